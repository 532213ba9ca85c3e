"""Execution choices applied to a model from outside it, each used only where it measured faster here.

    runtime.plan(device)       what this machine gets: a `RuntimePlan` (probed once per CPU model and torch version)
    runtime.apply(model)       training and inference: attention functions, 16-bit dropout masks, bf16 residual;
                               done by itself the first time a model is put in training mode (`on_train`)
    runtime.freeze(model)      inference only: `apply`, then frozen linear layers (fused Q/K/V and FFN activation,
                               weights cast once, prepacked oneDNN GEMMs where they won); the model can no longer train;
                               int8 layers of a quantized model (runtime.int8) run through the int8 library that won
    runtime.describe(plan)     the plan and why, one line per choice (`python -m bertkit.hardware` prints it)

`force="all"` switches every path on (tests use it to cover paths a machine would not pick), `force="none"` gives
plain PyTorch; `$BERTKIT_FAST_PATHS=all|none|measure` does the same from outside.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch
from torch import nn

from bertkit.attention import ExecutionOptions, dropout
from bertkit.compat import PreTrainedMixin
from bertkit.datasets import cache_dir
from bertkit.errors import ConfigError
from bertkit.hardware import cpu_flags, cpu_signature, native_bf16, resolve_precision
from bertkit.runtime.int8 import BF16_KERNEL_ALWAYS, default_engine, set_engine
from bertkit.runtime.linear import FrozenLinear, freeze_linears
from bertkit.runtime.probe import LAYER_WIDTHS, MARGIN, SHORT_ROWS, cached_measurements

__all__ = ["FastDropout", "FrozenLinear", "RuntimePlan", "apply", "describe", "freeze", "int8_float_below",
           "is_frozen", "on_train", "plan"]

FORCES = ("measure", "all", "none")
FORCED_BUCKET_OVERHEAD = 2.5e5                      # force="all": ~20 us a bucket at ~0.08 ns a unit (Zen 4, 1 thread)
# the probes that decide the ExecutionOptions field of their name
_OPTION_PROBES = ("explicit_train_attention", "explicit_train_short", "explicit_masked_inference", "fast_dropout")


@dataclass(frozen=True)
class RuntimePlan:
    options: ExecutionOptions                       # what BertModel.execution gets
    packed_dtypes: frozenset = frozenset()          # frozen linears through prepacked oneDNN GEMMs in these dtypes
    int8_engine: str | None = None                  # int8 linears (runtime.int8) through this library: measured
                                                    # faster than the fastest float GEMM here (None: not worth it)
    int8_float_below: int = 0                       # inputs of fewer rows run int8 layers' float GEMM: int8 lost on
                                                    # short sequences here (0: int8 at every length)
    reasons: dict = field(default_factory=dict)     # choice -> why, for describe()
    bucket_overhead: float | None = None            # inference attention buckets by cost (padding.cost_buckets):
                                                    # the per-bucket cost in row * length^2 * hidden units
    int8_under_bf16: tuple = ()                     # ((width, bf16_faster, kernel_below), ...) per probed layer
                                                    # width: bf16 GEMMs beat int8 there, so under bf16 autocast
                                                    # int8 layers of about that width run their dequantized weights
                                                    # in bf16, except inputs of fewer rows than kernel_below: int8
                                                    # GEMMs on bf16 activations (int8.qlinear_bf16) beat bf16 there


class FastDropout(nn.Dropout):
    """nn.Dropout with masks from 16 random bits per element on CPU (see attention.dropout_drop_mask)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training, fast=x.device.type == "cpu")


def _won(probe: dict) -> bool:
    return probe.get("fast") is not None and probe["fast"] < MARGIN * probe["plain"]


def _why(probe: dict, plain: str = "plain") -> str:
    if probe.get("fast") is None:
        return probe.get("why", "not measured")
    return f"{probe['fast'] * 1e3:.2f} ms vs {plain} {probe['plain'] * 1e3:.2f} ms"


def int8_float_below(int8_probe: dict) -> int:
    """Rows under which int8 layers run their float GEMM: the probe's short case (one sentence) and a margin, where
    int8 won on batches but lost there; 0 where it did not lose there (or lost everywhere: no int8 at all)."""
    short = {"fast": int8_probe.get("short_fast"), "plain": int8_probe.get("short_plain")}
    if not _won(int8_probe) or short["fast"] is None or _won(short):
        return 0
    return SHORT_ROWS.stop + 4


