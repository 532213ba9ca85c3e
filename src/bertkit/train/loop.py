"""The training loop; docs/training.md has its contract.

One optimizer step = `grad_accum` micro-batches: forward under autocast, `(loss / grad_accum).backward()`
(gradient all-reduce only on the last micro-batch), one small all-reduce of the step's sums (loss, metric sums and
counts, tokens, whether Ctrl-C was pressed), then clip, `optimizer.step()`, the lr for the next step. Every decision
that must agree across ranks is taken from all-reduced or broadcast numbers, so ranks never diverge.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from torch import Tensor, nn

from bertkit import runtime
from bertkit.attention import ExecutionOptions
from bertkit.errors import BertkitError, ConfigError
from bertkit.heads import IGNORE_INDEX
from bertkit.optim import OPTIMIZERS, SCHEDULES, build_optimizer, lr_factor, warmup_steps
from bertkit.precision import DTYPES, PRECISIONS, autocast, resolve
from bertkit.progress import say
from bertkit.train.callbacks import Callback, Events
from bertkit.train.checkpointing import (Checkpoints, RunState, latest_checkpoint, load_model_weights,
                                         save_model_weights)
from bertkit.train.distributed import Dist, distributed_context, grad_sync, unwrap, wrap
from bertkit.train.monitor import FlopMeter, RunLog, estimate_flops_per_token, peak_flops
from bertkit.train.steps import StepOutput, add_metrics, default_step, to_device
from bertkit.train.stream import Phase, Stream

__all__ = ["TrainConfig", "TrainResult", "Phase", "TrainingDiverged", "train", "seed_everything", "run_seeds",
           "latest_checkpoint", "why_stopped", "load_model_weights", "save_model_weights", "estimate_flops_per_token",
           "peak_flops", "parse_duration", "distributed_context"]


class TrainingDiverged(BertkitError):
    """The loss (or gradient norm) was NaN/inf for too many optimizer steps in a row."""


# ---------------------------------------------------------------------------------------------- config & results
@dataclass
class TrainConfig:
    # -- length: the first of these that is set decides the schedule's total (budget also caps the time)
    max_steps: int | None = None          # optimizer steps
    epochs: float | None = None           # passes over a sized `batches` (fine-tuning)
    budget_s: float | None = None         # wall-clock seconds (cramming): total steps estimated from step time
    # -- batch
    grad_accum: int = 1                   # micro-batches per optimizer step per rank
    # -- optimiser (BERT's AdamW: decoupled decay 0.01 off biases/LayerNorm, betas 0.9/0.999, eps 1e-6)
    optimizer: str = "adamw"              # "adamw" | "lamb" (large batches)
    lr: float = 1e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6                     # BERT's epsilon; PyTorch's default 1e-8 differs
    max_grad_norm: float | None = 1.0     # clip the global gradient norm; None: no clipping
    # -- schedule
    schedule: str = "linear"              # linear (BERT) | cosine | constant | wsd, after warmup
    warmup: float = 0.01                  # < 1: fraction of the total steps; >= 1: steps
    min_lr_ratio: float = 0.0             # the decay ends at lr * min_lr_ratio
    decay_fraction: float | None = None   # wsd only: the decay's last fraction of the steps (None: optim's default)
    # -- precision & placement
    precision: str = "auto"               # bf16 | fp16 (+ GradScaler) autocast, fp32 weights | fp32 | auto (hardware)
    device: str | None = None             # None: cuda:<LOCAL_RANK> when CUDA is available, else cpu
    fsdp: bool = False                    # shard parameters/gradients/optimizer state across ranks (big models)
    deterministic: bool = False           # torch.use_deterministic_algorithms (bitwise-reproducible on CPU)
    seed: int = 0                         # dropout etc.: rank r uses seed + r
    # -- checkpoints
    save_every_steps: int | None = None
    save_every_minutes: float | None = None
    keep_last: int = 3
    save_final: bool = True               # a checkpoint at the last step
    resume: bool | str = False            # True: newest checkpoint in out_dir; a path: that checkpoint
    overwrite: bool = False               # start afresh in an out_dir that holds an earlier run (else an error)
    # -- evaluation & logging
    eval_every_steps: int | None = None
    log_every_steps: int = 1              # metrics.jsonl lines (the per-step losses are in the result anyway)
    progress: bool = True                 # tqdm bar on rank 0
    tensorboard: bool = True              # when the tensorboard package is installed
    plot: bool = True                     # curves.png next to the checkpoints
    flops_per_token: float | None = None  # None: estimated from a BERT config (6N + attention), for FLOP/s and MFU
    peak_flops: float | None = None       # None: table for known GPUs, measured matmul rate on CPU (training dtype)
    # -- failure
    max_bad_steps: int = 5                # consecutive NaN/inf steps before stopping

    @classmethod
    def split(cls, values: dict, base: "TrainConfig | None" = None) -> tuple["TrainConfig", dict]:
        """(`base` or the defaults with the entries of `values` named like a field, the other entries): how the
        commands route their flags, so a new training setting is a field here plus a flag of the same dest."""
        names = {f.name for f in fields(cls)}
        ours = {k: v for k, v in values.items() if k in names}
        return replace(base or cls(), **ours), {k: v for k, v in values.items() if k not in names}

    def validate(self) -> None:
        if self.max_steps is None and self.epochs is None and self.budget_s is None:
            raise ConfigError("TrainConfig: set one of max_steps, epochs or budget_s")
        for name in ("max_steps", "grad_accum", "save_every_steps", "eval_every_steps", "keep_last",
                     "log_every_steps", "max_bad_steps"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ConfigError(f"TrainConfig.{name} must be a positive int, got {v!r}")
        for name in ("epochs", "budget_s", "save_every_minutes", "lr"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ConfigError(f"TrainConfig.{name} must be a positive number, got {v!r}")
        for name, choices in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES), ("precision", PRECISIONS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"TrainConfig.{name}={getattr(self, name)!r} is not one of {choices}")
        for name in ("warmup", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.decay_fraction is not None:
            if self.schedule != "wsd":
                raise ConfigError(f"TrainConfig.decay_fraction={self.decay_fraction!r} applies to schedule='wsd' "
                                  f"only, not {self.schedule!r}: drop it (--decay-fraction) or use the wsd schedule")
            if not (isinstance(self.decay_fraction, (int, float)) and 0 < self.decay_fraction <= 1):
                raise ConfigError(f"TrainConfig.decay_fraction must be in (0, 1], got {self.decay_fraction!r}")
        if not (len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas)):
            raise ConfigError(f"TrainConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"TrainConfig.max_grad_norm must be > 0 or None, got {self.max_grad_norm}")


@dataclass
class TrainResult:
    steps: int                            # optimizer steps done in total (including before a resume)
    total_steps: int                      # the schedule's total (estimated in budget mode)
    tokens: int                           # non-padding tokens trained on, all ranks
    elapsed_s: float                      # training wall time, all sessions of the run
    losses: list[float]                   # per optimizer step of *this* session (NaN for skipped steps)
    start_step: int                       # the step this session began at (0 unless resumed)
    history: list[dict]                   # the train records of this session (as in metrics.jsonl)
    eval_history: list[dict]              # the eval records of this session
    skipped_steps: int                    # NaN/inf steps skipped, whole run
    stop_reason: str                      # "max_steps" | "epochs" | "budget" | "early_stop" (eval_fn asked) |
                                          # "on_start" (its on_start returned False with the run not over)
    checkpoint: Path | None               # the last checkpoint written


# ---------------------------------------------------------------------------------------------- small utilities
def seed_everything(seed: int) -> None:
    """python, numpy and torch RNGs from one seed (call before building the model)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_seeds(seeds) -> tuple[int, ...]:
    """The seeds of a run that reports mean +- std over seeds: at least one, none twice (it would shrink the std)."""
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise ConfigError("seeds: give at least one seed")
    big = next((s for s in seeds if abs(s) >= 2**63), None)     # torch's generator takes 64 bits
    if big is not None:
        raise ConfigError(f"seeds: {str(big)[:30]} is too large for a seed")
    if len(set(seeds)) < len(seeds):
        raise ConfigError(f"seeds: {', '.join(map(str, seeds))} repeats a seed; give distinct seeds")
    return seeds


