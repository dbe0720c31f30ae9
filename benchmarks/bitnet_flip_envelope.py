"""How far a W1.58A8 model's outputs move when its float32 inputs move by rounding noise (the vLLM BitNet test's tolerances).

    PYTHONPATH=src python benchmarks/bitnet_flip_envelope.py --out benchmarks/results/bitnet_flip_envelope_cpu.json

BitNet layers round their activations to int8 per token. Two engines that
compute the same float32 model in a different summation order (vLLM's
attention and norms against transformers') reach each layer with inputs a few
ulps apart; where a value sits on a rounding boundary it rounds to a
neighbouring integer in one engine and not the other, and from then on every
later position of that prompt sees a slightly different key and value.

This script measures the size of that effect on the checkpoint that
``tests/vllm/test_vllm_bitnet.py`` builds, with one engine only: the runtime
against itself with its token embeddings multiplied by ``1 + eps * N(0, 1)``,
for several ``eps`` and seeds, on the prompts of ``tests/vllm/llm_script.py``.
Per trial it reports the largest prompt log-prob difference, the median one,
and the largest greedy gap: the perturbed run's greedy tokens scored by the
unperturbed runtime, teacher-forced, as ``max log-prob - chosen log-prob``
(zero where the two choose the same token).

For scale, the same figures for two wrong engines against the runtime: one
that skips the int8 rounding (``no_int8``) and one that runs the model made
with another seed (``other_weights``).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
EPS = (1e-7, 1e-6, 1e-5)
NEW_TOKENS = 16  # as llm_script.py asks vLLM for


def prompts() -> list[str]:
    spec = importlib.util.spec_from_file_location("llm_script", REPO / "tests" / "vllm" / "llm_script.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PROMPTS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args(argv)

    from trit import runtime
    from trit.import_bitnet import import_bitnet
    from trit.synthetic import make_bitnet_checkpoint

    def build(seed: int):
        with tempfile.TemporaryDirectory() as tmp:
            src = make_bitnet_checkpoint(Path(tmp) / "src", hidden=128, intermediate=256, heads=2, kv_heads=1,
                                         seed=seed)
            import_bitnet(src, Path(tmp) / "trit", progress=False, log=lambda s: None)
            return runtime.load(Path(tmp) / "trit", device="cpu", dtype=torch.float32)

    loaded = build(0)
    twin = copy.deepcopy(loaded)  # the copy that is perturbed or broken
    ids = [loaded.tokenizer(p).input_ids for p in prompts()]
    base = [runtime.prompt_logprobs(loaded, i) for i in ids]

    def compare(other) -> dict:
        d = torch.cat([(runtime.prompt_logprobs(other, i) - b).abs() for i, b in zip(ids, base)])
        new = [runtime.greedy_ids(other, torch.tensor([i]), NEW_TOKENS)[0].tolist() for i in ids]
        gap = torch.cat([runtime.greedy_gaps(loaded, i, n) for i, n in zip(ids, new)])
        return {"logprob_diff_max": d.max().item(), "logprob_diff_median": d.median().item(),
                "greedy_gap_max": gap.max().item(), "greedy_tokens_differ": int((gap > 0).sum().item())}

    layers = [m for m in twin.model.modules() if getattr(m, "act_int8", False)]
    for m in layers:
        m.act_int8 = False
    wrong = {"no_int8": compare(twin) | {"layers": len(layers)}, "other_weights": compare(build(1))}
    for m in layers:
        m.act_int8 = True

    emb = twin.model.get_input_embeddings()
    w0 = emb.weight.data.clone()
    rows = []
    for eps in EPS:
        for seed in range(args.trials):
            g = torch.Generator().manual_seed(seed)
            emb.weight.data = w0 * (1 + eps * torch.randn(w0.shape, generator=g))
            rows.append({"eps": eps, "seed": seed} | compare(twin))
            print(json.dumps(rows[-1]), file=sys.stderr)
    emb.weight.data = w0

    summary = {}
    for eps in EPS:
        r = [x for x in rows if x["eps"] == eps]
        summary[str(eps)] = {k: max(x[k] for x in r) for k in ("logprob_diff_max", "logprob_diff_median",
                                                                 "greedy_gap_max")}
    result = {"command": "PYTHONPATH=src python benchmarks/bitnet_flip_envelope.py --out " + str(args.out),
              "trials": args.trials, "eps": list(EPS), "worst_per_eps": summary,
              "wrong_engines": wrong, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"worst_per_eps": summary, "wrong_engines": wrong}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
