"""The one training loop: pre-training and fine-tuning, one process or many, crash-safe.

    loop.py           train(), read top to bottom: accumulation, bf16 autocast, clipping, schedule, budget,
                      phases, NaN skipping, evaluation; TrainConfig and the step functions
    checkpointing.py  atomic checkpoints (temp directory, fsync, rename) and exact resume
    distributed.py    the process group, DDP / FSDP wrapping, full state dicts
    stream.py         the data across epochs and phases, with a resumable position
    monitor.py        metrics JSONL / progress bar / curves.png, FLOP/s and MFU
    callbacks.py      the loop's callback events; TensorBoard, W&B and MLflow loggers
    pretrain.py       pretrain(): `bertkit pretrain` as a library call: shards -> model (preset / config / checkpoint,
                      MLM+NSP, MLM+SOP, MLM, ELECTRA) -> train() -> an HF-format model directory
    recipe.py         plan_recipe(): what `--budget` from scratch means, every setting the user did not give, each
                      with its reason (printed, OUT/plan.json); probe_times() for the steps a budget affords
    summary.py        OUT/summary.json / summary.md: held-out MLM accuracy and a fill-mask sample of held-out rows
    compact.py        compact_word_embeddings(): fine-tuning trains only the word-embedding rows its data uses
                      (exact for AdamW; the fine-tuning runner's default)
    ../optim.py       AdamW / LAMB param groups, warmup + linear / cosine schedules

Public API (stable; the fine-tuning tasks code against it)
---------------------------------------------------------

    from bertkit.train import TrainConfig, train, Phase, StepOutput, TrainResult, pretraining_step

    cfg = TrainConfig(max_steps=1000, lr=1e-4, warmup=0.01, grad_accum=4, save_every_steps=200)
    result = train(model, batches, cfg, "runs/x", eval_fn=None, step_fn=None)
    result.losses            # one float per optimizer step (mean over the global batch)

* `model`: an `nn.Module`. By default a step calls `model(**batch)` and uses `.loss` of what it returns. Give
  `step_fn(model, batch) -> StepOutput(loss, metrics)` to compute the loss (and summable metrics such as
  accuracies, as (sum, count) pairs) yourself; `pretraining_step` is the one for BertForPreTraining / ELECTRA
  (MLM accuracy, NSP/SOP accuracy, replaced-token-detection accuracy).
* `batches`: an iterable of dict batches of CPU tensors (moved to the device by the loop), e.g. the shard reader or
  a DataLoader. When it runs out a new epoch begins (`iter()` again, after `set_epoch(epoch)` if it has one). If it
  has `state_dict()` / `load_state_dict()` the data position is checkpointed through them (exact resume); otherwise
  resume re-iterates the current epoch and skips the micro-batches already consumed. Each rank passes its own
  part of the data (the loop does not shard). `batches` may also be a list of `Phase(batches, fraction)`: the
  phases follow each other over the run (BERT: seq 128 for 0.9 of the steps, then seq 512 for 0.1) under one
  learning-rate schedule.
* `eval_fn(model) -> dict[str, float]`: held-out evaluation, called every `cfg.eval_every_steps` steps and at the
  end with the unwrapped model in eval mode, under no_grad and the training autocast. Called on every rank. A true
  `"stop"` entry in the dict (not logged) ends the run there (early stopping; `result.stop_reason == "early_stop"`).
* `on_start(state) -> bool | None` (optional): called on every rank after the resume (or the fresh start) was
  accepted and before anything is logged, for the caller's own files; returning False ends the call untrained.
* `callbacks=[...]` (optional): bertkit.train.callbacks.Callback objects, their events named as transformers'
  TrainerCallback's (on_train_begin, on_step_end, on_evaluate, on_save, on_train_end); one with state_dict() /
  load_state_dict() has its state saved in each checkpoint and handed back on resume. W&B / MLflow loggers there.
* `out_dir` gets:
      metrics.jsonl                one JSON object per logged step ({"split": "train", "step", "loss", "lr", ...})
                                   and per evaluation ({"split": "eval", "step", ...})
      curves.png                   loss and accuracy curves (matplotlib, written at each eval and at the end)
      tb/                          TensorBoard events (a callback), when tensorboard is installed and cfg.tensorboard
      checkpoints/step-00001000/   model.safetensors (+ config.json when the model has a BertConfig),
                                   optimizer.pt, state.json, rank-00000.pt (RNG + data position per rank)
  A checkpoint directory is written under a temp name and renamed when complete; only the last `keep_last` stay.
  `cfg.resume=True` continues from the newest complete checkpoint in out_dir (or `resume="path/to/step-..."`):
  model, optimiser, schedule position, RNG states (python, numpy, torch) and data position, so the losses continue
  exactly as if the run had never stopped.
* Distributed: under `torchrun` (WORLD_SIZE > 1) the loop joins the process group (nccl on CUDA, gloo on CPU) and
  wraps the model in DDP, or FSDP with `cfg.fsdp`. The global batch is micro-batch x grad_accum x world_size; the
  reported loss is the mean over all of it, so 1 process x 2 accumulation steps and 2 processes x 1 give the same
  numbers.
* A step whose loss or gradient norm is NaN/inf changes no weight (skipped, counted in `result.skipped_steps`);
  `cfg.max_bad_steps` of them in a row raise `TrainingDiverged` with the step numbers, before any checkpoint of
  the bad state is written.
* Ctrl-C (SIGINT) during the steps of a run that writes checkpoints: the step in progress finishes, a checkpoint
  is written at that step like a periodic one (so resume continues from it exactly), one line on stderr names it,
  and KeyboardInterrupt propagates. A second Ctrl-C stops at once. Under torchrun the ranks learn of it through the
  step's all-reduce, so all stop at the same step. Ctrl-C during the last step lets the run finish; outside the
  steps, in a run that writes no checkpoint (fine-tuning) or in train() outside the main thread it is Python's
  KeyboardInterrupt at once.
* Length: `cfg.max_steps` optimizer steps, or `cfg.epochs` passes over a sized `batches`, or a wall-clock
  `cfg.budget_s`: the schedule's total is re-estimated each step from the measured time per step (as cramming
  does), so warmup and decay fit the time; with phases, their fractions are shares of the budget.

Multi-node launch (torch.distributed rendezvous)
------------------------------------------------
Every node runs the same command; torchrun's c10d rendezvous joins them (one node's address is the endpoint):

    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=node0.example:29500 \
             --rdzv_id=bert-run-1 -m bertkit pretrain shards128/ --phase2 shards512/ --preset base --out run/ ...

The global batch is --batch-size x accumulation x (nnodes x nproc_per_node); give --global-batch and the
accumulation is derived. Each rank reads every world_size-th example of each epoch's permutation, so no rank
sees another's data. --out must be a directory every node can write (a shared filesystem): rank 0 writes the
weights and optimizer state, every rank its own RNG + data position, and --resume needs them all. NCCL picks
the network itself; set NCCL_SOCKET_IFNAME if the nodes have several interfaces.
"""

