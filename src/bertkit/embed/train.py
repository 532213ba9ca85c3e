"""Bi-encoder training on bertkit's loop: data files -> tokenized column batches -> embeddings -> loss.

    data = EmbedDataset.read("pairs.jsonl")                   # anchor, positive[, negative | negative_1..n]
    model = EmbedModel(encoder, MultipleNegativesRankingLoss())
    train(model, data.batches(encoder, tokenizer, batch_size=64), TrainConfig(max_steps=1000), "runs/x",
          step_fn=embed_step(mini_batch_size=16), eval_fn=retrieval_eval(tokenizer, queries, corpus, relevant))

Files (CSV / TSV / JSONL, one example a row): pairs (anchor, positive, and negative or negative_1..n, a JSON list in
`negative` too; every row the same count) or scored pairs (text, text_pair, score).

A batch is a flat dict of (batch, seq) tensors per column (`anchor.input_ids`, `negative_1.attention_mask`, ...),
plus `<column>.key` (equal texts share a key: the loss masks in-batch false negatives) or `score`.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn

from bertkit.errors import ConfigError, DataError
from bertkit.tasks.readers import column_names, table_rows
from bertkit.train.steps import StepOutput

from bertkit.embed.gradcache import cached_loss
from bertkit.embed.index import search_vectors
from bertkit.embed.losses import MultipleNegativesRankingLoss, text_keys
from bertkit.embed.metrics import retrieval_metrics, similarity_metrics
from bertkit.embed.pooling import SentenceEncoder
from bertkit.predict.engine import PRECISION

__all__ = ["EmbedDataset", "EmbedBatches", "EmbedModel", "embed_step", "retrieval_eval", "similarity_eval"]

_NEGATIVE = re.compile(r"negative(?:_(\d+))?$")


@dataclass
class EmbedDataset:
    kind: str                              # "pairs" | "scored"
    columns: list[str]                     # pairs: anchor, positive, negative_1..n; scored: text, text_pair
    texts: list[tuple[str, ...]]           # one tuple per example, in `columns` order
    scores: list[float] | None = None      # scored only
    source: str = ""

    def __len__(self) -> int:
        return len(self.texts)

    @classmethod
    def read(cls, path) -> "EmbedDataset":
        path = Path(path)
        texts: list[tuple[str, ...]] = []
        scores: list[float] = []
        kind = None
        for line, row in table_rows(path):
            if kind is None:
                kind = _kind_of(path, line, row)
            if kind == "pairs":
                texts.append(_pair_row(path, line, row))
                if len(texts[-1]) != len(texts[0]):
                    raise DataError(f"{path}:{line}: column(s) {', '.join(_negative_columns(row)) or '(none)'}: "
                                    f"{len(texts[-1]) - 2} negative(s), the first row has {len(texts[0]) - 2}; "
                                    f"every row needs the same number")
            else:
                texts.append(tuple(_text(path, line, row, c) for c in ("text", "text_pair")))
                scores.append(_score(path, line, row))
        if not texts:
            raise DataError(f"{path}: no examples")
        n = len(texts[0])
        columns = (["anchor", "positive"] + [f"negative_{i}" for i in range(1, n - 1)] if kind == "pairs"
                   else ["text", "text_pair"])
        return cls(kind, columns, texts, scores if kind == "scored" else None, str(path))

    def batches(self, encoder: SentenceEncoder, tokenizer, batch_size: int, seed: int = 0,
                shuffle: bool = True) -> "EmbedBatches":
        return EmbedBatches(self, encoder, tokenizer, batch_size, seed, shuffle)


def _kind_of(path: Path, line: int, row: dict) -> str:
    if "anchor" in row:
        if "positive" not in row:
            raise DataError(f"{path}:{line}: column 'positive': missing (an 'anchor' needs a 'positive'); found "
                            f"{column_names(row)}")
        return "pairs"
    if "text" in row and "text_pair" in row and "score" in row:
        return "scored"
    raise DataError(f"{path}:{line}: expected columns anchor, positive[, negative...] or text, text_pair, score; "
                    f"found {column_names(row)}")


def _negative_columns(row: dict) -> list[str]:
    """'negative' first, then negative_1..n in numeric order."""
    found = [(int(m.group(1) or 0), c) for c in row if (m := _NEGATIVE.match(c))]
    return [c for _, c in sorted(found)]


def _text(path: Path, line: int, row: dict, column: str) -> str:
    value = row.get(column)
    if value is None or not isinstance(value, (str, int, float)) or not str(value).strip():
        raise DataError(f"{path}:{line}: column {column!r}: empty text")
    return str(value)


def _pair_row(path: Path, line: int, row: dict) -> tuple[str, ...]:
    texts = [_text(path, line, row, "anchor"), _text(path, line, row, "positive")]
    for c in _negative_columns(row):
        value = row[c]
        items = value if isinstance(value, list) else [value]
        for i, v in enumerate(items):
            if v is None or not str(v).strip():
                where = c if not isinstance(value, list) else f"{c}[{i}]"
                raise DataError(f"{path}:{line}: column {where!r}: empty text (every row needs the same number "
                                f"of negatives)")
            texts.append(str(v))
    return tuple(texts)


def _score(path: Path, line: int, row: dict) -> float:
    try:
        value = float(row["score"])
    except (TypeError, ValueError):
        raise DataError(f"{path}:{line}: column 'score': {row['score']!r} is not a number") from None
    if not math.isfinite(value):
        raise DataError(f"{path}:{line}: column 'score': {value} is not finite")
    return value


class EmbedBatches:
    """Tokenized batches of an EmbedDataset, reshuffled each epoch (`set_epoch`, which the loop calls). The last
    incomplete batch is dropped: in-batch negatives want full batches."""

    def __init__(self, data: EmbedDataset, encoder: SentenceEncoder, tokenizer, batch_size: int, seed: int = 0,
                 shuffle: bool = True):
        if batch_size < 2 and data.kind == "pairs":
            raise ConfigError(f"batch_size={batch_size}: in-batch negatives need at least 2 pairs a batch")
        if len(data) < batch_size:
            raise DataError(f"{data.source}: {len(data)} examples, fewer than one batch of {batch_size}")
        self.data, self.encoder, self.tokenizer = data, encoder, tokenizer
        self.batch_size, self.seed, self.shuffle, self.epoch = batch_size, seed, shuffle, 0
        self.max_lengths: dict[str, int] = {}        # column -> its own piece limit (a shorter query side)
        self.prompts: dict[str, str] = {}            # column -> the prompt before its texts
        self._skips: dict[str, int] = {}             # column -> its prompt's tokens pooling leaves out (once a run)

    def __len__(self) -> int:
        return len(self.data) // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = list(range(len(self.data)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        for b in range(len(self)):
            yield self.collate(order[b * self.batch_size:(b + 1) * self.batch_size])

    def collate(self, rows: Sequence[int]) -> dict[str, Tensor]:
        data = self.data
        batch: dict[str, Tensor] = {}
        columns = list(zip(*(data.texts[i] for i in rows)))                  # per column, its texts
        for name, texts in zip(data.columns, columns):
            limit, prompt = self.max_lengths.get(name), self.prompts.get(name, "")
            features = self.encoder.tokenize(self.tokenizer, [prompt + t for t in texts], limit)
            if name not in self._skips:
                self._skips[name] = self.encoder.prompt_length(self.tokenizer, prompt, limit)
            skip = self._skips[name]
            if skip:
                features["prompt_length"] = torch.full((len(texts),), skip, device=features["input_ids"].device)
            for field, t in features.items():
                batch[f"{name}.{field}"] = t                                   # (batch, seq), prompt_length (batch,)
        if data.kind == "pairs":
            batch["anchor.key"] = text_keys(columns[0])
            candidate_keys = text_keys([t for col in columns[1:] for t in col]).view(len(columns) - 1, -1)
            for name, keys in zip(data.columns[1:], candidate_keys):
                batch[f"{name}.key"] = keys                                    # (batch,)
        else:
            batch["score"] = torch.tensor([data.scores[i] for i in rows], dtype=torch.float32)
        return batch


class EmbedModel(nn.Module):
    """The encoder and its loss as one module, so the loop's optimizer and checkpoints include a learnable
    scale. forward = the encoder's: (batch, seq) inputs -> (batch, dim)."""

    def __init__(self, encoder: SentenceEncoder, loss: nn.Module):
        super().__init__()
        self.encoder, self.loss = encoder, loss

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, prompt_length: Tensor | int = 0) -> Tensor:
        return self.encoder(input_ids, token_type_ids, attention_mask, prompt_length)


