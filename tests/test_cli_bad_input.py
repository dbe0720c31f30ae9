"""Bad input, each case as a user meets it: one line naming the file or tensor, exit 2, nothing left, the source intact.

The CLI runs as a real process (``trit ...``) where the case can be made on disk; a full disk and a read-only
folder are made by patching the write in the process (``main`` called in-process), since CI cannot mount.
"""

from __future__ import annotations

import errno
import hashlib
import re
import shutil
from pathlib import Path

import pytest
from conftest import make_tiny_model, rewrite_tensors, trit

from trit.cli import main


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``: the source must come out of a failed run byte for byte."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def left_behind(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def refused(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("trit: error: "), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[-1], (needle, proc.stderr)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_tiny_model(tmp_path / "src")


@pytest.mark.parametrize(
    ("edit", "method", "needles"),
    [
        (lambda t: t.__setitem__("model.layers.1.mlp.up_proj.weight", t["model.layers.1.mlp.up_proj.weight"].int()),
         "absmean", ("'model.layers.1.mlp.up_proj.weight'", "expected a float dtype", "found I32")),
        (lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"),
         "absmean", ("'model.layers.0.self_attn.k_proj.weight' is missing",)),
        (lambda t: t["model.layers.1.self_attn.v_proj.weight"].view(-1).__setitem__(3, float("nan")),
         "gptq", ("'model.layers.1.self_attn.v_proj.weight' holds 1 NaN or Inf",)),
    ],
    ids=["int32-weight", "missing-tensor", "gptq-nan"],
)
def test_quantize_refuses_a_broken_source(src: Path, tmp_path: Path, edit, method: str, needles) -> None:
    rewrite_tensors(src, edit)
    before = digest(src)
    out = tmp_path / "deep" / "er" / "out"
    p = trit("quantize", src, out, "--method", method, "--group-size", "32", "--quiet", check=False)
    refused(p, *needles)
    assert left_behind(tmp_path) == ["src"]  # no OUT, no partial folder, no parent made for it
    assert digest(src) == before


def test_gptq_refuses_nan_before_calibrating(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The NaN check runs before the slow work: calibration is never reached."""
    import trit.calibrate

    def calibrate(*args, **kwargs):
        raise AssertionError("calibration started before the source was checked")

    monkeypatch.setattr(trit.calibrate, "gptq_model", calibrate)
    rewrite_tensors(src, lambda t: t["model.norm.weight"].view(-1).__setitem__(0, float("inf")))
    assert main(["quantize", str(src), str(tmp_path / "o"), "--method", "gptq", "--quiet"]) == 2


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_is_one_line_and_leaves_nothing(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", _disk_full)
    out = tmp_path / "a" / "b" / "out"
    assert main(["quantize", str(src), str(out), "--group-size", "32", "--method", "absmean", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"trit: error: {out}: no space left on device (needed about "), err
    assert " MiB free before writing)" in err[0]
    assert left_behind(tmp_path) == ["src"]


def test_too_little_free_space_is_refused_before_writing(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    assert main(["quantize", str(src), str(tmp_path / "out"), "--group-size", "32", "--method", "absmean", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"out: no space left on device \(needed about [0-9.]+ MiB, 0\.0 MiB free before writing\)$", err.strip()), err
    assert left_behind(tmp_path) == ["src"]


def test_read_only_output_is_one_line(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args, **kwargs):
        if tmp_path / "ro" in (self, *self.parents):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    out = tmp_path / "ro" / "out"
    assert main(["quantize", str(src), str(out), "--group-size", "32", "--method", "absmean", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"trit: error: {out}: cannot write here: Read-only file system"], err
    assert left_behind(tmp_path) == ["src"]


def test_failed_run_removes_the_parents_it_made(src: Path, tmp_path: Path) -> None:
    """A tensor the write refuses half way: OUT's new parent folders go with the partial output."""
    rewrite_tensors(src, lambda t: t["model.norm.weight"].view(-1).__setitem__(0, float("nan")))
    p = trit("quantize", src, tmp_path / "x" / "y" / "out", "--group-size", "32", "--method", "absmean", "--quiet", check=False)
    refused(p, "'model.norm.weight' holds 1 NaN or Inf")
    assert left_behind(tmp_path) == ["src"]


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--max-new-tokens", "0"], "--max-new-tokens 0: must be an integer >= 1"),
        (["--max-new-tokens", "-3"], "--max-new-tokens -3: must be an integer >= 1"),
        (["--temperature", "-1"], "--temperature -1.0: must be >= 0"),
        (["--top-p", "0"], "--top-p 0.0: must be in (0, 1]"),
        (["--top-p", "1.5"], "--top-p 1.5: must be in (0, 1]"),
        (["--top-k", "-1"], "--top-k -1: must be an integer >= 0"),
        (["--repetition-penalty", "0"], "--repetition-penalty 0.0: must be > 0"),
    ],
)
def test_generate_refuses_sampling_options_out_of_range(tiny_llama_trit: Path, flags: list[str], needle: str) -> None:
    refused(trit("generate", tiny_llama_trit, "hi", *flags, check=False), needle)


def test_generate_refuses_a_prompt_longer_than_the_context(tiny_llama_trit: Path) -> None:
    prompt = "a" * 1100  # the tiny model's character tokenizer: 1100 tokens, context 1024
    refused(trit("generate", tiny_llama_trit, prompt, "--max-new-tokens", "4", check=False),
            "the prompt has 1100 tokens", "context of 1024 tokens", "--truncate")
    ok = trit("generate", tiny_llama_trit, prompt, "--max-new-tokens", "4", "--truncate")
    assert "4 tokens" in ok.stderr


def test_nan_in_a_norm_of_a_trit_checkpoint_is_refused_at_load(tiny_llama_trit: Path, tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(tiny_llama_trit, tmp_path / "c"))
    rewrite_tensors(ckpt, lambda t: t["model.layers.1.post_attention_layernorm.weight"].view(-1).__setitem__(
        2, float("nan")))
    before = digest(ckpt)
    refused(trit("generate", ckpt, "hi", "--max-new-tokens", "2", check=False),
            "model.layers.1.post_attention_layernorm.weight: expected finite values, found 1 NaN or Inf")
    assert digest(ckpt) == before


def test_generate_options_are_checked_by_the_library_too() -> None:
    from trit.errors import OptionError
    from trit.runtime import SamplingOptions

    with pytest.raises(OptionError, match=r"--top-k -2: must be an integer >= 0"):
        SamplingOptions(top_k=-2)
    with pytest.raises(OptionError, match=r"--temperature nan"):
        SamplingOptions(temperature=float("nan"))
    assert SamplingOptions(temperature=0.7, top_p=0.9, top_k=40).generate_kwargs()["do_sample"] is True


@pytest.mark.parametrize(("flag", "value"), [("--calib-samples", "0"), ("--calib-seq-len", "1"), ("--calib-batch", "0")])
@pytest.mark.parametrize("scheme", ["ternary", "w4a8"])
def test_quantize_refuses_bad_calibration_counts(src: Path, tmp_path: Path, flag: str, value: str,
                                                  scheme: str) -> None:
    """A count that cannot sample or window anything: one line naming the flag, before the model is read."""
    method = ["--method", "gptq"] if scheme == "ternary" else []  # w4a8 is GPTQ, and refuses --method
    p = trit("quantize", src, tmp_path / "out", "--scheme", scheme, *method, flag, value, "--quiet", check=False)
    refused(p, f"{flag} {value}: must be at least")
    assert left_behind(tmp_path) == ["src"]
