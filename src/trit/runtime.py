"""The embedded runtime: a trit checkpoint loaded into a Hugging Face transformers model, and generation.

:func:`load` builds the model from its config on the meta device, swaps a
:class:`~trit.nn.TritLinear` in for every ternary layer, then reads the
checkpoint tensor by tensor straight to the target device. No float copy of a
ternary weight is ever made: the codes stay packed, two bits a weight. A float
Hugging Face checkpoint loads through the same function, so the two can be
compared by every command.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from threading import Thread
from typing import Any

import torch
from torch import nn

from trit import format as fmt
from trit.arch import check_architecture
from trit.checkpoint import CONFIG_FILE, Checkpoint, open_checkpoint
from trit.nn import TritLinear, swap_linears, warm_up
from trit.ops import warm_up_wanted


@dataclass
class Loaded:
    model: nn.Module  # a transformers *ForCausalLM
    tokenizer: Any
    trit_config: fmt.TritConfig | None  # None for a float checkpoint
    checkpoint: Checkpoint

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bf16 on a GPU; float32 on a CPU, where bf16 matmuls are emulated on most chips and slower."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def trit_config_of(ckpt: Checkpoint) -> fmt.TritConfig | None:
    q = ckpt.quantization_config
    if q is None:
        return None
    return fmt.TritConfig.from_dict(q, where=f"{ckpt.path / CONFIG_FILE}: quantization_config")


def meta_model(ckpt: Checkpoint | Path, dtype: torch.dtype | None = None) -> nn.Module:
    """The checkpoint's (or config folder's) transformers model built on the meta device: sizes, no memory."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(ckpt.path if isinstance(ckpt, Checkpoint) else ckpt)
    hf_config.quantization_config = None  # trit is not a transformers quantizer: layers are swapped by hand
    return meta_model_from_config(hf_config, dtype)


def meta_model_from_config(hf_config: Any, dtype: torch.dtype | None = None) -> nn.Module:
    """A transformers config's causal LM on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config, **({"dtype": dtype} if dtype else {}))


def load(
    path: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    validate: bool = True,
    warm: bool | None = None,
) -> Loaded:
    """Load a trit (or float) checkpoint folder for inference; see the module docstring.

    ``warm``: run each layer shape's kernels once now (:func:`trit.ops.warm_up`) so the first request does
    not compile them; ``None`` follows ``TRIT_WARMUP`` (on by default on CUDA).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(device or default_device())
    dtype = dtype or default_dtype(device)
    ckpt = open_checkpoint(path)
    check_architecture(ckpt.config, str(ckpt.path / CONFIG_FILE))
    qcfg = trit_config_of(ckpt)
    tokenizer = AutoTokenizer.from_pretrained(ckpt.path)
    if qcfg is None:
        model = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=dtype).to(device).eval()
        return Loaded(model, tokenizer, None, ckpt)
    model = meta_model(ckpt, dtype)
    names = fmt.layer_names(ckpt.tensors)
    swap_linears(model, names, qcfg)
    _load_tensors(model, ckpt, qcfg, device, dtype, validate)
    materialize_buffers(model, device)
    if warm_up_wanted(device) if warm is None else warm:  # compile the kernels now, not in the first request
        warm_up(model, dtype)
    return Loaded(model.eval(), tokenizer, qcfg, ckpt)


def _load_tensors(
    model: nn.Module, ckpt: Checkpoint, qcfg: fmt.TritConfig, device: torch.device, dtype: torch.dtype,
    validate: bool,
) -> None:
    expected = model.state_dict(keep_vars=True)
    tied = _tied_names(model)
    unexpected = sorted(set(ckpt.tensors) - set(expected))
    if unexpected:
        raise fmt.FormatError(unexpected[0], f"a tensor of the {type(model).__name__} model", "an unknown name")
    missing = sorted(set(expected) - set(ckpt.tensors) - tied)
    if missing:
        raise fmt.FormatError(missing[0], "a tensor in the checkpoint", "none")
    state: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        files = ckpt.open_all(stack, device=str(device))
        for name, info in ckpt.tensors.items():
            t = files[info.shard].get_tensor(name)
            if t.is_floating_point() and name.rsplit(".", 1)[1] not in fmt.TERNARY_SUFFIXES:
                t = t.to(dtype)
            state[name] = t
    for layer in fmt.layer_names(ckpt.tensors):
        mod = model.get_submodule(layer)
        assert isinstance(mod, TritLinear)
        for packed_name, scale_name in fmt.plane_suffixes(qcfg.planes):
            fmt.check_layer(
                layer, state[f"{layer}.{packed_name}"], state[f"{layer}.{scale_name}"],
                qcfg.group_size, mod.out_features, mod.in_features, check_values=validate,
                suffixes=(packed_name, scale_name),
            )
    for name, t in state.items():
        want = expected[name]
        if name.endswith(fmt.TERNARY_SUFFIXES):
            continue
        if tuple(t.shape) != tuple(want.shape):
            raise fmt.FormatError(name, f"shape {tuple(want.shape)}", f"{tuple(t.shape)}")
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.tie_weights()


