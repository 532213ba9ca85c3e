"""What a transformers user reaches for on the model side: dtype / torch_dtype, embeddings access and resizing,
gradient checkpointing, ModelOutput indexing, return_dict=False."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit import BertConfig, BertForMaskedLM, BertModel
from bertkit.errors import ConfigError


def _cfg(**kw):
    return BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=32, **kw)


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("mlm")
    BertForMaskedLM(_cfg()).save_pretrained(d)
    return d


@pytest.mark.parametrize("kw", [{"dtype": torch.bfloat16}, {"torch_dtype": torch.bfloat16},
                                {"dtype": "bfloat16"}, {"torch_dtype": "torch.bfloat16"}, {"dtype": "bf16"}])
def test_dtype_and_torch_dtype(mlm_dir, kw):
    m = BertForMaskedLM.from_pretrained(mlm_dir, **kw)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}


def test_dtype_auto_follows_the_config_then_the_weights(mlm_dir, tmp_path):
    assert next(BertModel.from_pretrained(mlm_dir, dtype="auto").parameters()).dtype == torch.float32
    BertForMaskedLM.from_pretrained(mlm_dir, dtype=torch.float16).save_pretrained(tmp_path)
    assert next(BertModel.from_pretrained(tmp_path, torch_dtype="auto").parameters()).dtype == torch.float16
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "bfloat16"}))
    assert next(BertModel.from_pretrained(tmp_path, dtype="auto").parameters()).dtype == torch.bfloat16
    assert BertModel.from_pretrained(tmp_path).embeddings.word_embeddings.weight.dtype == torch.float32


def test_bad_dtype_is_a_config_error(mlm_dir):
    with pytest.raises(ConfigError, match="dtype='bfloat17'"):
        BertModel.from_pretrained(mlm_dir, dtype="bfloat17")
    with pytest.raises(ConfigError, match="give one"):
        BertModel.from_pretrained(mlm_dir, dtype=torch.float32, torch_dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------------- outputs
def _ids(seed=0, b=3, s=9):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (b, s), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 4], labels[2, 7] = 7, 8, 9
    return ids, mask, labels


def test_outputs_index_and_unpack_like_model_output():
    torch.manual_seed(0)
    m = BertModel(_cfg()).eval()
    ids, mask, _ = _ids()
    with torch.no_grad():
        out = m(ids, attention_mask=mask)
        tup = m(ids, attention_mask=mask, return_dict=False)
    assert out.keys() == ["last_hidden_state", "pooler_output"] and len(out) == 2 and "pooler_output" in out
    assert out[0] is out.last_hidden_state and out["pooler_output"] is out.pooler_output and out[-1] is out[1]
    h, pooled = out
    assert h is out.last_hidden_state and pooled is out.pooler_output
    assert out.to_tuple() == (h, pooled) and out[:1] == (h,) and dict(out)["pooler_output"] is pooled
    assert isinstance(tup, tuple) and len(tup) == 2 and torch.equal(tup[0], h) and torch.equal(tup[1], pooled)
    with pytest.raises(KeyError, match="hidden_states"):
        out["hidden_states"]                                     # None: absent, as in transformers
    assert out.get("hidden_states") is None
    with torch.no_grad():
        full = m(ids, attention_mask=mask, output_hidden_states=True)
    assert full.keys() == ["last_hidden_state", "pooler_output", "hidden_states"] and len(full[2]) == 3


def test_head_tuples_have_transformers_positions():
    """bertkit's extras (masked_positions, mlm_loss, nsp_loss) stay out of the tuple: loss, logits = out works."""
    from bertkit import BertForPreTraining, BertForSequenceClassification
    torch.manual_seed(0)
    ids, mask, labels = _ids()
    mlm = BertForMaskedLM(_cfg()).eval()
    loss, logits = mlm(ids, attention_mask=mask, labels=labels)
    assert logits.shape == (3, 9, 50) and loss.dim() == 0                 # transformers' shape by default
    loss, logits = mlm(ids, attention_mask=mask, labels=labels, masked_logits_only=True)
    assert logits.shape == (3, 50) and loss.dim() == 0
    out = mlm(ids, attention_mask=mask, labels=labels, masked_logits_only=True)
    assert out.keys() == ["loss", "logits"] and out["masked_positions"].tolist() == [2, 13, 25]
    pt = BertForPreTraining(_cfg()).eval()
    out = pt(ids, attention_mask=mask, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]))
    assert out.keys() == ["loss", "prediction_logits", "seq_relationship_logits"]
    assert out[1] is out.prediction_logits and out["mlm_loss"] is out.mlm_loss
    clf = BertForSequenceClassification(_cfg()).eval()
    loss, logits = clf(ids, attention_mask=mask, labels=torch.tensor([0, 1, 1]), return_dict=False)
    assert logits.shape == (3, 2)


