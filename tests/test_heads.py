"""Heads: logits and losses equal transformers' on randomly initialised checkpoints that transformers saved."""

from __future__ import annotations

import pytest
import torch

from bertkit.config import BertConfig
from bertkit.heads import (BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering,
                           BertForSequenceClassification, BertForTokenClassification)

transformers = pytest.importorskip("transformers")

V, B, S = 211, 4, 13


def _hf_config(**kw):
    return transformers.BertConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=96, max_position_embeddings=32, **kw)


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (B, S), generator=g)
    lengths = torch.tensor([S, 7, 10, 4])
    mask = (torch.arange(S)[None] < lengths[:, None]).long()
    types = ((torch.arange(S)[None] >= lengths[:, None] // 2).long()) * mask
    return ids * mask, types, mask


def _save_hf(hf_cls, tmp_path, **cfg):
    torch.manual_seed(0)
    hf = hf_cls(_hf_config(**cfg)).eval()
    hf.save_pretrained(tmp_path)
    return hf


def _close(a, b, tol=1e-5):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert (a - b).abs().max().item() <= tol


@pytest.mark.parametrize("backend", ["eager", "unpadded"])
def test_pretraining_matches_hf(tmp_path, backend):
    hf = _save_hf(transformers.BertForPreTraining, tmp_path)
    ours = BertForPreTraining.from_pretrained(tmp_path, attn_implementation=backend)
    assert ours.loading_info["missing_keys"] == []
    ids, types, mask = _batch()
    labels = torch.full_like(ids, -100)
    pick = torch.rand(ids.shape, generator=torch.Generator().manual_seed(3)) < 0.3
    pick &= mask.bool()
    labels[pick] = ids[pick]
    nsp = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        r = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels, next_sentence_label=nsp)
        o = ours(ids, types, mask, labels=labels, next_sentence_label=nsp, masked_logits_only=True)
        o_full = ours(ids, types, mask)
        o_mlm = ours(ids, types, mask, labels=labels, masked_logits_only=True)
        o_hf_shape = ours(ids, types, mask, labels=labels, next_sentence_label=nsp)   # the default: HF's shape
    assert o_hf_shape.prediction_logits.shape == r.prediction_logits.shape
    _close(o_hf_shape.prediction_logits[mask.bool()], r.prediction_logits[mask.bool()])
    _close(o_hf_shape.loss, r.loss)
    _close(o.loss, r.loss)
    # masked-only projection: logits at the masked rows, in row-major order of the positions
    assert o.prediction_logits.shape == (int(pick.sum()), V)
    _close(o.prediction_logits, r.prediction_logits[pick])
    _close(o.seq_relationship_logits, r.seq_relationship_logits)
    _close(o_full.prediction_logits[mask.bool()], r.prediction_logits[mask.bool()])
    ce = torch.nn.functional.cross_entropy
    _close(o.mlm_loss, ce(r.prediction_logits.reshape(-1, V), labels.reshape(-1)))
    _close(o.nsp_loss, ce(r.seq_relationship_logits, nsp))
    _close(o_mlm.loss, o.mlm_loss)
    assert o_mlm.nsp_loss is None
    assert ours.cls.predictions._word_embeddings.weight is ours.bert.embeddings.word_embeddings.weight


def test_masked_lm_gradients_match_hf(tmp_path):
    hf = _save_hf(transformers.BertForMaskedLM, tmp_path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf.train()
    ours = BertForMaskedLM.from_pretrained(tmp_path).train()
    ids, types, mask = _batch(1)
    labels = torch.full_like(ids, -100)
    labels[:, 1] = ids[:, 1]
    labels[0, 5] = ids[0, 5]
    r = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
    o = ours(ids, types, mask, labels=labels)
    _close(o.loss, r.loss)
    r.loss.backward()
    o.loss.backward()
    hf_params = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        _close(p.grad, hf_params[name].grad, tol=1e-5)


@pytest.mark.parametrize("problem", ["single", "pair_regression", "multi_label"])
def test_sequence_classification_matches_hf(tmp_path, problem):
    kw = {"single": dict(num_labels=3), "pair_regression": dict(num_labels=1),
          "multi_label": dict(num_labels=4, problem_type="multi_label_classification")}[problem]
    hf = _save_hf(transformers.BertForSequenceClassification, tmp_path, **kw)
    ours = BertForSequenceClassification.from_pretrained(tmp_path)
    assert ours.config.num_labels == kw["num_labels"] and ours.loading_info["missing_keys"] == []
    ids, types, mask = _batch(2)
    g = torch.Generator().manual_seed(5)
    labels = {"single": torch.tensor([0, 2, 1, 2]), "pair_regression": torch.rand(B, generator=g),
              "multi_label": (torch.rand(B, 4, generator=g) > 0.5).float()}[problem]
    with torch.no_grad():
        r = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
        o = ours(ids, types, mask, labels=labels)
    _close(o.logits, r.logits)
    _close(o.loss, r.loss)


def test_token_classification_matches_hf(tmp_path):
    hf = _save_hf(transformers.BertForTokenClassification, tmp_path, num_labels=5)
    ours = BertForTokenClassification.from_pretrained(tmp_path)
    ids, types, mask = _batch(3)
    labels = torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(1))
    labels[~mask.bool()] = -100
    with torch.no_grad():
        r = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
        o = ours(ids, types, mask, labels=labels)
    real = mask.bool()
    _close(o.logits[real], r.logits[real])
    _close(o.loss, r.loss)


def test_question_answering_matches_hf(tmp_path):
    hf = _save_hf(transformers.BertForQuestionAnswering, tmp_path)
    ours = BertForQuestionAnswering.from_pretrained(tmp_path)
    ids, types, mask = _batch(4)
    start, end = torch.tensor([1, 2, 40, 0]), torch.tensor([3, 5, 41, 0])  # 40/41: outside, clamped and ignored
    with torch.no_grad():
        r = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, start_positions=start, end_positions=end)
        o = ours(ids, types, mask, start_positions=start, end_positions=end)
    real = mask.bool()
    _close(o.start_logits[real], r.start_logits[real])
    _close(o.end_logits[real], r.end_logits[real])
    # we exclude padding from the span softmax (transformers does not): same loss on its logits with padding masked
    ce = torch.nn.functional.cross_entropy
    neg = torch.finfo(torch.float32).min
    s_ref, e_ref = r.start_logits.masked_fill(~real, neg), r.end_logits.masked_fill(~real, neg)
    _close(o.loss, (ce(s_ref, start.clamp(0, S), ignore_index=S) + ce(e_ref, end.clamp(0, S), ignore_index=S)) / 2)
    # without padding the two definitions coincide: the loss equals transformers' exactly
    full = torch.ones_like(mask)
    with torch.no_grad():
        r = hf(input_ids=ids, token_type_ids=types, attention_mask=full, start_positions=start, end_positions=end)
        o = ours(ids, types, full, start_positions=start, end_positions=end)
    _close(o.loss, r.loss)


