"""EmbeddingIndex: exact blocked top-k against brute force, storage dtypes, atomic writes, model checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.config import BertConfig
from bertkit.embed.index import EmbeddingIndex, IndexMismatch, IndexWriter, model_hash, write_index
from bertkit.embed.pooling import Pooling, SentenceEncoder
from bertkit.errors import BertkitError, DataError
from bertkit.model import BertModel


def _unit(n, d, seed):
    v = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _brute(corpus, queries, k):
    s = queries @ corpus.T
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, order, 1), order


@pytest.mark.parametrize("corpus_block,query_block", [(7, 3), (64, 1024), (1000, 2)])
def test_float32_search_equals_brute_force(tmp_path, corpus_block, query_block):
    corpus, queries = _unit(500, 24, 0), _unit(13, 24, 1)
    index = write_index(tmp_path / "idx", corpus, [f"d{i}" for i in range(500)], "h", dtype="float32")
    res = index.search(queries, k=10, corpus_block=corpus_block, query_block=query_block)
    scores, rows = _brute(corpus, queries, 10)
    assert np.array_equal(res.rows, rows)
    assert np.allclose(res.scores, scores, atol=1e-6)
    assert res.ids[0] == [f"d{r}" for r in rows[0]]


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-3), ("int8", 2e-2)])
def test_compressed_dtypes_score_their_stored_vectors(tmp_path, dtype, tol):
    corpus, queries = _unit(300, 32, 2), _unit(9, 32, 3)
    index = write_index(tmp_path / "idx", corpus, range(300), "h", dtype=dtype)
    stored = np.asarray(index.vectors, dtype=np.float32)
    if dtype == "int8":
        stored = stored * np.asarray(index.scales)[:, None]
    res = index.search(queries, k=5, corpus_block=50)
    scores, rows = _brute(stored, queries, 5)                 # exact over what is stored
    assert np.array_equal(res.rows, rows)
    assert np.abs(stored - corpus).max() < tol                # and what is stored is close to the input
    recall = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(res.rows, _brute(corpus, queries, 5)[1])])
    assert recall >= 0.9


def test_k_larger_than_corpus_and_single_query(tmp_path):
    corpus = _unit(4, 8, 4)
    index = write_index(tmp_path / "idx", corpus, ["a", "b", "c", "d"], "h", dtype="float32")
    res = index.search(corpus[2], k=10)
    assert res.rows.shape == (1, 4) and res.ids[0][0] == "c"


def test_manifest_and_memory_map(tmp_path):
    index = write_index(tmp_path / "idx", _unit(20, 8, 5), range(20), "sha256:abc", dtype="int8")
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest == {"format": "bertkit-embedding-index", "version": 1, "model_hash": "sha256:abc", "dim": 8,
                        "dtype": "int8", "count": 20, "normalized": True}
    assert isinstance(index.ids, np.memmap) and isinstance(index.scales, np.memmap)
    assert not index.vectors.flags.owndata                       # a view of the mapped file


def test_mismatched_model_or_dim_is_refused_naming_both(tmp_path):
    index = write_index(tmp_path / "idx", _unit(10, 8, 6), range(10), "sha256:built")
    with pytest.raises(IndexMismatch, match="sha256:other.*sha256:built"):
        index.search(_unit(1, 8, 7), model_hash="sha256:other")
    with pytest.raises(IndexMismatch, match="dim 16.*dim 8") as e:
        index.search(_unit(1, 16, 7))
    assert isinstance(e.value, BertkitError)


def test_rewrite_is_atomic_and_incomplete_writer_refuses(tmp_path):
    write_index(tmp_path / "idx", _unit(10, 8, 8), range(10), "old")
    writer = IndexWriter(tmp_path / "idx", 10, 8, "new")
    writer.add(_unit(5, 8, 9), range(5))
    with pytest.raises(DataError, match="5 vectors added, 10 declared"):
        writer.commit()
    assert EmbeddingIndex.open(tmp_path / "idx").manifest["model_hash"] == "old"   # the old index is intact
    writer.add(_unit(5, 8, 10), range(5, 10))
    assert writer.commit().manifest["model_hash"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]                   # no temp or old dirs left


def test_model_hash_follows_weights_and_config():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16)
    enc = SentenceEncoder(BertModel(cfg), Pooling("mean"), max_seq_length=16)
    h = model_hash(enc)
    assert h.startswith("sha256:") and h == model_hash(enc)
    assert model_hash(SentenceEncoder(enc.bert, Pooling("cls"), max_seq_length=16)) != h
    with torch.no_grad():
        enc.bert.encoder.layer[0].output.dense.bias[0] += 1e-3
    assert model_hash(enc) != h


def test_in_memory_search_equals_brute_force():
    from bertkit.embed.index import search_vectors
    corpus, queries = _unit(300, 16, 11), _unit(20, 16, 12)
    scores, rows = search_vectors(queries, corpus, k=7, corpus_block=33, query_block=6)
    ref_scores, ref_rows = _brute(corpus, queries, 7)
    assert np.array_equal(rows, ref_rows) and np.allclose(scores, ref_scores, atol=1e-6)


def test_model_hash_leaves_out_weights_the_checkpoint_did_not_hold(tmp_path):
    """A bare encoder loaded from an MLM checkpoint draws a fresh pooler at every load; no embedding reads it, so an
    index built from that directory is searched with the same hash (it was refused at every load)."""
    from bertkit import BertForMaskedLM
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16)
    BertForMaskedLM(cfg).save_pretrained(tmp_path)
    first, second = (BertModel.from_pretrained(tmp_path) for _ in range(2))
    assert first.loading_info["missing_keys"] and not torch.equal(first.pooler.dense.weight,
                                                                  second.pooler.dense.weight)
    assert model_hash(SentenceEncoder(first, Pooling("mean"), max_seq_length=16)) == \
        model_hash(SentenceEncoder(second, Pooling("mean"), max_seq_length=16))
