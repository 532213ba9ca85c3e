"""Strict UTF-8 reading of the text files users hand to bertkit: a file that is not UTF-8 (a binary file, a Latin-1
export) is a `DataError` naming the file and the first bad line, never a UnicodeDecodeError traceback; `-` is stdin
(stdin_inputs: a CLI's '-' argument becomes a temporary copy of stdin). Readers that document a lenient decoding (the
tokenizer, vocab training and corpus reading replace invalid bytes and count them) do not use this module."""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import math
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

from bertkit.errors import BertkitError, ConfigError, DataError

__all__ = ["read_text", "read_lines", "parse_json", "utf8_error", "utf8_errors", "sniff_suffix", "stdin_inputs", "is_stdin_copy",
           "shown", "shown_all"]


# The UTF-8 byte-order mark Excel and Notepad start files with: no part of the text. (Plain UTF-8 decoding, not
# utf-8-sig, keeps a decoding error's offset counting the file's own bytes.)
_BOM = "\ufeff"


def _raw(path: Path) -> bytes:
    with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
        return f.read()


def utf8_error(path) -> DataError:
    """The DataError for a file that failed to decode: `PATH:LINE: not UTF-8 text (byte 0x..)`."""
    try:
        data = _raw(Path(path))
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return DataError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the file as UTF-8")
    except (OSError, EOFError, zlib.error):
        pass
    return DataError(f"{path}: not UTF-8 text; save the file as UTF-8")


def utf8_errors(reader):
    """Decorate `reader(path, ...)`: a decoding error inside it becomes `utf8_error(path)`, a broken gzip file
    a one-line DataError."""
    @functools.wraps(reader)
    def wrapped(path, *args, **kwargs):
        try:
            return reader(path, *args, **kwargs)
        except UnicodeDecodeError:
            raise utf8_error(path) from None
        except (gzip.BadGzipFile, EOFError, zlib.error):
            raise DataError(f"{path}: not a valid gzip file") from None
    return wrapped


@utf8_errors
def read_text(path) -> str:
    """The whole of a UTF-8 text file (or of stdin for '-'), a leading byte-order mark dropped; errors name the file
    (and line)."""
    if str(path) == "-":
        data = sys.stdin.buffer.read()
        try:
            return data.decode("utf-8").removeprefix(_BOM)
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise DataError(f"<stdin>:{line}: not UTF-8 text") from None
    if Path(path).is_dir():
        raise DataError(f"{path}: is a directory, expected a text file")
    try:
        return _raw(Path(path)).decode("utf-8").removeprefix(_BOM)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None


def read_lines(path) -> list[str]:
    """Non-empty lines of a text file, stripped (`bertkit embed --file`, similarity search's documents)."""
    lines = [ln.strip() for ln in read_text(path).splitlines() if ln.strip()]
    if not lines:
        raise DataError(f"{path}: no non-empty lines")
    return lines


