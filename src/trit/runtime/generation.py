"""Generation from a loaded model: streamed text, greedy ids, and teacher-forced log-probabilities."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from threading import Thread
from typing import Any

import torch

from trit.errors import OptionError
from trit.runtime.loader import Loaded


@dataclass(frozen=True)
class SamplingOptions:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0  # nucleus: the smallest set of tokens whose probability reaches top_p; 1: off
    top_k: int = 0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = (
            ("--max-new-tokens", self.max_new_tokens, self.max_new_tokens >= 1, "an integer >= 1"),
            ("--temperature", self.temperature, self.temperature >= 0, ">= 0 (0: greedy)"),
            ("--top-p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]"),
            ("--top-k", self.top_k, self.top_k >= 0, "an integer >= 0 (0: off)"),
            ("--repetition-penalty", self.repetition_penalty, self.repetition_penalty > 0, "> 0 (1: off)"),
            ("--seed", self.seed, self.seed is None or 0 <= self.seed < 2**63, "an integer in [0, 2**63)"),
        )
        for flag, value, ok, allowed in checks:
            if not ok or value != value:  # value != value: NaN (None is no seed: equal to itself)
                raise OptionError(f"{flag} {value}: must be {allowed}")

    def generate_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "repetition_penalty": self.repetition_penalty}
        if self.temperature > 0:
            kw.update(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k or None)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        return kw


def encode_prompt(loaded: Loaded, prompt: str, chat: bool = False) -> torch.Tensor:  # (1, T) int64
    """The prompt's token ids; an empty prompt (no tokens) becomes the tokenizer's BOS (else its EOS), so that the
    model generates from the start of a text."""
    tok = loaded.tokenizer
    if not isinstance(prompt, str):
        raise TypeError(f"prompt: expected a str, found {type(prompt).__name__}")
    if chat:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
    else:
        ids = tok(prompt, return_tensors="pt").input_ids
    if ids.shape[-1] == 0:
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if start is None:
            raise ValueError("an empty prompt: the tokenizer has no BOS or EOS token to generate from")
        ids = torch.tensor([[start]])
    return ids.to(loaded.device)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def context_length(loaded: Loaded) -> int | None:
    """The most positions the model was made for (``max_position_embeddings``), if its config says."""
    return getattr(loaded.model.config, "max_position_embeddings", None)


def fit_context(loaded: Loaded, ids: torch.Tensor, max_new_tokens: int, truncate: bool) -> torch.Tensor:
    """``ids`` ``(1, T)`` if the prompt and the new tokens fit the context; else its last tokens, or an error."""
    context = context_length(loaded)
    if context is None or ids.shape[1] + max_new_tokens <= context:
        return ids
    room = context - max_new_tokens
    if room < 1:
        raise OptionError(f"--max-new-tokens {max_new_tokens}: the model's context holds {context} tokens in all")
    if not truncate:
        raise OptionError(f"the prompt has {ids.shape[1]} tokens; with --max-new-tokens {max_new_tokens} that "
                          f"exceeds the model's context of {context} tokens: shorten it, or pass --truncate to "
                          f"keep its last {room} tokens")
    return ids[:, -room:]


def stream(
    loaded: Loaded, prompt: str, options: SamplingOptions = SamplingOptions(), chat: bool = False,
    stats: GenerationStats | None = None, truncate: bool = False,
) -> Iterator[str]:
    """Yield the generated text piece by piece as tokens come; fills ``stats`` when done.

    A prompt that leaves no room in the model's context for ``max_new_tokens`` is refused, or with
    ``truncate`` cut to its last tokens.
    """
    from transformers import TextIteratorStreamer

    ids = fit_context(loaded, encode_prompt(loaded, prompt, chat), options.max_new_tokens, truncate)
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


def generate(loaded: Loaded, prompt: str, options: SamplingOptions = SamplingOptions(), chat: bool = False,
             truncate: bool = False) -> str:
    """The whole generated text (see :func:`stream`)."""
    return "".join(stream(loaded, prompt, options, chat, truncate=truncate))


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
