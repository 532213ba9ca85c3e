"""BERT-style vs ModernBERT-style `mini` encoders pre-trained by bertkit on the same text for the same wall clock.

    .venv/bin/python benchmarks/equal_budget.py                      # 8 minutes each, then fine-tuning (~20 min)
    .venv/bin/python benchmarks/equal_budget.py --budget 30m         # longer
    .venv/bin/python benchmarks/equal_budget.py --quick              # a dry run of every stage (~3 minutes)

Data: BBC News without duplicate articles, split by article 80/10/10 (seed 0, the `topic` task's split): the
training articles are the pre-training text, the test articles the held-out text and the fine-tuning test set.
Vocabulary: MiniLM's (bert-base-uncased WordPiece, 30,522 pieces) for both. Shards as the `--budget` plan was
measured on (bertkit.train.recipe.SHARDS: rows of 64, sentence pairs, token 40% masks drawn each epoch); held out:
whole-word 15% masks drawn once, the same static masks for both models.

Models (4 layers, 256 hidden, 4 heads, ~same feed-forward parameters):
  bert        `--preset mini`: learned absolute positions, post-norm, GELU feed-forward 1,024 wide, biases
  modernbert  a `--config` of model_type modernbert: rotary positions, pre-norm with a final norm, GeGLU 2 x 672
              wide (the parameters of BERT's 1,024), no biases, layers 0 and 3 global, 1 and 2 a sliding window of
              32 tokens (ModernBERT's one global layer in three; its 128-token window would span these 64-token rows)
  bert-random `--models bert,modernbert,bert-random` adds it: `mini` from BERT's random init, as ModernBERT starts

Both run `bertkit pretrain --budget B --objective mlm --lr 1e-3` with the plan's other settings (wsd, 16 x 64 a
step, no dropout, ...; the lr is given to both alike, the 1e-3 the plan picks for a 256-wide model).
ModernBERT cannot take `--attention-init local` (it builds learned position embeddings and separate query / key
weights; ModernBERT has neither), so it starts from `random`: rotary positions give it relative positions from
the first step instead. The two pre-trainings run at the same time, one thread each (OMP_NUM_THREADS=1), so that
load from other jobs hits both alike. Then each is fine-tuned on BBC topic classification (5 classes, 64 tokens as
pre-trained, batch 16, lr 3e-4, 2 epochs: ~206 steps; the same for both, side by side, one thread each), and so
is a control of each family after one pre-training step (~ its random init): what the pre-training added.

Prints one JSON line per model: held-out MLM accuracy / loss (the run's last evaluation), steps, tokens, the
held-out curve, fine-tuned dev / test accuracy, and the machine (CPU, cores, load average, date).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the ModernBERT-style mini: config.json keys as transformers' ModernBertConfig spells them
MODERN = {"model_type": "modernbert", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
          "intermediate_size": 672, "hidden_activation": "gelu", "max_position_embeddings": 512,
          "local_attention": 32, "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
          "local_rope_theta": 10000.0, "norm_eps": 1e-5, "pad_token_id": 0}
MODELS = ("bert", "modernbert", "bert-random")


def bertkit(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertkit", *args]


def one_thread_env() -> dict:
    """The environment of a child that computes on one thread (torch reads OMP_NUM_THREADS at start)."""
    src = str(ROOT / "src")
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "PYTHONPATH": src if not path else f"{src}{os.pathsep}{path}"}


def side_by_side(commands: dict[str, list[str]], logs: Path) -> None:
    """Run the commands at the same time, one thread each, output to LOGS/NAME.log; a failed one exits naming it."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = {}
    for name, cmd in commands.items():
        log = open(logs / f"{name}.log", "w")
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=one_thread_env()), log)
    for name, (proc, log) in procs.items():
        proc.wait()
        log.close()
        if proc.returncode:
            sys.exit(f"{name} failed (exit {proc.returncode}): see {logs / name}.log")


def prepare_data(work: Path, seed: int) -> dict:
    """Corpora, shards and the topic task's files, all from one by-article split; paths by name."""
    from bertkit import datasets
    from bertkit.pretraining import PrepareConfig, prepare
    from bertkit.tasks import data as task_data
    from bertkit.train.recipe import SHARDS

    articles, _ = task_data._unique_articles()          # the topic task's articles: its split is ours
    train, _, test = datasets.split_by_seed(articles, seed)
    vocab = datasets.minilm_dir() / "vocab.txt"
    paths = {"vocab": vocab, "topic": work / "topic", "train": work / "shards_train", "heldout": work / "shards_heldout"}
    held_masks = {**SHARDS, "masking": "wwm", "mask_prob": 0.15, "dynamic": False}
    for name, part, masks, mask_seed in (("train", train, SHARDS, seed), ("heldout", test, held_masks, seed + 1)):
        corpus = work / f"bbc_{name}.txt"
        datasets.write_corpus(part, corpus)
        prepare(PrepareConfig(str(corpus), str(vocab), paths[name], **masks, seed=mask_seed, overwrite=True))
    task_data.build("topic", paths["topic"], seed=seed)
    paths["modernbert"] = work / "modernbert.json"
    paths["modernbert"].write_text(json.dumps({**MODERN, "vocab_size": sum(1 for _ in open(vocab, encoding="utf-8"))}))
    return paths


