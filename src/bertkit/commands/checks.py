"""Checks every subcommand shares, all made before any work starts: argument types (a bad value is one line, exit
2) and output paths (the rules, `--overwrite` included, are in docs/cli.md, Conventions)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bertkit.atomic import disk_full, temp_prefix, write_failure, write_json
from bertkit.errors import BertkitError
from bertkit.textfiles import STDIN_FORMATS

MARKER = ".bertkit-run.json"    # {"command", "keep": names already there, "made", "wrote"}: a command's output
_IN_FLIGHT = (".bertkit-probe-", temp_prefix(MARKER))     # names the checks and the marker's write use a moment
REPLACED = ".bertkit-replaced"  # the earlier run --overwrite replaces, until the new run succeeds
_HELD = ".bertkit-held"         # inside REPLACED: it is bertkit's (a user's own folder of that name is refused)
_CLAIMED: set[Path] = set()     # output directories out_dir set up in this process and settle_out has not settled


class OutputError(BertkitError):
    """An output path is unusable: not writable, the wrong kind, an input, or an earlier run."""


# errors of the file system that a user causes or can fix: one line naming the path, not a traceback
USER_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                         errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENOTEMPTY, errno.ENAMETOOLONG,
                         errno.EFBIG, errno.EMFILE, errno.ELOOP, errno.EXDEV, errno.EBUSY, errno.ETXTBSY})


# control characters as Python writes them in a string literal (a tab stays a tab)
_CONTROLS = {c: repr(chr(c))[1:-1] for c in (*range(32), 127) if c != ord("\t")}


def error_line(e: BaseException) -> str | None:
    """The one line for an error a user caused, or None for a bug (which keeps its traceback). Control characters
    in a file name are escaped: one line, and the terminal left as it was."""
    text = _error_text(e)
    return None if text is None else text.translate(_CONTROLS)


def _error_text(e: BaseException) -> str | None:
    if isinstance(e, BertkitError):
        return str(e)
    if isinstance(e, OSError) and e.errno in USER_ERRNOS:
        where = f"{e.filename}: " if e.filename else ""
        hint = " (free some space and run again)" if disk_full(e) else ""
        return f"{where}{e.strerror or str(e).splitlines()[0]}{hint}"
    reason = None if isinstance(e, OSError) else write_failure(e)    # a writer's own exception for a full disk
    if reason:
        return f"{reason} (free some space and run again)"
    if isinstance(e, MemoryError):     # numpy names the array it could not allocate
        return f"not enough memory: {e or 'allocation failed'}; ask for less"
    if isinstance(e, UnicodeDecodeError):
        return f"an input file is not UTF-8 text ({e.reason} at byte {e.start} of a block read)"
    return None


# ------------------------------------------------------------------------------------------- argument ranges

def _bound(low, high, low_open: bool) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"<= {high}"
    return f"in {'(' if low_open else '['}{low}, {high}]"


def number(kind: type, low=None, high=None, *, low_open: bool = False):
    """An argparse type: `kind` (int or float), finite, within [low, high] (low excluded when low_open)."""
    def parse(text: str):
        try:
            if not text.isascii():          # int() and float() read any script's digits ('٣' is 3): a typo here
                raise ValueError(text)
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if (low is not None and (value <= low if low_open else value < low)) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {_bound(low, high, low_open)}, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


positive_int = number(int, 1)
nonneg_int = number(int, 0)
positive_float = number(float, 0, low_open=True)
nonneg_float = number(float, 0)
probability = number(float, 0, 1)
processes = number(int, 1, 256)                 # workers / threads: beyond this a typo, not a machine
# the TorchScript ONNX exporter's range; below 13 Softmax/ReduceSum differ and BERT's graph does not export
opset = number(int, 13, 20)


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Usage errors of `parser` and its subcommands as one line on stderr (not argparse's usage), exit 2."""
    def error_for(prog: str):
        def error(message: str):
            sys.stderr.write(f"{prog}: error: {message} (see {prog} --help)\n")
            raise SystemExit(2)
        return error
    parser.error = error_for(parser.prog)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.error = error_for(sub.prog)