def parse_duration(text: str | float | int) -> float:
    """'90s', '10m', '1.5h', '2d', or a number of seconds -> seconds (> 0)."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        s = str(text).strip().lower()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        try:
            seconds = float(s[:-1]) * units[s[-1]] if s and s[-1] in units else float(s)
        except ValueError:
            raise ConfigError(f"cannot read a duration from {text!r} (examples: 90s, 10m, 1.5h)") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"a time budget must be > 0, got {text!r}")
    return seconds


def _tokens_in(batch: dict) -> int:
    mask = batch.get("attention_mask")
    if isinstance(mask, Tensor):
        return int(mask.sum())
    ids = batch.get("input_ids")
    return int(ids.numel()) if isinstance(ids, Tensor) else 0


# ---------------------------------------------------------------------------------------------- the loop
def train(model: nn.Module, batches: Iterable[dict] | list[Phase], cfg: TrainConfig, out_dir: str | os.PathLike,
          eval_fn: Callable[[nn.Module], dict] | None = None,
          step_fn: Callable[[nn.Module, dict], StepOutput] | None = None,
          on_start: Callable[[RunState], bool | None] | None = None,
          callbacks: Iterable[Callback] = ()) -> TrainResult:
    """Train `model` on `batches` as `cfg` says, writing metrics and checkpoints under `out_dir` (docs/training.md);
    bad settings raise ConfigError / CheckpointError before the first step."""
    out = Path(out_dir)
    run, checkpoints = _setup(model, batches, cfg, out, step_fn)
    state = run.state
    _start(run, checkpoints, out)
    events = Events(callbacks, state)
    start_step, last_save = state.step, state.elapsed
    if on_start is not None and on_start(state) is False:
        return _result(state, start_step, why_stopped(cfg, state) or "on_start")
    run.model.train()
    events.begin(state, out / "tb" if cfg.tensorboard else None)
    log = RunLog(out, cfg, run.d.main, state.total, state.step)
    dtype = DTYPES.get(run.precision, torch.float32)
    flops = FlopMeter(cfg.flops_per_token, cfg.peak_flops, run.d.device, dtype, run.d.world)
    losses, history, evals = [], [], []     # per step, train records, eval records
    session_t0, prior_elapsed = time.perf_counter(), state.elapsed
    # Ctrl-C stops after the step in progress with a checkpoint; a run that writes none has nothing to resume from
    keeps_checkpoints = bool(cfg.save_every_steps or cfg.save_every_minutes or cfg.save_final)
    try:
        with _interruptible(run, enabled=keeps_checkpoints):
            while (stop_reason := why_stopped(cfg, state)) is None:
                _phase_by_steps(run)
                t0 = time.perf_counter()
                rec = _train_step(run)
                dt = time.perf_counter() - t0
                _tick(run, prior_elapsed + time.perf_counter() - session_t0)
                finite, interrupted = rec.pop("finite"), rec.pop("interrupted")
                losses.append(rec["loss"])
                if not finite and len(state.bad_run) >= cfg.max_bad_steps:
                    raise _diverged(state)
                rec.update(step=state.step, split="train", tokens_per_s=rec["tokens"] / max(dt, 1e-9),
                           elapsed_s=round(state.elapsed, 3), skipped=state.skipped)
                flops.add(rec, dt, run.raw, getattr(run.stream.source, "seq_len", None))
                history.append(rec)
                log.train(rec, dt, state.total)
                events("on_step_end", state, rec)
                if why_stopped(cfg, state) is not None:
                    continue                                   # the final evaluation and checkpoint follow the loop
                if cfg.eval_every_steps and state.step % cfg.eval_every_steps == 0:
                    eval_rec, stop = _eval_and_log(run, eval_fn, log, events)
                    evals.append(eval_rec)
                    if stop:
                        stop_reason = "early_stop"
                        break
                # Ctrl-C saves where a periodic save would, after the evaluation: resuming from it replays exactly
                if interrupted or _save_due(cfg, state, last_save):
                    saved = _save(run, checkpoints, events)
                    last_save = state.elapsed
                if interrupted:
                    if run.d.main:
                        say(f"bertkit: interrupted after step {state.step}: checkpoint {saved} written; "
                            "--resume continues from it")
                    raise KeyboardInterrupt
        if eval_fn is not None and stop_reason != "early_stop":
            evals.append(_eval_and_log(run, eval_fn, log, events)[0])
        if cfg.save_final and state.step > start_step:
            _save(run, checkpoints, events)
    finally:
        log.close()
    events("on_train_end", state)
    return _result(state, start_step, stop_reason, losses, history, evals)


def _result(state: RunState, start_step: int, stop_reason: str, losses=(), history=(), evals=()) -> TrainResult:
    return TrainResult(steps=state.step, total_steps=state.total, tokens=state.tokens, elapsed_s=state.elapsed,
                       losses=list(losses), start_step=start_step, history=list(history), eval_history=list(evals),
                       skipped_steps=state.skipped, stop_reason=stop_reason, checkpoint=state.last_checkpoint)


@dataclass
class _Run:
    """What the steps of the loop work on."""
    cfg: TrainConfig
    d: Dist
    model: nn.Module                      # as trained: the model itself, or its DDP / FSDP wrapping
    optimizer: torch.optim.Optimizer
    stream: Stream
    step_fn: Callable
    weighted: bool                        # step_fn takes `token_weight` (see _token_weights)
    precision: str                        # "bf16" | "fp16" | "fp32": cfg.precision resolved on this device
    state: RunState
    scaler: torch.amp.GradScaler          # fp16's loss scaling; disabled (a no-op) for the other precisions
    interrupt_requested: bool = False     # this rank got Ctrl-C (SIGINT) during the run (see _interruptible)

    @property
    def raw(self) -> nn.Module:
        return unwrap(self.model)


def _setup(model, batches, cfg: TrainConfig, out: Path, step_fn) -> tuple[_Run, Checkpoints]:
    """Check the settings and the output directory, join the process group, place and wrap the model."""
    cfg.validate()
    step_fn = step_fn or default_step
    # step functions that take `token_weight` get the global-batch token weighting (see _token_weights)
    weighted = "token_weight" in inspect.signature(step_fn).parameters
    d = Dist.setup(cfg.device)
    precision = resolve(cfg.precision, d.device)
    if precision == "fp16" and cfg.fsdp:        # GradScaler finds inf in each rank's own shards: ranks could disagree
        raise ConfigError("TrainConfig.precision='fp16' does not run with fsdp (use bf16 or fp32 there)")
    checkpoints = Checkpoints(out, cfg, d)
    checkpoints.check_writable()
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    fast = d.broadcast_object(runtime.plan(d.device))     # this machine's measured fast paths, rank 0's for all
    model = wrap(runtime.apply(model.to(d.device), fast), cfg.fsdp, d)
    optimizer = build_optimizer(model, cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                betas=tuple(cfg.betas), eps=cfg.eps)
    stream = Stream(batches)
    state = RunState(total=_initial_total(cfg, stream), execution=asdict(fast.options))
    scaler = torch.amp.GradScaler(d.device.type, enabled=precision == "fp16")
    return _Run(cfg, d, model, optimizer, stream, step_fn, weighted, precision, state, scaler), checkpoints


def _save(run: _Run, checkpoints: Checkpoints, events: Events) -> Path:
    """A checkpoint of the run, the callbacks' state with it."""
    run.state.callbacks = {events.key(cb): cb.state_dict() for cb in events.stateful()}
    run.state.scaler = run.scaler.state_dict() or None
    path = checkpoints.save(run.state, run.model, run.optimizer, run.stream.state_dict())
    events("on_save", run.state, path)
    return path


