"""`bertkit quantize MODEL OUT`: an int8 copy of a model directory, gated on accuracy.

    quantize_dir(model, out, check=None, max_drop=1.0, keep_float=())
    write(quantize_model(model, check=...), out)     # the same in two steps (the CLI clears an earlier run between)

1. Says whether this CPU's int8 path measured faster than its float paths (runtime.plan's `int8_linear` probe:
   fp32, and bf16 where native): where it did not, the int8 model is written all the same (its size is the gain)
   and the inference commands run its weights in float here (runtime.freeze; bf16 under auto where bf16 won).
2. Quantizes every linear layer of the encoder and heads (runtime.int8), except `keep_float` patterns.
3. With `check` (a labelled dev file of the model's task; the model must come from `bertkit finetune`): scores fp32
   and int8 on it and refuses to write when the drop of the task's main metric exceeds `max_drop` points.
4. Writes config.json (with `quantization_config`: method, kept layers, the check's figures and the sizes),
   model.safetensors (int8 weights + scales), the tokenizer files and a sentence-transformers directory's module
   folders (pooling, dense, normalize: as they are, a Dense stays float), into `out` (new or empty; the CLI's
   --overwrite replaces an earlier quantize run there once the new model passed its gate).
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from torch import nn

from bertkit import runtime
from bertkit.atomic import copy_file, write_text
from bertkit.embed.st_format import module_dirs
from bertkit.errors import BertkitError, CheckpointError, ConfigError
from bertkit.predict.load import head_of
from bertkit.runtime import int8
from bertkit.tasks.runner import evaluate_task, load_task
from bertkit.textfiles import shown

__all__ = ["quantize_dir", "quantize_model", "write", "speed_here", "Quantized", "QualityGateError"]

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "config.json")
# what `bertkit finetune` / `distill` wrote about the fp32 model: not true of the int8 one (its check is in config.json)
_RUN_FILES = ("metrics.json", "summary.json", "predictions_*", "confusion_*", ".bertkit-*")   # .bertkit-*: the CLI's
# marker of the fp32 run: copied, it would label the int8 directory another command's run


class QualityGateError(BertkitError):
    """int8 scored more than the allowed drop below fp32 on the dev file."""


def _load(model_dir: Path):
    model_class, _ = head_of(model_dir)
    model = model_class.from_pretrained(str(model_dir))
    if "quantization_config" in model.config.extra:
        raise ConfigError(f"{model_dir}: already quantized (config.json has a quantization_config)")
    return model


def _check_out(model_dir: Path, out: Path, overwrite: bool) -> None:
    if out.resolve() == model_dir.resolve():
        raise ConfigError(f"OUT {out} is the input model directory: write the int8 model elsewhere")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ConfigError(f"OUT {out} exists and is not empty: choose a new directory or pass --overwrite")


# reported beside the main metric: SQuAD's EM with its F1, entity precision / recall with their F1
_ALSO = {"qa": ("exact",), "tag": ("precision", "recall")}


def _score(task, model, examples, feats, precision: str) -> dict[str, float]:
    """The task's main metric and its `_ALSO` companions, in points."""
    report, _ = evaluate_task(task, runtime.freeze(model), examples, feats, 128, precision)
    scale = 1.0 if task.kind == "qa" else 100.0                     # points: QA reports percent already
    return {k: scale * float(report[k]) for k in (task.main_metric, *_ALSO.get(task.kind, ()))}


def gate(model_dir: Path, fp32, quantized, dev_file, max_drop: float, precision: str) -> dict:
    """fp32 and int8 scores on `dev_file` in points of the task's main metric; raises QualityGateError (naming
    both) when int8 is more than `max_drop` points below."""
    task, _, tok = load_task(model_dir)
    examples = task.read(dev_file)
    feats = task.features(tok, examples)
    fp_all = _score(task, fp32, examples, feats, precision)
    q_all = _score(task, copy.deepcopy(quantized), examples, feats, precision)
    fp, q = fp_all.pop(task.main_metric), q_all.pop(task.main_metric)
    figures = {"dev_file": shown(dev_file), "metric": task.main_metric, "fp32": round(fp, 3), "int8": round(q, 3),
               "drop_points": round(fp - q, 3), "max_drop": max_drop, "precision": precision, "n": len(examples),
               "also": {k: {"fp32": round(v, 3), "int8": round(q_all[k], 3)} for k, v in fp_all.items()}}
    if fp - q > max_drop:
        raise QualityGateError(f"{dev_file}: int8 {task.main_metric} {q:.2f} is {fp - q:.2f} points below fp32 "
                               f"{fp:.2f} (--max-drop {max_drop:g}): nothing written; try --keep-float for the "
                               f"last layers or the head")
    return figures


