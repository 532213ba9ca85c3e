"""Pre-training data throughput and memory: raw text -> shards, 1 vs 2 processes; peak RSS at 5 MB vs 50 MB.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/prepare.py

Corpus: BBC News (bbc_corpus_file, ~5 MB, prose layout) cut into 4 files; the 50 MB corpus is those files
repeated 10 times (40 files). Settings: bert-base-uncased vocab, seq_len 128, task nsp, whole-word masking, static.

* Throughput: `prepare()` on the 50 MB corpus with workers=1 and workers=2, alternating (--repeats each, medians),
  each run in a fresh subprocess so imports and page cache are the same for both. (On 5 MB, fixed costs that
  every worker pays, such as warming the tokenizer's word cache, weigh too much: docs/performance.md.) MB/s = raw
  text bytes / wall time of prepare() (spawning workers included).
  `--cli` times the `bertkit prepare` console script instead (what a user runs: the CLI imports torch, so its
  workers are spawned, not forked; their start is inside the timed part).
  Also CPU seconds per MB (user + system of the run's processes, imports included): on a shared machine the wall
  clock of 2 workers only improves when a second core is idle, but equal CPU per MB shows the split adds no work.
* Memory: peak RSS of a fresh process (workers=1) building the 5 MB and the 50 MB corpus (the largest of the
  50 MB throughput runs): flat when streaming.
  For contrast, `in_memory_reference` measures the approach google-research's create_pretraining_data.py takes
  (every document of the corpus tokenised into lists of WordPiece strings and held in RAM before examples are
  built) by loading both corpora that way with our tokenizer: an emulation of its data structure, not its code
  (it needs TensorFlow, which this environment lacks), so only its RSS is reported.

One JSON line: ours (MB/s at 1 and 2 workers, speedup; peak RSS MB at 5 and 50 MB, ratio), the in-memory
reference's peak RSS at 5 and 50 MB, and the machine's CPU count and load average (a 2-worker speedup needs two
idle cores; on a shared machine the load says how many there were).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _corpora(root: Path) -> tuple[list[Path], list[Path]]:
    from bertkit.datasets import bbc_corpus_file
    text = bbc_corpus_file().read_text(encoding="utf-8")
    docs = text.split("\n\n")
    quarter = (len(docs) + 3) // 4
    small = []
    for i in range(4):
        p = root / f"bbc-{i}.txt"
        p.write_text("\n\n".join(docs[i * quarter:(i + 1) * quarter]) + "\n\n", encoding="utf-8")
        small.append(p)
    big = []
    for rep in range(10):
        for i, src in enumerate(small):
            p = root / "x10" / f"bbc-{rep}-{i}.txt"
            p.parent.mkdir(exist_ok=True)
            p.write_bytes(src.read_bytes())
            big.append(p)
    return small, big


def _child(args) -> None:
    """One measured run in this (fresh) process; prints a JSON line."""
    files = json.loads(args.files)
    if args.mode == "cli":
        with tempfile.TemporaryDirectory() as out:
            cmd = [str(Path(sys.executable).with_name("bertkit")), "prepare", "--corpus", *files, "--vocab", args.vocab,
                   "--out", out, "--seq-len", "128", "--task", "nsp", "--masking", "wwm", "--workers",
                   str(args.workers), "--seed", "1", "--json", "--no-progress"]
            s = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        res = {"seconds": s["seconds"], "mb_per_s": s["mb_per_s"], "bytes": s["corpus"]["bytes"],
               "examples": s["build"]["examples"]}
    elif args.mode == "prepare":
        from bertkit.pretraining import PrepareConfig, prepare
        with tempfile.TemporaryDirectory() as out:
            s = prepare(PrepareConfig(files, args.vocab, out, seq_len=128, task="nsp", masking="wwm",
                                      workers=args.workers, seed=1))
        res = {"seconds": s.seconds, "mb_per_s": s.mb_per_s, "bytes": s.corpus.bytes, "examples": s.build.examples}
    else:   # in-memory reference: the whole corpus as lists of WordPiece strings, like all_documents
        from bertkit import Tokenizer
        from bertkit.pretraining.corpus import iter_documents
        tok = Tokenizer.from_pretrained(args.vocab)
        all_documents = [[tok.tokenize(s) for s in d.sentences] for d in iter_documents(files)]
        res = {"documents": len(all_documents)}
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    self_kb, child_kb = me.ru_maxrss, kids.ru_maxrss
    res["cpu_s"] = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime     # whole process, imports included
    res["peak_rss_mb"] = round(max(self_kb, child_kb) / 1024, 1)
    print(json.dumps(res))


def _run(files, vocab, mode, workers=1) -> dict:
    cmd = [sys.executable, __file__, "--child", "--mode", mode, "--workers", str(workers), "--vocab", str(vocab),
           "--files", json.dumps([str(f) for f in files])]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-reference", action="store_true", help="skip the in-memory reference")
    ap.add_argument("--cli", action="store_true", help="time the `bertkit prepare` console script, not prepare()")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="prepare", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--vocab", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args)

    from bertkit.datasets import minilm_dir
    vocab = minilm_dir() / "vocab.txt"
    load_start = os.getloadavg()[0]
    mode = "cli" if args.cli else "prepare"
    with tempfile.TemporaryDirectory() as tmp:
        small, big = _corpora(Path(tmp))
        runs = {1: [], 2: []}
        for _ in range(args.repeats):                  # alternate 1 and 2 workers: background load hits both
            for w in (1, 2):
                runs[w].append(_run(big, vocab, mode, w))
        mbs = {w: statistics.median(r["mb_per_s"] for r in runs[w]) for w in runs}
        cpu = {w: statistics.median(r["cpu_s"] / (r["bytes"] / 1e6) for r in runs[w]) for w in runs}
        rss_small = _run(small, vocab, mode, 1)
        rss_big = max(runs[1], key=lambda r: r["peak_rss_mb"])
        ref = {}
        if not args.no_reference:
            ref = {"peak_rss_mb_5mb": _run(small, vocab, "in_memory")["peak_rss_mb"],
                   "peak_rss_mb_50mb": _run(big, vocab, "in_memory")["peak_rss_mb"]}
    result = {
        "benchmark": "prepare", "timed": "bertkit prepare (console script)" if args.cli else "prepare()",
        "settings": "bbc, bert-base-uncased vocab, seq_len 128, nsp, wwm, static",
        "corpus_mb": {"5mb": round(rss_small["bytes"] / 1e6, 2), "50mb": round(rss_big["bytes"] / 1e6, 2)},
        "throughput_corpus": "50mb",
        "ours": {"mb_per_s_1_worker": round(mbs[1], 3), "mb_per_s_2_workers": round(mbs[2], 3),
                 "speedup_2_vs_1": round(mbs[2] / mbs[1], 3),
                 "runs_mb_per_s": {str(w): [round(r["mb_per_s"], 3) for r in runs[w]] for w in runs},
                 "cpu_s_per_mb_1_worker": round(cpu[1], 3), "cpu_s_per_mb_2_workers": round(cpu[2], 3),
                 "peak_rss_mb_5mb": rss_small["peak_rss_mb"], "peak_rss_mb_50mb": rss_big["peak_rss_mb"],
                 "rss_ratio_50_vs_5": round(rss_big["peak_rss_mb"] / rss_small["peak_rss_mb"], 3),
                 "mb_per_s_5mb_1_worker": round(rss_small["mb_per_s"], 3),
                 "examples_5mb": rss_small["examples"], "examples_50mb": rss_big["examples"]},
        "in_memory_reference": ref,
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_start": round(load_start, 2),
                    "load_avg_1m_end": round(os.getloadavg()[0], 2)},
    }
    if ref:
        result["in_memory_reference"]["rss_ratio_50_vs_5"] = round(ref["peak_rss_mb_50mb"] / ref["peak_rss_mb_5mb"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
