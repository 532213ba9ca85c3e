"""`bertkit quantize`: an int8 model directory that every loader reads, gated on a dev file (exit 2 on a drop)."""

from __future__ import annotations

import json

import pytest
import torch
from test_tasks_finetune import NEG, POS, WORDS, one_thread, tiny_dir  # noqa: F401  (the same synthetic data)
from test_tasks_finetune import _cfg, _qa_examples, _tag_sentences
from test_tasks_finetune import _sentiment_rows as _rows

from bertkit.cli import main
from bertkit.runtime import int8

pytestmark = pytest.mark.skipif(not int8.int8_kernel_ok(), reason="no int8 linear kernel in this PyTorch build")

@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    """A 2-layer sentiment classifier fine-tuned by bertkit, and its dev file."""
    from bertkit.config import BertConfig
    from bertkit.model import BertModel
    from bertkit.tasks.readers import write_table
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    from bertkit.tokenizer import Tokenizer
    d = tmp_path_factory.mktemp("q")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS + POS + NEG))
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(
        d / "base", tokenizer=Tokenizer.from_pretrained(d / "vocab.txt"))
    train, dev = (str(write_table(d / f"{n}.csv", _rows(k, s))) for n, k, s in (("train", 320, 0), ("dev", 96, 1)))
    finetune(FinetuneConfig(task="classify", model=str(d / "base"), train=train, dev=dev, out=str(d / "run"),
                            batch_size=16, quiet=True,
                            training=finetune_recipe(lr=3e-3, epochs=6, warmup=0.1, precision="fp32")))
    return d / "run", dev


