"""One precision rule for every front door: the same model and input give the same numbers from `bertkit predict`,
`bertkit embed`, `serve`, `pipeline()` and `Predictor` (fp32 by default, whatever the CPU), and a bf16 choice is said.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("fastapi")
from test_serve import _request  # noqa: E402
from test_serve_models import _save, _serve  # noqa: E402

import bertkit  # noqa: E402
from bertkit.cli import main as cli  # noqa: E402
from bertkit.infer import Predictor  # noqa: E402

TEXTS = ["the cat sat on the mat .", "a dog", "who sat on the cat ?", "the mat . the dog . the cat sat on a mat ."]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    root = tmp_path_factory.mktemp("precision-rule")
    model = _save(root / "cls", "BertForSequenceClassification", id2label={0: "neg", 1: "pos"})
    config = json.loads((model / "config.json").read_text())
    config["bertkit_task"] = {"kind": "classify", "max_length": 64}      # as `bertkit finetune` writes it
    (model / "config.json").write_text(json.dumps(config))
    data = root / "texts.csv"
    data.write_text("text\n" + "".join(f'"{t}"\n' for t in TEXTS))
    return model, data


def test_every_front_door_gives_the_same_class_scores(classifier, tmp_path, capsys):
    model, data = classifier
    pred = Predictor.load(model)
    assert pred.precision == "fp32"
    ours = np.array([[r["scores"]["neg"], r["scores"]["pos"]] for r in pred.classify(TEXTS)])

    pipe = bertkit.pipeline("text-classification", str(model), top_k=None)
    piped = np.array([[{d["label"]: d["score"] for d in row}[k] for k in ("neg", "pos")] for row in pipe(TEXTS)])

    assert cli(["predict", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    cmd = np.array([[r["probabilities"]["neg"], r["probabilities"]["pos"]] for r in rows])
    assert "bf16" not in capsys.readouterr().err

    srv = _serve(pred)
    try:
        status, served = _request(srv.port, "POST", "/predict", {"inputs": TEXTS})
        _, info = _request(srv.port, "GET", "/info")
    finally:
        srv.stop()
    assert status == 200 and info["precision"] == "fp32"
    http = np.array([[{d["label"]: d["score"] for d in row}[k] for k in ("neg", "pos")] for row in served])
    for other in (piped, cmd, http):
        assert np.abs(other - ours).max() < 2e-6, other - ours      # the front doors round to 6 digits


def test_every_front_door_gives_the_same_embeddings(classifier, capsys):
    model, _ = classifier
    pred = Predictor.load(model)
    ours = pred.embed(TEXTS, normalize=True)             # as `bertkit embed` and /embed give them
    assert cli(["embed", str(model), *TEXTS]) == 0
    out = capsys.readouterr()
    cmd = np.array([json.loads(line)["embedding"] for line in out.out.splitlines()])
    assert "bf16" not in out.err
    srv = _serve(pred)
    try:
        status, served = _request(srv.port, "POST", "/embed", {"inputs": TEXTS})
    finally:
        srv.stop()
    assert status == 200
    for other in (cmd, np.array(served)):
        assert np.abs(other - ours).max() < 2e-6


def test_a_bf16_choice_is_said(classifier, capsys):
    from bertkit.precision import resolve
    model, _ = classifier
    assert cli(["embed", str(model), "--precision", "auto", *TEXTS[:1]]) == 0
    said = "bf16 autocast" in capsys.readouterr().err
    assert said == (resolve("auto") == "bf16")          # only where auto means bf16 on this machine
    assert Predictor.load(model, precision="auto").precision == "auto"


def test_every_front_door_names_unnamed_labels_as_transformers(tmp_path, capsys):
    """A classifier whose config names no labels: LABEL_i from every front door, as transformers names them."""
    model = _save(tmp_path / "cls", "BertForSequenceClassification")
    names = {"LABEL_0", "LABEL_1"}
    assert set(Predictor.load(model).classify(TEXTS[:1])[0]["scores"]) == names
    assert {d["label"] for d in bertkit.pipeline("text-classification", str(model), top_k=None)(TEXTS[:1])[0]} == names
    srv = _serve(Predictor.load(model))
    try:
        _, served = _request(srv.port, "POST", "/predict", {"inputs": TEXTS[:1]})
        _, info = _request(srv.port, "GET", "/info")
    finally:
        srv.stop()
    assert {d["label"] for d in served[0]} == names and set(info["labels"]) == names