def test_tuples_match_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    from bertkit import BertForPreTraining
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32)).eval()
    hf.save_pretrained(tmp_path)
    ours = BertForPreTraining.from_pretrained(tmp_path)
    ids, mask, labels = _ids()
    kw = dict(attention_mask=mask, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]), return_dict=False)
    with torch.no_grad():
        theirs = hf(input_ids=ids, **kw)
        mine = ours(ids, masked_logits_only=False, **kw)
    assert len(mine) == len(theirs) == 3
    real = mask.bool()                                          # padded rows' logits are undefined in both
    for a, b in zip(mine, theirs):
        assert a.shape == b.shape
        assert ((a[real] - b[real]) if a.dim() == 3 else (a - b)).abs().max() < 1e-5


def test_forward_flags_are_checked():
    m = BertForMaskedLM(_cfg()).eval()
    ids, _, _ = _ids()
    m(ids, position_ids=None, head_mask=None, inputs_embeds=None)   # transformers' defaults: accepted
    with pytest.raises(ConfigError, match="unexpected argument 'use_cache'"):
        m(ids, use_cache=False)
    with pytest.raises(ConfigError, match="head_mask is not supported"):
        m(ids, head_mask=torch.ones(2, 4))
    with pytest.raises(ConfigError, match="unexpected argument 'masked_logits_only'"):
        BertModel(_cfg())(ids, masked_logits_only=True)


