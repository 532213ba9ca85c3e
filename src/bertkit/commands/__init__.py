"""CLI subcommands, one module per stage; each exposes `register(subparsers)` (see bertkit.cli)."""

from __future__ import annotations

from bertkit.errors import ConfigError


def add_model_argument(parser, help: str) -> None:
    """MODEL as the first positional, or as `--model MODEL` like tokenize / finetune / evaluate / predict spell it
    (settle_model keeps the one given)."""
    parser.add_argument("model", nargs="?", help=f"{help} (or --model MODEL)")
    parser.add_argument("--model", dest="model_option", metavar="MODEL", help="the same as the MODEL positional")


def settle_model(args) -> None:
    """args.model from the positional or `--model`. With --model, the first positional word belongs to the texts
    that follow it (`embed --model M "a" "b"` parses as model "a", texts ["b"] until here)."""
    if "model_option" not in vars(args):
        return
    option = vars(args).pop("model_option")
    if option is None:
        if args.model is None:
            raise ConfigError("give the model directory: MODEL or --model MODEL")
        return
    if args.model is not None:
        texts = next((n for n in ("text", "texts") if isinstance(getattr(args, n, None), list)), None)
        if texts is None:
            raise ConfigError(f"the model is given twice: {args.model!r} and --model {option!r}")
        setattr(args, texts, [args.model, *getattr(args, texts)])
    args.model = option


def add_precision_argument(parser) -> None:
    """--precision of an inference command: fp32 by default at every front door (the numbers transformers and
    sentence-transformers give); bf16 autocast is the user's choice, said on stderr when made."""
    parser.add_argument("--precision", choices=("fp32", "auto", "bf16"), default="fp32",
                        help="forward precision: fp32; auto: bf16 autocast where this CPU multiplies bf16 natively "
                             "(faster there, numbers differ by ~1e-3); bf16")


def inference_precision(args, command: str) -> str:
    """args.precision, with one stderr line when it runs bf16 autocast."""
    import sys
    from bertkit.precision import resolve       # deferred: torch stays off `bertkit -h`'s path
    if resolve(args.precision) == "bf16":
        print(f"bertkit {command}: bf16 autocast (--precision {args.precision}); --precision fp32 for fp32 numbers",
              file=sys.stderr)
    return args.precision
