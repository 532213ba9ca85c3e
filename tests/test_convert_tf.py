"""`bertkit convert`: google-research/bert TensorFlow checkpoints read without TensorFlow.

tests/fixtures/tf_bert_tiny/ was written by real TensorFlow (tests/fixtures/make_tf_checkpoint.py, with the
optimizer slots and global_step of a training checkpoint); expected.npz holds tensors as TensorFlow read them back
and the original model's outputs computed by TensorFlow. Smaller bundles for the edge cases are written here by
`_write_bundle`, a minimal tensor-bundle writer.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError, CheckpointError
from bertkit.heads import BertForPreTraining
from bertkit.model import BertModel
from bertkit.tf_checkpoint import TFCheckpoint, convert_tf_checkpoint, crc32c, hf_name, resolve_prefix
from bertkit.tokenizer import Tokenizer

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tf_bert_tiny"
SRC = Path(__file__).resolve().parents[1] / "src"
DATA = "bert_model.ckpt.data-00000-of-00001"


@pytest.fixture(scope="module")
def expected():
    return np.load(FIXTURE / "expected.npz")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("converted") / "hf"
    return out, convert_tf_checkpoint(FIXTURE, out)


@pytest.fixture()
def ckpt_copy(tmp_path) -> Path:
    d = tmp_path / "tf"
    shutil.copytree(FIXTURE, d)
    return d


def _cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "bertkit", "convert", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)


def _assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertkit convert: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# ---------------------------------------------------------------------------------------------- a bundle writer
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(num: int, value) -> bytes:
    if isinstance(value, bytes):
        return _varint(num << 3 | 2) + _varint(len(value)) + value
    return _varint(num << 3) + _varint(value)


def _masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _table_block(entries: list[tuple[bytes, bytes]]) -> bytes:
    """Every entry a restart point (no shared key prefix): valid, if larger than TF's own blocks."""
    body, restarts = b"", []
    for key, value in entries:
        restarts.append(len(body))
        body += _varint(0) + _varint(len(key)) + _varint(len(value)) + key + value
    return body + b"".join(struct.pack("<I", r) for r in restarts or [0]) + struct.pack("<I", len(restarts) or 1)


def _write_bundle(prefix: Path, tensors: dict, big_endian: bool = False, block_type: int = 0) -> None:
    """tensors: {name: (TF DataType number, numpy array whose bytes are stored as they are)}."""
    data, entries = bytearray(), [(b"", _field(1, 1) + (_field(2, 1) if big_endian else b""))]
    for name in sorted(tensors, key=str.encode):
        dtype, array = tensors[name]
        raw = array.tobytes()
        shape = b"".join(_field(2, _field(1, d)) for d in array.shape)
        proto = _field(1, dtype) + _field(2, shape) + _field(4, len(data)) + _field(5, len(raw))
        entries.append((name.encode(), proto + _varint(6 << 3 | 5) + struct.pack("<I", _masked(crc32c(raw)))))
        data += raw
    index = bytearray()

    def put(block: bytes, kind: int = 0) -> bytes:
        handle = _varint(len(index)) + _varint(len(block))
        index.extend(block + bytes([kind]) + struct.pack("<I", _masked(crc32c(block + bytes([kind])))))
        return handle

    data_handle = put(_table_block(entries), block_type)
    handles = put(_table_block([])) + put(_table_block([(b"\xff", data_handle)]))
    Path(f"{prefix}.index").write_bytes(bytes(index) + handles.ljust(40, b"\0") + struct.pack("<Q", 0xDB4775248B80FB57))
    Path(f"{prefix}.data-00000-of-00001").write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------- reader
def test_crc32c_matches_the_bitwise_definition():
    def bitwise(data: bytes) -> int:
        crc = 0xFFFFFFFF
        for b in data:
            crc ^= b
            for _ in range(8):
                crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        return crc ^ 0xFFFFFFFF

    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 255, 256, 257, 4096 + 3, 70_001):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert crc32c(data) == bitwise(data), n


def test_reader_returns_what_tensorflow_read(expected):
    ckpt = TFCheckpoint(FIXTURE / "bert_model.ckpt")
    assert len(ckpt.names()) == 3 * 46 + 1  # 46 weights, their adam_m and adam_v, global_step
    raw = [k for k in expected.files if k.startswith("raw:")]
    assert len(raw) == 7
    for key in raw:
        got, want = ckpt.read(key[len("raw:"):]), expected[key]
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), key
    assert int(ckpt.read("global_step")) == 1000


