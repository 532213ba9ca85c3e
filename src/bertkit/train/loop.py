"""The training loop itself; the public API is described in bertkit/train/__init__.py.

One optimizer step = `grad_accum` micro-batches: forward under autocast, `(loss / grad_accum).backward()`
(gradient all-reduce only on the last micro-batch, `no_sync` before), one small all-reduce of the step's sums
(loss, metric sums and counts, tokens, wall time), then clip, `optimizer.step()`, the lr for the next step.
Every decision that must agree across ranks (skip, save on a timer, stop on the budget) is taken from those
all-reduced numbers, so ranks never diverge.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from bertkit import runtime
from bertkit.errors import BertkitError, CheckpointError, ConfigError
from bertkit.hardware import PRECISIONS, cpu_model, resolve_precision
from bertkit.optim import OPTIMIZERS, SCHEDULES, build_optimizer, lr_factor, warmup_steps

__all__ = ["TrainConfig", "TrainResult", "StepOutput", "Phase", "TrainingDiverged", "train", "default_step",
           "pretraining_step", "seed_everything", "latest_checkpoint", "load_model_weights", "save_model_weights",
           "estimate_flops_per_token", "peak_flops", "parse_duration", "pretraining_eval",
           "distributed_context"]

log = logging.getLogger("bertkit.train")

IGNORE_INDEX = -100
CHECKPOINT_DIR = "checkpoints"


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
    decay_fraction: float | None = None   # wsd: the linear decay spans this last fraction of the steps (None:
                                          # optim.DEFAULT_DECAY_FRACTION); an error with the other schedules
    # -- precision & placement
    precision: str = "auto"               # "bf16" autocast (weights and optimizer stay fp32) | "fp32" | "auto":
                                          # bf16 where the device has native bf16 (bertkit.hardware), else fp32
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
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"TrainConfig.optimizer={self.optimizer!r} is not one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"TrainConfig.schedule={self.schedule!r} is not one of {SCHEDULES}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"TrainConfig.precision={self.precision!r} is not one of {PRECISIONS}")
        if self.warmup < 0:
            raise ConfigError(f"TrainConfig.warmup must be >= 0, got {self.warmup}")
        if self.decay_fraction is not None:
            if self.schedule != "wsd":
                raise ConfigError(f"TrainConfig.decay_fraction={self.decay_fraction!r} applies to schedule='wsd' "
                                  f"only, not {self.schedule!r}: drop it (--decay-fraction) or use the wsd schedule")
            if not (isinstance(self.decay_fraction, (int, float)) and 0 < self.decay_fraction <= 1):
                raise ConfigError(f"TrainConfig.decay_fraction must be in (0, 1], got {self.decay_fraction!r}")
        if not (len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas)):
            raise ConfigError(f"TrainConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.weight_decay < 0:
            raise ConfigError(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"TrainConfig.max_grad_norm must be > 0 or None, got {self.max_grad_norm}")


@dataclass
class StepOutput:
    """What a step function returns for one micro-batch: the loss to backpropagate and summable metrics."""
    loss: Tensor
    # name -> (sum, count): e.g. "mlm_acc": (correct predictions, masked tokens); reported as sum / count over
    # the whole global batch. A plain tensor value means (value, 1), i.e. averaged over micro-batches.
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class Phase:
    """One stretch of a run with its own data (e.g. another sequence length)."""
    batches: Iterable[dict]
    fraction: float                       # share of the total optimizer steps (of the budget in budget mode)
    name: str = ""


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
    stop_reason: str                      # "max_steps" | "epochs" | "budget" | "data"
    checkpoint: Path | None               # the last checkpoint written


# ---------------------------------------------------------------------------------------------- step functions
def default_step(model: nn.Module, batch: dict) -> StepOutput:
    """`model(**batch).loss`."""
    out = model(**batch)
    loss = out["loss"] if isinstance(out, dict) else out.loss
    if loss is None:
        raise ConfigError("the model returned no loss: does the batch carry labels?")
    return StepOutput(loss=loss)


def pretraining_step(model: nn.Module, batch: dict, token_weight: float = 1.0) -> StepOutput:
    """BertForPreTraining / BertForMaskedLM / ELECTRA: loss plus MLM, NSP/SOP and replaced-token accuracies.

    The loss is `token_weight * token-level loss + sentence-level loss`, where the token-level part is the MLM
    loss (ELECTRA: generator MLM + weighted discriminator loss) and the sentence-level part NSP/SOP. The loop
    passes the weight that turns the mean over this micro-batch's masked tokens into its share of the mean over
    the global batch's masked tokens (1.0 when there is one micro-batch on one process)."""
    out = model(**batch)
    loss = out.loss
    mlm_loss = getattr(out, "mlm_loss", None)
    if token_weight != 1.0 and mlm_loss is not None:
        sentence = getattr(out, "nsp_loss", None)
        token_level = loss - sentence if sentence is not None else loss
        loss = token_level * token_weight + (sentence if sentence is not None else 0.0)
    metrics: dict[str, Any] = {}
    labels = batch.get("labels")
    logits = getattr(out, "prediction_logits", None)
    if logits is None:
        logits = getattr(out, "logits", None)
    if labels is not None and logits is not None:
        masked = labels != IGNORE_INDEX
        target = labels[masked]                                    # (n_masked,)
        pred = logits.argmax(-1)
        if pred.dim() > 1:                                         # full (batch, seq) logits
            pred = pred[masked]
        metrics["mlm_acc"] = ((pred == target).sum(), target.numel())
    if mlm_loss is not None:
        metrics["mlm_loss"] = (mlm_loss.detach() * token_weight, 1)
    nsp_label = batch.get("next_sentence_label")
    nsp_logits = getattr(out, "seq_relationship_logits", None)
    if nsp_label is not None and nsp_logits is not None:
        metrics["nsp_acc"] = ((nsp_logits.argmax(-1) == nsp_label.reshape(-1)).sum(), nsp_label.numel())
        if getattr(out, "nsp_loss", None) is not None:
            metrics["nsp_loss"] = out.nsp_loss.detach()
    if getattr(out, "rtd_loss", None) is not None:                  # ELECTRA discriminator
        metrics["rtd_loss"] = out.rtd_loss.detach()
        metrics["rtd_acc"] = (out.rtd_correct, out.rtd_count)
    return StepOutput(loss=loss, metrics=metrics)


