"""`bertkit quantize MODEL OUT`: an int8 copy of a model directory, optionally gated on a dev file (thin over
bertkit.quantize)."""

from __future__ import annotations

import argparse
import json

from bertkit.commands import add_model_argument, checks


def register(subparsers) -> None:
    p = subparsers.add_parser("quantize", help="write an int8 copy of a model (int8 linear layers, CPU inference)",
                              description="Quantize every linear layer of the encoder and heads to int8 (weights "
                                          "per output channel, activations per call); embeddings, LayerNorms and "
                                          "softmax stay float. The result loads like any model directory.")
    add_model_argument(p, "model directory (fp32)")
    p.add_argument("out", help="output directory (new or empty unless --overwrite)")
    p.add_argument("--check", metavar="DEV_FILE", help="labelled dev file of the model's task: score fp32 and int8 "
                                                      "and refuse (exit 2) when int8 drops more than --max-drop")
    p.add_argument("--max-drop", type=checks.nonneg_float, default=1.0, help="points of the task's main metric")
    p.add_argument("--keep-float", action="append", default=[], metavar="PATTERN",
                   help="module names to keep in float (fnmatch, repeatable), e.g. classifier")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="activation precision of the --check runs (default: as the inference commands)")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty output directory")
    p.add_argument("--force", action="store_true", help=argparse.SUPPRESS)   # int8 is written everywhere now
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    checks.stdin_ok(p, "check")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertkit.quantize import quantize_model, write  # deferred: torch, off `bertkit -h`'s start path

    def claim(dry_run: bool):
        checks.out_dir(args.out, "quantize", inputs=(args.model, args.check), overwrite=args.overwrite,
                       writes_model=True, dry_run=dry_run)

    claim(dry_run=True)         # checked before any work; an earlier run is cleared only once the gate has passed
    q = quantize_model(args.model, check=args.check, max_drop=args.max_drop, keep_float=tuple(args.keep_float),
                       precision=args.precision, force=args.force)
    claim(dry_run=False)
    report = write(q, args.out)
    if args.json:
        print(json.dumps(report))
        return 0
    size = report["size_bytes"]
    print(f"wrote {report['out']}: {report['int8_layers']} int8 linear layers, "
          f"{size['int8'] / 1e6:.1f} MB ({100 * size['ratio']:.0f}% of fp32 {size['fp32'] / 1e6:.1f} MB)")
    if "check" in report:
        c = report["check"]
        also = "".join(f"; {k} fp32 {v['fp32']:.2f}, int8 {v['int8']:.2f}" for k, v in c.get("also", {}).items())
        print(f"{c['dev_file']}: {c['metric']} fp32 {c['fp32']:.2f}, int8 {c['int8']:.2f} "
              f"(drop {c['drop_points']:.2f} points, allowed {c['max_drop']:g}){also}")
    print(report["speed_here"]["line"])
    return 0
