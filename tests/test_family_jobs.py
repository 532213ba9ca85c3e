"""Every job on every encoder family, from transformers-saved directories of tiny random models with the family's own
kind of tokenizer.json: predict / evaluate of a fine-tuned model, fill-mask, embed, rerank, attention maps, quantize
with its gate, ONNX export (checked with onnxruntime), distill (a student of the same family), prepare + continued
pre-training from the family's MLM checkpoint, and serve's TEI / OpenAI / fill-mask / predict routes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertkit.cli import main
from bertkit.families import FAMILIES

from test_family_journeys import FAMILY_TYPES, family_dir, family_tokenizer, _jsonl, _rows  # noqa: F401

CORPUS = "the film was great and the plot was boring but the music was lovely at the end of the show\n" * 24


@pytest.fixture(scope="module", params=FAMILY_TYPES)
def family(request, tmp_path_factory):
    """The family's directories: a fine-tuned classifier (by bertkit), its MLM and bare encoder, and data."""
    root = tmp_path_factory.mktemp(request.param)
    dirs = {"clf": family_dir(root / "clf", request.param), "mlm": family_dir(root / "mlm", request.param,
                                                                                 head="ForMaskedLM"),
            "enc": family_dir(root / "enc", request.param, head="Model"),
            "train": _jsonl(root / "train.jsonl", _rows(64, 0)), "dev": _jsonl(root / "dev.jsonl", _rows(16, 1))}
    (root / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    dirs["corpus"] = root / "corpus.txt"
    assert main(["finetune", "--task", "classify", "--model", str(dirs["clf"]), "--train", str(dirs["train"]),
                 "--dev", str(dirs["dev"]), "--out", str(root / "ft"), "--epochs", "1", "--no-progress"]) == 0
    dirs["ft"] = next(p.parent for p in (root / "ft").rglob("model.safetensors"))
    return request.param, dirs


def _ok(capsys, *argv) -> str:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    return out.out


def test_predict_evaluate_and_quantize_with_its_gate(family, tmp_path, capsys):
    _, d = family
    _ok(capsys, "predict", "--model", d["ft"], "--data", d["dev"], "--out", tmp_path / "pred.jsonl")
    assert len((tmp_path / "pred.jsonl").read_text().splitlines()) == 16
    _ok(capsys, "evaluate", "--model", d["ft"], "--data", d["dev"])
    report = json.loads(_ok(capsys, "quantize", d["ft"], tmp_path / "q", "--check", d["dev"], "--json"))
    assert report["int8_layers"] > 0 and "check" in report
    _ok(capsys, "evaluate", "--model", tmp_path / "q", "--data", d["dev"])


def test_fill_mask_embed_rerank_and_attention(family, tmp_path, capsys):
    model_type, d = family
    from bertkit.tokenizer import Tokenizer
    mask = Tokenizer.from_pretrained(d["mlm"]).mask_token
    fills = json.loads(_ok(capsys, "fill-mask", "--model", d["mlm"], f"the film was {mask} and great", "--json"))
    special = {"<s>", "</s>", "<pad>", "<mask>", "<unk>", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]"}
    assert fills["candidates"] and not any(set(c["pieces"]) & special for c in fills["candidates"])
    assert all(mask not in c["sequence"] and "Ġ" not in c["sequence"] for c in fills["candidates"])
    vec = json.loads(_ok(capsys, "embed", d["enc"], "the film was great"))["embedding"]
    assert len(vec) == 32 and np.isfinite(vec).all()
    (tmp_path / "docs.txt").write_text("a boring plot\nthe music was lovely\n", encoding="utf-8")
    ranked = _ok(capsys, "rerank", d["clf"], "--query", "film", "--file", tmp_path / "docs.txt")
    assert len(json.loads(ranked)["results"]) == 2
    _ok(capsys, "attention", "--model", d["enc"], "the film was great", "--out", tmp_path / "att.png")
    assert (tmp_path / "att.png").stat().st_size > 0


def test_export_checks_the_graph_with_onnxruntime(family, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    _, d = family
    _ok(capsys, "export", d["ft"], tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").stat().st_size > 0


def test_distill_a_student_of_the_same_family(family, tmp_path, capsys):
    model_type, d = family
    _ok(capsys, "distill", "--teacher", d["ft"], "--train", d["train"], "--dev", d["dev"], "--student-layers", "1",
        "--out", tmp_path / "student", "--epochs", "1")
    config = json.loads(next((tmp_path / "student").rglob("config.json")).read_text())
    assert config["model_type"] == model_type
    # general (masked-LM) distillation reads the family's own vocabulary, whichever file holds it
    _ok(capsys, "distill", "--teacher", d["mlm"], "--text", d["corpus"], "--student-layers", "1",
        "--out", tmp_path / "general", "--epochs", "1", "--batch-size", "8", "--quiet")
    assert json.loads((tmp_path / "general" / "config.json").read_text())["model_type"] == model_type


def test_continued_pretraining_from_the_family_checkpoint(family, tmp_path, capsys):
    model_type, d = family
    _ok(capsys, "prepare", "--corpus", d["corpus"], "--vocab", d["mlm"], "--out", tmp_path / "shards",
        "--seq-len", "32", "--task", "none")
    _ok(capsys, "pretrain", tmp_path / "shards", "--init", d["mlm"], "--out", tmp_path / "pt", "--steps", "3",
        "--batch-size", "2", "--no-progress")
    saved = json.loads(next((tmp_path / "pt").rglob("model/config.json")).read_text())
    assert saved["model_type"] == model_type and saved["architectures"][0].endswith("ForMaskedLM")


def test_serve_routes(family):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from bertkit.infer import Predictor
    from bertkit.serve import ServeConfig, ServerThread, absent_routes, make_app, model_endpoints, model_info
    _, d = family
    for name, route, body in (("enc", "/embed", {"inputs": ["the film", "a plot"]}),
                              ("enc", "/v1/embeddings", {"input": ["the film"], "model": "m"}),
                              ("ft", "/predict", {"inputs": "the film was great"})):
        pred = Predictor.load(d[name])
        config = ServeConfig(port=0)
        app = make_app(model_endpoints(pred, config), config, model_name=pred.name, info=model_info(pred, config),
                       absent=absent_routes(pred))
        srv = ServerThread(app, config).start()
        try:
            resp = httpx.post(f"{srv.url}{route}", json=body, timeout=30)
            assert resp.status_code == 200, resp.text
            if route == "/embed":     # laid out as id rows here: the family's own specials around a text, ids as given
                ids = pred.tokenizer.encode(body["inputs"][0])
                for inputs in (body["inputs"], [ids, body["inputs"][1]]):
                    rows = httpx.post(f"{srv.url}/embed", json={"inputs": inputs, "truncation_direction": "Left"})
                    assert np.abs(np.array(rows.json()) - np.array(resp.json())).max() < 1e-5
        finally:
            srv.stop()


def test_question_answering_windows_follow_the_family_layout(family, tmp_path):
    """RoBERTa's <s> q </s></s> c </s> has 4 specials, BERT's 3: windows fit max_seq_len and start where the context
    starts, and the pipeline's answer is a span of the context."""
    model_type, d = family
    from bertkit import pipeline
    from bertkit.predict.answers import Windows
    from bertkit.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(d["mlm"])
    context = "the film was great and the plot was boring but the music was lovely"
    w = Windows.build(tok, "film", context, 14, 3)
    pieces = tok.encode_pieces(["film", context]).text(1)[0]
    assert all(len(r) <= 14 for r in w.rows)
    assert all(r[w.first:w.first + b - a] == list(pieces[a:b]) for r, (a, b) in zip(w.rows, w.spans))
    transformers = pytest.importorskip("transformers")
    if hasattr(transformers, FAMILIES[model_type].class_prefix + "ForQuestionAnswering"):
        qa = family_dir(tmp_path / "qa", model_type, head="ForQuestionAnswering")
    else:                       # NomicBERT, GTE: transformers has no QA head for them; bertkit's own, fresh
        from bertkit.heads import BertForQuestionAnswering
        qa = tmp_path / "qa"
        BertForQuestionAnswering.from_pretrained(d["enc"]).save_pretrained(qa, tokenizer=tok)
    answer = pipeline("question-answering", model=str(qa))(question="what was great?", context=context)
    assert context[answer["start"]:answer["end"]] == answer["answer"]
