"""BERT's WordPiece tokenizer: exact, fast, and impossible to crash.

The pipeline (identical results to transformers' BertTokenizerFast, which is our test oracle):

    text ─> special tokens split out ─> clean ─> CJK isolate ─> [NFD + strip Mn] ─> [lowercase] ─> split on
            ("[MASK]" etc., verbatim,     (drop NUL,           (uncased only)        (uncased)      whitespace and
             case-sensitive, never split)  U+FFFD, controls;                                        punctuation
                                           whitespace -> ' ')                                            │
    ids, offsets <─ [CLS] A [SEP] (B [SEP]) <─ truncation / padding <─ WordPiece (greedy longest match, "##") <─┘

Character classes (Unicode, as the Rust tokenizer defines them; google-research's tokenization.py differs in two
places and we follow the Rust one, as the issue asks):
  * removed by cleaning: U+0000, U+FFFD and every "other" char (general category C*: Cc, Cf, Cs, Co, Cn) except
    tab / newline / carriage return. So U+000B, U+000C, U+001C..U+001F, U+0085 are *removed* (google-research
    keeps U+001C..U+001F as whitespace).
  * whitespace: the Unicode White_Space property (tab, LF, CR, space, U+00A0, U+1680, U+2000..U+200A, U+2028,
    U+2029, U+202F, U+205F, U+3000). google-research uses only Zs, so it keeps U+2028 / U+2029 as characters.
  * punctuation: ASCII non-alphanumeric printable characters and every Unicode P* character; each is its own word.
  * CJK ideographs (the blocks BERT lists) are each their own word.
  * uncased: NFD, drop nonspacing marks (Mn), then lowercase char by char (so a final sigma stays σ, as in Rust).

Offsets are (start, end) character positions into the ORIGINAL text (before any of the above) for every token,
(0, 0) for [CLS] / [SEP] / [PAD]. A normalised character inherits the position of the original character it came
from (an accent stripped from "é" leaves "e" covering the original "é"; a Hangul syllable that NFD splits into three
jamo has all three covering the syllable).

WordPiece: for each word, take the longest vocab entry that prefixes the rest of the word ("##"-prefixed after the
first piece); a word with no full segmentation, or longer than 100 characters, becomes one [UNK] covering the word.

Speed. Tokenization is a pure function of the word, and words repeat (Zipf), so every word's pieces are cached
(word -> piece ids, piece start offsets). Batch calls on ASCII text (most real text) never loop over characters in
Python: the whole batch is joined into one string, lowercased and split into words by one compiled regex (C code),
piece ids come from the word cache through `map`/`chain` (C loops), and offsets are computed arithmetically with
numpy from the match positions. Non-ASCII text takes the general path (per-character normalisation with an
alignment array), still through the word cache.

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

import hashlib
import json
import os
import re
import unicodedata
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from bertkit.errors import VocabError

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
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_removed(c: str) -> bool:
    """Dropped by cleaning: NUL, U+FFFD, and every C* char except tab / LF / CR."""
    if c in "\t\n\r":
        return False
    return c == "\x00" or c == "\ufffd" or unicodedata.category(c)[0] == "C"


def _is_cjk(c: str) -> bool:
    cp = ord(c)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_punct(c: str) -> bool:
    return c in _ASCII_PUNCT or unicodedata.category(c)[0] == "P"


def _char_class_regex(pred, lo: int = 0x80, hi: int = 0x110000) -> str:
    """A regex character-class body listing the code points in [lo, hi) for which pred holds, as ranges."""
    parts, start = [], None
    for cp in range(lo, hi + 1):
        hit = cp < hi and pred(chr(cp))
        if hit and start is None:
            start = cp
        elif not hit and start is not None:
            a, b = start, cp - 1
            parts.append(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}")
            start = None
    return "".join(parts)


# ASCII fast path: after lowercasing, a word is a run of letters/digits, and every other printable char is
# punctuation (ASCII has no other symbols), so one regex splits a whole batch.
_ASCII_WORD_RE = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
# ASCII chars cleaning removes (C0 controls except \t \n \r, and DEL). Text containing them takes the general path.
_ASCII_REMOVED_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class _Tables:
    """Per-character normalisation of non-ASCII text, computed lazily and memoised (the Unicode database is large
    and most text uses few distinct characters)."""

    def __init__(self, lowercase: bool, strip_accents: bool):
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self.norm: dict[str, str] = {}   # char -> its normalised form ("" when removed, " " when whitespace)
        self.kind: dict[str, int] = {}   # normalised char -> 0 letter-like, 1 whitespace, 2 isolated (punct / CJK)

    def normalize_char(self, c: str) -> str:
        n = self.norm.get(c)
        if n is None:
            n = self._normalize_char(c)
            self.norm[c] = n
        return n

    def _normalize_char(self, c: str) -> str:
        if _is_removed(c):
            return ""
        if c in _WHITESPACE:
            return " "
        n = c
        if self.strip_accents:
            n = "".join(x for x in unicodedata.normalize("NFD", n) if unicodedata.category(x) != "Mn")
        if self.lowercase:
            # char by char: str.lower() on a whole string turns a final Σ into ς, Rust's per-char lowercase does not
            n = "".join(x.lower() for x in n)
        return n

    def kind_of(self, c: str) -> int:
        k = self.kind.get(c)
        if k is None:
            k = 1 if c in _WHITESPACE else 2 if (_is_punct(c) or _is_cjk(c)) else 0
            self.kind[c] = k
        return k


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
class _Seq:
    """One encoded text before special tokens: piece ids and their character offsets."""
    ids: list[int]
    offsets: list[tuple[int, int]]


class Tokenizer:
    """WordPiece tokenizer with BERT semantics. See the module docstring for the algorithm."""

    def __init__(self, vocab: str | os.PathLike | dict[str, int], lowercase: bool = True,
                 strip_accents: bool | None = None):
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
        self._tables = _Tables(self.lowercase, self.strip_accents)
        # word -> (piece ids, piece start offsets within the word); see _wordpiece
        self._cache: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
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
        (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        return directory

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase})"

    # ------------------------------------------------------------------ words

    @staticmethod
    def _check_text(text, what: str = "text") -> str:
        if not isinstance(text, str):
            raise TypeError(f"{what} must be str, got {type(text).__name__}: {text!r:.60}")
        return text

    def _words(self, text: str) -> list[tuple[str, int, int, list[int] | None]]:
        """Split text into (word, start, end, alignment) in original-text character positions.

        alignment is None when the word is a verbatim slice text[start:end] (special tokens, ASCII words);
        otherwise alignment[i] is the original position of the word's i-th normalised character.
        """
        out = []
        pos = 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                self._segment_words(text, pos, m.start(), out)
            out.append((m.group(), m.start(), m.end(), None))
            pos = m.end()
        if pos < len(text):
            self._segment_words(text, pos, len(text), out)
        return out

    def _segment_words(self, text: str, lo: int, hi: int, out: list) -> None:
        seg = text[lo:hi]
        if seg.isascii() and not _ASCII_REMOVED_RE.search(seg):
            if self.lowercase:
                seg = seg.lower()
            for m in _ASCII_WORD_RE.finditer(seg):
                out.append((m.group(), lo + m.start(), lo + m.end(), None))
            return
        # General path: normalise char by char, remembering each normalised char's original position, then split.
        tables = self._tables
        word: list[str] = []
        align: list[int] = []

        def flush():
            if word:
                out.append(("".join(word), align[0], align[-1] + 1, align.copy()))
                word.clear()
                align.clear()

        for i, c in enumerate(seg, lo):
            for n in tables.normalize_char(c):
                k = tables.kind_of(n)
                if k == 0:
                    word.append(n)
                    align.append(i)
                else:
                    flush()
                    if k == 2:
                        out.append((n, i, i + 1, [i]))
        flush()

    def basic_tokenize(self, text: str) -> list[str]:
        """Words after cleaning, CJK isolation, lowercasing / accent stripping and punctuation split.

        Special tokens ("[MASK]", ...) appearing verbatim in text stay whole words.
        """
        self._check_text(text)
        return [w for w, _, _, _ in self._words(text)]

    # ------------------------------------------------------------------ WordPiece

    def _wordpiece(self, word: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Greedy longest-match-first segmentation: (piece ids, piece start positions within word). Memoised."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        vocab = self.vocab
        n = len(word)
        ids: list[int] = []
        starts: list[int] = []
        if word in self._special_set:
            res = ((vocab[word],), (0,))
        elif n > MAX_INPUT_CHARS_PER_WORD:
            res = ((self.unk_token_id,), (0,))
        else:
            start = 0
            while start < n:
                end = min(n, start + self._max_piece)
                prefix = "##" if start else ""
                while end > start:
                    i = vocab.get(prefix + word[start:end])
                    if i is not None:
                        break
                    end -= 1
                else:
                    ids, starts = [self.unk_token_id], [0]
                    break
                ids.append(i)
                starts.append(start)
                start = end
            res = (tuple(ids), tuple(starts))
        if len(self._cache) < 1_000_000:  # bound memory on adversarial input
            self._cache[word] = res
        return res

    def tokenize(self, text: str) -> list[str]:
        """WordPiece pieces of text (continuation pieces start with "##"), without [CLS] / [SEP]."""
        self._check_text(text)
        itt = self.ids_to_tokens
        return [itt[i] for i in self._encode_one(text).ids]

    def _encode_one(self, text: str) -> _Seq:
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        for word, start, end, align in self._words(text):
            pids, pstarts = self._wordpiece(word)
            if len(pids) == 1:
                ids.append(pids[0])
                offsets.append((start, end))
                continue
            bounds = pstarts + (len(word),)
            for k, pid in enumerate(pids):
                a, b = bounds[k], bounds[k + 1]
                ids.append(pid)
                if align is None:
                    offsets.append((start + a, start + b))
                else:
                    offsets.append((align[a], align[b - 1] + 1))
        return _Seq(ids, offsets)

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


def _as_id_list(ids) -> list[int]:
    if hasattr(ids, "tolist"):  # torch / numpy
        ids = ids.tolist()
    return list(ids)