def speed_here(width: int) -> dict:
    """Whether the int8 kernel runs on this CPU against its float paths for a model of hidden size `width`, with
    the probe's figures, in one line."""
    plan = runtime.plan("cpu")
    why = f"int8_linear: {plan.reasons.get('int8_linear', plan.reasons.get('all', ''))}"
    bf16_faster, kernel_below = int8.under_bf16_for(width, plan.int8_under_bf16)
    if plan.int8_engine is None:
        line = (f"int8 is not faster than float on this CPU ({why}): predict and serve run this model's weights in "
                f"float here; the directory keeps int8 for its size")
    elif kernel_below == int8.BF16_KERNEL_ALWAYS:
        line = f"int8 runs here, under auto or bf16 on bf16 activations at width {width} ({why})"
    elif bf16_faster:
        short = f" (int8 GEMMs on bf16 activations under {kernel_below} tokens)" if kernel_below else ""
        line = (f"int8 beats fp32 but not bf16 on this CPU at width {width} ({why}): at --precision fp32 (the "
                f"inference default) predict and serve run int8, under auto or bf16 this model's weights in "
                f"bf16{short}")
    else:
        line = f"int8 runs here ({why})"
    return {"int8_runs": plan.int8_engine is not None, "bf16_faster": bf16_faster, "line": line}


@dataclass
class Quantized:
    """An int8 model in memory (gated where a check file was given), not yet written: what `write` puts in a
    directory. Everything that can be refused has been checked by the time one exists."""
    model_dir: Path                    # the fp32 directory it came from (side files are copied from there)
    model: nn.Module                   # Int8Linear layers, quantization_config (with the check) in its config
    fp32_bytes: int                    # the fp32 weight files' size, for the size ratio
    module_dirs: list[Path]            # sentence-transformers module folders, relative to model_dir
    speed: dict                        # speed_here(width): whether int8 runs on this CPU, with the figures


def quantize_model(model_dir, check=None, max_drop: float = 1.0, keep_float=(), precision: str = "auto",
                   force: bool = False) -> Quantized:
    """Load, quantize and (with `check`) gate the model of `model_dir`; nothing is written. `force` is accepted
    for older callers: int8 is written on every CPU now (where it is slower it runs in float)."""
    model_dir = Path(model_dir)
    fp32 = _load(model_dir)
    size = sum(f.stat().st_size for f in model_dir.iterdir()
               if f.name.endswith(".safetensors") or f.name == "pytorch_model.bin")
    int8.check_keep_float(fp32, keep_float)
    quantized = int8.quantize(copy.deepcopy(fp32), keep_float)
    if check is not None:
        qc = quantized.config.extra["quantization_config"]
        qc["check"] = gate(model_dir, fp32, quantized, check, max_drop, precision)
    return Quantized(model_dir, quantized, size, module_dirs(model_dir),
                     speed_here(quantized.config.hidden_size))


def write(q: Quantized, out) -> dict:
    """The int8 model directory `out`: the weights, config.json with `quantization_config` (sizes included), and
    the fp32 directory's side files and sentence-transformers module folders as they are. Returns the report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in q.model_dir.iterdir():                  # tokenizer and other side files, as they are
        if f.is_file() and f.name not in _WEIGHT_FILES and not any(fnmatch(f.name, p) for p in _RUN_FILES):
            copy_file(f, out / f.name)
    for sub in q.module_dirs:                        # sentence-transformers' pooling / dense / normalize, as they are
        shutil.copytree(q.model_dir / sub, out / sub, dirs_exist_ok=True, copy_function=copy_file)
    q.model.save_pretrained(out)
    qc = q.model.config.extra["quantization_config"]
    size = (out / "model.safetensors").stat().st_size
    qc["size_bytes"] = {"fp32": q.fp32_bytes, "int8": size, "ratio": round(size / max(q.fp32_bytes, 1), 4)}
    cfg_path = out / "config.json"                   # the int8 file's own size is known only once written
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["quantization_config"] = qc
    write_text(cfg_path, json.dumps(cfg, indent=2, sort_keys=True) + "\n", CheckpointError)
    n = sum(type(m) is int8.Int8Linear for m in q.model.modules())
    return {"out": str(out), "int8_layers": n, **qc, "speed_here": q.speed}


def quantize_dir(model_dir, out, check=None, max_drop: float = 1.0, keep_float=(), precision: str = "auto",
                 overwrite: bool = False, force: bool = False) -> dict:
    """The int8 model directory `out` from `model_dir` (see the module docstring); returns what was written."""
    _check_out(Path(model_dir), Path(out), overwrite)
    return write(quantize_model(model_dir, check, max_drop, keep_float, precision, force), out)
