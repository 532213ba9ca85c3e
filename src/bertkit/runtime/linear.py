"""Inference linear layers for a frozen model: weights laid out once, never stale.

`freeze_linears(model, packed_dtypes)` swaps every nn.Linear of the encoder and heads for a `FrozenLinear` holding the
same values as buffers (the checkpoint names stay), runs Q/K/V as one fused matmul, and fuses the FFN activation
into its matmul. A frozen model has no trainable parameters, so no optimizer can change it, and `train()` refuses.
Every derived copy (the fused Q/K/V weight, cast and prepacked copies) is keyed on the identity and in-place version
of the weights it came from, so a load, a `.to()` or an in-place copy rebuilds it: derived weights cannot go stale.

Derived copies, built on first use per compute dtype: a cast copy under autocast (instead of a cast per call), and
for a dtype in `packed` on CPU the weight reordered once into oneDNN's blocked layout (what torch.compile's CPU freezing does)
with the FFN's activation in the GEMM's epilogue.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.attention import tracing
from bertkit.errors import ConfigError
from bertkit.activations import Activation, activation

__all__ = ["FrozenLinear", "freeze_linears", "onednn_linear_ok", "is_attention", "is_ffn_input",
           "tensors_stamp", "ONEDNN_ACT", "QKV", "swap_attention"]

QKV = ("query", "key", "value")                      # an attention block's projections, as checkpoints name them

# activation -> oneDNN post-op (name, algorithm) fused into the GEMM (float and int8 kernels); others run after it
ONEDNN_ACT = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"),
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
    attr, algorithm = ONEDNN_ACT[act] if act else ("none", "")
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, b, attr, [], algorithm)


def is_attention(m: nn.Module) -> bool:
    """A self-attention block as bertkit.model builds it: query / key / value and their fused projections (the
    runtime knows the model's modules by these names, as checkpoints do)."""
    return all(hasattr(m, n) for n in (*QKV, "qkv"))


def is_ffn_input(m: nn.Module) -> bool:
    """The feed-forward's first layer as bertkit.model builds it: `dense`, then `intermediate_act_fn` (Identity once
    fused into `dense`). A GLU's activation reads half the output (ModernBERT): it stays a module of its own."""
    return hasattr(m, "dense") and isinstance(getattr(m, "intermediate_act_fn", None), (Activation, nn.Identity))


def _tensor_stamp(t: Tensor | None) -> tuple | None:
    # inference-mode tensors have no version counter, and no in-place change outside inference mode either
    return None if t is None else (t.data_ptr(), -1 if t.is_inference() else t._version, t.dtype, t.device)


def tensors_stamp(tensors) -> tuple:
    """What derived copies of `tensors` depend on: which tensor each is and its in-place version. Checked on every
    call of a layer, so kept cheap."""
    return tuple(map(_tensor_stamp, tensors))


class _Derived:
    """Cast / prepacked copies of some weights, rebuilt whenever the weights' stamp changes (a load, `.to()`, an
    in-place copy): derived data never outlives what it was derived from."""

    def __init__(self):
        self.copies: dict = {}                       # (compute dtype, device type) -> (stamp, weight, bias, packed)

    def get(self, x: Tensor, weight: Tensor, bias: Tensor | None, packed_dtypes: frozenset, stamp: tuple):
        auto = torch.is_autocast_enabled(x.device.type)
        dtype = torch.get_autocast_dtype(x.device.type) if auto else weight.dtype
        key = (dtype, x.device.type)
        hit = self.copies.get(key)
        if hit is None or hit[0] != stamp:
            b = None if bias is None else bias.to(dtype)
            if dtype in packed_dtypes and x.device.type == "cpu" and onednn_linear_ok(dtype):
                hit = (stamp, pack(weight, dtype), b, True)
            else:
                hit = (stamp, weight.to(dtype), b, False)
            self.copies[key] = hit
        return hit[1:]

    def __getstate__(self):
        return {"copies": {}}                        # derived data (opaque oneDNN tensors cannot be copied)


class FrozenLinear(nn.Module):
    """act(x W^T + b) for inference, W and b as buffers under the checkpoint's names."""
    inference_only = True

    def __init__(self, weight: Tensor, bias: Tensor | None, act: str | None = None,
                 packed: frozenset[torch.dtype] = frozenset()):
        super().__init__()
        self.register_buffer("weight", weight.detach().clone())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.act = act
        self.packed = packed if act is None or act in ONEDNN_ACT else frozenset()   # dtypes run prepacked
        self._derived = _Derived()

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

    def weights(self) -> tuple[Tensor, Tensor | None]:
        b = self._buffers                            # not self.weight: nn.Module.__getattr__ on every call is slow
        return b["weight"], b["bias"]

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self.weights()
        if tracing():                                 # graphs want plain aten ops (ONNX has no oneDNN ones)
            y = F.linear(x, weight, bias)
            return y if self.act is None else activation(self.act)(y)
        w, b, packed = self._derived.get(x, weight, bias, self.packed, tensors_stamp((weight, bias)))
        if packed:
            return packed_linear(x.to(w.dtype), w, b, self.act)
        y = F.linear(x.to(w.dtype), w, b)
        return y if self.act is None else activation(self.act)(y)


class FrozenFused(FrozenLinear):
    """Sibling FrozenLinears of `owner` (Q, K, V) as one matmul; the fused weight is derived from theirs, so a load
    or `.to()` of the parts reaches it. Saves nothing of its own."""

    def __init__(self, owner: nn.Module, names: tuple[str, ...], packed: frozenset[torch.dtype]):
        nn.Module.__init__(self)
        self.__dict__["owner"] = owner                # the parts are registered where they live
        self.names = names
        self.act = None
        self.packed = packed
        self._derived = _Derived()
        self._fused: tuple = (None, None, None)       # (stamp of the parts, weight, bias)

    def weights(self) -> tuple[Tensor, Tensor | None]:
        pairs = [_weights(self.owner._modules[n]) for n in self.names]       # the parts as they are now
        stamp = tensors_stamp([t for pair in pairs for t in pair])
        if self._fused[0] != stamp:
            self._fused = (stamp, torch.cat([w for w, _ in pairs]), torch.cat([b for _, b in pairs]))
        return self._fused[1], self._fused[2]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_fused"] = (None, None, None)
        return state


def _weights(m: nn.Module) -> tuple[Tensor, Tensor | None]:
    return m.weights() if isinstance(m, FrozenLinear) else (m.weight, m.bias)


def _frozen(linear: nn.Linear, packed: frozenset[torch.dtype], act: str | None = None) -> FrozenLinear:
    return FrozenLinear(linear.weight, linear.bias, act, packed)


def swap_attention(m: nn.Module, part: Callable, names=QKV, fused: Callable | None = None) -> None:
    """`names` of an attention block's Q, K and V as part(linear), under their own names; with `fused`, its fused
    projections (Q/K/V, K/V, Q) as fused(their names): derived from the parts, saving nothing of their own."""
    for name in names:
        setattr(m, name, part(getattr(m, name)))
    if fused is not None:
        m.qkv, m.kv, m.q = (fused(parts) for parts in (QKV, QKV[1:], QKV[:1]))


def freeze_linears(model: nn.Module, packed: frozenset[torch.dtype]) -> None:
    """Swap the model's linear layers for FrozenLinear in place (see the module docstring); `packed`: the compute
    dtypes that run through prepacked oneDNN weights on CPU."""
    for module in list(model.modules()):
        if is_attention(module):
            if all(type(getattr(module, n)) is nn.Linear for n in QKV):   # not int8 ones
                swap_attention(module, lambda lin: _frozen(lin, frozenset()),
                               fused=lambda names: FrozenFused(module, names, packed))
        elif is_ffn_input(module) and isinstance(module.dense, nn.Linear):
            module.dense = _frozen(module.dense, packed, module.intermediate_act_fn.name)
            module.intermediate_act_fn = nn.Identity()
        else:
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, name, _frozen(child, packed))
    for p in list(model.parameters()):                # what is left (embeddings, LayerNorms, biases): read-only
        p.requires_grad_(False)

