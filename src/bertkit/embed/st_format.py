"""sentence-transformers model directories, both directions (any version from 2.x on):

    modules.json                       the module list: Transformer, Pooling, Dense..., Normalize
    config.json, model.safetensors     the BERT encoder in HF format (the Transformer module lives in the root)
    vocab.txt, tokenizer_config.json   the tokenizer (or a tokenizer.json)
    sentence_bert_config.json          max_seq_length, do_lower_case, the tokenizer's padding / truncation sides
    1_Pooling/config.json              pooling_mode_* flags (or `pooling_mode`, a name or a list), include_prompt
    2_Dense/config.json + weights      in/out features, bias, activation
    2_Normalize/ or 3_Normalize/       no weights
    config_sentence_transformers.json  versions, similarity function, prompts and default_prompt_name

A plain HF directory (no modules.json) loads as sentence-transformers loads it: mean pooling, no normalisation.
Writing uses the flag format every version reads. Modules bertkit cannot run (a custom one, a Dense with a residual,
a Dense after Normalize) raise CheckpointError naming the module.
"""

from __future__ import annotations

from pathlib import Path

import torch
import safetensors.torch

from bertkit import __version__
from bertkit.atomic import replacing, write_json
from bertkit.checkpoint import load_state_dict_file
from bertkit.config import CONFIG_NAME, read_json_config
from bertkit.errors import CheckpointError
from bertkit.textfiles import parse_json
from bertkit.model import BertModel
from bertkit.tokenizer import Tokenizer
from bertkit.tokenizer.hfjson import read_sides

from bertkit.embed.pooling import ACTIVATIONS, Dense, Pooling, Prompts, SentenceEncoder

__all__ = ["load_sentence_encoder", "load_tokenizer", "sentence_pipeline", "save_sentence_encoder",
           "is_sentence_transformers_dir", "model_config", "module_dirs", "read_prompts", "POOLING_FLAGS"]

# the legacy flag of each pooling mode, in sentence-transformers' concatenation order
POOLING_FLAGS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
                 "mean": "pooling_mode_mean_tokens", "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
                 "weighted_mean": "pooling_mode_weightedmean_tokens", "last_token": "pooling_mode_lasttoken"}
# torch class paths written in a Dense config ("torch.nn.modules.activation.Tanh") <-> our activation names
_ACTIVATION_PATHS = {name: f"{cls.__module__}.{cls.__name__}" for name, cls in ACTIVATIONS.items()}
# our mode names -> sentence-transformers' (for its list form of pooling_mode)
_ST_MODE_NAMES = {"mean_sqrt_len": "mean_sqrt_len_tokens", "weighted_mean": "weightedmean",
                  "last_token": "lasttoken"}
_DEFAULT_MAX_SEQ = 512
_ST_CONFIG = "config_sentence_transformers.json"


def is_sentence_transformers_dir(path) -> bool:
    """An embedding model's module list; sentence-transformers 6 writes modules.json for a CrossEncoder too, whose
    one module is the classifier itself: to bertkit, a plain HF directory."""
    return (Path(path) / "modules.json").is_file() and model_config(path).get("model_type") != "CrossEncoder"


def model_config(path) -> dict:
    """The directory's config_sentence_transformers.json ({} without one)."""
    return _json_object(Path(path) / _ST_CONFIG)


def _json_object(path: Path) -> dict:
    """The JSON object in `path`; {} where the file is missing or holds no object."""
    found = _read_json(path) if path.is_file() else {}
    return found if isinstance(found, dict) else {}


def _read_json(path: Path) -> dict | list:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e})") from None
    return parse_json(data, str(path), CheckpointError)


def _kind(module_type: str) -> str | None:
    """'transformer' | 'pooling' | 'dense' | 'normalize' for any spelling of the class path
    (sentence_transformers.models.Dense, sentence_transformers.models.Dense.Dense, ...), else None."""
    if module_type.startswith("sentence_transformers."):
        last = module_type.rsplit(".", 1)[-1].lower()
        return last if last in ("transformer", "pooling", "dense", "normalize") else None
    return None


