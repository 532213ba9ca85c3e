"""bertkit.precision: one precision value ("auto" | "bf16" | "fp32", or a task bf16 flag) and the one autocast."""

import warnings

import pytest
import torch

from bertkit.errors import ConfigError
from bertkit.precision import as_precision, autocast, resolve


def test_names_and_flags():
    assert [as_precision(v) for v in (None, True, False, "auto", "bf16", "fp32")] == \
        ["auto", "bf16", "fp32", "auto", "bf16", "fp32"]
    with pytest.raises(ConfigError, match="fp8"):
        as_precision("fp8")
    assert resolve("fp32") == "fp32" and resolve("auto") in ("bf16", "fp32")


def test_autocast_on_for_bf16_off_for_fp32_even_when_nested(monkeypatch):
    monkeypatch.setenv("BERTKIT_PRECISION", "fp32")
    x = torch.randn(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # bf16 asked for on a CPU that emulates it
        with autocast("bf16", "cpu"):
            assert (x @ x).dtype == torch.bfloat16
            with autocast("auto", "cpu"):              # auto = fp32 here ($BERTKIT_PRECISION)
                assert (x @ x).dtype == torch.float32


def test_auto_runs_an_int8_model_with_fp32_activations():
    """int8 GEMMs take fp32 input: "auto" gives an int8 model fp32 activations, a float model what auto means
    here; an explicit bf16 stays bf16; predict_batches applies it (no autocast around the int8 model)."""
    from bertkit.config import BertConfig
    from bertkit.heads import BertForSequenceClassification
    from bertkit.precision import for_model
    from bertkit.runtime import int8
    from bertkit.tasks.batching import predict_batches
    from bertkit.tasks.task import Feature
    cfg = BertConfig.preset("tiny", vocab_size=100, max_position_embeddings=32, num_labels=2)
    fp, q = BertForSequenceClassification(cfg), int8.quantize(BertForSequenceClassification(cfg))
    assert for_model("auto", q) == "fp32" and for_model(None, q) == "fp32" and for_model("bf16", q) == "bf16"
    assert for_model("auto", fp) == "auto" and for_model(False, fp) == "fp32"
    seen = []
    q.classifier.register_forward_pre_hook(lambda m, args: seen.append(torch.is_autocast_enabled("cpu")))
    feats = [Feature(input_ids=[2, 5, 7, 3], token_type_ids=[0] * 4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        list(predict_batches(q, feats, precision="auto"))
        list(predict_batches(q, feats, precision="bf16"))
    assert seen == [False, True]
