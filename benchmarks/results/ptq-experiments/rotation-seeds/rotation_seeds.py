"""One plane, 32 calibration windows (the first 32 of the default 128 in the cache), the rotation drawn from other
seeds: how much of the gain is the seed's."""
import json, sys, time
from pathlib import Path
import torch
from trit import convert as conv, runtime, smollm2
from trit.calibrate import CalibOptions
from trit.corpora import halves, read
from trit.eval.perplexity import PerplexityOptions, geometric_mean, perplexity, tokenize_text

out = Path(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]
src = smollm2.float_checkpoint()
corpora = ("wikitext2", "gsm8k", "python")
texts = {c: halves(read(c)[1])[0] for c in corpora}
opts = PerplexityOptions()
rows = []
for seed in seeds:
    conv.ROTATION_SEED = seed
    dst = out.parent / f"seed{seed}"
    t = time.perf_counter()
    conv.convert(src, dst, conv.ConvertOptions(calib=CalibOptions(samples=32), overwrite=True), progress=False,
                 log=lambda _: None)
    q = time.perf_counter() - t
    loaded = runtime.load(dst, device="cpu", dtype=torch.float32)
    ppl = {c: perplexity(loaded, tokenize_text(loaded, texts[c]), opts, progress=False).perplexity for c in corpora}
    rows.append({"seed": seed, "perplexity": ppl, "geometric_mean": geometric_mean(list(ppl.values())),
                 "quantize_seconds": q})
    print(json.dumps(rows[-1]), flush=True)
    out.write_text(json.dumps({"command": " ".join(["python rotation_seeds.py", *sys.argv[1:]]), "rows": rows}, indent=1))
