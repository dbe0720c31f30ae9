"""trit: ternary (1.58-bit) language models: quantize, run in transformers, serve in vLLM.

>>> import trit
>>> model = trit.load("OUT_DIR")                                       # doctest: +SKIP
>>> trit.generate(model, "What is the capital of France?", chat=True)  # doctest: +SKIP

``trit.quantize(MODEL_DIR, OUT_DIR, trit.GPTQConfig())`` makes a checkpoint ternary (:mod:`trit.api`).
Importing trit also teaches transformers' ``from_pretrained`` to read trit checkpoints (:mod:`trit.hf`), at the
moment transformers' quantizer registry is imported (or at once if it already is), so ``import trit`` itself stays
light: the command line does not pay for transformers where it does not use it. The command line is ``trit`` (``python -m trit``); vLLM finds the plugin through its entry point. The API names
load on first use, so ``import trit.vllm`` (what vLLM does) pulls in no converter or runtime.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

from trit.errors import TritError

__version__ = "0.1.0"
_API = {**{name: "trit.configs" for name in ("AbsmeanConfig", "TWNConfig", "GPTQConfig", "W4A8Config", "Layout",
                                              "CalibConfig", "HealConfig")},
        "generate": "trit.api", "load": "trit.api", "quantize": "trit.api", "Loaded": "trit.runtime"}
__all__ = ["TritError", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'trit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


_HF_REGISTRY = "transformers.quantizers.auto"


def _register_hf() -> None:
    from trit.hf import register

    register()


class _RegisterWithTransformers(importlib.abc.MetaPathFinder):
    """Runs :func:`trit.hf.register` right after transformers' quantizer registry module is executed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _HF_REGISTRY:
            return None
        sys.meta_path.remove(self)  # once: find the real module with the other finders
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            run = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                _register_hf()

            spec.loader.exec_module = exec_module
        return spec


if _HF_REGISTRY in sys.modules:
    _register_hf()
elif not any(isinstance(f, _RegisterWithTransformers) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWithTransformers())
