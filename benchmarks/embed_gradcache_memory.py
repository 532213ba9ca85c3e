"""Peak memory of one MNRL training step on MiniLM-L6 (real weights), with and without GradCache.

Each case runs in a fresh process; the figure is the peak RSS (ru_maxrss) minus the RSS after the model, the
tokenized batch and one small warm-up step are in memory, so it is what the step itself adds (activations, the
autograd graph, gradients).

    python benchmarks/embed_gradcache_memory.py                       # 256 pairs, mini-batches of 32
    python benchmarks/embed_gradcache_memory.py --pairs 128 --mini-batch 16 --words 24
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time


def _texts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = ("the of and a in to is was for on as by with at from his her an that which city river team "
             "music film game school church war people year world company model data paper new first").split()
    return [" ".join(rng.choice(vocab) for _ in range(words)) for _ in range(n)]


def _rss_mb() -> float:
    import psutil
    return psutil.Process().memory_info().rss / 2 ** 20


def run_case(pairs: int, mini_batch: int | None, words: int) -> dict:
    import torch
    from bertkit import datasets
    from bertkit.embed.gradcache import cached_loss
    from bertkit.embed.losses import MultipleNegativesRankingLoss
    from bertkit.embed.st_format import load_sentence_encoder

    torch.set_num_threads(max(1, torch.get_num_threads()))
    enc, tok = load_sentence_encoder(datasets.minilm_dir())
    enc.train()
    loss_fn = MultipleNegativesRankingLoss()
    cols = [enc.tokenize(tok, _texts(pairs, words, s)) for s in (0, 1)]

    def step(columns, mbs):
        if mbs:
            loss = cached_loss(enc, columns, loss_fn, mbs)
        else:
            loss = loss_fn([enc(**c) for c in columns])
        loss.backward()
        return float(loss.detach())

    step([{k: v[:4] for k, v in c.items()} for c in cols], mini_batch)         # warm-up: grads allocated
    base = _rss_mb()
    t0 = time.perf_counter()
    loss = step(cols, mini_batch)
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024                 # KiB on Linux
    return {"pairs": pairs, "mini_batch": mini_batch, "tokens_per_text": int(cols[0]["attention_mask"].sum(1).float()
            .mean()), "loss": round(loss, 5), "step_s": round(dt, 2), "base_rss_mb": round(base),
            "peak_rss_mb": round(peak), "step_added_mb": round(peak - base)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--mini-batch", type=int, default=32)
    ap.add_argument("--words", type=int, default=32, help="words per synthetic text")
    ap.add_argument("--case", choices=["plain", "cached"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        mbs = args.mini_batch if args.case == "cached" else None
        print(json.dumps(run_case(args.pairs, mbs, args.words)))
        return
    for case in ("plain", "cached"):
        out = subprocess.run([sys.executable, __file__, "--case", case, "--pairs", str(args.pairs),
                              "--mini-batch", str(args.mini_batch), "--words", str(args.words)],
                             capture_output=True, text=True, check=True)
        print(json.dumps({"case": case, **json.loads(out.stdout.strip().splitlines()[-1])}))


if __name__ == "__main__":
    main()
