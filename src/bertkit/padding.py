"""Padding: the one module that reads the attention mask.

A padded batch is (batch, seq) ids plus a 0/1 attention mask. The encoder runs it in one of two layouts:

    padded     hidden states (batch, seq, hidden); attention takes a (batch, 1, 1, seq) bool key mask
    unpadded   hidden states (tokens, hidden), real tokens only (MosaicBERT's `unpad_input`); every dense op runs
               on real tokens, and only attention needs sequence structure: the rows are sorted by length into
               buckets (`length_buckets`, `cost_buckets`), each a (rows, length) grid where every sequence is a left-aligned prefix

`Layout.build` once per forward; `unpad` / `pad` and `to_buckets` / `from_buckets` move between the shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Bucket", "Layout", "Rows", "cost_buckets", "fill", "length_buckets"]


def fill(attention_mask: Tensor | None) -> float:
    """The share of real tokens in the padded batch (1.0 without a mask)."""
    if attention_mask is None:
        return 1.0
    return float(attention_mask.sum()) / max(attention_mask.numel(), 1)


def length_buckets(batch: int) -> int:
    """How many attention buckets an unpadded batch of `batch` sequences is split into (equal row counts, each
    padded to its own longest row). One below 32 rows: the per-bucket launch cost outweighs the saved padding."""
    return 1 if batch < 32 else 2 if batch < 64 else 4


MAX_COST_BUCKETS = 32


def cost_buckets(sorted_len: list[int], overhead: float) -> int:
    """The bucket count k (equal row counts) minimising the modelled attention cost of lengths `sorted_len`
    (descending): sum over buckets of rows * length^2, plus `overhead` (a bucket's fixed cost, in the same
    row * length^2 units) per bucket."""
    n = len(sorted_len)
    best, best_k = math.inf, 1
    for k in range(1, min(n, MAX_COST_BUCKETS) + 1):
        bounds = [round(i * n / k) for i in range(k + 1)]
        cost = k * overhead + sum((hi - lo) * sorted_len[lo] ** 2 for lo, hi in zip(bounds[:-1], bounds[1:]))
        if cost < best:
            best, best_k = cost, k
    return best_k


@dataclass
class Bucket:
    """`rows` sequences of up to `length` tokens stored at `offset` of the flat bucket grid; `mask` is the
    (rows, 1, 1, length) bool key mask, None when every row is full."""
    offset: int
    rows: int
    length: int
    mask: Tensor | None


@dataclass
class Rows:
    """The last layer's output rows a caller reads: `index` (n,) rows of the layer's (rows, hidden) view (flat
    batch * seq positions, or packed token indices; `Layout.rows_of` maps one to the other), or None for each
    sequence's first position ([CLS]), which lets attention run one query per sequence."""
    index: Tensor | None = None

    @property
    def first_only(self) -> bool:
        return self.index is None


