"""Model inputs, laid out in one place: where [CLS] and [SEP] go, token types, attention masks, padding.

Every caller that turns pieces into what the model reads goes through these (the tokenizer call, task features, QA
windows, pre-training examples and shard batches, ONNX sample inputs), so the layout is written once:

    wrap(a, b, cls, sep)            [CLS] a [SEP] (b [SEP]) as a list; the same call lays out offsets or labels
                                    aligned to the ids (cls = sep = (0, 0), or the ignore index)
    token_types(len_a, len_b)       0 for [CLS] a [SEP], 1 for b [SEP]
    wrap_array(a, b, cls, sep)      wrap for int32 numpy rows (pre-training builds millions of them)
    pad_batch(rows, types, pad_id)  ragged rows -> (batch, seq) input_ids / token_type_ids / attention_mask tensors
    row_masks(length, a_len, seq)   stored rows of known lengths -> (batch, seq) attention and token-type masks
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["pad_batch", "row_masks", "token_types", "wrap", "wrap_array"]


def wrap(a: Sequence, b: Sequence | None = None, cls=None, sep=None) -> list:
    """[CLS] a [SEP] (b [SEP]) as one list."""
    return [cls, *a, sep] if b is None else [cls, *a, sep, *b, sep]


def token_types(len_a: int, len_b: int | None = None) -> list[int]:
    """Token types of wrap(a, b): 0 through the first [SEP], 1 for b and its [SEP]."""
    return [0] * (len_a + 2) + ([1] * (len_b + 1) if len_b is not None else [])


def wrap_array(a: np.ndarray, b: np.ndarray | None, cls: int, sep: int) -> np.ndarray:
    """wrap() for numpy piece arrays: (len_a,), (len_b,) -> (len_a + len_b + 3,) int32 (or len_a + 2 without b)."""
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
