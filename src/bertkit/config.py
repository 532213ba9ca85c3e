"""BertConfig: the typed hyper-parameters of a BERT model, with presets and HF `config.json` read/write.

Field names are exactly those of a Hugging Face BERT `config.json`, so a directory written by transformers loads
here and ours loads there. Other encoder families (`bertkit.families`) share the fields; a family that spells a
field otherwise (DistilBERT's `dim`) is read and written in its own spelling. Keys we do not model (`architectures`, `transformers_version`, `use_cache`, ...) are kept
in `extra` and written back unchanged, so a read -> write round trip loses nothing.

    cfg = BertConfig.preset("small", vocab_size=8000)
    cfg.to_json("run/config.json");  cfg = BertConfig.from_json("run/config.json")
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.atomic import write_text
from bertkit.errors import CheckpointError, ConfigError
from bertkit.families import family
from bertkit.hub import resolve_model_dir
from bertkit.textfiles import check_fields, parse_json

__all__ = ["BertConfig", "PRESETS", "ATTN_IMPLEMENTATIONS", "HIDDEN_ACTS", "PROBLEM_TYPES", "CONFIG_NAME",
           "read_config"]

CONFIG_NAME = "config.json"

# "auto" picks per batch (attention.ExecutionPlan): eager for attention maps, unpadded for a batch with enough padding
ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "unpadded")
HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
PROBLEM_TYPES = (None, "single_label_classification", "regression", "multi_label_classification")

# name -> (layers, hidden, heads); intermediate = 4 * hidden. Shapes of the BERT paper / the Turc et al. miniatures.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# Upper bounds far past any real BERT: a config beyond them is a typo or hostile, refused before memory is allocated
SIZE_LIMITS = {"vocab_size": 1 << 20, "hidden_size": 1 << 15, "num_hidden_layers": 512, "num_attention_heads": 1024,
               "intermediate_size": 1 << 17, "max_position_embeddings": 1 << 17, "type_vocab_size": 1 << 16,
               "num_labels": 1 << 20, "embedding_size": 1 << 15, "relative_attention_num_buckets": 1 << 12,
               "num_hidden_groups": 512}
# the fields of some families only; None (not written to config.json) elsewhere
_OPTIONAL = ("embedding_size", "relative_attention_num_buckets", "num_hidden_groups")
MAX_PARAMETERS = 20_000_000_000

# HF keys that we store under a different spelling (HF writes the first, we read both).
_BERTKIT_ATTN_KEY = "bertkit_attn_implementation"
_HF_ATTN = ("flash_attention_2", "flash_attention_3", "flex_attention", None)    # kept for the round trip


@dataclass
class BertConfig:
    vocab_size: int = 30522               # bert-base-uncased WordPiece vocab
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072         # 4 * hidden, as in the paper
    hidden_act: str = "gelu"              # exact erf GELU (not the tanh approximation): what real checkpoints used
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512    # learned absolute positions; longer inputs are an error, not truncated
    type_vocab_size: int = 2              # segment A / B; 0: no token-type embedding (DistilBERT)
    initializer_range: float = 0.02       # std of the truncated-normal-like init (HF uses plain normal)
    layer_norm_eps: float = 1e-12         # the TF original's epsilon; checkpoints are sensitive to it in fp32
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"  # the only kind BERT checkpoints use; others are rejected
    attn_implementation: str = "auto"
    model_type: str = "bert"              # the encoder family (bertkit.families): its parts and checkpoint names
    embedding_size: int | None = None     # factorised embeddings projected to hidden_size (ELECTRA); None: hidden_size
    relative_attention_num_buckets: int | None = None  # MPNet: a learned attention bias by relative distance
    num_hidden_groups: int | None = None  # ALBERT: layers shared in this many groups; None: none shared
    # task heads
    num_labels: int = 2
    problem_type: str | None = None       # None: inferred from num_labels / label dtype at loss time (as HF does)
    classifier_dropout: float | None = None  # None: use hidden_dropout_prob
    id2label: dict[int, str] | None = None
    # every key of a config.json we do not model, kept for the round trip
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.id2label is not None:
            labels = {int(k): str(v) for k, v in self.id2label.items()}
            self.num_labels = len(labels)
            # the default names (LABEL_0, ...) carry nothing: keep None so configs compare equal after a round trip
            self.id2label = None if labels == {i: f"LABEL_{i}" for i in range(len(labels))} else labels
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value cannot work."""
        family(self.model_type)
        for name in SIZE_LIMITS:                        # the positive ints, each with its upper bound
            v = getattr(self, name)
            if v is None and name in _OPTIONAL \
                    or v == 0 and name == "type_vocab_size":
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"BertConfig.{name} must be a positive int, got {v!r}")
            if v > SIZE_LIMITS[name]:
                raise ConfigError(f"BertConfig.{name}={v} is absurdly large (bertkit's limit is {SIZE_LIMITS[name]})")
        self._check_total_size()
        if self.num_hidden_groups is not None and self.num_hidden_groups > self.num_hidden_layers:
            raise ConfigError(f"BertConfig.num_hidden_groups={self.num_hidden_groups} is more than "
                              f"num_hidden_layers={self.num_hidden_layers}")
        if self.extra.get("inner_group_num", 1) != 1:
            raise ConfigError(f"inner_group_num={self.extra['inner_group_num']!r}: bertkit reads ALBERT models with "
                              f"one layer a group (every released ALBERT)")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"BertConfig.hidden_size={self.hidden_size} is not divisible by "
                              f"num_attention_heads={self.num_attention_heads}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise ConfigError(f"BertConfig.{name} must be in [0, 1), got {v!r}")
        if self.classifier_dropout is not None and not 0.0 <= self.classifier_dropout < 1.0:
            raise ConfigError(f"BertConfig.classifier_dropout must be in [0, 1) or None, got {self.classifier_dropout!r}")
        for name, allowed in (("hidden_act", HIDDEN_ACTS), ("attn_implementation", ATTN_IMPLEMENTATIONS),
                              ("problem_type", PROBLEM_TYPES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"BertConfig.{name}={getattr(self, name)!r} is not one of {allowed}")
        kind = dict(family(self.model_type).config_defaults).get("position_embedding_type", "absolute")
        if self.position_embedding_type != kind:          # the one kind the family's checkpoints use
            raise ConfigError(f"BertConfig.position_embedding_type={self.position_embedding_type!r} is not "
                              f"supported (only {kind!r} for model_type {self.model_type!r})")
        for name in ("layer_norm_eps", "initializer_range"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 < v < math.inf:      # NaN too
                raise ConfigError(f"BertConfig.{name} must be a finite number > 0, got {v!r}")
        if not isinstance(self.pad_token_id, int) or not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"BertConfig.pad_token_id={self.pad_token_id!r} is outside the vocab "
                              f"(vocab_size={self.vocab_size})")
        _ = self.disentangled           # DeBERTa's keys: refused here, by name, if bertkit cannot run them

    def _check_total_size(self) -> None:
        """Refuse a config whose weights alone would need more than MAX_PARAMETERS (before anything is allocated)."""
        h, inter = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h
        n = embeddings + self.num_hidden_layers * (4 * h * h + 2 * h * inter)
        if n > MAX_PARAMETERS:
            raise ConfigError(f"BertConfig declares about {n / 1e9:.0f}e9 parameters (hidden_size={h}, "
                              f"num_hidden_layers={self.num_hidden_layers}, intermediate_size={inter}, "
                              f"vocab_size={self.vocab_size}): more than bertkit's limit of {MAX_PARAMETERS / 1e9:.0f}e9")

    # ------------------------------------------------------------------ construction
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """A named size (tiny/mini/small/medium/base/large) with intermediate = 4 * hidden; overrides win."""
        if name not in PRESETS:
            raise ConfigError(f"unknown BertConfig preset {name!r}; choose one of {sorted(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        return cls.from_dict({"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
                              "intermediate_size": 4 * hidden, **overrides})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BertConfig":
        """Build from a dict of HF config keys; unknown keys go to `extra`, wrongly typed values raise ConfigError."""
        d = dict(d)
        fam = family(d.get("model_type", "bert"))      # an unknown family would load as BERT and compute wrong outputs
        for ours, theirs in fam.config_keys:
            if theirs in d:
                d.setdefault(ours, d.pop(theirs))          # our spelling, where both are given, wins
        for key, value in fam.config_defaults:
            d.setdefault(key, value)
        names = {f.name: f for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {}
        extra: dict[str, Any] = dict(d.pop("extra", None) or {})
        if _BERTKIT_ATTN_KEY in d:
            d["attn_implementation"] = d.pop(_BERTKIT_ATTN_KEY)
        if "label2id" in d:  # derived from id2label on write
            extra_label2id = d.pop("label2id")
            if "id2label" not in d and isinstance(extra_label2id, dict):
                if not all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in extra_label2id.values()):
                    raise ConfigError(f"BertConfig.label2id values must be integer ids, got {extra_label2id!r:.80}")
                d["id2label"] = {v: k for k, v in extra_label2id.items()}
        for key, value in d.items():
            if key in names and key != "extra":
                kw[key] = _coerce(key, value, names[key].type)
            else:
                extra[key] = value
        if "attn_implementation" in kw and kw["attn_implementation"] not in ATTN_IMPLEMENTATIONS:
            # an HF value such as "flash_attention_2": keep it for the round trip, choose ours automatically
            if kw["attn_implementation"] not in _HF_ATTN:
                raise ConfigError(f"BertConfig.attn_implementation={str(kw['attn_implementation'])[:40]!r} is not "
                                  f"one of {ATTN_IMPLEMENTATIONS} or transformers' {_HF_ATTN}")
            extra["attn_implementation"] = kw.pop("attn_implementation")
        if "num_labels" in kw and "id2label" in kw and kw["id2label"] is not None \
                and len(kw["id2label"]) != kw["num_labels"]:
            kw["id2label"] = None  # num_labels given explicitly wins (e.g. from_pretrained(num_labels=5))
        return cls(extra=extra, **kw)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "BertConfig":
        """Read an HF-style config.json (a file, or a directory containing one)."""
        p = Path(path) / CONFIG_NAME if Path(path).is_dir() else Path(path)
        d = read_json_config(p)
        try:
            return cls.from_dict(d)
        except ConfigError as e:
            raise ConfigError(f"{p}: {e}") from None

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, revision: str | None = None,
                        **overrides: Any) -> "BertConfig":
        """The config.json of a model directory or of a Hugging Face repo id in the local cache (see bertkit.hub),
        with keyword overrides of its fields."""
        return read_config(resolve_model_dir(name_or_path, revision=revision), overrides)

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict[str, Any]:
        """The HF config.json dict: our fields + the kept unknown keys (+ model_type/architectures if absent)."""
        out: dict[str, Any] = dict(self.extra)
        fam = family(self.model_type)
        theirs = dict(fam.config_keys)
        for f in dataclasses.fields(self):
            if f.name in ("extra", "attn_implementation", "id2label", "num_labels") \
                    or f.name in _OPTIONAL and getattr(self, f.name) is None:
                continue
            out[theirs.get(f.name, f.name)] = getattr(self, f.name)
        # HF derives num_labels from id2label; write both spellings so either library reads the label count
        id2label = self.id2label or {i: f"LABEL_{i}" for i in range(self.num_labels)}
        out["id2label"] = {str(k): v for k, v in sorted(id2label.items())}
        out["label2id"] = {v: k for k, v in sorted(id2label.items())}
        if self.attn_implementation != "auto":
            out[_BERTKIT_ATTN_KEY] = self.attn_implementation
        return out

    def to_json(self, path: str | os.PathLike) -> None:
        """Write config.json atomically (temp file, then rename). A directory path gets `config.json` inside."""
        p = Path(path) / CONFIG_NAME if Path(path).is_dir() else Path(path)
        write_text(p, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def replace(self, **changes: Any) -> "BertConfig":
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)

    @property
    def max_input_length(self) -> int:
        """The longest input the position table allows: max_position_embeddings, less the positions RoBERTa-style
        families reserve (theirs start at pad_token_id + 1)."""
        offset = self.pad_token_id + 1 if family(self.model_type).positions_from_ids else 0
        return self.max_position_embeddings - offset

    @property
    def disentangled(self) -> Disentangled | None:
        """The disentangled-attention settings of a DeBERTa config, None for other families; ConfigError naming a key
        whose value bertkit does not compute (v2-xlarge's convolution layer, a head size other than hidden / heads)."""
        if not family(self.model_type).disentangled:
            return None
        x = self.extra
        for key, ok in (("conv_kernel_size", lambda v: not v),
                        ("embedding_size", lambda v: v in (None, self.hidden_size)),
                        ("attention_head_size", lambda v: v in (None, self.head_dim)),
                        ("pooler_hidden_size", lambda v: v in (None, self.hidden_size))):
            value = getattr(self, key, None) if key == "embedding_size" else x.get(key)
            if not ok(value):
                raise ConfigError(f"{self.model_type} config key {key}={value!r} is not supported by bertkit")
        terms = x.get("pos_att_type") or []
        terms = tuple(t.strip() for t in (terms.lower().split("|") if isinstance(terms, str) else terms))
        if not set(terms) <= {"c2p", "p2c"}:
            raise ConfigError(f"{self.model_type} config key pos_att_type={x.get('pos_att_type')!r}: "
                              f"expected c2p and / or p2c")
        max_position = x.get("max_relative_positions", -1)
        max_position = max_position if max_position >= 1 else self.max_position_embeddings
        buckets = x.get("position_buckets", -1)
        return Disentangled(bool(x.get("relative_attention", False)), terms, buckets if buckets > 0 else max_position,
                            buckets, max_position, bool(x.get("share_att_key", False)),
                            "layer_norm" in str(x.get("norm_rel_ebd", "none")).lower().split("|"),
                            bool(x.get("position_biased_input", True)), x.get("pooler_hidden_act", "gelu"),
                            float(x.get("pooler_dropout", 0.0)))

    @property
    def position_table(self) -> bool:
        """A learned absolute position table: rotary families (ModernBERT) rotate q and k by position instead, and
        DeBERTa-v3 has relative positions only."""
        spec = self.disentangled
        return not family(self.model_type).rotary and (spec is None or spec.absolute_positions)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class Disentangled:
    """DeBERTa's disentangled-attention settings (bertkit.disentangled computes the terms by them): config.json keys in
    `BertConfig.extra`, read with transformers' defaults."""
    relative_attention: bool     # the c2p / p2c terms at all
    terms: tuple[str, ...]       # pos_att_type: "c2p", "p2c"
    span: int                    # relative embeddings each way: position_buckets, else max_relative_positions
    buckets: int                 # position_buckets (<= 0: distances unbucketed)
    max_position: int            # max_relative_positions (< 1: max_position_embeddings)
    share_att_key: bool          # the terms project R with the layer's own query / key
    norm: bool                   # norm_rel_ebd "layer_norm": R through encoder.LayerNorm
    absolute_positions: bool     # position_biased_input: v2 adds absolute position embeddings, v3 does not
    pooler_act: str              # the classifier's hidden layer (ContextPooler): activation and dropout before it
    pooler_dropout: float

    @property
    def scale(self) -> float:
        return 1.0 + len(self.terms)


