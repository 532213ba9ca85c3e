"""int8 linear layers for CPU inference: int8 weights per output channel, activations quantized to int8 per call.

    quantize_linears(model, keep_float)   every nn.Linear / FrozenLinear of the encoder and heads -> Int8Linear
                                          (Q/K/V fused into one int8 GEMM, the FFN activation applied after it);
                                          embeddings, LayerNorms, softmax and the tied MLM decoder stay float
    to_storage(state_dict)                the word-embedding table as int8 rows + one scale per row, for the file
    from_storage(state_dict)              back to float (embeddings are looked up in float)
    prepare(model, config)                the int8 layers a `quantization_config` in config.json names, before load

The kernel is PyTorch's own `quantized::linear_dynamic` on weights prepacked once for fbgemm or oneDNN (whichever
`runtime.plan` measured faster here): it quantizes each activation matrix with one (asymmetric uint8) scale inside
the call and multiplies with VNNI. Measured on AMD EPYC Zen 4 (AVX-512 VNNI, 2 threads), 2000 rows at MiniLM and
BERT-base shapes: 2.2-4.4x the fp32 GEMM, where `torch._int_mm` with per-token scales done in PyTorch ops was
0.9-3.1x and `torch._weight_int8pack_mm` (weight-only) 30x slower than fp32 (benchmarks/int8_kernels.py,
docs/performance.md). Without VNNI the kernel narrows activations to 7 bits (`reduce_range`), as int16 sums in AVX2
would saturate. `runtime.plan` measures int8 against fp32 and (native bf16) a bf16 encoder layer: where int8 lost,
the layers run their dequantized weights in float (`set_engine`). Under bf16 autocast a second kernel,
`qlinear_bf16` (oneDNN's int8 GEMM on bf16 activations quantized in PyTorch ops, bf16 out), runs where the plan's
encoder-layer probe at the layer's width found it faster than bf16: on an AMX Xeon it lost at MiniLM's width, where
the activation quantization costs more than int8 saves over AMX bf16 (docs/performance.md).
An Int8Linear has no trainable parameter: a quantized model is inference-only, like a frozen one.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import math
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.attention import tracing
from bertkit.config import peek_json_config
from bertkit.errors import ConfigError
from bertkit.hardware import cpu_flags
from bertkit.activations import activation
from bertkit.runtime.linear import (ONEDNN_ACT, QKV, FrozenLinear, is_attention, is_ffn_input, swap_attention,
                                    tensors_stamp)

__all__ = ["Int8Linear", "quantize", "quantize_linears", "runs_int8", "to_storage", "from_storage", "prepare",
           "int8_kernel_ok", "qlinear_bf16", "qlinear_bf16_ok", "is_int8_dir", "check_keep_float", "METHOD",
           "EMBEDDING_KEY", "BF16_KERNEL_ALWAYS", "under_bf16_for"]

log = logging.getLogger("bertkit.runtime.int8")

METHOD = "bertkit-int8"
EMBEDDING_KEY = "embeddings.word_embeddings.weight"
ENGINES = ("fbgemm", "onednn")                       # PyTorch's two x86 int8 GEMM libraries; runtime.plan picks one
BF16_KERNEL_ALWAYS = 1 << 62                          # bf16_kernel_below where `qlinear_bf16` won at every length


def _vnni() -> bool:
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags())


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """(rows, cols) float -> int8 values and one symmetric scale per row (rows,), float32."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def default_engine() -> str:
    return next((e for e in ENGINES if e in torch.backends.quantized.supported_engines), ENGINES[0])


def _prepack(q: Tensor, scale: Tensor, bias: Tensor | None, engine: str):
    """int8 weight + scales -> the weight prepacked for `engine` (built once, kept as derived data); the global
    engine setting is restored: the packed weight carries its library with it."""
    old = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = engine
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # the quantized-tensor constructor warns of its deprecation
            qw = torch._make_per_channel_quantized_tensor(q.cpu(), scale.double().cpu(),
                                                          torch.zeros(q.shape[0], dtype=torch.long), 0)
            return torch.ops.quantized.linear_prepack(qw, None if bias is None else bias.float().cpu())
    finally:
        torch.backends.quantized.engine = old