# ---------------------------------------------------------------------------------------------- MLM logits shape
@pytest.mark.parametrize("cls_name", ["BertForMaskedLM", "BertForPreTraining"])
def test_masked_logits_only_flag_and_attribute(cls_name):
    import bertkit
    cls = getattr(bertkit, cls_name)
    torch.manual_seed(0)
    m = cls(_cfg(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    ids, mask, labels = _ids()
    pick = labels != -100
    with torch.no_grad():
        full = m(ids, attention_mask=mask, labels=labels)              # the default: transformers' shape
        default = m(ids, attention_mask=mask, labels=labels, masked_logits_only=True)
        m.masked_logits_only = True                                    # what bertkit's pre-training sets
        attr = m(ids, attention_mask=mask, labels=labels)
        forced = m(ids, attention_mask=mask, labels=labels, masked_logits_only=False)
        nolabels = m(ids, attention_mask=mask)
    name = "logits" if cls_name == "BertForMaskedLM" else "prediction_logits"

    def logits(o):
        return o[name]
    assert logits(default).shape == (3, 50) and logits(attr).shape == (3, 50)
    assert logits(full).shape == (3, 9, 50) and logits(forced).shape == (3, 9, 50)
    assert (logits(full)[pick] - logits(default)).abs().max() < 1e-5
    assert (logits(full) - logits(nolabels)).abs().max() < 1e-5
    for o in (full, attr, forced):
        assert (o.loss - default.loss).abs() < 1e-6
    assert torch.equal(full.masked_positions, default.masked_positions)
    assert type(m).masked_logits_only is False                        # the class default is untouched


# ---------------------------------------------------------------------------------------------- embeddings
def test_get_and_set_input_embeddings():
    from bertkit import BertForSequenceClassification
    torch.manual_seed(0)
    m = BertForMaskedLM(_cfg())
    emb = m.get_input_embeddings()
    assert emb is m.bert.embeddings.word_embeddings and m.base_model is m.bert
    new = torch.nn.Embedding(60, 32, padding_idx=0)
    m.set_input_embeddings(new)
    assert m.get_input_embeddings() is new and m.config.vocab_size == 60
    assert m.cls.predictions._word_embeddings is new and m.cls.predictions.bias.shape == (60,)
    assert m(torch.tensor([[5, 59]])).logits.shape == (1, 2, 60)
    with pytest.raises(ConfigError, match="nn.Embedding"):
        m.set_input_embeddings(torch.nn.Embedding(60, 16))
    assert BertForSequenceClassification(_cfg()).get_input_embeddings().num_embeddings == 50
    assert BertModel(_cfg()).base_model.get_input_embeddings().num_embeddings == 50


def test_resize_token_embeddings_grows_and_shrinks_with_the_tied_decoder(tmp_path):
    torch.manual_seed(0)
    m = BertForMaskedLM(_cfg()).eval()
    with torch.no_grad():
        m.cls.predictions.bias.normal_()
    old_w = m.get_input_embeddings().weight.detach().clone()
    old_b = m.cls.predictions.bias.detach().clone()
    ids = torch.tensor([[2, 7, 9, 3]])
    with torch.no_grad():
        before = m(ids).logits
    emb = m.resize_token_embeddings(53, pad_to_multiple_of=8)            # 53 -> 56
    assert emb is m.get_input_embeddings() and emb.weight.shape == (56, 32) and m.config.vocab_size == 56
    assert torch.equal(emb.weight[:50], old_w)
    assert torch.allclose(emb.weight[50:], old_w.mean(0).expand(6, -1))   # new rows: the mean of the old ones
    bias = m.cls.predictions.bias
    assert bias.shape == (56,) and torch.equal(bias[:50], old_b) and not bias[50:].any()
    assert m.cls.predictions._word_embeddings.weight is emb.weight        # still tied
    assert dict(m.named_parameters())["cls.predictions.bias"] is bias
    with torch.no_grad():
        after = m(ids).logits
    assert after.shape == (1, 4, 56) and torch.allclose(after[..., :50], before, atol=1e-6)
    m.save_pretrained(tmp_path)
    assert BertForMaskedLM.from_pretrained(tmp_path).config.vocab_size == 56
    m.resize_token_embeddings(40)
    assert m.get_input_embeddings().weight.shape == (40, 32) and m.cls.predictions.bias.shape == (40,)
    assert m.config.vocab_size == 40 and m.resize_token_embeddings(pad_to_multiple_of=64).num_embeddings == 64


def test_resize_errors_name_the_value():
    m = BertModel(_cfg(pad_token_id=30))
    with pytest.raises(ConfigError, match="pad_token_id=30"):
        m.resize_token_embeddings(20)
    assert m.config.vocab_size == 50 and m.get_input_embeddings().num_embeddings == 50   # nothing changed
    with pytest.raises(ConfigError, match="pad_to_multiple_of must be a positive int, got 0"):
        m.resize_token_embeddings(60, pad_to_multiple_of=0)
    with pytest.raises(ConfigError, match="new_num_tokens must be a positive int, got -1"):
        m.resize_token_embeddings(-1)


# ---------------------------------------------------------------------------------------------- checkpointing
@pytest.mark.parametrize("backend", ["eager", "sdpa", "unpadded"])
def test_gradient_checkpointing_recomputes_each_layer_with_equal_gradients(backend):
    from bertkit import BertForPreTraining
    torch.manual_seed(0)
    m = BertForPreTraining(_cfg(attn_implementation=backend)).train()   # dropout on: RNG state must be replayed
    ids, mask, labels = _ids()
    nsp = torch.tensor([0, 1, 0])

    def run():
        m.zero_grad()
        torch.manual_seed(1)
        m(ids, attention_mask=mask, labels=labels, next_sentence_label=nsp).loss.backward()
        return {n: p.grad.clone() for n, p in m.named_parameters()}

    plain = run()
    calls = [0] * len(m.bert.encoder.layer)
    for i, layer in enumerate(m.bert.encoder.layer):
        # a pre-hook: the recompute stops as soon as backward has its tensors, before a post-forward hook would run
        layer.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    assert not m.is_gradient_checkpointing
    m.gradient_checkpointing_enable()
    assert m.is_gradient_checkpointing and m.bert.execution.checkpoint_layers
    checkpointed = run()
    assert calls == [2, 2]                                          # forward, then again in backward
    for name, g in plain.items():
        assert (g - checkpointed[name]).abs().max() <= 1e-6, name
    with torch.no_grad():
        m(ids, attention_mask=mask)
    assert calls == [3, 3]                                          # no backward, nothing recomputed
    m.gradient_checkpointing_disable()
    run()
    assert calls == [4, 4] and not m.is_gradient_checkpointing


def test_gradient_checkpointing_survives_runtime_apply_and_checks_kwargs():
    from bertkit import runtime
    m = BertModel(_cfg())
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    runtime.apply(m)
    assert m.execution.checkpoint_layers
    with pytest.raises(ConfigError, match="use_reentrant=False"):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
