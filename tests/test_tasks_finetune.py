"""End-to-end fine-tuning on tiny models and synthetic data that a working pipeline must learn (fast; offline).

The data are built so that the answer is a simple function of the words (a sentiment word decides the label, a
name list decides the tags, the word after "is" is the answer), so a 2-layer model trained for a few dozen steps
reaches high scores, and a broken label map, offset or decoding would not.
"""

from __future__ import annotations

import collections
import json
import random

from dataclasses import dataclass

import numpy as np
import pytest

from bertkit.errors import DataError
from bertkit.heads import BertForSequenceClassification
from bertkit.tasks.batching import predict_batches
from bertkit.tasks.readers import LabelMap, read_table
from bertkit.tasks.task import Feature, Task, write_jsonl

WORDS = "the a film movie plot actor story scene was is and but very quite really rather show music end".split()
POS, NEG = ["great", "superb", "lovely"], ["awful", "boring", "dull"]
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread is ~8x faster than two fighting for cores."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A randomly initialised 2-layer model directory with a small whole-word vocab."""
    from bertkit.config import BertConfig
    from bertkit.model import BertModel
    from bertkit.tokenizer import Tokenizer

    d = tmp_path_factory.mktemp("tiny")
    vocab = SPECIALS + sorted(set(WORDS + POS + NEG + NAMES + "who what winner ? . , x y z".split()))
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    import torch
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(d, tokenizer=Tokenizer.from_pretrained(d / "vocab.txt"))
    return d


