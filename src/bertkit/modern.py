"""The parts later encoders (ModernBERT, NomicBERT, GTE) swap into the one encoder, and the config keys choosing them:
rotary positions (RoFormer; one base for global layers, another for local ones), sliding-window local layers, the
GLU feed-forward, linear layers and LayerNorms without bias, and a fresh model's init by module.

Which family uses which is `bertkit.families` (docs/families.md). ModernBERT's values (thetas, window, biases,
pooling) are the config.json's own keys, kept in `BertConfig.extra` so they are written back unchanged, read here
with ModernBERT's defaults; NomicBERT's and GTE's biases are fixed by the family (`Family.parts`). BERT's families
get `Parts()`: every bias, no window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from bertkit.activations import activation
from bertkit.errors import ConfigError
from bertkit.families import family

__all__ = ["GLU", "Parts", "parts", "rotary_table", "rotate", "window_mask"]


@dataclass(frozen=True)
class Parts:
    norm_bias: bool = True
    attention_bias: bool = True
    mlp_bias: bool = True
    mlp_out_bias: bool | None = None          # the feed-forward's second layer's (GTE's alone); None: mlp_bias
    classifier_bias: bool = True              # the heads' hidden layer (ModernBERT's `head.dense`)
    decoder_bias: bool = True                 # the MLM decoder's
    classifier_pooling: str = "cls"           # "cls" or "mean": what a sequence classifier reads
    classifier_activation: str | None = None  # the heads' hidden layer's; None: the family's
    embedding_dropout: float | None = None    # None: hidden_dropout_prob
    mlp_dropout: float | None = 0.0           # inside the GLU, before its second layer; None: hidden_dropout_prob
    glu_act_half: int = 0                     # the GLU half its activation reads (the other is the gate)
    window: int | None = None                 # local layers: keys within this distance of the query
    local_layers: tuple[bool, ...] = ()       # per layer: local (sliding window) or global
    global_theta: float = 160_000.0
    local_theta: float = 10_000.0


# ModernBertConfig's defaults for the keys a config.json may leave out
_MODERN = dict(norm_bias=False, attention_bias=False, mlp_bias=False, classifier_bias=False, decoder_bias=True,
               classifier_pooling="cls", classifier_activation="gelu", embedding_dropout=0.0, mlp_dropout=0.0)


def parts(config) -> Parts:
    """The parts `config` chooses beyond BERT's fields; ConfigError naming a bad key."""
    fam, extra = family(config.model_type), config.extra
    if not fam.rotary:
        return Parts()
    if fam.parts:                         # NomicBERT, GTE: the family's biases, one rotary base, every layer global
        head_dim = extra.get("head_dim", config.head_dim)
        _check("head_dim", head_dim, head_dim == config.head_dim)
        _check("rope_scaling", extra.get("rope_scaling"), extra.get("rope_scaling") is None)
        for key, want in (("logn_attention_scale", False), ("pack_qkv", True), ("layer_norm_type", "layer_norm")):
            _check(key, extra.get(key, want), extra.get(key, want) == want)     # GTE's own code's other settings
        fixed = dict(fam.parts)
        fixed["global_theta"] = _theta(extra, None, "rope_theta", fixed["global_theta"])
        return Parts(**fixed, local_layers=(False,) * config.num_hidden_layers)
    kw = {name: extra.get(name, default) for name, default in _MODERN.items()}
    for name in ("norm_bias", "attention_bias", "mlp_bias", "classifier_bias", "decoder_bias"):
        _check(name, kw[name], isinstance(kw[name], bool))
    _check("classifier_pooling", kw["classifier_pooling"], kw["classifier_pooling"] in ("cls", "mean"))
    for name in ("embedding_dropout", "mlp_dropout"):
        _check(name, kw[name], isinstance(kw[name], (int, float)) and 0 <= kw[name] < 1)
    activation(kw["classifier_activation"])                      # an unknown name fails here, naming itself
    window = extra.get("local_attention", 128)
    _check("local_attention", window, isinstance(window, int) and not isinstance(window, bool) and window >= 2)
    types = extra.get("layer_types")
    if types is None:                     # older config.json: a global layer every n, the first one global
        every = extra.get("global_attn_every_n_layers", 3)
        _check("global_attn_every_n_layers", every, isinstance(every, int) and every >= 1)
        types = ["sliding_attention" if i % every else "full_attention" for i in range(config.num_hidden_layers)]
    _check("layer_types", types, isinstance(types, list) and len(types) == config.num_hidden_layers
           and set(types) <= {"sliding_attention", "full_attention"})
    return Parts(**kw, window=window // 2, local_layers=tuple(t == "sliding_attention" for t in types),
                 global_theta=_theta(extra, "full_attention", "global_rope_theta", 160_000.0),
                 local_theta=_theta(extra, "sliding_attention", "local_rope_theta", 10_000.0))


def _check(name: str, value, ok: bool) -> None:
    if not ok:
        raise ConfigError(f"config.json key {name}={value!r:.80} is not a value bertkit reads")


