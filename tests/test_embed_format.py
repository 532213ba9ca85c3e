"""Pooling and sentence-transformers directories against sentence-transformers itself (the oracle)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.config import BertConfig
from bertkit.embed.pooling import Dense, Pooling, SentenceEncoder
from bertkit.embed.st_format import load_sentence_encoder, save_sentence_encoder
from bertkit.errors import CheckpointError, ConfigError
from bertkit.model import BertModel

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "Café crème, s'il vous plaît!",
         "A man is playing a guitar on stage while people watch.", "x",
         " ".join(["a long sentence that goes past the limit"] * 60)]
ST_MODES = ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def st():
    return pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def st_minilm(st, minilm_dir):
    return st.SentenceTransformer(str(minilm_dir), device="cpu")


# ------------------------------------------------------------------------------------------------ pooling maths
def test_pooling_modes_by_hand():
    h = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)       # (batch, seq, hidden)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert torch.equal(Pooling("cls")(h, mask), h[:, 0])
    assert torch.equal(Pooling("last_token")(h, mask), torch.stack([h[0, 2], h[1, 1]]))
    assert torch.equal(Pooling("max")(h, mask), torch.stack([h[0, 2], h[1, 1]]))   # increasing values
    assert torch.allclose(Pooling("mean")(h, mask), torch.stack([h[0, :3].mean(0), h[1, :2].mean(0)]))
    assert torch.allclose(Pooling("mean_sqrt_len")(h, mask),
                          torch.stack([h[0, :3].sum(0) / 3 ** 0.5, h[1, :2].sum(0) / 2 ** 0.5]))
    w0 = (h[0, :3] * torch.tensor([1., 2., 3.])[:, None]).sum(0) / 6
    w1 = (h[1, :2] * torch.tensor([1., 2.])[:, None]).sum(0) / 3
    assert torch.allclose(Pooling("weighted_mean")(h, mask), torch.stack([w0, w1]))
    both = Pooling(["mean", "cls"])(h, mask)                                 # concatenated in the order given
    assert both.shape == (2, 6) and torch.equal(both[:, 3:], h[:, 0])


def test_pooling_rejects_unknown_mode():
    with pytest.raises(ConfigError, match="median"):
        Pooling("median")


def _tiny_encoder(**kw) -> SentenceEncoder:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32)
    return SentenceEncoder(BertModel(cfg), Pooling("mean"), **kw)


def test_encoder_shapes_and_limits():
    enc = _tiny_encoder(normalize=True, dense=Dense(16, 8), max_seq_length=32).eval()
    ids = torch.randint(5, 50, (3, 7))
    out = enc(ids, torch.zeros_like(ids), torch.ones_like(ids))
    assert out.shape == (3, 8) and torch.allclose(out.norm(dim=-1), torch.ones(3))
    with pytest.raises(ConfigError, match="max_seq_length"):
        _tiny_encoder(max_seq_length=64)


# ------------------------------------------------------------------------------------------ against the oracle
def test_minilm_dir_matches_sentence_transformers(minilm_dir, st_minilm):
    enc, tok = load_sentence_encoder(minilm_dir)
    assert (enc.pooling.modes, enc.normalize, enc.max_seq_length) == (("mean",), True, 256)
    cos = _cosines(enc.encode(tok, TEXTS), st_minilm.encode(TEXTS))
    assert cos.min() >= 0.99999, cos


@pytest.mark.parametrize("mode", ST_MODES)
def test_each_pooling_mode_written_by_sentence_transformers(st, st_minilm, tmp_path, mode):
    model = st.SentenceTransformer(modules=[st_minilm[0], st.models.Pooling(384, pooling_mode=mode)], device="cpu")
    model.save(str(tmp_path))
    enc, tok = load_sentence_encoder(tmp_path)
    assert not enc.normalize and len(enc.dense) == 0
    cos = _cosines(enc.encode(tok, TEXTS), model.encode(TEXTS))
    assert cos.min() >= 0.99999, (mode, cos)


def test_dense_and_normalize_written_by_sentence_transformers(st, st_minilm, tmp_path):
    torch.manual_seed(0)
    model = st.SentenceTransformer(modules=[st_minilm[0], st.models.Pooling(384, pooling_mode=("mean", "max")),
                                            st.models.Dense(768, 96), st.models.Normalize()], device="cpu")
    model.save(str(tmp_path))
    enc, tok = load_sentence_encoder(tmp_path)
    assert enc.normalize and enc.dim == 96 and enc.pooling.modes == ("mean", "max")
    ours, theirs = enc.encode(tok, TEXTS), model.encode(TEXTS)
    assert _cosines(ours, theirs).min() >= 0.99999


def test_saved_directory_loads_in_sentence_transformers(st, minilm_dir, tmp_path):
    enc, tok = load_sentence_encoder(minilm_dir)
    torch.manual_seed(1)
    dense = Dense(384 * 2, 64, activation="identity")
    enc = SentenceEncoder(enc.bert, Pooling(["weighted_mean", "cls"]), normalize=True, dense=dense,
                          max_seq_length=128)
    save_sentence_encoder(enc, tok, tmp_path)
    pool_cfg = json.loads((tmp_path / "1_Pooling" / "config.json").read_text())
    assert pool_cfg["pooling_mode_weightedmean_tokens"] and pool_cfg["pooling_mode_cls_token"]
    assert not pool_cfg["pooling_mode_mean_tokens"]
    model = st.SentenceTransformer(str(tmp_path), device="cpu")
    assert model.max_seq_length == 128
    ours, theirs = enc.encode(tok, TEXTS), model.encode(TEXTS)
    assert _cosines(ours, theirs).min() >= 0.99999
    again, _ = load_sentence_encoder(tmp_path)
    assert np.array_equal(again.encode(tok, TEXTS), ours)


def test_plain_hf_directory_loads_with_mean_pooling(minilm_dir, tmp_path, st):
    enc, tok = load_sentence_encoder(minilm_dir)
    enc.bert.save_pretrained(tmp_path, tokenizer=tok)
    plain, _ = load_sentence_encoder(tmp_path)
    assert plain.pooling.modes == ("mean",) and not plain.normalize and len(plain.dense) == 0
    model = st.SentenceTransformer(str(tmp_path), device="cpu")
    assert _cosines(plain.encode(tok, TEXTS), model.encode(TEXTS)).min() >= 0.99999


def test_unsupported_module_is_named(minilm_dir, tmp_path):
    enc, tok = load_sentence_encoder(minilm_dir)
    save_sentence_encoder(enc, tok, tmp_path)
    spec = json.loads((tmp_path / "modules.json").read_text())
    spec.insert(2, {"idx": 2, "name": "2", "path": "2_LSTM", "type": "sentence_transformers.models.LSTM"})
    (tmp_path / "modules.json").write_text(json.dumps(spec))
    with pytest.raises(CheckpointError, match="LSTM"):
        load_sentence_encoder(tmp_path)


def test_missing_pooling_config_is_named_not_guessed(tmp_path):
    """modules.json names a Pooling folder without its config: sentence-transformers cannot load it, and bertkit
    does not guess mean pooling for what may be a [CLS]-pooled model."""
    from bertkit.tokenizer import Tokenizer
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"]
    enc = SentenceEncoder(_tiny_encoder(max_seq_length=32).bert, Pooling("cls"), normalize=True, max_seq_length=32)
    save_sentence_encoder(enc, Tokenizer({t: i for i, t in enumerate(vocab)}), tmp_path)
    (tmp_path / "1_Pooling" / "config.json").unlink()
    with pytest.raises(CheckpointError, match="1_Pooling.config.json: missing"):
        load_sentence_encoder(tmp_path)


@pytest.mark.parametrize("bad", ["/etc", "../elsewhere", "x/../1_Pooling"])
def test_module_paths_that_leave_the_directory_are_refused(tmp_path, bad):
    from bertkit.embed.st_format import module_dirs
    from bertkit.tokenizer import Tokenizer
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello"]
    enc = SentenceEncoder(_tiny_encoder(max_seq_length=32).bert, Pooling("mean"), max_seq_length=32)
    save_sentence_encoder(enc, Tokenizer({t: i for i, t in enumerate(vocab)}), tmp_path)
    assert module_dirs(tmp_path) == [__import__("pathlib").Path("1_Pooling")]
    spec = json.loads((tmp_path / "modules.json").read_text())
    spec[1]["path"] = bad
    (tmp_path / "modules.json").write_text(json.dumps(spec))
    with pytest.raises(CheckpointError, match="leaves the model directory"):
        module_dirs(tmp_path)


def test_only_embeddings_read_the_module_list(tmp_path):
    """A directory whose modules.json bertkit cannot run still loads for everything else (export, fill-mask, a
    head's predictions); embedding it is the one-line error naming the module."""
    from bertkit.infer import Predictor
    from bertkit.tokenizer import Tokenizer
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"]
    enc = SentenceEncoder(_tiny_encoder(max_seq_length=32).bert, Pooling("mean"), max_seq_length=32)
    save_sentence_encoder(enc, Tokenizer({t: i for i, t in enumerate(vocab)}), tmp_path)
    spec = json.loads((tmp_path / "modules.json").read_text())
    spec.insert(2, {"idx": 2, "name": "2", "path": "2_LSTM", "type": "sentence_transformers.models.LSTM"})
    (tmp_path / "modules.json").write_text(json.dumps(spec))
    p = Predictor.load(tmp_path)
    assert p.encoder.config.hidden_size == 16
    with pytest.raises(CheckpointError, match="LSTM"):
        p.embed(["hello world"])
    assert p.embed(["hello world"], pooling="mean").shape == (1, 16)      # asked for the encoder's mean: no modules
