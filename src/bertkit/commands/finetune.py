"""`bertkit finetune | evaluate | predict | task-data`: thin over bertkit.tasks (examples in docs/cli.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bertkit import progress
from bertkit.commands import add_precision_argument, checks, chosen_precision, inference_precision
from bertkit.commands import embed as embed_cmd
from bertkit.errors import ConfigError
from bertkit.tasks.registry import ALIASES, TASKS, default


def _seeds(text: str) -> tuple[int, ...]:
    from bertkit.train.loop import run_seeds  # deferred: torch stays off `bertkit -h`'s path
    try:                # at parse time, so the one line names the flag
        return run_seeds(checks.int_list(text))
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("seeds: ")) from None


def register(sub) -> None:
    p = sub.add_parser("finetune", help=f"fine-tune a model on a task ({'/'.join(TASKS)}/embed)",
                       description="Fine-tune a pre-trained (or preset, randomly initialised) BERT on a task file. "
                                   "Defaults follow the BERT paper (A.3): lr 5e-5 (grid 5e-5/3e-5/2e-5), batch 32, "
                                   "3 epochs, 10% warmup, dropout 0.1, bf16 autocast where native.")
    p.add_argument("--task", required=True, choices=(*TASKS, *ALIASES, "embed"))
    p.add_argument("--model", required=True, help="model directory (HF format) or preset name (tiny/mini/...)")
    p.add_argument("--vocab", help="vocab.txt or model directory, for a preset model")
    p.add_argument("--train", required=True, help="training file (.csv/.tsv/.jsonl, CoNLL, SQuAD .json)")
    p.add_argument("--dev", required=True, help="dev file: scored during training, picks the best checkpoint")
    p.add_argument("--test", help="test file, scored once with the best checkpoint")
    p.add_argument("--out", required=True, help="output directory (model, metrics, predictions, summary.json)")
    add_recipe_args(p)
    p.add_argument("--max-length", type=checks.positive_int, help="max pieces per example (default 128; qa 384)")
    p.add_argument("--grid", action="store_true", help="search lr {5e-5,3e-5,2e-5} x batch {16,32} on dev first")
    p.add_argument("--bucket-batches", type=checks.positive_int, default=50,
                   help="length-bucketing window in batches (1: plain random batches)")
    p.add_argument("--full-embedding-table", dest="compact_embeddings", action="store_false",
                   help="train the whole word-embedding table (default: only the rows the training data uses; "
                        "the same maths, rows no example contains only decay)")
    p.add_argument("--attn", dest="attn_implementation", choices=("auto", "eager", "sdpa", "unpadded"))
    p.add_argument("--label-all-pieces", action="store_true", help="tag: label every piece, not only the first")
    p.add_argument("--scheme", choices=("IOB1", "IOB2", "BIOES"), help="tag: convert tags before training")
    p.add_argument("--doc-stride", type=checks.positive_int, default=128)
    p.add_argument("--max-query-length", type=checks.positive_int, help="qa: question pieces kept (default 64)")
    p.add_argument("--max-answer-length", type=checks.positive_int, default=30)
    p.add_argument("--n-best", type=checks.positive_int, default=20)
    p.add_argument("--no-save", action="store_true", help="do not write the model (metrics only)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run (or other files) in --out")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out after a crash or kill: finished seeds are kept, the others go on "
                        "from their last checkpoint, exactly as if never stopped (the same settings, else refused)")
    p.add_argument("--save-every", dest="save_every_steps", type=checks.positive_int,
                   help="checkpoint every N steps, for --resume (default: every 10 minutes, see --save-minutes)")
    p.add_argument("--save-minutes", dest="save_every_minutes", type=checks.positive_float,
                   help="checkpoint every M minutes of training (default 10)")
    p.add_argument("--report-to", type=checks.names, default=(),
                   help="also log to wandb and/or mlflow (comma-separated; the extras bertkit[wandb] / "
                        "bertkit[mlflow]); TensorBoard event files go to OUT/train/tb when tensorboard is installed")
    p.add_argument("--quiet", action="store_true", help="no log lines (and no bars unless --progress)")
    progress.add_arguments(p)
    embed_cmd.add_finetune_args(p)
    checks.stdin_ok(p, "train", "dev", "test")
    checks.stdin_ok(p, "vocab", suffix=".txt")
    p.set_defaults(func=_finetune)

    e = sub.add_parser("evaluate", help="score a fine-tuned model on a labelled file")
    e.add_argument("--model", required=True, help="directory written by `bertkit finetune`")
    e.add_argument("--data", required=True)
    e.add_argument("--out", help="directory for predictions, metrics.json and the confusion matrix PNG")
    e.add_argument("--batch-size", type=checks.positive_int, default=128)
    e.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation (or other files) in --out")
    add_precision_argument(e)
    progress.add_arguments(e)
    embed_cmd.add_evaluate_args(e)
    checks.stdin_ok(e, "data")
    e.set_defaults(func=_evaluate)

    r = sub.add_parser("predict", help="predictions of a fine-tuned model for a file")
    r.add_argument("--model", required=True, help="directory written by `bertkit finetune`")
    r.add_argument("--data", required=True, help="input file (labels optional)")
    r.add_argument("--out", required=True, help="output file (.jsonl; .json for qa)")
    r.add_argument("--batch-size", type=checks.positive_int, default=128)
    r.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    add_precision_argument(r)
    progress.add_arguments(r)
    checks.stdin_ok(r, "data")
    r.set_defaults(func=_predict)

    d = sub.add_parser("task-data", help="build a real fine-tuning data set (train/dev/test files)")
    d.add_argument("name", help="sentiment | sentiment-regress | topic | pairs | retrieval | ner | qa | qa2")
    d.add_argument("--out", required=True)
    d.add_argument("--seed", type=checks.nonneg_int, default=0)
    d.add_argument("--overwrite", action="store_true", help="replace an earlier build (or other files) in --out")
    d.set_defaults(func=_task_data)


RECIPE_DESTS = ("lr", "batch_size", "epochs", "warmup", "weight_decay", "dropout", "seeds", "eval_every_steps",
                "patience", "max_train_examples")                 # add_recipe_args' flags, besides the precision


def add_recipe_args(p) -> None:
    """The fine-tuning recipe's flags (shared with `bertkit distill`, RECIPE_DESTS and the precision): each dest
    names a TrainConfig or FinetuneConfig field."""
    p.add_argument("--lr", type=checks.positive_float, default=5e-5)
    p.add_argument("--batch-size", type=checks.positive_int, default=32)
    p.add_argument("--epochs", type=checks.positive_float, default=3.0)
    p.add_argument("--warmup", type=checks.nonneg_float, default=0.1, help="warmup fraction of the steps")
    p.add_argument("--weight-decay", type=checks.nonneg_float, default=0.01)
    p.add_argument("--dropout", type=checks.probability, default=0.1)
    p.add_argument("--seeds", type=_seeds, default=(1,), help="comma-separated seeds, e.g. 1,2,3 (mean +- std)")
    p.add_argument("--eval-every", dest="eval_every_steps", type=checks.positive_int,
                   help="steps between dev evaluations (default: every epoch)")
    p.add_argument("--patience", type=checks.nonneg_int, default=0, help="early stopping: evaluations without improvement")
    add_precision_argument(p, "auto", "train")
    p.add_argument("--max-train-examples", type=checks.positive_int, help="use only the first N training examples")


def run_values(args) -> dict:
    """The recipe's values (RECIPE_DESTS), precision (--fp32 folded in) and progress (off under --quiet unless asked
    for): TrainConfig and FinetuneConfig fields."""
    return {**{k: getattr(args, k) for k in RECIPE_DESTS}, "precision": chosen_precision(args),
            "progress": progress.wanted(args.progress) if args.progress is not None or not args.quiet else False}


def _finetune(args) -> int:
    if args.resume and args.overwrite:      # one continues the run, the other replaces it
        raise ConfigError("--resume continues the run in --out, --overwrite replaces it: give one of them")
    # --resume keeps the earlier run of --out as it is (the runner refuses one with other settings)
    checks.out_dir(args.out, "finetune", inputs=(args.model, args.vocab, args.train, args.dev, args.test),
                   overwrite=args.overwrite or args.resume, writes_model=True, reuse=args.resume)
    if args.task == "embed":
        return embed_cmd.finetune(args)
    from bertkit.tasks.runner import FinetuneConfig, check_query_budget, finetune, finetune_recipe  # deferred: torch
    from bertkit.train.loop import TrainConfig
    embed_cmd.refuse_embed_flags(args)
    if args.max_query_length is None:
        args.max_query_length = default("qa", "max_query_length")
    elif args.task == "qa":
        check_query_budget(args.max_query_length, args.max_length or default("qa", "max_length"))
    values = {k: v for k, v in vars(args).items()
              if k not in ("func", "command", "fp32", "no_save", "overwrite") and k not in embed_cmd.FINETUNE_DESTS}
    values.update(run_values(args))
    # every flag's dest names a TrainConfig field (the loop's settings) or a FinetuneConfig field
    training, rest = TrainConfig.split(values, base=finetune_recipe())
    cfg = FinetuneConfig(**rest, training=training, save_model=not args.no_save)
    brief = run_brief(finetune(cfg), args.quiet)
    print(json.dumps({**brief, "summary": str(Path(cfg.out) / "summary.json")}))
    return 0


_HEADLINE = ("accuracy", "f1", "f1_macro", "mcc", "pearson", "spearman", "exact", "precision", "recall", "f1_micro",
             "HasAns_f1", "NoAns_f1")


def run_brief(summary: dict, quiet: bool) -> dict:
    """The headline numbers: {"mean": .., "std": ..} per metric per split (numbers, not text); unless `quiet`, also
    said for a person on stderr (`dev accuracy 0.4750 +- 0.0661`)."""
    out = {k: summary[k] for k in ("task", "lr", "batch_size", "seeds")}
    out["examples_per_s"] = round(summary["examples_per_s"]["mean"], 1)
    for split in ("dev", "test"):
        if split in summary:
            out[split] = {k: {"mean": round(v["mean"], 6), "std": round(v["std"], 6)}
                          for k, v in summary[split].items() if k in _HEADLINE}
            if not quiet:
                for k, v in out[split].items():
                    print(f"{split} {k} {v['mean']:.4f} +- {v['std']:.4f} ({len(out['seeds'])} seed(s))",
                          file=sys.stderr)
    return out


def _evaluate(args) -> int:
    if args.baseline and args.task != "embed":
        raise ConfigError("--baseline applies to --task embed only")
    if args.out is not None:        # checked before the work, whatever the task
        checks.out_dir(args.out, "evaluate", inputs=(args.model, args.data, args.baseline), overwrite=args.overwrite)
    if args.task == "embed":
        return embed_cmd.evaluate(args)
    from bertkit.tasks.runner import evaluate  # deferred: torch stays off `bertkit -h`'s path
    report = evaluate(args.model, args.data, args.out, args.batch_size, precision=inference_precision(args, "evaluate"),
                      progress=progress.wanted(args.progress))
    report.pop("confusion_matrix", None)
    print(json.dumps(report, default=float))
    return 0


def _predict(args) -> int:
    from bertkit.tasks.runner import predict  # deferred: torch stays off `bertkit -h`'s path
    out = checks.out_file(args.out, inputs=(args.model, args.data), overwrite=args.overwrite,
                          default_name=f"{Path(args.data).name.split('.')[0]}.predictions.jsonl")
    with checks.staged(out.parent) as tmp:
        predict(args.model, args.data, tmp / out.name, args.batch_size, precision=inference_precision(args, "predict"),
                progress=progress.wanted(args.progress))
    print(out)
    return 0


def _task_data(args) -> int:
    from bertkit.tasks import data        # deferred: torch stays off `bertkit -h`'s path
    if args.name not in data.TASKS:
        raise ConfigError(f"unknown task data set {args.name!r}; choose from {', '.join(data.TASKS)}")
    checks.out_dir(args.out, "task-data", overwrite=args.overwrite)
    print(json.dumps(data.build(args.name, args.out, args.seed)))
    return 0
