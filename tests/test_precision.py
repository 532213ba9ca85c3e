"""bertkit.precision: one precision value ("auto" | "bf16" | "fp32", or a task bf16 flag) and the one autocast."""

import warnings

import pytest
import torch

from bertkit.errors import ConfigError
from bertkit.precision import as_precision, autocast, resolve


def test_names_and_flags():
    assert [as_precision(v) for v in (None, True, False, "auto", "bf16", "fp32")] == \
        ["auto", "bf16", "fp32", "auto", "bf16", "fp32"]
    with pytest.raises(ConfigError, match="fp8"):
        as_precision("fp8")
    assert resolve("fp32") == "fp32" and resolve("auto") in ("bf16", "fp32")


def test_autocast_on_for_bf16_off_for_fp32_even_when_nested(monkeypatch):
    monkeypatch.setenv("BERTKIT_PRECISION", "fp32")
    x = torch.randn(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # bf16 asked for on a CPU that emulates it
        with autocast("bf16", "cpu"):
            assert (x @ x).dtype == torch.bfloat16
            with autocast("auto", "cpu"):              # auto = fp32 here ($BERTKIT_PRECISION)
                assert (x @ x).dtype == torch.float32
