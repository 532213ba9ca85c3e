"""Masked-LM masking over id arrays: which positions to predict, and what the model sees there (token, whole-word
or n-gram units, 80-10-10; docs/pretraining.md, "Masking").

Randomness is counter-based, a splitmix64 hash of (row key, stream, position) with the row key a hash of (seed,
epoch, example index): a mask does not depend on batch size, rank or order, so dynamic masking is reproducible and
resumable, and the token mode is one vectorised pass over the batch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertkit.errors import ConfigError, VocabError
from bertkit.tokenizer import load_vocab

__all__ = ["MaskingConfig", "VocabTables", "mask_batch", "example_keys", "splitmix64", "MODES"]

MODES = ("token", "wwm", "ngram")


@dataclass
class MaskingConfig:
    mode: str = "token"              # token | wwm | ngram
    mask_prob: float = 0.15          # BERT's 15%; MosaicBERT found 30% better for short schedules
    max_predictions: int | None = None  # per row; None -> ceil(mask_prob * seq_len): 20 at 128 like BERT
    mask_token_prob: float = 0.8     # share of chosen positions shown as [MASK]
    random_token_prob: float = 0.1   # share shown as a random token; the rest keep their original token
    max_ngram: int = 3               # ngram mode: spans of 1..max_ngram whole words (ALBERT uses 3)
    dynamic: bool = False            # True: masks drawn at batch time, fresh every epoch (RoBERTa)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"masking mode {self.mode!r} is not one of {MODES}")
        if not 0.0 < self.mask_prob < 1.0:
            raise ConfigError(f"mask_prob={self.mask_prob} must be in (0, 1)")
        if not (0 <= self.mask_token_prob and 0 <= self.random_token_prob
                and self.mask_token_prob + self.random_token_prob <= 1.0):
            raise ConfigError(f"mask_token_prob={self.mask_token_prob} + random_token_prob={self.random_token_prob}"
                              " must be shares summing to at most 1")
        if self.max_ngram < 1:
            raise ConfigError(f"max_ngram={self.max_ngram} must be >= 1")

    def resolved_max_predictions(self, seq_len: int) -> int:
        if self.max_predictions is not None:
            if self.max_predictions < 1:
                raise ConfigError(f"max_predictions={self.max_predictions} must be >= 1")
            return self.max_predictions
        return math.ceil(self.mask_prob * seq_len)


# ----------------------------------------------------------------------------------------------- vocabulary tables

@dataclass
class VocabTables:
    """What masking needs to know about a vocabulary, as arrays indexed by token id."""
    never_mask: np.ndarray        # (V,) bool: special tokens (bracketed, or the tokenizer's own)
    continuation: np.ndarray      # (V,) bool: pieces that continue a word ("##", or the tokenizer's continues_word)
    random_ids: np.ndarray        # (R,) int64: ids a random replacement is drawn from (non-special tokens)
    mask_id: int
    pad_id: int
    cls_id: int
    sep_id: int

    @classmethod
    def from_tokens(cls, tokens: list[str]) -> "VocabTables":
        """A WordPiece vocab.txt's tokens ("##" continuations, bracketed specials)."""
        index = {t: i for i, t in enumerate(tokens)}
        for name in ("[PAD]", "[CLS]", "[SEP]", "[MASK]"):
            if name not in index:
                raise VocabError(f"vocabulary lacks the special token {name} that pre-training needs")
        return cls._build(tokens, np.array([t.startswith("##") for t in tokens], dtype=bool), (),
                          *(index[name] for name in ("[MASK]", "[PAD]", "[CLS]", "[SEP]")))

    @classmethod
    def from_tokenizer(cls, tok) -> "VocabTables":
        """Any tokenizer's: its special tokens, and per id whether the piece continues a word after a plain piece
        (its continues_word, asked of each id after one that is not special)."""
        ids = {n: getattr(tok, f"{n}_token_id", None) for n in ("mask", "pad", "cls", "sep", "unk", "bos", "eos")}
        missing = [n for n in ("mask", "pad", "cls", "sep") if ids[n] is None]
        if missing:
            raise VocabError(f"the tokenizer lacks the special token(s) {', '.join(missing)} that pre-training needs")
        specials = {i for i in ids.values() if i is not None}
        plain = next(i for i in range(tok.vocab_size) if i not in specials)
        probe = np.stack([np.full(tok.vocab_size, plain), np.arange(tok.vocab_size)], axis=1).ravel().tolist()
        cont = np.array(tok.continues_word(probe)[1::2], dtype=bool)
        return cls._build(tok.ids_to_tokens, cont, specials, ids["mask"], ids["pad"], ids["cls"], ids["sep"])

    @classmethod
    def _build(cls, tokens, cont, specials, mask_id, pad_id, cls_id, sep_id) -> "VocabTables":
        special = np.array([len(t) > 2 and t.startswith("[") and t.endswith("]") for t in tokens], dtype=bool)
        special[list(specials)] = True
        return cls(never_mask=special, continuation=cont & ~special,
                   random_ids=np.flatnonzero(~special).astype(np.int64),
                   mask_id=mask_id, pad_id=pad_id, cls_id=cls_id, sep_id=sep_id)

    @classmethod
    def from_vocab_file(cls, path: str | Path) -> "VocabTables":
        return cls.from_tokens(list(load_vocab(path)))

    @property
    def vocab_size(self) -> int:
        return len(self.never_mask)


