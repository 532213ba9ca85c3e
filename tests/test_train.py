"""The training loop on stand-in models and data: optimiser groups, schedules, accumulation maths, NaN skipping,
checkpoints (atomic, keep-last), exact resume after SIGKILL (mid-training and mid-checkpoint-write), bad settings."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from bertkit.errors import BertkitError, CheckpointError, ConfigError
from bertkit.optim import Lamb, build_optimizer, lr_factor, param_groups, warmup_steps
from bertkit.train import (StepOutput, TrainConfig, TrainingDiverged, latest_checkpoint, parse_duration,
                           pretraining_step, train)

V = 32  # stand-in vocabulary


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one intra-op thread is faster than two fighting a loaded machine for the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class TinyMLM(nn.Module):
    """Embedding -> LayerNorm -> dropout -> linear: an MLM-shaped model whose loss is a mean over labelled tokens."""

    def __init__(self, dropout: float = 0.1):
        super().__init__()
        self.emb = nn.Embedding(V, 16)
        self.LayerNorm = nn.LayerNorm(16)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(16, V)

    def forward(self, input_ids, labels, attention_mask=None):
        h = self.drop(self.LayerNorm(self.emb(input_ids)))                         # (batch, seq, 16)
        logits = self.out(h)                                                       # (batch, seq, V)
        loss = nn.functional.cross_entropy(logits.reshape(-1, V).float(), labels.reshape(-1))
        return SimpleNamespace(loss=loss, mlm_loss=loss, logits=logits)


class Batches:
    """Deterministic random batches; resumable via state_dict; `n` batches per epoch."""

    def __init__(self, n: int = 50, batch: int = 4, seq: int = 8, seed: int = 0):
        self.n, self.batch, self.seq, self.seed = n, batch, seq, seed
        self.epoch, self.pos = 0, 0

    def __len__(self):
        return self.n

    def set_epoch(self, epoch):
        self.epoch, self.pos = epoch, 0

    def __iter__(self):
        while self.pos < self.n:
            g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch * 1009 + self.pos)
            self.pos += 1
            x = torch.randint(0, V, (self.batch, self.seq), generator=g)
            labels = torch.where(torch.rand(x.shape, generator=g) < 0.3, (x * 7 + 3) % V, -100)
            labels[:, 0] = (x[:, 0] * 7 + 3) % V   # at least one label per row
            yield {"input_ids": x, "labels": labels}

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s):
        self.epoch, self.pos = s["epoch"], s["pos"]


def _cfg(**kw) -> TrainConfig:
    base = dict(max_steps=10, lr=1e-2, precision="fp32", progress=False, plot=False, tensorboard=False, warmup=2)
    base.update(kw)
    return TrainConfig(**base)


# ---------------------------------------------------------------------------------------------- optimiser
def test_param_groups_exclude_biases_and_layernorm():
    m = TinyMLM()
    groups = param_groups(m, 0.01)
    decay = {id(p) for p in groups[0]["params"]}
    names = {n for n, p in m.named_parameters() if id(p) in decay}
    assert names == {"emb.weight", "out.weight"}
    assert groups[0]["weight_decay"] == 0.01 and groups[1]["weight_decay"] == 0.0
    opt = build_optimizer(m, "adamw", lr=1e-4)
    assert opt.defaults["betas"] == (0.9, 0.999) and opt.defaults["eps"] == 1e-6


def test_lr_schedule_warmup_then_decay():
    total, warm = 100, warmup_steps(0.1, 100)
    assert warm == 10 and warmup_steps(7, 100) == 7
    f = [lr_factor(s, total, warm, "linear") for s in range(total + 1)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0) and f[10] == pytest.approx(1.0)
    assert f[55] == pytest.approx(0.5) and f[100] == 0.0
    assert all(a >= b for a, b in zip(f[10:], f[11:]))
    c = [lr_factor(s, total, warm, "cosine", min_ratio=0.1) for s in range(total + 1)]
    assert c[55] == pytest.approx(0.55) and c[100] == pytest.approx(0.1)
    assert lr_factor(50, total, warm, "constant") == 1.0
    # warmup-stable-decay: the peak held until the last 20% of the steps, then linear to min_ratio
    w = [lr_factor(s, total, warm, "wsd", decay_fraction=0.2) for s in range(total + 1)]
    assert w[:10] == f[:10] and all(v == 1.0 for v in w[10:81]) and w[90] == pytest.approx(0.5) and w[100] == 0.0
    assert lr_factor(90, total, warm, "wsd", min_ratio=0.1, decay_fraction=0.2) == pytest.approx(0.55)
    with pytest.raises(ConfigError, match="decay_fraction"):
        lr_factor(50, total, warm, "wsd", decay_fraction=0.0)
    with pytest.raises(ConfigError, match="decay_fraction must be in"):
        TrainConfig(max_steps=10, schedule="wsd", decay_fraction=1.5).validate()
    with pytest.raises(ConfigError, match="applies to schedule='wsd' only, not 'linear'"):
        TrainConfig(max_steps=10, decay_fraction=0.1).validate()   # it would change nothing: refused, not ignored
    TrainConfig(max_steps=10, schedule="wsd").validate()           # None: the default 0.2
    assert lr_factor(90, total, warm, "wsd", decay_fraction=None) == w[90]


def test_lamb_trust_ratio_and_descent():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(8, 8))
    opt = Lamb([w], lr=0.1, weight_decay=0.0)
    w0 = w.detach().clone()
    (w ** 2).sum().backward()
    opt.step()
    # first step: update = m_hat / sqrt(v_hat) = sign(g); scaled to lr * ||w|| / ||sign(g)||
    expected = w0 - 0.1 * w0.norm() / torch.sign(w0).norm() * torch.sign(w0)
    assert torch.allclose(w.detach(), expected, atol=1e-5)


def test_parse_duration():
    assert parse_duration("10m") == 600 and parse_duration("1.5h") == 5400 and parse_duration("90") == 90
    for bad in ("0", "0m", "-5s", "abc", "nan"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


# ---------------------------------------------------------------------------------------------- loop maths
def test_learns_and_writes_outputs(tmp_path):
    torch.manual_seed(0)
    res = train(TinyMLM(), Batches(), _cfg(max_steps=40, save_every_steps=10, keep_last=2), tmp_path)
    assert res.steps == 40 and len(res.losses) == 40 and res.stop_reason == "max_steps"
    assert sum(res.losses[-5:]) / 5 < sum(res.losses[:5]) / 5 - 0.3
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["step-00000030", "step-00000040"]          # keep_last=2, the final one included
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 41))
    assert {"loss", "lr", "tokens_per_s", "grad_norm"} <= set(lines[0])
    # an existing run is not silently overwritten
    with pytest.raises(ConfigError, match="already holds"):
        train(TinyMLM(), Batches(), _cfg(), tmp_path)


def test_accumulation_equals_big_batch_with_token_weighting(tmp_path):
    """4 micro-batches of 2 == 1 batch of 8: same per-step loss and weights (MLM mean over all masked tokens,
    although the micro-batches hold different numbers of masked tokens)."""
    class Split(Batches):
        def __iter__(self):
            for big in Batches(batch=8, n=self.n // 4).__iter__():
                for i in range(0, 8, 2):
                    self.pos += 1
                    yield {k: v[i:i + 2] for k, v in big.items()}

    torch.manual_seed(0)
    big = TinyMLM(dropout=0.0)
    torch.manual_seed(0)
    small = TinyMLM(dropout=0.0)
    r_big = train(big, Batches(batch=8), _cfg(max_steps=6), tmp_path / "big", step_fn=pretraining_step)
    r_acc = train(small, Split(n=200), _cfg(max_steps=6, grad_accum=4), tmp_path / "acc", step_fn=pretraining_step)
    assert r_acc.losses == pytest.approx(r_big.losses, rel=1e-5)
    for (name, a), b in zip(big.state_dict().items(), small.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-5), name
    assert r_acc.tokens == r_big.tokens == 6 * 8 * 8


def test_nan_steps_are_skipped_then_stop(tmp_path):
    torch.manual_seed(0)
    bad = {3, 4}

    def step_fn(model, batch):
        out = pretraining_step(model, batch)
        if step_fn.calls in bad:
            out.loss = out.loss * float("nan")
        step_fn.calls += 1
        return out
    step_fn.calls = 0
    m = TinyMLM()
    res = train(m, Batches(), _cfg(max_steps=8, max_bad_steps=3), tmp_path / "a", step_fn=step_fn)
    assert res.skipped_steps == 2 and math.isnan(res.losses[3]) and math.isnan(res.losses[4])
    assert all(math.isfinite(x) for x in res.losses[5:])
    assert all(torch.isfinite(p).all() for p in m.parameters())

    step_fn.calls = 0
    bad.clear()
    bad.update(range(6, 100))
    with pytest.raises(TrainingDiverged, match=r"3 consecutive steps \(6\.\.8\).*step-00000005"):
        train(TinyMLM(), Batches(), _cfg(max_steps=20, max_bad_steps=3, save_every_steps=5), tmp_path / "b",
              step_fn=step_fn)
    # the last good checkpoint is intact and no checkpoint of a bad state was written
    assert latest_checkpoint(tmp_path / "b").name == "step-00000005"


def test_bad_settings_fail_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="not writable"):
        train(TinyMLM(), Batches(), _cfg(), blocker / "out")
    with pytest.raises(ConfigError, match="max_steps, epochs or budget_s"):
        train(TinyMLM(), Batches(), _cfg(max_steps=None), tmp_path / "x")
    with pytest.raises(ConfigError, match="budget_s"):
        train(TinyMLM(), Batches(), _cfg(budget_s=0), tmp_path / "y")
    with pytest.raises(BertkitError):
        train(TinyMLM(), Batches(), _cfg(optimizer="sgd"), tmp_path / "z")


def test_budget_mode_fits_the_wall_clock(tmp_path, monkeypatch):
    """On the loop's own clock, a step of 20 ms each (not the machine's: a loaded machine's slow step would make
    the budget's overshoot a matter of chance)."""
    import types
    from bertkit.train import loop
    torch.manual_seed(0)
    clock = [0.0]
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def slow_step(model, batch):
        clock[0] += 0.02
        return pretraining_step(model, batch)
    res = train(TinyMLM(), Batches(), _cfg(max_steps=None, budget_s=1.0, warmup=0.1), tmp_path, step_fn=slow_step)
    assert res.stop_reason == "budget"
    assert res.elapsed_s == pytest.approx(1.0, abs=0.05)
    # the schedule was fitted: the last lr is near the end of the decay
    assert res.history[-1]["lr"] < 0.4 * 1e-2
    assert abs(res.total_steps - res.steps) <= 2