def _sentiment_rows(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = rng.sample(WORDS, 5) + [rng.choice(POS if label == "pos" else NEG)]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": label})
    return rows


def _write_csv(path, rows):
    from bertkit.tasks.readers import write_table
    return str(write_table(path, rows))


def _cfg(tiny_dir, tmp_path, task, train, dev, **kw):
    from bertkit.tasks.runner import FinetuneConfig, finetune_recipe
    training = dict(lr=2e-3, epochs=3, warmup=0.1, precision="fp32")
    training.update({k: kw.pop(k) for k in ("lr", "epochs", "eval_every_steps") if k in kw})
    base = dict(task=task, model=str(tiny_dir), train=train, dev=dev, out=str(tmp_path / "run"), batch_size=16,
                quiet=True, training=finetune_recipe(**training))
    base.update(kw)
    return FinetuneConfig(**base)


def test_classify_learns_and_roundtrips(tiny_dir, tmp_path):
    from bertkit.tasks.runner import evaluate, finetune, predict
    train = _write_csv(tmp_path / "train.csv", _sentiment_rows(320, 0))
    dev = _write_csv(tmp_path / "dev.csv", _sentiment_rows(64, 1))
    test = _write_csv(tmp_path / "test.csv", _sentiment_rows(64, 2))
    s = finetune(_cfg(tiny_dir, tmp_path, "classify", train, dev, test=test))
    assert s["dev"]["accuracy"]["mean"] >= 0.9, s["dev"]
    assert s["test"]["accuracy"]["mean"] >= 0.9
    run = tmp_path / "run"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["id2label"] == {"0": "neg", "1": "pos"} and cfg["label2id"] == {"neg": 0, "pos": 1}
    assert cfg["bertkit_task"]["kind"] == "classify"
    assert (run / "confusion_test.png").read_bytes()[:4] == b"\x89PNG"
    # the saved directory alone evaluates to the same numbers, and predicts label names
    rep = evaluate(run, test)
    assert rep["accuracy"] == pytest.approx(s["test"]["accuracy"]["mean"])
    out = predict(run, test, tmp_path / "p.jsonl")
    preds = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(preds) == 64 and {p["prediction"] for p in preds} <= {"pos", "neg"}
    assert np.mean([p["prediction"] == p["label"] for p in preds]) == pytest.approx(rep["accuracy"])


def test_unknown_dev_label_names_file_and_line(tiny_dir, tmp_path):
    from bertkit.tasks.runner import finetune
    train = _write_csv(tmp_path / "train.csv", _sentiment_rows(40, 0))
    rows = _sentiment_rows(5, 1)
    rows[3]["label"] = "neutral"
    dev = _write_csv(tmp_path / "dev.csv", rows)
    with pytest.raises(DataError, match=r"dev\.csv:5: unknown label 'neutral'"):
        finetune(_cfg(tiny_dir, tmp_path, "classify", train, dev))


def test_a_repeated_seed_is_refused(tiny_dir, tmp_path):
    from bertkit.errors import ConfigError
    with pytest.raises(ConfigError, match="seeds: 1, 2, 1 repeats a seed"):
        _cfg(tiny_dir, tmp_path, "classify", "t.csv", "d.csv", seeds=(1, 2, 1))


def test_regression_and_seeds(tiny_dir, tmp_path):
    from bertkit.tasks.runner import finetune
    rng = random.Random(0)

    def rows(n):
        out = []
        for _ in range(n):
            k = rng.randrange(4)
            words = rng.sample(WORDS, 4) + ["great"] * k
            rng.shuffle(words)
            out.append({"text": " ".join(words), "label": float(k)})
        return out
    train, dev = _write_csv(tmp_path / "tr.jsonl", rows(256)), _write_csv(tmp_path / "dv.jsonl", rows(64))
    s = finetune(_cfg(tiny_dir, tmp_path, "regress", train, dev, seeds=(1, 2), save_model=False, epochs=8, lr=1e-3))
    # a randomly initialised 2-layer model on 256 examples: an occasional seed fails to take off (seeds 1-12 at
    # these settings: 11 of 12 reach 0.81-0.92, one 0.57), so the test asks for the better of two seeds
    assert max(s["dev"]["pearson"]["values"]) > 0.8, s["dev"]
    assert len(s["dev"]["pearson"]["values"]) == 2 and s["dev"]["pearson"]["std"] >= 0
    assert (tmp_path / "run" / "seed-2" / "metrics.json").exists()


def _tag_sentences(n, seed):
    from bertkit.tasks.readers import Sentence
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words, tags = [], []
        for _ in range(rng.randrange(4, 9)):
            if rng.random() < 0.25 and (not tags or tags[-1] == "O"):  # entities never touch
                first, last = rng.choice(NAMES), rng.choice(NAMES)
                words += [first, last]
                tags += ["B-PER", "I-PER"]
            else:
                words.append(rng.choice(WORDS))
                tags.append("O")
        out.append(Sentence(words, tags, f"doc{i // 5}"))
    return out


def test_token_classification(tiny_dir, tmp_path):
    from bertkit.tasks.readers import write_conll
    from bertkit.tasks.runner import finetune, predict
    train = str(write_conll(tmp_path / "train.conll", _tag_sentences(300, 0)))
    dev = str(write_conll(tmp_path / "dev.conll", _tag_sentences(60, 1)))
    s = finetune(_cfg(tiny_dir, tmp_path, "tag", train, dev, max_length=8))  # forces window splits
    assert s["dev"]["f1"]["mean"] > 0.85, s["dev"]
    assert s["data"]["task_stats"]["windows_split"] > 0
    out = predict(tmp_path / "run", dev, tmp_path / "tags.jsonl")
    rec = json.loads(out.read_text().splitlines()[0])
    assert len(rec["tags"]) == len(rec["words"])
    sentence = " ".join(rec["words"])
    for e in rec["entities"]:
        assert sentence[e["chars"][0]:e["chars"][1]] == e["text"]


def test_first_piece_labels_and_all_pieces(tiny_dir):
    from bertkit.tasks.readers import LabelMap, Sentence
    from bertkit.tasks.tag import TokenTask
    from bertkit.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(tiny_dir)
    s = [Sentence(["alice", "x.y", "bob"], ["B-PER", "O", "B-PER"])]   # "x.y" -> 3 pieces
    task = TokenTask(max_length=32)
    task.fit_labels(s)
    f = task.features(tok, s)[0]
    lab = [task.labels.name(t) if t >= 0 else None for t in f.labels]
    assert lab == [None, "B-PER", "O", None, None, "B-PER", None]
    task2 = TokenTask(max_length=32, label_all_pieces=True, labels=LabelMap(task.labels.labels))
    f2 = task2.features(tok, [Sentence(["x.y"], ["B-PER"])])[0]
    assert [task2.labels.name(t) for t in f2.labels[1:-1]] == ["B-PER", "I-PER", "I-PER"]


def _qa_examples(n, seed, impossible_every=0):
    from bertkit.tasks.readers import SquadExample
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name = rng.choice(NAMES)
        filler = [rng.choice(WORDS) for _ in range(rng.randrange(3, 30))]
        cut = rng.randrange(len(filler) + 1)
        pre = " ".join(filler[:cut] + ["the", "winner", "is"])
        context = f"{pre} {name} . " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 30)))
        if impossible_every and i % impossible_every == 0:
            context = context.replace("winner is", "show is")
            out.append(SquadExample(f"q{i}", "who is the winner ?", context, [], True))
        else:
            out.append(SquadExample(f"q{i}", "who is the winner ?", context, [(name, len(pre) + 1)]))
    return out


