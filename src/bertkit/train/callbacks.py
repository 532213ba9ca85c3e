"""Callbacks: what a caller adds to the one training loop, its events named as transformers' TrainerCallback names
them (on_train_begin, on_step_end, on_evaluate, on_save, on_train_end; docs/training.md). The loop calls each on every
rank; a logger writes on rank 0 only. TensorBoard is the loop's own; W&B and MLflow are optional extras.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from pathlib import Path

from bertkit.errors import ConfigError

__all__ = ["Callback", "Events", "TensorBoardCallback", "WandbCallback", "MLflowCallback", "REPORTERS", "reporting",
           "main_rank"]


def main_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


class Callback:
    """The events the loop calls; subclass and override the ones you need."""

    def on_train_begin(self, state) -> None:
        pass

    def on_step_end(self, state, logs: dict) -> None:
        pass

    def on_evaluate(self, state, metrics: dict) -> None:
        pass

    def on_save(self, state, checkpoint: Path) -> None:
        pass

    def on_train_end(self, state) -> None:
        pass


def _numbers(logs: dict) -> dict[str, float]:
    return {k: float(v) for k, v in logs.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


class _Logger(Callback, ABC):
    """Scalars of every step (train/...) and evaluation (eval/...) to a tracking backend, on rank 0 only."""

    @abstractmethod
    def log(self, values: dict[str, float], step: int) -> None:
        """Write `values` at `step` to the backend."""

    def on_step_end(self, state, logs: dict) -> None:
        if main_rank():
            self.log({f"train/{k}": v for k, v in _numbers(logs).items()}, state.step)

    def on_evaluate(self, state, metrics: dict) -> None:
        if main_rank() and metrics:
            self.log({f"eval/{k}": v for k, v in _numbers(metrics).items()}, state.step)


class TensorBoardCallback(_Logger):
    """TensorBoard event files in `log_dir` (needs the tensorboard package)."""

    def __init__(self, log_dir):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(log_dir)) if main_rank() else None

    def log(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def on_train_end(self, state) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbCallback(_Logger):
    """Weights & Biases: `wandb.init(**init)` at the start (WANDB_MODE=offline writes files only), a run per call."""

    def __init__(self, **init):
        import wandb
        self.wandb, self.init, self.run = wandb, init, None

    def on_train_begin(self, state) -> None:
        if main_rank() and self.run is None:
            self.run = self.wandb.init(**self.init)

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def on_train_end(self, state) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


class MLflowCallback(_Logger):
    """MLflow: a run in the tracking URI's experiment (MLFLOW_TRACKING_URI; a file:// URI works offline)."""

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None):
        import mlflow
        self.mlflow, self.started = mlflow, False
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        if experiment:
            mlflow.set_experiment(experiment)

    def on_train_begin(self, state) -> None:
        if main_rank() and not self.started:
            self.mlflow.start_run()
            self.started = True

    def log(self, values: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({k.replace("/", "_"): v for k, v in values.items()}, step=step)

    def on_train_end(self, state) -> None:
        if self.started:
            self.mlflow.end_run()
            self.started = False


class Events:
    """The callbacks of one run: `events(name, ...)` calls each one's method of that name; a resume's saved state
    is handed back to the stateful ones here."""

    def __init__(self, callbacks, state):
        self.callbacks = list(callbacks)
        for cb in self.stateful():
            if state.callbacks and self.key(cb) in state.callbacks:
                cb.load_state_dict(state.callbacks[self.key(cb)])

    def begin(self, state, tensorboard: Path | None) -> None:
        """on_train_begin, TensorBoard first when a directory is given and the package is installed."""
        if tensorboard is not None:
            with contextlib.suppress(ImportError):
                self.callbacks.insert(0, TensorBoardCallback(tensorboard))
        self("on_train_begin", state)

    @staticmethod
    def key(cb) -> str:
        return getattr(cb, "key", type(cb).__name__)

    def stateful(self) -> list:
        return [cb for cb in self.callbacks if hasattr(cb, "state_dict") and hasattr(cb, "load_state_dict")]

    def __call__(self, name: str, *args) -> None:
        for cb in self.callbacks:
            if hasattr(cb, name):
                getattr(cb, name)(*args)


REPORTERS = {"wandb": WandbCallback, "mlflow": MLflowCallback}     # TensorBoard is the loop's own (cfg.tensorboard)


def reporting(names) -> list[Callback]:
    """The logger callbacks `names` ask for (wandb | mlflow), each configured by its own environment (WANDB_MODE,
    MLFLOW_TRACKING_URI, ...); one line naming the extra to install when its package is missing."""
    out = []
    for name in names:
        if name not in REPORTERS:
            raise ConfigError(f"--report-to {name!r}: choose from {', '.join(REPORTERS)}")
        try:
            out.append(REPORTERS[name]())
        except ImportError:
            raise ConfigError(f"--report-to {name} needs the {name} package: pip install 'bertkit[{name}]'") from None
    return out
