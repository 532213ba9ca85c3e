"""What `--budget` means from scratch: a recipe sized to the wall-clock budget, each setting with its reason.

    plan = plan_recipe(360, "mini", measured_step_s=0.23, manifest=read_manifest("shards/"))
    print(plan.block())

The plan is the recipe that got a from-scratch MLM off its plateau (every [MASK] the same few tokens) within a short
budget (docs/performance.md, "Pre-training from scratch on a budget", has the runs). `bertkit pretrain --budget`
without --init plans every setting the user did not give (PretrainConfig.set_fields: an explicit flag always wins).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import statistics
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from bertkit import runtime
from bertkit.config import PRESETS, BertConfig
from bertkit.errors import ConfigError
from bertkit.optim import build_optimizer
from bertkit.precision import autocast, resolve
from bertkit.pretraining.local_init import unfit_for
from bertkit.textfiles import check_fields, parse_json
from bertkit.train.steps import pretraining_step, to_device

__all__ = ["Choice", "RecipePlan", "plan_recipe", "apply_plan", "given_settings", "probe_times", "load_plan",
           "PLANNED", "SHARDS"]

STEP_TOKENS = 1024            # tokens per optimizer step: the measured recipe's 16 rows of 64
ROW_TOKENS = 64               # the rows the recipe was measured on
FULL_WARMUP = 1000            # steps: the measured warmup
FULL_WARMUP_FROM = 2000       # estimated steps from which the full warmup leaves at least half the run after it
SHORT_WARMUP = 0.3            # shorter budgets: this share of the estimated steps
DECAY_FRACTION = 0.1
EVAL_POINTS = 10              # held-out evaluations over the run, at most, the final one (after the budget) included
EVAL_SHARE = 0.1              # of the budget that the evaluations during the run may take, at most
EVAL_TOKENS = 65536           # held-out tokens scored per evaluation
FORWARD_SHARE = 1 / 3         # unmeasured: an evaluation batch (forward only) against a training step, in FLOPs
# the `bertkit prepare` settings whose shards the plan trains on as they are (the demo builds these)
SHARDS = {"seq_len": ROW_TOKENS, "task": "nsp", "masking": "token", "mask_prob": 0.4, "dynamic": True}
LRS = {"tiny": 1e-3, "mini": 1e-3, "small": 5e-4, "medium": 5e-4, "base": 1e-4, "large": 1e-4}
_LR_WHY = {1e-3: "measured: mini left the plateau at 1e-3 with this warmup and schedule",
           5e-4: "not measured: between mini's measured 1e-3 and BERT-base's 1e-4",
           1e-4: "BERT's lr for this size (not measured here)"}

# the settings a plan chooses -> their flag; PretrainConfig fields first, then TrainConfig fields
FLAGS = {"masking": "--masking", "mask_prob": "--mask-prob", "batch_size": "--batch-size", "dropout": "--dropout",
         "eval_batches": "--eval-batches", "lr": "--lr", "warmup": "--warmup", "schedule": "--schedule",
         "decay_fraction": "--decay-fraction", "eval_every_steps": "--eval-every", "output_vocab": "--output-vocab",
         "attention_init": "--attention-init"}
_PRETRAIN_FIELDS = ("masking", "mask_prob", "batch_size", "dropout", "eval_batches", "output_vocab", "attention_init")
PLANNED = tuple(FLAGS)


@dataclass
class Choice:
    value: Any
    reason: str
    flag: bool = False                    # the user's explicit flag, not the plan's


@dataclass
class RecipePlan:
    budget_s: float
    preset: str | None
    seq_len: int                          # the shards' rows
    step_s: float | None                  # measured seconds per optimizer step at the planned shape (None: not yet)
    row_tokens: float                     # mean real tokens in a shard row
    corpus_tokens: int                    # tokens in the training shards
    eval_batch_s: float | None = None     # measured seconds per evaluation batch (forward only) at that shape
    eval_s: float = 0.0                   # expected seconds of held-out evaluation within the budget
    choices: dict[str, Choice] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def value(self, name: str):
        c = self.choices.get(name)
        return None if c is None else c.value

    @property
    def steps(self) -> int | None:
        return None if not self.step_s else max(1, int((self.budget_s - self.eval_s) / self.step_s))

    @property
    def tokens(self) -> int | None:
        steps = self.steps
        return None if steps is None else int(steps * self.value("batch_size") * self.row_tokens)

    def to_dict(self) -> dict:
        return {**{name: getattr(self, name) for name in _MEASURES}, "estimated_steps": self.steps,
                "estimated_tokens": self.tokens, "settings": {k: c.value for k, c in self.choices.items()},
                "reasons": {k: c.reason for k, c in self.choices.items()},
                "flags": [k for k, c in self.choices.items() if c.flag], "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: dict) -> "RecipePlan":
        choices = {k: Choice(v, d["reasons"].get(k, ""), k in d["flags"]) for k, v in d["settings"].items()}
        return cls(**{name: d[name] for name in _MEASURES}, choices=choices, notes=list(d["notes"]))

    def block(self) -> str:
        """The plan and why, for a person: the estimate, one line per setting, the notes."""
        head = (f"bertkit pretrain: the plan for a {_duration(self.budget_s)} budget from scratch ("
                f"{self.preset or 'config.json'}; shards: rows of {self.seq_len} tokens, "
                f"{self.corpus_tokens / 1e6:.2f} M tokens)")
        lines = [head]
        if self.steps is not None:
            lines.append(f"  measured {self.step_s:.3f} s a step at {self.value('batch_size')} x {self.seq_len} on "
                         f"this machine -> ~{self.steps:,} steps, ~{self.tokens / 1e6:.2f} M tokens "
                         f"({self.tokens / max(self.corpus_tokens, 1):.1f} passes over the shards)"
                         + (f" and ~{self.eval_s:.0f} s of evaluation" if self.eval_s else ""))
            if self.eval_batch_s:
                lines[-1] += f"; {self.eval_batch_s:.3f} s an evaluation batch"
            lines[-1] += "; the run re-estimates its steps as it goes"
        for name, c in self.choices.items():
            lines.append(f"  {name:<17}{_show(name, c.value):<12}{'yours: ' if c.flag else ''}{c.reason}")
        lines += [f"  note: {n}" for n in self.notes]
        lines.append("  a flag you give wins over the plan; the measurements behind it: docs/performance.md")
        return "\n".join(lines)


_MEASURES = [f.name for f in fields(RecipePlan) if f.name not in ("choices", "notes")]    # plan.json's first keys


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"


def _show(name: str, value) -> str:
    if value is None:
        return "-"
    if name == "warmup":
        return f"{int(value)} step{'s' if int(value) != 1 else ''}" if value >= 1 else f"{value:.0%}"
    if name in ("mask_prob", "decay_fraction"):
        return f"{value:.0%}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _choose(plan: RecipePlan, given: dict, name: str, value, reason: str) -> None:
    plan.choices[name] = Choice(given[name], FLAGS[name], flag=True) if name in given else Choice(value, reason)


def plan_recipe(budget_s: float, preset: str | None, measured_step_s: float | None, manifest: dict,
                given: dict | None = None, heldout_rows: int = 0, eval_batch_s: float | None = None,
                model: BertConfig | None = None) -> RecipePlan:
    """The recipe for `budget_s` seconds from scratch on the shards of `manifest` (a pure function).

    `given`: the settings the user chose (kept, marked as theirs); `measured_step_s`: seconds per optimizer step at
    the planned shape, from which the steps the budget affords follow (None: the step-count choices, warmup and
    evaluation interval, are left out); `heldout_rows`: rows of the held-out shards (0: none to evaluate on);
    `eval_batch_s`: measured seconds per evaluation batch (None: a third of a step, the FLOP ratio); `model`: the
    config.json's model where there is no preset (its size picks the lr, its family whether it can start local)."""
    given = dict(given or {})
    size = preset   # a config.json's model takes the lr of the preset of its width
    if model is not None and size is None:
        size = next((n for n, (_, h, _) in PRESETS.items() if h == model.hidden_size), None)
    counts = manifest.get("counts", {})
    examples = max(int(counts.get("examples", 0)), 1)
    corpus = int(counts.get("tokens", 0))
    plan = RecipePlan(budget_s, preset, int(manifest["seq_len"]), measured_step_s,
                      corpus / examples if corpus else float(manifest["seq_len"]), corpus, eval_batch_s)
    _plan_masks(plan, given, manifest["masking"])
    _plan_shape(plan, given, heldout_rows > 0, unfit_for(model) if model is not None else None)
    _plan_optimiser(plan, given, size)
    if measured_step_s:
        if heldout_rows:
            _plan_evaluation(plan, given, heldout_rows)
        _plan_warmup(plan, given)
    if manifest.get("task") == "none":
        plan.notes.append("packed rows (task none) stayed on the plateau longer than sentence-pair rows in the "
                          "measured runs: `bertkit prepare ... --task nsp` builds those")
    return plan