def test_epochs_and_phases(tmp_path):
    from bertkit.train import Phase
    torch.manual_seed(0)
    res = train(TinyMLM(), Batches(n=6), _cfg(max_steps=None, epochs=2, grad_accum=2), tmp_path / "e")
    assert res.steps == 6 and res.stop_reason == "epochs"
    seen = []

    def step_fn(model, batch):
        seen.append(batch["input_ids"].shape[1])
        return pretraining_step(model, batch)
    train(TinyMLM(), [Phase(Batches(seq=8), 0.75), Phase(Batches(seq=12), 0.25)], _cfg(max_steps=8),
          tmp_path / "p", step_fn=step_fn)
    assert seen == [8] * 6 + [12] * 2


# ---------------------------------------------------------------------------------------------- crash safety
CHILD = textwrap.dedent("""
    import os, signal, sys, time, torch
    sys.path.insert(0, {tests!r})
    from test_train import TinyMLM, Batches, _cfg
    import bertkit.train.checkpointing as checkpointing
    from bertkit.train import train, pretraining_step
    out, resume, kill_in_save = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if kill_in_save:
        real = checkpointing.save_model_weights
        def dying_save(state, path):
            if path.parent.name == f".tmp-step-{{kill_in_save:08d}}":
                with open(path, "wb") as f:       # half a weights file, then the process dies
                    f.write(b"\\0" * 100)
                os.kill(os.getpid(), signal.SIGKILL)
            real(state, path)
        checkpointing.save_model_weights = dying_save
    def slow_step(model, batch):   # slow enough that the parent's SIGKILL lands mid-run
        time.sleep(0.03)
        return pretraining_step(model, batch)
    torch.manual_seed(0)
    train(TinyMLM(), Batches(), _cfg(max_steps=24, save_every_steps=4, resume=resume, deterministic=True), out,
          step_fn=slow_step)
""")


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _run_child(script: Path, out: Path, resume: bool, kill_in_save: int = 0, kill_after_step: int | None = None):
    p = subprocess.Popen([sys.executable, str(script), str(out), "1" if resume else "0", str(kill_in_save)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if kill_after_step is not None:
        metrics = out / "metrics.jsonl"
        deadline = time.time() + 60
        while time.time() < deadline and p.poll() is None:
            if metrics.exists() and any(json.loads(l)["step"] >= kill_after_step
                                        for l in metrics.read_text().splitlines() if l.endswith("}")):
                break
            time.sleep(0.005)
        p.send_signal(signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    return p.returncode, err.decode()


def test_sigkill_then_resume_gives_identical_losses(tmp_path):
    """Killed while writing the step-12 checkpoint, resumed, killed again mid-training, resumed to the end: the
    per-step losses equal an uninterrupted run's, bit for bit (CPU, deterministic algorithms, one thread)."""
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(0)
        train(TinyMLM(), Batches(), _cfg(max_steps=24, save_every_steps=4, deterministic=True), tmp_path / "ref",
              step_fn=pretraining_step)
    finally:
        torch.use_deterministic_algorithms(False)
    ref = _losses(tmp_path / "ref")
    assert sorted(ref) == list(range(1, 25))

    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(Path(__file__).parent)))
    run = tmp_path / "run"
    # 1) SIGKILL in the middle of writing the step-12 checkpoint: the half-written one is ignored
    rc, _ = _run_child(script, run, resume=False, kill_in_save=12)
    assert rc == -signal.SIGKILL
    assert latest_checkpoint(run).name == "step-00000008"
    assert any(p.name.startswith(".tmp-") for p in (run / "checkpoints").iterdir())
    # 2) resumed from step 8, SIGKILLed again mid-training once step 18 is logged
    rc, _ = _run_child(script, run, resume=True, kill_after_step=18)
    assert rc == -signal.SIGKILL
    assert 16 <= int(latest_checkpoint(run).name[5:]) < 24
    # 3) resumed to the end
    rc, err = _run_child(script, run, resume=True)
    assert rc == 0, err
    assert _losses(run) == ref                                                   # bitwise: the same floats
    assert not any(p.name.startswith(".tmp-") for p in (run / "checkpoints").iterdir())


def test_peak_flops_probe_leaves_the_global_rng_alone(tmp_path, monkeypatch):
    """The CPU matmul probe (first logged step of a run) must not draw from the global RNG: otherwise dropout, and
    so a run's losses, would depend on whether an earlier run in the process had already measured the peak."""
    from bertkit.train import monitor
    monkeypatch.setenv("BERTKIT_CACHE", str(tmp_path))
    monkeypatch.delenv("BERTKIT_PEAK_FLOPS", raising=False)
    monkeypatch.setattr(monitor, "_measured_peak", {})
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    assert monitor.peak_flops(torch.device("cpu"), torch.float32) > 0
    assert torch.equal(torch.rand(4), expected)


# ---------------------------------------------------------------------------------------------- resume that falls back
class _Crash(Exception):
    pass


def _crashing_step(after: int):
    """pretraining_step that raises on its call number `after` + 1: the process 'dies' mid-run."""
    calls = [0]

    def step(model, batch):
        calls[0] += 1
        if calls[0] > after:
            raise _Crash()
        return pretraining_step(model, batch)
    return step


def _steps(run: Path) -> list[int]:
    return [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()]


def _deterministic_train(batches, cfg, out, step_fn=pretraining_step):
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(0)
        return train(TinyMLM(), batches, cfg, out, step_fn=step_fn)
    finally:
        torch.use_deterministic_algorithms(False)


def test_corrupt_newest_checkpoint_falls_back_to_previous(tmp_path, caplog):
    """A crash after step 13 leaves step-4/8/12; step-12's weights are then damaged on disk (same size, one byte
    changed, still a readable safetensors file): resume skips it for step-8 with a warning, and the per-step losses
    equal an uninterrupted run's, each step logged once."""
    cfg = dict(max_steps=24, save_every_steps=4, deterministic=True)
    _deterministic_train(Batches(), _cfg(**cfg), tmp_path / "ref")
    ref = _losses(tmp_path / "ref")
    run = tmp_path / "run"
    with pytest.raises(_Crash):
        _deterministic_train(Batches(), _cfg(**cfg), run, step_fn=_crashing_step(13))
    assert latest_checkpoint(run).name == "step-00000012" and _steps(run)[-1] == 13
    weights = run / "checkpoints" / "step-00000012" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01                                   # a flipped bit inside a tensor: only the checksum sees it
    weights.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="bertkit.train"):
        res = _deterministic_train(Batches(), _cfg(resume=True, **cfg), run)
    assert res.start_step == 8
    assert any("skipping step-00000012" in r.getMessage() and "falling back to step-00000008" in r.getMessage()
               for r in caplog.records)
    assert _steps(run) == list(range(1, 25))
    assert _losses(run) == ref


