"""Model inputs from text, and the one batched forward loop of inference.

    batch = encode(tok, texts, pairs=None, max_length=256, device="cpu")     # (batch, seq) tensors
    out = forward(model, batch, precision="fp32")                             # one batch, eval, no gradients
    for idx, batch, out in forward_batches(model, lengths, make_batch, batch_size=32, precision="fp32"):
        ...                                     # idx: the original positions of this batch's rows

Inference defaults to fp32 at every front door (`PRECISION`), so each gives the same numbers for the same model and
input, equal to transformers'; bf16 ("auto", "bf16") is the user's choice, said where it is made.
"""

from __future__ import annotations

import contextlib
import numbers
from typing import Callable, Iterator, Sequence

import torch

from bertkit.errors import ConfigError
from bertkit.precision import autocast, for_model

__all__ = ["PRECISION", "MODEL_KEYS", "encode", "eval_mode", "forward", "forward_batches", "id_batch"]

PRECISION = "fp32"          # inference's default precision, the same at every front door

MODEL_KEYS = ("input_ids", "token_type_ids", "attention_mask")


def encode(tok, texts: Sequence[str], pairs: Sequence[str] | None = None, max_length: int | None = 256,
           device="cpu", offsets: bool = False) -> dict:
    """[CLS] a [SEP] (b [SEP]) per text, cut longest-first to max_length (None: not cut), padded on the right to the
    longest row: (batch, seq) input_ids / token_type_ids / attention_mask on `device`, and with `offsets` each token's
    (start, end) in its text ("offsets": nested lists)."""
    # padded on the right whatever the tokenizer's side: the heads read [CLS] at position 0
    enc = tok(list(texts), list(pairs) if pairs is not None else None, max_length=max_length,
              truncation="longest_first" if max_length else None, padding=True, return_offsets=offsets,
              padding_side="right")
    batch = {k: torch.tensor(enc[k], dtype=torch.long, device=device) for k in MODEL_KEYS}
    if offsets:
        batch["offsets"] = enc["offsets"]
    return batch


def id_batch(tok, rows: Sequence[list[int]], device="cpu") -> dict:
    """Model inputs of whole id rows (special tokens as the rows hold them), padded on the right to the longest."""
    return tok.build_inputs(rows, add_special_tokens=False, padding=True, padding_side="right",
                            return_tensors="pt").to(device)


@contextlib.contextmanager
def eval_mode(model):
    """`model` in eval mode inside, as it was after; one already in eval mode is not walked (eval() visits every
    module, a cost per forward: docs/performance.md)."""
    was_training = model.training
    if was_training:
        model.eval()
    try:
        yield model
    finally:
        if was_training:
            model.train()


@torch.no_grad()
def _run(model, batch: dict, precision: str, device, model_kwargs: dict):
    with autocast(precision, device):
        return model(**{k: v for k, v in batch.items() if k != "offsets"}, **model_kwargs)


def forward(model, batch: dict, precision: str | bool | None = PRECISION, **model_kwargs):
    """One batch of model inputs through `model` in eval mode, without gradients, under `precision` (an int8 model
    under "auto" keeps fp32 activations: precision.for_model). Keys the model does not take ("offsets") stay out."""
    with eval_mode(model):
        return _run(model, batch, for_model(precision, model), next(model.parameters()).device, model_kwargs)


def forward_batches(model, lengths: Sequence[int], make_batch: Callable[[list[int]], dict], batch_size: int = 32,
                    precision: str | bool | None = PRECISION,
                    **model_kwargs) -> Iterator[tuple[list[int], dict, object]]:
    """Run `model` over len(lengths) inputs, shortest first, `batch_size` at a time: make_batch(indices) gives a
    batch's model inputs; yields (indices, inputs, model output) of each batch, run as `forward` runs one."""
    if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r:.40}")
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    with eval_mode(model):
        precision, device = for_model(precision, model), next(model.parameters()).device
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            batch = make_batch(idx)
            yield idx, batch, _run(model, batch, precision, device, model_kwargs)
