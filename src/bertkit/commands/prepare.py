"""`bertkit prepare`: raw text -> masked sentence-pair shards for pre-training (thin over `bertkit.pretraining`)."""

from __future__ import annotations

import argparse
import json

from bertkit import progress
from bertkit.commands import checks, config_from


def register(subparsers) -> None:
    p = subparsers.add_parser("prepare", help="build pre-training shards (MLM + NSP/SOP examples) from raw text",
                              description="Stream raw text into masked pre-training examples in numpy shards "
                                          "(manifest.json + .npy), read later by bertkit pretrain.")
    p.add_argument("--corpus", nargs="+", required=True, metavar="GLOB",
                   help="text files, directories or glob patterns (.gz ok); blank line between documents")
    p.add_argument("--vocab", required=True, help="vocab.txt or a model directory holding one")
    p.add_argument("--out", required=True, help="output shard directory")
    p.add_argument("--seq-len", type=checks.positive_int, default=128, help="max_seq_length: tokens per example")
    p.add_argument("--task", choices=("nsp", "sop", "none"), default="nsp",
                   help="nsp: next sentence (BERT), sop: sentence order (ALBERT), none: packed text, MLM only")
    p.add_argument("--masking", choices=("token", "wwm", "ngram"), default="token",
                   help="token: single pieces; wwm: whole words; ngram: 1-3 word spans (ALBERT)")
    p.add_argument("--dynamic", action="store_true", help="draw masks at batch time, fresh every epoch (RoBERTa)")
    p.add_argument("--dupe-factor", type=checks.number(int, 1, 100), default=1,
                   help="static masking: copies with different masks (1-100; BERT used 10)")
    p.add_argument("--mask-prob", type=checks.probability, default=0.15, help="share of tokens to predict")
    p.add_argument("--max-predictions", type=checks.number(int, 1, 65535),
                   help="cap on predictions per example (default ceil(mask_prob * seq_len): 20 at 128)")
    p.add_argument("--short-seq-prob", type=checks.probability, default=0.1, help="share of shorter targets")
    p.add_argument("--format", dest="corpus_format", choices=("auto", "lines", "prose"), default="auto",
                   help="lines: a sentence per line (Google's format); prose: paragraphs, split into sentences")
    p.add_argument("--workers", type=checks.processes, default=1, help="processes (each writes its own shards)")
    p.add_argument("--max-line-bytes", type=checks.positive_int, default=256 * 1024,
                   help="longer lines are skipped and counted (default 256 KiB)")
    p.add_argument("--max-document-lines", type=checks.positive_int, default=10_000,
                   help="longer documents are cut (bounds memory for files without blank lines)")
    p.add_argument("--examples-per-shard", type=checks.number(int, 1, 1 << 24), default=65536,
                   help="examples per shard file (a shard is built in memory)")
    p.add_argument("--seed", type=checks.nonneg_int, default=12345)
    p.add_argument("--overwrite", action="store_true", help="replace shards already in --out")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    progress.add_arguments(p)
    checks.stdin_ok(p, "corpus", "vocab", suffix=".txt")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertkit.pretraining import PrepareConfig, prepare  # deferred: numpy, off `bertkit -h`'s start path

    checks.out_dir(args.out, "prepare", inputs=(*args.corpus, args.vocab), overwrite=args.overwrite)
    summary = prepare(config_from(PrepareConfig, args, progress=progress.wanted(args.progress)))
    print(json.dumps(summary.as_dict()) if args.json else summary.format())
    return 0
