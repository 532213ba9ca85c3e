"""The loop's callbacks: events in order with their numbers, state carried through a checkpoint and resume, the
TensorBoard / W&B / MLflow loggers (offline, where their packages are installed), and `--report-to` without them."""

from __future__ import annotations

import importlib.util
import json

import pytest

from bertkit.errors import ConfigError
from bertkit.train import train
from bertkit.train.callbacks import Callback, MLflowCallback, WandbCallback, reporting
from test_tasks_finetune import _cfg as finetune_cfg, _sentiment_rows, one_thread, tiny_dir  # noqa: F401
from test_train import Batches, TinyMLM, _cfg


class Recorder(Callback):
    """Every event it gets; a counter of steps that a checkpoint carries (state_dict / load_state_dict)."""
    key = "recorder"

    def __init__(self):
        self.events, self.steps = [], 0

    def on_train_begin(self, state):
        self.events.append(("begin", state.step))

    def on_step_end(self, state, logs):
        self.steps += 1
        self.events.append(("step", state.step, logs["loss"]))

    def on_evaluate(self, state, metrics):
        self.events.append(("evaluate", state.step, metrics))

    def on_save(self, state, checkpoint):
        self.events.append(("save", state.step, checkpoint.name))

    def on_train_end(self, state):
        self.events.append(("end", state.step))

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, d):
        self.steps = d["steps"]


def test_events_and_state_through_a_resume(tmp_path):
    rec = Recorder()
    result = train(TinyMLM(), Batches(), _cfg(max_steps=6, eval_every_steps=3, save_every_steps=4), tmp_path,
                   eval_fn=lambda m: {"score": 1.0}, callbacks=[rec])
    steps = [e for e in rec.events if e[0] == "step"]
    assert rec.events[0] == ("begin", 0) and rec.events[-1] == ("end", 6)
    assert [s[2] for s in steps] == result.losses and [s[1] for s in steps] == list(range(1, 7))
    assert [e[1:] for e in rec.events if e[0] == "evaluate"] == [(3, {"score": 1.0}), (6, {"score": 1.0})]
    assert [e[1:] for e in rec.events if e[0] == "save"] == [(4, "step-00000004"), (6, "step-00000006")]
    state = json.loads((tmp_path / "checkpoints" / "step-00000006" / "state.json").read_text())
    assert state["callbacks"] == {"recorder": {"steps": 6}}
    again = Recorder()                  # a resume hands the saved state back before the first event
    train(TinyMLM(), Batches(), _cfg(max_steps=8, save_every_steps=4, resume=True), tmp_path, callbacks=[again])
    assert again.events[0] == ("begin", 6) and again.steps == 8


def test_tensorboard_event_files(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (TensorBoard is logged only with it)")
    train(TinyMLM(), Batches(), _cfg(max_steps=3, tensorboard=True), tmp_path)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed (the extra bertkit[wandb])")
def test_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    train(TinyMLM(), Batches(), _cfg(max_steps=3), tmp_path / "run", callbacks=[WandbCallback(project="bertkit")])
    assert list(tmp_path.glob("wandb/offline-run-*"))


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed (the extra bertkit[mlflow])")
def test_mlflow_file_store(tmp_path):
    import mlflow
    cb = MLflowCallback(tracking_uri=(tmp_path / "mlruns").as_uri(), experiment="bertkit")
    train(TinyMLM(), Batches(), _cfg(max_steps=3), tmp_path / "run", callbacks=[cb])
    runs = mlflow.search_runs(experiment_names=["bertkit"])
    assert len(runs) == 1 and "metrics.train_loss" in runs.columns


def test_report_to_names_the_extra_when_missing():
    for name in ("wandb", "mlflow"):
        if importlib.util.find_spec(name) is None:
            with pytest.raises(ConfigError, match=rf"^--report-to {name} needs the {name} package: "
                                                  rf"pip install 'bertkit\[{name}\]'$"):
                reporting([name])
    with pytest.raises(ConfigError, match="choose from wandb, mlflow"):
        reporting(["neptune"])


def test_finetune_calls_the_callbacks(tiny_dir, tmp_path):  # noqa: F811
    from bertkit.tasks.runner import finetune
    rec = Recorder()
    s = finetune(finetune_cfg(tiny_dir, tmp_path, "classify", _sentiment_rows(64, 0), _sentiment_rows(16, 1),
                              epochs=1, save_model=False), callbacks=[rec])
    assert rec.steps == 4 and [e[0] for e in rec.events if e[0] != "step"] == ["begin", "evaluate", "end"]
    assert rec.events[-2][2]["accuracy"] == s["dev"]["accuracy"]["mean"]