def _initial_total(cfg: TrainConfig, stream: Stream) -> int:
    if cfg.max_steps is not None and cfg.budget_s is None:
        return cfg.max_steps
    if cfg.epochs is not None and cfg.budget_s is None:
        try:
            n = len(stream.source)
        except TypeError:
            raise ConfigError("TrainConfig.epochs needs batches with a len(); give max_steps instead") from None
        return max(1, math.ceil(cfg.epochs * n / cfg.grad_accum))
    # budget mode: provisional, re-estimated from measured step times after the first steps
    return cfg.max_steps or 1000


def _start(run: _Run, checkpoints: Checkpoints, out: Path) -> None:
    """Resume from a checkpoint (cfg.resume), or seed the RNGs and check that out holds no earlier run."""
    cfg, d = run.cfg, run.d
    if not cfg.resume or latest_checkpoint(out) is None:
        seed_everything(cfg.seed + d.rank)  # dropout, sampling: reproducible, a different stream per rank
    if cfg.resume:
        checkpoints.resume(run.state, run.model, run.optimizer, run.stream)
        run.scaler.load_state_dict(run.state.scaler or run.scaler.state_dict())   # fp16: the loss scale reached
        # the options the run started with: a resumed run draws the same dropout stream on any machine
        runtime.apply(run.raw, runtime.RuntimePlan(ExecutionOptions(**run.state.execution)))
    else:
        checkpoints.check_fresh()


