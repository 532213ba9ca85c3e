"""Fine-tuning is the same maths as transformers: our model trained by `bertkit.train` and transformers' model in a
plain torch loop, from the same checkpoint, on the same batches with the same schedule and no dropout, give the same
per-step losses. (With dropout the runs differ only in their masks; `benchmarks/finetune.py` compares them paired.)"""

from __future__ import annotations

import pytest
import torch

from bertkit.heads import BertForSequenceClassification, BertForTokenClassification
from bertkit.optim import lr_factor, param_groups, warmup_steps

from bertkit.train.loop import TrainConfig, train

transformers = pytest.importorskip("transformers")

V, STEPS, WARMUP = 97, 24, 0.25


def _batches(kind: str, n: int, b: int = 4, seed: int = 0) -> list[dict]:
    """Ragged rows (so our 'auto' attention takes the unpadded path), two segments, labels per row or per token."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(5, 17, (b,), generator=g)
        seq = int(lengths.max())
        mask = (torch.arange(seq)[None] < lengths[:, None]).long()
        ids = torch.randint(5, V, (b, seq), generator=g) * mask
        types = (torch.arange(seq)[None] >= (lengths[:, None] // 2)).long() * mask
        if kind == "tag":                                           # learnable: a function of the token
            labels = (ids % 3).masked_fill(mask == 0, -100)
        else:
            labels = (ids[:, 1] > V // 2).long()
        out.append({"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels})
    return out


class _List(list):
    def set_epoch(self, epoch: int) -> None:
        pass


@pytest.mark.parametrize("kind", ["classify", "tag"])
def test_finetune_steps_match_transformers(tmp_path, kind):
    hf_cls, our_cls = {"classify": (transformers.BertForSequenceClassification, BertForSequenceClassification),
                       "tag": (transformers.BertForTokenClassification, BertForTokenClassification)}[kind]
    num_labels = 2 if kind == "classify" else 3
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=32, num_labels=num_labels,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf_cls(cfg).save_pretrained(tmp_path / "ckpt")
    ref = hf_cls.from_pretrained(tmp_path / "ckpt", attn_implementation="sdpa").train()
    ours = our_cls.from_pretrained(tmp_path / "ckpt")
    batches = _batches(kind, n=4) * (STEPS // 4)   # a few batches seen repeatedly: the loss must come down

    tcfg = TrainConfig(max_steps=STEPS, lr=1e-3, warmup=WARMUP, weight_decay=0.01, precision="fp32", seed=0,
                       save_final=False, progress=False, tensorboard=False, plot=False)
    ours_losses = train(ours, _List(batches), tcfg, tmp_path / "run").losses

    opt = torch.optim.AdamW(param_groups(ref, 0.01), lr=1e-3, betas=(0.9, 0.999), eps=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, STEPS, warmup_steps(WARMUP, STEPS)))
    ref_losses = []
    for b in batches:
        loss = ref(**b).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        ref_losses.append(loss.item())

    assert len(ours_losses) == STEPS
    # the model must have learned something, or equal losses would prove little
    assert sum(ref_losses[-3:]) / 3 < ref_losses[0]
    for step, (a, r) in enumerate(zip(ours_losses, ref_losses)):
        assert abs(a - r) <= 1e-4 * max(1.0, abs(r)), (step, a, r)