def test_only_checkpoint_corrupt_is_an_error_and_named_corrupt_path_too(tmp_path):
    run = tmp_path / "run"
    train(TinyMLM(), Batches(), _cfg(max_steps=4, save_every_steps=4), run, step_fn=pretraining_step)
    ckpt = latest_checkpoint(run)
    (ckpt / "optimizer.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no intact checkpoint.*optimizer.pt does not match the sha256"):
        train(TinyMLM(), Batches(), _cfg(max_steps=8, resume=True), run, step_fn=pretraining_step)
    with pytest.raises(CheckpointError, match="optimizer.pt does not match"):
        train(TinyMLM(), Batches(), _cfg(max_steps=8, resume=str(ckpt)), run, step_fn=pretraining_step)


@pytest.mark.parametrize("key,value", [("step", "x"), ("tokens", None), ("elapsed", float("nan")),
                                       ("phase_time", float("inf")), ("skipped", -1), ("execution", "fast")])
def test_a_state_json_counter_of_the_wrong_type_is_named(key, value, tmp_path):
    """A hand-edited state.json: the checkpoint is refused naming the field, never a TypeError mid-training."""
    run = tmp_path / "run"
    train(TinyMLM(), Batches(), _cfg(max_steps=4, save_every_steps=4), run, step_fn=pretraining_step)
    state = latest_checkpoint(run) / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), key: value}))
    with pytest.raises(CheckpointError, match=f"state.json: {key} "):
        train(TinyMLM(), Batches(), _cfg(max_steps=8, resume=True), run, step_fn=pretraining_step)