def _int8_under_bf16(int8_probe: dict, engine: str | None) -> tuple[tuple, str]:
    """How int8 layers run under bf16 autocast, from the encoder-layer probe at each width (native bf16 only): per
    width (bf16 beat the fp32-activation int8 kernel, so "auto" runs bf16; rows under which `qlinear_bf16` runs,
    where it beat bf16: every row count where it won on the batch, one sentence's where it won only there), and
    the reason."""
    choices, line = [], ""
    for h in LAYER_WIDTHS:
        layer = {"fast": int8_probe.get(f"layer{h}_int8"), "plain": int8_probe.get(f"layer{h}_bf16")}
        if engine is None or layer["fast"] is None:
            continue
        kernel = {"fast": int8_probe.get(f"layer{h}_int8_bf16"), "plain": layer["plain"]}
        short = {"fast": int8_probe.get(f"layer{h}_short_int8_bf16"), "plain": int8_probe.get(f"layer{h}_short_bf16")}
        below = BF16_KERNEL_ALWAYS if _won(kernel) and kernel["fast"] < layer["fast"] else \
            SHORT_ROWS.stop + 4 if short["fast"] is not None and _won(short) else 0
        faster = not _won(layer) or below == BF16_KERNEL_ALWAYS
        choices.append((h, faster, below))
        line += f"; one encoder layer of width {h} {_why(layer, 'bf16')}" + (
            ": under bf16 autocast the int8 layers run bf16" if faster else "")
        if kernel["fast"] is not None:
            line += (f"; with bf16 activations {_why(kernel, 'bf16')}, one sentence {_why(short, 'bf16')}" +
                     (": the int8 GEMMs take bf16" if below == BF16_KERNEL_ALWAYS else
                      f": under {below} rows the int8 GEMMs take bf16" if below else ""))
    return tuple(choices), line


@functools.cache
def _measured_plan(bf16: bool, threads: int) -> RuntimePlan:
    """Once per process and thread count (the probes run under the current thread count)."""
    try:
        root = cache_dir()
    except OSError:
        root = None                                  # no cache directory: measure, keep the result in memory
    probes = cached_measurements(root, bf16)
    chosen = {name: _won(probes[name]) for name in _OPTION_PROBES}
    chosen["bf16_residual"] = bf16            # CPU autocast: one cast of the stream instead of one per matmul
    packed = frozenset(d for d, name in ((torch.float32, "packed_linear_fp32"), (torch.bfloat16, "packed_linear_bf16"))
                       if _won(probes[name]))
    reasons = {name: _why(probe) for name, probe in probes.items()}
    reasons["bf16_residual"] = "on with native bf16" if bf16 else "no native bf16: training runs fp32 here"
    int8_probe = probes["int8_linear"]
    engine = int8_probe.get("engine") if _won(int8_probe) else None
    reasons["int8_linear"] = _why(int8_probe, "fp32") + (f", {engine}" if engine else "")
    under_bf16, line = _int8_under_bf16(int8_probe, engine)
    reasons["int8_linear"] += line
    float_below = int8_float_below(int8_probe)
    if float_below:
        short = {"fast": int8_probe["short_fast"], "plain": int8_probe["short_plain"]}
        reasons["int8_linear"] += (f"; short inputs {_why(short, 'fp32')}: under {float_below} rows the int8 "
                                   f"layers run a float GEMM")
    buckets = probes["cost_buckets"]
    overhead = buckets["overhead"] if _won(buckets) else None
    reasons["cost_buckets"] += f", per-bucket cost {buckets['overhead']:.3g}" if "overhead" in buckets else ""
    return RuntimePlan(ExecutionOptions(**chosen), packed, engine, float_below, reasons, overhead, under_bf16)


def plan(device="cpu", force: str | None = None) -> RuntimePlan:
    """The fast paths for `device`: measured on this CPU (cached), every one ("all") or none ("none")."""
    force = force or os.environ.get("BERTKIT_FAST_PATHS", "").strip().lower() or "measure"
    if force not in FORCES:
        raise ConfigError(f"$BERTKIT_FAST_PATHS / force={force!r} is not one of {FORCES}")
    if torch.device(device).type != "cpu" or force == "none":
        why = "plain PyTorch kernels" + (" (forced)" if force == "none" else f" on {torch.device(device).type}")
        return RuntimePlan(ExecutionOptions(), frozenset(), reasons={"all": why})
    if force == "all":
        on = dict.fromkeys(_OPTION_PROBES, True)
        return RuntimePlan(ExecutionOptions(bf16_residual=True, **on), frozenset({torch.float32, torch.bfloat16}),
                           default_engine(), 0, {"all": "every fast path (forced)"}, FORCED_BUCKET_OVERHEAD)
    return _measured_plan(native_bf16("cpu"), torch.get_num_threads())


