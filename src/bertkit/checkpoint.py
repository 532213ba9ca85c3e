"""HF-format checkpoint directories, both directions, loaded safely.

A directory holds `config.json` and the weights: `model.safetensors` (preferred), a sharded
`model.safetensors.index.json`, or `pytorch_model.bin` (read with `torch.load(weights_only=True)`: no arbitrary
unpickling). Loading maps the names that real BERT checkpoints use onto our modules (which already carry HF names):

  * `bert.` prefix present or absent: a bare BertModel checkpoint loads into a head model and vice versa;
  * old `LayerNorm.gamma` / `LayerNorm.beta` (TF-converted checkpoints) -> `.weight` / `.bias`;
  * `cls.predictions.decoder.weight` is the tied word-embedding matrix (dropped); `decoder.bias` is
    `cls.predictions.bias` (renamed when only the former exists); `*.position_ids` buffers are dropped.

Then the keys are checked against the model, never silently half-loaded:
  * a shape that does not fit -> CheckpointError naming the key and both shapes;
  * keys the model does not have: other heads' weights (`cls.*`, `classifier.*`, `qa_outputs.*`, a pooler the
    model lacks) are ignored and listed; anything else (an extra layer, a foreign model) -> CheckpointError;
  * missing keys: head weights (pooler, cls, classifier, qa_outputs) are newly initialised, logged as a warning
    and listed in `model.loading_info["missing_keys"]`; a missing encoder weight -> CheckpointError.

`path` may also be a Hugging Face repo id ("org/name"), found in the local Hugging Face cache or downloaded
(`bertkit.hub.resolve_model_dir`; a local path always wins). `dtype` (also spelt `torch_dtype` in from_pretrained)
takes a torch.dtype, a name ("bfloat16") or "auto": the config's `torch_dtype` / `dtype`, else the weights' own.

Saving writes `config.json` and `model.safetensors`, each to a temp name then renamed, plus the tokenizer's files
(`tokenizer.save(dir)`) when one is given. The tied decoder is not duplicated (safetensors cannot alias), exactly as
transformers saves it, so `transformers.BertForPreTraining.from_pretrained(dir)` loads it with nothing missing.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from torch import Tensor

from bertkit.config import BertConfig
from bertkit.errors import CheckpointError, ConfigError

__all__ = ["load_pretrained", "save_pretrained", "load_state_dict_file", "read_weights", "read_config",
           "normalize_keys", "parse_dtype", "WEIGHTS_NAME", "PT_WEIGHTS_NAME", "CONFIG_NAME"]

log = logging.getLogger("bertkit.checkpoint")

WEIGHTS_NAME = "model.safetensors"
SHARDED_INDEX_NAME = "model.safetensors.index.json"
PT_WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "config.json"

# top-level parameter groups that belong to some task head (ignored when the model being loaded lacks them)
_HEAD_ROOTS = ("cls.", "classifier.", "qa_outputs.")


# ---------------------------------------------------------------------------------------------- reading
def load_state_dict_file(path: Path) -> dict[str, Tensor]:
    """One weights file -> {key: tensor} on CPU. Errors name the file."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            return load_file(str(path))
        sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt / truncated / not a checkpoint
        raise CheckpointError(f"cannot read weights file {path}: {type(e).__name__}: {e}") from None
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(v, Tensor) for v in sd.values()):
        raise CheckpointError(f"{path} does not hold a flat state_dict of tensors")
    return sd


