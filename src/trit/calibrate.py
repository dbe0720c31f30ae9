"""Calibrated ternary PTQ of a whole model: GPTQ layer by layer, on inputs that went through the quantized layers.

The float checkpoint is read lazily: the model is built on the meta device,
and only one decoder layer's weights are in memory at a time. Calibration
token windows go through the embeddings once; then, layer by layer, the
layer's float weights are loaded, its linear layers are quantized in the order
the data reaches them (q/k/v, then o, then gate/up, then down: each group sees
inputs computed with the groups before it already quantized), and its output
on the calibration windows becomes the next layer's input. Each linear layer's
Hessian ``X^T X`` is summed from the inputs it sees (:mod:`trit.quant.gptq`).
With ``float_target`` the windows also run through the float model, and each
linear layer aims at the float layer's outputs on the float inputs
(:func:`trit.quant.gptq.float_target_weight`). The float stream runs through
an untouched copy of the layer, batch by batch beside the quantized one, so
that each stage's cross term is summed as it goes: beyond the float stream's
hidden states, it costs one extra decoder layer in memory and a float forward
per stage, not every linear layer's float inputs. Each stage's forwards (float
and quantized) stop at the stage's first linear layer, where its input has
been seen.

Calibration text comes from ``--calib FILE`` (windows of ``--calib-seq-len``
tokens at evenly spaced offsets) or, by default, from the float model itself:
sequences it samples from its BOS token (data-free, as in LLM-QAT; Liu et al.
2023, arXiv:2305.17888).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from trit import corpora
from trit import format as fmt
from trit.arch import meta_model
from trit.checkpoint import Checkpoint, CheckpointError
from trit.configs import FIRST, CalibConfig
from trit.quant.budget import PlaneGain
from trit.quant.gptq import (
    GptqOptions,
    dequantize,
    dequantize_planes,
    float_target_weight,
    gptq_ternary,
    hessian,
    output_error,
)
from trit.rotation import TensorMap

# the order data reaches a decoder layer's linear layers; each group shares one input
STAGES = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
          ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))


def windows_from_text(ids: torch.Tensor, samples: int, seq_len: int) -> torch.Tensor:
    """``samples`` windows of ``seq_len`` tokens at evenly spaced offsets of a token stream: ``(S, T)``."""
    if ids.numel() < seq_len:
        raise ValueError(f"calibration text has {ids.numel()} tokens, fewer than one window of {seq_len}")
    starts = torch.linspace(0, ids.numel() - seq_len, samples).long()
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])


def sample_from_model(
    model: nn.Module, tokenizer, samples: int, seq_len: int, seed: int, batch: int, progress: bool = False,
    first: str = "random",
) -> torch.Tensor:
    """Data-free calibration: ``(S, T)`` token windows the float model samples after its BOS token.

    ``first="random"`` (the default): each sequence's second token is drawn uniformly from the vocabulary
    (special tokens left out) and the model samples on from there, as LLM-QAT does for diversity;
    ``first="bos"``: the model samples from BOS alone.
    """
    if first not in FIRST:
        raise ValueError(f"first: expected one of {', '.join(FIRST)}, found {first!r}")
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    torch.manual_seed(seed)
    out = []
    device = next(model.parameters()).device
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    ordinary = torch.ones(len(tokenizer), dtype=torch.bool)
    ordinary[special[special < len(tokenizer)]] = False
    ordinary = ordinary.nonzero().flatten()
    pick = torch.Generator().manual_seed(seed)
    starts = tqdm(range(0, samples, batch), desc="sample", unit="batch", disable=not progress)
    with torch.inference_mode():
        for start in starts:
            b = min(batch, samples - start)
            prompt = torch.full((b, 1), bos, dtype=torch.long)
            if first == "random":
                prompt = torch.cat([prompt, ordinary[torch.randint(len(ordinary), (b, 1), generator=pick)]], 1)
            prompt = prompt.to(device)
            new = seq_len - prompt.shape[1]
            ids = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, top_k=0,
                                 top_p=1.0, temperature=1.0, max_new_tokens=new, min_new_tokens=new,
                                 pad_token_id=tokenizer.eos_token_id)
            out.append(ids[:, :seq_len].cpu())
    return torch.cat(out)


def calibration_text(source: str | Path) -> str:
    """A text file's whole text, or a built-in corpus's calibration half (never its evaluation windows)."""
    if str(source) in corpora.BUILT_IN:
        return corpora.halves(corpora.read(source)[1])[1]
    if not Path(source).is_file():
        raise CheckpointError(source, f"no such calibration text file (nor a built-in corpus: "
                                      f"{', '.join(corpora.BUILT_IN)})")
    try:
        text = Path(source).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(source, f"calibration text: expected UTF-8 text, found a byte it cannot be "
                                      f"(0x{e.object[e.start]:02x} at byte {e.start})") from None
    if not text.strip():
        raise CheckpointError(source, "calibration text: expected text, found an empty file")
    return text


def calibration_ids(ckpt: Checkpoint, opts: CalibConfig, device: str, progress: bool = False) -> torch.Tensor:
    """The calibration windows ``(S, T)``: from ``opts.file``, or sampled from the float model (data-free).

    Sampled windows are kept in ``$TRIT_CACHE/calib`` (``$TRIT_CALIB_CACHE`` if set; not at all if
    ``opts.cache`` is off) under a key of the
    checkpoint's files (name, size, modification time), the sampling options, the device type and the torch
    and transformers versions, so that quantizing the same model again with another recipe does not sample
    again. An unreadable or mismatched entry is sampled again and replaced; the
    :data:`SAMPLE_CACHE_ENTRIES` most recently used entries are kept; a cache that cannot be written is
    passed over.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ckpt.path)
    if opts.file is not None:
        ids = tokenizer(calibration_text(opts.file), return_tensors="pt").input_ids[0]
        if ids.numel() < opts.seq_len:
            raise CheckpointError(opts.file, f"calibration text of {ids.numel()} tokens: expected at least one "
                                             f"window of {opts.seq_len} (--calib-seq-len)")
        return windows_from_text(ids, opts.samples, opts.seq_len)
    path = sample_cache_path(ckpt.path, opts, device) if opts.cache else None
    if path is not None:
        cached = _read_samples(path, opts)
        if cached is not None:
            if progress:
                print(f"calibration: {opts.samples} sampled windows from {path}")
            return cached
    model = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).to(device).eval()
    try:
        ids = sample_from_model(model, tokenizer, opts.samples, opts.seq_len, opts.seed, opts.batch, progress,
                                opts.first)
    finally:
        del model
    if path is not None:
        _write_samples(path, ids)
    return ids