def test_names_map_onto_hf_keys():
    assert hf_name("bert/encoder/layer_11/attention/self/query/kernel") == (
        "bert.encoder.layer.11.attention.self.query.weight", True)
    assert hf_name("bert/embeddings/LayerNorm/gamma") == ("bert.embeddings.LayerNorm.weight", False)
    assert hf_name("bert/embeddings/position_embeddings") == ("bert.embeddings.position_embeddings.weight", False)
    assert hf_name("cls/predictions/output_bias") == ("cls.predictions.bias", False)
    assert hf_name("cls/seq_relationship/output_weights") == ("cls.seq_relationship.weight", False)
    assert hf_name("output_weights") is None and hf_name("bert/encoder/layer_0/relative") is None


def test_prefix_resolution(ckpt_copy):
    prefix = ckpt_copy / "bert_model.ckpt"
    assert resolve_prefix(ckpt_copy) == prefix == resolve_prefix(prefix) == resolve_prefix(f"{prefix}.index")
    assert resolve_prefix(ckpt_copy / DATA) == prefix
    for suffix in (".index", ".data-00000-of-00001"):
        os.rename(f"{prefix}{suffix}", ckpt_copy / f"model.ckpt-1000{suffix}")
    assert resolve_prefix(ckpt_copy) == ckpt_copy / "model.ckpt-1000"  # the only *.index
    shutil.copy(ckpt_copy / "model.ckpt-1000.index", ckpt_copy / "model.ckpt-500.index")
    with pytest.raises(CheckpointError, match="2 checkpoints"):
        resolve_prefix(ckpt_copy)
    (ckpt_copy / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-1000"\n'
                                          'all_model_checkpoint_paths: "model.ckpt-500"\n')
    assert resolve_prefix(ckpt_copy) == ckpt_copy / "model.ckpt-1000"