def test_qa_windows_cover_long_contexts(tiny_dir):
    from bertkit.tasks.qa import QATask
    from bertkit.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(tiny_dir)
    task = QATask(max_length=24, doc_stride=8, max_query_length=4)
    ex = _qa_examples(30, 3)
    feats = task.features(tok, ex)
    assert task.stats["truncated_questions"] == 30 and task.stats["multi_window_examples"] > 0
    for i, e in enumerate(ex):
        fs = [f for f in feats if f.example == i]
        n_ctx = len(fs[0].windows.offsets)
        covered = set()
        for f in fs:
            assert len(f.input_ids) <= 24
            ctx_start, ctx_end = f.windows.spans[f.window]
            covered |= set(range(ctx_start, ctx_end))
            if f.start_positions:  # the labelled span is the answer text
                offs = f.windows.offsets
                a = offs[f.start_positions - f.windows.first + ctx_start][0]
                b = offs[f.end_positions - f.windows.first + ctx_start][1]
                assert e.context[a:b] == e.answers[0][0]
        assert covered == set(range(n_ctx))
        assert any(f.start_positions for f in fs)


def test_qa_decode_nbest_and_null(tiny_dir):
    from bertkit.tasks.qa import QATask
    from bertkit.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(tiny_dir)
    task = QATask(max_length=64, max_answer_length=2, version_2=True)
    ex = _qa_examples(1, 0)
    feats = task.features(tok, ex)
    f = feats[0]
    n = len(f.input_ids)
    s, e = np.zeros(n, np.float32), np.zeros(n, np.float32)
    p = f.start_positions
    s[p], e[p] = 5.0, 5.0
    e[p + 3] = 9.0            # a longer span scores higher but exceeds max_answer_length
    s[0], e[0] = 1.0, 1.0     # null score 2
    d = task.decode(ex, feats, [(s, e)])[0]
    assert d["text"] == ex[0].answers[0][0] and d["score"] == 10.0
    assert d["null_score"] == 2.0 and d["margin"] == -8.0
    assert task.final_answers([d]) == {"q0": d["text"]}
    task.null_threshold = -9.0
    assert task.final_answers([d]) == {"q0": ""}


def test_qa_squad2_end_to_end(tiny_dir, tmp_path):
    from bertkit.tasks.readers import write_squad
    from bertkit.tasks.runner import finetune, predict
    train = str(write_squad(tmp_path / "train.json", _qa_examples(300, 0, impossible_every=4), "2.0"))
    dev = str(write_squad(tmp_path / "dev.json", _qa_examples(60, 1, impossible_every=4), "2.0"))
    s = finetune(_cfg(tiny_dir, tmp_path, "qa", train, dev, max_length=48, doc_stride=16, epochs=4))
    assert s["data"]["version_2"] and s["data"]["task_stats"]["multi_window_examples"] > 0
    assert s["dev"]["f1"]["mean"] > 60, s["dev"]
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["bertkit_task"]["version_2"] and "null_threshold" in cfg["bertkit_task"]
    preds = json.loads(predict(tmp_path / "run", dev, tmp_path / "p.json").read_text())
    assert len(preds) == 60


