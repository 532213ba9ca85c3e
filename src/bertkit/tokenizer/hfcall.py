"""What transformers' tokenizer callers expect of a result: BatchEncoding (a dict with attribute access, .to(device),
.word_ids(i), .sequence_ids(i)), words given pre-split (is_split_into_words), windows over long inputs
(return_overflowing_tokens with stride), and pad() of encodings made earlier."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertkit.errors import BertkitError
from bertkit.tokenizer.inputs import cut


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
        return self._layout_of("word_ids").word_ids(batch_index)

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        """Per token, 0 for the text, 1 for the pair, None for special tokens and padding."""
        return self._layout_of("sequence_ids").sequence_ids(batch_index)

    def _layout_of(self, what: str) -> "_Layout":
        if getattr(self, "_layout", None) is None:
            raise ValueError(f"{what}() needs an encoding made by the tokenizer call")
        return _Layout(*self._layout)


class _Layout:
    """Enough to rebuild word ids: the rows as laid out, the kept lengths of a and b per row, and each piece's word
    per sequence where the pieces came with them (the tokenizers library's, is_split_into_words, or windows)."""

    def __init__(self, tokenizer, ids, lengths, special: bool, words, side: str):
        self.tokenizer, self.ids, self.lengths, self.special, self.words = tokenizer, ids, lengths, special, words
        self.left = side == "left"          # where the call padded

    def _row(self, i: int) -> list[int]:
        flat = isinstance(self.ids, list) and (not self.ids or isinstance(self.ids[0], int))   # an unbatched call
        ids = self.ids if flat else self.ids[i]
        return ids.tolist() if hasattr(ids, "tolist") else ids

    def _place(self, row: list[int], a: list, b: list | None) -> list:
        """Values of a's and b's tokens laid out as the row is: None at the specials and the padding."""
        out = self.tokenizer.template.wrap(a, b, None) if self.special else [*a, *(b or ())]
        pad = [None] * (len(row) - len(out))
        return pad + out if self.left else out + pad

    def word_ids(self, i: int) -> list[int | None]:
        row = self._row(i)
        na, nb = self.lengths[i]
        real = len(self._place([], [0] * na, None if nb is None else [0] * nb))        # the row less its padding
        start = len(row) - real if self.left else 0
        a_start = start + (len(self.tokenizer.template.single[0]) if self.special else 0)
        a = self._words(i, 0, row[a_start:a_start + na])
        b = None
        if nb is not None:
            b_start = start + (self.tokenizer.template.first_len(na) if self.special else na)
            b = self._words(i, 1, row[b_start:b_start + nb])
        return self._place(row, a, b)

    def sequence_ids(self, i: int) -> list[int | None]:
        na, nb = self.lengths[i]
        return self._place(self._row(i), [0] * na, None if nb is None else [1] * nb)

    def _words(self, i: int, part: int, ids: list[int]) -> list[int]:
        if self.words is not None:     # each piece's word before truncation: the kept pieces' are the cut's
            return cut(self.words[i][part], len(ids), self.tokenizer.truncation_side)
        return word_ids(self.tokenizer.continues_word(ids))


def word_ids(continues: Sequence[bool | None]) -> list[int | None]:
    """The word of each position, from whether its piece continues the word before it (the tokenizer's
    `continues_word`); None stays None (a special or padding position)."""
    out: list[int | None] = []
    word = -1
    for c in continues:
        if c is not None and not (c and word >= 0):      # a piece that starts a word, or the first piece
            word += 1
        out.append(None if c is None else word)
    return out


def uncut_words(tokenizer, first, second) -> list[tuple[list, list]]:
    """Each piece's word in the sequences (first and second, per row) before truncation cuts them."""
    return [(word_ids(tokenizer.continues_word(a)), word_ids(tokenizer.continues_word(second[i][0])) if second else [])
            for i, (a, _) in enumerate(first)]


def overflow(tokenizer, first, second, words, cut, stride: int):
    """return_overflowing_tokens: every input as windows of the sequences truncation cuts, `stride` pieces shared by
    neighbours, in the tokenizers library's order (the first windows of both, then each later window of the text
    with every window of the pair, then the first text window with each later pair window). `cut(na, nb)` gives the
    window lengths. Returns the rows' pieces (first, second), their words and each row's input index."""
    rows_a, rows_b, rows_w, mapping = [], [] if second is not None else None, [], []
    words = words if words is not None else uncut_words(tokenizer, first, second)
    for i, a in enumerate(first):
        b = second[i] if second is not None else ([], None)
        na, nb = cut(len(a[0]), None if second is None else len(b[0]))
        wa, wb = _windows(len(a[0]), na, stride), _windows(len(b[0]), nb, stride)
        w = words[i]
        for x, y in [(wa[0], wb[0]), *((x, y) for x in wa[1:] for y in wb), *((wa[0], y) for y in wb[1:])]:
            rows_a.append(tuple(None if p is None else p[x] for p in a))
            if rows_b is not None:
                rows_b.append(tuple(None if p is None else p[y] for p in b))
            rows_w.append((w[0][x], w[1][y]))
            mapping.append(i)
    return rows_a, rows_b, rows_w, mapping


def _windows(n: int, keep: int, stride: int) -> list[slice]:
    """[0, keep), then windows `keep - stride` further on until the last reaches n; one window where nothing is cut."""
    if keep >= n:
        return [slice(0, n)]
    if not 0 <= stride < keep:
        raise BertkitError(f"stride={stride} must be at least 0 and less than the {keep} tokens a window of the "
                           f"truncated sequence holds (max_length less the specials and the other sequence)")
    starts = range(0, n - stride, keep - stride)
    return [slice(s, min(s + keep, n)) for s in starts]


def split_words_pieces(tokenizer, sequences: Sequence[Sequence[str]], offsets: bool):
    """Pieces of pre-split words, per sequence, and each piece's word index (offsets are within each word, as
    transformers gives them)."""
    flat = [w for seq in sequences for w in tokenizer._check_batch(seq, "words")]
    per_word = iter(tokenizer._pieces_batch(flat, offsets))
    pieces, words = [], []
    for seq in sequences:
        mine = [next(per_word) for _ in seq]        # (ids, offsets) of each word of this sequence
        pieces.append(([i for ids, _ in mine for i in ids], [o for _, offs in mine for o in offs] if offsets else None))
        words.append([j for j, (ids, _) in enumerate(mine) for _ in ids])
    return pieces, words


_PADDED = ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask")   # pad() pads these keys only


def pad_encodings(tokenizer, encodings, how: tuple, return_tensors) -> BatchEncoding:
    """Tokenizer.pad: encodings made earlier, padded as one batch (`how`: Tokenizer._pad's padding, max_length,
    multiple and side); other keys (labels, ...) kept as they are, made tensors with the rest."""
    if isinstance(encodings, dict):
        batch = dict(encodings)
    else:
        encodings = list(encodings)
        if any("input_ids" not in e for e in encodings):
            raise BertkitError("pad: every encoding needs input_ids")
        batch = {k: [e[k] for e in encodings] for k in encodings[0]} if encodings else {}
    rows = {k: [list(as_id_list(r)) for r in batch[k]] for k in _PADDED if k in batch}
    ids = rows.get("input_ids", [])
    rows.setdefault("attention_mask", [[1] * len(x) for x in ids])
    types = rows.get("token_type_ids", [[0] * len(x) for x in ids])
    tokenizer._pad((ids, types, rows["attention_mask"], None, rows.get("special_tokens_mask")), *how)
    result = {**batch, **rows}
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
    if kind == "pt":
        import torch
    out = {}
    for k, v in result.items():
        if k in _PADDED or k in ("offsets", "offset_mapping", "overflow_to_sample_mapping"):
            arr = np.asarray(v, dtype=np.int64)
            arr = arr.reshape(len(v), -1, 2) if k == "offsets" else arr
            out[k] = torch.from_numpy(arr) if kind == "pt" else arr
        else:                                       # labels and the like: their own dtype, as transformers makes them
            out[k] = torch.as_tensor(v) if kind == "pt" else np.asarray(v)
    return out


def as_id_list(ids) -> list[int]:
    if hasattr(ids, "tolist"):  # torch / numpy
        ids = ids.tolist()
    return [ids] if isinstance(ids, int) else list(ids)     # decode(101): one id, as transformers takes it
