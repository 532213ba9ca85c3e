"""Every fine-tuning task by name: `--task NAME`, and the `kind` saved with a fine-tuned model.

Each name points at a class meeting `tasks.task.Task` (one serving several names, SequenceTask, reads its name from
`kind`). Names only, so the CLI offers them without importing torch; a task's module is imported when a run asks.
"""

from __future__ import annotations

import importlib
from dataclasses import fields

from bertkit.errors import ConfigError
from bertkit.tasks.task import Task

__all__ = ["TASKS", "ALIASES", "make_task", "task_class", "default"]

TASKS = {"classify": "bertkit.tasks.classify.SequenceTask", "pair": "bertkit.tasks.classify.SequenceTask",
         "regress": "bertkit.tasks.classify.SequenceTask", "multilabel": "bertkit.tasks.classify.SequenceTask",
         "tag": "bertkit.tasks.tag.TokenTask", "qa": "bertkit.tasks.qa.QATask"}
# sentence-transformers' name for a pair classifier that reranks: the same task, saved as "pair"
ALIASES = {"cross-encoder": "pair"}


def task_class(kind: str) -> type[Task]:
    if kind not in TASKS:
        raise ConfigError(f"unknown task {kind!r}; choose one of {', '.join(TASKS)}")
    module, _, name = TASKS[kind].rpartition(".")
    return getattr(importlib.import_module(module), name)


def make_task(kind: str, settings: dict | None = None) -> Task:
    """The task registered as `kind`, from settings (a saved model's, or a run's); missing ones keep their default."""
    return task_class(kind).create({**(settings or {}), "kind": kind})


def default(kind: str, name: str):
    """The default of a task's setting, e.g. default("qa", "max_length") == 384."""
    return next(f.default for f in fields(task_class(kind)) if f.name == name)
