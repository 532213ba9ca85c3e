"""Attention functions with one signature, and the execution plan that picks one per forward.

Every function computes softmax(q k^T * scale + mask) v with dropout on the probabilities in training:

    fn(q, k, v, mask, scale, dropout_p, plan) -> (context, probabilities or None)
        q, k, v  (rows, heads, len, head_dim)          mask  (rows, 1, 1, len) bool, True = attend, or None;
        context  (rows, heads, len, head_dim)                or a float bias added to the scaled scores,
                                                             broadcastable to (rows, heads, len, len), -inf where
                                                             a key is masked (relative positions: MPNet)

    "eager"     explicit scores, masked softmax, dropout, weighted sum; the only one that returns the probabilities
    "sdpa"      torch.nn.functional.scaled_dot_product_attention
    "explicit"  the eager maths in the input dtype with -inf masking and the 16-bit dropout mask: on some CPUs
                faster than SDPA's math fallback (training with dropout) and its flash kernel on short masked rows

The plan is built once per forward from the model's `ExecutionOptions` and the `Mode` read once from torch; nothing
below `ExecutionPlan.build` inspects ambient state. Adding a function: docs/architecture.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from bertkit.padding import Layout, fill

__all__ = ["ATTENTION_FUNCTIONS", "ExecutionOptions", "ExecutionPlan", "Mode", "dropout_drop_mask",
           "eager_attention", "explicit_attention", "sdpa_attention", "tracing", "with_bias"]


# ---------------------------------------------------------------------------------------------- dropout masks
def dropout_drop_mask(shape: tuple[int, ...], p: float, device: torch.device) -> tuple[Tensor, float]:
    """A dropout mask (True = dropped) from 16 random bits per element, and the matching 1 / P(keep) scale.

    One int64 draw over the full range (the same generator as torch.rand, so seeding and checkpointed RNG state
    hold) gives four 16-bit uniforms, far cheaper on CPU than one Bernoulli draw per element. P(drop) is p rounded
    to a multiple of 1/65536 and the scale uses that exact value, so the expectation is exactly the input's."""
    n = math.prod(shape)
    drop = round(p * 65536)
    bits = torch.randint(-2 ** 63, 2 ** 63 - 1, (-(-n // 4),), dtype=torch.int64, device=device)
    dropped = bits.view(torch.int16)[:n].view(shape) < drop - 32768                # P(drop) = drop / 65536
    return dropped, 65536.0 / (65536 - drop)


def dropout(x: Tensor, p: float, training: bool, fast: bool) -> Tensor:
    """F.dropout, or with the 16-bit mask of `dropout_drop_mask` when `fast`."""
    if not training or p == 0.0:
        return x
    if not fast or p >= 1.0:
        return F.dropout(x, p, True)
    dropped, scale = dropout_drop_mask(tuple(x.shape), p, x.device)
    return torch.where(dropped, 0.0, x * scale)                  # one pass each way (masked_fill clones first)


# ---------------------------------------------------------------------------------------------- the functions
def eager_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, dropout_p: float,
                    plan: "ExecutionPlan") -> tuple[Tensor, Tensor]:
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale                  # (rows, heads, len, len)
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask.clamp_min(torch.finfo(scores.dtype).min)
    elif mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    ctx = torch.matmul(dropout(probs, dropout_p, dropout_p > 0, plan.fast_dropout), v)
    return ctx, probs


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, dropout_p: float,
                   plan: "ExecutionPlan") -> tuple[Tensor, None]:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale), None


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, dropout_p: float,
                       plan: "ExecutionPlan") -> tuple[Tensor, None]:
    # scores stay in the input dtype: PyTorch's CPU softmax computes a bf16 input in fp32 internally
    scores = torch.matmul(q * scale, k.transpose(-1, -2))                  # (rows, heads, len, len)
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask
    elif mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if dropout_p == 0.0:
        return torch.matmul(probs, v), None
    if not plan.fast_dropout:
        return torch.matmul(F.dropout(probs, dropout_p, True), v), None
    dropped, keep_scale = dropout_drop_mask(tuple(probs.shape), dropout_p, probs.device)
    return torch.matmul(torch.where(dropped, 0.0, probs), v) * keep_scale, None   # scale the small side


def with_bias(bias: Tensor | None, mask: Tensor | None) -> Tensor | None:
    """A position bias (1 or rows, heads, len, len) and a bool key mask (rows, 1, 1, len) as one float mask: the
    bias, -inf at masked keys. Either may be None."""
    if bias is None or mask is None:
        return bias if mask is None else mask
    return bias.masked_fill(~mask, float("-inf"))


ATTENTION_FUNCTIONS = {"eager": eager_attention, "sdpa": sdpa_attention, "explicit": explicit_attention}


# ---------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class ExecutionOptions:
    """A model's execution choices. The defaults are plain PyTorch; `bertkit.runtime.apply` sets the fast paths
    that measured faster on this machine."""
    unpad_min_fill: float = 0.95          # "auto" unpads below this share of real tokens (cost model: docs/)
    explicit_max_len: int = 256           # explicit attention materialises (len, len) scores: short rows only
    explicit_train_attention: bool = False  # CPU training with attention dropout: "explicit" instead of SDPA
    explicit_train_short: bool = False    # CPU training without attention dropout, short rows: likewise
    explicit_masked_inference: bool = False  # CPU bf16 inference on masked short rows: "explicit" instead of SDPA
    fast_dropout: bool = False            # CPU dropout masks from 16 random bits per element
    bf16_residual: bool = False           # CPU training under bf16 autocast: the residual stream in bf16
    checkpoint_layers: bool = False       # training: recompute each encoder layer in backward (memory for time)
    bucket_overhead: float | None = None  # inference: unpadded attention buckets by padding.cost_buckets with this
                                          # per-bucket cost (row * length^2 units, measured); None: length_buckets

    def with_(self, **changes) -> "ExecutionOptions":
        return replace(self, **changes)


