"""trit: ternary (1.58-bit) language models: quantize, run in transformers, serve in vLLM."""

__version__ = "0.1.0"
