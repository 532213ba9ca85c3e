"""`bertkit pretrain` as a library call: shard directories -> a model -> train() -> an HF-format model directory.

    pretrain(PretrainConfig(shards="shards128/", preset="base", out="run/", train=TrainConfig(max_steps=1000)))

The model comes from a preset, a config.json or a checkpoint directory; the objective follows the shards' task
(docs/training.md). Everything a user can get wrong is checked before the first step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from bertkit.atomic import write_json, write_text
from bertkit.config import BertConfig, peek_json_config, read_json_config
from bertkit.errors import CheckpointError, ConfigError, DataError
from bertkit.heads import BertForMaskedLM, BertForPreTraining
from bertkit.families import family
from bertkit.modern import parts
from bertkit.pretraining.electra import ElectraForPreTraining
from bertkit.pretraining.local_init import local_attention_init, unfit_for
from bertkit.pretraining.masking import MaskingConfig, MODES as MASK_MODES
from bertkit.pretraining.packing import PackedReader
from bertkit.pretraining.shards import ShardReader, read_manifest
from bertkit.progress import say
from bertkit.tokenizer import Tokenizer
from bertkit.train.callbacks import Callback
from bertkit.train.checkpointing import (CHECKPOINT_DIR, Checkpoints, check_writable, complete_checkpoints,
                                        latest_checkpoint)
from bertkit.train.distributed import Dist
from bertkit.train.loop import (Phase, TrainConfig, TrainingDiverged, load_model_weights, seed_everything, train,
                                why_stopped)
from bertkit.train.recipe import apply_plan, given_settings, load_plan, plan_recipe, probe_times
from bertkit.train.steps import pretraining_eval, pretraining_step, to_device
from bertkit.train.summary import write_summary

__all__ = ["PretrainConfig", "pretrain", "unigram_bias_init", "OBJECTIVES"]

log = logging.getLogger("bertkit.pretrain")

OBJECTIVES = ("auto", "mlm", "electra")


@dataclass
class PretrainConfig:
    shards: str                                 # shard directory (phase 1)
    out: str
    train: TrainConfig = field(default_factory=TrainConfig)  # the loop's settings: length, lr, checkpoints, ...
    phase2_shards: str | None = None            # e.g. seq 512 shards for the last part of the run
    phase1_fraction: float = 0.9                # BERT: 90% of the steps at seq 128
    eval_shards: str | None = None              # held-out shards for periodic evaluation
    eval_batches: int = 50
    # model: exactly one of preset / config / init (init + config: config fields override the checkpoint's)
    preset: str | None = None
    config: str | None = None
    init: str | None = None
    dropout: float | None = None                # overrides hidden + attention dropout when given
    rope_theta: float | None = None             # rotary models: the global layers' base (context extension)
    # masks of the training rows: "shards" = as the shards were built; token | wwm | ngram = drawn at batch time
    # from the stored tokens, fresh every epoch (static shards too); mask_prob alone re-masks in the shards' mode
    masking: str = "shards"
    mask_prob: float | None = None
    mask_prob_end: float | None = None          # the share at the last step, falling linearly from mask_prob (mmBERT)
    average_last: int = 1                       # the saved model: the mean weights of the last N checkpoints
    unigram_bias: bool = True                   # a fresh MLM output bias starts at log unigram frequencies
    output_vocab: str = "full"                  # "corpus": the training softmax scores only the shards' ids
    attention_init: str = "random"              # "local": a fresh first layer starts on the neighbouring tokens
    objective: str = "auto"                     # auto (the shards' task) | mlm | electra
    electra_weight: float = 50.0
    generator: str | None = None                # electra with init: the generator's checkpoint (else a fresh one)
    # batch
    batch_size: int = 32                        # per process per micro-batch
    global_batch: int | None = None             # None: batch_size x processes x train.grad_accum
    packing: bool = False                       # batches of batch_size x seq_len tokens of whole examples
    verify: str = "size"                        # shard file check: "size" or "full" (sha256)
    vocab: str | None = None                    # tokenizer to save with the model (default: the shards' vocab.txt)
    # the settings the caller chose (the flags given); with a budget and no init the others come from the plan
    set_fields: tuple[str, ...] | None = None


class MaskRateSchedule(Callback):
    """The masking share of `configs` (the readers' own MaskingConfigs, changed in place) falling linearly from
    `start` at the first step to `end` at the last (docs/pretraining.md). Set from the step count alone, before each
    step's batches are read, so a resumed run masks exactly as the uninterrupted one."""

    def __init__(self, configs: list[MaskingConfig], start: float, end: float):
        self.configs, self.start, self.end = configs, start, end

    def rate(self, step: int, total: int) -> float:
        return self.start + (self.end - self.start) * min(1.0, step / max(total - 1, 1))

    def on_train_begin(self, state) -> None:
        self.on_step_end(state, {})

    def on_step_end(self, state, logs: dict) -> None:
        for c in self.configs:
            c.mask_prob = self.rate(state.step, state.total)


def _manifests(pc: PretrainConfig) -> dict[str, dict]:
    dirs = {name: getattr(pc, name) for name in ("shards", "phase2_shards", "eval_shards") if getattr(pc, name)}
    out = {name: read_manifest(path, strict=True) for name, path in dirs.items()}
    first = out["shards"]
    for name, m in out.items():
        if m["vocab_hash"] != first["vocab_hash"] or m["vocab_size"] != first["vocab_size"]:
            raise DataError(f"{dirs[name]} was built with another vocab (size {m['vocab_size']}, hash "
                            f"{m['vocab_hash'][:12]}…) than {pc.shards} (size {first['vocab_size']}, hash "
                            f"{first['vocab_hash'][:12]}…)")
    return out


def _objective(pc: PretrainConfig, task: str) -> str:
    if pc.objective == "electra":
        return "electra"
    if pc.objective == "mlm" or task == "none":
        return "mlm"
    return task  # "nsp" | "sop"


def build_model(pc: PretrainConfig, manifests: dict[str, dict], objective: str):
    """(model, BertConfig): from a preset, a config.json or a checkpoint, checked against the shards' vocab."""
    chosen = [n for n in ("preset", "init") if getattr(pc, n)]
    if len(chosen) > 1 or (not chosen and not pc.config):
        raise ConfigError("choose the model with one of --preset NAME, --config config.json or --init CHECKPOINT_DIR"
                          " (--config may refine --init)")
    manifest = manifests["shards"]
    vocab_size = int(manifest["vocab_size"])
    longest = max(int(m["seq_len"]) for m in manifests.values())
    drop = {} if pc.dropout is None else {"hidden_dropout_prob": pc.dropout, "attention_probs_dropout_prob": pc.dropout}
    cls = {"nsp": BertForPreTraining, "sop": BertForPreTraining, "mlm": BertForMaskedLM}.get(objective)
    if pc.generator and not (pc.init and objective == "electra"):
        raise ConfigError("--generator is the generator of an ELECTRA pair: it needs --objective electra and --init "
                          "with the discriminator")
    if pc.init:
        init = Path(pc.init)
        if not (init / "config.json").is_file():
            raise CheckpointError(f"--init {init}: not a model directory (no config.json)")
        overrides = {**(read_json_config(Path(pc.config)) if pc.config else {}), **drop}
        vocab_file = init / "vocab.txt"
        if vocab_file.is_file():
            _check_vocab_file(vocab_file, manifest, str(vocab_file), f"rebuild the shards with --vocab {vocab_file}")
        if objective == "electra":
            model = ElectraForPreTraining.from_pretrained(init, pc.generator, pc.electra_weight, **overrides)
        else:
            model = cls.from_pretrained(init, **overrides)
        _check_vocab(model.config, vocab_size, init)
        if pc.rope_theta is not None:       # the base is read when the layers are built: build them anew
            loaded, config = model, _rotary_base(model.config, pc.rope_theta, longest)
            if objective == "electra":      # the pair as loaded: its loss weight, its generator's shape
                model = ElectraForPreTraining(config, pc.electra_weight,
                                              _rotary_base(loaded.generator.config, pc.rope_theta, longest))
            else:
                model = cls(config)
                model.loading_info = loaded.loading_info
            model.load_state_dict(loaded.state_dict())
        return model, model.config
    if pc.preset:
        config = BertConfig.preset(pc.preset, vocab_size=vocab_size, **drop)
    else:
        config = BertConfig.from_json(pc.config)
        _check_vocab(config, vocab_size, pc.config)
        config = config.replace(**drop)
    if pc.rope_theta is not None:
        config = _rotary_base(config, pc.rope_theta, longest)
    if objective == "electra":
        return ElectraForPreTraining(config, rtd_weight=pc.electra_weight), config
    return cls(config), config


def _rotary_base(config, theta: float, seq_len: int):
    """`config` with its global layers' rotary base `theta` (the local layers' kept) and its longest input raised to
    `seq_len` where shorter: rotary positions have no table, so a longer context changes no weight's shape. Written
    as transformers >= 5 reads it (rope_parameters), and the older key in step where the config has it."""
    fam = family(config.model_type)
    if not fam.rotary:
        raise ConfigError(f"--rope-theta {theta:g}: model_type {config.model_type} has no rotary positions "
                          "(ModernBERT, NomicBERT and GTE have)")
    if not theta > 0:
        raise ConfigError(f"--rope-theta {theta:g}: a rotary base must be > 0")
    rope = {"rope_type": "default", "rope_theta": float(theta)}
    if not fam.parts:                   # ModernBERT: a base per layer type (NomicBERT, GTE: one for all)
        rope = {"full_attention": rope,
                "sliding_attention": {"rope_type": "default", "rope_theta": parts(config).local_theta}}
    extra = {**config.extra, "rope_parameters": rope}
    old = "rope_theta" if fam.parts else "global_rope_theta"       # the pre-rope_parameters spelling
    if old in extra:
        extra[old] = float(theta)
    return config.replace(extra=extra, max_position_embeddings=max(config.max_position_embeddings, seq_len))


def unigram_bias_init(model, shards) -> bool:
    """Set the MLM output bias to log p(token), p the add-one smoothed unigram distribution of the shards'
    non-special tokens: the softmax starts where a from-scratch model's first steps would take it
    (docs/performance.md). `shards`: the training ShardReader (its counts cover every shard, whatever its rank).
    Returns whether it was set."""
    head = getattr(getattr(model, "cls", None), "predictions", None)
    if head is None:                                                  # ELECTRA: its generator keeps zeros
        return False
    counts = shards.token_counts().astype(np.float64)
    counts[shards.tables.never_mask] = 0.0
    p = (counts + 1.0) / (counts + 1.0).sum()                         # add-one: unseen tokens stay possible
    with torch.no_grad():
        head.bias.copy_(torch.from_numpy(np.log(p)).to(head.bias.dtype))
    return True


def _restrict_output_vocab(model, readers) -> int:
    """Train the MLM softmax over the ids the training shards hold; returns how many. Every rank counts every
    shard, so the columns agree across processes."""
    used = sum(r.token_counts() > 0 for r in readers)
    ids = torch.from_numpy(np.flatnonzero(used))
    model.cls.predictions.restrict_to(ids)
    return ids.numel()


def _check_vocab_file(path, manifest: dict, what: str, fix: str) -> None:
    """A DataError unless the vocabulary file `path` is the one the shards were built with (same hash)."""
    tok = Tokenizer(str(path))
    if tok.vocab_hash != manifest["vocab_hash"]:
        raise DataError(f"the shards were built with vocab {manifest['vocab_hash'][:12]}… but {what} is "
                        f"{tok.vocab_hash[:12]}…: token ids would mean other tokens; {fix}")


# the fields that decide the weights' shapes and what they compute: a resumed run must keep them
_ARCHITECTURE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size", "hidden_act", "position_embedding_type", "model_type",
                 "embedding_size", "num_hidden_groups", "relative_attention_num_buckets", "rope_parameters")


