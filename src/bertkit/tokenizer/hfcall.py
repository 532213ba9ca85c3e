"""What transformers' tokenizer callers expect of a result: BatchEncoding (a dict with attribute access, .to(device),
.word_ids(i)), words given pre-split (is_split_into_words), and pad() of encodings made earlier."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertkit.errors import BertkitError


class BatchEncoding(dict):
    """Model inputs as a dict (input_ids, token_type_ids, attention_mask[, offsets / offset_mapping]) that also
    reads as attributes (enc.input_ids), moves its tensors with .to(device) and maps tokens to words (word_ids)."""

    __slots__ = ("_layout",)  # _Layout's arguments, set by the tokenizer call; a slot is cheaper than a __dict__

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"BatchEncoding has no {name!r} (keys: {', '.join(self)})") from None

    def __reduce__(self):  # pickles as its data alone: shipping the tokenizer with every batch would be costly
        return BatchEncoding, (dict(self),)

    def to(self, device) -> "BatchEncoding":
        """Move every tensor to device (torch's .to); lists are left as they are."""
        for k, v in self.items():
            if hasattr(v, "to"):
                self[k] = v.to(device)
        return self

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        """Per token, the index of the word it comes from within its sequence (text or pair); None for [CLS],
        [SEP] and padding. Words are the pre-tokenizer's (punctuation is a word), or the caller's with
        is_split_into_words."""
        if getattr(self, "_layout", None) is None:
            raise ValueError("word_ids() needs an encoding made by the tokenizer call")
        return _Layout(*self._layout).word_ids(batch_index)


class _Layout:
    """Enough to rebuild word ids: the rows as laid out, the kept lengths of a and b per row, and each piece's word
    per sequence where the pieces came with them (the tokenizers library's, or is_split_into_words)."""

    def __init__(self, tokenizer, ids, lengths, special: bool, words):
        self.tokenizer, self.ids, self.lengths, self.special, self.words = tokenizer, ids, lengths, special, words

    def word_ids(self, i: int) -> list[int | None]:
        flat = isinstance(self.ids, list) and (not self.ids or isinstance(self.ids[0], int))   # an unbatched call
        ids = self.ids if flat else self.ids[i]
        row = ids.tolist() if hasattr(ids, "tolist") else ids
        na, nb = self.lengths[i]
        start = len(self.tokenizer.template.single[0]) if self.special else 0
        a = self._words(i, 0, row[start:start + na])
        b = None
        if nb is not None:
            b_start = self.tokenizer.template.first_len(na) if self.special else na
            b = self._words(i, 1, row[b_start:b_start + nb])
        out = self.tokenizer.template.wrap(a, b, None) if self.special else [*a, *(b or ())]
        return out + [None] * (len(row) - len(out))

    def _words(self, i: int, part: int, ids: list[int]) -> list[int]:
        if self.words is not None:
            return self.words[i][part][:len(ids)]
        word, out = -1, []
        for k, continues in enumerate(self.tokenizer.continues_word(ids)):
            if not continues or k == 0:  # a continuation piece never starts a word
                word += 1
            out.append(word)
        return out


def split_words_pieces(tokenizer, sequences: Sequence[Sequence[str]], offsets: bool):
    """Pieces of pre-split words, per sequence, and each piece's word index (offsets are within each word, as
    transformers gives them)."""
    flat = [w for seq in sequences for w in tokenizer._check_batch(seq, "words")]
    per_word = tokenizer._pieces_batch(flat, offsets)
    pieces, words, k = [], [], 0
    for seq in sequences:
        ids, offs, wids = [], [] if offsets else None, []
        for j in range(len(seq)):
            w_ids, w_offs = per_word[k]
            k += 1
            ids += w_ids
            wids += [j] * len(w_ids)
            if offsets:
                offs += w_offs
        pieces.append((ids, offs))
        words.append(wids)
    return pieces, words


def pad_encodings(tokenizer, encodings, padding, max_length, pad_to_multiple_of, return_tensors) -> BatchEncoding:
    """Tokenizer.pad: encodings made earlier, padded as one batch."""
    if isinstance(encodings, dict):
        batch = {k: [list(as_id_list(r)) for r in v] for k, v in encodings.items()}
    else:
        encodings = list(encodings)
        if any("input_ids" not in e for e in encodings):
            raise BertkitError("pad: every encoding needs input_ids")
        batch = {k: [list(as_id_list(e[k])) for e in encodings] for k in encodings[0]} if encodings else {}
    ids = batch.get("input_ids", [])
    types = batch.get("token_type_ids", [[0] * len(x) for x in ids])
    mask = batch.get("attention_mask", [[1] * len(x) for x in ids])
    tokenizer._pad(ids, types, mask, None, padding, max_length, pad_to_multiple_of)
    result = {"input_ids": ids, **({"token_type_ids": types} if "token_type_ids" in batch else {}),
              "attention_mask": mask}
    if return_tensors is not None:
        result = to_tensors(result, return_tensors)
    return BatchEncoding(result)


def hf_text_args(texts, pairs, text, text_pair):
    """bertkit's (texts, pairs) from either spelling; transformers calls them text= and text_pair=."""
    if text is not None:
        if texts is not None:
            raise BertkitError("pass the text once: positionally or as text=, not both")
        texts = text
    if text_pair is not None:
        if pairs is not None:
            raise BertkitError("pass the pair once: as pairs= or as text_pair=, not both")
        pairs = text_pair
    if texts is None:
        raise TypeError("Tokenizer call needs a text (or a list of texts), got NoneType")
    return texts, pairs


def to_tensors(result: dict, kind: str) -> dict:
    if kind not in ("pt", "np"):
        raise BertkitError(f"return_tensors must be 'pt' or 'np', got {kind!r}")
    lengths = {len(x) for x in result["input_ids"]}
    if len(lengths) > 1:
        raise BertkitError("cannot make tensors from sequences of different lengths "
                         f"({min(lengths)}..{max(lengths)}): pass padding=True or padding='max_length'")
    out = {}
    for k, v in result.items():
        arr = np.asarray(v, dtype=np.int64)
        if k == "offsets":
            arr = arr.reshape(len(v), -1, 2)
        out[k] = arr
    if kind == "pt":
        import torch
        out = {k: torch.from_numpy(v) for k, v in out.items()}
    return out


def as_id_list(ids) -> list[int]:
    if hasattr(ids, "tolist"):  # torch / numpy
        ids = ids.tolist()
    return [ids] if isinstance(ids, int) else list(ids)     # decode(101): one id, as transformers takes it