def _module_path(directory: Path, entry) -> Path:
    """An entry's path relative to the directory; one that leaves it (absolute, or with '..') is an error."""
    rel = Path(str(entry.get("path") or "")) if isinstance(entry, dict) else Path()
    if rel.is_absolute() or ".." in rel.parts:
        raise CheckpointError(f"{directory / 'modules.json'}: module path {str(rel)!r} leaves the model directory")
    return rel


def _module_list(directory: Path) -> list[tuple[str, Path]]:
    """(kind, directory) per entry of modules.json, checked for an order SentenceEncoder can run."""
    spec = _read_json(directory / "modules.json")
    if not isinstance(spec, list) or not all(isinstance(m, dict) and "type" in m for m in spec):
        raise CheckpointError(f"{directory / 'modules.json'}: expected a list of {{type, path}} objects")
    bad = [m["idx"] for m in spec if not isinstance(m.get("idx", 0), int)]
    if bad:
        raise CheckpointError(f"{directory / 'modules.json'}: module idx {bad[0]!r:.60} is not an integer")
    out = []
    for m in sorted(spec, key=lambda m: m.get("idx", 0)):
        kind = _kind(str(m["type"]))
        if kind is None:
            raise CheckpointError(f"{directory / 'modules.json'}: module {m.get('name', '?')} has type "
                                  f"{m['type']!r}; bertkit runs Transformer, Pooling, Dense and Normalize only")
        out.append((kind, directory / _module_path(directory, m)))
    kinds = [k for k, _ in out]
    pattern_ok = (kinds[:2] == ["transformer", "pooling"] and all(k == "dense" for k in kinds[2:-1])
                  and (len(kinds) == 2 or kinds[-1] in ("dense", "normalize")))
    if not pattern_ok:
        raise CheckpointError(f"{directory / 'modules.json'}: modules {kinds}; bertkit runs Transformer, "
                              f"Pooling, then any Dense layers, then an optional Normalize")
    return out


def module_dirs(directory) -> list[Path]:
    """The subdirectories a sentence-transformers directory's modules.json names (Pooling, Dense, Normalize...),
    relative to it: what a copy of the model must carry besides the encoder's own files. [] without modules.json;
    a module path that leaves the directory (absolute, or with '..') is an error."""
    directory = Path(directory)
    if not is_sentence_transformers_dir(directory):
        return []
    spec = _read_json(directory / "modules.json")
    if not isinstance(spec, list):
        raise CheckpointError(f"{directory / 'modules.json'}: expected a list of {{type, path}} objects")
    return [rel for rel in (_module_path(directory, m) for m in spec) if rel.parts and (directory / rel).is_dir()]


def _pooling_from(path: Path, hidden: int) -> Pooling:
    if not (path / CONFIG_NAME).is_file():          # sentence-transformers cannot load it either; no silent "mean"
        raise CheckpointError(f"{path / CONFIG_NAME}: missing; modules.json names a Pooling module there")
    cfg = read_json_config(path / CONFIG_NAME, CheckpointError)
    dim = cfg.get("word_embedding_dimension", cfg.get("embedding_dimension", hidden))
    if dim != hidden:
        raise CheckpointError(f"{path / CONFIG_NAME}: pooling dimension {dim} differs from the encoder's "
                              f"hidden size {hidden}")
    if "pooling_mode" in cfg and isinstance(cfg["pooling_mode"], (str, list)):
        modes = cfg["pooling_mode"]
    else:
        modes = [mode for mode, flag in POOLING_FLAGS.items() if cfg.get(flag)] or ["mean"]
    return Pooling(modes, hidden_size=hidden, include_prompt=bool(cfg.get("include_prompt", True)))


