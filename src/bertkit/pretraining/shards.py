"""Examples on disk as numpy shards, and the reader that turns them into training batches (the directory's files,
its crash safety and the reader's order: docs/pretraining.md, "Shard directory").

Plain .npy files without pickle, so the reader memory-maps them; each epoch's order is a seeded permutation computed,
not stored (`permute`), so memory does not grow with the corpus; `state_dict()` = (epoch, batches consumed): exact
resume."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bertkit.atomic import write_bytes, write_json
from bertkit.errors import DataError
from bertkit.options import with_options
from bertkit.pretraining.examples import TASKS
from bertkit.pretraining.masking import MaskingConfig, VocabTables, example_keys, mask_batch, splitmix64
from bertkit.tokenizer import Tokenizer
from bertkit.textfiles import check_fields
from bertkit.tokenizer.inputs import row_masks

__all__ = ["ShardWriter", "ShardReader", "ReaderOptions", "read_manifest", "write_manifest", "MANIFEST",
           "FORMAT_VERSION", "file_sha256"]

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ---------------------------------------------------------------------------------------------------------- writer

class ShardWriter:
    """Collects examples (token rows + meta [+ static masks]) and writes a shard every `examples_per_shard`."""

    def __init__(self, out_dir: str | Path, prefix: str, seq_len: int, vocab_size: int, pad_id: int,
                 max_predictions: int | None = None, examples_per_shard: int = 65536):
        self.out_dir, self.prefix, self.examples_per_shard = Path(out_dir), prefix, examples_per_shard
        n, ids = examples_per_shard, np.uint16 if vocab_size <= 65536 else np.int32
        # a buffer per .npy file of a shard, reused shard after shard: every row is overwritten whole
        self._buffers = {"tokens": np.full((n, seq_len), pad_id, dtype=ids), "meta": np.zeros((n, 3), dtype=np.int32)}
        if max_predictions is not None:               # static masking: the masked positions and the ids shown there
            self._buffers.update(mask_pos=np.zeros((n, max_predictions), dtype=np.uint16),
                                 mask_ids=np.zeros((n, max_predictions), dtype=ids))
        self.shards: list[dict] = []                  # manifest entries of written shards
        self._n = 0

    def add_batch(self, tokens2d: np.ndarray, meta: np.ndarray, pos2d=None, ids2d=None) -> None:
        """Many examples at once: tokens2d (B, S) padded rows, meta (B, 3), static masks (B, P) each."""
        arrays = dict(zip(self._buffers, (tokens2d, meta, pos2d, ids2d)))
        start = 0
        while start < len(tokens2d):
            take = min(len(tokens2d) - start, self.examples_per_shard - self._n)
            for field, buf in self._buffers.items():
                buf[self._n:self._n + take] = arrays[field][start:start + take]
            self._n += take
            start += take
            if self._n == self.examples_per_shard:
                self.flush()

    def flush(self) -> None:
        if self._n == 0:
            return
        name = f"{self.prefix}-{len(self.shards):05d}"
        files = {}
        for field, buf in self._buffers.items():
            path, out = self.out_dir / f"{name}.{field}.npy", io.BytesIO()
            np.save(out, buf[:self._n], allow_pickle=False)
            data = out.getvalue()                   # one copy of the bytes, written and hashed (not read back)
            write_bytes(path, data, sync=False)
            files[field] = {"file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        entry = {"name": name, "examples": int(self._n), "files": files}
        write_json(self.out_dir / f"{name}.done.json", entry, indent=1, sync=False)   # write_manifest syncs
        self.shards.append(entry)
        self._n = 0

    def close(self) -> list[dict]:
        self.flush()
        return self.shards


def write_manifest(out_dir: str | Path, manifest: dict) -> Path:
    os.sync()       # the shards, written unsynced (an fsync each made one-example shards 100x slower), reach the disk
    return write_json(Path(out_dir) / MANIFEST, manifest, indent=1)


def read_manifest(shard_dir: str | Path, strict: bool = False) -> dict:
    """The shard directory's manifest (format and version checked); `strict`: also every field the reader uses."""
    shard_dir = Path(shard_dir)
    path = shard_dir / MANIFEST
    if not shard_dir.is_dir():
        raise DataError(f"shard directory {shard_dir} does not exist")
    if not path.exists():
        partial = sorted(p.name for p in shard_dir.iterdir() if ".tmp-" in p.name or p.name.endswith(".done.json"))
        raise DataError(f"{shard_dir} has no {MANIFEST}: the build did not finish (killed?) or this is not a shard "
                        f"directory ({len(partial)} shard marker / temp files present); rebuild it with bertkit prepare")
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:     # ValueError: bad JSON or bad UTF-8
        raise DataError(f"{path} is not valid JSON: {type(e).__name__}: {str(e)[:120]}") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{path}: not a bertkit shard manifest (a JSON {type(manifest).__name__}, not an object)")
    if manifest.get("format") != "bertkit-pretraining-shards" or manifest.get("version") != FORMAT_VERSION:
        raise DataError(f"{path}: not a bertkit shard manifest of version {FORMAT_VERSION} "
                        f"(format={str(manifest.get('format'))[:40]!r}, version={str(manifest.get('version'))[:20]!r})")
    if strict:
        _check_fields(path, manifest)
    return manifest