def _check_resume_model(pc: PretrainConfig, config, out: Path) -> None:
    """With resume, the checkpoint's config.json against the model asked for, before any weight is loaded."""
    resume = pc.train.resume
    ckpt = latest_checkpoint(out) if resume is True else Path(resume) if resume else None
    # none or unreadable: nothing to compare (resume itself names an unreadable checkpoint)
    saved = peek_json_config(ckpt / "config.json") if ckpt is not None else {}
    ours = config.to_dict()
    differ = [k for k in _ARCHITECTURE if k in saved and k in ours and saved[k] != ours[k]]
    if not differ:
        return
    asked = (f"--init {pc.init}" + (f" with --config {pc.config}" if pc.config else "") if pc.init
             else f"--preset {pc.preset}" if pc.preset else f"--config {pc.config}")
    raise ConfigError(f"{out} was trained with {', '.join(f'{k} {saved[k]}' for k in differ)}; {asked} has "
                      f"{', '.join(f'{k} {ours[k]}' for k in differ)}: resume with the run's model settings "
                      f"({out / 'pretrain_config.json'}) or start a new run in another --out")


def _divergence(model, result, data, d, fsdp: bool) -> str | None:
    """Where training diverged when the trained model is broken (NaN/inf weights, or a NaN/inf loss on a training
    batch), else None: one finite step with a huge update can break the weights, and every later step is skipped."""
    with torch.no_grad():
        finite = all(bool(torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all())  # FSDP: its shard
                     for p in model.parameters())
        bad = 0.0 if finite else 1.0
        # finite weights can still be absurd (a huge lr): one forward tells. FSDP: every rank runs it (collectives)
        # a reader that stopped at its epoch's end starts the next one on a second iter()
        batch = (next(iter(data), None) or next(iter(data), None)) if (not bad or fsdp) else None
        if batch is not None:
            model.eval()
            try:
                loss = float(pretraining_step(model, to_device(batch, d.device)).loss)
            finally:
                model.train()
            bad = max(bad, 0.0 if math.isfinite(loss) else 1.0)
    if d.world > 1:          # batches (and FSDP shards) differ per rank: every rank must take the same decision
        bad = float(d.all_reduce_sum(torch.tensor(bad, dtype=torch.float64)))
    if not bad:
        return None
    losses = result.losses
    k = len(losses)
    while k > 0 and not math.isfinite(losses[k - 1]):
        k -= 1
    # the update of the last step with a finite loss broke the weights; every step after it was skipped
    step = result.start_step + k
    if step <= result.start_step:
        return f"before step {result.start_step + 1} (the checkpoint resumed from was already broken)"
    return f"at step {step} (its update broke the weights" + ("; every later step was skipped)" if k < len(losses)
                                                             else ")")


