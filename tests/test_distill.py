"""Distillation (bertkit.distill, bertkit.distill_mlm, `bertkit distill`) on tiny 4-layer teachers (fast; offline)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from test_tasks_finetune import (NAMES, SPECIALS, WORDS, NEG, POS, _qa_examples, _sentiment_rows,  # noqa: F401
                                 _tag_sentences, _write_csv, one_thread)

TRAINING = dict(lr=2e-3, epochs=1, warmup=0.1, precision="fp32")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A random 4-layer pre-trained directory (with its MLM head) and a whole-word vocabulary."""
    from bertkit.config import BertConfig
    from bertkit.heads import BertForMaskedLM
    from bertkit.tokenizer import Tokenizer
    d = tmp_path_factory.mktemp("base4")
    vocab = SPECIALS + sorted(set(WORDS + POS + NEG + NAMES + "who what winner ? . , x y z".split()))
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertForMaskedLM(cfg).save_pretrained(d, tokenizer=Tokenizer.from_pretrained(d / "vocab.txt"))
    return d


def _data(kind: str, d):
    """(train, dev, finetune settings) of a tiny task of this kind under directory d."""
    from bertkit.tasks.readers import write_conll, write_squad
    d.mkdir(parents=True, exist_ok=True)
    if kind == "tag":
        return (str(write_conll(d / "train.conll", _tag_sentences(60, 0))),
                str(write_conll(d / "dev.conll", _tag_sentences(20, 1))), {"max_length": 16})
    if kind == "qa":
        return (str(write_squad(d / "train.json", _qa_examples(40, 0), "1.1")),
                str(write_squad(d / "dev.json", _qa_examples(12, 1), "1.1")), {"max_length": 48, "doc_stride": 16})
    rows = {"classify": _sentiment_rows, "pair": _pair_rows, "regress": _regress_rows}[kind]
    return _write_csv(d / "train.jsonl", rows(64, 0)), _write_csv(d / "dev.jsonl", rows(16, 1)), {}


def _pair_rows(n, seed):
    return [dict(r, text_pair=r["text"].split()[0]) for r in _sentiment_rows(n, seed)]


def _regress_rows(n, seed):
    return [dict(r, label=float(r["label"] == "pos")) for r in _sentiment_rows(n, seed)]


@pytest.fixture(scope="module")
def teachers(base_dir, tmp_path_factory):
    """kind -> (teacher directory written by finetune, train file, dev file), built on first use."""
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    root, made = tmp_path_factory.mktemp("teachers"), {}

    def get(kind: str):
        if kind not in made:
            train, dev, extra = _data(kind, root / f"data-{kind}")
            finetune(FinetuneConfig(task=kind, model=str(base_dir), train=train, dev=dev, out=str(root / kind),
                                    batch_size=16, quiet=True, training=finetune_recipe(**TRAINING), **extra))
            made[kind] = (root / kind, train, dev)
        return made[kind]
    return get


# ---------------------------------------------------------------------------------------------- the pieces

def test_soft_loss_is_the_hand_computed_kl():
    from bertkit.distill import soft_loss
    rng = np.random.default_rng(0)
    s, t = rng.normal(size=(5, 3)), rng.normal(size=(5, 3)) * 3
    temp = 2.5

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    p, q = softmax(t / temp), softmax(s / temp)
    want = np.mean([sum(p[i, j] * math.log(p[i, j] / q[i, j]) for j in range(3)) for i in range(5)]) * temp ** 2
    got = soft_loss(torch.tensor(s, dtype=torch.float32), torch.tensor(t, dtype=torch.float32), temp)
    assert float(got) == pytest.approx(want, rel=1e-5)
    mask = torch.tensor([1, 0, 1, 0, 0])
    sub = soft_loss(torch.tensor(s[[0, 2]], dtype=torch.float32), torch.tensor(t[[0, 2]], dtype=torch.float32), temp)
    assert float(soft_loss(torch.tensor(s, dtype=torch.float32), torch.tensor(t, dtype=torch.float32), temp, mask)) \
        == pytest.approx(float(sub), rel=1e-6)
    assert float(soft_loss(torch.tensor(t), torch.tensor(t), temp)) == pytest.approx(0.0, abs=1e-6)