@dataclass
class Layout:
    """How one batch is laid out for the encoder layers (see the module docstring). For "unpadded": `indices`
    (tokens,) are the real tokens' flat positions in the (batch * seq) grid; `grid_index` (tokens,) each token's slot
    in the flat bucket grid of `grid_size` slots; `cu_seqlens` (batch + 1,) the cumulative lengths."""
    kind: str
    batch: int
    seq: int
    mask: Tensor | None = None
    indices: Tensor | None = None
    grid_index: Tensor | None = None
    grid_size: int = 0
    buckets: tuple[Bucket, ...] = ()
    cu_seqlens: Tensor | None = None

    @property
    def unpadded(self) -> bool:
        return self.kind == "unpadded"

    @classmethod
    def build(cls, kind: str, attention_mask: Tensor | None, batch: int, seq: int,
              device: torch.device | None = None, drop_full_mask: bool = False,
              bucket_overhead: float | None = None) -> "Layout":
        """kind "padded" or "unpadded". drop_full_mask: a padded batch with no padding gets no mask at all (so SDPA
        takes its unmasked kernel); only worth its host sync on CPU. bucket_overhead: unpadded attention buckets by
        `cost_buckets` with this per-bucket cost (row * length^2 units); None: `length_buckets`."""
        if kind != "unpadded":
            if attention_mask is None:
                return cls(kind, batch, seq)
            mask = attention_mask.bool()
            if drop_full_mask and bool(mask.all()):
                return cls(kind, batch, seq)
            return cls(kind, batch, seq, mask=mask[:, None, None, :])
        if attention_mask is None:
            attention_mask = torch.ones(batch, seq, dtype=torch.bool, device=device)
        return cls._unpadded(attention_mask.bool(), batch, seq, bucket_overhead)

    @classmethod
    def _unpadded(cls, mask: Tensor, batch: int, seq: int, bucket_overhead: float | None) -> "Layout":
        lengths = mask.sum(1)                                          # (batch,)
        indices = mask.reshape(-1).nonzero().squeeze(1)                # (tokens,)
        rank = mask.cumsum(1, dtype=torch.long) - 1                    # position of each token inside its row
        cu = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
        order = torch.argsort(lengths, descending=True, stable=True)   # (batch,) rows by decreasing length
        sorted_len = lengths[order].tolist()                           # the one host sync: bucket shapes
        k = min(length_buckets(batch), batch) if bucket_overhead is None else cost_buckets(sorted_len, bucket_overhead)
        bounds = [round(i * batch / k) for i in range(k + 1)]
        buckets, base_sorted, offset = [], [], 0
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            # a row of padding only has no token: it keeps one zero slot, so a grid of such rows has a shape and
            # its attention a key (never a row of NaN); nothing is read back from that slot
            n, length = hi - lo, max(sorted_len[lo], 1)
            bmask = None
            if sorted_len[hi - 1] != length:
                blen = lengths[order[lo:hi]].clamp(min=1)
                bmask = (torch.arange(length, device=mask.device)[None, :] < blen[:, None])[:, None, None, :]
            buckets.append(Bucket(offset, n, length, bmask))
            base_sorted += [offset + j * length for j in range(n)]
            offset += n * length
        base = torch.empty(batch, dtype=torch.long, device=mask.device)
        base[order] = torch.tensor(base_sorted, dtype=torch.long, device=mask.device)   # (batch,) row -> slot 0
        grid_index = base[indices // seq] + rank.reshape(-1)[indices]  # (tokens,)
        return cls("unpadded", batch, seq, indices=indices, grid_index=grid_index, grid_size=offset,
                   buckets=tuple(buckets), cu_seqlens=cu)

    def unpad(self, t: Tensor | None) -> Tensor | None:
        """(batch, seq, ...) -> (tokens, ...) for "unpadded"; identity for "padded"."""
        if t is None or not self.unpadded:
            return t
        return t.reshape(self.batch * self.seq, *t.shape[2:]).index_select(0, self.indices)

    def positions(self, device: torch.device) -> Tensor:
        """Position ids: (seq,) for "padded" (broadcast over the batch), (tokens,) for "unpadded"."""
        if self.unpadded:
            return self.indices % self.seq
        return torch.arange(self.seq, device=device)

    def key_mask(self) -> Tensor | None:
        """The (batch, 1, 1, seq) bool key mask of the padded grid (True = real token), None when nothing is padded."""
        if not self.unpadded:
            return self.mask
        if self.indices.numel() == self.batch * self.seq:
            return None
        m = torch.zeros(self.batch * self.seq, dtype=torch.bool, device=self.indices.device)
        return m.index_fill(0, self.indices, True).view(self.batch, 1, 1, self.seq)

    def first_rows(self, x: Tensor) -> Tensor:
        """Each sequence's position 0: (batch, seq, hidden) or packed (tokens, hidden) -> (batch, hidden). Packed,
        this is each row's first real token, position 0 when every row starts with one (`starts_full`)."""
        if not self.unpadded:
            return x[:, 0]
        return x.index_select(0, self.cu_seqlens[:-1].long())

    def rows_of(self, flat: Tensor) -> Tensor:
        """Flat (batch * seq) positions -> row indices in the layer's (rows, hidden) view; -1 for a padded position
        of an unpadded batch (it has no row)."""
        if not self.unpadded:
            return flat
        inv = torch.full((self.batch * self.seq,), -1, dtype=torch.long, device=self.indices.device)
        inv[self.indices] = torch.arange(self.indices.numel(), device=self.indices.device)
        return inv.index_select(0, flat)

    def pad(self, x: Tensor) -> Tensor:
        """(tokens, hidden) -> (batch, seq, hidden) with zeros at padded positions (identity when padded)."""
        if not self.unpadded:
            return x
        out = x.new_zeros(self.batch * self.seq, x.shape[-1])
        out.index_copy_(0, self.indices, x)                   # in place: no copy of the zeros
        return out.view(self.batch, self.seq, x.shape[-1])

    def select(self, x: Tensor, rows: Rows) -> Tensor:
        """x at `rows`: (batch, 1, hidden) for the first positions, else (n, hidden)."""
        if rows.first_only:
            return self.first_rows(x)[:, None]
        return x.reshape(-1, x.shape[-1]).index_select(0, rows.index)

    def to_buckets(self, x: Tensor) -> list[Tensor]:
        """Packed (tokens, d) -> one (rows, length, d) grid per bucket, zeros at padded slots (padded values must not
        be NaN: they meet a zero attention weight)."""
        grid = x.new_zeros(self.grid_size, x.shape[-1])
        grid.index_copy_(0, self.grid_index, x)
        return [grid[b.offset:b.offset + b.rows * b.length].view(b.rows, b.length, -1) for b in self.buckets]

    def from_buckets(self, grids: list[Tensor]) -> Tensor:
        """[(rows, length, ...)] -> packed (tokens, d), d the product of the trailing dims: the inverse of
        `to_buckets` on the real slots. Each grid, strided or not, is copied once into one buffer (no reshape, no cat)."""
        grid = grids[0].new_empty(self.grid_size, grids[0][0, 0].numel())
        for g, b in zip(grids, self.buckets):
            grid[b.offset:b.offset + b.rows * b.length].view(g.shape).copy_(g)
        return grid.index_select(0, self.grid_index)


def starts_full(attention_mask: Tensor | None) -> bool:
    """Whether every row's first position is a real token (what running [CLS] rows of a packed batch needs)."""
    return attention_mask is None or bool(attention_mask[:, 0].all())
