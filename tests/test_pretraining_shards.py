"""prepare() -> shards on disk -> ShardReader batches: the batch contract, determinism, ranks, exact resume, crash
safety, vocab checks, parallel building, bad input and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from bertkit.errors import ConfigError, DataError
from bertkit.pretraining import PrepareConfig, ReaderOptions, ShardReader, prepare, read_manifest


@pytest.fixture(scope="module")
def small_corpus(bbc_articles, tmp_path_factory):
    """149 BBC articles over all topics in prose layout (a paragraph per line, blank line between articles)."""
    path = tmp_path_factory.mktemp("corpus") / "bbc150.txt"
    with open(path, "w") as f:
        for a in bbc_articles[::15]:
            f.write(a.title + "\n" + "\n".join(a.paragraphs) + "\n\n")
    return path


@pytest.fixture(scope="module")
def vocab(bert_vocab_file):
    return bert_vocab_file


@pytest.fixture(scope="module")
def tok(vocab):
    from bertkit.tokenizer import Tokenizer
    return Tokenizer.from_pretrained(vocab)


@pytest.fixture(scope="module")
def static_dir(small_corpus, vocab, tmp_path_factory):
    out = tmp_path_factory.mktemp("static")
    summary = prepare(PrepareConfig(small_corpus, vocab, out, seq_len=64, task="nsp", masking="wwm",
                                    examples_per_shard=500))
    return out, summary


@pytest.fixture(scope="module")
def dynamic_dir(small_corpus, vocab, tmp_path_factory):
    out = tmp_path_factory.mktemp("dynamic")
    prepare(PrepareConfig(small_corpus, vocab, out, seq_len=64, task="sop", masking="token", dynamic=True,
                          examples_per_shard=700))
    return out


def test_manifest_and_summary(static_dir, tok):
    out, s = static_dir
    m = read_manifest(out)
    assert m["vocab_hash"] == tok.vocab_hash and m["vocab_size"] == tok.vocab_size
    assert m["seq_len"] == 64 and m["task"] == "nsp" and m["masking"]["mode"] == "wwm" and m["static_masks"]
    assert m["counts"]["examples"] == s.build.examples == sum(e["examples"] for e in m["shards"])
    assert len(m["shards"]) == s.shards >= 3
    assert m["counts"]["documents"] == 149          # bbc_articles[::15]
    assert abs(s.masked_share - 0.15) < 0.005
    text = s.format()
    for word in ("documents", "examples", "tokens", "masking", "MB/s", "skipped"):
        assert word in text


def test_batch_contract(static_dir, tok):
    out, _ = static_dir
    reader = ShardReader(out, batch_size=16, seed=1)
    batch = next(iter(reader))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label"}
    for k in ("input_ids", "token_type_ids", "attention_mask", "labels"):
        assert batch[k].shape == (16, 64) and batch[k].dtype == torch.long
    assert batch["next_sentence_label"].shape == (16,) and batch["next_sentence_label"].dtype == torch.long
    ids, types, att, labels = (batch[k].numpy() for k in ("input_ids", "token_type_ids", "attention_mask", "labels"))
    assert (ids[:, 0] == tok.cls_token_id).all()
    for r in range(16):
        n = att[r].sum()
        assert (att[r, :n] == 1).all() and (att[r, n:] == 0).all()
        assert (ids[r, n:] == tok.pad_token_id).all() and ids[r, n - 1] == tok.sep_token_id
        seps = np.flatnonzero(ids[r, :n] == tok.sep_token_id)
        assert len(seps) == 2
        assert (types[r, :seps[0] + 1] == 0).all() and (types[r, seps[0] + 1:n] == 1).all() and (types[r, n:] == 0).all()
    masked = labels != -100
    assert masked.any(axis=1).all()
    shown = ids[masked]
    assert (shown == tok.mask_token_id).mean() > 0.6
    assert (labels[masked] != tok.mask_token_id).all()
    assert set(batch["next_sentence_label"].tolist()) <= {0, 1}


def test_static_masks_repeat_dynamic_masks_change(static_dir, dynamic_dir):
    idx = np.arange(40)
    for path, same in ((static_dir[0], True), (dynamic_dir, False)):
        r = ShardReader(path, batch_size=8)
        e0, e0b, e1 = r.batch(idx, epoch=0), r.batch(idx, epoch=0), r.batch(idx, epoch=1)
        assert torch.equal(e0["labels"], e0b["labels"]) and torch.equal(e0["input_ids"], e0b["input_ids"])
        assert torch.equal(e0["labels"], e1["labels"]) == same
    r = ShardReader(dynamic_dir, batch_size=8)
    b = r.batch(np.arange(r.num_examples), 0)
    chosen = b["labels"] != -100
    maskable = (b["attention_mask"] == 1) & (b["input_ids"] != 101) & (b["input_ids"] != 102)
    maskable |= chosen
    assert abs(chosen.sum().item() / maskable.sum().item() - 0.15) < 0.01
    assert set(b["next_sentence_label"].tolist()) == {0, 1}


def test_static_shards_remasked_dynamically(static_dir):
    """masking=MaskingConfig(...) ignores the stored whole-word 15% masks: token masks at 40%, fresh every epoch,
    drawn from the stored tokens (the labels hold the original ids, the rows are otherwise unchanged)."""
    from bertkit.pretraining.masking import MaskingConfig
    stored = ShardReader(static_dir[0], batch_size=8)
    r = ShardReader(static_dir[0], batch_size=8, masking=MaskingConfig(mode="token", mask_prob=0.4))
    assert r.remasked and r.masking.dynamic and not stored.remasked
    idx = np.arange(r.num_examples)
    tokens, _, pos, ids = r.gather(idx)
    assert pos is None and ids is None                                              # stored masks not read
    e0, e1, plain = r.batch(idx, 0), r.batch(idx, 1), stored.batch(idx, 0)
    chosen = e0["labels"] != -100
    assert not torch.equal(e0["labels"], e1["labels"])
    assert torch.equal(e0["labels"][chosen], torch.from_numpy(tokens)[chosen])
    assert torch.equal(e0["attention_mask"], plain["attention_mask"])
    maskable = (e0["attention_mask"] == 1) & (torch.from_numpy(tokens) != 101) & (torch.from_numpy(tokens) != 102)
    assert abs(chosen.sum().item() / maskable.sum().item() - 0.4) < 0.01
    assert abs((plain["labels"] != -100).sum().item() / maskable.sum().item() - 0.15) < 0.01


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_permute_is_a_seeded_bijection(n):
    from bertkit.pretraining.shards import permute
    p = permute(np.arange(n), n, seed=1, epoch=0)
    assert sorted(p.tolist()) == list(range(n))
    assert np.array_equal(permute(np.arange(n)[::-1], n, 1, 0), p[::-1])             # pointwise: any subset
    if n >= 64:
        assert not np.array_equal(p, permute(np.arange(n), n, 1, 1))
        assert not np.array_equal(p, permute(np.arange(n), n, 2, 0))
        assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 0.2                         # no visible order left


def test_permute_is_uniform_enough():
    from bertkit.pretraining.shards import permute
    first = np.array([permute(np.array([0]), 10, seed=s, epoch=0)[0] for s in range(5000)])
    counts = np.bincount(first, minlength=10)
    assert counts.min() > 400 and counts.max() < 600                                  # 500 expected each


def _all_batches(reader, n=None):
    out = []
    for i, b in enumerate(reader):
        out.append(b)
        if n is not None and i + 1 == n:
            break
    return out


def test_deterministic_for_a_seed(dynamic_dir):
    a = _all_batches(ShardReader(dynamic_dir, batch_size=32, seed=4))
    b = _all_batches(ShardReader(dynamic_dir, batch_size=32, seed=4))
    c = _all_batches(ShardReader(dynamic_dir, batch_size=32, seed=5), 1)
    assert len(a) == len(b) > 5
    assert all(torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"]) for x, y in zip(a, b))
    assert not torch.equal(a[0]["input_ids"], c[0]["input_ids"])


def test_ranks_split_the_data(dynamic_dir):
    one = ShardReader(dynamic_dir, batch_size=8, seed=3)
    ranks = [ShardReader(dynamic_dir, batch_size=8, seed=3, rank=r, world_size=3) for r in range(3)]
    parts = [r.indices(0) for r in ranks]
    assert all(len(p) == one.num_examples // 3 for p in parts)
    assert len(set(np.concatenate(parts).tolist())) == 3 * len(parts[0])          # disjoint
    assert len({len(r) for r in ranks}) == 1                                       # same number of batches
    # an example's dynamic mask does not depend on the rank or batch composition
    idx = parts[1][:8]
    assert torch.equal(one.batch(idx, 0)["input_ids"], next(iter(ranks[1]))["input_ids"])
    # and the epoch order differs between epochs
    assert not np.array_equal(ranks[0].indices(0), ranks[0].indices(1))



def test_reader_options_and_keywords_agree(dynamic_dir):
    opts = ReaderOptions(seed=3, world_size=3)
    by_options = ShardReader(dynamic_dir, 8, opts, rank=1)
    by_keywords = ShardReader(dynamic_dir, batch_size=8, seed=3, rank=1, world_size=3)
    assert np.array_equal(by_options.indices(0), by_keywords.indices(0)) and opts.rank == 0
    with pytest.raises(ConfigError, match="unknown option sed"):
        ShardReader(dynamic_dir, 8, sed=3)
    with pytest.raises(DataError, match="rank=3 / world_size=3"):
        ShardReader(dynamic_dir, 8, opts, rank=3)

def test_exact_resume(dynamic_dir):
    reader = ShardReader(dynamic_dir, batch_size=64, seed=9, infinite=True)
    per_epoch = len(reader)
    it = iter(reader)
    for _ in range(per_epoch - 2):
        next(it)
    state = json.loads(json.dumps(reader.state_dict()))          # survives a JSON round trip (checkpoints)
    expected = [next(it) for _ in range(5)]                        # crosses into epoch 1
    fresh = ShardReader(dynamic_dir, batch_size=64, seed=9, infinite=True)
    fresh.load_state_dict(state)
    got = [b for b, _ in zip(fresh, range(5))]
    for x, y in zip(expected, got):
        for k in x:
            assert torch.equal(x[k], y[k])
    assert fresh.epoch == 1
    with pytest.raises(DataError, match="batch_size"):
        ShardReader(dynamic_dir, batch_size=32, seed=9).load_state_dict(state)


def test_finite_iteration_runs_one_epoch(dynamic_dir):
    reader = ShardReader(dynamic_dir, batch_size=50, seed=0, drop_last=False)
    batches = _all_batches(reader)
    assert len(batches) == len(reader) and reader.epoch == 1
    assert sum(len(b["input_ids"]) for b in batches) == reader.num_examples


def test_vocab_checks(static_dir, tok):
    out, _ = static_dir
    ShardReader(out, batch_size=4, vocab_hash=tok.vocab_hash, vocab_size=tok.vocab_size)
    ShardReader(out, batch_size=4, vocab_size=tok.vocab_size + 6)       # a model vocab padded to a multiple of 8
    with pytest.raises(DataError, match="vocab"):
        ShardReader(out, batch_size=4, vocab_hash="0" * 64)
    with pytest.raises(DataError, match="vocab_size=1000"):
        ShardReader(out, batch_size=4, vocab_size=1000)


def test_damaged_shards_are_refused(small_corpus, vocab, tmp_path):
    prepare(PrepareConfig(small_corpus, vocab, tmp_path, seq_len=64, task="nsp", examples_per_shard=400))
    m = read_manifest(tmp_path)
    shard = m["shards"][1]
    tok_file = tmp_path / shard["files"]["tokens"]["file"]
    data = tok_file.read_bytes()
    tok_file.write_bytes(data[:-10])                                   # truncated
    with pytest.raises(DataError, match="bytes"):
        ShardReader(tmp_path, batch_size=4)
    tok_file.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))            # same size, one bit flipped
    ShardReader(tmp_path, batch_size=4)                                 # the cheap check passes...
    with pytest.raises(DataError, match="sha256"):
        ShardReader(tmp_path, batch_size=4, verify="full")               # ...the full check does not
    tok_file.write_bytes(data)
    (tmp_path / f"{shard['name']}.done.json").unlink()
    with pytest.raises(DataError, match="completeness marker"):
        ShardReader(tmp_path, batch_size=4)
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(DataError, match="did not finish"):
        ShardReader(tmp_path, batch_size=4)
    prepare(PrepareConfig(small_corpus, vocab, tmp_path / "x", seq_len=64))
    with pytest.raises(DataError, match="overwrite"):
        prepare(PrepareConfig(small_corpus, vocab, tmp_path / "x", seq_len=64))


def test_killed_build_is_refused(vocab, bbc_articles, tmp_path):
    corpus = tmp_path / "big.txt"
    with open(corpus, "w") as f:
        for a in bbc_articles * 2:          # ~10 MB: the build takes seconds, the first shard a fraction of that
            f.write(a.title + "\n" + "\n".join(a.paragraphs) + "\n\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "bertkit", "prepare", "--corpus", str(corpus), "--vocab", str(vocab),
                             "--out", str(out), "--seq-len", "64", "--examples-per-shard", "300", "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not (out.exists() and any(out.glob("*.done.json"))):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert any(out.glob("*.done.json")), "the build never wrote a shard"
    assert not (out / "manifest.json").exists(), "the build finished before it could be killed"
    with pytest.raises(DataError, match="did not finish"):
        ShardReader(out, batch_size=4)
    # a rebuild into the same directory clears the leftovers and works
    prepare(PrepareConfig(_head(corpus, 60_000), vocab, out, seq_len=64))
    assert ShardReader(out, batch_size=4).num_examples > 0


def _head(path, n_bytes):
    small = path.with_name("head.txt")
    small.write_bytes(path.read_bytes()[:n_bytes])
    return small


def test_parallel_build_merges_and_is_deterministic(small_corpus, vocab, tmp_path):
    one = prepare(PrepareConfig(small_corpus, vocab, tmp_path / "w1", seq_len=64, task="none", masking="ngram"))
    two = prepare(PrepareConfig(small_corpus, vocab, tmp_path / "w2", seq_len=64, task="none", masking="ngram",
                                workers=2))
    again = prepare(PrepareConfig(small_corpus, vocab, tmp_path / "w2b", seq_len=64, task="none", masking="ngram",
                                  workers=2))
    m1, m2, m2b = (read_manifest(tmp_path / d) for d in ("w1", "w2", "w2b"))
    assert two.workers == 2 and {e["name"][:3] for e in m2["shards"]} == {"w00", "w01"}
    assert m2["counts"]["documents"] == m1["counts"]["documents"] == one.corpus.documents
    assert m2["counts"]["examples"] == sum(e["examples"] for e in m2["shards"])
    # every token lands somewhere: packing loses nothing (one part-filled row per worker)
    assert abs(m2["counts"]["tokens"] - m1["counts"]["tokens"]) <= 2 * 2
    assert [e["files"]["tokens"]["sha256"] for e in m2["shards"]] == [e["files"]["tokens"]["sha256"] for e in m2b["shards"]]
    assert m2["counts"]["padding"] / (m2["counts"]["padding"] + m2["counts"]["tokens"]) < 0.02
    b = next(iter(ShardReader(tmp_path / "w2", batch_size=8)))
    assert "next_sentence_label" not in b and (b["token_type_ids"] == 0).all()
    # the CLI's workers: the same shards
    subprocess.run([sys.executable, "-m", "bertkit", "prepare", "--corpus", str(small_corpus), "--vocab", str(vocab),
                    "--out", str(tmp_path / "cli"), "--seq-len", "64", "--task", "none", "--masking", "ngram",
                    "--workers", "2", "--no-progress"], check=True, capture_output=True)
    m_cli = read_manifest(tmp_path / "cli")
    assert [e["files"]["tokens"]["sha256"] for e in m_cli["shards"]] == [e["files"]["tokens"]["sha256"] for e in m2["shards"]]
    assert [e["files"]["mask_pos"]["sha256"] for e in m_cli["shards"]] == [e["files"]["mask_pos"]["sha256"] for e in m2["shards"]]


def test_spawned_workers_do_not_run_the_main_script_again(small_corpus, vocab, tmp_path):
    """The `bertkit` console script imports the CLI and with it torch, so workers are spawned; one that ran the
    script again (as multiprocessing does by default) paid seconds of imports before its first line of text."""
    script, runs = tmp_path / "bertkit_script.py", tmp_path / "runs.txt"
    script.write_text(f"import sys\nwith open({str(runs)!r}, 'a') as f:\n    f.write('ran\\n')\n"
                      "from bertkit.cli import main\nif __name__ == '__main__':\n    sys.exit(main())\n")
    subprocess.run([sys.executable, str(script), "prepare", "--corpus", str(small_corpus), "--vocab", str(vocab),
                    "--out", str(tmp_path / "out"), "--seq-len", "64", "--workers", "2", "--no-progress"],
                   check=True, capture_output=True)
    assert runs.read_text() == "ran\n" and read_manifest(tmp_path / "out")["workers"] == 2


def test_workers_with_a_single_document_each_are_warned_about(bbc_articles, vocab, tmp_path, capsys):
    """A worker draws NotNext segments only from its own documents: 2 documents over 2 workers make IsNext pairs
    only, which one stderr line says, naming the cause and the fix; 1 worker over the same 2 documents does not."""
    corpus = tmp_path / "two.txt"
    corpus.write_text("".join(a.title + "\n" + "\n".join(a.paragraphs) + "\n\n" for a in bbc_articles[:2]))
    one = prepare(PrepareConfig(corpus, vocab, tmp_path / "w1", seq_len=64, task="nsp"))
    assert one.build.not_next > 0 and capsys.readouterr().err == ""
    two = prepare(PrepareConfig(corpus, vocab, tmp_path / "w2", seq_len=64, task="nsp", workers=2))
    assert two.build.not_next == 0 and two.build.no_other_document > 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertkit prepare: warning:"), lines
    assert "2 of 2 workers got a single document" in lines[0] and "use fewer --workers" in lines[0], lines
    corpus.write_text("\n".join(bbc_articles[0].paragraphs) + "\n")
    prepare(PrepareConfig(corpus, vocab, tmp_path / "doc1", seq_len=64, task="nsp"))
    assert "the corpus holds a single document" in capsys.readouterr().err


def test_bad_input_end_to_end(vocab, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "empty.txt").write_bytes(b"")
    (corpus / "junk.bin").write_bytes(os.urandom(50_000).replace(b"\n", b"") + b"\x00")
    (corpus / "one.txt").write_text("Only one sentence here.\n")
    (corpus / "mixed.txt").write_bytes(b"The first doc has words. It has two sentences.\n" + b"bad \xc3\x28 utf-8.\n"
                                       + b"y" * 1_100_000 + b"\nA literal [SEP] and [MASK] in text.\n\n"
                                       + b"Second document. Yes it is. Quite short.\n")
    s = prepare(PrepareConfig(corpus / "*", vocab, tmp_path / "out", seq_len=32))
    assert s.corpus.skipped() == {"empty_files": 1, "binary_files": 1, "invalid_utf8_lines": 1, "binary_lines": 0,
                                  "long_lines": 1}
    assert "empty_files=1" in s.format() and "long_lines=1" in s.format()
    assert s.corpus.documents == 3
    r = ShardReader(tmp_path / "out", batch_size=1, drop_last=False)
    for b in r:
        ids = b["input_ids"][0]
        assert (ids == 102).sum() == 2           # the literal [SEP] became [UNK]
    with pytest.raises(DataError, match="no examples"):
        prepare(PrepareConfig(corpus / "empty.txt", vocab, tmp_path / "out2"))


def test_config_errors(small_corpus, vocab, tmp_path):
    with pytest.raises(ConfigError, match="dupe_factor"):
        prepare(PrepareConfig(small_corpus, vocab, tmp_path / "a", dynamic=True, dupe_factor=3, task="none"))
    # nsp copies re-draw their sentence pairs, so dynamic masking + dupe_factor is allowed there
    one = prepare(PrepareConfig(small_corpus, vocab, tmp_path / "d1", dynamic=True, dupe_factor=1, task="nsp"))
    three = prepare(PrepareConfig(small_corpus, vocab, tmp_path / "d3", dynamic=True, dupe_factor=3, task="nsp"))
    assert three.build.examples > 2 * one.build.examples
    with pytest.raises(ConfigError, match="task"):
        prepare(PrepareConfig(small_corpus, vocab, tmp_path / "b", task="mlm"))
    with pytest.raises(ConfigError, match="masking mode"):
        prepare(PrepareConfig(small_corpus, vocab, tmp_path / "c", masking="span"))
    with pytest.raises(ConfigError, match="workers=0"):
        PrepareConfig(small_corpus, vocab, tmp_path / "e", workers=0)          # checked before anything is written
    assert not (tmp_path / "e").exists()


def test_cli(small_corpus, vocab, tmp_path, capsys):
    from bertkit.cli import main
    rc = main(["prepare", "--corpus", str(small_corpus), "--vocab", str(vocab.parent), "--out", str(tmp_path / "o"),
               "--seq-len", "64", "--task", "sop", "--masking", "ngram", "--dupe-factor", "2", "--mask-prob", "0.3",
               "--workers", "1", "--seed", "3", "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 0 and "documents" in text and "MB/s" in text and "masking" in text
    m = read_manifest(tmp_path / "o")
    assert m["masking"]["mask_prob"] == 0.3 and m["dupe_factor"] == 2 and m["task"] == "sop" and m["seed"] == 3
    rc = main(["prepare", "--corpus", str(tmp_path / "nothing*"), "--vocab", str(vocab), "--out", str(tmp_path / "p")])
    assert rc == 2 and "matches no file" in capsys.readouterr().err


def test_max_predictions_beyond_the_maskable_positions_is_refused_before_any_work(tmp_path, capsys):
    from bertkit.cli import main
    # a row of seq_len 32 holds at most 29 (nsp / sop: [CLS] A [SEP] B [SEP]) or 30 (none) maskable tokens
    assert PrepareConfig("c.txt", "v.txt", tmp_path / "ok", seq_len=32, max_predictions=29).max_predictions == 29
    assert PrepareConfig("c.txt", "v.txt", tmp_path / "ok", seq_len=32, task="none", max_predictions=30)
    with pytest.raises(ConfigError, match="max_predictions=30 .*29 maskable positions"):
        PrepareConfig("c.txt", "v.txt", tmp_path / "a", seq_len=32, max_predictions=30)
    with pytest.raises(ConfigError, match="max_predictions=31 .*30 maskable positions"):
        PrepareConfig("c.txt", "v.txt", tmp_path / "a", seq_len=32, task="none", max_predictions=31)
    # the command: one line, exit 2, nothing left behind (it used to crash in numpy after building the examples)
    words = "the cat sat on a mat while dogs ran fast over green hills and rivers".split()
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]) + "\n")
    (tmp_path / "corpus.txt").write_text("".join(" ".join(words[i:i + 6]) + ".\n" + ("\n" if i % 3 == 2 else "")
                                                 for i in range(9)))
    rc = main(["prepare", "--corpus", str(tmp_path / "corpus.txt"), "--vocab", str(tmp_path / "vocab.txt"),
               "--out", str(tmp_path / "sh"), "--seq-len", "32", "--max-predictions", "1000", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "--max-predictions" in err and "1000" in err and "29" in err, err
    assert not (tmp_path / "sh" / "manifest.json").exists()
