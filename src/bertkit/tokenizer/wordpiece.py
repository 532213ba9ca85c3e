"""WordPiece, the third stage: each word becomes its greedy longest-match-first pieces ("##" after the first; [UNK]
for a word with no full segmentation or over MAX_INPUT_CHARS_PER_WORD), and texts become pieces with character
offsets. Words repeat (Zipf), so segmentation is memoised; batches that one regex splits never loop over words in
Python (PieceTable, PieceEncoder.fast); other text takes the per-word general path, with the same pieces."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from bertkit.tokenizer.normalize import LazyMap
from bertkit.tokenizer.pretokenize import (ASCII_TOKEN_RE, ASCII_WORD_RE, PreTokenizer, unicode_token_re,
                                          tokens_with_space)

# BERT's limit: a longer (normalised) word is one [UNK]; it also bounds the WordPiece loop.
MAX_INPUT_CHARS_PER_WORD = 100
# decode's clean-up, applied in this order to each piece (with its leading space): the WordPiece decoder's
DECODE_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
                   (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


class WordPiece:
    """Greedy longest-match-first segmentation of one word over a vocab, memoised."""

    def __init__(self, vocab: dict[str, int], unk_id: int, special_tokens: Iterable[str]):
        self.vocab, self.unk_id = vocab, unk_id
        self.special = frozenset(special_tokens)
        # word -> (piece ids, piece start offsets within the word)
        self.cache: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        # no candidate longer than the longest vocab entry can match
        self.max_piece = max(len(t) for t in vocab)

    def pieces(self, word: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(piece ids, piece start positions within word). A special token is its own single piece."""
        hit = self.cache.get(word)
        if hit is not None:
            return hit
        vocab = self.vocab
        n = len(word)
        if word in self.special:
            res = ((vocab[word],), (0,))
        elif n > MAX_INPUT_CHARS_PER_WORD:
            res = ((self.unk_id,), (0,))
        else:
            ids: list[int] = []
            starts: list[int] = []
            start = 0
            while start < n:
                end = min(n, start + self.max_piece)
                prefix = "##" if start else ""
                while end > start:
                    i = vocab.get(prefix + word[start:end])
                    if i is not None:
                        break
                    end -= 1
                else:  # no piece matches here: the whole word is unknown
                    ids, starts = [self.unk_id], [0]
                    break
                ids.append(i)
                starts.append(start)
                start = end
            res = (tuple(ids), tuple(starts))
        if len(self.cache) > 2 * PieceTable.MAX_WORDS:  # bound memory on adversarial input
            self.cache.clear()
        self.cache[word] = res
        return res