def test_augmented_copies_mask_words_and_cut_spans_deterministically():
    from bertkit.distill import augment_examples
    from bertkit.tasks.readers import TextExample
    words = [f"w{i}" for i in range(40)]
    examples = [TextExample(" ".join(words), None, "pos", "train.csv:2"),
                TextExample("a b c", "d e", "neg", "train.csv:3")]
    copies = augment_examples(examples, 50, seed=3)
    assert len(copies) == 100 and all(c.label is None for c in copies)
    assert copies == augment_examples(examples, 50, seed=3) and copies != augment_examples(examples, 50, seed=4)
    assert copies[0].source == "train.csv:2 (augmented copy 1)"
    singles = [c.text.split() for c in copies[::2]]
    masked = sum(w == "[MASK]" for c in singles for w in c) / sum(map(len, singles))
    assert 0.06 < masked < 0.14                                    # each word with p 0.1
    cut = [c for c in singles if len(c) < 40]
    assert 5 <= len(cut) <= 22                                     # one copy in four, on average
    for c in cut:                                                  # a contiguous span of at least half the words
        assert len(c) >= 20
        kept = [int(w[1:]) for w in c if w != "[MASK]"]
        assert kept == sorted(kept) and kept[-1] - kept[0] < len(c)
    pairs = copies[1::2]
    assert all(len(c.text.split()) == 3 and len(c.text_pair.split()) == 2 for c in pairs)   # pairs are never cut


def test_layer_selection_is_evenly_spaced_up_to_the_top():
    from bertkit.distill import layer_map, select_layers
    from bertkit.errors import ConfigError
    assert select_layers(6, 3) == [1, 3, 5]            # 1-based 2, 4, 6: every second layer, the last kept
    assert select_layers(12, 6) == [1, 3, 5, 7, 9, 11]
    assert select_layers(6, 2) == [2, 5] and select_layers(4, 3) == [0, 1, 3]
    assert select_layers(6, 6) == list(range(6)) and select_layers(4, 1) == [3]
    assert layer_map(3, 6) == [(0, 0), (1, 2), (2, 4), (3, 6)]
    with pytest.raises(ConfigError, match="the teacher has 6 layers"):
        select_layers(6, 7)


def test_the_truncated_student_copies_the_chosen_layers_exactly(teachers):
    from bertkit.distill import truncated_student
    from bertkit.heads import BertForSequenceClassification
    teacher = BertForSequenceClassification.from_pretrained(teachers("classify")[0])
    student = truncated_student(teacher, 2)
    assert student.config.num_hidden_layers == 2
    t, s = teacher.state_dict(), student.state_dict()
    for name, value in s.items():
        src = name.replace("encoder.layer.1.", "encoder.layer.3.").replace("encoder.layer.0.", "encoder.layer.1.")
        assert torch.equal(value, t[src]), name                        # layers 1, 3 of 0..3
    assert not torch.equal(s["bert.encoder.layer.1.output.dense.weight"], t["bert.encoder.layer.1.output.dense.weight"])
    assert not torch.equal(s["bert.encoder.layer.0.output.dense.weight"], t["bert.encoder.layer.0.output.dense.weight"])
    assert torch.equal(s["classifier.weight"], t["classifier.weight"])


def test_alpha_zero_without_transfer_is_plain_finetuning_of_the_truncated_student(teachers, tmp_path):
    """The no-teacher comparison is exactly `finetune` of the layer-truncated student: same seed, same weights."""
    from bertkit.distill import DistillConfig, distill_task, truncated_student
    from bertkit.heads import BertForSequenceClassification
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    from bertkit.tokenizer import Tokenizer
    teacher_dir, train, dev = teachers("classify")
    init = tmp_path / "init"
    truncated_student(BertForSequenceClassification.from_pretrained(teacher_dir), 2).save_pretrained(
        init, tokenizer=Tokenizer.from_pretrained(teacher_dir))

    def cfg(model, out):
        return FinetuneConfig(task="classify", model=str(model), train=train, dev=dev, out=str(tmp_path / out),
                              batch_size=16, quiet=True, seeds=(3,), training=finetune_recipe(**TRAINING))
    a = distill_task(DistillConfig(teacher=str(teacher_dir), student_layers=2, alpha=0.0), cfg(teacher_dir, "a"))
    b = finetune(cfg(init, "b"))
    assert a["dev"] == b["dev"]
    wa = BertForSequenceClassification.from_pretrained(tmp_path / "a").state_dict()
    wb = BertForSequenceClassification.from_pretrained(tmp_path / "b").state_dict()
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    # the distilled run differs (the teacher's targets change the gradients)
    c = distill_task(DistillConfig(teacher=str(teacher_dir), student_layers=2, alpha=0.7), cfg(teacher_dir, "c"))
    wc = BertForSequenceClassification.from_pretrained(tmp_path / "c").state_dict()
    assert not torch.equal(wc["classifier.weight"], wa["classifier.weight"])
    assert c["distill"]["teacher_scores"]["dev"]["accuracy"] >= 0 and c["distill"]["alpha"] == 0.7


