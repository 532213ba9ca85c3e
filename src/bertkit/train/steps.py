"""What one step computes, apart from how the loop runs it: the StepOutput contract, the default step (the model's
own loss), the pre-training step with its accuracies, and the held-out evaluation built on it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import Tensor, nn

from bertkit.errors import ConfigError
from bertkit.heads import IGNORE_INDEX

__all__ = ["StepOutput", "default_step", "pretraining_step", "pretraining_eval", "add_metrics", "to_device"]


@dataclass
class StepOutput:
    """What a step function returns for one micro-batch: the loss to backpropagate and summable metrics, each a
    (sum, count) pair such as "mlm_acc": (correct predictions, masked tokens), reported as sum / count over the
    global batch; a plain value v means (v, 1), i.e. averaged over micro-batches."""
    loss: Tensor
    metrics: dict[str, Any] = field(default_factory=dict)  # name -> (sum, count), or a value meaning (value, 1)


def default_step(model: nn.Module, batch: dict) -> StepOutput:
    """`model(**batch).loss`."""
    out = model(**batch)
    loss = out["loss"] if isinstance(out, dict) else out.loss
    if loss is None:
        raise ConfigError("the model returned no loss: does the batch carry labels?")
    return StepOutput(loss=loss)


def pretraining_step(model: nn.Module, batch: dict, token_weight: float = 1.0) -> StepOutput:
    """BertForPreTraining / BertForMaskedLM / ELECTRA: loss plus MLM, NSP/SOP and replaced-token accuracies. The loss
    is `token_weight * token-level loss (MLM; ELECTRA's both) + sentence-level loss (NSP/SOP)`: the loop's weight
    makes this micro-batch's mean its share of the mean over the global batch's masked tokens."""
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
        pred = logits.max(-1).indices                              # argmax over a vocab is ~7x slower on CPU
        ids = getattr(out, "logit_ids", None)
        if ids is not None:                                        # columns of a vocabulary subset -> ids
            pred = ids[pred]
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


def pretraining_eval(batches: Iterable[dict], max_batches: int | None = None) -> Callable[[nn.Module], dict]:
    """An eval_fn over held-out pre-training batches: MLM loss (mean over every masked token) and accuracy, NSP/SOP
    loss and accuracy, ELECTRA's replaced-token accuracy, and `masked_tokens`, how many masked tokens were scored.
    The same batches each time (`set_epoch(0)` first when the source has it, so dynamic masks repeat too)."""
    def evaluate(model: nn.Module) -> dict:
        if hasattr(batches, "set_epoch"):
            batches.set_epoch(0)
        device = next(model.parameters()).device
        pairs: dict[str, list] = {}
        masked_tokens = 0
        for batch in itertools.islice(batches, max_batches):
            batch = to_device(batch, device)
            out = pretraining_step(model, batch)
            metrics = {**out.metrics, "loss": out.loss}
            if "labels" in batch:
                n_masked = float((batch["labels"] != IGNORE_INDEX).sum())
                masked_tokens += int(n_masked)
                if "mlm_loss" in metrics:   # a mean over this batch's masked tokens -> weight by their number
                    metrics["mlm_loss"] = (_pair(metrics["mlm_loss"])[0] * n_masked, n_masked)
            add_metrics(pairs, metrics)
        return {**{name: s / c for name, (s, c) in pairs.items() if c > 0}, "masked_tokens": masked_tokens}
    return evaluate


def _pair(value) -> tuple[float, float]:
    s, c = value if isinstance(value, tuple) else (value, 1)
    return float(s), float(c)


def add_metrics(sums: dict[str, list], metrics: dict) -> None:
    """Add a step's metrics to running [sum, count] pairs, by name (see StepOutput)."""
    for name, value in metrics.items():
        s, c = _pair(value)
        acc = sums.setdefault(name, [0.0, 0.0])
        acc[0] += s
        acc[1] += c


def to_device(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on `device` (the CPU's batches are already there)."""
    if device.type == "cpu":
        return batch
    return {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}
