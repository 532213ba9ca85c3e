"""`bertkit fill-mask | embed | attention | plot`: inference and pictures from the command line (thin over
bertkit.infer and bertkit.plots)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("fill-mask", help="fill [MASK] tokens (several masks decoded jointly)")
    p.add_argument("model", help="model directory with a masked-LM head")
    p.add_argument("text", nargs="+", help="text(s) with [MASK]; one [MASK] per word piece when there are several")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--beam-size", type=int, default=8)
    p.add_argument("--no-whole-word", action="store_true", help="one mask = one piece (skip multi-piece words)")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    p.set_defaults(func=fill_mask)

    p = sub.add_parser("embed", help="sentence embeddings to .npy / .jsonl, or a cosine similarity search")
    p.add_argument("model", help="model directory")
    p.add_argument("texts", nargs="*", help="sentences (or use --file)")
    p.add_argument("--file", help="a text file, one sentence per line")
    p.add_argument("--pooling", help="mean | cls | max | mean_sqrt_len | weighted_mean | last_token (default: the "
                                     "model's sentence-transformers pooling config; mean for a plain BERT directory)")
    p.add_argument("--layers", default="-1", help="comma-separated hidden layers to average (0 = embeddings, -1 = last)")
    p.add_argument("--no-normalize", action="store_true", help="keep raw vectors (default: L2-normalised)")
    p.add_argument("--max-length", type=int, help="pieces per text (default: the model's max_seq_length, else 256)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", help="write vectors to this .npy or .jsonl file (default: JSON lines on stdout), or to "
                                 "an index directory for `bertkit search` (any other name, e.g. index/)")
    p.add_argument("--dtype", choices=("float32", "float16", "int8"), default="float16",
                   help="index vectors' storage type (default float16)")
    p.add_argument("--search", metavar="QUERY", action="append",
                   help="instead of writing vectors: the --top-k sentences of --file / texts closest to QUERY")
    p.add_argument("--top-k", type=int, default=5)
    p.set_defaults(func=embed)

    p = sub.add_parser("attention", help="attention heatmaps (layer x head grid + where one token looks) as PNG")
    p.add_argument("model", help="model directory")
    p.add_argument("text")
    p.add_argument("--out", default="attention", help="output directory (default: ./attention)")
    p.add_argument("--query", help="token whose attention to draw across all heads (e.g. 'he')")
    p.add_argument("--layers", help="comma-separated layers for the grid (default: all)")
    p.set_defaults(func=attention)

    p = sub.add_parser("plot", help="loss / accuracy curves of a run directory, or a confusion matrix")
    p.add_argument("run", help="run directory (or its metrics JSONL); with --confusion a predictions JSONL")
    p.add_argument("--out", help="PNG path (default: <run>/curves.png or <file>.confusion.png)")
    p.add_argument("--confusion", action="store_true",
                   help="RUN is a JSONL with 'label' and 'prediction' fields per line: draw its confusion matrix")
    p.set_defaults(func=plot)


def _ints(s: str | None) -> list[int] | None:
    if s is None:
        return None
    from bertkit.errors import ConfigError
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"expected comma-separated integers, got {s!r}") from None


def fill_mask(args) -> int:
    from bertkit.infer import Predictor
    p = Predictor.load(args.model)
    for text in args.text:
        res = p.fill_mask(text, top_k=args.top_k, beam_size=args.beam_size, whole_word=not args.no_whole_word)
        if args.json:
            print(json.dumps({"text": text, **res}, ensure_ascii=False))
            continue
        print(text)
        for c in res["candidates"]:
            label = c["word"] if "word" in c else " | ".join(c["tokens"])
            print(f"  {c['score']:9.3g}  {label:<24s} {c['sequence']}")
    return 0


def embed(args) -> int:
    from bertkit.commands.embed import embed_encoder, wants_encoder, write_vectors
    from bertkit.errors import ConfigError
    from bertkit.infer import Predictor, cosine_search, read_lines
    if wants_encoder(args):            # the model's own pooling / normalisation / dense layers, or an index
        return embed_encoder(args)
    texts = list(args.texts) + (read_lines(args.file) if args.file else [])
    if not texts:
        raise ConfigError("no sentences: give them as arguments or with --file")
    p = Predictor.load(args.model)
    kw = dict(pooling=args.pooling or "mean", layers=_ints(args.layers), normalize=not args.no_normalize,
              max_length=args.max_length or 256, batch_size=args.batch_size)
    vecs = p.embed(texts, progress=len(texts) > 256, **kw)
    if args.search:
        queries = p.embed(args.search, **kw)
        for q, hits in zip(args.search, cosine_search(queries, vecs, args.top_k)):
            print(json.dumps({"query": q, "hits": [{"text": texts[i], "cosine": round(s, 4)} for i, s in hits]},
                             ensure_ascii=False))
        return 0
    return write_vectors(args.out, texts, vecs)


def attention(args) -> int:
    from bertkit import plots
    from bertkit.infer import Predictor
    p = Predictor.load(args.model)
    tokens, att = p.attention(args.text)
    out = Path(args.out)
    grid = plots.plot_attention(att, tokens, out / "attention_grid.png", layers=_ints(args.layers))
    print(grid)
    if args.query:
        q = args.query.lower() if p.tokenizer.lowercase else args.query
        print(plots.plot_attention_from(att, tokens, q, out / f"attention_from_{q}.png"))
    return 0


def plot(args) -> int:
    from bertkit import plots
    from bertkit.errors import DataError
    if args.confusion:
        path = Path(args.run)
        if not path.is_file():
            raise DataError(f"{path}: no such predictions file")
        pairs = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                pairs.append((str(rec["label"]), str(rec["prediction"])))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DataError(f"{path}:{lineno}: expected a JSON object with 'label' and 'prediction'") from None
        labels = sorted({x for pair in pairs for x in pair})
        ix = {l: i for i, l in enumerate(labels)}
        m = plots.confusion_matrix([ix[a] for a, _ in pairs], [ix[b] for _, b in pairs], len(labels))
        print(plots.plot_confusion(m, labels, args.out or path.with_suffix(".confusion.png")))
        return 0
    run = Path(args.run)
    print(plots.plot_run(run, args.out or (run if run.is_dir() else run.parent) / "curves.png"))
    return 0