def why_stopped(cfg: TrainConfig, state: RunState) -> str | None:
    """Why the run is over, or None while it goes on."""
    if state.step >= state.total:
        return "budget" if cfg.budget_s is not None else ("epochs" if cfg.max_steps is None else "max_steps")
    if cfg.budget_s is not None and state.elapsed >= cfg.budget_s:
        return "budget"
    return None


def _save_due(cfg: TrainConfig, state: RunState, last_save_elapsed: float) -> bool:
    if cfg.save_every_steps and state.step % cfg.save_every_steps == 0:
        return True
    return bool(cfg.save_every_minutes and state.elapsed - last_save_elapsed >= cfg.save_every_minutes * 60)


def _diverged(state: RunState) -> TrainingDiverged:
    bad = state.bad_run
    return TrainingDiverged(
        f"loss or gradient norm was NaN/inf at {len(bad)} consecutive steps ({bad[0]}..{bad[-1]}); stopped. "
        f"Weights are from before step {bad[0]}; last good checkpoint: {state.last_checkpoint or 'none'}. "
        f"Try a lower lr, more warmup, or fp32.")


# ---------------------------------------------------------------------------------------------- schedule & budget
def _phase_by_steps(run: _Run) -> None:
    """Step mode: the phase whose share of the total steps holds the current step."""
    stream, state = run.stream, run.state
    if len(stream.phases) > 1 and run.cfg.budget_s is None:
        bounds = stream.boundaries(state.total)
        stream.set_phase(next((k for k, b in enumerate(bounds) if state.step < round(b)), len(bounds) - 1))