_MANIFEST_FIELDS = {"vocab_hash": "name", "vocab_size": "count", "seq_len": "count", "task": "name",
                    "masking": "object", "shards": "list"}
_SHARD_FIELDS = {"name": "name", "examples": "count", "files": "object"}
_FILE_FIELDS = {"file": "name", "bytes": "count", "sha256": "name"}


def _check_fields(path: Path, m: dict) -> None:
    """DataError naming the first manifest field the reader uses that is missing or of the wrong type; shard file
    names must be plain names inside the shard directory."""
    check_fields(m, _MANIFEST_FIELDS, str(path))
    if m["task"] not in TASKS:
        raise DataError(f"{path}: task {m['task'][:40]!r} is not one of {', '.join(TASKS)}")
    for i, entry in enumerate(m["shards"]):
        where = f"shards[{i}]."
        check_fields(entry, _SHARD_FIELDS, str(path), prefix=where)
        for name in ("tokens", "meta"):
            if name not in entry["files"]:
                raise DataError(f"{path}: {where}files lacks {name!r}")
        for name, info in entry["files"].items():
            check_fields(info, _FILE_FIELDS, str(path), prefix=f"{where}files.{name}.")
            if Path(info["file"]).name != info["file"] or info["file"] in ("", ".", ".."):
                raise DataError(f"{path}: {where}files.{name}.file={info['file']!r} is not a file name in the shard "
                                f"directory: refused")


# ---------------------------------------------------------------------------------------------------------- reader

