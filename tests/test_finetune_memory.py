"""`bertkit.finetune` on in-memory examples (a list of dicts, a datasets.Dataset) trains exactly as on the same
examples in a file."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from bertkit.errors import DataError
from test_tasks_finetune import (_cfg, _qa_examples, _sentiment_rows, _tag_sentences, _write_csv,  # noqa: F401
                                 one_thread, tiny_dir)


def _same_run(a, b) -> None:
    for split in ("dev", "test"):
        assert a.get(split) == b.get(split)
    counts = [{k: v for k, v in r["data"].items() if k != "featurize_s" and not k.startswith("test")} for r in (a, b)]
    assert counts[0] == counts[1]


def _finetune(tiny_dir, tmp_path, name, task, train, dev, **kw):
    from bertkit.tasks.runner import finetune
    return finetune(_cfg(tiny_dir, tmp_path / name, task, train, dev, epochs=1, save_model=False, **kw))


def test_classify_from_dicts_equals_from_files(tiny_dir, tmp_path):
    train, dev = _sentiment_rows(64, 0), _sentiment_rows(32, 1)
    files = _finetune(tiny_dir, tmp_path, "file", "classify", _write_csv(tmp_path / "train.csv", train),
                      _write_csv(tmp_path / "dev.csv", dev))
    mem = _finetune(tiny_dir, tmp_path, "mem", "classify", train, dev, test=dev)
    _same_run(files, {**mem, "test": None})
    assert mem["test"] == mem["dev"]
    assert mem["config"]["train"].endswith("data/train.jsonl")       # what the run read, in its output directory


def test_tag_and_qa_from_dicts_equal_from_files(tiny_dir, tmp_path):
    from bertkit.tasks.readers import write_conll
    train, dev = _tag_sentences(40, 0), _tag_sentences(12, 1)
    files = _finetune(tiny_dir, tmp_path, "tag-file", "tag", str(write_conll(tmp_path / "t.conll", train)),
                      str(write_conll(tmp_path / "d.conll", dev)))
    rows = [[{"tokens": s.words, "tags": s.tags} for s in part] for part in (train, dev)]
    mem = _finetune(tiny_dir, tmp_path, "tag-mem", "tag", *rows)
    assert files["dev"] == mem["dev"]

    def squad(examples):        # the Hugging Face squad rows: answers as columns
        return [{"id": e.id, "question": e.question, "context": e.context,
                 "answers": {"text": [t for t, _ in e.answers], "answer_start": [s for _, s in e.answers]}}
                for e in examples]
    train, dev = _qa_examples(24, 0), _qa_examples(8, 1)
    path = tmp_path / "qa.json"
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "", "paragraphs": [
        {"context": r["context"], "qas": [{"id": r["id"], "question": r["question"], "answers": [
            {"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]}]}
        for r in squad(train)]}]}))
    files = _finetune(tiny_dir, tmp_path, "qa-file", "qa", str(path), squad(dev))
    mem = _finetune(tiny_dir, tmp_path, "qa-mem", "qa", squad(train), squad(dev))
    assert files["dev"] == mem["dev"]


def test_a_datasets_dataset(tiny_dir, tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is not installed (an optional input type)")
    train, dev = _sentiment_rows(64, 0), _sentiment_rows(32, 1)
    mem = _finetune(tiny_dir, tmp_path, "mem", "classify", train, dev)
    ds = _finetune(tiny_dir, tmp_path, "ds", "classify", datasets.Dataset.from_list(train),
                   datasets.Dataset.from_list(dev))
    _same_run(mem, ds)


def test_not_examples_is_one_line(tiny_dir, tmp_path):
    with pytest.raises(DataError, match="^train: give a file path, a list of dicts or a datasets.Dataset, not int$"):
        _finetune(tiny_dir, tmp_path, "bad", "classify", 42, [{"text": "a", "label": "pos"}])
    with pytest.raises(DataError, match="^dev: no examples$"):
        _finetune(tiny_dir, tmp_path, "bad", "classify", [{"text": "a", "label": "pos"}], [])
