"""HF-format checkpoint directories, both directions, loaded safely.

A directory holds `config.json` and the weights: `model.safetensors` (preferred), a sharded
`model.safetensors.index.json`, or `pytorch_model.bin` (read with `torch.load(weights_only=True)`: no arbitrary
unpickling). Loading maps the names that real BERT checkpoints use onto our modules (which already carry HF names):

  * another family's names (`roberta.`, `lm_head.`, DistilBERT's `q_lin`, ModernBERT's `layers.`) -> ours, by the
    family's rules (`bertkit.families`; config.json's `model_type` says which); saving writes them back;
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

Saving writes the family's names back, each file atomically; the tied decoder is not duplicated (safetensors cannot
alias), exactly as transformers saves it, so transformers loads the directory with nothing missing.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from pathlib import Path

import torch
import safetensors.torch
from torch import Tensor

from bertkit.atomic import replacing, write_text
from bertkit.config import CONFIG_NAME, BertConfig, read_config
from bertkit.errors import CheckpointError, ConfigError
from bertkit.families import family
from bertkit.hub import resolve_model_dir
from bertkit.runtime import int8

__all__ = ["load_pretrained", "save_pretrained", "load_state_dict_file", "read_weights", "normalize_keys",
           "parse_dtype", "check_finite", "check_vocab_rows", "WEIGHTS_NAME", "PT_WEIGHTS_NAME"]

log = logging.getLogger("bertkit.checkpoint")

WEIGHTS_NAME = "model.safetensors"
SHARDED_INDEX_NAME = "model.safetensors.index.json"
PT_WEIGHTS_NAME = "pytorch_model.bin"

# top-level parameter groups that belong to some task head (ignored when the model being loaded lacks them)
_HEAD_ROOTS = ("cls.", "classifier.", "qa_outputs.", "discriminator_predictions.", "head.", "unused.")
# the first name of a bare encoder's parameters, in any family (DistilBERT's layers are "transformer.", ModernBERT's
# "layers." and "final_norm.", NomicBERT's embedding norm "emb_ln.")
_ENCODER_ROOTS = ("embeddings", "embeddings_project", "encoder", "transformer", "pooler", "layers", "final_norm",
                  "emb_ln")


# ---------------------------------------------------------------------------------------------- reading
ALLOW_NON_FINITE_ENV = "BERTKIT_ALLOW_NON_FINITE"
_TRUE = {"1", "on", "yes", "true"}


def load_state_dict_file(path: Path, allow_non_finite: bool | None = None) -> dict[str, Tensor]:
    """One weights file -> {key: tensor} on CPU. Errors name the file; a tensor with NaN / Inf is refused unless
    allowed (keyword, or BERTKIT_ALLOW_NON_FINITE=1), then loaded with a warning."""
    try:
        if path.suffix == ".safetensors":
            sd = safetensors.torch.load_file(str(path))
        else:
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(_pickle_refusal(path, str(e))) from None
    except Exception as e:  # corrupt / truncated / not a checkpoint
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(f"cannot read weights file {path}: {type(e).__name__}: {first}") from None
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in sd.items()):
        raise CheckpointError(f"{path} does not hold a flat state_dict of tensors")
    if allow_non_finite is None:          # the environment: what `bertkit --allow-non-finite` sets
        allow_non_finite = os.environ.get(ALLOW_NON_FINITE_ENV, "").lower() in _TRUE
    check_finite(sd, path, allow_non_finite)
    return sd


def _pickle_refusal(path: Path, message: str) -> str:
    """torch's multi-line weights_only refusal as one line: what was refused and the safe way forward (a
    safetensors copy made where the file came from; bertkit never suggests unpickling it)."""
    found = re.search(r"GLOBAL ([\w.]+)", message)
    what = f"the Python object {found.group(1)}" if found else "a Python object that is not a tensor"
    return (f"{path}: refused to unpickle {what} (bertkit reads .bin weights with torch.load(weights_only=True), "
            f"which runs no code, and never unpickles more). Ask the model's source for {WEIGHTS_NAME}, or re-save "
            f"it where it was made (transformers: model.save_pretrained(DIR) writes {WEIGHTS_NAME}) and put that "
            f"file at {path.with_name(WEIGHTS_NAME)}")


def check_finite(sd: dict[str, Tensor], source: Path, allow: bool) -> None:
    """CheckpointError naming the file and the first tensor with NaN / Inf; a warning instead when `allow`."""
    for key, value in sd.items():
        if not value.is_floating_point() or bool(torch.isfinite(value).all()):
            continue
        bad = int((~torch.isfinite(value)).sum())
        what = f"{source}: tensor {key!r} holds {bad} non-finite value(s) (NaN/Inf)"
        if not allow:
            raise CheckpointError(f"{what}; the weights are corrupt or from a diverged run. To load them anyway: "
                                  f"from_pretrained(..., allow_non_finite=True), `bertkit --allow-non-finite`, or "
                                  f"{ALLOW_NON_FINITE_ENV}=1")
        log.warning("%s; loaded anyway (non-finite weights allowed): outputs will be NaN", what)


def _shard_files(directory: Path, index: Path) -> list[Path]:
    """The shard files a model.safetensors.index.json names, each confined to `directory`."""
    try:
        weight_map = json.loads(index.read_bytes().decode("utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise CheckpointError(f"{index}: malformed shard index ({type(e).__name__}: {e})") from None
    root = directory.resolve()
    files = []
    for shard in shards:
        if not isinstance(shard, str) or not shard:
            raise CheckpointError(f"{index}: weight_map values must be file names, got {shard!r}")
        file = (directory / shard).resolve()
        if Path(shard).is_absolute() or (file != root and root not in file.parents):
            raise CheckpointError(f"{index}: shard {shard!r} is outside the model directory {directory}: refused")
        files.append(directory / shard)
    return files


def read_weights(directory: Path, allow_non_finite: bool | None = None) -> tuple[dict[str, Tensor], Path]:
    """The raw state_dict of an HF directory (safetensors, sharded safetensors, or pytorch_model.bin)."""
    single = directory / WEIGHTS_NAME
    if single.is_file():
        return load_state_dict_file(single, allow_non_finite), single
    index = directory / SHARDED_INDEX_NAME
    if index.is_file():
        sd: dict[str, Tensor] = {}
        for shard in _shard_files(directory, index):
            sd.update(load_state_dict_file(shard, allow_non_finite))
        return sd, index
    pt = directory / PT_WEIGHTS_NAME
    if pt.is_file():
        return load_state_dict_file(pt, allow_non_finite), pt
    raise CheckpointError(f"no weights in {directory}: expected {WEIGHTS_NAME}, {SHARDED_INDEX_NAME} or "
                          f"{PT_WEIGHTS_NAME}")


def tokenizer_size(directory: Path) -> tuple[int, Path] | None:
    """(entries, file) of the vocab.txt (else tokenizer.json) beside the weights; None when there is none or it
    cannot be read (the tokenizer's own loader reports that)."""
    vocab_txt, tok_json = directory / "vocab.txt", directory / "tokenizer.json"
    try:
        if vocab_txt.is_file():
            return len(vocab_txt.read_bytes().rstrip(b"\n").split(b"\n")), vocab_txt
        if tok_json.is_file():
            spec = json.loads(tok_json.read_bytes())
            vocab = spec["model"]["vocab"]
            # Unigram's is [[piece, score], ...]; tokens added past the model's (DeBERTa-v3's [MASK]) count too
            n = len(vocab) if isinstance(vocab, list) else max(vocab.values(), default=-1) + 1
            n = max([n, *(t["id"] + 1 for t in spec.get("added_tokens") or [])])
            return (n, tok_json) if n else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    return None


def check_vocab_rows(directory: Path, rows: int, weights: Path) -> None:
    """A tokenizer with more entries than the word embedding has rows is refused (its ids would fall outside); one
    with fewer beyond rounding up to a multiple of 128 (padding) gets a warning: probably the wrong vocab."""
    found = tokenizer_size(directory)
    if found is None:
        return
    n, file = found
    what = f"{file} has {n} entries but the word embedding in {weights} has {rows} rows"
    if n > rows:
        raise CheckpointError(f"{what}: the tokenizer does not belong to these weights (restore its vocab, or "
                              f"resize_token_embeddings({n}) and save the model again)")
    if rows > -(-n // 128) * 128:
        log.warning("%s: the tokenizer is probably not the one these weights were trained with", what)


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


def family_keys(sd: dict[str, Tensor], model_type: str, head: str, prefixed: bool) -> dict[str, Tensor]:
    """A family's checkpoint names (`roberta.`, `lm_head.`, DistilBERT's `q_lin`, ...) -> ours for model class `head`
    (see bertkit.families); a bare encoder's names get the family prefix first when `prefixed`. BERT: unchanged."""
    fam = family(model_type)
    if fam.model_type == "bert":
        return sd
    bare = not any(k.startswith(fam.prefix + ".") for k in sd)
    sd = _stack(sd, fam.stacked)
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        if key in fam.tied or key.endswith("position_ids"):
            continue
        if prefixed and bare and key.split(".")[0] in _ENCODER_ROOTS:
            key = f"{fam.prefix}.{key}"
        out[fam.to_ours(key, head)] = value
    return out


def _module(key: str) -> tuple[str, str, str]:
    """"a.b.fc11.weight" -> ("a.b", "fc11", "weight")."""
    path, _, param = key.rpartition(".")
    head, _, module = path.rpartition(".")
    return head, module, param


def _stack(sd: dict[str, Tensor], stacked) -> dict[str, Tensor]:
    """Checkpoint names: the parts of each stacked weight (`Family.stacked`) -> the whole, parts in order along
    dim 0. Parts that are not all there stay as they are (reported unexpected)."""
    out = dict(sd)
    for whole, names in stacked:
        for key in sd:
            head, module, param = _module(key)
            keys = [f"{head}.{name}.{param}" for name in names]
            if module == names[0] and all(k in out for k in keys):
                out[f"{head}.{whole}.{param}"] = torch.cat([out.pop(k) for k in keys])
    return out


def _unstack(sd: dict[str, Tensor], stacked) -> dict[str, Tensor]:
    """Inverse of `_stack`: a stacked weight -> its parts, even splits along dim 0 (own copies: safetensors
    refuses tensors that share memory)."""
    parts, out = dict(stacked), {}
    for key, value in sd.items():
        head, module, param = _module(key)
        names = parts.get(module, ())
        out.update({f"{head}.{n}.{param}": t.clone() for n, t in zip(names, value.chunk(len(names)))} if names
                   else {key: value})
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
    for key in ("dtype", "torch_dtype"):
        if config.extra.get(key) is not None:
            return parse_dtype(config.extra[key], f"{cfg_path}: {key}")
    floats = [v.dtype for v in sd.values() if v.is_floating_point()]
    return floats[0] if floats else torch.float32


def load_pretrained(cls, path, *, dtype=None, device=None, ignore_mismatched_sizes: bool = False,
                    revision: str | None = None, allow_non_finite: bool | None = None, **config_overrides):
    """Build `cls` from the config in `path` (+ overrides) and load its weights (see module docstring). `path` is a
    directory or a Hugging Face repo id (see bertkit.hub; a local path wins); `dtype` a torch.dtype, a name
    ("bfloat16") or "auto" (the config's torch_dtype / dtype, else the weights' own); allow_non_finite: load NaN / Inf
    weights with a warning (default: refused; None reads BERTKIT_ALLOW_NON_FINITE)."""
    dtype = parse_dtype(dtype)
    directory = resolve_model_dir(path, revision=revision)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    config = read_config(directory, config_overrides)
    sd, source = read_weights(directory, allow_non_finite)
    model = cls(config)
    if "quantization_config" in config.extra:          # int8 layers first: the file holds their int8 weights
        model, sd = int8.prepare(model, config), int8.from_storage(sd)
    _load_into(model, sd, source, ignore_mismatched_sizes)
    check_vocab_rows(directory, model.config.vocab_size, source)
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
    sd = normalize_keys(family_keys(sd, model.config.model_type, cls.__name__, prefixed), prefixed)
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
def save_pretrained(model, path, tokenizer=None, safe_serialization: bool = True, max_shard_size=None) -> None:
    """config.json + the weights (+ the tokenizer's files) into `path`, each written atomically. The weights:
    model.safetensors; shards of at most `max_shard_size` (bytes, or "200MB" / "2GiB") with transformers' index
    where they do not fit one; pytorch_model.bin (torch.save of the state_dict) with safe_serialization=False.
    Weight files of another layout in `path` are removed, so the directory loads what was written."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    fam, head = family(model.config.model_type), type(model).__name__
    extra = model.config.extra
    sd = _unstack({fam.to_theirs(k, head, extra): v.detach().to("cpu").contiguous()
                   for k, v in model.state_dict().items()}, fam.stacked)
    if "quantization_config" in model.config.extra:
        sd = int8.to_storage(sd)
    if not safe_serialization:
        if max_shard_size is not None:
            raise ConfigError("save_pretrained: max_shard_size shards safetensors only; drop it or keep "
                              "safe_serialization=True")
        written = [directory / PT_WEIGHTS_NAME]
        with replacing(written[0], CheckpointError) as tmp:
            torch.save(sd, tmp)
    else:
        written = _save_shards(sd, directory, _shard_bytes(max_shard_size))
    _remove_stale_weights(directory, written)
    cfg = model.config.to_dict()
    cfg["architectures"] = [fam.class_name(head)]
    write_text(directory / CONFIG_NAME, json.dumps(cfg, indent=2, sort_keys=True) + "\n", CheckpointError)
    if tokenizer is not None:
        tokenizer.save(directory)


_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12, "KIB": 2 ** 10,
               "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


def _shard_bytes(size) -> int | None:
    """max_shard_size as bytes: an int, or a number and a unit as transformers spells it ("5GB", "500MiB")."""
    if size is None or (isinstance(size, int) and not isinstance(size, bool) and size > 0):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(size).upper())
    if m is None or m.group(2) not in _SIZE_UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"save_pretrained: max_shard_size={size!r} is not a size (bytes, or e.g. '200MB', '2GiB')")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def _save_shards(sd: dict[str, Tensor], directory: Path, limit: int | None) -> list[Path]:
    """Tensors in order into shards of at most `limit` bytes (a larger tensor alone); one shard is model.safetensors,
    more are model-0000i-of-0000n.safetensors and the index. Returns the files written."""
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for key, t in sd.items():
        n = t.numel() * t.element_size()
        if limit is not None and shards[-1] and size + n > limit:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += n
    names = [WEIGHTS_NAME] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        with replacing(directory / name, CheckpointError) as tmp:
            safetensors.torch.save_file(shard, str(tmp), metadata={"format": "pt"})
    if len(shards) == 1:
        return [directory / WEIGHTS_NAME]
    total = sum(t.numel() * t.element_size() for t in sd.values())
    index = {"metadata": {"total_size": total},
             "weight_map": {k: name for name, shard in zip(names, shards) for k in shard}}
    write_text(directory / SHARDED_INDEX_NAME, json.dumps(index, indent=2, sort_keys=True) + "\n", CheckpointError)
    return [directory / n for n in names] + [directory / SHARDED_INDEX_NAME]


def _remove_stale_weights(directory: Path, written: list[Path]) -> None:
    """Weight files of an earlier save in another layout: loading would read them first (or mix them in)."""
    for f in directory.iterdir():
        ours = f.name in (WEIGHTS_NAME, SHARDED_INDEX_NAME, PT_WEIGHTS_NAME) or _SHARD_NAME.fullmatch(f.name)
        if ours and f not in written:
            f.unlink()
