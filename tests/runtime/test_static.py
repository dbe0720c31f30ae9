"""StaticDecoder (static KV cache, CUDA-graph steps) against transformers' own greedy ``generate``."""

from __future__ import annotations

import pytest
import torch

from trit import format as fmt
from trit.runtime.static import StaticDecoder
from trit.synthetic import random_model

CUDA = torch.cuda.is_available()


def tiny(model_type: str, trit: bool, device: str = "cpu", dtype: torch.dtype = torch.float32,
         prepare: bool = True):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
                               tie_word_embeddings=model_type == "qwen2")
    return random_model(cfg, fmt.TritConfig(group_size=32) if trit else None, device, dtype, std=0.2,
                        prepare=prepare)


def hf_greedy(model, ids: torch.Tensor, new: int) -> torch.Tensor:
    model.generation_config.eos_token_id = None  # StaticDecoder never stops early: neither may the reference
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                             temperature=None, top_p=None, top_k=None, pad_token_id=0)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("trit", [True, False])
def test_equals_generate_and_restarts(model_type: str, trit: bool) -> None:
    model = tiny(model_type, trit)
    ids = torch.randint(3, 97, (3, 9), generator=torch.Generator().manual_seed(1))
    dec = StaticDecoder(model, batch=3, max_len=24)
    first = dec.generate(ids, 12)
    assert torch.equal(first, hf_greedy(model, ids, 12))
    assert len(set(first[0].tolist())) > 1  # a random model that does not just repeat one token
    assert torch.equal(dec.generate(ids, 12), first)  # prefill resets the cache in place


def test_random_model_codes_are_valid_and_tied() -> None:
    model = tiny("qwen2", trit=True, prepare=False)  # format v1's buffers, whatever TRIT_LAYOUT says
    layer = model.model.layers[1].mlp.down_proj
    assert fmt.count_invalid_codes(layer.weight_packed) == 0
    assert set(fmt.unpack(layer.weight_packed).unique().tolist()) == {-1, 0, 1}
    assert (layer.weight_scale > 0).all()
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_refuses_a_full_cache_and_a_wrong_batch() -> None:
    model = tiny("llama", trit=True)
    dec = StaticDecoder(model, batch=1, max_len=6)
    with pytest.raises(ValueError, match="expected 1 rows"):
        dec.prefill(torch.ones(2, 3, dtype=torch.long))
    dec.prefill(torch.ones(1, 5, dtype=torch.long))
    dec.step()
    with pytest.raises(ValueError, match="full"):
        dec.step()
    with pytest.raises(ValueError, match="CUDA"):
        StaticDecoder(model, 1, 6, graphs=True)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("trit", [True, False])
def test_cuda_graph_steps_equal_eager_steps(trit: bool) -> None:
    model = tiny("llama", trit, "cuda", torch.bfloat16)
    ids = torch.randint(3, 97, (4, 17), generator=torch.Generator().manual_seed(2)).cuda()
    graphed = StaticDecoder(model, batch=4, max_len=48)
    tokens = graphed.generate(ids, 20)
    assert graphed.graph is not None, graphed.graph_error
    eager = StaticDecoder(model, batch=4, max_len=48, graphs=False).generate(ids, 20)
    assert torch.equal(tokens, eager)
    assert torch.equal(graphed.generate(ids, 20), tokens)  # replays after a new prefill
