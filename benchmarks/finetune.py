"""Fine-tuning: bertkit vs transformers, same checkpoint, same splits, same features, same hyperparameters.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/finetune.py --task sentiment --seeds 1,2,3

Both sides start from the real MiniLM-L6 checkpoint (`datasets.minilm_dir()`), train on the same token ids (our
features; the bert-base-uncased WordPiece output is identical in both libraries) with AdamW (lr, weight decay 0.01
off biases / LayerNorm, betas 0.9/0.999, eps 1e-6), linear warmup over 10% then linear decay, gradient clipping
at 1.0, dropout 0.1, --precision (auto: bf16 autocast where the CPU has native bf16, AMX / AVX-512 BF16, else fp32;
the same on both sides), evaluate dev after every epoch and score test at the best dev epoch.

  * ours: `bertkit.tasks.runner.finetune` (bertkit.train loop, the encoder's "auto" attention, i.e. unpadded
    for ragged batches, length-bucketed batches padded to their own longest sequence);
  * reference: `transformers.Bert*` with `attn_implementation="sdpa"` (its fastest on CPU) in a plain torch loop,
    batches padded to the batch's longest sequence (DataCollatorWithPadding's behaviour). Metrics come from the
    same metric code on its outputs.

The comparison is paired by default: the reference trains on exactly our batches in our order (`--order same`;
`--order own`: its own random batches) and its new output layer starts from the weights our run of the same seed
drew (`--init same`; `--init own`: its own draw). The two runs of a seed then differ only in dropout masks and
float rounding. Unpaired, the head's N(0, 0.02) draw alone moved NER test F1 by 3 points on one seed (MiniLM,
1,500 sentences, 2 epochs), which swamps a 0.5-point criterion.

Runs interleave (seed 1 ours, seed 1 reference, seed 2 ours, ...) so background load hits both alike; examples/s
is training examples / training wall time (dev evaluation excluded). Prints one JSON line: per-side mean +- std
of every metric, examples/s medians, the speed ratio of each seed's back-to-back pair and their median
("speedup"), plus the per-run records.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bertkit import datasets
from bertkit.precision import autocast
from bertkit.tasks import data as task_data
from bertkit.tasks.batching import BucketBatchSampler, collate
from bertkit.tasks.runner import (FinetuneConfig, FinetuneHooks, evaluate_task, _prepare, _task, finetune,
                                  finetune_recipe)

# benchmark name -> (data set builder name, task kind, default max_length, file extension)
TASKS = {
    "sentiment": ("sentiment", "classify", 64, "csv"),
    "sentiment-regress": ("sentiment-regress", "regress", 64, "csv"),
    "topic": ("topic", "classify", 256, "csv"),
    "pairs": ("pairs", "pair", 96, "csv"),
    "ner": ("ner", "tag", 128, "conll"),
    "qa": ("qa", "qa", 384, "json"),
    "qa2": ("qa2", "qa", 384, "json"),
}


def _files(name: str) -> dict[str, str]:
    out = datasets.cache_dir() / "tasks" / name
    if not (out / "stats.json").exists():
        task_data.build(name, out)
    stats = json.loads((out / "stats.json").read_text())
    return stats["files"]


# ------------------------------------------------------------------------------------------- the reference
def _hf_model(kind: str, task, model_dir: Path, dropout: float):
    import transformers as tf
    cls = {"classify": tf.BertForSequenceClassification, "pair": tf.BertForSequenceClassification,
           "regress": tf.BertForSequenceClassification, "tag": tf.BertForTokenClassification,
           "qa": tf.BertForQuestionAnswering}[kind]
    kw = dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, attn_implementation="sdpa")
    if kind in ("classify", "pair", "regress", "tag"):
        kw["num_labels"] = task.num_labels
    if kind in ("classify", "pair"):
        kw["problem_type"] = "single_label_classification"
    if kind == "regress":
        kw["problem_type"] = "regression"
    return cls.from_pretrained(str(model_dir), **kw)


def run_reference(cfg: FinetuneConfig, task, data, seed: int, order: str = "same", init: str = "same") -> dict:
    """transformers model, plain torch loop, batches padded to their longest sequence (ours, or its own random ones)."""
    import transformers as tf
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = _hf_model(cfg.task, task, Path(cfg.model), cfg.dropout)
    if init == "same":
        # the new output layer starts from the weights our run of this seed drew (both sides draw N(0, 0.02); on
        # small sets the draw alone moves NER F1 by points, which would swamp what the comparison is about)
        ours = FinetuneHooks().build_model(cfg, task, seed)
        res = model.load_state_dict(ours.state_dict(), strict=False)
        if res.missing_keys:
            raise RuntimeError(f"reference weights not in ours: {res.missing_keys}")
        torch.manual_seed(seed)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "LayerNorm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.training.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.training.lr, betas=(0.9, 0.999), eps=1e-6,
                            fused=True)
    feats = data.train_feats
    per_epoch = -(-len(feats) // cfg.batch_size)
    total = max(1, math.ceil(per_epoch * cfg.training.epochs))
    sched = tf.get_linear_schedule_with_warmup(opt, int(cfg.training.warmup * total), total)
    label_keys = [k for k in ("labels", "start_positions", "end_positions") if getattr(feats[0], k) is not None]
    g = torch.Generator().manual_seed(seed)
    # order "same": exactly our batches (our sampler, same seed, reshuffled per epoch), so the two sides differ only
    # in dropout masks and the new head's random init; "own": random batches of its own (torch.randperm)
    sampler = BucketBatchSampler([len(f.input_ids) for f in feats], cfg.batch_size, seed,
                                 bucket_batches=cfg.bucket_batches)
    step, epoch, train_s, examples = 0, 0, 0.0, 0
    best = {"value": -math.inf}
    history = []
    while step < total:
        if order == "same":
            sampler.set_epoch(epoch)
            order_batches = sampler.batches()
        else:
            perm = torch.randperm(len(feats), generator=g).tolist()
            order_batches = [perm[s:s + cfg.batch_size] for s in range(0, len(perm), cfg.batch_size)]
        t0 = time.perf_counter()
        for idx in order_batches:
            if step >= total:
                break
            batch = collate([feats[i] for i in idx], 0, multiple_of=1)  # pad to the longest, as HF's collator
            inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask", *label_keys)}
            with autocast(cfg.training.precision, "cpu"):
                loss = model(**inputs).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            examples += len(idx)
        train_s += time.perf_counter() - t0
        epoch += 1
        with autocast(cfg.training.precision, "cpu"):
            raw = task.predict(model, data.dev, data.dev_feats, cfg.eval_batch_size, cfg.training.precision)
            task.tune(data.dev, raw)                        # qa 2.0: the null threshold, before scoring
            report = task.score(data.dev, data.dev_feats, raw)
        history.append({"step": step, task.main_metric: report[task.main_metric]})
        if report[task.main_metric] > best["value"]:
            best = {"value": report[task.main_metric], "dev": report, "step": step,
                    "null": getattr(task, "null_threshold", None),
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        model.train()
    model.load_state_dict(best["state"])
    if best["null"] is not None:
        task.null_threshold = best["null"]
    rec = {"seed": seed, "dev": best["dev"], "best_step": best["step"], "history": history, "train_s": train_s,
           "train_examples": examples, "examples_per_s": examples / train_s}
    if data.test is not None:
        rec["test"], _ = evaluate_task(task, model, data.test, data.test_feats, cfg.eval_batch_size,
                                       cfg.training.precision)
    return rec


# ----------------------------------------------------------------------------------------------- reporting
_KEYS = ("accuracy", "f1", "f1_macro", "mcc", "pearson", "spearman", "precision", "recall", "exact",
         "HasAns_f1", "NoAns_f1", "HasAns_exact", "NoAns_exact")


def _summary(runs: list[dict]) -> dict:
    out = {}
    for split in ("dev", "test"):
        if split in runs[0]:
            out[split] = {}
            for k in _KEYS:
                if k in runs[0][split]:
                    vals = [float(r[split][k]) for r in runs]
                    out[split][k] = {"mean": statistics.fmean(vals),
                                     "std": statistics.stdev(vals) if len(vals) > 1 else 0.0}
            if "per_type" in runs[0][split]:  # entity F1 per type, mean over seeds
                types = runs[0][split]["per_type"]
                out[split]["per_type_f1"] = {t: statistics.fmean(r[split]["per_type"].get(t, {"f1": 0})["f1"]
                                                                 for r in runs) for t in types}
    eps = [r["examples_per_s"] for r in runs]
    out["examples_per_s"] = {"median": statistics.median(eps), "values": eps}
    return out


def _strip(rec: dict) -> dict:
    drop = ("confusion_matrix", "per_class", "per_type", "files")
    return {k: ({kk: vv for kk, vv in v.items() if kk not in drop} if isinstance(v, dict) else v)
            for k, v in rec.items() if k not in ("history",)}


def feature_based(cfg: FinetuneConfig, task, data, tok, seeds: list[int]) -> dict:
    """The paper's section 5.3 on our data: frozen encoder, layers combined, a linear probe (bertkit.train)."""
    from bertkit.model import BertModel
    from bertkit.tasks.features import ProbeConfig, extract_features, train_probe
    from bertkit.tasks.metrics import accuracy
    enc = BertModel.from_pretrained(cfg.model)
    y = {k: np.array([task.labels.id(e.label) for e in v]) for k, v in
         (("train", data.train), ("dev", data.dev), ("test", data.test))}
    out = {}
    for name, layers, combine in (("last", (-1,), "concat"), ("concat_last4", (-1, -2, -3, -4), "concat"),
                                  ("sum_last4", (-1, -2, -3, -4), "sum"), ("embeddings", (0,), "concat")):
        t0 = time.perf_counter()
        X = {k: extract_features(enc, tok, [e.text for e in v], layers=layers, combine=combine, pooling="mean",
                                 max_length=cfg.max_length, bf16=cfg.training.precision == "bf16")
             for k, v in (("train", data.train), ("dev", data.dev), ("test", data.test))}
        extract_s = time.perf_counter() - t0
        runs = []
        for seed in seeds:
            probe, info = train_probe(X["train"], y["train"], X["dev"], y["dev"], len(task.labels),
                                      ProbeConfig(epochs=20, lr=1e-3, seed=seed))
            with torch.no_grad():
                test_acc = accuracy(y["test"], probe(torch.from_numpy(X["test"])).logits.argmax(-1).numpy())
            runs.append({"dev": info["dev_accuracy"], "test": test_acc})
        out[name] = {"dim": int(X["train"].shape[1]), "extract_s": round(extract_s, 1),
                     **{k: {"mean": statistics.fmean(r[k] for r in runs),
                            "std": statistics.stdev(r[k] for r in runs) if len(runs) > 1 else 0.0}
                        for k in ("dev", "test")}}
        print(f"# feature-based {name}: {out[name]}", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="sentiment", choices=sorted(TASKS))
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--max-length", type=int)
    p.add_argument("--max-train-examples", type=int)
    p.add_argument("--bucket-batches", type=int, default=50,
                   help="ours: length-bucketing window in batches (1: random batches, like the reference)")
    p.add_argument("--order", choices=("same", "own"), default="same",
                   help="reference batches: same = exactly ours (paired comparison: only dropout masks and the new "
                        "head's init differ), own = its own random batches")
    p.add_argument("--init", choices=("same", "own"), default="same",
                   help="reference's new output layer: same = the weights our run of the seed starts from, own = its "
                        "own N(0, 0.02) draw")
    p.add_argument("--model", help="model directory (default: MiniLM-L6)")
    p.add_argument("--random-init", action="store_true", help="ours only: the model's architecture, fresh weights")
    p.add_argument("--dropout", type=float, default=0.1,
                   help="hidden + attention dropout while fine-tuning, both sides (the paper: 0.1)")
    p.add_argument("--feature-based", action="store_true",
                   help="frozen encoder + linear probe on chosen layers instead of fine-tuning (classify tasks)")
    p.add_argument("--side", choices=("both", "ours", "reference"), default="both")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--out", default="runs/bench-finetune")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="both sides; auto: bf16 autocast where the CPU has native bf16, else fp32")
    args = p.parse_args(argv)
    from bertkit.precision import resolve
    bf16 = resolve(args.precision, "cpu") == "bf16"
    if args.threads:
        torch.set_num_threads(args.threads)

    data_name, kind, max_len, _ = TASKS[args.task]
    files = _files(data_name)
    model_dir = Path(args.model) if args.model else datasets.minilm_dir()
    seeds = [int(s) for s in args.seeds.split(",")]
    training = finetune_recipe(lr=args.lr, epochs=args.epochs, precision="bf16" if bf16 else "fp32")
    cfg = FinetuneConfig(task=kind, model=str(model_dir), train=files["train"], dev=files["dev"],
                         test=files.get("test"), out=args.out, training=training, batch_size=args.batch_size,
                         max_length=args.max_length or max_len, seeds=(seeds[0],),
                         max_train_examples=args.max_train_examples, save_model=False, quiet=True,
                         random_init=args.random_init, bucket_batches=args.bucket_batches, dropout=args.dropout)
    # the reference trains on exactly our features
    from bertkit.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(model_dir)
    ref_task = _task(cfg)
    data = _prepare(cfg, ref_task, tok)

    if args.feature_based:
        res = {"benchmark": "finetune-feature-based", "task": args.task, "model": model_dir.name, "seeds": seeds,
               "data": data.counts, "probe": feature_based(cfg, ref_task, data, tok, seeds)}
        out = Path(args.out) / f"{args.task}-feature-based.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1, default=float))
        print(json.dumps(res, default=float))
        return 0

    ours, ref = [], []
    for seed in seeds:
        if args.side in ("both", "ours"):
            cfg.seeds = (seed,)
            cfg.out = f"{args.out}/{args.task}/ours-seed{seed}"
            s = finetune(cfg)
            rec = json.loads((Path(cfg.out) / "metrics.json").read_text())
            ours.append(rec)
            print(f"# ours seed {seed}: dev {rec['dev'][ref_task.main_metric]:.4f} "
                  f"test {rec.get('test', {}).get(ref_task.main_metric, float('nan')):.4f} "
                  f"{rec['examples_per_s']:.1f} ex/s", file=sys.stderr, flush=True)
        if args.side in ("both", "reference"):
            rec = run_reference(cfg, ref_task, data, seed, args.order, args.init)
            ref.append(rec)
            print(f"# reference seed {seed}: dev {rec['dev'][ref_task.main_metric]:.4f} "
                  f"test {rec.get('test', {}).get(ref_task.main_metric, float('nan')):.4f} "
                  f"{rec['examples_per_s']:.1f} ex/s", file=sys.stderr, flush=True)

    result = {"benchmark": "finetune", "task": args.task, "random_init": args.random_init, "kind": kind, "model": model_dir.name,
              "lr": args.lr, "dropout": args.dropout, "batch_size": args.batch_size, "epochs": args.epochs,
              "bucket_batches": args.bucket_batches, "reference_order": args.order, "reference_init": args.init, "max_length": cfg.max_length,
              "seeds": seeds, "data": data.counts, "threads": torch.get_num_threads(),
              "precision": "bf16" if bf16 else "fp32"}
    if ours:
        result["ours"] = _summary(ours)
    if ref:
        result["reference"] = _summary(ref)
    if ours and ref:
        # per seed, ours and the reference run back to back: the ratio of each pair survives load that changes
        # between pairs (the sides' medians do not); "speedup" is the median of the pair ratios
        pairs = [o["examples_per_s"] / r["examples_per_s"] for o, r in zip(ours, ref)]
        result["speedup_per_seed"] = pairs
        result["speedup"] = statistics.median(pairs)
        result["speedup_of_medians"] = (result["ours"]["examples_per_s"]["median"]
                                        / result["reference"]["examples_per_s"]["median"])
        m = ref_task.main_metric
        for split in ("dev", "test"):
            if split in result["ours"] and m in result["ours"][split]:
                scale = 1.0 if m in ("exact", "f1") and kind == "qa" else 100.0   # SQuAD EM/F1 are already in %
                result[f"{split}_{m}_diff_points"] = scale * (result["ours"][split][m]["mean"]
                                                              - result["reference"][split][m]["mean"])
    result["runs"] = {"ours": [_strip(r) for r in ours], "reference": [_strip(r) for r in ref]}
    out = Path(args.out) / f"{args.task}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=float))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
