"""ONNX export: every head exports with dynamic batch/seq axes and matches PyTorch within 1e-4 on batches of
shapes other than the traced one (padding included); without onnx the error is a clear bertkit error."""

from __future__ import annotations

import builtins

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]


def _save(cls_name, path, **cfg):
    import bertkit
    from bertkit import BertConfig, Tokenizer
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", vocab_size=len(VOCAB), **cfg)
    getattr(bertkit, cls_name)(config).eval().save_pretrained(path, tokenizer=Tokenizer({t: i for i, t in enumerate(VOCAB)}))
    return path


@pytest.mark.parametrize("cls_name, cfg, outputs", [
    ("BertModel", {}, ["last_hidden_state", "pooler_output"]),
    ("BertForMaskedLM", {}, ["logits"]),
    ("BertForSequenceClassification", {"num_labels": 3}, ["logits"]),
    ("BertForTokenClassification", {"num_labels": 5}, ["logits"]),
    ("BertForQuestionAnswering", {}, ["start_logits", "end_logits"]),
])
def test_export_matches_pytorch(tmp_path, cls_name, cfg, outputs):
    import onnx
    from bertkit.export import check_onnx, export_onnx
    d = _save(cls_name, tmp_path / "m", **cfg)
    path = export_onnx(d, tmp_path / "m.onnx")
    graph = onnx.load(str(path)).graph
    assert [o.name for o in graph.output] == outputs
    dims = graph.input[0].type.tensor_type.shape.dim
    assert [x.dim_param for x in dims] == ["batch", "seq"]            # dynamic, not frozen to the traced (2, 16)
    report = check_onnx(d, path)
    assert report["max_abs_diff"] <= 1e-4, report
    assert report["shapes"] == [[1, 7], [3, 33], [8, 64]]


def test_cli_export(tmp_path, capsys):
    from bertkit.cli import main
    d = _save("BertForSequenceClassification", tmp_path / "m", num_labels=2)
    assert main(["export", str(d), str(tmp_path / "out" / "c.onnx")]) == 0
    assert '"max_abs_diff"' in capsys.readouterr().out
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "x.onnx")]) == 2


def test_missing_onnx_is_a_clear_error(tmp_path, monkeypatch):
    from bertkit.errors import BertkitError
    from bertkit.export import export_onnx
    real_import = builtins.__import__

    def no_onnx(name, *a, **kw):
        if name == "onnx" or name.startswith("onnx."):
            raise ImportError("No module named 'onnx'")
        return real_import(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_onnx)
    monkeypatch.delitem(__import__("sys").modules, "onnx", raising=False)
    with pytest.raises(BertkitError, match="pip install onnx"):
        export_onnx(tmp_path, tmp_path / "x.onnx")


def test_export_int8_has_dynamic_axes_and_matches_bertkit_int8(tmp_path, capsys):
    """The quantized graph against bertkit's int8 model: both quantize each activation matrix with one scale and
    the same weights; their roundings differ, so the CLI allows 15% of the largest output (passing means within)."""
    import json

    import onnx
    from bertkit.cli import main
    from bertkit.runtime.int8 import int8_kernel_ok
    if not int8_kernel_ok():
        pytest.skip("no int8 linear kernel in this PyTorch build")
    d = _save("BertModel", tmp_path / "m")
    assert main(["export", str(d), str(tmp_path / "fp32.onnx"), "--no-check"]) == 0
    assert main(["export", str(d), str(tmp_path / "int8.onnx"), "--int8"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 < report["max_abs_diff"] <= 0.15 * report["max_abs_output"], report
    graph = onnx.load(str(tmp_path / "int8.onnx")).graph
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in graph.node}
    assert [x.dim_param for x in graph.input[0].type.tensor_type.shape.dim] == ["batch", "seq"]
    assert (tmp_path / "int8.onnx").stat().st_size < 0.5 * (tmp_path / "fp32.onnx").stat().st_size


def test_a_failed_check_writes_nothing_and_int8_models_need_the_flag(tmp_path, capsys):
    """A check that fails leaves no file and keeps an earlier one; an int8 model is refused without --int8 before
    any work; --int8 into a directory that does not exist yet writes there."""
    import json

    from bertkit.cli import main
    from bertkit.quantize import quantize_dir
    from bertkit.runtime.int8 import int8_kernel_ok
    if not int8_kernel_ok():
        pytest.skip("no int8 linear kernel in this PyTorch build")
    d = _save("BertForQuestionAnswering", tmp_path / "m")
    quantize_dir(d, tmp_path / "q", force=True)
    out = tmp_path / "out" / "qa.onnx"
    assert main(["export", str(tmp_path / "q"), str(out)]) == 2
    assert "export it with --int8" in capsys.readouterr().err and not out.parent.exists()
    assert main(["export", str(tmp_path / "q"), str(out), "--int8"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["int8"]["onnx_vs_float"] > 0 and report["int8"]["bertkit_vs_float"] > 0
    before = out.read_bytes()
    assert main(["export", str(d), str(out), "--int8", "--overwrite", "--tolerance", "0"]) == 2   # diff > 0
    assert "nothing written" in capsys.readouterr().err
    assert out.read_bytes() == before and sorted(p.name for p in out.parent.iterdir()) == ["qa.onnx"]


def test_a_refused_export_into_new_directories_leaves_none(tmp_path, capsys):
    from bertkit.cli import main
    from bertkit.runtime.int8 import int8_kernel_ok
    if not int8_kernel_ok():
        pytest.skip("no int8 linear kernel in this PyTorch build")
    d = _save("BertModel", tmp_path / "m")
    out = tmp_path / "new" / "sub" / "m.onnx"
    assert main(["export", str(d), str(out), "--int8", "--tolerance", "0"]) == 2       # int8 never matches exactly
    assert "nothing written" in capsys.readouterr().err and not (tmp_path / "new").exists()


@pytest.mark.parametrize("model_type", ["modernbert", "gte"])
def test_rotary_families_export_their_rotation(tmp_path, model_type):
    """Attention sharp enough that unrotated q and k would move the outputs far past the tolerance (the exporter
    traces, and tracing drops in-place writes to views: the rotation must be written out of place there)."""
    transformers = pytest.importorskip("transformers")
    from bertkit import BertModel, Tokenizer
    from bertkit.export import check_onnx, export_onnx
    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=48, pad_token_id=0,
                                            **({"type_vocab_size": 2} if model_type == "gte" else {}))
    torch.manual_seed(0)
    ref = transformers.AutoModel.from_config(cfg)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "qkv" in name.lower() and p.dim() == 2:
                p.mul_(8.0)
    ref.save_pretrained(tmp_path / "m")
    Tokenizer({t: i for i, t in enumerate(VOCAB)}).save(tmp_path / "m")
    d = tmp_path / "m"
    BertModel.from_pretrained(d)                                      # loads as bertkit reads it
    report = check_onnx(d, export_onnx(d, tmp_path / "m.onnx"))
    assert report["max_abs_diff"] <= 1e-4, report