def read_json_config(p: Path, error=ConfigError) -> dict:
    """A config.json's object; `error` (one line naming the file) when it is unreadable, not UTF-8, not JSON, too
    deeply nested or not an object."""
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise error(f"config file not found: {p}") from None
    except OSError as e:
        raise error(f"{p}: cannot read: {e.strerror or e}") from None
    d = parse_json(data, str(p), error)
    check_fields(d, {}, str(p), error)
    names = d.get("architectures") or []    # kept as HF wrote it, but the loaders pick their class from it
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise error(f"{p}: architectures {str(d['architectures'])[:40]!r} is not a list of class names")
    return d


def peek_json_config(p: Path) -> dict:
    """`read_json_config`, or {} where it would refuse: a look before loading (the loader then names the problem)."""
    try:
        return read_json_config(p)
    except ConfigError:
        return {}


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Check/convert one JSON value against the annotated type of field `key` (annotations are strings here)."""
    t = str(typ)
    if value is None:
        if "None" in t:
            return None
        raise ConfigError(f"BertConfig.{key} must not be null")
    if t == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"BertConfig.{key} must be an int, got {value!r}")
    elif t.startswith("float"):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"BertConfig.{key} must be a number, got {value!r}")
        value = float(value)
    elif t.startswith("str"):
        if not isinstance(value, str):
            raise ConfigError(f"BertConfig.{key} must be a string, got {value!r}")
    elif t.startswith("dict"):
        if not isinstance(value, dict):
            raise ConfigError(f"BertConfig.{key} must be an object, got {value!r}")
        try:
            value = {int(k): v for k, v in value.items()}
        except (ValueError, TypeError):
            raise ConfigError(f"BertConfig.{key} keys must be integers, got {list(value)!r}") from None
    return value


def read_config(directory: Path, overrides: dict) -> BertConfig:
    """`directory`/config.json with `overrides` (BertConfig fields) applied; errors name the file or the field."""
    cfg_path = directory / CONFIG_NAME
    if not cfg_path.is_file():
        raise CheckpointError(f"no {CONFIG_NAME} in {directory}")
    raw = read_json_config(cfg_path, CheckpointError)
    field_names = set(BertConfig.__dataclass_fields__)
    for key in overrides:
        if key not in field_names:
            raise ConfigError(f"from_pretrained got {key}=..., which is not a BertConfig field")
    try:
        return BertConfig.from_dict({**raw, **overrides})
    except ConfigError as e:
        raise ConfigError(f"{cfg_path}: {e}") from None
