"""The encoder families bertkit reads and writes, as data: what each changes in the one encoder, and its names.

A family is not a copy of the model: `model.py` is one encoder whose parts the config chooses; this table says which
a transformers `model_type` uses and how its checkpoints spell the parameters and classes (what each family changes:
docs/families.md).

Weight names map both ways by ordered prefix rules, `#` standing for a layer number: a head's whole names first,
then the encoder's inner names under its prefix (`bert.` here, `roberta.` there; none in a bare encoder). A key no
rule matches keeps its name; another head's weights load under "unused." (reported ignored, never loaded).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from bertkit.errors import ConfigError

__all__ = ["Family", "FAMILIES", "family", "bert_class_name"]

# our class name suffixes, after "Bert"
SUFFIXES = ("Model", "ForPreTraining", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
            "ForQuestionAnswering", "ForReplacedTokenDetection")


@dataclass(frozen=True)
class Family:
    model_type: str
    prefix: str = "bert"                  # transformers' base_model_prefix: the encoder's key prefix in a head model
    class_prefix: str = "Bert"            # RobertaForMaskedLM, XLMRobertaModel, ...
    positions_from_ids: bool = False      # RoBERTa: position = pad_token_id + 1 + index among the non-pad ids
    classifier_act: str = "tanh"          # the sequence classifier's hidden layer (BERT's pooler)
    classifier_dropout_first: bool = False  # RoBERTa / ELECTRA drop out the [CLS] state before that layer too
    mlm_act: str | None = None            # the MLM transform's activation; None: config.hidden_act
    pooler: bool = True                   # the bare encoder has a pooler
    # ModernBERT's parts (bertkit.modern): rotary positions instead of position embeddings, one fused `Wqkv`
    # projection, local sliding-window layers; LayerNorm before each sublayer and after the last layer; GLU
    # feed-forward; a dense + act + norm layer before every head's output (and no pooler)
    rotary: bool = False
    pre_norm: bool = False
    glu: bool = False
    head_transform: bool = False
    # (ours, theirs) names inside the encoder, after its prefix ("encoder.layer.#.attention.self.query", ...)
    keys: tuple[tuple[str, str], ...] = ()
    # (ours, theirs) whole names of a head class ("ForSequenceClassification": the classifier's), tried first
    head_keys: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    tied: tuple[str, ...] = ()            # their names of weights tied to the word embeddings (never saved)
    config_keys: tuple[tuple[str, str], ...] = ()     # (BertConfig field, their config.json key)
    config_defaults: tuple[tuple[str, object], ...] = ()  # fields the family's config.json never writes
    class_names: dict[str, str] = field(default_factory=dict)   # our suffix -> theirs where they differ
    disentangled: bool = False            # DeBERTa's relative-position attention terms (bertkit.disentangled)
    # the family's own fresh init (ModernBERT's): (our module name's ending, "in" | "out" | "final") -> that std,
    # truncated normal (bertkit.modern.init_family); the modules it does not name keep BERT's
    init_stds: tuple[tuple[str, str], ...] = ()
    # NomicBERT / GTE: the bertkit.modern.Parts fields their architecture fixes (config.json has no keys for them)
    parts: tuple[tuple[str, object], ...] = ()
    # a weight ours holds whole that the checkpoints split along dim 0: (theirs module name, its parts' names),
    # e.g. NomicBERT's GLU input, ours `intermediate.dense`, theirs "mlp.fc1" stored as mlp.fc11 + mlp.fc12
    stacked: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # a head spelled otherwise where config.json says so: head -> ((key, value), rules); reading takes either
    variants: dict[str, tuple[tuple[str, object], tuple[tuple[str, str], ...]]] = field(default_factory=dict)

    # ------------------------------------------------------------------ classes
    def class_name(self, ours: str) -> str:
        """Our class name ("BertForMaskedLM") -> theirs ("RobertaForMaskedLM")."""
        suffix = ours.removeprefix("Bert")
        return self.class_prefix + self.class_names.get(suffix, suffix)

    # ------------------------------------------------------------------ weights
    def to_theirs(self, key: str, head: str, config: dict | None = None) -> str:
        """Our parameter name in model class `head` -> the family's checkpoint name (as `config`, the config.json
        dict, spells that head: see `variants`)."""
        own = head.removeprefix("Bert")
        (switch, value), variant = self.variants.get(own, ((None, None), ()))
        rules = (variant if switch and (config or {}).get(switch) == value else ()) + self.head_keys.get(own, ())
        renamed = _rename(key, rules, 0)
        if renamed is not None:
            return renamed
        if key.startswith("bert."):
            return f"{self.prefix}.{_rename(key[5:], self.keys, 0) or key[5:]}"
        return _rename(key, self.keys, 0) or key

    def to_ours(self, key: str, head: str) -> str:
        """A family checkpoint's parameter name -> ours in model class `head`. Another head's weights get a name no
        model has ("unused." + theirs), so the loader reports them ignored instead of loading one head's layer as
        another's (RoBERTa's classifier.dense is not a bare encoder's pooler)."""
        own = head.removeprefix("Bert")
        renamed = _rename(key, self.head_keys.get(own, ()), 1)
        if renamed is not None:
            return renamed
        others = tuple(r for h, rs in self.head_keys.items() if h != own for r in rs if not r[0].startswith("unused."))
        if _rename(key, others + tuple(r for _, rs in self.variants.values() for r in rs), 1) is not None:
            variant = self.variants.get(own)
            renamed = _rename(key, variant[1], 1) if variant else None
            return renamed if renamed is not None else f"unused.{key}"
        if key.startswith(self.prefix + "."):
            inner = key[len(self.prefix) + 1:]
            return f"bert.{_rename(inner, self.keys, 1) or inner}"
        return _rename(key, self.keys, 1) or key


