"""CLI subcommands, one module per stage; each exposes `register(subparsers)` (see bertkit.cli)."""

from __future__ import annotations

import dataclasses
import sys

from bertkit.errors import ConfigError


def add_model_argument(parser, help: str) -> None:
    """MODEL as the first positional, or as `--model MODEL` (settle_model keeps the one given)."""
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


def config_from(cls, args, **given):
    """The dataclass `cls` of the parsed flags whose dests name its fields (commands name them so), and `given`."""
    names = {f.name for f in dataclasses.fields(cls)} - set(given)
    return cls(**{k: v for k, v in vars(args).items() if k in names}, **given)


def add_precision_argument(parser, default: str = "fp32", verb: str = "run") -> None:
    """--precision (and --fp32, its short form): inference defaults to fp32 (the numbers transformers gives), training
    to auto; only training takes fp16 (its loss scaling is the training loop's)."""
    fp16 = ("fp16",) if verb == "train" else ()
    parser.add_argument("--precision", choices=("fp32", "auto", "bf16", *fp16), default=default,
                        help=f"{verb} in fp32 or bf16 autocast{' or fp16 with loss scaling' if fp16 else ''}; auto: "
                             "bf16 where the device multiplies bf16 natively (CUDA, AMX / AVX-512 BF16 CPUs: faster "
                             "there, numbers differ by ~1e-3), else fp16 on CUDA, else fp32")
    parser.add_argument("--fp32", action="store_true", help="the same as --precision fp32")


def chosen_precision(args) -> str:
    """--precision, or fp32 for --fp32."""
    return "fp32" if getattr(args, "fp32", False) else args.precision


def inference_precision(args, command: str) -> str:
    """The chosen precision, with one stderr line when it runs bf16 autocast."""
    from bertkit.precision import resolve       # deferred: torch stays off `bertkit -h`'s path
    precision = chosen_precision(args)
    if (resolved := resolve(precision)) != "fp32":
        print(f"bertkit {command}: {resolved} autocast (--precision {precision}); --precision fp32 for fp32 numbers",
              file=sys.stderr)
    return precision
