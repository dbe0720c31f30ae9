"""Heal step time on the GPU by batch size, gradient checkpointing and torch.compile (and a torch.profiler run).

    PYTHONPATH=src OUT=/tmp python benchmarks/heal_step_time.py [--runs 16:0:0,16:0:1] [--steps 40] [--no-profile]
    # needs /root/wt.txt: the WikiText-2 test file

Heals an absmean-g64 SmolLM2-135M checkpoint, one phase, on the text, once
for each ``batch:grad_checkpointing:compile`` of ``--runs``; then (unless
``--no-profile``) 12 steps of batch 16 under the profiler. Writes
``$OUT/probe.json``. ``s_per_step`` is the report's training-loop seconds over
its steps (a compiled run's compilation included); ``steady_s_per_step`` the
seconds from the end of the first held-out evaluation (step ``--eval-every``)
to the end of the last, over the steps between, and ``first_eval_s`` that first
evaluation's time from the start (compilation included).

Without ``--runs`` and ``--steps`` it runs what it ran first (batch 16, 32,
64, 64 with gradient checkpointing; 40 steps), each eager.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from trit import heal as H
from trit import smollm2
from trit.convert import ConvertOptions, convert

ap = argparse.ArgumentParser()
ap.add_argument("--runs", default="16:0:0,32:0:0,64:0:0,64:1:0", help="batch:grad_checkpointing:compile, ...")
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--eval-every", type=int, default=1000)
ap.add_argument("--no-profile", action="store_true")
args = ap.parse_args()

out = Path(os.environ.get("OUT", "/tmp"))
src = smollm2.float_checkpoint()
ck = Path("/root/absmean")
if not (ck / "config.json").exists():
    convert(src, ck, ConvertOptions(device="cuda"), progress=False)
text = Path("/root/wt.txt")
res = []
for spec in args.runs.split(","):
    batch, gc, comp = (int(v) for v in spec.split(":"))
    torch.cuda.synchronize()
    opts = H.HealOptions(steps=args.steps, scales_first=0, batch=batch, data=text, train_samples=512,
                         eval_every=args.eval_every, grad_checkpointing=bool(gc), compile=bool(comp), device="cuda")
    t = time.perf_counter()
    r = H.heal(ck, src, Path(f"/root/h{spec.replace(':', '_')}"), opts, overwrite=True, progress=False)
    run = {"batch": batch, "gc": bool(gc), "compile": bool(comp), "s_per_step": r.seconds / r.steps,
           "wall": time.perf_counter() - t, "mem_gb": torch.cuda.max_memory_allocated() / 1e9,
           "heldout_kl": r.heldout, "heldout_elapsed": r.elapsed}
    if len(r.heldout) > 2:
        (s1, _), (s2, _) = r.heldout[1], r.heldout[-1]
        run["steady_s_per_step"] = (r.elapsed[-1] - r.elapsed[1]) / (s2 - s1)
        run["first_eval_s"] = r.elapsed[1]
    res.append(run)
    torch.cuda.reset_peak_memory_stats()
    print({k: v for k, v in run.items() if not k.startswith("heldout")}, flush=True)
result = {"command": "python benchmarks/heal_step_time.py " + " ".join(sys.argv[1:]), "runs": res,
          "device": torch.cuda.get_device_name(), "torch": torch.__version__}
if not args.no_profile:
    opts = H.HealOptions(steps=12, scales_first=0, batch=16, data=text, train_samples=512, eval_every=1000,
                         grad_checkpointing=False, compile=False, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        r = H.heal(ck, src, Path("/root/hprof"), opts, overwrite=True, progress=False)
    ka = prof.key_averages()
    cuda_total = sum(e.self_device_time_total for e in ka) / 1e6
    print("profiled heal seconds", r.seconds, "cuda busy s", cuda_total)
    print(ka.table(sort_by="self_device_time_total", row_limit=25))
    print(ka.table(sort_by="count", row_limit=15))
    result.update(prof_seconds=r.seconds, cuda_busy=cuda_total)
json.dump(result, open(out / "probe.json", "w"), indent=1)