# ---------------------------------------------------------------------------------------------- the command

def _run(argv, capsys):
    from bertkit.cli import main
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:                           # argparse's own usage errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("kind,extra", [
    ("classify", ["--hidden-weight", "1", "--attention-weight", "1", "--unlabeled", "UNLABELED", "--augment", "2"]),
    ("pair", []),
    ("regress", []),
    ("tag", ["--temperature", "3"]),
    ("qa", ["--hidden-weight", "0.5"]),
])
def test_each_task_kind_distills_and_evaluate_loads_the_student(kind, extra, teachers, tmp_path, capsys):
    teacher, train, dev = teachers(kind)
    unlabeled = tmp_path / "unlabeled.csv"
    unlabeled.write_text("text\n" + "\n".join(r["text"] for r in _sentiment_rows(20, 5)) + "\n")
    extra = [str(unlabeled) if a == "UNLABELED" else a for a in extra]
    out = tmp_path / "student"
    rc, stdout, err = _run(["distill", "--teacher", teacher, "--student-layers", 2, "--train", train, "--dev", dev,
                            "--out", out, "--epochs", 1, "--lr", 2e-3, "--batch-size", 16, "--fp32", "--quiet",
                            *extra], capsys)
    assert rc == 0, err
    brief = json.loads(stdout)
    assert brief["task"] == kind and "dev" in brief
    summary = json.loads((out / "summary.json").read_text())
    assert summary["distill"]["teacher"] == str(teacher) and summary["distill"]["student_init_layers"] == [1, 3]
    assert summary["distill"]["teacher_scores"]["dev"]
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["bertkit_task"]["kind"] == kind
    rc, stdout, err = _run(["evaluate", "--model", out, "--data", dev], capsys)
    assert rc == 0, err
    assert json.loads(stdout)
    if "--unlabeled" in extra:
        assert summary["data"]["unlabeled_features"] == 20 + 2 * 64     # the file's 20, two copies of 64


def test_general_distillation_writes_a_model_finetune_takes(base_dir, teachers, tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(r["text"] for r in _sentiment_rows(48, 7)) + "\n")
    for student, out in ((["--student-layers", 2], "g2"), (["--student-preset", "tiny", "--hidden-weight", 1], "gp")):
        rc, stdout, err = _run(["distill", "--teacher", base_dir, *student, "--text", text, "--out", tmp_path / out,
                                "--epochs", 1, "--batch-size", 16, "--fp32", "--quiet"], capsys)
        assert rc == 0, err
        assert json.loads(stdout)["steps"] == 3
    _, train, dev = teachers("classify")
    rc, stdout, err = _run(["finetune", "--task", "classify", "--model", tmp_path / "g2", "--train", train,
                            "--dev", dev, "--out", tmp_path / "ft", "--epochs", 1, "--fp32", "--quiet"], capsys)
    assert rc == 0, err
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["num_hidden_layers"] == 2
    # a pre-trained student of the same vocabulary is a task-distillation student too
    rc, stdout, err = _run(["distill", "--teacher", teachers("classify")[0], "--student", tmp_path / "g2",
                            "--train", train, "--dev", dev, "--out", tmp_path / "ts", "--epochs", 1, "--fp32",
                            "--quiet"], capsys)
    assert rc == 0, err


def test_a_student_of_layers_of_a_pretrained_model(base_dir, teachers, tmp_path, capsys):
    """--student DIR --student-layers K: K evenly spaced layers of a pre-trained model (its head new), trained
    against the teacher: the student a user would otherwise fine-tune alone."""
    from bertkit.distill import DistillConfig, build_student
    from bertkit.heads import BertForSequenceClassification
    teacher, train, dev = teachers("classify")
    dcfg = DistillConfig(teacher=str(teacher), student=str(base_dir), student_layers=2)
    student = build_student(dcfg, BertForSequenceClassification, {"num_labels": 2})
    base = BertForSequenceClassification.from_pretrained(base_dir, num_labels=2).state_dict()
    got = student.state_dict()
    assert student.config.num_hidden_layers == 2
    assert torch.equal(got["bert.encoder.layer.0.output.dense.weight"], base["bert.encoder.layer.1.output.dense.weight"])
    assert torch.equal(got["bert.encoder.layer.1.output.dense.weight"], base["bert.encoder.layer.3.output.dense.weight"])
    rc, out, err = _run(["distill", "--teacher", teacher, "--student", base_dir, "--student-layers", 2, "--train",
                         train, "--dev", dev, "--out", tmp_path / "s", "--epochs", 1, "--fp32", "--quiet"], capsys)
    assert rc == 0, err
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["distill"]["student"] == str(base_dir) and summary["distill"]["student_layers"] == 2


