"""Retrieval metrics by hand and against scikit-learn's ndcg_score; Spearman against scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertkit.embed.metrics import retrieval_metrics, similarity_metrics
from bertkit.errors import DataError


def test_hand_computed_case():
    queries = ["q1", "q2", "q3"]
    ranked = [["d3", "d1", "d7", "d2", "d9", "d4", "d5", "d6", "d8", "d0", "d11"],   # relevant d1, d2
              ["d5", "d6", "d7", "d8", "d9", "d0", "d1", "d2", "d3", "d4"],          # relevant d4 at rank 10
              ["d1", "d2"]]                                                           # no relevant docs at all
    relevant = [("q1", "d1"), ("q1", "d2"), ("q2", "d4"), ("q2", "d11"), ("q3", "x")]
    m = retrieval_metrics(queries, ranked, relevant)
    # q1: recall@1 0, @5 1, @10 1; q2: 0, 0, 1/2; q3: 0, 0, 0
    assert m["recall@1"] == 0.0
    assert m["recall@5"] == pytest.approx(1 / 3)
    assert m["recall@10"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert m["mrr@10"] == pytest.approx((1 / 2 + 1 / 10 + 0) / 3)
    ndcg_q1 = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    ndcg_q2 = (1 / math.log2(11)) / (1 + 1 / math.log2(3))
    assert m["ndcg@10"] == pytest.approx((ndcg_q1 + ndcg_q2) / 3)
    assert m["queries"] == 3 and m["queries_without_relevant"] == 0


def test_queries_without_relevant_are_counted_not_averaged():
    m = retrieval_metrics(["a", "b"], [["x"], ["y"]], [("a", "x")])
    assert m["recall@1"] == 1.0 and m["queries"] == 1 and m["queries_without_relevant"] == 1
    with pytest.raises(DataError, match="no query"):
        retrieval_metrics(["a"], [["x"]], [("b", "x")])


def test_ndcg_equals_sklearn_with_graded_relevance():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    n_docs, n_queries = 40, 25
    grades = rng.integers(0, 4, size=(n_queries, n_docs)) * (rng.random((n_queries, n_docs)) < 0.2)
    grades[:, 0] += grades.sum(1) == 0                         # every query has a relevant document
    scores = rng.random((n_queries, n_docs))                   # distinct: no ties
    ranked = [[f"d{j}" for j in np.argsort(-s)] for s in scores]
    relevant = {f"q{i}": {f"d{j}": int(g) for j, g in enumerate(row) if g} for i, row in enumerate(grades)}
    m = retrieval_metrics([f"q{i}" for i in range(n_queries)], ranked, relevant)
    assert m["ndcg@10"] == pytest.approx(sklearn_metrics.ndcg_score(grades, scores, k=10), abs=1e-12)


def test_similarity_metrics_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((30, 8)), rng.standard_normal((30, 8))
    gold = np.round(rng.random(30) * 5) / 5                    # ties in the gold scores
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    m = similarity_metrics(a, b, gold)
    assert m["spearman_cosine"] == pytest.approx(stats.spearmanr(cos, gold).statistic, abs=1e-12)
    assert m["pearson_cosine"] == pytest.approx(stats.pearsonr(cos, gold).statistic, abs=1e-12)
