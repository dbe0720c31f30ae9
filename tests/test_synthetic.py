"""trit.synthetic: random whole models for benchmarks, repacked as the loader repacks them."""

import pytest
import torch
from transformers import AutoConfig

from trit import format as fmt
from trit.nn import TritLinear
from trit.synthetic import random_model

CFG = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           vocab_size=50)


def _model(prepare: bool):
    return random_model(AutoConfig.for_model("llama", **CFG), fmt.TritConfig(group_size=32), "cpu", torch.float32,
                        seed=5, prepare=prepare)


def _tiled(model) -> list[bool]:
    return [m.layout == "mma" for m in model.modules() if isinstance(m, TritLinear)]


def test_random_model_is_repacked_where_the_layout_rule_admits_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIT_LAYOUT", "auto")  # the default: the CPU keeps format v1
    assert not any(_tiled(_model(prepare=True)))
    monkeypatch.setenv("TRIT_LAYOUT", "mma")  # forced: every layer, the reference computes them on the CPU
    tiled, flat = _model(prepare=True), _model(prepare=False)
    assert all(_tiled(tiled)) and len(_tiled(tiled)) == 14 and not any(_tiled(flat))
    for m in flat.modules():  # the layout holds the scales in bf16: the one rounding it adds
        if isinstance(m, TritLinear):
            m.weight_scale.copy_(m.weight_scale.to(torch.bfloat16).to(m.weight_scale.dtype))
    ids = torch.tensor([[1, 7, 3, 9, 4]])
    with torch.inference_mode():
        torch.testing.assert_close(tiled(ids).logits, flat(ids).logits, rtol=1e-4, atol=1e-4)


def test_random_model_hands_its_dtype_to_the_repack_and_leaves_a_float_model_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import trit.nn

    calls = []
    monkeypatch.setattr(trit.nn, "prepare", lambda model, dtype: calls.append(dtype) or (0, None))
    cfg = AutoConfig.for_model("llama", **CFG)
    random_model(cfg, fmt.TritConfig(group_size=32), "cpu", torch.bfloat16, seed=5)
    assert calls == [torch.bfloat16]
    random_model(cfg, fmt.TritConfig(group_size=32), "cpu", torch.bfloat16, seed=5, prepare=False)
    plain = random_model(cfg, None, "cpu", torch.float32, seed=5)
    assert calls == [torch.bfloat16]  # neither prepare=False nor a float model repacks
    assert not any(isinstance(m, TritLinear) for m in plain.modules())


def test_word_tokenizer_gives_every_id_back_and_refuses_a_vocabulary_too_small(tmp_path) -> None:
    from transformers import AutoTokenizer

    from trit.synthetic import word_tokenizer

    word_tokenizer(1000).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.vocab_size == 1000 and (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (1, 2, 0)
    ids = [3, 4, 999, 500, 3, 17]
    text = tok.decode(ids)
    assert text == "t3 t4 t999 t500 t3 t17" and tok.encode(text, add_special_tokens=False) == ids
    # each token's string holds its space, so that no text of n tokens is longer than n times the longest token
    # (vLLM 0.25.1 refuses a prompt over that bound before tokenizing it): 30 of the longest words, 179 characters,
    # against 30 x 6 (bare words of 5 characters and the spaces between them went over)
    assert tok.convert_ids_to_tokens([3, 999]) == ["\u2581t3", "\u2581t999"]
    word_tokenizer(10000).save_pretrained(tmp_path / "big")
    big = AutoTokenizer.from_pretrained(tmp_path / "big")
    longest = max(len(t) for t in big.get_vocab())
    text = big.decode([9999] * 30)
    assert longest == len("\u2581t9999") and len(text) == 179 <= 30 * longest
    with pytest.raises(ValueError, match="at least 4 ids"):
        word_tokenizer(3)
