"""Pre-tokenization, the second stage: text -> words with (start, end) character offsets into the original text.
Special tokens found verbatim are words first; the rest splits on whitespace and punctuation, each punctuation or
CJK character a word. Plain ASCII splits by a regex; other text is normalised first, its words carrying alignments."""

from __future__ import annotations

import functools
import re
from typing import Iterable, Sequence

from bertkit.tokenizer.normalize import (CJK_RANGES, PUNCT_UNICODE_8, WHITESPACE, hex_ranges, is_cjk, is_punct,
                                        LazyMap, Normalizer)

# Each match is a word with the whitespace before it, so word ends are running sums of match lengths
ASCII_TOKEN_RE = re.compile(r"[ \t\n\r]*(?:[A-Za-z0-9]+|[!-/:-@\[-`{-~])")
# ASCII chars that cleaning removes (C0 controls other than tab / LF / CR, and DEL): such text takes the general path.
_ASCII_REMOVED_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
ASCII_WORD_RE = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")


@functools.cache
def unicode_token_re() -> re.Pattern:
    """The fast path's regex for normalised non-ASCII text (whitespace is then only ' '): a word is a run of chars
    that are neither whitespace nor punctuation / CJK; each punctuation / CJK char is a word of its own."""
    ranges = hex_ranges(PUNCT_UNICODE_8) + list(CJK_RANGES)
    iso = "!-/:-@\\[-`{-~" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)
    return re.compile(f"[ \t\n\r]*(?:[^ \t\n\r{iso}]+|[{iso}])")


# General path: words in the string of char classes ("a" word char, " " space, "." isolated)
_CLASS_WORD_RE = re.compile(r"a+|\.")


def _class_of(c: str) -> str:
    if c in WHITESPACE:
        return " "
    return "." if (is_punct(c) or is_cjk(c)) else "a"


def tokens_with_space(text: str, pattern: re.Pattern) -> list[str]:
    """The fast path's matches of pattern in text: each word with the whitespace before it."""
    # no trailing whitespace, so the regex never fails a match (failing from each position of a long tail: quadratic)
    return pattern.findall(text.rstrip(" \t\n\r"))


class PreTokenizer:
    """Words of a text with their offsets, and which splitter each text of a batch takes."""

    def __init__(self, lowercase: bool, strip_accents: bool, special_tokens: Iterable[str]):
        self.lowercase = lowercase
        self.normalizer = Normalizer(lowercase, strip_accents)
        self.cls = LazyMap(lambda cp: _class_of(chr(cp)))
        # special tokens are matched verbatim in the original text; longest first so a longer one wins
        self.special_re = re.compile("|".join(re.escape(t) for t in sorted(special_tokens, key=len, reverse=True)))

    def words(self, text: str) -> tuple[list[str], list[int], list[int], list]:
        """(words, starts, ends, alignments) of one text in original-text positions; alignments[k] is None when word
        k is text[start:end] up to ASCII lowercasing, else the original position of each of its characters."""
        words: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        aligns: list = []
        pos = 0
        for m in self.special_re.finditer(text):  # special tokens are matched first, in the raw text
            if m.start() > pos:
                self._segment(text[pos:m.start()], pos, words, starts, ends, aligns)
            words.append(m.group())
            starts.append(m.start())
            ends.append(m.end())
            aligns.append(None)
            pos = m.end()
        if pos < len(text):
            self._segment(text[pos:] if pos else text, pos, words, starts, ends, aligns)
        return words, starts, ends, aligns

    def _segment(self, seg: str, base: int, words, starts, ends, aligns) -> None:
        """Append the words of seg (no special tokens in it; positions offset by base) to the lists."""
        if seg.isascii() and not _ASCII_REMOVED_RE.search(seg):
            if self.lowercase:
                seg = seg.lower()
            pos = base
            for tok in tokens_with_space(seg, ASCII_TOKEN_RE):
                pos += len(tok)
                word = tok.lstrip(" \t\n\r")
                words.append(word)
                starts.append(pos - len(word))
                ends.append(pos)
                aligns.append(None)
            return
        norm, align = self.normalizer.normalize(seg, base)
        self._split(norm, align, base, words, starts, ends, aligns)

    def _split(self, norm: str, align: list[int] | None, base: int, words, starts, ends, aligns) -> None:
        cls = norm.translate(self.cls)
        for m in _CLASS_WORD_RE.finditer(cls):
            s, e = m.span()
            words.append(norm[s:e])
            if align is None:
                starts.append(base + s)
                ends.append(base + e)
                aligns.append(None)
            else:
                starts.append(align[s])
                ends.append(align[e - 1] + 1)
                aligns.append(align[s:e])

    def basic_tokenize(self, text: str) -> list[str]:
        """Words after cleaning, CJK isolation, lowercasing / accent stripping and punctuation split."""
        if text.isascii() and not _ASCII_REMOVED_RE.search(text) and "[" not in text:
            low = text.lower() if self.lowercase else text
            return ASCII_WORD_RE.findall(low)
        return self.words(text)[0]

    def plain_ascii(self, text: str) -> bool:
        """Whether text needs no normalisation beyond lowercasing (ASCII, no removed chars, no special tokens)."""
        return text.isascii() and not _ASCII_REMOVED_RE.search(text) and not self.special_re.search(text)

    def route(self, texts: Sequence[str]) -> tuple[dict[str, list[int]], list[str | None]]:
        """Which splitter each text takes: (text indices per route, each fast-route text prepared for its regex).
        "ascii": lowercased for ASCII_TOKEN_RE; "unicode": normalised one char to one char, for unicode_token_re();
        "general" (special tokens, removed chars, expansions, reordering): words()."""
        routes: dict[str, list[int]] = {"ascii": [], "unicode": [], "general": []}
        prepared: list[str | None] = [None] * len(texts)
        one_to_one = self.normalizer.one_to_one
        for i, t in enumerate(texts):
            if self.plain_ascii(t):
                prepared[i] = t.lower() if self.lowercase else t
                routes["ascii"].append(i)
            elif t.isascii() or self.special_re.search(t):
                routes["general"].append(i)
            else:
                prepared[i] = one_to_one(t)
                routes["unicode" if prepared[i] is not None else "general"].append(i)
        return routes, prepared
