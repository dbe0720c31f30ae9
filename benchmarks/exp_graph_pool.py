"""Graph-pool memory of CUDA-graph captures as vLLM makes them (sizes descending, one shared pool, an eager
warm-up before each capture), Llama-3-8B's four linear shapes twice a step: bf16 F.linear against trit as shipped
and trit with the dequantize path writing into one kept buffer. One variant a process: VARIANT=bf16|trit|trit_buf."""
import gc
import json
import os
import time

import torch

import trit.ops  # noqa: F401
from trit import format as fmt
from trit.kernels.cuda import gemv, mma, nvrtc
from trit.synthetic import random_packed

V = os.environ["VARIANT"]
G = 64
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
SIZES = sorted([1, 2, 4] + list(range(8, 513, 8)), reverse=True)
dev = "cuda"
torch.manual_seed(0)

if V == "trit_buf":
    _BUF = {}
    def dequantize(r):
        need = r.n * r.k
        b = _BUF.get(r.wq.device)
        if b is None or b.numel() < need:
            b = _BUF[r.wq.device] = torch.empty(need, dtype=torch.bfloat16, device=r.wq.device)
        out = b[:need].view(r.n, r.k)
        kern = nvrtc.load(gemv.source(), "trit_dequant")
        warps = r.row_tiles * r.k_steps
        gs = 0 if r.group_size == fmt.PER_ROW else r.group_size
        kern.launch((-(-warps // 4), 1, 1), 128, 0, gemv.DEQUANT_SIGNATURE,
                    (r.wq.data_ptr(), r.sc.data_ptr(), out.data_ptr(), r.n, r.k, r.k_steps, r.scale_groups, gs))
        return out
    gemv.dequantize = dequantize

layers = []
for n, k in SHAPES:
    if V == "bf16":
        layers.append(torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02)
    else:
        kp = fmt.padded_k(k, G)
        packed = random_packed((n, kp // 4), dev)
        scale = (torch.rand(n, fmt.num_groups(G, kp), device=dev) * 0.02 + 0.005).to(torch.bfloat16)
        layers.append(mma.repack(packed, scale, G, k))
xs = [torch.randn(512, k, dtype=torch.bfloat16, device=dev) for _, k in SHAPES]

def lin(x, w):
    if V == "bf16":
        return torch.nn.functional.linear(x, w)
    return torch.ops.trit.linear_tiled(x, w.wq, w.sc, w.n, G, None)

def step(m):
    outs = []
    for _ in range(2):
        for x, w in zip(xs, layers):
            outs.append(lin(x[:m], w))
    return sum(o.float().sum() for o in outs[-4:])

torch.cuda.synchronize()
for m in (512, 64, 1):
    step(m)
torch.cuda.synchronize()
gc.collect()
torch.cuda.empty_cache()
base_alloc, base_res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
free0, total = torch.cuda.mem_get_info()
pool = torch.cuda.graph_pool_handle()
graphs = []
t0 = time.time()
for m in SIZES:
    step(m)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        out = step(m)
    graphs.append((g, out))
torch.cuda.synchronize()
for g, _ in graphs:
    g.replay()
torch.cuda.synchronize()
free1, _ = torch.cuda.mem_get_info()
res = {"variant": V, "device": torch.cuda.get_device_name(), "sizes": len(SIZES), "capture_s": time.time() - t0,
       "allocated_mib": (torch.cuda.memory_allocated() - base_alloc) / 2**20,
       "reserved_mib": (torch.cuda.memory_reserved() - base_res) / 2**20,
       "device_used_mib": (free0 - free1) / 2**20,
       "peak_allocated_mib": torch.cuda.max_memory_allocated() / 2**20}
print(json.dumps(res))
with open(os.path.join(os.environ.get("OUT", "."), f"gp_{V}.json"), "w") as f:
    json.dump(res, f)