def test_killed_before_first_checkpoint_does_not_duplicate_steps(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(_Crash):
        _deterministic_train(Batches(), _cfg(max_steps=12, save_every_steps=8, deterministic=True), run,
                             step_fn=_crashing_step(3))
    assert _steps(run) == [1, 2, 3] and latest_checkpoint(run) is None
    _deterministic_train(Batches(), _cfg(max_steps=12, save_every_steps=8, deterministic=True, resume=True), run)
    _deterministic_train(Batches(), _cfg(max_steps=12, save_every_steps=8, deterministic=True), tmp_path / "ref")
    assert _steps(run) == list(range(1, 13))
    assert _losses(run) == _losses(tmp_path / "ref")


def test_stale_temp_directories_removed_at_start(tmp_path):
    stale = tmp_path / "run" / "checkpoints" / ".tmp-step-00000004"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"\0" * 10)
    train(TinyMLM(), Batches(), _cfg(max_steps=2), tmp_path / "run", step_fn=pretraining_step)
    assert not stale.exists()


def test_disk_full_during_checkpoint_write(tmp_path, monkeypatch):
    """ENOSPC while writing step-8: one CheckpointError line, no temp directory left, step-4 intact and resumable."""
    import errno
    from bertkit.train import checkpointing
    run = tmp_path / "run"
    real = checkpointing.save_model_weights

    def full_disk(state, path):
        if "step-00000008" in path.parent.name:
            path.write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(state, path)
    monkeypatch.setattr(checkpointing, "save_model_weights", full_disk)
    with pytest.raises(CheckpointError) as e:
        train(TinyMLM(), Batches(), _cfg(max_steps=12, save_every_steps=4), run, step_fn=pretraining_step)
    msg = str(e.value)
    assert "\n" not in msg and "No space left on device" in msg and "step-00000004" in msg
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000004"]
    monkeypatch.setattr(checkpointing, "save_model_weights", real)
    res = train(TinyMLM(), Batches(), _cfg(max_steps=12, save_every_steps=4, resume=True), run,
                step_fn=pretraining_step)
    assert res.start_step == 4 and res.steps == 12


