"""Raw text -> a stream of documents (lists of sentences), one document in memory at a time; bad input is skipped
and counted, never kept whole (the layouts, the skips and the sentence splitter: docs/pretraining.md, "Corpus")."""

from __future__ import annotations

import glob as globlib
import gzip
import os
import re
import zlib
from dataclasses import dataclass, fields
from itertools import chain, islice
from pathlib import Path
from typing import Iterator

from bertkit.errors import DataError

__all__ = ["Document", "CorpusStats", "expand_corpus", "iter_documents", "split_sentences", "detect_format"]

FORMATS = ("auto", "lines", "prose")


@dataclass
class Document:
    sentences: list[str]
    source: str        # file the document came from
    index: int         # running document number in the whole corpus stream (0-based): a stable document id


class Counts:
    """A dataclass of counters: a worker's counts are added to the total with `merge`."""

    def merge(self, other: "Counts") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class CorpusStats(Counts):
    files: int = 0
    bytes: int = 0                 # raw text bytes read (after gunzip)
    documents: int = 0
    sentences: int = 0
    empty_files: int = 0
    binary_files: int = 0
    invalid_utf8_lines: int = 0
    binary_lines: int = 0
    long_lines: int = 0
    split_documents: int = 0       # over-long documents cut at max_document_lines (not a loss of text)

    def skipped(self) -> dict[str, int]:
        names = ("empty_files", "binary_files", "invalid_utf8_lines", "binary_lines", "long_lines")
        return {n: getattr(self, n) for n in names}


# ------------------------------------------------------------------------------------------------- file discovery

def expand_corpus(patterns: str | os.PathLike | list) -> list[Path]:
    """Paths, directories (all files below, sorted) and globs -> a sorted, de-duplicated file list."""
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    out: list[Path] = []
    for pat in map(str, patterns):
        paths = [Path(pat)]
        if any(ch in pat for ch in "*?["):
            paths = [Path(m) for m in sorted(globlib.glob(pat, recursive=True))]
            if not paths:
                raise DataError(f"corpus pattern {pat!r} matches no file")
        for p in paths:
            if p.is_dir():
                out.extend(sorted(q for q in p.rglob("*") if q.is_file() and not q.name.startswith(".")))
            elif p.is_file():
                out.append(p)
            else:
                raise DataError(f"corpus file {p} does not exist")
    unique: dict[Path, Path] = {}
    for p in out:
        unique.setdefault(p.resolve(), p)           # a file named twice is read once, where first named
    files = list(unique.values())
    if not files:
        raise DataError(f"corpus {list(map(str, patterns))} holds no files")
    return files


# -------------------------------------------------------------------------------------------------- line reading

_CONTROL = re.compile(rb"[\x00-\x08\x0e-\x1f\x7f]")   # control bytes other than tab / newline / cr / ff
_BINARY_PROBE = 8192


def _iter_lines(path: Path, stats: CorpusStats, max_line_bytes: int) -> Iterator[str]:
    """Decoded, stripped lines of one file ('' for blank lines); bad lines skipped and counted."""
    try:
        f = open(path, "rb")
        if f.peek(2)[:2] == b"\x1f\x8b":              # gzip, told by its magic bytes
            f = gzip.GzipFile(fileobj=f)
    except OSError as e:
        raise DataError(f"cannot read corpus file {path}: {e}") from None
    stats.files += 1
    with f:
        try:
            head = f.peek(_BINARY_PROBE)[:_BINARY_PROBE]
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"corpus file {path} is not readable gzip: {e}") from None
        if not head.strip():
            stats.empty_files += 1
            return
        if b"\x00" in head:
            stats.binary_files += 1
            return
        while True:
            try:
                raw = f.readline(max_line_bytes + 1)
            except (OSError, EOFError, zlib.error) as e:   # zlib.error: a broken deflate stream
                raise DataError(f"corpus file {path} is truncated or corrupt: {e}") from None
            if not raw:
                return
            stats.bytes += len(raw)
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                stats.long_lines += 1
                while raw and not raw.endswith(b"\n"):   # drain the rest of the line without keeping it
                    raw = f.readline(1 << 20)
                    stats.bytes += len(raw)
                continue
            if _CONTROL.search(raw):
                stats.binary_lines += 1
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                stats.invalid_utf8_lines += 1
                continue
            yield line.strip()


# ------------------------------------------------------------------------------------------------ sentence split