def _qlinear_prepack(q: Tensor, scale: Tensor, bias: Tensor | None) -> tuple:
    """int8 weight + scales -> what `qlinear_bf16` takes: the weight prepacked for oneDNN, its scales, zero points
    and bias."""
    return (torch.ops.onednn.qlinear_prepack(q.cpu(), None), scale.float().cpu(),
            torch.zeros(q.shape[0], dtype=torch.long), None if bias is None else bias.float().cpu())


_ZERO = torch.zeros((), dtype=torch.int32)        # the activations' zero point: symmetric


def qlinear_bf16(x: Tensor, packed: tuple, act: str | None) -> Tensor:
    """act(x W^T + b) for bf16 `x` of any leading shape: x quantized to int8 with one symmetric scale (its absolute
    maximum, as a tensor: no sync with Python), oneDNN's int8 GEMM (AMX / VNNI) with the scales, bias and activation
    in its epilogue, bf16 out. Unlike `quantized::linear_dynamic` it takes and gives bf16, so the rest of a layer
    stays in bf16 under autocast."""
    w, w_scale, w_zero, b = packed
    x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    lo, hi = torch.aminmax(x2)                      # one pass, the fastest absolute maximum measured
    scale = torch.maximum(hi, lo.neg()).float().clamp_(min=1e-12).div_(127.0)
    xq = x2.div(scale).round_().to(torch.int8)
    post, algorithm = ONEDNN_ACT.get(act, ("none", ""))
    y = torch.ops.onednn.qlinear_pointwise.tensor(xq, scale, _ZERO, w, w_scale, w_zero, b, 1.0, 0, torch.bfloat16,
                                                   post, [], algorithm).reshape(*x.shape[:-1], -1)
    return y if act is None or act in ONEDNN_ACT else activation(act)(y)


def _agrees(kernel, dtype: torch.dtype) -> bool:
    """Whether kernel(x, int8 rows, scales) runs here and agrees with the float product of the dequantized weights."""
    try:
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(8, 64, generator=g).to(dtype), torch.randn(32, 64, generator=g)
        q, s = quantize_rows(w)
        ref = F.linear(x.float(), q.float() * s[:, None])
        return bool((kernel(x, q, s).float() - ref).abs().max() < 0.05 * ref.abs().max())
    except (RuntimeError, AttributeError, TypeError):
        return False


@functools.cache
def qlinear_bf16_ok() -> bool:
    """Whether oneDNN's int8 GEMM with bf16 activations (`qlinear_bf16`) runs here and agrees with the bf16
    product of the dequantized weights."""
    return "onednn" in torch.backends.quantized.supported_engines and _vnni() and _agrees(
        lambda x, q, s: qlinear_bf16(x, _qlinear_prepack(q, s, None), None), torch.bfloat16)


@functools.cache
def int8_kernel_ok(engine: str | None = None) -> bool:
    """Whether the prepacked int8 kernel of `engine` runs here and agrees with the float product of the
    dequantized weights."""
    engine = engine or default_engine()
    return engine in torch.backends.quantized.supported_engines and _agrees(
        lambda x, q, s: torch.ops.quantized.linear_dynamic(x, _prepack(q, s, None, engine), not _vnni()), torch.float32)


