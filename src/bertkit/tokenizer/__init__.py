"""BERT's WordPiece tokenizer: exact, fast, and impossible to crash.

The pipeline (identical results to transformers' BertTokenizerFast, which is our test oracle):

    text ─> special tokens split out ─> clean ─> CJK isolate ─> [NFD + strip Mn] ─> [lowercase] ─> split on
            ("[MASK]" etc., verbatim,     (drop NUL,           (uncased only)        (uncased)      whitespace and
             case-sensitive, never split)  U+FFFD, controls;                                        punctuation
                                           whitespace -> ' ')                                            │
    ids, offsets <─ [CLS] A [SEP] (B [SEP]) <─ truncation / padding <─ WordPiece (greedy longest match, "##") <─┘

Character classes are the Rust tokenizer's, which differ from google-research's tokenization.py in places; where
they differ we follow the Rust one (the issue says to match BertTokenizerFast). Its category tables are Unicode 8.0,
so a character assigned later is, to it, unassigned (kept, never punctuation, never a stripped mark); we reproduce
that with the list of code points assigned by Unicode 8.0 (_ASSIGNED_IN_UNICODE_8) and the few characters whose
category changed since (_CATEGORY_IN_UNICODE_8). Its lowercasing uses newer tables (_NEW_LOWERCASE adds the pairs
Python 3.11 lacks).
  * removed by cleaning: U+0000, U+FFFD and every Cc / Cf / Cs / Co char except tab / LF / CR. So U+000B, U+000C,
    U+001C..U+001F, U+0085 are removed (google-research keeps U+001C..U+001F as whitespace), and unassigned (Cn)
    code points are kept (google-research drops every C*).
  * whitespace: the Unicode White_Space property (tab, LF, CR, space, U+00A0, U+1680, U+2000..U+200A, U+2028,
    U+2029, U+202F, U+205F, U+3000). google-research uses only Zs, so it keeps U+2028 / U+2029 as characters.
  * punctuation: ASCII non-alphanumeric printable characters and every Unicode P* character; each is its own word.
  * CJK ideographs (the blocks BERT lists) are each their own word; Extension E starts at U+2B920 in the Rust
    tokenizer (U+2B820 in google-research).
  * uncased: NFD, drop nonspacing marks (Mn), then lowercase char by char (so a final sigma stays σ, as in Rust;
    google-research lowercases before NFD).

Offsets are (start, end) character positions into the ORIGINAL text (before any of the above) for every token,
(0, 0) for [CLS] / [SEP] / [PAD]. A normalised character inherits the position of the original character it came
from (an accent stripped from "é" leaves "e" covering the original "é"; a Hangul syllable that NFD splits into three
jamo has all three covering the syllable). The one exception, again the Rust tokenizer's: when NFD reorders
combining marks across characters, positions follow the sequence, not the characters (_normalize_reordered).

WordPiece: for each word, take the longest vocab entry that prefixes the rest of the word ("##"-prefixed after the
first piece); a word with no full segmentation, or longer than 100 characters, becomes one [UNK] covering the word.

Speed (pure Python, no extension). Tokenization is a pure function of the word, and words repeat (Zipf), so every
word's pieces are cached. Large batches of ASCII text (most real text) never loop over characters or words in
Python: the batch is joined into one string, lowercased and split by one compiled regex (C) whose matches carry
the whitespace before each word, so word end positions are a cumulative sum of match lengths; a dict lookup per
word (through `map`, a C loop) gives a word id, and numpy gathers piece ids and offsets from per-word tables and
splits them back per text. Non-ASCII text is normalised with str.translate tables filled lazily per character, and
an alignment array is built only when some character does not map to exactly one. Small batches take a per-text
path with less fixed overhead. Both paths are parity-tested.

Invalid input policy:
  * non-str text raises TypeError naming the type given; any str (any length, any code points, lone surrogates
    included) is accepted and never crashes.
  * files: text files are decoded as UTF-8 with errors="replace"; each invalid byte becomes U+FFFD, which cleaning
    then drops (exactly what BERT does with U+FFFD), so offsets index the decoded text. A vocab file is structure,
    not text: it must be valid UTF-8, and a bad byte raises VocabError naming the file, line and byte offset.
  * a missing, empty or malformed vocab (blank line, duplicate entry, missing [PAD]/[UNK]/[CLS]/[SEP]/[MASK])
    raises VocabError naming the file and line.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import hashlib
import json
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from bertkit.errors import BertkitError, VocabError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# BERT's limit: a longer (normalised) word is one [UNK]; it also bounds the WordPiece loop.
MAX_INPUT_CHARS_PER_WORD = 100

# ----------------------------------------------------------------------------------------------------------------
# Character classes

# The Unicode White_Space property (what Rust's char::is_whitespace tests). The C0/C1 controls among them
# (U+000B, U+000C, U+0085) are removed by cleaning before whitespace matters.
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
                        "\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_ASCII_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
# The CJK Unified Ideographs blocks BERT isolates (not all of CJK: Hangul, kana etc. are ordinary letters).
# google-research lists Extension E as 0x2B820-0x2CEAF; the Rust tokenizer starts it at 0x2B920, so U+2B820..U+2B91F
# are ordinary letters there, and we follow the Rust tokenizer (the issue says to match BertTokenizerFast).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _unicode8_starts_ends() -> tuple[list[int], list[int]]:
    starts, ends = [], []
    for r in _ASSIGNED_IN_UNICODE_8.split():
        a, _, b = r.partition("-")
        starts.append(int(a, 16))
        ends.append(int(b or a, 16))
    return starts, ends


_U8_RANGES: tuple[list[int], list[int]] | None = None


def _assigned_in_unicode_8(cp: int) -> bool:
    global _U8_RANGES
    if _U8_RANGES is None:
        _U8_RANGES = _unicode8_starts_ends()
    starts, ends = _U8_RANGES
    i = bisect.bisect_right(starts, cp) - 1
    return i >= 0 and cp <= ends[i]


# General_Category values that changed since Unicode 8.0 for characters assigned by then (the Rust tokenizer sees
# the 8.0 value). Source: the Unicode Character Database change history (DerivedGeneralCategory across versions).
_CATEGORY_IN_UNICODE_8 = {
    0x166D: "Po",   # CANADIAN SYLLABICS CHI SIGN: Po -> So in Unicode 12.0
    0x111C9: "Po",  # SHARADA SANDHI MARK: Po -> Mn in Unicode 11.0
    0x1734: "Mn",   # HANUNOO SIGN PAMUDPOD: Mn -> Mc in Unicode 14.0
    0x1885: "Lo",   # MONGOLIAN LETTER ALI GALI BALUDA: Lo -> Mn in Unicode 9.0
    0x1886: "Lo",   # MONGOLIAN LETTER ALI GALI THREE BALUDA: Lo -> Mn in Unicode 9.0
    0xA9BD: "Mc",   # JAVANESE CONSONANT SIGN KERET: Mc -> Mn in Unicode 12.0
}

# Lowercase pairs added after Unicode 14.0 (Python 3.11's database). The Rust tokenizer lowercases with Rust's std,
# whose tables are newer (Unicode 17.0), so these capitals are lowercased there even though its category tables
# (8.0) call them unassigned.
_NEW_LOWERCASE = {0x1C89: 0x1C8A, 0xA7CB: 0x0264, 0xA7CC: 0xA7CD, 0xA7CE: 0xA7CF, 0xA7D2: 0xA7D3, 0xA7D4: 0xA7D5,
                  0xA7DA: 0xA7DB, 0xA7DC: 0x019B,
                  **{cp: cp + 0x20 for cp in range(0x10D50, 0x10D66)},   # Garay (16.0)
                  **{cp: cp + 0x1B for cp in range(0x16EA0, 0x16EB9)}}   # Beria Erfe (17.0)


def _lower_char(c: str) -> str:
    low = c.lower()
    if low == c:
        cp = _NEW_LOWERCASE.get(ord(c))
        if cp is not None:
            return chr(cp)
    return low


def _category(c: str) -> str:
    """General category as the Rust tokenizer's Unicode 8.0 tables see it (Cn for anything assigned later)."""
    cp = ord(c)
    cat = _CATEGORY_IN_UNICODE_8.get(cp)
    if cat is not None:
        return cat
    if cp < 0x80 or 0xD800 <= cp <= 0xDFFF or _assigned_in_unicode_8(cp):  # surrogates: Cs in every version
        return unicodedata.category(c)
    return "Cn"