def test_problem_type_inference():
    cfg = BertConfig.preset("tiny", vocab_size=50, num_labels=3)
    m = BertForSequenceClassification(cfg)
    assert m.problem_type(torch.tensor([1])) == "single_label_classification"
    assert m.problem_type(torch.tensor([[1.0, 0.0, 1.0]])) == "multi_label_classification"
    assert BertForSequenceClassification(cfg.replace(num_labels=1)).problem_type(torch.tensor([0.5])) == "regression"


def test_mlm_with_no_masked_token_is_zero_not_nan():
    m = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=50))
    ids = torch.randint(1, 50, (2, 6))
    m.masked_logits_only = True
    out = m(ids, labels=torch.full_like(ids, -100))
    assert out.loss.item() == 0.0 and out.logits.shape == (0, 50)
    out.loss.backward()
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3])           # a packed ("unpadded") batch, nothing masked
    m.config.attn_implementation = "unpadded"
    out = m(ids, attention_mask=mask, labels=torch.full_like(ids, -100))
    assert out.loss.item() == 0.0 and out.logits.shape == (0, 50)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "unpadded"])
def test_classification_first_token_only_same_logits_and_gradients(tmp_path, backend):
    """The [CLS]-only last layer gives the full forward's logits, loss and every parameter gradient (dropout 0),
    on a padded batch, in each attention backend; and transformers' gradients too."""
    hf = _save_hf(transformers.BertForSequenceClassification, tmp_path, num_labels=3, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    ids, types, mask = _batch(3)
    labels = torch.tensor([0, 2, 1, 2])
    runs = {}
    for first in (True, False):
        m = BertForSequenceClassification.from_pretrained(tmp_path, attn_implementation=backend).train()
        m.first_token_only = first
        out = m(ids, types, mask, labels=labels)
        out.loss.backward()
        runs[first] = (out, {n: p.grad for n, p in m.named_parameters()})
    hf.train()
    r = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
    r.loss.backward()
    hf_grads = {n: p.grad for n, p in hf.named_parameters()}
    (fo, fg), (lo, lg) = runs[True], runs[False]
    _close(fo.logits, lo.logits)
    _close(fo.logits, r.logits)
    _close(fo.loss, lo.loss)
    assert fg.keys() == lg.keys()
    for name, g in fg.items():
        _close(g, lg[name], tol=1e-5)
        _close(g, hf_grads[name], tol=1e-5)
    # the last layer's query projection only sees [CLS]: its gradient is not all zeros
    assert fg["bert.encoder.layer.1.attention.self.query.weight"].abs().sum() > 0


def test_first_token_only_last_hidden_state_is_cls_row():
    cfg = BertConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                     max_position_embeddings=32)
    from bertkit.model import BertModel
    torch.manual_seed(0)
    m = BertModel(cfg).eval()
    ids, types, mask = _batch(4)
    with torch.no_grad():
        full = m(ids, types, mask)
        first = m(ids, types, mask, first_token_only=True)
        hid = m(ids, types, mask, first_token_only=True, output_hidden_states=True)   # ignored: full output
    assert first.last_hidden_state.shape == (B, 1, 48)
    _close(first.last_hidden_state, full.last_hidden_state[:, :1])
    _close(first.pooler_output, full.pooler_output)
    assert hid.last_hidden_state.shape == (B, S, 48)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "unpadded"])