def test_quantize_check_writes_int8_that_inference_loads(finetuned, tmp_path, capsys):
    from bertkit.tasks.runner import evaluate
    run, dev = finetuned
    out = tmp_path / "int8"
    assert main(["quantize", str(run), str(out), "--check", dev, "--max-drop", "1.0", "--precision", "fp32",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["method"] == "bertkit-int8" and qc["check"]["fp32"] >= 90.0
    assert qc["check"]["drop_points"] <= 1.0 and report["check"] == qc["check"]
    assert qc["size_bytes"]["int8"] == (out / "model.safetensors").stat().st_size
    assert (out / "vocab.txt").is_file() and cfg["bertkit_task"]["kind"] == "classify"
    assert (run / "metrics.json").is_file() and not (out / "metrics.json").exists()      # the fp32 run's figures
    assert not list(out.glob("predictions_*")) and not (out / "summary.json").exists()
    # `bertkit evaluate` (load_task -> from_pretrained -> runtime.freeze) reads the int8 directory as it is
    rep = evaluate(out, dev, precision="fp32")
    assert 100 * rep["accuracy"] == pytest.approx(qc["check"]["int8"], abs=1e-3)
    with pytest.raises(Exception, match="already quantized"):
        from bertkit.quantize import quantize_dir
        quantize_dir(out, tmp_path / "again")


def test_a_failed_gate_keeps_the_earlier_int8_model(finetuned, tmp_path, monkeypatch, capsys):
    """--overwrite replaces an earlier int8 model only when the new one is written: a gate that refuses leaves the
    earlier directory as it was."""
    import bertkit.quantize as q
    run, dev = finetuned
    out = tmp_path / "int8"
    assert main(["quantize", str(run), str(out)]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}

    def refuse(*a, **k):
        raise q.QualityGateError(f"{dev}: int8 accuracy 80.00 is 20.00 points below fp32 100.00")
    monkeypatch.setattr(q, "gate", refuse)
    assert main(["quantize", str(run), str(out), "--check", dev, "--overwrite"]) == 2
    assert "points below fp32" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()} == before
    monkeypatch.undo()
    assert main(["quantize", str(run), str(out), "--check", dev, "--overwrite"]) == 0   # a passing gate replaces it
    assert "check" in json.loads((out / "config.json").read_text())["quantization_config"]


def test_the_fp32_runs_marker_is_not_copied(finetuned, tmp_path, capsys):
    """A run directory `bertkit finetune` wrote carries its marker: copied, the int8 directory would be a finetune
    run that `quantize --overwrite` refuses to replace."""
    import shutil
    from bertkit.commands.checks import MARKER
    run, _ = finetuned
    src = tmp_path / "run"
    shutil.copytree(run, src)
    (src / MARKER).write_text(json.dumps({"command": "finetune", "keep": []}))
    out = tmp_path / "int8"
    assert main(["quantize", str(src), str(out)]) == 0
    assert json.loads((out / MARKER).read_text())["command"] == "quantize"
    assert main(["quantize", str(src), str(out), "--overwrite"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("kind", ["tag", "qa"])
def test_check_scores_tag_and_qa_in_points(kind, tiny_dir, tmp_path, capsys):  # noqa: F811
    """The gate reads entity F1 (a fraction, reported x100) for tag and SQuAD F1 (already percent) for qa, with
    precision / recall and EM beside them: each figure is what `bertkit evaluate` reports for that directory."""
    from bertkit.tasks.readers import write_conll, write_squad
    from bertkit.tasks.runner import evaluate, finetune
    if kind == "tag":
        train = str(write_conll(tmp_path / "train.conll", _tag_sentences(300, 0)))
        dev = str(write_conll(tmp_path / "dev.conll", _tag_sentences(60, 1)))
        finetune(_cfg(tiny_dir, tmp_path, "tag", train, dev, max_length=16))
        scale, also = 100.0, ("precision", "recall")
    else:
        train = str(write_squad(tmp_path / "train.json", _qa_examples(300, 0), "1.1"))
        dev = str(write_squad(tmp_path / "dev.json", _qa_examples(60, 1), "1.1"))
        finetune(_cfg(tiny_dir, tmp_path, "qa", train, dev, max_length=48, doc_stride=16, epochs=4))
        scale, also = 1.0, ("exact",)
    run, out = tmp_path / "run", tmp_path / "int8"
    assert main(["quantize", str(run), str(out), "--check", dev, "--max-drop", "100", "--precision", "fp32",
                 "--json"]) == 0
    c = json.loads(capsys.readouterr().out)["check"]
    fp, q = evaluate(run, dev, precision="fp32"), evaluate(out, dev, precision="fp32")
    assert c["metric"] == "f1" and c["fp32"] >= 60.0 and set(c["also"]) == set(also)
    for k, got in (("f1", c), *((k, c["also"][k]) for k in also)):
        assert got["fp32"] == pytest.approx(scale * fp[k], abs=1e-3), k
        assert got["int8"] == pytest.approx(scale * q[k], abs=1e-3), k


def test_quality_gate_refuses_with_exit_2(finetuned, tmp_path, capsys, monkeypatch):
    """A broken quantizer (every weight rounds to 0) loses accuracy: the gate scores both, names both, writes
    nothing."""
    run, dev = finetuned

    monkeypatch.setattr(int8, "quantize_rows", lambda w: (torch.zeros_like(w, dtype=torch.int8), w.new_ones(len(w))))
    out = tmp_path / "int8"
    assert main(["quantize", str(run), str(out), "--check", dev, "--max-drop", "0.5", "--precision", "fp32"]) == 2
    err = capsys.readouterr().err
    assert "points below fp32" in err and "int8 accuracy" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())


def test_quantize_refuses_existing_output_and_says_where_float_is_faster(finetuned, tmp_path, capsys, monkeypatch):
    from bertkit import runtime
    run, _ = finetuned
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    assert main(["quantize", str(run), str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "full" / "x").read_text() == "keep"
    # int8 slower than the fastest float path here: written all the same (its size), one line with both figures
    slow = runtime.RuntimePlan(runtime.plan(force="none").options,
                               reasons={"int8_linear": "9.00 ms vs bf16 float 3.00 ms"})
    monkeypatch.setattr(runtime, "plan", lambda *a, **k: slow)
    assert main(["quantize", str(run), str(tmp_path / "new")]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("int8 is not faster than float") and "9.00 ms vs bf16 float 3.00 ms" in line, line
    assert (tmp_path / "new" / "model.safetensors").is_file()


def test_quantize_keeps_a_sentence_transformers_pipeline(tmp_path):
    """An embedding model's directory keeps its pooling, dense and normalize folders: the int8 copy embeds as the
    fp32 one does ([CLS] pooling and the projection included), not with a guessed mean pooling."""
    import numpy as np
    from bertkit.config import BertConfig
    from bertkit.embed.pooling import Dense, Pooling, SentenceEncoder
    from bertkit.embed.st_format import load_sentence_encoder, save_sentence_encoder
    from bertkit.model import BertModel
    from bertkit.quantize import quantize_dir
    from bertkit.tokenizer import Tokenizer
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS + POS + NEG))
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=128, max_position_embeddings=64))
    enc = SentenceEncoder(bert, Pooling("cls"), normalize=True, dense=Dense(64, 16, activation="tanh"),
                          max_seq_length=64)
    tok = Tokenizer({t: i for i, t in enumerate(vocab)})
    save_sentence_encoder(enc, tok, tmp_path / "st")
    quantize_dir(tmp_path / "st", tmp_path / "int8", force=True)
    assert (tmp_path / "int8" / "2_Dense" / "model.safetensors").is_file()
    q, _ = load_sentence_encoder(tmp_path / "int8")
    assert q.pooling.modes == ("cls",) and len(q.dense) == 1 and q.normalize
    assert any(isinstance(m, int8.Int8Linear) for m in q.bert.modules())
    texts = [" ".join(WORDS[i:i + 6]) for i in range(0, 30, 3)]
    a, b = load_sentence_encoder(tmp_path / "st")[0].encode(tok, texts), q.encode(tok, texts)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.98