class Int8Linear(nn.Module):
    """act(x W^T + b) with W stored as int8 (`weight`) times one float scale per output row (`weight_scale`)."""
    inference_only = True
    _DERIVED = ("_packed", "_float", "_qpacked")      # (stamp, derived data) caches, never copied

    def __init__(self, in_features: int, out_features: int, bias: bool = True, act: str | None = None):
        super().__init__()
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.act = act
        self._init_runtime()

    def _init_runtime(self) -> None:
        """What runtime.freeze sets (set_engine) and the derived data built on first use."""
        self.engine = default_engine()                # the library measured fastest here (None: the float GEMM,
                                                      # where fp32 beat int8 here)
        self.bf16_faster = False                      # under bf16 autocast, the float GEMM (bf16 beat int8 here)
        self.bf16_kernel_below = 0                    # under bf16 autocast, inputs of fewer rows run
                                                      # `qlinear_bf16` (where it beat the bf16 GEMM here)
        self.float_below = 0                          # fewer rows: the float GEMM (where int8 lost on short inputs)
        self.float_packed: frozenset = frozenset()    # ... prepacked in these dtypes, as frozen fp32 layers are
        self._packed: tuple = (None, None)           # (stamp of weight / scale / bias + engine, prepacked weight)
        self._float: tuple = (None, None)            # (stamp, FrozenLinear of the dequantized weights)
        self._qpacked: tuple = (None, None)          # (stamp, `_qlinear_prepack` of the weights)

    @classmethod
    def from_float(cls, linear: nn.Module, act: str | None = None, values: bool = True) -> "Int8Linear":
        """The int8 layer of `linear`'s shape; with `values`, its weights quantized (without: a checkpoint's will
        be loaded, and quantizing a freshly initialised model's would be wasted work at every load)."""
        out_f, in_f = linear.weight.shape
        m = cls(in_f, out_f, linear.bias is not None, act)
        if not values:
            return m
        q, s = quantize_rows(linear.weight)
        m.weight.copy_(q)
        m.weight_scale.copy_(s)
        if linear.bias is not None:
            m.bias.copy_(linear.bias.detach().float())
        return m

    in_features = property(lambda self: self.weight.shape[1])
    out_features = property(lambda self: self.weight.shape[0])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, act={self.act}"

    def train(self, mode: bool = True):
        if mode:
            raise ConfigError("this model is quantized to int8 for inference: train the float model instead")
        return super().train(False)

    def parts(self) -> tuple[Tensor, Tensor, Tensor | None]:
        b = self._buffers                            # not self.weight: nn.Module.__getattr__ on every call is slow
        return b["weight"], b["weight_scale"], b["bias"]

    def stamp(self) -> tuple:
        """What derived copies of this layer's weights depend on (runtime.linear._stamp)."""
        return tensors_stamp(self.parts())

    def width(self) -> int:
        """The model width this layer belongs to: the narrower side (hidden size for Q/K/V, attention out, FFN)."""
        return min(self._buffers["weight"].shape)

    def dequantized(self) -> tuple[Tensor, Tensor | None]:
        q, s, b = self.parts()
        return q.float() * s.float()[:, None], b

    def forward(self, x: Tensor) -> Tensor:
        if tracing() or x.device.type != "cpu" or not int8_kernel_ok():
            w, b = self.dequantized()                # graphs want plain aten ops; other devices have no kernel here
            y = F.linear(x, w.to(x.dtype), None if b is None else b.to(x.dtype))
        elif x.numel() < self.bf16_kernel_below * x.shape[-1] and torch.is_autocast_enabled("cpu"):
            stamp = self.stamp()
            if self._qpacked[0] != stamp:
                self._qpacked = (stamp, _qlinear_prepack(*self.parts()))
            return qlinear_bf16(x, self._qpacked[1], self.act)
        elif self.engine is None or x.numel() < self.float_below * x.shape[-1] or (
                self.bf16_faster and torch.is_autocast_enabled("cpu")):
            stamp = self.stamp()                     # int8 measured slower than float (here, or at this few rows)
            if self._float[0] != stamp:
                self._float = (stamp, FrozenLinear(*self.dequantized(), self.act, self.float_packed))
            return self._float[1](x)
        else:
            stamp = (self.stamp(), self.engine)
            if self._packed[0] != stamp:
                self._packed = (stamp, _prepack(*self.parts(), self.engine))
            shape = x.shape
            y = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).float().contiguous(), self._packed[1],
                                                   not _vnni()).reshape(*shape[:-1], -1).to(x.dtype)
        return y if self.act is None else activation(self.act)(y)

    def __getstate__(self):
        # derived; prepacked weights cannot be copied
        return {**self.__dict__, **dict.fromkeys(self._DERIVED, (None, None))}


