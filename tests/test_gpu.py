"""On a CUDA GPU: the encoders give transformers' outputs there (padded and unpadded attention), pre-training runs
in bf16 with its MFU and in fp16 with a GradScaler, and a bare `device="cuda"` means this process's GPU. Skipped
without a GPU; `pytest -m cuda` (benchmarks/gpu_suite.sh does) runs exactly these."""

from __future__ import annotations

import math

import pytest
import torch

from bertkit import heads
from bertkit.config import BertConfig
from bertkit.model import BertModel

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

transformers = pytest.importorskip("transformers")

TINY = {"bert": dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=48, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0),
        # a global and two local layers, the window (|i - j| <= 4) shorter than the rows, so it matters
        "modernbert": dict(vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                           intermediate_size=48, max_position_embeddings=64, local_attention=8,
                           global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           cls_token_id=1, sep_token_id=2)}


@pytest.mark.parametrize("family", ["bert", "modernbert"])
@pytest.mark.parametrize("backend", ["sdpa", "unpadded"])
def test_encoder_on_cuda_equals_transformers(tmp_path, family, backend):
    cfg = transformers.AutoConfig.for_model(family, attn_implementation="sdpa", **TINY[family])
    torch.manual_seed(0)
    ref = transformers.AutoModel.from_config(cfg).eval()
    ref.save_pretrained(tmp_path)
    ours = BertModel.from_pretrained(tmp_path, attn_implementation=backend).eval().cuda()
    ref.cuda()
    ids = torch.randint(4, 120, (3, 17), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    mask[2, 6:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()                              # padding positions: nobody reads them
    assert got.device.type == "cuda"
    torch.testing.assert_close(got[real], want[real], atol=2e-4, rtol=1e-4)


def _pretrain(out, precision: str, steps: int, **cfg):
    """A tiny BERT pre-trained on one batch, `steps` times, on this process's GPU: (model, TrainResult)."""
    from bertkit.train import TrainConfig, train
    from bertkit.train.steps import pretraining_step
    torch.manual_seed(0)
    model = heads.BertForPreTraining(BertConfig.preset("tiny", vocab_size=600))
    model.masked_logits_only = True
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 600, (8, 64), generator=g)
    masked = torch.rand(ids.shape, generator=g) < 0.15
    batch = {"input_ids": ids.masked_fill(masked, 4), "token_type_ids": torch.zeros_like(ids),
             "attention_mask": torch.ones_like(ids), "labels": ids.masked_fill(~masked, -100),
             "next_sentence_label": torch.randint(0, 2, (8,), generator=g)}
    cfg = TrainConfig(max_steps=steps, lr=1e-3, warmup=0, device="cuda", precision=precision, progress=False,
                      plot=False, tensorboard=False, **cfg)
    return model, train(model, [batch], cfg, out, step_fn=pretraining_step)


def test_pretraining_on_a_bare_cuda_device_runs_bf16_with_mfu(tmp_path):
    model, res = _pretrain(tmp_path / "run", "auto", 3, save_final=False)
    assert next(model.parameters()).device == torch.device("cuda", torch.cuda.current_device())
    assert res.steps == 3 and all(math.isfinite(x) for x in res.losses)
    assert res.losses[-1] < res.losses[0]            # the same batch three times: it learns it
    assert all(0 < r["mfu"] < 1 for r in res.history)


def test_fp16_pretraining_scales_the_loss_and_learns(tmp_path):
    import json
    from bertkit.train import latest_checkpoint
    _, res = _pretrain(tmp_path / "run", "fp16", 8)
    finite = [x for x in res.losses if math.isfinite(x)]
    assert res.steps == 8 and len(finite) >= 6 and finite[-1] < finite[0]
    assert res.steps - res.skipped_steps == len(finite)     # a skipped step is an overflow the GradScaler took
    saved = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())["scaler"]
    assert saved["scale"] == 65536.0 / 2 ** res.skipped_steps      # the scale halved once per skipped step
