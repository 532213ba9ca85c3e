"""`bertkit tokenize`: text (arguments, a file, or stdin) -> a JSON line per text: tokens, ids, token_type_ids and
offsets, [CLS] / [SEP] included (their offsets (0, 0)). Thin over `bertkit.Tokenizer`."""

from __future__ import annotations

import json
import sys
from functools import partial
from itertools import islice

from bertkit.commands import checks
from bertkit.errors import BertkitError


def register(sub) -> None:
    p = sub.add_parser("tokenize", help="tokenize text with a WordPiece vocab; JSON lines out")
    p.add_argument("text", nargs="*", help="texts to tokenize (or use --file)")
    p.add_argument("--file", help="tokenize each line of this file ('-' = stdin)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--vocab", help="vocab.txt")
    src.add_argument("--model", help="model directory (vocab.txt + tokenizer_config.json)")
    case = p.add_mutually_exclusive_group()
    case.add_argument("--cased", action="store_true", help="keep case and accents (default: the vocab's setting, "
                                                           "uncased for a bare vocab.txt)")
    case.add_argument("--uncased", action="store_true", help="lowercase and strip accents")
    p.add_argument("--pair", help="second sequence for a single text argument")
    p.add_argument("--pair-file", help="second sequences, one per line, aligned with --file")
    p.add_argument("--max-length", type=checks.nonneg_int, help="truncate to this many tokens (with [CLS]/[SEP])")
    p.add_argument("--truncation", choices=["longest_first", "only_first", "only_second"],
                   help="truncation strategy (default longest_first when --max-length is given)")
    p.add_argument("--processes", type=checks.processes, default=1, help="worker processes for --file (parallel encoder)")
    p.add_argument("--batch-lines", type=checks.positive_int, default=20000, help="lines per batch when reading --file")
    checks.stdin_ok(p, "file", "pair_file", suffix="")     # streamed by the command itself
    checks.stdin_ok(p, "vocab", suffix=".txt")
    p.set_defaults(func=run)


def _lines(path: str):
    """Lines of a file (or stdin) without their newline, decoded as UTF-8 with invalid bytes replaced; an unreadable
    file is the CLI's one line naming it."""
    with open(sys.stdin.fileno() if path == "-" else path, "r", encoding="utf-8", errors="replace", newline="",
              closefd=path != "-") as stream:
        for line in stream:
            yield line.rstrip("\r\n")


def run(args) -> int:
    from bertkit.tokenizer import Tokenizer  # deferred: numpy, off `bertkit -h`'s start path
    if not args.vocab and not args.model:
        raise BertkitError("give --vocab VOCAB.txt or --model MODEL_DIR")
    if args.file and args.text:
        raise BertkitError("give texts as arguments or --file, not both")
    if not args.file and not args.text:
        raise BertkitError("nothing to tokenize: give texts as arguments or --file PATH ('-' = stdin)")
    if args.pair is not None and (args.file or len(args.text) != 1):
        raise BertkitError("--pair goes with exactly one text argument (use --pair-file with --file)")
    if args.pair_file and not args.file:
        raise BertkitError("--pair-file goes with --file")
    overrides = {"lowercase": False} if args.cased else {"lowercase": True} if args.uncased else {}
    tok = Tokenizer.from_pretrained(args.model or args.vocab, **overrides)
    opts = dict(max_length=args.max_length, truncation=args.truncation, return_offsets=True)

    if args.file:
        texts = _lines(args.file)
        pairs = _lines(args.pair_file) if args.pair_file else None
        encode = partial(tok.encode_batch_parallel, processes=args.processes) if args.processes > 1 else tok
        while True:
            batch = list(islice(texts, args.batch_lines))
            pair_batch = list(islice(pairs, len(batch))) if pairs is not None else None
            if pair_batch is not None and len(pair_batch) != len(batch):
                raise BertkitError(f"{args.pair_file} has fewer lines than {args.file}")
            if not batch:
                break
            _write(tok, encode(batch, pair_batch, **opts))
    else:
        pairs = [args.pair] if args.pair is not None else None
        _write(tok, tok(args.text, pairs, **opts))
    return 0


def _write(tok, enc: dict) -> None:
    sys.stdout.writelines(json.dumps({"tokens": tok.convert_ids_to_tokens(ids), "ids": ids, "token_type_ids": types,
                                      "offsets": [list(o) for o in offsets]}, ensure_ascii=False) + "\n"
                          for ids, types, offsets in zip(enc["input_ids"], enc["token_type_ids"], enc["offsets"]))
