"""Modern pre-training recipes as options: StableAdamW, the falling mask rate, checkpoint averaging and the
--recipe presets (explicit flags win)."""

from __future__ import annotations

import pytest
import torch

from bertkit.optim import StableAdamW, build_optimizer


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    a = torch.nn.Linear(6, 4)
    b = torch.nn.Linear(6, 4)
    b.load_state_dict(a.state_dict())
    return a, b


def _grads(model, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g) * scale


def test_stable_adamw_is_adamw_without_spikes():
    ours, ref = _pair()
    opt = StableAdamW(ours.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1)
    for step in range(5):               # one direction, shrinking: g^2 <= v_hat everywhere, so the RMS is <= 1
        for m in (ours, ref):
            _grads(m, 0.8 ** step, 0)
        opt.step()
        ref_opt.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_stable_adamw_shrinks_the_step_of_a_spiking_tensor():
    ours, ref = _pair()
    opt = StableAdamW(ours.parameters(), lr=1e-2, betas=(0.9, 0.98), weight_decay=0.0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0)
    for step in range(4):
        for m in (ours, ref):
            _grads(m, 1.0 if step < 3 else 100.0, step)      # the last step's gradient is 100x the others
        before = [p.detach().clone() for p in ours.parameters()]
        ref_before = [p.detach().clone() for p in ref.parameters()]
        opt.step()
        ref_opt.step()
    # the update rule, written out for the weight at the spike: lr / max(1, RMS(g^2 / v_hat)) times AdamW's step
    w, g = ours.weight, ours.weight.grad
    v_hat = opt.state[w]["exp_avg_sq"] / (1 - 0.98 ** 4)
    rms = float((g * g / v_hat).mean().sqrt())
    assert rms > 1.5       # bias-corrected v_hat already holds much of the spike: the RMS is ~2, not 100
    ours_step, ref_step = before[0] - w.detach(), ref_before[0] - ref.weight.detach()
    assert torch.allclose(ours_step * rms, ref_step, rtol=1e-4, atol=1e-7)
    assert isinstance(build_optimizer(ours, "stableadamw"), StableAdamW)


# ---------------------------------------------------------------------------------------------- with real shards
@pytest.fixture(scope="module")
def shards(bbc_nsp_shards):
    """NSP shards (seq 64, dynamic masks) from 40 BBC articles, a vocab of 600."""
    return bbc_nsp_shards(40, 64)


def test_mask_rate_falls_linearly_over_the_run(shards):
    from types import SimpleNamespace

    from bertkit.pretraining import MaskingConfig, ShardReader
    from bertkit.train.pretrain import MaskRateSchedule
    reader = ShardReader(shards, 16, seed=0, masking=MaskingConfig(mask_prob=0.4))
    schedule = MaskRateSchedule([reader.masking], 0.4, 0.1)
    idx = reader.indices(0, 0, 64)
    shares = []
    for step in (0, 5, 10):
        schedule.on_step_end(SimpleNamespace(step=step, total=11), {})
        b = reader.batch(idx, 0)
        shares.append(float((b["labels"] != -100).sum() / ((b["attention_mask"] == 1).sum() - 3 * len(idx))))
    assert reader.masking.mask_prob == pytest.approx(0.1)
    assert shares[0] == pytest.approx(0.4, abs=0.03) and shares[1] == pytest.approx(0.25, abs=0.03)
    assert shares[2] == pytest.approx(0.1, abs=0.02)


def _argv(shards, out, *flags):
    return [str(shards), "--out", str(out), "--steps", "3", *flags]


def test_recipe_presets_and_explicit_flags_win(shards, tmp_path):
    from bertkit.commands.pretrain import config_from_argv
    plain = config_from_argv(_argv(shards, tmp_path))
    t = plain.train
    assert (plain.objective, t.optimizer, t.betas, t.weight_decay) == ("auto", "adamw", (0.9, 0.999), 0.01)
    modern = config_from_argv(_argv(shards, tmp_path, "--recipe", "modernbert"))
    t = modern.train
    assert (modern.objective, modern.mask_prob, t.optimizer, t.betas, t.weight_decay, t.lr, t.schedule) == (
        "mlm", 0.3, "stableadamw", (0.9, 0.98), 1e-5, 8e-4, "wsd")
    mine = config_from_argv(_argv(shards, tmp_path, "--recipe", "modernbert", "--lr", "1e-3", "--optimizer", "adamw",
                                  "--mask-prob", "0.4", "--adam-beta2", "0.999"))
    assert (mine.train.lr, mine.train.optimizer, mine.mask_prob, mine.train.betas) == (1e-3, "adamw", 0.4,
                                                                                      (0.9, 0.999))
    roberta = config_from_argv(_argv(shards, tmp_path, "--recipe", "roberta"))
    assert (roberta.objective, roberta.train.betas, roberta.train.lr) == ("mlm", (0.9, 0.98), 6e-4)
    assert config_from_argv(_argv(shards, tmp_path, "--recipe", "bert")).train.schedule == "linear"


