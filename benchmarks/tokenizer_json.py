"""Tokenizer speed per pipeline, one thread: bertkit's tokenizer call (ids + offsets, special tokens added) vs the
`tokenizers` library's encode_batch on the same file with the ids and offsets of every encoding pulled into Python
(the same work), on the BBC corpus; medians of interleaved repeats. Prints ONE JSON line.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/tokenizer_json.py [--repeats 5] [--vocab-size 30000]

Pipelines: wordpiece (bert-base's vocab from all-MiniLM-L6-v2: bertkit's own Tokenizer; the measurement that decides
whether WordPiece stays ours), bpe (byte-level, RoBERTa's layout) and unigram (Metaspace, XLM-R's layout), both
trained on the corpus by `bertkit.vocab.train_library_vocab` and read by LibraryTokenizer (whose pieces come from the library:
its ratio is the cost of bertkit's layout over the library's own post-processor). transformers' own __call__ on the
same directory is reported too. The library runs single-threaded (RAYON_NUM_THREADS=1, set before it is imported).
Times are this process's CPU seconds (time.process_time; one thread, so the wall time of an idle machine), which the
other jobs of a shared machine disturb less than wall time.
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bertkit import datasets  # noqa: E402
from bertkit.hardware import cpu_model  # noqa: E402
from bertkit.tokenizer import Tokenizer, read_text_file  # noqa: E402
from bertkit.vocab import train_library_vocab  # noqa: E402


def timed(fn) -> float:
    gc.collect()
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def measure(directory: Path, lines: list[str], mb: float, repeats: int) -> dict:
    import transformers

    ours = Tokenizer.from_pretrained(directory)
    ref = transformers.AutoTokenizer.from_pretrained(str(directory))
    backend = ref.backend_tokenizer
    backend.no_truncation()
    backend.no_padding()

    def run_ours():
        out = ours(lines, return_offsets=True)
        return out["input_ids"], out["offsets"]

    def run_ref():
        return [(e.ids, e.offsets) for e in backend.encode_batch(lines)]

    got, want = run_ours(), run_ref()
    identical = got[0] == [w[0] for w in want] and got[1] == [w[1] for w in want]
    del got, want
    t = {"ours": [], "ref": [], "call": []}
    for _ in range(repeats):  # interleaved: background load hits all alike
        t["ours"].append(timed(run_ours))
        t["ref"].append(timed(run_ref))
        t["call"].append(timed(lambda: ref(lines, return_offsets_mapping=True)))
    med = {k: statistics.median(v) for k, v in t.items()}
    return {"class": type(ours).__name__, "identical_ids_and_offsets": identical,
            "ours_mb_s": round(mb / med["ours"], 3), "ref_encode_batch_mb_s": round(mb / med["ref"], 3),
            "ratio": round(med["ref"] / med["ours"], 3), "ref_transformers_call_mb_s": round(mb / med["call"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab-size", type=int, default=30_000)
    args = ap.parse_args()

    text = read_text_file(datasets.bbc_corpus_file())
    lines = text.split("\n")
    mb = len(text.encode("utf-8")) / 1e6
    result = {"benchmark": "tokenizer_json_bbc", "corpus_mb": round(mb, 3), "lines": len(lines),
              "repeats": args.repeats, "threads": 1}
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("bpe", "unigram"):
            train_library_vocab(lines, model, args.vocab_size).save_pretrained(Path(tmp) / model)
        dirs = {"wordpiece": datasets.minilm_dir(), "bpe": Path(tmp) / "bpe", "unigram": Path(tmp) / "unigram"}
        for name, directory in dirs.items():
            result[name] = measure(directory, lines, mb, args.repeats)
    result.update(cpu=cpu_model(), cpu_count=os.cpu_count(), load_avg_1min_at_end=round(os.getloadavg()[0], 2),
                  reference="tokenizers encode_batch, 1 thread, ids + offsets of every encoding into Python")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
