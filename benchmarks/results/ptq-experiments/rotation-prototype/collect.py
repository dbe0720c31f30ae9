import json, sys
from pathlib import Path
runs = [("base32", "SmolLM2-135M-Instruct as it is", "--calib-samples 32"),
        ("orth32", "residual rotated by a random orthogonal matrix, value heads by a signed Hadamard", "--calib-samples 32"),
        ("had32", "residual rotated by random signs x (random orthogonal 9x9 (x) Hadamard 64), value heads by a signed Hadamard", "--calib-samples 32"),
        ("base2p32", "SmolLM2-135M-Instruct as it is", "--calib-samples 32 --planes 2"),
        ("had2p32", "as had32", "--calib-samples 32 --planes 2")]
float_dir = {"base": "~/.cache/trit/SmolLM2-135M-Instruct", "orth": "/tmp/rot/f-orth", "had": "/tmp/rot/f-had"}
rows = []
for name, model, flags in runs:
    ev = json.loads(Path(f"/tmp/rot/{name}.json").read_text())
    q = int(Path(f"/tmp/rot/{name}.res").read_text().split()[1])
    kind = next(k for k in float_dir if name.startswith(k))
    rows.append({"variant": name, "float_model": model,
                 "command": f"run.sh {float_dir[kind]} {name} {flags}  (trit quantize FLOAT OUT --method gptq --device cpu {flags}; "
                            f"trit eval OUT --ppl wikitext2,gsm8k,python --device cpu)",
                 "perplexity": {c: v["perplexity"] for c, v in ev["corpora"].items()},
                 "geometric_mean": ev["geometric_mean"], "quantize_seconds": q})
bf16 = {"wikitext2": 36.08563752393831, "gsm8k": 5.944569913080272, "python": 9.73201947699192}
out = {"what": "A prototype of the residual-stream rotation before GPTQ: float SmolLM2-135M rotated and saved in float32 "
               "by rotate.py (norms folded, tied head untied), then trit quantize with the rotation off (the code of "
               "the time) on the same calibration windows for every run: the first 32 of the 128 default data-free "
               "windows in the calibration cache, copied under each float model's cache key by seed.py. One seed of "
               "each rotation. orth32 and had32 ran one after the other alone on the 2-core CPU; base2p32 and had2p32 "
               "shared it with a quality_domains.py run, so their seconds are not comparable.",
       "scripts": "benchmarks/results/ptq-experiments/rotation-prototype/ (rotate.py, seed.py, run.sh; removed from the tree after this commit, kept in git)",
       "rotate_commands": ["python rotate.py ~/.cache/trit/SmolLM2-135M-Instruct /tmp/rot/f-orth orth",
                           "python rotate.py ~/.cache/trit/SmolLM2-135M-Instruct /tmp/rot/f-had had",
                           "python seed.py ~/.cache/trit/SmolLM2-135M-Instruct /tmp/rot/f-orth /tmp/rot/f-had"],
       "bf16_perplexity": bf16, "bf16_geometric_mean": 12.780639852146154,
       "eval": "the first 16 windows of 512 tokens of each corpus's evaluation half", "device": "cpu", "rows": rows}
for r in rows:
    r["ratio_to_bf16"] = {c: r["perplexity"][c] / bf16[c] for c in bf16}
    r["geometric_mean_ratio"] = r["geometric_mean"] / out["bf16_geometric_mean"]
Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
for r in rows: print(r["variant"], round(r["geometric_mean_ratio"], 3), {c: round(v, 2) for c, v in r["ratio_to_bf16"].items()})
