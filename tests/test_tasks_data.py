"""The real task data sets (tasks.data): sizes, counted drops, and no article in two splits."""

from __future__ import annotations

import csv
import gzip
import json
import lzma

import pytest

from bertkit import datasets
from bertkit.errors import DataError
from bertkit.tasks import data, ner_silver
from bertkit.tasks.readers import read_conll, read_squad, read_table


def test_sentiment_split(rotten_tomatoes, tmp_path):
    s = data.build("sentiment", tmp_path, seed=0)
    zero = sum(r.score == 0 for r in rotten_tomatoes)
    assert s["dropped_zero_score"] == zero and sum(s["counts"].values()) == len(rotten_tomatoes) - zero
    train = read_table(s["files"]["train"])
    assert {e.label for e in train} == {"pos", "neg"}
    texts = {k: {e.text for e in read_table(f)} for k, f in s["files"].items()}
    assert len(texts["train"] & texts["test"]) < 5  # only literal duplicate sentences may repeat
    r = data.build("sentiment-regress", tmp_path / "r", seed=0)
    assert [e.text for e in read_table(r["files"]["dev"])] == [e.text for e in read_table(s["files"]["dev"])]


def test_pairs_by_article(bbc_articles, tmp_path):
    s = data.build("pairs", tmp_path, seed=0)
    rows = {k: list(csv.DictReader(open(f, encoding="utf-8"))) for k, f in s["files"].items()}
    assert s["duplicate_articles_dropped"] >= len(bbc_articles) - len({a.text for a in bbc_articles})
    assert sum(len(v) for v in rows.values()) == 2 * (len(bbc_articles) - s["duplicate_articles_dropped"])
    firsts = {k: {r["text_pair"] for r in v if r["label"] == "1"} for k, v in rows.items()}
    assert not firsts["train"] & firsts["test"] and not firsts["train"] & firsts["dev"]
    for v in rows.values():
        assert sum(r["label"] == "1" for r in v) == len(v) // 2


def test_ner_file_rebuilt_from_shipped_annotations(bbc_articles, tmp_path, monkeypatch):
    """A clone without ../shared: the NER file is rebuilt into the cache from the package's annotations (small, no
    text) and the fetched BBC corpus; a corpus that does not match is one DataError line."""
    root = datasets.bbc_dir()                   # fetched (or found) where it is, before the cache moves
    monkeypatch.delenv("BERTKIT_NER_FILE", raising=False)
    monkeypatch.setenv("BERTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "bbc_dir", lambda: root)
    assert ner_silver.ANNOTATIONS.stat().st_size < 400_000
    path = data.ner_file()
    assert path.parent == tmp_path / "cache" and data.ner_file() == path       # built once, then reused
    sents = read_conll(path)
    assert len({s.doc for s in sents}) == 1200 and len(sents) == 22209
    assert sents[0].words[:2] == ["Charles", "Clarke"] and sents[0].tags[:2] == ["B-PERSON", "I-PERSON"]
    with pytest.raises(DataError, match="cannot read the BBC article") as e:
        ner_silver.rebuild(tmp_path / "x.conll", bbc_root=tmp_path / "empty")
    assert "\n" not in str(e.value) and not (tmp_path / "x.conll").exists()


def test_rebuilt_ner_file_equals_the_shared_one(shared_dir, bbc_articles, tmp_path):
    shared = shared_dir / "data" / "bbc_ner_silver.conll.gz"
    if not shared.is_file():
        pytest.skip(f"{shared} is absent")
    rebuilt = ner_silver.rebuild(tmp_path / "ner.conll")
    assert rebuilt.read_bytes() == gzip.open(shared).read()
    again = ner_silver.encode(shared, datasets.bbc_dir())
    assert lzma.decompress(again) == lzma.decompress(ner_silver.ANNOTATIONS.read_bytes())


def test_cloze_ties_do_not_depend_on_the_hash_seed():
    q = "Daiwa shares rose in Japan"
    assert data._cloze(q, "Japan and Daiwa", ["Japan", "Daiwa"])[0] == "Daiwa shares rose in @placeholder"
    assert data._cloze(q, "Japan and Daiwa", ["Daiwa", "Japan"])[0] == "@placeholder shares rose in Japan"


@pytest.mark.slow
def test_ner_and_qa_sets(bbc_articles, tmp_path):
    ner = data.build("ner", tmp_path / "ner", seed=0)
    docs = {k: {s.doc for s in read_conll(f)} for k, f in ner["files"].items()}
    assert not docs["train"] & docs["dev"] and not docs["train"] & docs["test"]
    qa = data.build("qa2", tmp_path / "qa", seed=0)
    for split, f in qa["files"].items():
        d = read_squad(f, fix_offsets=False)  # every answer sits exactly at its offset
        assert d.version_2 and d.fixed_offsets == 0
        assert {e.id.split("#")[0] for e in d.examples} <= docs[split]
        for e in d.examples:
            assert "@placeholder" in e.question
            assert e.is_impossible == (not e.answers)
    stats = json.loads((tmp_path / "qa" / "stats.json").read_text())
    assert stats["counts"]["dev_unanswerable"] > 0 and stats["skipped"]
