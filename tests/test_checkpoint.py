"""Checkpoints: HF directories both ways, old names, prefixes, .bin, missing heads reported, bad files named."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertkit.config import BertConfig
from bertkit.errors import CheckpointError, ConfigError
from bertkit.heads import (BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering,
                           BertForSequenceClassification, BertForTokenClassification)
from bertkit.model import BertModel


def _cfg(**kw):
    return BertConfig.preset("tiny", vocab_size=97, max_position_embeddings=40, **kw)


def _ids():
    return torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(0))


def _same_params(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_round_trip_all_heads(tmp_path):
    torch.manual_seed(0)
    for cls in (BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
                BertForTokenClassification, BertForQuestionAnswering):
        m = cls(_cfg(num_labels=3))
        d = tmp_path / cls.__name__
        m.save_pretrained(d)
        assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"]  # no temp files left
        back = cls.from_pretrained(d)
        _same_params(m, back)
        assert back.loading_info["missing_keys"] == [] and back.config.replace(extra={}) == m.config
        assert back.config.extra["architectures"] == [cls.__name__]
        assert not back.training


def test_save_writes_tokenizer_files(tmp_path):
    class FakeTokenizer:  # duck-typed: only .save(dir) is used
        def save(self, directory):
            (directory / "vocab.txt").write_text("[PAD]\n")
    BertModel(_cfg()).save_pretrained(tmp_path, tokenizer=FakeTokenizer())
    assert (tmp_path / "vocab.txt").read_text() == "[PAD]\n"


def test_prefix_gamma_beta_bin_and_tied_decoder(tmp_path):
    """An old-style checkpoint: pytorch_model.bin, LayerNorm.gamma/beta, explicit decoder weight + bias."""
    torch.manual_seed(0)
    src = BertForPreTraining(_cfg())
    sd = {}
    for k, v in src.state_dict().items():
        k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        sd[k] = v.clone()
    sd["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"].clone()
    sd["cls.predictions.decoder.bias"] = sd.pop("cls.predictions.bias")
    sd["bert.embeddings.position_ids"] = torch.arange(40)[None]
    torch.save(sd, tmp_path / "pytorch_model.bin")
    _cfg().to_json(tmp_path)
    back = BertForPreTraining.from_pretrained(tmp_path)
    _same_params(src, back)
    # the same checkpoint into a bare BertModel: "bert." stripped, heads ignored (listed)
    bare = BertModel.from_pretrained(tmp_path)
    assert torch.equal(bare.embeddings.word_embeddings.weight, src.bert.embeddings.word_embeddings.weight)
    assert "cls.seq_relationship.weight" in bare.loading_info["ignored_keys"]


def test_bare_encoder_into_head_reports_missing(tmp_path, caplog):
    torch.manual_seed(0)
    enc = BertModel(_cfg(num_labels=4))
    enc.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertkit.checkpoint"):
        clf = BertForSequenceClassification.from_pretrained(tmp_path)
    assert clf.loading_info["missing_keys"] == ["classifier.bias", "classifier.weight"]
    assert "classifier.weight" in caplog.text and "newly initialised" in caplog.text
    assert torch.equal(clf.bert.pooler.dense.weight, enc.pooler.dense.weight)
    mlm = BertForMaskedLM.from_pretrained(tmp_path)  # no pooler in an MLM model: ignored, cls.* missing
    assert "bert.pooler.dense.weight" in mlm.loading_info["ignored_keys"]
    assert all(k.startswith("cls.") for k in mlm.loading_info["missing_keys"])
    # config overrides at load time
    assert BertForSequenceClassification.from_pretrained(tmp_path, num_labels=7).classifier.out_features == 7
    with pytest.raises(ConfigError, match="not_a_field"):
        BertModel.from_pretrained(tmp_path, not_a_field=1)


def test_errors_name_the_problem(tmp_path):
    torch.manual_seed(0)
    with pytest.raises(CheckpointError, match="not found"):
        BertModel.from_pretrained(tmp_path / "nowhere")
    _cfg().to_json(tmp_path)
    with pytest.raises(CheckpointError, match=f"no weights in {tmp_path}"):
        BertModel.from_pretrained(tmp_path)
    m = BertModel(_cfg())
    m.save_pretrained(tmp_path)
    # config that does not fit the weights: shape mismatch names the key
    _cfg(intermediate_size=64).to_json(tmp_path)
    with pytest.raises(CheckpointError, match=r"'encoder.layer.0.intermediate.dense.bias' has shape \(512,\).*but \(64,\)"):
        BertModel.from_pretrained(tmp_path)
    # fewer layers in the config: the extra layer's keys are unexpected, non-head -> error naming them
    _cfg(num_hidden_layers=1).to_json(tmp_path)
    with pytest.raises(CheckpointError, match="encoder.layer.1"):
        BertModel.from_pretrained(tmp_path)
    # more layers in the config: missing encoder weights -> error, never a half-random model
    _cfg(num_hidden_layers=3).to_json(tmp_path)
    with pytest.raises(CheckpointError, match="missing.*encoder.layer.2"):
        BertModel.from_pretrained(tmp_path)
    _cfg().to_json(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        BertModel.from_pretrained(tmp_path)


def test_mismatched_head_can_be_reinitialised(tmp_path):
    BertForSequenceClassification(_cfg(num_labels=2)).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="classifier.bias"):
        BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    m = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_sizes=True)
    assert m.loading_info["mismatched_keys"] == ["classifier.bias", "classifier.weight"]


def test_dtype_on_load_and_bf16_save(tmp_path):
    BertModel(_cfg()).save_pretrained(tmp_path / "a")
    m = BertModel.from_pretrained(tmp_path / "a", dtype=torch.bfloat16)
    assert m.embeddings.word_embeddings.weight.dtype == torch.bfloat16
    m.save_pretrained(tmp_path / "b")
    assert load_file(str(tmp_path / "b" / "model.safetensors"))["pooler.dense.weight"].dtype == torch.bfloat16


def test_transformers_interop_both_ways(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = BertForPreTraining(_cfg())
    ours.save_pretrained(tmp_path / "ours")
    hf, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids = _ids()
    hf.eval()
    ours.eval()
    with torch.no_grad():
        assert (hf(input_ids=ids).prediction_logits - ours(ids).prediction_logits).abs().max() < 1e-5
    hf.save_pretrained(tmp_path / "theirs")
    back = BertForPreTraining.from_pretrained(tmp_path / "theirs")
    assert back.loading_info["missing_keys"] == [] and back.loading_info["ignored_keys"] == []
    _same_params(ours, back)
    # a BertModel saved by transformers (no prefix) and ours into transformers' BertModel
    bare = transformers.BertModel.from_pretrained(tmp_path / "ours")  # from a pre-training dir: prefix stripped
    bare.save_pretrained(tmp_path / "bare")
    assert not any(k.startswith("bert.") for k in load_file(str(tmp_path / "bare" / "model.safetensors")))
    _same_params(ours.bert, BertModel.from_pretrained(tmp_path / "bare"))
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert cfg["architectures"] == ["BertForPreTraining"] and cfg["model_type"] == "bert"


def test_sharded_safetensors(tmp_path):
    m = BertModel(_cfg())
    sd = {k: v.contiguous() for k, v in m.state_dict().items()}
    keys = sorted(sd)
    save_file({k: sd[k] for k in keys[:10]}, str(tmp_path / "a.safetensors"))
    save_file({k: sd[k] for k in keys[10:]}, str(tmp_path / "b.safetensors"))
    index = {"weight_map": {k: ("a.safetensors" if i < 10 else "b.safetensors") for i, k in enumerate(keys)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    _cfg().to_json(tmp_path)
    _same_params(m, BertModel.from_pretrained(tmp_path))


def test_save_with_real_tokenizer_round_trip(tmp_path, bert_vocab_file):
    tokenizer_mod = pytest.importorskip("bertkit.tokenizer")
    tok = tokenizer_mod.Tokenizer.from_pretrained(bert_vocab_file)
    model = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=tok.vocab_size))
    model.save_pretrained(tmp_path, tokenizer=tok)
    assert (tmp_path / "vocab.txt").is_file()
    tok2 = tokenizer_mod.Tokenizer.from_pretrained(tmp_path)
    assert tok2.vocab_hash == tok.vocab_hash
    back = BertForMaskedLM.from_pretrained(tmp_path)
    ids = torch.tensor([tok.encode("the model and its tokenizer travel together")])
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model.eval()(ids).logits)


def test_saved_files_are_readable_as_the_umask_allows(tmp_path):
    """safetensors creates owner-only files; a saved model directory gets the modes any new file would."""
    import os
    import stat

    from bertkit import BertConfig, BertModel
    mask = os.umask(0o022)
    try:
        BertModel(BertConfig.preset("tiny", vocab_size=50)).save_pretrained(tmp_path / "m")
    finally:
        os.umask(mask)
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE((tmp_path / "m" / name).stat().st_mode) == 0o644, name
