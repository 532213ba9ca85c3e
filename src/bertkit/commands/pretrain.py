"""`bertkit pretrain`: pre-train (or continue pre-training) BERT on shard directories (thin over bertkit.train).
Examples: docs/cli.md (Pre-training); recipes and why: docs/pretraining.md.

--budget from scratch (no --init) plans every setting marked "planned" below that you do not give: masking, warmup,
schedule, batch size, dropout, lr, evaluation (bertkit.train.recipe; it prints the plan and why, and writes
OUT/plan.json). A flag you give always wins. Every run ends with OUT/summary.json and OUT/summary.md: held-out MLM
accuracy and a fill-mask sample of held-out rows.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bertkit import progress
from bertkit.atomic import write_text
from bertkit.commands import checks
from bertkit.errors import ConfigError
from bertkit.textfiles import read_text


# a published recipe's settings, applied where its flag is not given: the reasons are in docs/pretraining.md
RECIPES = {
    "bert": {"objective": "auto", "optimizer": "adamw", "beta2": 0.999, "weight_decay": 0.01, "lr": 1e-4,
             "warmup": 0.01, "schedule": "linear"},
    "roberta": {"objective": "mlm", "masking": "token", "mask_prob": 0.15, "optimizer": "adamw", "beta2": 0.98,
                "weight_decay": 0.01, "lr": 6e-4, "warmup": 0.048, "schedule": "linear"},
    "modernbert": {"objective": "mlm", "masking": "token", "mask_prob": 0.3, "optimizer": "stableadamw",
                   "beta2": 0.98, "weight_decay": 1e-5, "lr": 8e-4, "warmup": 0.01, "schedule": "wsd",
                   "decay_fraction": 0.1},
}
# the flags a recipe may set whose default is not None (argparse leaves them None so a given one is told apart)
DEFAULTS = {"objective": "auto", "optimizer": "adamw", "beta2": 0.999, "weight_decay": 0.01}


def register(subparsers) -> None:
    p = subparsers.add_parser("pretrain", help="pre-train BERT (MLM+NSP/SOP, MLM, ELECTRA) on shards",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shards", help="shard directory (bertkit prepare --out), phase 1")
    p.add_argument("--out", required=True, help="run directory: checkpoints/, metrics.jsonl, curves.png, model/")
    p.add_argument("--phase2", dest="phase2_shards",
                   help="shards for the last part of the run (BERT: seq 512 for the last 10%% of steps)")
    p.add_argument("--phase1-fraction", type=checks.probability, default=0.9, help="share of steps in phase 1")
    p.add_argument("--eval-shards", help="held-out shard directory for evaluation")
    p.add_argument("--eval-every", dest="eval_every_steps", type=checks.positive_int,
                   help="evaluate every N steps (default: at the end; planned)")
    p.add_argument("--eval-batches", type=checks.positive_int, help="batches per evaluation (default 50; planned)")
    m = p.add_argument_group("model (one of)")
    m.add_argument("--preset", help="tiny / mini / small / medium / base / large")
    m.add_argument("--config", help="config.json, - = stdin (with --init: fields overriding the checkpoint's)")
    m.add_argument("--init", help="model directory to continue pre-training from")
    m.add_argument("--dropout", type=checks.probability,
                   help="hidden + attention dropout override (default: the model's; planned)")
    m.add_argument("--rope-theta", type=checks.positive_float,
                   help="rotary models: the rotary base (ModernBERT: its global layers'; NomicBERT, GTE: the one "
                        "base), saved in config.json; "
                        "continued with --init on longer shards, a context extension (ModernBERT: 10000 at 1024 "
                        "tokens, then 160000 at 8192); max_position_embeddings rises to the shards' length")
    m.add_argument("--no-unigram-bias", dest="unigram_bias", action="store_false",
                   help="keep a fresh MLM output bias at zero (default: log unigram frequencies of the shards)")
    m.add_argument("--attention-init", choices=("random", "local"),
                   help="a fresh model's attention: BERT's random init (default) or local, the first layer's heads "
                        "starting on the neighbouring tokens (leaves the MLM plateau far sooner; planned)")
    m.add_argument("--output-vocab", choices=("full", "corpus"),
                   help="the MLM softmax in training: every vocabulary id (default) or only those the training "
                        "shards hold (faster with a large vocabulary; evaluation scores all; planned)")
    p.add_argument("--recipe", choices=tuple(RECIPES),
                   help="a published recipe's settings (docs/pretraining.md has the table and why); every flag you "
                        "give wins over it")
    p.add_argument("--objective", choices=("auto", "mlm", "electra"),
                   help="auto (default): the shards' task (nsp / sop -> MLM + that head, none -> MLM); mlm; electra")
    p.add_argument("--electra-weight", type=checks.nonneg_float, default=50.0, help="discriminator loss weight (paper: 50)")
    p.add_argument("--generator", help="electra with --init (the discriminator): the generator's checkpoint "
                                       "(transformers' ElectraForMaskedLM directory); default a fresh generator")
    p.add_argument("--masking", choices=("shards", "token", "wwm", "ngram"),
                   help="training masks: shards = as built (default); token / wwm / ngram = drawn at batch time from "
                        "the stored tokens, fresh every epoch, static shards too (planned)")
    p.add_argument("--mask-prob", type=float,
                   help="share of tokens masked at batch time (default: the shards'; planned)")
    p.add_argument("--mask-prob-end", type=float,
                   help="the masking share at the last step: it falls linearly from --mask-prob (mmBERT)")
    b = p.add_argument_group("batch and length")
    b.add_argument("--batch-size", type=checks.positive_int,
                   help="examples per process per micro-batch (default 32; planned)")
    b.add_argument("--global-batch", type=checks.number(int, 1, 1 << 20),
                   help="examples per optimizer step over all processes, at most 1,048,576 (LAMB's largest was "
                        "65,536); accumulation is derived")
    b.add_argument("--packing", action="store_true",
                   help="batches of --batch-size x seq_len tokens of whole examples, rows of similar length (~1%% "
                        "padding instead of ~10%%); each example still attends only to itself")
    b.add_argument("--steps", dest="max_steps", type=checks.positive_int, help="optimizer steps")
    b.add_argument("--epochs", type=checks.positive_float, help="passes over the shards")
    b.add_argument("--budget",
                   help="wall-clock budget, e.g. 10m, 2h: the schedule fits the time; from scratch, a planned recipe")
    _optimisation_arguments(p.add_argument_group("optimisation"))
    c = p.add_argument_group("checkpoints and logging")
    c.add_argument("--save-every", dest="save_every_steps", type=checks.positive_int, help="checkpoint every N steps")
    c.add_argument("--save-minutes", dest="save_every_minutes", type=checks.positive_float,
                   help="checkpoint every M minutes")
    c.add_argument("--keep", dest="keep_last", type=checks.positive_int, default=3, help="checkpoints kept")
    c.add_argument("--average-last", type=checks.positive_int, default=1,
                   help="the saved model is the mean of the weights of the last N checkpoints (default 1: the last)")
    c.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    c.add_argument("--overwrite", action="store_true", help="start afresh in an --out holding an earlier run")
    c.add_argument("--log-every", dest="log_every_steps", type=checks.positive_int, default=1)
    progress.add_arguments(c)
    c.add_argument("--verify", choices=("size", "full"), default="size", help="shard check (full = sha256)")
    c.add_argument("--vocab", help="vocab.txt saved with the model (default: the shards')")
    checks.stdin_ok(p, "config", suffix="")       # read here, kept in the run directory
    checks.stdin_ok(p, "vocab", suffix=".txt")
    p.set_defaults(func=run)


def _optimisation_arguments(o) -> None:
    """The optimiser, schedule, precision and device flags. Their choices are spelled here, not imported from
    optim / hardware (which import torch: parsing stays off it); tests/test_cli.py keeps them equal."""
    o.add_argument("--optimizer", choices=("adamw", "lamb", "stableadamw"),
                   help="adamw (default), lamb (large batches) or stableadamw (AdamW with per-tensor update "
                        "clipping; ModernBERT)")
    o.add_argument("--lr", type=checks.positive_float, help="peak learning rate (default 1e-4; planned)")
    o.add_argument("--weight-decay", type=checks.nonneg_float, help="default 0.01")
    o.add_argument("--adam-beta2", dest="beta2", type=checks.probability,
                   help="AdamW's second-moment decay (default 0.999, BERT's; RoBERTa's 0.98 tolerates higher "
                        "learning rates)")
    o.add_argument("--warmup", type=checks.nonneg_float,
                   help="< 1: fraction of steps; >= 1: steps (default 0.01; planned)")
    o.add_argument("--schedule", choices=("linear", "cosine", "constant", "wsd"),
                   help="after warmup: linear decay (BERT), cosine, constant, or wsd (peak held, linear decay over "
                        "the last --decay-fraction of the steps; for short budgets). Default linear; planned")
    o.add_argument("--decay-fraction", type=checks.probability,
                   help="wsd only: share of the steps that decay (default 0.2; planned)")
    o.add_argument("--min-lr-ratio", type=checks.probability, default=0.0)
    o.add_argument("--clip", dest="max_grad_norm", type=checks.nonneg_float, default=1.0, help="gradient norm clip (0: none)")
    o.add_argument("--precision", choices=("auto", "bf16", "fp32", "fp16"), default="auto",
                   help="auto (default): bf16 autocast where the device has native bf16 (CUDA, AMX / AVX-512 BF16 "
                        "CPUs), else fp16 autocast with loss scaling on CUDA (V100, T4), else fp32")
    o.add_argument("--seed", type=checks.nonneg_int, default=0)
    o.add_argument("--device", type=checks.device, help="cpu, cuda, cuda:1 (default: cuda if available)")
    o.add_argument("--fsdp", action="store_true", help="shard the model across processes (FSDP)")
    o.add_argument("--deterministic", action="store_true", help="torch deterministic algorithms")


def config_from_args(args):
    """The PretrainConfig of parsed `bertkit pretrain` arguments; set_fields names the planned settings given."""
    from bertkit.train.loop import TrainConfig, parse_duration  # deferred: torch, off `bertkit -h`'s start path
    from bertkit.train.pretrain import PretrainConfig
    from bertkit.train.recipe import PLANNED

    # `_stdin` / `stdin_format` are the CLI's (cli.main pops them; config_from_argv's parse keeps them)
    values = {k: v for k, v in vars(args).items() if k not in ("func", "command", "_stdin", "stdin_format")}
    for table in (RECIPES.get(values.pop("recipe", None), {}), DEFAULTS):   # a given flag wins, then the recipe
        values.update({k: v for k, v in table.items() if values.get(k) is None})
    given = tuple(n for n in (*PLANNED, "global_batch") if values.get(n) is not None)
    values = {k: v for k, v in values.items() if not (k in PLANNED and v is None)}  # the dataclass defaults
    # the flags that are not a TrainConfig field as they are typed; every other flag's dest names its field
    budget, beta2 = values.pop("budget"), values.pop("beta2")
    values.update(budget_s=parse_duration(budget) if budget is not None else None, betas=(0.9, beta2),
                  max_grad_norm=values["max_grad_norm"] or None)
    values["progress"] = progress.wanted(values["progress"])
    train_cfg, rest = TrainConfig.split(values)
    return PretrainConfig(**rest, train=train_cfg, set_fields=given)


def config_from_argv(argv: list[str]):
    """The PretrainConfig `bertkit pretrain ARGV...` runs (the demo calls pre-training this way)."""
    parser = argparse.ArgumentParser(prog="bertkit")
    register(parser.add_subparsers(dest="command"))
    return config_from_args(parser.parse_args(["pretrain", *argv]))


def run(args) -> int:
    from bertkit.train.pretrain import pretrain  # deferred: torch, off `bertkit -h`'s start path

    progress.log_lines()
    main_rank = int(os.environ.get("RANK", "0")) == 0      # torchrun: every rank runs this command
    if args.resume and args.overwrite:      # one continues the run, the other replaces it
        raise ConfigError("--resume continues the run in --out, --overwrite replaces it: give one of them")
    # --resume and a refused earlier run are the trainer's; --overwrite sets the earlier run aside until this one
    # succeeds (checks.settle_out), on rank 0 only: the other ranks of a torchrun launch check and move nothing
    checks.out_dir(args.out, "pretrain", inputs=(args.shards, args.phase2_shards, args.eval_shards, args.init,
                                                  args.config, args.generator), overwrite=args.overwrite or args.resume,
                   reuse=not args.overwrite, dry_run=not main_rank)
    if args.config:   # read by the trainer; a binary or non-UTF-8 file is refused here naming it
        text = read_text(args.config)
        if args.config == "-":      # stdin: kept in the run directory, where the trainer reads it
            args.config = str(Path(args.out) / "config.stdin.json")
            write_text(args.config, text)
    pc = config_from_args(args)
    result = pretrain(pc)
    last = result.eval_history[-1] if result.eval_history else {}
    summary = {"steps": result.steps, "tokens": result.tokens, "elapsed_s": round(result.elapsed_s, 1),
               "stop": result.stop_reason, "skipped_steps": result.skipped_steps,
               **{f"eval_{k}": round(v, 4) for k, v in last.items() if isinstance(v, float)},
               "summary": f"{pc.out}/summary.md"}
    if main_rank:
        print(json.dumps(summary))
    return 0
