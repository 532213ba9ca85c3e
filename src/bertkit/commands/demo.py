"""`bertkit demo --out runs/demo`: the main job, end to end (thin over bertkit.demo)."""

from __future__ import annotations

from bertkit.commands import checks, config_from
from bertkit.config import PRESETS
from bertkit.demo import DemoConfig, STAGES, run_demo


def register(sub) -> None:
    d = DemoConfig()
    p = sub.add_parser("demo", help="the whole pipeline on BBC News + Rotten Tomatoes, with a report (make demo)")
    p.add_argument("--out", default=d.out)
    p.add_argument("--force", action="store_true", help="redo stages whose output exists")
    p.add_argument("--only", type=checks.names, default=(),
                   help=f"comma-separated stages to run ({','.join(STAGES[:-1])})")
    p.add_argument("--seed", type=checks.nonneg_int, default=d.seed)
    p.add_argument("--pretrain-budget", type=checks.positive_float, default=d.pretrain_budget_s, help="seconds of pre-training")
    p.add_argument("--vocab-size", type=checks.positive_int, default=d.vocab_size)
    p.add_argument("--preset", default=d.preset, choices=PRESETS)
    p.add_argument("--sentiment-train-examples", type=checks.nonneg_int, default=d.sentiment_train_examples,
                   help="0 = all training sentences")
    p.add_argument("--sentiment-epochs", type=checks.positive_float, default=d.sentiment_epochs)
    p.add_argument("--fill-eval-sentences", type=checks.positive_int, default=d.fill_eval_sentences)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args) -> int:
    # its stages are a cache: an earlier demo run is reused (--force redoes them); other files are refused
    checks.out_dir(args.out, "demo", overwrite=args.force, reuse=True, writes_model=True, known=STAGES)
    cfg = config_from(DemoConfig, args, pretrain_budget_s=args.pretrain_budget, progress=not args.quiet,
                      sentiment_train_examples=args.sentiment_train_examples or None)
    print(run_demo(cfg))
    return 0
