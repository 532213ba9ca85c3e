"""An exact embedding index on disk: vectors + ids + a manifest, searched block by block from a memory map.

    index/
      manifest.json    {"format", "version", "model_hash", "dim", "dtype", "count", "normalized"}
      vectors.npy      (count, dim) float32 | float16 | int8
      scales.npy       (count,) float32, int8 only: vector i = vectors[i] * scales[i]
      ids.npy          (count,) unicode strings

    write_index("index/", vectors, ids, model_hash=model_hash(encoder), dtype="float16")
    EmbeddingIndex.open("index/").search(query_vectors, k=10, model_hash=model_hash(encoder))   # scores, rows, ids

A directory is written under a temporary name and renamed into place, so a reader never sees half an index. Search
is an exact dot product (cosine for normalised vectors) over blocks of `corpus_block` rows merged into a running top
k, so memory holds one block's scores, never queries x corpus; a finished block's pages leave the resident set.
A query from a model whose hash or dimension differs from the index's raises `IndexMismatch` naming both.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from bertkit.errors import ConfigError, DataError

__all__ = ["INDEX_SOURCE", "EmbeddingIndex", "IndexWriter", "IndexMismatch", "SearchResult", "write_index",
           "model_hash", "search_vectors", "DTYPES"]

INDEX_SOURCE = "bertkit_source.json"       # beside an index `bertkit embed` built: its model and encoder settings

FORMAT = "bertkit-embedding-index"
VERSION = 1
DTYPES = ("float32", "float16", "int8")


class IndexMismatch(ConfigError):
    """The query model (or query vectors) does not fit the index."""


def model_hash(model: nn.Module) -> str:
    """sha256 over the encoder's config (BERT config.json fields, pooling, normalisation, dense layers) and every
    weight's bytes: two models give the same vectors for the same text only if their hashes agree. Weights the
    checkpoint did not hold (the pooler an MLM checkpoint lacks) are left out: they are a fresh random draw at every
    load, and no embedding reads them."""
    h = hashlib.sha256()
    bert = getattr(model, "bert", model)
    fresh = set(getattr(bert, "loading_info", {}).get("missing_keys", ()))
    desc = {"config": bert.config.to_dict() if hasattr(bert, "config") else None,
            "pooling": list(getattr(getattr(model, "pooling", None), "modes", ())),
            "normalize": bool(getattr(model, "normalize", False)),
            "max_seq_length": getattr(model, "max_seq_length", None)}
    h.update(json.dumps(desc, sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        if name in fresh or name.split(".", 1)[-1] in fresh:       # the encoder's own name, or under `bert.`
            continue
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return "sha256:" + h.hexdigest()


def _quantize(v: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(n, dim) float -> stored rows (and per-row scales for int8)."""
    if dtype != "int8":
        return v.astype(dtype), None
    scale = np.abs(v).max(axis=1).astype(np.float32) / 127.0                       # (n,)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(v / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