def _dense_from(path: Path) -> Dense:
    cfg = read_json_config(path / CONFIG_NAME, CheckpointError)
    if cfg.get("use_residual"):
        raise CheckpointError(f"{path / CONFIG_NAME}: a Dense with use_residual is not supported")
    act_path = cfg.get("activation_function", _ACTIVATION_PATHS["tanh"])
    names = {p.rsplit(".", 1)[-1]: n for n, p in _ACTIVATION_PATHS.items()}
    act = names.get(str(act_path).rsplit(".", 1)[-1])
    if act is None:
        raise CheckpointError(f"{path / CONFIG_NAME}: activation {act_path!r} is not one of "
                              f"{', '.join(_ACTIVATION_PATHS.values())}")
    try:
        dense = Dense(int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)), act)
    except KeyError as e:
        raise CheckpointError(f"{path / CONFIG_NAME}: missing {e.args[0]!r}") from None
    weights = next((w for w in (path / "model.safetensors", path / "pytorch_model.bin") if w.is_file()), None)
    if weights is None:
        raise CheckpointError(f"{path}: no model.safetensors or pytorch_model.bin for the Dense layer")
    sd = load_state_dict_file(weights)
    try:
        dense.load_state_dict(sd)
    except RuntimeError as e:
        raise CheckpointError(f"{weights}: does not fit Dense({dense.in_features}, {dense.out_features}): "
                              f"{str(e).splitlines()[0]}") from None
    return dense


def load_tokenizer(tdir) -> Tokenizer:
    """The tokenizer of a Transformer module's directory as sentence-transformers loads it: the sides its
    sentence_bert_config.json's tokenizer_args / processor_kwargs set win over tokenizer_config.json's (a
    truncation_side "left" there cuts every text from the start, prompt first)."""
    cfg = _json_object(Path(tdir) / "sentence_bert_config.json")
    options = {k: v for key in ("tokenizer_args", "processor_kwargs") if isinstance(cfg.get(key), dict)
               for k, v in cfg[key].items()}
    where = f"{Path(tdir) / 'sentence_bert_config.json'}: tokenizer_args / processor_kwargs"
    return Tokenizer.from_pretrained(tdir, **read_sides(options, where))


def _seq_settings(path: Path, tokenizer: Tokenizer, max_positions: int) -> tuple[int, bool]:
    """(max_seq_length, do_lower_case): sentence_bert_config.json, else the tokenizer's model_max_length."""
    cfg = _json_object(path / "sentence_bert_config.json")
    length = cfg.get("max_seq_length") or tokenizer.model_max_length or _DEFAULT_MAX_SEQ
    if not isinstance(length, int):
        raise CheckpointError(f"{path / 'sentence_bert_config.json'}: max_seq_length {length!r:.60} "
                              f"is not an integer")
    return min(length, max_positions), bool(cfg.get("do_lower_case", False))


def read_prompts(path) -> Prompts:
    """The prompts of a sentence-transformers directory's config_sentence_transformers.json (none without it)."""
    file, cfg = Path(path) / _ST_CONFIG, model_config(path)
    saved, default = cfg.get("prompts") or {}, cfg.get("default_prompt_name")
    if not isinstance(saved, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in saved.items()):
        raise CheckpointError(f"{file}: prompts must map names to prompt texts, got {saved!r:.80}")
    if not isinstance(default, (str, type(None))):
        raise CheckpointError(f"{file}: default_prompt_name {default!r:.60} is not a prompt name")
    prompts = Prompts({**Prompts().named, **saved}, default)
    if default is not None and default not in prompts.named:
        raise CheckpointError(f"{file}: default_prompt_name {default!r} is not one of its prompts: "
                              f"{', '.join(prompts.named)}")
    return prompts


def load_sentence_encoder(path) -> tuple[SentenceEncoder, Tokenizer]:
    """A sentence-transformers (or plain HF BERT) directory -> (SentenceEncoder in eval mode, Tokenizer)."""
    directory = Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"model directory not found: {directory}")
    tdir = _module_list(directory)[0][1] if is_sentence_transformers_dir(directory) else directory
    bert = BertModel.from_pretrained(tdir)
    tokenizer = load_tokenizer(tdir)  # vocab.txt, or the tokenizer.json sentence-transformers 6 saves
    return sentence_pipeline(directory, bert, tokenizer).eval(), tokenizer


