"""What this machine computes fast: whether bf16 is native, and so which precision "auto" means.

bf16 autocast is bertkit's speed path where the hardware multiplies in bf16 (CUDA GPUs that support it, CPUs with
AMX or AVX-512 BF16); elsewhere PyTorch emulates bf16 matmuls, far slower than fp32 (figures: docs/cli.md). Every
entry point whose precision defaults to "auto" resolves it here; `BERTKIT_PRECISION=bf16|fp32` overrides that.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import warnings
from pathlib import Path

import torch

from bertkit.errors import ConfigError

__all__ = ["native_bf16", "resolve_precision", "use_bf16", "cpu_flags", "cpu_model", "cpu_signature", "usable_cpus",
           "load_per_cpu", "PRECISIONS"]

PRECISIONS = ("auto", "bf16", "fp32", "fp16")
_CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (Linux); empty where there is none to read."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags from /proc/cpuinfo (Linux); empty where there is none to read."""
    return frozenset(_cpuinfo().get("flags", "").split())


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what platform reports."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown"


@functools.cache
def cpu_signature() -> str:
    """The model name with family / model / stepping and a hash of the feature flags: a virtual machine may report
    one name ("AMD EPYC") for CPU generations that differ in what runs fast."""
    flags = hashlib.sha1(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:8]
    ids = "-".join(_cpuinfo().get(k, "?") for k in ("cpu family", "model", "stepping"))
    return f"{cpu_model()} ({ids}, flags {flags})"


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask, where the OS has one), not the machine's total."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_per_cpu() -> float:
    """The 1-minute load average over the usable cores: near or above 1, other work competes for every core and
    timings taken now are slowed and reordered. 0.0 where the OS does not report it."""
    try:
        return os.getloadavg()[0] / usable_cpus()
    except (OSError, AttributeError):
        return 0.0


def _device(device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device("cpu" if device is None else device)


@functools.cache
def _native_bf16(device_type: str, index: int | None) -> bool:
    if device_type == "cuda":
        try:
            return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        except (RuntimeError, AssertionError):
            return False
    if device_type == "cpu":
        # no flags (no /proc/cpuinfo: macOS, Windows): Apple silicon and others emulate bf16 GEMMs in torch's CPU build
        return any(f in cpu_flags() for f in _CPU_BF16_FLAGS)
    return device_type in ("xpu", "hpu")


def native_bf16(device=None) -> bool:
    """Whether bf16 matmuls are hardware-accelerated on `device` (default: the CPU)."""
    d = _device(device)
    return _native_bf16(d.type, d.index)


_warned: set[str] = set()


def resolve_precision(precision: str, device=None) -> str:
    """"auto" -> "bf16" where bf16 is native on `device`, else "fp16" on CUDA (V100, T4: half precision is what
    their tensor cores multiply), else "fp32" ($BERTKIT_PRECISION overrides "auto").
    An explicit "bf16" is kept, with a one-time warning where it is emulated (and so very slow)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not one of {PRECISIONS}")
    d = _device(device)
    if precision == "auto":
        env = os.environ.get("BERTKIT_PRECISION", "").strip().lower()
        if env in PRECISIONS[1:]:
            return env
        if env and env != "auto":
            raise ConfigError(f"$BERTKIT_PRECISION={env!r} is not one of {PRECISIONS}")
        return "bf16" if native_bf16(d) else "fp16" if d.type == "cuda" else "fp32"
    if precision == "bf16" and not native_bf16(d) and d.type not in _warned:
        _warned.add(d.type)
        what = platform.processor() or platform.machine() or d.type
        warnings.warn(f"bf16 was asked for, but {d.type} ({what}) has no native bf16 matmuls (no AMX / AVX-512 BF16 "
                      "on CPU): PyTorch emulates them, often 10-100x slower than fp32. precision 'auto' picks fp32 "
                      "here.", RuntimeWarning, stacklevel=2)
    return precision


def use_bf16(flag: bool | None, device=None) -> bool:
    """The task code's `bf16` flags: None = auto (native bf16 on `device`), True / False as given."""
    # an explicit bf16 goes through resolve_precision too: the warning, where it is emulated
    return resolve_precision("auto" if flag is None else "bf16" if flag else "fp32", device) == "bf16"


if __name__ == "__main__":        # `python -m bertkit.hardware`: the plan it prints is bertkit.runtime's, a layer up
    from bertkit.runtime import main
    main()