def _theta(extra: dict, layer_type: str | None, old_key: str, default: float) -> float:
    """A rotary base from `rope_parameters` (transformers >= 5; one per layer type, or one for all where
    `layer_type` is None), else the older top-level key."""
    rope = extra.get("rope_parameters") or {}
    _check("rope_parameters", rope, isinstance(rope, dict))
    if layer_type is None:                # one base for all: a per-layer-type dict is another family's
        _check("rope_parameters", rope, not any(isinstance(v, dict) for v in rope.values()))
    else:
        rope = rope.get(layer_type) or {}
        _check(f"rope_parameters.{layer_type}", rope, isinstance(rope, dict))
    _check("rope_parameters" + (f".{layer_type}" if layer_type else "") + ".rope_type", rope.get("rope_type"),
           rope.get("rope_type", "default") == "default")
    theta = rope.get("rope_theta", extra.get(old_key, default))
    _check(old_key, theta, isinstance(theta, (int, float)) and theta > 0)
    return float(theta)


# ---------------------------------------------------------------------------------------------- the maths
def rotary_table(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin (..., head_dim / 2) of the angles position / theta^(2i / head_dim), for positions (...,): once a
    forward, every layer of that base reads them. Rounded to the hidden states' dtype as transformers rounds them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=positions.device) / head_dim))
    angles = positions.float()[..., None] * inv_freq
    return angles.cos().to(dtype).float(), angles.sin().to(dtype).float()


def rotate(qkv: Tensor, table: tuple[Tensor, Tensor], heads: int) -> Tensor:
    """Fused (..., 3 * hidden) projections with q and k rotated (RoFormer), v as it was; the table's positions
    broadcast over the leading dims: (seq,) for a padded batch, (tokens,) for a packed one. In fp32, the halves
    x1 cos - x2 sin | x2 cos + x1 sin: transformers' x cos + rotate_half(x) sin, bit for bit. Rotated in place
    (`qkv` is a fresh projection no one else reads: no copy or cat), except under tracing (ONNX export), which drops
    in-place writes to views."""
    cos, sin = (t.unsqueeze(-2) for t in table)                                   # (..., 1, head_dim / 2)
    width = qkv.shape[-1] * 2 // 3
    if torch.jit.is_tracing():
        x1, x2 = qkv[..., :width].unflatten(-1, (2 * heads, 2, -1)).float().unbind(-2)
        turned = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2).to(qkv.dtype)
        return torch.cat((turned, qkv[..., width:]), dim=-1)
    out = qkv if qkv.dtype == torch.float32 else qkv.float()
    qk = out[..., :width].unflatten(-1, (2 * heads, 2, -1))                      # (..., 2 heads, 2, head_dim / 2)
    x1, x2 = qk.select(-2, 0), qk.select(-2, 1)
    x2_sin, x1_sin = x2 * sin, x1 * sin
    x1.mul_(cos).sub_(x2_sin)
    x2.mul_(cos).add_(x1_sin)
    return out.to(qkv.dtype)


def window_mask(mask: Tensor | None, length: int, window: int, device) -> Tensor | None:
    """A bool key mask (rows, 1, 1, len) or None, narrowed to keys within `window` of each query:
    (rows or 1, 1, len, len). A query always sees itself, so a padded query far from any real key has one key
    (never a row of NaN; nothing reads it). Unchanged where the window spans the whole row."""
    if length <= window + 1:
        return mask
    pos = torch.arange(length, device=device)
    near = (pos[:, None] - pos[None, :]).abs() <= window                               # (len, len)
    if mask is None:
        return near[None, None]
    return (near & mask) | torch.eye(length, dtype=torch.bool, device=device)


class GLU(nn.Module):
    """(..., 2 x intermediate) -> act(one half) * the other, dropout: the gated feed-forward's middle (GeGLU for
    GELU, SwiGLU for SiLU). `half`: which half the activation reads."""

    def __init__(self, name: str, p: float, half: int = 0):
        super().__init__()
        self.fn = activation(name)
        self.dropout = nn.Dropout(p)
        self.half = half

    def forward(self, x: Tensor) -> Tensor:
        halves = x.chunk(2, dim=-1)
        return self.dropout(self.fn(halves[self.half]) * halves[1 - self.half])


def init_family(model: nn.Module, module: nn.Module) -> None:
    """A fresh model's init by its family's own stds, for the modules of `module` the family names
    (families.Family.init_stds; ModernBERT's, as transformers initialises it): "in" initializer_range, "out" that
    over sqrt(2 x layers), "final" hidden_size ** -0.5, a normal truncated at initializer_cutoff_factor stds (its
    config's default 2; 3 where it is null)."""
    rules, c = family(model.config.model_type).init_stds, model.config
    if not rules:
        return
    stds = {"in": c.initializer_range, "out": c.initializer_range / math.sqrt(2 * c.num_hidden_layers),
            "final": c.hidden_size ** -0.5}
    cutoff = c.extra.get("initializer_cutoff_factor", 2.0)
    cutoff = 3.0 if cutoff is None else float(cutoff)
    names = {id(m): name for name, m in model.named_modules()}  # init_weights(part) names parts from the top
    for m in module.modules():
        name = names.get(id(m), "")
        role = next((r for end, r in rules if name == end or name.endswith("." + end)), None)
        if role is not None and isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(m.weight, 0.0, stds[role], -cutoff * stds[role], cutoff * stds[role])
