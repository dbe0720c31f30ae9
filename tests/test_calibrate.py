"""GPTQ over a whole (tiny) model: calibration data, the converter's --method gptq, two planes, the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trit import format as fmt
from trit import runtime
from trit.calibrate import windows_from_text
from trit.cli import main
from trit.configs import AbsmeanConfig, CalibConfig, GPTQConfig
from trit.convert import convert
from trit.eval.audit import audit

TEXT = ("The ternary weights were packed four to a byte. " * 8 + "A layer reads its inputs once per token. " * 8) * 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trit.synthetic import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("calib") / "float", hidden=64, intermediate=160, std=0.05)


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "calib.txt"
    path.write_text(TEXT)
    return path


def _logit_error(ckpt: Path, float_dir: Path, ids: torch.Tensor) -> float:
    want = runtime.load(float_dir, device="cpu").model(ids).logits
    got = runtime.load(ckpt, device="cpu").model(ids).logits
    return ((got - want).norm() / want.norm()).item()


def test_windows_from_text_spread_over_the_stream() -> None:
    w = windows_from_text(torch.arange(100), 4, 10)
    assert w.shape == (4, 10) and w[0, 0] == 0 and w[-1, -1] == 99
    with pytest.raises(ValueError, match="fewer than one window"):
        windows_from_text(torch.arange(5), 2, 10)


@torch.no_grad()
@pytest.mark.parametrize("float_target", [True, False])
def test_gptq_model_is_closer_to_float_than_absmean(tiny: Path, calib_file: Path, tmp_path: Path,
                                                    float_target: bool) -> None:
    calib = CalibConfig(calib_file, samples=8, seq_len=64, batch=4)
    opts = GPTQConfig(32, calib=calib, float_target=float_target)
    convert(tiny, tmp_path / "gptq", opts, progress=False, log=lambda s: None)
    convert(tiny, tmp_path / "absmean", AbsmeanConfig(32), progress=False, log=lambda s: None)
    assert audit(tmp_path / "gptq").ok
    tok = runtime.load(tiny, device="cpu").tokenizer
    ids = tok(TEXT[:200], return_tensors="pt").input_ids
    assert _logit_error(tmp_path / "gptq", tiny, ids) < _logit_error(tmp_path / "absmean", tiny, ids)


@torch.no_grad()
def test_two_planes_load_audit_and_beat_one(tiny: Path, calib_file: Path, tmp_path: Path) -> None:
    calib = CalibConfig(calib_file, samples=8, seq_len=64, batch=4)
    for planes in (1, 2):
        opts = GPTQConfig(32, planes=planes, calib=calib, act_order=True,
                              float_target=False)  # the same recipe for both (plain GPTQ)
        convert(tiny, tmp_path / f"p{planes}", opts, progress=False, log=lambda s: None)
    q = json.loads((tmp_path / "p2" / "config.json").read_text())["quantization_config"]
    assert q["planes"] == 2 and q["method"] == "gptq"
    report = audit(tmp_path / "p2")
    assert report.ok and 4.0 < report.bits_per_weight < 5.1  # two planes of 2 bits, plus two sets of scales
    loaded = runtime.load(tmp_path / "p2", device="cpu")
    assert loaded.model.model.layers[0].mlp.up_proj.weight_packed_2.shape == (160, 16)
    tok = loaded.tokenizer
    ids = tok(TEXT[:200], return_tensors="pt").input_ids
    assert _logit_error(tmp_path / "p2", tiny, ids) < 0.5 * _logit_error(tmp_path / "p1", tiny, ids)


@torch.no_grad()
def test_a_bits_budget_gives_a_second_plane_to_some_layers(tiny: Path, calib_file: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    import trit.calibrate

    calib = CalibConfig(calib_file, samples=8, seq_len=64, batch=4)
    convert(tiny, tmp_path / "p1", GPTQConfig(32, calib=calib), progress=False, log=lambda s: None)
    lines: list[str] = []
    fetched = []
    windows = trit.calibrate.calibration_ids
    monkeypatch.setattr(trit.calibrate, "calibration_ids", lambda *a, **k: fetched.append(1) or windows(*a, **k))
    report = convert(tiny, tmp_path / "b3", GPTQConfig(32, calib=calib, bits=3.0), progress=False, log=lines.append)
    assert len(fetched) == 1  # the sensitivity pass and both GPTQ passes share one set of windows
    qcfg = fmt.TritConfig.from_dict(json.loads((tmp_path / "b3" / "config.json").read_text())["quantization_config"])
    two = dict(qcfg.layer_planes)
    assert qcfg.planes == 1 and sorted(two) == report.two_planes and set(two.values()) == {2}
    assert 0 < len(two) < len(report.layers) and f"a second plane for {len(two)} of 14 layers" in lines[-1]
    for i in range(2):  # the layers vLLM fuses share one count
        qcfg.planes_of(f"model.layers.{i}.self_attn.qkv_proj"), qcfg.planes_of(f"model.layers.{i}.mlp.gate_up_proj")
    checked = audit(tmp_path / "b3")
    assert checked.ok and 2.5 < checked.bits_per_weight <= 3.0
    assert checked.bits_per_weight == pytest.approx(report.bits_per_weight)
    loaded = runtime.load(tmp_path / "b3", device="cpu")
    assert {name: loaded.model.get_submodule(name).planes for name in two} == two
    ids = loaded.tokenizer(TEXT[:200], return_tensors="pt").input_ids
    assert _logit_error(tmp_path / "b3", tiny, ids) < _logit_error(tmp_path / "p1", tiny, ids)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "b3", dtype=torch.float32)
    assert torch.equal(hf(ids).logits, loaded.model(ids).logits)


def test_output_fisher_is_the_squared_gradient_at_each_output(tiny: Path, calib_file: Path) -> None:
    from transformers import AutoModelForCausalLM

    from trit.calibrate import calibration_ids, output_fisher
    from trit.checkpoint import open_checkpoint

    calib = CalibConfig(calib_file, samples=3, seq_len=32)
    modules = {"model.layers.0.self_attn.k_proj", "model.layers.1.mlp.down_proj"}
    got = output_fisher(open_checkpoint(tiny), modules, calib, progress=False)
    # the same through another route: a zero added to the output, whose gradient is the output's
    ids = calibration_ids(open_checkpoint(tiny), calib, "cpu")
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    for name in modules:
        module, total = model.get_submodule(name), 0.0
        for window in ids:
            zero = torch.zeros(1, ids.shape[1], module.out_features, requires_grad=True)
            hook = module.register_forward_hook(lambda m, a, out, zero=zero: out + zero)
            logits = model(window[None]).logits[0, :-1]
            torch.nn.functional.cross_entropy(logits, window[1:], reduction="sum").backward()
            hook.remove()
            total += float(zero.grad.double().square().sum())
        assert got[name] == pytest.approx(total / ids.numel() / module.out_features, rel=1e-4)
        assert got[name] > 0


def test_the_budget_weights_each_layers_error_by_its_fisher(tiny: Path, calib_file: Path) -> None:
    from trit.calibrate import gptq_model
    from trit.checkpoint import open_checkpoint
    from trit.quant.gptq import GptqOptions

    calib = CalibConfig(calib_file, samples=4, seq_len=32)
    todo = {f"model.layers.0.{s}" for s in ("self_attn.o_proj", "mlp.down_proj")}
    measured: dict[float, list] = {}
    for weight in (1.0, 3.0):
        gains: list = []
        fisher = {"model.layers.0.mlp.down_proj": weight}  # o_proj: none given, weighted 1
        gptq_model(open_checkpoint(tiny), todo, GptqOptions(32), calib, progress=False, gains=gains, fisher=fisher)
        measured[weight] = {g.modules: g for g in gains}
    o, down = ("model.layers.0.self_attn.o_proj",), ("model.layers.0.mlp.down_proj",)
    assert measured[3.0][o] == measured[1.0][o]
    assert measured[3.0][down].error_one == pytest.approx(3 * measured[1.0][down].error_one)
    assert measured[3.0][down].error_two == pytest.approx(3 * measured[1.0][down].error_two)
    assert measured[3.0][down].energy == measured[1.0][down].energy


def test_data_free_calibration_by_default(tiny: Path, tmp_path: Path) -> None:
    code = main(["quantize", str(tiny), str(tmp_path / "out"), "--method", "gptq", "--group-size", "32",
                 "--calib-samples", "2", "--calib-seq-len", "16", "--quiet"])
    assert code == 0 and audit(tmp_path / "out").ok


def test_random_first_token_starts_each_sampled_window_apart(tiny: Path) -> None:
    from transformers import AutoTokenizer

    from trit.calibrate import calibration_ids
    from trit.checkpoint import open_checkpoint

    ckpt = open_checkpoint(tiny)
    special = set(AutoTokenizer.from_pretrained(tiny).all_special_ids)
    bos = calibration_ids(ckpt, CalibConfig(samples=6, seq_len=12, batch=3, first="bos"), "cpu")
    rnd = calibration_ids(ckpt, CalibConfig(samples=6, seq_len=12, batch=3), "cpu")  # the default
    assert bos.shape == rnd.shape == (6, 12)
    assert len(set(bos[:, 0].tolist())) == 1 and (rnd[:, 0] == bos[0, 0]).all()  # BOS first, either way
    assert len(set(rnd[:, 1].tolist())) > 1 and not special & set(rnd[:, 1].tolist())
    again = calibration_ids(ckpt, CalibConfig(samples=6, seq_len=12, batch=3, first="random", cache=False), "cpu")
    assert torch.equal(rnd, again)  # seeded (sampled again: the cache left out)
    with pytest.raises(ValueError, match=r"CalibConfig\(first='text'\): expected one of bos, random"):
        calibration_ids(ckpt, CalibConfig(samples=2, seq_len=8, first="text"), "cpu")


def test_sampled_windows_are_kept_and_reused(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import shutil

    from trit import calibrate
    from trit.checkpoint import open_checkpoint

    monkeypatch.setenv("TRIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TRIT_CALIB_CACHE")  # the tests' own folder (conftest): this test looks at the default
    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    calls = []
    real = calibrate.sample_from_model
    monkeypatch.setattr(calibrate, "sample_from_model", lambda *a, **kw: calls.append(a[2:]) or real(*a, **kw))
    opts = CalibConfig(samples=4, seq_len=10, batch=2)
    first = calibrate.calibration_ids(open_checkpoint(model), opts, "cpu")
    path = calibrate.sample_cache_path(model, opts, "cpu")
    assert path.is_file() and path.parent == tmp_path / "cache" / "calib" and len(calls) == 1
    assert torch.equal(calibrate.calibration_ids(open_checkpoint(model), opts, "cpu"), first) and len(calls) == 1
    # another seed, another device type, the cache switched off: sampled again
    calibrate.calibration_ids(open_checkpoint(model), CalibConfig(samples=4, seq_len=10, batch=2, seed=1), "cpu")
    assert calibrate.sample_cache_path(model, opts, "meta") != path
    calibrate.calibration_ids(open_checkpoint(model), CalibConfig(samples=4, seq_len=10, batch=2, cache=False), "cpu")
    assert len(calls) == 3
    # a checkpoint file changed (its modification time): another key
    config = model / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    assert calibrate.sample_cache_path(model, opts, "cpu") != path
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns - 10**9))
    # a torn entry: sampled again and replaced
    path.write_bytes(b"not a tensor")
    assert torch.equal(calibrate.calibration_ids(open_checkpoint(model), opts, "cpu"), first) and len(calls) == 4
    assert torch.equal(torch.load(path, weights_only=True), first)
    assert not list(path.parent.glob("*.tmp-*"))
    # the newest entries only
    monkeypatch.setattr(calibrate, "SAMPLE_CACHE_ENTRIES", 2)
    calibrate.calibration_ids(open_checkpoint(model), CalibConfig(samples=4, seq_len=10, batch=2, seed=2), "cpu")
    assert len(list(path.parent.glob("*.pt"))) == 2
    # TRIT_CALIB_CACHE moves the folder
    monkeypatch.setenv("TRIT_CALIB_CACHE", str(tmp_path / "elsewhere"))
    assert calibrate.sample_cache_path(model, opts, "cpu").parent == tmp_path / "elsewhere"


def test_a_cache_that_cannot_be_written_is_passed_over(tiny: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from trit import calibrate
    from trit.checkpoint import open_checkpoint

    blocked = tmp_path / "calib"
    blocked.mkdir()
    monkeypatch.setenv("TRIT_CALIB_CACHE", str(blocked))

    real = Path.write_bytes

    def torn(self: Path, data: bytes) -> int:  # half the file, then the disk is full
        real(self, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", torn)
    ids = calibrate.calibration_ids(open_checkpoint(tiny), CalibConfig(samples=2, seq_len=8, batch=2), "cpu")
    assert ids.shape == (2, 8) and list(blocked.iterdir()) == []  # the windows, and nothing left behind


def test_calib_cache_flag() -> None:
    from trit.cli import parser

    base = ["quantize", "m", "o", "--method", "gptq"]
    assert parser().parse_args(base).calib_cache is True
    assert parser().parse_args([*base, "--no-calib-cache"]).calib_cache is False


def test_float_target_flag() -> None:
    from trit.cli import parser

    base = ["quantize", "m", "o", "--method", "gptq"]
    assert parser().parse_args(base).float_target is None  # the converter decides by the number of planes
    assert parser().parse_args([*base, "--float-target"]).float_target is True
    assert parser().parse_args([*base, "--no-float-target"]).float_target is False


@pytest.mark.parametrize(("planes", "want"), [(1, True), (2, False)])
def test_float_target_default_follows_planes(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             planes: int, want: bool) -> None:
    import trit.calibrate

    class Seen(Exception):
        pass

    def spy(ckpt, todo, gopts, *args, **kwargs):
        raise Seen(gopts.float_target)

    monkeypatch.setattr(trit.calibrate, "gptq_model", spy)
    with pytest.raises(Seen) as seen:
        convert(tiny, tmp_path / "out", GPTQConfig(32, planes=planes),
                progress=False, log=lambda s: None)
    assert seen.value.args == (want,) and not (tmp_path / "out").exists()


def test_missing_calibration_file_fails_cleanly(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["quantize", str(tiny), str(tmp_path / "out"), "--method", "gptq", "--calib",
                 str(tmp_path / "nope.txt"), "--quiet"])
    assert code == 2 and "nope.txt: no such calibration text file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_data_free_planes_without_calibration(tiny: Path, tmp_path: Path) -> None:
    assert main(["quantize", str(tiny), str(tmp_path / "out"), "--planes", "2", "--group-size", "32", "--method", "absmean", "--quiet"]) == 0
    assert audit(tmp_path / "out").ok
