"""What a transformers user reaches for on the model side: dtype / torch_dtype, embeddings access and resizing,
gradient checkpointing, ModelOutput indexing, return_dict=False."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit import BertConfig, BertForMaskedLM, BertModel
from bertkit.errors import ConfigError


def _cfg(**kw):
    return BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=32, **kw)


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("mlm")
    BertForMaskedLM(_cfg()).save_pretrained(d)
    return d


@pytest.mark.parametrize("kw", [{"dtype": torch.bfloat16}, {"torch_dtype": torch.bfloat16},
                                {"dtype": "bfloat16"}, {"torch_dtype": "torch.bfloat16"}, {"dtype": "bf16"}])
def test_dtype_and_torch_dtype(mlm_dir, kw):
    m = BertForMaskedLM.from_pretrained(mlm_dir, **kw)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}


def test_dtype_auto_follows_the_config_then_the_weights(mlm_dir, tmp_path):
    assert next(BertModel.from_pretrained(mlm_dir, dtype="auto").parameters()).dtype == torch.float32
    BertForMaskedLM.from_pretrained(mlm_dir, dtype=torch.float16).save_pretrained(tmp_path)
    assert next(BertModel.from_pretrained(tmp_path, torch_dtype="auto").parameters()).dtype == torch.float16
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "bfloat16"}))
    assert next(BertModel.from_pretrained(tmp_path, dtype="auto").parameters()).dtype == torch.bfloat16
    assert BertModel.from_pretrained(tmp_path).embeddings.word_embeddings.weight.dtype == torch.float32


def test_bad_dtype_is_a_config_error(mlm_dir):
    with pytest.raises(ConfigError, match="dtype='bfloat17'"):
        BertModel.from_pretrained(mlm_dir, dtype="bfloat17")
    with pytest.raises(ConfigError, match="give one"):
        BertModel.from_pretrained(mlm_dir, dtype=torch.float32, torch_dtype=torch.bfloat16)
