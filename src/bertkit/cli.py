"""The `bertkit` command: one subcommand per stage (`bertkit/commands/<stage>.py`, `register(subparsers)`), thin
over the library. A user's error prints one line and exits 2; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import signal
import sys
import threading

from bertkit import __version__
from bertkit.atomic import disk_full
from bertkit.commands import settle_model
from bertkit.commands.checks import error_line, one_line_errors, settle_out
from bertkit.config import PRESETS
from bertkit.hub import cli_model_arg
from bertkit.textfiles import stdin_inputs

# stage modules under bertkit.commands, in the order of the data flow
STAGES = ("tokenize", "vocab", "prepare", "pretrain", "finetune", "distill", "infer", "embed", "serve", "export",
          "convert", "quantize", "demo")

# `bertkit -h` lists the subcommands by the stage of the pipeline they serve; one not listed here goes under "other"
GROUPS = {
    "vocabulary and tokens": ("vocab", "tokenize"),
    "pre-training": ("prepare", "pretrain", "convert"),
    "fine-tuning": ("task-data", "finetune", "evaluate", "distill"),
    "inference": ("predict", "fill-mask", "embed", "search", "rerank", "mine", "attention", "plot"),
    "serving, export, int8": ("serve", "export", "quantize"),
    "the whole pipeline": ("demo",),
}


class _ShowDefaults(argparse.HelpFormatter):
    """Every option's default after its help, said here once rather than in each option's help text: values only
    (a flag's default is to be off), and not where the help already says it."""

    def _format_action(self, action):
        default = action.default
        shown = action.nargs != 0 and default not in (None, "", argparse.SUPPRESS) and default not in ([], ())
        if shown and "default" not in (action.help or "").lower() and action.help != argparse.SUPPRESS:
            action = copy.copy(action)
            value = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
            action.help = f"{action.help or ''} (default: {value.replace('%', '%%')})".lstrip()
        return super()._format_action(action)


class _RawShowDefaults(argparse.RawDescriptionHelpFormatter, _ShowDefaults):
    """The same, for a subcommand whose description is laid out by hand (pretrain's)."""


class _AnyOrder(argparse.ArgumentParser):
    """A subcommand's parser taking options and positionals in any order (`embed --pooling cls MODEL "text"`):
    argparse's intermixed parsing, which the top-level parser (its subcommand a positional) cannot use."""

    _intermixed = False

    def __init__(self, **kwargs):
        raw = kwargs.get("formatter_class") is argparse.RawDescriptionHelpFormatter
        super().__init__(**{**kwargs, "formatter_class": _RawShowDefaults if raw else _ShowDefaults})

    def _get_values(self, action, arg_strings):
        # `--max-drop=--`: argparse drops the "--" and hands the option an empty list, skipping its type check
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected one argument")
        return super()._get_values(action, arg_strings)

    def parse_known_args(self, args=None, namespace=None):
        # parse_known_intermixed_args calls parse_known_args twice itself: those inner calls parse plainly
        if self._intermixed or not self._get_positional_actions():
            return super().parse_known_args(args, namespace)
        self._intermixed = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixed = False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertkit", formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="BERT, whole and fast: text -> vocab -> pre-training -> fine-tuning "
                                                 "-> predictions")
    parser.add_argument("--version", action="version", version=f"bertkit {__version__}")
    parser.add_argument("--allow-non-finite", action="store_true",
                        help="load model weights holding NaN / Inf (with a warning) instead of refusing them")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_AnyOrder,
                                help="one of the commands below; `bertkit COMMAND -h` lists its options")
    for stage in STAGES:
        importlib.import_module(f"bertkit.commands.{stage}").register(sub)
    parser.epilog = _grouped(sub)
    one_line_errors(parser)
    return parser


def _grouped(sub: argparse._SubParsersAction) -> str:
    """The subcommands and their one-line helps under GROUPS' headings, replacing argparse's single list."""
    helps = {a.dest: a.help for a in sub._choices_actions}
    sub._choices_actions.clear()
    placed = {name for names in GROUPS.values() for name in names}
    groups = {**GROUPS, "other": tuple(n for n in helps if n not in placed)}
    width = max(map(len, helps)) + 2
    lines = ["commands, by stage:"]
    for title, names in groups.items():
        if any(n in helps for n in names):
            lines += [f"  {title}"] + [f"    {n:<{width}}{helps[n]}" for n in names if n in helps]
    return "\n".join(lines)


def _resolve_model_args(args: argparse.Namespace) -> None:
    """Every command's model argument may name a Hugging Face repo (see bertkit.hub): made a directory here, once.
    Preset names (`finetune --model tiny`) stay as they are."""
    for name in ("model", "init"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            setattr(args, name, cli_model_arg(value, keep=tuple(PRESETS)))


def _leave_process_group() -> None:
    """A finished torchrun worker waits for the others, then closes its process group itself: left to the
    interpreter's exit while a peer still talks, gloo can abort the process (SIGABRT) after all its work is done."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    if vars(args).pop("allow_non_finite", False):     # popped: commands pass their namespace on as keywords
        from bertkit.checkpoint import ALLOW_NON_FINITE_ENV  # deferred: torch, off `bertkit -h`'s start path
        os.environ[ALLOW_NON_FINITE_ENV] = "1"     # every loader below reads it (from_pretrained's default)
    stdin_spec, stdin_format = vars(args).pop("_stdin", {}), vars(args).pop("stdin_format", None)
    ok = full = False
    # SIGTERM (a scheduler, `kill`, `timeout`) ends the command like an error would, so the finally below settles
    # its output directory: a replaced run goes back or stays aside with a note, as on Ctrl-C
    installed = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if installed else None
    try:
        settle_model(args)
        _resolve_model_args(args)
        with stdin_inputs(args, stdin_spec, stdin_format):
            rc = args.func(args)
        ok = not rc
        _leave_process_group()
    except KeyboardInterrupt:
        print(f"bertkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bertkit tokenize ... | head`: the reader had enough, the command's work is done
        ok = True
        return 0
    except Exception as e:      # noqa: BLE001 - error_line tells a user's error from a bug, which is raised again
        line, full = error_line(e), disk_full(e)
        if line is None:    # a bug: keep the traceback
            raise
        print(f"bertkit {args.command}: error: {line}", file=sys.stderr)
        return 2
    finally:    # every way out, a bug's traceback included: the output directory settled (checks.settle_out)
        if installed:   # None: a handler set outside Python, which cannot be handed back; the default is closest
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        note = settle_out(getattr(args, "out", None), ok, full)
        if note:
            print(f"bertkit {args.command}: {note}", file=sys.stderr)
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