def _describe(masking: dict) -> str:
    mode = {"wwm": "whole-word", "ngram": "n-gram"}.get(masking["mode"], masking["mode"])
    return f"{'dynamic' if masking.get('dynamic') else 'static'} {mode} {masking['mask_prob']:.0%}"


def _plan_masks(plan: RecipePlan, given: dict, stored: dict) -> None:
    if given.get("masking") == "shards":
        _choose(plan, given, "masking", "shards", "")
        _choose(plan, given, "mask_prob", None, "the shards' own rate (--masking shards)")
    else:
        _choose(plan, given, "masking", "token", "single tokens, redrawn every epoch: a masked piece's neighbours "
                "are its best evidence; whole-word masks stayed on the plateau")
        _choose(plan, given, "mask_prob", 0.4, "more predictions a step; 30% left the plateau later")
    mode, prob = plan.value("masking"), plan.value("mask_prob")
    if prob is None:
        plan.notes.append(f"training rows: the shards' own {_describe(stored)} masks")
        return
    want = {"mode": stored["mode"] if mode == "shards" else mode, "mask_prob": prob, "dynamic": True}
    if stored.get("dynamic") and (stored["mode"], stored["mask_prob"]) == (want["mode"], prob):
        plan.notes.append(f"training rows: the shards' own {_describe(stored)} masks fit the plan")
    else:
        plan.notes.append(f"the shards store {_describe(stored)} masks: the training rows are re-masked at batch time "
                          f"from their stored tokens ({_describe(want)}, fresh every epoch)")


