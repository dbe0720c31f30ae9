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
    low = {"--calib-samples": 1, "--calib-seq-len": 2, "--calib-batch": 1}[flag]
    refused(p, f"{flag} {value}: expected an integer >= {low}")
    assert left_behind(tmp_path) == ["src"]



# ---------------------------------------------------------------------------- round two (issue: bad input, round two)

def test_sigterm_cleans_up_like_ctrl_c(src: Path, tmp_path: Path) -> None:
    """SIGTERM (timeout, docker, Slurm, systemd) while the checkpoint is being written: the partial folder removed,
    one line, exit 143. A real process, whose shard write is slowed so that the signal lands inside it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    code = ("import sys, time, safetensors.torch\n"
            "real = safetensors.torch.save_file\n"
            "safetensors.torch.save_file = lambda *a, **k: (real(*a, **k), time.sleep(60))\n"
            "from trit.cli import main\n"
            f"sys.exit(main(['quantize', {str(src)!r}, {str(out)!r}, '--method', 'absmean', '--group-size', '32', "
            "'--quiet']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not list(tmp_path.glob(".out.partial-*/*.safetensors*")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)  # a shard written into the partial folder: the write is under way
    assert proc.poll() is None, proc.communicate()
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "trit: SIGTERM; nothing was left half-written", err
    assert left_behind(tmp_path) == ["src"]


def test_a_partial_folder_of_a_process_that_is_gone_is_removed_at_the_next_run(src: Path, tmp_path: Path) -> None:
    from trit.checkpoint import remove_stale_partials

    dead = 2**22 + 12345  # above the kernel's pid range: no such process
    stale, old = tmp_path / f".out.partial-{dead}", tmp_path / f".out.old-{dead}"
    for folder in (stale, old):
        folder.mkdir()
        (folder / "model.safetensors.tmp123").write_bytes(b"x" * 100)
    alive = tmp_path / f".out.partial-{__import__('os').getppid()}"  # a live process's (pytest's parent): kept
    alive.mkdir()
    other = tmp_path / f".other.partial-{dead}"  # another output's: not this run's business
    other.mkdir()
    trit("quantize", src, tmp_path / "out", "--method", "absmean", "--group-size", "32", "--quiet")
    assert sorted(left_behind(tmp_path)) == sorted([".other.partial-" + str(dead), alive.name, "out", "src"])
    assert remove_stale_partials(tmp_path / "other") == [other]


def test_a_missing_weight_is_refused_at_load_not_run_as_random(tmp_path: Path) -> None:
    src = make_tiny_model(tmp_path / "float")
    rewrite_tensors(src, lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
    refused(trit("generate", src, "hi", "--max-new-tokens", "3", check=False),
            "'model.layers.0.mlp.up_proj.weight' is missing")


def _set_config(folder: Path, **changes) -> None:
    import json

    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_packed_tensors_without_a_quantization_config_are_refused(tiny_llama_trit: Path, tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(tiny_llama_trit, tmp_path / "c"))
    _set_config(ckpt, quantization_config=None)
    refused(trit("generate", ckpt, "hi", "--max-new-tokens", "3", check=False),
            "config.json: quantization_config", "a trit config for the packed tensors it holds", "found none")


def test_from_pretrained_refuses_a_missing_tensor_before_loading(tiny_llama_trit: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    import trit  # noqa: F401  (teaches transformers the trit method)
    from trit.format import FormatError

    ckpt = Path(shutil.copytree(tiny_llama_trit, tmp_path / "c"))
    rewrite_tensors(ckpt, lambda t: t.pop("model.layers.1.mlp.down_proj.weight_scale"))
    with pytest.raises(FormatError, match=r"model.layers.1.mlp.down_proj.weight_scale: expected a tensor in the "
                                          r"checkpoint .*found none"):
        AutoModelForCausalLM.from_pretrained(ckpt)
    rewrite_tensors(Path(shutil.copytree(tiny_llama_trit, tmp_path / "d")),
                    lambda t: t.__setitem__("model.extra.weight", t["model.norm.weight"].clone()))
    with pytest.raises(FormatError, match=r"model.extra.weight: expected a tensor of the LlamaForCausalLM"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "d")


def test_an_empty_prompt_generates_from_bos(tiny_llama_trit: Path) -> None:
    p = trit("generate", tiny_llama_trit, "", "--max-new-tokens", "3")
    assert "3 tokens" in p.stderr


def test_missing_tokenizer_files_are_one_line_and_fail_the_audit(tiny_llama_trit: Path, tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(tiny_llama_trit, tmp_path / "c"))
    for f in ckpt.glob("tokenizer*"):
        f.unlink()
    refused(trit("generate", ckpt, "hi", check=False), "expected a tokenizer", str(ckpt))
    audit = trit("audit", ckpt, check=False)
    assert audit.returncode == 1 and "FAIL tokenizer, vocabulary fits the embedding" in audit.stdout, audit.stdout


def test_a_vocab_size_that_disagrees_with_the_embedding_fails_the_audit(tiny_llama_trit: Path, tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(tiny_llama_trit, tmp_path / "c"))
    rows = __import__("json").loads((ckpt / "config.json").read_text())["vocab_size"]
    _set_config(ckpt, vocab_size=rows + 7)
    audit = trit("audit", ckpt, check=False)
    assert audit.returncode == 1 and f"vocab_size {rows + 7}: expected the embedding's {rows} rows" in audit.stdout


@pytest.mark.parametrize(("flags", "needles"), [
    (["--damp", "-1"], ("--damp -1.0: expected a damping >= 0",)),
    (["--device", "tpu9"], ("--device tpu9: expected a device torch names",)),
    (["--passes", "0"], ("--passes 0: expected an integer >= 1",)),
    (["--method", "absmean", "--group-size", "1048576"],
     ("--group-size 1048576: larger than the rows of", "use a group of at most 64, or -1")),
    (["--method", "absmean", "--group-size", "6"], ("--group-size 6: expected -1 (one scale a row) or a positive",)),
    (["--bits", "2.5", "--planes", "2"], ("--bits 2.5 with --planes 2: a bits budget chooses each layer's planes",)),
    (["--bits", "2.5", "--method", "twn"], ("--bits with --method twn: a bits budget needs --method gptq",)),
    (["--bits", "9"], ("--bits 9: expected more than one plane's 2.250 and less than two planes' 4.500",)),
    (["--bits", "nan"], ("--bits nan: expected a number of bits a weight",)),
    (["--scheme", "w4a8", "--bits", "3"], ("--bits: ternary only",)),
])
def test_quantize_options_are_checked_before_work(src: Path, tmp_path: Path, flags: list[str], needles) -> None:
    refused(trit("quantize", src, tmp_path / "out", *flags, "--quiet", check=False), *needles)
    assert left_behind(tmp_path) == ["src"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without CUDA")
def test_quantize_on_cuda_without_a_gpu_is_one_line(src: Path, tmp_path: Path) -> None:
    refused(trit("quantize", src, tmp_path / "out", "--device", "cuda", check=False),
            "--device cuda: expected a device this machine has (no CUDA GPU is available here)")


@pytest.mark.parametrize(("content", "needle"), [
    (b"", "calibration text: expected text, found an empty file"),
    (bytes(range(256)), "calibration text: expected UTF-8 text, found a byte it cannot be (0x80 at byte 128)"),
    (b"0123456789", "calibration text of 10 tokens: expected at least one window of 64 (--calib-seq-len)"),
])
def test_calibration_text_that_cannot_calibrate_is_named(src: Path, tmp_path: Path, content: bytes,
                                                        needle: str) -> None:
    text = tmp_path / "calib.txt"
    text.write_bytes(content)
    refused(trit("quantize", src, tmp_path / "out", "--calib", text, "--calib-seq-len", "64", "--quiet", check=False),
            str(text), needle)
    assert sorted(left_behind(tmp_path)) == ["calib.txt", "src"]


def test_paths_that_cannot_be_written_or_read_are_one_line(src: Path, tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    refused(trit("quantize", tmp_path / "a", tmp_path / "out", check=False), "cannot be resolved")
    refused(trit("quantize", src, tmp_path / ("x" * 300), check=False), "its name is 300 bytes; at most 235")
    assert sorted(left_behind(tmp_path)) == ["a", "b", "src"]


def test_eval_json_target_is_checked_before_evaluating(tiny_llama_trit: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from trit.eval import perplexity

    monkeypatch.setattr(perplexity, "perplexity", lambda *a, **k: pytest.fail("evaluated first"))
    refused(trit("eval", tiny_llama_trit, "--json", tmp_path, check=False), "--json", "expected a file to write, "
            "found a folder")
    refused(trit("eval", tiny_llama_trit, "--json", tmp_path / "no" / "r.json", check=False), "does not exist")


def test_plan_and_generate_numbers_out_of_range_are_one_line(tiny_llama_trit: Path) -> None:
    refused(trit("plan", tiny_llama_trit, "--max-seq-len", "0", check=False), "--max-seq-len", "a positive number")
    refused(trit("generate", tiny_llama_trit, "hi", "--seed", str(10**24), check=False),
            f"--seed {10**24}: must be an integer in [0, 2**63)")


def test_the_api_names_its_own_arguments() -> None:
    import trit
    from trit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"AbsmeanConfig\(group_size=0\): expected -1 \(one scale a row\)"):
        trit.AbsmeanConfig(group_size=0)
    with pytest.raises(ConfigError, match=r"GPTQConfig\(damp=-1\)"):
        trit.GPTQConfig(damp=-1)
    with pytest.raises(ConfigError, match=r"CalibConfig\(samples=0\)"):
        trit.CalibConfig(samples=0)
    with pytest.raises(TypeError, match="model: expected what trit.load returns"):
        trit.generate(None, "hi")  # type: ignore[arg-type]
