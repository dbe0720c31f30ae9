"""The embedded runtime: loading on the meta device, numerics against a dequantized float model, generation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import corrupt_config, make_tiny_model, rewrite_tensors
from safetensors.torch import load_file

import trit.runtime.loader
from trit import format as fmt
from trit import runtime
from trit.configs import AbsmeanConfig
from trit.convert import convert
from trit.nn import TritLinear


def _dequantized_float_model(trit_dir: Path, float_dir: Path):
    """The oracle: the float model with each ternary layer's weight replaced by its dequantized value."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32)
    tensors = load_file(trit_dir / "model.safetensors")
    for layer in fmt.layer_names(tensors):
        lin = model.get_submodule(layer)
        w = fmt.dequantize(tensors[f"{layer}.weight_packed"], tensors[f"{layer}.weight_scale"], lin.in_features)
        lin.weight.data.copy_(w)
    return model.eval()


@pytest.mark.parametrize(("hidden", "group", "tie"), [(64, 32, False), (96, 64, True), (64, -1, False)])
def test_logits_match_dequantized_float_model(tmp_path: Path, hidden: int, group: int, tie: bool) -> None:
    src = make_tiny_model(tmp_path / "float", hidden=hidden, intermediate=128, tie=tie)
    out = tmp_path / "trit"
    convert(src, out, AbsmeanConfig(group), progress=False)
    loaded = runtime.load(out, device="cpu", dtype=torch.float32)
    ternary = [m for m in loaded.model.modules() if isinstance(m, TritLinear)]
    assert len(ternary) == 14
    assert all(not hasattr(m, "weight") for m in ternary)  # no float copy of a ternary weight
    assert not any(t.is_meta for t in loaded.model.state_dict().values())
    oracle = _dequantized_float_model(out, src)
    ids = torch.randint(3, 90, (2, 17))
    with torch.inference_mode():
        got, want = loaded.model(ids).logits, oracle(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_float_checkpoint_loads_through_the_same_function(tiny_llama: Path) -> None:
    loaded = runtime.load(tiny_llama, device="cpu")
    assert loaded.trit_config is None
    assert not any(isinstance(m, TritLinear) for m in loaded.model.modules())


def test_greedy_generation_is_deterministic_and_streams(tiny_llama_trit: Path) -> None:
    loaded = runtime.load(tiny_llama_trit, device="cpu")
    opts = runtime.SamplingOptions(max_new_tokens=12)
    stats = runtime.GenerationStats()
    pieces = list(runtime.stream(loaded, "hello", opts, stats=stats))
    assert stats.new_tokens == 12 and stats.prompt_tokens == 5 and stats.seconds > 0
    text = runtime.generate(loaded, "hello", opts)
    assert "".join(pieces) == text and len(text) > 0
    ids = runtime.encode_prompt(loaded, "hello")
    assert runtime.greedy_ids(loaded, ids, 12).shape == (1, 12)


def test_teacher_forced_scores_match_generation(tiny_llama_trit: Path) -> None:
    loaded = runtime.load(tiny_llama_trit, device="cpu")
    ids = runtime.encode_prompt(loaded, "hello")[0].tolist()
    new = runtime.greedy_ids(loaded, torch.tensor([ids]), 8)[0].tolist()
    assert runtime.greedy_gaps(loaded, ids, new).abs().max().item() < 1e-5  # its own greedy tokens: its best
    logp = runtime.token_logprobs(loaded, ids + new)
    assert logp.shape == (len(ids) + 8, loaded.model.config.vocab_size)
    worst = logp[len(ids) - 1].argmin().item()  # a token far below the best at the first new step
    gap = runtime.greedy_gaps(loaded, ids, [worst])
    # rel 1e-4: the two passes differ in length, so attention sums in another order (about 1e-7), and the native
    # CPU kernel's per-token int16 rounding can turn that into about 1e-5 of a log-probability
    assert gap.item() == pytest.approx((logp[len(ids) - 1].max() - logp[len(ids) - 1, worst]).item(), rel=1e-4)
    assert gap.item() > 0.5
    scored = runtime.prompt_logprobs(loaded, ids + new)
    assert scored.shape == (len(ids) + 7,)  # each token after its prefix: the new ones scored as generated
    assert torch.equal(scored[len(ids) - 1:], logp[len(ids) - 1:-1].gather(1, torch.tensor(new)[:, None])[:, 0])


def test_sampling_is_reproducible_with_a_seed(tiny_llama_trit: Path) -> None:
    loaded = runtime.load(tiny_llama_trit, device="cpu")
    opts = runtime.SamplingOptions(max_new_tokens=16, temperature=1.5, top_p=0.95, top_k=40,
                                   repetition_penalty=1.1, seed=7)
    a, b = runtime.generate(loaded, "abc", opts), runtime.generate(loaded, "abc", opts)
    c = runtime.generate(loaded, "abc", runtime.SamplingOptions(max_new_tokens=16, temperature=1.5, seed=8))
    assert a == b and a != c


def test_chat_template_is_applied(tiny_llama_trit: Path) -> None:
    loaded = runtime.load(tiny_llama_trit, device="cpu")
    ids = runtime.encode_prompt(loaded, "hi", chat=True)
    assert loaded.tokenizer.decode(ids[0]) == "<|user|>hi\n<|assistant|>"


@pytest.fixture
def trit_copy(tiny_llama_trit: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(tiny_llama_trit, dst)
    return dst


LAYER = "model.layers.0.mlp.up_proj"


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: t[f"{LAYER}.weight_packed"].view(-1)[:3].fill_(0xFF),
         rf"{LAYER}.weight_packed: expected 2-bit codes in \{{0, 1, 2\}}, found 12 codes equal to 3"),
        (lambda t: t.__setitem__(f"{LAYER}.weight_scale", t[f"{LAYER}.weight_scale"][:, :1].clone()),
         rf"{LAYER}.weight_scale: expected shape \(128, 2\) \(group size 32\), found \(128, 1\)"),
        (lambda t: t.pop(f"{LAYER}.weight_scale"), rf"{LAYER}.weight_scale: expected a tensor in the checkpoint"),
        (lambda t: t.pop("model.norm.weight"), r"model.norm.weight: expected a tensor in the checkpoint"),
        (lambda t: t.__setitem__("model.extra", torch.zeros(1)), r"model.extra: expected a tensor of the"),
    ],
)
def test_refuses_corrupt_checkpoint(trit_copy: Path, edit, match: str) -> None:
    rewrite_tensors(trit_copy, edit)
    with pytest.raises(fmt.FormatError, match=match):
        runtime.load(trit_copy, device="cpu")


