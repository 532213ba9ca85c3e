"""NomicBERT and GTE beyond the every-family tests (tests/test_families.py runs their heads, gradients, both-way
loading, base shapes and frozen / int8 models): long rows reach far rotary angles, their config.json round-trips
through transformers, the rotary settings bertkit does not compute are refused by name, and `pretrain --rope-theta`
writes their one base as transformers reads it."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit import heads
from bertkit.config import BertConfig
from bertkit.errors import ConfigError
from bertkit.model import BertModel
from bertkit.modern import parts
from bertkit.train.pretrain import _rotary_base

from test_families import TINY, _pair, assert_long_rows_equal

transformers = pytest.importorskip("transformers")

ROTARY_GLU = ("nomic_bert", "gte")


@pytest.mark.parametrize("model_type", ROTARY_GLU)
@pytest.mark.parametrize("backend", ["eager", "unpadded"])
def test_long_rows_equal_transformers(tmp_path, model_type, backend):
    """400-token rows, one of them half padding: rotary angles far past the short test rows'."""
    assert_long_rows_equal(tmp_path, model_type, "ForMaskedLM", dict(TINY, max_position_embeddings=512), backend,
                           400, 200)


@pytest.mark.parametrize("model_type", ROTARY_GLU)
def test_config_round_trips_through_transformers(tmp_path, model_type):
    cfg, ref, ours = _pair(tmp_path, model_type, "ForSequenceClassification",
                           shape=dict(TINY, rope_parameters={"rope_type": "default", "rope_theta": 321.0}))
    assert parts(ours.config).global_theta == 321.0
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.AutoConfig.from_pretrained(tmp_path / "ours").to_dict()
    skip = ("transformers_version", "architectures", "_name_or_path", "dtype")
    want = {k: v for k, v in cfg.to_dict().items() if k not in skip}
    assert want == {k: back[k] for k in want}


@pytest.mark.parametrize("key,value,named", [
    ("rope_parameters", {"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 2.0}, "rope_parameters.rope_type"),
    ("rope_scaling", {"type": "ntk", "factor": 2.0}, "rope_scaling"),
    ("head_dim", 16, "head_dim"),
])
def test_rotary_settings_bertkit_does_not_compute_are_refused_by_name(tmp_path, key, value, named):
    transformers.NomicBertModel(transformers.NomicBertConfig(**TINY)).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(raw, **{key: value})))
    with pytest.raises(ConfigError, match=f"config.json key {named}=.* is not a value bertkit reads"):
        BertModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("model_type", ROTARY_GLU)
def test_a_new_rotary_base_is_written_as_transformers_reads_it(model_type):
    """`pretrain --rope-theta`: one base for every layer (ModernBERT's are per layer type)."""
    cfg = BertConfig.from_dict(dict(transformers.AutoConfig.for_model(model_type, **TINY).to_dict()))
    longer = _rotary_base(cfg, 5e5, 256)
    assert parts(longer).global_theta == 5e5 and longer.max_position_embeddings == 256
    theirs = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in longer.to_dict().items()
                                                              if k != "model_type"})
    assert theirs.rope_parameters["rope_theta"] == 5e5
    assert heads.BertForMaskedLM(longer).bert.encoder.layer[0].attention.self.theta == 5e5


@pytest.mark.parametrize("model_type", ROTARY_GLU)
def test_keys_a_config_json_leaves_out_read_as_transformers_defaults_them(model_type):
    """Published config.json files spell few of these keys (nomic-embed's are GPT-2's: n_embd, ...)."""
    ours, theirs = BertConfig.from_dict({"model_type": model_type}), transformers.AutoConfig.for_model(model_type)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                "type_vocab_size", "layer_norm_eps", "pad_token_id"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert parts(ours).global_theta == theirs.rope_parameters["rope_theta"]


def _as_remote_code(src, dst, suffix: str) -> None:
    """A transformers-saved GTE directory rewritten as gte-base-en-v1.5's authors' code writes it: model_type "new",
    New* classes, the base's weights under `new.`, the remote config's own keys."""
    from safetensors.torch import load_file, save_file
    dst.mkdir()
    raw = json.loads((src / "config.json").read_text())
    theta = raw.pop("rope_parameters")["rope_theta"]
    raw.update(model_type="new", architectures=["New" + suffix], position_embedding_type="rope", rope_theta=theta,
               rope_scaling=None, logn_attention_scale=False, pack_qkv=True, layer_norm_type="layer_norm",
               auto_map={"AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"})
    (dst / "config.json").write_text(json.dumps(raw))
    weights = load_file(src / "model.safetensors")
    save_file({("new." + k[4:] if k.startswith("gte.") else k): v for k, v in weights.items()},
              dst / "model.safetensors")


@pytest.mark.parametrize("suffix", ["Model", "ForMaskedLM", "ForSequenceClassification"])
def test_gte_as_its_authors_code_saves_it_loads_and_saves_back_unchanged(tmp_path, suffix):
    cfg, ref, _ = _pair(tmp_path, "gte", suffix, shape=dict(TINY, rope_parameters={"rope_type": "default",
                                                                                   "rope_theta": 500_000.0}))
    _as_remote_code(tmp_path / "hf", tmp_path / "new", suffix)
    cls = BertModel if suffix == "Model" else getattr(heads, "Bert" + suffix)
    ours = cls.from_pretrained(tmp_path / "new").eval()
    assert ours.loading_info["missing_keys"] == [] and ours.loading_info["ignored_keys"] == []
    assert parts(ours.config).global_theta == 500_000.0
    ids = torch.randint(4, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = ref(input_ids=ids), ours(ids)
    key = "last_hidden_state" if suffix == "Model" else "logits"
    torch.testing.assert_close(getattr(got, key), getattr(want, key), atol=1e-5, rtol=1e-5)
    ours.save_pretrained(tmp_path / "back")
    from safetensors.torch import load_file
    assert sorted(load_file(tmp_path / "back" / "model.safetensors")) == \
        sorted(load_file(tmp_path / "new" / "model.safetensors"))
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back["model_type"] == "new" and back["architectures"] == ["New" + suffix]
    assert back["auto_map"] and back["position_embedding_type"] == "rope" and back["rope_theta"] == 500_000.0


@pytest.mark.parametrize("key,value", [("logn_attention_scale", True), ("layer_norm_type", "rms_norm"),
                                       ("position_embedding_type", "absolute")])
def test_gte_remote_code_settings_bertkit_does_not_compute_are_refused_by_name(tmp_path, key, value):
    _pair(tmp_path, "gte", "Model")
    _as_remote_code(tmp_path / "hf", tmp_path / "new", "Model")
    raw = json.loads((tmp_path / "new" / "config.json").read_text())
    (tmp_path / "new" / "config.json").write_text(json.dumps(dict(raw, **{key: value})))
    with pytest.raises(ConfigError, match=key):
        BertModel.from_pretrained(tmp_path / "new")
