"""The command line as a user meets it: exit codes, messages, nothing left behind (through ``trit.cli.main``;
the console script and one whole run are real processes)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import corrupt_config, rewrite_tensors, trit


def test_console_script_is_installed() -> None:
    script = shutil.which("trit", path=str(Path(sys.executable).parent))
    assert script is not None
    out = subprocess.run([script, "--help"], capture_output=True, text=True, check=True).stdout
    assert "quantize" in out and "audit" in out


def test_quantize_audit_generate_eval(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "t"
    q = trit("quantize", tiny_llama, out, "--method", "twn", "--group-size", "32", "--keep", "*.down_proj", "--quiet")
    assert "2.500 bits per weight including scales" in q.stdout and "kept" in q.stdout
    a = trit("audit", out)
    assert a.stdout.rstrip().endswith("PASS")
    g = trit("generate", out, "hello", "--max-new-tokens", "5", "--temperature", "0.8", "--top-p", "0.9",
             "--top-k", "20", "--repetition-penalty", "1.2", "--seed", "3", "--chat", "--device", "cpu", process=True)
    assert "5 tokens" in g.stderr
    text = tmp_path / "t.txt"
    text.write_text("some text to score. " * 40)
    for ckpt in (out, tiny_llama):
        e = trit("eval", ckpt, "--ppl", text, "--seq-len", "64", "--max-windows", "3")
        assert e.stdout.startswith("perplexity ") and "over 189 tokens (3 windows" in e.stdout


def _no_output(parent: Path, name: str) -> bool:
    return not (parent / name).exists() and not [p for p in parent.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize(
    ("setup", "match"),
    [
        (lambda m: (m / "config.json").unlink(), "config.json: missing"),
        (lambda m: (m / "config.json").write_text("{"), "config.json: not valid JSON"),
        (lambda m: (m / "model.safetensors").write_bytes((m / "model.safetensors").read_bytes()[:-64]), "truncated"),
        (lambda m: rewrite_tensors(m, lambda t: t["model.layers.0.mlp.up_proj.weight"].view(-1).__setitem__(0, float("nan"))),
         "holds 1 NaN or Inf values"),
        (lambda m: (m / "config.json").write_text(json.dumps({**json.loads((m / "config.json").read_text()), "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]})),
         "unsupported architecture GPTNeoXForCausalLM"),
    ],
)
def test_quantize_bad_input(tiny_llama: Path, tmp_path: Path, setup, match: str) -> None:
    setup(tiny_llama)
    p = trit("quantize", tiny_llama, tmp_path / "o", "--method", "absmean", check=False)
    assert p.returncode == 2 and "\ntrit: error: " in "\n" + p.stderr and match in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert _no_output(tmp_path, "o")


@pytest.mark.parametrize(("flags", "match"), [(["--planes", "3"], "--planes"), (["--passes", "0"], "--passes 0")])
def test_quantize_bad_options(tiny_llama: Path, tmp_path: Path, flags: list[str], match: str) -> None:
    p = trit("quantize", tiny_llama, tmp_path / "o", "--method", "gptq", *flags, check=False)
    assert p.returncode == 2 and match in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert _no_output(tmp_path, "o")


def test_quantize_builds_the_typed_configs_with_their_defaults() -> None:
    """``trit quantize`` parses its flags into the configs the Python API takes: unset, their defaults (act-order,
    three passes, groups of 64); each scheme its own type; the serving choices in the Layout."""
    from trit import format as fmt
    from trit.cli import parser, quantize_configs
    from trit.configs import AbsmeanConfig, CalibConfig, GPTQConfig, Layout, TWNConfig, W4A8Config
    from trit.errors import OptionError

    def configs(*flags: str):
        return quantize_configs(parser().parse_args(["quantize", "m", "o", *flags]))

    config, layout = configs()
    assert (config, layout) == (GPTQConfig(), Layout()) and (config.act_order, config.passes, config.group_size) == (
        True, 3, 64)
    config, _ = configs("--no-act-order", "--passes", "1", "--calib", "wikitext2", "--calib-first", "bos")
    assert (config.act_order, config.passes, config.calib) == (False, 1, CalibConfig("wikitext2", first="bos"))
    assert configs("--method", "twn", "--planes", "2")[0] == TWNConfig(planes=2)
    assert configs("--method", "absmean", "--group-size", "-1")[0] == AbsmeanConfig(fmt.PER_ROW)
    assert configs("--method", "absmean", "--planes", "2")[0] == AbsmeanConfig(planes=2)
    _, layout = configs("--keep", "a, b", "--lm-head", "int8", "--activations", "int8", "--pad", "keep")
    assert layout == Layout(("a", "b"), fmt.PadPolicy.KEEP, lm_head="int8",
                            activations=fmt.ActivationQuant.INT8_PER_TOKEN)
    assert configs("--scheme", "w4a8", "--group-size", "channel") == (W4A8Config(-1), Layout())
    with pytest.raises(OptionError, match="--activations: ternary only"):
        configs("--scheme", "w4a8", "--activations", "int8")


def test_quantize_refuses_out_equal_to_model(tiny_llama: Path) -> None:
    p = trit("quantize", tiny_llama, tiny_llama, "--overwrite", check=False)
    assert p.returncode == 2 and "is MODEL_DIR" in p.stderr


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda c: rewrite_tensors(c, lambda t: t["model.layers.0.mlp.up_proj.weight_packed"].view(-1)[0:1].fill_(0xC0)),
         "codes equal to 3"),
        (lambda c: rewrite_tensors(c, lambda t: t.__setitem__("model.layers.0.mlp.up_proj.weight_scale", t["model.layers.0.mlp.up_proj.weight_scale"][:, :1].clone())),
         "weight_scale: expected shape"),
        (lambda c: rewrite_tensors(c, lambda t: t.pop("model.layers.0.mlp.up_proj.weight_packed")),
         "expected a tensor in the checkpoint"),
        (lambda c: corrupt_config(c, format_version=2), "format_version: expected 1"),
    ],
)
def test_bad_trit_checkpoint(tiny_llama_trit: Path, tmp_path: Path, edit, match: str) -> None:
    ckpt = Path(shutil.copytree(tiny_llama_trit, tmp_path / "c"))
    edit(ckpt)
    g = trit("generate", ckpt, "hi", "--max-new-tokens", "2", check=False)
    assert g.returncode == 2 and match in g.stderr and "Traceback" not in g.stderr, g.stderr
    a = trit("audit", ckpt, check=False)
    assert a.returncode != 0 and match in a.stdout and a.stdout.rstrip().endswith("FAIL")


def test_eval_several_corpora_with_their_geometric_mean(tiny_llama_trit: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    e = trit("eval", tiny_llama_trit, "--ppl", "wikitext2,python", "--seq-len", "64", "--max-windows", "2",
             "--json", out, "--device", "cpu")
    lines = e.stdout.strip().splitlines()
    assert [ln.split(" of ")[1].split(";")[0] for ln in lines[:2]] == ["wikitext2", "python"]
    assert lines[2].startswith("geometric mean over 2 corpora: ")
    data = json.loads(out.read_text())
    ppl = [c["perplexity"] for c in data["corpora"].values()]
    assert data["geometric_mean"] == pytest.approx((ppl[0] * ppl[1]) ** 0.5)
    bad = trit("eval", tiny_llama_trit, "--ppl", "wikitext2,nope", check=False)
    assert bad.returncode == 2 and "nope: no such text file, and not a built-in corpus" in bad.stderr


def test_every_command_has_help_with_defaults_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    """In-process (argparse prints the help and exits 0); one real ``--help`` process checks the entry point."""
    from trit.cli import main

    def help_text(*args: str) -> str:
        with pytest.raises(SystemExit) as stop:
            main([*args, "--help"])
        assert stop.value.code == 0, args
        return capsys.readouterr().out

    for cmd in ("quantize", "heal", "generate", "eval", "audit", "plan", "demo", "import"):
        out = help_text(cmd)
        assert "example:" in out and "trit " + cmd in out, cmd
    assert "(default: gptq)" in help_text("quantize")
    bench = help_text("bench")
    assert all(w in bench for w in ("kernels", "a8", "decode", "serve", "cpu", "memory", "sass", "check"))
    assert "--concurrency" in help_text("bench", "serve")
    assert "--engines" in help_text("bench", "decode")
    assert "--llama-cpp-python" in help_text("bench", "cpu")
    assert "(default: gptq)" in trit("quantize", "--help").stdout
