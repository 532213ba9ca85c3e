"""The FFN non-linearities by their Hugging Face names (`config.hidden_act`): the model builds its feed-forward with
them, and the runtime's fused linear layers apply the same function after their GEMM."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import ConfigError

__all__ = ["Activation", "activation"]


def activation(name: str):
    """The FFN non-linearity named in config.hidden_act (HF names)."""
    if name == "gelu":
        return F.gelu  # exact: 0.5 x (1 + erf(x / sqrt 2))
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    if name == "tanh":                  # the pooler's
        return torch.tanh
    raise ConfigError(f"BertConfig.hidden_act={name!r} is not supported")


class Activation(nn.Module):
    """`activation(name)` as a module, so an execution path can fuse it into the preceding matmul."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.fn = activation(name)                      # unknown names fail here, at build time

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)
