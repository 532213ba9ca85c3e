"""One process or many: joining the process group, wrapping the model in DDP / FSDP, and the full (unsharded)
state a checkpoint stores. With one process every function here is a no-op or the identity."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from bertkit.errors import CheckpointError

__all__ = ["Dist", "distributed_context", "wrap", "unwrap", "grad_sync", "full_state", "load_full_state",
           "encode_shared"]


@dataclass
class Dist:
    """This process's place in the run: rank, world size, device, and the few collectives the loop needs."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def setup(cls, device_name: str | None = None) -> "Dist":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device(device_name if device_name is not None
                              else f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
        if device.type == "cuda" and device.index is None:     # "cuda": this process's GPU (set_device needs one)
            device = torch.device("cuda", local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        ours = world > 1 and not dist.is_initialized()
        if ours:
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
            # a group still open when the interpreter exits is torn down with its threads running: SIGABRT
            # ("terminate called without an active exception") after the run's work is done
            atexit.register(_close_group)
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), local_rank, device)
        return cls(0, 1, 0, device)

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        if self.world > 1:
            # gloo reduces CPU tensors; nccl needs them on the GPU
            if self.device.type == "cuda":
                t = t.to(self.device)
            dist.all_reduce(t)
            t = t.cpu()
        return t

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def broadcast_object(self, obj):
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def _close_group() -> None:
    """At exit, the process group this process opened, unless the caller closed it or an uncaught exception ends
    the process: with collectives of a crashed step still in flight, closing can block on peers that will not come."""
    crashed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if dist.is_initialized() and not crashed:
        dist.destroy_process_group()


def distributed_context(device: str | None = None) -> tuple[int, int]:
    """(rank, world_size); under torchrun this joins the process group (what train() would do), so data readers
    can be built for this rank before training starts."""
    d = Dist.setup(device)
    return d.rank, d.world


def encode_shared(encode, texts: list, d: Dist):
    """`encode(texts)` ((n, dim) array) split across the ranks: each encodes a contiguous share, rank 0 gets every
    vector in the order of `texts`, the other ranks None."""
    if d.world == 1:
        return encode(texts)
    bounds = [len(texts) * r // d.world for r in range(d.world + 1)]
    share = texts[bounds[d.rank]:bounds[d.rank + 1]]
    parts = [None] * d.world if d.main else None
    dist.gather_object(encode(share) if share else None, parts, dst=0)
    return np.concatenate([p for p in parts if p is not None]) if d.main else None


def wrap(model: nn.Module, fsdp: bool, d: Dist) -> nn.Module:
    """The model as the ranks train it: itself (one process), DDP, or FSDP2 (sharded in place)."""
    if d.world == 1:
        return model
    if fsdp:
        # FSDP2 runs on gloo and nccl; one unit per encoder layer, so only one layer is gathered at a time
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(d.device.type, (d.world,))
        for unit in _shard_units(model):
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def _shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules the model (and any model inside it) declares for one-by-one sharding: `shard_units()`."""
    units: dict[int, nn.Module] = {}
    for m in model.modules():
        for unit in (m.shard_units() if hasattr(m, "shard_units") else ()):
            units.setdefault(id(unit), unit)
    return list(units.values())


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside a DDP wrapper (FSDP2 shards the model itself, so it is its own)."""
    return getattr(model, "module", model)


def grad_sync(model: nn.Module, d: Dist, last: bool):
    """A context for one micro-batch's backward: gradients are all-reduced on the last micro-batch of a step only."""
    if d.world > 1 and hasattr(model, "set_requires_gradient_sync"):    # FSDP2
        model.set_requires_gradient_sync(last)
    elif d.world > 1 and not last and hasattr(model, "no_sync"):        # DDP
        return model.no_sync()
    return contextlib.nullcontext()


def _sharded(fsdp: bool) -> bool:
    return fsdp and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def full_state(model: nn.Module, optimizer, fsdp: bool) -> tuple[dict, dict]:
    """(model state, optimizer state) gathered in full (FSDP) and keyed like the unwrapped model."""
    if _sharded(fsdp):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return unwrap(model).state_dict(keep_vars=False), optimizer.state_dict()


def load_full_state(model: nn.Module, optimizer, fsdp: bool, model_state: dict, optim_state: dict,
                    source: str) -> None:
    """Full states into the (possibly sharded) model and optimizer; CheckpointError naming `source` on a misfit."""
    if _sharded(fsdp):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state,
                       options=StateDictOptions(full_state_dict=True))
        return
    try:
        unwrap(model).load_state_dict(model_state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{source}: the weights do not fit the model: "
                              f"{_mismatch(unwrap(model), model_state, e)}") from None
    optimizer.load_state_dict(optim_state)


def _mismatch(model: nn.Module, state: dict, error: Exception) -> str:
    """What differs between `state` and the model's own state dict, in one line (torch's lists every key)."""
    own = model.state_dict()
    shapes = [(k, tuple(state[k].shape), tuple(v.shape)) for k, v in own.items()
              if k in state and hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(v.shape)]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    parts = []
    if shapes:
        k, theirs, ours = shapes[0]
        parts.append(f"{len(shapes)} tensors of another shape (first {k}: {list(theirs)} in the checkpoint, "
                     f"{list(ours)} in the model)")
    if missing:
        parts.append(f"{len(missing)} tensors missing from the checkpoint (first {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} tensors the model does not have (first {unexpected[0]})")
    if not parts:
        text = str(error).strip()
        parts.append(text.splitlines()[0] if text else type(error).__name__)
    return "; ".join(parts)