def test_same_vocabulary_is_checked_whatever_file_holds_it(tmp_path):
    """A byte-level BPE teacher (tokenizer.json, no vocab.txt, as RoBERTa / ModernBERT save) and a student with the
    same tokenizer pass; one trained on other text is refused by name."""
    from bertkit.distill import check_same_vocab
    from bertkit.errors import ConfigError
    from bertkit.vocab import train_library_vocab
    texts = ["the cat sat on the mat", "a dog ran in the park", "birds sing at dawn"] * 20
    dirs = {}
    for name, corpus in (("teacher", texts), ("student", texts), ("other", [t.upper() for t in texts])):
        dirs[name] = tmp_path / name
        train_library_vocab(corpus, "bpe", vocab_size=300, min_frequency=1).save_pretrained(dirs[name])
        assert not (dirs[name] / "vocab.txt").exists()
    check_same_vocab(dirs["teacher"], dirs["student"])
    with pytest.raises(ConfigError, match="vocabulary differs from the teacher"):
        check_same_vocab(dirs["teacher"], dirs["other"])


def test_user_errors_are_one_line(base_dir, teachers, tmp_path, capsys):
    from bertkit.quantize import quantize_dir
    teacher, train, dev = teachers("classify")
    other = tmp_path / "other-vocab"
    other.mkdir()
    (other / "vocab.txt").write_text("\n".join(SPECIALS + ["x", "y"]) + "\n")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "f.txt").write_text("x")
    int8_teacher = tmp_path / "int8-teacher"
    quantize_dir(teacher, int8_teacher, force=True)
    task = ["--train", train, "--dev", dev, "--out"]
    cases = [
        (["--teacher", base_dir, "--student-layers", 2, *task, tmp_path / "o1"], "not fine-tuned"),
        (["--teacher", teacher, "--student-layers", 9, *task, tmp_path / "o2"], "the teacher has 4 layers"),
        (["--teacher", teacher, "--student", other, *task, tmp_path / "o3"], "vocabulary differs from the teacher"),
        (["--teacher", teacher, "--student-layers", 2, *task, tmp_path / "taken"], "is not empty"),
        (["--teacher", teacher, "--student-layers", 2, "--out", tmp_path / "o4"], "give --train and --dev"),
        (["--teacher", teacher, "--student-layers", 2, "--text", train, "--train", train, "--out", tmp_path / "o5"],
         "does not take --train"),
        (["--teacher", teacher, "--student-preset", "mini", "--attention-weight", 1, *task, tmp_path / "o6"],
         "attention heads"),
        (["--teacher", teacher, "--student-layers", 2, "--alpha", 0, "--augment", 1, *task, tmp_path / "o7"],
         "give --alpha > 0"),
        (["--teacher", teachers("tag")[0], "--student-layers", 2, "--augment", 1, "--train", teachers("tag")[1],
          "--dev", teachers("tag")[2], "--out", tmp_path / "o9"], "--augment: supported for classify"),
        (["--teacher", teacher, "--student-layers", 2, "--augment", 1000000, *task, tmp_path / "o10"],
         "--augment: must be"),
        (["--teacher", teacher, "--student-layers", 2, "--max-length", 8, *task, tmp_path / "o11"],
         "--max-length is general distillation's"),
        (["--teacher", base_dir, "--student-layers", 2, "--text", train, "--patience", 2, "--out", tmp_path / "o12"],
         "does not take --patience"),
        (["--teacher", base_dir, "--student-layers", 2, "--text", train, "--max-length", 100000,
          "--out", tmp_path / "o13"], "more than the teacher's max_position_embeddings"),
        (["--teacher", int8_teacher, "--student-layers", 2, *task, tmp_path / "o14"], "is int8 (bertkit quantize)"),
        (["--teacher", teacher, "--student", int8_teacher, *task, tmp_path / "o15"], "cannot train"),
        (["--teacher", teacher, *task, tmp_path / "o16"], "choose the student"),
        (["--teacher", teacher, "--student-layers", 2, "--student-preset", "mini", *task, tmp_path / "o17"],
         "give one of them"),
        (["--teacher", teacher, "--student", base_dir, "--student-layers", 9, *task, tmp_path / "o18"],
         f"--student {base_dir} has 4 layers"),
    ]
    for argv, message in cases:
        rc, _, err = _run(["distill", *argv, "--epochs", 1, "--fp32", "--quiet"], capsys)
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
