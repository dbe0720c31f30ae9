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


def test_the_configs_are_the_api_and_carry_every_option_the_cli_has() -> None:
    """One config type a scheme: the method is the type; the GPTQ settings and calibration live in it."""
    config = trit.GPTQConfig(planes=2, calib=trit.CalibConfig("wikitext2"), passes=1)
    assert (config.method, config.planes, config.calib.file, config.passes) == (Method.GPTQ, 2, "wikitext2", 1)
    assert trit.AbsmeanConfig(group_size=32).method is Method.ABSMEAN and trit.TWNConfig(planes=2).planes == 2
    defaults = trit.GPTQConfig()
    assert (defaults.act_order, defaults.passes, defaults.damp, defaults.rotates) == (True, 3, 0.01, True)
    assert defaults.gptq().passes == 3 and trit.W4A8Config().gptq().int_bits == 4
    assert (trit.Layout(lm_head="int8").lm_head, trit.CalibConfig(first="bos").first) == ("int8", "bos")
    with pytest.raises(TypeError, match="expected AbsmeanConfig, TWNConfig, GPTQConfig or W4A8Config"):
        trit.quantize("m", "o", "gptq")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Layout\(lm_head='fp8'\): expected one of stored, int8"):
        trit.Layout(lm_head="fp8")


def test_import_trit_vllm_stays_light() -> None:
    """What vLLM imports: the plugin, not the converter or the runtime (the API loads on first use)."""
    code = "import sys, trit.ops, trit; print(any(m in sys.modules for m in ('trit.convert', 'trit.runtime')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