SAMPLER_VERSION = 1  # part of the cache key: bump it when sample_from_model would sample other windows
CACHE_ENV = "TRIT_CALIB_CACHE"  # the folder of the kept windows, if not $TRIT_CACHE/calib (the tests use one apart)


def sample_cache_dir() -> Path:
    import os

    from trit.cache import cache_dir

    return Path(os.environ.get(CACHE_ENV) or cache_dir() / "calib")


def sample_cache_path(model_dir: Path | str, opts: CalibConfig, device: str) -> Path:
    """Where the data-free windows of this model, these options and this device type are kept."""
    import hashlib

    import transformers

    root = Path(model_dir).resolve()
    parts = [str(root)]
    for f in sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith(".")):
        st = f.stat()
        parts.append(f"{f.name} {st.st_size} {st.st_mtime_ns}")
    parts += [f"samples={opts.samples} seq_len={opts.seq_len} seed={opts.seed} batch={opts.batch} first={opts.first}",
              torch.device(device).type, torch.__version__, transformers.__version__, f"sampler {SAMPLER_VERSION}"]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
    return sample_cache_dir() / f"{key}.pt"


def _read_samples(path: Path, opts: CalibConfig) -> torch.Tensor | None:
    if not path.is_file():
        return None
    try:
        ids = torch.load(path, weights_only=True)
    except Exception:  # a torn or foreign file: sample again and replace it
        return None
    ok = isinstance(ids, torch.Tensor) and ids.dtype == torch.long and tuple(ids.shape) == (opts.samples, opts.seq_len)
    if ok:
        try:
            path.touch()  # used now: the pruning keeps the most recently used
        except OSError:
            pass
    return ids if ok else None


