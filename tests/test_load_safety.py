"""Loading refuses what would silently go wrong: NaN / Inf weights, a tokenizer that does not fit the embedding, a
shard outside the model directory, a pickle that is not plain tensors, a config.json that is not one or is absurd.
Each refusal is one line naming the file (and tensor / field / numbers)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from safetensors.torch import save_file

from bertkit.checkpoint import ALLOW_NON_FINITE_ENV
from bertkit.cli import main
from bertkit.config import BertConfig
from bertkit.errors import CheckpointError, ConfigError
from bertkit.heads import BertForMaskedLM
from bertkit.model import BertModel

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["the", "cat", "sat", "on", "mat"]


def _cfg(**kw):
    return BertConfig.preset("tiny", vocab_size=len(SPECIALS) + len(WORDS), max_position_embeddings=40, **kw)


def _write_vocab(directory, n_extra: int = 0) -> None:
    tokens = SPECIALS + WORDS + [f"extra{i}" for i in range(n_extra)]
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")


def _one_line(e: Exception) -> str:
    text = str(e)
    assert "\n" not in text, text
    return text


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ALLOW_NON_FINITE_ENV, raising=False)


@pytest.fixture()
def nan_model(tmp_path):
    torch.manual_seed(0)
    m = BertForMaskedLM(_cfg())
    with torch.no_grad():
        m.bert.encoder.layer[1].attention.output.dense.weight[0, 3] = float("nan")
        m.bert.embeddings.word_embeddings.weight[2, 0] = float("inf")
    d = tmp_path / "nan"
    m.save_pretrained(d)
    _write_vocab(d)
    return d


def test_non_finite_weights_refused_naming_file_and_tensor(nan_model, caplog):
    with pytest.raises(CheckpointError) as e:
        BertForMaskedLM.from_pretrained(nan_model)
    msg = _one_line(e.value)
    assert str(nan_model / "model.safetensors") in msg and "non-finite" in msg and "allow_non_finite" in msg
    assert "encoder.layer.1.attention.output.dense.weight" in msg or "word_embeddings.weight" in msg
    with caplog.at_level(logging.WARNING, logger="bertkit.checkpoint"):
        m = BertForMaskedLM.from_pretrained(nan_model, allow_non_finite=True)
    assert torch.isnan(m.bert.encoder.layer[1].attention.output.dense.weight[0, 3])
    assert any("non-finite" in r.getMessage() for r in caplog.records)


def test_non_finite_env_and_cli_flag(nan_model, monkeypatch, capsys):
    monkeypatch.setenv(ALLOW_NON_FINITE_ENV, "1")
    BertModel.from_pretrained(nan_model)                     # the environment allows it
    monkeypatch.delenv(ALLOW_NON_FINITE_ENV)
    assert main(["fill-mask", str(nan_model), "the [MASK] sat"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "non-finite" in err and "--allow-non-finite" in err
    try:
        assert main(["--allow-non-finite", "fill-mask", str(nan_model), "the [MASK] sat"]) == 0
    finally:
        os.environ.pop(ALLOW_NON_FINITE_ENV, None)        # the flag sets it for the process
    assert "the [MASK] sat" in capsys.readouterr().out


def test_vocab_larger_than_embedding_refused_smaller_warned(tmp_path, caplog):
    d = tmp_path / "m"
    BertModel(_cfg()).save_pretrained(d)
    rows = _cfg().vocab_size
    _write_vocab(d)
    BertModel.from_pretrained(d)                             # the vocab that belongs to it
    _write_vocab(d, n_extra=5)
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(d)
    msg = _one_line(e.value)
    assert f"has {rows + 5} entries" in msg and f"{rows} rows" in msg
    assert str(d / "vocab.txt") in msg and str(d / "model.safetensors") in msg
    big = tmp_path / "big"
    BertModel(BertConfig.preset("tiny", vocab_size=2000, max_position_embeddings=40)).save_pretrained(big)
    _write_vocab(big)
    with caplog.at_level(logging.WARNING, logger="bertkit.checkpoint"):
        BertModel.from_pretrained(big)
    assert any(f"{rows} entries" in r.getMessage() and "2000 rows" in r.getMessage() for r in caplog.records)
    padded = tmp_path / "padded"                             # rows rounded up to a multiple of 8: no warning
    BertModel(BertConfig.preset("tiny", vocab_size=40, max_position_embeddings=40)).save_pretrained(padded)
    _write_vocab(padded)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertkit.checkpoint"):
        BertModel.from_pretrained(padded)
    assert not any("entries" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "sub/../../outside.safetensors", "ABS"])
def test_shard_outside_model_directory_refused(tmp_path, shard):
    m = BertModel(_cfg())
    sd = {k: v.contiguous() for k, v in m.state_dict().items()}
    save_file(sd, str(tmp_path / "outside.safetensors"))
    d = tmp_path / "model"
    d.mkdir()
    _cfg().to_json(d)
    shard = str(tmp_path / "outside.safetensors") if shard == "ABS" else shard
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: shard for k in sd}}))
    with pytest.raises(CheckpointError, match="outside the model directory") as e:
        BertModel.from_pretrained(d)
    _one_line(e.value)


@pytest.mark.parametrize("index", ['[]', '{"weight_map": 3}', '{"weight_map": {"a": 5}}', '{"weight_map": {"a": ""}}',
                                   '\xff\xfe', '{"weight_map": {"a": ["x"]}}'])
def test_malformed_shard_index_is_one_line(tmp_path, index):
    _cfg().to_json(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_bytes(index.encode("latin-1"))
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(tmp_path)
    _one_line(e.value)


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_unsafe_pickle_refused_in_one_line_with_the_conversion(tmp_path):
    marker = tmp_path / "pwned"
    sd = {k: v for k, v in BertModel(_cfg()).state_dict().items()}
    sd["evil"] = _Payload(marker)
    d = tmp_path / "m"
    d.mkdir()
    _cfg().to_json(d)
    torch.save(sd, d / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(d)
    msg = _one_line(e.value)
    assert not marker.exists()
    assert str(d / "pytorch_model.bin") in msg and "refused to unpickle" in msg and "system" in msg
    assert "weights_only=False" not in msg                         # never advises running the pickle
    assert "save_pretrained" in msg and str(d / "model.safetensors") in msg


@pytest.mark.parametrize("config,words", [
    ("[1, 2]", "expected a JSON object"),
    ('"bert"', "expected a JSON object"),
    ('{"max_position_embeddings": 100000000}', "max_position_embeddings=100000000 is absurdly large"),
    ('{"vocab_size": 5000000}', "vocab_size=5000000 is absurdly large"),
    ('{"hidden_size": 2000000, "num_attention_heads": 1}', "hidden_size=2000000 is absurdly large"),
    ('{"hidden_size": 16384, "intermediate_size": 65536, "num_hidden_layers": 300, "num_attention_heads": 16}',
     "parameters"),
    ("\udcff", "not UTF-8"),
    ("[" * 100000, "nested too deeply"),
    ('{"vocab_size": ' + "1" * 5000 + "}", "Exceeds the limit (4300 digits)"),
])
def test_bad_config_json_refused_in_one_line(tmp_path, config, words):
    (tmp_path / "config.json").write_bytes(config.encode("utf-8", "surrogateescape"))
    for load in (BertModel.from_pretrained, BertConfig.from_json):
        with pytest.raises((CheckpointError, ConfigError)) as e:
            load(tmp_path)
        msg = _one_line(e.value)
        assert words in msg and str(tmp_path / "config.json") in msg


def test_save_on_a_full_disk_keeps_the_previous_files(tmp_path, monkeypatch):
    import errno

    import safetensors.torch
    d = tmp_path / "m"
    first = BertModel(_cfg())
    first.save_pretrained(d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}

    def full(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(CheckpointError) as e:
        BertModel(_cfg()).save_pretrained(d)
    assert "No space left on device" in _one_line(e.value) and str(d / "model.safetensors") in str(e.value)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before          # no temp file, nothing replaced