def _tick(run: _Run, wall: float) -> None:
    """state.elapsed = the run's wall time so far (a budget is wall-clock); in budget mode the phase and the
    schedule's total follow it."""
    cfg, d, state, stream = run.cfg, run.d, run.state, run.stream
    if d.world > 1 and (cfg.budget_s is not None or cfg.save_every_minutes):
        wall = d.broadcast_object(wall)  # one clock for every rank's decisions
    step_time, state.elapsed = wall - state.elapsed, wall
    if cfg.budget_s is None:
        return
    # budget mode: phase by elapsed share of the budget; total = done + remaining time / time per step
    bounds = stream.boundaries(cfg.budget_s)
    phase = next((k for k, b in enumerate(bounds) if state.elapsed < b), len(bounds) - 1)
    if phase != stream.phase:
        stream.set_phase(phase)
        state.phase_time, state.phase_steps = 0.0, 0
        return
    state.phase_time += step_time
    state.phase_steps += 1
    if state.phase_steps >= 2:  # the first step of a phase pays warm-up costs: estimate from the rest
        per_step = state.phase_time / state.phase_steps
        remaining = max(0.0, cfg.budget_s - state.elapsed)
        est = state.step + int(remaining / per_step)
        if cfg.max_steps is not None:
            est = min(est, cfg.max_steps)
        state.total = max(state.step + 1, est)