@pytest.mark.parametrize("kind", ["pretraining", "mlm"])
def test_mlm_last_layer_subset_same_loss_and_gradients(tmp_path, backend, kind):
    """With labels the last layer runs its output projection and FFN for the masked rows (+ [CLS]) only: the loss,
    the masked rows' logits, the NSP logits and every parameter gradient equal transformers' full forward (dropout
    0), in each attention backend."""
    hf_cls = transformers.BertForPreTraining if kind == "pretraining" else transformers.BertForMaskedLM
    ours_cls = BertForPreTraining if kind == "pretraining" else BertForMaskedLM
    hf = _save_hf(hf_cls, tmp_path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ids, types, mask = _batch(5)
    g = torch.Generator().manual_seed(1)
    labels = torch.where((torch.rand(B, S, generator=g) < 0.3) & mask.bool(), ids, torch.full_like(ids, -100))
    labels[0, 0] = -100   # a row whose [CLS] is not masked, as in real data
    kw = {"next_sentence_label": torch.tensor([0, 1, 1, 0])} if kind == "pretraining" else {}
    m = ours_cls.from_pretrained(tmp_path, attn_implementation=backend).train()
    out = m(ids, types, mask, labels=labels, masked_logits_only=True, **kw)
    out.loss.backward()
    hf.train()
    r = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels, **kw)
    r.loss.backward()
    pos = (labels.reshape(-1) != -100).nonzero().squeeze(1)
    assert torch.equal(out.masked_positions, pos)
    hf_logits = (r.prediction_logits if kind == "pretraining" else r.logits).reshape(B * S, -1)[pos]
    logits = out.prediction_logits if kind == "pretraining" else out.logits
    _close(logits, hf_logits, tol=2e-5)
    _close(out.loss, r.loss)
    if kind == "pretraining":
        _close(out.seq_relationship_logits, r.seq_relationship_logits)
    hf_grads = dict(hf.named_parameters())
    for name, p in m.named_parameters():
        _close(p.grad, hf_grads[name].grad, tol=2e-5)


def test_output_rows_selects_the_full_forwards_rows():
    cfg = BertConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                     max_position_embeddings=32)
    from bertkit.model import BertModel
    torch.manual_seed(0)
    ids, types, mask = _batch(6)
    rows = torch.tensor([1, 5, S + 2, 2 * S + 9, 3 * S + 3])            # real tokens of rows 0, 1, 2, 3
    for backend in ("sdpa", "unpadded"):
        m = BertModel(cfg.replace(attn_implementation=backend)).eval()
        with torch.no_grad():
            full = m(ids, types, mask)
            sub = m(ids, types, mask, output_rows=rows)
            hid = m(ids, types, mask, output_rows=rows, output_hidden_states=True)   # full layer, rows selected
            none = m(ids, types, mask, output_rows=rows[:0])
        want = full.last_hidden_state.reshape(B * S, -1)[rows]
        assert sub.last_hidden_state.shape == (5, 48)
        _close(sub.last_hidden_state, want)
        _close(sub.pooler_output, full.pooler_output)
        _close(hid.last_hidden_state, want)
        assert none.last_hidden_state.shape == (0, 48)
        _close(none.pooler_output, full.pooler_output)


def test_mlm_labels_on_padding_fall_back_to_the_full_last_layer():
    """A label on a padded position (not a row of the packed batch) gives the loss it gave before the masked-rows
    path: the full last layer runs and that position's (zero) output is read."""
    torch.manual_seed(0)
    m = BertForMaskedLM(BertConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=96, max_position_embeddings=32, attn_implementation="unpadded",
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    ids, types, mask = _batch(7)
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 9] = 5, 6                      # mask[1, 9] == 0: a padded position
    losses = {}
    for subset in (True, False):
        m.masked_rows_only = subset
        losses[subset] = m(ids, types, mask, labels=labels).loss
    _close(losses[True], losses[False])