def _is_removed(c: str) -> bool:
    """Dropped by cleaning: NUL, U+FFFD, and every Cc / Cf / Cs / Co char except tab / LF / CR. Unassigned (Cn)
    code points are kept, as the Rust tokenizer keeps them (google-research's "C*" test would drop them)."""
    if c in "\t\n\r":
        return False
    return c == "\x00" or c == "\ufffd" or _category(c) in ("Cc", "Cf", "Cs", "Co")


def _is_cjk(c: str) -> bool:
    cp = ord(c)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_punct(c: str) -> bool:
    return c in _ASCII_PUNCT or _category(c)[0] == "P"


def _ccc(c: str) -> int:
    """Canonical combining class (0 for a char Unicode 8.0 did not have, as in the Rust tables)."""
    if c.isascii():
        return 0
    cp = ord(c)
    return unicodedata.combining(c) if (0xD800 <= cp <= 0xDFFF or _assigned_in_unicode_8(cp)) else 0


def _nfd(c: str) -> str:
    """Canonical decomposition of one char; a char unknown to Unicode 8.0 does not decompose (Rust tables)."""
    if c.isascii() or not _assigned_in_unicode_8(ord(c)):
        return c
    return unicodedata.normalize("NFD", c)


# ASCII fast path. In ASCII text without control characters every char is whitespace (space, tab, LF, CR), a letter
# or digit, or punctuation (ASCII has no other symbols). One regex over a whole batch yields each word together with
# the whitespace before it, so consecutive matches tile the text and a word's end position is the running sum of the
# match lengths: no per-word position bookkeeping in Python.
_ASCII_TOKEN_RE = re.compile(r"[ \t\n\r]*(?:[A-Za-z0-9]+|[!-/:-@\[-`{-~])")
# ASCII chars that cleaning removes (C0 controls other than tab / LF / CR, and DEL): such text takes the general path.
_ASCII_REMOVED_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_ASCII_WORD_RE = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
_UNICODE_TOKEN_RE: re.Pattern | None = None


def _unicode_token_re() -> re.Pattern:
    """The fast path's regex for normalised non-ASCII text (whitespace is then only ' '): a word is a run of chars
    that are neither whitespace nor punctuation / CJK; each punctuation / CJK char is a word of its own."""
    global _UNICODE_TOKEN_RE
    if _UNICODE_TOKEN_RE is None:
        ranges = [r.partition("-") for r in _PUNCT_UNICODE_8.split()]
        ranges = [(int(a, 16), int(b or a, 16)) for a, _, b in ranges] + list(_CJK_RANGES)
        iso = "!-/:-@\\[-`{-~" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)
        _UNICODE_TOKEN_RE = re.compile(f"[ \t\n\r]*(?:[^ \t\n\r{iso}]+|[{iso}])")
    return _UNICODE_TOKEN_RE


# General path: normalised text is mapped char by char to its class ("a" word char, " " space, "." isolated), and
# this finds the words in the class string.
_CLASS_WORD_RE = re.compile(r"a+|\.")