def sentence_pipeline(path, bert: BertModel, tokenizer: Tokenizer) -> SentenceEncoder:
    """The directory's pooling / Dense / Normalize modules around an encoder already loaded from it (mean pooling,
    no normalisation for a plain HF directory): what `serve` embeds with, sharing the model it loaded."""
    directory = Path(path)
    modules = _module_list(directory) if is_sentence_transformers_dir(directory) else [("transformer", directory)]
    tdir = modules[0][1]
    max_len, lower = _seq_settings(tdir, tokenizer, bert.config.max_input_length)
    hidden = bert.config.hidden_size
    pooling = _pooling_from(modules[1][1], hidden) if len(modules) > 1 else Pooling("mean", hidden)
    dense = [_dense_from(p) for kind, p in modules if kind == "dense"]
    normalize = modules[-1][0] == "normalize"
    encoder = SentenceEncoder(bert, pooling, normalize=normalize, dense=dense, max_seq_length=max_len,
                              do_lower_case=lower,
                              prompts=read_prompts(directory) if is_sentence_transformers_dir(directory) else None)
    if dense and dense[0].in_features != pooling.output_dim():
        raise CheckpointError(f"{directory}: the first Dense takes {dense[0].in_features} features but pooling "
                              f"gives {pooling.output_dim()}")
    return encoder


# ---------------------------------------------------------------------------------------------------- writing
def save_sentence_encoder(encoder: SentenceEncoder, tokenizer: Tokenizer, path) -> Path:
    """Write `encoder` + `tokenizer` as a sentence-transformers directory (which `SentenceTransformer(path)` and
    `load_sentence_encoder(path)` both read). Returns the directory."""
    directory = Path(path)
    encoder.bert.save_pretrained(directory, tokenizer=tokenizer)
    write_json(directory / "sentence_bert_config.json",
               {"max_seq_length": encoder.max_seq_length, "do_lower_case": encoder.do_lower_case},
               error=CheckpointError)
    modules = [("0", "", "Transformer")]
    pool_dir = directory / "1_Pooling"
    pool_dir.mkdir(exist_ok=True)
    modes = encoder.pooling.modes
    pool_cfg = {"word_embedding_dimension": encoder.bert.config.hidden_size,
                **{flag: mode in modes for mode, flag in POOLING_FLAGS.items()},
                "include_prompt": encoder.pooling.include_prompt}
    if list(modes) != [m for m in POOLING_FLAGS if m in modes]:
        # flags concatenate in their fixed order; the newer list form (read first) keeps another order
        pool_cfg["pooling_mode"] = [_ST_MODE_NAMES.get(m, m) for m in modes]
    write_json(pool_dir / CONFIG_NAME, pool_cfg, error=CheckpointError)
    modules.append(("1", "1_Pooling", "Pooling"))
    for layer in encoder.dense:
        idx = str(len(modules))
        sub = directory / f"{idx}_Dense"
        sub.mkdir(exist_ok=True)
        write_json(sub / CONFIG_NAME, {"in_features": layer.in_features, "out_features": layer.out_features,
                                       "bias": layer.bias,
                                       "activation_function": _ACTIVATION_PATHS[layer.activation_name]},
                   error=CheckpointError)
        sd = {k: v.detach().to("cpu").contiguous() for k, v in layer.state_dict().items()}
        with replacing(sub / "model.safetensors", CheckpointError) as tmp:
            safetensors.torch.save_file(sd, str(tmp), metadata={"format": "pt"})
        modules.append((idx, f"{idx}_Dense", "Dense"))
    if encoder.normalize:
        idx = str(len(modules))
        (directory / f"{idx}_Normalize").mkdir(exist_ok=True)
        modules.append((idx, f"{idx}_Normalize", "Normalize"))
    write_json(directory / _ST_CONFIG,
               {"__version__": {"bertkit": __version__, "pytorch": torch.__version__},
                "prompts": encoder.prompts.named, "default_prompt_name": encoder.prompts.default_name,
                "similarity_fn_name": "cosine"}, error=CheckpointError)
    write_json(directory / "modules.json",
               [{"idx": int(i), "name": i, "path": p, "type": f"sentence_transformers.models.{t}"}
                for i, p, t in modules], error=CheckpointError)
    return directory
