"""Crash-safe checkpoints and exact resume (docs/training.md).

    out/checkpoints/step-00001000/   model.safetensors (+ config.json when the model has a BertConfig),
                                     optimizer.pt, state.json, rank-00000.pt (RNG + data position per rank)

Written under `.tmp-step-...`, every file fsynced, then renamed: a `step-*` directory with a state.json is complete,
whatever killed the process. state.json, written last, holds the sha256 of every other file, so resume can skip a
spoiled newest checkpoint for the previous good one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from bertkit.atomic import write_failure, write_text
from bertkit.errors import CheckpointError, ConfigError
from bertkit.pretraining.shards import file_sha256
from bertkit.textfiles import check_fields
from bertkit.train.distributed import Dist, full_state, load_full_state, unwrap
from bertkit.train.monitor import jsonable

__all__ = ["CHECKPOINT_DIR", "RunState", "Checkpoints", "latest_checkpoint", "complete_checkpoints",
           "save_model_weights", "load_model_weights", "to_plain", "from_plain", "check_writable"]

log = logging.getLogger("bertkit.train")

CHECKPOINT_DIR = "checkpoints"


@dataclass
class RunState:
    """Where a run stands; the counters are saved in state.json and restored by resume."""
    step: int = 0                         # optimizer steps done
    total: int = 0                        # the schedule's total (re-estimated in budget mode)
    tokens: int = 0                       # non-padding tokens trained on, all ranks
    elapsed: float = 0.0                  # wall time of the run, all sessions
    skipped: int = 0                      # NaN/inf steps skipped
    phase_time: float = 0.0               # budget mode: time and steps spent in the current phase
    phase_steps: int = 0
    last_checkpoint: Path | None = None   # not saved: where this state was last written or read
    bad_run: list[int] = field(default_factory=list)  # not saved: the current run of non-finite steps
    execution: dict | None = None         # the execution options the run trains with (a resume keeps them)
    callbacks: dict | None = None         # the stateful callbacks' state_dict()s, by key (a resume hands them back)
    scaler: dict | None = None            # fp16: the GradScaler's state_dict() (the loss scale reached)


# ---------------------------------------------------------------------------------------------- weights
def save_model_weights(state: dict[str, Tensor], path: Path) -> None:
    """A state dict to safetensors; tensors that share storage (tied embeddings) are stored once, aliased."""
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


# ---------------------------------------------------------------------------------------------- RNG and data state
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


def to_plain(obj):
    """numpy scalars/arrays -> python numbers / tensors, so torch.load(weights_only=True) reads the state back."""
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj)), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def from_plain(obj):
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return obj["__ndarray__"].numpy().astype(obj["dtype"])
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(from_plain(v) for v in obj)
    return obj


# ---------------------------------------------------------------------------------------------- files
def complete_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoint directories under `root`, oldest first (temp directories are ignored)."""
    return sorted(p for p in root.glob("step-*") if p.is_dir() and (p / "state.json").is_file())


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directory under out_dir/checkpoints."""
    done = complete_checkpoints(Path(out_dir) / CHECKPOINT_DIR)
    return done[-1] if done else None


def check_writable(out: Path, tag: str = "", sub: str | None = None) -> None:
    """ConfigError unless the directory `out` (and `out/sub`) can be created and written (a probe named by `tag`)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}{tag}"
        probe.write_text("ok")
        probe.unlink()
        if sub:
            (out / sub).mkdir(exist_ok=True)
    except OSError as e:
        raise ConfigError(f"output directory {out} is not writable: {e.strerror or e}") from None


