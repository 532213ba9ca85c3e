"""Retrieval and similarity metrics for embeddings (numpy only; scipy / scikit-learn are test oracles), as BEIR /
pytrec_eval define them: recall@k = |relevant in the top k| / |relevant|; MRR@10 = 1 / rank of the first relevant
result in the top 10 (0 if none); nDCG@10 = sum over the top 10 of rel / log2(rank + 1), over the ideal ranking's.

`ranked[i]` is query i's corpus ids, best first; `relevant` is (query id, corpus id) pairs (relevance 1) or
{query id: {corpus id: graded relevance}}. Queries without a relevant document are left out of the averages and
counted in `queries_without_relevant`.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np

from bertkit.errors import DataError
from bertkit.tasks.metrics import pearson, spearman

__all__ = ["retrieval_metrics", "similarity_metrics", "relevance_table", "RECALL_KS"]

RECALL_KS = (1, 5, 10)


def relevance_table(relevant) -> dict[str, dict[str, float]]:
    """(query id, corpus id) pairs or a {query: {doc: grade}} mapping -> {query: {doc: grade > 0}} with str ids."""
    table: dict[str, dict[str, float]] = {}
    if isinstance(relevant, Mapping):
        for q, docs in relevant.items():
            for d, grade in docs.items():
                if float(grade) > 0:
                    table.setdefault(str(q), {})[str(d)] = float(grade)
        return table
    for pair in relevant:
        if len(pair) != 2:
            raise DataError(f"a relevant pair must be (query id, corpus id), got {pair!r}")
        table.setdefault(str(pair[0]), {})[str(pair[1])] = 1.0
    return table


def _dcg(gains: Sequence[float]) -> float:
    return sum(g / math.log2(rank + 2) for rank, g in enumerate(gains))


def _one_query(ranked: Sequence[str], rel: dict[str, float], ks: Sequence[int], depth: int) -> dict[str, float]:
    out = {f"recall@{k}": sum(1 for d in ranked[:k] if d in rel) / len(rel) for k in ks}
    first = next((r for r, d in enumerate(ranked[:depth]) if d in rel), None)
    out[f"mrr@{depth}"] = 0.0 if first is None else 1.0 / (first + 1)
    ideal = _dcg(sorted(rel.values(), reverse=True)[:depth])
    out[f"ndcg@{depth}"] = _dcg([rel.get(d, 0.0) for d in ranked[:depth]]) / ideal
    return out


def retrieval_metrics(query_ids: Sequence, ranked: Sequence[Sequence], relevant: Iterable | Mapping,
                      ks: Sequence[int] = RECALL_KS, depth: int = 10) -> dict[str, float]:
    """Mean recall@k for each k, MRR@depth and nDCG@depth over the queries that have a relevant document."""
    if len(query_ids) != len(ranked):
        raise DataError(f"{len(query_ids)} query ids but {len(ranked)} ranked lists")
    table = relevance_table(relevant)
    sums: dict[str, float] = {}
    scored = 0
    for q, docs in zip(query_ids, ranked):
        rel = table.get(str(q))
        if not rel:
            continue
        scored += 1
        for name, value in _one_query([str(d) for d in docs], rel, ks, depth).items():
            sums[name] = sums.get(name, 0.0) + value
    if not scored:
        raise DataError("no query has a relevant document: check the query ids of the relevance pairs")
    return {**{name: s / scored for name, s in sums.items()}, "queries": scored,
            "queries_without_relevant": len(query_ids) - scored}


def similarity_metrics(a: np.ndarray, b: np.ndarray, gold: Sequence[float]) -> dict[str, float]:
    """Rank and linear correlation of cos(a_i, b_i) with the gold scores: (n, dim), (n, dim), (n,)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)   # (n,)
    gold = np.asarray(gold, dtype=np.float64)
    if len(gold) != len(cos) or len(cos) < 2:
        raise DataError(f"need n >= 2 pairs with one gold score each, got {len(cos)} pairs, {len(gold)} scores")
    return {"spearman_cosine": spearman(cos, gold), "pearson_cosine": pearson(cos, gold)}
