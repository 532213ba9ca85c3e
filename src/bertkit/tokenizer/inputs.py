"""Model inputs, laid out in one place: where the special tokens go, token types, attention masks, padding. Every
caller that turns pieces into what the model reads goes through these (the tokenizer call, task features, QA
windows, pre-training examples and shard batches, ONNX sample inputs), so the layout is written once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from bertkit.errors import BertkitError

__all__ = ["Template", "pad_batch", "row_masks", "wrap_array", "cut", "SIDES", "TRUNCATION_STRATEGIES",
           "truncation_strategy", "truncated_lengths"]

TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
SIDES = ("right", "left")    # padding_side / truncation_side: where padding goes, which end truncation cuts

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

    def first_len(self, len_a: int) -> int:
        """Tokens before b in a pair's row (the specials before a, a, and those between a and b)."""
        return len(self.pair[0]) + len_a + len(self.pair[1])


def truncation_strategy(truncation, max_length, padding) -> str | None:
    """None (no truncation) or one of TRUNCATION_STRATEGIES, from the user's `truncation` argument. Unset, it
    means longest_first when max_length is given without padding (BertTokenizerFast's rule)."""
    if truncation is None:
        unpadded = padding is False or padding is None or padding == "do_not_pad"
        return "longest_first" if max_length is not None and unpadded else None
    if truncation is False or truncation == "do_not_truncate":
        return None
    if max_length is None:
        return None  # nothing to truncate to (BertTokenizerFast would use the model's max length)
    if truncation is True:
        return "longest_first"
    if truncation in TRUNCATION_STRATEGIES:
        return truncation
    raise BertkitError(f"truncation must be a bool or one of {', '.join(TRUNCATION_STRATEGIES)}, got {truncation!r}")


def truncated_lengths(na: int, nb: int | None, max_length: int, strategy: str, n_special: int) -> tuple[int, int]:
    """Lengths (first, second) after truncating so that, with the n_special [CLS]/[SEP] tokens, the input fits
    max_length. longest_first cuts the longer sequence down to the shorter one, then both alternately; when both must
    be cut to the same length and one token is left over it goes to the longer (to the second on a tie)."""
    budget = max_length - n_special
    nb0 = nb or 0
    if budget < 0:
        return na, nb0  # BertTokenizerFast leaves the inputs untruncated when max_length < the special tokens
    if budget == 0:
        return 0, 0
    excess = na + nb0 - budget
    if excess <= 0:
        return na, nb0
    if strategy == "longest_first":
        if nb is None:
            return budget, 0
        short, long_ = min(na, nb), max(na, nb)
        half = budget // 2
        if short > half:
            short, long_ = half, budget - half
        else:
            long_ = budget - short
        return (long_, short) if na > nb else (short, long_)
    if strategy == "only_first":
        if na <= excess:
            raise BertkitError(f"truncation='only_first' cannot fit max_length={max_length}: the first sequence "
                             f"has {na} tokens but {excess} must go")
        return na - excess, nb0
    # only_second
    if nb is None:
        raise BertkitError("truncation='only_second' needs a pair, but no second sequence was given")
    if nb <= excess:
        raise BertkitError(f"truncation='only_second' cannot fit max_length={max_length}: the second sequence "
                         f"has {nb} tokens but {excess} must go")
    return na, nb - excess


def cut(seq, keep: int, side: str = "right"):
    """What truncation to `keep` items leaves of seq: the first ones, or the last ones where side is "left" (the
    tokenizer's truncation_side; serve's truncation_direction)."""
    return seq[max(len(seq) - keep, 0):] if side == "left" else seq[:keep]


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
              multiple_of: int | None = None, device=None, cap: int | None = None) -> dict:
    """Ragged rows -> {"input_ids", "token_type_ids", "attention_mask"}: (batch, seq) long tensors padded to the
    longest row (rounded up to `multiple_of`, but not past `cap`: the longest input the model takes); padding has
    id `pad_id`, type 0 and mask 0. `types=None`: all 0."""
    import torch

    longest = max(len(r) for r in rows)
    seq = -(-longest // multiple_of) * multiple_of if multiple_of else longest
    seq = max(longest, min(seq, cap)) if cap else seq
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