# ---------------------------------------------------------------------------------------------- conversion
def test_converted_model_matches_tensorflow_and_transformers(converted, expected):
    transformers = pytest.importorskip("transformers")
    out, report = converted
    assert report["model"] == "BertForPreTraining" and report["unknown"] == []
    assert report["converted"] == 46 and report["skipped"] == 93 and report["lowercase"] is True
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                                     "vocab.txt"]
    assert (out / "vocab.txt").read_bytes() == (FIXTURE / "vocab.txt").read_bytes()
    config = json.loads((out / "config.json").read_text())
    for key, value in json.loads((FIXTURE / "bert_config.json").read_text()).items():
        assert config[key] == value, key

    ours = BertForPreTraining.from_pretrained(out)
    assert ours.loading_info["missing_keys"] == []
    kernel = expected["raw:bert/encoder/layer_1/attention/self/query/kernel"]
    assert np.array_equal(ours.state_dict()["bert.encoder.layer.1.attention.self.query.weight"].numpy(), kernel.T)
    theirs, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    theirs.eval()

    ids, types, mask = (torch.from_numpy(expected[k]).long() for k in ("input_ids", "token_type_ids",
                                                                        "attention_mask"))
    with torch.no_grad():
        a = ours(ids, types, mask, output_hidden_states=True)
        b = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()  # padded positions differ by design (mask value), so only real tokens are compared
    assert len(a.hidden_states) == len(b.hidden_states) == 3
    for x, y in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(x[real], y[real], atol=1e-5, rtol=0)
    # the TensorFlow forward pass of the original model on the raw TF values
    torch.testing.assert_close(a.hidden_states[-1][real], torch.from_numpy(expected["sequence_output"])[real],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(a.prediction_logits[real], torch.from_numpy(expected["mlm_logits"])[real],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(a.seq_relationship_logits, torch.from_numpy(expected["nsp_logits"]),
                               atol=1e-5, rtol=0)
    assert Tokenizer.from_pretrained(out).lowercase


def test_headless_half_precision_bundle_with_unknown_variable(tmp_path, expected):
    """No cls/ heads -> BertModel; float16 / bfloat16 tensors are widened; unknown variables are reported."""
    ckpt = TFCheckpoint(FIXTURE / "bert_model.ckpt")
    tensors = {n: (1, ckpt.read(n)) for n in ckpt.names() if n.startswith("bert/") and "adam" not in n}
    word = tensors["bert/embeddings/word_embeddings"][1]
    tensors["bert/embeddings/word_embeddings"] = (19, word.astype(np.float16))
    pooler = tensors["bert/pooler/dense/kernel"][1]
    tensors["bert/pooler/dense/kernel"] = (14, (pooler.view(np.uint32) >> 16).astype(np.uint16))
    tensors["output_weights"] = (1, np.ones((3, 32), np.float32))  # a run_classifier head: not BERT's
    src = tmp_path / "tf"
    src.mkdir()
    for name in ("bert_config.json", "vocab.txt"):
        shutil.copy(FIXTURE / name, src)
    _write_bundle(src / "bert_model.ckpt", tensors)

    report = convert_tf_checkpoint(src, tmp_path / "hf")
    assert report["model"] == "BertModel" and report["unknown"] == ["output_weights"]
    model = BertModel.from_pretrained(tmp_path / "hf")
    sd = model.state_dict()
    assert torch.equal(sd["embeddings.word_embeddings.weight"], torch.from_numpy(word.astype(np.float16)).float())
    truncated = (pooler.view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert torch.equal(sd["pooler.dense.weight"], torch.from_numpy(truncated.T.copy()))
    transformers = pytest.importorskip("transformers")
    _, info = transformers.BertModel.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"]


def test_big_endian_unsupported_dtype_and_compressed_index(tmp_path):
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    _write_bundle(tmp_path / "be", {"w": (1, values.astype(">f4"))}, big_endian=True)
    assert np.array_equal(TFCheckpoint(tmp_path / "be").read("w"), values)
    _write_bundle(tmp_path / "str", {"bert/embeddings/word_embeddings": (7, np.zeros(4, np.uint8))})
    with pytest.raises(CheckpointError, match=r"bert/embeddings/word_embeddings has unsupported dtype DT_STRING"):
        TFCheckpoint(tmp_path / "str").read("bert/embeddings/word_embeddings")
    _write_bundle(tmp_path / "snappy", {"w": (1, values)}, block_type=1)
    with pytest.raises(CheckpointError, match=r"snappy\.index: .*compressed"):
        TFCheckpoint(tmp_path / "snappy")


# ---------------------------------------------------------------------------------------------- user errors
def test_truncated_data_file(ckpt_copy, tmp_path):
    data = ckpt_copy / DATA
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"{DATA} is truncated: .* needs bytes"):
        convert_tf_checkpoint(ckpt_copy, tmp_path / "out")
    _assert_one_line_error(_cli(ckpt_copy, tmp_path / "out2"), "is truncated")


def test_corrupt_data_and_index(ckpt_copy, tmp_path):
    data = bytearray((ckpt_copy / DATA).read_bytes())
    data[100] ^= 0xFF  # the first tensor, bert/embeddings/LayerNorm/beta, is converted
    (ckpt_copy / DATA).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch in bert/embeddings/LayerNorm/beta"):
        convert_tf_checkpoint(ckpt_copy, tmp_path / "out")
    index = ckpt_copy / "bert_model.ckpt.index"
    index.write_bytes(index.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="not a TensorFlow checkpoint index"):
        TFCheckpoint(ckpt_copy / "bert_model.ckpt")


def test_missing_files(ckpt_copy, tmp_path):
    (ckpt_copy / DATA).unlink()
    with pytest.raises(CheckpointError, match=f"data file not found: .*{DATA}"):
        convert_tf_checkpoint(ckpt_copy, tmp_path / "a")
    (ckpt_copy / "bert_model.ckpt.index").unlink()
    with pytest.raises(CheckpointError, match=r"no TensorFlow checkpoint in .*no \*\.index"):
        convert_tf_checkpoint(ckpt_copy, tmp_path / "b")
    _assert_one_line_error(_cli(ckpt_copy / "bert_model.ckpt", tmp_path / "c"), "bert_model.ckpt.index")
    for name in ("bert_model.ckpt.index", DATA):
        shutil.copy(FIXTURE / name, ckpt_copy)
    (ckpt_copy / "bert_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"BERT config not found: .*bert_config\.json"):
        convert_tf_checkpoint(ckpt_copy, tmp_path / "d")
    assert not any((tmp_path / n).exists() for n in "abd")
    shutil.move(ckpt_copy / "vocab.txt", tmp_path / "my-vocab.txt")  # as in a run_pretraining output directory
    report = convert_tf_checkpoint(ckpt_copy, tmp_path / "e", config=FIXTURE / "bert_config.json",
                                   vocab=tmp_path / "my-vocab.txt", lowercase=False)
    assert report["model"] == "BertForPreTraining" and not Tokenizer.from_pretrained(tmp_path / "e").lowercase


def test_config_that_does_not_fit(ckpt_copy, tmp_path):
    config = json.loads((ckpt_copy / "bert_config.json").read_text())
    (ckpt_copy / "bert_config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    with pytest.raises(CheckpointError, match=r"intermediate/dense/bias has shape \(64,\) .*json gives \(128,\)"):
        convert_tf_checkpoint(ckpt_copy, tmp_path / "a")
    (ckpt_copy / "bert_config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.raises(CheckpointError, match="layer_1/.* beyond num_hidden_layers=1"):
        convert_tf_checkpoint(ckpt_copy, tmp_path / "b")


def test_cli_refuses_a_non_empty_out_without_overwrite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    _assert_one_line_error(_cli(FIXTURE, out), str(out), "--overwrite")
    with pytest.raises(BertkitError, match="not empty"):
        convert_tf_checkpoint(FIXTURE, out)
    proc = _cli(FIXTURE, out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert "BertForPreTraining, 46 tensors" in proc.stdout
    assert (out / "model.safetensors").is_file() and (out / "keep.txt").is_file()
