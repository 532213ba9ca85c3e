"""The demo's report: new stage results (recipe, task, held-out NSP) and those an older demo left in done.json."""

from bertkit.demo import DemoConfig, write_report

PRETRAIN = {"steps": 2680, "tokens": 2_640_000, "seconds": 720.0, "tokens_per_s": 3668.0, "params": 5_500_000,
            "precision": "fp32", "final_train_loss": 5.8, "final_train_mlm_acc": 0.238, "heldout_mlm_acc": 0.262,
            "heldout_mlm_loss": 4.95, "heldout_masked_tokens": 9070}


def test_report_names_the_recipe(tmp_path):
    results = {
        "shards": {"train": {"examples": 17227, "tokens": 1061287, "seq_len": 64, "task": "nsp", "masking": "token",
                             "mask_prob": 0.4},
                   "heldout": {"examples": 2373, "tokens": 147036, "seq_len": 64, "task": "nsp", "masking": "wwm",
                               "mask_prob": 0.15}},
        "pretrain": {**PRETRAIN, "heldout_nsp_acc": 0.513,
                     "recipe": {"preset": "mini", "task": "nsp", "batch_size": 16, "lr": 1e-3, "warmup": 1000.0,
                                "schedule": "wsd", "decay_fraction": 0.1, "dropout": 0.0}},
    }
    text = write_report(DemoConfig(out=str(tmp_path)), tmp_path, results).read_text()
    assert "| split | rows (64 tokens) |" in text
    assert "| train | 17227 | 1061287 | token 40%, dynamic" in text
    assert "| held-out | 2373 | 147036 | whole-word 15%, static |" in text
    assert "(`mini`, MLM + NSP, from scratch)" in text
    assert "warmup 1000 steps, schedule wsd (decay over the last 10%), dropout 0" in text
    assert "held-out NSP accuracy 0.513" in text


def test_report_reads_an_older_demo(tmp_path):
    """done.json files from before the recipe fields: seq 128, whole-word 15%, MLM only, no NSP figure."""
    results = {"shards": {"train": {"examples": 8000, "tokens": 1_000_000},
                          "heldout": {"examples": 900, "tokens": 120_000}},
               "pretrain": dict(PRETRAIN)}
    text = write_report(DemoConfig(out=str(tmp_path)), tmp_path, results).read_text()
    assert "| split | rows (128 tokens) |" in text
    assert "whole-word 15%, dynamic" in text
    assert "(`mini`, MLM only, from scratch)" in text
    assert "NSP accuracy" not in text and "warmup" not in text


def test_report_shows_the_heldout_curve(tmp_path):
    results = {"pretrain": {**PRETRAIN, "heldout_curve": [{"step": 250, "mlm_acc": 0.078, "nsp_acc": 0.5},
                                                          {"step": 500, "mlm_acc": 0.101, "nsp_acc": 0.49}]}}
    text = write_report(DemoConfig(out=str(tmp_path)), tmp_path, results).read_text()
    assert "held-out MLM accuracy by step: 250: 0.078, 500: 0.101" in text


def test_pretrain_refuses_an_older_demos_shards(tmp_path):
    """Shards an older demo built (MLM-only rows of 128 tokens) are named, with the fix, before any training."""
    import json

    import pytest

    from bertkit.demo import stage_pretrain
    from bertkit.errors import BertkitError
    train = tmp_path / "shards" / "train"
    train.mkdir(parents=True)
    (train / "manifest.json").write_text(json.dumps({"format": "bertkit-pretraining-shards", "version": 1,
                                                     "task": "none", "seq_len": 128}))
    with pytest.raises(BertkitError, match=r"task 'none' rows of 128 tokens.*--force"):
        stage_pretrain(DemoConfig(out=str(tmp_path)), tmp_path / "pretrain", tmp_path / "vocab", tmp_path / "shards")


def test_pretrain_is_the_budgets_plan(tmp_path, monkeypatch):
    """The demo pre-trains as `bertkit pretrain TRAIN --preset mini --budget 720s --eval-shards HELDOUT` does: no
    recipe setting of its own, so every one of them is the plan's."""
    import json

    import pytest

    import bertkit.train.pretrain as P
    from bertkit.demo import stage_pretrain
    train = tmp_path / "shards" / "train"
    train.mkdir(parents=True)
    (train / "manifest.json").write_text(json.dumps({"format": "bertkit-pretraining-shards", "version": 1,
                                                     "task": "nsp", "seq_len": 64}))
    seen = {}

    def fake(pc):
        seen["pc"] = pc
        raise RuntimeError("stop here")
    monkeypatch.setattr(P, "pretrain", fake)
    with pytest.raises(RuntimeError, match="stop here"):
        stage_pretrain(DemoConfig(out=str(tmp_path)), tmp_path / "pretrain", tmp_path / "vocab", tmp_path / "shards")
    pc = seen["pc"]
    assert pc.set_fields == () and pc.train.budget_s == 720 and pc.preset == "mini" and pc.init is None
    assert pc.eval_shards == str(tmp_path / "shards" / "heldout")


def test_report_reads_the_plan(tmp_path):
    results = {"pretrain": {**PRETRAIN, "recipe": {"preset": "mini", "task": "nsp", "masking": "token",
                                                   "mask_prob": 0.4, "batch_size": 16, "lr": 1e-3, "warmup": 1000.0,
                                                   "schedule": "wsd", "decay_fraction": 0.1, "dropout": 0.0,
                                                   "estimated_steps": 2900}}}
    text = write_report(DemoConfig(out=str(tmp_path)), tmp_path, results).read_text()
    assert "the budget's plan (pretrain/plan.json): token masks 40% redrawn every epoch, batch 16" in text
    assert "~2,900 steps estimated" in text