def model_args(model: str, paths: dict) -> list[str]:
    """bert: the plan's local attention init; bert-random: BERT's own random init, as ModernBERT starts."""
    if model == "modernbert":
        return ["--config", str(paths["modernbert"]), "--attention-init", "random"]
    return ["--preset", "mini", *(["--attention-init", "random"] if model == "bert-random" else [])]


def pretrain_commands(paths: dict, work: Path, models: list[str], budget: str | None, steps: int | None,
                      tag: str) -> dict:
    # the plan picks the lr by preset, and gives a --config BERT-base's 1e-4: both get the mini's 1e-3
    length = ["--budget", budget, "--lr", "1e-3"] if budget else ["--steps", str(steps), "--eval-batches", "8"]
    return {f"{fam}{tag}": bertkit("pretrain", str(paths["train"]), "--out", str(work / f"{fam}{tag}"), *length,
                                   "--objective", "mlm", "--eval-shards", str(paths["heldout"]), "--seed", "0",
                                   "--no-progress", "--overwrite", *model_args(fam, paths))
            for fam in models}


def finetune_commands(paths: dict, work: Path, runs: list[str], args) -> dict:
    topic = paths["topic"]
    limit = ["--max-train-examples", str(args.train_examples)] if args.train_examples else []
    return {f"ft_{run}": bertkit("finetune", "--task", "classify", "--model", str(work / run / "model"),
                              "--train", str(topic / "train.csv"), "--dev", str(topic / "dev.csv"),
                              "--test", str(topic / "test.csv"), "--out", str(work / f"ft_{run}"),
                              "--lr", str(args.ft_lr), "--batch-size", "16", "--epochs", str(args.ft_epochs),
                              "--max-length", "64", "--seeds", "1", "--no-save", "--overwrite", "--quiet", *limit)
            for run in runs}


def pretrained(run: Path) -> dict:
    """What a pre-training run's summary.json says it did and learnt."""
    s = json.loads((run / "summary.json").read_text())
    return {"steps": s["steps"], "tokens": s["tokens"], "elapsed_s": s["elapsed_s"],
            "heldout_mlm_acc": round(s["heldout"]["mlm_acc"], 4), "heldout_mlm_loss": round(s["heldout"]["loss"], 4),
            "heldout_curve": [[c["step"], round(c["mlm_acc"], 4)] for c in s["heldout_curve"]]}


def finetuned(ft_dir: Path) -> dict:
    """Dev / test accuracy (and test macro-F1) of a fine-tuning run, its training examples/s."""
    s = json.loads((ft_dir / "summary.json").read_text())
    return {"dev_acc": round(s["dev"]["accuracy"]["mean"], 4), "test_acc": round(s["test"]["accuracy"]["mean"], 4),
            "test_f1_macro": round(s["test"]["f1_macro"]["mean"], 4),
            "examples_per_s": round(s["examples_per_s"]["mean"], 1)}


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budget", default="8m", help="pre-training wall clock for each model (bertkit's --budget)")
    p.add_argument("--quick", action="store_true", help="a dry run: 20 s budgets, 200 fine-tuning examples")
    p.add_argument("--work", help="working directory (default: a fresh temporary one)")
    p.add_argument("--seed", type=int, default=0, help="the by-article split")
    p.add_argument("--ft-lr", type=float, default=3e-4)
    p.add_argument("--ft-epochs", type=float, default=2.0)
    p.add_argument("--train-examples", type=int, help="fine-tune on the first N training articles only")
    p.add_argument("--models", default="bert,modernbert", help=f"comma-separated, side by side: {', '.join(MODELS)}")
    p.add_argument("--no-controls", dest="controls", action="store_false",
                   help="skip fine-tuning each model after one pre-training step")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not models or set(models) - set(MODELS):
        p.error(f"--models {args.models}: choose from {', '.join(MODELS)}")
    if args.quick:
        args.budget, args.train_examples, args.ft_epochs = "20s", args.train_examples or 200, 1.0
    work = Path(args.work or tempfile.mkdtemp(prefix="bertkit-equal-budget-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    paths = prepare_data(work, args.seed)
    start = machine()
    side_by_side(pretrain_commands(paths, work, models, args.budget, None, ""), work / "logs")
    runs = [models]
    if args.controls:
        side_by_side(pretrain_commands(paths, work, models, None, 1, "_init"), work / "logs")
        runs.append([f"{m}_init" for m in models])
    for pair in runs:
        side_by_side(finetune_commands(paths, work, pair, args), work / "logs")
    end = machine()
    for m in models:
        control = {"topic_after_1_step": finetuned(work / f"ft_{m}_init")} if args.controls else {}
        print(json.dumps({"model": m, "budget": args.budget, "threads": 1, **pretrained(work / m),
                          "topic": finetuned(work / f"ft_{m}"), **control, "machine_at_start": start,
                          "machine_at_end": end, "total_s": round(time.time() - t0), "work": str(work)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