# -------------------------------------------------------------------------------------------- counter-based random

_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a good 64-bit hash, elementwise (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def example_keys(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """(n,) uint64 keys for examples `indices` in `epoch` under `seed`: the only input a row's mask depends on."""
    base = splitmix64(splitmix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF)) ^ np.uint64(epoch & 0xFFFFFFFFFFFFFFFF))
    return splitmix64(base ^ np.asarray(indices, dtype=np.uint64))


def _uniform(keys: np.ndarray, stream: int, width: int | None = None) -> np.ndarray:
    """U[0,1) floats: (B,) when width is None, else (B, width); independent per (key, stream, column)."""
    k = splitmix64(keys ^ np.uint64(stream * 0x632BE59BD9B4E019 & 0xFFFFFFFFFFFFFFFF))
    if width is None:
        bits = splitmix64(k)
    else:
        cols = np.arange(1, width + 1, dtype=np.uint64) * _GOLD   # (width,)
        bits = splitmix64(k[:, None] ^ cols[None, :])                      # (B, width)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


_S_COUNT, _S_ORDER, _S_KIND, _S_RANDOM, _S_NGRAM = 1, 2, 3, 4, 5


# --------------------------------------------------------------------------------------------------------- masking

def mask_batch(tokens: np.ndarray, lengths: np.ndarray, keys: np.ndarray, cfg: MaskingConfig,
               tables: VocabTables) -> tuple[np.ndarray, np.ndarray]:
    """Mask a batch. tokens (B, S) ids, lengths (B,) real lengths, keys (B,) uint64 from `example_keys`.

    Returns (input_ids (B, S) int64 with replacements applied, chosen (B, S) bool: the positions to predict).
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    b, s = tokens.shape
    keys = np.asarray(keys, dtype=np.uint64)
    cand = (np.arange(s)[None, :] < np.asarray(lengths)[:, None]) & ~tables.never_mask[tokens]   # (B, S)
    n_cand = cand.sum(axis=1)
    budget = np.floor(cfg.mask_prob * n_cand + _uniform(keys, _S_COUNT)).astype(np.int64)
    budget = np.minimum(np.minimum(budget, cfg.resolved_max_predictions(s)), n_cand)               # (B,)

    if cfg.mode == "token":
        chosen = _choose_tokens(cand, budget, keys)
    elif cfg.mode == "wwm":
        chosen = _choose_words(tokens, cand, budget, keys, tables)
    else:
        chosen = _choose_ngrams(tokens, cand, budget, keys, tables, cfg.max_ngram)

    inputs = tokens.copy()
    u = _uniform(keys, _S_KIND, s)                                                                 # (B, S)
    to_mask = chosen & (u < cfg.mask_token_prob)
    to_random = chosen & (u >= cfg.mask_token_prob) & (u < cfg.mask_token_prob + cfg.random_token_prob)
    inputs[to_mask] = tables.mask_id
    if to_random.any():
        r = _uniform(keys, _S_RANDOM, s)[to_random]
        inputs[to_random] = tables.random_ids[(r * len(tables.random_ids)).astype(np.int64)]
    return inputs, chosen


def _rank_in_row(keys2d: np.ndarray) -> np.ndarray:
    """For each element, its rank when its row is sorted ascending. (B, N) -> (B, N) int."""
    order = np.argsort(keys2d, axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(keys2d.shape[1])[None, :].repeat(keys2d.shape[0], 0), axis=1)
    return ranks


def _choose_tokens(cand, budget, keys):
    order_keys = np.where(cand, _uniform(keys, _S_ORDER, cand.shape[1]), 2.0)   # non-candidates sort last
    return _rank_in_row(order_keys) < budget[:, None]


def _words(tokens, cand, tables):
    """Word structure: word id per position (-1 outside words) and per-row word lengths (B, S)."""
    b, s = tokens.shape
    prev_cand = np.zeros_like(cand)
    prev_cand[:, 1:] = cand[:, :-1]
    # a continuation piece continues the word before it, unless nothing maskable precedes it (e.g. after [SEP])
    start = cand & ~(tables.continuation[tokens] & prev_cand)
    word = np.cumsum(start, axis=1) - 1
    word = np.where(cand, word, -1)                                                # (B, S)
    n_words = start.sum(axis=1)
    flat = (np.arange(b)[:, None] * s + word)[cand]
    lengths = np.bincount(flat, minlength=b * s).reshape(b, s)                     # (B, S): length of word w
    return word, lengths, n_words


def _choose_words(tokens, cand, budget, keys, tables):
    b, s = tokens.shape
    word, wlen, n_words = _words(tokens, cand, tables)
    valid = np.arange(s)[None, :] < n_words[:, None]                               # (B, S) over word slots
    wkeys = np.where(valid, _uniform(keys, _S_ORDER, s), 2.0)
    order = np.argsort(wkeys, axis=1, kind="stable")                              # words in random order
    len_sorted = np.take_along_axis(np.where(valid, wlen, 0), order, axis=1)
    taken_sorted = np.cumsum(len_sorted, axis=1) <= budget[:, None]               # the prefix that fits
    taken_sorted &= np.take_along_axis(valid, order, axis=1)
    remaining = budget - np.where(taken_sorted, len_sorted, 0).sum(axis=1)
    # google-research keeps scanning after a word that does not fit: take the next word that does, repeatedly
    pos = np.arange(s)[None, :]
    while True:
        fits = (~taken_sorted) & (len_sorted > 0) & (len_sorted <= remaining[:, None])
        first_overflow = np.argmin(taken_sorted, axis=1)                          # scanning resumes after the prefix
        fits &= pos >= first_overflow[:, None]
        rows = np.flatnonzero(fits.any(axis=1))
        if len(rows) == 0:
            break
        pick = np.argmax(fits[rows], axis=1)
        taken_sorted[rows, pick] = True
        remaining[rows] -= len_sorted[rows, pick]
    taken = np.zeros((b, s), dtype=bool)
    np.put_along_axis(taken, order, taken_sorted, axis=1)                          # back to word ids
    return cand & np.take_along_axis(taken, np.maximum(word, 0), axis=1)


def _choose_ngrams(tokens, cand, budget, keys, tables, max_ngram):
    b, s = tokens.shape
    word, wlen, n_words = _words(tokens, cand, tables)
    order = np.argsort(_uniform(keys, _S_ORDER, s), axis=1, kind="stable").tolist()   # word visiting order
    span_u = _uniform(keys, _S_NGRAM, s).tolist()
    p = 1.0 / np.arange(1, max_ngram + 1)
    cdfs = [(np.cumsum(p[:k]) / p[:k].sum()).tolist() for k in range(1, max_ngram + 1)]  # P(n <= j) given reach k
    chosen = np.zeros((b, s), dtype=bool)
    for r in range(b):
        nw, left = int(n_words[r]), int(budget[r])
        if nw == 0 or left == 0:
            continue
        pos = np.flatnonzero(cand[r])
        starts = pos[np.r_[True, word[r, pos[1:]] != word[r, pos[:-1]]]]             # first position of each word
        lens = wlen[r, :nw].tolist()
        ends = (starts + wlen[r, :nw]).tolist()                                       # exclusive
        starts = starts.tolist()
        taken = [False] * nw
        u_row = span_u[r]
        for i in order[r]:
            if left == 0:
                break
            if i >= nw or taken[i]:
                continue
            reach = 1                      # words a span from i may cover without jumping over a special token
            while reach < max_ngram and i + reach < nw and ends[i + reach - 1] == starts[i + reach]:
                reach += 1
            u, cdf, n = u_row[i], cdfs[reach - 1], 1
            while n < reach and u >= cdf[n - 1]:
                n += 1
            size = sum(lens[i:i + n])
            while n > 0 and size > left:                                              # shorten to fit the budget
                n -= 1
                size -= lens[i + n]
            if n == 0 or any(taken[i:i + n]):
                continue
            for j in range(i, i + n):
                taken[j] = True
                chosen[r, starts[j]:ends[j]] = True
            left -= size
    return chosen