def _check_vocab(config, vocab_size: int, where) -> None:
    if config.vocab_size != vocab_size:
        raise DataError(f"the shards hold ids of a {vocab_size}-token vocab, the model ({where}) has "
                        f"vocab_size={config.vocab_size}")


def pretrain(pc: PretrainConfig, callbacks=()):
    """Check everything, build the model and readers, train, save `out/model`. Returns the TrainResult.
    `callbacks`: bertkit.train.callbacks.Callback objects for the loop."""
    out = Path(pc.out)
    _check_settings(pc)
    check_writable(out)
    manifests = _manifests(pc)
    if pc.vocab:         # saved with the model at the end: a wrong one would only fail then, after the training
        _check_vocab_file(pc.vocab, manifests["shards"], f"--vocab {pc.vocab}", "leave --vocab out (the shards' "
                          "own vocab.txt is saved with the model) or rebuild the shards with it")
    objective = _objective(pc, manifests["shards"]["task"])
    d = Dist.setup(pc.train.device)
    if not (pc.train.resume or pc.train.overwrite):     # an earlier run is refused before a file of it is replaced
        Checkpoints(out, pc.train, d).check_fresh()
    pc, plan = _start_plan(pc, manifests["shards"], objective)
    cfg = _train_config(pc, d.world)
    seed_everything(cfg.seed)
    model, config = build_model(pc, manifests, objective)
    if pc.attention_init == "local" and (unfit := unfit_for(config)):
        raise ConfigError(f"--attention-init local: {unfit}; use --attention-init random")
    if pc.train.resume:
        _check_resume_model(pc, config, out)
    model.masked_logits_only = True          # the loss and accuracy read the masked rows: project only those
    if pc.attention_init == "local" and not pc.init and objective != "electra":
        local_attention_init(model, seed=cfg.seed)
    for name, m in manifests.items():
        if int(m["seq_len"]) > config.max_input_length:
            hint = "; --rope-theta extends a rotary model to it" if family(config.model_type).rotary else ""
            raise ConfigError(f"{getattr(pc, name)} has seq_len {m['seq_len']} > the model's longest input, "
                              f"{config.max_input_length} (max_position_embeddings={config.max_position_embeddings})"
                              + hint)
    data = _reader(pc, pc.shards, config, objective, rank=d.rank, world_size=d.world)
    # a head bias that came from a checkpoint is kept; every rank sets it alike (the weights must start equal)
    fresh_head = not pc.init or "cls.predictions.bias" in (getattr(model, "loading_info", None) or {}).get(
        "missing_keys", ())
    if pc.unigram_bias and fresh_head:
        unigram_bias_init(model, data)
    phase2 = (_reader(pc, pc.phase2_shards, config, objective, rank=d.rank, world_size=d.world)
              if pc.phase2_shards else None)
    readers = [r for r in (data, phase2) if r is not None]
    if pc.output_vocab == "corpus" and objective != "electra":
        n = _restrict_output_vocab(model, readers)
        if d.main:
            say(f"bertkit pretrain: the MLM softmax in training scores the {n:,} ids the training shards hold (of "
                f"{config.vocab_size:,}); evaluation scores them all")
    if plan is not None and plan.steps is None:          # the steps the budget affords at this shape, measured
        times = d.broadcast_object(probe_times(model, data, cfg, d.device))
        pc, plan = _plan(pc, manifests["shards"], None if pc.preset else config, times)
        cfg = dataclasses.replace(pc.train, grad_accum=cfg.grad_accum)
        cfg.validate()
    batches = data if phase2 is None else [Phase(data, pc.phase1_fraction, "phase1"),
                                           Phase(phase2, 1 - pc.phase1_fraction, "phase2")]
    eval_fn = None
    if pc.eval_shards:
        held_out = _reader(pc, pc.eval_shards, config, objective, shuffle=False, masked=False)
        eval_fn = pretraining_eval(held_out, max_batches=pc.eval_batches)
    if d.main:
        log.info("pre-training %s (%s, %.1fM parameters) on %s: objective %s, global batch %d (%d x %d x %d)",
                 pc.preset or pc.config or pc.init, type(model).__name__, model.num_parameters() / 1e6, pc.shards,
                 objective, pc.batch_size * cfg.grad_accum * d.world, pc.batch_size, cfg.grad_accum, d.world)
    if pc.mask_prob_end is not None:
        masks = [r.masking for r in readers]
        callbacks = (*callbacks, MaskRateSchedule(masks, masks[0].mask_prob, pc.mask_prob_end))
    result = train(model, batches, cfg, out, eval_fn=eval_fn, step_fn=pretraining_step,
                   on_start=_starter(pc, plan, cfg, out, d), callbacks=callbacks)
    if result.steps > result.start_step or not (out / "model" / "config.json").is_file():
        _finish(model, result, data, d, pc, plan, out, objective)
    return result


