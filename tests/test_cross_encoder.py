"""sentence-transformers CrossEncoder directories (the layouts of versions 5 and 6) score as `CrossEncoder.predict`
at every front door (`bertkit rerank`, `search --rerank`'s scorer, serve's /rerank, `bertkit.rerank`), and a
cross-encoder bertkit fine-tunes loads in CrossEncoder with the same scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

st = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")

WORDS = "the a man woman child cat dog city river is was eats eating sat ran plays on in of bread music film".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
QUERY = "a man is eating"
DOCS = ["the man eats bread", "a cat sat on the river", "the woman plays music in the city",
        "a dog ran", "the child is eating bread of the city"]


def _hf_classifier(path, num_labels: int, id2label: dict | None = None):
    """A random tiny transformers BertForSequenceClassification (weights large enough for the scores to differ)."""
    import torch
    torch.manual_seed(num_labels)
    cfg = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64, num_labels=num_labels,
                                  initializer_range=0.3, **({"id2label": id2label} if id2label else {}))
    path.mkdir(parents=True)
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    transformers.BertForSequenceClassification(cfg).save_pretrained(path)
    transformers.BertTokenizerFast(str(path / "vocab.txt")).save_pretrained(path)
    return path


def _v6(root, name: str, num_labels: int, **kw):
    """A directory as sentence-transformers 6 saves a CrossEncoder (modules.json, config_sentence_transformers.json
    with the activation)."""
    ce = st.CrossEncoder(str(_hf_classifier(root / f"{name}-base", num_labels, kw.pop("id2label", None))), **kw)
    ce.save(str(root / name))
    return root / name


def _v5(root, name: str, num_labels: int, activation: str):
    """A directory as sentence-transformers 5 saves a CrossEncoder: the HF files, the activation in config.json."""
    path = _hf_classifier(root / name, num_labels)
    cfg = json.loads((path / "config.json").read_text())
    cfg["sentence_transformers"] = {"activation_fn": activation, "version": "5.1.2"}
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def cross_encoders(tmp_path_factory):
    import torch
    root = tmp_path_factory.mktemp("cross-encoders")
    nli = {0: "contradiction", 1: "entailment", 2: "neutral"}            # the relevant label is the middle one
    return {"v6 one label, Sigmoid": _v6(root, "one", 1),
            "v6 three labels": _v6(root, "three", 3, id2label=nli),
            "v6 one label, Tanh": _v6(root, "tanh", 1, activation_fn=torch.nn.Tanh(), max_length=12),
            "v5 one label, Sigmoid": _v5(root, "v5-one", 1, "torch.nn.modules.activation.Sigmoid"),
            "v5 two labels, Sigmoid": _v5(root, "v5-two", 2, "torch.nn.modules.activation.Sigmoid")}


def _predict(path, docs=DOCS) -> np.ndarray:
    """CrossEncoder.predict's score of each (QUERY, doc): its output, or the relevant label's column of it (raw
    logits of several labels softmaxed)."""
    ce = st.CrossEncoder(str(path))
    scores = ce.predict([(QUERY, d) for d in docs], apply_softmax=isinstance(ce.activation_fn, torch.nn.Identity))
    column = {3: 1}.get(scores.shape[-1], -1) if scores.ndim == 2 else None     # entailment, else the last label
    return scores if column is None else scores[:, column]


def _by_index(ranks: list[dict]) -> np.ndarray:
    return np.array([r["score"] for r in sorted(ranks, key=lambda r: r["index"])])


@pytest.mark.parametrize("name", ["v6 one label, Sigmoid", "v6 three labels", "v6 one label, Tanh",
                                  "v5 one label, Sigmoid", "v5 two labels, Sigmoid"])
def test_every_front_door_scores_as_cross_encoder_predict(cross_encoders, name, tmp_path, capsys):
    from bertkit.cli import main
    from bertkit.infer import Predictor
    from bertkit.rerank import rerank
    from test_serve import _request
    from bertkit.serve import ServeConfig, ServerThread, absent_routes, make_app, model_endpoints, model_info
    path = cross_encoders[name]
    ref = _predict(path)
    assert np.ptp(ref) > 1e-3                                           # the documents' scores differ
    ranks = rerank(str(path), QUERY, DOCS)
    assert np.abs(_by_index(ranks) - ref).max() < 1e-5
    assert [r["index"] for r in ranks] == sorted(range(len(DOCS)), key=lambda i: -ref[i])
    (tmp_path / "docs.txt").write_text("\n".join(DOCS) + "\n")
    assert main(["rerank", str(path), "--query", QUERY, "--file", str(tmp_path / "docs.txt")]) == 0
    assert np.abs(_by_index(json.loads(capsys.readouterr().out)["results"]) - ref).max() < 1e-5
    pred = Predictor.load(path)
    config = ServeConfig(port=0)
    app = make_app(model_endpoints(pred, config), config, model_name=pred.name, info=model_info(pred, config),
                   absent=absent_routes(pred))
    with ServerThread(app, config).start() as srv:
        status, res = _request(srv.port, "POST", "/rerank", {"query": QUERY, "texts": DOCS, "truncate": True})
        assert status == 200 and np.abs(_by_index(res) - ref).max() < 1e-5
        status, info = _request(srv.port, "GET", "/info")                # serve loads the directory whole
        assert status == 200 and info["task"] == "classify"


def test_the_saved_max_length_cuts_the_pairs(cross_encoders):
    from bertkit.rerank import CrossEncoder
    long = ["the man is eating bread in the city of the river and the dog ran"]     # over the saved 12 pieces
    ce = CrossEncoder.load(cross_encoders["v6 one label, Tanh"])
    assert ce.max_length == 12 and abs(ce.score(QUERY, long)[0] - _predict(cross_encoders["v6 one label, Tanh"],
                                                                            long)[0]) < 1e-5


def _pairs_file(path, regress: bool):
    import random
    rng = random.Random(0)
    rows = ["text,text_pair,label"]
    for i in range(24):
        doc = " ".join(rng.choices(WORDS, k=6))
        rows.append(f"{' '.join(rng.choices(WORDS, k=3))},{doc},{rng.random() if regress else i % 2}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


@pytest.mark.parametrize("task", ["cross-encoder", "regress"])      # cross-encoder: the pair task's other name
def test_a_bertkit_cross_encoder_loads_in_cross_encoder_with_equal_scores(tmp_path, task, capsys):
    from bertkit.cli import main
    from bertkit.rerank import rerank
    base = _hf_classifier(tmp_path / "base", 1 if task == "regress" else 2)
    data = _pairs_file(tmp_path / "train.csv", task == "regress")
    assert main(["finetune", "--task", task, "--model", str(base), "--train", data, "--dev", data,
                 "--out", str(tmp_path / "m"), "--epochs", "1", "--fp32", "--quiet"]) == 0
    capsys.readouterr()
    ref = _predict(tmp_path / "m")
    assert np.ptp(ref) > 1e-3 and np.abs(_by_index(rerank(str(tmp_path / "m"), QUERY, DOCS)) - ref).max() < 1e-5
    model = st.CrossEncoder(str(tmp_path / "m"))
    assert type(model.activation_fn).__name__ == "Identity"        # a regression value is not squashed
