"""The ``trit`` command line: a thin argument parser over typed functions.

``trit quantize | import | heal | generate | eval | audit | plan | demo | bench``, also ``python -m trit``.
Errors about the user's input (a bad checkpoint, a bad path, a bad flag) print
one line ``trit: error: ...`` and exit with status 2; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from trit import format as fmt
from trit.configs import (
    FIRST,
    AbsmeanConfig,
    CalibConfig,
    GPTQConfig,
    HealConfig,
    Layout,
    QuantConfig,
    TWNConfig,
    W4A8Config,
)
from trit.errors import TritError
from trit.eval.gsm8k import Gsm8kOptions
from trit.eval.perplexity import PerplexityOptions
from trit.quant import Method
from trit.runtime import SamplingOptions

EXIT_USAGE = 2


def quantize(args: argparse.Namespace) -> int:
    from trit.api import quantize as run

    config, layout = quantize_configs(args)
    print(run(args.model_dir, args.out_dir, config, layout, args.overwrite, progress=not args.quiet).summary())
    return 0


def calib_config(args: argparse.Namespace) -> CalibConfig:
    """``trit quantize``'s calibration flags (both schemes)."""
    return CalibConfig(args.calib, args.calib_samples, args.calib_seq_len, first=args.calib_first,
                       batch=args.calib_batch, cache=args.calib_cache)


# the flag each config field comes from, for errors in the CLI's words
FLAG_OF = {"group_size": "--group-size", "planes": "--planes", "device": "--device", "damp": "--damp",
           "passes": "--passes", "samples": "--calib-samples", "seq_len": "--calib-seq-len", "batch": "--calib-batch",
           "first": "--calib-first", "tensor_parallel_size": "--tensor-parallel-size", "lm_head": "--lm-head", "bits": "--bits"}


@contextlib.contextmanager
def _as_flags():
    """A config's refusal (:class:`~trit.errors.ConfigError`) said again with the flag its field comes from."""
    from trit.errors import ConfigError, OptionError

    try:
        yield
    except ConfigError as e:
        raise OptionError(f"{FLAG_OF.get(e.field, e.field)} {e.value}: expected {e.expected}") from None


def heal_config(args: argparse.Namespace) -> HealConfig:
    """``trit heal``'s flags as :class:`~trit.configs.HealConfig` (also for scripts that run heal with CLI flags)."""
    return HealConfig(args.steps, args.lr, args.batch, args.seq_len, args.data, args.train_samples,
                      args.heldout_samples, args.eval_every, args.device, sample_batch=args.sample_batch,
                      grad_checkpointing=args.grad_checkpointing, freeze_codes=args.freeze_codes,
                      weight_lr=args.weight_lr, train_embeddings=args.train_embeddings,
                      scales_first=args.scales_first, scales_first_lr=args.scales_first_lr,
                      compile=args.compile, mix_sampled=args.mix_sampled, sample_first=args.sample_first)


def quantize_configs(args: argparse.Namespace) -> tuple[QuantConfig, Layout]:
    """``trit quantize``'s flags as the typed configs the Python API takes (:mod:`trit.configs`); a flag left
    unset takes the config's default; a value a config refuses is refused by its flag."""
    with _as_flags():
        return _quantize_configs(args)


def _quantize_configs(args: argparse.Namespace) -> tuple[QuantConfig, Layout]:
    from trit.compressed import parse_group_size
    from trit.errors import OptionError

    knobs = dict(damp=args.damp, act_order=args.act_order) | ({} if args.passes is None else {"passes": args.passes})
    if args.scheme == "w4a8":
        ternary_only = [flag for flag, used in (("--planes", args.planes != 1), ("--bits", args.bits is not None),
                                                ("--keep", bool(args.keep)),
                                                ("--lm-head", args.lm_head != "stored"),
                                                ("--activations", args.activations != "none"),
                                                ("--method", args.method != Method.GPTQ.value),
                                                ("--float-target", args.float_target is not None)) if used]
        if ternary_only:
            raise OptionError(f"{', '.join(ternary_only)}: ternary only; --scheme w4a8 is GPTQ on every decoder "
                              "linear")
        return W4A8Config(parse_group_size(args.group_size), calib_config(args), args.rotate, args.device,
                          args.tensor_parallel_size, **knobs), Layout()
    group, method = _int_flag(args.group_size, "--group-size"), Method(args.method)
    if args.bits is not None and args.planes != 1:
        raise OptionError(f"--bits {args.bits} with --planes {args.planes}: a bits budget chooses each layer's planes")
    if args.bits is not None and method is not Method.GPTQ:
        raise OptionError(f"--bits with --method {method.value}: a bits budget needs --method gptq (its calibration "
                          "pass measures what a second plane buys in each layer)")
    if method is Method.GPTQ:
        config: QuantConfig = GPTQConfig(group, args.planes, calib_config(args), args.rotate, args.device,
                                         float_target=args.float_target, bits=args.bits, **knobs)
    else:
        config = (TWNConfig if method is Method.TWN else AbsmeanConfig)(group, args.planes, args.rotate, args.device)
    layout = Layout(tuple(k.strip() for k in args.keep.split(",") if k.strip()), fmt.PadPolicy(args.pad),
                    fmt.ScaleDtype(args.scale_dtype), args.lm_head, fmt.ActivationQuant(
                        "int8_per_token" if args.activations == "int8" else "none"))
    return config, layout


