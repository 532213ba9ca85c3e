"""Fine-tuning, evaluation and prediction: the library behind `bertkit finetune / evaluate / predict`.

    result = finetune(FinetuneConfig(task="classify", model=minilm_dir, train="train.csv", dev="dev.csv",
                                     out="runs/sst", training=finetune_recipe(lr=3e-5)))
    report = evaluate("runs/sst", "test.csv");  predict("runs/sst", "new.csv", "preds.jsonl")

Recipe (the paper's section 3.5 / appendix A.3): a pre-trained encoder plus one new output layer, all parameters
trained end to end with AdamW (weight decay 0.01, not on biases / LayerNorm), linear warmup over the first 10% of
steps then linear decay to 0, dropout 0.1, batch 16 or 32, 2-4 epochs, lr in {5e-5, 3e-5, 2e-5}. Small data sets
make fine-tuning unstable, so:
  * `seeds=(1, 2, 3)` trains one model per seed and reports each metric as mean +- std (sample std, n - 1);
  * `grid=True` tries every (lr, batch size) of the paper's grid on the first seed, keeps the best on dev, then runs
    the seeds with it;
  * the dev set is scored after every epoch (or every `training.eval_every_steps` steps); the best state on the dev
    metric is kept and saved, and `patience` evaluations without improvement stop the run early.

`FinetuneConfig.training` is the shared loop's TrainConfig (`finetune_recipe()`: the paper's recipe; lr, epochs,
warmup, weight decay, precision, ... live there); the rest of FinetuneConfig is what only fine-tuning has.

Training runs through `bertkit.train` (the one loop shared with pre-training); this module only builds the
model, the batches and the dev evaluation. Throughput comes from bf16 autocast (where native), the encoder's
unpadded attention ("auto" picks it for ragged batches) and length-bucketed batches padded only to their own
longest sequence (`tasks.batching`). The saved model directory is an ordinary HF-format checkpoint whose
config.json carries `id2label` / `label2id` and a `bertkit_task` entry (task kind and its settings, the tuned
SQuAD 2.0 null threshold), so `evaluate` / `predict` need only the directory.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from bertkit import runtime
from bertkit.errors import ConfigError
from bertkit.precision import resolve
from bertkit.progress import forward_bar, say
from bertkit.tasks.batching import BucketBatchSampler, collate
from bertkit.train.loop import TrainConfig, run_seeds, seed_everything, train

__all__ = ["FinetuneConfig", "FinetuneHooks", "finetune", "finetune_recipe", "evaluate", "predict", "load_task",
           "make_task", "TASK_KINDS", "PAPER_GRID", "TrainBatches", "evaluate_task", "model_class", "model_overrides",
           "numeric_metrics"]

TASK_KINDS = ("classify", "pair", "regress", "multilabel", "tag", "qa")
PAPER_GRID = {"lr": (5e-5, 3e-5, 2e-5), "batch_size": (16, 32)}   # appendix A.3 (epochs kept as configured)
DEFAULT_MAX_LENGTH = {"qa": 384}                                    # others: 128


def finetune_recipe(**changes) -> TrainConfig:
    """The paper's fine-tuning recipe as the loop's settings: lr 5e-5, 3 epochs, warmup over the first 10% of the
    steps then linear decay, AdamW with weight decay 0.01; `changes` override it, e.g. finetune_recipe(lr=3e-5).
    eval_every_steps None scores the dev set once per epoch."""
    return TrainConfig(**{"lr": 5e-5, "epochs": 3.0, "warmup": 0.1, "log_every_steps": 50, "progress": False,
                          **changes})


@dataclass
class FinetuneConfig:
    task: str                              # classify | pair | regress | multilabel | tag | qa
    model: str                             # HF-format directory, or a preset name (random init; needs vocab)
    train: str                             # the training file
    dev: str
    out: str
    training: TrainConfig = field(default_factory=finetune_recipe)  # the loop's settings (`train` is the file)
    test: str | None = None
    vocab: str | None = None               # vocab.txt for a preset model (a directory brings its own)
    random_init: bool = False              # fresh weights: the baseline that shows what pre-training is worth
    batch_size: int = 32
    dropout: float = 0.1                   # hidden + attention dropout of the encoder (and the head)
    max_length: int | None = None          # pieces per example; None: 384 for qa, 128 otherwise
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

    def __post_init__(self):
        if self.task not in TASK_KINDS:
            raise ConfigError(f"--task {self.task!r}: choose one of {', '.join(TASK_KINDS)}")
        if self.max_length is None:
            self.max_length = DEFAULT_MAX_LENGTH.get(self.task, 128)
        self.seeds = run_seeds(self.seeds)
        values = {"lr": self.training.lr, "batch_size": self.batch_size, "epochs": self.training.epochs,
                  "max_length": self.max_length, "bucket_batches": self.bucket_batches}
        for name, value in values.items():
            if value is None or value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value!r}")
        if not 0 <= self.training.warmup < 1:
            raise ConfigError(f"warmup must be a fraction in [0, 1), got {self.training.warmup!r}")

# ---------------------------------------------------------------------------------------------------- tasks

def make_task(kind: str, cfg: FinetuneConfig | None = None, settings: dict | None = None):
    """The task object for `kind`, from a FinetuneConfig (training) or saved settings (evaluate / predict)."""
    s = dict(settings or {})
    if cfg is not None:
        s.update(max_length=cfg.max_length, label_all_pieces=cfg.label_all_pieces, convert_to=cfg.scheme,
                 doc_stride=cfg.doc_stride, max_query_length=cfg.max_query_length,
                 max_answer_length=cfg.max_answer_length, n_best=cfg.n_best, multilabel_sep=cfg.multilabel_sep)
    if kind in ("classify", "pair", "regress", "multilabel"):
        from bertkit.tasks.classify import SequenceTask
        return SequenceTask(kind, max_length=s.get("max_length", 128), multilabel_sep=s.get("multilabel_sep", "|"))
    if kind == "tag":
        from bertkit.tasks.tag import TokenTask
        return TokenTask(max_length=s.get("max_length", 128), label_all_pieces=s.get("label_all_pieces", False),
                         convert_to=s.get("convert_to"))
    if kind == "qa":
        from bertkit.tasks.qa import QATask
        return QATask(max_length=s.get("max_length", 384), doc_stride=s.get("doc_stride", 128),
                      max_query_length=s.get("max_query_length", 64),
                      max_answer_length=s.get("max_answer_length", 30), n_best=s.get("n_best", 20),
                      null_threshold=s.get("null_threshold", 0.0), version_2=s.get("version_2", False))
    raise ConfigError(f"unknown task {kind!r}; choose one of {', '.join(TASK_KINDS)}")


def _task_settings(task) -> dict:
    keys = ("max_length", "label_all_pieces", "convert_to", "doc_stride", "max_query_length", "max_answer_length",
            "n_best", "null_threshold", "version_2", "multilabel_sep")
    return {"kind": task.kind, **{k: getattr(task, k) for k in keys if hasattr(task, k)}}


def model_class(task):
    import bertkit.heads as heads
    return getattr(heads, task.model_class_name)


def load_task(model_dir: str | Path):
    """(task, model frozen for inference, tokenizer) from a directory written by `finetune`."""
    from bertkit.config import BertConfig
    from bertkit.tokenizer import Tokenizer
    from bertkit.tasks.readers import LabelMap
    model_dir = Path(model_dir)
    cfg_path = model_dir / "config.json"
    if not cfg_path.exists():
        seeds = sorted(p.name for p in model_dir.glob("seed-*") if (p / "config.json").is_file())
        if seeds:   # `finetune --seeds 1,2,3` writes one model per seed
            raise ConfigError(f"{model_dir}: holds one model per seed ({', '.join(seeds)}): give one of them, "
                              f"e.g. --model {model_dir / seeds[0]}")
        raise ConfigError(f"{model_dir}: no config.json (not a model directory)")
    raw = json.loads(cfg_path.read_text())
    settings = raw.get("bertkit_task")
    if not isinstance(settings, dict) or settings.get("kind") not in TASK_KINDS:
        raise ConfigError(f"{cfg_path}: no 'bertkit_task' entry: not a model fine-tuned by bertkit "
                          f"(evaluate/predict need the task kind and label map saved by `bertkit finetune`)")
    task = make_task(settings["kind"], settings=settings)
    config = BertConfig.from_json(cfg_path)
    if config.id2label and task.kind != "qa" and settings["kind"] != "regress":
        task.labels = LabelMap([config.id2label[i] for i in sorted(config.id2label)])
    model = runtime.freeze(model_class(task).from_pretrained(model_dir))     # evaluate / predict only
    tok = Tokenizer.from_pretrained(model_dir)
    return task, model, tok


# ---------------------------------------------------------------------------------------------- evaluation

def evaluate_task(task, model, examples, feats, batch_size: int, precision: str,
                  tune_null: bool = False) -> tuple[dict, object]:
    """Metrics of `model` on (examples, feats); returns (report, raw predictions for writing)."""
    if task.kind == "qa":
        decoded = task.decode(examples, feats, task.logits(model, feats, batch_size, precision))
        if tune_null and task.version_2:
            task.tune_threshold(examples, decoded)
        return task.score_decoded(examples, decoded), decoded
    logits = task.logits(model, feats, batch_size, precision)
    return task.score(examples, feats, logits), logits


def _write_outputs(task, out_dir: Path, split: str, examples, feats, raw, report: dict) -> list[str]:
    files = []
    path = out_dir / (f"predictions_{split}.json" if task.kind == "qa" else f"predictions_{split}.jsonl")
    if task.kind == "tag":
        task.write_predictions(path, examples, raw, feats)
    else:
        task.write_predictions(path, examples, raw)
    files.append(str(path))
    files += [str(p) for p in task.artifacts(out_dir, split, report)]
    return files


# ----------------------------------------------------------------------------------------------- training

def _log(cfg: FinetuneConfig, msg: str) -> None:
    if not cfg.quiet:
        say(msg)


def model_overrides(cfg: FinetuneConfig, task) -> dict:
    """The config fields a fine-tuned model takes from the run: the task's head, dropout, the attention backend."""
    over = dict(task.config_overrides(), hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout)
    if cfg.attn_implementation:
        over["attn_implementation"] = cfg.attn_implementation
    return over