@pytest.mark.parametrize("pattern,message", [("Classifier", "matches no linear layer"),
                                             ("", "matches no linear layer"),
                                             ("*", "nothing would be quantized")])
def test_keep_float_patterns_that_match_nothing_or_everything_are_refused(finetuned, tmp_path, capsys, pattern,
                                                                           message):
    run, _ = finetuned
    assert main(["quantize", str(run), str(tmp_path / "out"), "--keep-float", pattern]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_speed_line_says_how_int8_runs_here(monkeypatch):
    """`quantize`'s one line on speed follows the plan: float where int8 lost, bf16 with the int8 GEMMs on short
    inputs where they won only there, int8 on bf16 activations where they won everywhere."""
    from bertkit import quantize, runtime
    opts = runtime.plan(force="none").options
    why = {"int8_linear": "2 ms vs fp32 6 ms"}
    cases = [(runtime.RuntimePlan(opts, reasons=why), "not faster than float"),
             (runtime.RuntimePlan(opts, int8_engine="onednn", reasons=why,
                                  int8_under_bf16=((384, True, 64),)), "bf16 activations under 64 tokens"),
             (runtime.RuntimePlan(opts, int8_engine="onednn", reasons=why,
                                  int8_under_bf16=((384, True, int8.BF16_KERNEL_ALWAYS),)), "under auto or bf16 on bf16")]
    for plan, words in cases:
        monkeypatch.setattr(runtime, "plan", lambda device="cpu", plan=plan: plan)
        assert words in quantize.speed_here(384)["line"], plan
    # each width follows the probe nearest it: the bf16-activation kernel at base width, bf16 GEMMs at MiniLM's
    plan = runtime.RuntimePlan(opts, int8_engine="onednn", reasons=why,
                               int8_under_bf16=((384, True, 0), (768, True, int8.BF16_KERNEL_ALWAYS)))
    monkeypatch.setattr(runtime, "plan", lambda device="cpu": plan)
    assert "not bf16" in quantize.speed_here(384)["line"] and "not bf16" in quantize.speed_here(256)["line"]
    assert "on bf16 activations" in quantize.speed_here(768)["line"]
    assert "on bf16 activations" in quantize.speed_here(1024)["line"]