import sys
import types

from bertkit.train.loop import (TrainConfig, TrainResult, Phase, TrainingDiverged, train, seed_everything,
                                distributed_context, latest_checkpoint, load_model_weights, save_model_weights,
                                estimate_flops_per_token, peak_flops, parse_duration)
from bertkit.train.steps import StepOutput, default_step, pretraining_step, pretraining_eval

__all__ = ["TrainConfig", "TrainResult", "StepOutput", "Phase", "TrainingDiverged", "train", "default_step",
           "pretraining_step", "pretraining_eval", "seed_everything", "distributed_context", "latest_checkpoint",
           "load_model_weights", "save_model_weights", "estimate_flops_per_token", "peak_flops", "parse_duration",
           "pretrain", "PretrainConfig"]


def __getattr__(name):
    if name in ("pretrain", "PretrainConfig"):
        # deferred: the pre-training driver (shards, heads) loads only when asked for
        from bertkit.train import pretrain as _p
        return getattr(_p, name)
    raise AttributeError(f"module 'bertkit.train' has no attribute {name!r}")


class _CallablePackage(types.ModuleType):
    """`bertkit.train(model, batches, cfg, out)` is train(): the package and the function share that name, so the
    package answers the call rather than hiding (or being hidden by) the function."""

    def __call__(self, *args, **kwargs):
        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
