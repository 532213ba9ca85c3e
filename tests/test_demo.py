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
    assert "token 40%, dynamic" in text and "whole-word 15%, static" in text
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
