"""The one training loop: pre-training and fine-tuning, one process or many, crash-safe.

    from bertkit.train import TrainConfig, train
    result = train(model, batches, TrainConfig(max_steps=1000, lr=1e-4), "runs/x", eval_fn=None, step_fn=None)

docs/training.md has the contract (batches, eval_fn, step_fn, on_start, callbacks, out_dir, resume, Ctrl-C,
distributed and multi-node runs) and the map of this package.
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
