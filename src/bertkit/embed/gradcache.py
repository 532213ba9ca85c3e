"""GradCache (Gao et al. 2021): a contrastive loss over a large batch in the activation memory of one mini-batch.

    1. embed every column in mini-batches without a graph, remembering each mini-batch's RNG state;
    2. the loss on the detached full-batch embeddings, and its gradient w.r.t. them: the cache;
    3. on backward, re-run each mini-batch with autograd under its RNG state (the same dropout masks) and
       backpropagate its slice of the cache, scaled by the outer gradient (so `loss / grad_accum` reaches it).

    loss = cached_loss(model, columns, loss_fn, mini_batch_size=32, keys=...)   # a tensor, as loss_fn's
    loss.backward()                                                               # runs step 3

The encoder runs forward twice; the loss and gradients (a learnable scale's too) equal the uncached ones. Under
DistributedDataParallel it refuses to run (each replayed mini-batch would all-reduce on its own).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from bertkit.errors import ConfigError

__all__ = ["cached_loss", "RngState", "split_columns"]


@dataclass
class RngState:
    """The CPU generator and (when the inputs live there) one CUDA device's generator, to replay dropout."""
    cpu: Tensor
    device: torch.device
    cuda: Tensor | None

    @classmethod
    def capture(cls, device: torch.device) -> "RngState":
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        return cls(torch.get_rng_state(), device, cuda)

    @contextlib.contextmanager
    def restored(self):
        """Run the block from this state; the generators continue afterwards as if it had not run."""
        devices = [self.device] if self.cuda is not None else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state(self.cuda, self.device)
            yield


def _slice_rows(features: dict[str, Tensor], start: int, end: int) -> dict[str, Tensor]:
    """Rows start:end of (batch, seq) inputs, with the padding columns no row of the slice needs cut off."""
    out = {k: v[start:end] for k, v in features.items()}
    mask = out.get("attention_mask")
    if mask is not None and mask.dim() == 2 and mask.shape[1] > 0:
        used = mask.any(dim=0).nonzero()
        width = int(used.max()) + 1 if used.numel() else mask.shape[1]
        out = {k: v[:, :width] if v.dim() == 2 else v for k, v in out.items()}
    return out


def split_columns(columns: Sequence[dict[str, Tensor]], mini_batch_size: int) -> list[list[dict[str, Tensor]]]:
    """Per column, its mini-batches (each trimmed of unneeded padding)."""
    if mini_batch_size <= 0:
        raise ConfigError(f"mini_batch_size must be a positive int, got {mini_batch_size!r}")
    out = []
    for col in columns:
        n = next(iter(col.values())).shape[0]
        out.append([_slice_rows(col, s, min(s + mini_batch_size, n)) for s in range(0, n, mini_batch_size)])
    return out


class _Replay(torch.autograd.Function):
    """Carries the loss value; its backward runs step 3 and returns the loss parameters' cached gradients. Inputs:
    the detached embeddings (so the output needs a gradient even for a loss without parameters), the parameters."""

    @staticmethod
    def forward(ctx, replay, param_grads, n_embeddings, loss_value, *tensors):
        ctx.replay, ctx.param_grads, ctx.n_embeddings = replay, param_grads, n_embeddings
        return loss_value.detach().clone()

    @staticmethod
    def backward(ctx, grad_output):
        ctx.replay(grad_output)
        scaled = [None if g is None else g * grad_output for g in ctx.param_grads]
        return (None, None, None, None, *([None] * ctx.n_embeddings), *scaled)


def cached_loss(model: Callable[..., Tensor], columns: Sequence[dict[str, Tensor]], loss_fn: Callable,
                mini_batch_size: int, **loss_kwargs) -> Tensor:
    """`loss_fn([model(**column) for column in columns], **loss_kwargs)`, computed with GradCache (see the module
    docstring). Each column is a dict of (batch, seq) model inputs; returns the scalar loss, ready for backward."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise ConfigError("GradCache (mini_batch_size) does not run under DistributedDataParallel yet: train on "
                          "one process or without a mini-batch size")
    chunks = split_columns(columns, mini_batch_size)
    device = next(iter(columns[0].values())).device
    states: list[list[RngState]] = []
    embeddings: list[Tensor] = []
    # bertkit's encoder runs a no-grad forward as inference (no attention dropout), so in training step 1 keeps
    # autograd on to draw the replay's masks, and drops each mini-batch's graph at once
    with torch.enable_grad() if isinstance(model, nn.Module) and model.training else torch.no_grad():     # step 1
        for col in chunks:
            states.append([])
            parts = []
            for mb in col:
                states[-1].append(RngState.capture(device))
                parts.append(model(**mb).detach())                             # (mini, dim)
            embeddings.append(torch.cat(parts))                                # (batch, dim)
    leaves = [e.detach().requires_grad_() for e in embeddings]
    params = [p for p in loss_fn.parameters() if p.requires_grad] if isinstance(loss_fn, nn.Module) else []
    with torch.enable_grad():                                                 # step 2
        loss = loss_fn(leaves, **loss_kwargs)
        grads = torch.autograd.grad(loss, leaves + params, allow_unused=True)
    emb_grads, param_grads = grads[:len(leaves)], list(grads[len(leaves):])
    if any(g is None for g in emb_grads):
        unused = [i for i, g in enumerate(emb_grads) if g is None]
        raise ConfigError(f"the loss does not use column(s) {unused}: drop them from the batch")
    # the replay runs in the outer backward, outside the step's autocast: it takes the forward's
    enabled, dtype = torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type)

    def replay(grad_output: Tensor) -> None:                                  # step 3
        with torch.enable_grad(), torch.autocast(device.type, dtype=dtype, enabled=enabled):
            for col, col_states, g in zip(chunks, states, emb_grads):
                start = 0
                for mb, state in zip(col, col_states):
                    with state.restored():
                        out = model(**mb)                                      # (mini, dim)
                    n = out.shape[0]
                    torch.autograd.backward(out, g[start:start + n].to(out.dtype) * grad_output.to(out.dtype))
                    start += n

    return _Replay.apply(replay, param_grads, len(leaves), loss.detach(), *leaves, *params)
