"""A fresh ModernBERT (pre-training from scratch, new heads) starts as transformers' ModernBertPreTrainedModel
initialises one: per module type the weights' std (truncated normal; inputs at initializer_range, residual outputs
scaled by 1 / sqrt(2 x layers), classifiers at hidden_size ** -0.5) equals transformers' own fresh model's; BERT's
init is untouched."""

from __future__ import annotations

import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertkit.config import BertConfig  # noqa: E402
from bertkit.families import family  # noqa: E402
from bertkit.heads import BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification  # noqa: E402

SHAPE = dict(vocab_size=500, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=256,
             pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


def _stds(model) -> dict[str, tuple[float, int]]:
    """(std, count) of the weight matrices by module type (layer numbers dropped, every layer's weights pooled)."""
    groups: dict[str, list] = {}
    for name, p in model.named_parameters():
        if p.dim() == 2:
            groups.setdefault(re.sub(r"\.\d+\.", ".#.", name), []).append(p.detach().flatten())
    return {k: (torch.cat(v).std().item(), sum(x.numel() for x in v)) for k, v in groups.items()}


@pytest.mark.parametrize("ours, head", [(BertForMaskedLM, "ForMaskedLM"),
                                        (BertForSequenceClassification, "ForSequenceClassification"),
                                        (BertForQuestionAnswering, "ForQuestionAnswering")])
@pytest.mark.parametrize("cutoff", [2.0, 3.0])
def test_weight_std_per_module_type_equals_transformers(ours, head, cutoff):
    config = transformers.ModernBertConfig(**SHAPE, initializer_cutoff_factor=cutoff)
    torch.manual_seed(0)
    ref = getattr(transformers, f"ModernBert{head}")(config)
    torch.manual_seed(1)
    model = ours(BertConfig.from_dict(config.to_dict()))
    fam, want = family("modernbert"), _stds(ref)
    got = {re.sub(r"\.\d+\.", ".#.", fam.to_theirs(re.sub(r"\.#\.", ".0.", k), head)): v
           for k, v in _stds(model).items()}
    got = {re.sub(r"\.\d+\.", ".#.", k): v for k, v in got.items()}
    assert set(got) == set(want)
    for name, (std, n) in want.items():     # a 2 x hidden classifier's std is known to a few percent only
        assert got[name][0] == pytest.approx(std, rel=0.03 if n > 10_000 else 0.15), name
    bound = cutoff * config.initializer_range
    assert model.bert.encoder.layer[0].attention.self.Wqkv.weight.abs().max() <= bound


def test_bert_keeps_its_normal_init():
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(**{k: SHAPE[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                                 "num_attention_heads", "intermediate_size")}))
    stds = _stds(model)
    assert stds["bert.encoder.layer.#.output.dense.weight"][0] == pytest.approx(0.02, rel=0.03)
    assert model.bert.encoder.layer[0].output.dense.weight.abs().max() > 3 * 0.02     # not truncated
