"""Cross-encoder reranking: a pair classification / regression model scores (query, document) jointly.

    ce = CrossEncoder.load("runs/pairs")                   # `bertkit finetune --task pair` (or regress) output,
    ce.rank("who won?", docs, top_k=3)                      # or a sentence-transformers CrossEncoder directory
    rerank("runs/pairs", "who won?", docs)                  # the same in one call: [{"index", "text", "score"}]

A pair's score is sentence-transformers' `CrossEncoder.predict`'s at every front door (docs/cli.md): the model's
saved activation on its logits, then the column of the relevant label (one of POSITIVE_LABELS, else the last).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from bertkit.embed.st_format import model_config
from bertkit.errors import ConfigError, DataError
from bertkit.infer import Predictor
from bertkit.predict.decode import relevance
from bertkit.predict.engine import PRECISION

__all__ = ["CrossEncoder", "rerank", "saved_activation", "single_text_kind", "positive_label", "POSITIVE_LABELS"]

POSITIVE_LABELS = ("1", "positive", "pos", "relevant", "true", "yes", "entailment")
DEFAULT_MAX_LENGTH = 256            # pieces per pair where the tokenizer names no model_max_length


def single_text_kind(predictor) -> str | None:
    """The bertkit task kind of a classifier fine-tuned on single texts ("classify", "multilabel"), to which a
    (query, document) pair means nothing; None for pair models and for models bertkit did not fine-tune."""
    kind = (getattr(predictor.model.config, "extra", {}).get("bertkit_task") or {}).get("kind")
    return kind if kind in ("classify", "multilabel") else None


def saved_activation(config, directory: Path | None = None) -> torch.nn.Module:
    """The activation CrossEncoder.predict applies to the logits, found where sentence-transformers looks:
    config_sentence_transformers.json `activation_fn` (version 6), config.json `sentence_transformers.activation_fn`
    (4 and 5) or `sbert_ce_default_activation_function` (older); else, and for a class outside torch (which
    CrossEncoder runs only with trust_remote_code), Sigmoid for one output and Identity for more."""
    st = config.extra.get("sentence_transformers")
    found = [model_config(directory).get("activation_fn") if directory is not None else None,
             st.get("activation_fn") if isinstance(st, dict) else None,
             config.extra.get("sbert_ce_default_activation_function")]
    path = next((p for p in found if isinstance(p, str) and p.startswith("torch.")), None)
    if path is None:
        return torch.nn.Sigmoid() if config.num_labels == 1 else torch.nn.Identity()
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)()
    except (ImportError, AttributeError, TypeError):
        raise ConfigError(f"{directory or 'config.json'}: activation_fn {path!r} is not a torch class that takes "
                          f"no arguments") from None


def positive_label(labels: Sequence[str] | None) -> int:
    """The index of the label that means "relevant": one of POSITIVE_LABELS, else the last."""
    names = [str(l).lower() for l in (labels or [])]
    return next((names.index(l) for l in POSITIVE_LABELS if l in names), max(len(names) - 1, 0))


class CrossEncoder:
    def __init__(self, predictor, name: str = "model"):
        self.predictor, self.name = predictor, name
        config = predictor.model.config
        self.positive = positive_label(predictor.labels)
        self.activation = saved_activation(config, predictor.directory)
        # CrossEncoder's own cut: the tokenizer's model_max_length, within the model's positions
        self.max_length = min(predictor.tokenizer.model_max_length or DEFAULT_MAX_LENGTH, config.max_input_length)

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

    def from_logits(self, logits: np.ndarray, raw: bool = False) -> np.ndarray:
        """(n, labels) logits -> (n,) scores, CrossEncoder.predict's; raw: the relevant label's logits, the
        activation skipped (TEI's raw_scores)."""
        if raw:
            return np.asarray(logits, dtype=np.float32)[:, self.positive]
        return relevance(logits, self.activation, self.positive)

    def score(self, query: str, docs: Sequence[str], batch_size: int = 32, max_length: int | None = None) -> np.ndarray:
        """(len(docs),) float32 scores of (query, doc) pairs, cut to max_length pieces (default: self.max_length)."""
        docs = list(docs)
        if not str(query).strip():
            raise DataError("rerank: the query is empty")
        for i, d in enumerate(docs):
            if not isinstance(d, str) or not d.strip():
                raise DataError(f"rerank: document {i + 1} is empty")
        return self.from_logits(self.predictor.logits([query] * len(docs), docs, max_length or self.max_length,
                                                      batch_size))

    def rank(self, query: str, docs: Sequence[str], top_k: int | None = None, batch_size: int = 32,
             max_length: int | None = None) -> list[dict]:
        """The documents sorted by score, best first (ties: earlier document first)."""
        docs = list(docs)
        scores = self.score(query, docs, batch_size, max_length)
        order = sorted(range(len(docs)), key=lambda i: (-float(scores[i]), i))[:top_k]
        return [{"index": i, "text": docs[i], "score": float(scores[i])} for i in order]


def rerank(model, query: str, docs: Sequence[str], top_k: int | None = None, batch_size: int = 32) -> list[dict]:
    """`CrossEncoder.load(model).rank(query, docs, top_k)`; `model` may also be a loaded CrossEncoder."""
    ce = model if isinstance(model, CrossEncoder) else CrossEncoder.load(model)
    return ce.rank(query, docs, top_k, batch_size)
