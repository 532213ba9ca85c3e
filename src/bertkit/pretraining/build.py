"""The whole pipeline, parallel over processes: corpus files -> documents -> WordPiece ids -> examples -> (static)
masks -> shards (docs/pretraining.md, "Workers"). A worker's output depends only on (seed, rank, workers)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from bertkit.atomic import write_text
from bertkit.errors import ConfigError, DataError
from bertkit.pretraining.corpus import CorpusStats, Counts, expand_corpus, iter_documents
from bertkit.pretraining.examples import BuildStats, ExampleBuilder, ExampleConfig, TokenizedDocument
from bertkit.pretraining.masking import MaskingConfig, VocabTables, example_keys, mask_batch
from bertkit.pretraining.shards import FORMAT_VERSION, MANIFEST, ShardWriter, remove_partial, write_manifest
from bertkit.progress import bar as progress_bar, say
from bertkit.tokenizer import Tokenizer
from bertkit.tokenizer.library import LibraryTokenizer

__all__ = ["prepare", "PrepareConfig", "PrepareSummary"]

_MASK_BATCH = 512           # examples masked and written together
_TOKENIZE_BATCH = 1024      # sentences tokenised together (documents are buffered until they hold this many)
_STATIC_SEED_SALT = 0x5EED_57A7_1C   # static masks draw from other keys than the reader's dynamic masks
_STATS_SAMPLE = 4096        # dynamic masking: examples masked for the summary's statistics


@dataclass(frozen=True)
class PrepareConfig:
    """What `prepare` builds: the corpus, the vocabulary, the output directory and how examples are cut and masked.
    Checked when constructed, so a bad value fails before any file is read."""
    corpus: str | Path | list                # text files, directories or globs (.gz ok)
    vocab: str | Path                        # vocab.txt or a model directory holding one
    out: str | Path                          # the shard directory
    seq_len: int = 128
    task: str = "nsp"                        # nsp | sop | none (packed text, MLM only)
    masking: str = "token"                   # token | wwm | ngram
    dynamic: bool = False                    # masks drawn at batch time, fresh every epoch (RoBERTa)
    mask_prob: float = 0.15                  # BERT's share of tokens to predict
    max_predictions: int | None = None       # None: ceil(mask_prob * seq_len), 20 at 128 like BERT
    dupe_factor: int = 1                     # static masking: copies with different masks (BERT used 10)
    short_seq_prob: float = 0.1              # BERT's share of shorter targets (ignored for task none)
    workers: int = 1                         # processes, each writing its own shards
    seed: int = 12345                        # google-research's create_pretraining_data default
    corpus_format: str = "auto"              # auto | lines (a sentence per line) | prose (split into sentences)
    examples_per_shard: int = 65536          # rows a worker buffers before writing a shard: bounds its memory
    max_line_bytes: int = 256 * 1024         # longer lines are skipped (read in bounded chunks): not prose
    max_document_lines: int = 10_000         # longer documents are cut: bounds memory on files without blank lines
    overwrite: bool = False                  # replace shards already in `out`
    progress: bool = False

    def __post_init__(self):
        self.example_config()                # ExampleConfig and MaskingConfig check their own fields
        self.masking_config()
        if self.max_predictions is not None:
            # static masks are stored max_predictions wide, and a row can never offer more positions than these:
            # [CLS] and the [SEP]s are never masked (examples.py fills at most seq_len - 3 / - 2 tokens)
            maskable = self.seq_len - (2 if self.task == "none" else 3)
            if self.max_predictions > maskable:
                raise ConfigError(f"max_predictions={self.max_predictions} (--max-predictions) exceeds the "
                                  f"{maskable} maskable positions of a seq_len={self.seq_len} {self.task!r} example "
                                  f"([CLS] and [SEP] are never masked): use at most {maskable}")
        if self.dynamic and self.dupe_factor != 1 and self.task == "none":
            # nsp / sop copies differ in their sentence pairs and target lengths, so they still add data
            raise ConfigError(f"dupe_factor={self.dupe_factor} with dynamic masking and task 'none': masks are "
                              "redrawn every epoch and packed rows are identical, so copies add nothing; use "
                              "dupe_factor=1")
        for name in ("workers", "examples_per_shard", "max_line_bytes", "max_document_lines"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")

    def example_config(self) -> ExampleConfig:
        return ExampleConfig(seq_len=self.seq_len, task=self.task, dupe_factor=self.dupe_factor,
                             short_seq_prob=0.0 if self.task == "none" else self.short_seq_prob)

    def masking_config(self) -> MaskingConfig:
        """The masking settings with max_predictions resolved for seq_len (as the manifest records them)."""
        mcfg = MaskingConfig(mode=self.masking, mask_prob=self.mask_prob, max_predictions=self.max_predictions,
                             dynamic=self.dynamic)
        mcfg.max_predictions = mcfg.resolved_max_predictions(self.seq_len)
        return mcfg


@dataclass
class MaskStats(Counts):
    candidates: int = 0      # maskable tokens in masked rows
    chosen: int = 0          # positions to predict
    shown_mask: int = 0
    shown_random: int = 0
    shown_original: int = 0


@dataclass
class PrepareSummary:
    out: str
    seconds: float
    corpus: CorpusStats
    build: BuildStats
    masks: MaskStats                 # static: over every example; dynamic: over a sample drawn like epoch 0
    shards: int
    workers: int
    dynamic: bool

    @property
    def masked_share(self) -> float:
        return self.masks.chosen / max(1, self.masks.candidates)

    @property
    def mb_per_s(self) -> float:
        return self.corpus.bytes / 1e6 / max(self.seconds, 1e-9)

    @property
    def skipped(self) -> dict[str, int]:
        return {**self.corpus.skipped(), "skipped_chunks": self.build.skipped_chunks,
                "no_other_document": self.build.no_other_document}

    def as_dict(self) -> dict:
        return {**asdict(self), "seconds": round(self.seconds, 3), "mb_per_s": round(self.mb_per_s, 3),
                "masked_share": round(self.masked_share, 5)}

    def format(self) -> str:
        c, b, m = self.corpus, self.build, self.masks
        pairs = b.is_next + b.not_next
        lines = [
            f"wrote {b.examples:,} examples in {self.shards} shards to {self.out}",
            f"  input      {c.files} files, {c.bytes / 1e6:.1f} MB, {c.documents:,} documents, {c.sentences:,} sentences"
            + (f" ({c.split_documents} over-long documents cut)" if c.split_documents else ""),
            f"  tokens     {b.tokens:,} in examples, padding {b.padding / max(1, b.tokens + b.padding):.2%}",
            (f"  masking    {'dynamic (sampled as epoch 0)' if self.dynamic else 'static'}: {self.masked_share:.2%} "
             f"of maskable tokens; shown as [MASK] {m.shown_mask / max(1, m.chosen):.1%}, random "
             f"{m.shown_random / max(1, m.chosen):.1%}, original {m.shown_original / max(1, m.chosen):.1%}"),
        ]
        if pairs:
            lines.append(f"  pairs      label 0 {b.is_next / pairs:.1%} / label 1 {b.not_next / pairs:.1%}; "
                         f"{b.split_sentence_pairs:,} split single sentences, {b.forced_not_next} forced NotNext")
        skipped = {k: v for k, v in self.skipped.items() if v}
        lines.append("  skipped    " + (", ".join(f"{k}={v}" for k, v in skipped.items()) if skipped else "nothing"))
        lines.append(f"  speed      {self.mb_per_s:.2f} MB/s of raw text ({self.seconds:.1f} s, {self.workers} workers)")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------- worker

@dataclass
class _Job:
    rank: int
    files: list[str]
    select_modulo: bool              # True: every worker reads all files, keeps documents index % workers == rank
    cfg: PrepareConfig


_progress = None                     # shared per-worker byte counters (multiprocessing.Array) in pool workers


def _init_worker(progress) -> None:
    global _progress
    _progress = progress


def _worker(job: _Job, progress=None) -> dict:
    progress = progress if progress is not None else _progress
    cfg, ecfg, mcfg = job.cfg, job.cfg.example_config(), job.cfg.masking_config()
    tok = Tokenizer.from_pretrained(cfg.vocab)
    tables = VocabTables.from_tokenizer(tok)
    seq_len, static, max_pred = cfg.seq_len, not cfg.dynamic, mcfg.max_predictions
    writer = ShardWriter(cfg.out, f"w{job.rank:02d}", seq_len, tok.vocab_size, tok.pad_token_id,
                         max_predictions=max_pred if static else None, examples_per_shard=cfg.examples_per_shard)
    builder = ExampleBuilder(ecfg, tok.cls_token_id, tok.sep_token_id,
                             seed=int(example_keys(cfg.seed, job.rank, np.array([cfg.workers]))[0]))
    reserved = np.array([tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id])
    cstats, mstats = CorpusStats(), MaskStats()
    pending: list = []
    serial = 0

    def flush():
        nonlocal serial, pending
        if not pending:
            return
        b = len(pending)
        rows = np.full((b, seq_len), tok.pad_token_id, dtype=np.int64)
        meta = np.empty((b, 3), dtype=np.int32)
        for i, ex in enumerate(pending):
            rows[i, :len(ex.tokens)] = ex.tokens
            meta[i] = (len(ex.tokens), ex.a_len, ex.label)
        pos = ids = None
        if static or serial < _STATS_SAMPLE:
            keys = example_keys(cfg.seed ^ _STATIC_SEED_SALT, job.rank, np.arange(serial, serial + b))
            inputs, chosen = mask_batch(rows, meta[:, 0], keys, mcfg, tables)
            _count_masks(mstats, rows, meta[:, 0], inputs, chosen, tables)
            if static:
                order = np.argsort(~chosen, axis=1, kind="stable")[:, :max_pred]       # chosen columns first
                valid = np.take_along_axis(chosen, order, axis=1)
                pos = np.where(valid, order, 0)
                ids = np.where(valid, np.take_along_axis(inputs, order, axis=1), 0)
        writer.add_batch(rows, meta, pos, ids)
        serial += b
        pending = []

    def build(docs):
        for tdoc in _tokenize_documents(tok, docs, reserved):
            pending.extend(builder.add(tdoc))
            if len(pending) >= _MASK_BATCH:
                flush()
        if progress is not None:
            progress[job.rank] = cstats.bytes

    select = (lambda i: i % cfg.workers == job.rank) if job.select_modulo else None
    waiting, n_sentences = [], 0
    for doc in iter_documents(job.files, cfg.corpus_format, cstats, cfg.max_line_bytes, select=select,
                              max_document_lines=cfg.max_document_lines):
        waiting.append(doc)
        n_sentences += len(doc.sentences)
        if n_sentences >= _TOKENIZE_BATCH:
            build(waiting)
            waiting, n_sentences = [], 0
    build(waiting)      # the corpus is read: its last progress report is the total
    pending.extend(builder.finish())
    flush()
    return {"shards": writer.close(), "corpus": asdict(cstats), "build": asdict(builder.stats),
            "masks": asdict(mstats)}


def _tokenize_documents(tok, docs, reserved) -> list[TokenizedDocument]:
    """WordPiece ids of every sentence of `docs`, in one batched tokenizer call (its vectorised path is faster than a
    call per sentence: docs/performance.md)."""
    sentences = [s for d in docs for s in d.sentences]
    if not sentences:
        return []
    encoded = tok(sentences)["input_ids"]                                     # [CLS] pieces [SEP] per sentence
    out, k = [], 0
    for d in docs:
        ids = [e[1:-1] for e in encoded[k:k + len(d.sentences)]]
        k += len(d.sentences)
        tdoc = TokenizedDocument.from_sentences(d.index, ids)
        tdoc.tokens[np.isin(tdoc.tokens, reserved)] = tok.unk_token_id     # a literal "[SEP]" in text -> [UNK]
        out.append(tdoc)
    return out


def _count_masks(st: MaskStats, rows, lengths, inputs, chosen, tables) -> None:
    cand = (np.arange(rows.shape[1])[None, :] < lengths[:, None]) & ~tables.never_mask[rows]
    st.candidates += int(cand.sum())
    st.chosen += int(chosen.sum())
    shown, orig = inputs[chosen], rows[chosen]
    st.shown_mask += int((shown == tables.mask_id).sum())
    st.shown_original += int((shown == orig).sum())
    st.shown_random += int(((shown != tables.mask_id) & (shown != orig)).sum())


# --------------------------------------------------------------------------------------------------------- driver

def _split_files(files: list[Path], workers: int) -> list[list[str]]:
    """Greedy balance by size: the largest file goes to the least loaded worker."""
    loads = [0] * workers
    shares: list[list[str]] = [[] for _ in range(workers)]
    for f in sorted(files, key=lambda p: p.stat().st_size, reverse=True):
        w = loads.index(min(loads))
        shares[w].append(str(f))
        loads[w] += f.stat().st_size
    return [sorted(s) for s in shares]


def prepare(cfg: PrepareConfig) -> PrepareSummary:
    """Build pre-training shards in `cfg.out` from `cfg.corpus` (paths / dirs / globs). Returns the summary."""
    ecfg, mcfg = cfg.example_config(), cfg.masking_config()
    files = expand_corpus(cfg.corpus)
    tok = Tokenizer.from_pretrained(cfg.vocab)
    out = Path(cfg.out)
    _prepare_out_dir(out, cfg.overwrite)

    by_files = len(files) >= cfg.workers
    shares = _split_files(files, cfg.workers) if by_files else [[str(f) for f in files]] * cfg.workers
    jobs = [_Job(w, shares[w], not by_files, cfg) for w in range(cfg.workers) if shares[w]]
    total_bytes = sum(f.stat().st_size for f in files)
    t0 = time.perf_counter()
    results = _run(jobs, total_bytes * (1 if by_files else len(jobs)), cfg.progress)
    seconds = time.perf_counter() - t0

    cstats, bstats, mstats, shards = _merge_results(results, counted_once=by_files)
    if bstats.examples == 0:
        raise DataError(f"corpus {[str(f) for f in files][:3]}... produced no examples "
                        f"({cstats.documents} documents; skipped: {cstats.skipped()})")
    # written once there are shards: a refused run leaves nothing of its own
    write_text(out / "vocab.txt", "\n".join(tok.ids_to_tokens) + "\n")
    if isinstance(tok, LibraryTokenizer):       # BPE / Unigram: its specials and word starts are in its own files
        tok.save(out)
    summary = PrepareSummary(str(out), seconds, cstats, bstats, mstats, len(shards), len(jobs), cfg.dynamic)
    write_manifest(out, {
        "format": "bertkit-pretraining-shards", "version": FORMAT_VERSION,
        "vocab_hash": tok.vocab_hash, "vocab_size": tok.vocab_size, "lowercase": tok.lowercase,
        "seq_len": cfg.seq_len, "task": cfg.task, "short_seq_prob": ecfg.short_seq_prob,
        "dupe_factor": cfg.dupe_factor, "buffer_docs": ecfg.buffer_docs, "buffer_tokens": ecfg.buffer_tokens,
        "masking": asdict(mcfg), "static_masks": not cfg.dynamic, "seed": cfg.seed, "workers": len(jobs),
        "corpus": [str(f) for f in files][:1000], "corpus_format": cfg.corpus_format,
        "counts": {"examples": bstats.examples, "documents": cstats.documents, "sentences": cstats.sentences,
                   "tokens": bstats.tokens, "padding": bstats.padding, "label_0": bstats.is_next,
                   "label_1": bstats.not_next, "masked": mstats.chosen, "maskable": mstats.candidates,
                   "bytes": cstats.bytes, "skipped": summary.skipped},
        "shards": sorted(shards, key=lambda e: e["name"]),
    })
    warning = _lone_document_warning(results, bstats, cstats.documents)
    if warning is not None:
        say(f"bertkit prepare: warning: {warning}")
    return summary


def _merge_results(results: list[dict], counted_once: bool) -> tuple[CorpusStats, BuildStats, MaskStats, list]:
    """The workers' counts summed and their shard lists joined. `counted_once` False: every worker read the whole
    stream, so the input counts are divided back to one reading."""
    cstats, bstats, mstats, shards = CorpusStats(), BuildStats(), MaskStats(), []
    for r in results:
        cstats.merge(CorpusStats(**r["corpus"]))
        bstats.merge(BuildStats(**r["build"]))
        mstats.merge(MaskStats(**r["masks"]))
        shards.extend(r["shards"])
    if not counted_once:
        for name in (f.name for f in fields(CorpusStats) if f.name not in ("documents", "sentences")):
            setattr(cstats, name, getattr(cstats, name) // len(results))
    return cstats, bstats, mstats, shards


_LONE_DOCUMENT_SHARE = 0.02     # of the NotNext pairs wanted; below it the labels stay within a point of 50/50


def _lone_document_warning(results: list[dict], bstats: BuildStats, documents: int) -> str | None:
    """Why NotNext pairs are missing, when too many of them could not be made: a worker pairs only the documents
    it reads, so one that got a single document has no other to draw B from and makes IsNext pairs instead."""
    wanted = bstats.not_next + bstats.no_other_document
    if not wanted or bstats.no_other_document <= _LONE_DOCUMENT_SHARE * wanted:
        return None
    pairs = bstats.is_next + bstats.not_next
    lost = (f"{bstats.no_other_document:,} of {wanted:,} NotNext pairs could not be made and became IsNext "
            f"(label 0 is {bstats.is_next / max(1, pairs):.0%} of the pairs)")
    if len(results) == 1:
        return f"{lost}: the corpus holds a single document; separate documents with a blank line"
    alone = sum(1 for r in results if r["corpus"]["documents"] == 1)
    return (f"{lost}: {alone} of {len(results)} workers got a single document of the corpus's {documents:,}, and "
            f"a worker draws NotNext only from its own; use fewer --workers (each needs at least 2 documents)")


def _prepare_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} exists and is not a directory")
    if (out / MANIFEST).exists() and not overwrite:
        raise DataError(f"{out} already holds shards ({MANIFEST}); pass overwrite=True (--overwrite) to replace them")
    out.mkdir(parents=True, exist_ok=True)
    remove_partial(out)


def _run(jobs: list[_Job], total: int, show: bool) -> list[dict]:
    with progress_bar(total=total, unit="B", unit_scale=True, desc="prepare", smoothing=0.1, show=show) as bar:
        if len(jobs) == 1:
            return [_worker(jobs[0], _BarCounter(bar))]
        # fork starts a worker with numpy and the tokenizer already imported (spawn re-imports them in every worker,
        # docs/performance.md); but a parent that imported torch has thread pools that fork does not copy safely.
        ctx = mp.get_context("fork" if sys.platform == "linux" and "torch" not in sys.modules else "spawn")
        shared = ctx.Array("q", len(jobs), lock=False)
        with ProcessPoolExecutor(len(jobs), mp_context=ctx, initializer=_init_worker, initargs=(shared,)) as pool:
            with _main_script_hidden():              # submit starts the workers
                futures = [pool.submit(_worker, job) for job in jobs]
            while not all(f.done() for f in futures):
                time.sleep(0.2)
                bar.n = sum(shared)
                bar.refresh()
            return [f.result() for f in futures]


@contextlib.contextmanager
def _main_script_hidden():
    """A spawned worker runs the parent's main script first (as __mp_main__): the `bertkit` console script would
    import the CLI and torch in each. The workers run a function of this module, so they start without the script
    (`python -m bertkit` is skipped by multiprocessing itself)."""
    main = sys.modules["__main__"]
    path = main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        if path is not None:
            main.__file__ = path


class _BarCounter:
    """Stands in for the shared counter array in the single-process case: updates the bar directly."""

    def __init__(self, bar):
        self.bar, self.last = bar, 0

    def __setitem__(self, i, value):
        if value - self.last >= 1 << 20:   # refresh every MB
            self.bar.n, self.last = value, value
            self.bar.refresh()