def _int_flag(text: str, flag: str) -> int:
    from trit.errors import OptionError

    try:
        return int(text)
    except ValueError:
        raise OptionError(f"{flag} {text!r}: expected an integer") from None


def import_checkpoint(src: Path, out_dir: Path, overwrite: bool, quiet: bool = False) -> int:
    """One importer per source: a GGUF file, a BitNet checkpoint, or a float checkpoint already ternary."""
    from trit.checkpoint import CheckpointError, read_config

    if src.is_file():
        with open(src, "rb") as f:
            if f.read(4) != b"GGUF":
                raise CheckpointError(src, "expected a GGUF file (magic 'GGUF') or a checkpoint folder")
        from trit.import_gguf import import_gguf as run
    elif src.is_dir() and (src / "config.json").is_file() and read_config(src).get("quantization_config") is None:
        from trit.import_trilm import import_trilm as run
    else:
        from trit.import_bitnet import import_bitnet as run
    report = run(src, out_dir, overwrite=overwrite, progress=not quiet)
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


def writable_file(path: Path, flag: str) -> None:
    """Refuse, before any work, an output file that cannot be written: a folder, or in a folder that is not one."""
    from trit.errors import OptionError

    if path.is_dir():
        raise OptionError(f"{flag} {path}: expected a file to write, found a folder")
    if not path.parent.is_dir():
        raise OptionError(f"{flag} {path}: its folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OptionError(f"{flag} {path}: cannot be written here")


def evaluate(ckpt: Path, corpora: list[str], opts: PerplexityOptions, device: str | None, dtype: str | None,
             json_out: Path | None = None, gsm8k: Gsm8kOptions | None = None) -> int:
    import json
    from dataclasses import asdict

    if json_out is not None:
        writable_file(json_out, "--json")

    from trit.corpora import read

    for name in corpora:
        read(name)  # every corpus readable before the model loads
    out: dict = {"checkpoint": str(ckpt)}
    if corpora:
        from trit import runtime
        from trit.eval.perplexity import geometric_mean, perplexities

        loaded = runtime.load(ckpt, device=device, dtype=_dtype(dtype))
        results = perplexities(loaded, corpora, opts)
        for label, r in results.items():
            print(f"perplexity {r.perplexity:.3f} over {r.tokens_scored} tokens "
                  f"({r.windows} windows, tokens {r.first_token}..{r.last_token} of {label}; {r.seconds:.1f} s)")
        mean = geometric_mean([r.perplexity for r in results.values()])
        if len(results) > 1:
            print(f"geometric mean over {len(results)} corpora: {mean:.3f}")
        out |= {"options": asdict(opts), "geometric_mean": mean, "corpora": {k: asdict(r) for k, r in results.items()}}
        del loaded
    if gsm8k is not None:
        from trit.eval.gsm8k import run_gsm8k

        g = run_gsm8k(ckpt, gsm8k)
        scores = ", ".join(f"{k} {v:.3f}" + (f" +- {g.stderr[k]:.3f}" if k in g.stderr else "")
                           for k, v in g.exact_match.items())
        print(f"gsm8k {gsm8k.fewshot}-shot exact match over {g.samples} problems: {scores} ({g.seconds:.0f} s)")
        out["gsm8k"] = asdict(g)
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=1))
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


class _Help(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; each option ends with its default where it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, "", argparse.SUPPRESS) \
                and "default" not in text:
            text += " (default: %(default)s)"
        return text


def _command(sub, name: str, summary: str, description: str, example: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=summary, description=f"{summary}.\n\n{description}",
                          epilog=f"example:\n  {example}", formatter_class=_Help)


def _runtime_flags(a: argparse.ArgumentParser) -> None:
    a.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    a.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None,
                   help="activation dtype (default: bf16 on a GPU, fp32 on a CPU)")