def test_feature_based_probe(tiny_dir):
    import torch
    from bertkit.model import BertModel
    from bertkit.tasks.features import ProbeConfig, extract_features, train_probe
    from bertkit.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(tiny_dir)
    torch.manual_seed(0)
    enc = BertModel.from_pretrained(tiny_dir)
    texts = ["great film", "the the the the very long awful scene and story", "dull"]
    X = extract_features(enc, tok, texts, layers=(-1, -2, -3), combine="concat")
    assert X.shape == (3, 3 * 32)
    one = extract_features(enc, tok, texts[:1], layers=(-1, -2, -3))
    np.testing.assert_allclose(one[0], X[0], atol=1e-5)  # padding in a batch does not change mean pooling
    rows = _sentiment_rows(200, 0)
    Xtr = extract_features(enc, tok, [r["text"] for r in rows], layers=(-1,))
    y = np.array([r["label"] == "pos" for r in rows], dtype=np.int64)
    assert all(p.grad is None for p in enc.parameters())
    probe, info = train_probe(Xtr[:160], y[:160], Xtr[160:], y[160:], 2, ProbeConfig(epochs=30, lr=1e-2))
    assert info["dev_accuracy"] >= 0.75, info  # random encoder, linear probe: well above chance


def test_cli_finetune_evaluate_errors(tiny_dir, tmp_path, capsys):
    from bertkit.cli import main
    train = _write_csv(tmp_path / "train.csv", _sentiment_rows(64, 0))
    dev = _write_csv(tmp_path / "dev.csv", _sentiment_rows(16, 1))
    rc = main(["finetune", "--task", "classify", "--model", str(tiny_dir), "--train", train, "--dev", dev,
               "--out", str(tmp_path / "m"), "--epochs", "1", "--fp32", "--quiet"])
    assert rc == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "accuracy" in line["dev"]
    assert main(["evaluate", "--model", str(tmp_path / "m"), "--data", dev]) == 0
    (tmp_path / "bad.csv").write_text("text,label\nfine,pos\n,neg\n")
    assert main(["evaluate", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "bad.csv")]) == 2
    assert "bad.csv:3: empty 'text'" in capsys.readouterr().err
    assert main(["evaluate", "--model", str(tiny_dir), "--data", dev]) == 2
    assert "not a model fine-tuned by bertkit" in capsys.readouterr().err


def test_overwrite_replaces_a_link_in_out_and_leaves_its_target(tiny_dir, tmp_path, capsys):
    """Outputs are written whole under their own name: a hard link or symlink of that name in --out is replaced,
    never written through to the file it points at (here the training data)."""
    import os
    from bertkit.cli import main
    train = _write_csv(tmp_path / "train.csv", _sentiment_rows(64, 0))
    dev = _write_csv(tmp_path / "dev.csv", _sentiment_rows(16, 1))
    before = (tmp_path / "train.csv").read_bytes()
    out = tmp_path / "out"
    out.mkdir()
    os.link(train, out / "predictions_dev.jsonl")
    os.symlink(train, out / "metrics.json")
    rc = main(["finetune", "--task", "classify", "--model", str(tiny_dir), "--train", train, "--dev", dev,
               "--out", str(out), "--epochs", "1", "--fp32", "--quiet", "--overwrite"])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "train.csv").read_bytes() == before
    assert not (out / "metrics.json").is_symlink() and json.loads((out / "metrics.json").read_text())["seed"] == 1
    assert os.stat(out / "predictions_dev.jsonl").st_ino != os.stat(train).st_ino
    assert json.loads((out / "predictions_dev.jsonl").read_text().splitlines()[0])["prediction"] in ("pos", "neg")


def test_every_registered_task_meets_the_protocol():
    from dataclasses import fields
    from bertkit.tasks.registry import TASKS, make_task
    from bertkit.tasks.task import Task
    members = [n for n in vars(Task) if not n.startswith("_")] + list(Task.__annotations__)
    for kind in TASKS:
        task = make_task(kind)
        assert task.kind == kind and isinstance(task, Task) and task.settings()["kind"] == kind
        assert all(hasattr(task, n) for n in members), kind
        assert make_task(kind, task.settings()).settings() == task.settings()
        assert {f.name for f in fields(task)} >= set(task.settings()) - {"kind"}


