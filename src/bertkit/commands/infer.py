"""`bertkit fill-mask | embed | attention | plot`: inference and pictures from the command line (thin over
bertkit.infer and bertkit.plots)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from bertkit import progress
from bertkit.commands import add_model_argument, add_precision_argument, checks, inference_precision
from bertkit.commands.embed import add_prompt_arguments, embed_encoder, search_or_write, vector_out, wants_encoder
from bertkit.errors import ConfigError, DataError
from bertkit.serve.limits import ServeConfig
from bertkit.textfiles import is_stdin_copy, read_lines, read_text


def register(sub) -> None:
    p = sub.add_parser("fill-mask", help="fill [MASK] tokens (several masks decoded jointly)")
    add_model_argument(p, "model directory with a masked-LM head")
    p.add_argument("text", nargs="*", help="text(s) with [MASK]; one [MASK] per word piece when there are several")
    p.add_argument("--file", help="a text file, one text with [MASK] per line")
    p.add_argument("--top-k", type=checks.positive_int, default=5)
    p.add_argument("--beam-size", type=checks.number(int, 1, 1000), default=8,
                   help="beams per joint decoding of several masks (1-1000)")
    p.add_argument("--no-whole-word", action="store_true", help="one mask = one piece (skip multi-piece words)")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    add_precision_argument(p)
    progress.add_arguments(p)
    checks.stdin_ok(p, "file", suffix=".txt")
    p.set_defaults(func=fill_mask)

    p = sub.add_parser("embed", help="sentence embeddings to .npy / .jsonl, or a cosine similarity search")
    add_model_argument(p, "model directory")
    p.add_argument("texts", nargs="*", help="sentences (or use --file)")
    p.add_argument("--file", help="a text file, one sentence per line")
    p.add_argument("--pooling", help="mean | cls | max | mean_sqrt_len | weighted_mean | last_token (default: the "
                                     "model's sentence-transformers pooling config; mean for a plain BERT directory)")
    p.add_argument("--layers", type=checks.int_list,
                   help="comma-separated hidden layers to average (0 = embeddings, -1 = last; default -1)")
    p.add_argument("--no-normalize", action="store_true", help="keep raw vectors (default: L2-normalised)")
    add_prompt_arguments(p)
    p.add_argument("--max-length", type=checks.number(int, 2),
                   help="pieces per text, [CLS]/[SEP] included (default: the model's max_seq_length, else 256 "
                        "within its positions)")
    p.add_argument("--batch-size", type=checks.positive_int, default=32)
    p.add_argument("--out", help="write vectors to this .npy or .jsonl file (default: JSON lines on stdout), or to "
                                 "an index directory for `bertkit search` (any other name, e.g. index/)")
    p.add_argument("--dtype", choices=("float32", "float16", "int8"),
                   help="index vectors' storage type (default float16; .npy / .jsonl vectors are float32)")
    p.add_argument("--search", metavar="QUERY", action="append",
                   help="instead of writing vectors: the --top-k sentences of --file / texts closest to QUERY")
    p.add_argument("--top-k", type=checks.positive_int, default=5)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    add_precision_argument(p)
    progress.add_arguments(p)
    checks.stdin_ok(p, "file", suffix=".txt")
    p.set_defaults(func=embed)

    p = sub.add_parser("attention", help="attention heatmaps (layer x head grid + where one token looks) as PNG")
    add_model_argument(p, "model directory")
    p.add_argument("text")
    p.add_argument("--out", default="attention", help="output directory (default: ./attention)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace maps of the same name (an earlier text's) or other files in --out")
    p.add_argument("--query", help="token whose attention to draw across all heads (e.g. 'he')")
    p.add_argument("--layers", type=checks.int_list, help="comma-separated layers for the grid (default: all)")
    add_precision_argument(p)
    p.set_defaults(func=attention)

    p = sub.add_parser("plot", help="loss / accuracy curves of a run directory, or a confusion matrix")
    p.add_argument("run", help="run directory (or its metrics JSONL); with --confusion a predictions JSONL")
    p.add_argument("--out", help="PNG path (default: <run>/curves.png or <file>.confusion.png)")
    p.add_argument("--confusion", action="store_true",
                   help="RUN is a JSONL with 'label' and 'prediction' fields per line: draw its confusion matrix")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    checks.stdin_ok(p, "run", suffix=".jsonl")
    p.set_defaults(func=plot)


def _texts(given: list[str], file: str | None) -> list[str]:
    """The texts given as arguments, then the lines of --file."""
    texts = list(given) + (read_lines(file) if file else [])
    if not texts:
        raise ConfigError("no texts: give them as arguments or with --file")
    return texts


def fill_mask(args) -> int:
    from bertkit.infer import Predictor  # deferred: torch stays off `bertkit -h`'s path
    texts = _texts(args.text, args.file)
    p = Predictor.load(args.model, precision=inference_precision(args, "fill-mask"))
    limit, mask = ServeConfig.max_masks, p.tokenizer.mask_token
    for text in texts:          # joint decoding costs a forward per mask and beam: the server's cap, before any work
        if text.count(mask) > limit:
            raise ConfigError(f"a text holds {text.count(mask)} {mask}s; fill-mask decodes at most {limit} per text")
    show = progress.wanted(args.progress) and len(texts) > 1
    with progress.bar(texts, show=show, desc="fill-mask", unit="text") as bar:
        write = bar.write if show else print      # a result line that does not tear the bar on stderr
        for text in bar:
            res = p.fill_mask(text, top_k=args.top_k, beam_size=args.beam_size, whole_word=not args.no_whole_word)
            if args.json:
                write(json.dumps({"text": text, **res}, ensure_ascii=False), file=sys.stdout)
                continue
            lines = [text] + [f"  {c['score']:9.3g}  {c['word'] if 'word' in c else ' | '.join(c['tokens']):<24s} "
                              f"{c['sequence']}" for c in res["candidates"]]
            write("\n".join(lines), file=sys.stdout)
    return 0


def embed(args) -> int:
    from bertkit.infer import Predictor  # deferred: torch stays off `bertkit -h`'s path
    if wants_encoder(args):            # the model's own pooling / normalisation / dense layers, or an index
        return embed_encoder(args)
    texts = _texts(args.texts, args.file)
    out = vector_out(args)
    p = Predictor.load(args.model, precision=inference_precision(args, "embed"))
    kw = dict(pooling=args.pooling or "mean", layers=args.layers or [-1], normalize=not args.no_normalize,
              max_length=args.max_length, batch_size=args.batch_size,
              prompt=p.prompts.text(args.prompt, args.prompt_name))
    vecs = p.embed(texts, progress=progress.wanted(args.progress) and len(texts) > kw["batch_size"], **kw)
    return search_or_write(args, out, texts, vecs, lambda queries: p.embed(queries, **kw))


def attention(args) -> int:
    from bertkit import plots  # deferred: matplotlib is the plots extra
    plots.require()
    from bertkit.infer import Predictor  # deferred: torch stays off `bertkit -h`'s path
    out = checks.out_dir(args.out, "attention", inputs=(args.model,), overwrite=args.overwrite, reuse=True)
    p = Predictor.load(args.model, precision=inference_precision(args, "attention"))
    tokens, att = p.attention(args.text)
    whole = len(p.tokenizer.tokenize(args.text)) + 2
    if whole > len(tokens):     # a grid of more tokens than this cannot be read
        print(f"bertkit attention: the text is {whole} tokens; the maps show its first {len(tokens)}",
              file=sys.stderr)
    n = len(att)
    bad = [i for i in args.layers or () if not -n <= i < n]
    if bad:
        raise ConfigError(f"--layers {bad[0]}: the model has {n} layers (0..{n - 1}, or -{n}..-1)")
    q = args.query
    if q is not None and q not in tokens and p.tokenizer.lowercase:   # 'He' finds 'he'; '[SEP]' stays as it is
        q = q.lower()
    if q is not None and q not in tokens:
        raise ConfigError(f"--query {args.query!r} is not one of the text's tokens: {' '.join(tokens)}")
    safe = re.sub(r"[^\w#-]", "_", q or "")       # a token may be '/' or '.': not in a file name
    from_png = f"attention_from_{safe}.png"
    names = ["attention_grid.png"] + ([from_png] if q is not None else [])
    there = [name for name in names if (out / name).exists()]
    if there and not args.overwrite:    # OUT gathers maps of several texts; one of the same name is an earlier text's
        raise checks.OutputError(f"{out / there[0]}: exists; pass --overwrite to replace it, or choose another --out")
    with checks.staged(out) as tmp:
        plots.plot_attention(att, tokens, tmp / "attention_grid.png", layers=args.layers)
        if q is not None:
            plots.plot_attention_from(att, tokens, q, tmp / from_png)
    for name in names:
        print(out / name)
    return 0


def plot(args) -> int:
    from bertkit import plots  # deferred: matplotlib is the plots extra, numpy stays off `bertkit -h`'s path
    from bertkit.tasks.metrics import confusion_matrix
    plots.require()
    run = Path(args.run)
    if args.confusion:
        if not run.is_file():
            raise DataError(f"{run}: no such predictions file")
        pairs = []
        for lineno, line in enumerate(read_text(run).splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                pairs.append((str(rec["label"]), str(rec["prediction"])))
            except (ValueError, RecursionError, KeyError, TypeError):     # not JSON, or not this object
                raise DataError(f"{run}:{lineno}: expected a JSON object with 'label' and 'prediction'") from None
        if not pairs:
            raise DataError(f"{run}: no predictions in the file")
        labels = sorted({x for pair in pairs for x in pair})
        ix = {l: i for i, l in enumerate(labels)}
        m = confusion_matrix([ix[a] for a, _ in pairs], [ix[b] for _, b in pairs], len(labels))
        out = _plot_out(args, run.with_suffix(".confusion.png"))
        draw = lambda png: plots.plot_confusion(m, labels, png)     # noqa: E731
    else:
        out = _plot_out(args, (run if run.is_dir() else run.parent) / "curves.png")
        draw = lambda png: plots.plot_run(run, png)                 # noqa: E731
    with checks.staged(out.parent) as tmp:
        draw(tmp / out.name)
    print(out)
    return 0


def _plot_out(args, default: Path) -> Path:
    """The picture's path: --out (an existing file only with --overwrite), else `default`, redrawn freely."""
    from matplotlib.backend_bases import FigureCanvasBase
    if args.out is None and is_stdin_copy(args.run):
        raise ConfigError("plot -: give --out PNG (input from stdin has no directory to draw next to)")
    if args.out is None:
        return checks.out_file(default, inputs=(args.run,), default_name=default.name)
    out = checks.out_file(args.out, inputs=(args.run,), default_name=default.name, overwrite=args.overwrite)
    kinds = FigureCanvasBase.get_supported_filetypes()
    if out.suffix.lstrip(".").lower() not in kinds:
        raise ConfigError(f"--out {args.out}: a picture needs one of the suffixes {', '.join(sorted(kinds))}")
    return out
