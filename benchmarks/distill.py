"""Distillation: a 3-layer student of a fine-tuned MiniLM-L6 teacher against the teacher and against 3-layer students
fine-tuned without it.

Run (one JSON line per run, then one line with every figure):

    flock /tmp/bertkit-bench.lock nice -n 19 .venv/bin/python benchmarks/distill.py --cases accuracy --work /tmp/q-acc
    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/distill.py --cases speed --work /tmp/q-acc

The teachers are the fine-tuned MiniLM-L6 runs of `benchmarks/quantize.py --cases accuracy` (WORK/runs/sentiment,
max_length 64; WORK/runs/topic, 128) on WORK/data/{sentiment,topic}.

accuracy: per task and seed, three students (--students), the same lr / epochs / seed, each scored on test.csv
with the best dev epoch's model:
  distilled   `bertkit distill --student-layers 3`: layers 2, 4, 6 of the teacher, its embeddings and head copied;
              soft targets at --temperature with weight --alpha, optional hidden-state transfer, --augment copies
              and unlabeled text for sentiment (--unlabeled-vader, --unlabeled-bbc)
  no_teacher  the same truncated teacher with --alpha 0: plain fine-tuning, no soft targets (it still starts from
              the fine-tuned teacher's weights)
  pretrained  layers 2, 4, 6 of the pre-trained MiniLM-L6 the teacher was fine-tuned from and a new head,
              fine-tuned on the task: the 3-layer model a user without a teacher has
  distilled_pretrained  that pre-trained student (new head) trained as `distilled` is: the teacher's part alone
The final line per task: the distilled student's test accuracy (mean +- std over the seeds) against the teacher's
and the other students', and the students paired by seed (mean difference; seeds better / equal / worse).

speed: teacher and student (bertkit fp32, frozen for inference as `bertkit evaluate` loads them) over the task's
test texts in batches of 32, interleaved in one run (median of --repeats), sequences/s and the ratio.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quantize import emit, interleaved  # noqa: E402

from bertkit.hardware import cpu_model  # noqa: E402

TASKS = ("sentiment", "topic")


def _mean_std(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4),
            "std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0, "values": values}


def _paired(runs: dict, other: str, ours: str = "distilled") -> dict | None:
    """`ours` minus `other`'s test accuracy, seed by seed: on a small test set (207 topic articles, 0.48 points
    each) the count of seeds each way says more than two means an article or two apart."""
    seeds = sorted(set(runs[ours]) & set(runs[other]))
    if not seeds:
        return None
    diffs = [100 * (runs[ours][s] - runs[other][s]) for s in seeds]
    return {"seeds": seeds, "mean_diff_points": round(statistics.fmean(diffs), 2),
            "better": sum(d > 0 for d in diffs), "equal": sum(d == 0 for d in diffs), "worse": sum(d < 0 for d in diffs)}


STUDENTS = ("distilled", "no_teacher", "pretrained", "distilled_pretrained")


def pretrained_student(work: Path) -> Path:
    """Layers 2, 4, 6 of the pre-trained MiniLM-L6 the teachers were fine-tuned from (no task head): the 3-layer
    model a user without a fine-tuned teacher would start from."""
    from bertkit.datasets import minilm_dir
    from bertkit.distill import truncated_student
    from bertkit.model import BertModel
    from bertkit.tokenizer import Tokenizer
    out = work / "distill" / "pretrained-minilm-3"
    if not (out / "config.json").is_file():
        truncated_student(BertModel.from_pretrained(minilm_dir()), 3).save_pretrained(
            out, tokenizer=Tokenizer.from_pretrained(minilm_dir()))
    return out


def teacher_test_accuracy(work: Path, task: str, precision: str) -> float:
    """The teacher on test.csv, scored as the distilled students score it (distill.TaskDistiller.extend)."""
    from bertkit.precision import resolve
    from bertkit.tasks.runner import evaluate
    report = evaluate(work / "runs" / task, work / "data" / task / "test.csv", batch_size=64,
                      precision=resolve(precision, "cpu"))
    return float(report["accuracy"])


def train_student(args, work: Path, task: str, seed: int, name: str) -> dict:
    from bertkit.distill import DistillConfig, distill_task
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    teacher, data = work / "runs" / task, work / "data" / task
    with_teacher = name.startswith("distilled")
    alpha = args.alpha if with_teacher else 0.0
    out = work / "distill" / args.tag / task / f"{name}-seed{seed}"
    settings = json.loads((teacher / "config.json").read_text())["bertkit_task"]
    start = ({"student": str(pretrained_student(work))} if name == "distilled_pretrained"
             else {"student_layers": 3})
    dcfg = DistillConfig(teacher=str(teacher), **start, temperature=args.temperature, alpha=alpha,
                         hidden_weight=args.hidden_weight if with_teacher else 0.0,
                         augment=args.augment if with_teacher else 0,
                         unlabeled=(unlabeled_reviews(args, work) or unlabeled_file(args, work))
                         if with_teacher and task == "sentiment" else None)
    cfg = FinetuneConfig(task="classify", model=str(teacher), train=str(data / "train.csv"),
                         dev=str(data / "dev.csv"), test=str(data / "test.csv"), out=str(out), seeds=(seed,),
                         max_length=settings["max_length"], batch_size=32, quiet=True,
                         training=finetune_recipe(lr=args.lr, epochs=args.epochs, precision=args.precision))
    if name == "pretrained":
        summary = finetune(replace(cfg, model=str(pretrained_student(work))))
        summary["distill"] = {"settings": "no teacher: pre-trained MiniLM layers 2, 4, 6, a new head",
                              "teacher_scores": {"test": {"accuracy": teacher_test_accuracy(work, task, args.precision)}}}
    else:
        summary = distill_task(dcfg, cfg)
    return emit({"case": "accuracy", "task": task, "student": name, "seed": seed, "layers": 3,
                 "test_accuracy": summary["test"]["accuracy"]["mean"],
                 "dev_accuracy": summary["dev"]["accuracy"]["mean"],
                 "teacher_test_accuracy": summary["distill"]["teacher_scores"]["test"]["accuracy"],
                 "settings": summary["distill"].get("settings") or {
                     k: summary["distill"][k] for k in ("temperature", "alpha", "hidden_weight", "unlabeled", "augment")},
                 "lr": args.lr, "epochs": args.epochs, "examples_per_s": round(summary["examples_per_s"]["mean"], 1),
                 "out": str(out)})


def unlabeled_file(args, work: Path) -> str | None:
    """--unlabeled-bbc N: N BBC News sentences (bertkit.datasets) as unlabeled text for the sentiment student."""
    if not args.unlabeled_bbc:
        return None
    from inference import bbc_sentences
    from bertkit.tasks.readers import write_table
    path = work / "distill" / f"bbc-{args.unlabeled_bbc}.csv"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_table(path, [{"text": t} for t in bbc_sentences(args.unlabeled_bbc)])
    return str(path)


def unlabeled_reviews(args, work: Path) -> str | None:
    """--unlabeled-vader N: up to N of the other rated snippets of the vaderSentiment corpus (Amazon reviews, tweets,
    NYT editorials; not the Rotten Tomatoes sentences the task uses), their ratings dropped: unlabeled text with
    sentiment in it for the sentiment student."""
    if not args.unlabeled_vader:
        return None
    import random

    from bertkit.datasets import hutto_dir
    from bertkit.tasks.readers import write_table
    path = work / "distill" / f"vader-{args.unlabeled_vader}.csv"
    if not path.is_file():
        texts = []
        for name in ("amazonReviewSnippets", "tweets", "nytEditorialSnippets"):
            for line in (hutto_dir() / f"{name}_GroundTruth.txt").read_text(encoding="utf-8", errors="replace").splitlines():
                parts = line.split("\t", 2)
                if len(parts) == 3 and parts[2].strip():
                    texts.append(parts[2].strip())
        random.Random(0).shuffle(texts)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_table(path, [{"text": t} for t in texts[:args.unlabeled_vader]])
    return str(path)


def accuracy(args, work: Path) -> list[dict]:
    records, final = [], []
    for task in args.tasks.split(","):
        runs = {name: {} for name in STUDENTS}                              # student -> seed -> test accuracy
        for seed in (int(s) for s in args.seeds.split(",")):
            for name in args.students.split(","):
                r = train_student(args, work, task, seed, name)
                records.append(r)
                runs[name][seed] = r["test_accuracy"]
        teacher = records[-1]["teacher_test_accuracy"]
        ours, plain, pre, pre_distilled = (_mean_std(list(runs[k].values())) if runs[k] else None
                                           for k in STUDENTS)
        final.append(emit({"case": "accuracy-summary", "task": task, "teacher": round(teacher, 4),
                           "distilled": ours, "no_teacher": plain, "pretrained": pre,
                           "distilled_pretrained": pre_distilled,
                           "gap_to_teacher_points": round(100 * (teacher - ours["mean"]), 2) if ours else None,
                           "gain_over_no_teacher_points": round(100 * (ours["mean"] - plain["mean"]), 2)
                           if ours and plain else None,
                           "gain_over_pretrained_points": round(100 * (ours["mean"] - pre["mean"]), 2)
                           if ours and pre else None,
                           "paired": _paired(runs, "no_teacher"), "paired_pretrained": _paired(runs, "pretrained"),
                           "paired_pretrained_init": _paired(runs, "pretrained", "distilled_pretrained")}))
    return final


def speed(args, work: Path) -> list[dict]:
    from bertkit.tasks.runner import load_task
    records = []
    for task in args.tasks.split(","):
        teacher_dir = work / "runs" / task
        student_dir = next(iter(sorted((work / "distill" / args.tag / task).glob("distilled*-seed*"))), None)
        if student_dir is None:
            raise SystemExit(f"no distilled student under {work / 'distill' / args.tag / task}: run --cases accuracy")
        models = {"teacher": load_task(teacher_dir), "student": load_task(student_dir)}
        task_obj, _, tok = models["teacher"]
        examples = task_obj.read(work / "data" / task / "test.csv")
        feats = task_obj.features(tok, examples)
        fns = {name: m for name, (_, m, _) in models.items()}

        def run_all(model):
            with torch.no_grad():
                task_obj.predict(model, examples, feats, 32, "fp32")
        t = interleaved(fns, run_all, args.repeats)
        seq_s = {k: round(len(feats) / v, 2) for k, v in t.items()}
        records.append(emit({"case": "speed", "task": task, "batch": 32, "sequences": len(feats),
                             "max_length": task_obj.max_length, "seq_per_s": seq_s,
                             "student_vs_teacher": round(seq_s["student"] / seq_s["teacher"], 2)}))
    return records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="accuracy,speed")
    p.add_argument("--work", default="/tmp/q-acc", help="holds runs/{task} (the teachers) and data/{task}")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--students", default="distilled,no_teacher,pretrained",
                   help="which students to train, per seed: " + ", ".join(STUDENTS))
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--hidden-weight", type=float, default=0.0)
    p.add_argument("--unlabeled-bbc", type=int, default=0, help="BBC sentences as unlabeled text for sentiment")
    p.add_argument("--unlabeled-vader", type=int, default=0,
                   help="vaderSentiment's Amazon / tweet / NYT snippets as unlabeled text for sentiment (wins over bbc)")
    p.add_argument("--augment", type=int, default=0, help="noisy copies of each training text (soft targets only)")
    p.add_argument("--precision", default="auto", help="training precision of the students (auto: bf16 where native)")
    p.add_argument("--tag", default="default", help="names this configuration's run directories")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    unknown = set(args.students.split(",")) - set(STUDENTS)
    if unknown:
        p.error(f"--students: unknown {', '.join(sorted(unknown))}; choose from {', '.join(STUDENTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work)
    records = []
    for case in args.cases.split(","):
        records += {"speed": speed, "accuracy": accuracy}[case](args, work)
    emit({"case": "all", "cpu": cpu_model(), "machine": platform.machine(), "torch": torch.__version__,
          "settings": {k: getattr(args, k) for k in ("lr", "epochs", "temperature", "alpha", "hidden_weight",
                                                     "unlabeled_bbc", "unlabeled_vader", "augment", "seeds",
                                                     "precision")},
          "records": records})


if __name__ == "__main__":
    main()
