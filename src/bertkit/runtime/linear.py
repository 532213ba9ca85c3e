"""Inference linear layers for a frozen model: weights laid out once, never stale.

`freeze_linears(model, packed_dtypes)` swaps every nn.Linear of the encoder and heads for a `FrozenLinear` holding the
same values as buffers (the checkpoint names stay), fuses Q/K/V into one weight whose rows the three projections
view, and fuses the FFN activation into its matmul. A frozen model has no trainable parameters, so no optimizer can change it,
`train()` refuses, and `load_state_dict` rebuilds the derived copies: cached weights cannot go stale.

Derived copies, built on first use per compute dtype: a cast copy under autocast (instead of a cast per call), and
for a dtype in `packed` on CPU the weight reordered once into oneDNN's blocked layout (what torch.compile's CPU freezing does)
with the FFN's activation in the GEMM's epilogue.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import ConfigError
from bertkit.model import BertIntermediate, BertSelfAttention, activation

__all__ = ["FrozenLinear", "freeze_linears", "onednn_linear_ok"]

_ONEDNN_ACT = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"),
               "relu": ("relu", "")}


@functools.cache
def onednn_linear_ok(dtype: torch.dtype) -> bool:
    """Whether prepacked oneDNN linears run here for `dtype` and agree with F.linear."""
    if dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    try:
        if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        g = torch.Generator().manual_seed(0)            # a private generator: the global RNG stream is untouched
        x, w, b = (torch.randn(*shape, generator=g).to(dtype) for shape in ((4, 16), (8, 16), (8,)))
        y = packed_linear(x, pack(w, dtype), b, None)
        return bool(torch.allclose(y.float(), F.linear(x, w, b).float(), atol=1e-2, rtol=1e-2))
    except (RuntimeError, AttributeError, TypeError):
        return False


def pack(weight: Tensor, dtype: torch.dtype) -> Tensor:
    """(out, in) weight -> oneDNN's blocked layout for `dtype` (an opaque tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), None)


def packed_linear(x: Tensor, w: Tensor, b: Tensor | None, act: str | None) -> Tensor:
    attr, algorithm = _ONEDNN_ACT[act] if act else ("none", "")
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, b, attr, [], algorithm)


def _tracing() -> bool:
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling()


class FrozenLinear(nn.Module):
    """act(x W^T + b) for inference, W and b as buffers (`weight` may be a view of a fused weight)."""
    inference_only = True

    def __init__(self, weight: Tensor, bias: Tensor | None, act: str | None = None,
                 packed: frozenset[torch.dtype] = frozenset(), persistent: bool = True):
        super().__init__()
        # a fused projection's weight is not saved: the checkpoint holds its parts under their own names
        self.register_buffer("weight", weight.detach(), persistent=persistent)
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=persistent)
        self.act = act
        self.packed = packed if act is None or act in _ONEDNN_ACT else frozenset()   # dtypes run prepacked
        self._derived: dict = {}                      # compute dtype -> (weight, bias, packed?)

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def train(self, mode: bool = True):
        if mode:
            raise ConfigError("this model is frozen for inference (bertkit.runtime.freeze): load it again to train")
        return super().train(False)

    def _load_from_state_dict(self, *args, **kwargs):
        self._derived = {}                            # new values: every derived copy is rebuilt from them
        super()._load_from_state_dict(*args, **kwargs)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_derived"] = {}                        # derived data (opaque oneDNN tensors cannot be copied)
        return state

    def _apply(self, fn, recurse=True):
        self._derived = {}                            # .to() / .float(): derive again from the moved buffers
        return super()._apply(fn, recurse)

    def _weights(self, x: Tensor) -> tuple[Tensor, Tensor | None, bool]:
        auto = torch.is_autocast_enabled(x.device.type)
        dtype = torch.get_autocast_dtype(x.device.type) if auto else self.weight.dtype
        key = (dtype, x.device.type)
        if key not in self._derived:
            b = None if self.bias is None else self.bias.to(dtype)
            if dtype in self.packed and x.device.type == "cpu" and onednn_linear_ok(dtype):
                self._derived[key] = (pack(self.weight, dtype), b, True)
            else:
                self._derived[key] = (self.weight.to(dtype), b, False)
        return self._derived[key]

    def forward(self, x: Tensor) -> Tensor:
        if _tracing():                                # graphs want plain aten ops (ONNX has no oneDNN ones)
            y = F.linear(x, self.weight, self.bias)
            return y if self.act is None else activation(self.act)(y)
        w, b, packed = self._weights(x)
        if packed:
            return packed_linear(x.to(w.dtype), w, b, self.act)
        y = F.linear(x.to(w.dtype), w, b)
        return y if self.act is None else activation(self.act)(y)


def _frozen(linear: nn.Linear, packed: frozenset[torch.dtype], act: str | None = None) -> FrozenLinear:
    return FrozenLinear(linear.weight, linear.bias, act, packed)


def _freeze_attention(m: BertSelfAttention, packed: frozenset[torch.dtype]) -> None:
    """Q, K, V as views of one (3 * hidden, hidden) weight: the fused projections and the three checkpoint names
    share it."""
    h = m.query.out_features
    w = torch.cat([m.query.weight, m.key.weight, m.value.weight]).detach()
    b = torch.cat([m.query.bias, m.key.bias, m.value.bias]).detach()
    for name, part in (("query", slice(0, h)), ("key", slice(h, 2 * h)), ("value", slice(2 * h, 3 * h))):
        setattr(m, name, FrozenLinear(w[part], b[part]))
    m.qkv = FrozenLinear(w, b, packed=packed, persistent=False)
    m.kv = FrozenLinear(w[h:], b[h:], packed=packed, persistent=False)
    m.q = FrozenLinear(w[:h], b[:h], packed=packed, persistent=False)


def freeze_linears(model: nn.Module, packed: frozenset[torch.dtype]) -> None:
    """Swap the model's linear layers for FrozenLinear in place (see the module docstring); `packed`: the compute
    dtypes that run through prepacked oneDNN weights on CPU."""
    for module in list(model.modules()):
        if isinstance(module, BertSelfAttention):
            _freeze_attention(module, packed)
        elif isinstance(module, BertIntermediate) and isinstance(module.dense, nn.Linear):
            module.dense = _frozen(module.dense, packed, module.intermediate_act_fn.name)
            module.intermediate_act_fn = nn.Identity()
        else:
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, name, _frozen(child, packed))
    for p in list(model.parameters()):                # what is left (embeddings, LayerNorms, biases): read-only
        p.requires_grad_(False)