# ---------------------------------------------------------------------------------------------- one optimizer step
def _train_step(run: _Run) -> dict:
    """One optimizer step over cfg.grad_accum micro-batches; its record, the same on every rank."""
    cfg, state = run.cfg, run.state
    lr = cfg.lr * lr_factor(state.step, state.total, warmup_steps(cfg.warmup, state.total), cfg.schedule,
                            cfg.min_lr_ratio, cfg.decay_fraction)
    for g in run.optimizer.param_groups:
        g["lr"] = lr
    loss, metrics, global_tokens, interrupted = _all_reduce(run, *_forward_backward(run))
    finite, grad_norm = _clip_and_step(run, loss)
    state.step += 1
    state.tokens += global_tokens
    return {"loss": loss if finite else float("nan"), "lr": lr, "grad_norm": grad_norm, **metrics,
            "tokens": global_tokens, "finite": finite, "interrupted": interrupted}


def _forward_backward(run: _Run) -> tuple[float, dict[str, list], int]:
    """Forward and backward of this rank's micro-batches: (summed loss, metric name -> [sum, count], tokens)."""
    cfg, d = run.cfg, run.d
    loss_sum, metric_sums, tokens = 0.0, {}, 0
    micro = [run.stream.next() for _ in range(cfg.grad_accum)]
    weights = _token_weights(run, micro)
    for i, batch in enumerate(micro):
        tokens += _tokens_in(batch)
        batch = to_device(batch, d.device)
        with grad_sync(run.model, d, last=i == cfg.grad_accum - 1):
            with autocast(run.precision, d.device):
                out = run.step_fn(run.model, batch, **({"token_weight": weights[i]} if run.weighted else {}))
            run.scaler.scale(out.loss / cfg.grad_accum).backward()
        loss_sum += float(out.loss.detach())
        add_metrics(metric_sums, out.metrics)
    return loss_sum, metric_sums, tokens


def _token_weights(run: _Run, micro: list[dict]) -> list[float]:
    """Per micro-batch: labelled tokens / mean labelled tokens per micro-batch over the global batch. Averaging
    micro-batch means would weight a token by 1 / (its micro-batch's count); this weight makes the step's loss the
    mean over every labelled token of the global batch, however it is cut (accumulation x processes)."""
    if not run.weighted:
        return [1.0] * len(micro)
    counts = [float((b["labels"] != IGNORE_INDEX).sum()) if isinstance(b.get("labels"), Tensor)
              and b["labels"].dim() > 1 else 1.0 for b in micro]
    total = float(run.d.all_reduce_sum(torch.tensor(sum(counts), dtype=torch.float64)))
    mean = total / (len(micro) * run.d.world)
    return [c / mean if mean > 0 else 1.0 for c in counts]