def test_checkpoint_without_checksums_still_resumes(tmp_path):
    """A checkpoint written before state.json held checksums is taken as it is."""
    run = tmp_path / "run"
    train(TinyMLM(), Batches(), _cfg(max_steps=4, save_every_steps=4), run, step_fn=pretraining_step)
    state = latest_checkpoint(run) / "state.json"
    saved = json.loads(state.read_text())
    assert set(saved.pop("files")) == {"model.safetensors", "optimizer.pt", "rank-00000.pt"}
    state.write_text(json.dumps(saved))
    res = train(TinyMLM(), Batches(), _cfg(max_steps=6, resume=True), run, step_fn=pretraining_step)
    assert res.start_step == 4 and res.steps == 6


# ---------------------------------------------------------------------------------------------- Ctrl-C
@pytest.fixture
def ctrl_c_live():
    """Ctrl-C as a terminal delivers it: a suite started as a background job (`cmd &` in a script) inherits SIGINT
    ignored, and the loop then rightly leaves it alone, so these tests give Python's handler back for their span."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupting_step(at_step: int, times: int = 1):
    """pretraining_step that sends this process SIGINT `times` times during optimizer step `at_step` (grad_accum 1),
    as Ctrl-C in a terminal would."""
    calls = [0]

    def step(model, batch):
        calls[0] += 1
        if calls[0] == at_step:
            for _ in range(times):
                signal.raise_signal(signal.SIGINT)
        return pretraining_step(model, batch)
    return step


def test_ctrl_c_finishes_the_step_saves_and_resume_is_exact(tmp_path, capsys, ctrl_c_live):
    """SIGINT during step 6 (periodic checkpoints every 4): step 6 completes, step-6 is written and named in one
    line, KeyboardInterrupt propagates with Python's handler back in place; resuming gives the losses and the final
    weights of an uninterrupted run, bit for bit."""
    from bertkit.train.checkpointing import load_model_weights
    cfg = dict(max_steps=10, save_every_steps=4, deterministic=True)
    handler = signal.getsignal(signal.SIGINT)
    _deterministic_train(Batches(), _cfg(**cfg), tmp_path / "ref")
    assert signal.getsignal(signal.SIGINT) is handler
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _deterministic_train(Batches(), _cfg(**cfg), run, step_fn=_interrupting_step(6))
    assert signal.getsignal(signal.SIGINT) is handler
    assert latest_checkpoint(run).name == "step-00000006" and _steps(run) == list(range(1, 7))
    err = capsys.readouterr().err
    assert "interrupted after step 6: checkpoint" in err and "step-00000006" in err and "--resume" in err, err
    res = _deterministic_train(Batches(), _cfg(resume=True, **cfg), run)
    assert res.start_step == 6 and res.steps == 10
    assert _losses(run) == _losses(tmp_path / "ref")
    final = [load_model_weights(latest_checkpoint(r) / "model.safetensors") for r in (tmp_path / "ref", run)]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])


def test_second_ctrl_c_and_runs_without_checkpoints_stop_at_once(tmp_path, ctrl_c_live):
    """Two SIGINTs stop inside the step, as Python's handler does: only the periodic checkpoint stays. A run that
    writes no checkpoints (fine-tuning) stops at the first. Ctrl-C on the last step lets the run finish."""
    run = tmp_path / "twice"
    with pytest.raises(KeyboardInterrupt):
        train(TinyMLM(), Batches(), _cfg(max_steps=10, save_every_steps=4), run, step_fn=_interrupting_step(6, 2))
    assert latest_checkpoint(run).name == "step-00000004" and _steps(run) == list(range(1, 6))
    run = tmp_path / "finetune"
    with pytest.raises(KeyboardInterrupt):
        train(TinyMLM(), Batches(), _cfg(max_steps=10, save_final=False), run, step_fn=_interrupting_step(3))
    assert latest_checkpoint(run) is None and _steps(run) == [1, 2]
    res = train(TinyMLM(), Batches(), _cfg(max_steps=4), tmp_path / "last", step_fn=_interrupting_step(4))
    assert res.steps == 4 and latest_checkpoint(tmp_path / "last").name == "step-00000004"


def test_train_outside_the_main_thread_leaves_sigint_alone(tmp_path):
    """signal.signal works in the main thread only: train() in another thread runs as before."""
    import threading
    handler = signal.getsignal(signal.SIGINT)
    result, errors = [], []

    def work():
        try:
            result.append(train(TinyMLM(), Batches(), _cfg(max_steps=2), tmp_path / "run", step_fn=pretraining_step))
        except BaseException as e:     # noqa: BLE001 - reported by the assertion below
            errors.append(e)
    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    assert not errors and result[0].steps == 2
    assert signal.getsignal(signal.SIGINT) is handler
