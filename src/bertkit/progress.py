"""Progress bars and log lines of the long commands: on stderr only, so stdout carries results alone.

A command's bars follow `--progress` / `--no-progress` (the `progress` setting: True / False, None = auto): auto shows
them when stderr is a terminal, so a log file or a pipe gets none unless `--progress` asks for them.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager


def add_arguments(parser) -> None:
    """--progress / --no-progress on a (sub)parser or argument group; dest `progress`, default None (auto)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--progress", dest="progress", action="store_true", default=None,
                       help="progress bars on stderr even when it is not a terminal (default: only on a terminal)")
    group.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


def wanted(setting: bool | None) -> bool:
    """Whether to draw bars: `setting` when given, else whether stderr is a terminal."""
    return sys.stderr.isatty() if setting is None else bool(setting)


def bar(iterable=None, *, show: bool, **options):
    """A tqdm bar on stderr (a silent pass-through when not `show`)."""
    from tqdm.auto import tqdm
    return tqdm(iterable, disable=not show, file=sys.stderr, dynamic_ncols=True, **options)


def say(message: str) -> None:
    """A log line on stderr that does not tear a bar being drawn."""
    from tqdm.auto import tqdm
    tqdm.write(message, file=sys.stderr)
    sys.stderr.flush()


class _SayHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        say(self.format(record))


def log_lines(level: int = logging.INFO) -> None:
    """The command's log records as plain lines on stderr, through `say` (a line does not tear a bar)."""
    handler = _SayHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


@contextmanager
def forward_bar(model, total: int | None, desc: str, show: bool):
    """A bar advanced by every forward of `model`: evaluation runs the model once per batch deep inside a task."""
    with bar(total=total, desc=desc, unit="batch", show=show) as b:
        def step(*_) -> None:        # a hook that returned a value would replace the model's output
            b.update(1)
        handle = model.register_forward_hook(step) if show else None
        try:
            yield b
        finally:
            if handle is not None:
                handle.remove()
