"""Bi-encoder training, bertkit vs sentence-transformers, from the same MiniLM-L6 checkpoint on the same pairs.

Both train with in-batch negatives (MultipleNegativesRankingLoss, scale 20) on the BBC retrieval pairs
(`bertkit task-data retrieval`: headline -> its article's opening paragraph) with the same batch size, epochs,
learning rate, linear warmup then decay, AdamW (weight decay 0.01), gradient clipping at 1 and full batches only.
sentence-transformers runs its `fit` (the v2 loop `old_fit`: its v3 trainer needs the `datasets` and
`accelerate` packages), fp32 or with `--st-amp` its autocast (bf16 on CPU); bertkit runs `finetune_embed`
(precision auto: bf16 autocast where native). Each model is scored on the test split (queries, corpus, qrels) by
its own library's encoder and the same metric code, before and after training. Training examples/s is examples
over the wall time of the training call (setup included); examples per CPU second (the process's CPU time, one
thread) is the same figure with the time other processes took from the machine left out. The order of the two
alternates by seed.

    python benchmarks/embed_train.py --seeds 1,2,3            # one JSON line
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _metrics_st(model, queries: dict, corpus: dict, qrels: dict) -> dict:
    from bertkit.embed.index import search_vectors
    from bertkit.embed.metrics import retrieval_metrics
    qids, cids = list(queries), list(corpus)
    q = model.encode([queries[i] for i in qids], batch_size=128, normalize_embeddings=True)
    c = model.encode([corpus[i] for i in cids], batch_size=128, normalize_embeddings=True)
    _, rows = search_vectors(q, c, k=10)
    return retrieval_metrics(qids, [[cids[r] for r in row] for row in rows], qrels)


def run_st(args, model_dir: Path, pairs: list[tuple[str, str]], test, seed: int) -> dict:
    import torch
    from sentence_transformers import InputExample, SentenceTransformer, losses
    from torch.utils.data import DataLoader
    torch.manual_seed(seed)
    model = SentenceTransformer(str(model_dir), device="cpu")
    before = _metrics_st(model, *test)
    examples = [InputExample(texts=list(p)) for p in pairs]
    loader = DataLoader(examples, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(seed))
    steps = math.ceil(len(loader) * args.epochs)
    loss = losses.MultipleNegativesRankingLoss(model, scale=20.0)
    t0, cpu0 = time.perf_counter(), time.process_time()
    model.old_fit(train_objectives=[(loader, loss)], epochs=math.ceil(args.epochs), steps_per_epoch=len(loader),
                  warmup_steps=math.ceil(args.warmup * steps), optimizer_params={"lr": args.lr}, weight_decay=0.01,
                  max_grad_norm=1.0, use_amp=args.st_amp, show_progress_bar=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"before": before, "after": _metrics_st(model, *test), "examples_per_s": steps * args.batch_size / wall,
            "examples_per_cpu_s": steps * args.batch_size / cpu, "train_s": wall}


def run_bertkit(args, model_dir: Path, train_file: Path, test_dir: Path, seed: int, out: Path) -> dict:
    from bertkit.embed.runner import EmbedFinetuneConfig, finetune_embed
    from bertkit.train.loop import TrainConfig
    cfg = EmbedFinetuneConfig(model=str(model_dir), train=str(train_file), test=str(test_dir), out=str(out),
                              training=TrainConfig(lr=args.lr, epochs=args.epochs, warmup=args.warmup,
                                                   weight_decay=0.01, precision=args.precision),
                              batch_size=args.batch_size, scale=20.0, seeds=(seed,), save_model=False, quiet=True)
    finetune_embed(cfg)
    rec = json.loads((out / "metrics.json").read_text())
    return {"before": rec["before"]["test"], "after": rec["after"]["test"], "examples_per_s": rec["examples_per_s"],
            "examples_per_cpu_s": rec["train_examples"] / rec["train_cpu_s"], "train_s": rec["train_s"], "precision": json.loads((out / "summary.json").read_text())["config"]
            ["training"]["precision"]}


def _stat(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4),
            "std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="a `bertkit task-data retrieval` directory (default: built in a temp dir)")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--warmup", type=float, default=0.1)
    ap.add_argument("--precision", default="auto", help="bertkit's (auto: bf16 where native)")
    ap.add_argument("--st-amp", action="store_true", help="sentence-transformers with its autocast (use_amp)")
    ap.add_argument("--max-train-examples", type=int)
    args = ap.parse_args()
    import torch
    from bertkit import datasets, hardware
    from bertkit.embed.runner import read_retrieval
    from bertkit.embed.train import EmbedDataset
    from bertkit.tasks import data as task_data
    tmp = Path(tempfile.mkdtemp(prefix="embed-train-"))
    data_dir = Path(args.data) if args.data else tmp / "retrieval"
    if not args.data:
        task_data.build("retrieval", data_dir, seed=0)
    train_file = data_dir / "train.jsonl"
    if args.max_train_examples:
        rows = train_file.read_text(encoding="utf-8").splitlines()[:args.max_train_examples]
        train_file = tmp / "train.jsonl"
        train_file.write_text("\n".join(rows) + "\n", encoding="utf-8")
    pairs = [t[:2] for t in EmbedDataset.read(train_file).texts]
    test = read_retrieval(data_dir / "test")
    model_dir = datasets.minilm_dir()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    runs = {"sentence_transformers": [], "bertkit": []}
    for i, seed in enumerate(seeds):
        order = ["sentence_transformers", "bertkit"] if i % 2 == 0 else ["bertkit", "sentence_transformers"]
        for name in order:
            if name == "bertkit":
                r = run_bertkit(args, model_dir, train_file, data_dir / "test", seed, tmp / f"bertkit-{seed}")
            else:
                r = run_st(args, model_dir, pairs, test, seed)
            runs[name].append(r)
            print(f"seed {seed} {name}: {json.dumps(r, default=float)}", file=sys.stderr, flush=True)
    out = {"benchmark": "embed_train", "train_pairs": len(pairs), "test_queries": len(test[0]),
           "test_corpus": len(test[1]), "batch_size": args.batch_size, "epochs": args.epochs, "lr": args.lr,
           "warmup": args.warmup, "seeds": seeds, "st_amp": args.st_amp,
           "bertkit_precision": runs["bertkit"][0]["precision"], "torch_threads": torch.get_num_threads(),
           "cpu": hardware.cpu_signature(), "cpu_model": hardware.cpu_model()}
    for name, rs in runs.items():
        out[name] = {f"{stage}_{m}": _stat([r[stage][m] for r in rs]) for stage in ("before", "after")
                     for m in ("ndcg@10", "recall@1")}
        for key in ("examples_per_s", "examples_per_cpu_s"):
            out[name][key] = _stat([r[key] for r in rs])
    pairs = list(zip(runs["bertkit"], runs["sentence_transformers"]))
    out["speedup"] = _stat([b["examples_per_s"] / s["examples_per_s"] for b, s in pairs])
    out["speedup_cpu_time"] = _stat([b["examples_per_cpu_s"] / s["examples_per_cpu_s"] for b, s in pairs])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