def tracing() -> bool:
    """torch.jit.trace, torch.export / torch.compile: graphs want plain aten ops. ONNX export traces (TorchScript) or
    runs torch.export, which these two flags show; torch.onnx.is_in_onnx_export() imports twice a call, and
    layers call this on every forward."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling()


@dataclass(frozen=True)
class Mode:
    """What torch says about this forward, read once."""
    device: torch.device
    dtype: torch.dtype          # the matmul dtype: autocast's when it is on, else the weights'
    training: bool              # module in training mode: dropout applies
    tracing: bool               # torch.jit / ONNX export / torch.compile: plain aten ops only
    autocast: bool
    grad: bool = True           # gradients on: with `training`, a training step (backward-friendly kernels)

    @property
    def step(self) -> bool:
        return self.training and self.grad

    @classmethod
    def current(cls, device: torch.device, weight_dtype: torch.dtype, training: bool) -> "Mode":
        autocast = torch.is_autocast_enabled(device.type)
        return cls(device, torch.get_autocast_dtype(device.type) if autocast else weight_dtype,
                   training, tracing(), autocast, torch.is_grad_enabled())


@dataclass
class ExecutionPlan:
    """How one forward runs: the layout, the attention function for masked and for unmasked blocks, attention
    dropout, the dtype of the residual stream (None = as computed), whether input ids are range-checked (they are
    read on the host: not on a GPU, a sync per step, nor inside a graph), whether layers are recomputed in backward
    (gradient checkpointing: only when training with gradients)."""
    layout: Layout
    masked: str
    unmasked: str
    dropout_p: float
    fast_dropout: bool
    residual_dtype: torch.dtype | None = None
    check_values: bool = False
    checkpoint_layers: bool = False
    bias: Tensor | None = None      # (1, heads, seq, seq) relative-position bias shared by the layers (MPNet)
    rotary: dict | None = None      # rotary base -> its (cos, sin) tables at this layout's positions (ModernBERT)
    relative: Tensor | None = None  # DeBERTa's relative-position embeddings, each layer's bias derives from them

    @classmethod
    def build(cls, options: ExecutionOptions, implementation: str, attention_mask: Tensor | None,
              shape: tuple[int, int], mode: Mode, output_attentions: bool, dropout_p: float) -> "ExecutionPlan":
        kind, kernel = _layout_and_kernel(options, implementation, attention_mask, output_attentions)
        cpu = mode.device.type == "cpu" and not mode.tracing
        dropout_p = dropout_p if mode.training else 0.0
        masked, unmasked = (kernel, kernel) if kernel == "eager" else _kernels(options, mode, shape[1], dropout_p)
        layout = Layout.build(kind, attention_mask, *shape, device=mode.device,
                              drop_full_mask=cpu and kind == "padded" and kernel != "eager",
                              bucket_overhead=None if mode.step else options.bucket_overhead)
        residual = None
        if options.bf16_residual and cpu and mode.step and mode.autocast:
            residual = mode.dtype        # CPU autocast keeps LayerNorm outputs fp32: one cast instead of many
        return cls(layout, masked, unmasked, dropout_p, options.fast_dropout and cpu, residual, check_values=cpu,
                   checkpoint_layers=options.checkpoint_layers and mode.step)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float
               ) -> tuple[Tensor, Tensor | None]:
        fn = ATTENTION_FUNCTIONS[self.masked if mask is not None else self.unmasked]
        return fn(q, k, v, mask, scale, self.dropout_p, self)


def _layout_and_kernel(options: ExecutionOptions, implementation: str, attention_mask: Tensor | None,
                       output_attentions: bool) -> tuple[str, str]:
    """config.attn_implementation -> (layout, attention function). Attention maps need "eager"; "auto" unpads a
    batch whose real tokens are below `unpad_min_fill` of the grid."""
    if output_attentions or implementation == "eager":
        return "padded", "eager"
    if implementation == "unpadded":
        return "unpadded", "sdpa"
    if implementation == "auto" and fill(attention_mask) < options.unpad_min_fill:
        return "unpadded", "sdpa"
    return "padded", "sdpa"


def _kernels(options: ExecutionOptions, mode: Mode, seq: int, dropout_p: float) -> tuple[str, str]:
    """(masked, unmasked) attention functions where SDPA is the default."""
    if mode.device.type != "cpu" or mode.tracing:
        return "sdpa", "sdpa"
    short = seq <= options.explicit_max_len
    if mode.step and dropout_p > 0 and options.explicit_train_attention:
        return "explicit", "explicit"
    if mode.step and dropout_p == 0 and short and options.explicit_train_short:
        return "explicit", "explicit"
    if not mode.training and not mode.grad and short and mode.dtype == torch.bfloat16 and options.explicit_masked_inference:
        return "explicit", "sdpa"
    return "sdpa", "sdpa"