class Int8Fused(Int8Linear):
    """Sibling Int8Linears of `owner` (Q, K, V) as one GEMM on their concatenated int8 rows; saves nothing itself."""
    _DERIVED = (*Int8Linear._DERIVED, "_fused")

    def __init__(self, owner: nn.Module, names: tuple[str, ...]):
        nn.Module.__init__(self)
        self.__dict__["owner"] = owner                # the parts are registered where they live
        self.names = names
        self.act = None
        self._init_runtime()
        self._fused: tuple = (None, None)

    def _sources(self) -> list[Int8Linear]:
        return [self.owner._modules[n] for n in self.names]     # as they are now: a load may have replaced one

    def stamp(self) -> tuple:
        return tuple([m.stamp() for m in self._sources()])

    def width(self) -> int:
        return self._sources()[0].width()

    def parts(self) -> tuple[Tensor, Tensor, Tensor | None]:
        stamp = self.stamp()
        if self._fused[0] != stamp:
            cat = [torch.cat(ts) for ts in zip(*(m.parts() for m in self._sources()))]
            self._fused = (stamp, tuple(cat))
        return self._fused[1]


def under_bf16_for(width: int, choices: tuple) -> tuple[bool, int]:
    """(bf16 GEMMs beat the fp32-activation int8 kernel, rows under which `qlinear_bf16` runs) for a layer of
    `width`: the choice measured at the probed width nearest it by ratio, in `choices` ((width, faster, below),
    ...); (False, 0) where nothing was measured."""
    if not choices:
        return False, 0
    _, faster, below = min(choices, key=lambda c: abs(math.log(width / c[0])))
    return faster, below


def set_engine(model: nn.Module, engine: str | None, measured_slower: bool = False, float_below: int = 0,
               float_packed: frozenset = frozenset(), under_bf16: tuple = ()) -> None:
    """Run every int8 layer of `model` through `engine` (None: the default one). Where int8 lost here, the layers
    take their float GEMM instead (a FrozenLinear of the dequantized weights, prepacked in `float_packed` dtypes,
    built on first use): everywhere with `measured_slower` (int8 lost to fp32: the user is told once), on inputs
    of fewer than `float_below` rows (int8 lost on short inputs). Under bf16 autocast each layer follows the
    `under_bf16` choice of its width (`under_bf16_for`): the float GEMM where bf16 beat int8 (precision.for_model
    then lets "auto" run bf16), except inputs of fewer rows than its limit, which run `qlinear_bf16` (int8 GEMMs
    with bf16 activations, where they beat bf16 here)."""
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    if layers and measured_slower:
        log.warning("this CPU's int8 path measured slower than fp32 (python -m bertkit.hardware): the int8 layers "
                    "run their weights in float here")
    elif layers and float_below and float_below != layers[0].float_below:
        log.warning(f"this CPU's int8 path measured slower than fp32 on short inputs (python -m bertkit.hardware): "
                    f"inputs under {float_below} tokens run the int8 layers' weights in float")
    for m in layers:
        m.engine = None if measured_slower else engine or default_engine()
        m.float_below, m.float_packed = float_below, float_packed
        m.bf16_faster, m.bf16_kernel_below = under_bf16_for(m.width(), under_bf16)


def runs_int8(model: nn.Module) -> bool:
    """Whether some layer of `model` runs the int8 kernel (`set_engine`) under bf16 autocast: a model that does
    wants fp32 activations, as the kernel takes them."""
    return any(isinstance(m, Int8Linear) and m.engine is not None and not m.bf16_faster for m in model.modules())


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, p + ".*") for p in patterns)


def _linear_like(m: nn.Module) -> bool:
    return isinstance(m, (nn.Linear, FrozenLinear)) and getattr(m, "weight", None) is not None \
        and m.weight.is_floating_point()


def check_keep_float(model: nn.Module, patterns) -> None:
    """Every `keep_float` pattern names some linear layer of `model`, and some layer is left to quantize: a typo
    would otherwise quantize what the user meant to keep, or write a "quantized" model with nothing in int8."""
    layers = [n for n, m in model.named_modules() if _linear_like(m)]
    for p in patterns:
        if not p.strip() or not any(_matches(n, [p]) for n in layers):
            raise ConfigError(f"--keep-float {p!r} matches no linear layer (names look like {layers[0]!r}, "
                              f"{layers[-1]!r})")
    if patterns and all(_matches(n, patterns) for n in layers):
        raise ConfigError(f"--keep-float {' '.join(map(repr, patterns))} keeps every linear layer in float: "
                          f"nothing would be quantized")


