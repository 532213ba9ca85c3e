"""One precision setting, "auto" | "bf16" | "fp32" | "fp16", from the command line to every forward pass, and the one
autocast that applies it. "auto" is bertkit.hardware's; bf16 and fp16 keep the weights and optimizer state in fp32
(training scales an fp16 loss: bertkit.train.loop). The task code's bf16 flags mean True = "bf16", False = "fp32",
None = "auto".
"""

from __future__ import annotations

import torch

from bertkit.errors import ConfigError
from bertkit.hardware import PRECISIONS, resolve_precision
from bertkit.runtime.int8 import runs_int8

__all__ = ["PRECISIONS", "DTYPES", "as_precision", "resolve", "autocast", "for_model"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}     # the autocast dtype of each half precision


def as_precision(value: str | bool | None) -> str:
    """A precision name from a name or a bf16 flag."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "bf16" if value else "fp32"
    if value not in PRECISIONS:
        raise ConfigError(f"precision {value!r} is not one of {PRECISIONS}")
    return value


def resolve(value: str | bool | None, device="cpu") -> str:
    """"bf16", "fp16" or "fp32": what `value` means on `device` (an explicit bf16 where it is emulated warns once)."""
    return resolve_precision(as_precision(value), device)


def for_model(value: str | bool | None, model: torch.nn.Module) -> str:
    """`value`, except that "auto" runs an int8 model (runtime.int8) with fp32 activations: its GEMMs take fp32
    input, and bf16 autocast only adds casts around them (slower in every run, docs/performance.md). An int8
    model whose layers run float under bf16 here (runtime.freeze, where float measured faster) keeps "auto"."""
    value = as_precision(value)
    return "fp32" if value == "auto" and runs_int8(model) else value


def autocast(value: str | bool | None, device="cpu") -> torch.autocast:
    """bf16 / fp16 autocast on `device` when `value` resolves to one; otherwise autocast off, so fp32 means fp32
    even inside an enclosing autocast."""
    device = torch.device(device)
    value = resolve(value, device)
    return torch.autocast(device.type, dtype=DTYPES.get(value, torch.bfloat16), enabled=value in DTYPES)

