"""Slow: fine-tune the real MiniLM-L6 checkpoint on a slice of the real sentiment data (minutes on 2 cores).

The full comparison with transformers (3 seeds, examples/s) is benchmarks/finetune.py; this checks that the path
from the real checkpoint to a useful classifier works, with a bound far above chance (0.5)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_minilm_sentiment_slice(minilm_dir, rotten_tomatoes, tmp_path):
    from bertkit.tasks import data
    from bertkit.tasks.readers import read_table, write_table
    from bertkit.tasks.runner import FinetuneConfig, evaluate, finetune, finetune_recipe
    files = data.build("sentiment", tmp_path / "data")["files"]
    dev = [{"text": e.text, "label": e.label} for e in read_table(files["dev"])[:300]]
    dev_file = str(write_table(tmp_path / "dev300.csv", dev))
    s = finetune(FinetuneConfig(task="classify", model=str(minilm_dir), train=files["train"], dev=dev_file,
                                out=str(tmp_path / "run"), max_train_examples=1200, batch_size=16,
                                training=finetune_recipe(epochs=1),
                                max_length=64, quiet=True))
    assert s["dev"]["accuracy"]["mean"] >= 0.68, s["dev"]
    assert evaluate(tmp_path / "run", dev_file)["accuracy"] == pytest.approx(s["dev"]["accuracy"]["mean"], abs=0.01)
