"""Other libraries' low-bit GEMMs on trit's weights, for ``trit bench kernels --peers``.

``humming``: Humming (``pip install humming-kernels``), the JIT GEMM library vLLM and SGLang serve 2-bit
weights with, on the same ternary values: int2 codes ``w + 2`` packed along K (16 to an int32, element ``i``
in bits ``2i``, which is format v1's packing with every code one higher), symmetric, the layer's scales in bf16
(its groups, or one a row). Two rows: W2A16 (bf16 activations) and W2A8 (its own per-token int8 rounding of
the activations, included in the time, as trit's W1.58A8 includes its own). Laid out as vLLM lays it out
(N padded to 256, K to 128). Timed with the same CUDA-graph replays over copies of the weights past the L2.
Not a dependency of trit: only this benchmark imports it.
"""

from __future__ import annotations

from importlib import metadata

import torch

from trit import format as fmt

PEERS = ("humming",)
PACKAGES = {"humming": "humming-kernels"}


def version(name: str) -> str:
    try:
        return metadata.version(PACKAGES[name])
    except metadata.PackageNotFoundError:
        return "not installed"


def missing(names: tuple[str, ...]) -> str | None:
    """Why these peers cannot run here (unknown, or not installed), else ``None``."""
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        return f"no peer named {', '.join(unknown)}; the peers are {', '.join(PEERS)}"
    absent = [PACKAGES[n] for n in names if version(n) == "not installed"]
    if absent:
        return f"--peers needs {', '.join(absent)}: pip install {' '.join(absent)}"
    return None


def humming_weight(packed: torch.Tensor) -> torch.Tensor:  # (N, K // 4) uint8 -> (N, K // 16) int32
    """Format v1's codes ``c = w + 1`` as Humming's symmetric uint2 codes ``w + 2``: the same bit positions, each
    2-bit field one higher (``c <= 2``, so no carry crosses a field)."""
    words = packed.contiguous().view(torch.int32).to(torch.int64) + 0x55555555
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def humming_layer(packed: torch.Tensor, scale: torch.Tensor, group: int, n: int, k: int, a8: bool):
    """A Humming layer holding trit's ternary weights (``a8``: int8 per-token activations)."""
    from humming.layer import HummingLayer

    layer = HummingLayer(
        shape_n=n, shape_k=k,
        weight_config={"dtype": "uint2", "group_size": 0 if group == fmt.PER_ROW else group, "has_zero_point": False},
        input_config={"dtype": "int8"} if a8 else None,
        pad_n_to_multiple=256, pad_k_to_multiple=128, torch_dtype=torch.bfloat16,
    ).cuda()
    layer.load_from_tensors({"weight": humming_weight(packed), "weight_scale": scale.to(torch.bfloat16)})
    layer.transform()
    return layer


def time_peers(names: tuple[str, ...], x: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]],
               group: int, act_int8: bool, refs: dict[bool, torch.Tensor]) -> dict[str, dict]:
    """Each peer's time a call (us, CUDA-graph replays over the weight copies) and relative error against the
    reference of its activations (``refs[a8]``); a peer that fails records its error instead of stopping the
    run. The peer's row with the run's activations comes first."""
    from trit.kernels import tuning

    out: dict[str, dict] = {}
    n, k = layers[0][0].shape[0], x.shape[1]
    for name in names:
        assert name == "humming", name
        rows = ("humming_w2a8", True), ("humming_w2a16", False)
        for label, a8 in rows if act_int8 else rows[1:] + rows[:1]:
            try:
                peer = [humming_layer(p, s, group, n, k, a8) for p, s in layers]
                with torch.inference_mode():
                    y = peer[0](x).float()
                    times = tuning.graph_times_us([lambda f=f: f(x) for f in peer])
                want = refs[a8].float()
                out[label] = {"us": times[len(times) // 2], "rel_err_vs_reference":
                              float((y - want).norm() / want.norm())}
            except Exception as e:  # a peer's failure is a row of the results, not the end of the run
                out[label] = {"error": f"{type(e).__name__}: {e}"[:500]}
            finally:
                peer = None
                torch.cuda.empty_cache()
    return out
