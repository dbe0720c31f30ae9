"""The ``trit`` command line: a thin argument parser over typed functions.

``trit quantize | import | heal | generate | eval | audit | plan | demo | bench``, also ``python -m trit``.
Errors about the user's input (a bad checkpoint, a bad path, a bad flag) print
one line ``trit: error: ...`` and exit with status 2; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from trit import format as fmt
from trit.calibrate import CalibOptions
from trit.checkpoint import CheckpointError
from trit.convert import ConvertOptions
from trit.errors import TritError
from trit.heal import HealOptions
from trit.quant import Method

EXIT_USAGE = 2


def quantize(model_dir: Path, out_dir: Path, opts: ConvertOptions, quiet: bool = False) -> int:
    from trit.convert import convert

    report = convert(model_dir, out_dir, opts, progress=not quiet)
    print(report.summary())
    return 0


def import_checkpoint(model_dir: Path, out_dir: Path, overwrite: bool, quiet: bool = False) -> int:
    from trit.import_bitnet import import_bitnet

    report = import_bitnet(model_dir, out_dir, overwrite=overwrite, progress=not quiet)
    print(report.summary())
    return 0


def generate(
    ckpt: Path, prompt: str, sampling: object, chat: bool, device: str | None, dtype: str | None,
    truncate: bool = False,
) -> int:
    from trit import runtime

    loaded = runtime.load(ckpt, device=device, dtype=_dtype(dtype))
    stats = runtime.GenerationStats()
    for piece in runtime.stream(loaded, prompt, sampling, chat=chat, stats=stats,  # type: ignore[arg-type]
                                truncate=truncate):
        print(piece, end="", flush=True)
    print()
    print(f"[{stats.new_tokens} tokens, {stats.tokens_per_second:.1f} tokens/s on {loaded.device}]", file=sys.stderr)
    return 0


def evaluate(ckpt: Path, ppl_file: Path, opts: object, device: str | None, dtype: str | None) -> int:
    from trit import runtime
    from trit.eval.perplexity import perplexity, tokenize_file

    if not ppl_file.is_file():
        raise CheckpointError(ppl_file, "no such text file")
    loaded = runtime.load(ckpt, device=device, dtype=_dtype(dtype))
    r = perplexity(loaded, tokenize_file(loaded, ppl_file), opts)  # type: ignore[arg-type]
    print(
        f"perplexity {r.perplexity:.3f} over {r.tokens_scored} tokens "
        f"({r.windows} windows, tokens {r.first_token}..{r.last_token} of {ppl_file.name}; {r.seconds:.1f} s)"
    )
    return 0


def audit(ckpt: Path) -> int:
    from trit.eval.audit import audit as run_audit

    report = run_audit(ckpt)
    print(report.table())
    return 0 if report.ok else 1


def _dtype(name: str | None):
    if name is None:
        return None
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


class _ShowDefaults(argparse.HelpFormatter):
    """Help that ends each option with its default, where it has one worth showing (not None, not off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trit", description="Ternary language models: quantize, run, serve.")
    sub = p.add_subparsers(dest="command", required=True)

    q = sub.add_parser("quantize", help="convert a float Hugging Face checkpoint to ternary")
    q.add_argument("model_dir", type=Path)
    q.add_argument("out_dir", type=Path)
    q.add_argument("--method", choices=[m.value for m in Method], default=Method.ABSMEAN.value)
    q.add_argument("--group-size", type=int, default=ConvertOptions.group_size, help="inputs per scale; -1: one scale per row")
    q.add_argument("--keep", default="", help="comma-separated modules (globs allowed) kept in high precision")
    q.add_argument("--pad", choices=[x.value for x in fmt.PadPolicy], default=fmt.PadPolicy.PAD.value,
                   help="layers whose K is not a multiple of the group: pad with zeros, or keep in high precision")
    q.add_argument("--scale-dtype", choices=[x.value for x in fmt.ScaleDtype], default="float16")
    q.add_argument("--planes", type=int, default=1, choices=[1, 2],
                   help="ternary planes per layer: 2 stores W = a1*T1 + a2*T2 (about 4 bits a weight)")
    q.add_argument("--calib", type=Path, default=None,
                   help="gptq: calibration text file (default: text sampled from the float model)")
    q.add_argument("--calib-samples", type=int, default=32, help="gptq: calibration windows")
    q.add_argument("--calib-seq-len", type=int, default=512, help="gptq: tokens per window")
    q.add_argument("--act-order", action=argparse.BooleanOptionalAction, default=ConvertOptions.act_order,
                   help="gptq: columns by decreasing Hessian diagonal")
    q.add_argument("--damp", type=float, default=ConvertOptions.damp, help="gptq: damping, a fraction of mean(diag(H))")
    q.add_argument("--passes", type=int, default=ConvertOptions.passes,
                   help="gptq: rounding passes; each later pass rounds again onto the scales the one before "
                        "refitted (each costs one more GPTQ solve a layer, no more forward passes)")
    q.add_argument("--float-target", action=argparse.BooleanOptionalAction, default=None,
                   help="gptq: aim each layer at the float model's outputs on float inputs, running the calibration "
                        "windows through the float model too (default for one plane); --no-float-target: at the "
                        "float weight on the quantized inputs, as plain GPTQ does (default for two planes)")
    q.add_argument("--device", default="cpu", help="where the quantizer runs (cpu, cuda)")
    q.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    q.add_argument("--quiet", action="store_true", help="no progress bar")

    i = sub.add_parser("import", help="import a natively ternary checkpoint (transformers' BitNet format)")
    i.add_argument("model_dir", type=Path)
    i.add_argument("out_dir", type=Path)
    i.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    i.add_argument("--quiet", action="store_true", help="no progress bar")

    heal_defaults = HealOptions()  # one set of defaults: the CLI shows the library's
    h = sub.add_parser("heal", help="quantization-aware distillation of a ternary checkpoint from its float teacher",
                       formatter_class=_ShowDefaults)
    h.add_argument("ckpt", type=Path, help="a trit checkpoint (one plane)")
    h.add_argument("out_dir", type=Path)
    h.add_argument("--teacher", type=Path, required=True, help="the float checkpoint it was made from")
    h.add_argument("--steps", type=int, default=heal_defaults.steps, help="steps of the main phase (codes free)")
    h.add_argument("--lr", type=float, default=heal_defaults.lr, help="learning rate of the scales and norms")
    h.add_argument("--weight-lr", type=float, default=heal_defaults.weight_lr,
                   help="learning rate of the latent weights and embeddings")
    h.add_argument("--train-embeddings", action="store_true", help="the float embeddings and lm_head train too")
    h.add_argument("--batch", type=int, default=heal_defaults.batch, help="sequences a step")
    h.add_argument("--seq-len", type=int, default=heal_defaults.seq_len, help="tokens a sequence")
    h.add_argument("--data", type=Path, default=None, help="training text (default: sequences the teacher samples)")
    h.add_argument("--train-samples", type=int, default=heal_defaults.train_samples,
                   help="training sequences (windows of --data, or sampled by the teacher)")
    h.add_argument("--heldout-samples", type=int, default=heal_defaults.heldout_samples,
                   help="held-out sequences the best student is chosen on")
    h.add_argument("--mix-sampled", type=int, default=heal_defaults.mix_sampled, metavar="N",
                   help="with --data: N sequences the teacher samples join the text's training windows (2048 "
                        "gave the best measured heal of SmolLM2-135M on a GPU; sampling is slow on a CPU)")
    h.add_argument("--sample-batch", type=int, default=heal_defaults.sample_batch,
                   help="sequences the teacher samples at once (without --data, or with --mix-sampled)")
    h.add_argument("--freeze-codes", action="store_true", help="train the scales and norms only; the codes stay")
    h.add_argument("--scales-first", type=int, default=heal_defaults.scales_first, metavar="N",
                   help="first N steps with every code fixed (scales and norms learn, and the embeddings with "
                        "--train-embeddings); --steps more from that phase's best state (0: one phase)")
    h.add_argument("--scales-first-lr", type=float, default=heal_defaults.scales_first_lr,
                   help="the scales' learning rate in that first phase")
    h.add_argument("--eval-every", type=int, default=heal_defaults.eval_every,
                   help="steps between held-out evaluations")
    h.add_argument("--grad-checkpointing", action=argparse.BooleanOptionalAction,
                   default=heal_defaults.grad_checkpointing,
                   help="recompute activations in the backward pass (less memory, one more forward pass a step)")
    h.add_argument("--compile", action=argparse.BooleanOptionalAction, default=heal_defaults.compile,
                   help="torch.compile the training step: fewer, fused kernels (default: on CUDA; the first step of "
                        "each phase compiles, about 20 s for SmolLM2-135M on an H200 machine)")
    h.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    h.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    h.add_argument("--quiet", action="store_true", help="no progress bars")

    def runtime_flags(a: argparse.ArgumentParser) -> None:
        a.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
        a.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None,
                       help="activation dtype (default: bf16 on GPU, fp32 on CPU)")

    g = sub.add_parser("generate", help="generate text, streamed")
    g.add_argument("ckpt", type=Path)
    g.add_argument("prompt")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    g.add_argument("--truncate", action="store_true",
                   help="a prompt that leaves no room in the model's context: keep its last tokens (default: refuse)")
    runtime_flags(g)

    e = sub.add_parser("eval", help="perplexity of a trit or float checkpoint on a text file")
    e.add_argument("ckpt", type=Path)
    e.add_argument("--ppl", type=Path, required=True, metavar="FILE", help="text file, e.g. WikiText-2 test")
    e.add_argument("--seq-len", type=int, default=512)
    e.add_argument("--stride", type=int, default=None, help="default: --seq-len (non-overlapping windows)")
    e.add_argument("--max-windows", type=int, default=16, help="0: the whole file")
    e.add_argument("--first-token", type=int, default=0)
    runtime_flags(e)

    a = sub.add_parser("audit", help="reconcile a trit checkpoint: config, tensors, layout, values")
    a.add_argument("ckpt", type=Path)

    pl = sub.add_parser("plan", help="GPU memory ledger: weights, KV cache, activations; does it fit")
    pl.add_argument("ckpt", type=Path, help="a checkpoint folder or a config.json")
    pl.add_argument("--gpu-mem", default="24GiB")
    pl.add_argument("--max-seq-len", type=int, default=8192)
    pl.add_argument("--batch", type=int, default=1)
    pl.add_argument("--kv-cache-dtype", default="auto", help="auto (the model dtype), fp8, float16, bfloat16")
    pl.add_argument("--group-size", type=int, default=fmt.DEFAULT_GROUP_SIZE,
                    help="for a float config: the group trit would use")
    pl.add_argument("--overhead", default="1.5GiB", help="CUDA context, workspaces and graphs (an assumption)")

    d = sub.add_parser("demo", help="SmolLM2-135M: quantize, generate side by side, perplexity, size, speed")
    d.add_argument("--ppl", type=Path, default=Path("../shared/data/wikitext-2-raw-test.txt"))
    d.add_argument("--max-new-tokens", type=int, default=48)
    runtime_flags(d)

    b = sub.add_parser("bench", help="GPU benchmarks (JSON and a plot)")
    b.add_argument("what", choices=["kernels", "a8", "decode", "serve"],
                   help="kernels: trit::linear vs bf16; a8: int8-activation prefill; decode: whole models, "
                        "runtime and vLLM (its own flags: trit bench decode --help); serve: vLLM's OpenAI server "
                        "under load, vLLM's own client (trit bench serve --help)")
    b.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    b.add_argument("--quick", action="store_true", help="M in {1, 4} only")
    b.add_argument("--ms", default=None, help="kernels: the M values, comma-separated (default: 1,4,16,64,256,2048)")
    b.add_argument("--no-tune", action="store_true", help="time the configs as they are, without tuning first")
    b.add_argument("--tune-ms", default=None,
                   help="kernels: tune only these M values (comma-separated); the others run the table as it is")
    b.add_argument("--tuned-out", type=Path, default=None,
                   help="write the tuned config table here (JSON); an existing table is updated in place")
    return p


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "quantize":
        opts = ConvertOptions(
            method=Method(args.method), group_size=args.group_size,
            keep=tuple(k.strip() for k in args.keep.split(",") if k.strip()),
            pad_policy=fmt.PadPolicy(args.pad), scale_dtype=fmt.ScaleDtype(args.scale_dtype),
            overwrite=args.overwrite, device=args.device, planes=args.planes,
            calib=CalibOptions(args.calib, args.calib_samples, args.calib_seq_len),
            act_order=args.act_order, damp=args.damp, float_target=args.float_target, passes=args.passes,
        )
        return quantize(args.model_dir, args.out_dir, opts, args.quiet)
    if args.command == "import":
        return import_checkpoint(args.model_dir, args.out_dir, args.overwrite, args.quiet)
    if args.command == "heal":
        from trit.heal import heal

        opts = HealOptions(args.steps, args.lr, args.batch, args.seq_len, args.data, args.train_samples,
                           args.heldout_samples, args.eval_every, args.device, sample_batch=args.sample_batch,
                           grad_checkpointing=args.grad_checkpointing, freeze_codes=args.freeze_codes,
                           weight_lr=args.weight_lr, train_embeddings=args.train_embeddings,
                           scales_first=args.scales_first, scales_first_lr=args.scales_first_lr,
                           compile=args.compile, mix_sampled=args.mix_sampled)
        heal(args.ckpt, args.teacher, args.out_dir, opts, overwrite=args.overwrite, progress=not args.quiet)
        return 0
    if args.command == "generate":
        from trit.runtime import SamplingOptions

        sampling = SamplingOptions(args.max_new_tokens, args.temperature, args.top_p, args.top_k,
                                   args.repetition_penalty, args.seed)
        return generate(args.ckpt, args.prompt, sampling, args.chat, args.device, args.dtype, args.truncate)
    if args.command == "eval":
        from trit.eval.perplexity import PerplexityOptions

        opts = PerplexityOptions(args.seq_len, args.stride or 0, args.max_windows, args.first_token)
        return evaluate(args.ckpt, args.ppl, opts, args.device, args.dtype)
    if args.command == "audit":
        return audit(args.ckpt)
    if args.command == "plan":
        from trit.eval.plan import PlanOptions, parse_size, plan

        opts = PlanOptions(parse_size(args.gpu_mem), args.max_seq_len, args.batch, args.kv_cache_dtype,
                           group_size=args.group_size, overhead=parse_size(args.overhead, "--overhead"))
        result = plan(args.ckpt, opts)
        print(result.table(opts))
        return 0 if result.fits else 1
    if args.command == "demo":
        from trit.demo import demo

        return demo(args.ppl, args.max_new_tokens, args.device, _dtype(args.dtype))
    if args.command == "bench" and args.what == "a8":
        from trit.bench.a8 import main as bench_a8

        return bench_a8(args.out)
    if args.command == "bench":
        from trit.bench.kernels import main as bench_kernels

        ms = tuple(int(m) for m in args.ms.split(",")) if args.ms else None
        tune_ms = tuple(int(m) for m in args.tune_ms.split(",")) if args.tune_ms else None
        return bench_kernels(args.out, quick=args.quick, tune=not args.no_tune, tuned_out=args.tuned_out, ms=ms,
                             tune_ms=tune_ms)
    raise AssertionError(args.command)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "decode"]:  # its own flags: ``trit bench decode --help``
        from trit.bench.decode import main as bench_decode

        return bench_decode(argv[2:])
    if argv[:2] == ["bench", "serve"]:  # its own flags: ``trit bench serve --help``
        from trit.bench.serve import main as bench_serve

        return bench_serve(argv[2:])
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except TritError as e:
        print(f"trit: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("trit: interrupted; nothing was left half-written", file=sys.stderr)
        return 130
