"""Bi-encoder fine-tuning and evaluation from files: the library behind `bertkit finetune --task embed` and
`bertkit evaluate --task embed` (data formats, prompts and the report: docs/cli.md).

    summary = finetune_embed(EmbedFinetuneConfig(model=minilm_dir, train="data/retrieval/train.jsonl",
                                                 dev="data/retrieval/dev", out="runs/retrieval"))
    report = evaluate_embed("runs/retrieval", "data/retrieval/test", baseline=minilm_dir)   # before / after

`EmbedRun` runs under fine-tuning's one driver (tasks.runner.run) on `bertkit.train`'s loop; each seed's model is
saved as a sentence-transformers directory, the prompts of its first two training columns as "query" and "document".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from bertkit.embed.losses import CoSENTLoss, CosineMSELoss, MultipleNegativesRankingLoss
from bertkit.embed.pooling import Dense, Pooling
from bertkit.embed.st_format import load_sentence_encoder, save_sentence_encoder
from bertkit.embed.train import EmbedDataset, EmbedModel, embed_step, retrieval_eval, similarity_eval
from bertkit.predict.engine import PRECISION
from bertkit.errors import ConfigError, DataError
from bertkit.tasks.readers import column_names, table_rows
from bertkit.tasks.resume import checkpointing
from bertkit.tasks.runner import check_recipe, compact, log, run, spread, spread_metrics, timed_train
from bertkit.textfiles import parse_json
from bertkit.train.callbacks import reporting
from bertkit.train.compact import restore_word_embeddings
from bertkit.train.loop import TrainConfig, run_seeds, seed_everything

__all__ = ["EmbedFinetuneConfig", "EmbedRun", "finetune_embed", "evaluate_embed", "read_retrieval", "evaluator",
           "LOSSES", "load_encoder", "training_prompts"]

LOSSES = ("mnrl", "cosent", "cosine")
_ID = ("id", "_id")
_QID = ("query_id", "query-id", "qid")
_CID = ("corpus_id", "corpus-id", "doc_id", "docid", "pid")


def _recipe() -> TrainConfig:
    """sentence-transformers' defaults (lr 2e-5, one epoch) with BERT's linear warmup over 10% of the steps."""
    return TrainConfig(lr=2e-5, epochs=1.0, warmup=0.1, log_every_steps=50)


@dataclass
class EmbedFinetuneConfig:
    model: str                               # sentence-transformers or HF BERT directory
    train: str                               # pairs (anchor, positive[, negative...]) or scored pairs
    out: str
    dev: str | None = None                   # retrieval directory, scored-pair or pair file
    test: str | None = None
    training: TrainConfig = field(default_factory=_recipe)
    batch_size: int = 32
    loss: str | None = None                  # mnrl | cosent | cosine; None: mnrl for pairs, cosent for scored
    scale: float = 20.0                      # MNRL's (initial) logit scale; CoSENT's scale
    learnable_scale: bool = False
    symmetric: bool = False
    gradcache_batch: int | None = None       # GradCache mini-batch: a large batch in a small batch's memory
    pooling: str | None = None               # None: the model's (its pooling config; mean for plain BERT)
    normalize: bool | None = None            # None: the model's
    projection: int | None = None            # an extra Dense (identity activation) to this many dimensions
    max_length: int | None = None            # pieces per text; None: the model's max_seq_length
    anchor_max_length: int | None = None     # pieces per anchor / text (the query side); None: max_length
    seeds: tuple[int, ...] = (1,)
    max_train_examples: int | None = None
    eval_batch_size: int = 128
    compact_embeddings: bool = True
    save_model: bool = True
    quiet: bool = False
    resume: bool = False                     # continue the run in `out` (training.resume), as FinetuneConfig's
    save_every_steps: int | None = None      # checkpoints (training's; `bertkit finetune --save-every` routes here)
    save_every_minutes: float | None = None
    report_to: tuple[str, ...] = ()          # loggers besides metrics.jsonl and TensorBoard: wandb | mlflow
    prompts: str | dict | None = None        # sentence-transformers' training `prompts`: see training_prompts

    def __post_init__(self):
        self.resume = bool(self.resume or self.training.resume)
        self.training = replace(self.training, resume=self.resume, save_every_steps=self.save_every_steps or
                                self.training.save_every_steps, save_every_minutes=self.save_every_minutes or
                                self.training.save_every_minutes)
        self.seeds = run_seeds(self.seeds)
        if self.loss is not None and self.loss not in LOSSES:
            raise ConfigError(f"--loss {self.loss!r}: choose one of {', '.join(LOSSES)}")
        for name in ("batch_size", "gradcache_batch", "projection", "max_length", "anchor_max_length",
                     "max_train_examples"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ConfigError(f"scale must be a positive number, got {self.scale!r}")
        check_recipe(self.training)


# ---------------------------------------------------------------------------------------------------- data
def _field(path: Path, line: int, row: dict, names: tuple[str, ...]) -> str:
    for n in names:
        value = row.get(n)
        if value is not None and str(value).strip():
            return str(value).strip()
    raise DataError(f"{path}:{line}: column {names[0]!r}: missing or empty (found {column_names(row)})")


def _table(directory: Path, stem: str) -> Path:
    found = [directory / f"{stem}.{ext}" for ext in ("jsonl", "csv", "tsv") if (directory / f"{stem}.{ext}").is_file()]
    if not found:
        raise DataError(f"{directory}: no {stem}.jsonl / {stem}.csv / {stem}.tsv (a retrieval set needs queries, "
                        f"corpus and qrels)")
    return found[0]


def read_id_texts(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line, row in table_rows(path):
        key = _field(path, line, row, _ID)
        if key in out:
            raise DataError(f"{path}:{line}: id {key!r} appears twice")
        title = str(row.get("title") or "").strip()
        out[key] = f"{title} {_field(path, line, row, ('text',))}" if title else _field(path, line, row, ("text",))
    if not out:
        raise DataError(f"{path}: no rows")
    return out


def read_retrieval(directory) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, float]]]:
    """(queries {id: text}, corpus {id: text}, qrels {query id: {corpus id: grade}}) from a retrieval directory."""
    directory = Path(directory)
    queries, corpus = read_id_texts(_table(directory, "queries")), read_id_texts(_table(directory, "corpus"))
    path = _table(directory, "qrels")
    qrels: dict[str, dict[str, float]] = {}
    for line, row in table_rows(path):
        q, c = _field(path, line, row, _QID), _field(path, line, row, _CID)
        if q not in queries:
            raise DataError(f"{path}:{line}: query id {q!r} is not in the queries file")
        if c not in corpus:
            raise DataError(f"{path}:{line}: corpus id {c!r} is not in the corpus file")
        try:
            score = row.get("score")
            grade = 1.0 if score is None or score == "" else float(score)     # a JSON 0 is a grade, not a blank
        except (TypeError, ValueError):
            raise DataError(f"{path}:{line}: column 'score': {row.get('score')!r} is not a number") from None
        qrels.setdefault(q, {})[c] = grade
    if not qrels:
        raise DataError(f"{path}: no relevance rows")
    return queries, corpus, qrels


def training_prompts(spec: str | dict | None, columns: list[str], source: str) -> dict[str, str]:
    """{column: prompt} from sentence-transformers' `prompts` training argument: one text for every column, or a
    {column: text} mapping (JSON on the command line); "negative" names every negative column."""
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        spec = parse_json(spec, "--prompts (one text, or a JSON object {column: text})", ConfigError)
    if not spec:
        return {}
    if isinstance(spec, str):
        return dict.fromkeys(columns, spec)
    if not isinstance(spec, dict) or not all(isinstance(v, str) for v in spec.values()):
        raise ConfigError(f"--prompts: expected one text or {{column: text}}, got {spec!r:.80}")
    out = {}
    for key, text in spec.items():
        named = [c for c in columns if c == key or (key == "negative" and c.startswith("negative_"))]
        if not named:
            raise ConfigError(f"--prompts: column {key!r} is not one of {source}'s: {', '.join(columns)}")
        out.update(dict.fromkeys(named, text))
    return out


def evaluator(path, tokenizer, batch_size: int = 128, precision: str = PRECISION, prompts: tuple = (None, None)):
    """The eval_fn (model -> metrics) of a retrieval directory (queries, corpus, qrels), a scored-pair file or a pair
    file, whose anchors retrieve among its distinct positives. prompts: the queries' (texts') and the corpus' (text
    pairs') prompts; None: the model's default."""
    path = Path(path)
    if path.is_dir():
        return retrieval_eval(tokenizer, *read_retrieval(path), batch_size=batch_size, precision=precision,
                              prompts=prompts)
    if not path.is_file():
        raise DataError(f"{path}: no such evaluation file or directory")
    data = EmbedDataset.read(path)
    if data.kind == "scored":
        a, b = zip(*data.texts)
        return similarity_eval(tokenizer, a, b, data.scores, batch_size, precision, prompts)
    pid = {p: f"p{i}" for i, p in enumerate(dict.fromkeys(t[1] for t in data.texts))}   # distinct positives
    queries = {f"q{i}": t[0] for i, t in enumerate(data.texts)}
    qrels = {f"q{i}": {pid[t[1]]: 1.0} for i, t in enumerate(data.texts)}
    return retrieval_eval(tokenizer, queries, {v: k for k, v in pid.items()}, qrels, batch_size=batch_size,
                          precision=precision, prompts=prompts)


# ---------------------------------------------------------------------------------------------------- model
def load_encoder(model, pooling: str | None = None, normalize: bool | None = None, max_length: int | None = None,
                 projection: int | None = None):
    """(SentenceEncoder, Tokenizer) of a directory, its settings changed where an argument is given."""
    encoder, tok = load_sentence_encoder(model)
    if pooling is not None:
        encoder.pooling = Pooling(pooling.split("+"), hidden_size=encoder.bert.config.hidden_size,
                                  include_prompt=encoder.pooling.include_prompt)
        if len(encoder.dense) and encoder.dense[0].in_features != encoder.pooling.output_dim():
            raise ConfigError(f"--pooling {pooling}: gives {encoder.pooling.output_dim()} features but {model}'s "
                              f"Dense layer takes {encoder.dense[0].in_features}")
    if normalize is not None:
        encoder.normalize = bool(normalize)
    if max_length is not None:
        limit = encoder.bert.config.max_input_length
        if max_length > limit:
            raise ConfigError(f"--max-length {max_length} exceeds the model's {limit} positions")
        encoder.max_seq_length = max_length
    if projection is not None:
        encoder.dense.append(Dense(encoder.dim, projection, activation="identity"))
    return encoder, tok


def _loss(cfg: EmbedFinetuneConfig, kind: str, source: str):
    name = cfg.loss or ("mnrl" if kind == "pairs" else "cosent")
    if (name == "mnrl") != (kind == "pairs"):
        want = "anchor, positive[, negative...]" if name == "mnrl" else "text, text_pair, score"
        raise DataError(f"{source}: --loss {name} needs columns {want}")
    if name == "mnrl":
        return MultipleNegativesRankingLoss(cfg.scale, cfg.learnable_scale, cfg.symmetric)
    return CoSENTLoss(cfg.scale) if name == "cosent" else CosineMSELoss()


def _used_ids(encoder, tok, data, prompts: dict[str, str]) -> set[int]:
    """The piece ids of every training text, its prompt before it (and the pad id): the rows a compact embedding
    table trains."""
    texts = {prompts.get(c, "") + t for row in data.texts for c, t in zip(data.columns, row)}
    texts = sorted({t.lower() if encoder.do_lower_case else t for t in texts})
    ids = {tok.pad_token_id}
    for start in range(0, len(texts), 1024):
        for row in tok(texts[start:start + 1024], max_length=encoder.max_seq_length, truncation=True)["input_ids"]:
            ids.update(row)
    return ids


# ---------------------------------------------------------------------------------------------------- running
class EmbedRun:
    """`tasks.runner.run` for a bi-encoder: per seed, every evaluation split before and after training."""

    def __init__(self, callbacks=()):
        self.callbacks = list(callbacks)

    def prepare(self, cfg: EmbedFinetuneConfig) -> None:
        data = EmbedDataset.read(cfg.train)
        if cfg.max_train_examples:
            data.texts = data.texts[:cfg.max_train_examples]
            data.scores = data.scores[:cfg.max_train_examples] if data.scores else data.scores
        _loss(cfg, data.kind, data.source)                  # a loss that does not fit the file fails before loading
        self.splits = {s: p for s, p in (("dev", cfg.dev), ("test", cfg.test)) if p}
        for p in self.splits.values():
            if not Path(p).exists():
                raise DataError(f"{p}: no such evaluation file or directory")
        log(cfg, f"finetune embed: {len(data)} {data.kind} examples, columns {', '.join(data.columns)}")
        self.data = data
        self.prompts = training_prompts(cfg.prompts, data.columns, data.source)
        # evaluation reads queries (texts) as the first column was trained, the corpus (pairs) as the second
        self.eval_prompts = tuple(self.prompts.get(c) for c in data.columns[:2])

    def train_seed(self, cfg: EmbedFinetuneConfig, seed: int, run_dir: Path, log_prefix: str) -> dict:
        """Train one seed; returns its record (before / after metrics, timing) and saves the model."""
        data = self.data
        seed_everything(seed)
        encoder, tok = load_encoder(cfg.model, cfg.pooling, cfg.normalize, cfg.max_length, cfg.projection)
        evals = {s: evaluator(p, tok, cfg.eval_batch_size, cfg.training.precision, self.eval_prompts)
                 for s, p in self.splits.items()}
        before = {split: fn(encoder) for split, fn in evals.items()}
        model = EmbedModel(encoder, _loss(cfg, data.kind, data.source))
        compacted = compact(cfg, encoder, _used_ids(encoder, tok, data, self.prompts))
        batches = data.batches(encoder, tok, cfg.batch_size, seed=seed)
        batches.prompts = self.prompts
        if cfg.anchor_max_length:
            batches.max_lengths = {data.columns[0]: cfg.anchor_max_length}
        total = max(1, math.ceil(len(batches) * cfg.training.epochs))
        tcfg = replace(cfg.training, max_steps=total, epochs=None, seed=seed, plot=False,
                       progress=cfg.training.progress and not cfg.quiet, eval_every_steps=None,
                       **checkpointing(cfg.training))
        result, timing = timed_train(model, batches, tcfg, run_dir, dict(step_fn=embed_step(cfg.gradcache_batch),
                                     callbacks=self.callbacks), lambda r: r.steps * cfg.batch_size)
        if compacted:
            restore_word_embeddings(encoder)
        after = {split: fn(encoder) for split, fn in evals.items()}
        rec = {"seed": seed, "steps": result.steps, **timing,
               "final_loss": result.losses[-1] if result.losses else None, "before": before, "after": after}
        if cfg.save_model:
            # the trained prompts under the names SentenceTransformer.encode_query / encode_document read
            encoder.prompts.named.update({n: p for n, p in zip(("query", "document"), self.eval_prompts) if p})
            save_sentence_encoder(encoder, tok, run_dir)
            rec["model_dir"] = str(run_dir)
        log(cfg, f"seed {seed}: {json.dumps({'after': after}, default=float)}")
        return rec

    def summary(self, cfg: EmbedFinetuneConfig, runs: list[dict]) -> dict:
        """The before / after metrics of every evaluation split (mean +- std over seeds) and the throughput."""
        data = self.data
        return {"task": "embed", "model": cfg.model, "kind": data.kind,
                "loss": cfg.loss or ("mnrl" if data.kind == "pairs" else "cosent"), "lr": cfg.training.lr,
                "batch_size": cfg.batch_size, "epochs": cfg.training.epochs, "seeds": list(cfg.seeds),
                "train_examples": len(data), "examples_per_s": spread([r["examples_per_s"] for r in runs]),
                **{stage: {split: spread_metrics([r[stage][split] for r in runs]) for split in runs[0][stage]}
                   for stage in ("before", "after")}}


def finetune_embed(cfg: EmbedFinetuneConfig) -> dict:
    """Train a bi-encoder per the config for each seed; returns (and writes OUT/summary.json) the before / after
    metrics of every evaluation split (mean +- std over seeds) and the training throughput."""
    return run(cfg, EmbedRun(reporting(cfg.report_to)))


def evaluate_embed(model, data, baseline=None, batch_size: int = 128) -> dict:
    """Metrics of `model` on an evaluation path; with `baseline`, that model's metrics on the same set too
    ({"before": baseline's, "after": model's})."""
    report = {}
    for name, path in (("before", baseline), ("after", model)):
        if path is None:
            continue
        encoder, tok = load_encoder(path)
        report[name] = {"model": str(path), **evaluator(data, tok, batch_size)(encoder)}
    return report if baseline is not None else report["after"]
