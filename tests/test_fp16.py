"""fp16 training: float16 autocast with a GradScaler (the loss scaled, the gradients unscaled before the clip, steps
with overflowing gradients skipped and the scale halved, the scale saved in checkpoints so a resume is exact), and
"auto" picking it on a CUDA device without bf16. On CPU, where torch's autocast and GradScaler take float16."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_train import Batches, TinyMLM, _cfg, _one_thread  # noqa: E402, F401 (_one_thread: one thread here too)

from bertkit import hardware, precision  # noqa: E402
from bertkit.errors import ConfigError  # noqa: E402
from bertkit.cli import build_parser  # noqa: E402
from bertkit.train import latest_checkpoint, pretraining_step, train  # noqa: E402


def _scaler(run_dir: Path) -> dict:
    return json.loads((latest_checkpoint(run_dir) / "state.json").read_text())["scaler"]


def test_fp16_run_learns_and_resumes_exactly(tmp_path):
    torch.manual_seed(0)
    whole = train(TinyMLM(), Batches(), _cfg(max_steps=12, precision="fp16"), tmp_path / "whole")
    finite = [x for x in whole.losses if math.isfinite(x)]
    assert len(finite) >= 10 and sum(finite[-3:]) < sum(finite[:3])
    assert _scaler(tmp_path / "whole")["scale"] > 0

    torch.manual_seed(0)
    train(TinyMLM(), Batches(), _cfg(max_steps=12, precision="fp16", save_every_steps=6), tmp_path / "cut")
    # the run stopped at step 6 (its checkpoint kept, the later one removed) and resumed from there
    for step in sorted((tmp_path / "cut" / "checkpoints").iterdir())[1:]:
        for f in step.iterdir():
            f.unlink()
        step.rmdir()
    assert latest_checkpoint(tmp_path / "cut").name == "step-00000006"
    resumed = train(TinyMLM(), Batches(), _cfg(max_steps=12, precision="fp16", resume=True), tmp_path / "cut")
    assert resumed.start_step == 6
    assert resumed.losses == pytest.approx(whole.losses[6:], rel=0, abs=0, nan_ok=True)
    assert _scaler(tmp_path / "cut") == _scaler(tmp_path / "whole")


def test_an_overflowing_gradient_skips_the_step_and_halves_the_scale(tmp_path):
    def step_fn(model, batch, blow_up_at=None):
        out = pretraining_step(model, batch)
        if step_fn.calls == blow_up_at:
            w = model.out.weight.sum()
            out.loss = out.loss + (w - w.detach()) * 1e38     # the loss unchanged, its gradient inf once scaled
        step_fn.calls += 1
        return out

    runs = {}
    for name, at in (("clean", None), ("overflow", 4)):
        torch.manual_seed(0)
        step_fn.calls = 0
        fn = lambda m, b, at=at: step_fn(m, b, at)  # noqa: E731
        # max_bad_steps=1: an overflow at a finite loss is the scaler's to handle, never a divergence
        runs[name] = (train(TinyMLM(), Batches(), _cfg(max_steps=6, precision="fp16", max_bad_steps=1),
                            tmp_path / name, step_fn=fn), _scaler(tmp_path / name))
    (clean, clean_scaler), (hit, hit_scaler) = runs["clean"], runs["overflow"]
    assert hit.skipped_steps == clean.skipped_steps + 1 and math.isnan(hit.losses[4])
    assert math.isfinite(clean.losses[4]) and hit.losses[:4] == clean.losses[:4]
    assert hit_scaler["scale"] == clean_scaler["scale"] / 2


def test_auto_is_fp16_on_cuda_without_bf16(monkeypatch):
    monkeypatch.delenv("BERTKIT_PRECISION", raising=False)
    monkeypatch.setattr(hardware, "native_bf16", lambda device=None: False)
    assert precision.resolve("auto", "cuda") == "fp16"
    assert precision.resolve("auto", "cpu") == "fp32"
    monkeypatch.setattr(hardware, "native_bf16", lambda device=None: True)
    assert precision.resolve("auto", "cuda") == "bf16"
    monkeypatch.setenv("BERTKIT_PRECISION", "fp32")
    assert precision.resolve("auto", "cuda") == "fp32"
    with precision.autocast("fp16", "cpu"):
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float16


def test_fp16_is_a_training_choice_only(capsys):
    parser = build_parser()
    finetune = ["finetune", "--model", "m", "--task", "classify", "--train", "t.csv", "--dev", "d.csv", "--out", "o"]
    for argv in (["pretrain", "corpus/", "--out", "o"], finetune):
        assert parser.parse_args([*argv, "--precision", "fp16"]).precision == "fp16"
    with pytest.raises(SystemExit):
        parser.parse_args(["predict", "--model", "m", "--data", "d.csv", "--out", "o", "--precision", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


def test_fp16_is_refused_under_fsdp(tmp_path):
    # its GradScaler would find inf in each rank's own shards, and the ranks could disagree on a skipped step
    with pytest.raises(ConfigError, match=r"precision='fp16' does not run with fsdp"):
        train(TinyMLM(), Batches(), _cfg(precision="fp16", fsdp=True), tmp_path / "run")
    assert not (tmp_path / "run").exists()
