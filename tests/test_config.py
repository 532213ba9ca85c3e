"""BertConfig: presets, validation naming the field, HF config.json round trip (unknown keys kept)."""

from __future__ import annotations

import json

import pytest

from bertkit.config import PRESETS, BertConfig
from bertkit.errors import ConfigError


@pytest.mark.parametrize("name,shape", [("tiny", (2, 128, 2)), ("mini", (4, 256, 4)), ("small", (4, 512, 8)),
                                        ("medium", (8, 512, 8)), ("base", (12, 768, 12)), ("large", (24, 1024, 16))])
def test_presets(name, shape):
    cfg = BertConfig.preset(name)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == shape == PRESETS[name]
    assert cfg.intermediate_size == 4 * cfg.hidden_size
    assert (cfg.max_position_embeddings, cfg.type_vocab_size, cfg.vocab_size) == (512, 2, 30522)


def test_preset_overrides_and_unknown():
    cfg = BertConfig.preset("tiny", vocab_size=1000, num_labels=3)
    assert cfg.vocab_size == 1000 and cfg.num_labels == 3 and cfg.hidden_size == 128
    with pytest.raises(ConfigError, match="huge"):
        BertConfig.preset("huge")


@pytest.mark.parametrize("kw,field", [
    (dict(hidden_size=130, num_attention_heads=4), "hidden_size=130 is not divisible by num_attention_heads=4"),
    (dict(num_hidden_layers=0), "num_hidden_layers"),
    (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob"),
    (dict(hidden_act="tanhh"), "hidden_act"),
    (dict(attn_implementation="flash"), "attn_implementation"),
    (dict(problem_type="ranking"), "problem_type"),
    (dict(pad_token_id=40000), "pad_token_id"),
    (dict(position_embedding_type="relative_key"), "position_embedding_type"),
])
def test_validation_names_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        BertConfig(**kw)


def test_hf_json_round_trip_keeps_unknown_keys(tmp_path):
    hf = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "transformers_version": "4.8.2",
          "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 384,
          "initializer_range": 0.02, "intermediate_size": 1536, "layer_norm_eps": 1e-12,
          "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 6, "pad_token_id": 0,
          "position_embedding_type": "absolute", "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522,
          "gradient_checkpointing": False, "some_future_key": {"nested": [1, 2]},
          "id2label": {"0": "neg", "1": "pos", "2": "neutral"}, "label2id": {"neg": 0, "pos": 1, "neutral": 2}}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg = BertConfig.from_json(tmp_path)
    assert cfg.hidden_size == 384 and cfg.num_hidden_layers == 6 and cfg.num_labels == 3
    assert cfg.id2label == {0: "neg", 1: "pos", 2: "neutral"}
    assert cfg.extra["some_future_key"] == {"nested": [1, 2]}
    cfg.to_json(tmp_path / "out.json")
    back = json.loads((tmp_path / "out.json").read_text())
    # nothing lost; only our two optional fields are added (as transformers writes them); "auto" is not written
    assert back == {**hf, "classifier_dropout": None, "problem_type": None}
    assert BertConfig.from_json(tmp_path / "out.json") == cfg


def test_attn_implementation_round_trip(tmp_path):
    cfg = BertConfig.preset("tiny", attn_implementation="unpadded")
    cfg.to_json(tmp_path)  # a directory -> config.json inside
    assert BertConfig.from_json(tmp_path).attn_implementation == "unpadded"


def test_bad_json_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        BertConfig.from_json(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(ConfigError, match="bad.json"):
        BertConfig.from_json(tmp_path / "bad.json")
    (tmp_path / "typed.json").write_text(json.dumps({"hidden_size": "768"}))
    with pytest.raises(ConfigError, match="hidden_size"):
        BertConfig.from_json(tmp_path / "typed.json")


def test_an_unknown_family_is_refused_by_name(tmp_path):
    """A config of a family bertkit does not read (BERT's fields, other maths) must not load as BERT."""
    from bertkit.model import BertModel
    BertModel(BertConfig.preset("tiny")).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "camembert-x"}))
    with pytest.raises(ConfigError, match=r"config.json: model_type 'camembert-x' is not a family bertkit reads: "
                                          r"albert, bert, deberta-v2, distilbert, electra"):
        BertModel.from_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="camembert-x"):
        BertConfig.from_json(tmp_path)


def test_transformers_reads_our_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    BertConfig.preset("mini", num_labels=4).to_json(tmp_path)
    hf = transformers.BertConfig.from_pretrained(tmp_path)
    assert (hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_labels) == (256, 4, 4, 4)
