"""`bertkit export MODEL OUT.onnx`: ONNX export with dynamic axes, verified against PyTorch (thin over
bertkit.export)."""

from __future__ import annotations

import json
import sys

from bertkit.commands import add_model_argument, checks


def register(sub) -> None:
    p = sub.add_parser("export", help="export a model to ONNX (dynamic batch/seq) and check it with onnxruntime")
    add_model_argument(p, "model directory")
    p.add_argument("out", help="output .onnx path")
    p.add_argument("--opset", type=checks.opset, default=17)
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT file")
    p.add_argument("--tolerance", type=checks.nonneg_float, default=None,
                   help="max abs difference allowed by the check (default 1e-4; with --int8 a share "
                        "of the largest output, default 0.15)")
    p.add_argument("--int8", action="store_true", help="a dynamically quantized int8 graph, checked against "
                                                       "bertkit's int8 model (bertkit quantize)")
    p.set_defaults(func=run)


def run(args) -> int:
    from bertkit.errors import BertkitError
    from bertkit.export import check_onnx, export_onnx, export_onnx_int8
    out = checks.out_file(args.out, "export", inputs=(args.model,), default_name="model.onnx",
                          overwrite=args.overwrite)
    if args.int8:
        path, report = export_onnx_int8(args.model, out, opset=args.opset, check=not args.no_check)
    else:
        path = export_onnx(args.model, out, opset=args.opset)
        report = None if args.no_check else check_onnx(args.model, path)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    if report is None:
        print(json.dumps({"out": str(path), "bytes": path.stat().st_size}))
        return 0
    print(json.dumps({"out": str(path), "bytes": path.stat().st_size, **report}))
    # two int8 implementations round independently: they differ about as much as each differs from fp32 (MiniLM,
    # random tokens: 0.72 vs int8-fp32 0.45, largest output 6.2; docs/performance.md)
    if args.int8:
        tolerance = (args.tolerance if args.tolerance is not None else 0.15) * report["max_abs_output"]
    else:
        tolerance = args.tolerance if args.tolerance is not None else 1e-4
    if report["max_abs_diff"] > tolerance:
        raise BertkitError(f"{path}: onnxruntime differs from PyTorch by {report['max_abs_diff']:.3g} "
                           f"> tolerance {tolerance:.3g}")
    return 0