class PieceTable:
    """The fast path's memo: ASCII token (word with its leading whitespace) -> word id, with numpy arrays per word id
    (piece count, index of its first piece, token length) and per piece (id, start and end relative to the token
    end). Lookups for a whole batch are one C-level `map` over the dict; misses run WordPiece once."""

    MAX_WORDS = 1_000_000  # bound memory on adversarial input: the table restarts when it grows past this

    def __init__(self, wordpiece, vocab: dict[str, int]):
        self.wordpiece, self.vocab = wordpiece, vocab
        self._lock = threading.Lock()       # a server tokenizes from several threads; the table grows under them
        self.reset()

    def reset(self) -> None:
        self.index = LazyMap(self._add)
        self.prefilled = False
        self.n_words = self.n_pieces = 0
        # new entries since the last flush into the numpy arrays
        self.pending_words: list[tuple[int, int, int]] = []         # (first piece, piece count, token length)
        self.pending_pieces: list[tuple[int, int, int]] = []        # (id, start, end) relative to the token end
        self.words = np.zeros((1024, 3), dtype=np.int64)            # columns: first piece, count, token length
        self.pieces = np.zeros((1024, 3), dtype=np.int64)           # columns: id, rel start, rel end

    def _add(self, key: str) -> int:
        word = key.lstrip(" \t\n\r")
        n = len(word)
        ids, starts = self.wordpiece(word)
        self.pending_words.append((self.n_pieces, len(ids), len(key)))
        bounds = starts + (n,)
        for k, i in enumerate(ids):
            self.pending_pieces.append((i, bounds[k] - n, bounds[k + 1] - n))
        self.n_pieces += len(ids)
        self.n_words += 1
        return self.n_words - 1

    @staticmethod
    def _append(arr: np.ndarray, used: int, rows: list) -> np.ndarray:
        need = used + len(rows)
        if need > len(arr):
            grown = np.zeros((max(need, 2 * len(arr)), arr.shape[1]), dtype=arr.dtype)
            grown[:used] = arr[:used]
            arr = grown
        arr[used:need] = rows
        return arr

    def prefill(self, vocab: dict[str, int]) -> None:
        """Enter every whole-word vocab entry the fast path can meet (ASCII letters/digits, or one punctuation char),
        alone and after a space: WordPiece maps a word that is a vocab entry to that one entry, so these
        need no WordPiece run (most running-text words are vocab entries)."""
        entries = [(w, i) for w, i in vocab.items() if ASCII_WORD_RE.fullmatch(w)]
        rows_w, rows_p = [], []
        for prefix in ("", " "):
            for w, i in entries:
                key = prefix + w
                if key in self.index:
                    continue
                self.index[key] = self.n_words + len(rows_w)
                rows_w.append((self.n_pieces + len(rows_p), 1, len(key)))
                rows_p.append((i, -len(w), 0))
        self.words = self._append(self.words, self.n_words, rows_w)
        self.pieces = self._append(self.pieces, self.n_pieces, rows_p)
        self.n_words += len(rows_w)
        self.n_pieces += len(rows_p)

    def lookup(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Word ids of keys, and the words / pieces arrays that cover every id returned (one thread at a time: a
        growth or restart by another thread would lose rows or renumber words)."""
        with self._lock:
            if self.n_words > self.MAX_WORDS:
                self.reset()
            if not self.prefilled:
                self.prefilled = True
                self.prefill(self.vocab)
            wids = np.fromiter(map(self.index.__getitem__, keys), dtype=np.int64, count=len(keys))
            if self.pending_words:
                self.words = self._append(self.words, self.n_words - len(self.pending_words), self.pending_words)
                self.pieces = self._append(self.pieces, self.n_pieces - len(self.pending_pieces), self.pending_pieces)
                self.pending_words, self.pending_pieces = [], []
            return wids, self.words, self.pieces


@dataclass
class PieceArrays:
    """WordPiece pieces of many texts (no [CLS] / [SEP]), concatenated: text i owns rows bounds[i]:bounds[i+1];
    offsets are relative to each text. Compact numpy arrays: what corpus pipelines store, and cheap to ship between
    processes."""
    ids: np.ndarray      # (n_pieces,) int64
    starts: np.ndarray   # (n_pieces,) int64
    ends: np.ndarray     # (n_pieces,) int64
    bounds: np.ndarray   # (n_texts + 1,) int64

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def text(self, i: int) -> tuple[list[int], list[tuple[int, int]]]:
        """(piece ids, offsets) of text i."""
        a, b = int(self.bounds[i]), int(self.bounds[i + 1])
        return self.ids[a:b].tolist(), list(zip(self.starts[a:b].tolist(), self.ends[a:b].tolist()))

    def lists(self, offsets: bool) -> list[tuple[list[int], list | None]]:
        """Per text: (ids, [(start, end), ...] or None) as Python lists."""
        ids = self.ids.tolist()
        b = self.bounds.tolist()
        spans = zip(b, b[1:])
        if not offsets:
            return [(ids[x:y], None) for x, y in spans]
        starts, ends = self.starts.tolist(), self.ends.tolist()
        return [(ids[x:y], list(zip(starts[x:y], ends[x:y]))) for x, y in spans]

    @staticmethod
    def concatenate(parts: list["PieceArrays"]) -> "PieceArrays":
        if not parts:
            return PieceArrays(*(np.zeros(0, np.int64) for _ in range(3)), np.zeros(1, np.int64))
        shifts = np.cumsum([0] + [int(p.bounds[-1]) for p in parts[:-1]])
        bounds = np.concatenate([parts[0].bounds[:1]] + [p.bounds[1:] + k for p, k in zip(parts, shifts)])
        return PieceArrays(np.concatenate([p.ids for p in parts]), np.concatenate([p.starts for p in parts]),
                           np.concatenate([p.ends for p in parts]), bounds)


class PieceEncoder:
    """Texts -> pieces with offsets into each text, through the fast (whole-batch) or the general (per-word) path."""

    def __init__(self, pretok: PreTokenizer, wordpiece: Callable[[str], tuple], table: PieceTable):
        self.pretok, self.wordpiece, self.table = pretok, wordpiece, table

    def general(self, text: str) -> tuple[list[int], list[int], list[int]]:
        """Pieces of one text of any content: (ids, starts, ends)."""
        ids: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        wordpiece = self.wordpiece
        for word, s, e, align in zip(*self.pretok.words(text)):
            pids, pstarts = wordpiece(word)
            if len(pids) == 1:
                ids.append(pids[0])
                starts.append(s)
                ends.append(e)
                continue
            bounds = pstarts + (len(word),)
            for k, pid in enumerate(pids):
                a, b = bounds[k], bounds[k + 1]
                ids.append(pid)
                if align is None:
                    starts.append(s + a)
                    ends.append(s + b)
                else:
                    starts.append(align[a])
                    ends.append(align[b - 1] + 1)
        return ids, starts, ends

    def fast(self, texts: list[str], pattern: re.Pattern) -> PieceArrays:
        """Pieces of texts already prepared for pattern (see flat), the whole batch at once: one regex pass, one dict
        lookup per word, numpy for the rest."""
        joined = "\n".join(texts)  # the newline is whitespace, so no word spans two texts
        toks = tokens_with_space(joined, pattern)
        wids, words, pieces = self.table.lookup(toks)              # (n_words,)
        tok_end = np.cumsum(words[wids, 2])                        # (n_words,) end of each word in joined
        counts = words[wids, 1]
        first = words[wids, 0]
        if len(counts) and counts.max() == 1:                      # one piece per word: no expansion needed
            pidx, pend = first, tok_end
        else:
            cum = np.cumsum(counts)
            pidx = np.repeat(first - (cum - counts), counts) + np.arange(cum[-1] if len(cum) else 0)
            pend = np.repeat(tok_end, counts)                      # (n_pieces,) end of each piece's word
        ids = pieces[pidx, 0]
        starts = pend + pieces[pidx, 1]
        ends = pend + pieces[pidx, 2]
        # which text each piece is in, and positions relative to that text
        lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        text_start = np.cumsum(lens + 1) - (lens + 1)              # (n_texts,)
        which = np.searchsorted(text_start, starts, side="right") - 1
        starts -= text_start[which]
        ends -= text_start[which]
        bounds = np.searchsorted(which, np.arange(len(texts) + 1))
        return PieceArrays(ids, starts, ends, bounds)

    def flat(self, texts: Sequence[str]) -> PieceArrays:
        """Pieces of every text, each text on the route pretokenize picks for it (see PreTokenizer.route)."""
        pretok = self.pretok
        if pretok.plain_ascii("\n".join(texts)):
            return self.fast([t.lower() for t in texts] if pretok.lowercase else list(texts), ASCII_TOKEN_RE)
        routes, prepared = pretok.route(texts)
        parts: list = [None] * len(texts)
        for route, pattern in (("ascii", ASCII_TOKEN_RE), ("unicode", None)):
            idx = routes[route]
            if not idx:
                continue
            f = self.fast([prepared[i] for i in idx], pattern or unicode_token_re())
            b = f.bounds.tolist()
            for k, i in enumerate(idx):
                parts[i] = (f.ids[b[k]:b[k + 1]], f.starts[b[k]:b[k + 1]], f.ends[b[k]:b[k + 1]])
        for i in routes["general"]:
            parts[i] = tuple(np.array(x, dtype=np.int64) for x in self.general(texts[i]))
        lens = np.array([len(p[0]) for p in parts], dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        cat = (lambda k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.int64))
        return PieceArrays(cat(0), cat(1), cat(2), bounds)


def decode_pieces(tokens: Iterable[str]) -> str:
    """Text of pieces as BertTokenizerFast's WordPiece decoder makes it: pieces joined by spaces, "##" continuations
    glued to the piece before, then per piece the clean-up replacements (" ." -> ".", " ," -> ",", " 's" -> "'s",
    ...)."""
    out = []
    for t in tokens:
        if out:
            t = t[2:] if t.startswith("##") else " " + t
        for dirty, clean in DECODE_CLEANUP:
            t = t.replace(dirty, clean)
        out.append(t)
    return "".join(out)
