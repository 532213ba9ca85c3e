"""benchmarks/equal_budget.py: its ModernBERT-style mini is the shape docs/pretraining.md says (BERT mini's
parameters within 2%, layers 1 and 2 local), and its dry run prints one line per family with every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import equal_budget
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return equal_budget


def test_the_modern_mini_matches_bert_mini_but_for_its_parts():
    from bertkit.config import BertConfig
    from bertkit.heads import BertForMaskedLM
    from bertkit.modern import parts

    modern = BertConfig.from_dict({**_script().MODERN, "vocab_size": 30522})
    bert = BertConfig.preset("mini", vocab_size=30522)
    count = lambda c: sum(p.numel() for p in BertForMaskedLM(c).bert.encoder.parameters())  # noqa: E731
    assert abs(count(modern) / count(bert) - 1) < 0.02
    p = parts(modern)
    assert p.local_layers == (False, True, True, False) and p.window == 16
    assert not (p.attention_bias or p.mlp_bias or p.norm_bias)


@pytest.mark.slow
def test_the_dry_run_prints_both_families(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "equal_budget.py"), "--quick",
                           "--work", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["model"] for r in lines] == ["bert", "modernbert"]
    for r in lines:
        assert r["steps"] > 0 and 0 < r["heldout_mlm_acc"] < 1 and r["heldout_curve"][-1][0] == r["steps"]
        for run in ("topic", "topic_after_1_step"):
            assert 0 < r[run]["test_acc"] <= 1
