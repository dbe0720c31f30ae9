"""On a GPU: a random ternary Llama-shaped model through vLLM (the trit plugin) against trit's own runtime.

Run on the GPU machine from the repository root, with vLLM importable::

    PYTHONPATH=src python benchmarks/vllm_gpu_check.py --mode graphs --out graphs.json
    PYTHONPATH=src python benchmarks/vllm_gpu_check.py --mode fp8 --out fp8.json
    PYTHONPATH=src python benchmarks/vllm_gpu_check.py --mode bitnet --out bitnet.json

It makes a random Llama checkpoint, converts it with ``trit quantize``
(absmean, group 64), generates greedily with the embedded runtime and with
``vllm.LLM`` (``graphs``: CUDA graphs on; ``fp8``: ``kv_cache_dtype="fp8"``),
and compares the tokens. ``bitnet`` instead makes a random BitNet b1.58
checkpoint in transformers' format, imports it with ``trit import`` (int8
activations) and runs the plugin's ``BitNetForCausalLM`` with CUDA graphs; one
prompt is long enough (>= 64 tokens) for the int8 tensor-core prefill kernel.
One engine a process. It prints and writes a JSON summary. vLLM finds the
plugin through its entry point when trit is installed; from a source tree the
script registers it itself.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

PROMPTS = ("The quick brown fox", "def main():", "Once upon a time,")
LONG_PROMPT = "In the beginning the ternary weights were packed four to a byte, and " * 3


def first_divergence(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def tiled_layers(model) -> list[int]:
    """(layers the plugin repacked to the mma layout, trit layers): run inside vLLM's worker by ``apply_model``."""
    flags = [getattr(m, "trit_kernel", None) for m in model.modules()]
    flags = [None if k is None else k.name == "mma" for k in flags]
    return [sum(f is True for f in flags), sum(f is not None for f in flags)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("vllm_gpu_check.json"))
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--mode", choices=["graphs", "fp8", "bitnet"], default="graphs")
    args = ap.parse_args()

    import torch

    from trit import runtime
    from trit.configs import AbsmeanConfig
    from trit.convert import convert
    from trit.synthetic import make_bitnet_checkpoint, make_checkpoint
    from trit.vllm import register

    register()
    from vllm import LLM, SamplingParams

    work = Path(tempfile.mkdtemp())
    shape = {"hidden": 1024, "intermediate": 2816, "layers": 4, "heads": 16, "kv_heads": 4, "std": 0.05}
    ckpt = work / "trit"
    prompts_text = PROMPTS
    if args.mode == "bitnet":
        from trit.import_bitnet import import_bitnet

        import_bitnet(make_bitnet_checkpoint(work / "bitnet", **shape), ckpt, progress=False)
        what = "random BitNet b1.58 (bitlinear, offline), hidden 1024, 4 layers, imported: int8 activations"
        prompts_text = (*PROMPTS, LONG_PROMPT)
    else:
        convert(make_checkpoint(work / "float", **shape), ckpt, AbsmeanConfig(64), progress=False)
        what = "random Llama, hidden 1024, 4 layers, absmean group 64"
    result: dict = {"checkpoint": what, "torch": torch.__version__}

    loaded = runtime.load(ckpt, device="cuda", dtype=torch.bfloat16)
    result["runtime_layers_tiled_of_trit_layers"] = tiled_layers(loaded.model)
    prompt_ids = [loaded.tokenizer(p).input_ids for p in prompts_text]
    ref = [runtime.greedy_ids(loaded, torch.tensor([ids]), args.new_tokens)[0].tolist() for ids in prompt_ids]
    del loaded
    torch.cuda.empty_cache()

    greedy = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
    modes = {"graphs": {"enforce_eager": False}, "fp8": {"enforce_eager": True, "kv_cache_dtype": "fp8"},
             "bitnet": {"enforce_eager": False}}
    for name, kwargs in ((args.mode, modes[args.mode]),):
        start = time.time()
        llm = LLM(model=str(ckpt), dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=512,
                  skip_tokenizer_init=True, **kwargs)
        load_s = time.time() - start
        outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, greedy)]
        agree = [first_divergence(o, r) for o, r in zip(outs, ref)]
        try:
            tiled = llm.apply_model(tiled_layers)[0]
        except Exception as e:  # an engine without apply_model: say so in the record, not fail the check
            tiled = f"unknown ({type(e).__name__}: {e})"
        result[name] = {"load_seconds": load_s, "vllm_tokens": outs, "runtime_tokens": ref,
                        "tokens_equal_before_first_difference": agree, "kwargs": kwargs,
                        "vllm_layers_tiled_of_trit_layers": tiled}
        print(f"{name}: loaded in {load_s:.1f} s; tokens equal to the runtime's for the first {agree} of "
              f"{args.new_tokens}", flush=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
