"""`bertkit convert SRC OUT`: an original google-research/bert TensorFlow checkpoint -> an HF-format directory,
without TensorFlow (thin over bertkit.tf_checkpoint)."""

from __future__ import annotations

import argparse
import json

from bertkit.commands import checks
from bertkit.textfiles import read_text


def register(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert a google-research/bert TensorFlow checkpoint to HF format",
                              description="Read a TensorFlow checkpoint (PREFIX.index + PREFIX.data-*) and its "
                                          "bert_config.json and vocab.txt, and write config.json, "
                                          "model.safetensors, vocab.txt and tokenizer_config.json. TensorFlow is "
                                          "not needed.")
    p.add_argument("src", help="checkpoint directory (bert_model.ckpt, the `checkpoint` file's choice or the only "
                               "*.index), or DIR/PREFIX")
    p.add_argument("out", help="output directory (must be empty unless --overwrite)")
    p.add_argument("--config", help="bert_config.json (default: the one next to the checkpoint)")
    p.add_argument("--vocab", help="vocab.txt (default: the one next to the checkpoint)")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty output directory")
    case = p.add_mutually_exclusive_group()
    case.add_argument("--cased", dest="lowercase", action="store_false", default=None,
                      help="the tokenizer keeps case (default: inferred from the vocab)")
    case.add_argument("--uncased", dest="lowercase", action="store_true", help="the tokenizer lowercases")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    checks.stdin_ok(p, "config", suffix=".json")
    checks.stdin_ok(p, "vocab", suffix=".txt")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertkit.tf_checkpoint import convert_tf_checkpoint  # deferred: torch, off `bertkit -h`'s start path

    if args.config:     # read by the converter; a binary or non-UTF-8 file is refused here naming it
        read_text(args.config)
    checks.out_dir(args.out, "convert", inputs=(args.src, args.config, args.vocab), overwrite=args.overwrite,
                   writes_model=True)
    # the directory was checked above (it may hold only the marker of this command's run)
    report = convert_tf_checkpoint(args.src, args.out, config=args.config, vocab=args.vocab,
                                   overwrite=True, lowercase=args.lowercase)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"wrote {report['out']}: {report['model']}, {report['converted']} tensors from {report['checkpoint']} "
          f"({report['skipped']} optimizer/step variables skipped), "
          f"{'uncased' if report['lowercase'] else 'cased'} tokenizer")
    if report["unknown"]:
        print(f"not converted ({len(report['unknown'])} unknown variables): {', '.join(report['unknown'])}")
    return 0
