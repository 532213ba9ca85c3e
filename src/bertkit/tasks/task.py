"""The typed stages of fine-tuning, as google-research/bert names them: example -> features -> batch.

    examples = task.read("train.csv")                  # the task's own example type (TextExample, Sentence, ...)
    feats = task.features(tok, examples)               # list[Feature]: pieces, segments, training targets
    batch = collate(feats, pad_id)                     # tasks.batching: a dict of padded tensors for the head
    raw = task.predict(model, examples, feats, 128, "auto")   # the head's outputs, decoded as far as needed
    report = task.score(examples, feats, raw)          # metrics (the task's `main_metric` picks the best state)

A task meets the `Task` protocol (subclass it for the defaults below); its loss is its head's (`model_class`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from bertkit.tasks.readers import LabelMap, write_jsonl

__all__ = ["Feature", "Task", "write_jsonl"]

_UNSAVED = ("labels", "stats")              # fields that are data, not settings: the label map lives in id2label


@dataclass(kw_only=True)
class Feature:
    """One model input made from an example: word pieces and segments, and the targets training needs (None at
    inference). A long example can make several features (tag and qa windows)."""
    input_ids: list[int]
    token_type_ids: list[int]
    labels: int | float | list | None = None       # a class id, a number, a multi-hot row, or ids per piece
    token_labels: bool = False                     # `labels` holds one id per piece (padded with IGNORE_INDEX)
    start_positions: int | None = None             # qa: the answer's first and last piece in this window
    end_positions: int | None = None
    labelled: bool = True                          # distillation: added texts carry the teacher's targets only
    teacher: object = None                         # distillation: the teacher's logits, computed once


@runtime_checkable
class Task(Protocol):
    """What the fine-tuning runner, evaluate and predict need of a task; nothing else is asked of it."""
    kind: str                                      # its registry name (`--task`), saved with the model
    main_metric: str                               # the dev metric that picks the best state
    model_class: type                              # the head (bertkit.heads): trained, saved, and its loss used
    predictions_suffix: ClassVar[str] = ".jsonl"

    def read(self, path, require_label: bool = True) -> list:
        """Examples of a file; a row the task cannot use is a DataError naming file and line."""

    def features(self, tok, examples: list, with_labels: bool = True) -> list[Feature]:
        ...

    def config_overrides(self) -> dict:
        """The head's config entries: num_labels, and id2label where the task has a label map."""
        out = {"num_labels": self.num_labels}
        if getattr(self, "labels", None) is not None:
            out["id2label"] = dict(enumerate(self.labels.labels))
        return out

    def predict(self, model, examples: list, feats: list[Feature], batch_size: int, precision) -> object:
        """The model's outputs for `feats`, decoded as far as `score` and `write_predictions` need."""

    def score(self, examples: list, feats: list[Feature], raw) -> dict:
        """Metrics of `raw` against the gold labels; numbers, plus whatever `artifacts` draws from."""

    def write_predictions(self, path: Path, examples: list, feats: list[Feature], raw) -> Path:
        ...

    def fit_labels(self, train: list) -> None:
        """The label map, from the training examples (before `features`)."""

    def restore_labels(self, names: list[str]) -> None:
        """The label map of a saved model (its config's id2label)."""
        self.labels = LabelMap(names)

    def tune(self, examples: list, raw) -> dict:
        """Settings chosen on the dev set after an evaluation (e.g. qa's null threshold): {field: value}."""
        return {}

    def artifacts(self, out_dir: Path, split: str, report: dict) -> list[Path]:
        """More output files for a scored split (e.g. a confusion-matrix PNG)."""
        return []

    def config_entries(self) -> dict:
        """More config.json entries saved with the fine-tuned model, read by other libraries."""
        return {}

    def counts(self) -> dict:
        """Entries for the run's data counts (summary.json "data")."""
        stats = getattr(self, "stats", None)
        return {"task_stats": dict(stats)} if stats else {}

    def settings(self) -> dict:
        """What `make_task` needs to rebuild the task: saved in config.json as `bertkit_task`."""
        return {"kind": self.kind, **{f.name: getattr(self, f.name) for f in fields(self)
                                      if f.init and f.name not in _UNSAVED}}

    @classmethod
    def create(cls, settings: dict):
        """The task from settings (`settings()` of a saved model, or a run's configuration)."""
        return cls(**{f.name: settings[f.name] for f in fields(cls) if f.init and f.name in settings})