def stdin_ok(parser: argparse.ArgumentParser, *dests: str, suffix: str | None = None) -> None:
    """Let the input arguments `dests` of `parser` be '-' (stdin, at most one per command line): the CLI hands the
    command a temporary file with stdin's bytes and the suffix `suffix` (None: sniffed from the bytes, overridable
    with --stdin-format; "": the command reads '-' itself)."""
    spec = dict(parser.get_default("_stdin") or {})
    for action in parser._actions:
        if action.dest in dests:
            if action.help and "stdin" not in action.help:
                action.help += " ('-' = stdin)"
            spec[action.dest] = (action.option_strings[0] if action.option_strings else action.dest.upper(), suffix)
    if suffix is None and "--stdin-format" not in parser._option_string_actions:
        parser.add_argument("--stdin-format", choices=STDIN_FORMATS, help="the format of a '-' (stdin) data file "
                                                                          "(default: sniffed from its first lines)")
    parser.set_defaults(_stdin=spec)


def device(text: str) -> str:
    """An argparse type: a torch device this machine has (cpu, cuda, cuda:N, mps)."""
    import torch
    try:
        d = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}") from None
    if d.type == "cuda":
        n = torch.cuda.device_count()
        if n == 0 or (d.index is not None and d.index >= n):
            raise argparse.ArgumentTypeError(f"{text}: this machine has {n} CUDA device{'s' * (n != 1)}")
    elif d.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: MPS is not available here")
    elif d.type not in ("cpu", "mps"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers ('0,-1')."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
        if not values or not text.isascii():
            raise ValueError(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return values


def names(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated names ('wandb,mlflow'), blanks dropped."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


# ---------------------------------------------------------------------------------------------- output paths

def _resolved(path) -> Path:
    if str(path) == "":
        raise OutputError("a path is empty ('')")
    if str(path) == "-":                        # stdout is no place for a directory or a staged file
        raise OutputError("'-': this output is written to a path, not to stdout; name one (./- for a file named '-')")
    try:
        return Path(os.path.expanduser(str(path))).resolve()
    except (RuntimeError, OSError) as e:     # a symbolic link loop
        raise OutputError(f"{path}: cannot resolve the path ({e})") from None


def _existing(inputs) -> list[tuple[str, Path]]:
    """(as given, resolved) for each of `inputs` (a path, or a list of paths) that exists; None, '' and '-' skipped."""
    given = [one for i in inputs if i is not None and str(i) not in ("", "-")
             for one in (i if isinstance(i, (list, tuple)) else [i])]
    return [(str(one), r) for one in given if (r := _resolved(one)).exists()]


def _check_writable(shown: str, target: Path) -> None:
    """Refuse `target` unless its nearest existing ancestor is a directory bertkit can write: probed with a temporary
    file (permission bits alone say nothing to root or on a read-only mount)."""
    ancestor = target
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"{shown}: not writable: {ancestor} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=ancestor, prefix=_IN_FLIGHT[0])
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(f"{shown}: not writable: cannot write in {ancestor} ({e.strerror or e})") from None


def _marker(d: Path) -> dict | None:
    """MARKER's content: the command whose earlier run `d` holds, and the names that were there before it."""
    try:
        info = json.loads((d / MARKER).read_text(encoding="utf-8"))
        lists = [info.get(k, []) for k in ("keep", "wrote")] if isinstance(info, dict) else [None]
        names = all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in lists)
        return info if names and isinstance(info.get("command"), str) else None
    except (OSError, ValueError):
        return None


def _is_model_dir(d: Path) -> bool:
    return (d / "config.json").is_file() and any((d / n).exists() for n in (
        "model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json"))


def _clear(entries: list[Path]) -> None:
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _set_aside(d: Path, gone: list[Path]) -> None:
    """Move the earlier run (`gone` and its MARKER) into d/REPLACED. Where REPLACED is already there a run failed
    after writing and could not put it back: that complete run stays the one to restore, the failed run's files go."""
    held = d / REPLACED
    if held.is_dir():
        _clear(gone)
        return
    if not gone and not (d / MARKER).exists():
        return
    held.mkdir()
    (held / _HELD).write_text("the run --overwrite replaces; deleted when the new run succeeds\n", encoding="utf-8")
    moved = []
    try:
        for entry in [*gone, d / MARKER]:
            if entry.exists() or entry.is_symlink():
                os.replace(entry, held / entry.name)
                moved.append(entry)
    except OSError:     # the directory as it was, then the one-line error
        for entry in reversed(moved):
            with contextlib.suppress(OSError):
                os.replace(held / entry.name, entry)
        with contextlib.suppress(OSError):
            (held / _HELD).unlink()
            held.rmdir()            # only when every entry went back
        raise


def _put_back(d: Path) -> None:
    held = d / REPLACED
    for entry in held.iterdir():
        if entry.name != _HELD:
            os.replace(entry, d / entry.name)
    shutil.rmtree(held)


def out_dir(path, command: str, *, inputs=(), overwrite: bool = False, writes_model: bool = False,
            reuse: bool = False, known: tuple[str, ...] = (), dry_run: bool = False) -> Path:
    """Check (and create) the output directory of `bertkit COMMAND`, before any work; with --overwrite its earlier
    run is set aside until this run succeeds (settle_out). `reuse`: an earlier run of the command is kept as it is
    (a cache). `known`: names an earlier run left before MARKER existed. `dry_run`: the checks only (a command that
    can still refuse after its work, a quality gate, calls it again when it is about to write)."""
    shown = str(path)
    d = _resolved(path)
    if d.exists() and not d.is_dir():
        raise OutputError(f"{shown}: is a file, expected a directory")
    ins = _existing(inputs)
    for name, r in ins:
        if r == d:
            raise OutputError(f"{shown}: is the input {name}; write the output elsewhere")
    _check_writable(shown, d)
    held = d / REPLACED
    if (held.exists() or held.is_symlink()) and not (held.is_dir() and (held / _HELD).is_file()):
        raise OutputError(f"{held}: is not bertkit's (it holds a replaced run only when bertkit made it); move it "
                          f"away or choose another directory")
    # another process's probe or marker in flight (the ranks of one torchrun launch check the same directory at once)
    # is not content
    entries = [e for e in d.iterdir() if e.name not in (MARKER, REPLACED) and not e.name.startswith(_IN_FLIGHT)] \
        if d.is_dir() else []
    info = _marker(d) if d.is_dir() else None
    if info is None and entries and known and all(e.name.split(".")[0] in known for e in entries):
        info = {"command": command}
    earlier, keep = (info or {}).get("command"), list((info or {}).get("keep", []))
    if entries or earlier:
        if earlier is not None and earlier != command:
            raise OutputError(f"{shown}: holds a `bertkit {earlier}` run; choose another directory")
        if earlier == command and reuse:
            return d
        if not overwrite:
            what = f"holds an earlier `bertkit {command}` run" if earlier else "is not empty"
            if held.is_dir():
                what += f" (and in {REPLACED}, the run a failed --overwrite was replacing)"
            raise OutputError(f"{shown}: {what}; pass --overwrite to replace it, or choose another directory")
        if earlier is None and _is_model_dir(d) and not writes_model:
            raise OutputError(f"{shown}: is a model directory; `bertkit {command}` would break it, write elsewhere")
        if earlier is None:     # someone else's files: kept now and by every later --overwrite
            keep = sorted(e.name for e in entries)
        wrote = (info or {}).get("wrote")
        if isinstance(wrote, list):     # what the earlier run wrote; anything added since is someone else's
            keep = sorted({*keep, *(e.name for e in entries if e.name not in wrote)})
        gone = [e for e in entries if e.name not in keep]
        inside = [name for name, r in ins for e in gone if e == r or e in r.parents]
        if inside:
            raise OutputError(f"{shown}: holds the input {inside[0]}, which --overwrite would delete")
    if dry_run:
        return d
    with _signals_held():   # a SIGTERM between setting the earlier run aside and claiming d would strand it there
        if entries or earlier:
            _set_aside(d, gone)
        made = str(_first_missing(d) or "")      # "": the directory was there
        d.mkdir(parents=True, exist_ok=True)
        try:
            write_json(d / MARKER, {"command": command, "made": made, "keep": keep}, indent=None)
        except BertkitError:        # a full disk before the run began: the run set aside goes back
            if (d / REPLACED).is_dir():
                _put_back(d)
            raise
        _CLAIMED.add(d)
    return d


@contextlib.contextmanager
def _signals_held():
    """SIGINT / SIGTERM wait until the block ends (then they act as usual); where signals cannot be masked, nothing."""
    held = {signal.SIGINT, signal.SIGTERM}
    mask = getattr(signal, "pthread_sigmask", None)
    previous = mask(signal.SIG_BLOCK, held) if mask else None
    try:
        yield
    finally:
        if mask:
            mask(signal.SIG_SETMASK, previous)


def _holds_a_file(path: Path) -> bool:
    """A file, or a directory with a file somewhere inside (empty directories hold nothing)."""
    return path.is_file() or any(p.is_file() for p in path.rglob("*"))


def _first_missing(d: Path) -> Path | None:
    """The topmost directory that `d.mkdir(parents=True)` would create, or None where `d` exists."""
    if d.exists():
        return None
    while not d.parent.exists():
        d = d.parent
    return d


def settle_out(path, ok: bool, disk_full: bool = False) -> str | None:
    """After a command that wrote to `path` (out_dir, in this process): record what it wrote (a later --overwrite
    replaces only that); on success delete the run it replaced; on failure put that run back if this one wrote
    nothing (or filled the disk: its part-run goes), else leave it in REPLACED, and remove a directory this run
    made and left empty. Returns a line for the user where the earlier run stays aside."""
    if path is None:
        return None
    try:
        d = _resolved(path)
        if d not in _CLAIMED:
            return None
        _CLAIMED.discard(d)
        info = json.loads((d / MARKER).read_text(encoding="utf-8"))
        if not isinstance(info, dict):
            return None
        since = (d / MARKER).stat().st_mtime_ns
        rewrote = [n for n in info.get("keep", []) if (d / n).exists() and (d / n).stat().st_mtime_ns > since]
        keep = (set(info.get("keep", [])) - set(rewrote)) | {MARKER, REPLACED}
        wrote = [e.name for e in d.iterdir() if e.name not in keep]
        held = d / REPLACED
        # what this run wrote, success or not: a later --overwrite replaces that and leaves files added since
        write_json(d / MARKER, {**info, "keep": sorted(keep - {MARKER, REPLACED}), "wrote": sorted(wrote)}, None)
        if ok:
            shutil.rmtree(held, ignore_errors=True)
            return None
        if any(_holds_a_file(d / n) for n in wrote) and not (disk_full and held.is_dir()):
            return f"{path}: the run --overwrite replaced is kept in {held}" if held.is_dir() else None
        _clear([d / n for n in wrote])                      # empty directories this run made, or its part-run
        (d / MARKER).unlink()
        if held.is_dir():                                               # nothing written: the earlier run goes back
            _put_back(d)
            return None
        made = Path(info["made"]) if info.get("made") else None
        while made is not None and d != made.parent:
            d.rmdir()
            d = d.parent
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


def out_index(path, *, inputs=(), overwrite: bool = False) -> Path:
    """Check the directory an index is written to as a whole (renamed into place, so nothing else may live there):
    absent, empty, or an earlier index with --overwrite; never holding one of `inputs`."""
    shown, d = str(path), _resolved(path)
    if d.exists() and not d.is_dir():
        raise OutputError(f"{shown}: is a file, expected an index directory")
    for name, r in _existing(inputs):
        if r == d or d in r.parents:
            raise OutputError(f"{shown}: holds the input {name}; write the index elsewhere")
    if d.is_dir() and any(d.iterdir()):
        if not (d / "manifest.json").is_file():
            raise OutputError(f"{shown}: is not empty and holds no index; choose another directory")
        if not overwrite:
            raise OutputError(f"{shown}: holds an earlier index; pass --overwrite to replace it")
    _check_writable(shown, d)
    return d


def out_file(path, *, inputs=(), default_name: str, overwrite: bool | None = None) -> Path:
    """Check a command's output file, before any work; a directory (or a path ending in '/') gets `default_name`
    inside it. `overwrite` None: the command has no --overwrite (an existing file is replaced). Returns the path."""
    _resolved(path)         # '' or a link loop: refused naming the path
    shown, p = str(path), Path(os.path.expanduser(str(path)))
    if shown.endswith(("/", os.sep)) or p.is_dir():
        p = p / default_name
        shown = str(p)
    f, ins = p.resolve(), _existing(inputs)
    if f.is_dir():
        raise OutputError(f"{shown}: is a directory, expected a file")
    for name, r in ins:
        if r == f:
            raise OutputError(f"{shown}: is the input {name}; write the output elsewhere")
    if f.exists() and not f.is_file():
        raise OutputError(f"{shown}: is not a regular file (a device or pipe); write to a file")
    if f.exists() and overwrite is False:
        raise OutputError(f"{shown}: exists; pass --overwrite to replace it, or choose another file")
    inside = [name for name, r in ins if r in f.parents]
    if f.exists() and inside and overwrite is not None:
        raise OutputError(f"{shown}: is a file of the input {inside[0]}; write the output elsewhere")
    _check_writable(shown, f.parent)
    return p


@contextlib.contextmanager
def staged(directory) -> Iterator[Path]:
    """A temporary directory inside `directory` for a command's output files, each moved in (os.replace) on success:
    no reader sees half a file; on an error the files there before stay, and directories made for them go."""
    d = Path(directory)
    made = _first_missing(d)
    d.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=d, prefix=".bertkit-tmp-"))
    ok = False
    try:
        yield tmp
        for f in sorted(tmp.iterdir()):
            os.replace(f, d / f.name)
        ok = True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not ok and made is not None and not _holds_a_file(made):
            shutil.rmtree(made, ignore_errors=True)