class IndexWriter:
    """Fills an index of a known size chunk by chunk (`add`), then `commit()` renames it into place."""

    def __init__(self, directory, count: int, dim: int, model_hash: str, dtype: str = "float16",
                 normalized: bool = True):
        if dtype not in DTYPES:
            raise ConfigError(f"index dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        if count <= 0 or dim <= 0:
            raise ConfigError(f"an index needs count > 0 and dim > 0, got count={count}, dim={dim}")
        self.final = Path(directory)
        self.tmp = self.final.with_name(f".{self.final.name}.tmp-{os.getpid()}")
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        self.manifest = {"format": FORMAT, "version": VERSION, "model_hash": model_hash, "dim": dim,
                         "dtype": dtype, "count": count, "normalized": normalized}
        self.vectors = np.lib.format.open_memmap(self.tmp / "vectors.npy", mode="w+", dtype=dtype,
                                                 shape=(count, dim))
        self.scales = (np.lib.format.open_memmap(self.tmp / "scales.npy", mode="w+", dtype=np.float32,
                                                 shape=(count,)) if dtype == "int8" else None)
        self.ids: list[str] = []

    def add(self, vectors: np.ndarray, ids: Sequence) -> None:
        v = np.asarray(vectors, dtype=np.float32)
        n, start = v.shape[0], len(self.ids)
        if v.ndim != 2 or v.shape[1] != self.manifest["dim"]:
            raise IndexMismatch(f"vectors of shape {v.shape} do not fit an index of dim {self.manifest['dim']}")
        if len(ids) != n:
            raise DataError(f"{n} vectors but {len(ids)} ids")
        if start + n > self.manifest["count"]:
            raise DataError(f"more than the declared {self.manifest['count']} vectors")
        self.vectors[start:start + n], scale = _quantize(v, self.manifest["dtype"])
        if scale is not None:
            self.scales[start:start + n] = scale
        self.ids.extend(str(i) for i in ids)

    def commit(self) -> "EmbeddingIndex":
        if len(self.ids) != self.manifest["count"]:
            raise DataError(f"{len(self.ids)} vectors added, {self.manifest['count']} declared")
        self.vectors.flush()
        if self.scales is not None:
            self.scales.flush()
        del self.vectors, self.scales
        old = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
        try:
            np.save(self.tmp / "ids.npy", np.array(self.ids, dtype=str))
            (self.tmp / "manifest.json").write_text(json.dumps(self.manifest, indent=2) + "\n", encoding="utf-8")
            if self.final.exists():                      # a directory cannot be renamed over a non-empty one
                os.replace(self.final, old)
            try:
                os.replace(self.tmp, self.final)
            except BaseException:
                if old.exists():                         # the earlier index goes back
                    os.replace(old, self.final)
                raise
        except BaseException:       # a full disk: no half index left beside the earlier one
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        shutil.rmtree(old, ignore_errors=True)
        return EmbeddingIndex.open(self.final)


def write_index(directory, vectors: np.ndarray, ids: Sequence, model_hash: str, dtype: str = "float16",
                normalized: bool = True) -> "EmbeddingIndex":
    """Write (n, dim) `vectors` with their `ids` as an index directory, atomically."""
    v = np.asarray(vectors)
    if v.ndim != 2:
        raise ConfigError(f"vectors must be (n, dim), got shape {v.shape}")
    writer = IndexWriter(directory, v.shape[0], v.shape[1], model_hash, dtype, normalized)
    writer.add(v, ids)
    return writer.commit()


def _map_npy(path: Path) -> tuple[np.ndarray, mmap.mmap, int]:
    """A read-only view of a .npy file through our own mmap, so finished blocks can be released (madvise)."""
    with open(path, "rb") as f:
        major, _ = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if fortran or dtype.hasobject:
        raise DataError(f"{path}: Fortran-ordered or object arrays are not an index layout")
    if offset + int(np.prod(shape)) * dtype.itemsize > len(mm):      # a copy cut short: never read past its end
        raise DataError(f"{path}: truncated ({len(mm)} bytes for a {'x'.join(map(str, shape))} {dtype} array)")
    return np.ndarray(shape, dtype=dtype, buffer=mm, offset=offset), mm, offset


def _read_manifest(path: Path) -> dict:
    """manifest.json of an index; DataError unless it is this format's object with the fields it needs."""
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise DataError(f"{path}: not a readable JSON manifest ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        got = (manifest.get("format"), manifest.get("version")) if isinstance(manifest, dict) else manifest
        raise DataError(f"{path}: format / version {str(got)[:60]}, expected {FORMAT!r} version {VERSION}")
    for key in ("dim", "count"):
        value = manifest.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "dim" else 0):
            raise DataError(f"{path}: {key} must be a {'positive' if key == 'dim' else 'non-negative'} int, got "
                            f"{str(value)[:40]!r}")
    if manifest.get("dtype") not in DTYPES or not isinstance(manifest.get("model_hash"), str):
        raise DataError(f"{path}: dtype {str(manifest.get('dtype'))[:20]!r} / model_hash "
                        f"{str(manifest.get('model_hash'))[:20]!r} is not an index's")
    return manifest


@dataclass
class SearchResult:
    scores: np.ndarray                 # (queries, k) float32, best first
    rows: np.ndarray                   # (queries, k) int64 corpus rows
    ids: list[list[str]]               # the rows' ids


class EmbeddingIndex:
    """An index directory opened for search; vectors, scales and ids stay on disk (memory-mapped)."""

    def __init__(self, directory: Path, manifest: dict):
        self.directory, self.manifest = directory, manifest
        self.vectors, self._mm, self._offset = _map_npy(directory / "vectors.npy")
        self.scales = np.load(directory / "scales.npy", mmap_mode="r") if manifest["dtype"] == "int8" else None
        self.ids = np.load(directory / "ids.npy", mmap_mode="r")
        self._row_bytes = self.vectors.dtype.itemsize * self.dim

    @classmethod
    def open(cls, directory) -> "EmbeddingIndex":
        directory = Path(directory)
        path = directory / "manifest.json"
        if not path.is_file():
            raise DataError(f"{directory}: not an embedding index (no manifest.json)")
        manifest = _read_manifest(path)
        try:
            index = cls(directory, manifest)
        except (OSError, ValueError, EOFError) as e:     # a missing, truncated or foreign .npy file
            raise DataError(f"{directory}: unreadable index files ({type(e).__name__}: {str(e)[:100]})") from None
        if index.vectors.shape != (manifest["count"], manifest["dim"]) or len(index.ids) != manifest["count"]:
            raise DataError(f"{directory}: vectors {index.vectors.shape} / {len(index.ids)} ids do not match the "
                            f"manifest's count {manifest['count']} x dim {manifest['dim']}")
        return index

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def __len__(self) -> int:
        return int(self.manifest["count"])

    def check(self, model_hash: str | None = None, dim: int | None = None) -> None:
        """IndexMismatch unless the query model's hash and vector dimension are the index's."""
        if dim is not None and dim != self.dim:
            raise IndexMismatch(f"query vectors have dim {dim}, the index {self.directory} has dim {self.dim}")
        if model_hash is not None and model_hash != self.manifest["model_hash"]:
            raise IndexMismatch(f"query model {model_hash} is not the model that built {self.directory} "
                                f"({self.manifest['model_hash']}{self._built_with()})")

    def _built_with(self) -> str:
        """", MODEL" from the source note `bertkit embed` leaves beside an index, if there is one."""
        try:
            source = json.loads((Path(self.directory) / INDEX_SOURCE).read_text(encoding="utf-8"))
            return f", {source['model']}"
        except (OSError, ValueError, KeyError, TypeError):
            return ""

    def search(self, queries: np.ndarray, k: int = 10, model_hash: str | None = None, corpus_block: int = 32768,
               query_block: int = 256) -> SearchResult:
        """Exact top-k rows by dot product for each query row (see the module docstring)."""
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim == 1:
            q = q[None]
        self.check(model_hash, q.shape[1])
        scores, rows = _blocked_top_k(q, len(self), self._block, k, (corpus_block, query_block), self._release)
        return SearchResult(scores, rows, [[str(self.ids[r]) for r in row] for row in rows])

    def _block(self, start: int, end: int) -> np.ndarray:
        block = np.asarray(self.vectors[start:end], dtype=np.float32)                    # reads the pages
        if self.scales is not None:
            block *= np.asarray(self.scales[start:end])[:, None]
        return block

    def _release(self, start: int, end: int) -> None:
        """Drop the block's pages from this process's resident memory (Linux; elsewhere a no-op)."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        lo = (self._offset + start * self._row_bytes) // page * page
        hi = self._offset + end * self._row_bytes
        if hi > lo:
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def _blocked_top_k(q: np.ndarray, n: int, block_fn, k: int, blocks: tuple[int, int], release=None):
    """Exact top k of q @ corpus.T, reading the corpus through block_fn(start, end) -> (rows, dim) float32:
    (queries, dim) -> scores, rows, each (queries, min(k, n)), best first (equal scores: lower row first)."""
    corpus_block, query_block = blocks
    if k <= 0 or corpus_block <= 0 or query_block <= 0:
        raise ConfigError(f"k, corpus_block and query_block must be positive, got {k}, {corpus_block}, "
                          f"{query_block}")
    k = min(k, n)
    queries = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32))
    scores = torch.full((q.shape[0], k), float("-inf"))
    rows = torch.full((q.shape[0], k), -1, dtype=torch.long)
    for start in range(0, n, corpus_block):
        end = min(start + corpus_block, n)
        block = block_fn(start, end)                                                     # (block, dim) float32
        block = torch.from_numpy(block if block.flags.writeable else block.copy())        # a read-only map: copy
        for qs in range(0, q.shape[0], query_block):
            part = slice(qs, qs + query_block)
            top = (queries[part] @ block.T).topk(min(k, end - start), dim=1)             # (queries, <= k)
            merged_s = torch.cat([scores[part], top.values], dim=1)                      # (queries, <= 2k)
            merged_r = torch.cat([rows[part], top.indices + start], dim=1)
            best = merged_s.topk(k, dim=1)
            scores[part], rows[part] = best.values, merged_r.gather(1, best.indices)
        if release is not None:
            release(start, end)
    scores, rows = scores.numpy(), rows.numpy()
    order = np.lexsort((rows, -scores), axis=1)
    return np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)


def search_vectors(queries: np.ndarray, corpus: np.ndarray, k: int = 10, corpus_block: int = 32768,
                   query_block: int = 256, cosine: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The same exact blocked top k over an in-memory (n, dim) corpus: scores, rows, each (queries, k). `cosine`:
    both sides L2-normalised first (vectors a model did not normalise), so the scores are cosines."""
    q, corpus = np.asarray(queries, dtype=np.float32), np.asarray(corpus)
    if q.ndim != 2 or corpus.ndim != 2 or q.shape[1] != corpus.shape[1]:
        raise IndexMismatch(f"queries {q.shape} and corpus {corpus.shape} must be (n, dim) with the same dim")
    if cosine:
        q, corpus = (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12) for x in (q, corpus))
    return _blocked_top_k(q, corpus.shape[0], lambda s, e: np.asarray(corpus[s:e], dtype=np.float32), k,
                          (corpus_block, query_block))
