"""Optimisers and learning-rate schedules for the training loop.

* `param_groups` / `build_optimizer`: BERT's weight-decay groups; AdamW (fused where the device has it), LAMB or
  StableAdamW (ModernBERT's: AdamW with AdaFactor's update clipping per tensor; docs/pretraining.md).
* `lr_factor`: a pure function of (step, total), which the trainer checkpoints, so a resumed run continues on
  exactly the same curve; "wsd" holds the peak until the last `decay_fraction` of the steps (a short run's lr stays
  high through the MLM loss plateau).
"""

from __future__ import annotations

import abc
import inspect
import math
from typing import Iterable

import torch
from torch import nn

from bertkit.errors import ConfigError

__all__ = ["param_groups", "build_optimizer", "Lamb", "StableAdamW", "lr_factor", "warmup_steps", "SCHEDULES", "OPTIMIZERS"]

SCHEDULES = ("linear", "cosine", "constant", "wsd")
OPTIMIZERS = ("adamw", "lamb", "stableadamw")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """[{decayed params, weight_decay}, {biases + LayerNorm weights, weight_decay 0}]: BERT's exclusion rule (1-D,
    or named LayerNorm / bias: any custom norm layer too). Tied parameters appear once."""
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name or name.endswith(".bias"):
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, name: str = "adamw", lr: float = 1e-4, weight_decay: float = 0.01,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6) -> torch.optim.Optimizer:
    """AdamW (the fused kernel where the device has it), LAMB or StableAdamW over `param_groups(model,
    weight_decay)`."""
    groups = param_groups(model, weight_decay)
    if name == "adamw":
        kw = {"fused": True} if _fused_adamw_ok(groups) else {"foreach": True}
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kw)
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")
    moments = Lamb if name == "lamb" else StableAdamW
    return moments(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def _fused_adamw_ok(groups: list[dict]) -> bool:
    """torch has a fused AdamW for this device type and dtype (CPU since 2.4, CUDA since 2.0)."""
    if "fused" not in inspect.signature(torch.optim.AdamW).parameters:
        return False
    params = [p for g in groups for p in g["params"]]
    if not params:
        return False
    dev = params[0].device.type
    if dev == "cpu":
        return tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4)
    return dev == "cuda"


class _Moments(torch.optim.Optimizer, abc.ABC):
    """Adam's bias-corrected moments per parameter, in fp32; subclasses turn them into a step (`_apply`)."""

    default_betas = (0.9, 0.999)

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] | None = None,
                 eps: float = 1e-6, weight_decay: float = 0.01):
        betas = self.default_betas if betas is None else betas
        if lr < 0 or eps < 0 or not 0 <= betas[0] < 1 or not 0 <= betas[1] < 1:
            raise ConfigError(f"invalid {type(self).__name__} hyper-parameters lr={lr} betas={betas} eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float()
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                t = state["step"].item()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                self._apply(p, g, m / (1 - beta1 ** t), v / (1 - beta2 ** t), group)
        return loss

    @abc.abstractmethod
    def _apply(self, p, g, m_hat, v_hat, group) -> None:
        """Update parameter p in place from its gradient g and the bias-corrected moments (the optimizer's rule)."""


class Lamb(_Moments):
    """LAMB (You et al. 2019): Adam moments + decoupled weight decay, each tensor's update scaled by the trust ratio
    ||w|| / ||u|| (1 when either is 0). Bias-corrected, and groups without weight decay still get the trust ratio, as
    in the paper's v3 and NVIDIA's implementation."""

    def _apply(self, p, g, m_hat, v_hat, group) -> None:
        update = m_hat / (v_hat.sqrt() + group["eps"])
        w = p.float()
        if group["weight_decay"]:
            update.add_(w, alpha=group["weight_decay"])
        w_norm, u_norm = w.norm(), update.norm()
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        p.add_((update * trust).to(p.dtype), alpha=-group["lr"])


class StableAdamW(_Moments):
    """AdamW whose lr per tensor is divided by max(1, RMS(g^2 / v_hat)) (Wortsman et al. 2023): a gradient spike
    cannot make one huge update; without spikes it is AdamW exactly. The decoupled weight decay uses that lr too.
    v_hat is floored at eps^2 so a zero second moment cannot divide by zero."""

    default_betas = (0.9, 0.98)

    def _apply(self, p, g, m_hat, v_hat, group) -> None:
        rms = (g * g / v_hat.clamp(min=group["eps"] ** 2)).mean().sqrt()
        lr = group["lr"] / rms.clamp(min=1.0)                     # a 0-d tensor: no host sync per tensor
        if group["weight_decay"]:
            p.mul_(1 - lr * group["weight_decay"])
        p.sub_((m_hat / (v_hat.sqrt() + group["eps"]) * lr).to(p.dtype))


def warmup_steps(warmup: float, total: int) -> int:
    """`warmup` < 1 is a fraction of the total steps, >= 1 a number of steps."""
    if warmup < 0:
        raise ConfigError(f"warmup must be >= 0, got {warmup}")
    return int(round(warmup * total)) if warmup < 1 else int(warmup)


DEFAULT_DECAY_FRACTION = 0.2   # wsd: the linear decay spans the last 20% of the steps


def lr_factor(step: int, total: int, warmup: int, schedule: str = "linear", min_ratio: float = 0.0,
              decay_fraction: float | None = None) -> float:
    """Multiplier of the peak lr for the update made at optimizer step `step` (0-based) of `total`.
    Warmup: (step + 1) / warmup, so the first update already moves (BERT's TF code starts at 0 and wastes one step).
    Then linear / cosine decay to `min_ratio` at step == total ("wsd": over the last `decay_fraction` of `total`
    only; None: DEFAULT_DECAY_FRACTION), or constant."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown lr schedule {schedule!r}; choose one of {SCHEDULES}")
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    start = warmup
    if schedule == "wsd":
        decay_fraction = DEFAULT_DECAY_FRACTION if decay_fraction is None else decay_fraction
        if not 0 < decay_fraction <= 1:
            raise ConfigError(f"decay_fraction must be in (0, 1], got {decay_fraction}")
        start = max(warmup, total - int(round(decay_fraction * total)))
    span = max(1, total - start)
    progress = min(1.0, max(0.0, (step - start) / span))
    shape = 1.0 - progress if schedule in ("linear", "wsd") else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape
