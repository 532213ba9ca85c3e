"""Readers for fine-tuning data: table files (CSV / TSV / JSONL), CoNLL token files, SQuAD JSON.

Each record remembers where it came from (`source = "file:line"`), so a later error (an unknown label in dev, an
answer that does not fit) still names the file and line. Nothing is dropped silently: docs/architecture.md.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bertkit.atomic import replacing, write_text
from bertkit.errors import DataError
from bertkit.textfiles import parse_json, read_text

__all__ = ["TextExample", "Sentence", "SquadExample", "SquadData", "LabelMap", "read_table", "read_conll",
           "read_squad", "table_rows", "write_table", "write_jsonl", "write_conll", "write_squad"]


# ------------------------------------------------------------------------------------------------------ helpers

def _open_text(path: Path):
    """textfiles.read_text (.gz, BOM, UTF-8 errors naming file and line) as a stream with line endings kept."""
    try:
        return io.StringIO(read_text(path), newline="")
    except OSError as e:                        # no permission
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None


_TABLE_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".tsv": "tsv", ".tab": "tsv", ".csv": "csv"}


def _table_format(path: Path) -> str:
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a data file")
    suffixes = [s for s in path.suffixes if s != ".gz"]
    ext = suffixes[-1].lower() if suffixes else ""
    if ext not in _TABLE_FORMATS:
        raise DataError(f"{path}: unknown table format {ext or '(no extension)'!r}; use .csv, .tsv or .jsonl")
    return _TABLE_FORMATS[ext]


# --------------------------------------------------------------------------------------------------- table files

@dataclass
class TextExample:
    text: str
    text_pair: str | None = None
    label: str | float | list[str] | None = None   # name, number (regression) or names (multi-label); None = unlabelled
    source: str = ""                                # "file:line", for error messages


# csv's default field limit (131072 characters) refuses a long document; csv keeps the limit in a C long, and
# 2**31 - 1 fits one on every platform (sys.maxsize overflows Windows' 32-bit long)
_CSV_FIELD_LIMIT = 2**31 - 1


def column_names(names) -> str:
    """The columns of a row or header for an error line: the first 10 quoted, then how many there are."""
    names = list(names)
    shown = ", ".join(map(repr, names[:10]))
    return shown if len(names) <= 10 else f"{shown}, ... ({len(names)} columns)"


def table_rows(path: Path):
    """(line_number, dict row) of a CSV/TSV/JSONL file; line numbers are 1-based physical lines."""
    fmt = _table_format(path)
    with _open_text(path) as f:
        if fmt == "jsonl":
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = parse_json(line, f"{path}:{i}")
                except DataError as e:
                    raise DataError(f"{e}{_json_document_hint(path, i)}") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{i}: expected a JSON object per line, got {type(row).__name__}")
                yield i, row
            return
        if csv.field_size_limit() < _CSV_FIELD_LIMIT:
            csv.field_size_limit(_CSV_FIELD_LIMIT)
        reader = csv.DictReader(f, delimiter="\t" if fmt == "tsv" else ",",
                                quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL)
        try:
            if reader.fieldnames is None:
                return
            names = reader.fieldnames
            counts = Counter(names)          # a header may have 100,000 columns: no pairwise comparison
            twice = next((n for n in names if counts[n] > 1), None)
            if twice is not None:            # a dict row keeps only the last of two same-named columns
                raise DataError(f"{path}: duplicate column {twice!r} in the header")
            for row in reader:
                line = reader.line_num  # the physical line where this row ends
                if None in row:  # more fields than the header
                    raise DataError(f"{path}:{line}: {len(reader.fieldnames) + len(row[None])} fields, the header "
                                    f"has {len(reader.fieldnames)} ({column_names(reader.fieldnames)})")
                yield line, row
        except csv.Error as e:
            raise DataError(f"{path}:{reader.line_num}: not valid {fmt.upper()} ({e})") from None


def read_table(path: str | Path, *, require_pair: bool = False, require_label: bool = True,
               multilabel_sep: str = "|") -> list[TextExample]:
    """A CSV / TSV / JSONL file with columns text, text_pair (unless `require_pair`, optional) and label (unless
    `require_label`, optional). A multi-label cell is a JSON list or names joined by `multilabel_sep`; labels stay
    strings (numbers too) and `LabelMap` / the task decide what they mean."""
    path = Path(path)
    out: list[TextExample] = []
    for line, row in table_rows(path):
        if not out:                     # the first row: the columns it needs are there
            needed = ["text"] + (["text_pair"] if require_pair else []) + (["label"] if require_label else [])
            missing = [c for c in needed if c not in row]
            if missing:
                raise DataError(f"{path}:{line}: missing column(s) {', '.join(map(repr, missing))}; "
                                f"found {column_names(row)}")
        text, pair = (_cell(path, line, c, row.get(c)) for c in ("text", "text_pair"))
        label = row.get("label")
        label = [_cell(path, line, "label", x) for x in label] if isinstance(label, list) \
            else _cell(path, line, "label", label)
        if text is None or not text.strip():
            raise DataError(f"{path}:{line}: empty 'text'")
        if require_pair and (pair is None or not pair.strip()):
            raise DataError(f"{path}:{line}: empty 'text_pair'")
        if isinstance(label, str):
            label = label.strip() or None
        if require_label and label is None:
            raise DataError(f"{path}:{line}: missing value in column 'label'")
        out.append(TextExample(text=text, text_pair=pair, label=label, source=f"{path}:{line}"))
    if not out:
        raise DataError(f"{path}: no examples")
    return out


def _cell(path: Path, line: int, column: str, value) -> str | None:
    """A cell as text: numbers (JSONL) read as their text, as a CSV cell would; a JSON object or list is refused."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        raise DataError(f"{path}:{line}: column {column!r} holds {json.dumps(value)[:40]}, not a text or number")
    return str(value)


