"""The layout of model inputs (tokenizer/inputs.py) equals what the tokenizer call returns, for every caller."""

from __future__ import annotations

import numpy as np
import torch

from bertkit import Tokenizer
from bertkit.tokenizer.inputs import pad_batch, row_masks, wrap_array

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "a", "mat", "##s", "dog"]


def _tok() -> Tokenizer:
    return Tokenizer({t: i for i, t in enumerate(VOCAB)})


def test_wrap_and_types_equal_the_tokenizer_call():
    tok = _tok()
    texts, pairs = ["the cat sat", "a dog"], ["on a mat", "the mats on the mat"]
    enc = tok(texts, pairs)
    for i, (a, b) in enumerate(zip(texts, pairs)):
        pa, pb = (tok.convert_tokens_to_ids(tok.tokenize(x)) for x in (a, b))
        assert tok.template.wrap(pa, pb) == enc["input_ids"][i]
        assert tok.template.types(len(pa), len(pb)) == enc["token_type_ids"][i]
        assert tok.template.wrap(pa) == tok(a)["input_ids"]
        assert tok.template.types(len(pa)) == tok(a)["token_type_ids"]
        assert wrap_array(np.array(pa), np.array(pb), tok.cls_token_id, tok.sep_token_id).tolist() == enc["input_ids"][i]


def test_pad_batch_equals_the_padded_call():
    tok = _tok()
    texts, pairs = ["the cat sat on a mat", "a dog", "cats"], ["the mat", "on a mat", "dog"]
    enc = tok(texts, pairs, padding=True, return_tensors="pt")
    plain = tok(texts, pairs)
    got = pad_batch(plain["input_ids"], plain["token_type_ids"], tok.pad_token_id)
    for k in ("input_ids", "token_type_ids", "attention_mask"):
        assert torch.equal(got[k], enc[k]), k
    eight = pad_batch(plain["input_ids"], None, tok.pad_token_id, multiple_of=8)
    assert eight["input_ids"].shape[1] % 8 == 0 and not eight["token_type_ids"].any()
    assert torch.equal(eight["attention_mask"].sum(1), enc["attention_mask"].sum(1))
    longest = enc["input_ids"].shape[1]                  # 11 pieces: 16 rounded, but the model takes only 12
    assert pad_batch(plain["input_ids"], None, tok.pad_token_id, 8, cap=longest + 1)["input_ids"].shape[1] == longest + 1


def test_row_masks_match_stored_lengths():
    length, a_len = np.array([5, 3, 7]), np.array([3, 3, 4])
    attention, types = row_masks(length, a_len, 8)
    assert attention.sum(1).tolist() == [5, 3, 7]
    assert types.tolist()[0] == [False] * 3 + [True] * 2 + [False] * 3
    assert not types[1].any() and types[2].sum() == 3
