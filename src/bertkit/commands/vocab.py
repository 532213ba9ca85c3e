"""`bertkit vocab`: learn a vocabulary from raw text files (thin over `bertkit.vocab`): WordPiece (bertkit's own), or
byte-level BPE as RoBERTa's / Unigram with Metaspace as XLM-R's (the `tokenizers` library's trainers)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bertkit import progress
from bertkit.commands import checks
from bertkit.errors import BertkitError


def register(subparsers) -> None:
    p = subparsers.add_parser("vocab", help="train a WordPiece, BPE or Unigram vocabulary from raw text files",
                              description="Learn a vocabulary from raw text files, streaming: WordPiece (vocab.txt + "
                                          "tokenizer_config.json), or byte-level BPE / Unigram (tokenizer.json + "
                                          "tokenizer_config.json). Files may be globs and may be gzipped.")
    # not args.vocab_model: that one every command resolves as a model directory or Hub repo
    p.add_argument("--model", dest="vocab_model", choices=("wordpiece", "bpe", "unigram"), default="wordpiece",
                   help="wordpiece (BERT's, default), bpe (byte-level, RoBERTa's) or unigram (Metaspace, XLM-R's)")
    p.add_argument("--files", nargs="+", required=True, metavar="FILE", help="text files or glob patterns (.gz ok); - = stdin")
    p.add_argument("--vocab-size", type=checks.positive_int, default=30_522, help="size of the vocabulary, specials included")
    p.add_argument("--out", required=True, help="output directory (vocab.txt + tokenizer_config.json)")
    p.add_argument("--cased", action="store_true", help="keep case and accents (wordpiece's default: uncased, like bert-base-uncased)")
    p.add_argument("--uncased", action="store_true", help="lowercase (bpe / unigram; their default is cased, like RoBERTa)")
    p.add_argument("--min-frequency", type=checks.positive_int, default=2, help="stop merging when the best pair is rarer (default 2)")
    p.add_argument("--limit-alphabet", type=checks.positive_int,
                   help="keep only the N most frequent characters (default: every character seen)")
    p.add_argument("--max-distinct-words", type=checks.positive_int, default=1_000_000,
                   help="cap on the word-count table; rarer words are pruned beyond it (bounds memory)")
    progress.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier vocabulary (or other files) in --out")
    checks.stdin_ok(p, "files", suffix="")       # streamed by the command itself
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.cased and args.uncased:
        raise BertkitError("give --cased or --uncased, not both")
    if args.uncased and args.vocab_model == "wordpiece":
        raise BertkitError("--uncased is wordpiece's default; it goes with --model bpe or unigram")
    if args.limit_alphabet is not None and args.vocab_model == "unigram":
        raise BertkitError("--limit-alphabet goes with --model wordpiece or bpe")
    out = checks.out_dir(args.out, "vocab", inputs=args.files, overwrite=args.overwrite)
    files = ["/dev/stdin" if f == "-" else f for f in args.files]     # read once, streaming: a pipe will do
    tok, summary, line = (_wordpiece if args.vocab_model == "wordpiece" else _library)(args, files)
    with checks.staged(out) as tmp:
        tok.save_pretrained(tmp)
    print(json.dumps(summary) if args.json else line)
    return 0


def _wordpiece(args: argparse.Namespace, files: list[str]) -> tuple:
    """bertkit's own WordPiece trainer: the tokenizer, the JSON summary and the line for a person."""
    from bertkit.vocab import VocabTrainingConfig, learn_vocab, tokenizer_from_tokens  # deferred: numpy
    config = VocabTrainingConfig(vocab_size=args.vocab_size, lowercase=not args.cased,
                                 min_frequency=args.min_frequency, limit_alphabet=args.limit_alphabet,
                                 max_distinct_words=args.max_distinct_words)
    result = learn_vocab(files, config, progress=progress.wanted(args.progress))
    s = result.stats
    note = "" if s["vocab_size"] == args.vocab_size else f" (requested {args.vocab_size}: {s['stop_reason']})"
    pruned = f" ({s['pruned_words']:,} rare words pruned)" if s["pruned_words"] else ""
    if s["replacement_chars"]:
        print(f"note: {s['replacement_chars']:,} invalid UTF-8 bytes (or U+FFFD characters) were dropped", file=sys.stderr)
    line = (f"wrote {args.out}/vocab.txt: {s['vocab_size']} pieces{note}, {'cased' if args.cased else 'uncased'}; "
            f"{s['files']} file(s), {s['words_seen']:,} words, {s['distinct_words']:,} distinct{pruned}, "
            f"{s['alphabet']} characters, {s['merges']:,} merges; {s['count_seconds'] + s['merge_seconds']:.1f} s")
    return (tokenizer_from_tokens(result.tokens, lowercase=config.lowercase),
            {"out": str(Path(args.out) / "vocab.txt"), "cased": args.cased, **s}, line)


def _library(args: argparse.Namespace, files: list[str]) -> tuple:
    """--model bpe / unigram: the tokenizers library's trainers (tokenizer.json + configs), as _wordpiece."""
    from bertkit.vocab import learn_library_vocab  # deferred: numpy, off `bertkit -h`'s start path
    tok, s = learn_library_vocab(files, args.vocab_model, args.vocab_size, lowercase=args.uncased,
                                 min_frequency=args.min_frequency, limit_alphabet=args.limit_alphabet,
                                 progress=progress.wanted(args.progress))
    line = (f"wrote {args.out}/tokenizer.json: {args.vocab_model}, {s['vocab_size']} pieces, "
            f"{'uncased' if args.uncased else 'cased'}; {s['files']} file(s), {s['characters']:,} characters; "
            f"{s['seconds']:.1f} s")
    return tok, {"out": str(Path(args.out) / "tokenizer.json"), "model": args.vocab_model, "cased": not args.uncased,
                 **s}, line
