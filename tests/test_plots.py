"""Pictures: each plot writes a real PNG from the data it is given, and bad input gets a bertkit error."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bertkit.errors import DataError

PNG = b"\x89PNG\r\n\x1a\n"


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == PNG and path.stat().st_size > 5000


def test_read_metrics_splits_train_and_eval(tmp_path):
    from bertkit.plots import read_metrics
    f = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "split": "train", "loss": 5.0 / s, "lr": 1e-4} for s in range(1, 6)]
    rows += [{"step": 5, "split": "eval", "loss": 1.5, "mlm_accuracy": 0.4}, {"step": 5, "note": "text", "ok": True}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    s = read_metrics(tmp_path)
    assert s["train/loss"] == [(float(i), 5.0 / i) for i in range(1, 6)]
    assert s["eval/loss"] == [(5.0, 1.5)] and s["eval/mlm_accuracy"] == [(5.0, 0.4)]
    assert "ok" not in s and "note" not in s


def test_plot_run_writes_png(tmp_path):
    from bertkit.plots import plot_run
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(1, 50):
            f.write(json.dumps({"step": s, "train/loss": 8 * 0.95 ** s, "eval/accuracy": 1 - 0.9 * 0.97 ** s}) + "\n")
    out = plot_run(run, tmp_path / "curves.png")
    assert _is_png(out)


def test_plot_run_errors(tmp_path):
    from bertkit.plots import plot_run
    with pytest.raises(DataError, match="no metrics.jsonl"):
        plot_run(tmp_path, tmp_path / "x.png")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "lr": 0.1}\n')
    with pytest.raises(DataError, match="no finite loss or accuracy"):
        plot_run(tmp_path, tmp_path / "x.png")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.1}\nnot json\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:2"):
        plot_run(tmp_path, tmp_path / "x.png")


def test_attention_pictures(tmp_path):
    from bertkit.plots import plot_attention, plot_attention_from
    rng = np.random.default_rng(0)
    tokens = ["[CLS]", "bert", "saw", "ernie", "since", "he", "knew", ".", "[SEP]"]
    att = []
    for _ in range(3):
        a = rng.random((4, len(tokens), len(tokens)))
        att.append(a / a.sum(-1, keepdims=True))
    assert _is_png(plot_attention(att, tokens, tmp_path / "grid.png"))
    assert _is_png(plot_attention_from(att, tokens, "he", tmp_path / "he.png"))
    with pytest.raises(ValueError, match="not among"):
        plot_attention_from(att, tokens, "she", tmp_path / "she.png")
    with pytest.raises(ValueError, match="tokens"):
        plot_attention(att, tokens[:-1], tmp_path / "bad.png")


def test_confusion(tmp_path):
    from bertkit.plots import plot_confusion
    from bertkit.tasks.metrics import confusion_matrix
    m = confusion_matrix([0, 0, 1, 1, 2], [0, 1, 1, 1, 0], 3)
    assert m.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    assert _is_png(plot_confusion(m, ["neg", "neu", "pos"], tmp_path / "cm.png"))
    with pytest.raises(ValueError):
        plot_confusion(m, ["a", "b"], tmp_path / "bad.png")


def test_cli_plot(tmp_path):
    from bertkit.cli import main
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 1 / i}) + "\n" for i in range(1, 9)))
    assert main(["plot", str(tmp_path)]) == 0
    assert _is_png(tmp_path / "curves.png")
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"label": "pos", "prediction": "pos"}\n{"label": "neg", "prediction": "pos"}\n')
    assert main(["plot", str(preds), "--confusion"]) == 0
    assert _is_png(tmp_path / "preds.confusion.png")
    preds.write_text('{"label": "pos"}\n')
    assert main(["plot", str(preds), "--confusion"]) == 2


def test_non_finite_values_are_gaps(tmp_path):
    """A diverged step's NaN / Infinity loss breaks the curve there; a field with no finite value is no curve."""
    from bertkit.plots import read_metrics
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 3, "lr": NaN}\n{"step": 2, "loss": NaN}\n'
                                            '{"step": Infinity, "loss": Infinity}\n{"step": 4, "loss": 1}\n')
    s = read_metrics(tmp_path)
    assert "lr" not in s and [x for x, _ in s["loss"]] == [1.0, 2.0, 3.0, 4.0]
    assert [y for _, y in s["loss"]][::3] == [3.0, 1.0] and all(math.isnan(y) for _, y in s["loss"][1:3])
