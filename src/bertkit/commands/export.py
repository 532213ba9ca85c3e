"""`bertkit export MODEL OUT.onnx`: ONNX export with dynamic axes, verified against PyTorch (thin over
bertkit.export)."""

from __future__ import annotations

import json
import sys

from bertkit.commands import add_model_argument, checks
from bertkit.errors import BertkitError, ConfigError


def register(sub) -> None:
    p = sub.add_parser("export", help="export a model to ONNX (dynamic batch/seq) and check it with onnxruntime")
    add_model_argument(p, "model directory")
    p.add_argument("out", help="output .onnx path")
    p.add_argument("--opset", type=checks.opset, default=17)
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT file")
    p.add_argument("--tolerance", type=checks.nonneg_float,
                   help="max abs difference allowed by the check (default 1e-4). With --int8 a share of "
                        "the largest output; by default 0.15, or an int8 graph no further than 1.5x bertkit's "
                        "int8 model from the float product of the same int8 weights")
    p.add_argument("--int8", action="store_true", help="a dynamically quantized int8 graph, checked against "
                                                       "bertkit's int8 model (bertkit quantize)")
    p.set_defaults(func=run)


INT8_VS_FLOAT = 1.5      # an int8 graph may be this much further from the float product than bertkit's int8 ...
INT8_CAP = 0.3           # ... as long as it stays within this share of the largest output of bertkit's int8


def run(args) -> int:
    from bertkit.export import check_onnx, export_onnx, export_onnx_int8  # deferred: torch, off `bertkit -h`'s path
    from bertkit.runtime.int8 import is_int8_dir
    out = checks.out_file(args.out, inputs=(args.model,), default_name="model.onnx", overwrite=args.overwrite)
    if not args.int8 and is_int8_dir(args.model):
        raise ConfigError(f"{args.model} is an int8 model (bertkit quantize): export it with --int8")
    # written beside OUT and moved into place only once checked: a failed check leaves nothing, an earlier file stays
    with checks.staged(out.parent) as tmp:
        part = tmp / out.name
        if args.int8:
            _, report = export_onnx_int8(args.model, part, opset=args.opset, check=not args.no_check)
        else:
            export_onnx(args.model, part, opset=args.opset)
            report = None if args.no_check else check_onnx(args.model, part)
        size = part.stat().st_size
        if report is not None:
            _verdict(args, out, report)
    print(f"wrote {out} ({size / 1e6:.1f} MB)", file=sys.stderr)
    print(json.dumps({"out": str(out), "bytes": size, **(report or {})}))
    return 0


def _verdict(args, out, report: dict) -> None:
    """Raise (nothing written) when onnxruntime disagrees with PyTorch beyond the tolerance."""
    diff = report["max_abs_diff"]
    if not args.int8:
        tolerance = args.tolerance if args.tolerance is not None else 1e-4
        if diff > tolerance:
            raise BertkitError(f"{out}: onnxruntime differs from PyTorch by {diff:.3g} > tolerance {tolerance:.3g}; "
                               f"nothing written")
        return
    # two int8 roundings differ from each other about as much as each differs from the float product (docs/cli.md)
    share = args.tolerance if args.tolerance is not None else 0.15
    tolerance = share * report["max_abs_output"]
    int8 = report.get("int8")          # absent where the model holds no int8 layer: the share alone decides
    as_far = (int8 is not None and args.tolerance is None and int8["worst_ratio"] <= INT8_VS_FLOAT
              and diff <= INT8_CAP * report["max_abs_output"])              # a --tolerance given is the only rule
    if diff > tolerance and not as_far:
        far = "" if int8 is None else (f" and from the float product of the int8 weights by "
                                       f"{int8['onnx_vs_float']:.3g} (bertkit int8: {int8['bertkit_vs_float']:.3g})")
        raise BertkitError(f"{out}: onnxruntime's int8 graph differs from bertkit's int8 model by {diff:.3g} (> "
                           f"{share:g} of the largest output, {tolerance:.3g}){far}; nothing written")