def _tied_names(model: nn.Module) -> set[str]:
    """State-dict names that share storage with another (``lm_head.weight`` under tied embeddings)."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return set()
    out = model.get_output_embeddings()
    return {f"{n}.weight" for n, m in model.named_modules() if m is out and out is not None}


def materialize_buffers(model: nn.Module, device: torch.device) -> None:
    """Rebuild modules whose computed (non-persistent) buffers are still on the meta device (rotary tables)."""
    for name, mod in list(model.named_modules()):
        if not any(b.is_meta for b in mod.buffers(recurse=False)):
            continue
        if not hasattr(mod, "config"):
            raise RuntimeError(f"{name}: buffer left on the meta device and no config to rebuild it from")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, type(mod)(mod.config).to(device))
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise fmt.FormatError(left[0], "a tensor in the checkpoint", "none")


# ---------------------------------------------------------------------------- generation


@dataclass(frozen=True)
class SamplingOptions:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    repetition_penalty: float = 1.0
    seed: int | None = None

    def generate_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "repetition_penalty": self.repetition_penalty}
        if self.temperature > 0:
            kw.update(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k or None)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        return kw


def encode_prompt(loaded: Loaded, prompt: str, chat: bool = False) -> torch.Tensor:  # (1, T) int64
    tok = loaded.tokenizer
    if chat:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
    else:
        ids = tok(prompt, return_tensors="pt").input_ids
    return ids.to(loaded.device)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def stream(
    loaded: Loaded, prompt: str, options: SamplingOptions = SamplingOptions(), chat: bool = False,
    stats: GenerationStats | None = None,
) -> Iterator[str]:
    """Yield the generated text piece by piece as tokens come; fills ``stats`` when done."""
    from transformers import TextIteratorStreamer

    ids = encode_prompt(loaded, prompt, chat)
    if options.seed is not None:
        torch.manual_seed(options.seed)
    streamer = TextIteratorStreamer(loaded.tokenizer, skip_prompt=True, skip_special_tokens=True)
    out: dict[str, torch.Tensor] = {}
    pad = loaded.tokenizer.pad_token_id or loaded.tokenizer.eos_token_id

    errors: list[BaseException] = []

    def work() -> None:
        try:
            with torch.inference_mode():
                out["ids"] = loaded.model.generate(
                    ids, attention_mask=torch.ones_like(ids), streamer=streamer, pad_token_id=pad,
                    **options.generate_kwargs(),
                )
        except BaseException as e:  # re-raised in the caller's thread below
            errors.append(e)
            streamer.end()

    start = time.perf_counter()
    thread = Thread(target=work, daemon=True)
    thread.start()
    yield from streamer
    thread.join()
    if errors:
        raise errors[0]
    if stats is not None:
        stats.prompt_tokens = ids.shape[1]
        stats.new_tokens = out["ids"].shape[1] - ids.shape[1] if "ids" in out else 0
        stats.seconds = time.perf_counter() - start


def generate(loaded: Loaded, prompt: str, options: SamplingOptions = SamplingOptions(), chat: bool = False) -> str:
    return "".join(stream(loaded, prompt, options, chat))


def greedy_ids(loaded: Loaded, ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:  # (1, T) -> (1, new)
    """Greedy continuation token ids, no streaming (for comparisons between engines)."""
    with torch.inference_mode():
        out = loaded.model.generate(
            ids.to(loaded.device), attention_mask=torch.ones_like(ids, device=loaded.device),
            max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
            pad_token_id=loaded.tokenizer.pad_token_id or loaded.tokenizer.eos_token_id,
        )
    return out[:, ids.shape[1]:]


def token_logprobs(loaded: Loaded, ids: list[int]) -> torch.Tensor:  # -> (T, vocab) float32, on the CPU
    """Log-probabilities of the next token after each prefix of ``ids``, one forward pass (teacher-forced)."""
    with torch.inference_mode():
        logits = loaded.model(torch.tensor([ids], device=loaded.device)).logits[0]
    return torch.log_softmax(logits.float(), -1).cpu()


def prompt_logprobs(loaded: Loaded, ids: list[int]) -> torch.Tensor:  # -> (len(ids) - 1,)
    """The log-probability of each token of ``ids`` after the ones before it (the first is not scored)."""
    return token_logprobs(loaded, ids)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def greedy_gaps(loaded: Loaded, ids: list[int], new: list[int]) -> torch.Tensor:  # -> (len(new),)
    """How far each of ``new`` (another engine's greedy continuation of ``ids``) falls below this model's best.

    ``max - chosen`` log-probability per step, teacher-forced on ``new``: zero where this model picks the same
    token, small where two engines break a near-tie apart.
    """
    steps = token_logprobs(loaded, ids + new)[len(ids) - 1:len(ids) - 1 + len(new)]
    return steps.max(-1).values - steps.gather(1, torch.tensor(new)[:, None])[:, 0]