def test_random_init_keeps_architecture_not_weights(tiny_dir, tmp_path):
    import torch
    from bertkit.heads import BertForSequenceClassification
    from bertkit.tasks.registry import make_task
    from bertkit.tasks.runner import FinetuneConfig, FinetuneHooks
    from bertkit.tasks.readers import LabelMap
    task = make_task("classify")
    task.labels = LabelMap(["neg", "pos"])
    kw = dict(task="classify", model=str(tiny_dir), train="", dev="", out=str(tmp_path))
    fresh = FinetuneHooks().build_model(FinetuneConfig(**kw, random_init=True), task, seed=5)
    loaded = FinetuneHooks().build_model(FinetuneConfig(**kw), task, seed=5)
    assert isinstance(fresh, BertForSequenceClassification) and fresh.config.hidden_size == 32
    w = "bert.embeddings.word_embeddings.weight"
    assert not torch.equal(fresh.state_dict()[w], loaded.state_dict()[w])
    assert fresh.config.id2label == {0: "neg", 1: "pos"}


def test_tagged_raw_text_char_spans(tiny_dir):
    """Raw text -> words from pieces -> entities whose character spans index the original string."""
    import torch
    from bertkit.heads import BertForTokenClassification
    from bertkit.infer import Predictor
    from bertkit.tasks.metrics import get_entities
    from bertkit.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(tiny_dir)
    model = BertForTokenClassification.from_pretrained(tiny_dir, num_labels=3)
    text = "the  winner is Alice Bob, said x.y"
    enc = tok([text], return_offsets=True)
    names = {i for i, (s, e) in enumerate(enc["offsets"][0]) if text[s:e] in ("Alice", "Bob")}
    with torch.no_grad():  # rig the head: B-PER on "alice", I-PER on "bob", O elsewhere, via a hook on logits
        def hook(_m, _inp, out):
            fake = torch.zeros_like(out)
            fake[..., 0] = 1.0
            for i in names:
                fake[0, i] = torch.tensor([0.0, 2.0, 1.0] if text[enc["offsets"][0][i][0]] == "A" else [0.0, 1.0, 2.0])
            return fake
        model.classifier.register_forward_hook(hook)
    words = Predictor(model, tok, "tag", labels=["O", "B-PER", "I-PER"]).tag([text])[0]
    ents = [{"type": t, "start": words[a]["start"], "end": words[b]["end"]}
            for t, a, b in get_entities([w["label"] for w in words])]
    assert ents == [{"type": "PER", "start": 15, "end": 24}] and text[15:24] == "Alice Bob"


def test_grid_search_picks_best_dev(tiny_dir, tmp_path):
    from bertkit.tasks.runner import PAPER_GRID, finetune
    train = _write_csv(tmp_path / "train.csv", _sentiment_rows(64, 0))
    dev = _write_csv(tmp_path / "dev.csv", _sentiment_rows(32, 1))
    s = finetune(_cfg(tiny_dir, tmp_path, "classify", train, dev, grid=True, epochs=1, save_model=False))
    assert len(s["grid"]) == len(PAPER_GRID["lr"]) * len(PAPER_GRID["batch_size"])
    best = max(s["grid"], key=lambda g: g["accuracy"])
    assert (s["lr"], s["batch_size"]) == (best["lr"], best["batch_size"])


def test_early_stopping_keeps_best(tiny_dir, tmp_path):
    from bertkit.tasks.runner import finetune
    train = _write_csv(tmp_path / "train.csv", _sentiment_rows(128, 0))
    dev = _write_csv(tmp_path / "dev.csv", _sentiment_rows(32, 1))
    # an lr too small to change the dev accuracy: the second evaluation does not improve, patience 1 stops the run
    finetune(_cfg(tiny_dir, tmp_path, "classify", train, dev, lr=1e-12, eval_every_steps=2, patience=1, epochs=3))
    rec = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert rec["stopped_early"] and len(rec["history"]) == 2 and rec["best_step"] == 2
    assert rec["steps"] == 24 and rec["train_examples"] == 4 * 16


