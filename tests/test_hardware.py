"""bertkit.hardware: what "auto" precision resolves to, and the warning for emulated bf16."""

import warnings

import pytest

from bertkit import hardware
from bertkit.errors import ConfigError
from bertkit.train import TrainConfig


def test_auto_follows_native_bf16(monkeypatch):
    monkeypatch.delenv("BERTKIT_PRECISION", raising=False)
    for native, want in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(hardware, "native_bf16", lambda device=None, n=native: n)
        assert hardware.resolve_precision("auto", "cpu") == want
        assert hardware.use_bf16(None, "cpu") is (want == "bf16")
    assert hardware.resolve_precision("fp32", "cpu") == "fp32"
    assert hardware.use_bf16(False, "cpu") is False


def test_cpu_flags_decide(monkeypatch):
    hardware._native_bf16.cache_clear()
    try:
        for flags, want in ((frozenset({"avx2", "fma"}), False), (frozenset({"avx512f", "avx512_bf16"}), True),
                            (frozenset({"amx_tile", "amx_bf16"}), True)):
            monkeypatch.setattr(hardware, "cpu_flags", lambda f=flags: f)
            hardware._native_bf16.cache_clear()
            assert hardware.native_bf16("cpu") is want
    finally:
        hardware._native_bf16.cache_clear()


def test_env_override_and_bad_values(monkeypatch):
    monkeypatch.setenv("BERTKIT_PRECISION", "fp32")
    assert hardware.resolve_precision("auto") == "fp32"
    monkeypatch.setenv("BERTKIT_PRECISION", "bf16")
    assert hardware.resolve_precision("auto") == "bf16"
    monkeypatch.setenv("BERTKIT_PRECISION", "fp16")
    assert hardware.resolve_precision("auto") == "fp16"
    monkeypatch.setenv("BERTKIT_PRECISION", "fp8")
    with pytest.raises(ConfigError, match="BERTKIT_PRECISION"):
        hardware.resolve_precision("auto")
    with pytest.raises(ConfigError, match="fp8"):
        hardware.resolve_precision("fp8")


def test_emulated_bf16_warns_once(monkeypatch):
    monkeypatch.setattr(hardware, "native_bf16", lambda device=None: False)
    monkeypatch.setattr(hardware, "_warned", set())
    with pytest.warns(RuntimeWarning, match="no native bf16"):
        assert hardware.resolve_precision("bf16", "cpu") == "bf16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hardware.resolve_precision("bf16", "cpu")       # once per device type


def test_trainconfig_accepts_auto_rejects_others():
    TrainConfig(max_steps=1, precision="auto").validate()
    with pytest.raises(ConfigError, match="precision"):
        TrainConfig(max_steps=1, precision="half").validate()
