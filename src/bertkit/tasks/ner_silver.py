"""The silver NER file (spaCy tags over 1,200 BBC articles), rebuilt from position-only annotations shipped in the
package and the BBC corpus `bertkit.datasets` fetches, so `bertkit task-data ner|qa|qa2` runs on any clone. The
annotation format: docs/architecture.md.
"""

from __future__ import annotations

import itertools
import lzma
import os
import re
from pathlib import Path

from bertkit import datasets
from bertkit.errors import DataError
from bertkit.tasks.metrics import get_entities
from bertkit.tasks.readers import Sentence, read_conll, write_conll

__all__ = ["ANNOTATIONS", "TYPES", "rebuild", "encode"]

ANNOTATIONS = Path(__file__).with_name("resources") / "bbc_ner_silver.tsv.xz"
TYPES = ("CARDINAL", "DATE", "EVENT", "FAC", "GPE", "LANGUAGE", "LAW", "LOC", "MONEY", "NORP", "ORDINAL", "ORG",
         "PERCENT", "PERSON", "PRODUCT", "QUANTITY", "TIME", "WORK_OF_ART")
_SPACE = re.compile(r"\s*")
_WORD = re.compile(r"\S+")
_ENTITY = re.compile(r"(\d+)(!?)([A-Z])(\d*)")


def article_body(raw: bytes) -> str:
    """The text the tagger was given: the article after its headline line, as make_bbc_ner_silver.py built it."""
    text = raw.decode("utf-8", errors="replace").replace("Â£", "£")
    return " ".join(line.strip() for line in text.splitlines()[1:] if line.strip())


def _tokens(body: str, splits: list[str], where: str) -> list[str]:
    """The article's tokens: each starts at the next non-space character and runs for its stored length, or to the
    next white space."""
    out, pos = [], 0
    for length in splits:
        pos = _SPACE.match(body, pos).end()
        end = pos + int(length) if length else (_WORD.match(body, pos).end() if _WORD.match(body, pos) else pos)
        if end <= pos or end > len(body):
            raise DataError(f"{where}: token {len(out) + 1} does not fit the article text (a different corpus "
                            f"version?)")
        out.append(body[pos:end])
        pos = end
    if body[pos:].strip():
        raise DataError(f"{where}: the article text goes on past its last token (a different corpus version?)")
    return out


def _tags(n: int, entities: str, where: str) -> list[str]:
    tags, pos = ["O"] * n, 0
    for item in entities.split():
        m = _ENTITY.fullmatch(item)
        if not m or ord(m.group(3)) - 65 >= len(TYPES):
            raise DataError(f"{where}: malformed entity {item!r}")
        start = pos + int(m.group(1))
        end = start + int(m.group(4) or 1)
        if end > n:
            raise DataError(f"{where}: entity {item!r} runs past the last token")
        typ = TYPES[ord(m.group(3)) - 65]
        tags[start:end] = [f"I-{typ}"] * (end - start)
        if not m.group(2):
            tags[start] = f"B-{typ}"
        pos = end
    return tags


def _article(line: str, root: Path) -> list[Sentence]:
    name, splits, sentences, entities = line.split("\t")
    path = root / name
    where = f"{ANNOTATIONS.name}: {name}"
    try:
        body = article_body(path.read_bytes())
    except OSError as e:
        raise DataError(f"{where}: cannot read the BBC article {path}: {e.strerror or e}") from None
    tokens = _tokens(body, splits.split(","), where)
    tags = _tags(len(tokens), entities, where)
    lengths = [int(x) for x in sentences.split(",")]
    if sum(lengths) != len(tokens):
        raise DataError(f"{where}: sentence lengths add up to {sum(lengths)}, the article has {len(tokens)} tokens")
    starts = [0, *itertools.accumulate(lengths)]
    return [Sentence(tokens[a:b], tags[a:b], name) for a, b in zip(starts, starts[1:])]


def rebuild(out: str | os.PathLike, bbc_root: str | os.PathLike | None = None) -> Path:
    """Write the silver NER CoNLL file to `out` (atomically) from the shipped annotations and the BBC corpus
    (default: `bertkit.datasets.bbc_dir()`, fetched when absent). DataError when the corpus does not match."""
    root = Path(bbc_root) if bbc_root is not None else datasets.bbc_dir()
    lines = lzma.decompress(ANNOTATIONS.read_bytes()).decode("utf-8").splitlines()
    return write_conll(out, [s for line in lines for s in _article(line, root)])


def encode(conll: str | os.PathLike, bbc_root: str | os.PathLike) -> bytes:
    """The xz-compressed annotations of a silver CoNLL file (.gz or plain) over the BBC corpus in `bbc_root`."""
    docs: dict[str, list[Sentence]] = {}
    for s in read_conll(conll):
        docs.setdefault(s.doc, []).append(s)
    return lzma.compress("".join(_encode_doc(name, sents, Path(bbc_root)) for name, sents in docs.items())
                         .encode("utf-8"), preset=9 | lzma.PRESET_EXTREME)


def _encode_doc(name: str, sents: list[Sentence], root: Path) -> str:
    body = article_body((root / name).read_bytes())
    toks = [t for s in sents for t in s.words]
    tags = [tag for s in sents for tag in s.tags]
    starts, pos = [], 0
    for t in toks:
        pos = _SPACE.match(body, pos).end()
        if body[pos:pos + len(t)] != t:
            raise DataError(f"{name}: token {t!r} not found in the article at {pos}")
        starts.append(pos)
        pos += len(t)
    glued = [i + 1 < len(toks) and starts[i + 1] == starts[i] + len(t) for i, t in enumerate(toks)]
    splits = ",".join(str(len(t)) if g else "" for t, g in zip(toks, glued))
    ents, prev = [], 0
    for typ, i, last in get_entities(tags):          # "!": an entity that starts at an I- tag
        n = last + 1 - i
        ents.append(f"{i - prev}{'' if tags[i][0] == 'B' else '!'}{chr(65 + TYPES.index(typ))}{n if n > 1 else ''}")
        prev = last + 1
    return "\t".join([name, splits, ",".join(str(len(s.words)) for s in sents), " ".join(ents)]) + "\n"
