"""Batching for fine-tuning: length-bucketed batches, dynamic padding, and a sorted inference pass.

Padding every batch to `max_seq_length` would spend most of the compute on pad tokens, so `BucketBatchSampler`
sorts random windows of `batch_size * bucket_batches` examples by length (batches of similar lengths, still random
from epoch to epoch), and `collate` pads a batch only to its own longest sequence.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from bertkit.heads import IGNORE_INDEX
from bertkit.predict.engine import MODEL_KEYS, forward_batches
from bertkit.tasks.task import Feature
from bertkit.tokenizer.inputs import pad_batch

__all__ = ["BucketBatchSampler", "collate", "predict_batches"]


@dataclass(eq=False)                    # a sampler is one object, compared and hashed by identity
class BucketBatchSampler:
    """Yields lists of indices; similar lengths share a batch. Deterministic given (seed, epoch)."""
    lengths: list[int]
    batch_size: int
    seed: int = 0
    bucket_batches: int = 50
    epoch: int = field(default=0, init=False)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)

    def batches(self) -> list[list[int]]:
        idx = list(range(len(self.lengths)))
        rng = random.Random(self.seed * 100_003 + self.epoch)
        rng.shuffle(idx)
        window = self.batch_size * self.bucket_batches
        out: list[list[int]] = []
        for w in range(0, len(idx), window):
            chunk = sorted(idx[w:w + window], key=lambda i: self.lengths[i])
            out.extend(chunk[b:b + self.batch_size] for b in range(0, len(chunk), self.batch_size))
        rng.shuffle(out)
        return out

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches()


def collate(features: list[Feature], pad_token_id: int = 0, multiple_of: int = 8,
            cap: int | None = None) -> dict[str, torch.Tensor]:
    """Pad a list of features to the batch's longest sequence (rounded up to `multiple_of`, never past `cap`: the
    longest input the model takes)."""
    out = pad_batch([f.input_ids for f in features], [f.token_type_ids for f in features], pad_token_id,
                    multiple_of, cap=cap)
    b, seq = out["input_ids"].shape
    first = features[0]
    lab = first.labels
    if first.token_labels:                                                   # per-token: pad with -100
        t = torch.full((b, seq), IGNORE_INDEX, dtype=torch.long)
        for i, f in enumerate(features):
            t[i, :len(f.labels)] = torch.as_tensor(f.labels)
        out["labels"] = t
    elif lab is not None:                      # a multi-hot row or a number: float; a class id: long
        dtype = torch.float if isinstance(lab, (list, float)) else torch.long
        out["labels"] = torch.tensor([f.labels for f in features], dtype=dtype)
    if first.start_positions is not None:
        out["start_positions"] = torch.tensor([f.start_positions for f in features], dtype=torch.long)
        out["end_positions"] = torch.tensor([f.end_positions for f in features], dtype=torch.long)
    return out


def predict_batches(model, features: list[Feature], batch_size: int = 64, precision: str | bool | None = "auto",
                    pad_token_id: int = 0, model_kwargs: dict | None = None) -> Iterator[tuple[list[int], object]]:
    """`engine.forward_batches` over task features under `precision` (or a bf16 flag: evaluation inside training
    follows the training's); yields (original indices, model output)."""
    device = next(model.parameters()).device

    cap = getattr(getattr(model, "config", None), "max_input_length", None)

    def batch(idx: list[int]) -> dict:
        b = collate([features[i] for i in idx], pad_token_id, cap=cap)
        return {k: b[k].to(device) for k in MODEL_KEYS}
    lengths = [len(f.input_ids) for f in features]
    for idx, _, out in forward_batches(model, lengths, batch, batch_size, precision, **(model_kwargs or {})):
        yield idx, out