def apply(model: nn.Module, runtime: RuntimePlan | None = None) -> nn.Module:
    """Give every bertkit model in `model` the plan's execution options, and fast dropout modules where they won
    (inside bertkit models only: other modules keep their own dropout)."""
    runtime = runtime or plan(next(model.parameters()).device)
    berts = [m for m in model.modules() if isinstance(m, PreTrainedMixin)]     # BertModel and the heads
    for m in berts:
        m.runtime_planned = True
        if isinstance(getattr(m, "execution", None), ExecutionOptions):       # a BertModel
            # gradient checkpointing is the caller's choice, not a measured fast path: it stays as it was
            per_model = None if runtime.bucket_overhead is None else runtime.bucket_overhead / m.config.hidden_size
            spec = m.config.disentangled
            if spec and spec.relative_attention:      # DeBERTa's terms add ~10 small kernels a bucket: the fixed
                per_model = None                      # few buckets measured faster (benchmarks/families.py)
            m.execution = runtime.options.with_(checkpoint_layers=m.execution.checkpoint_layers,
                                                bucket_overhead=per_model)
    for bert in berts:
        for module in list(bert.modules()):
            for name, child in list(module.named_children()):
                if runtime.options.fast_dropout and type(child) is nn.Dropout:
                    setattr(module, name, FastDropout(child.p).train(child.training))
                elif not runtime.options.fast_dropout and type(child) is FastDropout:
                    setattr(module, name, nn.Dropout(child.p).train(child.training))
    return model


def on_train(model: nn.Module) -> None:
    """What `model.train()` does the first time: `apply` this machine's plan (for the device the parameters are on),
    so a model trained outside bertkit's loop runs the same fast paths. Not where the execution options were set
    by hand (anything but the defaults, gradient checkpointing aside): those stay."""
    chosen = any(m.execution.with_(checkpoint_layers=False) != ExecutionOptions() for m in model.modules()
                 if isinstance(getattr(m, "execution", None), ExecutionOptions))
    if chosen:
        for m in model.modules():
            if isinstance(m, PreTrainedMixin):
                m.runtime_planned = True
        return
    apply(model)


def freeze(model: nn.Module, runtime: RuntimePlan | None = None) -> nn.Module:
    """`apply`, then inference-only linear layers (see runtime.linear). In place; returns the model in eval mode."""
    runtime = runtime or plan(next(model.parameters()).device)
    apply(model, runtime)
    freeze_linears(model, runtime.packed_dtypes)
    # int8 layers (a quantized model): the library measured faster, or their weights in float where float won here
    set_engine(model, runtime.int8_engine, runtime.int8_engine is None and "int8_linear" in runtime.reasons,
               runtime.int8_float_below, runtime.packed_dtypes, runtime.int8_under_bf16)
    return model.eval()


def is_frozen(model: nn.Module) -> bool:
    """Whether `freeze` has made `model` (or a part of it) inference-only."""
    return any(getattr(m, "inference_only", False) for m in model.modules())


def describe(runtime: RuntimePlan) -> list[str]:
    """One line per choice: on/off and the measurement behind it."""
    o = runtime.options
    state = {"packed_linear_fp32": torch.float32 in runtime.packed_dtypes,
             "packed_linear_bf16": torch.bfloat16 in runtime.packed_dtypes,
             "int8_linear": runtime.int8_engine is not None, "cost_buckets": runtime.bucket_overhead is not None,
             "bf16_residual": o.bf16_residual, **{n: getattr(o, n) for n in _OPTION_PROBES}}
    forced = runtime.reasons.get("all")                 # a forced plan: one reason for every choice
    return [f"{name}: {'on' if on else 'off'} ({forced or runtime.reasons.get(name, '')})"
            for name, on in state.items()]


def main() -> None:
    """python -m bertkit.hardware: what "auto" precision picks here, and the fast paths this CPU measured."""
    flags = sorted(f for f in cpu_flags() if "bf16" in f or "amx" in f or f in ("avx2", "avx512f", "avx512_vnni"))
    print(f"cpu: {cpu_signature()}; torch {torch.__version__}; {torch.get_num_threads()} threads; flags: {flags}")
    print(f"native bf16: {native_bf16('cpu')}; auto precision: {resolve_precision('auto')}")
    print("fast paths (each on only where it measured faster than plain PyTorch here):")
    for line in describe(plan("cpu")):
        print(f"  {line}")

