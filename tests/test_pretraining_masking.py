"""Masking on synthetic id arrays: whole-word selection equals google-research's greedy scan, config checks,
vocab tables, and the counter-based random numbers."""

from __future__ import annotations

import numpy as np
import pytest

from bertkit.errors import ConfigError, VocabError
from bertkit.pretraining import masking as M
from test_pretraining_stats import _word_spans  # the same word segmentation as the statistics tests

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"] + [f"w{i}" for i in range(40)] + \
         [f"##p{i}" for i in range(20)]


@pytest.fixture(scope="module")
def tables():
    return M.VocabTables.from_tokens(TOKENS)


def random_rows(n, s, seed=0):
    rng = np.random.default_rng(seed)
    word_ids = np.arange(6, 46)
    cont_ids = np.arange(46, 66)
    rows = np.where(rng.random((n, s)) < 0.35, rng.choice(cont_ids, (n, s)), rng.choice(word_ids, (n, s)))
    lengths = rng.integers(s // 3, s + 1, n)
    for r in range(n):
        rows[r, 0] = 2
        sep = rng.integers(2, lengths[r] - 1)
        rows[r, sep] = 3
        rows[r, lengths[r] - 1] = 3
        rows[r, lengths[r]:] = 0
    return rows, lengths


def reference_wwm(row, length, budget, word_keys, tables):
    """google-research's loop: words in random order, skip one that overshoots, stop when the budget is met."""
    words = _word_spans(row, length, tables)
    chosen = np.zeros(len(row), dtype=bool)
    total = 0
    for w in np.argsort(word_keys[:len(words)], kind="stable"):
        if total >= budget:
            break
        a, b = words[w]
        if total + (b - a) > budget:
            continue
        chosen[a:b] = True
        total += b - a
    return chosen


def test_wwm_matches_the_greedy_reference(tables):
    rows, lengths = random_rows(400, 48)
    keys = M.example_keys(11, 0, np.arange(400))
    for prob in (0.15, 0.4):
        cfg = M.MaskingConfig(mode="wwm", mask_prob=prob)
        _, chosen = M.mask_batch(rows, lengths, keys, cfg, tables)
        cand = (np.arange(48)[None] < lengths[:, None]) & ~tables.never_mask[rows]
        budget = np.floor(prob * cand.sum(1) + M._uniform(keys, M._S_COUNT)).astype(int)
        budget = np.minimum(budget, cfg.resolved_max_predictions(48))
        word_keys = M._uniform(keys, M._S_ORDER, 48)
        for r in range(400):
            ref = reference_wwm(rows[r], lengths[r], budget[r], word_keys[r], tables)
            assert (chosen[r] == ref).all(), r


def test_token_mode_is_exact_and_unbiased(tables):
    rows, lengths = random_rows(2000, 32, seed=1)
    keys = M.example_keys(0, 0, np.arange(2000))
    inputs, chosen = M.mask_batch(rows, lengths, keys, M.MaskingConfig(mask_prob=0.15), tables)
    cand = (np.arange(32)[None] < lengths[:, None]) & ~tables.never_mask[rows]
    per_row = chosen.sum(1)
    assert (np.abs(per_row - 0.15 * cand.sum(1)) < 1).all()            # stochastic rounding: floor or ceil
    assert abs(per_row.sum() / cand.sum() - 0.15) < 0.002
    assert not (chosen & ~cand).any()


def test_mask_shares_configurable(tables):
    rows, lengths = random_rows(2000, 32, seed=2)
    keys = M.example_keys(0, 0, np.arange(2000))
    cfg = M.MaskingConfig(mask_prob=0.3, mask_token_prob=1.0, random_token_prob=0.0)
    inputs, chosen = M.mask_batch(rows, lengths, keys, cfg, tables)
    assert (inputs[chosen] == tables.mask_id).all()
    cfg = M.MaskingConfig(mask_prob=0.3, mask_token_prob=0.0, random_token_prob=0.0)
    inputs, chosen = M.mask_batch(rows, lengths, keys, cfg, tables)
    assert (inputs == rows).all() and chosen.any()


def test_uniform_streams_are_uniform_and_independent():
    keys = M.example_keys(1, 2, np.arange(5000))
    a, b = M._uniform(keys, 1, 64), M._uniform(keys, 2, 64)
    assert 0 <= a.min() and a.max() < 1 and abs(a.mean() - 0.5) < 0.01 and abs(a.std() - 0.2887) < 0.01
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.01
    assert abs(np.corrcoef(a[:, :-1].ravel(), a[:, 1:].ravel())[0, 1]) < 0.01
    assert len(np.unique(keys)) == 5000
    assert not np.array_equal(M.example_keys(1, 3, np.arange(10)), keys[:10])


def test_config_and_vocab_errors(tmp_path):
    with pytest.raises(ConfigError, match="mode"):
        M.MaskingConfig(mode="span")
    with pytest.raises(ConfigError, match="mask_prob"):
        M.MaskingConfig(mask_prob=1.5)
    with pytest.raises(ConfigError, match="sum"):
        M.MaskingConfig(mask_token_prob=0.9, random_token_prob=0.2)
    assert M.MaskingConfig().resolved_max_predictions(128) == 20        # BERT's max_predictions_per_seq at 128
    with pytest.raises(VocabError, match=r"\[MASK\]"):
        M.VocabTables.from_tokens(["[PAD]", "[CLS]", "[SEP]", "a"])
    (tmp_path / "vocab.txt").write_text("\n".join(TOKENS) + "\n")
    t = M.VocabTables.from_vocab_file(tmp_path / "vocab.txt")
    assert t.vocab_size == len(TOKENS) and t.mask_id == 4 and t.never_mask[:6].all() and not t.never_mask[6:].any()
    assert t.continuation[46:].all() and not t.continuation[:46].any()
    assert set(t.random_ids.tolist()) == set(range(6, len(TOKENS)))
