"""Shared fixtures. Tests that need ../shared or a real corpus skip with a reason when it is absent.

The suite never depends on chance (a failure is a bug, never a draw):
- the runtime's fast paths are all on (`BERTKIT_FAST_PATHS=all`, also for the CLI's child processes): measured,
  they would depend on the load at the moment of the probe, on whether a probe file for this thread count is in
  $BERTKIT_CACHE already (`make demo` leaves them) and on a measurement running inside whichever test asks first;
- hypothesis draws from a fixed seed and keeps no example database (a `.hypothesis/` of an earlier run would
  replay its own draws); BERTKIT_HYPOTHESIS=random draws afresh, to hunt for bugs.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("BERTKIT_FAST_PATHS", "all")
try:
    from hypothesis import settings
except ImportError:     # the property tests skip without it
    pass
else:
    settings.register_profile("fixed", derandomize=True, database=None, print_blob=True)
    settings.register_profile("random", database=None, print_blob=True)
    settings.load_profile("random" if os.environ.get("BERTKIT_HYPOTHESIS") == "random" else "fixed")

REPO = Path(__file__).resolve().parents[1]
TF_FIXTURE = REPO / "tests" / "fixtures" / "tf_bert_tiny"
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (a user's fresh clone has no ../shared)")
    return SHARED


def _dataset(fn):
    from bertkit.errors import DatasetUnavailable
    try:
        return fn()
    except DatasetUnavailable as e:
        pytest.skip(f"dataset unavailable offline: {e}")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from bertkit import datasets
    return _dataset(datasets.minilm_dir)


@pytest.fixture(scope="session")
def bbc_articles():
    from bertkit import datasets
    return _dataset(datasets.bbc_articles)


@pytest.fixture(scope="session")
def bbc_nsp_shards(tmp_path_factory, bbc_articles):
    """make(n, seq_len): NSP shards (dynamic masks) of the first n BBC articles under a 600-token vocab."""
    def make(n: int, seq_len: int) -> Path:
        from bertkit.pretraining import PrepareConfig, prepare
        from bertkit.vocab import train_vocab
        root = tmp_path_factory.mktemp(f"bbc{n}-{seq_len}")
        (root / "train.txt").write_text("".join("\n".join([a.title, *a.paragraphs]) + "\n\n" for a in bbc_articles[:n]))
        train_vocab([str(root / "train.txt")], vocab_size=600).save(root / "vocab")
        prepare(PrepareConfig(str(root / "train.txt"), str(root / "vocab"), str(root / "shards"), seq_len=seq_len,
                              task="nsp", dynamic=True, corpus_format="prose"))
        return root / "shards"
    return make


@pytest.fixture(scope="session")
def rotten_tomatoes():
    from bertkit import datasets
    return _dataset(datasets.rotten_tomatoes)


@pytest.fixture(scope="session")
def bert_vocab_file(minilm_dir) -> Path:
    """The real bert-base-uncased vocab.txt (shipped inside MiniLM-L6)."""
    return minilm_dir / "vocab.txt"


# ----------------------------------------------------------------- a tiny workspace for the command-line tests

_WORDS = ("the a man woman child cat dog city river paris france london capital food bread music film news game "
         "team player is was eats eating sat ran plays wrote sells of in on at by with because he she they it "
         "tired happy new old big small good bad".split())


def _corpus(rng: random.Random) -> str:
    docs = []
    for _ in range(24):
        docs.append("\n".join(" ".join(rng.choices(_WORDS, k=rng.randint(5, 12))) + " ." for _ in range(6)))
    return "\n\n".join(docs) + "\nParis is the capital of France .\nThe cat sat because he was tired .\n"


def _sentiment(path: Path, rng: random.Random, n: int, labels: bool = True) -> None:
    rows = ["text,label" if labels else "text"]
    for _ in range(n):
        good = rng.random() < 0.5
        text = " ".join(rng.choices(_WORDS, k=6) + ["good" if good else "bad"])
        rows.append(f"{text},{'pos' if good else 'neg'}" if labels else text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _retrieval(ws: Path, rng: random.Random) -> None:
    """data/retrieval/ (train pairs, dev / test retrieval directories), docs.jsonl / docs.txt and pairs.jsonl."""
    docs = [" ".join(rng.choices(_WORDS, k=8)) for _ in range(40)]   # a batch of 32 pairs at least
    pairs = [{"anchor": " ".join(rng.choices(_WORDS, k=3)), "positive": d} for d in docs]
    _jsonl(ws / "data" / "retrieval" / "train.jsonl", pairs)
    _jsonl(ws / "pairs.jsonl", pairs)
    for split in ("dev", "test"):
        d = ws / "data" / "retrieval" / split
        _jsonl(d / "queries.jsonl", [{"id": f"q{i}", "text": pairs[i]["anchor"]} for i in range(6)])
        _jsonl(d / "corpus.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(docs[:10])])
        _jsonl(d / "qrels.jsonl", [{"query_id": f"q{i}", "corpus_id": f"d{i}", "score": 1} for i in range(6)])
    _jsonl(ws / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(docs)])
    (ws / "docs.txt").write_text("\n".join(docs[:8]) + "\n")


@pytest.fixture(scope="session")
def tiny_workspace(tmp_path_factory) -> dict:
    """A directory (`ws`) with tiny stand-ins at the paths README.md and docs/cli.md name (corpus/, my-vocab/,
    vocab.txt, shards128/, tiny-bert/, data/sentiment/, ...), a model fine-tuned on that data (`finetuned`) and its run directory (`run`),
    for the command-line tests (tests/test_readme.py, tests/test_cli.py). Copy `ws` before writing into it."""
    import torch
    from bertkit import BertConfig, BertForPreTraining
    from bertkit.pretraining import PrepareConfig, prepare
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    from bertkit.vocab import train_vocab

    rng = random.Random(0)
    ws = tmp_path_factory.mktemp("cli-workspace") / "ws"
    (ws / "corpus").mkdir(parents=True)
    for name in ("a", "b"):
        (ws / "corpus" / f"{name}.txt").write_text(_corpus(rng))
    lines = [" ".join(rng.choices(_WORDS, k=8)) for _ in range(40)]
    (ws / "lines.txt").write_text("\n".join(lines) + "\n")
    (ws / "sentences.txt").write_text("\n".join(lines[:20] + ["a man is eating food ."]) + "\n")
    tok = train_vocab(sorted(str(p) for p in (ws / "corpus").glob("*.txt")), vocab_size=160, lowercase=True)
    tok.save(ws / "my-vocab")
    shutil.copy(TF_FIXTURE / "vocab.txt", ws / "vocab.txt")
    shutil.copytree(TF_FIXTURE, ws / "uncased_L-12_H-768_A-12", ignore=shutil.ignore_patterns("expected.npz"))
    for out, seq_len, seed in (("shards128", 128, 1), ("shards", 128, 1), ("heldout", 128, 2), ("shards512", 512, 3)):
        prepare(PrepareConfig(str(ws / "corpus"), ws / "my-vocab", ws / out, seq_len=seq_len, seed=seed))
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=tok.vocab_size)
    BertForPreTraining(cfg).save_pretrained(ws / "tiny-bert", tokenizer=tok)
    for split, n in (("train", 48), ("dev", 16), ("test", 16)):
        _sentiment(ws / "data" / "sentiment" / f"{split}.csv", rng, n)
    _sentiment(ws / "new.csv", rng, 8, labels=False)
    _retrieval(ws, rng)
    from bertkit import BertForSequenceClassification
    BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=tok.vocab_size, num_labels=2)).save_pretrained(
        ws / "runs" / "pairs", tokenizer=tok)                      # a cross-encoder for rerank / search --rerank

    built = ws.parent / "built"
    finetune(FinetuneConfig(task="classify", model=str(ws / "tiny-bert"), train=str(ws / "data/sentiment/train.csv"),
                            dev=str(ws / "data/sentiment/dev.csv"), out=str(built / "sentiment"), batch_size=16,
                            training=finetune_recipe(epochs=1.0, precision="fp32"), quiet=True))
    return {"ws": ws, "finetuned": built / "sentiment", "run": built / "sentiment" / "train"}
