"""Metrics against independent oracles (scikit-learn, scipy, seqeval; skipped when absent) and hand cases."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bertkit import plots
from bertkit.tasks import metrics as M


def _rand_labels(rng, n, k):
    return [rng.randrange(k) for _ in range(n)]


def test_classification_metrics_match_sklearn():
    sk = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    for k in (2, 3, 5):
        for _ in range(20):
            y, p = _rand_labels(rng, 50, k), _rand_labels(rng, 50, k)
            assert M.accuracy(y, p) == pytest.approx(sk.accuracy_score(y, p))
            assert M.f1_macro(y, p) == pytest.approx(sk.f1_score(y, p, average="macro"))
            assert M.mcc(y, p) == pytest.approx(sk.matthews_corrcoef(y, p))
            assert (M.confusion_matrix(y, p, k) == sk.confusion_matrix(y, p, labels=list(range(k)))).all()
            if k == 2:
                assert M.f1_binary(y, p) == pytest.approx(sk.f1_score(y, p))


def test_classification_hand_cases():
    assert M.accuracy([0, 1, 1, 0], [0, 1, 0, 0]) == 0.75
    assert M.f1_binary([0, 1, 1, 0], [0, 1, 0, 0]) == pytest.approx(2 / 3)
    assert M.mcc([0, 0, 0], [0, 0, 0]) == 0.0  # undefined -> 0, not NaN
    assert M.mcc([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert M.mcc([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    rep = M.classification_report([0, 1, 2, 2], [0, 2, 2, 2], ["a", "b", "c"])
    assert rep["per_class"]["b"]["recall"] == 0 and rep["per_class"]["c"]["support"] == 2
    assert rep["confusion_matrix"] == [[1, 0, 0], [0, 0, 1], [0, 0, 2]]


def test_correlations_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    y = 0.5 * x + rng.normal(size=200)
    yt = np.round(y)  # ties
    assert M.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
    assert M.spearman(x, yt) == pytest.approx(stats.spearmanr(x, yt)[0])
    assert M.pearson([1, 1, 1], [1, 2, 3]) == 0.0


def test_confusion_matrix_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = plots.plot_confusion([[3, 1], [0, 4]], ["neg", "pos"], tmp_path / "cm.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------------- sequence labelling

def test_get_entities_schemes():
    iob2 = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "O"]
    ents = [("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 5)]
    assert M.get_entities(iob2) == ents
    iob1 = M.convert_tags(iob2, "IOB1")
    assert iob1 == ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "O"]
    bioes = M.convert_tags(iob2, "BIOES")
    assert bioes == ["B-PER", "E-PER", "O", "S-LOC", "B-LOC", "E-LOC", "O"]
    assert M.get_entities(iob1) == ents and M.get_entities(bioes) == ents
    assert M.convert_tags(bioes, "IOB2") == iob2
    # lenient conlleval: I after O starts a chunk, a type change ends one
    assert M.get_entities(["O", "I-ORG", "I-PER"]) == [("ORG", 1, 1), ("PER", 2, 2)]


def _random_tags(rng, n, prefixes="BIO"):
    out = []
    for _ in range(n):
        p = rng.choice(prefixes)
        out.append("O" if p == "O" else f"{p}-{rng.choice(['PER', 'ORG', 'LOC'])}")
    return out


def test_entities_match_seqeval():
    seqeval = pytest.importorskip("seqeval.metrics.sequence_labeling")
    rng = random.Random(1)
    for prefixes in ("BIO", "BIOES"):
        for _ in range(200):
            tags = _random_tags(rng, rng.randrange(1, 12), prefixes)
            assert M.get_entities(tags) == seqeval.get_entities(tags), tags


def test_entity_scores_match_seqeval():
    sm = pytest.importorskip("seqeval.metrics")
    rng = random.Random(2)
    gold = [_random_tags(rng, rng.randrange(1, 15)) for _ in range(60)]
    pred = [[t if rng.random() < 0.7 else rng.choice(["O", "B-PER", "I-ORG"]) for t in g] for g in gold]
    s = M.entity_scores(gold, pred)
    assert s["f1"] == pytest.approx(sm.f1_score(gold, pred))
    assert s["precision"] == pytest.approx(sm.precision_score(gold, pred))
    assert s["recall"] == pytest.approx(sm.recall_score(gold, pred))
    rep = sm.classification_report(gold, pred, output_dict=True)
    for t, v in s["per_type"].items():
        assert v["f1"] == pytest.approx(rep[t]["f1-score"]) and v["support"] == rep[t]["support"]


# ------------------------------------------------------------------------------------------------ SQuAD

def test_squad_normalisation_and_scores():
    assert M.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert M.normalize_answer("an apple a day") == "apple day"
    assert M.squad_exact("the Eiffel Tower", "Eiffel Tower.") == 1.0
    assert M.squad_f1("Eiffel Tower in Paris", "the Eiffel Tower") == pytest.approx(2 * 0.5 * 1 / 1.5)
    gold = {"q1": ["Paris", "in Paris"], "q2": [], "q3": ["1990"]}
    s = M.squad_scores({"q1": "Paris", "q2": "", "q3": "in 1991"}, gold)
    assert s["exact"] == pytest.approx(200 / 3) and s["f1"] == pytest.approx(200 / 3)
    assert s["HasAns_total"] == 2 and s["NoAns_exact"] == 100.0


def test_best_null_threshold():
    gold = {"a": ["x"], "b": [], "c": ["y"], "d": []}
    spans = {"a": "x", "b": "z", "c": "y", "d": "w"}
    margins = {"a": -2.0, "b": 1.0, "c": 0.0, "d": 3.0}
    thresh, best = M.best_null_threshold(spans, margins, gold, "exact")
    assert best == 100.0 and 0.0 <= thresh < 1.0
    preds = {q: ("" if margins[q] > thresh else spans[q]) for q in gold}
    assert M.squad_scores(preds, gold)["exact"] == 100.0
