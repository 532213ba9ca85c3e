"""Knowledge distillation: a smaller student trained on a teacher's outputs (the library behind `bertkit distill`).

    summary = distill_task(DistillConfig(teacher="runs/sst", student_layers=3, temperature=2.0, alpha=0.5),
                           FinetuneConfig(task="classify", model="runs/sst", train=..., dev=..., out="runs/sst-3"))

Task distillation (DistilBERT, TinyBERT, MiniLM) from a model directory written by `bertkit finetune`; per batch

    alpha * soft + (1 - alpha) * gold + hidden_weight * hidden + attention_weight * attention

  soft       KL(teacher / T || student / T) * T^2 (Hinton et al.: the T^2 keeps the gradient scale as T changes);
             classify / pair: per example; tag: per labelled token; qa: start and end distributions, averaged;
             regress: MSE to the teacher's output (no temperature); multilabel: BCE to sigmoid(teacher / T) * T^2
  gold       the task's own loss on the gold labels (rows from --unlabeled or --augment have none)
  hidden     MSE between mapped hidden states over real tokens, through a learned projection when widths differ
  attention  KL between the mapped layers' attention probabilities over real query rows

Student layer j (1..K) learns from teacher layer j * L / K (TinyBERT's uniform map). Training is `bertkit
finetune`'s (FinetuneHooks), so the student is an ordinary fine-tuned model directory; with alpha = 0 and no transfer
the teacher is not used: plain fine-tuning of the same student. Without transfer losses the teacher's logits are
computed once for the training set (eval mode: the same every epoch); with them the teacher runs per batch.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.config import BertConfig
from bertkit.errors import ConfigError
from bertkit.heads import IGNORE_INDEX
from bertkit.tasks.batching import predict_batches
from bertkit.tasks.readers import TextExample
from bertkit.tasks.runner import (FinetuneConfig, FinetuneHooks, TrainBatches, evaluate_task, finetune, load_task,
                                  model_overrides, numeric_metrics)
from bertkit.tasks.task import Feature
from bertkit.tokenizer import Tokenizer
from bertkit.train.steps import StepOutput

__all__ = ["DistillConfig", "distill_task", "select_layers", "layer_map", "truncated_student", "soft_loss",
           "hidden_loss", "attention_loss", "augment_examples"]

INPUTS = ("input_ids", "token_type_ids", "attention_mask")       # what the student and the teacher both read
_SEQUENCE_KINDS = ("classify", "pair", "regress", "multilabel")
_KINDS = (*_SEQUENCE_KINDS, "tag", "qa")                      # the kinds `_task_losses` has a soft loss for


@dataclass
class DistillConfig:
    teacher: str                           # a model directory written by `bertkit finetune`
    student_layers: int | None = None      # K layers, evenly spaced (select_layers): of the teacher, or of `student`
    student_preset: str | None = None      # or a random student of this preset size
    student: str | None = None             # or this model directory (same vocabulary as the teacher)
    temperature: float = 2.0
    alpha: float = 0.5                     # weight of the soft loss; 1 - alpha: the gold labels
    hidden_weight: float = 0.0             # hidden-state transfer; 0: off
    attention_weight: float = 0.0          # attention transfer; 0: off
    unlabeled: str | None = None           # more training texts (the task's format, no labels): soft targets only
    augment: int = 0                       # noisy copies of each training text, soft targets only (augment_examples)

    def __post_init__(self):
        given = [n for n in ("student_layers", "student_preset", "student") if getattr(self, n) is not None]
        if given not in (["student_layers"], ["student_preset"], ["student"], ["student_layers", "student"]):
            raise ConfigError("choose the student with one of --student-layers (of the teacher), --student-preset, "
                              "--student DIR (with --student-layers: that many of its layers)")
        if self.temperature <= 0:
            raise ConfigError(f"--temperature must be > 0, got {self.temperature}")
        if not 0 <= self.alpha <= 1:
            raise ConfigError(f"--alpha must be in [0, 1], got {self.alpha}")
        if self.hidden_weight < 0 or self.attention_weight < 0:
            raise ConfigError("--hidden-weight and --attention-weight must be >= 0")
        if self.augment < 0:
            raise ConfigError(f"--augment must be >= 0, got {self.augment}")
        if self.adds_texts and not self.uses_teacher:
            raise ConfigError("--unlabeled / --augment texts have no gold labels, only the teacher's soft targets: "
                              "give --alpha > 0")

    @property
    def transfer(self) -> bool:
        return self.hidden_weight > 0 or self.attention_weight > 0

    @property
    def uses_teacher(self) -> bool:
        return self.alpha > 0 or self.transfer

    @property
    def adds_texts(self) -> bool:
        return bool(self.unlabeled) or self.augment > 0


def teacher_outputs(teacher: nn.Module, batch: dict, **flags):
    """The teacher's outputs for `batch`, without gradients, on the batch's device (moved there once: `.to()` every
    step would walk every parameter)."""
    if next(teacher.parameters()).device != batch["input_ids"].device:
        teacher.to(batch["input_ids"].device)
    with torch.no_grad():
        return teacher(**{k: batch[k] for k in INPUTS if k in batch}, **flags)


def transfer_pairs(student: nn.Module, teacher: nn.Module, hidden_weight: float) -> list[tuple[int, int]]:
    """The student's layer map onto the teacher; with hidden transfer between different widths, the student gets a
    learned projection (`distill_projection`, trained with it and dropped before it is saved)."""
    s, t = student.config, teacher.config
    if hidden_weight > 0 and s.hidden_size != t.hidden_size:
        student.distill_projection = nn.Linear(s.hidden_size, t.hidden_size)
    return layer_map(s.num_hidden_layers, t.num_hidden_layers)


# ---------------------------------------------------------------------------------------------- students

def select_layers(teacher_layers: int, k: int, source: str = "the teacher") -> list[int]:
    """0-based teacher layers a K-layer student starts from: (i + 1) * L // K - 1, evenly spaced, ending at the top
    (the head and pooler copied with them were trained on the last layer's output)."""
    if not 1 <= k <= teacher_layers:
        raise ConfigError(f"--student-layers {k}: {source} has {teacher_layers} layers; choose 1..{teacher_layers}")
    return [(i + 1) * teacher_layers // k - 1 for i in range(k)]


def layer_map(student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """(student, teacher) hidden-state indices for transfer: 0 = embeddings, j -> j * L / K (rounded)."""
    return [(j, round(j * teacher_layers / student_layers)) for j in range(student_layers + 1)]


_LAYER = re.compile(r"^(.*encoder\.layer\.)(\d+)\.(.*)$")


def truncated_student(teacher: nn.Module, k: int, source: str = "the teacher") -> nn.Module:
    """A K-layer copy of `teacher` (any bertkit head model): layers select_layers(L, K), everything else copied."""
    n = teacher.config.num_hidden_layers
    chosen = select_layers(n, k, source)
    groups = teacher.config.num_hidden_groups
    if groups is not None and groups > k:
        raise ConfigError(f"--student-layers {k}: {source} shares its layers in {groups} groups; choose {groups}..{n}")
    settings = teacher.config.to_dict()
    # per-layer settings (ModernBERT's layer_types) follow the chosen layers
    if isinstance(settings.get("layer_types"), list):
        settings["layer_types"] = [settings["layer_types"][i] for i in chosen]
    student = type(teacher)(BertConfig.from_dict({**settings, "num_hidden_layers": k}))
    state = {}
    for name, value in teacher.state_dict().items():
        m = _LAYER.match(name)
        if m is None or groups is not None:           # ALBERT: the shared layers are the student's too
            state[name] = value.clone()
        elif int(m[2]) in chosen:
            state[f"{m[1]}{chosen.index(int(m[2]))}.{m[3]}"] = value.clone()
    own = student.state_dict()
    # ModernBERT's first layer has no norm before attention: a later layer's, chosen as the first, leaves it behind
    student.load_state_dict({k: v for k, v in state.items() if k in own}, strict=True)
    return student


def check_same_vocab(teacher_dir, student_dir) -> None:
    """Refuse a student whose vocabulary is not the teacher's (the soft targets are over the same token ids),
    whichever file holds it (vocab.txt, tokenizer.json, a SentencePiece model)."""
    teacher, student = (Tokenizer.from_pretrained(d).ids_to_tokens for d in (teacher_dir, student_dir))
    if teacher != student:
        raise ConfigError(f"--student {student_dir}: its vocabulary differs from the teacher's ({teacher_dir}: "
                          f"{len(teacher)} tokens, the student {len(student)}); distillation needs the same vocabulary")


def build_student(dcfg: DistillConfig, cls, overrides: dict):
    """The untrained student (a `cls` head model) per dcfg: truncated teacher, preset, a directory, or K layers of
    a directory (a pre-trained model: its head is new)."""
    if dcfg.student is not None:
        check_same_vocab(dcfg.teacher, dcfg.student)
        student = cls.from_pretrained(dcfg.student, **overrides)
        return (student if dcfg.student_layers is None
                else truncated_student(student, dcfg.student_layers, f"--student {dcfg.student}"))
    if dcfg.student_layers is not None:
        return truncated_student(cls.from_pretrained(dcfg.teacher, **overrides), dcfg.student_layers)
    teacher_cfg = BertConfig.from_json(Path(dcfg.teacher) / "config.json")
    return cls(BertConfig.preset(dcfg.student_preset, vocab_size=teacher_cfg.vocab_size, **overrides))


# ---------------------------------------------------------------------------------------------- losses

def _kl_rows(p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) along the last axis, 0 * log 0 = 0 (padding's probabilities)."""
    return (torch.xlogy(p, p) - p * log_q).sum(-1)


def soft_loss(student: Tensor, teacher: Tensor, temperature: float, mask: Tensor | None = None) -> Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) * T^2, averaged over the rows (where `mask`)."""
    t = temperature
    kl = _kl_rows(torch.softmax(teacher.float() / t, -1), torch.log_softmax(student.float() / t, -1))
    return _masked_mean(kl, mask) * t * t


def _masked_mean(values: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return values.mean()
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def hidden_loss(student: tuple, teacher: tuple, pairs, attention_mask: Tensor, projection: nn.Module | None
                ) -> Tensor:
    """Mean over the mapped (student, teacher) pairs of the MSE between hidden states at real tokens."""
    real = attention_mask.unsqueeze(-1).float()                                     # (batch, seq, 1)
    total = 0.0
    for s, t in pairs:
        h = student[s].float()
        if projection is not None:
            h = projection(h)
        total = total + ((h - teacher[t].float()) ** 2 * real).sum() / (real.sum() * h.shape[-1]).clamp_min(1.0)
    return total / len(pairs)


def attention_loss(student: tuple, teacher: tuple, pairs, attention_mask: Tensor) -> Tensor:
    """Mean over mapped layers of KL(teacher's attention || student's) per real query row and head."""
    real = attention_mask.float()[:, None, :].expand(-1, student[0].shape[1], -1)   # (batch, heads, seq)
    total = 0.0
    for s, t in pairs:
        log_q = student[s - 1].float().clamp_min(1e-12).log()
        total = total + _masked_mean(_kl_rows(teacher[t - 1].float(), log_q), real)
    return total / len(pairs)


def _sequence_losses(kind: str, student: Tensor, teacher: Tensor, batch: dict, t: float) -> tuple[Tensor, Tensor]:
    """(soft, gold) for classify / pair / regress / multilabel; gold over the labelled rows only."""
    labelled, labels = batch["labelled"].float(), batch["labels"]
    if kind == "regress":
        soft = F.mse_loss(student.float(), teacher.float())
        gold = (student.float().squeeze(-1) - labels.float()) ** 2
    elif kind == "multilabel":
        target = torch.sigmoid(teacher.float() / t)
        soft = F.binary_cross_entropy_with_logits(student.float() / t, target) * t * t
        gold = F.binary_cross_entropy_with_logits(student.float(), labels.float(), reduction="none").mean(-1)
    else:
        soft = soft_loss(student, teacher, t)
        gold = F.cross_entropy(student.float(), labels.long(), reduction="none")
    return soft, _masked_mean(gold, labelled)


def _outputs(kind: str, out) -> Tensor:
    """The logits distillation matches: (batch, C) or (batch, seq, C); qa: (batch, seq, 2) start / end."""
    return torch.stack([out.start_logits, out.end_logits], -1) if kind == "qa" else out.logits


# ---------------------------------------------------------------------------------------------- augmentation

def augment_examples(examples: list, copies: int, seed: int, mask_prob: float = 0.1, span_prob: float = 0.25,
                     mask_token: str = "[MASK]") -> list:
    """`copies` noisy, unlabelled copies of each example, for the teacher to label (Tang et al. 2019, "Distilling
    task-specific knowledge from BERT into simple neural networks"): each word becomes [MASK] with `mask_prob`;
    with `span_prob` a single text is first cut to a random contiguous span of at least half its words (a long
    document thus shows the student text from beyond its first max_length pieces). Deterministic per seed."""
    rng = np.random.default_rng(seed)

    def noisy(text: str | None, may_cut: bool) -> str | None:
        if text is None:
            return None
        words = text.split()
        if may_cut and len(words) > 1 and rng.random() < span_prob:
            n = int(rng.integers((len(words) + 1) // 2, len(words) + 1))
            start = int(rng.integers(0, len(words) - n + 1))
            words = words[start:start + n]
        return " ".join(mask_token if rng.random() < mask_prob else w for w in words)

    return [TextExample(noisy(e.text, e.text_pair is None), noisy(e.text_pair, False), None,
                        f"{e.source} (augmented copy {c + 1})")
            for c in range(copies) for e in examples]


# ---------------------------------------------------------------------------------------------- task distillation

class _TargetBatches(TrainBatches):
    """finetune's batches plus `labelled` (rows with gold labels) and, when precomputed, `teacher` (logits)."""

    def batch(self, feats: list[Feature]) -> dict:
        batch = super().batch(feats)
        batch["labelled"] = torch.tensor([f.labelled for f in feats])
        if feats[0].teacher is not None:
            rows = [torch.from_numpy(f.teacher) for f in feats]
            if rows[0].ndim == 2:                # per-token logits: padded to the batch's width
                rows = [F.pad(r, (0, 0, 0, batch["input_ids"].shape[1] - len(r))) for r in rows]
            batch["teacher"] = torch.stack(rows)
        return batch


class TaskDistiller(FinetuneHooks):
    """FinetuneHooks for task distillation: the teacher's task and tokenizer, the student, the targets, the loss."""

    def __init__(self, dcfg: DistillConfig):
        self.dcfg = dcfg
        self.teacher = None
        self.teacher_scores: dict = {}
        self.step_fn = self._step if dcfg.uses_teacher else None     # alpha 0, no transfer: plain fine-tuning

    def setup(self, cfg: FinetuneConfig):
        task, teacher, tok = load_task(self.dcfg.teacher)
        if task.kind != cfg.task:
            raise ConfigError(f"--teacher {self.dcfg.teacher}: fine-tuned for {task.kind!r}, not {cfg.task!r}")
        if task.kind not in _KINDS:
            raise ConfigError(f"--teacher {self.dcfg.teacher}: distillation supports {', '.join(_KINDS)}, "
                              f"not {task.kind!r}")
        task.fit_labels = lambda train: None          # the teacher's label ids, whatever order the file has
        self.teacher = teacher
        self.kind = task.kind
        return task, tok

    def extend(self, cfg: FinetuneConfig, task, tok, data) -> None:
        for split, examples, feats in (("dev", data.dev, data.dev_feats), ("test", data.test, data.test_feats)):
            if examples is not None:
                report, _ = evaluate_task(task, self.teacher, examples, feats, cfg.eval_batch_size,
                                          cfg.training.precision)
                self.teacher_scores[split] = numeric_metrics(report)
        if self.dcfg.adds_texts:
            added = self._unlabeled(task, tok, data, cfg.seeds[0])
            data.train_feats += added
            data.counts["unlabeled_features"] = len(added)
        if self.dcfg.uses_teacher and not self.dcfg.transfer:
            self._precompute(data.train_feats, cfg)

    def _unlabeled(self, task, tok, data, seed: int) -> list[Feature]:
        """Features of the texts with soft targets only: --unlabeled's file, then --augment's copies."""
        if self.kind not in _SEQUENCE_KINDS:
            flag = "--unlabeled" if self.dcfg.unlabeled else "--augment"
            raise ConfigError(f"{flag}: supported for {', '.join(_SEQUENCE_KINDS)} teachers, not {self.kind!r}")
        examples = task.read(self.dcfg.unlabeled, require_label=False) if self.dcfg.unlabeled else []
        examples += augment_examples(data.train, self.dcfg.augment, seed, mask_token=tok.mask_token)
        feats = task.features(tok, examples, with_labels=False)
        dummy = data.train_feats[0].labels
        for f in feats:
            f.labels, f.labelled = dummy, False
        return feats

    def _precompute(self, feats: list[Feature], cfg: FinetuneConfig) -> None:
        """The teacher's logits for every training feature, once (eval mode: the same every epoch)."""
        for idx, out in predict_batches(self.teacher, feats, cfg.eval_batch_size, cfg.training.precision):
            logits = _outputs(self.kind, out).float().cpu().numpy()
            for row, i in enumerate(idx):
                feats[i].teacher = logits[row] if logits.ndim == 2 else logits[row, :len(feats[i].input_ids)]

    def build_model(self, cfg: FinetuneConfig, task, seed: int):
        torch.manual_seed(seed)
        student = build_student(self.dcfg, task.model_class, model_overrides(cfg, task))
        self._check_transfer(student)
        return student

    def _check_transfer(self, student) -> None:
        t, s = self.teacher.config, student.config
        if self.dcfg.attention_weight > 0 and s.num_attention_heads != t.num_attention_heads:
            raise ConfigError(f"--attention-weight: the student has {s.num_attention_heads} attention heads, the "
                              f"teacher {t.num_attention_heads}; attention transfer needs the same number")
        self.pairs = transfer_pairs(student, self.teacher, self.dcfg.hidden_weight)

    def batches(self, cfg: FinetuneConfig, data, seed: int, pad_id: int):
        if not self.dcfg.uses_teacher:
            return super().batches(cfg, data, seed, pad_id)
        return _TargetBatches(data.train_feats, cfg.batch_size, seed, pad_id, cfg.bucket_batches)

    def trained(self, model):
        if hasattr(model, "distill_projection"):
            del model.distill_projection
        return model

    def _step(self, model, batch: dict) -> StepOutput:
        d = self.dcfg
        flags = {"output_hidden_states": d.hidden_weight > 0, "output_attentions": d.attention_weight > 0}
        target, t_out = batch.get("teacher"), None
        if target is None:
            t_out = teacher_outputs(self.teacher, batch, **flags)
            target = _outputs(self.kind, t_out)
        s_out = model(**{k: batch[k] for k in INPUTS if k in batch}, **flags)
        soft, gold = self._task_losses(_outputs(self.kind, s_out), target, s_out, batch)
        loss = d.alpha * soft + (1 - d.alpha) * gold
        metrics = {"soft_loss": soft.detach(), "gold_loss": gold.detach()}
        if d.hidden_weight > 0:
            h = hidden_loss(s_out.hidden_states, t_out.hidden_states, self.pairs, batch["attention_mask"],
                            getattr(model, "distill_projection", None))
            loss, metrics["hidden_loss"] = loss + d.hidden_weight * h, h.detach()
        if d.attention_weight > 0:
            a = attention_loss(s_out.attentions, t_out.attentions, self.pairs[1:], batch["attention_mask"])
            loss, metrics["attention_loss"] = loss + d.attention_weight * a, a.detach()
        return StepOutput(loss=loss, metrics=metrics)

    def _task_losses(self, student: Tensor, target: Tensor, s_out, batch: dict) -> tuple[Tensor, Tensor]:
        t = self.dcfg.temperature
        if self.kind in _SEQUENCE_KINDS:
            return _sequence_losses(self.kind, student, target, batch, t)
        if self.kind == "tag":
            labels = batch["labels"]
            gold = F.cross_entropy(student.float().reshape(-1, student.shape[-1]), labels.reshape(-1),
                                   ignore_index=IGNORE_INDEX)
            return soft_loss(student, target, t, labels != IGNORE_INDEX), gold
        pad = (batch["attention_mask"] == 0).unsqueeze(-1)          # qa: padding is never an answer
        target = target.float().masked_fill(pad, torch.finfo(torch.float32).min)
        soft = soft_loss(student.transpose(1, 2), target.transpose(1, 2), t)   # rows: (example, start / end)
        s = student.shape[1]
        gold = sum(F.cross_entropy(student[..., i].float(), batch[k].reshape(-1).clamp(0, s), ignore_index=s)
                   for i, k in enumerate(("start_positions", "end_positions"))) / 2
        return soft, gold

    def summary(self) -> dict:
        return {"distill": {**asdict(self.dcfg), "layer_map": self.pairs,
                            "student_init_layers": (select_layers(self.teacher.config.num_hidden_layers,
                                                                  self.dcfg.student_layers)
                                                    if self.dcfg.student_layers and not self.dcfg.student else None),
                            "teacher_scores": self.teacher_scores}}


def distill_task(dcfg: DistillConfig, cfg: FinetuneConfig) -> dict:
    """Train the student of `dcfg` with finetune's recipe `cfg` (its `model` is ignored; the task is the teacher's);
    returns the summary written to OUT/summary.json (with a `distill` entry: settings, teacher scores)."""
    return finetune(cfg, TaskDistiller(dcfg))