def _plan_shape(plan: RecipePlan, given: dict, evaluate: bool, unfit: str | None) -> None:
    seq = plan.seq_len
    batch = max(1, STEP_TOKENS // seq)
    if seq == ROW_TOKENS:
        why = f"{batch} rows of {seq} = {STEP_TOKENS:,} tokens a step: many small updates in a short budget"
    else:
        why = (f"the shards' {seq}-token rows as they are, {batch} a step = the recipe's {STEP_TOKENS:,} tokens (it "
               f"was measured on rows of {ROW_TOKENS}: `bertkit prepare ... --seq-len {ROW_TOKENS}` builds those)")
    if "global_batch" in given and "batch_size" not in given:
        batch = math.gcd(int(given["global_batch"]), batch)
        why = f"the largest micro-batch up to {STEP_TOKENS // seq} that divides your --global-batch"
    _choose(plan, given, "batch_size", batch, why)
    _choose(plan, given, "dropout", 0.0, "a few passes over the data: nothing to regularise yet (and it costs time)")
    if unfit:
        _choose(plan, given, "attention_init", "random", f"no local start: {unfit}")
    else:
        _choose(plan, given, "attention_init", "local", "the first layer's heads start on the neighbouring tokens: "
                "the plateau (every [MASK] the same few words) ended within ~300 steps instead of after 5,000+ on a "
                "novel")
    _choose(plan, given, "output_vocab", "corpus", "the softmax scores only the ids the training shards hold (the "
            "others are never a target): with a 30k vocabulary it is as costly as the encoder")
    if evaluate:
        rows = plan.value("batch_size") * seq
        _choose(plan, given, "eval_batches", max(1, math.ceil(EVAL_TOKENS / rows)),
                f"~{EVAL_TOKENS // 1024}k held-out tokens an evaluation: a steady accuracy")


def _plan_optimiser(plan: RecipePlan, given: dict, size: str | None) -> None:
    lr = LRS.get(size or "", 1e-4)
    _choose(plan, given, "lr", lr, _LR_WHY[lr] + ("" if size == plan.preset else f"; your model is {size}'s width"))
    _choose(plan, given, "schedule", "wsd", "the peak lr held through the plateau, decayed only at the end")
    if plan.value("schedule") == "wsd":
        _choose(plan, given, "decay_fraction", DECAY_FRACTION, "the decay of the measured runs")
    elif "decay_fraction" in given:                       # TrainConfig refuses it, naming the flag
        _choose(plan, given, "decay_fraction", None, "")


def _plan_evaluation(plan: RecipePlan, given: dict, heldout_rows: int) -> None:
    """Evaluations during the run in at most EVAL_SHARE of the budget, EVAL_POINTS in all with the final one (which
    the loop makes after the budget); their time comes off the steps."""
    batches = min(plan.value("eval_batches"), max(1, heldout_rows // plan.value("batch_size")))
    cost = batches * (plan.eval_batch_s or plan.step_s * FORWARD_SHARE)         # seconds per evaluation
    if "eval_every_steps" in given:
        during = int(plan.budget_s / (given["eval_every_steps"] * plan.step_s + cost))
    else:
        during = max(0, min(EVAL_POINTS - 1, int(EVAL_SHARE * plan.budget_s / cost)))
    plan.eval_s = during * cost
    if during:
        why = f"{during + 1} held-out evaluations of ~{cost:.0f} s, the last at the end: the curve in curves.png"
    else:
        why = f"one held-out evaluation, at the end: one takes ~{cost:.0f} s, over {EVAL_SHARE:.0%} of the budget"
    _choose(plan, given, "eval_every_steps", max(1, plan.steps // (during + 1)) if during else None, why)


def _plan_warmup(plan: RecipePlan, given: dict) -> None:
    steps = plan.steps
    if steps >= FULL_WARMUP_FROM:
        warmup, why = FULL_WARMUP, (f"the budget affords ~{steps:,} steps: the measured {FULL_WARMUP:,}-step "
                                    "warmup (shorter ones kept runs on the plateau)")
    else:
        warmup, why = max(1, round(SHORT_WARMUP * steps)), (f"a short budget (~{steps:,} steps): {SHORT_WARMUP:.0%} "
                                                            "of them, so most of the run is at the peak lr")
    _choose(plan, given, "warmup", float(warmup), why)


def given_settings(pc) -> dict:
    """The planned settings (and --global-batch) that the user chose, with their values: pc.set_fields of them."""
    out = {}
    for name in pc.set_fields or ():
        if name == "global_batch" or name in _PRETRAIN_FIELDS:
            out[name] = getattr(pc, name)
        elif name in PLANNED:
            out[name] = getattr(pc.train, name)
    return out


def apply_plan(pc, plan: RecipePlan):
    """`pc` with the plan's settings (the user's among them, unchanged)."""
    ours = {n: c.value for n, c in plan.choices.items() if n in _PRETRAIN_FIELDS}
    train = {n: c.value for n, c in plan.choices.items() if n in PLANNED and n not in _PRETRAIN_FIELDS}
    return replace(pc, **ours, train=replace(pc.train, **train))


def load_plan(out: Path) -> RecipePlan | None:
    """The plan an interrupted run wrote (OUT/plan.json), so a resumed run keeps its schedule."""
    path = Path(out) / "plan.json"
    if not path.is_file():
        return None
    d = parse_json(path.read_bytes(), str(path), ConfigError)
    _check_plan(path, d)
    try:
        return RecipePlan.from_dict(d)
    except KeyError:                    # a plan.json of an earlier bertkit: the run is resumed without it
        return None


_PLAN_SECTIONS = {"settings": "object", "reasons": "object", "flags": "list", "notes": "list", "preset": "name?"}
_PLAN_COUNTS = ("batch_size", "eval_batches", "eval_every_steps", "seq_len", "corpus_tokens")  # sizes, not rates
_PLAN_WORDS = ("masking", "schedule", "output_vocab", "attention_init")  # its other settings are numbers
_PLAN_UNMEASURED = ("step_s", "eval_batch_s", "eval_batches", "eval_every_steps", "decay_fraction")  # may be null


def _plan_kinds(names) -> dict[str, str]:
    """Each plan number's kind: a count the loop divides by, else a number; null where not measured yet."""
    return {name: ("count" if name in _PLAN_COUNTS else "number") + ("?" if name in _PLAN_UNMEASURED else "")
            for name in names}


def _check_plan(path: Path, d) -> None:
    """ConfigError naming the first field of plan.json whose value is of the wrong type (a hand-edited file)."""
    measures = _plan_kinds(name for name in _MEASURES if name != "preset")
    check_fields(d, {**_PLAN_SECTIONS, **measures}, str(path), ConfigError, required=False)
    settings = d.get("settings", {})
    kinds = {name: "name" for name in _PLAN_WORDS} | _plan_kinds(n for n in settings if n not in _PLAN_WORDS)
    check_fields(settings, kinds, str(path), ConfigError, prefix="settings.", required=False)


def probe_times(model, batches, cfg, device, steps: int = 4) -> tuple[float, float]:
    """(seconds per optimizer step, seconds per evaluation batch) of `model` on `batches` as `cfg` trains it on
    `device`: medians, on a copy of the model; the data go back to the start of epoch 0."""
    probe = runtime.apply(copy.deepcopy(model).to(device)).train()
    opt = build_optimizer(probe, cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas),
                          eps=cfg.eps)
    precision = resolve(cfg.precision, device)
    source = itertools.chain.from_iterable(itertools.repeat(batches))     # epoch after epoch

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    def step() -> None:
        for _ in range(cfg.grad_accum):
            with autocast(precision, device):
                loss = pretraining_step(probe, to_device(next(source), device)).loss
            (loss / cfg.grad_accum).backward()
        if cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(probe.parameters(), cfg.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def evaluate() -> None:
        with torch.no_grad(), autocast(precision, device):
            pretraining_step(probe, to_device(next(source), device))

    step_s = statistics.median([timed(step) for _ in range(steps + 1)][1:])   # the first pays one-off costs
    probe.eval()
    eval_s = statistics.median([timed(evaluate) for _ in range(2)])
    if hasattr(batches, "set_epoch"):
        batches.set_epoch(0)
    return step_s, eval_s
