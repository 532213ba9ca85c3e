"""The embedding commands end to end on tiny random models: finetune --task embed, evaluate --task embed,
embed --out INDEX/, search (+ rerank), rerank, mine, task-data retrieval; and their one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.cli import main

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the a man is eating food bread piece of paris capital france dog run city river music film game market "
         "price oil win team vote cup final rain snow").split()


def _tiny(cls, **kw):
    from bertkit import BertConfig, Tokenizer
    torch.manual_seed(0)
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    cfg = BertConfig.preset("tiny", vocab_size=len(vocab), hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, **kw)
    return cls(cfg).eval(), Tokenizer(vocab)


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory):
    """A random tiny BERT as a sentence-transformers directory: CLS pooling, normalised, max length 32."""
    from bertkit import BertModel
    from bertkit.embed.pooling import Pooling, SentenceEncoder
    from bertkit.embed.st_format import save_sentence_encoder
    bert, tok = _tiny(BertModel)
    enc = SentenceEncoder(bert, Pooling("cls"), normalize=True, max_seq_length=32)
    return save_sentence_encoder(enc, tok, tmp_path_factory.mktemp("tiny_st"))


@pytest.fixture(scope="module")
def tiny_ce(tmp_path_factory):
    """A random tiny pair classifier (labels 0 / 1): a cross-encoder."""
    from bertkit import BertForSequenceClassification
    model, tok = _tiny(BertForSequenceClassification, id2label={0: "0", 1: "1"})
    d = tmp_path_factory.mktemp("tiny_ce")
    model.save_pretrained(d, tokenizer=tok)
    return d


def _sentence(rng, n=5) -> str:
    return " ".join(rng.choice(WORDS, n))


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(0)
    d = tmp_path_factory.mktemp("embed_data")
    docs = [_sentence(rng, 6) for _ in range(24)]
    _jsonl(d / "pairs.jsonl", [{"anchor": _sentence(rng, 3), "positive": p} for p in docs])
    _jsonl(d / "dev" / "queries.jsonl", [{"id": f"q{i}", "text": _sentence(rng, 3)} for i in range(6)])
    _jsonl(d / "dev" / "corpus.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(docs[:10])])
    _jsonl(d / "dev" / "qrels.jsonl", [{"query_id": f"q{i}", "corpus_id": f"d{i}", "score": 1} for i in range(6)])
    _jsonl(d / "scored.jsonl", [{"text": _sentence(rng), "text_pair": _sentence(rng), "score": float(i % 3)}
                                for i in range(16)])
    (d / "docs.txt").write_text("\n".join(docs[:8]) + "\n", encoding="utf-8")
    return d


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _error(capsys, *argv) -> str:
    rc, out, err = _run(capsys, *argv)
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------------------------- finetune
def test_finetune_embed_saves_a_sentence_transformers_dir_that_reloads(capsys, tmp_path, tiny_st, data):
    from bertkit.embed.st_format import load_sentence_encoder
    out = tmp_path / "run"
    rc, stdout, _ = _run(capsys, "finetune", "--task", "embed", "--model", tiny_st, "--train", data / "pairs.jsonl",
                         "--dev", data / "dev", "--out", out, "--batch-size", "8", "--epochs", "2", "--lr", "1e-3",
                         "--pooling", "mean", "--symmetric", "--learnable-scale", "--gradcache-batch", "3",
                         "--projection", "16", "--max-length", "24", "--anchor-max-length", "8", "--quiet")
    assert rc == 0
    brief = json.loads(stdout)
    assert brief["task"] == "embed" and brief["loss"] == "mnrl" and brief["examples_per_s"] > 0
    assert set(brief["dev"]) == {"before", "after"} and 0 <= brief["dev"]["after"]["ndcg@10"]["mean"] <= 1
    assert brief["dev"]["before"] != brief["dev"]["after"]          # the weights moved
    pool = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pool["pooling_mode_mean_tokens"] and not pool["pooling_mode_cls_token"]
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 24
    enc, tok = load_sentence_encoder(out)
    assert enc.pooling.modes == ("mean",) and enc.normalize and enc.dim == 16 and enc.max_seq_length == 24
    # `bertkit embed` on the saved directory runs the same settings
    rc, stdout, _ = _run(capsys, "embed", out, "paris is the capital of france")
    got = np.array(json.loads(stdout)["embedding"])
    want = enc.encode(tok, ["paris is the capital of france"])[0]
    assert got.shape == (16,) and np.allclose(got, want, atol=1e-5)
    try:
        import sentence_transformers as st                    # a test extra: the oracle reads the same directory
    except ImportError:
        return
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(["paris is the capital of france"])[0]
    assert float(theirs @ want / np.linalg.norm(theirs) / np.linalg.norm(want)) >= 0.99999


def test_finetune_embed_scored_pairs_cosent_and_cosine(capsys, tmp_path, tiny_st, data):
    for loss in ("cosent", "cosine"):
        rc, stdout, _ = _run(capsys, "finetune", "--task", "embed", "--model", tiny_st, "--train",
                             data / "scored.jsonl", "--dev", data / "scored.jsonl", "--out", tmp_path / loss,
                             "--batch-size", "8", "--epochs", "1", "--loss", loss, "--no-save", "--quiet")
        assert rc == 0
        brief = json.loads(stdout)
        assert brief["loss"] == loss and "spearman_cosine" in brief["dev"]["after"]
        assert not (tmp_path / loss / "modules.json").exists()


@pytest.mark.parametrize("rows,extra,message", [
    ([{"anchor": "a man", "pos": "the dog"}] * 8, [], r"column 'positive': missing"),
    ([{"anchor": "a man", "positive": " "}] * 8, [], r"column 'positive': empty text"),
    ([{"anchor": "a", "positive": "b", "negative": ["c", "d"]}, {"anchor": "a", "positive": "b", "negative": ["c"]}],
     [], r"1 negative\(s\), the first row has 2"),
    ([{"text": "a", "text_pair": "b", "score": 1}] * 8, ["--loss", "mnrl"], r"--loss mnrl needs columns anchor"),
    ([{"anchor": "a", "positive": "b"}] * 8, ["--grid"], r"--grid does not apply to --task embed"),
    ([{"anchor": "a", "positive": "b"}] * 8, ["--eval-every", "2"], r"--eval-every does not apply to --task embed"),
    ([{"anchor": "a", "positive": "b"}] * 8, ["--pooling", "median"], r"pooling mode 'median'"),
])
def test_finetune_embed_bad_input_is_one_line(capsys, tmp_path, tiny_st, data, rows, extra, message):
    import re
    train = _jsonl(tmp_path / "bad.jsonl", rows)
    line = _error(capsys, "finetune", "--task", "embed", "--model", tiny_st, "--train", train, "--dev",
                  data / "dev", "--out", tmp_path / "run", "--batch-size", "4", "--quiet", *extra)
    assert re.search(message, line), line


def test_embed_flags_refused_for_other_tasks(capsys, tmp_path, tiny_st, data):
    line = _error(capsys, "finetune", "--task", "classify", "--model", tiny_st, "--train", data / "pairs.jsonl",
                  "--dev", data / "pairs.jsonl", "--out", tmp_path / "x", "--symmetric")
    assert "--symmetric applies to --task embed only" in line


# ------------------------------------------------------------------------------------------------- evaluate
def test_evaluate_embed_before_after_and_scored(capsys, tmp_path, tiny_st, data):
    from bertkit.embed.runner import evaluate_embed
    rc, stdout, _ = _run(capsys, "evaluate", "--task", "embed", "--model", tiny_st, "--baseline", tiny_st,
                         "--data", data / "dev", "--out", tmp_path / "ev")
    report = json.loads(stdout)
    assert rc == 0 and report["before"]["ndcg@10"] == report["after"]["ndcg@10"]
    assert {"recall@1", "recall@5", "recall@10", "mrr@10", "ndcg@10"} <= set(report["after"])
    assert json.loads((tmp_path / "ev" / "metrics_embed.json").read_text()) == report
    scored = evaluate_embed(tiny_st, data / "scored.jsonl")
    assert -1 <= scored["spearman_cosine"] <= 1
    # a pair file: anchors retrieve among the distinct positives
    assert evaluate_embed(tiny_st, data / "pairs.jsonl")["queries"] == 24


def test_evaluate_embed_replaces_a_link_in_out_and_leaves_its_target(capsys, tmp_path, tiny_st, data):
    """A hard link named metrics_embed.json inside --out must be replaced, not written through (its target is
    another file of the user's)."""
    out, victim = tmp_path / "ev", tmp_path / "keep.txt"
    victim.write_text("the user's file\n")
    out.mkdir()
    os.link(victim, out / "metrics_embed.json")
    assert "--overwrite" in _error(capsys, "evaluate", "--task", "embed", "--model", tiny_st, "--data", data / "dev",
                                   "--out", out)
    rc, stdout, _ = _run(capsys, "evaluate", "--task", "embed", "--model", tiny_st, "--data", data / "dev", "--out",
                         out, "--overwrite")
    assert rc == 0 and victim.read_text() == "the user's file\n"
    assert json.loads((out / "metrics_embed.json").read_text()) == json.loads(stdout)


def test_baseline_needs_task_embed(capsys, tiny_st, data):
    assert "--baseline applies to --task embed only" in _error(capsys, "evaluate", "--model", tiny_st, "--baseline",
                                                                 tiny_st, "--data", data / "scored.jsonl")


def test_evaluate_embed_bad_retrieval_dir(capsys, tmp_path, tiny_st, data):
    d = tmp_path / "bad"
    _jsonl(d / "queries.jsonl", [{"id": "q1", "text": "the dog"}])
    _jsonl(d / "corpus.jsonl", [{"id": "d1", "text": "a man"}])
    _jsonl(d / "qrels.jsonl", [{"query_id": "q1", "corpus_id": "d9"}])
    assert "corpus id 'd9' is not in the corpus file" in _error(capsys, "evaluate", "--task", "embed", "--model",
                                                                  tiny_st, "--data", d)
    (d / "qrels.jsonl").unlink()
    assert "no qrels.jsonl" in _error(capsys, "evaluate", "--task", "embed", "--model", tiny_st, "--data", d)


# ----------------------------------------------------------------------------------------- embed, search, rerank
def test_embed_reads_the_sentence_transformers_pooling(capsys, tiny_st):
    from bertkit.embed.st_format import load_sentence_encoder
    enc, tok = load_sentence_encoder(tiny_st)
    rc, stdout, _ = _run(capsys, "embed", tiny_st, "the dog is eating bread")
    got = np.array(json.loads(stdout)["embedding"])
    assert np.allclose(got, enc.encode(tok, ["the dog is eating bread"])[0], atol=1e-5)
    rc, stdout, _ = _run(capsys, "embed", tiny_st, "the dog is eating bread", "--pooling", "mean")
    assert not np.allclose(np.array(json.loads(stdout)["embedding"]), got, atol=1e-3)   # cls != mean


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_embed_index_then_search(capsys, tmp_path, tiny_st, data, dtype):
    index = tmp_path / "index"
    rc, stdout, _ = _run(capsys, "embed", tiny_st, "--file", data / "dev" / "corpus.jsonl", "--out", index,
                         "--dtype", dtype)
    assert rc == 0 and json.loads(stdout)["count"] == 10
    assert json.loads((index / "manifest.json").read_text())["dtype"] == dtype
    corpus = [json.loads(l)["text"] for l in (data / "dev" / "corpus.jsonl").read_text().splitlines()]
    rc, stdout, _ = _run(capsys, "search", index, "--query", corpus[3], "--query", corpus[7], "--top-k", "3")
    hits = [json.loads(l)["hits"] for l in stdout.splitlines()]
    if dtype == "int8":    # a random tiny model's vectors are close together: 8 bits may swap near neighbours
        assert "d3" in [h["id"] for h in hits[0]] and "d7" in [h["id"] for h in hits[1]]
    else:
        assert [h[0]["id"] for h in hits] == ["d3", "d7"] and hits[0][0]["text"] == corpus[3]
    assert all(len(h) == 3 and h[0]["score"] >= h[1]["score"] >= h[2]["score"] for h in hits)
    assert "holds an earlier index" in _error(capsys, "embed", tiny_st, "--file", data / "docs.txt", "--out", index)


def test_search_with_another_model_is_refused(capsys, tmp_path, tiny_st, tiny_ce, data):
    from bertkit import BertModel
    from bertkit.embed.pooling import Pooling, SentenceEncoder
    from bertkit.embed.st_format import save_sentence_encoder
    index = tmp_path / "index"
    assert _run(capsys, "embed", tiny_st, "--file", data / "docs.txt", "--out", index)[0] == 0
    bert, tok = _tiny(BertModel)
    with torch.no_grad():
        bert.embeddings.word_embeddings.weight.mul_(1.01)
    other = save_sentence_encoder(SentenceEncoder(bert, Pooling("cls"), normalize=True, max_seq_length=32), tok,
                                  tmp_path / "other")
    line = _error(capsys, "search", index, "--query", "the dog", "--model", other)
    assert "is not the model that built" in line and str(Path(tiny_st).resolve()) in line     # names the index's model
    line = _error(capsys, "search", index, "--query", "the dog", "--rerank", tiny_st)
    assert "reranking needs a pair classification" in line


def test_rerank_scores_and_sorts(capsys, tiny_ce, data):
    from bertkit.rerank import CrossEncoder, rerank
    docs = (data / "docs.txt").read_text().splitlines()
    rc, stdout, _ = _run(capsys, "rerank", tiny_ce, "--query", "the man is eating", "--file", data / "docs.txt")
    results = json.loads(stdout)["results"]
    assert rc == 0 and sorted(r["index"] for r in results) == list(range(len(docs)))
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    ce = CrossEncoder.load(tiny_ce)
    got = ce.score("the man is eating", docs)
    logits = ce.predictor.logits(["the man is eating"] * len(docs), docs)
    assert np.allclose(sorted(got, reverse=True), scores, atol=1e-6)
    probs = torch.from_numpy(logits).softmax(-1)[:, 1].numpy()     # two labels: label "1"'s probability,
    assert np.allclose(got, probs, atol=1e-6)                       # as CrossEncoder.predict(apply_softmax=True)
    top = rerank(tiny_ce, "the man is eating", docs, top_k=2)
    assert [r["index"] for r in top] == [r["index"] for r in results[:2]]
    assert "document 2 is empty" in str(pytest.raises(Exception, ce.score, "q", ["a man", " "]).value)
    limit = ce.predictor.model.config.max_position_embeddings
    line = _error(capsys, "rerank", tiny_ce, "--query", "q", "--file", data / "docs.txt", "--max-length", "100000")
    assert f"--max-length 100000 exceeds the model's {limit} positions" in line
    assert "is a directory" in _error(capsys, "rerank", tiny_ce, "--query", "q", "--file", data)


def test_search_then_rerank(capsys, tmp_path, tiny_st, tiny_ce, data):
    index = tmp_path / "index"
    assert _run(capsys, "embed", tiny_st, "--file", data / "docs.txt", "--out", index)[0] == 0
    rc, stdout, _ = _run(capsys, "search", index, "--query", "the man is eating", "--rerank", tiny_ce, "--top-k", "3")
    hits = json.loads(stdout)["hits"]
    assert rc == 0 and len(hits) == 3
    assert [h["rerank_score"] for h in hits] == sorted((h["rerank_score"] for h in hits), reverse=True)


# ----------------------------------------------------------------------------------------------------- mine
def test_mine_hard_negatives_then_train_on_them(capsys, tmp_path, tiny_st, data):
    out = tmp_path / "mined.jsonl"
    rc, stdout, _ = _run(capsys, "mine", tiny_st, "--data", data / "pairs.jsonl", "--out", out, "--negatives", "2",
                         "--skip-top", "1", "--corpus", data / "docs.txt")
    assert rc == 0 and json.loads(stdout)["rows"] == 24
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert all(set(r) == {"anchor", "positive", "negative_1", "negative_2"} for r in rows)
    assert all(r["positive"] not in (r["negative_1"], r["negative_2"]) for r in rows)
    assert "exists" in _error(capsys, "mine", tiny_st, "--data", data / "pairs.jsonl", "--out", out)
    line = _error(capsys, "mine", tiny_st, "--data", data / "pairs.jsonl", "--out", tmp_path / "x.jsonl",
                  "--negatives", "40")
    assert "candidate(s)" in line
    rc, stdout, _ = _run(capsys, "finetune", "--task", "embed", "--model", tiny_st, "--train", out, "--dev",
                         data / "dev", "--out", tmp_path / "run", "--batch-size", "8", "--epochs", "1", "--no-save",
                         "--quiet")
    assert rc == 0 and json.loads(stdout)["train_examples"] == 24
    # the same mining as pointwise cross-encoder data: a pair classifier trains on it
    pairs = tmp_path / "ce.csv"
    assert _run(capsys, "mine", tiny_st, "--data", data / "pairs.jsonl", "--out", pairs, "--negatives", "2",
                "--format", "pair")[0] == 0
    from bertkit.tasks.readers import table_rows
    labels = [row["label"] for _, row in table_rows(pairs)]
    assert labels.count("1") == 24 and labels.count("0") == 48


# ------------------------------------------------------------------------------------------------ task data
def test_task_data_retrieval_splits_by_article(tmp_path, bbc_articles):
    from bertkit.embed.runner import read_retrieval
    from bertkit.tasks import data
    stats = data.build("retrieval", tmp_path)
    train = [json.loads(l) for l in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(train) == stats["counts"]["train"] > 1000 and {"anchor", "positive"} == set(train[0])
    dev_q, dev_c, dev_rel = read_retrieval(tmp_path / "dev")
    test_q, test_c, _ = read_retrieval(tmp_path / "test")
    assert not set(dev_c) & set(test_c) and len(dev_q) == len(dev_c) == stats["counts"]["dev"]
    assert all(rel == {q: 1.0} for q, rel in dev_rel.items())              # each headline -> its own article
    assert not {r["positive"] for r in train} & (set(dev_c.values()) | set(test_c.values()))


def test_qrels_grades_read_as_written(tmp_path):
    """A JSON grade 0 is not relevant (not a blank read as 1); a blank CSV grade is 1; a list is named."""
    from bertkit.embed.runner import read_retrieval
    from bertkit.errors import DataError
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "a"}\n')
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "x"}\n{"_id": "d2", "text": "y"}\n')
    (tmp_path / "qrels.jsonl").write_text('{"query-id": "q1", "corpus-id": "d1", "score": 0}\n'
                                          '{"query-id": "q1", "corpus-id": "d2", "score": ""}\n')
    assert read_retrieval(tmp_path)[2] == {"q1": {"d1": 0.0, "d2": 1.0}}
    (tmp_path / "qrels.jsonl").write_text('{"query-id": "q1", "corpus-id": "d1", "score": [1]}\n')
    with pytest.raises(DataError, match="column 'score'"):
        read_retrieval(tmp_path)


def test_embed_of_a_model_with_fewer_positions_than_the_default_length(tmp_path, capsys):
    """The default pieces per text (256) stays within a model's position table (here 64): a long line is cut
    there, not refused."""
    from bertkit import BertConfig, BertForMaskedLM, Tokenizer
    from bertkit.cli import main
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(40)]
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64)
    BertForMaskedLM(cfg).save_pretrained(tmp_path / "m", tokenizer=Tokenizer({t: i for i, t in enumerate(vocab)}))
    (tmp_path / "t.txt").write_text(" ".join(["w1"] * 300) + "\nw2 w3\n")
    assert main(["embed", str(tmp_path / "m"), "--file", str(tmp_path / "t.txt"), "--out",
                 str(tmp_path / "v.npy")]) == 0
    assert np.load(tmp_path / "v.npy").shape == (2, 16)