def _rename(key: str, rules: tuple[tuple[str, str], ...], side: int) -> str | None:
    """`key` under the first rule whose side `side` (0 ours, 1 theirs) is a prefix of it, else None."""
    for rule in rules:
        m = _pattern(rule[side]).match(key)
        if m:
            out = rule[1 - side]
            for group in m.groups()[:-1]:
                out = out.replace("#", group, 1)
            return out + m.groups()[-1]
    return None


@functools.cache
def _pattern(template: str) -> re.Pattern:
    """"a.#.b" -> a regex matching the prefix "a.<n>.b" at a name boundary, capturing n and the rest."""
    body = r"(\d+)".join(re.escape(p) for p in template.split("#"))
    return re.compile(body + r"(\..*|$)")


def _layer(theirs: str, *pairs: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """Renames inside every encoder layer: ours "encoder.layer.#.<a>" is theirs "<theirs>.<b>" for each (a, b), where
    `theirs` names layer # ("transformer.layer.#")."""
    return tuple((f"encoder.layer.#.{a}", f"{theirs}.{b}") for a, b in pairs)


def _mlm(dense: str, norm: str, bias: str) -> tuple[tuple[str, str], ...]:
    """An MLM head's transform (dense, LayerNorm) and output bias under the family's names."""
    return (("cls.predictions.transform.dense", dense), ("cls.predictions.transform.LayerNorm", norm),
            ("cls.predictions.bias", bias))


def _roberta(prefix: str) -> dict:
    """RoBERTa's positions and heads, shared by XLM-R and MPNet (whose encoders they sit on: `prefix`)."""
    heads = {
        "ForMaskedLM": _mlm("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
        # the bare encoder's pooler is not the classifier's hidden layer: a name no model has, reported ignored
        "ForSequenceClassification": (("unused.pooler", f"{prefix}.pooler"),
                                      ("bert.pooler.dense", "classifier.dense"),
                                      ("classifier", "classifier.out_proj")),
    }
    return dict(prefix=prefix, positions_from_ids=True, classifier_dropout_first=True, mlm_act="gelu",
                head_keys=heads, tied=("lm_head.decoder.weight", "lm_head.decoder.bias"))

_GTE = dict(pooler=False, rotary=True, glu=True, mlm_act="gelu",
            keys=_layer("encoder.layer.#",
                ("attention.self.Wqkv", "attention.qkv_proj"), ("attention.output.dense", "attention.o_proj"),
                ("attention.output.LayerNorm", "attn_ln"), ("intermediate.dense", "mlp.up_gate_proj"),
                ("output.dense", "mlp.down_proj"), ("output.LayerNorm", "mlp_ln")),
            head_keys={"ForMaskedLM": _mlm("lm_head.dense", "lm_head.norm", "lm_head.decoder.bias")},
            tied=("lm_head.decoder.weight",))


def _gte_parts(theta: float) -> tuple[tuple[str, object], ...]:
    """GTE's fixed parts, with the rotary base its config class defaults to."""
    return (("attention_bias", True), ("mlp_bias", False), ("mlp_out_bias", True), ("mlp_dropout", None),
            ("glu_act_half", 1), ("global_theta", theta))


_albert_mlm = _mlm("predictions.dense", "predictions.LayerNorm", "predictions.bias")

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("bert"),
    Family("roberta", class_prefix="Roberta", **_roberta("roberta")),
    Family("xlm-roberta", class_prefix="XLMRoberta", **_roberta("roberta")),
    Family(
        "mpnet", class_prefix="MPNet", **_roberta("mpnet"),
        keys=_layer("encoder.layer.#",
            ("attention.self.query", "attention.attn.q"), ("attention.self.key", "attention.attn.k"),
            ("attention.self.value", "attention.attn.v"), ("attention.output.dense", "attention.attn.o"),
            ("attention.output.LayerNorm", "attention.LayerNorm")),
        config_defaults=(("type_vocab_size", 0), ("relative_attention_num_buckets", 32))),
    Family(
        "albert", prefix="albert", class_prefix="Albert",
        keys=(("embeddings_project", "encoder.embedding_hidden_mapping_in"), ("pooler.dense", "pooler"),
              *_layer("encoder.albert_layer_groups.#.albert_layers.0",
                  ("attention.self.query", "attention.query"), ("attention.self.key", "attention.key"),
                  ("attention.self.value", "attention.value"), ("attention.output.dense", "attention.dense"),
                  ("attention.output.LayerNorm", "attention.LayerNorm"), ("intermediate.dense", "ffn"),
                  ("output.dense", "ffn_output"), ("output.LayerNorm", "full_layer_layer_norm"))),
        head_keys={
            "ForMaskedLM": _albert_mlm,
            "ForPreTraining": _albert_mlm + (("cls.seq_relationship", "sop_classifier.classifier"),),
        },
        tied=("predictions.decoder.weight", "predictions.decoder.bias"),
        config_keys=(("classifier_dropout", "classifier_dropout_prob"),),
        config_defaults=(("num_hidden_groups", 1),)),
    Family(
        "electra", prefix="electra", class_prefix="Electra", classifier_act="gelu", classifier_dropout_first=True,
        mlm_act="gelu", pooler=False,
        head_keys={
            "ForMaskedLM": _mlm("generator_predictions.dense", "generator_predictions.LayerNorm",
                                "generator_lm_head.bias"),
            "ForSequenceClassification": (("bert.pooler.dense", "classifier.dense"),
                                          ("classifier", "classifier.out_proj")),
        },
        tied=("generator_lm_head.weight",),
        class_names={"ForReplacedTokenDetection": "ForPreTraining"}),
    Family(
        "distilbert", prefix="distilbert", class_prefix="DistilBert", classifier_act="relu", pooler=False,
        keys=_layer("transformer.layer.#",
            ("attention.self.query", "attention.q_lin"), ("attention.self.key", "attention.k_lin"),
            ("attention.self.value", "attention.v_lin"), ("attention.output.dense", "attention.out_lin"),
            ("attention.output.LayerNorm", "sa_layer_norm"), ("intermediate.dense", "ffn.lin1"),
            ("output.dense", "ffn.lin2"), ("output.LayerNorm", "output_layer_norm")),
        head_keys={
            "ForMaskedLM": _mlm("vocab_transform", "vocab_layer_norm", "vocab_projector.bias"),
            "ForSequenceClassification": (("bert.pooler.dense", "pre_classifier"),),
        },
        tied=("vocab_projector.weight",),
        config_keys=(("hidden_size", "dim"), ("num_hidden_layers", "n_layers"), ("num_attention_heads", "n_heads"),
                     ("intermediate_size", "hidden_dim"), ("hidden_act", "activation"),
                     ("hidden_dropout_prob", "dropout"), ("attention_probs_dropout_prob", "attention_dropout"),
                     ("classifier_dropout", "seq_classif_dropout")),
        config_defaults=(("type_vocab_size", 0),)),
    Family(
        "modernbert", prefix="model", class_prefix="ModernBert", pooler=False, rotary=True, pre_norm=True, glu=True,
        head_transform=True,
        keys=(("embeddings.word_embeddings", "embeddings.tok_embeddings"), ("embeddings.LayerNorm", "embeddings.norm"),
              ("encoder.final_norm", "final_norm")) + _layer("layers.#",
            ("attention.self.Wqkv", "attn.Wqkv"), ("attention.output.dense", "attn.Wo"),
            ("attention.output.LayerNorm", "attn_norm"), ("intermediate.dense", "mlp.Wi"),
            ("output.dense", "mlp.Wo"), ("output.LayerNorm", "mlp_norm")),
        head_keys={
            "ForMaskedLM": _mlm("head.dense", "head.norm", "decoder.bias"),
            # "classifier" is QA's too: named here so a classifier's own weights are not taken for QA's
            **{h: (("head.dense", "head.dense"), ("head.LayerNorm", "head.norm"), ("classifier", "classifier"))
               for h in ("ForSequenceClassification", "ForTokenClassification")},
            "ForQuestionAnswering": (("head.dense", "head.dense"), ("head.LayerNorm", "head.norm"),
                                     ("qa_outputs", "classifier")),
        },
        tied=("decoder.weight",),
        # transformers' ModernBertPreTrainedModel: inputs at initializer_range, each residual branch's output layer
        # scaled down by sqrt(2 x layers), the final classifier at hidden_size ** -0.5
        init_stds=(("word_embeddings", "in"), ("attention.self.Wqkv", "in"), ("intermediate.dense", "in"),
                   ("attention.output.dense", "out"), ("output.dense", "out"), ("transform.dense", "out"),
                   ("head.dense", "out"), ("classifier", "final"), ("qa_outputs", "final")),
        config_keys=(("layer_norm_eps", "norm_eps"), ("hidden_act", "hidden_activation"),
                     ("attention_probs_dropout_prob", "attention_dropout")),
        # transformers' ModernBertConfig defaults (it refuses a null classifier_dropout)
        config_defaults=(("type_vocab_size", 0), ("hidden_dropout_prob", 0.0), ("classifier_dropout", 0.0))),
    Family(
        "nomic_bert", prefix="nomic_bert", class_prefix="NomicBert", pooler=False, rotary=True, glu=True,
        parts=(("attention_bias", False), ("mlp_bias", False), ("glu_act_half", 1), ("global_theta", 1000.0)),
        keys=(("embeddings.LayerNorm", "emb_ln"),) + _layer("encoder.layers.#",
            ("attention.self.Wqkv", "attn.Wqkv"), ("attention.output.dense", "attn.out_proj"),
            ("attention.output.LayerNorm", "norm1"), ("intermediate.dense", "mlp.fc1"), ("output.dense", "mlp.fc2"),
            ("output.LayerNorm", "norm2")),
        stacked=(("fc1", ("fc11", "fc12")),),
        head_keys={"ForMaskedLM": (("cls.predictions.transform.LayerNorm", "cls.predictions.transform.layer_norm"),)},
        tied=("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
        # transformers' NomicBertConfig defaults where BERT's differ (the hub's config.json spells few of its keys)
        config_defaults=(("hidden_act", "silu"), ("vocab_size", 30528), ("max_position_embeddings", 2048),
                         ("hidden_dropout_prob", 0.0), ("attention_probs_dropout_prob", 0.0))),
    Family("gte", prefix="gte", class_prefix="Gte", **_GTE, parts=_gte_parts(160_000.0),
           config_defaults=(("vocab_size", 250048), ("max_position_embeddings", 8192), ("type_vocab_size", 1),
                            ("pad_token_id", 1), ("attention_probs_dropout_prob", 0.0))),
    # the same checkpoints as their authors' own code saves them (gte-base-en-v1.5 on the hub: config.json's
    # model_type "new", read by transformers only with trust_remote_code); its NewConfig's defaults
    Family("new", prefix="new", class_prefix="New", **_GTE, parts=_gte_parts(10_000.0),
           config_defaults=(("vocab_size", 30528), ("type_vocab_size", 2), ("attention_probs_dropout_prob", 0.0),
                            ("position_embedding_type", "rope"))),
    Family(
        "deberta-v2", prefix="deberta", class_prefix="DebertaV2", classifier_dropout_first=True, pooler=False,
        disentangled=True,
        keys=(("encoder.relative.rel_embeddings", "encoder.rel_embeddings"),
              ("encoder.relative.LayerNorm", "encoder.LayerNorm")) + _layer("encoder.layer.#",
            ("attention.self.query", "attention.self.query_proj"), ("attention.self.key", "attention.self.key_proj"),
            ("attention.self.value", "attention.self.value_proj"),
            ("attention.self.relative.pos_key_proj", "attention.self.pos_key_proj"),
            ("attention.self.relative.pos_query_proj", "attention.self.pos_query_proj")),
        head_keys={"ForSequenceClassification": (("bert.pooler.dense", "pooler.dense"),)},
        # legacy=false: the MLM head of microsoft's own checkpoints (transformers' default, legacy, is BERT's names)
        variants={"ForMaskedLM": (("legacy", False), _mlm(
            "lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm", "lm_predictions.lm_head.bias"))},
        config_keys=(("classifier_dropout", "cls_dropout"),),
        config_defaults=(("type_vocab_size", 0), ("layer_norm_eps", 1e-7))),
)}


def family(model_type: str) -> Family:
    """The family of a config.json `model_type`; ConfigError naming the ones bertkit reads."""
    try:
        return FAMILIES[model_type]
    except (KeyError, TypeError):
        raise ConfigError(f"model_type {model_type!r} is not a family bertkit reads: "
                          f"{', '.join(sorted(FAMILIES))}") from None


def bert_class_name(name) -> str | None:
    """A transformers class name of any family ("XLMRobertaForMaskedLM") -> ours ("BertForMaskedLM"), or None."""
    if not isinstance(name, str):
        return None
    for f in sorted(FAMILIES.values(), key=lambda f: -len(f.class_prefix)):   # "XLMRoberta" before "Roberta"...
        if name.startswith(f.class_prefix):
            suffixes = {s: s for s in SUFFIXES} | {theirs: ours for ours, theirs in f.class_names.items()}
            ours = suffixes.get(name[len(f.class_prefix):])
            if ours is not None:
                return "Bert" + ours
    return None