def pretraining_eval(batches: Iterable[dict], max_batches: int | None = None,
                     step_fn: Callable = pretraining_step) -> Callable[[nn.Module], dict]:
    """An eval_fn over held-out pre-training batches: MLM loss (mean over every masked token) and accuracy, NSP/SOP
    loss and accuracy, ELECTRA's replaced-token accuracy, and `masked_tokens`, how many masked tokens were scored.
    The same batches each time (`set_epoch(0)` first when the source has it, so dynamic masks repeat too)."""
    def evaluate(model: nn.Module) -> dict:
        if hasattr(batches, "set_epoch"):
            batches.set_epoch(0)
        device = next(model.parameters()).device
        pairs: dict[str, list[float]] = {}
        masked_tokens = 0
        for i, batch in enumerate(batches):
            if max_batches is not None and i >= max_batches:
                break
            batch = _to_device(batch, device)
            out = step_fn(model, batch)
            n_masked = float((batch["labels"] != IGNORE_INDEX).sum()) if "labels" in batch else 1.0
            masked_tokens += int(n_masked) if "labels" in batch else 0
            for name, value in out.metrics.items():
                s, c = value if isinstance(value, tuple) else (value, 1)
                s, c = float(s), float(c)
                if name == "mlm_loss":        # a mean over this batch's masked tokens -> weight by their number
                    s, c = s * n_masked, n_masked
                acc = pairs.setdefault(name, [0.0, 0.0])
                acc[0] += s
                acc[1] += c
            acc = pairs.setdefault("loss", [0.0, 0.0])
            acc[0] += float(out.loss)
            acc[1] += 1
        return {**{name: s / c for name, (s, c) in pairs.items() if c > 0}, "masked_tokens": masked_tokens}
    return evaluate


# ---------------------------------------------------------------------------------------------- small utilities
def seed_everything(seed: int) -> None:
    """python, numpy and torch RNGs from one seed (call before building the model)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


def estimate_flops_per_token(model: nn.Module, seq_len: int) -> float | None:
    """Training FLOPs per token of a BERT-like model: 6 x non-embedding parameters + 12 x layers x hidden x seq
    (the attention score and value matmuls, forward + backward), as nanoGPT's estimate_mfu. None when unknown."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        return None
    n = sum(p.numel() for name, p in model.named_parameters() if "embeddings" not in name)
    return 6.0 * n + 12.0 * config.num_hidden_layers * config.hidden_size * seq_len


_GPU_BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12, "4090": 165e12}
_measured_peak: dict[str, float] = {}


