"""Sequence-level tasks: single-text classification, text-pair classification, regression, multi-label; one output
layer on the pooled [CLS] (`BertForSequenceClassification`). Losses and metrics per kind: docs/architecture.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertkit import plots
from bertkit.errors import DataError
from bertkit.heads import BertForSequenceClassification
from bertkit.predict.decode import class_scores
from bertkit.tasks import metrics as M
from bertkit.tasks.batching import predict_batches
from bertkit.tasks.readers import LabelMap, TextExample, read_table, split_multilabel
from bertkit.tasks.task import Feature, Task, write_jsonl

__all__ = ["SequenceTask", "encode_examples"]

PROBLEM = {"classify": "single_label_classification", "pair": "single_label_classification",
           "regress": "regression", "multilabel": "multi_label_classification"}


def encode_examples(tok, examples: list[TextExample], max_length: int) -> list[Feature]:
    """Tokenise (text[, text_pair]) with [CLS]/[SEP], truncating the longer side first to `max_length`."""
    texts = [e.text for e in examples]
    pairs = [e.text_pair for e in examples] if any(e.text_pair is not None for e in examples) else None
    if pairs is not None and any(p is None for p in pairs):
        bad = next(e for e in examples if e.text_pair is None)
        raise DataError(f"{bad.source}: empty text_pair (other rows have one)")
    enc = tok(texts, pairs, max_length=max_length, truncation="longest_first" if pairs else True)
    return [Feature(input_ids=list(enc["input_ids"][i]), token_type_ids=list(enc["token_type_ids"][i]))
            for i in range(len(examples))]


@dataclass
class SequenceTask(Task):
    kind: str                      # classify | pair | regress | multilabel
    max_length: int = 128
    multilabel_sep: str = "|"
    labels: LabelMap | None = None

    model_class = BertForSequenceClassification

    def read(self, path, require_label: bool = True) -> list[TextExample]:
        examples = read_table(path, require_pair=self.kind == "pair", require_label=require_label,
                              multilabel_sep=self.multilabel_sep)
        if self.kind != "multilabel":   # a JSON list would otherwise become a label named "['pos']"
            bad = next((e for e in examples if isinstance(e.label, list)), None)
            if bad is not None:
                raise DataError(f"{bad.source}: label {bad.label!r} is a list; --task {self.kind} wants a single "
                                f"value (lists of labels are for --task multilabel)")
        return examples

    def fit_labels(self, train: list[TextExample]) -> None:
        if self.kind == "regress":
            self.labels = None
        elif self.kind == "multilabel":
            self.labels = LabelMap.from_labels(x for e in train for x in split_multilabel(e.label, self.multilabel_sep))
        else:
            self.labels = LabelMap.from_labels(e.label for e in train)
            if len(self.labels) < 2:
                raise DataError(f"{train[0].source.rsplit(':', 1)[0]}: only one label ({self.labels.labels[0]!r}) "
                                f"in the training data; classification needs two or more")

    def restore_labels(self, names: list[str]) -> None:
        if self.kind != "regress":
            super().restore_labels(names)

    @property
    def num_labels(self) -> int:
        return 1 if self.kind == "regress" else len(self.labels)

    def config_overrides(self) -> dict:
        return {**super().config_overrides(), "problem_type": PROBLEM[self.kind]}

    def config_entries(self) -> dict:
        # sentence-transformers' CrossEncoder applies this to the logits, so its scores are `bertkit rerank`'s: the
        # head's own outputs (its default would put a sigmoid on a regression value, or one a base model saved)
        return {"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}}

    def _target(self, e: TextExample):
        if self.kind == "regress":
            try:
                value = float(e.label)
            except (TypeError, ValueError):
                raise DataError(f"{e.source}: regression label {e.label!r} is not a number") from None
            if not math.isfinite(value):   # a nan / inf loss makes the loop skip the whole batch
                raise DataError(f"{e.source}: regression label {e.label!r} is not a finite number")
            return value
        if self.kind == "multilabel":
            v = [0.0] * len(self.labels)
            for name in split_multilabel(e.label, self.multilabel_sep):
                v[self.labels.id(name, e.source)] = 1.0
            return v
        return self.labels.id(e.label, e.source)

    def features(self, tok, examples: list[TextExample], with_labels: bool = True) -> list[Feature]:
        feats = encode_examples(tok, examples, self.max_length)
        if with_labels:
            for f, e in zip(feats, examples):
                f.labels = self._target(e)
        return feats

    def predict(self, model, examples, feats: list[Feature], batch_size: int = 64,
                precision: str | bool | None = "auto") -> np.ndarray:
        """(n, num_labels) logits."""
        out = np.zeros((len(feats), self.num_labels), dtype=np.float32)
        for idx, o in predict_batches(model, feats, batch_size, precision):
            out[idx] = o.logits.float().cpu().numpy()
        return out

    def decode(self, logits: np.ndarray) -> list:
        if self.kind == "regress":
            return logits[:, 0].tolist()
        if self.kind == "multilabel":
            return [[self.labels.name(j) for j in np.nonzero(row > 0)[0]] for row in logits]
        return [self.labels.name(int(j)) for j in logits.argmax(-1)]

    def score(self, examples: list[TextExample], feats: list[Feature], logits: np.ndarray) -> dict:
        if self.kind == "regress":
            gold = np.array([f.labels for f in feats])
            pred = logits[:, 0]
            return {"pearson": M.pearson(gold, pred), "spearman": M.spearman(gold, pred),
                    "mse": float(((gold - pred) ** 2).mean()), "n": len(gold)}
        if self.kind == "multilabel":
            gold = np.array([f.labels for f in feats]) > 0.5
            pred = logits > 0
            tp = (gold & pred).sum(0)
            fp, fn = (~gold & pred).sum(0), (gold & ~pred).sum(0)
            f1s = [M.prf(tp[k], fp[k], fn[k])[2] for k in range(gold.shape[1])]
            return {"f1_micro": M.prf(tp.sum(), fp.sum(), fn.sum())[2], "f1_macro": float(np.mean(f1s)),
                    "exact_match": float((gold == pred).all(1).mean()), "n": len(gold)}
        gold = [f.labels for f in feats]
        rep = M.classification_report(gold, logits.argmax(-1).tolist(), self.labels.labels)
        rep["n"] = len(gold)
        return rep

    @property
    def main_metric(self) -> str:
        return {"regress": "pearson", "multilabel": "f1_micro"}.get(self.kind, "accuracy")

    def write_predictions(self, path: Path, examples: list[TextExample], feats, logits: np.ndarray) -> Path:
        return write_jsonl(path, (self._record(e, p, row) for e, p, row in zip(examples, self.decode(logits), logits)))

    def _record(self, e: TextExample, prediction, row: np.ndarray) -> dict:
        rec = {"text": e.text, "prediction": prediction}
        if e.text_pair is not None:
            rec["text_pair"] = e.text_pair
        if e.label is not None:
            rec["label"] = e.label
        if self.kind in ("classify", "pair"):
            probs = class_scores(row, "softmax").tolist()
            rec["probabilities"] = {self.labels.name(j): round(p, 6) for j, p in enumerate(probs)}
        return rec

    def artifacts(self, out_dir: Path, split: str, report: dict) -> list[Path]:
        """Confusion-matrix PNG for classification (matplotlib Agg), when matplotlib is installed."""
        if "confusion_matrix" not in report:
            return []
        try:
            return [plots.plot_confusion(report["confusion_matrix"], self.labels.labels,
                                         out_dir / f"confusion_{split}.png", f"{split} confusion matrix")]
        except ImportError:
            return []
