"""Cross-encoder reranking: a pair classification / regression model scores (query, document) jointly.

    ce = CrossEncoder.load("runs/pairs")                   # `bertkit finetune --task pair` (or regress) output
    ce.rank("who won?", docs, top_k=3)                      # [{"index", "text", "score"}], best first
    rerank("runs/pairs", "who won?", docs)                  # the same in one call

The score of a pair is the regression value (one output), or the log-probability of the relevant label (two or
more outputs): the label named 1 / positive / pos / relevant / true / yes / entailment, else the last label.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertkit.errors import ConfigError, DataError
from bertkit.infer import Predictor
from bertkit.predict.decode import relevance
from bertkit.predict.engine import PRECISION

__all__ = ["CrossEncoder", "rerank", "single_text_kind", "positive_label", "POSITIVE_LABELS"]

POSITIVE_LABELS = ("1", "positive", "pos", "relevant", "true", "yes", "entailment")


def single_text_kind(predictor) -> str | None:
    """The bertkit task kind of a classifier fine-tuned on single texts ("classify", "multilabel"), to which a
    (query, document) pair means nothing; None for pair models and for models bertkit did not fine-tune."""
    kind = (getattr(predictor.model.config, "extra", {}).get("bertkit_task") or {}).get("kind")
    return kind if kind in ("classify", "multilabel") else None


def positive_label(labels: Sequence[str] | None) -> int:
    """The index of the label that means "relevant": one of POSITIVE_LABELS, else the last."""
    names = [str(l).lower() for l in (labels or [])]
    return next((names.index(l) for l in POSITIVE_LABELS if l in names), max(len(names) - 1, 0))


class CrossEncoder:
    def __init__(self, predictor, name: str = "model"):
        self.predictor, self.name = predictor, name
        self.positive = positive_label(predictor.labels)

    @classmethod
    def load(cls, path, device: str = "cpu", precision: str = PRECISION) -> "CrossEncoder":
        p = Predictor.load(path, device=device, precision=precision)
        if p.task != "classify":
            raise ConfigError(f"{path}: its head is {p.task!r}; reranking needs a pair classification or regression "
                              f"model (bertkit finetune --task pair | regress)")
        kind = single_text_kind(p)
        if kind is not None:
            raise ConfigError(f"{path}: fine-tuned on single texts (bertkit_task kind {kind!r}); reranking needs a "
                              f"model fine-tuned on pairs (bertkit finetune --task pair | regress)")
        return cls(p, str(path))

    def score(self, query: str, docs: Sequence[str], batch_size: int = 32, max_length: int = 256) -> np.ndarray:
        """(len(docs),) float32 relevance scores of (query, doc) pairs: a one-output model's value, else the
        log-probability of the positive label."""
        docs = list(docs)
        if not str(query).strip():
            raise DataError("rerank: the query is empty")
        for i, d in enumerate(docs):
            if not isinstance(d, str) or not d.strip():
                raise DataError(f"rerank: document {i + 1} is empty")
        logits = self.predictor.logits([query] * len(docs), docs, max_length, batch_size)     # (n, labels)
        z = relevance(logits, self.positive)
        return (z if logits.shape[1] == 1 else -np.logaddexp(0.0, -z)).astype(np.float32)    # log sigmoid(z)

    def rank(self, query: str, docs: Sequence[str], top_k: int | None = None, batch_size: int = 32,
             max_length: int = 256) -> list[dict]:
        """The documents sorted by score, best first (ties: earlier document first)."""
        docs = list(docs)
        scores = self.score(query, docs, batch_size, max_length)
        order = sorted(range(len(docs)), key=lambda i: (-float(scores[i]), i))[:top_k]
        return [{"index": i, "text": docs[i], "score": float(scores[i])} for i in order]


def rerank(model, query: str, docs: Sequence[str], top_k: int | None = None, batch_size: int = 32) -> list[dict]:
    """`CrossEncoder.load(model).rank(query, docs, top_k)`; `model` may also be a loaded CrossEncoder."""
    ce = model if isinstance(model, CrossEncoder) else CrossEncoder.load(model)
    return ce.rank(query, docs, top_k, batch_size)
