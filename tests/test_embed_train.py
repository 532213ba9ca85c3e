"""EmbedDataset files and errors, batches, and a few real training steps of MiniLM through bertkit's loop."""

from __future__ import annotations

import json
import random

import pytest
import torch

from bertkit.embed.losses import CoSENTLoss, MultipleNegativesRankingLoss
from bertkit.embed.train import EmbedDataset, EmbedModel, embed_step, retrieval_eval, similarity_eval
from bertkit.errors import DataError


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------------- reading
def test_reads_pairs_with_negatives_jsonl_and_csv(tmp_path):
    data = EmbedDataset.read(_jsonl(tmp_path / "a.jsonl", [
        {"anchor": "q1", "positive": "p1", "negative": ["n1", "m1"]},
        {"anchor": "q2", "positive": "p2", "negative": ["n2", "m2"]}]))
    assert data.kind == "pairs" and data.columns == ["anchor", "positive", "negative_1", "negative_2"]
    assert data.texts[1] == ("q2", "p2", "n2", "m2")
    csv = tmp_path / "b.csv"
    csv.write_text("anchor,positive,negative_2,negative_1\nq1,p1,second,first\n", encoding="utf-8")
    assert EmbedDataset.read(csv).texts == [("q1", "p1", "first", "second")]


def test_reads_scored_pairs(tmp_path):
    csv = tmp_path / "s.csv"
    csv.write_text("text,text_pair,score\na,b,0.5\nc,d,1\n", encoding="utf-8")
    data = EmbedDataset.read(csv)
    assert data.kind == "scored" and data.scores == [0.5, 1.0] and data.texts[1] == ("c", "d")


@pytest.mark.parametrize("rows,message", [
    ([{"anchor": "q", "positive": "p"}, {"anchor": "q2", "positive": "  "}], r"b\.jsonl:2: column 'positive': empty"),
    ([{"anchor": "q", "pos": "p"}], r"b\.jsonl:1: column 'positive': missing"),
    ([{"anchor": "q", "positive": "p", "negative": ["n", "m"]},
      {"anchor": "q", "positive": "p", "negative": ["n"]}], r"b\.jsonl:2: column\(s\) negative: 1 negative\(s\), "
                                                             r"the first row has 2"),
    ([{"text": "a", "text_pair": "b", "score": "high"}], r"b\.jsonl:1: column 'score': 'high' is not a number"),
])
def test_errors_name_file_line_and_column(tmp_path, rows, message):
    with pytest.raises(DataError, match=message):
        EmbedDataset.read(_jsonl(tmp_path / "b.jsonl", rows))


def test_csv_blank_negative_is_a_count_error(tmp_path):
    csv = tmp_path / "c.csv"
    csv.write_text("anchor,positive,negative_1,negative_2\nq,p,n,m\nq2,p2,n2,\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c\.csv:3: column 'negative_2': empty text \(every row needs the same"):
        EmbedDataset.read(csv)


# ------------------------------------------------------------------------------------------------------ batches
@pytest.fixture(scope="module")
def minilm(minilm_dir):
    from bertkit.embed.st_format import load_sentence_encoder
    return load_sentence_encoder(minilm_dir)


def test_batches_hold_columns_and_keys(tmp_path, minilm):
    enc, tok = minilm
    data = EmbedDataset.read(_jsonl(tmp_path / "d.jsonl", [
        {"anchor": "a", "positive": "same", "negative": "n1"}, {"anchor": "b", "positive": "p2", "negative": "same"},
        {"anchor": "a", "positive": "p3", "negative": "n3"}]))
    batches = data.batches(enc, tok, batch_size=3, shuffle=False)
    (batch,) = list(batches)
    assert batch["anchor.input_ids"].shape[0] == 3 and batch["negative_1.attention_mask"].shape[0] == 3
    assert batch["anchor.key"].tolist() == [0, 1, 0]
    assert batch["positive.key"][0] == batch["negative_1.key"][1]         # one key space over all candidates


# ----------------------------------------------------------------------------------------------------- training
def _pairs(n: int) -> list[dict]:
    rng = random.Random(0)
    names = [f"agent {w}" for w in "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
             "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu".split()]
    places = "paris lima oslo cairo quito delhi tokyo rome bern kyiv riga doha lome suva apia male".split()
    return [{"anchor": f"{names[i % len(names)]} number {i}", "positive": f"{rng.choice(places)} {rng.choice(places)}"
             f" {i % 7}"} for i in range(n)]


def _mean_loss(model, batches) -> float:
    model.eval()
    with torch.no_grad():
        losses = [float(embed_step()(model, b).loss) for b in batches]
    return sum(losses) / len(losses)


def test_minilm_loss_drops_in_a_few_steps(tmp_path, minilm):
    from bertkit.train import TrainConfig, train
    enc, tok = minilm
    data = EmbedDataset.read(_jsonl(tmp_path / "train.jsonl", _pairs(64)))
    model = EmbedModel(enc, MultipleNegativesRankingLoss(learnable_scale=True))
    batches = data.batches(enc, tok, batch_size=16, seed=0)
    fixed = list(data.batches(enc, tok, batch_size=16, shuffle=False))
    before = _mean_loss(model, fixed)
    cfg = TrainConfig(max_steps=8, lr=1e-4, warmup=0, schedule="constant", precision="fp32", progress=False,
                      tensorboard=False, plot=False, save_final=False, eval_every_steps=8)
    queries = {str(i): p["anchor"] for i, p in enumerate(_pairs(64))}
    corpus = {str(i): p["positive"] for i, p in enumerate(_pairs(64))}
    result = train(model, batches, cfg, tmp_path / "run", step_fn=embed_step(mini_batch_size=8),
                   eval_fn=retrieval_eval(tok, queries, corpus, [(q, q) for q in queries]))
    after = _mean_loss(model, fixed)
    assert len(result.losses) == 8 and all(l == l for l in result.losses)
    assert after < before - 0.3, (before, after)
    assert {"recall@1", "mrr@10", "ndcg@10"} <= set(result.eval_history[-1])
    print(f"MNRL loss {before:.3f} -> {after:.3f}; train losses {[round(l, 3) for l in result.losses]}; "
          f"eval {result.eval_history[-1]}")


def test_scored_pairs_step_and_eval(tmp_path, minilm):
    enc, tok = minilm
    rows = [{"text": f"a cat sat {i}", "text_pair": f"a cat sat {i}" if i % 2 else "stock prices fell",
             "score": float(i % 2)} for i in range(8)]
    data = EmbedDataset.read(_jsonl(tmp_path / "s.jsonl", rows))
    model = EmbedModel(enc, CoSENTLoss())
    (batch,) = list(data.batches(enc, tok, batch_size=8, shuffle=False))
    model.train()
    step = embed_step()(model, batch)
    cached = embed_step(mini_batch_size=3)(model, batch)
    assert step.loss.requires_grad and cached.loss.requires_grad
    ev = similarity_eval(tok, [r["text"] for r in rows], [r["text_pair"] for r in rows], data.scores)(model)
    assert ev["spearman_cosine"] > 0.5