def test_modernbert_recipe_trains_with_falling_masks_and_averages_checkpoints(shards, tmp_path, capsys):
    from bertkit.cli import main as cli
    from bertkit.train.checkpointing import load_model_weights
    out = tmp_path / "run"
    flags = ["--preset", "tiny", "--batch-size", "8", "--precision", "fp32", "--no-progress"]
    assert cli(["pretrain", *_argv(shards, tmp_path / "bad", *flags, "--average-last", "3")]) != 0
    assert "--average-last 3 averages the last checkpoints: give --save-every" in capsys.readouterr().err
    assert cli(["pretrain", *_argv(shards, out, *flags, "--recipe", "modernbert", "--mask-prob-end", "0.1",
                                   "--save-every", "1", "--average-last", "3", "--packing")]) == 0
    steps = sorted((out / "checkpoints").glob("step-*"))
    assert [p.name for p in steps] == ["step-00000001", "step-00000002", "step-00000003"]
    weights = [load_model_weights(p / "model.safetensors") for p in steps]
    saved = load_model_weights(out / "model" / "model.safetensors")
    name = "bert.encoder.layer.0.attention.self.query.weight"
    key = next(k for k in saved if k.endswith("layer.0.attention.self.query.weight"))
    mean = sum(w[name] for w in weights) / 3
    assert torch.allclose(saved[key], mean, atol=1e-6) and not torch.allclose(saved[key], weights[-1][name])


def test_a_context_extension_phase_loads_in_transformers_with_equal_logits(bbc_nsp_shards, tmp_path, capsys):
    """ModernBERT's recipe on a small scale: rows of 32 at rotary base 10,000, then continued (--init) on rows of
    64 at 160,000; the phase-2 model's config.json carries the new base and length, and transformers' ModernBERT
    loads it with bertkit's logits (which the base changes)."""
    import json

    transformers = pytest.importorskip("transformers")
    from bertkit.cli import main as cli
    from bertkit.heads import BertForMaskedLM
    short, long = bbc_nsp_shards(40, 32), bbc_nsp_shards(40, 64)
    config = tmp_path / "modernbert.json"
    # a wide init peaks the attention, so the rotary base shows in the logits
    config.write_text(json.dumps({"model_type": "modernbert", "vocab_size": 600, "hidden_size": 32,
                                  "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 48,
                                  "max_position_embeddings": 32, "local_attention": 8, "pad_token_id": 0,
                                  "initializer_range": 0.3, "hidden_dropout_prob": 0.0,
                                  "attention_probs_dropout_prob": 0.0}))
    flags = ["--objective", "mlm", "--steps", "2", "--batch-size", "4", "--precision", "fp32", "--no-progress"]
    one, two = tmp_path / "phase1", tmp_path / "phase2"
    assert cli(["pretrain", str(short), "--config", str(config), "--rope-theta", "10000", "--out", str(one),
                *flags]) == 0
    # the run's summary fills masks with its MLM head, sentence-pair shards or not
    assert json.loads((one / "summary.json").read_text())["fill_mask"]["examples"]
    assert cli(["pretrain", str(long), "--init", str(one / "model"), "--out", str(tmp_path / "no"), *flags]) == 2
    assert "--rope-theta extends a rotary model" in capsys.readouterr().err     # longer rows name the way to them
    assert cli(["pretrain", str(long), "--init", str(one / "model"), "--rope-theta", "160000", "--out", str(two),
                *flags]) == 0
    ref = transformers.ModernBertForMaskedLM.from_pretrained(two / "model", attn_implementation="eager").eval()
    rope = ref.config.rope_parameters
    assert (rope["full_attention"]["rope_theta"], rope["sliding_attention"]["rope_theta"]) == (160000, 10000)
    assert ref.config.max_position_embeddings == 64
    ours = BertForMaskedLM.from_pretrained(two / "model")
    ids = torch.randint(5, 600, (2, 64), generator=torch.Generator().manual_seed(0))
    raw = json.loads((two / "model" / "config.json").read_text())
    raw["rope_parameters"]["full_attention"]["rope_theta"] = 10000.0
    (tmp_path / "base10k").mkdir()
    (tmp_path / "base10k" / "config.json").write_text(json.dumps(raw))
    (tmp_path / "base10k" / "model.safetensors").symlink_to(two / "model" / "model.safetensors")
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        torch.testing.assert_close(ours(ids).logits, want, atol=1e-5, rtol=1e-5)
        # the comparison tells the bases apart: phase 1's base gives logits outside its tolerance
        other = BertForMaskedLM.from_pretrained(tmp_path / "base10k")(ids).logits
        assert not torch.allclose(other, want, atol=1e-5, rtol=1e-5)


def test_a_local_start_is_refused_by_name_for_a_model_without_a_position_table(bbc_nsp_shards, tmp_path, capsys):
    import json

    from bertkit.cli import main as cli
    config = tmp_path / "modernbert.json"
    config.write_text(json.dumps({"model_type": "modernbert", "vocab_size": 600, "hidden_size": 32,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
                                  "max_position_embeddings": 32, "pad_token_id": 0}))
    rc = cli(["pretrain", str(bbc_nsp_shards(40, 32)), "--config", str(config), "--attention-init", "local",
              "--objective", "mlm", "--steps", "1", "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "--attention-init local: a modernbert model has no learned position table" in err, err
