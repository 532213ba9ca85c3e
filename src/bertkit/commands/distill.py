"""`bertkit distill`: a smaller student trained on a teacher's outputs, task (--train / --dev) or general (--text)
(thin over bertkit.distill, bertkit.distill_mlm)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from bertkit import progress
from bertkit.commands import checks, config_from
from bertkit.commands.finetune import add_recipe_args, run_brief, run_values
from bertkit.config import BertConfig, read_json_config
from bertkit.errors import ConfigError

_TASK_ONLY = ("train", "dev", "test", "unlabeled", "augment", "student", "attention_weight", "patience")
MAX_AUGMENT = 64                # copies per training text, all held in memory: beyond this a typo, not a recipe


def register(sub) -> None:
    p = sub.add_parser("distill", help="train a smaller student on a teacher's outputs (task or general)",
                       description="Task distillation (--train/--dev): soft targets of a fine-tuned teacher at "
                                   "temperature T plus the gold labels, optional hidden-state and attention "
                                   "transfer; writes a fine-tuned model directory. General distillation (--text): "
                                   "the MLM outputs of a pre-trained teacher on raw text; writes a pre-trained one.")
    p.add_argument("--teacher", required=True,
                   help="task: a directory written by `bertkit finetune`; general: a pre-trained MLM model")
    p.add_argument("--student-layers", type=checks.positive_int,
                   help="K teacher layers, evenly spaced up to the last (6 -> 3: layers 2, 4, 6), embeddings and "
                        "head copied; with --student, K layers of that model (its head new)")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--student-preset", help="a random student of this preset size (tiny/mini/small/...)")
    who.add_argument("--student", help="task: a pre-trained student directory (same vocabulary as the teacher)")
    p.add_argument("--train", help="task: training file (the teacher's task format)")
    p.add_argument("--dev", help="task: dev file, picks the best evaluation")
    p.add_argument("--test", help="task: test file, scored once with the best student")
    p.add_argument("--unlabeled", help="task: more texts in the task's format without labels (soft targets only)")
    p.add_argument("--augment", type=checks.number(int, 0, MAX_AUGMENT), default=0, metavar="N",
                   help="task: N noisy copies of each training text (each word masked with p 0.1; one in four cut to "
                        "a random span of at least half its words), soft targets only; 0: off")
    p.add_argument("--text", help="general: raw text, one document per line")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--temperature", type=checks.number(float, 0, low_open=True), default=2.0)
    p.add_argument("--alpha", type=checks.probability, default=0.5,
                   help="weight of the soft loss; 1 - alpha weighs the gold labels (0: plain fine-tuning)")
    p.add_argument("--hidden-weight", type=checks.nonneg_float, default=0.0, help="hidden-state transfer; 0: off")
    p.add_argument("--attention-weight", type=checks.nonneg_float, default=0.0,
                   help="task: attention transfer; 0: off")
    add_recipe_args(p)
    p.add_argument("--max-length", type=checks.positive_int,
                   help="general: pieces per document (default 128); task distillation uses the teacher's")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run (or other files) in --out")
    p.add_argument("--quiet", action="store_true", help="no log lines")
    progress.add_arguments(p)
    p.set_defaults(func=_distill)


def _distill(args) -> int:
    inputs = (args.teacher, args.student, args.train, args.dev, args.test, args.unlabeled, args.text)
    if args.student_layers is None and args.student_preset is None and args.student is None:
        raise ConfigError("choose the student: --student-layers K (of the teacher), --student-preset NAME or "
                          "--student DIR (with --student-layers K: K of its layers)")
    if args.student_layers is not None and args.student_preset is not None:
        raise ConfigError("--student-layers takes layers of the teacher (or of --student); a --student-preset "
                          "student is built new: give one of them")
    if args.text is not None:
        given = [f"--{n.replace('_', '-')}" for n in _TASK_ONLY if getattr(args, n)]
        if given:
            raise ConfigError(f"--text (general distillation) does not take {', '.join(given)}")
        # the positions an input may use: RoBERTa-style families reserve the first ones
        limit = BertConfig.from_json(Path(args.teacher) / "config.json").max_input_length
        if args.max_length is not None and args.max_length > limit:
            raise ConfigError(f"--max-length {args.max_length} is more than the teacher's max_position_embeddings "
                              f"allow ({limit} input positions)")
        args.max_length = args.max_length or min(128, limit)
    elif args.train is None or args.dev is None:
        raise ConfigError("give --train and --dev (task distillation) or --text (general distillation)")
    elif args.max_length is not None:
        raise ConfigError("--max-length is general distillation's (--text); task distillation reads the teacher's "
                          "max_length, which the student keeps")
    _refuse_int8(args)
    checks.out_dir(args.out, "distill", inputs=inputs, overwrite=args.overwrite, writes_model=True)
    summary = _general(args) if args.text is not None else _task(args)
    print(json.dumps({**summary, "summary": str(Path(args.out) / "summary.json")}, default=float))
    return 0


def _refuse_int8(args) -> None:
    """int8 models (bertkit quantize) run inference only: a teacher, yes; copied layers or a student, no."""
    from bertkit.runtime.int8 import is_int8_dir  # deferred: torch, off `bertkit -h`'s start path
    if args.student_layers is not None and args.student is None and is_int8_dir(args.teacher):
        raise ConfigError(f"--teacher {args.teacher} is int8 (bertkit quantize): --student-layers copies the "
                          f"teacher's float layers; give the fp32 teacher, or --student-preset")
    if args.student is not None and is_int8_dir(args.student):
        raise ConfigError(f"--student {args.student} is int8 (bertkit quantize), which cannot train; start the "
                          f"student from the fp32 model")


def _teacher_task(teacher: str) -> dict:
    path = Path(teacher) / "config.json"
    if not path.is_file():
        raise ConfigError(f"--teacher {teacher}: no config.json (not a model directory)")
    settings = read_json_config(path).get("bertkit_task")
    if not isinstance(settings, dict) or "kind" not in settings:
        raise ConfigError(f"--teacher {teacher}: not fine-tuned by `bertkit finetune` (config.json has no "
                          f"bertkit_task); task distillation needs a fine-tuned teacher (or use --text)")
    return settings


def _task(args) -> dict:
    from bertkit.distill import DistillConfig, distill_task  # deferred: torch, off `bertkit -h`'s start path
    from bertkit.tasks.runner import FinetuneConfig, finetune_recipe
    from bertkit.train.loop import TrainConfig
    settings = _teacher_task(args.teacher)
    dcfg = config_from(DistillConfig, args)
    training, rest = TrainConfig.split(run_values(args), base=finetune_recipe())
    cfg = FinetuneConfig(task=settings["kind"], model=args.teacher, train=args.train, dev=args.dev, test=args.test,
                         out=args.out, training=training, max_length=settings.get("max_length"),
                         quiet=args.quiet, **rest)
    return run_brief(distill_task(dcfg, cfg), args.quiet)


def _general(args) -> dict:
    from bertkit.distill_mlm import MlmDistillConfig, distill_mlm  # deferred: torch, off `bertkit -h`'s start path
    values = run_values(args)
    if len(values["seeds"]) != 1:
        raise ConfigError("general distillation trains one student: give one --seeds value")
    base = config_from(MlmDistillConfig, args)
    training = replace(base.training, lr=args.lr, epochs=args.epochs, warmup=args.warmup,
                       weight_decay=args.weight_decay, precision=values["precision"], seed=values["seeds"][0],
                       progress=values["progress"], overwrite=True)
    summary = distill_mlm(replace(base, training=training))
    return {k: summary[k] for k in ("teacher", "documents", "steps", "train_s", "final_loss")}
