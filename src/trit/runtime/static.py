"""Greedy decoding with a static KV cache and, on a GPU, one-token steps replayed from a CUDA graph.

``model.generate`` spends most of a small-batch decode step in Python: at a
few milliseconds a step on an 8B model, launching some four hundred kernels
one by one is slower than running them. :class:`StaticDecoder` keeps every
tensor of a step at a fixed address (transformers' ``StaticCache`` for keys
and values, one buffer each for the next tokens and their positions), runs
the prompt eagerly, runs the first one-token step eagerly too (it compiles
the Triton kernels for this batch size and allocates the workspaces; with
``compile=True`` it is also where ``torch.compile`` traces the step), and
captures the second into a CUDA graph; every later step is one replay. The
graph feeds itself: it writes the argmax token and the next position into
its own input buffers, so a step is a replay and, for a streaming caller, one
copy of ``batch`` token ids to the host.

Prompts of one batch have one length (no padding); greedy only. This is the
engine of ``trit bench decode``; the result equals ``model.generate``'s greedy
tokens (a test), and with ``graphs=False`` it runs the same steps eagerly (the
CPU path, and the reference for the graph).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn


class StaticDecoder:
    def __init__(self, model: nn.Module, batch: int, max_len: int, graphs: bool | None = None,
                 compile: bool = False):
        from transformers import StaticCache

        self.model, self.batch, self.max_len = model, batch, max_len
        self.device = next(model.parameters()).device
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, found one on {self.device}")
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=self.device)  # (B, 1) next input
        self.positions = torch.zeros(batch, 1, dtype=torch.long, device=self.device)  # (B, 1)
        self.cache_position = torch.zeros(1, dtype=torch.long, device=self.device)  # older transformers only
        # transformers before the cache kept its own length took the slots to write as ``cache_position``
        self._legacy = "cache_position" in inspect.signature(model.forward).parameters
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_error: str | None = None
        self.length = 0
        self._eager_steps = 0
        # Inductor fuses the small ops between the matmuls (norms, rotary, residuals, SiLU * up): fewer
        # kernels a step; the graph then replays the compiled step. The prompt stays eager.
        self._step_forward = torch.compile(self._forward, dynamic=False) if compile else self._forward

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        kw = {"cache_position": cache_position} if self._legacy else {}
        out = self.model(input_ids=ids, position_ids=positions, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1, **kw)
        return out.logits[:, -1].argmax(-1)  # (B,) int64

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:  # (B, P) int64 -> (B,) the first new tokens
        b, p = ids.shape
        if b != self.batch or p >= self.max_len:
            raise ValueError(f"prompt batch of shape {(b, p)}: expected {self.batch} rows shorter than {self.max_len}")
        self.cache.reset()
        positions = torch.arange(p, device=self.device).expand(b, p)
        first = self._forward(ids.to(self.device), positions, torch.arange(p, device=self.device))
        self.tokens.copy_(first[:, None])
        self.positions.fill_(p)
        self.cache_position.fill_(p)
        self.length = p
        return self.tokens[:, 0]

    def _step(self) -> None:
        nxt = self._step_forward(self.tokens, self.positions, self.cache_position)
        self.tokens.copy_(nxt[:, None])
        self.positions.add_(1)
        self.cache_position.add_(1)

    @torch.inference_mode()
    def step(self) -> torch.Tensor:  # (B,) the next tokens, on the device
        if self.length >= self.max_len:
            raise ValueError(f"the static cache holds {self.max_len} tokens and is full")
        if not self.graphs or (self.graph is None and self._eager_steps == 0):
            self._eager_steps += 1
            self._step()
        elif self.graph is None:
            self._capture()
        else:
            self.graph.replay()
        self.length += 1
        return self.tokens[:, 0]

    def _capture(self) -> None:
        """Record one step (not run while recording), then replay it; on failure keep stepping eagerly."""
        graph = torch.cuda.CUDAGraph()
        try:
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                self._step()
        except Exception as e:  # noqa: BLE001  (an op that cannot be captured: say so, decode eagerly)
            self.graph_error = f"{type(e).__name__}: {e}"
            self.graphs = False
            torch.cuda.synchronize()
            self._step()
            return
        self.graph = graph
        graph.replay()

    def generate(self, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:  # (B, P) -> (B, new_tokens)
        out = [self.prefill(ids).clone()]
        out += [self.step().clone() for _ in range(new_tokens - 1)]
        return torch.stack(out, dim=1)