def _quantize_parser(sub) -> None:
    d, lay, w4 = GPTQConfig(), Layout(), W4A8Config()  # the configs' defaults are the CLI's
    q = _command(sub, "quantize", "make a float Hugging Face checkpoint ternary (or W4A8)",
                 "Methods: gptq (the default) rounds each layer onto its ternary grid with Hessian-aware error\n"
                 "feedback, on calibration text (--calib FILE, or by default text the float model samples itself);\n"
                 "absmean is BitNet's naive rounding (instant, and ruinous for a model not trained ternary); twn\n"
                 "fits each group's threshold and scale exactly, without data. --planes 2 stores two ternary planes\n"
                 "a layer (about 4.5 bits a weight); --bits B gives a second plane to the layers where it buys the\n"
                 "most, up to B bits a weight. Embeddings and lm_head stay in high precision.\n\n"
                 "--scheme w4a8: int4 GPTQ weights (group or channel scales) and int8 per-token activations,\n"
                 "written as compressed-tensors for stock vLLM (no plugin); same calibration flags.",
                 "trit quantize ./SmolLM2-135M ./smollm2-trit\n"
                 "  trit quantize ./SmolLM2-135M ./smollm2-trit2 --planes 2\n"
                 "  trit quantize ./SmolLM2-135M ./smollm2-trit3 --bits 3.0\n"
                 "  trit quantize ./SmolLM2-135M ./smollm2-w4a8 --scheme w4a8 --group-size 64")
    q.add_argument("model_dir", type=Path, help="a float checkpoint folder (config.json, safetensors)")
    q.add_argument("out_dir", type=Path, help="where the checkpoint goes (written atomically)")
    q.add_argument("--scheme", choices=["ternary", "w4a8"], default="ternary",
                   help="ternary (trit's format), or W4A8 (compressed-tensors)")
    q.add_argument("--method", choices=[m.value for m in Method], default=d.method.value,
                   help="ternary: how to round")
    q.add_argument("--group-size", default=str(d.group_size),
                   help="inputs per scale; -1 (ternary) or 'channel' (w4a8): one scale per row")
    q.add_argument("--planes", type=int, default=d.planes, choices=[1, 2],
                   help="ternary planes per layer: 2 stores W = a1*T1 + a2*T2 (about 4.5 bits a weight)")
    q.add_argument("--bits", type=float, default=None, metavar="B",
                   help="a bits budget (GPTQ): one plane everywhere, and a second plane for the layers where it cuts "
                        "the loss most per added bit (output error weighted by the layer's sensitivity), up to B "
                        "bits a weight as stored (between one plane's and two planes', e.g. 2.5 or 3.0 at groups of "
                        "64; default: --planes everywhere)")
    q.add_argument("--calib", default=None, metavar="TEXT",
                   help="calibration text: a file, or a built-in corpus (wikitext2, gsm8k, python: its calibration "
                        "half); default: text sampled from the float model (data-free)")
    q.add_argument("--calib-samples", type=int, default=d.calib.samples, help="calibration windows")
    q.add_argument("--calib-seq-len", type=int, default=d.calib.seq_len, help="tokens per window")
    q.add_argument("--device", default=d.device, help="where the quantizer runs (cpu, cuda)")
    q.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    q.add_argument("--quiet", action="store_true", help="no progress bars")
    s = q.add_argument_group("how it is stored and served")
    s.add_argument("--keep", default="", help="ternary: comma-separated modules (globs allowed) kept in high precision")
    s.add_argument("--lm-head", choices=list(fmt.LM_HEADS), default=lay.lm_head,
                   help="ternary: the output layer when the model is served: as stored, or int8 rows (one scale a "
                        "row, rounded when loaded; half the bytes a decode step reads there); TRIT_LM_HEAD overrides "
                        "it at load time")
    s.add_argument("--activations", choices=["none", "int8"], default="none",
                   help="ternary: the activations when the model is served: as they are, or rounded to int8 per "
                        "token (W1.58A8, BitNet's arithmetic; docs/quantization.md measures its cost); "
                        "TRIT_ACTIVATIONS overrides it at load time")
    s.add_argument("--pad", choices=[x.value for x in fmt.PadPolicy], default=lay.pad_policy.value,
                   help="ternary: layers whose K is not a multiple of the group: pad with zeros, or keep them")
    s.add_argument("--scale-dtype", choices=[x.value for x in fmt.ScaleDtype], default=lay.scale_dtype.value,
                   help="ternary: the stored scales' dtype (w4a8 stores them in the model's dtype)")
    s.add_argument("--tensor-parallel-size", type=int, default=w4.tensor_parallel_size,
                   help="w4a8: also check the group against each rank's slice of the row-parallel layers")
    r = q.add_argument_group("research knobs (the defaults are the recipe every measured result used)")
    r.add_argument("--rotate", action=argparse.BooleanOptionalAction, default=None,
                   help="rotate the residual stream and each value head before rounding (the same model, "
                        "weights and activations without outlier channels; Llama, Mistral, Qwen2, Qwen3). A model "
                        "with tied embeddings gets an lm_head of its own (default: on for gptq and --scheme w4a8, "
                        "off for absmean and twn)")
    r.add_argument("--calib-batch", type=int, default=d.calib.batch,
                   help="data-free: windows the float model samples at once (more: faster, more memory)")
    r.add_argument("--calib-first", choices=FIRST, default=d.calib.first,
                   help="data-free: each sampled window starts from BOS and a token drawn at random from the "
                        "vocabulary (random), or from BOS alone (bos)")
    r.add_argument("--calib-cache", action=argparse.BooleanOptionalAction, default=d.calib.cache,
                   help="data-free: keep the sampled windows in $TRIT_CACHE/calib and reuse them for the same "
                        "model, options and device type")
    r.add_argument("--act-order", action=argparse.BooleanOptionalAction, default=d.act_order,
                   help="gptq: columns by decreasing Hessian diagonal")
    r.add_argument("--damp", type=float, default=d.damp, help="gptq: damping, a fraction of mean(diag(H))")
    r.add_argument("--passes", type=int, default=None,
                   help=f"gptq: rounding passes; each later pass rounds again onto the scales the one before "
                        f"refitted (default: {d.passes} ternary, {w4.passes} w4a8)")
    r.add_argument("--float-target", action=argparse.BooleanOptionalAction, default=None,
                   help="gptq: aim each layer at the float model's outputs on float inputs (default: for one "
                        "plane); --no-float-target: plain GPTQ (default for two planes)")


