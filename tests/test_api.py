"""The Python API at the package's top: its docstring example runs, and each config maps onto the converter."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import pytest

import trit
import trit.api
from trit.quant import Method


def test_docstring_example_runs(tmp_path: Path) -> None:
    result = doctest.testmod(trit.api, extraglobs={"tmp": tmp_path}, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted >= 7 and result.failed == 0, result


def test_help_shows_the_api() -> None:
    out = subprocess.run([sys.executable, "-c", "import trit; help(trit.load); help(trit.quantize)"],
                         capture_output=True, text=True, check=True).stdout
    assert "A trit (or float) checkpoint as a transformers model" in out and "GPTQConfig" in out


def test_configs_map_onto_the_converters_options() -> None:
    opts = trit.api.convert_options(trit.GPTQConfig(planes=2, calib="wikitext2", passes=1), trit.Layout(keep=("x",)))
    assert (opts.method, opts.planes, opts.calib.file, opts.passes, opts.keep) == (Method.GPTQ, 2, "wikitext2", 1,
                                                                                 ("x",))
    assert trit.api.convert_options(trit.AbsmeanConfig(group_size=32)).method is Method.ABSMEAN
    assert trit.api.convert_options(trit.TWNConfig(planes=2)).planes == 2
    defaults = trit.api.convert_options(trit.GPTQConfig())
    assert (defaults.act_order, defaults.passes, defaults.damp) == (True, 3, 0.01)  # the CLI's defaults
    with pytest.raises(TypeError, match="expected AbsmeanConfig, TWNConfig or GPTQConfig"):
        trit.api.convert_options("gptq")  # type: ignore[arg-type]


def test_import_trit_vllm_stays_light() -> None:
    """What vLLM imports: the plugin, not the converter or the runtime (the API loads on first use)."""
    code = "import sys, trit.ops, trit; print(any(m in sys.modules for m in ('trit.convert', 'trit.runtime')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
