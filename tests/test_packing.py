"""Packed pre-training batches (bertkit.pretraining.packing) on real text (BBC articles): under 2% padding, every
example once per epoch, the same masks as unpacked batches, exact resume, ranks in step, and each example's MLM
loss in a packed batch the same as that example run alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.cli import main as cli
from bertkit.errors import DataError
from bertkit.pretraining import PackedReader, ShardReader
from bertkit.pretraining.packing import pack_batches, padding_share


@pytest.fixture(scope="module")
def shards(bbc_nsp_shards):
    """NSP shards (seq 128, dynamic masks) from 60 BBC articles, a vocab of 600."""
    return bbc_nsp_shards(60, 128)


def test_pack_batches_fit_the_budget_and_cover_every_row():
    lengths = np.random.default_rng(0).integers(5, 129, 5000)
    batches = pack_batches(lengths, 32 * 128)
    assert sorted(np.concatenate(batches).tolist()) == list(range(5000))
    assert all(len(b) * lengths[b].max() <= 32 * 128 for b in batches)
    # uniform lengths are harsher than text (whose rows crowd near the longest): still a tenth of the padding
    assert padding_share(lengths, batches) < 0.1 * padding_share(lengths, batches, width=128)


def test_packed_reader_on_real_text(shards):
    reader = ShardReader(shards, 8, seed=3)
    packed = PackedReader(reader)
    lengths, plan = packed.lengths, packed.batches(0)
    before = padding_share(lengths, [reader.indices(0, i * 8, i * 8 + 8) for i in range(len(reader))], width=128)
    after = padding_share(lengths, plan)
    assert after < 0.02 and before > 0.05, (before, after)
    seen = np.concatenate(plan)
    assert len(np.unique(seen)) == len(seen) >= 0.95 * reader.num_examples   # each example at most once an epoch
    batches = list(packed)
    assert len(batches) == len(plan) and packed.epoch == 1
    # the masks are the example's own: the same as in the reader's batch of that one example
    b, idx = batches[0], plan[0]
    alone = reader.batch(idx[-1:], 0)
    n = int(alone["attention_mask"].sum())
    assert torch.equal(b["input_ids"][-1, :n], alone["input_ids"][0, :n])
    assert torch.equal(b["labels"][-1, :n], alone["labels"][0, :n])
    assert all(int(x["attention_mask"].sum()) <= 8 * 128 for x in batches)


def test_packed_reader_resumes_exactly_and_ranks_step_together(shards):
    packed = PackedReader(ShardReader(shards, 8, seed=3))
    packed.set_epoch(1)
    it = iter(packed)
    next(it), next(it)
    state = packed.state_dict()
    rest = [b["input_ids"] for b in it]
    again = PackedReader(ShardReader(shards, 8, seed=3))
    again.load_state_dict(state)
    assert all(torch.equal(a, b["input_ids"]) for a, b in zip(rest, again, strict=True))
    with pytest.raises(DataError, match="packed"):
        PackedReader(ShardReader(shards, 8, seed=3)).load_state_dict({**state, "packed": None})
    ranks = [PackedReader(ShardReader(shards, 8, seed=3, rank=r, world_size=2)).batches(0) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) and not set(np.concatenate(ranks[0])) & set(np.concatenate(ranks[1]))


def test_packed_batch_gives_each_example_its_own_mlm_loss(shards):
    """Each example's per-token MLM losses in a packed batch (rows of different lengths, positions from 0 in each)
    equal those of the example run alone: nothing crosses from one example to another."""
    from bertkit import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=600)).eval()
    packed = PackedReader(ShardReader(shards, 8, seed=3))
    batch = next(b for b in (packed.batch(i) for i in packed.batches(0))
                 if len(set(b["attention_mask"].sum(1).tolist())) > 1)
    batch = {k: v for k, v in batch.items() if k != "next_sentence_label"}

    def token_losses(b):
        logits = model(**{k: v for k, v in b.items() if k != "labels"}).logits
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), b["labels"], reduction="none")

    with torch.no_grad():
        together = token_losses(batch)
        for row in range(len(batch["input_ids"])):
            n = int(batch["attention_mask"][row].sum())
            alone = token_losses({k: v[row:row + 1, :n] for k, v in batch.items()})
            assert torch.allclose(together[row, :n], alone[0], atol=1e-5)
            chosen = batch["labels"][row, :n] != -100
            assert chosen.any() and torch.allclose(together[row, :n][chosen].mean(), alone[0][chosen].mean(),
                                                   atol=1e-5)


def test_pretrain_packing_flag_trains(shards, tmp_path):
    out = tmp_path / "run"
    assert cli(["pretrain", str(shards), "--out", str(out), "--preset", "tiny", "--batch-size", "8",
                "--precision", "fp32", "--no-progress", "--steps", "3", "--packing", "--save-every", "3"]) == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["split"] == "train"] == [1, 2, 3]
    assert json.loads((out / "pretrain_config.json").read_text())["packing"] is True