def _starter(pc: PretrainConfig, plan, cfg, out: Path, d) -> Callable:
    """train()'s on_start: the run's own files are written only once the resume was accepted, so a refused one
    leaves them as they were. A run resumed at (or past) its end trains nothing; it still writes a missing model/."""
    def on_start(state) -> bool:
        stop = why_stopped(cfg, state)
        if stop is None:
            if d.main:
                _write_start(pc, plan, out)
            return True
        if d.main:
            end = (f">= --steps {state.total}" if stop == "max_steps" else "its --budget is spent"
                   if stop == "budget" else f">= the {state.total} steps of its --epochs")
            then = ("the run is left as it was" if (out / "model" / "config.json").is_file()
                    else f"writing the missing {out / 'model'}")
            say(f"bertkit pretrain: {out} is already at step {state.step} ({end}): nothing trained, {then}")
        return False
    return on_start


def _finish(model, result, data, d, pc: PretrainConfig, plan, out: Path, objective: str) -> None:
    """After training: refuse to save a model training broke, else write model/ and the summary."""
    where = _divergence(model, result, data, d, pc.train.fsdp)
    if where is not None:
        raise TrainingDiverged(f"training diverged {where}: the model gives NaN/inf, so {out / 'model'} "
                               f"was not written (checkpoints kept as they are); try a lower --lr than "
                               f"{pc.train.lr:g}, more --warmup, or --precision fp32")
    if d.main:
        _save_final(model, result, pc, out)
        write_summary(out, result, plan, pc.eval_shards or pc.shards, objective)


