"""Packed batches: a token budget per batch instead of a row count, each example its own sequence
(docs/pretraining.md, "Packed batches").

The batch plan is a pure function of (seed, epoch, lengths): every rank computes the same global list and takes
every world_size-th batch (cut to a multiple of world_size, so the ranks step together); a checkpoint stores only
(epoch, position), as ShardReader's does."""

from __future__ import annotations

import numpy as np

from bertkit.errors import DataError
from bertkit.pretraining.shards import ShardReader, permute

__all__ = ["PackedReader", "pack_batches", "padding_share", "POOL"]

POOL = 64          # batches per sorted pool: enough rows that neighbours in length differ by a token or two


def pack_batches(lengths: np.ndarray, budget: int, pool: int = POOL) -> list[np.ndarray]:
    """Positions into `lengths` grouped into batches of rows x longest row <= budget (a longer row alone), in
    pools of `pool * budget` tokens' worth of rows, each pool sorted by decreasing length."""
    rows_per_pool = max(1, int(pool * budget / max(float(np.mean(lengths)), 1.0))) if len(lengths) else 1
    batches = []
    for lo in range(0, len(lengths), rows_per_pool):
        part = lo + np.argsort(-lengths[lo:lo + rows_per_pool], kind="stable")
        start = 0
        while start < len(part):
            rows = max(1, budget // max(int(lengths[part[start]]), 1))   # sorted: the first row is the longest
            batches.append(part[start:start + rows])
            start += rows
    return batches


def padding_share(lengths: np.ndarray, batches: list[np.ndarray], width: int | None = None) -> float:
    """Padded share of the batch grids: each batch ends at its longest row (`width`: at that many positions)."""
    real = sum(int(lengths[b].sum()) for b in batches)
    grid = sum(len(b) * (width or int(lengths[b].max())) for b in batches)
    return 1.0 - real / max(grid, 1)


class PackedReader:
    """A ShardReader's examples in token-budget batches (see the module docstring); the reader's other attributes
    (seq_len, tables, token_counts, task, ...) pass through."""

    def __init__(self, reader: ShardReader, pool: int = POOL):
        self.reader, self.pool = reader, pool
        self.budget = reader.batch_size * reader.seq_len
        # every example's length (meta column 0), read once from the memory-mapped shards
        self.lengths = np.concatenate([np.asarray(sh["meta"][:, 0], dtype=np.int64) for sh in reader._shards])
        self.epoch, self.position = 0, 0
        self._plan: tuple[int, list[np.ndarray]] | None = None

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "reader":
            raise AttributeError(name)
        return getattr(self.reader, name)

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of `epoch`, as global example indices."""
        if self._plan is None or self._plan[0] != epoch:
            r = self.reader
            order = np.arange(r.per_rank * r.world_size, dtype=np.int64)
            if r.shuffle:
                order = permute(order, r.num_examples, r.seed, epoch)
            plan = [order[b] for b in pack_batches(self.lengths[order], self.budget, self.pool)]
            rng = np.random.default_rng([r.seed, epoch])          # pools are sorted: batches in a random order
            plan = [plan[i] for i in rng.permutation(len(plan))]
            usable = len(plan) - len(plan) % r.world_size
            self._plan = (epoch, plan[r.rank:usable:r.world_size])
        return self._plan[1]

    def __len__(self) -> int:
        return len(self.batches(self.epoch))

    def batch_indices(self, epoch: int, b: int) -> np.ndarray:
        return self.batches(epoch)[b]

    # the reader's walk (epoch, position, infinite) over these batches
    set_epoch, __iter__ = ShardReader.set_epoch, ShardReader.__iter__

    def batch(self, indices: np.ndarray, epoch: int = 0) -> dict:
        """The reader's batch of `indices`, its tensors ending at the longest row."""
        width = int(self.lengths[indices].max())
        return {k: v[:, :width] if v.ndim == 2 else v for k, v in self.reader.batch(indices, epoch).items()}

    def state_dict(self) -> dict:
        return {**self.reader.state_dict(), "epoch": self.epoch, "position": self.position, "packed": self.budget}

    def load_state_dict(self, state: dict) -> None:
        if state.get("packed") != self.budget:
            raise DataError(f"cannot resume data position: state has packed={state.get('packed')!r}, this reader "
                            f"packs {self.budget} tokens a batch (--packing changed since the checkpoint)")
        self.reader.load_state_dict(state)
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
