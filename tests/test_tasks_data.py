"""The real task data sets (tasks.data): sizes, counted drops, and no article in two splits."""

from __future__ import annotations

import csv
import json

import pytest

from bertkit.tasks import data
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


@pytest.mark.slow
def test_ner_and_qa_sets(shared_dir, bbc_articles, tmp_path):
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