def split_multilabel(label: str | list[str], sep: str = "|") -> list[str]:
    if isinstance(label, list):
        return label
    return [x.strip() for x in label.split(sep) if x.strip()]


def write_table(path: str | Path, rows: list[dict]) -> Path:
    """Write dict rows as CSV / TSV / JSONL (by extension), whole; the builders in tasks.data use it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = _table_format(path)
    if fmt == "jsonl":
        return write_jsonl(path, rows)
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if fmt == "tsv" else ",",
                           quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL,
                           escapechar="\\" if fmt == "tsv" else None)
        w.writeheader()
        w.writerows(rows)
    return path


def write_jsonl(path: Path, records) -> Path:
    """One JSON object per line, written whole (bertkit.atomic)."""
    return write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


# ------------------------------------------------------------------------------------------------------ labels

_NUMBER = re.compile(r"^-?\d+$")


@dataclass
class LabelMap:
    """id <-> label name. Built from training labels: integer-looking labels sort numerically ("0" < "1" < "10"),
    others alphabetically, so the same training file always gives the same ids."""
    labels: list[str]

    @classmethod
    def from_labels(cls, labels) -> "LabelMap":
        names = sorted({str(x) for x in labels})
        if names and all(_NUMBER.match(n) for n in names):
            names.sort(key=int)
        return cls(names)

    def __post_init__(self):
        self._index = {n: i for i, n in enumerate(self.labels)}

    def __len__(self) -> int:
        return len(self.labels)

    def __contains__(self, label) -> bool:
        return str(label) in self._index

    def id(self, label, source: str = "") -> int:
        try:
            return self._index[str(label)]
        except KeyError:
            known = ", ".join(self.labels[:20]) + (" ..." if len(self.labels) > 20 else "")
            where = f"{source}: " if source else ""
            raise DataError(f"{where}unknown label {label!r}: the model knows {len(self.labels)} labels "
                            f"({known}), from its training data") from None

    def name(self, i: int) -> str:
        return self.labels[i]


# ------------------------------------------------------------------------------------------------------ CoNLL

@dataclass
class Sentence:
    words: list[str]
    tags: list[str] | None     # None when the file has no tag column (prediction input)
    doc: str = ""              # the -DOCSTART- argument (or "doc<N>"): split by document, never by sentence
    source: str = ""           # "file:line" of the first word


def read_conll(path: str | Path, *, require_tags: bool = True) -> list[Sentence]:
    """CoNLL-style token file: one token per line with whitespace-separated columns (token first, tag last),
    blank lines between sentences, `-DOCSTART-` lines between documents. Every token line must have
    the same column count as the first one (a wrong count is an error naming the line)."""
    path = Path(path)
    out: list[Sentence] = []
    n_cols: int | None = None
    rows: list[tuple[int, list[str]]] = []       # the sentence so far: (line number, columns) per token
    doc, n_docs = "", 0

    def flush():
        if rows:
            tags = [cols[-1] for _, cols in rows] if n_cols > 1 else None
            out.append(Sentence([cols[0] for _, cols in rows], tags, doc or f"doc{n_docs}", f"{path}:{rows[0][0]}"))
            rows.clear()

    with _open_text(path) as f:
        for i, raw in enumerate(f, 1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                flush()
                continue
            cols = line.split("\t") if "\t" in line else line.split()
            if cols[0] == "-DOCSTART-":
                flush()
                n_docs += 1
                # "-DOCSTART-<TAB>name" names the document; CoNLL-2003's "-DOCSTART- -X- -X- O" does not
                doc = cols[1] if len(cols) == 2 and cols[1] != "O" else f"doc{n_docs}"
                continue
            if n_cols is None:
                n_cols = len(cols)
                if line.lstrip()[:1] in ("{", "[") and _json_document(path) is not None:
                    raise DataError(f"{path}:{i}: JSON, not CoNLL (one token and its tag per line, blank lines "
                                    f"between sentences), which tag models read")
                if require_tags and n_cols < 2:
                    raise DataError(f"{path}:{i}: a token line needs a tag column (token<TAB>tag), got {line!r}")
            if len(cols) != n_cols:
                raise DataError(f"{path}:{i}: {len(cols)} column(s), expected {n_cols} like line 1 of the data "
                                f"({line!r})")
            rows.append((i, cols))
        flush()
    if not out:
        raise DataError(f"{path}: no sentences")
    return out


def write_conll(path: str | Path, sentences: list[Sentence]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    with replacing(path) as tmp, opener(tmp, "wt", encoding="utf-8", newline="\n") as f:
        last_doc = None
        for s in sentences:
            if s.doc != last_doc:
                f.write(f"-DOCSTART-\t{s.doc}\n\n")
                last_doc = s.doc
            for j, w in enumerate(s.words):
                f.write(w + (f"\t{s.tags[j]}" if s.tags is not None else "") + "\n")
            f.write("\n")
    return path


# ------------------------------------------------------------------------------------------------------ SQuAD

@dataclass
class SquadExample:
    id: str
    question: str
    context: str
    answers: list[tuple[str, int]]       # (text, char start); all gold answers (dev has several)
    is_impossible: bool = False
    title: str = ""
    source: str = ""


@dataclass
class SquadData:
    examples: list[SquadExample]
    version_2: bool                      # any is_impossible question in the file
    fixed_offsets: int = 0               # answers whose answer_start was moved to where the text really is


def _id_lines(raw: str) -> dict[str, list[int]]:
    """question id -> 1-based lines of its `"id": ...` in the raw JSON (parsed JSON has no line numbers)."""
    out: dict[str, list[int]] = {}
    line, last = 1, 0
    for m in re.finditer(r'"id"\s*:\s*"((?:[^"\\]|\\.)*)"', raw):
        line += raw.count("\n", last, m.start())
        last = m.start()
        out.setdefault(m.group(1), []).append(line)
    return out


def _json_document(path: Path):
    try:
        return json.loads(_open_text(path).read())
    except (ValueError, RecursionError, DataError):     # ValueError: not JSON, or an integer past the digit limit
        return None


def _json_document_hint(path: Path, line: int) -> str:
    """Why line 1 of a .json table is not JSON: often the file is one indented JSON document (a SQuAD file)."""
    doc = _json_document(path) if line == 1 else None
    if doc is None:
        return ""
    squad = isinstance(doc, dict) and isinstance(doc.get("data"), list)
    return ("; the file is one JSON document, not JSON Lines (one object per line)"
            + (": a SQuAD file, which qa models read" if squad else ""))


def read_squad(path: str | Path, *, require_answers: bool = True, fix_offsets: bool = True) -> SquadData:
    """SQuAD v1.1 / v2.0 JSON: {"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
    "answers": [{"text", "answer_start"}], "is_impossible"?}]}]}]}; an answer off its `answer_start` moves to the
    nearest occurrence of its text with `fix_offsets` (counted), else it is an error naming the line."""
    path = Path(path)
    raw = _open_text(path).read()
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); a qa model reads SQuAD JSON") from None
    except (RecursionError, ValueError):     # nested too deeply, an integer past Python's digit limit
        raise DataError(f"{path}: not SQuAD JSON (nested too deeply, or a number too long)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DataError(f"{path}: not SQuAD JSON (expected a top-level object with a 'data' list)")
    out: list[SquadExample] = []
    fixed: list[str] = []
    id_lines = _id_lines(raw)
    seen: set[str] = set()
    for article in _objects({"data": doc["data"]}, "data", f"{path}"):
        title = str(article.get("title", ""))
        for para in _objects(article, "paragraphs", f"{path}: article {title!r}"):
            context = para.get("context")
            if not isinstance(context, str) or not context.strip():
                raise DataError(f"{path}: article {title!r} has a paragraph with an empty 'context'")
            for qa in _objects(para, "qas", f"{path}: article {title!r}"):
                qid = str(qa.get("id", ""))
                lines = id_lines.get(qid, [0])
                where = f"{path}:{lines[0]}" if lines[0] else f"{path} (question {qid!r})"
                if qid in seen:   # predictions and scores are keyed by id: the two would count as one
                    at = f" (lines {', '.join(map(str, lines))})" if len(lines) > 1 else ""
                    raise DataError(f"{path}: duplicate question id {qid!r}{at}")
                seen.add(qid)
                question = qa.get("question")
                if not isinstance(question, str) or not question.strip():
                    raise DataError(f"{where}: question {qid!r} is empty")
                impossible = bool(qa.get("is_impossible", False))
                answers = [] if impossible else [_place_answer(a, context, where, qid, fix_offsets, fixed)
                                                 for a in _objects(qa, "answers", f"{where}: question {qid!r}")]
                if require_answers and not impossible and not answers:
                    raise DataError(f"{where}: question {qid!r} has no answers and is not marked is_impossible")
                out.append(SquadExample(qid, question, context, answers, impossible, title, where))
    if not out:
        raise DataError(f"{path}: no questions")
    return SquadData(out, any(e.is_impossible for e in out), len(fixed))


def _objects(parent: dict, key: str, where: str) -> list[dict]:
    """parent[key] (default []) checked to be a list of JSON objects."""
    items = parent.get(key, [])
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise DataError(f"{where}: {key!r} must be a list of objects, got {str(items)[:60]!r}")
    return items


def _place_answer(a: dict, context: str, where: str, qid: str, fix_offsets: bool, fixed: list[str]
                  ) -> tuple[str, int]:
    """(text, start) of one answer, moved to its text's nearest occurrence when `fix_offsets` (noted in `fixed`)."""
    text, start = a.get("text"), a.get("answer_start")
    if not isinstance(text, str) or not text or not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise DataError(f"{where}: question {qid!r} has an answer without 'text' / an integer 'answer_start' >= 0: "
                        f"{str(a)[:80]}")
    if context[start:start + len(text)] == text:
        return text, start
    hits = [m.start() for m in re.finditer(re.escape(text), context)]
    if not (fix_offsets and hits):
        found = context[start:start + len(text)]
        raise DataError(f"{where}: question {qid!r}: answer {text!r} is not at answer_start={start} of its context "
                        f"(found {found!r})" + ("" if hits else "; the text does not occur in the context"))
    new = min(hits, key=lambda h: abs(h - start))
    fixed.append(f"{where}: question {qid!r}: answer_start {start} -> {new}")
    return text, new


def write_squad(path: str | Path, examples: list[SquadExample], version: str = "1.1") -> Path:
    """Write examples as SQuAD JSON (one paragraph per distinct (title, context))."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    articles: dict[str, dict[str, list]] = {}
    for e in examples:
        articles.setdefault(e.title, {}).setdefault(e.context, []).append(e)

    def qa(e: SquadExample) -> dict:
        out = {"id": e.id, "question": e.question, "answers": [{"text": t, "answer_start": s} for t, s in e.answers]}
        if version.startswith("2"):
            out["is_impossible"] = e.is_impossible
        return out

    data = [{"title": title, "paragraphs": [{"context": context, "qas": [qa(e) for e in exs]}
                                            for context, exs in paras.items()]}
            for title, paras in articles.items()]
    return write_text(path, json.dumps({"version": version, "data": data}, ensure_ascii=False, indent=1))
