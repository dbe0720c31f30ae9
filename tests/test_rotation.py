"""Whether ``trit quantize`` rotates: the option as given, the scheme's default, and the model types the
rotation knows (an explicit ``--rotate`` on another is refused by name; the default passes it through)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model, trit
from test_cli_bad_input import digest, left_behind, refused

from trit.checkpoint import open_checkpoint
from trit.errors import ConvertError
from trit.quant.rotate import rotate_tensor
from trit.rotation import choose_rotation, tied_head_bytes


def test_choose_rotation_follows_the_option_and_the_model_type(tmp_path: Path) -> None:
    tied = open_checkpoint(make_tiny_model(tmp_path / "tied", tie=True))
    untied = open_checkpoint(make_tiny_model(tmp_path / "untied"))
    assert choose_rotation(tied, None, False) is None and choose_rotation(tied, False, False) is None
    rot = choose_rotation(tied, None, True)
    assert rot is not None and rot.tied and rot.residual.shape == (64, 64)
    assert not choose_rotation(untied, True, True).tied
    assert tied_head_bytes(tied) == tied.tensors["model.embed_tokens.weight"].nbytes and tied_head_bytes(untied) == 0
    bitnet = open_checkpoint(make_tiny_model(tmp_path / "bitnet", model_type="bitnet"))
    assert choose_rotation(bitnet, None, True) is None  # the default: quantized as it stands
    with pytest.raises(ConvertError, match=r"--rotate: .*bitnet is model_type 'bitnet'; the rotation knows"):
        choose_rotation(bitnet, True, True)


def test_explicit_rotate_on_a_model_it_does_not_know_is_refused(tmp_path: Path) -> None:
    src = make_tiny_model(tmp_path / "src", model_type="bitnet")
    before = digest(src)
    proc = trit("quantize", src, tmp_path / "out", "--rotate", "--method", "absmean", check=False)
    refused(proc, "--rotate", "model_type 'bitnet'")
    assert left_behind(tmp_path) == ["src"] and digest(src) == before
    trit("quantize", src, tmp_path / "out", "--calib-samples", "2", "--calib-seq-len", "16", "--no-calib-cache",
         "--quiet")  # gptq's default rotation passes it through
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "rotation" not in config["quantization_config"]


def test_rotation_maps_give_the_loader_the_embeddings_alone(tmp_path: Path) -> None:
    from trit.rotation import rotation_maps

    ckpt = open_checkpoint(make_tiny_model(tmp_path / "tied", tie=True))
    rot = choose_rotation(ckpt, None, True)
    embed = ckpt.tensors["model.embed_tokens.weight"]
    with ExitStack() as stack:
        shards = ckpt.open_all(stack)
        source = shards[embed.shard].get_tensor("model.embed_tokens.weight")
        write, load = rotation_maps(ckpt, rot, stack, device="cpu")
        writer, loader = write("model.embed_tokens.weight", source), load("model.embed_tokens.weight", source)
        assert set(writer) == {"model.embed_tokens.weight", "lm_head.weight"}
        assert list(loader) == ["model.embed_tokens.weight"]
        assert torch.equal(loader["model.embed_tokens.weight"], writer["model.embed_tokens.weight"])
        norms = shards[ckpt.tensors["model.norm.weight"].shard]
        expected = rotate_tensor(rot, "model.embed_tokens.weight", source, norms.get_tensor)
        assert torch.equal(writer["lm_head.weight"], expected["lm_head.weight"])  # E diag(g) Q, the final norm's g
        q = "model.layers.0.self_attn.q_proj.weight"
        layer = shards[ckpt.tensors[q].shard].get_tensor(q)
        assert torch.equal(write(q, layer)[q], load(q, layer)[q])  # a layer: the same for both
        for unrotated in rotation_maps(ckpt, None, stack, device="cpu"):
            assert unrotated("model.embed_tokens.weight", source)["model.embed_tokens.weight"] is source


@pytest.mark.parametrize("scheme", ["ternary", "w4a8"])
def test_quantize_gives_calibration_the_embeddings_alone_on_its_device(tmp_path: Path, monkeypatch,
                                                                       scheme: str) -> None:
    """Both writers hand GPTQ's loader a rotation without the tied lm_head (which only the writer needs)."""
    import trit.calibrate
    from trit.configs import GPTQConfig, W4A8Config
    from trit.convert import convert
    from trit.w4a8 import quantize_w4a8

    class Seen(Exception):
        pass

    def spy(ckpt, todo, gopts, calib, device, progress, rotate, **_):
        with ExitStack() as stack:
            info = ckpt.tensors["model.embed_tokens.weight"]
            embed = ckpt.open_all(stack)[info.shard].get_tensor("model.embed_tokens.weight")
        raise Seen(device, sorted(rotate("model.embed_tokens.weight", embed.float())))

    monkeypatch.setattr(trit.calibrate, "gptq_model", spy)
    src = make_tiny_model(tmp_path / "tied", tie=True)
    with pytest.raises(Seen) as seen:
        if scheme == "ternary":
            convert(src, tmp_path / "out", GPTQConfig(32), progress=False, log=lambda s: None)
        else:
            quantize_w4a8(src, tmp_path / "out", W4A8Config(group_size=32), progress=False, log=lambda s: None)
    assert seen.value.args == ("cpu", ["model.embed_tokens.weight"]) and not (tmp_path / "out").exists()