def read_weights(directory: Path) -> tuple[dict[str, Tensor], Path]:
    """The raw state_dict of an HF directory (safetensors, sharded safetensors, or pytorch_model.bin)."""
    single = directory / WEIGHTS_NAME
    if single.is_file():
        return load_state_dict_file(single), single
    index = directory / SHARDED_INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: malformed shard index ({e})") from None
        sd: dict[str, Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            sd.update(load_state_dict_file(directory / shard))
        return sd, index
    pt = directory / PT_WEIGHTS_NAME
    if pt.is_file():
        return load_state_dict_file(pt), pt
    raise CheckpointError(f"no weights in {directory}: expected {WEIGHTS_NAME}, {SHARDED_INDEX_NAME} or "
                          f"{PT_WEIGHTS_NAME}")


def normalize_keys(sd: dict[str, Tensor], prefixed: bool) -> dict[str, Tensor]:
    """Rename checkpoint keys onto our (HF) names for a model with (`prefixed`) or without a `bert.` prefix."""
    out: dict[str, Tensor] = {}
    has_prefix = any(k.startswith("bert.") for k in sd)
    for key, value in sd.items():
        if key.endswith("LayerNorm.gamma"):
            key = key[: -len("gamma")] + "weight"
        elif key.endswith("LayerNorm.beta"):
            key = key[: -len("beta")] + "bias"
        if key.endswith("position_ids"):
            continue  # a buffer (arange) in old checkpoints, not a weight
        if key == "cls.predictions.decoder.weight":
            continue  # tied to bert.embeddings.word_embeddings.weight
        if key == "cls.predictions.decoder.bias":
            if "cls.predictions.bias" in sd:
                continue
            key = "cls.predictions.bias"
        if prefixed and not has_prefix and not key.startswith(_HEAD_ROOTS):
            key = "bert." + key
        elif not prefixed and key.startswith("bert."):
            key = key[len("bert."):]
        out[key] = value
    return out


def _is_head_key(key: str, head_prefixes: tuple[str, ...]) -> bool:
    return key.startswith(_HEAD_ROOTS) or key.startswith(head_prefixes) or ".pooler." in f".{key}"


# ---------------------------------------------------------------------------------------------- load
_DTYPES = {"float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
           "float64": torch.float64, "double": torch.float64}


def parse_dtype(value, where: str = "dtype") -> torch.dtype | str | None:
    """None, a torch.dtype, "auto", or a name ("bfloat16", "torch.float16", "fp32", ...) -> torch.dtype / "auto"."""
    if value is None or isinstance(value, torch.dtype) or value == "auto":
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
        return _DTYPES[value.removeprefix("torch.")]
    raise ConfigError(f"{where}={value!r} is not a dtype: use a torch.dtype, 'auto' or one of {sorted(_DTYPES)}")


def _auto_dtype(config: BertConfig, sd: dict[str, Tensor], cfg_path: Path) -> torch.dtype:
    """dtype="auto": the config's `torch_dtype` / `dtype` (as transformers writes it), else the weights' own."""
    for key in ("dtype", "torch_dtype"):
        if config.extra.get(key) is not None:
            return parse_dtype(config.extra[key], f"{cfg_path}: {key}")
    floats = [v.dtype for v in sd.values() if v.is_floating_point()]
    return floats[0] if floats else torch.float32


def read_config(directory: Path, overrides: dict) -> BertConfig:
    """`directory`/config.json with `overrides` (BertConfig fields) applied; errors name the file or the field."""
    cfg_path = directory / CONFIG_NAME
    if not cfg_path.is_file():
        raise CheckpointError(f"no {CONFIG_NAME} in {directory}")
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{cfg_path}: expected a JSON object, got {type(raw).__name__}")
    field_names = set(BertConfig.__dataclass_fields__)
    for key in overrides:
        if key not in field_names:
            raise ConfigError(f"from_pretrained got {key}=..., which is not a BertConfig field")
    try:
        return BertConfig.from_dict({**raw, **overrides})
    except ConfigError as e:
        raise ConfigError(f"{cfg_path}: {e}") from None


def load_pretrained(cls, path, *, dtype=None, device=None, ignore_mismatched_sizes: bool = False,
                    revision: str | None = None, **config_overrides):
    """Build `cls` from the config in `path` (+ overrides) and load its weights (see module docstring). `path` is a
    directory or a Hugging Face repo id (see bertkit.hub); `dtype` a torch.dtype, a name ("bfloat16") or "auto"."""
    from bertkit.hub import resolve_model_dir
    dtype = parse_dtype(dtype)
    directory = resolve_model_dir(path, revision=revision)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    config = read_config(directory, config_overrides)
    sd, source = read_weights(directory)
    model = cls(config)
    if "quantization_config" in config.extra:          # int8 layers first: the file holds their int8 weights
        from bertkit.runtime import int8
        model, sd = int8.prepare(model, config), int8.from_storage(sd)
    _load_into(model, sd, source, ignore_mismatched_sizes)
    if dtype == "auto":
        dtype = _auto_dtype(config, sd, directory / CONFIG_NAME)
    if dtype is not None or device is not None:
        model.to(device=device, dtype=dtype)
    model.eval()  # like HF: loaded models start in inference mode; call .train() to fine-tune
    return model


def _load_into(model, sd: dict[str, Tensor], source: Path, ignore_mismatched_sizes: bool) -> None:
    """Check the checkpoint's keys against `model` (see the module docstring), load them, fill loading_info."""
    cls = type(model)
    own = model.state_dict()
    prefixed = any(k.startswith("bert.") for k in own)
    sd = normalize_keys(sd, prefixed)
    head_prefixes = getattr(cls, "_head_prefixes", ())

    ignored = sorted(k for k in sd if k not in own and _is_head_key(k, head_prefixes))
    unexpected = sorted(k for k in sd if k not in own and k not in ignored)
    if unexpected:
        raise CheckpointError(f"{source}: {len(unexpected)} key(s) do not fit {cls.__name__} with this config, "
                              f"e.g. {unexpected[:5]}")
    mismatched = []
    for key, value in sorted(sd.items()):
        if key in own and tuple(value.shape) != tuple(own[key].shape):
            if ignore_mismatched_sizes and _is_head_key(key, head_prefixes):
                mismatched.append(key)
                continue
            raise CheckpointError(f"{source}: key {key!r} has shape {tuple(value.shape)} in the checkpoint but "
                                  f"{tuple(own[key].shape)} in the model (config {source.parent / CONFIG_NAME})")
    for key in mismatched:
        del sd[key]
    missing = sorted(k for k in own if k not in sd)
    not_head = [k for k in missing if not _is_head_key(k, head_prefixes)]
    if not_head:
        raise CheckpointError(f"{source}: {len(not_head)} weight(s) of {cls.__name__} are missing from the "
                              f"checkpoint, e.g. {not_head[:5]}")
    for key in ignored:
        del sd[key]
    model.load_state_dict(sd, strict=False)
    model.loading_info = {"missing_keys": missing, "unexpected_keys": [], "ignored_keys": ignored,
                          "mismatched_keys": mismatched}
    if missing:
        log.warning("%s: newly initialised (not in %s): %s", cls.__name__, source, ", ".join(missing))
    if ignored:
        log.info("%s: ignored checkpoint weights of other heads: %s", cls.__name__, ", ".join(ignored))


# ---------------------------------------------------------------------------------------------- save
def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_pretrained(model, path, tokenizer=None) -> None:
    """config.json + model.safetensors (+ the tokenizer's files) into `path`, each written atomically."""
    from safetensors.torch import save_file

    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if "quantization_config" in model.config.extra:
        from bertkit.runtime import int8
        sd = int8.to_storage(sd)
    _atomic_write(directory / WEIGHTS_NAME, lambda p: save_file(sd, str(p), metadata={"format": "pt"}))
    cfg = model.config.to_dict()
    cfg["architectures"] = [type(model).__name__]
    text = json.dumps(cfg, indent=2, sort_keys=True) + "\n"
    _atomic_write(directory / CONFIG_NAME, lambda p: p.write_text(text, encoding="utf-8"))
    if tokenizer is not None:
        tokenizer.save(directory)
