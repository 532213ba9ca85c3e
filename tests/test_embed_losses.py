"""Embedding losses against sentence-transformers' on the same embeddings, and the false-negative mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertkit.embed.losses import (CoSENTLoss, CosineMSELoss, MultipleNegativesRankingLoss, false_negative_mask,
                                  text_keys)

TOL = 1e-6          # fp64 embeddings: the two agree to ~1e-15; fp32 ones to ~2e-6 (summation order)


@pytest.fixture(scope="module")
def st_losses():
    return pytest.importorskip("sentence_transformers.sentence_transformer.losses")


def _columns(b=8, d=16, negatives=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, d, generator=g, dtype=torch.float64) for _ in range(2 + negatives)]


@pytest.mark.parametrize("negatives", [0, 1, 3])
@pytest.mark.parametrize("scale", [20.0, 7.5])
def test_mnrl_equals_sentence_transformers(st_losses, negatives, scale):
    cols = _columns(negatives=negatives)
    ours = MultipleNegativesRankingLoss(scale=scale).double()(cols)
    theirs = st_losses.MultipleNegativesRankingLoss(None, scale=scale).compute_loss_from_embeddings(cols, None)
    assert abs(float(ours) - float(theirs)) <= TOL


@pytest.mark.parametrize("negatives", [0, 2])
def test_symmetric_mnrl_equals_sentence_transformers(st_losses, negatives):
    cols = _columns(negatives=negatives, seed=1)
    ours = MultipleNegativesRankingLoss(symmetric=True).double()(cols)
    theirs = st_losses.MultipleNegativesRankingLoss(
        None, directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"
    ).compute_loss_from_embeddings(cols, None)
    assert abs(float(ours) - float(theirs)) <= TOL


def test_mnrl_gradient_equals_sentence_transformers(st_losses):
    cols = [c.requires_grad_() for c in _columns(negatives=1, seed=2)]
    MultipleNegativesRankingLoss().double()(cols).backward()
    ours = [c.grad.clone() for c in cols]
    cols2 = [c.detach().clone().requires_grad_() for c in cols]
    st_losses.MultipleNegativesRankingLoss(None).compute_loss_from_embeddings(cols2, None).backward()
    for a, b in zip(ours, cols2):
        assert torch.allclose(a, b.grad, atol=TOL, rtol=0)


def test_keys_without_duplicates_change_nothing():
    cols = _columns(negatives=1)
    loss = MultipleNegativesRankingLoss().double()
    keys = [text_keys([f"a{i}" for i in range(8)]), text_keys([f"p{i}" for i in range(16)])[:8],
            text_keys([f"p{i}" for i in range(16)])[8:]]
    assert torch.equal(loss(cols), loss(cols, keys))


def test_duplicate_masking_changes_exactly_the_masked_entries():
    b = 6
    anchors = ["q0", "q1", "q2", "q1", "q4", "q5"]            # rows 1 and 3 ask the same
    positives = ["p0", "p1", "p0", "p3", "p4", "p5"]           # rows 0 and 2 have the same positive
    negatives = ["n0", "p4", "n2", "n3", "n4", "n5"]           # row 1's hard negative is row 4's positive
    keyed = text_keys(positives + negatives)
    keys = [text_keys(anchors), keyed[:b], keyed[b:]]
    mask = false_negative_mask(keys[0], torch.cat(keys[1:]))
    expected = {(0, 2), (2, 0), (1, 3), (3, 1), (4, 7)}        # (row, candidate column)
    assert {tuple(x) for x in mask.nonzero().tolist()} == expected
    cols = _columns(b=b, negatives=1, seed=3)
    cols[0][3], cols[1][2], cols[2][1] = cols[0][1], cols[1][0], cols[1][4]   # equal texts, equal vectors
    loss = MultipleNegativesRankingLoss().double()
    plain, masked = loss.logits(cols), loss.logits(cols, keys)
    assert torch.isinf(masked[mask]).all() and torch.equal(plain[~mask], masked[~mask])
    per_row_plain = F.cross_entropy(plain, torch.arange(b), reduction="none")
    per_row_masked = F.cross_entropy(masked, torch.arange(b), reduction="none")
    changed = (per_row_plain - per_row_masked).abs() > 1e-9
    assert changed.tolist() == [r in {0, 1, 2, 3, 4} for r in range(b)]
    assert torch.allclose(loss(cols, keys), per_row_masked.mean())


def test_symmetric_term_is_masked_too():
    cols = _columns(b=4, seed=4)
    keys = [text_keys(["a", "b", "a", "c"]), text_keys(["x", "y", "z", "w"])]
    loss = MultipleNegativesRankingLoss(symmetric=True).double()
    logits = loss.logits(cols, keys)
    back = F.cross_entropy(logits[:, :4].T, torch.arange(4))
    fwd = F.cross_entropy(logits, torch.arange(4))
    assert torch.allclose(loss(cols, keys), (fwd + back) / 2)
    assert torch.isinf(logits[0, 2]) and torch.isinf(logits[2, 0])


def test_learnable_scale_gets_a_gradient_and_is_capped():
    loss = MultipleNegativesRankingLoss(scale=20.0, learnable_scale=True)
    assert loss.log_scale.requires_grad and [p for p in loss.parameters()] == [loss.log_scale]
    loss([c.float() for c in _columns()]).backward()
    assert loss.log_scale.grad is not None and loss.log_scale.grad != 0
    with torch.no_grad():
        loss.log_scale.fill_(10.0)
    assert float(loss.scale.detach()) == 100.0
    assert not list(MultipleNegativesRankingLoss().parameters())


def test_cosent_and_cosine_mse_equal_sentence_transformers(st_losses):
    a, b = _columns(b=10, seed=5)
    scores = torch.rand(10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    scores[3] = scores[7]                                                  # a tie: no term either way
    ours = CoSENTLoss()([a, b], scores)
    theirs = st_losses.CoSENTLoss(None).compute_loss_from_embeddings([a, b], scores)
    assert abs(float(ours) - float(theirs)) <= TOL
    ours = CosineMSELoss()([a, b], scores)
    theirs = st_losses.CosineSimilarityLoss(None).compute_loss_from_embeddings([a, b], scores)
    assert abs(float(ours) - float(theirs)) <= TOL
