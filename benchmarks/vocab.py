"""Vocabulary quality, speed and memory: bertkit `train_vocab` vs tokenizers' `WordPieceTrainer` (the oracle).

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/vocab.py            # prints ONE JSON line

Data: the 2,225 BBC articles (sorted by name); every 10th article is held out (223), the other 2,002 are the training
text, written as one file (a paragraph per line). Both trainers get the same file, the same size, the same special
tokens, min_frequency and the same BERT uncased normalisation / pre-tokenisation (HF: BertNormalizer +
BertPreTokenizer; ours: the Tokenizer's basic_tokenize).

Quality: each learned vocab.txt is loaded into the *same* encoder, bertkit's Tokenizer (BERT greedy longest-match
WordPiece), and the held-out articles are encoded: pieces per word (words = basic_tokenize output) and the [UNK]
rate (share of pieces that are [UNK]). As a cross-check the HF vocab is also encoded by HF's own Rust BERT tokenizer.

Speed / memory: every training run is its own subprocess (python -c worker), so its peak RSS (VmHWM) is its own;
the RSS after imports, before training, is reported too (`base_rss_mb`), so the training's own memory is
peak - base. Ours and HF alternate, `--repeats` times; medians are reported. HF runs with its default threads (it
parallelises counting over both cores); ours is single-process.

Memory vs corpus size: ours trains on the training text and on the same text repeated 10 times (peak RSS should be
about the same: counting streams), and on a synthetic corpus of all-distinct words 1x and 4x as large with a small
word-table cap, which shows the pruning keeps the table bounded when the distinct-word count grows too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# ---------------------------------------------------------------------------------------------- worker (subprocess)

WORKER = r"""
import json, os, sys, time
kind, corpus, size, min_freq, out, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
if kind == "ours":
    from bertkit.vocab import train_vocab
    import bertkit.tokenizer  # imported before the baseline so base_rss counts it
    base = rss_mb()
    t0 = time.perf_counter()
    tok = train_vocab([corpus], vocab_size=size, lowercase=True, min_frequency=min_freq, special_tokens=specials,
                      max_distinct_words=cap)
    secs = time.perf_counter() - t0
    tok.save(out)
else:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    base = rss_mb()
    t0 = time.perf_counter()
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=size, min_frequency=min_freq, special_tokens=specials,
                                        show_progress=False)
    tok.train([corpus], trainer)
    secs = time.perf_counter() - t0
    os.makedirs(out, exist_ok=True)
    tok.model.save(out)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork+exec, so it would include the parent benchmark's RSS
with open("/proc/self/status") as f:
    peak = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
