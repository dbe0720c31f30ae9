"""BitNet b1.58's decoder in vLLM, registered out of tree as ``BitNetForCausalLM``.

vLLM has no BitNet model of its own. BitNet b1.58 (Ma et al. 2024,
arXiv:2402.17764; transformers' ``modeling_bitnet.py``) is Llama with three
changes, and vLLM's Llama classes carry everything else (rotary embedding,
paged attention, the fused norms, weight loading, CUDA graphs):

- an RMSNorm over the attention output before ``o_proj`` (``attn_sub_norm``);
- a squared-ReLU gated MLP, ``relu(gate)^2 * up``;
- an RMSNorm over the MLP's inner activations before ``down_proj`` (``ffn_sub_norm``).

Its linear layers are ternary through trit's quantization config (an imported
checkpoint records int8 per-token activations, which trit's linear method
applies). Under tensor parallelism the sub-norms' inputs are split over the
ranks (by heads before ``o_proj``, by the MLP's inner width before
``down_proj``): each rank holds its slice of the norm's weight and the mean of
squares is the all-reduced sum over the whole row, so the norm is the
single-rank one exactly (up to summation order).
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from vllm.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM

ARCHITECTURE = "BitNetForCausalLM"


class SplitRMSNorm(nn.Module):
    """RMSNorm over a dimension of ``size`` split evenly over the tensor-parallel ranks: this rank's slice of the
    weight, the sum of squares all-reduced; computed in float32 as transformers' BitNet norm."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        ranks = get_tensor_model_parallel_world_size()
        self.size, self.eps, self.part = size, eps, size // ranks
        self.weight = nn.Parameter(torch.ones(self.part))
        self.weight.weight_loader = self._load  # vLLM's loaders call a parameter's own, if it has one

    def _load(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded.narrow(0, get_tensor_model_parallel_rank() * self.part, self.part))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        squares = tensor_model_parallel_all_reduce(xf.pow(2).sum(-1, keepdim=True))
        return self.weight * (xf * torch.rsqrt(squares / self.size + self.eps)).to(x.dtype)


def sub_norm(size: int, eps: float) -> nn.Module:
    """vLLM's RMSNorm on one rank; the split norm above on several."""
    return SplitRMSNorm(size, eps) if get_tensor_model_parallel_world_size() > 1 else RMSNorm(size, eps=eps)


class BitNetAttention(LlamaAttention):
    def __init__(self, config, hidden_size: int, **kwargs) -> None:
        super().__init__(config=config, hidden_size=hidden_size, **kwargs)
        self.attn_sub_norm = sub_norm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        attn_output = self.attn(q, k, v)
        output, _ = self.o_proj(self.attn_sub_norm(attn_output))
        return output


class BitNetMLP(nn.Module):
    def __init__(self, config, quant_config, prefix: str) -> None:
        super().__init__()
        if config.hidden_act != "relu2":
            raise ValueError(f"{prefix}: BitNet's MLP is squared ReLU (hidden_act 'relu2'), found {config.hidden_act!r}")
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=False, quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=False, quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )
        self.ffn_sub_norm = sub_norm(config.intermediate_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        gate, up = gate_up.chunk(2, dim=-1)
        x, _ = self.down_proj(self.ffn_sub_norm(torch.square(torch.relu(gate)) * up))
        return x


class BitNetDecoderLayer(LlamaDecoderLayer):
    """Llama's layer (and its forward) with BitNet's attention and MLP."""

    def __init__(self, vllm_config, prefix: str = "", config=None) -> None:
        nn.Module.__init__(self)
        config = config or vllm_config.model_config.hf_config
        quant_config = self.get_quant_config(vllm_config)
        self.hidden_size = config.hidden_size
        self.self_attn = BitNetAttention(
            config=config, hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", config.num_attention_heads),
            max_position_embeddings=getattr(config, "max_position_embeddings", 8192), quant_config=quant_config,
            bias=getattr(config, "attention_bias", False), bias_o_proj=getattr(config, "attention_bias", False),
            cache_config=vllm_config.cache_config, prefix=f"{prefix}.self_attn",
        )
        self.mlp = BitNetMLP(config, quant_config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class BitNetForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=BitNetDecoderLayer)