def _heal_parser(sub) -> None:
    d = HealConfig()  # one set of defaults: the CLI shows the library's
    h = _command(sub, "heal", "distil the float model back into a ternary checkpoint (best on a GPU)",
                 "The student starts at the ternary checkpoint; its latent weights and scales learn to match the\n"
                 "float teacher's next-token distribution (KL), re-quantized every step; the best student by\n"
                 "held-out KL is written. Data-free by default (sequences the teacher samples); --data TEXT trains\n"
                 "on text, --mix-sampled N adds sampled sequences to it.",
                 "trit heal ./smollm2-trit ./smollm2-healed --teacher ./SmolLM2-135M")
    h.add_argument("ckpt", type=Path, help="a trit checkpoint (each trit-plane's codes and scales train)")
    h.add_argument("out_dir", type=Path)
    h.add_argument("--teacher", type=Path, required=True, help="the float checkpoint it was made from")
    h.add_argument("--steps", type=int, default=d.steps, help="steps of the main phase (codes free)")
    h.add_argument("--lr", type=float, default=d.lr, help="learning rate of the scales and norms")
    h.add_argument("--weight-lr", type=float, default=d.weight_lr,
                   help="learning rate of the latent weights and embeddings")
    h.add_argument("--train-embeddings", action="store_true", help="the float embeddings and lm_head train too")
    h.add_argument("--batch", type=int, default=d.batch, help="sequences a step")
    h.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens a sequence")
    h.add_argument("--data", type=Path, default=None, help="training text (default: sequences the teacher samples)")
    h.add_argument("--train-samples", type=int, default=d.train_samples,
                   help="training sequences (default: 4096 sampled by the teacher, chosen on three domains; 2048 "
                        "windows of --data)")
    h.add_argument("--heldout-samples", type=int, default=d.heldout_samples,
                   help="held-out sequences the best student is chosen on")
    h.add_argument("--mix-sampled", type=int, default=d.mix_sampled, metavar="N",
                   help="with --data: N sequences the teacher samples join the text's training windows")
    h.add_argument("--sample-batch", type=int, default=d.sample_batch,
                   help="sequences the teacher samples at once (without --data, or with --mix-sampled; default: "
                        "512 on CUDA, halved while their KV cache would take over a quarter of the free GPU "
                        "memory; 64 on the CPU)")
    h.add_argument("--sample-first", choices=FIRST, default=d.sample_first,
                   help="how each teacher-sampled sequence starts (as quantize's --calib-first)")
    h.add_argument("--freeze-codes", action="store_true", help="train the scales and norms only; the codes stay")
    h.add_argument("--scales-first", type=int, default=d.scales_first, metavar="N",
                   help="first N steps with every code fixed; --steps more from that phase's best state (0: one "
                        "phase)")
    h.add_argument("--scales-first-lr", type=float, default=d.scales_first_lr,
                   help="the scales' learning rate in that first phase")
    h.add_argument("--eval-every", type=int, default=d.eval_every, help="steps between held-out evaluations")
    h.add_argument("--grad-checkpointing", action=argparse.BooleanOptionalAction, default=d.grad_checkpointing,
                   help="recompute activations in the backward pass (less memory, one more forward pass a step)")
    h.add_argument("--compile", action=argparse.BooleanOptionalAction, default=d.compile,
                   help="torch.compile the training step (default: on CUDA)")
    h.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    h.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    h.add_argument("--quiet", action="store_true", help="no progress bars")


