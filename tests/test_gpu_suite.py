"""benchmarks/gpu_suite.sh, ready before a GPU is lent: its dry run (--device cpu, tiny shapes) prints every figure
with both sides measured, and the FLOPs behind its MFU count a local layer's window, not the whole row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _figures(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _check_measured(records: list[dict]) -> None:
    for r in records:
        assert "error" not in r and "not_run" not in r, r
        if r["figure"] in ("pretrain", "finetune", "infer"):
            for side in ("ours", "reference"):
                assert r[f"{side}_tokens_per_s"] > 0 and 0 < r[f"{side}_mfu"] < 1, r


def test_dry_run_prints_every_figure_of_a_family(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    threads = torch.get_num_threads()
    try:
        assert gpu_suite.main(["--device", "cpu", "--quick", "--skip", "tests", "--families", "bert",
                               "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    records = _figures(capsys.readouterr().out)
    assert [(r["figure"], r.get("family"), r.get("seq")) for r in records] == [
        ("env", None, None), ("pretrain", "bert", 32), ("pretrain", "bert", 128), ("finetune", "bert", None),
        ("infer", "bert", None), ("total", None, None)]
    assert records[0]["shape"] == "tiny" and records[0]["reference_attention"] in ("sdpa", "flash_attention_2")
    _check_measured(records)


@pytest.mark.slow
def test_the_script_dry_run_covers_both_families_and_the_cuda_tests():
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_suite.sh"), "--device", "cpu", "--quick",
                           "--threads", "1"],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = _figures(proc.stdout)
    _check_measured(records)
    tests = next(r for r in records if r["figure"] == "tests")
    assert tests["files"] == ["tests/test_gpu.py"] and tests["skipped"] > 0 and tests.get("failed", 0) == 0
    assert {(r["figure"], r["family"]) for r in records if "family" in r} == {
        (f, fam) for f in ("pretrain", "finetune", "infer") for fam in ("bert", "modernbert")}


def test_flops_per_token_counts_a_local_layer_s_window():
    from bertkit.config import BertConfig
    from bertkit.heads import BertForMaskedLM
    from bertkit.train.monitor import estimate_flops_per_token
    # global, local, local; a local layer's queries see keys within 8 of them: 17 keys
    config = BertConfig.from_dict({"model_type": "modernbert", "vocab_size": 120, "hidden_size": 32,
                                   "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 48,
                                   "max_position_embeddings": 256, "local_attention": 16,
                                   "global_attn_every_n_layers": 3})
    model = BertForMaskedLM(config)
    six_n = 6.0 * sum(p.numel() for name, p in model.named_parameters() if "embeddings" not in name)
    assert estimate_flops_per_token(model, 128) == six_n + 12 * 32 * (128 + 17 + 17)
    assert estimate_flops_per_token(model, 10) == six_n + 12 * 32 * 3 * 10      # rows inside the window
