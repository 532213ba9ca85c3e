"""The training data as the loop reads it: micro-batches across epochs and phases, with a position a checkpoint
can store and resume exactly."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Iterable, Iterator

from bertkit.errors import ConfigError
from bertkit.train.checkpointing import from_plain, to_plain

__all__ = ["Phase", "Stream"]


@dataclass
class Phase:
    """One stretch of a run with its own data (e.g. another sequence length)."""
    batches: Iterable[dict]
    fraction: float                       # share of the total optimizer steps (of the budget in budget mode)
    name: str = ""


class Stream:
    """Micro-batches from `batches` (or a list of Phases) across epochs, with a resumable position."""

    def __init__(self, batches):
        if isinstance(batches, (list, tuple)) and batches and all(isinstance(p, Phase) for p in batches):
            self.phases = list(batches)
        else:
            self.phases = [Phase(batches, 1.0)]
        total = sum(p.fraction for p in self.phases)
        if any(p.fraction <= 0 for p in self.phases) or abs(total - 1.0) > 1e-6:
            raise ConfigError(f"phase fractions must be > 0 and sum to 1, got {[p.fraction for p in self.phases]}")
        self.phase = 0
        self.epoch = 0
        self.position = 0        # micro-batches consumed in the current epoch of the current phase
        self._it: Iterator | None = None
        self._pending_skip = 0

    @property
    def source(self):
        return self.phases[self.phase].batches

    def boundaries(self, total: float) -> list[float]:
        """Cumulative ends of the phases in units of `total` (steps, or seconds in budget mode)."""
        return [end * total for end in accumulate(p.fraction for p in self.phases)]

    def set_phase(self, k: int) -> None:
        if k > self.phase:  # phases only move forward
            self.phase, self.epoch, self.position, self._it = k, 0, 0, None

    def _new_epoch_iter(self) -> None:
        src = self.source
        if hasattr(src, "set_epoch"):
            src.set_epoch(self.epoch)
        self._it = iter(src)
        skip, self._pending_skip = self._pending_skip, 0
        for _ in range(skip):  # resume without a data state: replay the consumed part of this epoch
            next(self._it)

    def next(self) -> dict:
        """The next micro-batch; a new epoch begins when the source runs out."""
        if self._it is None:
            self._new_epoch_iter()
        batch = next(self._it, None)
        if batch is None:
            if self.position == 0:
                raise ConfigError("the training data yielded no batch")
            self.epoch, self.position = self.epoch + 1, 0
            self._new_epoch_iter()
            if (batch := next(self._it, None)) is None:
                raise ConfigError("the training data yielded no batch in a new epoch")
        self.position += 1
        return batch

    def state_dict(self) -> dict:
        state = {"phase": self.phase, "epoch": self.epoch, "position": self.position}
        src = self.source
        if hasattr(src, "state_dict"):
            state["source"] = to_plain(src.state_dict())
        return state

    def load_state_dict(self, state: dict) -> None:
        self.phase, self.epoch, self.position = int(state["phase"]), int(state["epoch"]), int(state["position"])
        self._it = None
        src = self.source
        if "source" in state and hasattr(src, "load_state_dict"):
            src.load_state_dict(from_plain(state["source"]))  # the source's own state carries its epoch
            self._it = iter(src)
        else:
            self._pending_skip = self.position