def _check_settings(pc: PretrainConfig) -> None:
    t = pc.train
    if t.budget_s is None and t.max_steps is None and t.epochs is None:
        raise ConfigError("give the run's length: --steps N, --epochs E or --budget 10m")
    if not 0 < pc.phase1_fraction < 1 and pc.phase2_shards:
        raise ConfigError(f"phase1_fraction must be in (0, 1), got {pc.phase1_fraction}")
    if pc.batch_size < 1 or pc.eval_batches < 0:
        raise ConfigError(f"batch_size must be >= 1 and eval_batches >= 0, got {pc.batch_size} and {pc.eval_batches}")
    for flag, value, choices in (("--attention-init", pc.attention_init, ("random", "local")),
                                 ("--output-vocab", pc.output_vocab, ("full", "corpus")),
                                 ("--masking", pc.masking, ("shards", *MASK_MODES)),
                                 ("--objective", pc.objective, OBJECTIVES)):
        if value not in choices:
            raise ConfigError(f"{flag} {value}: choose one of {', '.join(choices)}")
    if pc.attention_init == "local" and pc.init:
        raise ConfigError(f"--attention-init local initialises a fresh model; --init {pc.init} starts from trained "
                          "weights (drop one of them)")
    for flag, v in (("--mask-prob", pc.mask_prob), ("--mask-prob-end", pc.mask_prob_end)):
        if v is not None and not 0 < v < 1:
            raise ConfigError(f"{flag} {v}: a share of the tokens, in (0, 1)")
    if pc.average_last > 1 and not (t.save_every_steps or t.save_every_minutes) or pc.average_last > t.keep_last:
        raise ConfigError(f"--average-last {pc.average_last} averages the last checkpoints: give --save-every or "
                          f"--save-minutes, and --keep >= {pc.average_last} (now {t.keep_last})")


