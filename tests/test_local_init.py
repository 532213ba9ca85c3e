"""The local attention init (bertkit.pretraining.local_init): at step 0 each first-layer head attends mostly to its
offset token, the rest of BERT's init is untouched, and the --budget plan chooses it unless a flag says otherwise."""

from __future__ import annotations

import torch

from bertkit.commands.pretrain import config_from_argv
from bertkit.config import BertConfig
from bertkit.heads import BertForPreTraining
from bertkit.pretraining.local_init import OFFSETS, local_attention_init
from bertkit.train.recipe import apply_plan, given_settings, plan_recipe


def _attention(model, seq=64):
    ids = torch.randint(1000, 2000, (4, seq), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return model.eval().bert(ids, output_attentions=True).attentions


def test_first_layer_heads_start_on_their_offsets():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.preset("mini", vocab_size=3000))      # 4 heads of 64
    value = model.bert.encoder.layer[0].attention.self.value.weight.clone()
    second = model.bert.encoder.layer[1].attention.self.query.weight.clone()
    before = _attention(model)[0]
    local_attention_init(model)
    att = _attention(model)[0]                                                    # (batch, heads, seq, seq)
    rows = torch.arange(8, 56)                                                    # away from the ends
    for h in range(4):
        target = rows + OFFSETS[h]
        on_target = att[:, h, rows, target]                                       # (batch, rows)
        assert float(on_target.mean()) > 0.3, (h, float(on_target.mean()))
        assert float((att[:, h, rows].argmax(-1) == target).float().mean()) > 0.8
        assert float(before[:, h, rows, target].mean()) < 0.05                    # BERT's init: ~1 / seq
    assert torch.equal(model.bert.encoder.layer[0].attention.self.value.weight, value)
    assert torch.equal(model.bert.encoder.layer[1].attention.self.query.weight, second)
    pos = model.bert.embeddings.position_embeddings.weight
    assert abs(float(pos.detach().norm(dim=1).mean()) - 0.02 * 256 ** 0.5) < 0.05          # a word embedding row's norm


def test_deterministic_for_a_seed_and_fits_narrow_heads():
    a = BertForPreTraining(BertConfig.preset("tiny", vocab_size=500))
    b = BertForPreTraining(BertConfig.preset("tiny", vocab_size=500))
    local_attention_init(a, seed=4)
    local_attention_init(b, seed=4)
    for name in ("bert.embeddings.position_embeddings.weight", "bert.encoder.layer.0.attention.self.query.weight"):
        assert torch.equal(a.state_dict()[name], b.state_dict()[name])
    narrow = BertForPreTraining(BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                           intermediate_size=128))                 # heads of 16 < 32 dims
    local_attention_init(narrow)
    assert torch.isfinite(narrow.bert.embeddings.position_embeddings.weight).all()


def test_the_plan_starts_local_and_a_flag_keeps_random(tmp_path):
    manifest = {"seq_len": 128, "task": "nsp", "counts": {"examples": 8000, "tokens": 900_000},
                "masking": {"mode": "token", "mask_prob": 0.15, "dynamic": False, "max_predictions": None,
                            "mask_token_prob": 0.8, "random_token_prob": 0.1, "max_ngram": 3}}
    pc = config_from_argv(["s/", "--preset", "mini", "--budget", "6m", "--out", str(tmp_path)])
    plan = plan_recipe(360, "mini", 0.2, manifest)
    assert apply_plan(pc, plan).attention_init == "local" and "neighbouring" in plan.choices["attention_init"].reason
    pc = config_from_argv(["s/", "--preset", "mini", "--budget", "6m", "--out", str(tmp_path), "--attention-init",
                           "random"])
    plan = plan_recipe(360, "mini", 0.2, manifest, given_settings(pc))
    assert apply_plan(pc, plan).attention_init == "random" and plan.choices["attention_init"].flag
    assert config_from_argv(["s/", "--preset", "mini", "--steps", "5", "--out", str(tmp_path)]).attention_init == "random"