def _build_model(cfg: FinetuneConfig, task, seed: int):
    from bertkit.config import BertConfig
    torch.manual_seed(seed)  # the new head's initialisation depends on the seed
    over = model_overrides(cfg, task)
    cls = model_class(task)
    path = Path(cfg.model)
    if path.is_dir() and cfg.random_init:
        return cls(BertConfig.from_dict({**BertConfig.from_json(path / "config.json").to_dict(), **over}))
    if path.is_dir():
        return cls.from_pretrained(path, **over)
    try:
        config = BertConfig.preset(cfg.model, **over)
    except ConfigError:
        raise ConfigError(f"--model {cfg.model!r} is neither a model directory nor a preset name") from None
    return cls(config)


class FinetuneHooks:
    """What `finetune` builds, each overridable: the plain recipe here; distillation (bertkit.distill) swaps in
    the teacher's task and tokenizer, a layer-truncated student, teacher targets on the data and its own loss."""
    step_fn = None                          # the loop's step function; None: the model's own loss

    def setup(self, cfg: FinetuneConfig):
        """(task, tokenizer) for the run."""
        return make_task(cfg.task, cfg), _tokenizer(cfg)

    def extend(self, cfg: FinetuneConfig, task, tok, data: "_Data") -> None:
        """Change the prepared data in place (more training features, targets) before any training."""

    def build_model(self, cfg: FinetuneConfig, task, seed: int):
        return _build_model(cfg, task, seed)

    def batches(self, cfg: FinetuneConfig, data: "_Data", seed: int, pad_id: int) -> "TrainBatches":
        return TrainBatches(data.train_feats, cfg.batch_size, seed, pad_id, cfg.bucket_batches)

    def trained(self, model):
        """The model to evaluate and save, from the trained one (at its best dev state)."""
        return model

    def summary(self) -> dict:
        """Entries added to summary.json."""
        return {}