def permute(positions: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """A seeded pseudo-random permutation of [0, n), evaluated only at `positions`: O(batch) memory however many
    examples there are (an explicit permutation of 100M examples would take 800 MB per rank).

    A 4-round Feistel network on 2h-bit numbers (2^2h >= n; the round function is splitmix64 of the right half and
    a round key from (seed, epoch)) is a bijection of [0, 2^2h); "cycle walking" (apply it again while the result
    is >= n) restricts it to a bijection of [0, n). 2^2h < 4n, so a value walks fewer than 4 times on average.
    """
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    round_keys = example_keys(seed, epoch, np.arange(4) + (1 << 40))          # (4,) uint64
    x = np.asarray(positions, dtype=np.uint64).copy()
    todo = np.ones(len(x), dtype=bool)
    while todo.any():
        y = x[todo]
        for k in round_keys:
            left, right = y >> shift, y & mask
            y = (right << shift) | (left ^ (splitmix64(right ^ k) & mask))
        x[todo] = y
        todo = x >= np.uint64(n)
    return x.astype(np.int64)


def _open_shard(shard_dir: Path, entry: dict, verify: str, seq_len: int) -> dict[str, np.ndarray]:
    """A shard's arrays by field (tokens, meta [, mask_pos, mask_ids]), memory-mapped, checked against the manifest."""
    name = entry.get("name", "?")
    if not (shard_dir / f"{name}.done.json").exists():
        raise DataError(f"shard {name} in {shard_dir} has no completeness marker {name}.done.json: it was not "
                        "written to the end; rebuild the shards")
    arrays = {}
    for field, info in entry["files"].items():
        path = shard_dir / info["file"]
        if not path.exists():
            raise DataError(f"shard file {path} is missing")
        size = path.stat().st_size
        if size != info["bytes"]:
            raise DataError(f"shard file {path} has {size} bytes, the manifest says {info['bytes']}: truncated or "
                            "overwritten; rebuild the shards")
        if verify == "full" and file_sha256(path) != info["sha256"]:
            raise DataError(f"shard file {path} fails its sha256 check: corrupt; rebuild the shards")
        try:
            arrays[field] = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise DataError(f"shard file {path} is not a valid .npy array: {e}") from None
    n = entry["examples"]
    tokens, meta = arrays["tokens"], arrays["meta"]
    if tokens.shape != (n, seq_len) or meta.shape != (n, 3):
        raise DataError(f"shard {name}: arrays of shape {tokens.shape} / {meta.shape}, expected ({n}, {seq_len}) / "
                        f"({n}, 3)")
    return arrays


def _check_vocab(shard_dir: Path, m: dict, vocab_hash: str | None, vocab_size: int | None) -> None:
    """DataError unless the shards' vocab is the model's (same hash) and fits its embedding table."""
    if vocab_hash is not None and vocab_hash != m["vocab_hash"]:
        raise DataError(f"{shard_dir}: shards were built with vocab {m['vocab_hash'][:12]}… (size {m['vocab_size']}),"
                        f" but the model's tokenizer has vocab {vocab_hash[:12]}…: token ids would mean other "
                        "tokens; rebuild the shards with this vocab (bertkit prepare --vocab ...)")
    if vocab_size is not None and vocab_size < m["vocab_size"]:     # a model vocab padded to a multiple of 8 is fine
        raise DataError(f"{shard_dir}: shards were built with a vocab of {m['vocab_size']} tokens, the model has "
                        f"vocab_size={vocab_size}: ids would fall outside its embedding table")


@dataclass
class ReaderOptions:
    """How a ShardReader walks its shards; every field can also be given to ShardReader as a keyword."""
    seed: int = 0
    rank: int = 0                    # this process's share: every world_size-th example of the epoch's order
    world_size: int = 1
    shuffle: bool = True
    drop_last: bool = True           # every batch full (and every rank the same number of batches)
    infinite: bool = False           # iterating goes on past the epoch's end
    vocab_hash: str | None = None    # the model tokenizer's: the shards must have been built with the same vocab
    vocab_size: int | None = None    # the model's embedding rows: at least the shards' vocab size
    verify: str = "size"             # "size": file sizes against the manifest; "full": also sha256 (reads it all)
    masking: MaskingConfig | None = None  # masks drawn at batch time instead of the shards' own (static ones too)
    sentence_labels: bool = True     # NSP / SOP shards' next_sentence_label in the batches (False: MLM-only training)

    def __post_init__(self):
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise DataError(f"rank={self.rank} / world_size={self.world_size}: need 0 <= rank < world_size")
        if self.verify not in ("size", "full"):
            raise DataError(f"verify={self.verify!r} must be 'size' or 'full'")


class ShardReader:
    """Batches from a shard directory (docs/pretraining.md, "Shard directory"). Iterating runs the rest of the
    current epoch and then moves to the next one (`infinite=True`: keeps going).

        ShardReader("shards/", 32, seed=1)                    # keywords: the fields of ReaderOptions
        ShardReader("shards/", 32, ReaderOptions(seed=1, rank=r, world_size=w), shuffle=False)
    """

    def __init__(self, shard_dir: str | Path, batch_size: int, options: ReaderOptions | None = None, **overrides):
        opts = with_options(ReaderOptions, options, overrides, "ShardReader")
        if batch_size < 1:
            raise DataError(f"batch_size={batch_size} must be >= 1")
        self.dir = Path(shard_dir)
        self.manifest = read_manifest(self.dir, strict=True)
        m = self.manifest
        _check_vocab(self.dir, m, opts.vocab_hash, opts.vocab_size)
        self.seq_len, self.task = int(m["seq_len"]), m["task"]
        try:
            self.masking = MaskingConfig(**m["masking"])
        except TypeError as e:
            raise DataError(f"{self.dir / MANIFEST}: masking: {e}") from None
        self.remasked = opts.masking is not None       # stored static masks are ignored, drawn from the tokens
        if self.remasked:
            self.masking = replace(opts.masking, dynamic=True)
        if (self.dir / "tokenizer.json").is_file():    # a BPE / Unigram vocabulary: its tokenizer knows its specials
            self.tables = VocabTables.from_tokenizer(Tokenizer.from_pretrained(self.dir))
        else:
            self.tables = VocabTables.from_vocab_file(self.dir / "vocab.txt")
        if self.tables.vocab_size != m["vocab_size"]:
            raise DataError(f"{self.dir / 'vocab.txt'} has {self.tables.vocab_size} tokens, manifest says {m['vocab_size']}")
        self._shards = [_open_shard(self.dir, e, opts.verify, self.seq_len) for e in m["shards"]]
        self._token_counts: np.ndarray | None = None        # token_counts(), read once (unigram bias, softmax ids)
        counts = np.array([e["examples"] for e in m["shards"]], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self.num_examples = int(self._starts[-1])
        if self.num_examples == 0:
            raise DataError(f"{self.dir}: the shards hold no examples")
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, opts.seed, opts.rank, opts.world_size
        self.shuffle, self.drop_last, self.infinite = opts.shuffle, opts.drop_last, opts.infinite
        self.sentence_labels = opts.sentence_labels and self.task != "none"
        self.per_rank = self.num_examples // self.world_size
        if self.per_rank == 0 or (self.drop_last and self.per_rank < batch_size):
            raise DataError(f"{self.dir}: {self.num_examples} examples are too few for world_size={self.world_size} "
                            f"x batch_size={batch_size}")
        self.epoch, self.position = 0, 0

    # ------------------------------------------------------------------------------------------------- order

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        full, rest = divmod(self.per_rank, self.batch_size)
        return full + (0 if self.drop_last or rest == 0 else 1)

    def indices(self, epoch: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Global example indices at this rank's positions [start, stop) of `epoch` (default: the whole epoch)."""
        stop = self.per_rank if stop is None else min(stop, self.per_rank)
        positions = self.rank + self.world_size * np.arange(start, stop, dtype=np.int64)
        if not self.shuffle:
            return positions
        return permute(positions, self.num_examples, self.seed, epoch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = int(epoch), 0

    def batch_indices(self, epoch: int, b: int) -> np.ndarray:
        """Global example indices of this rank's batch `b` of `epoch`."""
        return self.indices(epoch, b * self.batch_size, (b + 1) * self.batch_size)

    def __iter__(self):
        while True:
            n_batches = len(self)
            while self.position < n_batches:
                b = self.position
                self.position += 1          # counted before the yield: a state_dict taken now resumes after it
                yield self.batch(self.batch_indices(self.epoch, b), self.epoch)
            self.epoch, self.position = self.epoch + 1, 0
            if not self.infinite:
                return

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size, "num_examples": self.num_examples,
                "shuffle": self.shuffle}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "world_size", "batch_size", "num_examples", "shuffle"):
            if state.get(key) != getattr(self, key):
                raise DataError(f"cannot resume data position: state has {key}={state.get(key)!r}, this reader "
                                f"{key}={getattr(self, key)!r}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def token_counts(self, chunk: int = 4096) -> np.ndarray:
        """(V,) int64: how often each id occurs in the rows of every shard (padding excluded, all ranks' rows).
        Read once per reader; each call returns its own copy."""
        if self._token_counts is None:
            counts = np.zeros(self.tables.vocab_size, dtype=np.int64)
            for sh in self._shards:
                for a in range(0, len(sh["meta"]), chunk):
                    tokens = np.asarray(sh["tokens"][a:a + chunk], dtype=np.int64)               # (rows, S)
                    inside = np.arange(tokens.shape[1])[None, :] < np.asarray(sh["meta"][a:a + chunk, 0])[:, None]
                    counts += np.bincount(tokens[inside], minlength=len(counts))[:len(counts)]
            self._token_counts = counts
        return self._token_counts.copy()

    # ------------------------------------------------------------------------------------------------- batches

    def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Rows of global example `indices`: tokens (B, S) int64, meta (B, 3), static mask pos / ids or None."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_examples):
            raise IndexError(f"example index out of range [0, {self.num_examples})")
        shard_of = np.searchsorted(self._starts, indices, side="right") - 1
        static = "mask_pos" in self._shards[0] and not self.remasked
        fields = ("tokens", "meta", "mask_pos", "mask_ids") if static else ("tokens", "meta")
        out = {f: np.empty((len(indices), self._shards[0][f].shape[1]), dtype=np.int64) for f in fields}
        for s in np.unique(shard_of):
            rows = np.flatnonzero(shard_of == s)
            local = indices[rows] - self._starts[s]
            order = np.argsort(local)                     # ascending reads are kinder to the page cache
            rows, local = rows[order], local[order]
            for f in fields:
                out[f][rows] = self._shards[s][f][local]
        return out["tokens"], out["meta"], out.get("mask_pos"), out.get("mask_ids")

    def batch(self, indices: np.ndarray, epoch: int = 0) -> dict:
        """The batch dict (torch tensors) for global example `indices` in `epoch`."""
        import torch

        from bertkit.heads import IGNORE_INDEX      # deferred: torch; writing shards (prepare) needs numpy only

        tokens, meta, pos, ids = self.gather(indices)
        length, a_len, label = meta[:, 0], meta[:, 1], meta[:, 2]
        attention, types = row_masks(length, a_len, self.seq_len)                  # (B, S) each
        if pos is None:                                                             # dynamic: draw now
            keys = example_keys(self.seed, epoch, indices)
            inputs, chosen = mask_batch(tokens, length, keys, self.masking, self.tables)
        else:                                                                       # static: stored masks
            inputs, chosen = tokens.copy(), np.zeros_like(attention)
            r, c = np.nonzero(pos)
            inputs[r, pos[r, c]] = ids[r, c]
            chosen[r, pos[r, c]] = True
        labels = np.where(chosen, tokens, IGNORE_INDEX)
        out = {"input_ids": torch.from_numpy(inputs),
               "token_type_ids": torch.from_numpy(types.astype(np.int64)),
               "attention_mask": torch.from_numpy(attention.astype(np.int64)),
               "labels": torch.from_numpy(labels)}
        if self.sentence_labels:
            out["next_sentence_label"] = torch.from_numpy(label.copy())
        return out


_OWN_FILE = re.compile(r"^(manifest\.json|vocab\.txt|w\d+-\d+\.(tokens|meta|mask_pos|mask_ids)\.npy|w\d+-\d+\.done\.json)$")


def remove_partial(out_dir: Path) -> None:
    """Delete what a bertkit build leaves in `out_dir` (shards, markers, temp files, manifest); nothing else."""
    for p in out_dir.iterdir():
        name = p.name[1:].split(".tmp-")[0] if p.name.startswith(".") and ".tmp-" in p.name else p.name
        if p.is_file() and _OWN_FILE.match(name):
            p.unlink()