def peak_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> float:
    """The machine's peak FLOP/s in `dtype` (the training precision): $BERTKIT_PEAK_FLOPS, else a table for known
    GPUs (bf16 dense, no sparsity; half of it for fp32's TF32), else on CPU the best measured rate of a 2048^3 matmul
    in `dtype` (1024^3 where bf16 is emulated: it runs ~1 GFLOP/s there). A measurement on a busy machine reads low,
    so the best rate ever seen on this CPU / thread count / dtype is kept in ~/.cache/bertkit/peak_flops.json and
    only ever raised."""
    env = os.environ.get("BERTKIT_PEAK_FLOPS")
    if env:
        return float(env)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in _GPU_BF16_PEAK.items() if k in name), 312e12)
        return peak if dtype in (torch.bfloat16, torch.float16) else peak / 2
    from bertkit.hardware import native_bf16
    dname = str(dtype).removeprefix("torch.")
    key = f"{cpu_model()}|threads={torch.get_num_threads()}" + ("" if dtype == torch.bfloat16 else f"|{dname}")
    if key not in _measured_peak:
        n = 2048 if dtype != torch.bfloat16 or native_bf16(device) else 256
        g = torch.Generator().manual_seed(0)    # its own generator: the global RNG (dropout) stays untouched, so
        a = torch.randn(n, n, dtype=dtype, generator=g)     # a run does not depend on whether this ran before
        b = torch.randn(n, n, dtype=dtype, generator=g)
        a @ b
        best = 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            a @ b
            best = max(best, 2.0 * n ** 3 / (time.perf_counter() - t0))
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bertkit" / "peak_flops.json"
        try:
            known = json.loads(cache.read_text()) if cache.exists() else {}
            best = max(best, float(known.get(key, 0.0)))
            known[key] = best
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
            tmp.write_text(json.dumps(known))
            os.replace(tmp, cache)
        except (OSError, ValueError):
            pass
        _measured_peak[key] = best
    return _measured_peak[key]


# ---------------------------------------------------------------------------------------------- distributed
@dataclass
class _Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    we_initialised: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def setup(cls, device_name: str | None = None) -> "_Dist":
        import torch.distributed as dist
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device_name is not None:
            device = torch.device(device_name)
        elif torch.cuda.is_available():
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        ours = False
        if world > 1 and not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
            ours = True
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), local_rank, device, ours)
        return cls(0, 1, 0, device, False)

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        if self.world > 1:
            import torch.distributed as dist
            # gloo reduces CPU tensors; nccl needs them on the GPU
            if self.device.type == "cuda":
                t = t.to(self.device)
            dist.all_reduce(t)
            t = t.cpu()
        return t

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier()

    def broadcast_object(self, obj):
        if self.world == 1:
            return obj
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def distributed_context(device: str | None = None) -> tuple[int, int]:
    """(rank, world_size); under torchrun this joins the process group (what train() would do), so data readers
    can be built for this rank before training starts."""
    d = _Dist.setup(device)
    return d.rank, d.world


def _wrap(model: nn.Module, cfg: TrainConfig, d: _Dist) -> nn.Module:
    if d.world == 1:
        return model
    if cfg.fsdp:
        # FSDP2 (per-parameter sharding, DTensor): works on CPU (gloo) as well as CUDA (nccl). Each encoder layer
        # is its own unit (all-gathered just before it runs, freed after), the rest (embeddings, heads) the root.
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
        mesh = init_device_mesh(d.device.type, (d.world,))
        for m in model.modules():
            if type(m).__name__.endswith("Layer"):
                fully_shard(m, mesh=mesh)
                # the last layer may run through these methods instead of forward ([CLS]-only / masked rows):
                # they must all-gather the layer's shards too
                for name in ("forward_first", "forward_rows"):
                    if hasattr(m, name):
                        register_fsdp_forward_method(m, name)
        fully_shard(model, mesh=mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


# ---------------------------------------------------------------------------------------------- data stream
class _Stream:
    """Micro-batches from `batches` (or a list of Phases) across epochs, with a resumable position."""

    def __init__(self, batches, sized_len: int | None = None):
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
        out, acc = [], 0.0
        for p in self.phases:
            acc += p.fraction
            out.append(acc * total)
        return out

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

    def next(self) -> tuple[dict, bool]:
        """(batch, wrapped): wrapped says an epoch ended before this batch."""
        wrapped = False
        if self._it is None:
            self._new_epoch_iter()
        try:
            batch = next(self._it)
        except StopIteration:
            if self.position == 0:
                raise ConfigError("the training data yielded no batch") from None
            self.epoch += 1
            self.position = 0
            wrapped = True
            self._new_epoch_iter()
            try:
                batch = next(self._it)
            except StopIteration:
                raise ConfigError("the training data yielded no batch in a new epoch") from None
        self.position += 1
        return batch, wrapped

    def state_dict(self) -> dict:
        state = {"phase": self.phase, "epoch": self.epoch, "position": self.position}
        src = self.source
        if hasattr(src, "state_dict"):
            state["source"] = _to_plain(src.state_dict())
        return state

    def load_state_dict(self, state: dict) -> None:
        self.phase, self.epoch, self.position = int(state["phase"]), int(state["epoch"]), int(state["position"])
        self._it = None
        src = self.source
        if "source" in state and hasattr(src, "load_state_dict"):
            src.load_state_dict(_from_plain(state["source"]))
            if hasattr(src, "set_epoch"):
                pass  # the source's own state carries its epoch
            self._it = iter(src)
        else:
            self._pending_skip = self.position


def _to_plain(obj):
    """numpy scalars/arrays -> python numbers / tensors, so torch.load(weights_only=True) reads the state back."""
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj)), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _from_plain(obj):
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return obj["__ndarray__"].numpy().astype(obj["dtype"])
        return {k: _from_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_plain(v) for v in obj)
    return obj