def _train_config(pc: PretrainConfig, world: int):
    """pc.train with the accumulation the batch arithmetic gives, checked (before the model is built)."""
    per_step = pc.batch_size * world
    global_batch = pc.global_batch or per_step * pc.train.grad_accum
    if global_batch % per_step:
        raise ConfigError(f"global batch {global_batch} is not a multiple of batch_size {pc.batch_size} x "
                          f"{world} processes")
    cfg = dataclasses.replace(pc.train, grad_accum=global_batch // per_step)
    cfg.validate()
    return cfg


def _start_plan(pc: PretrainConfig, manifest: dict, objective: str):
    """(pc, plan): with a budget from scratch, the plan's settings that need no step time (resumed: plan.json)."""
    t = pc.train
    if pc.set_fields is None or t.budget_s is None:
        return pc, None
    if pc.init or objective == "electra":
        why = "--init continues pre-training" if pc.init else "the plan was measured on MLM"
        say(f"bertkit pretrain: no plan for the budget ({why}): the flags' settings or their defaults")
        return pc, None
    plan = load_plan(Path(pc.out)) if t.resume else None
    if plan is None:
        return _plan(pc, manifest, BertConfig.from_json(pc.config) if pc.config and not pc.preset else None)
    say(f"bertkit pretrain: resuming with the plan in {Path(pc.out) / 'plan.json'}")
    return apply_plan(pc, plan), plan


def _plan(pc: PretrainConfig, manifest: dict, model: BertConfig | None, times=(None, None)):
    """(pc with the plan's settings, the plan), given the measured (s per step, s per evaluation batch) or None."""
    heldout = int(read_manifest(pc.eval_shards)["counts"]["examples"]) if pc.eval_shards else 0
    plan = plan_recipe(pc.train.budget_s, pc.preset, times[0], manifest, given_settings(pc), heldout,
                       eval_batch_s=times[1], model=model)
    return apply_plan(pc, plan), plan


def _write_start(pc: PretrainConfig, plan, out: Path) -> None:
    """pretrain_config.json, and the plan: printed (stderr) and written to plan.json."""
    write_text(out / "pretrain_config.json", json.dumps(dataclasses.asdict(pc), indent=1, default=str))
    for stale in ("summary.json", "summary.md"):
        (out / stale).unlink(missing_ok=True)
    if plan is not None:
        say(plan.block())
        write_json(out / "plan.json", plan.to_dict(), indent=1)


def _reader(pc: PretrainConfig, path: str, config, objective: str, masked: bool = True, **kw):
    """A ShardReader of `path` for the model (the training rows re-masked as pc.masking / mask_prob ask)."""
    masking = _masking(pc, path) if masked else None
    r = ShardReader(path, pc.batch_size, seed=pc.train.seed, vocab_size=config.vocab_size, verify=pc.verify,
                    masking=masking, sentence_labels=objective not in ("mlm", "electra"), **kw)
    return PackedReader(r) if pc.packing and masked else r


def _masking(pc: PretrainConfig, path: str):
    """The masks to draw at batch time instead of the shards' own, or None to keep theirs."""
    if pc.masking == "shards" and pc.mask_prob is None and pc.mask_prob_end is None:
        return None
    stored = read_manifest(path)["masking"]
    return MaskingConfig(mode=stored["mode"] if pc.masking == "shards" else pc.masking,
                         mask_prob=stored["mask_prob"] if pc.mask_prob is None else pc.mask_prob,
                         mask_token_prob=stored["mask_token_prob"], random_token_prob=stored["random_token_prob"],
                         max_ngram=stored["max_ngram"], dynamic=True)


def _averaged_weights(out: Path, k: int) -> dict:
    """The mean of the model weights of the newest `k` checkpoints in out/checkpoints (in fp32, cast back)."""
    done = complete_checkpoints(out / CHECKPOINT_DIR)[-k:]
    if len(done) < k:
        say(f"bertkit pretrain: --average-last {k}: the run has {len(done)} checkpoints, averaging those")
    total, last = {}, {}
    for p in done:                  # a running sum: one checkpoint in memory at a time
        last = load_model_weights(p / "model.safetensors")
        for name, t in last.items():
            if t.is_floating_point():
                total[name] = total[name] + t.float() if name in total else t.float()
    return {name: (total[name] / len(done)).to(t.dtype) if t.is_floating_point() else t for name, t in last.items()}


def _save_final(model, result, pc: PretrainConfig, out: Path) -> None:
    """out/model: the trained weights as an HF-format directory with the tokenizer (FSDP: from the checkpoint)."""
    if pc.train.fsdp and result.checkpoint is not None:   # the trained model is sharded: rebuild it whole on rank 0
        model = type(model)(model.config)
        model.load_state_dict(load_model_weights(result.checkpoint / "model.safetensors"))
    if pc.average_last > 1:
        model.load_state_dict(_averaged_weights(out, pc.average_last))
    vocab = pc.vocab or str(Path(pc.shards) / "vocab.txt")
    try:
        lowercase = bool(read_manifest(pc.shards).get("lowercase", True))
        tok = Tokenizer(vocab, lowercase=lowercase)
    except Exception as e:  # the model is still worth saving
        log.warning("no tokenizer saved with the model: %s", e)
        tok = None
    model.save_pretrained(out / "model", tokenizer=tok)
