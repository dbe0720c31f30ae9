"""The residual-stream rotation (:mod:`trit.quant.rotate`) applied to a float checkpoint as it is quantized:
whether to rotate it, and its tensors rotated one by one as they are read (``trit quantize`` for ternary and
for W4A8; the calibration loader through :func:`rotation_maps`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack

import torch

from trit.checkpoint import Checkpoint, CheckpointError
from trit.errors import ConvertError
from trit.quant.rotate import ROTATABLE_MODEL_TYPES, Rotation, make_rotation, rotate_tensor

ROTATION_SEED = 0  # --rotate's random signs and orthogonal factor (recorded in quantization_config.rotation)

TensorMap = Callable[[str, torch.Tensor], dict[str, torch.Tensor]]


def choose_rotation(ckpt: Checkpoint, asked: bool | None, wanted: bool) -> Rotation | None:
    """The rotation to apply, or None: ``wanted`` is the option's answer (``asked``, the flag as given, or the
    scheme's default when None). Asked for by name (``asked=True``), a model whose layers it does not know is
    refused; by default such a model is quantized as it stands."""
    if not wanted:
        return None
    model_type = ckpt.config.get("model_type")  # what check_architecture read
    if model_type not in ROTATABLE_MODEL_TYPES:
        if asked is None:  # the default: such a model is quantized as it stands
            return None
        raise ConvertError(f"--rotate: {ckpt.path} is model_type {model_type!r}; the rotation knows the layers of "
                           f"{', '.join(ROTATABLE_MODEL_TYPES)} only (--no-rotate quantizes it as it stands)")
    return make_rotation(ckpt.config, tied="lm_head.weight" not in ckpt.tensors, seed=ROTATION_SEED)


def rotation_maps(ckpt: Checkpoint, rotation: Rotation | None, stack: ExitStack,
                  device: str | None = None) -> tuple[TensorMap, TensorMap]:
    """The writer's and the calibration loader's ``(name, source tensor) -> {name: tensor}``: the rotated
    tensors (norm weights read from the source, whose shards are opened once and stay open in ``stack``), or the
    tensor as it is without a rotation. The float64 products run on ``device`` (the quantizer's: on a GPU rather
    than in minutes of CPU for a model of billions of weights); each tensor comes back where it was given. The
    writer's embeddings of a tied model also give the lm_head the rotation makes of them; the loader's give
    themselves alone (calibration has no use for that head)."""
    if rotation is None:
        same = lambda name, tensor: {name: tensor}  # noqa: E731
        return same, same
    files = ckpt.open_all(stack)
    rot = rotation.to(device) if device is not None else rotation

    def norm(name: str) -> torch.Tensor:
        info = ckpt.tensors.get(name)
        if info is None:
            raise CheckpointError(ckpt.path, f"--rotate: tensor {name!r} is missing (a norm the rotation folds)")
        return files[info.shard].get_tensor(name)

    return (lambda name, tensor: rotate_tensor(rot, name, tensor, norm),
            lambda name, tensor: rotate_tensor(rot, name, tensor, norm, head=False))


def tied_head_bytes(ckpt: Checkpoint) -> int:
    """The bytes of the lm_head a rotation writes for a tied model (the embeddings' size), else 0."""
    info = ckpt.tensors.get("model.embed_tokens.weight")
    return info.nbytes if info is not None and "lm_head.weight" not in ckpt.tensors else 0


__all__ = ["ROTATION_SEED", "TensorMap", "choose_rotation", "rotation_maps", "tied_head_bytes"]
