"""General (task-agnostic) distillation: a pre-trained student from a pre-trained MLM teacher on raw text.

    distill_mlm(MlmDistillConfig(teacher="models/minilm", text="corpus.txt", out="models/minilm-l3", student_layers=3))

Documents (a line each, cut to `max_length`) masked afresh every epoch with bertkit.pretraining.masking; the loss is
alpha * KL(teacher / T || student / T) * T^2 at the masked positions + (1 - alpha) * MLM + hidden_weight * hidden
(DistilBERT's general distillation with TinyBERT's hidden-state transfer). The output is an ordinary pre-trained
model directory that `bertkit finetune --model` and `bertkit distill --student` take.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bertkit.atomic import write_json
from bertkit.config import BertConfig
from bertkit.distill import (INPUTS, hidden_loss, select_layers, soft_loss, teacher_outputs, transfer_pairs,
                             truncated_student)
from bertkit.errors import ConfigError
from bertkit.heads import IGNORE_INDEX, BertForMaskedLM
from bertkit.pretraining.masking import MaskingConfig, VocabTables, example_keys, mask_batch
from bertkit.tasks.batching import BucketBatchSampler
from bertkit.textfiles import read_text
from bertkit.tokenizer import Tokenizer
from bertkit.tokenizer.inputs import pad_batch
from bertkit.train.loop import TrainConfig, train
from bertkit.train.steps import StepOutput

__all__ = ["MlmDistillConfig", "distill_mlm"]

@dataclass
class MlmDistillConfig:
    teacher: str                           # a pre-trained model directory with its MLM head (cls.predictions.*)
    text: str                              # raw text, one document per line
    out: str
    student_layers: int | None = None
    student_preset: str | None = None
    temperature: float = 2.0
    alpha: float = 0.5
    hidden_weight: float = 0.0
    max_length: int = 128
    batch_size: int = 32
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    training: TrainConfig = field(default_factory=lambda: TrainConfig(lr=1e-4, epochs=1.0, warmup=0.05,
                                                                        progress=False, tensorboard=False,
                                                                        plot=False, save_final=False))

    def __post_init__(self):
        if (self.student_layers is None) == (self.student_preset is None):
            raise ConfigError("choose the student with exactly one of --student-layers, --student-preset")
        if self.temperature <= 0 or not 0 <= self.alpha <= 1 or self.hidden_weight < 0:
            raise ConfigError(f"need --temperature > 0, --alpha in [0, 1], --hidden-weight >= 0; got "
                              f"{self.temperature}, {self.alpha}, {self.hidden_weight}")


class _MaskedBatches:
    """Length-bucketed batches of the documents, masked per (seed, epoch, document): fresh masks every epoch."""

    def __init__(self, docs: list[list[int]], cfg: MlmDistillConfig, tables: VocabTables, seed: int):
        self.docs, self.cfg, self.tables, self.seed = docs, cfg, tables, seed
        self.sampler = BucketBatchSampler([len(d) for d in docs], cfg.batch_size, seed)
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        for idx in self.sampler:
            # rounded to 8 for the GEMMs, never past max_length (RoBERTa-style tables leave it off a multiple of 8)
            batch = pad_batch([self.docs[i] for i in idx], None, self.tables.pad_id, 8, cap=self.cfg.max_length)
            lengths = batch["attention_mask"].sum(1).numpy()
            keys = example_keys(self.seed, self.epoch, np.asarray(idx))
            ids, chosen = mask_batch(batch["input_ids"].numpy(), lengths, keys, self.cfg.masking, self.tables)
            labels = np.where(chosen, batch["input_ids"].numpy(), IGNORE_INDEX)
            yield {**batch, "input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}


def _teacher(path: str) -> BertForMaskedLM:
    teacher = BertForMaskedLM.from_pretrained(path)
    missing = [k for k in teacher.loading_info.get("missing_keys", []) if k.startswith("cls.")]
    if missing:
        raise ConfigError(f"--teacher {path}: has no MLM head ({missing[0]} missing): general distillation needs a "
                          f"pre-trained masked-LM teacher")
    return teacher.eval().requires_grad_(False)


def _documents(cfg: MlmDistillConfig, tok) -> list[list[int]]:
    lines = [line.strip() for line in read_text(cfg.text).splitlines() if line.strip()]
    if not lines:
        raise ConfigError(f"--text {cfg.text}: no text (one document per line)")
    enc = tok(lines, max_length=cfg.max_length, truncation=True)
    return [list(ids) for ids in enc["input_ids"]]


def _student(cfg: MlmDistillConfig, teacher: BertForMaskedLM) -> nn.Module:
    if cfg.student_layers is not None:
        return truncated_student(teacher, cfg.student_layers).requires_grad_(True)
    return BertForMaskedLM(BertConfig.preset(cfg.student_preset, vocab_size=teacher.config.vocab_size))


def _step_fn(cfg: MlmDistillConfig, teacher: BertForMaskedLM, pairs):
    def step(model, batch: dict) -> StepOutput:
        flags = {"labels": batch["labels"], "masked_logits_only": True, "output_hidden_states": cfg.hidden_weight > 0}
        t_out = teacher_outputs(teacher, batch, **flags)
        s_out = model(**{k: batch[k] for k in INPUTS if k in batch}, **flags)
        soft = soft_loss(s_out.logits, t_out.logits, cfg.temperature)   # (n_masked, vocab), the same rows
        loss = cfg.alpha * soft + (1 - cfg.alpha) * s_out.loss
        metrics = {"soft_loss": soft.detach(), "mlm_loss": s_out.loss.detach()}
        if cfg.hidden_weight > 0:
            h = hidden_loss(s_out.hidden_states, t_out.hidden_states, pairs, batch["attention_mask"],
                            getattr(model, "distill_projection", None))
            loss, metrics["hidden_loss"] = loss + cfg.hidden_weight * h, h.detach()
        return StepOutput(loss=loss, metrics=metrics)
    return step


def distill_mlm(cfg: MlmDistillConfig) -> dict:
    """Train the student on the teacher's masked-LM outputs; write it to cfg.out with the teacher's tokenizer and a
    summary.json; returns the summary."""
    teacher = _teacher(cfg.teacher)
    tok = Tokenizer.from_pretrained(cfg.teacher)
    tables = VocabTables.from_tokenizer(tok)        # whichever file holds the vocabulary
    docs = _documents(cfg, tok)
    torch.manual_seed(cfg.training.seed)
    student = _student(cfg, teacher)
    pairs = transfer_pairs(student, teacher, cfg.hidden_weight)
    batches = _MaskedBatches(docs, cfg, tables, cfg.training.seed)
    out = Path(cfg.out)
    t0 = time.perf_counter()
    result = train(student, batches, cfg.training, out / "train", step_fn=_step_fn(cfg, teacher, pairs))
    if hasattr(student, "distill_projection"):
        del student.distill_projection
    student.cpu().save_pretrained(out, tokenizer=tok)
    last = [x for x in result.losses[-20:] if math.isfinite(x)]
    summary = {"teacher": cfg.teacher, "text": cfg.text, "documents": len(docs), "steps": result.steps,
               "train_s": round(time.perf_counter() - t0, 2), "final_loss": sum(last) / max(len(last), 1),
               "layer_map": pairs, "student_init_layers": (select_layers(teacher.config.num_hidden_layers,
                                                                          cfg.student_layers)
                                                           if cfg.student_layers else None),
               "config": json.loads(json.dumps(asdict(cfg), default=str))}
    write_json(out / "summary.json", summary, indent=1)
    return summary