def _tokenizer(cfg: FinetuneConfig):
    from bertkit.tokenizer import Tokenizer
    if Path(cfg.model).is_dir() and (Path(cfg.model) / "vocab.txt").exists():
        return Tokenizer.from_pretrained(cfg.model)
    if cfg.vocab:
        return Tokenizer.from_pretrained(cfg.vocab)
    raise ConfigError(f"--model {cfg.model!r} has no vocab.txt: pass --vocab (a vocab.txt or model directory)")


def _mean_std(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def numeric_metrics(report: dict) -> dict[str, float]:
    return {k: float(v) for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@dataclass
class _Data:
    train: list
    dev: list
    test: list | None
    train_feats: list[dict]
    dev_feats: list[dict]
    test_feats: list[dict] | None
    counts: dict = field(default_factory=dict)


def _prepare(cfg: FinetuneConfig, task, tok) -> _Data:
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
    if getattr(task, "stats", None):
        counts["task_stats"] = dict(task.stats)
    if task.kind == "qa":
        # unanswerable windows are the [CLS] targets; SQuAD 2.0 is decided by the data, not a flag
        counts["version_2"] = task.version_2
    return _Data(train, dev, test, train_feats, dev_feats, test_feats, counts)


class TrainBatches:
    """The training batches of one run: length-bucketed, reshuffled per epoch (`set_epoch`, called by the loop),
    padded per batch. Counts the examples it hands out, for examples/s."""

    def __init__(self, feats: list[dict], batch_size: int, seed: int, pad_id: int, bucket_batches: int = 50):
        self.feats, self.pad_id = feats, pad_id
        self.sampler = BucketBatchSampler([len(f["input_ids"]) for f in feats], batch_size, seed,
                                          bucket_batches=bucket_batches)
        self.examples = 0

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        for idx in self.sampler:
            self.examples += len(idx)
            yield self.batch([self.feats[i] for i in idx])

    def batch(self, feats: list[dict]) -> dict:
        """One padded batch of these features."""
        return collate(feats, self.pad_id)


def _compact(cfg: FinetuneConfig, model, data: _Data, tok) -> bool:
    """Swap in the compact word-embedding table (one process only: DDP would broadcast its buffers every step)."""
    import os
    if not cfg.compact_embeddings or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return False
    from bertkit.train.compact import compact_word_embeddings, used_token_ids
    try:
        compact_word_embeddings(model, used_token_ids(data.train_feats, (tok.pad_token_id,)))
    except ConfigError:
        return False                        # no separate input table (or a tied one): train the full table
    return True


def _train_one(cfg: FinetuneConfig, task, tok, data: _Data, seed: int, run_dir: Path, log_prefix: str = "",
               hooks: FinetuneHooks | None = None) -> dict:
    """Fine-tune one model with the shared loop (cfg.training, cfg.batch_size); returns the best dev report, the
    model at its best dev state, and timing figures (train time excludes dev evaluations)."""
    hooks = hooks or FinetuneHooks()
    seed_everything(seed)
    model = hooks.build_model(cfg, task, seed)
    compacted = _compact(cfg, model, data, tok)
    batches = hooks.batches(cfg, data, seed, tok.pad_token_id)
    total_steps = max(1, math.ceil(len(batches) * cfg.training.epochs))
    eval_every = cfg.training.eval_every_steps or len(batches)
    metric = task.main_metric
    state = {"best": -math.inf, "best_state": None, "best_report": None, "best_step": 0, "bad": 0,
             "history": [], "eval_s": 0.0, "evals": 0, "stopped": False}

    def on_eval(m) -> dict:
        """Dev evaluation (called by the loop every `eval_every` steps and at the end); keeps the best state."""
        t0 = time.perf_counter()
        state["evals"] += 1
        step = min(state["evals"] * eval_every, total_steps)
        report, _ = evaluate_task(task, m, data.dev, data.dev_feats, cfg.eval_batch_size, cfg.training.precision,
                                  tune_null=True)
        value = report[metric]
        state["history"].append({"step": step, metric: value})
        _log(cfg, f"{log_prefix}step {step}/{total_steps} dev {metric} {value:.4f}")
        if value > state["best"]:
            state.update(best=value, best_report=report, best_step=step, bad=0,
                         best_state={k: v.detach().clone() for k, v in m.state_dict().items()},
                         best_null=getattr(task, "null_threshold", None))
        else:
            state["bad"] += 1
        state["eval_s"] += time.perf_counter() - t0
        state["stopped"] = bool(cfg.patience and state["bad"] >= cfg.patience)
        return {**numeric_metrics(report), "stop": state["stopped"]}   # patience exhausted: the loop ends the run

    tcfg = replace(cfg.training, max_steps=total_steps, seed=seed, eval_every_steps=eval_every, save_final=False,
                   tensorboard=False, plot=False, overwrite=True)
    t0 = time.perf_counter()
    train(model, batches, tcfg, run_dir / "train", eval_fn=on_eval, step_fn=hooks.step_fn)
    train_s = time.perf_counter() - t0 - state["eval_s"]
    model.load_state_dict(state["best_state"])
    model = hooks.trained(model)
    if compacted:
        from bertkit.train.compact import restore_word_embeddings
        restore_word_embeddings(model)
    if getattr(task, "version_2", False) and state.get("best_null") is not None:
        task.null_threshold = state["best_null"]
    return {"model": model, "dev": state["best_report"], "best_step": state["best_step"],
            "history": state["history"], "stopped_early": state["stopped"], "train_s": train_s,
            "train_examples": batches.examples,
            "examples_per_s": batches.examples / train_s if train_s > 0 else 0.0, "steps": total_steps}


def _with(cfg: FinetuneConfig, lr: float, batch_size: int) -> FinetuneConfig:
    """`cfg` with another learning rate and batch size (a grid point, or the grid's best)."""
    return replace(cfg, batch_size=batch_size, training=replace(cfg.training, lr=lr))


def finetune(cfg: FinetuneConfig, hooks: FinetuneHooks | None = None) -> dict:
    """Train per the config (grid search and seeds included), evaluate on dev (and test), save models and reports.
    Returns the summary also written to OUT/summary.json. `hooks`: what to build instead of the plain recipe."""
    hooks = hooks or FinetuneHooks()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    # auto precision resolved once, so the summary records what ran
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = replace(cfg, training=replace(cfg.training, precision=resolve(cfg.training.precision, device)))
    task, tok = hooks.setup(cfg)
    data = _prepare(cfg, task, tok)
    hooks.extend(cfg, task, tok, data)
    _log(cfg, f"finetune {cfg.task}: {json.dumps(data.counts)}")

    lr, bs = cfg.training.lr, cfg.batch_size
    grid_results = []
    if cfg.grid:
        for g_lr in PAPER_GRID["lr"]:
            for g_bs in PAPER_GRID["batch_size"]:
                r = _train_one(_with(cfg, g_lr, g_bs), task, tok, data, cfg.seeds[0],
                               out / f"grid-lr{g_lr}-bs{g_bs}", f"[grid lr={g_lr} bs={g_bs}] ", hooks)
                grid_results.append({"lr": g_lr, "batch_size": g_bs, task.main_metric: r["dev"][task.main_metric]})
                del r
        best = max(grid_results, key=lambda g: g[task.main_metric])
        lr, bs = best["lr"], best["batch_size"]
        _log(cfg, f"grid: best lr={lr} batch_size={bs} (dev {task.main_metric} {best[task.main_metric]:.4f})")

    runs = []
    for seed in cfg.seeds:
        run_dir = out if len(cfg.seeds) == 1 else out / f"seed-{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        r = _train_one(_with(cfg, lr, bs), task, tok, data, seed, run_dir,
                       f"[seed {seed}] " if len(cfg.seeds) > 1 else "", hooks)
        model = r.pop("model")
        # the dev report at the best state was computed during training; recompute dev outputs for the files
        dev_report, dev_raw = evaluate_task(task, model, data.dev, data.dev_feats, cfg.eval_batch_size,
                                            cfg.training.precision)
        files = _write_outputs(task, run_dir, "dev", data.dev, data.dev_feats, dev_raw, dev_report)
        rec = {"seed": seed, "dev": dev_report, **{k: r[k] for k in ("best_step", "steps", "stopped_early",
               "history", "train_s", "train_examples", "examples_per_s")}}
        if data.test is not None:
            test_report, test_raw = evaluate_task(task, model, data.test, data.test_feats, cfg.eval_batch_size,
                                                  cfg.training.precision)
            files += _write_outputs(task, run_dir, "test", data.test, data.test_feats, test_raw, test_report)
            rec["test"] = test_report
        if cfg.save_model:
            model.config.extra["bertkit_task"] = _task_settings(task)
            model.save_pretrained(run_dir, tokenizer=tok)
            files.append(str(run_dir / "config.json"))
        rec["files"] = files
        (run_dir / "metrics.json").write_text(json.dumps(rec, indent=1, default=float))
        runs.append(rec)
        del model

    summary = {"task": cfg.task, "model": cfg.model, "lr": lr, "batch_size": bs, "epochs": cfg.training.epochs,
               "seeds": list(cfg.seeds), "data": data.counts, "grid": grid_results,
               "examples_per_s": _mean_std([r["examples_per_s"] for r in runs])}
    for split in ("dev", "test"):
        if split in runs[0]:
            keys = numeric_metrics(runs[0][split])
            summary[split] = {k: _mean_std([numeric_metrics(r[split])[k] for r in runs]) for k in keys if k != "n"}
    from bertkit.textfiles import shown_all
    summary["config"] = shown_all(asdict(cfg))
    summary.update(hooks.summary())
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    return summary


# ------------------------------------------------------------------------------------------ evaluate/predict

def evaluate(model_dir: str | Path, path: str | Path, out_dir: str | Path | None = None, batch_size: int = 128,
             precision: str = "auto", progress: bool = False) -> dict:
    """Metrics of a fine-tuned model directory on a labelled file (writes predictions + PNGs when out_dir);
    `progress`: a bar on stderr."""
    task, model, tok = load_task(model_dir)
    examples = task.read(path)
    feats = task.features(tok, examples)
    with forward_bar(model, math.ceil(len(feats) / batch_size), "evaluate", progress):
        report, raw = evaluate_task(task, model, examples, feats, batch_size, precision)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        report["files"] = _write_outputs(task, out_dir, Path(path).stem, examples, feats, raw, report)
        (out_dir / f"metrics_{Path(path).stem}.json").write_text(json.dumps(report, indent=1, default=float))
    return report


def predict(model_dir: str | Path, path: str | Path, out_path: str | Path, batch_size: int = 128,
            precision: str = "auto", progress: bool = False) -> Path:
    """Predictions of a fine-tuned model for an unlabelled (or labelled) file; `progress`: a bar on stderr."""
    task, model, tok = load_task(model_dir)
    examples = task.read(path, require_label=False)
    feats = task.features(tok, examples, with_labels=False)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with forward_bar(model, math.ceil(len(feats) / batch_size), "predict", progress):
        return _write_predictions(task, model, examples, feats, out_path, batch_size, precision)


def _write_predictions(task, model, examples, feats, out_path: Path, batch_size: int, precision: str) -> Path:
    if task.kind == "qa":
        decoded = task.decode(examples, feats, task.logits(model, feats, batch_size, precision))
        return task.write_predictions(out_path, examples, decoded)
    logits = task.logits(model, feats, batch_size, precision)
    if task.kind == "tag":
        return task.write_predictions(out_path, examples, logits, feats)
    return task.write_predictions(out_path, examples, logits)
