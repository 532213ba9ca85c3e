"""Model inputs, laid out in one place: where the special tokens go, token types, attention masks, padding.

Every caller that turns pieces into what the model reads goes through these (the tokenizer call, task features, QA
windows, pre-training examples and shard batches, ONNX sample inputs), so the layout is written once:

    Template                        a tokenizer's layout (`tok.template`): the specials before a, after a, between a
                                    and b, after b, with the token type of each part; BERT's [CLS] a [SEP] (b [SEP])
                                    types 0/1, RoBERTa's <s> a </s> (</s> b </s>) all 0, ...; .wrap / .types /
                                    .wrap_array as below, for any layout
    wrap_array(a, b, cls, sep)      [CLS] a [SEP] (b [SEP]) as int32 numpy rows (pre-training builds millions of them)
    pad_batch(rows, types, pad_id)  ragged rows -> (batch, seq) input_ids / token_type_ids / attention_mask tensors
    row_masks(length, a_len, seq)   stored rows of known lengths -> (batch, seq) attention and token-type masks
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = ["Template", "pad_batch", "row_masks", "wrap_array"]

_IDS = object()  # wrap's default fill: the special tokens' own ids


@dataclass(frozen=True)
class Template:
    """Where a tokenizer's special tokens go around one sequence (before a, after a) or a pair (before a, between a
    and b, after b), and their token types: one per special, and one for each of a and b."""
    single: tuple[tuple[int, ...], tuple[int, ...]]
    pair: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    single_types: tuple[tuple[int, ...], int, tuple[int, ...]]
    pair_types: tuple[tuple[int, ...], int, tuple[int, ...], int, tuple[int, ...]]
    # every row of a tokenizer call lays out through here: the specials replaced by each fill, kept once
    _filled: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def bert(cls, cls_id: int, sep_id: int) -> "Template":
        """[CLS] a [SEP] (b [SEP]): types 0 through the first [SEP], 1 for b and its [SEP]."""
        return cls(((cls_id,), (sep_id,)), ((cls_id,), (sep_id,), (sep_id,)), ((0,), 0, (0,)),
                   ((0,), 0, (0,), 1, (1,)))

    @classmethod
    def none(cls) -> "Template":
        """No special tokens: a, or a b (types 0 / 1)."""
        return cls(((), ()), ((), (), ()), ((), 0, ()), ((), 0, (), 1, ()))

    def n_special(self, pair: bool) -> int:
        return sum(map(len, self.pair if pair else self.single))

    def wrap(self, a: Sequence, b: Sequence | None = None, fill=_IDS) -> list:
        """The specials around a (and b) as one list; `fill` replaces each special (offsets, labels, word ids)."""
        parts = self.single if b is None else self.pair
        if fill is not _IDS:
            key = (fill, b is None)
            if key not in self._filled:
                self._filled[key] = [[fill] * len(p) for p in parts]
            parts = self._filled[key]
        if b is None:
            return [*parts[0], *a, *parts[1]]
        return [*parts[0], *a, *parts[1], *b, *parts[2]]

    def types(self, len_a: int, len_b: int | None = None) -> list[int]:
        """Token types of wrap(a, b)."""
        if len_b is None:
            pre, ta, post = self.single_types
            return [*pre, *[ta] * len_a, *post]
        pre, ta, mid, tb, post = self.pair_types
        if pre + mid == (ta,) * len(pre + mid) and post == (tb,) * len(post):  # BERT's, RoBERTa's: two runs
            return [ta] * (len(pre) + len_a + len(mid)) + [tb] * (len_b + len(post))
        return [*pre, *[ta] * len_a, *mid, *[tb] * len_b, *post]

    def wrap_array(self, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """wrap() for numpy piece arrays, as one int32 row."""
        parts = self.wrap([a], None if b is None else [b], fill=_IDS)
        return np.concatenate([np.asarray(p, dtype=np.int32).reshape(-1) for p in parts])

    def first_len(self, len_a: int) -> int:
        """Tokens before b in a pair's row (the specials before a, a, and those between a and b)."""
        return len(self.pair[0]) + len_a + len(self.pair[1])


def wrap_array(a: np.ndarray, b: np.ndarray | None, cls: int, sep: int) -> np.ndarray:
    """[CLS] a [SEP] (b [SEP]) of numpy piece arrays: (len_a,), (len_b,) -> (len_a + len_b + 3,) int32 (or len_a + 2
    without b)."""
    n = len(a) + 2 + (0 if b is None else len(b) + 1)
    row = np.empty(n, dtype=np.int32)
    row[0], row[1:1 + len(a)], row[1 + len(a)] = cls, a, sep
    if b is not None:
        row[2 + len(a):-1], row[-1] = b, sep
    return row


def pad_batch(rows: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None, pad_id: int,
              multiple_of: int | None = None, device=None) -> dict:
    """Ragged rows -> {"input_ids", "token_type_ids", "attention_mask"}: (batch, seq) long tensors padded to the
    longest row (rounded up to `multiple_of`); padding has id `pad_id`, type 0 and mask 0. `types=None`: all 0."""
    import torch

    longest = max(len(r) for r in rows)
    seq = -(-longest // multiple_of) * multiple_of if multiple_of else longest
    ids = torch.full((len(rows), seq), pad_id, dtype=torch.long)
    tt = torch.zeros((len(rows), seq), dtype=torch.long)
    mask = torch.zeros((len(rows), seq), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r)
        ids[i, :n] = torch.as_tensor(r)
        if types is not None and types[i] is not None:
            tt[i, :n] = torch.as_tensor(types[i])
        mask[i, :n] = 1
    out = {"input_ids": ids, "token_type_ids": tt, "attention_mask": mask}
    return {k: v.to(device) for k, v in out.items()} if device is not None else out


def row_masks(length: np.ndarray, a_len: np.ndarray, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows stored as (length, length of [CLS] a [SEP]) -> attention (True = a real token) and token types (True =
    segment b), both (batch, seq) bool."""
    cols = np.arange(seq)[None, :]
    attention = cols < length[:, None]
    return attention, (cols >= a_len[:, None]) & attention