def _bench_parser(sub) -> None:
    from trit.bench import cpu, decode, memory, serve

    b = sub.add_parser("bench", help="GPU benchmarks: kernels, a8, decode, serve (JSON and a plot)",
                       description="Benchmarks; each writes JSON (with its command) and a plot.", formatter_class=_Help)
    bsub = b.add_subparsers(dest="what", required=True)
    k = _command(bsub, "kernels", "trit::linear against bf16 cuBLAS on Llama-3-8B, Qwen2-1.5B and 27B layer shapes",
                 "CUDA-graph replays, weights rotated past the L2, the copy bandwidth of the same run; tunes each\n"
                 "problem's kernel configs first unless told not to. A table written with --tuned-out and copied\n"
                 "into src/trit/kernels/tuned/ ships: it is read only on a GPU of the model named in its device\n"
                 "field (h100.json on an H100); a GPU without one runs the rules of thumb. --explain prints, for\n"
                 "each layer and M, the layout and kernel this machine would choose and why, and times nothing.",
                 "trit bench kernels --tune-ms 4,16,64 --out benchmarks/results --tuned-out h200.json\n"
                 "  trit bench kernels --models llama3-8b,bitnet-2b4t --activations int8 --group -1 --peers humming\n"
                 "  trit bench kernels --explain --models llama3-8b --ms 1,64 --activations int8")
    k.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder for kernels.json/png")
    k.add_argument("--quick", action="store_true", help="M in {1, 4} only")
    k.add_argument("--ms", default=None, help="the M values, comma-separated (default: 1,4,16,64,128,256,512,2048)")
    k.add_argument("--models", default=None, help="these models' layer shapes only, comma-separated "
                   "(default: llama3-8b,qwen2-1.5b,27b; also bitnet-2b4t)")
    k.add_argument("--no-tune", action="store_true", help="time the configs as they are, without tuning first")
    k.add_argument("--tune-ms", default=None, help="tune only these M values; the others run the table as it is")
    k.add_argument("--tuned-out", type=Path, default=None,
                   help="write the tuned config table here (JSON); an existing table of this GPU is updated in "
                        "place, one tuned on another GPU is refused")
    k.add_argument("--baseline", type=Path, default=None,
                   help="compare each problem's time with this baseline (regression guard); exit 1 on a regression")
    k.add_argument("--write-baseline", type=Path, default=None, help="record this run as a baseline")
    k.add_argument("--tolerance", type=float, default=0.05, help="allowed slow-down, relative")
    k.add_argument("--explain", action="store_true", help="print each layer's layout and kernel choice with "
                   "the reasons, on this machine; time nothing")
    k.add_argument("--activations", choices=["bf16", "int8"], default="bf16",
                   help="the activations the layers take (int8: rounded per token, W1.58A8, inside the timed op)")
    k.add_argument("--group", type=int, default=fmt.DEFAULT_GROUP_SIZE,
                   help="inputs a weight scale (-1: one scale a row, as BitNet imports hold them)")
    k.add_argument("--peers", default="", help="other libraries' kernels timed on the same weights, comma-separated "
                   "(humming: humming-kernels' W2A16 and W2A8)")
    c = _command(bsub, "check", "compare a result file already written with a baseline (regression guard)",
                 "A kernels.json or a trit bench serve JSON: each figure against the same key of the baseline.",
                 "trit bench check benchmarks/results/kernels.json --baseline benchmarks/baselines/kernels_h200.json")
    c.add_argument("result", type=Path)
    c.add_argument("--baseline", type=Path, default=None)
    c.add_argument("--write-baseline", type=Path, default=None)
    c.add_argument("--tolerance", type=float, default=0.05, help="allowed growth, relative")
    a = _command(bsub, "a8", "int8-activation (W1.58A8) prefill against bf16 cuBLAS",
                 "BitNet-2B and Llama-3-8B shapes, M from 64 to 8192.", "trit bench a8 --out benchmarks/results")
    a.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    for name, module, what in (
            ("decode", decode, "whole models, bf16 against trit, in trit's runtime and in-process vLLM"),
            ("serve", serve, "vLLM's OpenAI server under load, vLLM's own client, bf16 against trit"),
            ("memory", memory, "bytes on disk, bits a weight, plan ledgers, quantize's peak RSS (CPU; regression guard)"),
            ("cpu", cpu, "ternary on the CPU against torch's float and llama.cpp: layers and SmolLM2 end to end")):
        bsub.add_parser(name, parents=[module.parser(add_help=False)], formatter_class=_Help, help=what,
                        description=module.__doc__.split("\n\n")[0])
    bsub.add_parser("sass", help="each GPU kernel compiled for sm_90 offline: registers, loop instructions (CPU; "
                    "regression guard); trit bench sass --help", add_help=False)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trit", formatter_class=_Help,
                                description="Ternary language models: quantize, run, serve.",
                                epilog="start here:\n  trit demo\n  trit quantize MODEL_DIR OUT_DIR\n"
                                       "  trit generate OUT_DIR \"Hello\"\n  vllm serve OUT_DIR")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _quantize_parser(sub)

    i = _command(sub, "import", "import a natively ternary model: GGUF, BitNet or ternary float checkpoint",
                 "Exact: the source's codes and scales, never rounded again. SOURCE is a GGUF file (TQ1_0, TQ2_0,\n"
                 "Q2_0, PQ2_0, PTQ1_0, I2_S; llama, qwen2, qwen3, bitnet), a transformers BitNet checkpoint\n"
                 "(quant_method 'bitnet'), or a float checkpoint whose linear weights are {0, +-s} (TriLM).",
                 "trit import ./Ternary-Bonsai-8B-Q2_0.gguf ./bonsai-trit\n"
                 "  trit import ./bitnet-b1.58-2B-4T ./bitnet-trit")
    i.add_argument("model_dir", type=Path, metavar="SOURCE")
    i.add_argument("out_dir", type=Path)
    i.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    i.add_argument("--quiet", action="store_true", help="no progress bar")

    e = _command(sub, "export", "export a trit checkpoint to GGUF for llama.cpp, ollama and LM Studio",
                 "Exact where the groups allow: q2_0 from groups of 64 (or one scale a row), tq2_0 and tq1_0\n"
                 "from groups of 256; otherwise refused naming the layer, unless --requantize.",
                 "trit export ./smollm2-trit ./smollm2-trit.gguf --type q2_0")
    e.add_argument("ckpt", type=Path)
    e.add_argument("out_file", type=Path, metavar="OUT.gguf")
    e.add_argument("--type", dest="qtype", choices=["q2_0", "tq2_0", "tq1_0"], default="q2_0",
                   help="ternary tensor type (default: q2_0, 2.25 bits; tq2_0 2.06; tq1_0 1.69)")
    e.add_argument("--embeddings", choices=["f16", "q8_0"], default="f16", help="embeddings and output layer")
    e.add_argument("--requantize", action="store_true",
                   help="round layers whose groups do not fit the type's blocks again (the summary prints the cost)")
    e.add_argument("--tokenizer-from", type=Path, default=None, metavar="FILE.gguf",
                   help="copy the tokenizer keys from this GGUF (default: build them from tokenizer.json)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing OUT.gguf")

    _heal_parser(sub)

    s = SamplingOptions()
    g = _command(sub, "generate", "generate text from a trit (or float) checkpoint, streamed",
                 "Greedy by default; --temperature > 0 samples (with --top-p, --top-k).",
                 "trit generate ./smollm2-trit \"What is the capital of France?\" --chat")
    g.add_argument("ckpt", type=Path)
    g.add_argument("prompt")
    g.add_argument("--max-new-tokens", type=int, default=s.max_new_tokens, help="at least 1")
    g.add_argument("--temperature", type=float, default=s.temperature, help="0: greedy; else >= 0")
    g.add_argument("--top-p", type=float, default=s.top_p, help="in (0, 1]; 1: off")
    g.add_argument("--top-k", type=int, default=s.top_k, help="0: off")
    g.add_argument("--repetition-penalty", type=float, default=s.repetition_penalty, help="> 0; 1: off")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    g.add_argument("--truncate", action="store_true",
                   help="a prompt that leaves no room in the model's context: keep its last tokens (default: refuse)")
    _runtime_flags(g)

    po = PerplexityOptions()
    ge = Gsm8kOptions()
    e = _command(sub, "eval", "perplexity on one or more corpora; GSM8K accuracy through vLLM and lm-eval",
                 "Takes float, trit and W4A8 checkpoints alike. Built-in corpora (shipped with trit): wikitext2\n"
                 "(prose), gsm8k (maths word problems), python (source code); any other name is a text file.\n"
                 "Windows of --seq-len tokens from the start of each; with several corpora the geometric mean of\n"
                 "their perplexities is printed too. --gsm8k serves the checkpoint with vLLM on 127.0.0.1 and runs\n"
                 "lm-eval's GSM8K task (greedy, exact match) on the GSM8K test set trit ships, offline.",
                 "trit eval ./smollm2-trit --ppl wikitext2,gsm8k,python\n"
                 "  trit eval ./smollm2-w4a8 --gsm8k --limit 50")
    e.add_argument("ckpt", type=Path)
    e.add_argument("--ppl", default=None, metavar="CORPORA",
                   help="comma-separated corpus names or files (default: wikitext2, unless --gsm8k alone)")
    e.add_argument("--seq-len", type=int, default=po.seq_len)
    e.add_argument("--stride", type=int, default=None, help="default: --seq-len (non-overlapping windows)")
    e.add_argument("--max-windows", type=int, default=po.max_windows, help="0: the whole text")
    e.add_argument("--first-token", type=int, default=po.first_token)
    e.add_argument("--json", type=Path, default=None, help="also write the results here")
    _runtime_flags(e)
    gg = e.add_argument_group("gsm8k (lm-eval through vLLM's OpenAI server)")
    gg.add_argument("--gsm8k", action="store_true", help="score GSM8K exact match")
    gg.add_argument("--limit", type=int, default=ge.limit, help="the first N problems (default: all 1319)")
    gg.add_argument("--fewshot", type=int, default=ge.fewshot, help="worked examples before each problem")
    gg.add_argument("--max-gen-toks", type=int, default=ge.max_gen_toks, help="tokens an answer may take")
    gg.add_argument("--concurrency", type=int, default=ge.concurrency, help="requests in flight")
    gg.add_argument("--request-timeout", type=float, default=ge.request_timeout, help="seconds a request may take")
    gg.add_argument("--max-model-len", type=int, default=ge.max_model_len, help="the server's context")
    gg.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for the vLLM server (repeatable), e.g. --server-arg=--dtype=float32")
    gg.add_argument("--lm-eval-python", default=None, metavar="PYTHON",
                    help="the interpreter of an environment with lm-eval (default: this one)")

    a = _command(sub, "audit", "reconcile a trit checkpoint: config, tensors, layout, values",
                 "Every check is a row; a failure names the tensor. Exit status 1 on any failure.",
                 "trit audit ./smollm2-trit")
    a.add_argument("ckpt", type=Path)

    pl = _command(sub, "plan", "GPU memory ledger of serving a checkpoint: weights, KV cache, activations",
                  "From the safetensors headers, or from a bare config.json as trit would store it. Exit status 1\n"
                  "when it does not fit --gpu-mem.", "trit plan ./llama3-8b-trit --gpu-mem 24GiB --batch 4")
    pl.add_argument("ckpt", type=Path, help="a checkpoint folder or a config.json")
    pl.add_argument("--gpu-mem", default="24GiB")
    pl.add_argument("--max-seq-len", type=int, default=8192)
    pl.add_argument("--batch", type=int, default=1)
    pl.add_argument("--kv-cache-dtype", default="auto", help="auto (the model dtype), fp8, float16, bfloat16")
    pl.add_argument("--group-size", type=int, default=fmt.DEFAULT_GROUP_SIZE,
                    help="for a float config: the group trit would use")
    pl.add_argument("--overhead", default="1.5GiB", help="CUDA context, workspaces and graphs (an assumption)")
    pl.add_argument("--rotate", action=argparse.BooleanOptionalAction, default=True,
                    help="for a float config: as trit quantize's default rotation writes it (a tied model of a "
                         "rotatable type gets an lm_head of its own); --no-rotate: as quantize --no-rotate")

    d = _command(sub, "demo", "SmolLM2-135M: bf16 against ternary, side by side",
                 "Makes the ternary checkpoints the CPU can make in a few minutes (GPTQ, and naive rounding for\n"
                 "comparison), then prints their answers, perplexity, size and speed beside bf16's.", "trit demo")
    d.add_argument("--max-new-tokens", type=int, default=48)
    _runtime_flags(d)

    _bench_parser(sub)
    return p


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "quantize":
        return quantize(args)
    if args.command == "import":
        return import_checkpoint(args.model_dir, args.out_dir, args.overwrite, args.quiet)
    if args.command == "export":
        from trit.export_gguf import export_gguf

        print(export_gguf(args.ckpt, args.out_file, args.qtype, args.embeddings, args.requantize,
                          args.tokenizer_from, args.overwrite).summary())
        return 0
    if args.command == "heal":
        from trit.heal import heal

        heal(args.ckpt, args.teacher, args.out_dir, heal_config(args), overwrite=args.overwrite,
             progress=not args.quiet)
        return 0
    if args.command == "generate":
        sampling = SamplingOptions(args.max_new_tokens, args.temperature, args.top_p, args.top_k,
                                   args.repetition_penalty, args.seed)
        return generate(args.ckpt, args.prompt, sampling, args.chat, args.device, args.dtype, args.truncate)
    if args.command == "eval":
        opts = PerplexityOptions(args.seq_len, args.stride or 0, args.max_windows, args.first_token)
        ppl = args.ppl if args.ppl is not None else ("" if args.gsm8k else "wikitext2")
        corpora = [c.strip() for c in ppl.split(",") if c.strip()]
        gsm8k = Gsm8kOptions(args.limit, args.fewshot, args.max_gen_toks, args.concurrency, args.request_timeout,
                             args.max_model_len, server_args=tuple(args.server_arg),
                             lm_eval_python=args.lm_eval_python) if args.gsm8k else None
        return evaluate(args.ckpt, corpora, opts, args.device, args.dtype, args.json, gsm8k)
    if args.command == "audit":
        return audit(args.ckpt)
    if args.command == "plan":
        from trit.eval.plan import PlanOptions, parse_size, plan

        opts = PlanOptions(parse_size(args.gpu_mem), args.max_seq_len, args.batch, args.kv_cache_dtype,
                           group_size=args.group_size, overhead=parse_size(args.overhead, "--overhead"),
                           rotate=args.rotate)
        result = plan(args.ckpt, opts)
        print(result.table(opts))
        return 0 if result.fits else 1
    if args.command == "demo":
        from trit.demo import demo

        return demo(args.max_new_tokens, args.device, _dtype(args.dtype))
    if args.command == "bench" and args.what == "a8":
        from trit.bench.a8 import main as bench_a8

        return bench_a8(args.out)
    if args.command == "bench" and args.what == "kernels":
        from trit.bench.kernels import Setting, explain
        from trit.bench.kernels import main as bench_kernels

        ms = tuple(int(m) for m in args.ms.split(",")) if args.ms else None
        models = tuple(args.models.split(",")) if args.models else None
        fmt.check_group_size(args.group, "--group")
        setting = Setting(args.group, args.activations == "int8", tuple(p for p in args.peers.split(",") if p))
        if args.explain:
            return explain(models, ms, setting)
        tune_ms = tuple(int(m) for m in args.tune_ms.split(",")) if args.tune_ms else None
        return bench_kernels(args.out, quick=args.quick, tune=not args.no_tune, tuned_out=args.tuned_out, ms=ms,
                             tune_ms=tune_ms, baseline=args.baseline, write_baseline=args.write_baseline,
                             tolerance=args.tolerance, models=models, setting=setting)
    if args.command == "bench" and args.what == "check":
        from trit.bench.guard import check

        return check(_report_of(args.result), args.baseline, args.write_baseline, args.tolerance)
    raise AssertionError(args.command)


