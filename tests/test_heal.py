"""``trit heal`` on a tiny model, on the CPU: held-out loss goes down, a normal checkpoint comes out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from trit import runtime
from trit.configs import AbsmeanConfig, HealConfig
from trit.convert import convert
from trit.eval.audit import audit
from trit.heal import heal

OPTS = HealConfig(steps=30, lr=3e-3, weight_lr=3e-3, batch=4, seq_len=32, train_samples=16, heldout_samples=4,
                   eval_every=10, device="cpu", scales_first=0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from trit.synthetic import make_checkpoint

    root = tmp_path_factory.mktemp("heal")
    src = make_checkpoint(root / "float")
    convert(src, root / "trit", AbsmeanConfig(32), progress=False, log=lambda s: None)
    return src, root / "trit"


def test_heal_lowers_heldout_loss_and_writes_the_best(pair, tmp_path: Path) -> None:
    teacher, ckpt = pair
    report = heal(ckpt, teacher, tmp_path / "healed", OPTS, progress=False, log=lambda s: None)
    start, (best_step, best) = report.heldout[0][1], report.best
    assert best < 0.9 * start and best_step > 0
    assert report.train_windows.shape == (16, 32)  # sampled by the teacher, all at once (sample_batch 64)
    assert report.tokens == OPTS.steps * OPTS.batch * OPTS.seq_len
    assert audit(tmp_path / "healed").ok
    # the written checkpoint is the best student: its held-out KL is the one reported
    healed = runtime.load(tmp_path / "healed", device="cpu")
    assert healed.trit_config == runtime.load(ckpt, device="cpu").trit_config
    assert not torch.equal(healed.model.model.layers[0].mlp.up_proj.weight_packed,
                           runtime.load(ckpt, device="cpu").model.model.layers[0].mlp.up_proj.weight_packed)


def test_compiled_step_trains_as_the_eager_one(pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile=True`` traces the teacher's and the student's forward (and so the student's backward) through
    torch.compile, over both phases (codes fixed, then free): the held-out KL follows the eager run's.

    The backend is ``aot_eager`` here: it traces and splits forward from backward as the default backend does,
    without generating kernels (inductor takes minutes on two CPU cores)."""
    import trit.heal

    opts = dataclasses.replace(OPTS, steps=12, scales_first=8, eval_every=4)
    eager = heal(pair[1], pair[0], tmp_path / "eager", dataclasses.replace(opts, compile=False), progress=False,
                 log=lambda s: None)
    monkeypatch.setattr(trit.heal, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = heal(pair[1], pair[0], tmp_path / "compiled", dataclasses.replace(opts, compile=True), progress=False,
                    log=lambda s: None)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # traced: one graph a phase at least
    assert [s for s, _ in compiled.heldout] == [s for s, _ in eager.heldout] == [0, 4, 8, 12, 16, 20]
    torch.testing.assert_close([kl for _, kl in compiled.heldout], [kl for _, kl in eager.heldout], rtol=1e-4,
                               atol=1e-6)
    assert eager.heldout[-1][1] < eager.heldout[0][1]
    assert len(compiled.elapsed) == len(compiled.heldout) and compiled.elapsed == sorted(compiled.elapsed)
    # the training KL, averaged between evaluations, is reported at each one after step 0, and falls too
    assert [s for s, _ in compiled.train_kl] == [s for s, _ in compiled.heldout][1:]
    torch.testing.assert_close([v for _, v in compiled.train_kl], [v for _, v in eager.train_kl], rtol=1e-4, atol=1e-6)
    assert eager.train_kl[-1][1] < eager.train_kl[0][1]


def test_compiles_by_default_on_cuda_only() -> None:
    assert HealConfig().compiles("cuda") and HealConfig().compiles("cuda:0") and not HealConfig().compiles("cpu")
    assert HealConfig(compile=True).compiles("cpu") and not HealConfig(compile=False).compiles("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: inductor's GPU kernels")
def test_compiled_step_on_cuda(pair, tmp_path: Path) -> None:
    """The default on CUDA (compile, inductor, bf16 autocast) trains as the eager step does."""
    opts = dataclasses.replace(OPTS, steps=12, scales_first=8, eval_every=4, device="cuda")
    runs = [heal(pair[1], pair[0], tmp_path / str(c), dataclasses.replace(opts, compile=c), progress=False,
                 log=lambda s: None) for c in (False, None)]
    eager, compiled = ([kl for _, kl in r.heldout] for r in runs)
    assert compiled[0] == eager[0] and compiled[-1] < 0.9 * compiled[0]
    torch.testing.assert_close(compiled, eager, rtol=0.05, atol=1e-3)  # bf16 autocast: fused kernels round apart


def test_heal_starts_exactly_at_the_checkpoint(pair) -> None:
    from trit.heal import _swap_in_qat

    _, ckpt = pair
    model = runtime.load(ckpt, device="cpu").model
    ids = torch.randint(3, 90, (2, 16))
    with torch.no_grad():
        before = model(ids).logits
        _swap_in_qat(model)
        after = model(ids).logits
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_scales_learn_from_the_start(pair) -> None:
    """On the grid, a scale's gradient is that of ``t * a`` with the codes ``t`` as constants, not zero."""
    from trit.heal import QATLinear

    _, ckpt = pair
    layer = QATLinear(runtime.load(ckpt, device="cpu").model.model.layers[0].mlp.up_proj)
    x = torch.randn(5, layer.in_features)
    upstream = torch.randn(5, layer.out_features)
    (layer(x) * upstream).sum().backward()
    t, _ = layer.codes()
    dq = (upstream.T @ x)  # dL/dQ, (N, K)
    want = (dq.view(t.shape) * t.detach()).sum(-1)  # (N, G)
    torch.testing.assert_close(layer.scale.grad, want, rtol=1e-4, atol=1e-6)
    assert want.abs().max() > 0


def test_heal_from_text(pair, tmp_path: Path) -> None:
    teacher, ckpt = pair
    text = tmp_path / "train.txt"
    text.write_text("ternary weights, four to a byte; " * 60)
    opts = HealConfig(steps=4, lr=3e-3, weight_lr=3e-3, batch=2, seq_len=32, data=text, train_samples=8,
                       heldout_samples=2, eval_every=2, device="cpu", scales_first=0)
    report = heal(ckpt, teacher, tmp_path / "healed", opts, progress=False, log=lambda s: None)
    assert [s for s, _ in report.heldout] == [0, 2, 4]
    assert report.train_windows.shape == (8, 32)
    # --mix-sampled: teacher-sampled sequences join the text's windows; the held-out windows stay the text's
    mixed = heal(ckpt, teacher, tmp_path / "mixed", dataclasses.replace(opts, mix_sampled=3), progress=False,
                 log=lambda s: None)
    assert mixed.train_windows.shape == (11, 32)
    assert torch.equal(mixed.train_windows[:8], report.train_windows)
    assert mixed.heldout[0] == report.heldout[0]  # the same held-out text, so the same KL before training


def test_heldout_windows_are_the_texts_tail(pair, tmp_path: Path) -> None:
    """From a text, the held-out windows are its last tokens side by side; training windows end before them."""
    from trit.heal import _sequences

    _, ckpt = pair
    tokenizer = runtime.load(ckpt, device="cpu").tokenizer
    text = tmp_path / "train.txt"
    text.write_text(" ".join(f"word{i} and" for i in range(400)))
    ids = tokenizer(text.read_text(), return_tensors="pt").input_ids[0]
    opts = HealConfig(seq_len=32, data=text, train_samples=8, heldout_samples=3)
    train, heldout = _sequences(None, tokenizer, opts)
    assert torch.equal(heldout.flatten(), ids[-3 * 32:])
    cut = ids.numel() - 3 * 32
    assert torch.equal(train[-1], ids[cut - 32:cut]) and train.shape == (8, 32)


@pytest.mark.parametrize("change", [{"freeze_codes": True}, {"weight_lr": 0.0}, {"scales_first": 20, "steps": 0}],
                         ids=["freeze-codes", "weight-lr-0", "scales-first-only"])
def test_scales_train_while_the_codes_stay(pair, tmp_path: Path, change: dict) -> None:
    """``freeze_codes``, a zero learning rate for the latent weights alone, or a codes-fixed first phase whose
    state stays the best: the scales move, no code does."""
    teacher, ckpt = pair
    report = heal(ckpt, teacher, tmp_path / "healed", dataclasses.replace(OPTS, **change), progress=False,
                  log=lambda s: None)
    assert report.best[1] < report.heldout[0][1]
    before, after = runtime.load(ckpt, device="cpu").model, runtime.load(tmp_path / "healed", device="cpu").model
    for (name, a), b in zip(before.named_buffers(), after.buffers()):
        if name.endswith("weight_packed"):
            assert torch.equal(a, b), name  # every code as it was
    assert any(not torch.equal(a, b) for (name, a), b in zip(before.named_buffers(), after.buffers())
               if name.endswith("weight_scale"))


def test_two_phases_scales_first_then_all(pair, tmp_path: Path) -> None:
    """``scales_first``: a codes-fixed phase, then the main phase from its best state; one step count runs on."""
    teacher, ckpt = pair
    opts = dataclasses.replace(OPTS, scales_first=10, steps=20)
    report = heal(ckpt, teacher, tmp_path / "healed", opts, progress=False, log=lambda s: None)
    assert [s for s, _ in report.heldout] == [0, 10, 20, 30]
    assert report.steps == 30 and report.tokens == 30 * OPTS.batch * OPTS.seq_len
    assert report.best[1] < report.heldout[1][1] < report.heldout[0][1]  # each phase lowered the held-out loss
    before, after = runtime.load(ckpt, device="cpu").model, runtime.load(tmp_path / "healed", device="cpu").model
    assert any(not torch.equal(a, b) for (name, a), b in zip(before.named_buffers(), after.buffers())
               if name.endswith("weight_packed"))  # the second phase moved codes


def test_cli_runs_two_phases(pair, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from trit.cli import main

    teacher, ckpt = pair
    rc = main(["heal", str(ckpt), str(tmp_path / "healed"), "--teacher", str(teacher), "--scales-first", "3",
               "--steps", "3", "--batch", "2", "--seq-len", "16", "--train-samples", "4", "--heldout-samples", "2",
               "--eval-every", "3", "--device", "cpu", "--quiet"])
    assert rc == 0 and audit(tmp_path / "healed").ok
    assert "6 steps" in capsys.readouterr().out


def test_cli_defaults_are_the_library_defaults() -> None:
    """``trit heal`` with no options runs ``HealConfig()``: the measured recipe, two phases."""
    from trit.cli import parser

    args = parser().parse_args(["heal", "ckpt", "out", "--teacher", "teacher"])
    defaults = HealConfig()
    for name in ("steps", "lr", "weight_lr", "batch", "seq_len", "train_samples", "heldout_samples", "sample_batch",
                 "scales_first", "scales_first_lr", "eval_every", "grad_checkpointing", "freeze_codes",
                 "train_embeddings", "data", "device", "compile", "mix_sampled", "sample_first"):
        assert getattr(args, name) == getattr(defaults, name), name
    assert defaults.scales_first > 0 and defaults.weight_lr > defaults.lr  # codes fixed first, then weights move
    sub = next(a for a in parser()._actions if a.dest == "command").choices["heal"]
    text = sub.format_help()
    assert f"(default: {defaults.steps})" in text and f"(default: {defaults.scales_first})" in text


def test_unfreeze_starts_from_the_fixed_codes_and_new_scales(pair) -> None:
    from trit.heal import QATLinear

    _, ckpt = pair
    layer = QATLinear(runtime.load(ckpt, device="cpu").model.model.layers[0].mlp.up_proj)
    layer.freeze()
    t0 = layer.frozen[0].clone()
    with torch.no_grad():
        layer.scale.mul_(2.5)  # a scale that grew: rounding the old weight by it zeroes every code
        naive = torch.round(layer.weight.view(t0.shape) / layer.scale.abs()[:, :, None]).clamp(-1, 1)
    assert not torch.equal(naive, t0)
    x = torch.randn(3, layer.in_features)
    frozen_out = layer(x)
    layer.unfreeze()
    assert layer.frozen is None and layer.weight.requires_grad
    torch.testing.assert_close(layer.codes()[0], t0, rtol=0, atol=0)
    torch.testing.assert_close(layer(x), frozen_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_train_embeddings_writes_them(tmp_path: Path, tie: bool) -> None:
    """With ``train_embeddings`` the written checkpoint carries the trained embeddings (one tensor when tied)."""
    from safetensors.torch import load_file

    from trit.synthetic import make_checkpoint

    teacher = make_checkpoint(tmp_path / "float", tie=tie)
    convert(teacher, tmp_path / "trit", AbsmeanConfig(32), progress=False, log=lambda s: None)
    opts = dataclasses.replace(OPTS, freeze_codes=True, train_embeddings=True, weight_lr=1e-2, steps=10)
    report = heal(tmp_path / "trit", teacher, tmp_path / "healed", opts, progress=False, log=lambda s: None)
    assert report.best[0] > 0
    before = {k: v for f in (tmp_path / "trit").glob("*.safetensors") for k, v in load_file(f).items()}
    after = {k: v for f in (tmp_path / "healed").glob("*.safetensors") for k, v in load_file(f).items()}
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert "model.embed_tokens.weight" in changed
    assert ("lm_head.weight" in changed) == (not tie) and ("lm_head.weight" in before) == (not tie)
    assert not any(k.endswith("weight_packed") for k in changed)
    healed = runtime.load(tmp_path / "healed", device="cpu").model
    assert (healed.get_output_embeddings().weight is healed.get_input_embeddings().weight) == tie


def test_snapshot_copies_a_tied_embedding_once(tmp_path: Path) -> None:
    from trit import heal as heal_module
    from trit.synthetic import make_checkpoint

    teacher = make_checkpoint(tmp_path / "float", tie=True)
    convert(teacher, tmp_path / "trit", AbsmeanConfig(32), progress=False, log=lambda s: None)
    student = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32, warm=False).model
    qat = heal_module._swap_in_qat(student)
    state, _ = heal_module._snapshot(student, qat)
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]
    assert state["model.embed_tokens.weight"].data_ptr() != student.get_input_embeddings().weight.data_ptr()
    with torch.no_grad():
        student.get_input_embeddings().weight.zero_()
    heal_module._restore(student, qat, (state, {name: None for name in qat}))
    assert torch.equal(student.get_input_embeddings().weight, state["model.embed_tokens.weight"])
    assert student.get_output_embeddings().weight is student.get_input_embeddings().weight


@pytest.mark.parametrize(("change", "flag"), [({"steps": -1}, "--steps"), ({"scales_first": -3}, "--scales-first"),
                                              ({"batch": 0}, "--batch"), ({"lr": float("nan")}, "--lr"),
                                              ({"mix_sampled": 4}, "--mix-sampled 4: mixes sampled sequences into"),
                                              ({"sample_first": "nope"}, "--sample-first 'nope': expected one of")])
def test_heal_refuses_bad_options_before_writing(pair, tmp_path: Path, change: dict, flag: str) -> None:
    from trit.convert import ConvertError

    teacher, ckpt = pair
    with pytest.raises(ConvertError, match=f"heal {flag} "):
        heal(ckpt, teacher, tmp_path / "out", dataclasses.replace(OPTS, **change), progress=False)
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def planes(pair, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two planes in every layer (``--planes 2``), and a bits budget's mix of one and two (``--bits 3``)."""
    from trit.configs import CalibConfig, GPTQConfig

    root = tmp_path_factory.mktemp("heal-planes")
    calib = CalibConfig(samples=4, seq_len=32, batch=4, cache=False)
    convert(pair[0], root / "two", AbsmeanConfig(32, planes=2), progress=False, log=lambda s: None)
    convert(pair[0], root / "bits", GPTQConfig(32, calib=calib, bits=3.0), progress=False, log=lambda s: None)
    return {"two": root / "two", "bits": root / "bits"}


@pytest.mark.parametrize("kind", ["two", "bits"])
def test_heal_of_several_planes_starts_at_the_checkpoint_and_trains_each(pair, planes, tmp_path: Path,
                                                                         kind: str) -> None:
    """A layer of two trit-planes trains both (the second's codes move too) and writes both; step 0 is the
    checkpoint exactly; the layers of one plane in a bits budget's mix stay one plane."""
    from trit import format as fmt
    from trit.heal import _swap_in_qat

    teacher, ckpt = pair[0], planes[kind]
    source = runtime.load(ckpt, device="cpu")
    ids = torch.randint(3, 90, (2, 16))
    with torch.no_grad():
        before = source.model(ids).logits
        qat = _swap_in_qat(runtime.load(ckpt, device="cpu").model)
    two = {name for name, m in qat.items() if m.planes == 2}
    assert two and (kind == "two") == (len(two) == len(qat))
    model = runtime.load(ckpt, device="cpu").model
    _swap_in_qat(model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)

    report = heal(ckpt, teacher, tmp_path / "healed", OPTS, progress=False, log=lambda s: None)
    assert report.best[1] < 0.9 * report.heldout[0][1] and report.best[0] > 0
    assert audit(tmp_path / "healed").ok
    healed = runtime.load(tmp_path / "healed", device="cpu")
    assert healed.trit_config == source.trit_config
    moved = {suffix: 0 for pair_ in fmt.plane_suffixes(2) for suffix in pair_[:1]}
    for name in two:
        new, old = healed.model.get_submodule(name), source.model.get_submodule(name)
        assert new.planes == 2
        for packed, _ in fmt.plane_suffixes(2):
            moved[packed] += int(not torch.equal(getattr(new, packed), getattr(old, packed)))
    assert all(moved.values()), moved  # codes of both planes moved somewhere


def test_heal_refuses_a_float_checkpoint(pair, tmp_path: Path) -> None:
    from trit.convert import ConvertError

    teacher, _ = pair
    with pytest.raises(ConvertError, match="not a trit checkpoint"):
        heal(teacher, teacher, tmp_path / "out", OPTS, progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("first", ["bos", "random"])
def test_sampled_sequences_start_as_told(pair, tmp_path: Path, first: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sample-first`` reaches the sampler, for the training and held-out sequences alike; a random token by
    default."""
    from trit import calibrate

    teacher, ckpt = pair
    seen = []
    real = calibrate.sample_from_model
    monkeypatch.setattr(calibrate, "sample_from_model", lambda *a, **kw: seen.append(kw["first"]) or real(*a, **kw))
    opts = dataclasses.replace(OPTS, steps=2, eval_every=2, sample_first=first)
    report = heal(ckpt, teacher, tmp_path / "out", opts, progress=False)
    assert seen == [first] and report.train_windows.shape == (OPTS.train_samples, OPTS.seq_len)
    assert HealConfig().sample_first == "random"


def test_cli_passes_sample_first(pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trit.heal
    from trit.cli import main

    got = []
    monkeypatch.setattr(trit.heal, "heal", lambda ckpt, teacher, out, opts, **kw: got.append(opts.sample_first))
    teacher, ckpt = pair
    for flags in ([], ["--sample-first", "bos"]):
        assert main(["heal", str(ckpt), str(tmp_path / "out"), "--teacher", str(teacher), *flags, "--quiet"]) == 0
    assert got == ["random", "bos"]


def test_training_sequences_default_to_4096_sampled_and_2048_windows_of_text(tmp_path: Path) -> None:
    """Data-free heal trains on 4096 sampled sequences (the default chosen across domains); with --data, 2048
    windows of the text (the text recipe as measured); an explicit count wins either way, on the CLI too."""
    from trit.cli import heal_config, parser

    assert HealConfig().training_samples() == 4096
    assert HealConfig(data=tmp_path / "text.txt").training_samples() == 2048
    assert HealConfig(train_samples=100, data=tmp_path / "text.txt").training_samples() == 100

    def parsed(*flags: str) -> int:
        return heal_config(parser().parse_args(["heal", "CKPT", "OUT", "--teacher", "T", *flags])).training_samples()

    assert (parsed(), parsed("--data", "text.txt"), parsed("--train-samples", "8")) == (4096, 2048, 8)


def test_sample_batch_defaults_to_the_device_and_its_free_memory() -> None:
    from transformers import LlamaConfig

    from trit.arch import kv_cache_bytes

    # SmolLM2-135M's shape: 30 layers, 3 KV heads of 64; float32, 512 tokens: 23.6 MB a sequence
    smol = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3)
    seq = kv_cache_bytes(smol, 512)
    assert seq == 2 * 30 * 3 * 64 * 4 * 512
    d = HealConfig()
    assert d.sampling_batch("cpu", seq, None) == 64 and d.sampling_batch("cuda") == 512
    assert d.sampling_batch("cuda:0", seq, 135 * 2**30) == 512  # an H200: 512 sequences' 12 GB fit a quarter
    assert d.sampling_batch("cuda", seq, 22 * 2**30) == 128  # a 24 GB card: halved twice, to 3 GB
    assert d.sampling_batch("cuda", 2**40, 2**30) == 1  # nothing fits: one at a time, never zero
    assert HealConfig(sample_batch=8).sampling_batch("cuda", seq, 2**20) == 8  # given: as given
