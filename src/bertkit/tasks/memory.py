"""In-memory examples for `bertkit.finetune` (a list of dicts with the file formats' fields, or a `datasets.Dataset`),
written to OUT/data/ in the format the task reads, so every run (and its resume) reads files. A Dataset's ClassLabel
tag ids become their names; qa rows are the Hugging Face squad columns (no answers: unanswerable).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from bertkit.errors import DataError

__all__ = ["materialize"]

SPLITS = ("train", "dev", "test")


def materialize(cfg, task: str):
    """(`cfg` with each in-memory split replaced by the path of its file, {that path: the file's text}); the caller
    writes the files (after a resume compared them with the run's)."""
    changes, files = {}, {}
    for split in SPLITS:
        value = getattr(cfg, split, None)
        if value is None or isinstance(value, (str, Path)):
            continue
        rows, tags = _rows(value, split)
        suffix, text = (".json", _squad(rows, split)) if task == "qa" else \
            (".conll", _conll(rows, split, tags)) if task == "tag" else \
            (".jsonl", "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows))
        path = Path(cfg.out) / "data" / f"{split}{suffix}"
        changes[split], files[path] = str(path), text
    return replace(cfg, **changes), files


def _rows(value, split: str) -> tuple[list[dict], list[str] | None]:
    """(rows as dicts, a Dataset's tag names); a DataError naming the split for anything else."""
    tags = None
    features = getattr(value, "features", None)       # a datasets.Dataset: rows are dicts, tag ids a ClassLabel
    if features is not None:
        column = features.get("ner_tags") or features.get("tags")
        tags = getattr(getattr(column, "feature", None), "names", None)
    try:
        rows = [dict(r) for r in value]
    except (TypeError, ValueError):
        raise DataError(f"{split}: give a file path, a list of dicts or a datasets.Dataset, not "
                        f"{type(value).__name__}") from None
    if not rows:
        raise DataError(f"{split}: no examples")
    return rows, tags


def _conll(rows: list[dict], split: str, names: list[str] | None) -> str:
    lines = []
    for i, r in enumerate(rows):
        tokens, tags = r.get("tokens"), r.get("tags", r.get("ner_tags"))
        if not tokens or tags is None or len(tags) != len(tokens):
            raise DataError(f"{split}: example {i}: wants 'tokens' and as many 'tags' (or 'ner_tags')")
        lines += [f"{t}\t{names[g] if names and isinstance(g, int) else g}" for t, g in zip(tokens, tags)] + [""]
    return "\n".join(lines) + "\n"


def _squad(rows: list[dict], split: str) -> str:
    """SQuAD JSON, one paragraph per example."""
    articles = []
    for i, r in enumerate(rows):
        if not r.get("question") or not r.get("context"):
            raise DataError(f"{split}: example {i}: wants 'question' and 'context'")
        answers = r.get("answers") or []
        if isinstance(answers, dict):                   # the Hugging Face squad columns
            answers = [{"text": t, "answer_start": s} for t, s in zip(answers["text"], answers["answer_start"])]
        qa = {"id": str(r.get("id", i)), "question": r["question"], "answers": answers, "is_impossible": not answers}
        articles.append({"title": r.get("title", ""), "paragraphs": [{"context": r["context"], "qas": [qa]}]})
    return json.dumps({"version": "v2.0", "data": articles}, ensure_ascii=False)