def _fsync(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_STATE_KEYS = {"step", "total", "tokens", "elapsed", "skipped", "world_size"}
# RunState's, in state.json
_SAVED = ("step", "total", "tokens", "elapsed", "skipped", "phase_time", "phase_steps", "scaler")
_COUNTERS = {**dict.fromkeys(("step", "total", "tokens", "skipped", "phase_steps", "world_size"), "count"),
             "elapsed": "number", "phase_time": "number", "execution": "object?"}     # state.json's, checked


def _verify(path: Path) -> dict:
    """state.json of checkpoint `path`, after checking every file against the sha256 it records."""
    try:
        saved = json.loads((path / "state.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        saved = None
    files = saved.get("files", {}) if isinstance(saved, dict) else None
    if not isinstance(files, dict) or not _STATE_KEYS <= set(saved):
        raise CheckpointError(f"{path / 'state.json'} is unreadable or not a bertkit checkpoint state")
    check_fields(saved, _COUNTERS, str(path / "state.json"), CheckpointError, required=False)
    for name, digest in files.items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise CheckpointError(f"{path / 'state.json'}: {name!r} is not a file name of the checkpoint")
        try:
            ok = file_sha256(path / name) == digest
        except OSError as e:
            raise CheckpointError(f"{path / name}: cannot read ({e.strerror or e})") from None
        if not ok:
            raise CheckpointError(f"{path / name} does not match the sha256 in state.json (corrupt)")
    return saved


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines after `step` (written after the checkpoint by the interrupted session), atomically."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the crash
        if isinstance(rec, dict) and isinstance(rec.get("step", 0), int) and rec.get("step", 0) <= step:
            keep.append(line)
    write_text(path, "".join(l + "\n" for l in keep))


# ---------------------------------------------------------------------------------------------- checkpoints
class Checkpoints:
    """The checkpoints of one run directory, as every rank sees them (the ranks meet at barriers)."""

    def __init__(self, out: Path, cfg, d: Dist):
        self.out, self.cfg, self.d = out, cfg, d
        self.root = out / CHECKPOINT_DIR

    def check_writable(self) -> None:
        """The run directory can be written; temp directories an interrupted checkpoint write left are removed."""
        check_writable(self.out, f"-{self.d.rank}", sub=CHECKPOINT_DIR)
        if self.d.main:
            for stale in self.root.glob(".tmp-*"):
                log.info("removing %s, left by an interrupted checkpoint write", stale)
                shutil.rmtree(stale, ignore_errors=True)

    def check_fresh(self) -> None:
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
            shutil.rmtree(self.root, ignore_errors=True)
            self.root.mkdir(parents=True, exist_ok=True)
            metrics.unlink(missing_ok=True)
        self.d.barrier()

    def save(self, state: RunState, model, optimizer, data_state: dict) -> Path:
        """Write step-<state.step> atomically (temp directory, fsync, rename) and keep the newest cfg.keep_last."""
        final = self.root / f"step-{state.step:08d}"
        if not final.exists():
            tmp = self.root / f".tmp-{final.name}"
            msd, osd = full_state(model, optimizer, self.cfg.fsdp)
            try:
                self._write_tmp(tmp, state, model, msd, osd, data_state)
            except BaseException as e:    # a full disk, a quota, Ctrl-C: nothing half-written stays
                shutil.rmtree(tmp, ignore_errors=True)
                reason = write_failure(e)
                if reason is None:
                    raise
                earlier = latest_checkpoint(self.out)
                raise CheckpointError(f"cannot write checkpoint {final}: {reason}; removed the partial "
                                      f"write, the newest intact checkpoint is {earlier or '(none)'}") from None
            if self.d.main:
                os.replace(tmp, final)
                with contextlib.suppress(OSError):   # best effort: not every filesystem can fsync a directory
                    _fsync(self.root)
                done = sorted(p for p in self.root.glob("step-*") if p.is_dir())
                for old in done[:-self.cfg.keep_last]:
                    shutil.rmtree(old, ignore_errors=True)
            self.d.barrier()
        state.last_checkpoint = final
        return final

    def _write_tmp(self, tmp: Path, state: RunState, model, msd: dict, osd: dict, data_state: dict) -> None:
        """Every rank's RNG + data file, then rank 0's files and, last, state.json with their sha256, all fsynced."""
        if self.d.main:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        self.d.barrier()
        rank_file = tmp / f"rank-{self.d.rank:05d}.pt"
        torch.save({"rng": _rng_state(), "data": data_state}, rank_file)
        _fsync(rank_file)
        self.d.barrier()    # every rank file is complete before rank 0 checksums them
        if self.d.main:
            save_model_weights(msd, tmp / "model.safetensors")
            torch.save(osd, tmp / "optimizer.pt")
            config = getattr(unwrap(model), "config", None)
            if config is not None and hasattr(config, "to_json"):
                config.to_json(tmp / "config.json")
            saved = {**{k: getattr(state, k) for k in _SAVED}, "world_size": self.d.world,
                     "execution": state.execution, "callbacks": state.callbacks,
                     "config": jsonable(dataclasses.asdict(self.cfg))}
            for f in tmp.iterdir():
                _fsync(f)
            saved["files"] = {f.name: file_sha256(f) for f in sorted(tmp.iterdir())}
            (tmp / "state.json").write_text(json.dumps(saved, indent=1))
            _fsync(tmp / "state.json")
        self.d.barrier()

    def resume(self, state: RunState, model, optimizer, stream) -> None:
        """Continue from cfg.resume (True: the newest checkpoint in out; a path: that one); nothing to resume
        from leaves everything as it is (train() called check_writable first: no stale temp directory is left)."""
        found = self._intact() if self.cfg.resume is True else self._named(Path(self.cfg.resume))
        if found is None:
            log.info("resume: no checkpoint in %s, starting from scratch", self.out)
            if self.d.main:      # killed before its first checkpoint: the steps it logged are redone
                truncate_metrics(self.out / "metrics.jsonl", 0)
            return
        path, saved, (weights, optim, rank_state) = found
        load_full_state(model, optimizer, self.cfg.fsdp, weights, optim, str(path))
        for k in _SAVED:            # checkpoints from before the phase counters: those get RunState's defaults
            setattr(state, k, saved.get(k, getattr(RunState, k)))
        state.execution = saved.get("execution") or state.execution
        state.callbacks = saved.get("callbacks")
        if self.cfg.max_steps is not None and self.cfg.budget_s is None:
            state.total = self.cfg.max_steps  # a resumed run may be asked to go further
        stream.load_state_dict(rank_state["data"])
        _set_rng_state(rank_state["rng"])
        state.last_checkpoint = path
        if self.d.main:
            truncate_metrics(self.out / "metrics.jsonl", state.step)
        log.info("resumed from %s at step %d", path, state.step)

    def _intact(self):
        """(path, state.json, files) of the newest checkpoint whose files are intact; each one skipped is logged."""
        done = complete_checkpoints(self.root)[::-1]
        for i, path in enumerate(done):
            try:
                return self._named(path)
            except CheckpointError as e:
                fallback = done[i + 1].name if i + 1 < len(done) else None
                if fallback is None:
                    raise CheckpointError(f"no intact checkpoint to resume from in {self.root}: {e}") from None
                log.warning("resume: skipping %s (%s); falling back to %s", path.name, e, fallback)
        return None

    def _named(self, path: Path):
        """(path, state.json, (weights, optimizer state, this rank's RNG + data state)) of checkpoint `path`."""
        if not (path / "state.json").is_file():
            raise CheckpointError(f"{path} is not a complete bertkit training checkpoint (no state.json)")
        saved = _verify(path)
        if saved["world_size"] != self.d.world:
            raise ConfigError(f"{path} was written by {saved['world_size']} processes, this run has "
                              f"{self.d.world}: resume with the same number of processes")
        sd = load_model_weights(path / "model.safetensors")
        try:
            osd = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
            rank_state = torch.load(path / f"rank-{self.d.rank:05d}.pt", map_location="cpu", weights_only=True)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {first}") from None
        return path, saved, (sd, osd, rank_state)