def embed_step(mini_batch_size: int | None = None):
    """A step_fn for bertkit.train.train: each column embedded, then the model's loss (GradCache with a
    mini-batch size). Reports the loss's scale when it is learnable."""
    def step(model: nn.Module, batch: dict[str, Tensor]) -> StepOutput:
        loss_fn = getattr(model, "module", model).loss
        names = [k[:-len(".input_ids")] for k in batch if k.endswith(".input_ids")]
        features = [{f: batch[f"{n}.{f}"] for f in ("input_ids", "token_type_ids", "attention_mask", "prompt_length")
                     if f"{n}.{f}" in batch} for n in names]
        if isinstance(loss_fn, MultipleNegativesRankingLoss):
            extra = {"keys": [batch[f"{n}.key"] for n in names]} if f"{names[0]}.key" in batch else {}
        else:
            extra = {"scores": batch["score"]}
        if mini_batch_size:
            loss = cached_loss(model, features, loss_fn, mini_batch_size, **extra)
        else:
            loss = loss_fn([model(**f) for f in features], **extra)
        metrics = {}
        if isinstance(loss_fn, MultipleNegativesRankingLoss) and loss_fn.learnable:
            metrics["scale"] = loss_fn.scale.detach()
        return StepOutput(loss=loss, metrics=metrics)
    return step


