"""DeBERTa's disentangled attention (He et al. 2021; transformers' modeling_deberta_v2.py), as an additive bias.

Each layer's scores add to content-to-content two terms read from relative-position embeddings R (2 * span rows,
shared by the layers, LayerNorm'd when norm_rel_ebd says so), indexed by the log bucket of the distance i - j:

    score(i, j) = [ q_i . k_j  +  q_i . K_r(R)[b(i, j)]  +  k_j . Q_r(R)[b(i, j)] ] / sqrt(head_dim * (1 + terms))
                               content -> position "c2p"     position -> content "p2c"

K_r / Q_r are the layer's own key / query projections (share_att_key) or pos_key_proj / pos_query_proj. The two
terms depend only on q, k and positions counted from 0, so they are a float mask for every attention function and
both layouts (each unpadded bucket's rows start at position 0). Only the rows of R that the sequence's distances
reach are projected (at most 2 * len - 1 of them), where transformers projects and multiplies all 2 * span.

The settings are config.json keys in `BertConfig.extra`, read (or refused by name) by `BertConfig.disentangled`.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from bertkit.config import Disentangled

__all__ = ["RelativeEmbeddings", "Terms"]


def log_bucket(relative: Tensor, buckets: int, max_position: int) -> Tensor:
    """transformers' make_log_bucket_position, op for op (the buckets must be its integers): distances within half
    the buckets kept, farther ones logarithmic up to max_position."""
    sign = torch.sign(relative)
    mid = buckets // 2
    near = (relative < mid) & (relative > -mid)
    abs_pos = torch.where(near, torch.tensor(mid - 1).type_as(relative), torch.abs(relative))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid))
                         * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative.type_as(log_pos), log_pos * sign).long()


class RelativeEmbeddings(nn.Module):
    """R, shared by the layers: encoder.rel_embeddings (2 * span, hidden), LayerNorm'd by encoder.LayerNorm."""

    def __init__(self, config, spec: Disentangled):
        super().__init__()
        self.rel_embeddings = nn.Embedding(2 * spec.span, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if spec.norm else None

    def forward(self) -> Tensor:
        r = self.rel_embeddings.weight
        return self.LayerNorm(r) if self.LayerNorm is not None else r


class Terms(nn.Module):
    """One layer's c2p + p2c terms as an additive score bias. The layer's query / key are looked up on `owner` at
    every call (a frozen or quantized replacement is the one that runs)."""

    def __init__(self, config, spec: Disentangled, owner: nn.Module):
        super().__init__()
        self.__dict__["owner"] = owner                  # not a submodule: query / key are registered there
        self.spec = spec
        self.heads = config.num_attention_heads
        self.scale = (config.head_dim * spec.scale) ** -0.5
        if not spec.share_att_key:
            if "c2p" in spec.terms:
                self.pos_key_proj = nn.Linear(config.hidden_size, config.hidden_size)
            if "p2c" in spec.terms:
                self.pos_query_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.pos_dropout = nn.Dropout(config.hidden_dropout_prob)

    def project(self, rel: Tensor, seq: int) -> tuple[Tensor | None, Tensor | None, int]:
        """R's rows that distances within `seq` reach, through K_r and Q_r and scaled like the content scores, once
        a layer for all its buckets: (pos_k, pos_q) each (heads, n, d) or None without its term, and the first
        row's number."""
        _, lo, n = _index(self.spec, seq, seq)
        r = self.pos_dropout(rel[lo: lo + n])
        pos_k = self._project(r, "pos_key_proj", "key") if "c2p" in self.spec.terms else None
        pos_q = self._project(r, "pos_query_proj", "query") if "p2c" in self.spec.terms else None
        return pos_k, pos_q, lo

    def forward(self, q: Tensor, k: Tensor, positions: tuple[Tensor | None, Tensor | None, int]) -> Tensor:
        """q (rows, heads, sq, d), k (rows, heads, sk, d) unscaled, `project`'s positions -> the bias
        (rows, heads, sq, sk). Heads lead the products: (heads, rows * len, d) is a view of the fused Q/K/V output,
        where (rows, heads, ...) batches would be copied first."""
        (b, h, sq, d), sk = q.shape, k.shape[-2]
        pos_k, pos_q, lo = positions
        index, first, _ = _index(self.spec, sq, sk)
        index = (index + (first - lo) if first != lo else index).to(q.device)   # into the projected rows
        bias = 0
        if pos_k is not None:                                               # content -> position
            c2p = torch.bmm(q.transpose(0, 1).reshape(h, b * sq, d), pos_k.transpose(-1, -2))
            bias = c2p.view(h, b, sq, -1).gather(-1, index.expand(h, b, sq, sk))
        if pos_q is not None:                                               # position -> content
            p2c = torch.bmm(k.transpose(0, 1).reshape(h, b * sk, d), pos_q.transpose(-1, -2))
            bias = bias + p2c.view(h, b, sk, -1).gather(-1, index.t().expand(h, b, sk, sq)).transpose(-1, -2)
        return bias.transpose(0, 1)

    def _project(self, r: Tensor, own: str, shared: str) -> Tensor:
        linear = getattr(self.owner, shared) if self.spec.share_att_key else getattr(self, own)
        return (linear(r) * self.scale).view(r.shape[0], self.heads, -1).transpose(0, 1)   # (heads, n, d)


@functools.lru_cache(maxsize=256)
def _index(spec: Disentangled, sq: int, sk: int) -> tuple[Tensor, int, int]:
    """The (sq, sk) rows of R for query i, key j: span + bucket(i - j), clamped, less the first row used `lo`; and
    how many rows from `lo` on are used. On the host, once per shape: the distances are sq + sk - 1 values."""
    d = torch.arange(-(sk - 1), sq)                                         # every distance i - j
    b = log_bucket(d, spec.buckets, spec.max_position) if spec.buckets > 0 else d
    table = (b + spec.span).clamp(0, 2 * spec.span - 1)
    lo, hi = int(table.min()), int(table.max())
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    return table[i - j + sk - 1] - lo, lo, hi - lo + 1