def _tokens_in(batch: dict) -> int:
    mask = batch.get("attention_mask")
    if isinstance(mask, Tensor):
        return int(mask.sum())
    ids = batch.get("input_ids")
    return int(ids.numel()) if isinstance(ids, Tensor) else 0


def _to_device(batch: dict, device: torch.device) -> dict:
    if device.type == "cpu":
        return batch
    return {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}


# ---------------------------------------------------------------------------------------------- checkpoints
def save_model_weights(state: dict[str, Tensor], path: Path) -> None:
    """A state dict to safetensors; tensors that share storage (tied embeddings) are stored once, their other
    names listed in the metadata and restored by `load_model_weights`."""
    from safetensors.torch import save_file
    seen: dict[tuple, str] = {}
    unique: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in state.items():
        t = t.detach()
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        unique[name] = t.contiguous().cpu()
    save_file(unique, str(path), metadata={"format": "pt", "bertkit_aliases": json.dumps(aliases)})


def load_model_weights(path: Path) -> dict[str, Tensor]:
    from safetensors import safe_open
    from safetensors.torch import load_file
    try:
        sd = load_file(str(path))
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint weights {path}: {type(e).__name__}: {e}") from None
    for alias, name in json.loads(meta.get("bertkit_aliases", "{}")).items():
        sd[alias] = sd[name]
    return sd