print(json.dumps({"seconds": secs, "peak_rss_mb": peak, "base_rss_mb": base}))
"""


def run_worker(kind: str, corpus: Path, size: int, min_freq: int, out: Path, cap: int = 1_000_000) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, "-c", WORKER, kind, str(corpus), str(size), str(min_freq), str(out), str(cap)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} worker failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------------- quality

def evaluate(vocab_file: Path, heldout: list[str]) -> dict:
    from bertkit.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(vocab_file)
    words = pieces = unk = 0
    for text in heldout:
        words += len(tok.basic_tokenize(text))
        toks = tok.tokenize(text)
        pieces += len(toks)
        unk += sum(t == "[UNK]" for t in toks)
    return {"vocab_size": tok.vocab_size, "words": words, "pieces": pieces,
            "pieces_per_word": pieces / words, "unk_rate": unk / pieces, "unk": unk}


def hf_pieces_per_word(vocab_file: Path, heldout: list[str], words: int) -> float:
    from tokenizers import BertWordPieceTokenizer  # the Rust BERT tokenizer (what BertTokenizerFast wraps)
    tok = BertWordPieceTokenizer(str(vocab_file), lowercase=True)
    return sum(len(e.tokens) for e in tok.encode_batch(heldout, add_special_tokens=False)) / words


def synthetic_corpus(path: Path, n_words: int, seed: int) -> None:
    """n_words all-distinct random lowercase words, 12 per line: the worst case for a word table."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(0, n_words, 12):
            f.write(" ".join("".join(rng.choices(letters, k=10)) + str(i + j) for j in range(12)) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8000, 30000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-frequency", type=int, default=1,
                    help="1 (not our default 2) so that both trainers reach the full 30,000 on 4.5 MB of text")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory-vs-corpus-size runs")
    ap.add_argument("--only-memory", action="store_true", help="only the memory-vs-corpus-size runs")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from bertkit import datasets

    articles = datasets.bbc_articles()
    train = [a for i, a in enumerate(articles) if i % 10 != 0]
    heldout = [a.text for i, a in enumerate(articles) if i % 10 == 0]
    report: dict = {"bench": "vocab", "train_articles": len(train), "heldout_articles": len(heldout),
                    "min_frequency": args.min_frequency, "repeats": args.repeats,
                    "encoder": "bertkit Tokenizer (greedy longest-match) for both vocabs",
                    "hf_threads": "default (both cores)", "ours_threads": 1}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "train.txt"
        datasets.write_corpus(train, corpus)
        report["train_mb"] = round(corpus.stat().st_size / 1e6, 2)
        for size in ([] if args.only_memory else args.sizes):
            runs: dict[str, list[dict]] = {"ours": [], "hf": []}
            for r in range(args.repeats):
                order = ("ours", "hf") if r % 2 == 0 else ("hf", "ours")
                for kind in order:
                    runs[kind].append(run_worker(kind, corpus, size, args.min_frequency, tmp / f"{kind}-{size}"))
            entry: dict = {}
            for kind in ("ours", "hf"):
                q = evaluate(tmp / f"{kind}-{size}" / "vocab.txt", heldout)
                entry[kind] = {
                    **{k: round(v, 5) if isinstance(v, float) else v for k, v in q.items()},
                    "seconds": round(statistics.median(x["seconds"] for x in runs[kind]), 3),
                    "peak_rss_mb": round(statistics.median(x["peak_rss_mb"] for x in runs[kind]), 1),
                    "base_rss_mb": round(statistics.median(x["base_rss_mb"] for x in runs[kind]), 1),
                }
            entry["hf"]["pieces_per_word_hf_encoder"] = round(
                hf_pieces_per_word(tmp / f"hf-{size}" / "vocab.txt", heldout, entry["hf"]["words"]), 5)
            entry["ratio_pieces_per_word"] = round(entry["ours"]["pieces_per_word"] / entry["hf"]["pieces_per_word"], 4)
            entry["ratio_seconds"] = round(entry["ours"]["seconds"] / entry["hf"]["seconds"], 3)
            entry["target_met"] = entry["ratio_pieces_per_word"] <= 1.03 and entry["ours"]["unk"] <= entry["hf"]["unk"]
            report[str(size)] = entry

        if not args.no_memory:
            mem: dict = {}
            big = tmp / "train_x10.txt"
            with open(big, "w", encoding="utf-8") as f:
                text = corpus.read_text(encoding="utf-8")
                for _ in range(10):
                    f.write(text)
            for name, path in (("bbc_x1", corpus), ("bbc_x10", big)):
                o = run_worker("ours", path, 8000, args.min_frequency, tmp / f"mem-{name}")
                h = run_worker("hf", path, 8000, args.min_frequency, tmp / f"memhf-{name}")
                mem[name] = {"mb": round(path.stat().st_size / 1e6, 1), "ours_peak_rss_mb": round(o["peak_rss_mb"], 1),
                             "ours_seconds": round(o["seconds"], 2), "hf_peak_rss_mb": round(h["peak_rss_mb"], 1),
                             "hf_seconds": round(h["seconds"], 2)}
            cap = 100_000
            for name, n in (("distinct_1x", 500_000), ("distinct_4x", 2_000_000)):
                path = tmp / f"{name}.txt"
                synthetic_corpus(path, n, seed=0)
                o = run_worker("ours", path, 2000, args.min_frequency, tmp / f"mem-{name}", cap=cap)
                mem[name] = {"mb": round(path.stat().st_size / 1e6, 1), "distinct_words": n, "max_distinct_words": cap,
                             "ours_peak_rss_mb": round(o["peak_rss_mb"], 1), "ours_seconds": round(o["seconds"], 2)}
            report["memory_vs_corpus_size"] = mem
    print(json.dumps(report))


if __name__ == "__main__":
    main()
