"""Writing an output whole or not at all: every file bertkit writes goes through here.

    with replacing(path) as tmp:           # write tmp (a Path beside `path`), by any means
        save_file(tensors, tmp)
    write_text(path, text)                 # the same for a string, bytes or a JSON value
    write_bytes(path, data)
    write_json(path, obj, indent=2)

The temp name sits in the same directory (so the rename is atomic and never crosses file systems) and is fsynced
before it replaces `path`. `path` itself is replaced, never written through: a hard link or symlink of that name
keeps its target. A failure (a full disk, a read-only directory) removes the temp file, leaves `path` as it was,
and is one `error` line naming the file (exit 2 in the CLI), not an OSError traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from bertkit.errors import BertkitError

__all__ = ["replacing", "write_text", "write_bytes", "write_json", "file_mode"]


def file_mode() -> int:
    """0o666 less this process's umask: what open() would give a new file (tools that create owner-only files,
    safetensors, are set to it, since a model is for sharing)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def replacing(path, error: type[BertkitError] = BertkitError):
    """Yield a temp Path beside `path`; on a clean exit it is fsynced and renamed over `path`, otherwise removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:                     # the bytes reach the disk before the name points at them
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except OSError as e:
        raise error(f"cannot write {path}: {e.strerror or e}; the previous file, if any, is unchanged") from None
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path, data: bytes, error: type[BertkitError] = BertkitError) -> Path:
    with replacing(path, error) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path, text: str, error: type[BertkitError] = BertkitError) -> Path:
    return write_bytes(path, text.encode("utf-8"), error)


def write_json(path, obj, indent: int | None = 2, error: type[BertkitError] = BertkitError) -> Path:
    return write_text(path, json.dumps(obj, indent=indent) + "\n", error)