def test_refuses_format_version_2(trit_copy: Path) -> None:
    corrupt_config(trit_copy, format_version=2)
    with pytest.raises(fmt.FormatError, match=r"format_version: expected 1 \(this trit reads format 1 only\), found 2"):
        runtime.load(trit_copy, device="cpu")


def test_load_warms_the_kernels_up_when_asked(tiny_llama_trit: Path, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(trit.runtime.loader, "warm_up", lambda model, dtype: calls.append(dtype))
    monkeypatch.delenv("TRIT_WARMUP", raising=False)
    runtime.load(tiny_llama_trit, device="cpu")  # a CPU compiles nothing: no warm-up by default
    runtime.load(tiny_llama_trit, device="cpu", warm=False)
    assert calls == []
    runtime.load(tiny_llama_trit, device="cpu", warm=True)
    monkeypatch.setenv("TRIT_WARMUP", "1")
    runtime.load(tiny_llama_trit, device="cpu")
    assert calls == [torch.float32, torch.float32]


@pytest.mark.parametrize("tie", [False, True])
def test_an_int8_head_is_the_rounded_head(tmp_path: Path, monkeypatch, tie: bool) -> None:
    """TRIT_LM_HEAD=int8 (or the checkpoint's lm_head) puts the output layer's int8 rows in its place: logits are
    the stored head's rounded to 127 steps a row; a tied model's embeddings keep the float matrix."""
    from trit.kernels import int8_rows

    src = make_tiny_model(tmp_path / "float", hidden=64, intermediate=128, tie=tie)
    out = tmp_path / "trit"
    convert(src, out, AbsmeanConfig(32), progress=False)
    stored = runtime.load(out, device="cpu", dtype=torch.float32)
    head = stored.model.get_output_embeddings().weight.detach().clone()
    monkeypatch.setenv("TRIT_LM_HEAD", "int8")
    loaded = runtime.load(out, device="cpu", dtype=torch.float32)
    new = loaded.model.get_output_embeddings()
    assert isinstance(new, int8_rows.Int8RowsLinear) and new.q.dtype == torch.int8
    assert torch.equal(loaded.model.get_input_embeddings().weight, stored.model.get_input_embeddings().weight)
    ids = torch.randint(3, 90, (2, 9))
    with torch.inference_mode():
        hidden = stored.model.model(ids).last_hidden_state
        want = hidden @ int8_rows.dequantize_rows(*int8_rows.quantize_rows(head), torch.float32).T
        torch.testing.assert_close(loaded.model(ids).logits, want, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(stored.model(ids).logits, want, rtol=1e-4, atol=1e-4)  # it did round
    assert isinstance(runtime.load(out, device="cpu", lm_head="stored").model.get_output_embeddings(),
                      torch.nn.Linear)  # the argument before the variable
    with pytest.raises(ValueError, match="lm_head='fp8'"):
        runtime.load(out, device="cpu", lm_head="fp8")
    monkeypatch.setenv("TRIT_LM_HEAD", "fp8")
    with pytest.raises(fmt.FormatError, match="TRIT_LM_HEAD: expected one of stored, int8, found 'fp8'"):
        runtime.load(out, device="cpu")
