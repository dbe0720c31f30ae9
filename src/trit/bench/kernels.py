"""``trit bench kernels``: ternary linear kernels against bf16 cuBLAS and the reference, on one GPU.

For the Llama-3-8B, Qwen2-1.5B and 27B layer shapes (``--models``) and M in {1, 4, 16, 64, 128, 256,
512, 2048} it
times, in the same run: the op a loaded layer calls, as it dispatches
(``trit::linear_tiled`` on the mma layout where the CUDA kernels can run, else
``trit::linear`` on format v1), format v1's ``trit::linear`` beside it, bf16
``F.linear`` (cuBLAS) and the plain-PyTorch reference (unpack, then matmul).
Device time comes from CUDA graph replays of many back-to-back calls, and each
call reads the next of several copies of the weights, together several times
the L2 cache, as real decode reads each layer once per token. Bandwidth is
bytes moved (weights, scales, activations in, outputs out) over time, and its
fraction of the device-to-device copy bandwidth measured in the same run.

Before timing, each problem's kernel configs are tuned (same rotation), for
the kernels a loaded layer runs (the CUDA kernels on the mma layout where they
can run, else the Triton ones; format v1's time beside them uses the table's
configs), and the table is written to ``--tuned-out`` (the package ships it:
``kernels/tuned``; entries this run did not tune are kept).
Writes ``kernels.json`` and ``kernels.png`` under ``--out``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trit import format as fmt
from trit.bench import decode
from trit.bench.guard import DEFAULT_TOLERANCE, Figure, Report, check
from trit.kernels.cuda import mma as cmma


def layer_shapes(config: dict) -> tuple[tuple[str, int, int], ...]:
    """(layer, N, K) of a decoder's four linear shapes (q, k and v fused; gate and up fused), from a model
    config of :data:`trit.bench.decode.SHAPES`, the models ``trit bench decode`` and ``serve`` build."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    return ("qkv", q + 2 * kv, hidden), ("o", hidden, q), ("gate_up", 2 * inter, hidden), ("down", hidden, inter)


SHAPES = {model: layer_shapes(decode.SHAPES[model]) for model in ("llama3-8b", "qwen2-1.5b", "27b")}
# BitNet b1.58 2B4T (hidden 2560, intermediate 6912, 20 heads, 5 KV heads of 128): its four linear shapes
SHAPES["bitnet-2b4t"] = layer_shapes(dict(hidden_size=2560, intermediate_size=6912, num_attention_heads=20,
                                          num_key_value_heads=5, head_dim=128))
DEFAULT_MODELS = ("llama3-8b", "qwen2-1.5b", "27b")
MS = (1, 4, 16, 64, 128, 256, 512, 2048)  # 512: the wgmma kernel's tuning range ends there
GROUP = fmt.DEFAULT_GROUP_SIZE


@dataclass
class Row:
    model: str
    layer: str
    n: int
    k: int
    m: int
    kernel: str  # what trit::linear chose
    trit_us: float
    bf16_us: float
    reference_us: float
    trit_bytes: int
    bf16_bytes: int
    trit_gbps: float
    bf16_gbps: float
    trit_frac_copy_bw: float
    speedup_vs_bf16: float
    rel_err_vs_reference: float
    trit_us_spread: float | None = None  # (max - min) / median of the replays
    layout: str = "v1"  # the layout a loaded layer is held in ("mma": repacked at load for the CUDA kernels)
    v1_kernel: str | None = None  # with the mma layout: what format v1 (TRIT_LAYOUT=v1) would run, and its time
    v1_us: float | None = None
    peers: dict | None = None  # other libraries' kernels on the same weights: name -> us, speed-up, error