SAMPLE_CACHE_ENTRIES = 64  # the most recently used entries kept; older ones go when a new one is written


def _write_samples(path: Path, ids: torch.Tensor) -> None:
    """Written whole or not at all (:func:`trit.cache.write_atomic`). A cache that cannot be written is left
    alone (the windows are still returned)."""
    import io

    from trit.cache import write_atomic

    buf = io.BytesIO()
    torch.save(ids.contiguous(), buf)
    try:
        write_atomic(path, buf.getvalue())
        entries = sorted(path.parent.glob("*.pt"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in entries[SAMPLE_CACHE_ENTRIES:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


class _LayerLoader:
    """Loads one module's float tensors from the checkpoint onto the device (through ``rotate``: name and
    source tensor to the rotated model's tensors, if given), and drops them again."""

    def __init__(self, ckpt: Checkpoint, stack: ExitStack, device: str, rotate: TensorMap | None = None):
        self.ckpt, self.device, self.rotate = ckpt, device, rotate
        self.files = ckpt.open_all(stack)

    def load(self, model: nn.Module, prefix: str) -> nn.Module:
        module = model.get_submodule(prefix)
        module.to_empty(device=self.device)
        state = {}
        for name in module.state_dict():
            full = f"{prefix}.{name}"
            info = self.ckpt.tensors.get(full)
            if info is None:
                raise fmt.FormatError(full, "a tensor in the checkpoint", "none")
            tensor = self.files[info.shard].get_tensor(full).to(self.device).float()
            state[name] = self.rotate(full, tensor)[full] if self.rotate is not None else tensor
        module.load_state_dict(state)
        return module


def output_fisher(ckpt: Checkpoint, modules: set[str], calib: CalibConfig, device: str = "cpu",
                  progress: bool = True, ids: torch.Tensor | None = None) -> dict[str, float]:
    """Each module's output sensitivity: the squared gradient of the calibration windows' log-likelihood with
    respect to the module's output, averaged over tokens and output channels (the trace of the output's Fisher
    information over its width; on sampled windows the model's own Fisher). An output error ``D`` (tokens x
    channels) then costs about ``F * |D|^2 / 2`` in log-likelihood. A trace is unchanged by an orthogonal map of
    the output, so the float model as stored measures the rotated one too. The whole float model is in memory
    (float32), one window at a time through a forward and a backward pass. ``ids``: the windows, where the caller
    holds them already (else :func:`calibration_ids`)."""
    from transformers import AutoModelForCausalLM

    ids = calibration_ids(ckpt, calib, device, progress) if ids is None else ids  # (S, T)
    model = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).to(device).eval()
    model.requires_grad_(False)
    sums = dict.fromkeys(sorted(modules), 0.0)

    def watch(name: str):
        def add(grad: torch.Tensor) -> None:
            sums[name] += float(grad.double().square().sum()) / grad.shape[-1]

        def hook(module: nn.Module, args, out: torch.Tensor) -> None:
            out.register_hook(add)
        return hook

    hooks = [model.get_submodule(m).register_forward_hook(watch(m)) for m in sums]
    # the gradient has to reach every layer's output: the embeddings' output is the one leaf that needs one
    hooks.append(model.get_input_embeddings().register_forward_hook(lambda m, a, out: out.requires_grad_()))
    try:
        with torch.enable_grad():
            for window in tqdm(ids, desc="fisher", unit="window", disable=not progress):
                x = window[None].to(device)
                logits = model(x, use_cache=False).logits[0, :-1].float()
                nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").backward()
    finally:
        for h in hooks:
            h.remove()
        del model
    return {m: v / ids.numel() for m, v in sums.items()}


def gptq_model(
    ckpt: Checkpoint, quantized: set[str], gopts: GptqOptions, calib: CalibConfig, device: str = "cpu",
    progress: bool = True, rotate: TensorMap | None = None, planes: Mapping[str, int] | None = None,
    gains: list[PlaneGain] | None = None, fisher: Mapping[str, float] | None = None, ids: torch.Tensor | None = None,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """GPTQ every module in ``quantized``: ``{module: (codes (P, N, K_pad) int8, scales (P, N, G) f32)}``.

    ``rotate`` (``(name, source tensor) -> {name: tensor}``, the loader of :func:`trit.rotation.rotation_maps`):
    quantize the model those tensors make (the sampled calibration windows are the source's: the same function).
    ``planes``: the modules whose plane count is not ``gopts.planes``. ``gains``: also round each group of layers
    sharing an input with two planes on the same Hessian and append what that measured (:mod:`trit.quant.budget`),
    each layer's output errors weighted by its ``fisher`` (:func:`output_fisher`; 1 where not given); the one-plane
    result is the one kept and passed on. ``ids``: the calibration windows, where the caller holds them already
    (else :func:`calibration_ids`)."""
    ids = calibration_ids(ckpt, calib, device, progress) if ids is None else ids  # (S, T)
    model = meta_model(ckpt, torch.float32)
    results: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    with ExitStack() as stack, torch.inference_mode():
        loader = _LayerLoader(ckpt, stack, device, rotate)
        embed = loader.load(model, "model.embed_tokens")
        rotary = type(model.model.rotary_emb)(model.config).to(device)
        hidden = [embed(ids[i:i + calib.batch].to(device)) for i in range(0, ids.shape[0], calib.batch)]
        embed.to("meta")
        positions = torch.arange(ids.shape[1], device=device)[None]
        rope = rotary(hidden[0], positions)
        layers = model.model.layers
        hidden_f = list(hidden) if gopts.float_target else None  # the float model's stream
        bar = tqdm(total=len(layers), desc="gptq", unit="layer", disable=not progress)
        for i, layer in enumerate(layers):
            prefix = f"model.layers.{i}"
            loader.load(model, prefix)
            groups = [[f"{prefix}.{s}" for s in stage if f"{prefix}.{s}" in quantized] for stage in STAGES]
            groups = [names for names in groups if names]  # each stage's linears; they share one input
            # the float stream runs through an untouched copy of the layer, batch by batch beside the quantized one
            float_layer = copy.deepcopy(layer) if hidden_f is not None else None
            for names in groups:
                first = names[0].removeprefix(prefix + ".")
                h, cross = _stage_stats(layer, first, hidden, rope, positions, float_layer, hidden_f)
                measured: list[tuple[int, ...]] | None = [] if gains is not None else None
                for name in names:
                    bar.set_postfix_str(name, refresh=False)
                    opts = replace(gopts, planes=(planes or {}).get(name, gopts.planes))
                    results[name] = _quantize_linear(model.get_submodule(name), h, opts, cross, measured,
                                                     (fisher or {}).get(name, 1.0))
                if gains is not None:
                    gains.append(PlaneGain(tuple(names), *(sum(column) for column in zip(*measured))))
            hidden = _run_layer(layer, hidden, rope, positions)
            if float_layer is not None:
                hidden_f = _run_layer(float_layer, hidden_f, rope, positions)
                del float_layer
            layer.to("meta")
            bar.update(1)
        bar.close()
    return results


def _run_layer(layer: nn.Module, hidden: list[torch.Tensor], rope, positions) -> list[torch.Tensor]:
    out = [layer(x, attention_mask=None, position_ids=positions, position_embeddings=rope) for x in hidden]
    return [x[0] if isinstance(x, tuple) else x for x in out]


class _Stop(Exception):
    """Raised by a hook once it has the input it wanted: the rest of the layer need not run."""


def _run_until(layer: nn.Module, x: torch.Tensor, rope, positions) -> None:
    """Run ``layer`` on ``x`` until a hook raises :class:`_Stop`."""
    try:
        _run_layer(layer, [x], rope, positions)
    except _Stop:
        pass


def _stage_stats(layer: nn.Module, first: str, hidden, rope, positions, float_layer=None, hidden_f=None):
    """``H = X^T X`` of the inputs that ``layer``'s submodule ``first`` sees when the calibration windows run
    through ``layer``; with ``float_layer`` (the layer's float copy) and ``hidden_f`` (the float stream), also the
    cross term ``R = X_f^T X`` with the inputs the copy's ``first`` sees, batch by batch; else None. Each forward
    stops at ``first``: nothing after it is needed."""
    lin = layer.get_submodule(first)
    k = lin.in_features
    h = torch.zeros(k, k, dtype=torch.float64, device=lin.weight.device)
    cross = torch.zeros_like(h) if float_layer is not None else None
    seen: list[torch.Tensor] = []  # the float input of the batch in flight

    def hook(module, args):
        h.add_(hessian(args[0]))
        if cross is not None:
            cross.add_(seen.pop().reshape(-1, k).double().T @ args[0].reshape(-1, k).double())
        raise _Stop

    def float_hook(module, args):
        seen.append(args[0])
        raise _Stop

    handles = [lin.register_forward_pre_hook(hook)]
    if float_layer is not None:
        handles.append(float_layer.get_submodule(first).register_forward_pre_hook(float_hook))
    try:
        for b, x in enumerate(hidden):
            if float_layer is not None:
                _run_until(float_layer, hidden_f[b], rope, positions)
            _run_until(layer, x, rope, positions)
    finally:
        for handle in handles:
            handle.remove()
    return h.float(), (cross.float() if cross is not None else None)


def _quantize_linear(
    lin: nn.Linear, h: torch.Tensor, gopts: GptqOptions, cross: torch.Tensor | None = None,
    measured: list[tuple] | None = None, error_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ one linear layer (K padded to whole groups), and put its dequantized weight back in place.

    Returns codes ``(P, N, K_pad)`` int8 and scales ``(P, N, G)`` f32, on the CPU. ``measured``: also round it
    with two planes and append ``(weights, codes, scales, error with one plane, with two, tr(W H W^T))``, the
    two errors times ``error_weight``.
    """
    n, k = lin.weight.shape
    k_pad = fmt.padded_k(k, gopts.group_size)
    w = fmt.pad_k(lin.weight.float(), k_pad)
    hp = torch.zeros(k_pad, k_pad, device=h.device)
    hp[:k, :k] = h
    if cross is not None:
        cp = torch.zeros_like(hp)
        cp[:k, :k] = cross
        w = float_target_weight(w, hp, cp, gopts.damp)
    codes, scales = gptq_ternary(w, hp, gopts)
    if measured is not None:
        codes2, scales2 = gptq_ternary(w, hp, replace(gopts, planes=2))
        measured.append((n * k, n * k_pad, scales.shape[1] * scales.shape[2],
                         error_weight * output_error(w, dequantize_planes(codes, scales), hp),
                         error_weight * output_error(w, dequantize_planes(codes2, scales2), hp),
                         output_error(w, 0 * w, hp)))
    lin.weight.copy_(dequantize(codes, scales, gopts)[:, :k].to(lin.weight.dtype))
    return codes.cpu(), scales.cpu()


__all__ = ["CalibConfig", "FIRST", "gptq_model", "output_fisher", "windows_from_text", "sample_from_model", "STAGES"]