class _LazyMap(dict):
    """A str.translate table filled on demand: fn(code point) -> replacement string, memoised."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def __missing__(self, cp: int) -> str:
        v = self[cp] = self.fn(chr(cp))
        return v


class _Normalizer:
    """Cleaning + accent stripping + lowercasing of arbitrary text, with alignment to the original characters.

    Three lazily-filled str.translate tables keep the per-character work in C: `norm` (char -> normalised form, ""
    when removed), `width` (char -> chr(len(normalised form))) to build the alignment only when some char does not map
    to exactly one char, and `cls` (normalised char -> "a" / " " / ".").
    """

    def __init__(self, lowercase: bool, strip_accents: bool):
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self.norm = _LazyMap(self._normalize_char)
        self.width = _LazyMap(lambda c: chr(len(self.norm[ord(c)])))
        self.cls = _LazyMap(self._class_of)
        # "m" when the char's NFD holds a combining mark with a nonzero combining class, "" when cleaning removes
        # it, else "o": two adjacent "m" may need canonical reordering (see _words_reordered)
        self.marks = _LazyMap(lambda c: "" if _is_removed(c) else "m" if any(_ccc(x) for x in _nfd(c)) else "o")

    def _normalize_char(self, c: str) -> str:
        if _is_removed(c):
            return ""
        if c in _WHITESPACE:
            return " "
        n = c
        if self.strip_accents:
            n = "".join(x for x in _nfd(n) if _category(x) != "Mn")
        if self.lowercase:
            # char by char: str.lower() on a whole string turns a final Σ into ς, Rust's per-char lowercase does not
            n = "".join(_lower_char(x) for x in n)
        return n

    @staticmethod
    def _class_of(c: str) -> str:
        if c in _WHITESPACE:
            return " "
        return "." if (_is_punct(c) or _is_cjk(c)) else "a"

    def words(self, text: str, base: int, out_words: list, out_starts: list, out_ends: list,
              out_align: list) -> None:
        """Append the words of text (positions offset by base) to the out lists. out_align gets, per word, None when
        the word is a verbatim copy of text[start:end], else the list of original positions of its characters."""
        if self.strip_accents and "mm" in text.translate(self.marks):
            norm, align = self._normalize_reordered(text, base)
            self._split(norm, align, base, out_words, out_starts, out_ends, out_align)
            return
        norm = text.translate(self.norm)
        widths = text.translate(self.width)
        if len(norm) == len(text) and widths.count("\x01") == len(text):
            align = None  # every char maps to exactly one char: positions are unchanged
        else:
            counts = np.frombuffer(widths.encode("latin-1"), dtype=np.uint8)
            align = np.repeat(np.arange(base, base + len(text)), counts).tolist()
        self._split(norm, align, base, out_words, out_starts, out_ends, out_align)

    def one_to_one(self, text: str) -> str | None:
        """The normalised text when every char maps to exactly one char (so positions are unchanged), else None."""
        norm = text.translate(self.norm)
        if len(norm) != len(text) or text.translate(self.width).count("\x01") != len(text):
            return None
        if self.strip_accents and "mm" in text.translate(self.marks):
            return None
        return norm

    def _normalize_reordered(self, text: str, base: int) -> tuple[str, list[int]]:
        """Normalise text whose NFD needs canonical reordering of combining marks across characters.

        Emulates the Rust tokenizer exactly: after cleaning, each char decomposes into (char, change) pairs (change
        0 for its first char, +1 for the ones it adds); runs of nonzero-class marks are stably sorted by class, the
        pairs moving together; then alignment is assigned by walking the pairs in order: a change-0 char takes the
        position of the next source char, an added char that of the last one taken. So after a reordering the
        positions follow the sequence, not the characters.
        """
        pairs: list[list] = []
        src: list[int] = []
        for i, c in enumerate(text, base):
            if _is_removed(c):
                continue
            src.append(i)
            d = " " if c in _WHITESPACE else _nfd(c)
            pairs.extend([x, 1 if k else 0] for k, x in enumerate(d))
        k = 0
        while k < len(pairs):  # canonical ordering: stable sort of each run of non-starters by class
            if _ccc(pairs[k][0]):
                j = k
                while j < len(pairs) and _ccc(pairs[j][0]):
                    j += 1
                pairs[k:j] = sorted(pairs[k:j], key=lambda p: _ccc(p[0]))
                k = j
            else:
                k += 1
        chars: list[str] = []
        align: list[int] = []
        taken = 0
        for x, change in pairs:
            if change == 0:
                pos = src[taken]
                taken += 1
            else:
                pos = src[taken - 1] if taken else src[0]
            if _category(x) == "Mn":
                continue
            for y in (_lower_char(x) if self.lowercase else x):
                chars.append(y)
                align.append(pos)
        return "".join(chars), align

    def _split(self, norm: str, align: list[int] | None, base: int, out_words, out_starts, out_ends,
               out_align) -> None:
        cls = norm.translate(self.cls)
        for m in _CLASS_WORD_RE.finditer(cls):
            s, e = m.span()
            out_words.append(norm[s:e])
            if align is None:
                out_starts.append(base + s)
                out_ends.append(base + e)
                out_align.append(None)
            else:
                out_starts.append(align[s])
                out_ends.append(align[e - 1] + 1)
                out_align.append(align[s:e])


class _PieceTable:
    """The fast path's memo: ASCII token (word with its leading whitespace) -> word id, with numpy arrays per word id
    (piece count, index of its first piece, token length) and per piece (id, start and end relative to the token
    end). Lookups for a whole batch are one C-level `map` over the dict; misses run WordPiece once."""

    MAX_WORDS = 1_000_000  # bound memory on adversarial input: the table restarts when it grows past this

    def __init__(self, wordpiece, vocab: dict[str, int]):
        self.wordpiece, self.vocab = wordpiece, vocab
        self.reset()

    def reset(self) -> None:
        self.index = _LazyIndex(self._add)
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
        shape = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
        entries = [(w, i) for w, i in vocab.items() if shape.fullmatch(w)]
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

    def lookup(self, keys: list[str]) -> np.ndarray:
        """Word ids of keys; afterwards self.words / self.pieces cover every id returned."""
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
        return wids


class _LazyIndex(dict):
    def __init__(self, add):
        super().__init__()
        self.add = add

    def __missing__(self, key: str) -> int:
        v = self[key] = self.add(key)
        return v


# ----------------------------------------------------------------------------------------------------------------
# Vocab files

def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """Read a vocab.txt (one token per line, id = line number - 1). Raises VocabError naming file and line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise VocabError(f"{path}: vocab file not found") from None
    except IsADirectoryError:
        raise VocabError(f"{path}: is a directory, expected a vocab.txt (or use Tokenizer.from_pretrained)") from None
    except OSError as e:
        raise VocabError(f"{path}: cannot read vocab file: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise VocabError(f"{path}:{line}: invalid UTF-8 at byte offset {e.start}") from None
    if not text.strip():
        raise VocabError(f"{path}: vocab file is empty")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline
    vocab: dict[str, int] = {}
    for i, line in enumerate(lines):
        token = line.rstrip("\r")
        if token == "" or token != token.strip():
            raise VocabError(f"{path}:{i + 1}: blank line or token with surrounding whitespace: {line!r}")
        if token in vocab:
            raise VocabError(f"{path}:{i + 1}: duplicate entry {token!r} (first on line {vocab[token] + 1})")
        vocab[token] = i
    _check_specials(vocab, str(path))
    return vocab


def _check_specials(vocab: dict[str, int], where: str) -> None:
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise VocabError(f"{where}:{len(vocab) + 1}: vocab lacks the special token(s) {', '.join(missing)} "
                         f"(checked to the end of the file, line {len(vocab)})")


def read_text_file(path: str | os.PathLike) -> str:
    """Read a text file under the module's policy: UTF-8, invalid bytes -> U+FFFD (dropped by cleaning)."""
    return Path(path).read_bytes().decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------------------------------
# The tokenizer

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

    @staticmethod
    def concatenate(parts: list["PieceArrays"]) -> "PieceArrays":
        if not parts:
            return PieceArrays(*(np.zeros(0, np.int64) for _ in range(3)), np.zeros(1, np.int64))
        shifts = np.cumsum([0] + [int(p.bounds[-1]) for p in parts[:-1]])
        bounds = np.concatenate([parts[0].bounds[:1]] + [p.bounds[1:] + k for p, k in zip(parts, shifts)])
        return PieceArrays(np.concatenate([p.ids for p in parts]), np.concatenate([p.starts for p in parts]),
                           np.concatenate([p.ends for p in parts]), bounds)




TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
# decode's clean-up, applied in this order to each piece (with its leading space): the WordPiece decoder's
_DECODE_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
                   (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


class Tokenizer:
    """WordPiece tokenizer with BERT semantics. See the module docstring for the algorithm."""

    def __init__(self, vocab: str | os.PathLike | dict[str, int], lowercase: bool = True,
                 strip_accents: bool | None = None, model_max_length: int | None = None):
        if isinstance(vocab, (str, os.PathLike)):
            self.vocab_file: str | None = str(vocab)
            vocab = load_vocab(vocab)
        elif isinstance(vocab, dict):
            self.vocab_file = None
            vocab = dict(vocab)
            ids = sorted(vocab.values())
            if ids != list(range(len(ids))):
                raise VocabError("vocab dict: ids must be exactly 0..len-1, each once")
            if any(not isinstance(t, str) or not t or t != t.strip() for t in vocab):
                raise VocabError("vocab dict: tokens must be non-empty strings without surrounding whitespace")
            _check_specials(vocab, "vocab dict")
        else:
            raise TypeError(f"vocab must be a path or a dict[str, int], got {type(vocab).__name__}")
        self.vocab: dict[str, int] = vocab
        self.ids_to_tokens: list[str] = [""] * len(vocab)
        for t, i in vocab.items():
            self.ids_to_tokens[i] = t
        self.lowercase = bool(lowercase)
        # None follows lowercase, as in BERT / BertTokenizerFast
        self.strip_accents = self.lowercase if strip_accents is None else bool(strip_accents)
        self.vocab_size = len(vocab)
        self.pad_token_id = vocab["[PAD]"]
        self.unk_token_id = vocab["[UNK]"]
        self.cls_token_id = vocab["[CLS]"]
        self.sep_token_id = vocab["[SEP]"]
        self.mask_token_id = vocab["[MASK]"]
        self.vocab_hash = hashlib.sha256(("\n".join(self.ids_to_tokens) + "\n").encode("utf-8")).hexdigest()
        self._special_ids = {vocab[t] for t in SPECIAL_TOKENS}
        self._special_set = frozenset(SPECIAL_TOKENS)
        # Special tokens are matched verbatim in the original text; longest first so a longer one wins.
        self._special_re = re.compile("|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS, key=len, reverse=True)))
        # the length truncation=True / padding="max_length" use when max_length is not given (tokenizer_config.json's
        # model_max_length, e.g. 512); None: those then do nothing, as in BertTokenizerFast
        self.model_max_length = model_max_length
        self._normalizer = _Normalizer(self.lowercase, self.strip_accents)
        # word -> (piece ids, piece start offsets within the word); see _wordpiece
        self._cache: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._pieces = _PieceTable(self._wordpiece, self.vocab)
        # batches shorter than this (in chars) take the per-text path: same results, less fixed overhead
        self._small_batch_chars = 2048
        # WordPiece never needs to try a candidate longer than the longest vocab entry
        self._max_piece = max(len(t) for t in vocab)

    # ------------------------------------------------------------------ loading / saving

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides) -> "Tokenizer":
        """Load a vocab.txt, or an HF-format model dir (vocab.txt + tokenizer_config.json's do_lower_case)."""
        path = Path(path)
        if path.is_dir():
            vocab_file = path / "vocab.txt"
            if not vocab_file.is_file():
                raise VocabError(f"{path}: model directory has no vocab.txt")
            kwargs = {}
            cfg_file = path / "tokenizer_config.json"
            if cfg_file.is_file():
                try:
                    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
                except (ValueError, UnicodeDecodeError) as e:
                    raise VocabError(f"{cfg_file}: not valid JSON: {e}") from None
                if not isinstance(cfg, dict):
                    raise VocabError(f"{cfg_file}: expected a JSON object")
                if "do_lower_case" in cfg:
                    kwargs["lowercase"] = bool(cfg["do_lower_case"])
                if cfg.get("strip_accents") is not None:
                    kwargs["strip_accents"] = bool(cfg["strip_accents"])
                mml = cfg.get("model_max_length")
                if isinstance(mml, int) and 0 < mml < 1_000_000:  # HF writes 1e30 for "no limit"
                    kwargs["model_max_length"] = mml
            kwargs.update(overrides)
            return cls(vocab_file, **kwargs)
        return cls(path, **overrides)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write vocab.txt and tokenizer_config.json (HF-compatible) into directory; returns the directory."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "vocab.txt").write_text("\n".join(self.ids_to_tokens) + "\n", encoding="utf-8")
        cfg = {"do_lower_case": self.lowercase, "strip_accents": None if self.strip_accents == self.lowercase
               else self.strip_accents, "tokenize_chinese_chars": True, "unk_token": "[UNK]", "sep_token": "[SEP]",
               "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]",
               "tokenizer_class": "BertTokenizer", "vocab_hash": self.vocab_hash}
        if self.model_max_length is not None:
            cfg["model_max_length"] = self.model_max_length
        (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        return directory

    def __getstate__(self) -> dict:  # caches hold closures; ship only what rebuilds the tokenizer
        return {"vocab": self.vocab, "lowercase": self.lowercase, "strip_accents": self.strip_accents,
                "vocab_file": self.vocab_file, "model_max_length": self.model_max_length}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["vocab"], lowercase=state["lowercase"], strip_accents=state["strip_accents"],
                      model_max_length=state["model_max_length"])
        self.vocab_file = state["vocab_file"]

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase})"

    # ------------------------------------------------------------------ words

    @staticmethod
    def _check_text(text, what: str = "text") -> str:
        if not isinstance(text, str):
            raise TypeError(f"{what} must be str, got {type(text).__name__}: {_short_repr(text)}")
        return text

    def _words(self, text: str) -> tuple[list[str], list[int], list[int], list]:
        """Split one text into words: (words, starts, ends, alignments) in original-text character positions.

        alignments[k] is None when word k is text[start:end] verbatim up to ASCII lowercasing; otherwise it lists
        the original position of each of the word's normalised characters.
        """
        words: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        aligns: list = []
        pos = 0
        for m in self._special_re.finditer(text):  # special tokens are matched first, in the raw text
            if m.start() > pos:
                self._segment_words(text[pos:m.start()], pos, words, starts, ends, aligns)
            words.append(m.group())
            starts.append(m.start())
            ends.append(m.end())
            aligns.append(None)
            pos = m.end()
        if pos < len(text):
            self._segment_words(text[pos:] if pos else text, pos, words, starts, ends, aligns)
        return words, starts, ends, aligns

    def _segment_words(self, seg: str, base: int, words, starts, ends, aligns) -> None:
        if seg.isascii() and not _ASCII_REMOVED_RE.search(seg):
            if self.lowercase:
                seg = seg.lower()
            pos = base
            for tok in _ASCII_TOKEN_RE.findall(seg.rstrip(" \t\n\r")):  # rstrip: see _encode_fast
                pos += len(tok)
                word = tok.lstrip(" \t\n\r")
                words.append(word)
                starts.append(pos - len(word))
                ends.append(pos)
                aligns.append(None)
            return
        self._normalizer.words(seg, base, words, starts, ends, aligns)

    def basic_tokenize(self, text: str) -> list[str]:
        """Words after cleaning, CJK isolation, lowercasing / accent stripping and punctuation split.

        Special tokens ("[MASK]", ...) appearing verbatim in text stay whole words.
        """
        self._check_text(text)
        if text.isascii() and not _ASCII_REMOVED_RE.search(text) and "[" not in text:
            low = text.lower() if self.lowercase else text
            return _ASCII_WORD_RE.findall(low)
        return self._words(text)[0]

    # ------------------------------------------------------------------ WordPiece

    def _wordpiece(self, word: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Greedy longest-match-first segmentation: (piece ids, piece start positions within word). Memoised."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        vocab = self.vocab
        n = len(word)
        if word in self._special_set:
            res = ((vocab[word],), (0,))
        elif n > MAX_INPUT_CHARS_PER_WORD:
            res = ((self.unk_token_id,), (0,))
        else:
            ids: list[int] = []
            starts: list[int] = []
            start = 0
            while start < n:
                end = min(n, start + self._max_piece)
                prefix = "##" if start else ""
                while end > start:
                    i = vocab.get(prefix + word[start:end])
                    if i is not None:
                        break
                    end -= 1
                else:  # no piece matches here: the whole word is unknown
                    ids, starts = [self.unk_token_id], [0]
                    break
                ids.append(i)
                starts.append(start)
                start = end
            res = (tuple(ids), tuple(starts))
        if len(self._cache) > 2 * _PieceTable.MAX_WORDS:  # bound memory on adversarial input
            self._cache.clear()
        self._cache[word] = res
        return res

    def tokenize(self, text: str) -> list[str]:
        """WordPiece pieces of text (continuation pieces start with "##"), without [CLS] / [SEP]."""
        self._check_text(text)
        itt = self.ids_to_tokens
        return [itt[i] for i in self._pieces_batch([text], offsets=False)[0][0]]

    # ------------------------------------------------------------------ texts -> pieces

    def _encode_general(self, text: str) -> tuple[list[int], list[int], list[int]]:
        """Pieces of one text of any content: (ids, starts, ends)."""
        ids: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        for word, s, e, align in zip(*self._words(text)):
            pids, pstarts = self._wordpiece(word)
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

    def _encode_fast(self, texts: list[str], pattern: re.Pattern) -> PieceArrays:
        """Pieces of texts that need no normalisation beyond what is already done (see _encode_flat), the whole
        batch at once: one regex pass, one dict lookup per word, numpy for the rest (see the module docstring)."""
        joined = "\n".join(texts)  # the newline is whitespace, so no word spans two texts
        # no trailing whitespace: then every whitespace run is followed by a word, and the regex never fails a
        # match (a failing scan from each position of a long whitespace tail would be quadratic)
        toks = pattern.findall(joined.rstrip(" \t\n\r"))
        table = self._pieces
        wids = table.lookup(toks)                                  # (n_words,)
        words, pieces = table.words, table.pieces
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

    def _encode_flat(self, texts: Sequence[str]) -> PieceArrays:
        """Pieces of every text. Three routes, same results: ASCII text without control chars goes to the fast path
        as is (lowercased); other text whose normalisation maps each char to one char goes there normalised (with a
        Unicode regex); the rest (special tokens, removed chars, expansions, reordering) takes the general path."""
        joined = "\n".join(texts)
        if joined.isascii() and not _ASCII_REMOVED_RE.search(joined) and not self._special_re.search(joined):
            return self._encode_fast([t.lower() for t in texts] if self.lowercase else list(texts), _ASCII_TOKEN_RE)
        routes: dict[str, list[int]] = {"ascii": [], "unicode": [], "general": []}
        prepared: list[str | None] = [None] * len(texts)
        one_to_one = self._normalizer.one_to_one
        for i, t in enumerate(texts):
            if self._special_re.search(t):
                routes["general"].append(i)
            elif t.isascii():
                if _ASCII_REMOVED_RE.search(t):
                    routes["general"].append(i)
                else:
                    prepared[i] = t.lower() if self.lowercase else t
                    routes["ascii"].append(i)
            else:
                prepared[i] = one_to_one(t)
                routes["unicode" if prepared[i] is not None else "general"].append(i)
        parts: list = [None] * len(texts)
        for route, pattern in (("ascii", _ASCII_TOKEN_RE), ("unicode", None)):
            idx = routes[route]
            if not idx:
                continue
            f = self._encode_fast([prepared[i] for i in idx], pattern or _unicode_token_re())
            b = f.bounds.tolist()
            for k, i in enumerate(idx):
                parts[i] = (f.ids[b[k]:b[k + 1]], f.starts[b[k]:b[k + 1]], f.ends[b[k]:b[k + 1]])
        for i in routes["general"]:
            parts[i] = tuple(np.array(x, dtype=np.int64) for x in self._encode_general(texts[i]))
        lens = np.array([len(p[0]) for p in parts], dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        cat = (lambda k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.int64))
        return PieceArrays(cat(0), cat(1), cat(2), bounds)

    def _materialize(self, flat: PieceArrays, offsets: bool) -> list[tuple[list[int], list | None]]:
        """Per text: (ids, [(start, end), ...] or None) as Python lists."""
        ids = flat.ids.tolist()
        b = flat.bounds.tolist()
        spans = zip(b, b[1:])
        if not offsets:
            return [(ids[x:y], None) for x, y in spans]
        starts, ends = flat.starts.tolist(), flat.ends.tolist()
        return [(ids[x:y], list(zip(starts[x:y], ends[x:y]))) for x, y in spans]

    def _pieces_batch(self, texts: Sequence[str], offsets: bool) -> list[tuple[list[int], list | None]]:
        if sum(map(len, texts)) < self._small_batch_chars:  # numpy's per-call overhead would dominate
            out = []
            for t in texts:
                ids, starts, ends = self._encode_general(t)
                out.append((ids, list(zip(starts, ends)) if offsets else None))
            return out
        return self._materialize(self._encode_flat(texts), offsets)

    # ------------------------------------------------------------------ model inputs

    def encode(self, text: str, pair: str | None = None, max_length: int | None = None,
               truncation: bool | str | None = None) -> list[int]:
        """Ids of [CLS] text [SEP] (pair [SEP]), truncated to max_length when given."""
        return self(text, pair, max_length=max_length, truncation=truncation)["input_ids"]

    def __call__(self, texts: str | Sequence[str], pairs: str | Sequence[str] | None = None,
                 max_length: int | None = None, padding: bool | str = False, truncation: bool | str | None = None,
                 pad_to_multiple_of: int | None = None, return_offsets: bool = False,
                 return_tensors: str | None = None) -> dict:
        """Model inputs for one text (or pair) or a batch: dict(input_ids, token_type_ids, attention_mask[,
        offsets]). Semantics follow transformers' BertTokenizerFast:

        truncation: None -> "longest_first" when max_length is given and padding is off, else none;
          True = "longest_first"; or "only_first" / "only_second". max_length counts the special tokens. A
          strategy that cannot reach max_length (the sequence it may cut is too short) raises BertkitError (a
          ValueError); a max_length below the number of special tokens leaves the inputs untruncated, as
          BertTokenizerFast does.
        padding: False; True / "longest" (to the longest in the batch); "max_length" (to max_length, default
          model_max_length);
          pad_to_multiple_of rounds the padded length up.
        offsets: (start, end) character positions into the original text, (0, 0) for special and pad tokens.
        return_tensors="pt" returns torch tensors (batch, seq) (offsets (batch, seq, 2)); needs equal lengths.
        A single str returns flat lists (but tensors always have a batch dimension).
        """
        single = isinstance(texts, str)
        if single:
            if pairs is not None:
                self._check_text(pairs, "pair")
                # BertTokenizerFast treats an empty pair string in an unbatched call as no pair
                pairs = [pairs] if pairs else None
            texts = [texts]
        else:
            texts = self._check_batch(texts, "texts")
            if pairs is not None:
                pairs = self._check_batch(pairs, "pairs")
                if len(pairs) != len(texts):
                    raise BertkitError(f"pairs has {len(pairs)} entries, texts has {len(texts)}")
        with _gc_paused():
            first = self._pieces_batch(texts, return_offsets)
            second = self._pieces_batch(pairs, return_offsets) if pairs is not None else None
            return self._assemble(first, second, max_length=max_length, padding=padding, truncation=truncation,
                              pad_to_multiple_of=pad_to_multiple_of, return_offsets=return_offsets,
                              return_tensors=return_tensors, single=single)

    def _assemble(self, first, second, max_length=None, padding=False, truncation=None, pad_to_multiple_of=None,
                  return_offsets=False, return_tensors=None, single=False) -> dict:
        """Truncate, add [CLS] / [SEP], token types, mask, pad: pieces -> model inputs."""
        if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool)
                                       or max_length < 0):
            raise BertkitError(f"max_length must be a non-negative int, got {max_length!r}")
        if max_length is None and self.model_max_length is not None and (
                truncation not in (None, False, "do_not_truncate") or padding == "max_length"):
            max_length = self.model_max_length
        strategy = _truncation_strategy(truncation, max_length, padding)
        if (strategy is not None and padding not in (False, None, "do_not_pad") and pad_to_multiple_of
                and max_length is not None and max_length % pad_to_multiple_of):
            raise BertkitError(f"max_length={max_length} (truncation with padding) must be a multiple of "
                               f"pad_to_multiple_of={pad_to_multiple_of}")
        cls, sep = self.cls_token_id, self.sep_token_id
        out_ids, out_types, out_offsets = [], [], []
        for i, (a_ids, a_off) in enumerate(first):
            b_ids, b_off = second[i] if second is not None else (None, None)
            if strategy is not None:
                na, nb = _truncated_lengths(len(a_ids), None if b_ids is None else len(b_ids), max_length, strategy)
                a_ids, a_off = a_ids[:na], a_off[:na] if a_off is not None else None
                if b_ids is not None:
                    b_ids, b_off = b_ids[:nb], b_off[:nb] if b_off is not None else None
            if b_ids is None:
                out_ids.append([cls, *a_ids, sep])
                out_types.append([0] * (len(a_ids) + 2))
                if return_offsets:
                    out_offsets.append([(0, 0), *a_off, (0, 0)])
            else:
                out_ids.append([cls, *a_ids, sep, *b_ids, sep])
                out_types.append([0] * (len(a_ids) + 2) + [1] * (len(b_ids) + 1))
                if return_offsets:
                    out_offsets.append([(0, 0), *a_off, (0, 0), *b_off, (0, 0)])
        out_mask = [[1] * len(x) for x in out_ids]
        self._pad(out_ids, out_types, out_mask, out_offsets if return_offsets else None, padding, max_length,
                  pad_to_multiple_of)
        result = {"input_ids": out_ids, "token_type_ids": out_types, "attention_mask": out_mask}
        if return_offsets:
            result["offsets"] = out_offsets
        if return_tensors is not None:
            return _to_tensors(result, return_tensors)
        if single:
            result = {k: v[0] for k, v in result.items()}
        return result

    def _check_batch(self, texts, what: str) -> list[str]:
        if isinstance(texts, (str, bytes)) or not hasattr(texts, "__len__"):
            raise TypeError(f"{what} must be a str or a list of str, got {type(texts).__name__}: "
                            f"{_short_repr(texts)}")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"{what}[{i}] must be str, got {type(t).__name__}: {_short_repr(t)}")
        return texts

    def _pad(self, ids, types, mask, offsets, padding, max_length, multiple) -> None:
        if padding is False or padding is None or padding == "do_not_pad" or not ids:
            return
        if padding is True or padding == "longest":
            target = max(len(x) for x in ids)
        elif padding == "max_length":
            if max_length is None:
                return  # no length to pad to (BertTokenizerFast: "Default to no padding")
            target = max_length
        else:
            raise BertkitError(f"padding must be False, True, 'longest' or 'max_length', got {padding!r}")
        if multiple is not None:
            if not isinstance(multiple, int) or multiple <= 0:
                raise BertkitError(f"pad_to_multiple_of must be a positive int, got {multiple!r}")
            target = -(-target // multiple) * multiple
        pad = self.pad_token_id
        for i in range(len(ids)):
            n = target - len(ids[i])
            if n > 0:
                ids[i].extend([pad] * n)
                types[i].extend([0] * n)
                mask[i].extend([0] * n)
                if offsets is not None:
                    offsets[i].extend([(0, 0)] * n)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of ids as BertTokenizerFast's WordPiece decoder makes it: pieces joined by spaces, "##" continuations
        glued to the piece before, then per piece the clean-up replacements (" ." -> ".", " ," -> ",", " 's" ->
        "'s", ...). Lowercasing / accent stripping is not undone."""
        out = []
        for i in _as_id_list(ids):
            i = int(i)
            if skip_special_tokens and i in self._special_ids:
                continue
            t = self._id_to_token(i)
            if out:
                t = t[2:] if t.startswith("##") else " " + t
            for dirty, clean in _DECODE_CLEANUP:
                t = t.replace(dirty, clean)
            out.append(t)
        return "".join(out)

    def encode_batch_parallel(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
                              processes: int | None = None, chunk_size: int = 2000, **kwargs) -> dict:
        """Like `self(texts, pairs, **kwargs)` for a large batch: chunks of texts are split into pieces by
        `processes` worker processes (default: all cores); truncation, special tokens and padding then run here.
        Results are identical to the serial call. (The Python lists are built here, which bounds the speed-up;
        `encode_pieces` returns numpy arrays and scales further.)"""
        texts = self._check_batch(texts, "texts")
        if pairs is not None:
            pairs = self._check_batch(pairs, "pairs")
        processes = processes or os.cpu_count() or 1
        if processes <= 1 or len(texts) <= chunk_size:
            return self(texts, pairs, **kwargs)
        offsets = bool(kwargs.get("return_offsets"))
        chunks = [texts[i:i + chunk_size] for i in range(0, len(texts), chunk_size)]
        if pairs is not None:
            chunks += [pairs[i:i + chunk_size] for i in range(0, len(pairs), chunk_size)]
        flats = self._map_chunks(chunks, processes)
        with _gc_paused():
            pieces = []
            for f in flats:
                pieces.extend(self._materialize(f, offsets))
            first = pieces[:len(texts)]
            second = pieces[len(texts):] if pairs is not None else None
            return self._assemble(first, second, **kwargs)

    def encode_pieces(self, texts: Sequence[str], processes: int = 1, chunk_size: int = 2000) -> PieceArrays:
        """WordPiece pieces of every text as flat numpy arrays (no [CLS] / [SEP], no truncation), for corpora: with
        processes > 1, chunks are encoded by worker processes and only concatenated here, so it scales with cores."""
        texts = self._check_batch(texts, "texts")
        if processes <= 1 or len(texts) <= chunk_size:
            with _gc_paused():
                return self._encode_flat(texts)
        chunks = [texts[i:i + chunk_size] for i in range(0, len(texts), chunk_size)]
        return PieceArrays.concatenate(self._map_chunks(chunks, processes))

    def _map_chunks(self, chunks: list[list[str]], processes: int) -> list[PieceArrays]:
        import multiprocessing as mp
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        with mp.get_context(method).Pool(min(processes, len(chunks)), initializer=_worker_init,
                                         initargs=(self,)) as pool:
            return pool.map(_worker_encode, chunks, chunksize=1)

    # ------------------------------------------------------------------ ids <-> tokens

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        if isinstance(ids, (int, np.integer)):
            return self._id_to_token(int(ids))
        return [self._id_to_token(int(i)) for i in _as_id_list(ids)]

    def _id_to_token(self, i: int) -> str:
        if not 0 <= i < self.vocab_size:
            raise IndexError(f"token id {i} is outside the vocab (size {self.vocab_size})")
        return self.ids_to_tokens[i]


@contextlib.contextmanager
def _gc_paused():
    """Pause the cyclic GC: encoding a batch allocates millions of small lists / tuples / ints (none cyclic), and
    each allocation burst would otherwise trigger collections that walk every live object again and again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _short_repr(x, limit: int = 60) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[:limit] + "..."


def _truncation_strategy(truncation, max_length, padding) -> str | None:
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


def _truncated_lengths(na: int, nb: int | None, max_length: int, strategy: str) -> tuple[int, int]:
    """Lengths (first, second) after truncating so that, with [CLS]/[SEP], the input fits max_length.

    longest_first cuts the longer sequence down to the shorter one, then both alternately; when both must be cut
    to the same length and one token is left over it goes to the longer (to the second on a tie).
    """
    budget = max_length - (2 if nb is None else 3)
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


def _to_tensors(result: dict, kind: str) -> dict:
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


_WORKER_TOKENIZER: "Tokenizer | None" = None


def _worker_init(tok: "Tokenizer") -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tok


def _worker_encode(texts: list[str]) -> PieceArrays:
    gc.disable()
    return _WORKER_TOKENIZER._encode_flat(texts)


def _as_id_list(ids) -> list[int]:
    if hasattr(ids, "tolist"):  # torch / numpy
        ids = ids.tolist()
    return list(ids)


# Code points assigned as of Unicode 8.0 (DerivedAge "Present_In=8.0"), as hex ranges: the Rust tokenizer classifies
# characters with Unicode 8.0 tables, so a character assigned later is, to it, unassigned (kept, never punctuation,
# never a mark, never removed). Generated with perl (whose Unicode database carries the Age property):
#   perl -e 'for $cp (0..0x10FFFF) { ... chr($cp) =~ /\p{In=8.0}/ ... }'   (ranges of matching code points)
_ASSIGNED_IN_UNICODE_8 = (
    "0-377 37A-37F 384-38A 38C 38E-3A1 3A3-52F 531-556 559-55F 561-587 589-58A 58D-58F 591-5C7 5D0-5EA 5F0-5F4 "
    "600-61C 61E-70D 70F-74A 74D-7B1 7C0-7FA 800-82D 830-83E 840-85B 85E 8A0-8B4 8E3-983 985-98C 98F-990 993-9A8 "
    "9AA-9B0 9B2 9B6-9B9 9BC-9C4 9C7-9C8 9CB-9CE 9D7 9DC-9DD 9DF-9E3 9E6-9FB A01-A03 A05-A0A A0F-A10 A13-A28 A2A-A30 "
    "A32-A33 A35-A36 A38-A39 A3C A3E-A42 A47-A48 A4B-A4D A51 A59-A5C A5E A66-A75 A81-A83 A85-A8D A8F-A91 A93-AA8 "
    "AAA-AB0 AB2-AB3 AB5-AB9 ABC-AC5 AC7-AC9 ACB-ACD AD0 AE0-AE3 AE6-AF1 AF9 B01-B03 B05-B0C B0F-B10 B13-B28 B2A-B30 "
    "B32-B33 B35-B39 B3C-B44 B47-B48 B4B-B4D B56-B57 B5C-B5D B5F-B63 B66-B77 B82-B83 B85-B8A B8E-B90 B92-B95 B99-B9A "
    "B9C B9E-B9F BA3-BA4 BA8-BAA BAE-BB9 BBE-BC2 BC6-BC8 BCA-BCD BD0 BD7 BE6-BFA C00-C03 C05-C0C C0E-C10 C12-C28 "
    "C2A-C39 C3D-C44 C46-C48 C4A-C4D C55-C56 C58-C5A C60-C63 C66-C6F C78-C7F C81-C83 C85-C8C C8E-C90 C92-CA8 CAA-CB3 "
    "CB5-CB9 CBC-CC4 CC6-CC8 CCA-CCD CD5-CD6 CDE CE0-CE3 CE6-CEF CF1-CF2 D01-D03 D05-D0C D0E-D10 D12-D3A D3D-D44 "
    "D46-D48 D4A-D4E D57 D5F-D63 D66-D75 D79-D7F D82-D83 D85-D96 D9A-DB1 DB3-DBB DBD DC0-DC6 DCA DCF-DD4 DD6 DD8-DDF "
    "DE6-DEF DF2-DF4 E01-E3A E3F-E5B E81-E82 E84 E87-E88 E8A E8D E94-E97 E99-E9F EA1-EA3 EA5 EA7 EAA-EAB EAD-EB9 "
    "EBB-EBD EC0-EC4 EC6 EC8-ECD ED0-ED9 EDC-EDF F00-F47 F49-F6C F71-F97 F99-FBC FBE-FCC FCE-FDA 1000-10C5 10C7 10CD "
    "10D0-1248 124A-124D 1250-1256 1258 125A-125D 1260-1288 128A-128D 1290-12B0 12B2-12B5 12B8-12BE 12C0 12C2-12C5 "
    "12C8-12D6 12D8-1310 1312-1315 1318-135A 135D-137C 1380-1399 13A0-13F5 13F8-13FD 1400-169C 16A0-16F8 1700-170C "
    "170E-1714 1720-1736 1740-1753 1760-176C 176E-1770 1772-1773 1780-17DD 17E0-17E9 17F0-17F9 1800-180E 1810-1819 "
    "1820-1877 1880-18AA 18B0-18F5 1900-191E 1920-192B 1930-193B 1940 1944-196D 1970-1974 1980-19AB 19B0-19C9 "
    "19D0-19DA 19DE-1A1B 1A1E-1A5E 1A60-1A7C 1A7F-1A89 1A90-1A99 1AA0-1AAD 1AB0-1ABE 1B00-1B4B 1B50-1B7C 1B80-1BF3 "
    "1BFC-1C37 1C3B-1C49 1C4D-1C7F 1CC0-1CC7 1CD0-1CF6 1CF8-1CF9 1D00-1DF5 1DFC-1F15 1F18-1F1D 1F20-1F45 1F48-1F4D "
    "1F50-1F57 1F59 1F5B 1F5D 1F5F-1F7D 1F80-1FB4 1FB6-1FC4 1FC6-1FD3 1FD6-1FDB 1FDD-1FEF 1FF2-1FF4 1FF6-1FFE "
    "2000-2064 2066-2071 2074-208E 2090-209C 20A0-20BE 20D0-20F0 2100-218B 2190-23FA 2400-2426 2440-244A 2460-2B73 "
    "2B76-2B95 2B98-2BB9 2BBD-2BC8 2BCA-2BD1 2BEC-2BEF 2C00-2C2E 2C30-2C5E 2C60-2CF3 2CF9-2D25 2D27 2D2D 2D30-2D67 "
    "2D6F-2D70 2D7F-2D96 2DA0-2DA6 2DA8-2DAE 2DB0-2DB6 2DB8-2DBE 2DC0-2DC6 2DC8-2DCE 2DD0-2DD6 2DD8-2DDE 2DE0-2E42 "
    "2E80-2E99 2E9B-2EF3 2F00-2FD5 2FF0-2FFB 3000-303F 3041-3096 3099-30FF 3105-312D 3131-318E 3190-31BA 31C0-31E3 "
    "31F0-321E 3220-32FE 3300-4DB5 4DC0-9FD5 A000-A48C A490-A4C6 A4D0-A62B A640-A6F7 A700-A7AD A7B0-A7B7 A7F7-A82B "
    "A830-A839 A840-A877 A880-A8C4 A8CE-A8D9 A8E0-A8FD A900-A953 A95F-A97C A980-A9CD A9CF-A9D9 A9DE-A9FE AA00-AA36 "
    "AA40-AA4D AA50-AA59 AA5C-AAC2 AADB-AAF6 AB01-AB06 AB09-AB0E AB11-AB16 AB20-AB26 AB28-AB2E AB30-AB65 AB70-ABED "
    "ABF0-ABF9 AC00-D7A3 D7B0-D7C6 D7CB-D7FB E000-FA6D FA70-FAD9 FB00-FB06 FB13-FB17 FB1D-FB36 FB38-FB3C FB3E "
    "FB40-FB41 FB43-FB44 FB46-FBC1 FBD3-FD3F FD50-FD8F FD92-FDC7 FDD0-FDFD FE00-FE19 FE20-FE52 FE54-FE66 FE68-FE6B "
    "FE70-FE74 FE76-FEFC FEFF FF01-FFBE FFC2-FFC7 FFCA-FFCF FFD2-FFD7 FFDA-FFDC FFE0-FFE6 FFE8-FFEE FFF9-1000B "
    "1000D-10026 10028-1003A 1003C-1003D 1003F-1004D 10050-1005D 10080-100FA 10100-10102 10107-10133 10137-1018C "
    "10190-1019B 101A0 101D0-101FD 10280-1029C 102A0-102D0 102E0-102FB 10300-10323 10330-1034A 10350-1037A "
    "10380-1039D 1039F-103C3 103C8-103D5 10400-1049D 104A0-104A9 10500-10527 10530-10563 1056F 10600-10736 "
    "10740-10755 10760-10767 10800-10805 10808 1080A-10835 10837-10838 1083C 1083F-10855 10857-1089E 108A7-108AF "
    "108E0-108F2 108F4-108F5 108FB-1091B 1091F-10939 1093F 10980-109B7 109BC-109CF 109D2-10A03 10A05-10A06 "
    "10A0C-10A13 10A15-10A17 10A19-10A33 10A38-10A3A 10A3F-10A47 10A50-10A58 10A60-10A9F 10AC0-10AE6 10AEB-10AF6 "
    "10B00-10B35 10B39-10B55 10B58-10B72 10B78-10B91 10B99-10B9C 10BA9-10BAF 10C00-10C48 10C80-10CB2 10CC0-10CF2 "
    "10CFA-10CFF 10E60-10E7E 11000-1104D 11052-1106F 1107F-110C1 110D0-110E8 110F0-110F9 11100-11134 11136-11143 "
    "11150-11176 11180-111CD 111D0-111DF 111E1-111F4 11200-11211 11213-1123D 11280-11286 11288 1128A-1128D "
    "1128F-1129D 1129F-112A9 112B0-112EA 112F0-112F9 11300-11303 11305-1130C 1130F-11310 11313-11328 1132A-11330 "
    "11332-11333 11335-11339 1133C-11344 11347-11348 1134B-1134D 11350 11357 1135D-11363 11366-1136C 11370-11374 "
    "11480-114C7 114D0-114D9 11580-115B5 115B8-115DD 11600-11644 11650-11659 11680-116B7 116C0-116C9 11700-11719 "
    "1171D-1172B 11730-1173F 118A0-118F2 118FF 11AC0-11AF8 12000-12399 12400-1246E 12470-12474 12480-12543 "
    "13000-1342E 14400-14646 16800-16A38 16A40-16A5E 16A60-16A69 16A6E-16A6F 16AD0-16AED 16AF0-16AF5 16B00-16B45 "
    "16B50-16B59 16B5B-16B61 16B63-16B77 16B7D-16B8F 16F00-16F44 16F50-16F7E 16F8F-16F9F 1B000-1B001 1BC00-1BC6A "
    "1BC70-1BC7C 1BC80-1BC88 1BC90-1BC99 1BC9C-1BCA3 1D000-1D0F5 1D100-1D126 1D129-1D1E8 1D200-1D245 1D300-1D356 "
    "1D360-1D371 1D400-1D454 1D456-1D49C 1D49E-1D49F 1D4A2 1D4A5-1D4A6 1D4A9-1D4AC 1D4AE-1D4B9 1D4BB 1D4BD-1D4C3 "
    "1D4C5-1D505 1D507-1D50A 1D50D-1D514 1D516-1D51C 1D51E-1D539 1D53B-1D53E 1D540-1D544 1D546 1D54A-1D550 "
    "1D552-1D6A5 1D6A8-1D7CB 1D7CE-1DA8B 1DA9B-1DA9F 1DAA1-1DAAF 1E800-1E8C4 1E8C7-1E8D6 1EE00-1EE03 1EE05-1EE1F "
    "1EE21-1EE22 1EE24 1EE27 1EE29-1EE32 1EE34-1EE37 1EE39 1EE3B 1EE42 1EE47 1EE49 1EE4B 1EE4D-1EE4F 1EE51-1EE52 "
    "1EE54 1EE57 1EE59 1EE5B 1EE5D 1EE5F 1EE61-1EE62 1EE64 1EE67-1EE6A 1EE6C-1EE72 1EE74-1EE77 1EE79-1EE7C 1EE7E "
    "1EE80-1EE89 1EE8B-1EE9B 1EEA1-1EEA3 1EEA5-1EEA9 1EEAB-1EEBB 1EEF0-1EEF1 1F000-1F02B 1F030-1F093 1F0A0-1F0AE "
    "1F0B1-1F0BF 1F0C1-1F0CF 1F0D1-1F0F5 1F100-1F10C 1F110-1F12E 1F130-1F16B 1F170-1F19A 1F1E6-1F202 1F210-1F23A "
    "1F240-1F248 1F250-1F251 1F300-1F579 1F57B-1F5A3 1F5A5-1F6D0 1F6E0-1F6EC 1F6F0-1F6F3 1F700-1F773 1F780-1F7D4 "
    "1F800-1F80B 1F810-1F847 1F850-1F859 1F860-1F887 1F890-1F8AD 1F910-1F918 1F980-1F984 1F9C0 1FFFE-2A6D6 "
    "2A700-2B734 2B740-2B81D 2B820-2CEA1 2F800-2FA1D 2FFFE-2FFFF 3FFFE-3FFFF 4FFFE-4FFFF 5FFFE-5FFFF 6FFFE-6FFFF "
    "7FFFE-7FFFF 8FFFE-8FFFF 9FFFE-9FFFF AFFFE-AFFFF BFFFE-BFFFF CFFFE-CFFFF DFFFE-DFFFF E0001 E0020-E007F "
    "E0100-E01EF EFFFE-10FFFF "
)

# Non-ASCII punctuation as the Rust tokenizer sees it (General_Category P* in Unicode 8.0, with
# _CATEGORY_IN_UNICODE_8), as hex ranges: the character class of the fast path's Unicode regex. Derived from the
# functions above (computing it at import would cost seconds); test_tokenizer checks it still equals them.
_PUNCT_UNICODE_8 = (
    "A1 A7 AB B6-B7 BB BF 37E 387 55A-55F 589-58A 5BE 5C0 5C3 5C6 5F3-5F4 609-60A 60C-60D 61B 61E-61F 66A-66D 6D4 "
    "700-70D 7F7-7F9 830-83E 85E 964-965 970 AF0 DF4 E4F E5A-E5B F04-F12 F14 F3A-F3D F85 FD0-FD4 FD9-FDA 104A-104F "
    "10FB 1360-1368 1400 166D-166E 169B-169C 16EB-16ED 1735-1736 17D4-17D6 17D8-17DA 1800-180A 1944-1945 1A1E-1A1F "
    "1AA0-1AA6 1AA8-1AAD 1B5A-1B60 1BFC-1BFF 1C3B-1C3F 1C7E-1C7F 1CC0-1CC7 1CD3 2010-2027 2030-2043 2045-2051 "
    "2053-205E 207D-207E 208D-208E 2308-230B 2329-232A 2768-2775 27C5-27C6 27E6-27EF 2983-2998 29D8-29DB 29FC-29FD "
    "2CF9-2CFC 2CFE-2CFF 2D70 2E00-2E2E 2E30-2E42 3001-3003 3008-3011 3014-301F 3030 303D 30A0 30FB A4FE-A4FF "
    "A60D-A60F A673 A67E A6F2-A6F7 A874-A877 A8CE-A8CF A8F8-A8FA A8FC A92E-A92F A95F A9C1-A9CD A9DE-A9DF AA5C-AA5F "
    "AADE-AADF AAF0-AAF1 ABEB FD3E-FD3F FE10-FE19 FE30-FE52 FE54-FE61 FE63 FE68 FE6A-FE6B FF01-FF03 FF05-FF0A "
    "FF0C-FF0F FF1A-FF1B FF1F-FF20 FF3B-FF3D FF3F FF5B FF5D FF5F-FF65 10100-10102 1039F 103D0 1056F 10857 1091F 1093F "
    "10A50-10A58 10A7F 10AF0-10AF6 10B39-10B3F 10B99-10B9C 11047-1104D 110BB-110BC 110BE-110C1 11140-11143 "
    "11174-11175 111C5-111C9 111CD 111DB 111DD-111DF 11238-1123D 112A9 114C6 115C1-115D7 11641-11643 1173C-1173E "
    "12470-12474 16A6E-16A6F 16AF5 16B37-16B3B 16B44 1BC9F 1DA87-1DA8B "
)