def _all_reduce(run: _Run, loss_sum: float, metric_sums: dict[str, list], tokens: int
                ) -> tuple[float, dict[str, float], int, bool]:
    """One all-reduce for everything ranks must agree on: (mean loss, metrics, tokens) of the global batch, and
    whether any rank was interrupted (riding along: a collective of its own each step costs real time on gloo)."""
    names = sorted(metric_sums)
    vec = [loss_sum, run.cfg.grad_accum, *(x for n in names for x in metric_sums[n]), tokens, run.interrupt_requested]
    red = run.d.all_reduce_sum(torch.tensor([float(v) for v in vec], dtype=torch.float64)).tolist()
    metrics = {n: red[2 + 2 * k] / max(red[3 + 2 * k], 1e-12) for k, n in enumerate(names)}
    return red[0] / red[1], metrics, int(red[-2]), red[-1] > 0


def _clip_and_step(run: _Run, loss: float) -> tuple[bool, float]:
    """Clip the gradients, then step unless the loss or the gradients are not finite: (stepped, grad norm)."""
    cfg, state, scaler = run.cfg, run.state, run.scaler
    scaler.unscale_(run.optimizer)        # fp16: the true gradients, for the clip and the norm logged
    scale = scaler.get_scale()
    finite = math.isfinite(loss)
    grad_norm = float("nan")
    if finite and cfg.max_grad_norm is not None:
        # FSDP2: the gradients are DTensor shards; clip_grad_norm_ reduces the norm across ranks
        gn = torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.max_grad_norm)
        grad_norm = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
        finite = math.isfinite(grad_norm)
    if finite:
        scaler.step(run.optimizer)        # fp16: no step where unscale_ found inf / NaN gradients
    scaler.update()
    overflow = scaler.get_scale() < scale
    if finite and not overflow:
        state.bad_run = []
    else:   # an fp16 overflow at a finite loss is the GradScaler's to handle, not a step toward a divergence
        state.skipped += 1
        state.bad_run += [] if overflow and math.isfinite(loss) else [state.step]
    run.optimizer.zero_grad(set_to_none=True)
    return finite and not overflow, grad_norm


# ---------------------------------------------------------------------------------------------- Ctrl-C
@contextlib.contextmanager
def _interruptible(run: _Run, enabled: bool):
    """SIGINT while the steps run: the first one only marks the run (`run.interrupt_requested`), so the step in
    progress finishes and the ranks agree through the step's all-reduce; a second one raises KeyboardInterrupt at
    once. Only the main thread may set a signal handler; where SIGINT is ignored (a background job) it stays so."""
    if not (enabled and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):
        yield
        return

    def handle(signum, frame) -> None:
        if run.interrupt_requested:
            raise KeyboardInterrupt
        run.interrupt_requested = True
        if run.d.main:
            line = ("\n" if run.cfg.progress else "") + ("bertkit: interrupted: finishing this step to save a "
                    "checkpoint (Ctrl-C again stops at once, losing the steps since the last checkpoint)\n")
            try:    # os.write: print() from a handler can re-enter a write to stderr in progress (the progress bar)
                os.write(2, line.encode())
            except OSError:
                pass        # no stderr: the checkpoint matters, not the notice

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield
    finally:
        # None: the handler was set outside Python, which getsignal cannot hand back; the default is the closest
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


# ---------------------------------------------------------------------------------------------- evaluation
def _eval_and_log(run: _Run, eval_fn, log: RunLog, events: Events) -> tuple[dict, bool]:
    """Evaluate (when there is an eval_fn) and log: (the eval record, whether any rank's eval_fn asked to stop)."""
    res = {}
    if eval_fn is not None:
        run.model.eval()
        try:
            with torch.no_grad(), autocast(run.precision, run.d.device):
                res = dict(eval_fn(run.raw) or {})
        finally:
            run.model.train()
    stop = bool(res.pop("stop", False))
    if run.d.world > 1 and eval_fn is not None:
        stop = float(run.d.all_reduce_sum(torch.tensor(float(stop), dtype=torch.float64))) > 0
    metrics = {k: float(v) for k, v in res.items()}
    rec = {"split": "eval", "step": run.state.step, **metrics}
    log.eval(rec, metrics)
    events("on_evaluate", run.state, metrics)
    return rec, stop
