"""Attention that starts local: an initialisation of a from-scratch BERT whose first layer attends to neighbours.

    local_attention_init(model)            # BertForPreTraining / BertForMaskedLM / BertModel, before training

A from-scratch MLM sits on a plateau, predicting every [MASK] from the bag of words of its row, until a head learns to
read the neighbouring tokens (docs/performance.md, "Pre-training from scratch on a budget"): with learned absolute
positions from N(0, 0.02) nothing relates position i to i - 1 at the start. This init builds that in, keeping BERT's
architecture and checkpoint format (only initial values change):

  * position embeddings: random Fourier features of a Gaussian kernel over positions, in a `dims`-dimensional
    subspace of the hidden space: p_i . p_j ~ exp(-(i - j)^2 / (2 length_scale^2)) (Rahimi & Recht, 2007), at the
    norm of a word embedding row;
  * the first `layers` layers: head h's key reads the position subspace, its query the same subspace rotated by a
    shift of OFFSETS[h] positions, scaled so the attention logits span ~`beta`: at step 0 head h attends mostly to
    token i + OFFSETS[h].
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["local_attention_init", "OFFSETS"]

OFFSETS = (-1, 1, -2, 2, -3, 3)      # head h's starting offset (heads past these continue -4, 4, ...)


def _offset(head: int) -> int:
    return OFFSETS[head] if head < len(OFFSETS) else (head // 2 + 1) * (-1 if head % 2 == 0 else 1)


def unfit_for(config) -> str | None:
    """Why `config`'s model cannot start local (it needs a learned position table as wide as the layers and separate
    query / key weights), or None where it can."""
    if not config.position_table:
        return f"a {config.model_type} model has no learned position table to start from"
    if (config.embedding_size or config.hidden_size) != config.hidden_size:
        return "its factorised position table is narrower than its layers"
    return None


def local_attention_init(model: nn.Module, length_scale: float = 1.5, dims: int = 32, beta: float = 8.0,
                         layers: int = 1, seed: int = 0) -> None:
    """Re-initialise `model`'s position embeddings and the query / key weights of its first `layers` layers so that
    each head starts attending at its offset (module docstring). In place; deterministic for a seed."""
    bert = getattr(model, "bert", model)
    config = bert.config
    d, heads = config.hidden_size, config.num_attention_heads
    dh = d // heads
    m = min(dims, dh) // 2 * 2                                     # (cos, sin) pairs, within a head's width
    g = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(d, m, generator=g, dtype=torch.float64))   # (d, m) orthonormal
    omega = torch.randn(m // 2, generator=g, dtype=torch.float64) / length_scale
    phase = torch.rand(m // 2, generator=g, dtype=torch.float64) * 2 * math.pi
    emb = bert.embeddings.position_embeddings.weight
    pos = torch.arange(emb.shape[0], dtype=torch.float64)[:, None]
    angle = pos * omega + phase                                    # (positions, m / 2)
    features = torch.cat([angle.cos(), angle.sin()], 1) / math.sqrt(m // 2)   # (positions, m): f_i . f_j ~ kernel
    # after the embedding LayerNorm the position part has norm ~sqrt(d / 2): q . k / sqrt(dh) then spans ~beta
    scale = math.sqrt(beta * math.sqrt(dh) / (d / 2))
    with torch.no_grad():
        emb.copy_((features @ basis.T * config.initializer_range * math.sqrt(d)).to(emb.dtype))
        for layer in bert.encoder.layer[:layers]:
            attn = layer.attention.self
            for h in range(heads):
                rows = slice(h * dh, (h + 1) * dh)
                attn.key.weight[rows] = 0.0
                attn.query.weight[rows] = 0.0
                attn.key.weight[rows][:m] = (scale * basis.T).to(attn.key.weight.dtype)
                attn.query.weight[rows][:m] = (scale * _shift(omega, _offset(h)) @ basis.T).to(attn.query.weight.dtype)
            attn.query.bias.zero_()
            attn.key.bias.zero_()


def _shift(omega: torch.Tensor, offset: int) -> torch.Tensor:
    """(m, m): the map f_i -> f_{i + offset} of the Fourier features (a rotation by omega * offset per pair)."""
    half = omega.numel()
    c, s = torch.cos(omega * offset), torch.sin(omega * offset)
    rot = torch.zeros(2 * half, 2 * half, dtype=omega.dtype)
    i = torch.arange(half)
    rot[i, i], rot[i, i + half], rot[i + half, i], rot[i + half, i + half] = c, -s, s, c
    return rot
