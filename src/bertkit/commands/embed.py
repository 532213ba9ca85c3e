"""`bertkit search | rerank | mine`, and the embedding side of `finetune | evaluate --task embed` and
`embed --out INDEX/` (thin over bertkit.embed; examples in docs/cli.md)."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

from bertkit import progress
from bertkit.atomic import replacing, write_json, write_text
from bertkit.errors import ConfigError, DataError
from bertkit.tasks.readers import write_table
from bertkit.textfiles import parse_json, read_lines, read_text
from bertkit.commands import (add_model_argument, add_precision_argument, checks, chosen_precision, config_from,
                              inference_precision)

INDEX_TEXTS = "texts.jsonl"                # the indexed texts, one JSON string per row, in index order
PART_BATCHES = 64                          # batches in a part of an index being built: what a kill can cost a rank
_VECTOR_SUFFIXES = (".npy", ".jsonl", ".json")


def register(sub) -> None:
    p = sub.add_parser("search", help="top-k search of an embedding index (`embed --out INDEX/`), optionally "
                                      "reranked by a cross-encoder")
    p.add_argument("index", help="index directory written by `bertkit embed ... --out INDEX/`")
    p.add_argument("--query", action="append", required=True, help="query text (repeat for several)")
    p.add_argument("--model", help="query encoder (default: the model that built the index)")
    p.add_argument("--top-k", type=checks.positive_int, default=10)
    p.add_argument("--rerank", metavar="CROSS_ENCODER", help="rerank the first --rerank-depth hits with this pair "
                                                             "classification / regression model")
    p.add_argument("--rerank-depth", type=checks.positive_int, default=50)
    add_prompt_arguments(p, "each query")
    add_precision_argument(p)
    p.set_defaults(func=search)

    p = sub.add_parser("rerank", help="score (query, document) pairs with a cross-encoder and sort")
    add_model_argument(p, "pair classification / regression model (bertkit finetune --task pair | regress)")
    p.add_argument("--query", action="append", required=True, help="query text (repeat for several)")
    p.add_argument("--file", required=True, help="documents, one per line")
    p.add_argument("--top-k", type=checks.positive_int, help="print only the best K (default: all)")
    p.add_argument("--batch-size", type=checks.positive_int, default=32)
    p.add_argument("--max-length", type=checks.number(int, 2),
                   help="pieces per (query, document) pair (default: the tokenizer's model_max_length, else 256; "
                        "at most the model's positions)")
    add_precision_argument(p)
    progress.add_arguments(p)
    checks.stdin_ok(p, "file", suffix=".txt")
    p.set_defaults(func=rerank)

    p = sub.add_parser("mine", help="hard negatives for (anchor, positive) pairs, mined with a bi-encoder")
    add_model_argument(p, "sentence embedding model directory")
    p.add_argument("--data", required=True, help="pairs file (anchor, positive): .jsonl / .csv / .tsv")
    p.add_argument("--out", required=True, help="output pairs file with negative_1..N columns")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--corpus", help="more candidate texts, one per line (default: the pairs' positives only)")
    p.add_argument("--negatives", type=checks.positive_int, default=1, help="negatives per pair")
    p.add_argument("--skip-top", type=checks.nonneg_int, default=0, help="leave out the first N ranked non-positives")
    p.add_argument("--batch-size", type=checks.positive_int, default=64)
    p.add_argument("--format", choices=("negatives", "pair"), default="negatives",
                   help="negatives: anchor, positive, negative_1..N (bi-encoder training); pair: text, text_pair, "
                        "label 1 / 0 rows (cross-encoder training with `finetune --task pair`)")
    progress.add_arguments(p)
    checks.stdin_ok(p, "data")
    checks.stdin_ok(p, "corpus", suffix=".txt")
    p.set_defaults(func=mine)


def add_prompt_arguments(p, what: str = "each text") -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt-name", help=f"put the model's prompt of this name before {what} (default: the "
                                         f"model's default_prompt_name, as sentence-transformers)")
    g.add_argument("--prompt", help=f"put this text before {what} (\"\": no prompt, not even the default)")


# ------------------------------------------------------------------------------------------------- finetune
# finetune's flags that only --task embed reads, with their defaults
FINETUNE_DESTS = {"loss": None, "scale": 20.0, "learnable_scale": False, "symmetric": False, "gradcache_batch": None,
                  "pooling": None, "normalize": None, "projection": None, "anchor_max_length": None, "prompts": None}


def refuse_embed_flags(args) -> None:
    _refuse(args, {f"--{d.replace('_', '-')}": (d, v) for d, v in FINETUNE_DESTS.items()},
            f"applies to --task embed only, not --task {args.task}")


def add_finetune_args(p) -> None:
    g = p.add_argument_group("--task embed (bi-encoder; --train: anchor, positive[, negative...] or text, "
                             "text_pair, score; --dev / --test: a retrieval directory or a pair file)")
    g.add_argument("--loss", choices=("mnrl", "cosent", "cosine"),
                   help="mnrl: in-batch negatives (pairs; default); cosent / cosine: scored pairs (cosent default)")
    g.add_argument("--scale", type=checks.positive_float, default=20.0, help="MNRL / CoSENT logit scale (default 20)")
    g.add_argument("--learnable-scale", action="store_true", help="MNRL: train the scale (from --scale)")
    g.add_argument("--symmetric", action="store_true", help="MNRL: add the positive -> anchor direction")
    g.add_argument("--gradcache-batch", type=checks.positive_int, help="GradCache mini-batch: the loss of --batch-size pairs in "
                                                       "the memory of this many")
    g.add_argument("--pooling", help="mean | cls | max | mean_sqrt_len | weighted_mean | last_token (join with +); "
                                     "default: the model's pooling config")
    g.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="L2-normalise the output (default: the model's setting)")
    g.add_argument("--projection", type=checks.positive_int, help="add a Dense output projection to this many dimensions")
    g.add_argument("--anchor-max-length", type=checks.number(int, 2), help="pieces per anchor / query (default: --max-length)")
    g.add_argument("--prompts", help="a prompt before every training text, or a JSON object {column: prompt} (as "
                                     "sentence-transformers' trainer); the first two columns' are saved as the "
                                     "model's query / document prompts")


def _refuse(args, flags: dict[str, tuple[str, object]], why: str) -> None:
    """Each flag -> (its dest, its default): a flag given a value where it does not apply is said, not ignored."""
    for flag, (dest, default) in flags.items():
        if getattr(args, dest, default) not in (default, None):
            raise ConfigError(f"{flag} {why}")


def finetune(args) -> int:
    from bertkit.embed.runner import EmbedFinetuneConfig, finetune_embed  # deferred: torch, off `bertkit -h`'s path
    from bertkit.train.loop import TrainConfig
    _refuse(args, {"--grid": ("grid", False), "--patience": ("patience", 0), "--vocab": ("vocab", None),
                   "--eval-every": ("eval_every_steps", None)}, "does not apply to --task embed")
    training = TrainConfig(lr=args.lr, epochs=args.epochs, warmup=args.warmup, weight_decay=args.weight_decay,
                           precision=chosen_precision(args), log_every_steps=50,
                           progress=progress.wanted(args.progress))
    cfg = config_from(EmbedFinetuneConfig, args, training=training, save_model=not args.no_save)
    print(json.dumps(_brief(finetune_embed(cfg))))
    return 0


def _brief(summary: dict) -> dict:
    """The headline numbers: per split, the metrics before and after training (mean, and std over seeds)."""
    keep = ("recall@1", "recall@5", "recall@10", "mrr@10", "ndcg@10", "spearman_cosine")
    out = {k: summary[k] for k in ("task", "loss", "lr", "batch_size", "epochs", "seeds", "train_examples")}
    out["examples_per_s"] = round(summary["examples_per_s"]["mean"], 1)     # as finetune's other tasks print it
    for split in summary["after"]:      # {"mean", "std"} whatever the number of seeds: one schema for a reader
        out[split] = {stage: {k: {"mean": round(v["mean"], 4), "std": round(v["std"], 4)}
                              for k, v in summary[stage][split].items() if k in keep}
                      for stage in ("before", "after")}
    out["summary"] = str(Path(summary["config"]["out"]) / "summary.json")
    return out


# ------------------------------------------------------------------------------------------------- evaluate
def add_evaluate_args(e) -> None:
    e.add_argument("--task", choices=("embed",), help="embed: a sentence embedding model on a retrieval directory "
                                                      "(queries, corpus, qrels) or a scored / pair file")
    e.add_argument("--baseline", help="--task embed: also score this model on the same data (before / after)")


def evaluate(args) -> int:
    from bertkit.embed.runner import evaluate_embed  # deferred: torch stays off `bertkit -h`'s path
    report = evaluate_embed(args.model, args.data, baseline=args.baseline, batch_size=args.batch_size)
    if args.out is not None:                 # beside its place, moved in whole: a link there is replaced
        write_text(Path(args.out) / "metrics_embed.json", json.dumps(report, indent=1, default=float) + "\n")
    print(json.dumps(report, default=float))
    return 0


# ---------------------------------------------------------------------------------------------------- embed
def wants_encoder(args) -> bool:
    """`bertkit embed` runs the model's sentence-transformers settings (pooling, normalisation, dense layers,
    max length) for a sentence-transformers directory, an index output or a pooling mode beyond mean / cls."""
    from bertkit.embed.st_format import is_sentence_transformers_dir  # deferred: torch stays off `bertkit -h`'s path
    return (is_index_out(args.out) or args.pooling not in (None, "mean", "cls")
            or is_sentence_transformers_dir(args.model))


def is_index_out(out: str | None) -> bool:
    return bool(out) and not out.endswith(_VECTOR_SUFFIXES)


def _texts_and_ids(args) -> tuple[list[str], list[str]]:
    """Texts (arguments, then --file) and their ids: a .jsonl / .csv / .tsv file gives `id` (or `_id`) and `text`
    columns, a text file a line each (ids: their order, from 0)."""
    from bertkit.embed.runner import read_id_texts  # deferred: torch stays off `bertkit -h`'s path
    texts = list(args.texts)
    for i, t in enumerate(texts):
        if not t.strip():
            raise DataError(f"text argument {i + 1} is empty")
    ids = [str(i) for i in range(len(texts))]
    if args.file:
        table = (read_id_texts(Path(args.file)) if Path(args.file).suffix in (".jsonl", ".csv", ".tsv")
                 else {str(i): line for i, line in enumerate(read_lines(args.file), len(texts))})
        ids, texts = ids + list(table), texts + list(table.values())
    if not texts:
        raise ConfigError("no sentences: give them as arguments or with --file")
    if len(set(ids)) != len(ids):
        raise DataError(f"{args.file}: ids repeat the positional texts' ids 0..{len(args.texts) - 1}")
    return texts, ids


def embed_encoder(args) -> int:
    """`bertkit embed` through the model's sentence-transformers settings (see wants_encoder)."""
    from bertkit.embed.runner import load_encoder  # deferred: torch stays off `bertkit -h`'s path
    from bertkit.train.distributed import Dist, encode_shared
    if args.layers not in (None, [-1]):
        raise ConfigError("--layers applies to plain BERT directories only (a sentence embedding model pools its "
                          "last layer)")
    index = is_index_out(args.out)
    normalize = False if args.no_normalize else (True if index else None)
    if index and args.no_normalize:
        raise ConfigError("an index is searched by cosine: its vectors are always normalised (drop --no-normalize)")
    d = Dist.setup()        # under torchrun each rank encodes a share of the texts; rank 0 alone checks and writes
    if index and d.main:
        checks.out_index(args.out, inputs=(args.model, args.file), overwrite=args.overwrite)
    out = None if index or not d.main else vector_out(args)
    texts, ids = _texts_and_ids(args)
    encoder, tok = load_encoder(args.model, args.pooling, normalize, args.max_length)
    precision = inference_precision(args, "embed")
    prompt = encoder.prompts.text(args.prompt, args.prompt_name)

    def encode(part: list[str]):                                                   # (n, dim) float32
        return encoder.encode(tok, part, args.batch_size, precision, prompt=prompt)
    if index:
        return _index_in_parts(args, d, encoder, texts, ids, encode, [precision, prompt])
    show = progress.wanted(args.progress) and len(texts) > args.batch_size and d.main
    with progress.forward_bar(encoder, -(-len(texts) // args.batch_size), "embed", show):
        vecs = encode_shared(encode, texts, d)
    return search_or_write(args, out, texts, vecs, encode) if d.main else 0


def vector_out(args) -> Path | None:
    """The checked .npy / .jsonl output file of `bertkit embed` (None: stdout, or a search), before any work."""
    if args.dtype not in (None, "float32"):
        raise ConfigError(f"--dtype {args.dtype} is an index's storage type: vectors (.npy, .jsonl, stdout, "
                          f"--search) are float32; write an index directory (e.g. --out index/) or drop --dtype")
    if not args.out or args.search:
        return None
    return checks.out_file(args.out, inputs=(args.model, args.file), default_name="embeddings.jsonl",
                           overwrite=args.overwrite)


def search_or_write(args, out: Path | None, texts, vecs, embed_queries) -> int:
    """With --search, each QUERY's --top-k closest `texts` by cosine (`embed_queries` embeds the queries), a JSON line
    each; else `vecs` written (write_vectors)."""
    if not args.search:
        return write_vectors(out, texts, vecs)
    from bertkit.infer import cosine_search  # deferred: torch stays off `bertkit -h`'s path
    for q, hits in zip(args.search, cosine_search(embed_queries(args.search), vecs, args.top_k)):
        print(json.dumps({"query": q, "hits": [{"text": texts[i], "cosine": round(s, 4)} for i, s in hits]},
                         ensure_ascii=False))
    return 0


def write_vectors(out: Path | None, texts, vecs) -> int:
    """Vectors to a .npy file, or JSON lines (text, embedding) to a file or stdout; files staged, then moved."""
    import numpy as np
    if out is not None and out.suffix == ".npy":
        with checks.staged(out.parent) as tmp:
            np.save(tmp / out.name, vecs)
        print(f"wrote {vecs.shape[0]} x {vecs.shape[1]} float32 to {out}", file=sys.stderr)
        return 0
    lines = (json.dumps({"text": t, "embedding": [round(float(x), 6) for x in v]}, ensure_ascii=False) + "\n"
             for t, v in zip(texts, vecs))
    if out is None:
        sys.stdout.writelines(lines)
        return 0
    with checks.staged(out.parent) as tmp, open(tmp / out.name, "w", encoding="utf-8") as f:
        f.writelines(lines)
    print(f"wrote {len(texts)} embeddings to {out}", file=sys.stderr)
    return 0


def _index_in_parts(args, d, encoder, texts, ids, encode, settings: list) -> int:
    """The index, built in parts of PART_BATCHES batches kept beside it (`.NAME.parts/`): each rank encodes every
    world-th missing part and writes it atomically (a part file is whole or absent), then rank 0 streams the parts
    into the index and removes them. A rerun after a kill encodes only the missing parts, shared anew among its
    ranks; parts of another model, texts or settings are discarded first."""
    import numpy as np
    from bertkit.embed.index import model_hash  # deferred: torch stays off `bertkit -h`'s path
    out, rows = Path(args.out), PART_BATCHES * args.batch_size
    parts = out.with_name(f".{out.name}.parts")
    spans = {parts / f"part-{i:05d}.npy": slice(i * rows, (i + 1) * rows) for i in range(-(-len(texts) // rows))}
    digest = model_hash(encoder) if d.main else None
    if d.main:
        _keep_parts(parts, {"model_hash": digest, "settings": settings, "rows": rows,
                            "texts": hashlib.sha256(json.dumps([ids, texts]).encode()).hexdigest()})
    d.barrier()                             # every rank sees the same complete parts, so they share the rest alike
    mine = [name for name in spans if not name.is_file()][d.rank::d.world]
    batches = sum(-(-len(texts[spans[name]]) // args.batch_size) for name in mine)
    with progress.forward_bar(encoder, batches, "embed", progress.wanted(args.progress) and d.main and batches > 1):
        for name in mine:
            with replacing(name, DataError) as tmp, open(tmp, "wb") as f:
                np.save(f, encode(texts[spans[name]]))
    d.barrier()
    return _write_index(args, encoder, texts, ids, spans, digest) if d.main else 0


def _keep_parts(parts: Path, plan: dict) -> None:
    """`parts` ready for this run: an earlier run's of the same plan kept as it is, anything else made afresh."""
    plan_file = parts / "plan.json"
    # only a parts directory of bertkit's own is reused or removed: a user's folder of that name beside --out is kept
    # (a run killed before its plan.json was written, or while the finished index removed them, left a partial set)
    ours = parts.is_dir() and not parts.is_symlink() and all(
        e.name.lstrip(".").startswith(("plan.json", "part-")) for e in parts.iterdir())
    if (parts.exists() or parts.is_symlink()) and not ours:
        raise checks.OutputError(f"{parts}: holds something else than the parts bertkit builds an index in; move it "
                                 "away or choose another --out")
    if ours and plan_file.is_file() and parse_json(plan_file.read_bytes(), str(plan_file)) == plan:
        done = len(list(parts.glob("part-*.npy")))
        print(f"bertkit embed: {parts} holds {done} encoded parts of this index: encoding the rest", file=sys.stderr)
        return
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    write_json(plan_file, plan)


def _write_index(args, encoder, texts, ids, spans: dict[Path, slice], digest: str) -> int:
    """Rank 0: the parts streamed into the index (one in memory at a time), its texts and source beside it."""
    import numpy as np
    from bertkit.embed.index import INDEX_SOURCE, IndexWriter  # deferred: torch stays off `bertkit -h`'s path
    out = Path(args.out)
    writer = None
    for name, span in spans.items():
        if not name.is_file():
            raise DataError(f"{name}: missing once every rank had finished; the ranks of a run must write to one "
                            "filesystem (an --out every node sees)")
        vecs = np.load(name)
        writer = writer or IndexWriter(out, len(texts), vecs.shape[1], digest, args.dtype or "float16", True)
        writer.add(vecs, ids[span])
    index = writer.commit()
    shutil.rmtree(name.parent)
    (out / INDEX_TEXTS).write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    source = {"model": str(Path(args.model).resolve()), "pooling": encoder.pooling.mode,
              "max_length": encoder.max_seq_length}
    (out / INDEX_SOURCE).write_text(json.dumps(source, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"index": str(out), "count": len(index), "dim": index.dim, "dtype": index.manifest["dtype"]}))
    return 0


# --------------------------------------------------------------------------------------------------- search
def _index_texts(directory: Path, rows: int) -> list[str] | None:
    """The index's texts, one per row, or None where it keeps none; DataError naming the file when they do not fit."""
    path = directory / INDEX_TEXTS
    if not path.is_file():
        return None
    texts = [parse_json(line, f"{path}:{i}") for i, line in enumerate(read_text(path).split("\n"), 1) if line]
    bad = next((i for i, t in enumerate(texts, 1) if not isinstance(t, str)), None)
    if bad is not None:
        raise DataError(f"{path}:{bad}: expected a JSON string (an indexed text), got {type(texts[bad - 1]).__name__}")
    if len(texts) != rows:
        raise DataError(f"{path}: holds {len(texts)} texts for an index of {rows} rows")
    return texts


def search(args) -> int:
    from bertkit.embed.index import INDEX_SOURCE, EmbeddingIndex, model_hash  # deferred: torch, off `bertkit -h`'s path
    from bertkit.embed.runner import load_encoder
    for i, q in enumerate(args.query):
        if not q.strip():
            raise DataError(f"--query {i + 1} is empty")
    directory = Path(args.index)
    index = EmbeddingIndex.open(directory)
    source_path = directory / INDEX_SOURCE
    source = parse_json(source_path.read_bytes(), str(source_path), ConfigError) if source_path.is_file() else {}
    if not isinstance(source, dict):
        raise ConfigError(f"{source_path}: expected a JSON object naming the index's model")
    model = args.model or source.get("model")
    if not isinstance(model, (str, type(None))):
        raise ConfigError(f"{source_path}: model {model!r:.60} is not a model path")
    if model is None:
        raise ConfigError(f"{directory}: no {INDEX_SOURCE} naming its model: give --model")
    encoder, tok = load_encoder(model, source.get("pooling"), True, source.get("max_length"))
    precision = inference_precision(args, "search")
    queries = encoder.encode(tok, args.query, precision=precision, prompt=args.prompt, prompt_name=args.prompt_name)
    depth = max(args.top_k, args.rerank_depth) if args.rerank else args.top_k
    result = index.search(queries, k=depth, model_hash=model_hash(encoder))
    texts = _index_texts(directory, len(index))
    ce = None
    if args.rerank:
        from bertkit.rerank import CrossEncoder  # deferred: torch stays off `bertkit -h`'s path
        if texts is None:
            raise DataError(f"{directory}: no {INDEX_TEXTS}, so the hits cannot be reranked")
        ce = CrossEncoder.load(args.rerank, precision=precision)
    for qi, q in enumerate(args.query):
        hits = [{"id": i, "score": round(float(s), 4), **({"text": texts[r]} if texts else {})}
                for i, s, r in zip(result.ids[qi], result.scores[qi], result.rows[qi])]
        if ce is not None:
            for h, s in zip(hits, ce.score(q, [h["text"] for h in hits])):
                h["rerank_score"] = round(float(s), 6)
            hits.sort(key=lambda h: -h["rerank_score"])
        print(json.dumps({"query": q, "hits": hits[:args.top_k]}, ensure_ascii=False))
    return 0


# --------------------------------------------------------------------------------------------- rerank, mine
def rerank(args) -> int:
    from bertkit.rerank import CrossEncoder  # deferred: torch stays off `bertkit -h`'s path
    docs = read_lines(args.file)
    ce = CrossEncoder.load(args.model, precision=inference_precision(args, "rerank"))
    limit = ce.predictor.model.config.max_input_length
    if args.max_length and args.max_length > limit:     # else only a long enough document would fail, later
        raise ConfigError(f"--max-length {args.max_length} exceeds the model's {limit} positions")
    max_length = args.max_length or ce.max_length
    batches = len(args.query) * -(-len(docs) // args.batch_size)
    with progress.forward_bar(ce.predictor.model, batches, "rerank", progress.wanted(args.progress)) as bar:
        for q in args.query:
            ranked = ce.rank(q, docs, args.top_k, args.batch_size, max_length)
            bar.write(json.dumps({"query": q, "results": [{**r, "score": round(r["score"], 6)} for r in ranked]},
                                 ensure_ascii=False), file=sys.stdout)
    return 0


def mine(args) -> int:
    from bertkit.embed.mine import mine_hard_negatives, pair_label_rows  # deferred: torch stays off `bertkit -h`'s path
    from bertkit.embed.runner import load_encoder
    from bertkit.embed.train import EmbedDataset
    out = checks.out_file(args.out, inputs=(args.model, args.data, args.corpus), default_name="mined.jsonl",
                          overwrite=args.overwrite)
    data = EmbedDataset.read(args.data)
    if data.kind != "pairs":
        raise DataError(f"{args.data}: mining needs anchor, positive columns (found text, text_pair, score)")
    encoder, tok = load_encoder(args.model)
    corpus = read_lines(args.corpus) if args.corpus else []
    with progress.forward_bar(encoder, None, "mine", progress.wanted(args.progress)):   # anchors, then candidates
        rows = mine_hard_negatives(encoder, tok, [t[:2] for t in data.texts], args.negatives, args.skip_top, corpus,
                                   args.batch_size)
    if args.format == "pair":
        rows = pair_label_rows(rows)
    with checks.staged(out.parent) as tmp:
        write_table(tmp / out.name, rows)
    print(json.dumps({"out": str(out), "rows": len(rows), "negatives": args.negatives, "format": args.format}))
    return 0
