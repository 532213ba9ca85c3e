"""Inference: embeddings against sentence-transformers' reference, fill-mask mechanics on a tiny random MLM,
joint decoding never worse than independent argmax (in pseudo-likelihood), the CLI end to end."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError

WORDS = ["the", "a", "man", "is", "eating", "food", "bread", "piece", "of", "paris", "capital", "france", "cap",
         "##ital", "##s", "##ing", "dog", "run", ".", ","]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory):
    """A random 2-layer BertForMaskedLM over a 25-token vocabulary, saved as an HF-format directory."""
    from bertkit import BertConfig, BertForMaskedLM, Tokenizer
    torch.manual_seed(0)
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(vocab)
    cfg = BertConfig.preset("tiny", vocab_size=len(vocab), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForMaskedLM(cfg).eval()
    d = tmp_path_factory.mktemp("tiny_mlm")
    model.save_pretrained(d, tokenizer=tok)
    return d


@pytest.fixture(scope="module")
def predictor(tiny_mlm):
    from bertkit.infer import Predictor
    return Predictor.load(tiny_mlm)


def test_minilm_mean_pooled_cosine_matches_sentence_transformers(minilm_dir):
    from bertkit.infer import Predictor
    p = Predictor.load(minilm_dir)
    assert p.task == "encoder" and not p.has_mlm
    v = p.embed(["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert abs(float(v[0] @ v[1]) - 0.755) < 0.002          # sentence-transformers' all-MiniLM-L6-v2 reference
    assert float(v[0] @ v[2]) < 0.2                         # unrelated sentence: far
    raw = p.embed(["A man is eating food."], normalize=False)
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3
    last = p.embed(["A man is eating food."], layers=[-1])
    assert np.allclose(last, v[:1], atol=1e-5)              # layers=[-1] is the default last layer
    mixed = p.embed(["A man is eating food."], layers=[-1, -2])
    cls = p.embed(["A man is eating food."], pooling="cls")
    assert not np.allclose(mixed, v[:1], atol=1e-3) and not np.allclose(cls, v[:1], atol=1e-3)
    with pytest.raises(BertkitError, match="layers"):
        p.embed(["x"], layers=[99])
    with pytest.raises(BertkitError, match="masked-LM"):
        p.fill_mask("Paris is the [MASK] of France.")


def test_embed_is_batch_invariant(minilm_dir):
    from bertkit.infer import Predictor
    p = Predictor.load(minilm_dir)
    texts = ["short one.", "a much longer sentence that needs a lot more padding in its batch than the others do."] * 3
    together = p.embed(texts, batch_size=6)
    alone = np.concatenate([p.embed([t]) for t in texts])
    assert np.abs(together - alone).max() < 1e-5


def test_cosine_search_orders_by_similarity():
    from bertkit.infer import cosine_search
    corpus = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    hits = cosine_search(np.array([[3.0, 0.1]]), corpus, top_k=2)[0]
    assert [i for i, _ in hits] == [0, 2]
    assert hits[0][1] == pytest.approx(3.0 / math.hypot(3.0, 0.1))


def test_fill_one_mask_returns_ranked_word_starts(predictor):
    res = predictor.fill_mask("the man is [MASK] food .", top_k=5)
    assert res["masks"] == 1
    cands = res["candidates"]
    assert len(cands) == 5
    scores = [c["score"] for c in cands]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0 + 1e-6
    for c in cands:
        assert not c["word"].startswith("##") and not c["word"].startswith("[")
        assert "".join(p.removeprefix("##") for p in c["pieces"]) == c["word"]
        assert c["word"] in c["sequence"]
        if len(c["pieces"]) > 1:                            # a real split: the whole word is not one vocab entry
            assert c["word"] not in predictor.tokenizer.vocab
    # one-piece scores are exactly the softmax at the mask over word-start pieces
    ids = predictor.masked_ids("the man is [MASK] food .", 64)
    lp = predictor.log_probs([ids], [ids.index(predictor.tokenizer.mask_token_id)])[0, 0]
    single = [c for c in cands if len(c["pieces"]) == 1]
    for c in single:
        assert c["score"] == pytest.approx(math.exp(float(lp[predictor.tokenizer.vocab[c["word"]]])), rel=1e-4)


def test_whole_word_candidates_are_found(predictor):
    words = predictor._fill_word(predictor.masked_ids("the [MASK] of france", 64), 2, 2, beam_size=50)
    assert words, "two-piece decoding produced no candidate"
    for pieces, score in words:
        toks = predictor.tokenizer.convert_ids_to_tokens(pieces)
        assert not toks[0].startswith("##") and toks[1].startswith("##") and score <= 0


def test_joint_fill_scores_are_pseudo_likelihoods_and_beat_independent(predictor):
    tok = predictor.tokenizer
    ids = predictor.masked_ids("the [MASK] [MASK] eating food .", 64)
    positions = [i for i, t in enumerate(ids) if t == tok.mask_token_id]
    results = predictor.joint_fill(ids, positions, top_k=3, beam_size=6)
    assert len(results) == 3 and results[0].score >= results[1].score >= results[2].score
    best = list(ids)
    for p, t in zip(positions, tok.convert_tokens_to_ids(results[0].tokens)):
        best[p] = t
    assert math.log(results[0].score) == pytest.approx(predictor.pseudo_log_likelihood([best], positions)[0], abs=1e-4)
    # each mask is a word: no "##" piece, no special token (the default words=True)
    assert not any(t.startswith("##") or t.startswith("[") for r in results for t in r.tokens)
    indep = list(ids)
    for p, t in zip(positions, predictor.independent_fill(ids, positions, words=True)):
        indep[p] = t
    assert math.log(results[0].score) >= predictor.pseudo_log_likelihood([indep], positions)[0] - 1e-5
    free = predictor.joint_fill(ids, positions, top_k=1, beam_size=6, words=False)[0]
    free_indep = list(ids)
    for p, t in zip(positions, predictor.independent_fill(ids, positions)):
        free_indep[p] = t
    assert math.log(free.score) >= predictor.pseudo_log_likelihood([free_indep], positions)[0] - 1e-5
    # with a beam as wide as the vocabulary the search finds the brute-force PLL optimum of 2 masks often enough:
    # at least it must be within the top few of all |V|^2 fills
    cand = [i for i in range(len(tok.vocab)) if bool(predictor.fills.word_start[i])]
    rows = []
    for a, b in itertools.product(cand, cand):
        r = list(ids)
        r[positions[0]], r[positions[1]] = a, b
        rows.append(r)
    pll = sorted(predictor.pseudo_log_likelihood(rows, positions), reverse=True)
    wide = predictor.joint_fill(ids, positions, top_k=1, beam_size=len(cand))[0]
    assert math.log(wide.score) >= pll[min(4, len(pll) - 1)] - 1e-5



def test_multi_mask_eval_counts_both_decoders(predictor):
    from bertkit.errors import ConfigError
    from bertkit.fillmask_eval import MultiMaskOptions, multi_mask_eval
    sents = ["the man is eating a piece of bread .", "a dog is eating the bread of paris .", "too short ."]
    for span in ("contiguous", "scattered"):
        r = multi_mask_eval(predictor, sents, MultiMaskOptions(span=span, n_masks=(2,), beam_size=2))
        assert r["span"] == span and r["sentences"] == 2 and r["masks"] == 4
        assert 0 <= r["joint_exact_count"] <= 2 and 0.0 <= r["independent_per_mask"] <= 1.0
        assert r == multi_mask_eval(predictor, sents, MultiMaskOptions(span=span, n_masks=(2,), beam_size=2))
    with pytest.raises(ConfigError, match="span"):
        MultiMaskOptions(span="adjacent")
    with pytest.raises(BertkitError, match="no sentence"):
        multi_mask_eval(predictor, ["too short ."])

def test_fill_mask_errors(predictor):
    with pytest.raises(BertkitError, match=r"no \[MASK\]"):
        predictor.fill_mask("no mask here")
    with pytest.raises(BertkitError, match="limit"):
        predictor.fill_mask("the " * 600 + "[MASK]")


def test_cli_fill_mask_and_embed(tiny_mlm, tmp_path, capsys):
    from bertkit.cli import main
    assert main(["fill-mask", str(tiny_mlm), "the [MASK] is eating .", "the [MASK] [MASK] .", "--json", "--top-k", "3"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["masks"] for x in lines] == [1, 2] and all(len(x["candidates"]) == 3 for x in lines)
    sents = tmp_path / "s.txt"
    sents.write_text("the man is eating food .\na dog run .\n\nparis france .\n")
    out = tmp_path / "v.npy"
    assert main(["embed", str(tiny_mlm), "--file", str(sents), "--out", str(out)]) == 0
    v = np.load(out)
    assert v.shape == (3, 128) and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    capsys.readouterr()
    assert main(["embed", str(tiny_mlm), "--file", str(sents), "--search", "the man is eating food .", "--top-k", "2"]) == 0
    hit = json.loads(capsys.readouterr().out)
    assert hit["hits"][0]["text"] == "the man is eating food ." and hit["hits"][0]["cosine"] == pytest.approx(1.0, abs=1e-4)
    assert main(["fill-mask", str(tiny_mlm), "nothing to fill"]) == 2
    assert "no [MASK]" in capsys.readouterr().err


def test_attention_maps_and_cli(tiny_mlm, tmp_path):
    from bertkit.cli import main
    from bertkit.infer import Predictor
    tokens, att = Predictor.load(tiny_mlm).attention("the man is eating food .")
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and len(att) == 2
    assert att[0].shape == (2, len(tokens), len(tokens))
    assert np.allclose(att[1].sum(-1), 1.0, atol=1e-5)
    assert main(["attention", str(tiny_mlm), "the man is eating food .", "--out", str(tmp_path), "--query", "man"]) == 0
    assert (tmp_path / "attention_grid.png").stat().st_size > 5000
    assert (tmp_path / "attention_from_man.png").stat().st_size > 5000
