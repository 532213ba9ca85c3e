"""Tokenizer speed: encode the whole BBC corpus (ids + offsets, [CLS]/[SEP] added), single process, ours vs the Rust
tokenizer behind transformers' BertTokenizerFast, in the same run with interleaved repeats; medians. Prints ONE JSON
line.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/tokenizer.py [--repeats 5]

The reference runs single-threaded (TOKENIZERS_PARALLELISM=false, RAYON_NUM_THREADS=1, set before tokenizers is
imported) at its fastest: the backend's encode_batch, then the ids and offsets of every encoding pulled into Python
(the same work ours does); transformers' own __call__ (slower, it wraps the same) is reported too. Ours is measured
cold (a fresh Tokenizer per repeat, so the word cache is built during the run: the headline) and warm. The parallel
encoders are measured on 2 processes vs 1 (cold each time, pool start-up included): encode_batch_parallel (Python
lists, like the serial call) and encode_pieces (numpy arrays of pieces, for corpora). The 1-minute load average is
reported: the machine is shared, and parallel speed-up needs idle cores.
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from bertkit import datasets  # noqa: E402
from bertkit.tokenizer import Tokenizer, read_text_file  # noqa: E402


def timed(fn):
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    from transformers import BertTokenizerFast

    vocab_file = datasets.minilm_dir() / "vocab.txt"
    text = read_text_file(datasets.bbc_corpus_file())
    lines = text.split("\n")
    mb = len(text.encode("utf-8")) / 1e6
    ref = BertTokenizerFast(str(vocab_file))
    backend = ref.backend_tokenizer
    vocab = Tokenizer(vocab_file).vocab

    def run_ref():
        return [(e.ids, e.offsets) for e in backend.encode_batch(lines)]

    def run_ref_call():
        out = ref(lines, return_offsets_mapping=True)
        return out["input_ids"], out["offset_mapping"]

    def run_ours(tok):
        out = tok(lines, return_offsets=True)
        return out["input_ids"], out["offsets"]

    # correctness of what is timed: identical ids and offsets
    ours_ids, ours_off = run_ours(Tokenizer(vocab))
    ref_out = run_ref()
    identical = ours_ids == [r[0] for r in ref_out] and ours_off == [r[1] for r in ref_out]
    del ours_ids, ours_off, ref_out

    t = {k: [] for k in ("ours", "ours_warm", "ref", "ref_call", "par1", "par2", "pieces1", "pieces2")}
    warm = Tokenizer(vocab)
    run_ours(warm)
    for _ in range(args.repeats):  # interleaved: background load hits all alike
        t["ours"].append(timed(lambda: run_ours(Tokenizer(vocab)))[0])
        t["ref"].append(timed(run_ref)[0])
        t["ours_warm"].append(timed(lambda: run_ours(warm))[0])
        t["ref_call"].append(timed(run_ref_call)[0])
        t["par1"].append(timed(lambda: Tokenizer(vocab).encode_batch_parallel(lines, processes=1,
                                                                               return_offsets=True))[0])
        t["par2"].append(timed(lambda: Tokenizer(vocab).encode_batch_parallel(lines, processes=2, chunk_size=2000,
                                                                               return_offsets=True))[0])
        t["pieces1"].append(timed(lambda: Tokenizer(vocab).encode_pieces(lines, processes=1))[0])
        t["pieces2"].append(timed(lambda: Tokenizer(vocab).encode_pieces(lines, processes=2, chunk_size=2000))[0])
    med = {k: statistics.median(v) for k, v in t.items()}
    mbs = {k: round(mb / v, 3) for k, v in med.items()}
    print(json.dumps({
        "benchmark": "tokenizer_encode_bbc", "corpus_mb": round(mb, 3), "lines": len(lines),
        "repeats": args.repeats, "identical_ids_and_offsets": identical,
        "ours_mb_s": mbs["ours"], "ref_mb_s": mbs["ref"], "ratio": round(med["ref"] / med["ours"], 3),
        "ours_warm_mb_s": mbs["ours_warm"], "ratio_warm": round(med["ref"] / med["ours_warm"], 3),
        "ref_transformers_call_mb_s": mbs["ref_call"],
        "parallel_1proc_mb_s": mbs["par1"], "parallel_2proc_mb_s": mbs["par2"],
        "parallel_speedup_2v1": round(med["par1"] / med["par2"], 3),
        "pieces_arrays_1proc_mb_s": mbs["pieces1"], "pieces_arrays_2proc_mb_s": mbs["pieces2"],
        "pieces_arrays_speedup_2v1": round(med["pieces1"] / med["pieces2"], 3),
        "cpu_count": os.cpu_count(), "load_avg_1min_at_end": round(os.getloadavg()[0], 2),
        "reference": "tokenizers BertTokenizerFast backend encode_batch, 1 thread", "target_ratio": 1.5,
    }))


if __name__ == "__main__":
    main()