def quantize_linears(model: nn.Module, keep_float=(), values: bool = True) -> list[str]:
    """Swap the model's linear layers for Int8Linear in place, except those whose module name matches a pattern in
    `keep_float` (fnmatch, e.g. "classifier" or "bert.encoder.layer.5.output.*"); `values=False`: the int8 layers
    of the right shapes only, for a checkpoint's values to load into. Returns the names quantized."""
    done = []
    for path, module in list(model.named_modules()):
        if _matches(path, keep_float):
            continue
        if is_attention(module) and all(_linear_like(getattr(module, n)) for n in QKV):
            names = [n for n in QKV if not _matches(f"{path}.{n}", keep_float)]
            # some stay float: no fused int8 GEMM; the module's Projections run each layer on its own
            swap_attention(module, lambda lin: Int8Linear.from_float(lin, values=values), names,
                           (lambda parts: Int8Fused(module, parts)) if len(names) == len(QKV) else None)
            done += [f"{path}.{n}" for n in names]
            continue
        for name, child in list(module.named_children()):
            full = f"{path}.{name}" if path else name
            if is_attention(module) or not _linear_like(child) or _matches(full, keep_float):
                continue
            act = None
            if is_ffn_input(module) and name == "dense":
                act = getattr(child, "act", None) or module.intermediate_act_fn.name
                module.intermediate_act_fn = nn.Identity()
            setattr(module, name, Int8Linear.from_float(child, act, values))
            done.append(full)
    for p in model.parameters():                      # what is left (embeddings, LayerNorms): read-only
        p.requires_grad_(False)
    return done


def is_int8_dir(model_dir) -> bool:
    """Whether `model_dir`'s config.json names bertkit's int8 method; False where it cannot be read (the loaders
    then name what is wrong with it)."""
    qc = peek_json_config(Path(model_dir) / "config.json").get("quantization_config")
    return isinstance(qc, dict) and qc.get("method") == METHOD


def prepare(model: nn.Module, config) -> nn.Module:
    """The int8 layers named by `config.extra["quantization_config"]`, ready for the checkpoint's int8 weights."""
    qc = config.extra.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("method") != METHOD:
        raise ConfigError(f"quantization_config {qc!r} is not bertkit's: expected method {METHOD!r}")
    quantize_linears(model, qc.get("keep_float", ()), values=False)
    return model.eval()


def to_storage(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """The state_dict to write: word-embedding rows as int8 with a scale per row (the largest float table)."""
    out = dict(sd)
    for key in [k for k in sd if k.endswith(EMBEDDING_KEY) and sd[k].is_floating_point()]:
        out[key], out[key + "_scale"] = quantize_rows(sd[key])
    return out


def from_storage(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of `to_storage`: int8 embedding rows back to float32."""
    out = dict(sd)
    for key in [k for k in sd if k.endswith(EMBEDDING_KEY) and k + "_scale" in sd]:
        out[key] = sd[key].float() * out.pop(key + "_scale").float()[:, None]
    return out


def quantize(model: nn.Module, keep_float=()) -> nn.Module:
    """`quantize_linears` in place, and the `quantization_config` that save_pretrained / from_pretrained read."""
    quantize_linears(model, keep_float)
    with torch.no_grad():                             # the values the file will hold: what runs now is what loads
        for name, p in model.named_parameters():
            if name.endswith(EMBEDDING_KEY):
                q, s = quantize_rows(p)
                p.copy_(q.float() * s[:, None])
    model.config.extra["quantization_config"] = {
        "method": METHOD, "weights": "int8, symmetric, one scale per output channel",
        "activations": "int8, dynamic, one scale per matrix per call (quantized::linear_dynamic on fbgemm "
                       "or oneDNN, the one measured faster where the model runs)",
        "embeddings": "word embeddings stored as int8 rows with a scale per row, looked up in float32",
        "keep_float": list(keep_float)}
    return model.eval()
