"""What a fine-tuning run keeps so that `--resume` continues it: its settings (OUT/settings.json, which a resume
must repeat), the loop's checkpoint settings, and the records of the seeds (or grid points) already finished.
The dev state (best score and weights, patience, history) travels in the checkpoints (runner.DevTracker)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from bertkit.atomic import write_text
from bertkit.errors import ConfigError
from bertkit.progress import say
from bertkit.textfiles import shown_all
from bertkit.train.loop import TrainConfig
from bertkit.train.monitor import jsonable

__all__ = ["SETTINGS", "Settings", "checkpointing", "finished"]

SETTINGS = "settings.json"
# settings a resume may change: they do not change the numbers
_FREE = {"resume", "overwrite", "progress", "quiet", "save_every_steps", "save_every_minutes", "keep_last",
         "tensorboard", "report_to"}


class Settings:
    """The settings of the run in cfg.out (the training settings flattened in, the in-memory data by digest). A
    resume must repeat those the run recorded: a ConfigError naming the first that differs, before any file is
    written; a fresh run records them once its training starts."""

    def __init__(self, cfg, files: dict[Path, str]):
        self.path, self.resume = Path(cfg.out) / SETTINGS, cfg.training.resume
        now = {**{k: v for k, v in shown_all(asdict(cfg)).items() if k != "training"}, **asdict(cfg.training),
               **{f"{p.stem} data sha256": hashlib.sha256(t.encode()).hexdigest() for p, t in files.items()}}
        self.now = jsonable({k: v for k, v in now.items() if k not in _FREE})
        if self.resume and self.path.exists():
            saved = json.loads(self.path.read_text())
            for k in sorted(set(saved) | set(self.now)):
                if saved.get(k) != self.now.get(k):
                    raise ConfigError(f"--resume: {self.path.parent} was run with {k} {saved.get(k)!r}, this run "
                                      f"has {self.now.get(k)!r}: resume with the same settings (or --overwrite to "
                                      f"start again)")

    def on_train_begin(self, state) -> None:
        """Recorded as training starts (a loop callback): a run that fails before it leaves no file."""
        if not self.path.exists() or not self.resume:
            write_text(self.path, json.dumps(self.now, indent=1))
            self.resume = True              # the next seeds of this run keep the record


def finished(cfg, metrics: Path) -> dict | None:
    """A resumed run's record of a seed (or grid point) that had finished, else None."""
    if cfg.training.resume and metrics.is_file():
        if not cfg.quiet:
            say(f"{metrics.parent}: finished earlier, kept")
        return json.loads(metrics.read_text())
    return None


def checkpointing(training: TrainConfig) -> dict:
    """The loop's checkpoint settings for one fine-tuning run: the newest checkpoint only (weights and optimizer:
    3x the model), every training.save_every_steps steps or save_every_minutes minutes (default 10: a kill loses
    at most that much, and short runs write none); none at the end (the model is saved by the runner)."""
    minutes = training.save_every_minutes or (None if training.save_every_steps else 10.0)
    return {"save_every_minutes": minutes, "keep_last": 1, "save_final": False, "overwrite": not training.resume}
