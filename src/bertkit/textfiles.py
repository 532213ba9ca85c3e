"""Strict UTF-8 reading of the text files users hand to bertkit: a file that is not UTF-8 (a binary file, a Latin-1
export) is a `DataError` naming the file and the first bad line, never a UnicodeDecodeError traceback; `-` is stdin.

    text = read_text(path)                 # the whole file
    @utf8_errors                           # a reader(path, ...) whose decoding errors name path:line
    def read_table(path, ...): ...

Readers that document a lenient decoding (the tokenizer, vocab training and corpus reading replace invalid bytes
and count them) do not use this module.
"""

from __future__ import annotations

import functools
import gzip
import sys
import zlib
from pathlib import Path

from bertkit.errors import DataError

__all__ = ["read_text", "utf8_error", "utf8_errors"]


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


def read_text(path) -> str:
    """The whole of a UTF-8 text file (or of stdin for '-'); errors name the file (and line)."""
    if str(path) == "-":
        data = sys.stdin.buffer.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise DataError(f"<stdin>:{line}: not UTF-8 text") from None
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{path}: is a directory, expected a text file")
    try:
        return _raw(p).decode("utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise utf8_error(p) from None
    except (gzip.BadGzipFile, EOFError, zlib.error):
        raise DataError(f"{path}: not a valid gzip file") from None


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
