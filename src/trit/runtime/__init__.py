"""The embedded runtime: trit checkpoints in Hugging Face transformers models.

:func:`load` builds the model on the meta device and reads the packed codes
straight into :class:`~trit.nn.TritLinear` layers (:mod:`.loader`);
:mod:`.generation` streams text and scores tokens; :mod:`.static` decodes with a
static KV cache and, on a GPU, CUDA-graph replays.
"""

from trit.runtime.generation import (
    GenerationStats,
    SamplingOptions,
    encode_prompt,
    generate,
    greedy_gaps,
    greedy_ids,
    prompt_logprobs,
    stream,
    token_logprobs,
)
from trit.runtime.loader import Loaded, default_device, default_dtype, load

__all__ = [
    "GenerationStats", "Loaded", "SamplingOptions", "default_device", "default_dtype", "encode_prompt", "generate",
    "greedy_gaps", "greedy_ids", "load", "prompt_logprobs", "stream", "token_logprobs",
]