def parse_json(text: str | bytes, where: str, error: type[BertkitError] = DataError):
    """json.loads, with every way a hostile text fails it as one line of `error` naming `where` (a file, or
    file:line): not JSON, nested too deeply, an integer past Python's digit limit, bytes that are not UTF-8 (one rule
    for every JSON file: UTF-8, a byte-order mark tolerated; json.loads alone would take UTF-16 bytes and refuse a BOM)."""
    try:
        text = text.decode("utf-8-sig") if isinstance(text, bytes) else text.removeprefix(_BOM)
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 (invalid byte at offset {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e.msg}, line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None
    except ValueError as e:
        raise error(f"{where}: not valid JSON ({str(e).split(':')[0]})") from None


_KINDS = {"count": "a count >= 0", "number": "a number >= 0", "name": "a name", "object": "a JSON object",
          "list": "a JSON list"}


def _is(kind: str, value) -> bool:
    """Whether `value` is of `kind`; counts and numbers are finite and >= 0, never a bool."""
    if kind in ("count", "number"):
        # an int of any size is finite (math.isfinite overflows on one past a float's range)
        number = isinstance(value, int) or (kind == "number" and isinstance(value, float) and math.isfinite(value))
        return number and not isinstance(value, bool) and value >= 0
    return isinstance(value, {"name": str, "object": dict, "list": list}[kind])


def check_fields(obj, kinds: dict[str, str], where: str, error: type[BertkitError] = DataError, prefix: str = "",
                 required: bool = True) -> None:
    """`error` naming `where` (a file), the field and its value, for the first field of `kinds` whose value in the
    JSON object `obj` is not of its kind (a key of _KINDS; "kind?" lets it be null); absent fields are errors only
    when `required`. Hand-edited files are refused by name here, never as a TypeError later."""
    if not isinstance(obj, dict):
        raise error(f"{where}: {prefix.rstrip('.')} {obj!r:.40} is not a JSON object" if prefix else
                    f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key, kind in kinds.items():
        if (key not in obj and not required) or (obj.get(key) is None and kind.endswith("?")):
            continue
        if not _is(kind.rstrip("?"), obj.get(key)):
            raise error(f"{where}: {prefix}{key} {obj.get(key)!r:.40} is not {_KINDS[kind.rstrip('?')]}")


# ---------------------------------------------------------------------------------------------- '-' = stdin

STDIN_FORMATS = ("csv", "tsv", "jsonl", "json", "conll")
_COPIES: set[str] = set()      # paths of the temporary copies of stdin that are alive


def _is_conll(lines: list[str]) -> bool:
    """Token lines with a tag column (one column count >= 2 throughout), in blank-line-separated sentences."""
    counts = {len(ln.split()) for ln in lines if ln.strip() and not ln.startswith("-DOCSTART-")}
    blank_between = any(not a.strip() and b.strip() for a, b in zip(lines[1:], lines[2:]))
    docstart = bool(lines) and lines[0].startswith("-DOCSTART-")
    return len(counts) == 1 and min(counts) >= 2 and (blank_between or docstart)


def sniff_suffix(data: bytes) -> str:
    """The file suffix a task-file reader needs for these bytes: .jsonl (a first line that is a JSON object), .json
    (a SQuAD document, or JSON over several lines), .conll, .tsv (a tab in the header), else .csv; .gz appended to
    gzip bytes."""
    if data[:2] == b"\x1f\x8b":
        try:
            return sniff_suffix(gzip.decompress(data)) + ".gz"
        except (OSError, EOFError, zlib.error):
            return ".gz"
    # a sample: enough to tell the layouts apart
    text = data[:1 << 20].decode("utf-8", errors="replace").removeprefix(_BOM)
    body = text.lstrip()
    if body.startswith("{"):
        first, _, rest = body.partition("\n")
        try:
            doc = json.loads(first)
        except ValueError:
            return ".json"                  # one document over several lines
        return ".json" if isinstance(doc, dict) and "data" in doc and not rest.strip() else ".jsonl"
    lines = text.splitlines()[:2000]
    if _is_conll(lines):
        return ".conll"
    header = next((ln for ln in lines if ln.strip()), "")
    return ".tsv" if "\t" in header else ".csv"


def is_stdin_copy(path) -> bool:
    """Whether `path` is the temporary copy of stdin that `stdin_inputs` put in place of a '-' argument."""
    return str(path) in _COPIES


def shown(path) -> str:
    """`path` as a record (a summary, a report) names it: '-' for the copy of stdin, which is gone afterwards."""
    return "-" if is_stdin_copy(path) else str(path)


def shown_all(record: dict) -> dict:
    """`record` with each copy of stdin among its values named '-' (a run's config, saved in its summary)."""
    return {k: "-" if isinstance(v, str) and is_stdin_copy(v) else v for k, v in record.items()}


def _dashes(value) -> int:
    return sum(v == "-" for v in value) if isinstance(value, list) else int(value == "-")


@contextlib.contextmanager
def stdin_inputs(args, spec: dict, fmt: str | None = None):
    """Within the block, the one '-' among the input arguments `spec` names ({dest: (flag, suffix)}) is a
    temporary file holding stdin's bytes, removed afterwards. suffix None: sniffed (or `fmt`); "": the command reads
    '-' itself (counted, left as it is). A second '-' is a ConfigError; error messages name <stdin>, not the copy."""
    dashed = [(dest, flag) for dest, (flag, _) in spec.items() for _ in range(_dashes(getattr(args, dest, None)))]
    if len(dashed) > 1:
        flags = ", ".join(dict.fromkeys(flag for _, flag in dashed))
        raise ConfigError(f"'-' (stdin) can feed one input only, but it is given {len(dashed)} times ({flags})")
    if not dashed or spec[dashed[0][0]][1] == "":
        yield
        return
    dest, suffix = dashed[0][0], spec[dashed[0][0]][1]
    data = sys.stdin.buffer.read()
    if suffix is None:
        suffix = f".{fmt}" if fmt else sniff_suffix(data)
    elif data[:2] == b"\x1f\x8b":       # gzip bytes: the readers that take .gz files decompress them
        suffix += ".gz"
    folder = tempfile.mkdtemp(prefix="bertkit-stdin-")
    copy = str(Path(folder) / f"stdin{suffix}")
    try:
        Path(copy).write_bytes(data)
        value = getattr(args, dest)
        setattr(args, dest, [copy if v == "-" else v for v in value] if isinstance(value, list) else copy)
        _COPIES.add(copy)
        yield
    except BertkitError as e:
        e.args = tuple(a.replace(copy, "<stdin>") if isinstance(a, str) else a for a in e.args)
        raise
    finally:
        _COPIES.discard(copy)
        shutil.rmtree(folder, ignore_errors=True)
