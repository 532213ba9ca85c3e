"""`bertkit finetune --resume`: a run killed (SIGKILL) mid-epoch continues from its last checkpoint and ends with the
per-step losses and final weights of a run never stopped; finished seeds are kept; other settings are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_embed_cli import data as embed_data, tiny_st  # noqa: F401  (the same tiny models and data)
from test_tasks_finetune import _sentiment_rows, _write_csv, one_thread, tiny_dir  # noqa: F401

SRC = str(Path(__file__).resolve().parents[1] / "src")

# the child: `bertkit ARGS`, killed by SIGKILL once it has done $KILL_AT steps, all seeds (a test-only wrapper)
CHILD = r"""
import os, signal, sys
import torch
torch.set_num_threads(1)
import bertkit.train.loop as loop
kill_at, step, done = int(os.environ.get("KILL_AT", "0")), loop._train_step, [0]
def killing_step(run):
    rec = step(run)
    with open(os.environ["LOSSES"], "a") as f:
        f.write(f"{run.state.step} {rec['loss']!r}\n")
    done[0] += 1
    if done[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return rec
loop._train_step = killing_step
from bertkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _bertkit(args, kill_at: int = 0) -> subprocess.CompletedProcess:
    """`bertkit ARGS` in a child; each step's loss is appended to OUT.losses (OUT: the value of --out)."""
    out = Path(args[args.index("--out") + 1])
    env = {**os.environ, "PYTHONPATH": SRC, "KILL_AT": str(kill_at), "LOSSES": f"{out}.losses"}
    return subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=600)


def _losses(out: Path) -> list[list[float]]:
    """The per-step losses of each training run (seed) in OUT's sessions; a step replayed after a resume must
    repeat the loss it had, and counts once."""
    runs: list[list[float]] = []
    for line in Path(f"{out}.losses").read_text().splitlines():
        step, loss = int(line.split()[0]), float(line.split()[1])
        if step == 1:
            runs.append([])
        elif step <= len(runs[-1]):          # replayed from the checkpoint: the same loss as the first time
            assert runs[-1][step - 1] == loss, (step, runs[-1][step - 1], loss)
            del runs[-1][step - 1:]
        runs[-1].append(loss)
    return runs


def _weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(model_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    return _write_csv(d / "train.csv", _sentiment_rows(96, 0)), _write_csv(d / "dev.csv", _sentiment_rows(32, 1))


def _args(tiny_dir, data, out, *more):
    train, dev = data
    return ["finetune", "--task", "classify", "--model", tiny_dir, "--train", train, "--dev", dev, "--out", out,
            "--batch-size", "16", "--epochs", "2", "--lr", "2e-3", "--fp32", "--eval-every", "4", "--save-every", "3",
            "--patience", "5", "--quiet", *more]


def test_killed_then_resumed_equals_uninterrupted(tiny_dir, data, tmp_path):
    """12 steps, dev every 4, a checkpoint every 3; killed after step 8 (the checkpoint at 6, the dev state at 4 and
    8 with it): --resume replays 7-8 and goes on; the losses and the saved weights are those of an unbroken run."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    r = _bertkit(_args(tiny_dir, data, whole, "--seeds", "1,2"))
    assert r.returncode == 0, r.stderr
    r = _bertkit(_args(tiny_dir, data, broken, "--seeds", "1,2"), kill_at=20)     # seed 1 done, seed 2 at step 8
    assert r.returncode == -9, r.stderr
    assert (broken / "seed-1" / "metrics.json").exists() and not (broken / "seed-2" / "metrics.json").exists()
    assert list((broken / "seed-2" / "train" / "checkpoints").glob("step-*"))
    seed1 = (broken / "seed-1" / "model.safetensors").stat().st_mtime_ns
    r = _bertkit(_args(tiny_dir, data, broken, "--seeds", "1,2", "--resume"))
    assert r.returncode == 0, r.stderr
    assert (broken / "seed-1" / "model.safetensors").stat().st_mtime_ns == seed1      # a finished seed is kept
    assert _losses(broken) == _losses(whole) and [len(r) for r in _losses(whole)] == [12, 12]
    for seed in ("seed-1", "seed-2"):
        a, b = _weights(whole / seed), _weights(broken / seed)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert not list((broken / seed / "train" / "checkpoints").glob("step-*"))   # done: no checkpoint left
    for split in ("dev",):
        assert (json.loads((broken / "summary.json").read_text())[split]
                == json.loads((whole / "summary.json").read_text())[split])


def test_resume_refuses_other_settings_and_overwrite(tiny_dir, data, tmp_path):
    out = tmp_path / "run"
    assert _bertkit(_args(tiny_dir, data, out), kill_at=5).returncode == -9
    r = _bertkit(_args(tiny_dir, data, out, "--resume", "--lr", "1e-3"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "lr 0.002" in r.stderr and "0.001" in r.stderr
    r = _bertkit(_args(tiny_dir, data, out, "--resume", "--overwrite"))
    assert r.returncode == 2 and "give one of them" in r.stderr
    r = _bertkit(_args(tiny_dir, data, out, "--overwrite"))           # --overwrite still starts afresh
    assert r.returncode == 0, r.stderr
    assert len(_losses(out)[-1]) == 12


def test_embed_resume_equals_uninterrupted(tmp_path, tiny_st, embed_data):  # noqa: F811
    """The bi-encoder runner checkpoints through the same loop: killed mid-epoch, resumed: the same weights."""
    def args(out, *more):
        return ["finetune", "--task", "embed", "--model", tiny_st, "--train", embed_data / "pairs.jsonl", "--dev",
                embed_data / "dev", "--out", out, "--batch-size", "4", "--epochs", "2", "--lr", "1e-3", "--save-every", "3",
                "--quiet", *more]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    assert _bertkit(args(whole)).returncode == 0
    assert _bertkit(args(broken), kill_at=8).returncode == -9
    r = _bertkit(args(broken, "--resume"))
    assert r.returncode == 0, r.stderr
    assert _losses(broken) == _losses(whole) and [len(r) for r in _losses(whole)] == [12]
    a, b = _weights(whole), _weights(broken)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
