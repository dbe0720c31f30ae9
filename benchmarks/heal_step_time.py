"""Heal step time on the GPU by batch size, and how busy the GPU is during a step (torch.profiler).

    PYTHONPATH=src OUT=/tmp python benchmarks/heal_step_time.py   # needs /root/wt.txt: the WikiText-2 test file

Heals an absmean-g64 SmolLM2-135M checkpoint for 40 steps at batch 16, 32,
64 (and 64 with gradient checkpointing), one phase, on the text; then 12
steps of batch 16 under the profiler. Writes ``$OUT/probe.json``.
"""

import json
import os
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from trit import heal as H
from trit import smollm2
from trit.convert import ConvertOptions, convert

out = Path(os.environ.get("OUT", "/tmp"))
src = smollm2.float_checkpoint()
ck = Path("/root/absmean")
if not (ck / "config.json").exists():
    convert(src, ck, ConvertOptions(device="cuda"), progress=False)
text = Path("/root/wt.txt")
res = []
for batch, gc in [(16, False), (32, False), (64, False), (64, True)]:
    torch.cuda.synchronize()
    opts = H.HealOptions(steps=40, scales_first=0, batch=batch, data=text, train_samples=512, eval_every=1000,
                         grad_checkpointing=gc, device="cuda")
    t = time.perf_counter()
    r = H.heal(ck, src, Path(f"/root/h{batch}{gc}"), opts, overwrite=True, progress=False)
    res.append({"batch": batch, "gc": gc, "s_per_step": r.seconds / r.steps, "wall": time.perf_counter() - t,
                "mem_gb": torch.cuda.max_memory_allocated() / 1e9})
    torch.cuda.reset_peak_memory_stats()
    print(res[-1], flush=True)
opts = H.HealOptions(steps=12, scales_first=0, batch=16, data=text, train_samples=512, eval_every=1000,
                     grad_checkpointing=False, device="cuda")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    r = H.heal(ck, src, Path("/root/hprof"), opts, overwrite=True, progress=False)
ka = prof.key_averages()
cuda_total = sum(e.self_device_time_total for e in ka) / 1e6
print("profiled heal seconds", r.seconds, "cuda busy s", cuda_total)
print(ka.table(sort_by="self_device_time_total", row_limit=25))
print(ka.table(sort_by="count", row_limit=15))
json.dump({"runs": res, "prof_seconds": r.seconds, "cuda_busy": cuda_total}, open(out / "probe.json", "w"), indent=1)