def _rng_state() -> dict:
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]), int(np_state[3]),
                  float(np_state[4])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directory under out_dir/checkpoints (temp directories are ignored)."""
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step-*") if p.is_dir() and (p / "state.json").is_file())
    return done[-1] if done else None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _sharded(cfg: TrainConfig) -> bool:
    import torch.distributed as dist
    return cfg.fsdp and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _full_state(model: nn.Module, optimizer, cfg: TrainConfig) -> tuple[dict, dict]:
    """(model state, optimizer state) gathered in full (FSDP) and keyed like the unwrapped model."""
    if _sharded(cfg):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        msd, osd = get_state_dict(model, optimizer,
                                  options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return msd, osd
    return _unwrap(model).state_dict(keep_vars=False), optimizer.state_dict()


# ---------------------------------------------------------------------------------------------- the loop
class _Trainer:
    def __init__(self, model: nn.Module, batches, cfg: TrainConfig, out_dir, eval_fn, step_fn):
        cfg.validate()
        self.cfg = cfg
        self.out = Path(out_dir)
        self.eval_fn = eval_fn
        self.step_fn = step_fn or default_step
        # step functions that take `token_weight` get the global-batch token weighting (see _token_weights)
        self._weighted = "token_weight" in inspect.signature(self.step_fn).parameters
        self.d = _Dist.setup(cfg.device)
        self._check_out_dir()
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        self.raw = runtime.apply(model.to(self.d.device))     # this machine's measured fast paths
        self.model = _wrap(self.raw, cfg, self.d)
        self.optimizer = build_optimizer(self.model, cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                         betas=tuple(cfg.betas), eps=cfg.eps)
        self.stream = _Stream(batches)
        # run state (checkpointed)
        self.step = 0
        self.tokens = 0
        self.elapsed = 0.0
        self.skipped = 0
        self.total = self._initial_total(batches)
        self.phase_time = 0.0          # budget mode: time and steps spent in the current phase
        self.phase_steps = 0
        self.last_ckpt: Path | None = None
        self.bad_run: list[int] = []
        self.precision = resolve_precision(cfg.precision, self.d.device)
        self.autocast_dtype = torch.bfloat16 if self.precision == "bf16" else None
        self.peak = None
        self.flops_per_token = cfg.flops_per_token

    # -- setup helpers
    def _check_out_dir(self) -> None:
        try:
            (self.out / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
            probe = self.out / f".write-test-{os.getpid()}-{self.d.rank}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"output directory {self.out} is not writable: {e.strerror or e}") from None

    def _initial_total(self, batches) -> int:
        cfg = self.cfg
        if cfg.max_steps is not None and cfg.budget_s is None:
            return cfg.max_steps
        if cfg.epochs is not None and cfg.budget_s is None:
            src = self.stream.source
            try:
                n = len(src)
            except TypeError:
                raise ConfigError("TrainConfig.epochs needs batches with a len(); give max_steps instead") from None
            return max(1, math.ceil(cfg.epochs * n / cfg.grad_accum))
        # budget mode: provisional, re-estimated from measured step times after the first steps
        return cfg.max_steps or 1000

    # -- checkpointing
    def save(self) -> Path:
        name = f"step-{self.step:08d}"
        root = self.out / CHECKPOINT_DIR
        final = root / name
        if final.exists():
            self.last_ckpt = final
            return final
        tmp = root / f".tmp-{name}"
        msd, osd = _full_state(self.model, self.optimizer, self.cfg)
        if self.d.main:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        self.d.barrier()
        rank_file = tmp / f"rank-{self.d.rank:05d}.pt"
        torch.save({"rng": _rng_state(), "data": self.stream.state_dict()}, rank_file)
        _fsync_file(rank_file)
        if self.d.main:
            save_model_weights(msd, tmp / "model.safetensors")
            torch.save(osd, tmp / "optimizer.pt")
            config = getattr(self.raw, "config", None)
            if config is not None and hasattr(config, "to_json"):
                config.to_json(tmp / "config.json")
            state = {"step": self.step, "total": self.total, "tokens": self.tokens, "elapsed": self.elapsed,
                     "skipped": self.skipped, "world_size": self.d.world, "phase_time": self.phase_time,
                     "phase_steps": self.phase_steps, "config": _jsonable(dataclasses.asdict(self.cfg))}
            (tmp / "state.json").write_text(json.dumps(state, indent=1))
            for f in tmp.iterdir():
                _fsync_file(f)
        self.d.barrier()
        if self.d.main:
            os.replace(tmp, final)
            _fsync_dir(root)
            done = sorted(p for p in root.glob("step-*") if p.is_dir())
            for old in done[:-self.cfg.keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        self.d.barrier()
        self.last_ckpt = final
        return final

    def resume(self) -> None:
        cfg = self.cfg
        if self.d.main:
            for stale in (self.out / CHECKPOINT_DIR).glob(".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)  # an interrupted write
        self.d.barrier()
        path = latest_checkpoint(self.out) if cfg.resume is True else Path(cfg.resume)
        if path is None:
            log.info("resume: no checkpoint in %s, starting from scratch", self.out)
            return
        if not (path / "state.json").is_file():
            raise CheckpointError(f"{path} is not a complete bertkit training checkpoint (no state.json)")
        state = json.loads((path / "state.json").read_text())
        if state["world_size"] != self.d.world:
            raise CheckpointError(f"{path} was written by {state['world_size']} processes, this run has "
                                  f"{self.d.world}: resume with the same number of processes")
        sd = load_model_weights(path / "model.safetensors")
        try:
            osd = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
            rank_state = torch.load(path / f"rank-{self.d.rank:05d}.pt", map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from None
        if _sharded(cfg):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
            set_state_dict(self.model, self.optimizer, model_state_dict=sd, optim_state_dict=osd,
                           options=StateDictOptions(full_state_dict=True))
        else:
            try:
                self.raw.load_state_dict(sd, strict=True)
            except RuntimeError as e:
                raise CheckpointError(f"{path}: the weights do not fit the model: {e}") from None
            self.optimizer.load_state_dict(osd)
        self.step, self.total, self.tokens = state["step"], state["total"], state["tokens"]
        self.elapsed, self.skipped = state["elapsed"], state["skipped"]
        self.phase_time, self.phase_steps = state.get("phase_time", 0.0), state.get("phase_steps", 0)
        if cfg.max_steps is not None and cfg.budget_s is None:
            self.total = cfg.max_steps  # a resumed run may be asked to go further
        self.stream.load_state_dict(rank_state["data"])
        _set_rng_state(rank_state["rng"])
        self.last_ckpt = path
        if self.d.main:
            self._truncate_metrics(self.step)
        log.info("resumed from %s at step %d", path, self.step)

    def _truncate_metrics(self, step: int) -> None:
        """Drop metric lines after `step` (written after the checkpoint by the interrupted session)."""
        path = self.out / "metrics.jsonl"
        if not path.exists():
            return
        keep = []
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by the crash
            if rec.get("step", 0) <= step:
                keep.append(line)
        path.write_text("".join(l + "\n" for l in keep))

    # -- schedule
    def lr_at(self, step: int) -> float:
        cfg = self.cfg
        return cfg.lr * lr_factor(step, self.total, warmup_steps(cfg.warmup, self.total), cfg.schedule,
                                  cfg.min_lr_ratio, cfg.decay_fraction)

    def _update_budget(self, step_time: float) -> None:
        """Budget mode: phase by elapsed share of the budget; total = done + remaining time / time per step."""
        cfg = self.cfg
        bounds = self.stream.boundaries(cfg.budget_s)
        phase = next((k for k, b in enumerate(bounds) if self.elapsed < b), len(bounds) - 1)
        if phase != self.stream.phase:
            self.stream.set_phase(phase)
            self.phase_time, self.phase_steps = 0.0, 0
            return
        self.phase_time += step_time
        self.phase_steps += 1
        if self.phase_steps >= 2:  # the first step of a phase pays warm-up costs: estimate from the rest
            per_step = self.phase_time / self.phase_steps
            remaining = max(0.0, cfg.budget_s - self.elapsed)
            est = self.step + int(remaining / per_step)
            if cfg.max_steps is not None:
                est = min(est, cfg.max_steps)
            self.total = max(self.step + 1, est)

    def _phase_by_steps(self) -> None:
        if len(self.stream.phases) > 1 and self.cfg.budget_s is None:
            bounds = self.stream.boundaries(self.total)
            phase = next((k for k, b in enumerate(bounds) if self.step < round(b)), len(bounds) - 1)
            self.stream.set_phase(phase)

    # -- one optimizer step
    def _micro_batches(self):
        for i in range(self.cfg.grad_accum):
            batch, _ = self.stream.next()
            yield i, batch

    def _token_weights(self, micro: list[dict]) -> list[float]:
        """Per micro-batch: labelled tokens / mean labelled tokens per micro-batch over the global batch.

        A token-level loss (MLM) is a mean over the micro-batch's labelled tokens; averaging those means over
        micro-batches and ranks would weight a token by 1 / (its micro-batch's count). Scaling each micro-batch's
        token loss by this weight makes the step's loss the mean over every labelled token of the global batch,
        so the maths does not depend on how the global batch is cut (accumulation x processes)."""
        if not self._weighted:
            return [1.0] * len(micro)
        counts = [float((b["labels"] != IGNORE_INDEX).sum()) if isinstance(b.get("labels"), Tensor)
                  and b["labels"].dim() > 1 else 1.0 for b in micro]
        total = float(self.d.all_reduce_sum(torch.tensor(sum(counts), dtype=torch.float64)))
        mean = total / (len(micro) * self.d.world)
        return [c / mean if mean > 0 else 1.0 for c in counts]

    def train_step(self) -> dict:
        cfg, d = self.cfg, self.d
        lr = self.lr_at(self.step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64)
        metric_sums: dict[str, list] = {}
        tokens = 0
        micro = [b for _, b in self._micro_batches()]
        weights = self._token_weights(micro)
        for i, batch in enumerate(micro):
            tokens += _tokens_in(batch)
            batch = _to_device(batch, d.device)
            last = i == cfg.grad_accum - 1
            sync = contextlib.nullcontext()
            if d.world > 1 and hasattr(self.model, "set_requires_gradient_sync"):    # FSDP2
                self.model.set_requires_gradient_sync(last)
            elif d.world > 1 and not last and hasattr(self.model, "no_sync"):        # DDP
                sync = self.model.no_sync()
            with sync:
                with torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=self.autocast_dtype is not None):
                    if self._weighted:
                        out = self.step_fn(self.model, batch, token_weight=weights[i])
                    else:
                        out = self.step_fn(self.model, batch)
                (out.loss / cfg.grad_accum).backward()
            loss_sum += out.loss.detach().double().cpu()
            for name, value in out.metrics.items():
                s, c = value if isinstance(value, tuple) else (value, 1)
                acc = metric_sums.setdefault(name, [0.0, 0.0])
                acc[0] = acc[0] + (s.detach().double().cpu() if isinstance(s, Tensor) else float(s))
                acc[1] = acc[1] + (c.detach().double().cpu() if isinstance(c, Tensor) else float(c))
        names = sorted(metric_sums)
        step_time = time.perf_counter() - t0
        # one all-reduce for everything ranks must agree on
        vec = [loss_sum, torch.tensor(float(cfg.grad_accum), dtype=torch.float64)]
        for n in names:
            vec += [torch.as_tensor(metric_sums[n][0], dtype=torch.float64),
                    torch.as_tensor(metric_sums[n][1], dtype=torch.float64)]
        vec += [torch.tensor(float(tokens), dtype=torch.float64), torch.tensor(step_time, dtype=torch.float64)]
        red = d.all_reduce_sum(torch.stack([v.reshape(()) for v in vec])).tolist()
        loss = red[0] / red[1]
        metrics = {n: red[2 + 2 * k] / max(red[3 + 2 * k], 1e-12) for k, n in enumerate(names)}
        global_tokens = int(red[-2])
        # clip (global norm over all ranks' synchronised grads), then step unless something is not finite
        finite = math.isfinite(loss)
        grad_norm = float("nan")
        if finite:
            if cfg.max_grad_norm is not None:
                # FSDP2: the gradients are DTensor shards; clip_grad_norm_ reduces the norm across ranks
                gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                grad_norm = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
                finite = math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
            self.bad_run = []
        else:
            self.skipped += 1
            self.bad_run.append(self.step)
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += global_tokens
        return {"loss": loss if finite else float("nan"), "lr": lr, "grad_norm": grad_norm, **metrics,
                "tokens": global_tokens, "finite": finite}

    # -- evaluation, logging
    def evaluate(self) -> dict:
        if self.eval_fn is None:
            return {}
        self.model.eval()
        try:
            with torch.no_grad(), torch.autocast(self.d.device.type, dtype=torch.bfloat16,
                                                 enabled=self.autocast_dtype is not None):
                res = self.eval_fn(self.raw)
        finally:
            self.model.train()
        return {k: float(v) for k, v in (res or {}).items()}

    def _check_fresh(self) -> None:
        """Without resume, an out_dir holding an earlier run is an error unless cfg.overwrite clears it."""
        old = latest_checkpoint(self.out)
        metrics = self.out / "metrics.jsonl"
        had_metrics = metrics.exists()
        self.d.barrier()  # every rank has looked before rank 0 creates metrics.jsonl
        if old is None and not had_metrics:
            return
        if not self.cfg.overwrite:
            raise ConfigError(f"{self.out} already holds a training run ({old or metrics}): resume it, or "
                              "choose a new output directory, or overwrite it")
        self.d.barrier()
        if self.d.main:
            shutil.rmtree(self.out / CHECKPOINT_DIR, ignore_errors=True)
            (self.out / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
            metrics.unlink(missing_ok=True)
        self.d.barrier()

    def run(self) -> TrainResult:
        cfg, d = self.cfg, self.d
        if not cfg.resume or latest_checkpoint(self.out) is None:
            seed_everything(cfg.seed + d.rank)  # dropout, sampling: reproducible, a different stream per rank
        if cfg.resume:
            self.resume()
        else:
            self._check_fresh()
        start_step = self.step
        self.model.train()
        metrics_path = self.out / "metrics.jsonl"
        mfile = open(metrics_path, "a") if d.main else None
        tb = self._tensorboard() if d.main else None
        bar = None
        if d.main and cfg.progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=self.total, initial=self.step, desc="train", dynamic_ncols=True, mininterval=0.5)
        losses: list[float] = []
        history: list[dict] = []
        evals: list[dict] = []
        last_save_elapsed = self.elapsed
        stop_reason = "max_steps"
        window_tokens, window_time = 0, 0.0
        session_t0, prior_elapsed = time.perf_counter(), self.elapsed
        try:
            while True:
                if self.step >= self.total:
                    stop_reason = "budget" if cfg.budget_s is not None else (
                        "epochs" if cfg.max_steps is None else "max_steps")
                    break
                if cfg.budget_s is not None and self.elapsed >= cfg.budget_s:
                    stop_reason = "budget"
                    break
                self._phase_by_steps()
                t0 = time.perf_counter()
                rec = self.train_step()
                dt = time.perf_counter() - t0
                # wall time of the run, evaluations and checkpoints included (a budget is wall-clock)
                wall = prior_elapsed + time.perf_counter() - session_t0
                if d.world > 1 and (cfg.budget_s is not None or cfg.save_every_minutes):
                    wall = d.broadcast_object(wall)  # one clock for every rank's decisions
                step_wall, self.elapsed = wall - self.elapsed, wall
                if cfg.budget_s is not None:
                    self._update_budget(step_wall)
                finite = rec.pop("finite")
                losses.append(rec["loss"])
                if not finite and len(self.bad_run) >= cfg.max_bad_steps:
                    raise TrainingDiverged(
                        f"loss or gradient norm was NaN/inf at {len(self.bad_run)} consecutive steps "
                        f"({self.bad_run[0]}..{self.bad_run[-1]}); stopped. Weights are from before step "
                        f"{self.bad_run[0]}; last good checkpoint: {self.last_ckpt or 'none'}. "
                        f"Try a lower lr, more warmup, or fp32.")
                window_tokens += rec["tokens"]
                window_time += dt
                rec.update(step=self.step, split="train", tokens_per_s=rec["tokens"] / max(dt, 1e-9),
                           elapsed_s=round(self.elapsed, 3), skipped=self.skipped)
                self._add_flops(rec, dt)
                history.append(rec)
                if d.main:
                    if self.step % cfg.log_every_steps == 0 or self.step == self.total:
                        mfile.write(json.dumps(_jsonable(rec)) + "\n")
                        mfile.flush()
                        if tb is not None:
                            for k, v in rec.items():
                                if isinstance(v, (int, float)) and k != "step":
                                    tb.add_scalar(f"train/{k}", v, self.step)
                    if bar is not None:
                        bar.total = self.total
                        bar.update(1)
                        bar.set_postfix(self._postfix(rec, window_tokens / max(window_time, 1e-9)), refresh=False)
                        if window_time > 5:
                            window_tokens, window_time = 0, 0.0
                done = self.step >= self.total or (cfg.budget_s is not None and self.elapsed >= cfg.budget_s)
                if cfg.eval_every_steps and self.step % cfg.eval_every_steps == 0 and not done:
                    evals.append(self._eval_and_log(mfile, tb))
                want_save = bool(cfg.save_every_steps and self.step % cfg.save_every_steps == 0)
                if cfg.save_every_minutes and self.elapsed - last_save_elapsed >= cfg.save_every_minutes * 60:
                    want_save = True
                if want_save and not done:
                    self.save()
                    last_save_elapsed = self.elapsed
            if self.eval_fn is not None:
                evals.append(self._eval_and_log(mfile, tb))
            if cfg.save_final and self.step > start_step:
                self.save()
        finally:
            if bar is not None:
                bar.close()
            if mfile is not None:
                mfile.close()
            if tb is not None:
                tb.close()
            if d.main and cfg.plot:
                self._plot()
        return TrainResult(steps=self.step, total_steps=self.total, tokens=self.tokens, elapsed_s=self.elapsed,
                           losses=losses, start_step=start_step, history=history, eval_history=evals,
                           skipped_steps=self.skipped, stop_reason=stop_reason, checkpoint=self.last_ckpt)

    def _eval_and_log(self, mfile, tb) -> dict:
        res = self.evaluate()
        rec = {"split": "eval", "step": self.step, **res}
        if self.d.main and res:
            mfile.write(json.dumps(_jsonable(rec)) + "\n")
            mfile.flush()
            if tb is not None:
                for k, v in res.items():
                    tb.add_scalar(f"eval/{k}", v, self.step)
            log.info("eval at step %d: %s", self.step, " ".join(f"{k}={v:.4g}" for k, v in res.items()))
            if self.cfg.plot:
                self._plot()
        return rec

    def _add_flops(self, rec: dict, dt: float) -> None:
        if self.flops_per_token is None:
            self.flops_per_token = estimate_flops_per_token(self.raw, self._seq_len or 128) or 0.0
        if not self.flops_per_token:
            return
        fps = self.flops_per_token * rec["tokens"] / max(dt, 1e-9)
        rec["flops_per_s"] = fps
        if self.peak is None:
            self.peak = self.cfg.peak_flops or peak_flops(self.d.device, self.autocast_dtype or torch.float32)
        rec["mfu"] = fps / (self.peak * self.d.world)

    @property
    def _seq_len(self) -> int | None:
        src = self.stream.source
        return getattr(src, "seq_len", None)

    @staticmethod
    def _postfix(rec: dict, tok_s: float) -> dict:
        out = {"loss": f"{rec['loss']:.3f}"}
        for k in ("mlm_acc", "nsp_acc", "rtd_acc"):
            if k in rec:
                out[k] = f"{rec[k]:.3f}"
        out["lr"] = f"{rec['lr']:.2e}"
        out["tok/s"] = f"{tok_s:,.0f}"
        if "mfu" in rec:
            out["mfu"] = f"{100 * rec['mfu']:.1f}%"
        return out

    def _tensorboard(self):
        if not self.cfg.tensorboard:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception:  # tensorboard not installed
            return None
        return SummaryWriter(str(self.out / "tb"))

    def _plot(self) -> None:
        try:
            from bertkit.plots import plot_run
            plot_run(self.out, self.out / "curves.png")
        except Exception as e:  # matplotlib missing or no records yet: the run itself is fine
            log.info("no curves.png: %s", e)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def train(model: nn.Module, batches: Iterable[dict] | list[Phase], cfg: TrainConfig, out_dir: str | os.PathLike,
          eval_fn: Callable[[nn.Module], dict] | None = None,
          step_fn: Callable[[nn.Module, dict], StepOutput] | None = None) -> TrainResult:
    """Train `model` on `batches` as `cfg` says, writing metrics and checkpoints under `out_dir`. See the module
    docstring for the contract; raises ConfigError / CheckpointError before the first step for bad settings."""
    return _Trainer(model, batches, cfg, out_dir, eval_fn, step_fn).run()
