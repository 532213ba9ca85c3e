"""Original google-research/bert TensorFlow checkpoints -> HF-format directories, without importing TensorFlow.

    report = convert_tf_checkpoint("uncased_L-12_H-768_A-12/", "bert-base-uncased/")
    TFCheckpoint("model/bert_model.ckpt").read("bert/pooler/dense/kernel")     # a numpy array

A tensor bundle: `PREFIX.index` maps each variable name to its bytes in `PREFIX.data-NNNNN-of-MMMMM`. The index is a
LevelDB-style table: a 48-byte footer (varint handles of the metaindex and index blocks, padding, the magic); each
block followed by a type byte (0 raw; TF writes the index raw) and the masked CRC-32C of block + type; a block is
prefix-compressed entries (varint shared, unshared, value length; key bytes; value) then uint32 restart offsets and
their count; the index block maps separator keys to data block handles. The empty key holds a BundleHeaderProto
(1: num_shards, 2: endianness), every other value a BundleEntryProto (1: dtype, 2: shape {2: dim {1: size}},
3: shard_id, 4: offset, 5: size, 6: masked crc32c, 7: slices), both decoded from the protobuf wire format here.
Tensors are raw C-order bytes at [offset, offset + size). Names map onto the HF BERT state_dict (`hf_name`);
optimizer slots and `global_step` are skipped, any other variable is reported as unknown and left out.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bertkit.config import BertConfig
from bertkit.errors import BertkitError, CheckpointError
from bertkit.heads import BertForPreTraining
from bertkit.protobuf import Malformed as _Malformed, fields as _fields, varint as _varint
from bertkit.model import BertModel
from bertkit.tokenizer import Tokenizer, load_vocab

__all__ = ["TFCheckpoint", "convert_tf_checkpoint", "resolve_prefix", "hf_name", "crc32c"]

log = logging.getLogger("bertkit.tf_checkpoint")

_MAGIC = 0xDB4775248B80FB57
_FOOTER = 48
# TensorFlow DataType enum -> little-endian numpy dtype; bfloat16 (14) is widened by hand
_DTYPES = {1: "<f4", 2: "<f8", 3: "<i4", 4: "u1", 5: "<i2", 6: "i1", 9: "<i8", 10: "?", 14: "<u2", 19: "<f2"}
_DTYPE_NAMES = {7: "DT_STRING", 8: "DT_COMPLEX64", 18: "DT_COMPLEX128", 20: "DT_RESOURCE", 21: "DT_VARIANT"}
_SKIPPED = re.compile(r"(^|/)(adam_m|adam_v|Adam|Adam_1|global_step|beta1_power|beta2_power)$")  # optimizer state
_RENAMED = {"cls/predictions/output_bias": "cls.predictions.bias",
            "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
            "cls/seq_relationship/output_bias": "cls.seq_relationship.bias"}
_LEAVES = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}


# ---------------------------------------------------------------------------------------------- CRC-32C
def _crc_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0x82F63B78), t >> 1).astype(np.uint32)
    return t


_TABLE = _crc_table()
_TABLE_LIST = _TABLE.tolist()


def _zero_shift(n: int):
    """The linear map 'feed n zero bytes' on a raw CRC register, as a function of the register."""
    basis = np.uint32(1) << np.arange(32, dtype=np.uint32)
    for _ in range(n):
        basis = _TABLE[basis & 0xFF] ^ (basis >> 8)
    bits = (np.arange(256)[:, None] >> np.arange(8)) & 1            # (256, 8): the bits of each byte value
    # per byte of the register: the images of its set bits, xor-ed
    t0, t1, t2, t3 = (np.bitwise_xor.reduce(np.where(bits, basis[8 * j:8 * j + 8], np.uint32(0)), axis=1).tolist()
                      for j in range(4))
    return lambda r: t0[r & 0xFF] ^ t1[(r >> 8) & 0xFF] ^ t2[(r >> 16) & 0xFF] ^ t3[r >> 24]


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of bytes: lanes of the buffer side by side in numpy, each from zero, chained afterwards
    (the CRC is linear; a Python loop over bytes takes minutes: docs/performance.md)."""
    a = np.frombuffer(data, dtype=np.uint8)
    lanes = int(min(16384, max(1, len(a) // 256)))
    width = len(a) // lanes
    regs = np.zeros(lanes, dtype=np.uint32)
    for column in a[: lanes * width].reshape(lanes, width).T.copy():
        regs = _TABLE[(regs ^ column) & 0xFF] ^ (regs >> 8)
    shift, crc = _zero_shift(width), 0xFFFFFFFF
    for r in regs.tolist():
        crc = shift(crc) ^ r
    for b in a[lanes * width:].tolist():
        crc = _TABLE_LIST[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF  # TF stores CRCs masked


# ---------------------------------------------------------------------------------------------- wire formats
def _block(data: bytes, handle: bytes) -> bytes:
    """The contents of the table block a handle (varint offset, varint size) points at, checked."""
    offset, pos = _varint(handle, 0)
    size, _ = _varint(handle, pos)
    end = offset + size
    if end + 5 > len(data):
        raise _Malformed(f"block at offset {offset} (+{size} bytes) runs past the end of the file")
    if _masked(crc32c(data[offset:end + 1])) != int.from_bytes(data[end + 1:end + 5], "little"):
        raise _Malformed(f"checksum mismatch in the block at offset {offset}")
    if data[end] != 0:
        raise _Malformed(f"block at offset {offset} is compressed (type {data[end]}, snappy); only uncompressed "
                         f"indexes (what TensorFlow writes) are supported")
    return data[offset:end]


def _block_entries(block: bytes):
    """(key, value) pairs of one block; keys are prefix-compressed against the previous key."""
    if len(block) < 4:
        raise _Malformed("block shorter than its restart count")
    limit = len(block) - 4 - 4 * int.from_bytes(block[-4:], "little")
    pos, key = 0, b""
    if limit < 0:
        raise _Malformed("block restart array is longer than the block")
    while pos < limit:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        if shared > len(key) or pos + unshared + length > limit:
            raise _Malformed(f"bad block entry at byte {pos}")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + length]
        pos += length


def _read_table(data: bytes) -> dict[bytes, bytes]:
    """Every (key, value) of an SSTable held in memory."""
    if len(data) < _FOOTER or int.from_bytes(data[-8:], "little") != _MAGIC:
        raise _Malformed("not a TensorFlow checkpoint index (no table magic number at the end)")
    footer = data[-_FOOTER:]
    _, pos = _varint(footer, _varint(footer, 0)[1])  # the metaindex handle: no filters in a bundle index
    index = _block(data, footer[pos:])
    return {k: v for _, handle in _block_entries(index) for k, v in _block_entries(_block(data, handle))}


@dataclass
class BundleEntry:
    dtype: int = 0
    shape: tuple[int, ...] = ()
    shard: int = 0
    offset: int = 0
    size: int = 0
    crc: int | None = None
    sliced: bool = False


_ENTRY_FIELDS = {1: "dtype", 3: "shard", 4: "offset", 5: "size", 6: "crc"}


def _entry(buf: bytes) -> BundleEntry:
    e = BundleEntry()
    for num, value in _fields(buf):
        if num == 2:  # TensorShapeProto: repeated dim (2) {size (1)}
            e.shape = tuple(dict(_fields(dim)).get(1, 0) for n, dim in _fields(value) if n == 2)
        elif num == 7:
            e.sliced = True
        elif num in _ENTRY_FIELDS:
            setattr(e, _ENTRY_FIELDS[num], value)
    return e


# ---------------------------------------------------------------------------------------------- reader
class TFCheckpoint:
    """The tensors of a TF tensor-bundle checkpoint, by variable name (see the module docstring)."""

    def __init__(self, prefix) -> None:
        self.prefix = Path(prefix)
        self.index_path = Path(f"{self.prefix}.index")
        try:
            data = self.index_path.read_bytes()
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint index not found: {self.index_path}") from None
        except OSError as e:
            raise CheckpointError(f"cannot read {self.index_path}: {e.strerror}") from None
        try:
            table = _read_table(data)
            header = dict(_fields(table.pop(b"")))
            self.entries = {k.decode("utf-8"): _entry(v) for k, v in table.items()}
        except KeyError:
            raise CheckpointError(f"{self.index_path}: no bundle header (the empty key)") from None
        except (_Malformed, UnicodeDecodeError) as e:
            raise CheckpointError(f"{self.index_path}: {e}") from None
        self.num_shards = header.get(1, 0)
        self.big_endian = header.get(2, 0) == 1

    def names(self) -> list[str]:
        return sorted(self.entries)

    def shard_path(self, shard: int) -> Path:
        return Path(f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}")

    def read(self, name: str) -> np.ndarray:
        """One variable as a numpy array (bfloat16 widened to float32). Errors name the variable and file."""
        e = self.entries.get(name)
        if e is None:
            raise CheckpointError(f"{self.index_path}: no variable named {name!r}")
        if e.sliced:
            raise CheckpointError(f"{self.index_path}: {name} is a partitioned variable, which is not supported")
        if e.dtype not in _DTYPES:
            raise CheckpointError(f"{self.index_path}: {name} has unsupported dtype "
                                  f"{_DTYPE_NAMES.get(e.dtype, 'DataType')} ({e.dtype})")
        dtype = np.dtype(_DTYPES[e.dtype])
        dtype = dtype.newbyteorder(">") if self.big_endian else dtype
        if e.size != int(np.prod(e.shape)) * dtype.itemsize:
            raise CheckpointError(f"{self.index_path}: {name} has {e.size} bytes, not the {e.shape} "
                                  f"{dtype.name} it declares")
        raw = self._bytes(name, e)
        if e.crc is not None and _masked(crc32c(raw)) != e.crc:
            raise CheckpointError(f"{self.shard_path(e.shard)}: checksum mismatch in {name} (corrupt data file)")
        array = np.frombuffer(raw, dtype=dtype).reshape(e.shape)
        array = array.astype(dtype.newbyteorder("=")) if self.big_endian else array
        if e.dtype == 14:
            array = (array.astype(np.uint32) << 16).view(np.float32)
        return array

    def _bytes(self, name: str, e: BundleEntry) -> bytearray:
        path = self.shard_path(e.shard)
        raw = bytearray(e.size)
        try:
            with path.open("rb") as f:
                f.seek(e.offset)
                got = f.readinto(raw)
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint data file not found: {path} (listed by {self.index_path})") from None
        except OSError as e_:
            raise CheckpointError(f"cannot read {path}: {e_.strerror}") from None
        if got != e.size:
            raise CheckpointError(f"{path} is truncated: {name} needs bytes {e.offset}..{e.offset + e.size} but "
                                  f"the file ends at {path.stat().st_size}")
        return raw


def resolve_prefix(src) -> Path:
    """DIR, DIR/PREFIX, PREFIX.index or a PREFIX.data-* file -> the checkpoint prefix. A directory uses
    bert_model.ckpt, else the `checkpoint` file's model_checkpoint_path, else its only *.index file."""
    p = Path(src)
    m = re.fullmatch(r"(.*)\.(index|data-\d{5}-of-\d{5})", p.name)
    if m:
        return p.with_name(m.group(1))
    if not p.is_dir():
        if Path(f"{p}.index").is_file():
            return p
        raise CheckpointError(f"TensorFlow checkpoint not found: {p} is neither a directory nor a prefix with "
                              f"{p.name}.index next to it")
    if (p / "bert_model.ckpt.index").is_file():
        return p / "bert_model.ckpt"
    state = p / "checkpoint"
    if state.is_file():
        m = re.search(r'^model_checkpoint_path:\s*"(.*)"', state.read_text("utf-8", "replace"), re.M)
        if m and Path(f"{p / Path(m.group(1)).name}.index").is_file():
            return p / Path(m.group(1)).name
    found = sorted(p.glob("*.index"))
    if len(found) == 1:
        return found[0].with_suffix("")
    if not found:
        raise CheckpointError(f"no TensorFlow checkpoint in {p}: no *.index file")
    raise CheckpointError(f"{p} holds {len(found)} checkpoints ({', '.join(f.name for f in found)}); pass "
                          f"DIR/PREFIX to choose one")


# ---------------------------------------------------------------------------------------------- names
def hf_name(tf_name: str) -> tuple[str, bool] | None:
    """(HF state_dict key, transpose?) for a google-research/bert variable name; None for names it does not know."""
    if tf_name in _RENAMED:
        return _RENAMED[tf_name], False
    parts = [re.sub(r"^layer_(\d+)$", r"layer.\1", p) for p in tf_name.split("/")]
    if parts[:2] == ["bert", "embeddings"] and parts[-1].endswith("_embeddings") and len(parts) == 3:
        return ".".join(parts) + ".weight", False
    if parts[-1] not in _LEAVES or len(parts) < 2:
        return None
    return ".".join(parts[:-1] + [_LEAVES[parts[-1]]]), parts[-1] == "kernel"


def _plan(names: list[str]) -> tuple[dict[str, tuple[str, bool]], list[str], list[str]]:
    """({tf name: (hf key, transpose)}, skipped optimizer/step variables, unknown variables)."""
    mapped, skipped, unknown = {}, [], []
    for name in names:
        if _SKIPPED.search(name):
            skipped.append(name)
        elif (target := hf_name(name)) is None:
            unknown.append(name)
        else:
            mapped[name] = target
    return mapped, skipped, unknown


def _state_dict(ckpt: TFCheckpoint, mapped: dict, own: dict, config: BertConfig,
                config_path: Path) -> tuple[dict, list[str]]:
    """The model's state_dict from the checkpoint, shapes checked against the model built from the config."""
    state, unknown = {}, []
    strip = not any(k.startswith("bert.") for k in own)  # a bare BertModel has no "bert." prefix
    for name, (key, transpose) in mapped.items():
        key = key[len("bert."):] if strip and key.startswith("bert.") else key
        if key not in own:
            layer = re.match(r".*encoder\.layer\.\d+\.", key)
            if layer and not any(k.startswith(layer.group(0)) for k in own):
                raise CheckpointError(f"{ckpt.index_path}: {name} is beyond num_hidden_layers="
                                      f"{config.num_hidden_layers} in {config_path}")
            unknown.append(name)
            continue
        array = ckpt.read(name)
        array = array.T if transpose else array
        if tuple(array.shape) != tuple(own[key].shape):
            raise CheckpointError(f"{ckpt.index_path}: {name} has shape {tuple(array.shape)} (as {key}) but "
                                  f"{config_path} gives {tuple(own[key].shape)}")
        state[key] = torch.from_numpy(np.ascontiguousarray(array)).to(own[key].dtype)
    missing = sorted(set(own) - set(state))
    if missing:
        raise CheckpointError(f"{ckpt.index_path}: {len(missing)} weight(s) are missing, e.g. {missing[:5]}")
    return state, unknown


def convert_tf_checkpoint(src, out, *, config=None, vocab=None, overwrite: bool = False,
                          lowercase: bool | None = None) -> dict:
    """Write the HF-format directory `out` (config.json, model.safetensors, vocab.txt, tokenizer_config.json) from
    a google-research/bert checkpoint `src` (see resolve_prefix); `config` / `vocab` default to bert_config.json /
    vocab.txt beside it. BertForPreTraining when the checkpoint has the MLM and NSP heads, else BertModel.
    `lowercase=None` infers the tokenizer's casing from the vocab. Returns a report: model, counts, unknowns."""
    prefix = resolve_prefix(src)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BertkitError(f"output {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise BertkitError(f"output directory {out} is not empty; pass overwrite=True (--overwrite) to write into it")
    config_path = Path(config) if config is not None else prefix.parent / "bert_config.json"
    if not config_path.is_file():
        raise CheckpointError(f"BERT config not found: {config_path} (bert_config.json is looked for next to the "
                              f"checkpoint unless --config names it)")
    config = BertConfig.from_json(config_path)
    vocab_path = Path(vocab) if vocab is not None else prefix.parent / "vocab.txt"
    vocab = load_vocab(vocab_path)
    if len(vocab) > config.vocab_size:
        raise CheckpointError(f"{vocab_path} has {len(vocab)} tokens but {config_path} has vocab_size "
                              f"{config.vocab_size}")
    if lowercase is None:       # uncased vocabularies (bert-*-uncased) hold no upper-case letter outside [SPECIAL]s
        lowercase = not any(t[0] != "[" and any(c.isupper() for c in t) for t in vocab)
    tokenizer = Tokenizer(vocab, lowercase=lowercase)
    ckpt = TFCheckpoint(prefix)
    mapped, skipped, unknown = _plan(ckpt.names())
    heads = {v for v, _ in mapped.values()} >= {"cls.predictions.bias", "cls.seq_relationship.weight"}
    model = (BertForPreTraining if heads else BertModel)(config)
    state, extra = _state_dict(ckpt, mapped, model.state_dict(), config, config_path)
    model.load_state_dict(state, strict=True)
    model.save_pretrained(out, tokenizer=tokenizer)
    unknown = sorted(unknown + extra)
    if unknown:
        log.info("%s: %d variable(s) not converted (unknown to BERT): %s", ckpt.index_path, len(unknown),
                    ", ".join(unknown))
    return {"out": str(out), "checkpoint": str(prefix), "model": type(model).__name__, "converted": len(state),
            "skipped": len(skipped), "unknown": unknown, "lowercase": lowercase}