# Words that end with a period but rarely end a sentence (lower-cased, without the final period).
ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st rev hon gen col lt sgt capt cmdr adm gov sen rep pres supt insp det messrs mme mlle
inc ltd co corp plc llc bros dept univ assn est approx fig figs vol vols no nos pp p ed eds al vs etc cf
e.g i.e a.m p.m viz ca
jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu thur thurs fri sat sun
""".split())
# Words that usually open a sentence: after a dotted acronym ("the U.S. The ..."), they signal a real boundary.
_OPENERS = frozenset("""
the a an this that these those it its he she they we i you his her their our my there here but and or so
yet however meanwhile in on at for if when while after before as since although though mr mrs ms dr
""".split())

_BOUNDARY = re.compile(r"""
    (?P<end>[.!?\u2026]+)                 # sentence-final punctuation
    (?P<close>['"\u2019\u201d)\]]*)      # closing quotes / brackets that belong to the sentence
    (?P<space>\s+)
    (?=[\"'\u2018\u201c(\[]*[A-Z0-9\u00C0-\u00DE])   # next sentence opens with a capital or a digit
""", re.VERBOSE)
_ACRONYM = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]?$")


def _is_false_boundary(text: str, m: re.Match) -> bool:
    if m.group("end") != ".":
        return False
    end = m.start("end")
    before = text[max(0, end - 40):end].split()      # a bounded window: searching from 0 would be quadratic
    if not before or text[end - 1].isspace():
        return False
    word = before[-1].lstrip("\"'(\u2018\u201c[")
    low = word.lower()
    if low in ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isalpha() and word.isupper():        # an initial: "J. R. R. Tolkien"
        return True
    if _ACRONYM.match(word + "."):                                  # "U.S.", "e.g.", "Ph.D."
        nxt = text[m.end():].split(None, 1)
        opener = nxt[0].strip("\"'\u2018\u201c(").lower() if nxt else ""
        return opener not in _OPENERS
    return False


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences (the rules: docs/pretraining.md, "Corpus")."""
    text = text.strip()
    if not text:
        return []
    out, start = [], 0
    for m in _BOUNDARY.finditer(text):
        if _is_false_boundary(text, m):
            continue
        end = m.end("close")
        sentence = text[start:end].strip()
        if sentence:
            out.append(sentence)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


# ------------------------------------------------------------------------------------------------------ documents

def detect_format(lines: list[str]) -> str:
    """'prose' if the sample holds clearly more than one sentence per non-blank line, else 'lines'."""
    body = [ln for ln in lines if ln]
    if not body:
        return "lines"
    per_line = sum(len(split_sentences(ln)) for ln in body) / len(body)
    return "prose" if per_line > 1.3 else "lines"


_ENDS_SENTENCE = re.compile(r"""[.!?\u2026:;'"\u2019\u201d)\]]$""")


def _prose_paragraphs(lines: list[str]) -> list[str]:
    """Join hard-wrapped lines: a line that does not end like a sentence, followed by one that starts with a
    lower-case letter or a digit, continues the same paragraph."""
    out: list[str] = []
    for line in lines:
        if out and not _ENDS_SENTENCE.search(out[-1]) and (line[0].islower() or line[0].isdigit()):
            out[-1] += " " + line
        else:
            out.append(line)
    return out


def _sentences(lines: list[str], fmt: str) -> list[str]:
    if fmt == "lines":
        return lines
    return [s for para in _prose_paragraphs(lines) for s in split_sentences(para)]


def iter_documents(corpus, fmt: str = "auto", stats: CorpusStats | None = None, max_line_bytes: int = 256 * 1024,
                   select=None, max_document_lines: int = 10_000) -> Iterator[Document]:
    """Stream documents from `corpus` (paths / dirs / globs, or a list of them).

    `select(doc_index) -> bool`, when given, keeps only some documents before their sentences are split (parallel
    workers each take their share of one stream this way). Document ids (`Document.index`) count every document of
    the stream, selected or not, so they are the same for any number of workers.
    """
    if fmt not in FORMATS:
        raise DataError(f"corpus format {fmt!r} is not one of {FORMATS}")
    stats = stats if stats is not None else CorpusStats()
    files = expand_corpus(corpus)
    index = 0
    for path in files:
        lines = _iter_lines(path, stats, max_line_bytes)
        file_fmt = fmt
        if fmt == "auto":
            sample = list(islice(lines, 200))
            file_fmt = detect_format(sample)
            lines = chain(sample, lines)
        current: list[str] = []
        for line in chain(lines, [""]):           # a final blank line closes the last document of each file
            if line:
                current.append(line)
                if len(current) < max_document_lines:
                    continue
                stats.split_documents += 1
            if not current:
                continue
            keep = select is None or select(index)
            if keep:
                sentences = _sentences(current, file_fmt)
                if sentences:
                    stats.documents += 1
                    stats.sentences += len(sentences)
                    yield Document(sentences, str(path), index)
            index += 1
            current = []