def test_multilabel(tiny_dir, tmp_path):
    from bertkit.tasks.runner import finetune, predict
    rng = random.Random(0)

    def rows(n):
        out = []
        for _ in range(n):
            labels = [name for name, words in (("pos", POS), ("neg", NEG)) if rng.random() < 0.5]
            # random filler count: with a fixed one, length would give away the label count in bucketed batches
            words = rng.sample(WORDS, rng.randrange(1, 6)) + [rng.choice(POS if lab == "pos" else NEG) for lab in labels]
            rng.shuffle(words)
            out.append({"text": " ".join(words), "label": labels})
        return out
    dev_rows = rows(64)
    train, dev = _write_csv(tmp_path / "tr.jsonl", rows(640)), _write_csv(tmp_path / "dv.jsonl", dev_rows)
    s = finetune(_cfg(tiny_dir, tmp_path, "multilabel", train, dev, epochs=8, lr=3e-3, dropout=0.0))
    # a random 2-layer model learns this only part-way (one label first); it must beat the trivial predictors:
    # "every label" for F1 and the most frequent label set for exact match
    n_pos = sum(len(r["label"]) for r in dev_rows)
    all_f1 = 2 * (n_pos / (2 * len(dev_rows))) / (1 + n_pos / (2 * len(dev_rows)))
    top_set = max(collections.Counter(tuple(r["label"]) for r in dev_rows).values()) / len(dev_rows)
    assert s["dev"]["f1_micro"]["mean"] > all_f1 + 0.03, (s["dev"], all_f1)
    assert s["dev"]["exact_match"]["mean"] > top_set + 0.1, (s["dev"], top_set)
    preds = [json.loads(x) for x in predict(tmp_path / "run", dev, tmp_path / "p.jsonl").read_text().splitlines()]
    assert all(set(p["prediction"]) <= {"pos", "neg"} for p in preds)


# ------------------------------------------------------------------------------ a new task head, as documented
# docs/architecture.md "Adding a task head": a task module and one registry line; the runner, evaluate and
# predict need nothing else. The task here: is the text's first word a positive one (a head of its own).

@dataclass
class FirstWordTask(Task):
    max_length: int = 16
    labels: LabelMap | None = None
    kind = "firstword"
    model_class = BertForSequenceClassification
    main_metric = "accuracy"

    def read(self, path, require_label=True):
        return read_table(path, require_label=require_label)

    def fit_labels(self, train):
        self.labels = LabelMap.from_labels(e.label for e in train)

    def restore_labels(self, names):
        self.labels = LabelMap(names)

    def config_overrides(self):
        return {"num_labels": len(self.labels), "id2label": dict(enumerate(self.labels.labels))}

    def features(self, tok, examples, with_labels=True):
        enc = tok([e.text.split()[0] for e in examples], max_length=self.max_length, truncation=True)
        return [Feature(input_ids=list(ids), token_type_ids=list(types),
                        labels=self.labels.id(e.label, e.source) if with_labels else None)
                for ids, types, e in zip(enc["input_ids"], enc["token_type_ids"], examples)]

    def predict(self, model, examples, feats, batch_size, precision):
        out = np.zeros((len(feats), len(self.labels)), dtype=np.float32)
        for idx, o in predict_batches(model, feats, batch_size, precision):
            out[idx] = o.logits.float().numpy()
        return out

    def score(self, examples, feats, raw):
        gold = np.array([f.labels for f in feats])
        return {"accuracy": float((raw.argmax(-1) == gold).mean()), "n": len(feats)}

    def write_predictions(self, path, examples, feats, raw):
        return write_jsonl(path, ({"text": e.text, "prediction": self.labels.name(int(j))}
                                  for e, j in zip(examples, raw.argmax(-1))))


def test_a_new_task_is_a_module_and_a_registry_line(tiny_dir, tmp_path, monkeypatch):
    from bertkit.tasks import registry
    from bertkit.tasks.runner import evaluate, finetune, predict
    monkeypatch.setitem(registry.TASKS, "firstword", f"{__name__}.FirstWordTask")
    train = _write_csv(tmp_path / "train.csv", _sentiment_rows(64, 0))
    dev = _write_csv(tmp_path / "dev.csv", _sentiment_rows(16, 1))
    s = finetune(_cfg(tiny_dir, tmp_path, "firstword", train, dev, epochs=1))
    assert s["task"] == "firstword" and 0 <= s["dev"]["accuracy"]["mean"] <= 1
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["bertkit_task"] == {"kind": "firstword", "max_length": 16}
    assert evaluate(run, dev)["accuracy"] == pytest.approx(s["dev"]["accuracy"]["mean"])
    preds = predict(run, dev, tmp_path / "p.jsonl").read_text().splitlines()
    assert len(preds) == 16 and json.loads(preds[0])["prediction"] in ("pos", "neg")
