"""Writing an output whole or not at all: every file bertkit writes goes through here.

    with replacing(path) as tmp:           # write tmp (a Path beside `path`), by any means
        save_file(tensors, tmp)
    write_text(path, text)                 # the same for a string, bytes or a JSON value
    write_bytes(path, data)
    write_json(path, obj, indent=2)
    copy_file(src, path)

The temp name sits in the same directory (so the rename is atomic and never crosses file systems) and is fsynced
before it replaces `path`. `path` itself is replaced, never written through: a hard link or symlink of that name
keeps its target. A failure (a full disk, a read-only directory) removes the temp file, leaves `path` as it was,
and is one `error` line naming the file (exit 2 in the CLI), not an OSError traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from pathlib import Path

from bertkit.errors import BertkitError

__all__ = ["replacing", "temp_prefix", "write_text", "write_bytes", "write_json", "copy_file", "file_mode", "write_failure",
           "disk_full"]

# How writers that wrap the OS error say a disk or quota is full: safetensors (Rust) "... (os error 28)", torch's
# zip writer "file write failed"
_FULL = ("os error 28", "os error 122", "no space left on device", "disk quota exceeded", "file write failed")


def _full(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    return isinstance(e, Exception) and any(w in str(e).lower() for w in _FULL)


def write_failure(e: BaseException) -> str | None:
    """Why a write failed, when the file system refused it (an OSError: a full disk, a quota, a read-only or
    forbidden path) or a writer reports a full disk in its own exception (safetensors, torch.save); None for
    anything else, which is a bug."""
    if isinstance(e, OSError):
        return e.strerror or str(e).splitlines()[0]
    return "No space left on device" if _full(e) else None


def disk_full(e: BaseException | None) -> bool:
    """Whether `e`, or an error it was raised from (a bertkit error's one line hides it), is a full disk or quota."""
    for _ in range(8):
        if e is None or _full(e):
            return e is not None
        e = e.__cause__ or e.__context__
    return False


def file_mode() -> int:
    """0o666 less this process's umask: what open() would give a new file (tools that create owner-only files,
    safetensors, are set to it, since a model is for sharing)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def temp_prefix(name: str) -> str:
    """How `replacing` names the temp file of `name` (a PID follows): other processes can tell it from content."""
    return f".{name}.tmp-"


@contextlib.contextmanager
def replacing(path, error: type[BertkitError] = BertkitError, sync: bool = True):
    """Yield a temp Path beside `path`; on a clean exit it is fsynced and renamed over `path`, otherwise removed.
    sync=False skips the fsync (a few ms each) for many small files that a later `os.sync()` makes durable
    together, their sizes and hashes recorded to catch a torn one (pre-training shards)."""
    path = Path(path)
    tmp = path.with_name(f"{temp_prefix(path.name)}{os.getpid()}")
    try:
        yield tmp
        if sync:
            with open(tmp, "rb+") as f:                 # the bytes reach the disk before the name points at them
                os.fsync(f.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        reason = write_failure(e)
        if reason is None:
            raise
        raise error(f"cannot write {path}: {reason}; the previous file, if any, is unchanged") from None


def write_bytes(path, data: bytes, error: type[BertkitError] = BertkitError, sync: bool = True) -> Path:
    with replacing(path, error, sync) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def copy_file(src, dst, error: type[BertkitError] = BertkitError) -> Path:
    """shutil.copy2 into a temp file beside `dst`, then moved into place (a link at `dst` keeps its target)."""
    with replacing(dst, error) as tmp:
        shutil.copy2(src, tmp)
    return Path(dst)


def write_text(path, text: str, error: type[BertkitError] = BertkitError, sync: bool = True) -> Path:
    return write_bytes(path, text.encode("utf-8"), error, sync)


def write_json(path, obj, indent: int | None = 2, error: type[BertkitError] = BertkitError, sync: bool = True
               ) -> Path:
    return write_text(path, json.dumps(obj, indent=indent) + "\n", error, sync)