def _encoder_of(model: nn.Module) -> SentenceEncoder:
    model = getattr(model, "module", model)
    return model.encoder if isinstance(model, EmbedModel) else model


def retrieval_eval(tokenizer, queries: dict[str, str], corpus: dict[str, str], relevant, k: int = 10,
                   batch_size: int = 64, precision: str = PRECISION, prompts: tuple = (None, None)):
    """An eval_fn: embed queries and corpus (in `precision`: a training run's evaluations follow its own; with
    `prompts`, the queries' and the corpus' prompts, None: the model's default), exact top k, then
    retrieval_metrics (recall@k, MRR@10, nDCG@10)."""
    qids, cids = list(queries), list(corpus)

    def evaluate(model: nn.Module) -> dict[str, float]:
        enc = _encoder_of(model)
        q = enc.encode(tokenizer, [queries[i] for i in qids], batch_size, precision, prompt=prompts[0])
        c = enc.encode(tokenizer, [corpus[i] for i in cids], batch_size, precision, prompt=prompts[1])
        _, rows = search_vectors(q, c, k=k, cosine=not enc.normalize)
        ranked = [[cids[r] for r in row] for row in rows]
        return retrieval_metrics(qids, ranked, relevant)
    return evaluate


def similarity_eval(tokenizer, texts: Sequence[str], text_pairs: Sequence[str], scores: Sequence[float],
                    batch_size: int = 64, precision: str = PRECISION, prompts: tuple = (None, None)):
    """An eval_fn for scored pairs: Spearman and Pearson of the cosines against the gold scores."""
    def evaluate(model: nn.Module) -> dict[str, float]:
        enc = _encoder_of(model)
        return similarity_metrics(enc.encode(tokenizer, texts, batch_size, precision, prompt=prompts[0]),
                                  enc.encode(tokenizer, text_pairs, batch_size, precision, prompt=prompts[1]), scores)
    return evaluate
