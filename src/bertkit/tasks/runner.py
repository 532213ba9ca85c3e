"""Fine-tuning, evaluation and prediction: the library behind `bertkit finetune / evaluate / predict`.

    result = finetune(FinetuneConfig(task="classify", model=minilm_dir, train="train.csv", dev="dev.csv",
                                     out="runs/sst", training=finetune_recipe(lr=3e-5)))
    report = evaluate("runs/sst", "test.csv");  predict("runs/sst", "new.csv", "preds.jsonl")

`run` is the one fine-tuning driver (seeds, metrics.json, summary.json): `TaskRun` for the registry's tasks,
embed.runner's for bi-encoders; training is `bertkit.train`'s loop. The recipe (seeds, grid, patience, resume) and
the saved directory: docs/architecture.md, "Fine-tuning".
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

import torch

from bertkit import runtime
from bertkit.atomic import replacing, write_text
from bertkit.config import BertConfig, read_json_config
from bertkit.errors import ConfigError
from bertkit.precision import resolve
from bertkit.progress import forward_bar, say
from bertkit.tasks.batching import BucketBatchSampler, collate
from bertkit.tasks.memory import materialize
from bertkit.tasks.registry import ALIASES, TASKS, default, make_task
from bertkit.tasks.resume import Settings, checkpointing, finished
from bertkit.tasks.task import Feature, Task
from bertkit.textfiles import shown_all
from bertkit.tokenizer import Tokenizer
from bertkit.train.callbacks import main_rank, reporting
from bertkit.train.checkpointing import CHECKPOINT_DIR, load_model_weights, save_model_weights
from bertkit.train.compact import compact_word_embeddings, restore_word_embeddings
from bertkit.train.loop import TrainConfig, run_seeds, seed_everything, train

__all__ = ["FinetuneConfig", "FinetuneHooks", "FinetuneRun", "TaskRun", "run", "finetune", "finetune_recipe",
           "evaluate", "predict", "load_task", "check_recipe", "PAPER_GRID", "TrainBatches", "evaluate_task",
           "model_overrides", "numeric_metrics", "spread", "spread_metrics", "compact", "log"]

PAPER_GRID = {"lr": (5e-5, 3e-5, 2e-5), "batch_size": (16, 32)}   # appendix A.3 (epochs kept as configured)


def finetune_recipe(**changes) -> TrainConfig:
    """The paper's fine-tuning recipe as the loop's settings; `changes` override it, e.g. finetune_recipe(lr=3e-5)."""
    return TrainConfig(**{"lr": 5e-5, "epochs": 3.0, "warmup": 0.1, "log_every_steps": 50, "progress": False,
                          **changes})


@dataclass
class FinetuneConfig:
    task: str                              # a tasks.registry name: classify | pair | regress | multilabel | tag | qa
    model: str                             # HF-format directory, or a preset name (random init; needs vocab)
    train: str | list | object             # the training file, or its examples: dicts or a datasets.Dataset
    dev: str | list | object               # (tasks.memory: the fields of the file formats)
    out: str
    training: TrainConfig = field(default_factory=finetune_recipe)  # the loop's settings (`train` is the file)
    test: str | list | object | None = None
    vocab: str | None = None               # vocab.txt for a preset model (a directory brings its own)
    random_init: bool = False              # fresh weights: the baseline that shows what pre-training is worth
    batch_size: int = 32
    dropout: float = 0.1                   # hidden + attention dropout of the encoder (and the head)
    max_length: int | None = None          # pieces per example; None: the task's default (384 for qa, else 128),
                                           # at most what the model's position table takes
    seeds: tuple[int, ...] = (1,)
    grid: bool = False                     # the paper's grid is lr {5e-5, 3e-5, 2e-5} x batch {16, 32}
    patience: int = 0                      # stop after this many evaluations without improvement; 0 = never
    max_train_examples: int | None = None  # keep the first N training examples (quick runs); counted in the result
    eval_batch_size: int = 128
    bucket_batches: int = 50               # batches per length-sorted window (less padding); 1: plain random
    attn_implementation: str | None = None # None: the checkpoint's setting ("auto")
    compact_embeddings: bool = True        # train only the used embedding rows: same maths (bertkit.train.compact)
    # token classification
    label_all_pieces: bool = False
    scheme: str | None = None              # convert tags to IOB1/IOB2/BIOES before training; None = as in the file
    # question answering
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best: int = 20
    multilabel_sep: str = "|"
    save_model: bool = True
    quiet: bool = False
    resume: bool = False                   # continue the run in `out` (training.resume): exactly as if never stopped
    report_to: tuple[str, ...] = ()        # loggers besides metrics.jsonl and TensorBoard: wandb | mlflow

    def __post_init__(self):
        self.resume = bool(self.resume or self.training.resume)
        self.training = replace(self.training, resume=self.resume)
        self.task = ALIASES.get(self.task, self.task)
        if self.task not in TASKS:
            raise ConfigError(f"--task {self.task!r}: choose one of {', '.join(TASKS)}")
        if self.max_length is None:
            self.max_length = min(default(self.task, "max_length"), _model_positions(self.model))
        _check_task_fit(self)
        self.seeds = run_seeds(self.seeds)
        check_recipe(self.training, batch_size=self.batch_size, max_length=self.max_length,
                     bucket_batches=self.bucket_batches)


def _model_positions(model) -> int:
    """The longest input a model directory's position table takes (a preset's table is larger than any default)."""
    path = Path(model) / "config.json"
    return BertConfig.from_json(path).max_input_length if path.is_file() else 1 << 30


# the most pieces a model's specials take around a text pair (RoBERTa: <s> a </s></s> b </s>)
_SPECIALS = 4


def _check_task_fit(cfg: FinetuneConfig) -> None:
    """One line for a setting the run cannot use: a length with no room for text, a tag option on another task."""
    if cfg.max_length <= _SPECIALS:
        raise ConfigError(f"--max-length {cfg.max_length} leaves no room for text (a model's special tokens take up "
                          f"to {_SPECIALS} pieces); give at least {_SPECIALS + 1}")
    if cfg.scheme is not None and cfg.task != "tag":
        raise ConfigError(f"--scheme {cfg.scheme} converts the tags of --task tag; --task {cfg.task} has none")


def check_query_budget(max_query_length: int, max_length: int) -> None:
    """Refuses a question budget asked for that leaves no room for the context (the default one is only a bound)."""
    if max_query_length + _SPECIALS >= max_length:
        raise ConfigError(f"--max-query-length {max_query_length} leaves no room for the context in --max-length "
                          f"{max_length}; give a --max-query-length below {max_length - _SPECIALS}")


def check_recipe(training: TrainConfig, **values) -> None:
    """One ConfigError line for the first of lr, epochs and `values` that is not > 0, or a warmup outside [0, 1)."""
    for name, value in {"lr": training.lr, "epochs": training.epochs, **values}.items():
        if value is None or value <= 0:
            raise ConfigError(f"{name} must be > 0, got {value!r}")
    if not 0 <= training.warmup < 1:
        raise ConfigError(f"warmup must be a fraction in [0, 1), got {training.warmup!r}")

# ---------------------------------------------------------------------------------------------------- tasks

def _task(cfg: FinetuneConfig) -> Task:
    """The run's task, its settings the configuration's fields of the same name (--scheme is its convert_to)."""
    return make_task(cfg.task, {**vars(cfg), "convert_to": cfg.scheme})


def load_task(model_dir: str | Path):
    """(task, model frozen for inference, tokenizer) from a directory written by `finetune`."""
    model_dir = Path(model_dir)
    cfg_path = model_dir / "config.json"
    if not cfg_path.exists():
        seeds = sorted(p.name for p in model_dir.glob("seed-*") if (p / "config.json").is_file())
        if seeds:   # `finetune --seeds 1,2,3` writes one model per seed
            raise ConfigError(f"{model_dir}: holds one model per seed ({', '.join(seeds)}): give one of them, "
                              f"e.g. --model {model_dir / seeds[0]}")
        raise ConfigError(f"{model_dir}: no config.json (not a model directory)")
    settings = read_json_config(cfg_path).get("bertkit_task")
    if not isinstance(settings, dict) or settings.get("kind") not in TASKS:
        raise ConfigError(f"{cfg_path}: no 'bertkit_task' entry: not a model fine-tuned by bertkit "
                          f"(evaluate/predict need the task kind and label map saved by `bertkit finetune`)")
    task = make_task(settings["kind"], settings)
    model = runtime.freeze(task.model_class.from_pretrained(model_dir))     # evaluate / predict only
    if model.config.id2label:
        task.restore_labels([model.config.id2label[i] for i in sorted(model.config.id2label)])
    return task, model, Tokenizer.from_pretrained(model_dir)


# ---------------------------------------------------------------------------------------------- evaluation

def evaluate_task(task: Task, model, examples, feats: list[Feature], batch_size: int,
                  precision: str) -> tuple[dict, object]:
    """Metrics of `model` on (examples, feats); returns (report, raw predictions for writing)."""
    raw = task.predict(model, examples, feats, batch_size, precision)
    return task.score(examples, feats, raw), raw


def _write_outputs(task: Task, out_dir: Path, split: str, examples, feats, raw, report: dict) -> list[str]:
    path = task.write_predictions(out_dir / f"predictions_{split}{task.predictions_suffix}", examples, feats, raw)
    return [str(path)] + [str(p) for p in task.artifacts(out_dir, split, report)]


# ------------------------------------------------------------------------------------------------- the driver

class FinetuneRun(Protocol):
    """One kind of fine-tuning as `run` drives it: `TaskRun` (the registry's tasks) or embed.runner's bi-encoders."""

    def prepare(self, cfg) -> None:
        """Read and check the data (before any model is loaded); log what was read."""

    def train_seed(self, cfg, seed: int, run_dir: Path, log_prefix: str) -> dict:
        """Train, evaluate and save one model; its record, written to RUN_DIR/metrics.json."""

    def summary(self, cfg, runs: list[dict]) -> dict:
        """summary.json's entries (the driver adds the configuration)."""


def run(cfg, how: FinetuneRun) -> dict:
    """The one fine-tuning driver: one model per seed of `cfg` (in OUT for one seed, OUT/seed-N for several), each
    with its metrics.json, and OUT/summary.json (mean +- std over the seeds); returns the summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    # auto precision resolved once, so the summary records what ran
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = replace(cfg, training=replace(cfg.training, precision=resolve(cfg.training.precision, device)))
    cfg, files = materialize(cfg, getattr(cfg, "task", "embed"))        # in-memory examples: files in OUT/data
    settings = Settings(cfg, files)         # a refused resume (other settings or data) changes no file
    for path, text in files.items():
        path.parent.mkdir(exist_ok=True)
        write_text(path, text)
    how.callbacks.append(settings)          # recorded once training starts: a run that fails before writes none
    how.prepare(cfg)
    runs = []
    for seed in cfg.seeds:
        run_dir = out if len(cfg.seeds) == 1 else out / f"seed-{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        rec = finished(cfg, run_dir / "metrics.json") or how.train_seed(cfg, seed, run_dir, f"[seed {seed}] "
                                                                        if len(cfg.seeds) > 1 else "")
        write_text(run_dir / "metrics.json", json.dumps(rec, indent=1, default=float))
        shutil.rmtree(run_dir / "train" / CHECKPOINT_DIR, ignore_errors=True)   # the seed is done: nothing to resume
        runs.append(rec)
    summary = {**how.summary(cfg, runs), "config": shown_all(asdict(cfg))}
    write_text(out / "summary.json", json.dumps(summary, indent=1, default=float))
    return summary


def timed_train(model, batches, training: TrainConfig, run_dir: Path, loop: dict, examples, eval_s=lambda: 0.0):
    """`train` of one seed into RUN_DIR/train, timed as every fine-tuning run records it: train_s (wall, the loop's
    setup included, its dev evaluations `eval_s()` not), train_cpu_s (this process's CPU time, which other load on
    the machine leaves alone), loop_s (the loop's own clock), train_examples (`examples(result)`), examples_per_s.
    Returns the loop's result and those figures."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = train(model, batches, training, run_dir / "train", **loop)
    wall, cpu, n = time.perf_counter() - t0 - eval_s(), time.process_time() - cpu0, examples(result)
    return result, {"train_s": wall, "train_cpu_s": cpu, "loop_s": result.elapsed_s, "train_examples": n,
                    "examples_per_s": n / wall if wall > 0 else 0.0}


def log(cfg, msg: str) -> None:
    if not cfg.quiet:
        say(msg)


def spread(values: list[float]) -> dict:
    """Mean and sample standard deviation (n - 1) over the seeds."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def numeric_metrics(report: dict) -> dict[str, float]:
    return {k: float(v) for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def spread_metrics(reports: list[dict]) -> dict:
    """`spread` of every measurement (a float) in the seeds' reports; counts (ints) are the same for every seed."""
    return {k: spread([float(r[k]) for r in reports]) for k, v in reports[0].items() if isinstance(v, float)}


def compact(cfg, model, used_ids: set[int]) -> bool:
    """Swap in the compact word-embedding table over `used_ids` (bertkit.train.compact: the same maths); one
    process only: DDP would broadcast its buffers every step."""
    if not cfg.compact_embeddings or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return False
    try:
        compact_word_embeddings(model, torch.tensor(sorted(used_ids), dtype=torch.long), cfg.training.optimizer)
    except ConfigError:
        return False                        # no separate input table (or a tied one): train the full table
    return True


# ----------------------------------------------------------------------------------------------- training

def model_overrides(cfg: FinetuneConfig, task: Task) -> dict:
    """The config fields a fine-tuned model takes from the run: the task's head, dropout, the attention backend."""
    over = dict(task.config_overrides(), hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout)
    if cfg.attn_implementation:
        over["attn_implementation"] = cfg.attn_implementation
    return over


class FinetuneHooks:
    """What `finetune` builds, each overridable: the plain recipe here; distillation (bertkit.distill) swaps in
    the teacher's task and tokenizer, a layer-truncated student, teacher targets on the data and its own loss."""
    step_fn = None                          # the loop's step function; None: the model's own loss

    def setup(self, cfg: FinetuneConfig):
        """(task, tokenizer) for the run."""
        return _task(cfg), _tokenizer(cfg)

    def extend(self, cfg: FinetuneConfig, task: Task, tok, data: "TaskData") -> None:
        """Change the prepared data in place (more training features, targets) before any training."""

    def build_model(self, cfg: FinetuneConfig, task: Task, seed: int):
        torch.manual_seed(seed)  # the new head's initialisation depends on the seed
        over = model_overrides(cfg, task)
        cls = task.model_class
        path = Path(cfg.model)
        if path.is_dir() and cfg.random_init:
            return cls(BertConfig.from_dict({**BertConfig.from_json(path / "config.json").to_dict(), **over}))
        if path.is_dir():
            return cls.from_pretrained(path, **over)
        try:
            config = BertConfig.preset(cfg.model, **{"vocab_size": len(_tokenizer(cfg)), **over})   # rows for the vocab
        except ConfigError:
            raise ConfigError(f"--model {cfg.model!r} is neither a model directory nor a preset name") from None
        return cls(config)

    def batches(self, cfg: FinetuneConfig, data: "TaskData", seed: int, pad_id: int) -> "TrainBatches":
        return TrainBatches(data.train_feats, cfg.batch_size, seed, pad_id, cfg.bucket_batches, cfg.max_length)

    def trained(self, model):
        """The model to evaluate and save, from the trained one (at its best dev state)."""
        return model

    def summary(self) -> dict:
        """Entries added to summary.json."""
        return {}


def _tokenizer(cfg: FinetuneConfig):
    model = Path(cfg.model)
    if model.is_dir() and any((model / name).exists() for name in ("vocab.txt", "tokenizer.json")):
        return Tokenizer.from_pretrained(cfg.model)
    if cfg.vocab:
        return Tokenizer.from_pretrained(cfg.vocab)
    raise ConfigError(f"--model {cfg.model!r} has no vocab.txt or tokenizer.json: pass --vocab (a vocab.txt or "
                      f"model directory)")


@dataclass
class TaskData:
    train: list
    dev: list
    test: list | None
    train_feats: list[Feature]
    dev_feats: list[Feature]
    test_feats: list[Feature] | None
    counts: dict = field(default_factory=dict)


def _prepare(cfg: FinetuneConfig, task: Task, tok) -> TaskData:
    train = task.read(cfg.train)
    counts = {"train_examples_in_file": len(train)}
    if cfg.max_train_examples and len(train) > cfg.max_train_examples:
        train = train[:cfg.max_train_examples]
        counts["train_examples_used"] = len(train)
    dev = task.read(cfg.dev)
    test = task.read(cfg.test) if cfg.test else None
    task.fit_labels(train)
    t0 = time.perf_counter()
    train_feats = task.features(tok, train)
    dev_feats = task.features(tok, dev)
    test_feats = task.features(tok, test) if test is not None else None
    counts.update(train_features=len(train_feats), dev_examples=len(dev), dev_features=len(dev_feats),
                  featurize_s=round(time.perf_counter() - t0, 2))
    if test is not None:
        counts.update(test_examples=len(test), test_features=len(test_feats))
    counts.update(task.counts())
    return TaskData(train, dev, test, train_feats, dev_feats, test_feats, counts)


class TrainBatches(BucketBatchSampler):
    """The sampler's index batches as padded batches of the features; counts the examples it hands out."""

    def __init__(self, feats: list[Feature], batch_size: int, seed: int, pad_id: int, bucket_batches: int = 50,
                 cap: int | None = None):
        super().__init__([len(f.input_ids) for f in feats], batch_size, seed, bucket_batches)
        self.feats, self.pad_id, self.cap = feats, pad_id, cap        # cap: padded no longer than max_length
        self.examples = 0

    def __iter__(self):
        for idx in self.batches():
            self.examples += len(idx)
            yield self.batch([self.feats[i] for i in idx])

    def batch(self, feats: list[Feature]) -> dict:
        return collate(feats, self.pad_id, cap=self.cap)


def _with(cfg: FinetuneConfig, lr: float, batch_size: int) -> FinetuneConfig:
    return replace(cfg, batch_size=batch_size, training=replace(cfg.training, lr=lr))


class TaskRun:
    """`run` for a registry task: the paper's recipe (grid, best dev state, predictions, the saved model)."""

    def __init__(self, hooks: FinetuneHooks | None = None, callbacks=()):
        self.hooks = hooks or FinetuneHooks()
        self.callbacks = list(callbacks)
        self.grid: list[dict] = []

    def prepare(self, cfg: FinetuneConfig) -> None:
        self.task, self.tok = self.hooks.setup(cfg)
        self.data = _prepare(cfg, self.task, self.tok)
        self.hooks.extend(cfg, self.task, self.tok, self.data)
        log(cfg, f"finetune {cfg.task}: {json.dumps(self.data.counts)}")
        self.lr, self.batch_size = cfg.training.lr, cfg.batch_size
        if cfg.grid:
            self._search(cfg)

    def _search(self, cfg: FinetuneConfig) -> None:
        """The paper's grid on the first seed; the best dev point is the one the seeds train with."""
        metric = self.task.main_metric
        for lr in PAPER_GRID["lr"]:
            for bs in PAPER_GRID["batch_size"]:
                point = Path(cfg.out) / f"grid-lr{lr}-bs{bs}"
                dev = finished(cfg, point / "metrics.json")
                if dev is None:
                    dev = self._train(_with(cfg, lr, bs), cfg.seeds[0], point, f"[grid lr={lr} bs={bs}] ")["dev"]
                    write_text(point / "metrics.json", json.dumps(dev, default=float))
                    shutil.rmtree(point / "train" / CHECKPOINT_DIR, ignore_errors=True)
                self.grid.append({"lr": lr, "batch_size": bs, metric: dev[metric]})
        best = max(self.grid, key=lambda g: g[metric])
        self.lr, self.batch_size = best["lr"], best["batch_size"]
        log(cfg, f"grid: best lr={self.lr} batch_size={self.batch_size} (dev {metric} {best[metric]:.4f})")

    def train_seed(self, cfg: FinetuneConfig, seed: int, run_dir: Path, log_prefix: str) -> dict:
        task, data = self.task, self.data
        cfg = _with(cfg, self.lr, self.batch_size)
        r = self._train(cfg, seed, run_dir, log_prefix)
        model = r.pop("model")
        rec = {"seed": seed, "dev": None, **{k: v for k, v in r.items() if k != "dev"}}
        files = []
        # the dev report at the best state was computed during training; recompute dev outputs for the files
        for split, examples, feats in (("dev", data.dev, data.dev_feats), ("test", data.test, data.test_feats)):
            if examples is not None:
                report, raw = evaluate_task(task, model, examples, feats, cfg.eval_batch_size, cfg.training.precision)
                files += _write_outputs(task, run_dir, split, examples, feats, raw, report)
                rec[split] = report
        if cfg.save_model:
            model.config.extra.update(task.config_entries(), bertkit_task=task.settings())
            model.save_pretrained(run_dir, tokenizer=self.tok)
            files.append(str(run_dir / "config.json"))
        rec["files"] = files
        return rec

    def summary(self, cfg: FinetuneConfig, runs: list[dict]) -> dict:
        summary = {"task": cfg.task, "model": cfg.model, "lr": self.lr, "batch_size": self.batch_size,
                   "epochs": cfg.training.epochs, "seeds": list(cfg.seeds), "data": self.data.counts,
                   "grid": self.grid, "examples_per_s": spread([r["examples_per_s"] for r in runs])}
        for split in ("dev", "test"):
            if split in runs[0]:
                summary[split] = spread_metrics([r[split] for r in runs])
        return {**summary, **self.hooks.summary()}

    def _train(self, cfg: FinetuneConfig, seed: int, run_dir: Path, log_prefix: str) -> dict:
        """Fine-tune one model with the shared loop (cfg.training, cfg.batch_size); returns the best dev report, the
        model at its best dev state, and timing figures (train time excludes dev evaluations)."""
        task, data, hooks = self.task, self.data, self.hooks
        seed_everything(seed)
        model = hooks.build_model(cfg, task, seed)
        compacted = compact(cfg, model, {self.tok.pad_token_id, *(i for f in data.train_feats for i in f.input_ids)})
        batches = hooks.batches(cfg, data, seed, self.tok.pad_token_id)
        total_steps = max(1, math.ceil(len(batches) * cfg.training.epochs))
        eval_every = cfg.training.eval_every_steps or len(batches)
        dev = DevTracker(cfg, task, data, eval_every, total_steps, log_prefix, run_dir / "train")
        tcfg = replace(cfg.training, max_steps=total_steps, seed=seed, eval_every_steps=eval_every, plot=False,
                       **checkpointing(cfg.training))
        _, timing = timed_train(model, batches, tcfg, run_dir, dict(eval_fn=dev, step_fn=hooks.step_fn,
                                callbacks=[dev, *self.callbacks]), lambda _: batches.examples, lambda: dev.s["eval_s"])
        model.load_state_dict(dev.best_state)
        model = hooks.trained(model)
        if compacted:
            restore_word_embeddings(model)
        for name, value in dev.s["tuned"].items():     # what was tuned on dev at the best state
            setattr(task, name, value)
        return {"model": model, "dev": dev.s["best_report"], "best_step": dev.s["best_step"],
                "history": dev.s["history"], "stopped_early": dev.s["stopped"], "steps": total_steps, **timing}


class DevTracker:
    """The dev evaluation of one fine-tuning run, as the loop's eval_fn (called every `eval_every` steps and at the
    end) and a stateful callback: keeps the best state (patience, history, tuned settings) so a checkpoint carries
    it; the best weights go to BEST-STEP-N.safetensors when a checkpoint is written, so a resume finds them."""
    key = "dev"

    def __init__(self, cfg, task: Task, data, eval_every: int, total_steps: int, log_prefix: str, out: Path):
        self.cfg, self.task, self.data, self.out = cfg, task, data, out
        self.eval_every, self.total_steps, self.log_prefix = eval_every, total_steps, log_prefix
        self.s = {"best": None, "best_report": None, "best_step": 0, "bad": 0, "history": [], "eval_s": 0.0,
                  "evals": 0, "stopped": False, "tuned": {}}
        self.best_state = None

    def __call__(self, m) -> dict:
        cfg, task, data, s = self.cfg, self.task, self.data, self.s
        t0 = time.perf_counter()
        s["evals"] += 1
        step = min(s["evals"] * self.eval_every, self.total_steps)
        raw = task.predict(m, data.dev, data.dev_feats, cfg.eval_batch_size, cfg.training.precision)
        tuned = task.tune(data.dev, raw)                      # before scoring: the score uses it
        report = task.score(data.dev, data.dev_feats, raw)
        value = report[task.main_metric]
        s["history"].append({"step": step, task.main_metric: value})
        log(cfg, f"{self.log_prefix}step {step}/{self.total_steps} dev {task.main_metric} {value:.4f}")
        if s["best"] is None or value > s["best"]:
            s.update(best=value, best_report=report, best_step=step, bad=0, tuned=tuned)
            self.best_state = {k: v.detach().clone() for k, v in m.state_dict().items()}
        else:
            s["bad"] += 1
        s["eval_s"] += time.perf_counter() - t0
        s["stopped"] = bool(cfg.patience and s["bad"] >= cfg.patience)
        return {**numeric_metrics(report), "stop": s["stopped"]}   # patience exhausted: the loop ends the run

    def _best_file(self, step: int) -> Path:
        return self.out / f"best-step-{step:08d}.safetensors"

    def state_dict(self) -> dict:
        path = self._best_file(self.s["best_step"])
        if self.best_state is not None and not path.exists() and main_rank():
            with replacing(path) as tmp:
                save_model_weights(self.best_state, tmp)
        # as JSON (state.json) but NaN kept: a NaN best must compare on resume as it did before
        return json.loads(json.dumps(self.s, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))

    def load_state_dict(self, s: dict) -> None:
        self.s = s
        if s["best_report"] is not None:
            self.best_state = load_model_weights(self._best_file(s["best_step"]))

    def on_save(self, state, checkpoint: Path) -> None:
        """Best weights the checkpoints no longer name are removed."""
        for old in self.out.glob("best-step-*.safetensors"):
            if old != self._best_file(self.s["best_step"]) and main_rank():
                old.unlink(missing_ok=True)


def finetune(cfg: FinetuneConfig, hooks: FinetuneHooks | None = None, callbacks=()) -> dict:
    """Train per the config (grid search and seeds included), evaluate on dev (and test), save models and reports.
    Returns the summary also written to OUT/summary.json. `hooks`: what to build instead of the plain recipe;
    `callbacks`: bertkit.train.callbacks.Callback objects for the loop (with cfg.report_to's loggers)."""
    return run(cfg, TaskRun(hooks, [*callbacks, *reporting(cfg.report_to)]))


# ------------------------------------------------------------------------------------------ evaluate/predict

def _over_file(model_dir, path, batch_size: int, precision: str, progress: bool, what: str):
    """(task, examples, features, raw predictions) of a fine-tuned model over a data file."""
    task, model, tok = load_task(model_dir)
    examples = task.read(path, require_label=what == "evaluate")
    feats = task.features(tok, examples, with_labels=what == "evaluate")
    with forward_bar(model, math.ceil(len(feats) / batch_size), what, progress):
        return task, examples, feats, task.predict(model, examples, feats, batch_size, precision)


def evaluate(model_dir: str | Path, path: str | Path, out_dir: str | Path | None = None, batch_size: int = 128,
             precision: str = "auto", progress: bool = False) -> dict:
    """Metrics of a fine-tuned model on a labelled file (predictions + PNGs into out_dir); `progress`: a bar."""
    task, examples, feats, raw = _over_file(model_dir, path, batch_size, precision, progress, "evaluate")
    report = task.score(examples, feats, raw)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        report["files"] = _write_outputs(task, out_dir, Path(path).stem, examples, feats, raw, report)
        write_text(out_dir / f"metrics_{Path(path).stem}.json", json.dumps(report, indent=1, default=float))
    return report


def predict(model_dir: str | Path, path: str | Path, out_path: str | Path, batch_size: int = 128,
            precision: str = "auto", progress: bool = False) -> Path:
    """Predictions of a fine-tuned model for an unlabelled (or labelled) file; `progress`: a bar on stderr."""
    task, examples, feats, raw = _over_file(model_dir, path, batch_size, precision, progress, "predict")
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    return task.write_predictions(Path(out_path), examples, feats, raw)