def _report_of(result: Path):
    """The guard's figures of a result file a benchmark wrote (kernels.json, a trit bench serve JSON, a report)."""
    import json

    from trit.bench.guard import BaselineError, Report

    if not result.is_file():
        raise BaselineError(f"{result}: no such result file")
    data = json.loads(result.read_text())
    if "rows" in data and "summed_speedup_vs_bf16" in data:
        from trit.bench.kernels import guard_report
    elif "servers" in data:
        from trit.bench.serve import guard_report
    elif "figures" in data:
        return Report.from_json(result.read_text())
    else:
        raise BaselineError(f"{result}: not a kernels.json, a trit bench serve result or a guard report")
    return guard_report(data)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own = {"decode", "serve", "memory", "sass", "cpu"}  # benchmarks that parse (and record) their own argv
    if argv[:1] == ["bench"] and argv[1:2] and argv[1] in own and (argv[1] == "sass" or not {"-h", "--help"} & set(argv)):
        import importlib

        try:
            return importlib.import_module(f"trit.bench.{argv[1]}").main(argv[2:])
        except TritError as e:
            print(f"trit: error: {e}", file=sys.stderr)
            return EXIT_USAGE
    args = parser().parse_args(argv)
    try:
        with _signals_interrupt():
            return _dispatch(args)
    except TritError as e:
        print(f"trit: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Terminated as e:
        print(f"trit: {e.name}; nothing was left half-written", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("trit: interrupted; nothing was left half-written", file=sys.stderr)
        return 130


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (what ``timeout``, docker, Slurm and systemd send), raised where the process is, so that
    everything Ctrl-C cleans up (a half-written checkpoint folder) is cleaned up the same way."""

    def __init__(self, signum: int):
        import signal

        super().__init__(signum)
        self.signum, self.name = signum, signal.Signals(signum).name


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP raise :class:`Terminated` while the command runs (the main thread only; elsewhere, and
    where a signal cannot be caught, the handlers stay as they were)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated(signum)

    previous = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            previous[sig] = signal.signal(sig, raise_terminated)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
