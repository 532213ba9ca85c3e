"""Every encoder family against transformers, both ways: a directory transformers saved loads here with equal hidden
states, head logits and gradients (fp32, every attention backend), and a directory bertkit saved loads there with
no missing or unexpected keys and equal logits. Models are transformers' own config classes with random weights."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from bertkit import heads, runtime
from bertkit.errors import ConfigError
from bertkit.families import FAMILIES, bert_class_name
from bertkit.config import BertConfig
from bertkit.model import BertModel
from bertkit.modern import parts
from bertkit.runtime import int8

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# the published base shapes (roberta-base, electra-base-discriminator, distilbert-base-uncased, mpnet-base,
# albert-base-v2: one shared layer), small vocab
BASE = dict(TINY, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            max_position_embeddings=514)
# ModernBERT-base's: 22 layers, GLU width 1152, a global layer every 3, the others a 128-token window
MODERN_BASE = dict(BASE, num_hidden_layers=22, intermediate_size=1152, local_attention=128, max_position_embeddings=8192)

DEBERTA_V3 = dict(relative_attention=True, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
                  norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False, type_vocab_size=0)

def hf_config(model_type: str, shape: dict):
    """transformers' config class of the family, in the shape given (its own spelling of the fields)."""
    kw = dict(shape)
    if model_type in ("roberta", "xlm-roberta"):
        kw.update(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    if model_type == "mpnet":
        kw.update(pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
    if model_type == "deberta-v2":       # DeBERTa-v3's: relative positions only, log buckets past a few at tiny
        kw.update(DEBERTA_V3, position_buckets=256 if kw["hidden_size"] == 768 else 8)
    if model_type in ("electra", "albert"):
        kw.update(embedding_size=kw["hidden_size"] // 2)
    if model_type == "albert":
        kw.update(num_hidden_groups=2 if kw["num_hidden_layers"] == 2 else 1, classifier_dropout_prob=0.0)
    if model_type == "modernbert":
        kw = dict(MODERN_BASE if shape is BASE else shape)
        kw["attention_dropout"] = kw.pop("attention_probs_dropout_prob")
        del kw["hidden_dropout_prob"]
        kw.setdefault("local_attention", 8)    # tiny: |i - j| <= 4, shorter than the test rows, so it matters
        kw.update(global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                  sep_token_id=2)
    if model_type == "gte" and shape is BASE:       # gte-base-en-v1.5's: no token types, rotary base 500000
        kw.update(type_vocab_size=0, rope_parameters={"rope_type": "default", "rope_theta": 500_000.0})
    if model_type == "distilbert":
        names = {"hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                 "intermediate_size": "hidden_dim", "hidden_dropout_prob": "dropout",
                 "attention_probs_dropout_prob": "attention_dropout"}
        kw = {names.get(k, k): v for k, v in kw.items()}
        kw.update(seq_classif_dropout=0.0, qa_dropout=0.0)
    return transformers.AutoConfig.for_model(model_type, **kw)


HEADS = {"Model": BertModel, "ForMaskedLM": heads.BertForMaskedLM,
         "ForSequenceClassification": heads.BertForSequenceClassification,
         "ForTokenClassification": heads.BertForTokenClassification,
         "ForQuestionAnswering": heads.BertForQuestionAnswering}
# every head transformers has for the family: NomicBERT and GTE have no question answering (named, so that a renamed
# class fails below instead of skipping a family)
NO_HEAD = {("nomic_bert", "ForQuestionAnswering"), ("gte", "ForQuestionAnswering")}
# the families transformers builds itself (not "new": GTE under its authors' remote-code names, tested on its own)
REFERENCED = [t for t in FAMILIES if t != "bert" and hasattr(transformers, FAMILIES[t].class_prefix + "Model")]
FAMILY_HEADS = [(t, h) for t in REFERENCED for h in HEADS if (t, h) not in NO_HEAD]
assert all(hasattr(transformers, FAMILIES[t].class_prefix + h) for t, h in FAMILY_HEADS)
FAMILY_HEADS += [("electra", "ForPreTraining"),                 # ELECTRA's discriminator
                 ("albert", "ForPreTraining")]                  # ALBERT's MLM + sentence order


def _batch(cfg, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, cfg.vocab_size, (3, 17), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    mask[2, 6:] = 0
    return ids.masked_fill(mask == 0, cfg.pad_token_id), mask


def _pair(tmp_path, model_type: str, suffix: str, shape=TINY, **ours):
    cfg = hf_config(model_type, shape)
    torch.manual_seed(0)
    cls = getattr(transformers, transformers.AutoConfig.for_model(model_type).__class__.__name__
                  .replace("Config", "") + suffix)
    ref = cls(cfg).eval()
    ref.save_pretrained(tmp_path / "hf")
    name = bert_class_name(cls.__name__)                 # ElectraForPreTraining -> BertForReplacedTokenDetection
    ours_cls = BertModel if name == "BertModel" else getattr(heads, name)
    return cfg, ref, ours_cls.from_pretrained(tmp_path / "hf", **ours).eval()


def _main(out):
    if hasattr(out, "prediction_logits"):
        return out.prediction_logits
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else (
        torch.stack([out.start_logits, out.end_logits]) if hasattr(out, "start_logits") else out.logits)


@pytest.mark.parametrize("model_type,suffix", FAMILY_HEADS)
@pytest.mark.parametrize("backend", ["eager", "sdpa", "unpadded"])
def test_outputs_equal_transformers(tmp_path, model_type, suffix, backend):
    cfg, ref, ours = _pair(tmp_path, model_type, suffix, attn_implementation=backend)
    assert ours.loading_info["missing_keys"] == [] and ours.loading_info["ignored_keys"] == []
    ids, mask = _batch(cfg)
    with torch.no_grad():
        want, got = _main(ref(input_ids=ids, attention_mask=mask)), _main(ours(ids, attention_mask=mask))
    real = mask.bool()                      # padding positions: transformers computes them, nobody reads them
    if suffix == "ForQuestionAnswering":
        want, got = want[:, real], got[:, real]
    elif suffix != "ForSequenceClassification":
        want, got = want[real], got[real]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type,suffix", [(t, h) for t, h in FAMILY_HEADS if h != "Model"])
def test_gradients_of_a_training_step_equal_transformers(tmp_path, model_type, suffix):
    cfg, ref, ours = _pair(tmp_path, model_type, suffix)
    ids, mask = _batch(cfg, seed=1)
    if suffix == "ForQuestionAnswering":      # bertkit keeps padding out of the span softmax; transformers does not
        ids, mask = ids[:1], mask[:1]
    g = torch.Generator().manual_seed(2)
    mlm = suffix == "ForMaskedLM" or model_type == "albert" and suffix == "ForPreTraining"
    if mlm:                                   # no label on padding: nothing real reads it
        labels = {"labels": torch.where((torch.rand(ids.shape, generator=g) < 0.3) & mask.bool(), ids, -100)}
    elif suffix == "ForSequenceClassification":
        labels = {"labels": torch.tensor([0, 1, 1])}
    elif suffix == "ForTokenClassification":
        labels = {"labels": torch.randint(0, 2, ids.shape, generator=g).masked_fill(mask == 0, -100)}
    elif suffix == "ForPreTraining":              # ELECTRA: which tokens were replaced
        labels = {"labels": torch.randint(0, 2, ids.shape, generator=g)}
    else:
        labels = {"start_positions": torch.tensor([2]), "end_positions": torch.tensor([4])}
    theirs_labels, ours_labels = dict(labels), dict(labels)
    if model_type == "albert" and suffix == "ForPreTraining":    # and the sentence-order target, each its name
        theirs_labels["sentence_order_label"] = ours_labels["next_sentence_label"] = torch.tensor([0, 1, 1])
    ref.train()
    ours.train()
    ref(input_ids=ids, attention_mask=mask, **theirs_labels).loss.backward()
    ours(ids, attention_mask=mask, **ours_labels).loss.backward()
    theirs = _gradients_as_ours(ref, type(ours), tmp_path / "grads")
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def _gradients_as_ours(ref, cls, path) -> dict:
    """transformers' gradients under our parameter names: saved as `ref`'s weights (overwritten; transformers writes
    its checkpoint names, NomicBERT's and GTE's fused where its modules are not) and read by bertkit."""
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.zeros_like(p) if p.grad is None else p.grad)
    ref.save_pretrained(path)
    return dict(cls.from_pretrained(path).named_parameters())


@pytest.mark.parametrize("model_type,suffix", FAMILY_HEADS)
def test_a_bertkit_directory_loads_in_transformers_with_equal_logits(tmp_path, model_type, suffix):
    cfg, ref, ours = _pair(tmp_path, model_type, suffix)
    ours.save_pretrained(tmp_path / "ours")
    back, info = type(ref).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert transformers.AutoConfig.from_pretrained(tmp_path / "ours").model_type == model_type
    ids, mask = _batch(cfg)
    with torch.no_grad():
        torch.testing.assert_close(_main(back.eval()(input_ids=ids, attention_mask=mask)),
                                   _main(ref(input_ids=ids, attention_mask=mask)), atol=0, rtol=0)


@pytest.mark.parametrize("model_type", REFERENCED)
def test_base_shapes_equal_transformers(tmp_path, model_type):
    cfg, ref, ours = _pair(tmp_path, model_type, "Model", shape=BASE)
    ids, mask = _batch(cfg)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        got = ours(ids, attention_mask=mask).last_hidden_state[mask.bool()]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_head_loads_from_the_bare_encoder_and_the_other_way(tmp_path):
    """Fine-tuning starts from a family's bare encoder (or its MLM checkpoint); embeddings read a head's encoder."""
    cfg, ref, _ = _pair(tmp_path, "roberta", "Model")
    clf = heads.BertForSequenceClassification.from_pretrained(tmp_path / "hf")
    assert sorted(clf.loading_info["missing_keys"]) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight",
                                                        "classifier.bias", "classifier.weight"]
    assert clf.loading_info["ignored_keys"] == ["unused.pooler.dense.bias", "unused.pooler.dense.weight"]
    mlm_cfg, mlm, _ = _pair(tmp_path / "mlm", "roberta", "ForMaskedLM")
    enc = BertModel.from_pretrained(tmp_path / "mlm" / "hf")
    ids, mask = _batch(mlm_cfg)
    with torch.no_grad():
        torch.testing.assert_close(enc(ids, attention_mask=mask).last_hidden_state[mask.bool()],
                                   mlm.roberta(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()])


def test_another_heads_layers_are_never_loaded_as_this_ones(tmp_path):
    """RoBERTa's classifier.dense is no encoder's pooler, nor its out_proj a token classifier: both start fresh."""
    _pair(tmp_path, "roberta", "ForSequenceClassification")
    enc = BertModel.from_pretrained(tmp_path / "hf")
    assert enc.loading_info["missing_keys"] == ["pooler.dense.bias", "pooler.dense.weight"]
    tagger = heads.BertForTokenClassification.from_pretrained(tmp_path / "hf")
    assert sorted(tagger.loading_info["missing_keys"]) == ["classifier.bias", "classifier.weight"]


def test_positions_count_from_the_padding_id_and_its_limit_is_named(tmp_path):
    cfg, ref, ours = _pair(tmp_path, "roberta", "Model")
    too_long = torch.full((1, cfg.max_position_embeddings - 1), 5)
    with pytest.raises(Exception, match="less the 2 positions roberta reserves"):
        ours(too_long)


def test_class_names_map_both_ways():
    for model_type, f in FAMILIES.items():
        for ours in ("BertModel", "BertForMaskedLM", "BertForSequenceClassification"):
            assert bert_class_name(f.class_name(ours)) == ours, (model_type, ours)
    assert bert_class_name("ElectraForPreTraining") == "BertForReplacedTokenDetection"
    assert bert_class_name("XLMRobertaModel") == "BertModel"
    assert bert_class_name("GPT2Model") is None


def test_modernbert_config_round_trips_and_its_window_matters(tmp_path):
    """transformers reads back every value of a bertkit-saved ModernBERT config.json; the older keys
    (global_rope_theta, global_attn_every_n_layers) of published checkpoints are read; the window changes outputs."""
    cfg, ref, ours = _pair(tmp_path, "modernbert", "ForMaskedLM")
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.AutoConfig.from_pretrained(tmp_path / "ours").to_dict()
    skip = ("transformers_version", "architectures", "_name_or_path", "dtype")
    assert {k: v for k, v in cfg.to_dict().items() if k not in skip} == {k: back[k] for k in cfg.to_dict() if k not in skip}
    old = BertConfig.from_dict({"model_type": "modernbert", "vocab_size": 120, "hidden_size": 32,
                                "num_hidden_layers": 4, "num_attention_heads": 4, "pad_token_id": 0,
                                "global_rope_theta": 1000.0, "global_attn_every_n_layers": 2})
    assert parts(old).local_layers == (False, True, False, True) and parts(old).global_theta == 1000.0
    ids, mask = _batch(cfg)
    raw = json.loads((tmp_path / "ours" / "config.json").read_text())
    (tmp_path / "ours" / "config.json").write_text(json.dumps(dict(raw, local_attention=64)))
    wide = heads.BertForMaskedLM.from_pretrained(tmp_path / "ours")
    with torch.no_grad():
        assert not torch.allclose(wide(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits)


@pytest.mark.parametrize("backend", ["eager", "unpadded"])
def test_modernbert_mean_pooling_equals_transformers(tmp_path, backend):
    cfg, ref, ours = _pair(tmp_path, "modernbert", "ForSequenceClassification",
                           shape=dict(TINY, classifier_pooling="mean"), attn_implementation=backend)
    ids, mask = _batch(cfg)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, attention_mask=mask).logits,
                                   ref(input_ids=ids, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)

@pytest.mark.parametrize("model_type", REFERENCED)
@pytest.mark.parametrize("backend", ["sdpa", "unpadded"])
def test_frozen_and_int8_models_run_every_family(tmp_path, model_type, backend):
    """runtime.freeze (frozen linears, fused Q/K/V where a family has separate ones, the FFN activation in its GEMM
    where it is not a GLU) keeps the logits; int8 layers run, and load back as saved."""
    cfg, ref, ours = _pair(tmp_path, model_type, "ForSequenceClassification", attn_implementation=backend)
    ids, mask = _batch(cfg)
    with torch.no_grad():
        want = ours(ids, attention_mask=mask).logits
        frozen = runtime.freeze(copy.deepcopy(ours), runtime.plan(force="all"))
        torch.testing.assert_close(frozen(ids, attention_mask=mask).logits, want, atol=1e-5, rtol=1e-5)
        quantized = runtime.freeze(int8.quantize(copy.deepcopy(ours)), runtime.plan(force="all"))
        got = quantized(ids, attention_mask=mask).logits
        assert got.shape == want.shape and torch.isfinite(got).all()
        quantized.save_pretrained(tmp_path / "int8")
        back = type(ours).from_pretrained(tmp_path / "int8", attn_implementation=backend)
        torch.testing.assert_close(back(ids, attention_mask=mask).logits, got)


# ---------------------------------------------------------------------------------------------- DeBERTa-v2 / v3
DEBERTA_V2 = dict(relative_attention=True, pos_att_type="c2p|p2c", position_biased_input=True, share_att_key=False,
                  max_relative_positions=24, type_vocab_size=2)      # v2-style: own position projections, no buckets


@pytest.mark.parametrize("variant", ["v3", "v2", "mlm_not_legacy"])
@pytest.mark.parametrize("backend", ["eager", "sdpa", "unpadded"])
@pytest.mark.parametrize("length", [3, 17, 60])        # under, over and far past the tiny shape's 4 exact buckets
def test_deberta_lengths_and_variants_equal_transformers_both_ways(tmp_path, variant, backend, length):
    kw = dict(TINY, **(DEBERTA_V2 if variant == "v2" else dict(DEBERTA_V3, position_buckets=8)))
    if variant == "mlm_not_legacy":                     # microsoft's own MLM head names, lm_predictions.lm_head.*
        kw["legacy"] = False
    cls = transformers.DebertaV2ForMaskedLM if variant == "mlm_not_legacy" else \
        transformers.DebertaV2ForSequenceClassification
    torch.manual_seed(0)
    ref = cls(transformers.DebertaV2Config(**kw)).eval()
    ref.save_pretrained(tmp_path / "hf")
    ours = getattr(heads, bert_class_name(cls.__name__)).from_pretrained(tmp_path / "hf", attn_implementation=backend)
    assert ours.loading_info["missing_keys"] == [] and ours.loading_info["ignored_keys"] == []
    g = torch.Generator().manual_seed(length)
    ids = torch.randint(4, 120, (3, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, length // 2 + 1:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        want, got = ref(input_ids=ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    real = mask.bool() if want.dim() == 3 else slice(None)
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    ours.save_pretrained(tmp_path / "ours")
    back, info = cls.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(input_ids=ids, attention_mask=mask).logits,
                                   ref(input_ids=ids, attention_mask=mask).logits, atol=0, rtol=0)


def test_a_bertkit_deberta_config_loads_in_transformers_with_the_same_values(tmp_path):
    cfg, ref, ours = _pair(tmp_path, "deberta-v2", "ForSequenceClassification", shape=BASE)
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.DebertaV2Config.from_pretrained(tmp_path / "ours").to_dict()
    want = cfg.to_dict()
    for key in ("architectures", "transformers_version"):
        back.pop(key, None), want.pop(key, None)
    assert {k: back[k] for k in want} == want
    assert set(back) - set(want) == {"cls_dropout", "position_embedding_type"}    # BertConfig's own, at defaults


def test_deberta_parts_bertkit_does_not_compute_are_refused_by_name(tmp_path):
    cfg = transformers.DebertaV2Config(**TINY, conv_kernel_size=3)
    transformers.DebertaV2Model(cfg).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="config.json: deberta-v2 config key conv_kernel_size=3 is not supported"):
        BertModel.from_pretrained(tmp_path)


def test_deberta_frozen_equals_and_int8_runs(tmp_path):
    """runtime.freeze (fused Q/K/V, frozen position projections) keeps the outputs; int8 quantizes every linear layer,
    the position projections too, and the directory `bertkit quantize` writes loads and runs."""
    from bertkit import runtime
    from bertkit.quantize import quantize_dir
    cfg, ref, ours = _pair(tmp_path, "deberta-v2", "ForSequenceClassification")
    ids, mask = _batch(cfg)
    with torch.no_grad():
        want = ours(ids, attention_mask=mask).logits
        frozen = runtime.freeze(copy.deepcopy(ours), runtime.plan(force="all"))
        torch.testing.assert_close(frozen(ids, attention_mask=mask).logits, want, atol=1e-5, rtol=1e-5)
    report = quantize_dir(tmp_path / "hf", tmp_path / "int8", force=True)
    assert report["int8_layers"] == 2 * 6 + 2          # q, k, v, o, ffn in, ffn out a layer; pooler.dense, classifier
    q = heads.BertForSequenceClassification.from_pretrained(tmp_path / "int8")
    with torch.no_grad():
        got = runtime.freeze(q, runtime.plan(force="all"))(ids, attention_mask=mask).logits
    assert torch.isfinite(got).all() and (got - want).abs().max() < 0.05


@pytest.mark.parametrize("backend", ["sdpa", "unpadded"])
def test_deberta_v3_base_past_its_exact_buckets_equals_transformers(tmp_path, backend):
    """v3-base keeps distances under 128 exact: a 300-token row reaches its logarithmic buckets."""
    assert_long_rows_equal(tmp_path, "deberta-v2", "Model", BASE, backend, 300, 140)


def assert_long_rows_equal(tmp_path, model_type, suffix, shape, backend, length, real):
    """Two rows of `length` tokens, the second real up to `real`: ours equals transformers at the real tokens."""
    cfg, ref, ours = _pair(tmp_path, model_type, suffix, shape=shape, attn_implementation=backend)
    ids = torch.randint(4, cfg.vocab_size, (2, length), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, real:] = 0
    with torch.no_grad():
        want, got = _main(ref(input_ids=ids, attention_mask=mask)), _main(ours(ids, attention_mask=mask))
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)
