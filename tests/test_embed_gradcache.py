"""GradCache: the cached loss and every gradient equal the uncached computation's."""

from __future__ import annotations

import contextlib

import pytest
import torch

from bertkit.config import BertConfig
from bertkit.embed import gradcache
from bertkit.embed.gradcache import cached_loss, split_columns
from bertkit.embed.losses import MultipleNegativesRankingLoss, text_keys
from bertkit.embed.pooling import Dense, Pooling, SentenceEncoder
from bertkit.model import BertModel

TOL = 1e-5


def _encoder(dropout: float) -> SentenceEncoder:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=dropout,
                     attention_probs_dropout_prob=dropout)
    return SentenceEncoder(BertModel(cfg), Pooling("mean"), dense=Dense(32, 24), max_seq_length=64).train()


def _column(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 20, (n,), generator=g)
    ids = torch.randint(5, 60, (n, int(lengths.max())), generator=g)
    mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()          # (n, seq), right padding
    return {"input_ids": ids * mask, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}


def _batch(n: int = 10):
    cols = [_column(n, s) for s in (1, 2, 3)]                                    # anchor, positive, negative
    keys = [text_keys([str(i) for i in range(n)]), text_keys([f"p{i}" for i in range(n)]),
            text_keys([f"n{i}" for i in range(n)])]
    return cols, keys


def _grads(*modules) -> dict[str, torch.Tensor]:
    return {f"{i}.{name}": p.grad.clone() for i, m in enumerate(modules) for name, p in m.named_parameters()
            if p.requires_grad}


def _zero(*modules) -> None:
    for m in modules:
        m.zero_grad(set_to_none=True)


def _assert_same(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= TOL, worst
    return worst


def _cached(enc, loss_fn, cols, keys, mbs, seed, scale=1.0):
    _zero(enc, loss_fn)
    torch.manual_seed(seed)
    loss = cached_loss(enc, cols, loss_fn, mbs, keys=keys)
    (loss * scale).backward()
    return float(loss.detach()), _grads(enc, loss_fn)


def test_no_dropout_equals_one_full_batch_forward():
    enc, loss_fn = _encoder(0.0), MultipleNegativesRankingLoss(learnable_scale=True)
    cols, keys = _batch()
    loss = loss_fn([enc(**c) for c in cols], keys)                     # the whole batch in one graph
    loss.backward()
    ref_loss, ref = float(loss.detach()), _grads(enc, loss_fn)
    for mbs in (1, 3, 4, 10, 16):
        got_loss, got = _cached(enc, loss_fn, cols, keys, mbs, seed=0)
        assert abs(got_loss - ref_loss) <= TOL
        _assert_same(got, ref)


def _uncached_same_masks(enc, loss_fn, cols, keys, mbs, seed):
    """The full batch with autograd kept for every mini-batch, drawing dropout in the cached pass's order."""
    _zero(enc, loss_fn)
    torch.manual_seed(seed)
    embeddings = [torch.cat([enc(**mb) for mb in col]) for col in split_columns(cols, mbs)]
    loss = loss_fn(embeddings, keys)
    loss.backward()
    return float(loss.detach()), _grads(enc, loss_fn)


@pytest.mark.parametrize("mbs", [2, 3, 7])
def test_dropout_on_equals_uncached_batch(mbs):
    enc, loss_fn = _encoder(0.1), MultipleNegativesRankingLoss(learnable_scale=True)
    cols, keys = _batch()
    ref_loss, ref = _uncached_same_masks(enc, loss_fn, cols, keys, mbs, seed=5)
    got_loss, got = _cached(enc, loss_fn, cols, keys, mbs, seed=5)
    assert abs(got_loss - ref_loss) <= TOL
    _assert_same(got, ref)
    # the generator continues as after the first pass: the replay did not consume draws
    torch.manual_seed(5)
    for col in split_columns(cols, mbs):
        for mb in col:
            enc(**mb)
    after_first_pass = torch.rand(3)
    torch.manual_seed(5)
    cached_loss(enc, cols, loss_fn, mbs, keys=keys).backward()
    assert torch.equal(torch.rand(3), after_first_pass)


def test_without_rng_replay_the_gradients_differ(monkeypatch):
    enc, loss_fn = _encoder(0.1), MultipleNegativesRankingLoss()
    cols, keys = _batch()
    _, ref = _uncached_same_masks(enc, loss_fn, cols, keys, 3, seed=5)
    monkeypatch.setattr(gradcache.RngState, "restored", lambda self: contextlib.nullcontext())
    _, got = _cached(enc, loss_fn, cols, keys, 3, seed=5)
    assert max(float((got[k] - ref[k]).abs().max()) for k in ref) > 1e-3


def test_outer_gradient_scale_reaches_every_mini_batch():
    enc, loss_fn = _encoder(0.0), MultipleNegativesRankingLoss(learnable_scale=True)
    cols, keys = _batch()
    _, full = _cached(enc, loss_fn, cols, keys, 4, seed=0)
    _, quarter = _cached(enc, loss_fn, cols, keys, 4, seed=0, scale=0.25)
    _assert_same({k: v * 0.25 for k, v in full.items()}, quarter)


def test_replay_runs_under_the_callers_autocast():
    enc, loss_fn = _encoder(0.1), MultipleNegativesRankingLoss()
    cols, keys = _batch()
    seen = []
    enc.register_forward_pre_hook(lambda m, a: seen.append(torch.get_autocast_dtype("cpu")
                                                           if torch.is_autocast_enabled("cpu") else None))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss, ref = _uncached_same_masks(enc, loss_fn, cols, keys, 4, seed=3)
        _zero(enc)
        torch.manual_seed(3)
        seen.clear()
        loss = cached_loss(enc, cols, loss_fn, 4, keys=keys)
    loss.backward()                                            # outside autocast, as the training loop does
    assert seen == [torch.bfloat16] * 18                       # 3 columns x 3 mini-batches, both passes
    got = _grads(enc)
    assert abs(float(loss.detach()) - ref_loss) <= TOL
    # the one-graph reference sums a shared weight's bf16 gradient over mini-batches before the fp32 cast (the
    # autocast weight cache); the replay adds each mini-batch in fp32: equal to bf16 precision, not bitwise
    for k, v in got.items():
        assert float((v - ref[k]).abs().max()) <= 1e-2 * float(ref[k].abs().max()) + TOL, k