def copy_bandwidth(gib: float = 2.0) -> float:
    """Device-to-device copy, bytes read plus bytes written per second: the faster of two copies.

    ``copy_`` of a contiguous tensor is a memcpy, which a CUDA graph may hand to a copy engine rather than
    the SMs; an elementwise kernel (``mul`` by one, written to the second tensor) copies on the SMs, as the
    kernels measured against it do. Both are timed and the higher figure is the reference.
    """
    from trit.kernels import tuning

    n = int(gib * 2**30) // 2
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    us = min(tuning.graph_time_us([lambda: b.copy_(a)], reps=20),
             tuning.graph_time_us([lambda: torch.mul(a, 1, out=b)], reps=20))
    return 2 * n * 2 / (us * 1e-6)


def copies_for(nbytes: int, l2_bytes: int, factor: int = 4, cap: int = 256) -> int:
    return max(2, min(cap, math.ceil(factor * l2_bytes / nbytes)))


def ternary_bytes(n: int, k: int, group: int = GROUP) -> int:
    """What a ternary layer reads: 2-bit codes and fp16 scales (one per row for group -1)."""
    return n * k // 4 + n * fmt.num_groups(group, k) * 2


def ternary_layer(n: int, k: int, group: int = GROUP, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """Random codes (0..2, never 3) packed as the format says, and fp16 scales (one per row for group -1)."""
    from trit.synthetic import random_packed

    scale = (torch.rand(n, fmt.num_groups(group, k), device=device) * 0.02 + 0.005).half()
    return random_packed((n, k // 4), device), scale


@dataclass(frozen=True)
class Setting:
    """What every problem of a run shares: the scale granularity and the activations (int8: W1.58A8)."""

    group: int = GROUP
    act_int8: bool = False
    peers: tuple[str, ...] = ()  # other libraries' kernels timed on the same weights (trit.bench.peers)

    @property
    def label(self) -> str:
        g = "one scale a row" if self.group == fmt.PER_ROW else f"groups of {self.group}"
        return f"{'W1.58A8 (int8 activations per token)' if self.act_int8 else 'bf16 activations'}, {g}"


def bench_problem(n: int, k: int, m: int, l2: int, tune: bool, setting: Setting = Setting()) -> dict:
    from trit.kernels import registry, tuning
    from trit.kernels.reference import linear as ref_linear
    from trit.kernels.reference import linear_a8 as ref_linear_a8
    from trit.kernels.triton import dequant, gemm, gemv, launch, skinny

    g, a8 = setting.group, setting.act_int8
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    t_bytes = ternary_bytes(n, k, g)
    copies = copies_for(t_bytes, l2)
    layers = [ternary_layer(n, k, g) for _ in range(copies)]
    key = tuning.key(m, n, k, g, torch.bfloat16)  # the kernels' configs: the same problem with either activations
    choice_key = tuning.key(m, n, k, g, torch.bfloat16, a8)
    tuned = {}
    tiled = layout_of(n, k, x.device, a8, g) == "mma"
    if tune and not tiled:  # format v1's kernels, when they are the ones a loaded layer runs
        for name, run, cands in (
            ("triton_gemv", gemv.gemv, gemv.CONFIGS if m <= gemv.MAX_M else ()),
            ("triton_skinny", skinny.skinny, skinny.configs_for(m, g) if m <= skinny.MAX_M else ()),
            ("triton_gemm", gemm.gemm, gemm.configs_for(m, g) if m < launch.DEQUANT_MIN_M else ()),
        ):
            if not cands:
                continue

            def make_calls(cfg, run=run):
                return [lambda p=p, s=s: run(x, p.view(torch.int32), s, g, None, cfg) for p, s in layers]

            best, us = tuning.tune(make_calls, cands)
            tuning.remember(name, key, best, persist=False)
            tuned[name] = {"config": asdict(best), "us": us}
        if m >= 16:
            calls = [lambda p=p, s=s: dequant.linear(x, p.view(torch.int32), s, g) for p, s in layers]
            tuned["triton_dequant_cublas"] = {"us": tuning.graph_time_us(calls)}
        if not a8:  # int8 activations on format v1 keep the rules (the int8 GEMM is not among these)
            tuning.prefer(choice_key, min(tuned, key=lambda name: tuned[name]["us"]), "v1")
    out = {"tuned": tuned}
    problem = registry.Problem(m, n, k, g, "cuda", torch.bfloat16, a8)
    v1_times = tuning.graph_times_us([_op_call(x, p, s, g, a8) for p, s in layers])
    v1_kernel = registry.choose_kernel(problem).kernel.name
    out["layout"] = "mma" if tiled else "v1"
    if out["layout"] == "mma":  # a loaded layer is repacked: time what its forward runs
        reps = [cmma.repack(p, s, g, k) for p, s in layers]
        if tune:
            tuned.update(_tune_tiled(x, reps, key, choice_key))
        out["kernel"] = registry.choose_kernel(dataclasses.replace(problem, layout="mma")).kernel.name
        times = tuning.graph_times_us([_tiled_call(x, r, a8) for r in reps])
        out["v1_kernel"], out["v1_us"] = v1_kernel, v1_times[len(v1_times) // 2]
        y = _tiled_call(x, reps[0], a8)().float()
    else:
        out["kernel"], times = v1_kernel, v1_times
        y = _op_call(x, layers[0][0], layers[0][1], g, a8)().float()
    out["trit_us"] = times[len(times) // 2]
    out["trit_us_spread"] = (times[-1] - times[0]) / out["trit_us"]  # over the replays, relative
    w_bytes = n * k * 2
    bf16_copies = copies_for(w_bytes, l2)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(bf16_copies)]
    out["bf16_us"] = tuning.graph_time_us([lambda w=w: torch.nn.functional.linear(x, w) for w in weights])
    del weights
    ref_fn = ref_linear_a8 if a8 else ref_linear
    ref = [lambda p=p, s=s: ref_fn(x, p, s, g) for p, s in layers[: min(copies, 8)]]
    out["reference_us"] = tuning.graph_time_us(ref, reps=3)
    # the reference on the scales the layout holds (bf16, where the layer is repacked): float32 on the GPU
    s0 = layers[0][1].to(torch.bfloat16).float() if tiled else layers[0][1]
    want = ref_fn(x.float(), layers[0][0], s0, g).float()
    out["rel_err_vs_reference"] = float((y - want).norm() / want.norm())  # the kernel the op chose, tuned config
    out["trit_bytes"] = t_bytes + m * k * 2 + m * n * 2
    out["bf16_bytes"] = w_bytes + m * k * 2 + m * n * 2
    if setting.peers:
        from trit.bench import peers

        refs = {a8: want, not a8: (ref_linear if a8 else ref_linear_a8)(x.float(), layers[0][0], layers[0][1], g)}
        out["peers"] = peers.time_peers(setting.peers, x, layers, g, a8, refs)
        for entry in out["peers"].values():
            if "us" in entry:
                entry["speedup_vs_bf16"] = out["bf16_us"] / entry["us"]
    return out


def layout_of(n: int, k: int, device: torch.device, act_int8: bool = False, group: int = GROUP) -> str:
    """The layout a loaded (N, K) layer is held in (:func:`trit.linear.choose`)."""
    from trit import linear

    return linear.choose(linear.LinearSpec(n, k, group, 1, act_int8), device, torch.bfloat16).kernel.name


def explain(models: tuple[str, ...] | None = None, ms: tuple[int, ...] | None = None,
            setting: Setting = Setting()) -> int:
    """Print, for each layer shape of ``models`` and each M of ``ms``, the layout a loaded layer is held in and the
    kernel its op runs, with every candidate's answer, as this machine (its GPU and tables) would choose."""
    from trit import linear
    from trit.kernels import registry

    unknown = sorted(set(models or ()) - set(SHAPES))
    if unknown:
        print(f"trit bench kernels: no layer shapes for {', '.join(unknown)}; known: {', '.join(SHAPES)}",
              file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        torch.zeros(1, device=device)  # CUDA in use: this GPU's tuned tables are read
    g, act_int8 = setting.group, setting.act_int8
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}, {str(dtype).removeprefix('torch.')} "
          f"activations{' rounded to int8 per token (W1.58A8)' if act_int8 else ''}, "
          f"{'one scale a row' if g == fmt.PER_ROW else f'groups of {g}'}")
    for model, shapes in SHAPES.items():
        if (models and model not in models) or (not models and model not in DEFAULT_MODELS):
            continue
        for layer, n, k in shapes:
            choice = linear.choose(linear.LinearSpec(n, k, g, 1, act_int8), device, dtype)
            print(f"\n{model} {layer} ({n} x {k}): the {choice.kernel.name} layout")
            print("  " + choice.explain().replace("\n", "\n  "))
            for m in ms or MS:
                kernel = registry.choose_kernel(registry.Problem(m, n, k, g, device.type, dtype, act_int8,
                                                                 choice.kernel.name))
                print(f"  M={m}: {kernel.kernel.name}\n    " + kernel.explain().replace("\n", "\n    "))
    return 0


def _op_call(x, packed, scale, group: int = GROUP, act_int8: bool = False):
    return lambda: torch.ops.trit.linear(x, packed, scale, group, None, act_int8)


def _tiled_call(x, r, act_int8: bool = False):
    return lambda: torch.ops.trit.linear_tiled(x, r.wq, r.sc, r.n, r.group_size, None, act_int8)


def tiled_kernels(m: int, wgmma_ok: bool, a8: bool = False) -> list[str]:
    """The mma layout's kernels this benchmark tunes and times at ``m`` rows (``wgmma_ok``: the GPU runs the wgmma
    kernel; ``a8``: int8 activations on a layer whose scale groups the int8 wgmma kernel takes): each in
    its tuning range, and dequantize + cuBLAS beside the GEMMs wherever one of them could take the problem from it.
    Where none is timed, dequantize + cuBLAS takes the rows without a tuned choice."""
    from trit.kernels.cuda import gemv as cgemv
    from trit.kernels.cuda import imma as cimma
    from trit.kernels.cuda import wgmma as cwgmma
    from trit.kernels.cuda import wgmma_a8 as cwgmma_a8

    names = [name for name, on in (
        ("cuda_wgmma_a8", a8 and wgmma_ok and m >= cwgmma_a8.MIN_M),
        ("cuda_imma", m <= cimma.MAX_M),
        ("cuda_gemv", m <= cgemv.MAX_M),
        ("cuda_wgmma", wgmma_ok and cwgmma.TUNE_MIN_M <= m <= cwgmma.TUNE_MAX_M),
        # the mma kernel over its whole search space wherever it is timed: at M <= 4 it once ran at its heuristic
        # config only, which favoured the kernels tuned beside it (the GEMV, the int8 GEMV)
        ("cuda_mma", m <= cmma.TUNE_MAX_M),
    ) if on]
    if m >= 16 and {"cuda_wgmma", "cuda_mma", "cuda_wgmma_a8"} & set(names):
        names.append("cuda_dequant_cublas")
    return names


def _tune_tiled(x: torch.Tensor, reps: list, key: str, choice_key: str | None = None) -> dict:
    """Tune the CUDA kernels' configs on the repacked layers (under ``key``) and the fastest kernel (under
    ``choice_key``, ``key`` by default); remembered (in memory) for the timing that follows."""
    from trit.kernels import tuning
    from trit.kernels.cuda import gemv as cgemv
    from trit.kernels.cuda import imma as cimma
    from trit.kernels.cuda import launch as cuda_launch
    from trit.kernels.cuda import nvrtc
    from trit.kernels.cuda import wgmma as cwgmma
    from trit.kernels.cuda import wgmma_a8 as cwgmma_a8
    from trit.kernels.triton.device import sm_count

    m, out = x.shape[0], {}
    group = reps[0].group_size
    int8_acts = bool(choice_key and choice_key.endswith(",a8"))
    a8 = int8_acts and cwgmma_a8.group_refusal(group) is None

    def x_in() -> torch.Tensor:  # what the bf16 kernels take: with int8 activations, rounded and back, timed
        return cuda_launch.fake_quantize(x) if int8_acts else x

    names = tiled_kernels(m, cwgmma.supported(x.device) is None, a8)
    wg = cwgmma.configs_for(m, reps[0], sm_count()) if "cuda_wgmma" in names else []
    wa = cwgmma_a8.configs_for(m, reps[0], sm_count()) if "cuda_wgmma_a8" in names else []
    nvrtc.precompile(cwgmma_a8.source(), [cwgmma_a8.kernel_name(c, group) for c in wa], arch_suffix="a")
    nvrtc.precompile(cwgmma.source(), [cwgmma.kernel_name(c, group) for c in wg], arch_suffix="a")
    im = cimma.configs_for(reps[0], sm_count()) if "cuda_imma" in names else []
    nvrtc.precompile(cimma.source(), [cimma.kernel_name(cimma.token_tiles(m), c, group) for c in im])
    mm = cmma.configs_for(m, reps[0], sm_count()) if "cuda_mma" in names else []
    nvrtc.precompile(cmma.source(), [cmma.kernel_name(cmma.token_tiles(m, c.mt), c, group) for c in mm])
    for name, run, cands in (
        ("cuda_wgmma_a8", cwgmma_a8.linear, wa),  # every time includes the activations' rounding launch
        ("cuda_imma", cimma.linear, im),
        ("cuda_gemv", cgemv.linear, cgemv.configs_for(reps[0], sm_count()) if "cuda_gemv" in names else ()),
        ("cuda_wgmma", cwgmma.linear, wg),
        ("cuda_mma", cmma.linear, mm),
    ):
        if not cands:
            continue
        xin = (lambda: x) if name == "cuda_wgmma_a8" else x_in
        best, us = tuning.tune(lambda cfg, run=run, xin=xin: [lambda r=r: run(xin(), r, cfg) for r in reps], cands)
        tuning.remember(name, key, best, persist=False)
        out[name] = {"config": asdict(best), "us": us}
    if "cuda_dequant_cublas" in names:  # where a GEMM may hand over to dequantize + cuBLAS: both timed
        out["cuda_dequant_cublas"] = {"us": tuning.graph_time_us(
            [lambda r=r: torch.nn.functional.linear(x_in(), cgemv.dequantize(r)) for r in reps])}
    if len(out) > 1:  # the fastest of the layout's kernels takes this problem
        tuning.prefer(choice_key or key, min(out, key=lambda name: out[name]["us"]), "mma")
    return out


def guard_report(result: dict) -> Report:
    """The regression guard's figures of a kernels.json: each problem's time, with its replays' spread."""
    rep = Report("kernels", result["device"], {"torch": result["torch"].split("+")[0], "triton": result["triton"]},
                 command=result["command"])
    for r in result["rows"]:
        rep.figures[f"{r['model']} {r['layer']} {r['n']}x{r['k']} M={r['m']}"] = Figure(
            round(r["trit_us"], 3), "us a call", spread=r.get("trit_us_spread"))
    return rep


def table_mismatch(path: Path | None, device: str) -> str | None:
    """Why ``--tuned-out path`` cannot take this GPU's results: an existing table tuned on another GPU (even
    another variant of the same model), which a merge would mix and relabel (``None``: it can)."""
    if path is None or not path.is_file():
        return None
    try:
        tuned_on = json.loads(path.read_text()).get("device")
    except (OSError, ValueError) as e:
        return f"{path}: not a tuned table ({e})"
    if tuned_on and tuned_on != device:
        return (f"{path} was tuned on {tuned_on}, this GPU is {device}: write this GPU's table to another file "
                "(--tuned-out)")
    return None


def write_table(path: Path, tuned: dict, command: str) -> None:
    """Write the tuned configs and kernel choices; an existing table keeps the problems this run did not tune."""
    table = json.loads(path.read_text()) if path.is_file() else {"configs": {}, "choice": {}}
    table["device"] = torch.cuda.get_device_name()
    table["command"] = f"{table['command']}; then, for the problems it holds: {command}" if "command" in table \
        else command
    for key, entry in tuned.items():
        for layout, names in (("v1", [n for n in entry if n.startswith("triton_")]),  # format v1's kernels
                              ("mma", [n for n in entry if n.startswith("cuda_")])):  # the mma layout's
            if len(names) > 1 or (names and layout == "v1" and not key.endswith(",a8")):
                table["choice"].setdefault(layout, {})[key] = min(names, key=lambda name: entry[name]["us"])
        for kernel, t in entry.items():
            if "config" in t:  # dequant_cublas has no config, only a time; int8 activations share the configs
                table["configs"].setdefault(kernel, {})[key.removesuffix(",a8")] = t["config"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1, sort_keys=True))


def plot(rows: list[Row], copy_bw: float, path: Path, title: str = Setting().label) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    ms = sorted({r.m for r in rows})  # --quick benches some of MS
    labels = [f"{r.model}\n{r.layer}" for r in rows if r.m == ms[0]]
    for m in ms:
        sel = [r for r in rows if r.m == m]
        axes[0].plot(labels, [r.speedup_vs_bf16 for r in sel], marker="o", label=f"M={m}")
        axes[1].plot(labels, [r.trit_frac_copy_bw for r in sel], marker="o", label=f"M={m}")
    axes[0].axhline(1.0, color="gray", lw=0.8)
    axes[0].set_ylabel("speed-up over bf16 cuBLAS (x)")
    axes[1].set_ylabel(f"fraction of copy bandwidth ({copy_bw / 1e12:.2f} TB/s)")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"trit's ternary linear layers, {title}, {torch.cuda.get_device_name()}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summed(rows: list[Row]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """bf16's time over trit's, each layer shape of a model summed, for every (model, M) the rows hold whole; and
    the same for each peer that ran on every one of those layers."""
    summary: dict[str, float] = {}
    peers: dict[str, dict[str, float]] = {}
    for model, shapes in SHAPES.items():
        for m in dict.fromkeys(r.m for r in rows):
            sel = [r for r in rows if r.model == model and r.m == m]
            if len(sel) != len(shapes):
                continue
            summary[f"{model} M={m}"] = sum(r.bf16_us for r in sel) / sum(r.trit_us for r in sel)
            for name in sel[0].peers or {}:
                times = [(r.peers or {}).get(name, {}).get("us") for r in sel]
                if all(t is not None for t in times):
                    peers.setdefault(name, {})[f"{model} M={m}"] = sum(r.bf16_us for r in sel) / sum(times)
    return summary, peers


def _write(out_dir: Path, rows: list[Row], tuned: dict, copy_bw: float, l2: int, start: float,
           setting: Setting = Setting()) -> dict:
    """``kernels.json`` as it stands: every row so far and the summed speed-ups of the (model, M) it holds whole."""
    summary, peers = summed(rows)
    result = {
        "command": " ".join(sys.argv),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("TRIT_")},  # TRIT_LAYOUT, ...
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": platform.python_version(),
        "group_size": setting.group,
        "activations": "int8" if setting.act_int8 else "bf16",
        "peer_versions": _peer_versions(setting.peers),
        "copy_bandwidth_bytes_per_s": copy_bw,
        "l2_bytes": l2,
        "seconds": time.time() - start,
        "summed_speedup_vs_bf16": summary,
        "peers_summed_speedup_vs_bf16": peers,
        "rows": [asdict(r) for r in rows],
        "tuned": tuned,
    }
    (out_dir / "kernels.json").write_text(json.dumps(result, indent=1))
    return result


def _peer_versions(names: tuple[str, ...]) -> dict[str, str]:
    from trit.bench import peers

    return {name: peers.version(name) for name in names}


def main(out_dir: Path, quick: bool = False, tune: bool = True, tuned_out: Path | None = None,
         ms: tuple[int, ...] | None = None, tune_ms: tuple[int, ...] | None = None, baseline: Path | None = None,
         write_baseline: Path | None = None, tolerance: float = DEFAULT_TOLERANCE,
         models: tuple[str, ...] | None = None, setting: Setting = Setting()) -> int:
    """Time every (shape, M); tune first the Ms of ``tune_ms`` (all, by default; none without ``tune``).

    ``kernels.json`` is rewritten after each problem, so a run stopped part way keeps what it measured.
    """
    from trit.kernels import tuning

    unknown = sorted(set(models or ()) - set(SHAPES))
    if unknown:
        print(f"trit bench kernels: no layer shapes for {', '.join(unknown)}; known: {', '.join(SHAPES)}",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("trit bench kernels needs a CUDA GPU", file=sys.stderr)
        return 2
    if setting.peers:
        from trit.bench import peers

        missing = peers.missing(setting.peers)
        if missing:
            print(f"trit bench kernels: {missing}", file=sys.stderr)
            return 2
    why = table_mismatch(tuned_out, torch.cuda.get_device_name())
    if why:
        print(f"trit bench kernels: {why}", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copy_bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_bw / 1e12:.3f} TB/s, L2 {l2 / 2**20:.0f} MiB")
    ms = ms or (MS[:2] if quick else MS)
    tune_ms = set(ms if tune_ms is None else tune_ms) if tune else set()
    rows, tuned = [], {}
    start = time.time()
    print(setting.label)
    for model, shapes in SHAPES.items():
        if (models and model not in models) or (not models and model not in DEFAULT_MODELS):
            continue
        for layer, n, k in shapes:
            for m in ms:
                r = bench_problem(n, k, m, l2, m in tune_ms, setting)
                if r["tuned"]:
                    tuned[tuning.key(m, n, k, setting.group, torch.bfloat16, setting.act_int8)] = r["tuned"]
                row = Row(model, layer, n, k, m, r["kernel"], r["trit_us"], r["bf16_us"], r["reference_us"],
                          r["trit_bytes"], r["bf16_bytes"], r["trit_bytes"] / r["trit_us"] / 1e3,
                          r["bf16_bytes"] / r["bf16_us"] / 1e3, r["trit_bytes"] / (r["trit_us"] * 1e-6) / copy_bw,
                          r["bf16_us"] / r["trit_us"], r["rel_err_vs_reference"], r["trit_us_spread"],
                          r["layout"], r.get("v1_kernel"), r.get("v1_us"), r.get("peers"))
                rows.append(row)
                _write(out_dir, rows, tuned, copy_bw, l2, start, setting)
                print(f"{model:>10} {layer:>7} {n:>5}x{k:<5} M={m:<4} {row.kernel:>22} trit {row.trit_us:8.2f} us "
                      f"bf16 {row.bf16_us:8.2f} us ref {row.reference_us:9.2f} us  x{row.speedup_vs_bf16:5.2f} "
                      f"{row.trit_frac_copy_bw:6.1%} of copy bw"
                      + (f" (format v1: {row.v1_kernel} {row.v1_us:.2f} us)" if row.v1_us else "")
                      + "".join(f"; {name} {p['us']:.2f} us x{p['speedup_vs_bf16']:.2f}" if "us" in p else
                                f"; {name}: {p['error']}" for name, p in (row.peers or {}).items()), flush=True)
    result = _write(out_dir, rows, tuned, copy_bw, l2, start, setting)
    if tuned_out is not None and tuned:
        write_table(tuned_out, tuned, result["command"])
    try:
        plot(rows, copy_bw, out_dir / "kernels.png", setting.label)
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    for name, s in result["summed_speedup_vs_bf16"].items():
        print(f"summed over the layers, {name}: x{s:.2f} vs bf16"
              + "".join(f", {peer} x{by[name]:.2f}" for peer, by in result["peers_summed_speedup_vs_bf16"].items()
                        if name in by))
    return check(guard_report(result), baseline, write_baseline, tolerance)
