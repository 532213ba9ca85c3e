"""`bertkit pretrain` end to end on tiny real shards (BBC articles, a small trained vocab): objectives, continued
pre-training, every bad input failing before the first step, and DDP on 2 CPU processes (torchrun, gloo) giving
the losses of 1 process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertkit.cli import main as cli

TINY = ["--preset", "tiny", "--batch-size", "8", "--precision", "fp32", "--no-progress", "--lr", "1e-3",
        "--warmup", "0"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def data(tmp_path_factory, bbc_articles):
    """Shards from 40 BBC articles (NSP, seq 64, dynamic masks), held-out shards from 10 others, vocab of 600."""
    from bertkit.pretraining import PrepareConfig, prepare
    from bertkit.vocab import train_vocab
    root = tmp_path_factory.mktemp("pretrain_data")
    for name, arts in (("train", bbc_articles[:40]), ("heldout", bbc_articles[1000:1010])):
        (root / f"{name}.txt").write_text("".join("\n".join([a.title, *a.paragraphs]) + "\n\n" for a in arts))
    tok = train_vocab([str(root / "train.txt")], vocab_size=600)
    tok.save(root / "vocab")
    prepare(PrepareConfig(str(root / "train.txt"), str(root / "vocab"), str(root / "shards"), seq_len=64, task="nsp",
                          dynamic=True, corpus_format="prose"))
    prepare(PrepareConfig(str(root / "heldout.txt"), str(root / "vocab"), str(root / "heldout"), seq_len=64,
                          task="nsp", corpus_format="prose"))
    # the same text under another vocab, for the mismatch check
    other = train_vocab([str(root / "heldout.txt")], vocab_size=400)
    other.save(root / "vocab_other")
    prepare(PrepareConfig(str(root / "heldout.txt"), str(root / "vocab_other"), str(root / "shards_other"),
                          seq_len=64, task="nsp", corpus_format="prose"))
    return root


def _records(run: Path, split: str = "train") -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


def test_pretrain_mlm_nsp_writes_model_metrics_plot(data, tmp_path):
    from bertkit.heads import BertForPreTraining
    out = tmp_path / "run"
    rc = cli(["pretrain", str(data / "shards"), "--out", str(out), *TINY, "--steps", "4", "--eval-shards",
              str(data / "heldout"), "--eval-every", "2", "--eval-batches", "2", "--save-every", "2",
              "--adam-beta2", "0.98"])
    assert rc == 0
    state = json.loads((out / "checkpoints" / "step-00000004" / "state.json").read_text())
    assert state["config"]["betas"] == [0.9, 0.98]
    train_recs, eval_recs = _records(out), _records(out, "eval")
    assert [r["step"] for r in train_recs] == [1, 2, 3, 4] and [r["step"] for r in eval_recs] == [2, 4]
    assert {"mlm_acc", "nsp_acc", "mlm_loss", "nsp_loss", "tokens_per_s", "flops_per_s", "mfu"} <= set(train_recs[0])
    assert {"mlm_acc", "nsp_acc", "mlm_loss"} <= set(eval_recs[-1])
    assert (out / "curves.png").stat().st_size > 1000
    model = BertForPreTraining.from_pretrained(out / "model")
    assert model.config.vocab_size == 600 and (out / "model" / "vocab.txt").exists()
    # continued pre-training from that model, MLM only (the NSP labels of the shards are dropped)
    out2 = tmp_path / "run2"
    assert cli(["pretrain", str(data / "shards"), "--out", str(out2), "--init", str(out / "model"),
                "--objective", "mlm", "--steps", "2", "--batch-size", "8", "--no-progress"]) == 0
    rec = _records(out2)[-1]
    assert "mlm_acc" in rec and "nsp_acc" not in rec


def test_pretrain_electra(data, tmp_path):
    from bertkit.model import BertModel
    out = tmp_path / "electra"
    assert cli(["pretrain", str(data / "shards"), "--out", str(out), *TINY, "--steps", "3",
                "--objective", "electra"]) == 0
    rec = _records(out)[-1]
    assert {"rtd_acc", "rtd_loss", "mlm_acc"} <= set(rec)
    assert rec["loss"] == pytest.approx(rec["mlm_loss"] + 50 * rec["rtd_loss"], rel=1e-4)
    body = BertModel.from_pretrained(out / "model")                          # the discriminator
    assert body.config.num_hidden_layers == 2


def test_electra_corrupts_only_masked_positions():
    from bertkit.config import BertConfig
    from bertkit.pretraining.electra import ElectraForPreTraining
    torch.manual_seed(0)
    m = ElectraForPreTraining(BertConfig.preset("tiny", vocab_size=50))
    assert m.generator.bert.embeddings is m.discriminator.embeddings
    ids = torch.randint(5, 50, (2, 12))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    ids_in = ids.clone()
    ids_in[:, 3] = 4  # [MASK]-like
    out = m(ids_in, attention_mask=torch.ones_like(ids), labels=labels)
    assert out.rtd_count == 24 and 0 <= out.replaced_share <= 2 / 24
    assert float(out.loss) == pytest.approx(float(out.mlm_loss + 50 * out.rtd_loss), rel=1e-5)


def _fails(argv, capsys, match: str, out: Path | None = None):
    rc = cli(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "bertkit pretrain: error:" in err and match in err, err
    if out is not None:
        assert not (out / "metrics.jsonl").exists()   # no training step ran


def test_bad_inputs_fail_before_training(data, tmp_path, capsys, monkeypatch):
    import shutil
    out = tmp_path / "out"
    base = [*TINY, "--steps", "2", "--out", str(out)]
    _fails(["pretrain", str(tmp_path / "nope"), *base], capsys, "does not exist", out)
    # a truncated shard file
    bad = tmp_path / "bad_shards"
    shutil.copytree(data / "shards", bad)
    victim = sorted(bad.glob("*.tokens.npy"))[0]
    victim.write_bytes(victim.read_bytes()[:-100])
    _fails(["pretrain", str(bad), *base], capsys, "truncated", out)
    # a manifest that is not JSON
    (bad / "manifest.json").write_text("{not json")
    _fails(["pretrain", str(bad), *base], capsys, "not valid JSON", out)
    # a config whose vocab size differs from the shards'
    from bertkit.config import BertConfig
    BertConfig.preset("tiny", vocab_size=999).to_json(tmp_path / "config.json")
    _fails(["pretrain", str(data / "shards"), "--config", str(tmp_path / "config.json"),
            *base[2:]], capsys, "vocab_size=999", out)
    # phase-2 / eval shards built with another vocab
    _fails(["pretrain", str(data / "shards"), "--eval-shards", str(data / "shards_other"), *base], capsys,
           "another vocab", out)
    # a checkpoint + a config that does not fit it
    model_dir = tmp_path / "m"
    from bertkit.heads import BertForPreTraining
    from bertkit.tokenizer import Tokenizer
    BertForPreTraining(BertConfig.preset("tiny", vocab_size=600)).save_pretrained(
        model_dir, tokenizer=Tokenizer(str(data / "vocab" / "vocab.txt")))
    (tmp_path / "wide.json").write_text(json.dumps({"hidden_size": 256, "num_attention_heads": 2,
                                                     "intermediate_size": 512}))
    _fails(["pretrain", str(data / "shards"), "--init", str(model_dir), "--config", str(tmp_path / "wide.json"),
            *base[2:]], capsys, "shape", out)
    # a checkpoint whose vocab.txt is not the shards' vocab
    _fails(["pretrain", str(data / "shards_other"), "--init", str(model_dir), *base[2:]], capsys,
           "token ids would mean other tokens", out)
    # an output directory that cannot be written, a zero budget, no length at all
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _fails(["pretrain", str(data / "shards"), *TINY, "--steps", "2", "--out", str(blocker / "run")], capsys,
           "not writable")
    _fails(["pretrain", str(data / "shards"), *TINY, "--budget", "0", "--out", str(out)], capsys, "budget", out)
    _fails(["pretrain", str(data / "shards"), *TINY, "--out", str(out)], capsys, "--steps", out)
    _fails(["pretrain", str(data / "shards"), *TINY, "--steps", "2", "--global-batch", "12", "--out", str(out)],
           capsys, "not a multiple", out)
    _fails(["pretrain", str(data / "shards"), *TINY, "--budget", "1m", "--mask-prob", "1.5", "--out", str(out)],
           capsys, "--mask-prob 1.5", out)
    # a training setting that is refused: before the model is even built
    import bertkit.train.pretrain as P
    monkeypatch.setattr(P, "build_model", lambda *a, **k: pytest.fail("the model was built"))
    _fails(["pretrain", str(data / "shards"), *TINY, "--steps", "2", "--decay-fraction", "0.1", "--out", str(out)],
           capsys, "applies to schedule='wsd' only", out)


def test_two_processes_give_the_losses_of_one(data, tmp_path):
    """Global batch 8: 1 process x batch 8 vs torchrun 2 processes (gloo) x batch 4: same per-step losses."""
    common = ["--preset", "tiny", "--precision", "fp32", "--no-progress", "--dropout", "0", "--steps", "4",
              "--lr", "1e-3", "--warmup", "0", "--save-every", "2"]
    one = tmp_path / "one"
    assert cli(["pretrain", str(data / "shards"), "--out", str(one), "--batch-size", "8", *common]) == 0
    two = tmp_path / "two"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "bertkit", "pretrain", str(data / "shards"), "--out", str(two), "--batch-size", "4",
                           *common], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = _records(one), _records(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert rb["tokens"] == ra["tokens"]
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc"):
            assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-6), (ra["step"], key)
    # each rank wrote its own data position + RNG state
    ckpt = two / "checkpoints" / "step-00000004"
    assert (ckpt / "rank-00000.pt").exists() and (ckpt / "rank-00001.pt").exists()


@pytest.mark.slow
def test_fsdp_two_processes_give_the_losses_of_one(data, tmp_path):
    """--fsdp (FSDP2 on CPU / gloo): the same per-step losses as one process, and a whole model saved."""
    common = ["--preset", "tiny", "--precision", "fp32", "--no-progress", "--dropout", "0", "--steps", "3",
              "--lr", "1e-3", "--warmup", "0"]
    one = tmp_path / "one"
    assert cli(["pretrain", str(data / "shards"), "--out", str(one), "--batch-size", "8", *common]) == 0
    two = tmp_path / "fsdp"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "bertkit", "pretrain", str(data / "shards"), "--out", str(two), "--batch-size", "4",
                           "--fsdp", *common], env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for ra, rb in zip(_records(one), _records(two), strict=True):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5)
    from bertkit.heads import BertForPreTraining
    a = BertForPreTraining.from_pretrained(one / "model").state_dict()
    b = BertForPreTraining.from_pretrained(two / "model").state_dict()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k


def test_unigram_bias_starts_mlm_at_the_unigram_loss(data):
    """A fresh MLM output bias is log p(token) over the shards' non-special tokens: exp sums to 1, specials get the
    add-one floor, the most frequent token the largest bias, and the first batch's MLM loss drops from ~log V."""
    import numpy as np

    from bertkit.config import BertConfig
    from bertkit.heads import BertForMaskedLM
    from bertkit.pretraining.shards import ShardReader
    from bertkit.train.pretrain import unigram_bias_init

    reader = ShardReader(data / "shards", 16, vocab_size=600)
    counts = reader.token_counts()
    lengths = sum(int(np.asarray(sh["meta"][:, 0]).sum()) for sh in reader._shards)
    assert counts.sum() == lengths
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=600)).eval()
    batch = next(iter(reader))
    batch = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask", "labels")}
    with torch.no_grad():
        before = float(model(**batch).loss)
    assert unigram_bias_init(model, reader)
    bias = model.cls.predictions.bias.detach().double()
    assert abs(float(bias.exp().sum()) - 1.0) < 1e-4
    special = torch.from_numpy(reader.tables.never_mask)
    assert float(bias[special].max()) == pytest.approx(float(bias.min()))
    plain = counts.copy()
    plain[reader.tables.never_mask] = 0
    assert int(bias.argmax()) == int(plain.argmax())
    with torch.no_grad():
        after = float(model(**batch).loss)
    assert before == pytest.approx(np.log(600), abs=0.3)
    assert after < before - 0.5


def test_budget_from_scratch_plans_prints_and_summarises(data, tmp_path, capsys):
    """--budget without --init: the plan block on stderr (with the user's --lr kept), plan.json, and a summary with
    the held-out MLM accuracy and a fill-mask sample of held-out rows."""
    out = tmp_path / "planned"
    assert cli(["pretrain", str(data / "shards"), "--preset", "tiny", "--budget", "6s", "--lr", "2e-3",
                "--precision", "fp32", "--no-progress", "--eval-shards", str(data / "heldout"), "--out",
                str(out)]) == 0
    err = capsys.readouterr().err
    assert "bertkit pretrain: the plan for a 6s budget from scratch (tiny" in err
    assert "yours: --lr" in err and "re-masked at batch time" in err and " steps, ~" in err
    plan = json.loads((out / "plan.json").read_text())
    assert plan["flags"] == ["lr"] and plan["settings"]["lr"] == 2e-3 and plan["estimated_steps"] >= 1
    assert plan["settings"]["masking"] == "token" and plan["settings"]["mask_prob"] == 0.4
    assert plan["settings"]["batch_size"] == 16 and plan["settings"]["warmup"] >= 1
    state = sorted((out / "checkpoints").glob("step-*"))[-1] / "state.json"
    cfg = json.loads(state.read_text())["config"]
    assert (cfg["lr"], cfg["schedule"], cfg["warmup"]) == (2e-3, "wsd", plan["settings"]["warmup"])
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["heldout"]["mlm_acc"] <= 1 and summary["plan"]["settings"] == plan["settings"]
    sample = summary["fill_mask"]["examples"]
    assert sample and all("[MASK]" in e["text"] and len(e["top"]) == 5 and e["truth"] for e in sample)
    md = (out / "summary.md").read_text()
    assert "held-out MLM accuracy" in md and "## Fill-mask" in md and "(truth: **" in md


def test_plan_remasks_static_shards(data, tmp_path):
    """The plan's dynamic token 40% on shards that store static masks: the reader draws them from the tokens."""
    from bertkit.config import BertConfig
    from bertkit.pretraining.shards import read_manifest
    from bertkit.train.pretrain import PretrainConfig, _reader
    from bertkit.train.recipe import apply_plan, plan_recipe
    static = data / "heldout"                                       # static token 15% masks
    pc = PretrainConfig(shards=str(static), out=str(tmp_path), preset="tiny", set_fields=())
    plan = plan_recipe(60, "tiny", 0.1, read_manifest(static))
    assert any("re-masked" in n for n in plan.notes)
    reader = _reader(apply_plan(pc, plan), str(static), BertConfig.preset("tiny", vocab_size=600), "nsp")
    assert reader.remasked and (reader.masking.mode, reader.masking.mask_prob) == ("token", 0.4)
    kept = _reader(pc, str(static), BertConfig.preset("tiny", vocab_size=600), "nsp")
    assert not kept.remasked                                         # no plan: the shards' own masks
    b = reader.batch(reader.indices(0, 0, 64))
    maskable = (b["attention_mask"] == 1).sum() - 3 * 64             # [CLS] and two [SEP] per row
    assert abs(float((b["labels"] != -100).sum()) / float(maskable) - 0.4) < 0.03


def test_corpus_output_vocab_is_the_softmax_over_those_columns(data):
    """restrict_to: in training the MLM loss is the cross-entropy over the candidate columns only (the full
    logits' columns, labels mapped), the reported accuracy names vocabulary ids, only candidate rows of the tied
    table get a decoder gradient, and eval mode scores the whole vocabulary again."""
    import torch.nn.functional as F

    from bertkit.config import BertConfig
    from bertkit.heads import BertForPreTraining
    from bertkit.pretraining.shards import ShardReader
    from bertkit.train.steps import pretraining_step

    reader = ShardReader(data / "shards", 8, vocab_size=600)
    batch = next(iter(reader))
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=600, hidden_dropout_prob=0.0,
                                                 attention_probs_dropout_prob=0.0))
    model.masked_logits_only = True
    labels = batch["labels"][batch["labels"] != -100]
    ids = torch.unique(torch.cat([labels, torch.arange(5, 300)]))          # every label, and others
    full = model(**batch)
    model.cls.predictions.restrict_to(ids)
    out = model(**batch)
    assert out.prediction_logits.shape == (labels.numel(), ids.numel())
    torch.testing.assert_close(out.prediction_logits, full.prediction_logits[:, ids])
    columns = torch.searchsorted(ids, labels)
    want = F.cross_entropy(full.prediction_logits[:, ids].float(), columns)
    torch.testing.assert_close(out.mlm_loss, want)
    step = pretraining_step(model, batch)
    right, n = step.metrics["mlm_acc"]
    assert int(right) == int((ids[full.prediction_logits[:, ids].argmax(-1)] == labels).sum()) and n == labels.numel()
    model.zero_grad()
    out.mlm_loss.backward()
    grad = model.bert.embeddings.word_embeddings.weight.grad
    outside = torch.ones(600, dtype=torch.bool)
    outside[ids] = False
    outside[batch["input_ids"].unique()] = False                              # input rows get their own gradient
    assert outside.any() and float(grad[outside].abs().max()) == 0.0
    model.eval()
    with torch.no_grad():
        assert model(**batch).prediction_logits.shape[-1] == 600 and model(**batch).logit_ids is None


def test_plan_trains_the_corpus_vocabulary_and_a_flag_keeps_the_full_one(data, tmp_path, capsys):
    out = tmp_path / "corpus"
    assert cli(["pretrain", str(data / "shards"), *TINY, "--budget", "3s", "--precision", "fp32", "--out",
                str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["settings"]["output_vocab"] == "corpus" and "never a target" in plan["reasons"]["output_vocab"]
    assert "MLM softmax in training scores the" in capsys.readouterr().err
    out2 = tmp_path / "full"
    assert cli(["pretrain", str(data / "shards"), *TINY, "--budget", "3s", "--precision", "fp32", "--out",
                str(out2), "--output-vocab", "full"]) == 0
    plan = json.loads((out2 / "plan.json").read_text())
    assert plan["settings"]["output_vocab"] == "full" and "output_vocab" in plan["flags"]
    assert "MLM softmax in training" not in capsys.readouterr().err


def test_local_attention_init_refuses_a_trained_start(data, tmp_path, capsys):
    from bertkit.config import BertConfig
    from bertkit.heads import BertForPreTraining
    BertForPreTraining(BertConfig.preset("tiny", vocab_size=600)).save_pretrained(tmp_path / "model")
    out = tmp_path / "run"
    _fails(["pretrain", str(data / "shards"), "--init", str(tmp_path / "model"), "--attention-init", "local",
            "--steps", "2", "--no-progress", "--out", str(out)], capsys, "--attention-init local initialises a fresh",
           out)


# ------------------------------------------------------------------------------------ a finished tiny run, misused

TINY_RUN = ["--preset", "tiny", "--batch-size", "4", "--device", "cpu", "--precision", "fp32", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A 4-step run (checkpoints at 2 and 4, summary) on shards of seq 32 from a 75-token vocab."""
    import random
    from bertkit.pretraining import PrepareConfig, prepare
    from bertkit.vocab import train_vocab
    root = tmp_path_factory.mktemp("tiny_run")
    rng = random.Random(0)
    words = "the cat sat on a mat while dogs ran fast over green hills and rivers".split()
    (root / "corpus.txt").write_text("".join(
        "".join(" ".join(rng.choice(words) for _ in range(rng.randint(5, 14))) + ".\n" for _ in range(6)) + "\n"
        for _ in range(8)))
    train_vocab([str(root / "corpus.txt")], vocab_size=120).save(root / "vocab")
    prepare(PrepareConfig(str(root / "corpus.txt"), str(root / "vocab"), str(root / "shards"), seq_len=32))
    assert cli(["pretrain", str(root / "shards"), "--out", str(root / "run"), *TINY_RUN, "--steps", "4",
                "--save-every", "2"]) == 0
    assert (root / "run" / "summary.json").exists()
    return root


def _digest(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error:" in line or line.startswith(("Traceback", "\t", "  "))]


def test_a_refused_resume_leaves_the_run_as_it_was(tiny_run, tmp_path, capsys):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(tiny_run / "run", run)
    before = _digest(run)
    shards = str(tiny_run / "shards")
    for argv, match in (
            # the data position does not fit another batch size
            (["--batch-size", "8", "--steps", "12"], "batch_size=4"),
            # another model: named in one line from the configs, before any weight is loaded
            (["--preset", "mini", "--steps", "12"], "was trained with hidden_size 128, num_hidden_layers 2, "
                                                    "num_attention_heads 2, intermediate_size 512; --preset mini "
                                                    "has hidden_size 256"),
            # another head (MLM only on an NSP run): the weights' mismatch summarised in one line
            (["--objective", "mlm", "--steps", "12"], "the weights do not fit the model"),
    ):
        rc = cli(["pretrain", shards, "--out", str(run), *TINY_RUN, *argv, "--resume"])
        err = capsys.readouterr().err
        lines = _error_lines(err)
        assert rc == 2 and len(lines) == 1 and match in lines[0], err
        assert _digest(run) == before, argv          # summary, pretrain_config.json, metrics, checkpoints


def test_resuming_a_run_already_past_its_steps_trains_nothing_and_says_so(tiny_run, tmp_path, capsys):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(tiny_run / "run", run)
    before = _digest(run)
    rc = cli(["pretrain", str(tiny_run / "shards"), "--out", str(run), *TINY_RUN, "--steps", "2", "--resume"])
    err = capsys.readouterr().err
    assert rc == 0 and "is already at step 4 (>= --steps 2): nothing trained" in err, err
    assert _digest(run) == before
    shutil.rmtree(run / "model")               # lost to a full disk or an interrupt after the last checkpoint
    rc = cli(["pretrain", str(tiny_run / "shards"), "--out", str(run), *TINY_RUN, "--steps", "4", "--resume"])
    err = capsys.readouterr().err
    assert rc == 0 and "nothing trained, writing the missing" in err, err
    assert (run / "model" / "config.json").is_file() and (run / "model" / "model.safetensors").is_file()


def test_a_vocab_that_is_not_the_shards_is_refused_before_training(tiny_run, tmp_path, capsys):
    tokens = (tiny_run / "vocab" / "vocab.txt").read_text().splitlines()
    tokens[10], tokens[11] = tokens[11], tokens[10]            # same size, ids meaning other tokens
    (tmp_path / "swapped.txt").write_text("\n".join(tokens) + "\n")
    out = tmp_path / "run"
    _fails(["pretrain", str(tiny_run / "shards"), "--out", str(out), *TINY_RUN, "--steps", "2", "--vocab",
            str(tmp_path / "swapped.txt")], capsys, "token ids would mean other tokens", out)
    assert not (out / "model").exists()


def test_a_failed_overwrite_keeps_the_earlier_run(tiny_run, tmp_path, capsys):
    """--overwrite sets the earlier run aside; a run that fails before writing its own files puts it back whole, one
    that fails later (diverged here) leaves it in .bertkit-replaced and says so."""
    import shutil
    from bertkit.commands.checks import REPLACED
    run = tmp_path / "run"
    shutil.copytree(tiny_run / "run", run)
    before = _digest(run)
    _fails(["pretrain", str(tiny_run / "nope"), "--out", str(run), *TINY_RUN, "--steps", "2", "--overwrite"], capsys,
           "nope", None)
    assert _digest(run) == before
    rc = cli(["pretrain", str(tiny_run / "shards"), "--out", str(run), *TINY_RUN, "--steps", "2", "--lr", "1e30",
              "--warmup", "0", "--overwrite"])
    err = capsys.readouterr().err
    assert rc == 2 and "kept in" in err and (run / REPLACED / "model" / "config.json").is_file(), err
    assert (run / REPLACED / "summary.json").is_file()
    _fails(["pretrain", str(tiny_run / "shards"), "--out", str(run), *TINY_RUN, "--steps", "2", "--overwrite",
            "--resume"], capsys, "give one of them", None)


def test_a_diverged_run_fails_without_saving_a_model(tiny_run, tmp_path, capsys):
    out = tmp_path / "run"
    # step 1's update (lr 1e30) leaves finite but absurd weights; step 2's loss is NaN and skipped
    rc = cli(["pretrain", str(tiny_run / "shards"), "--out", str(out), *TINY_RUN, "--steps", "2", "--lr", "1e30",
              "--warmup", "0"])
    err = capsys.readouterr().err
    lines = _error_lines(err)
    assert rc == 2 and len(lines) == 1, err
    assert "training diverged at step 1" in lines[0] and "lower --lr" in lines[0], err
    assert not (out / "model").exists() and not (out / "summary.json").exists()
    assert (out / "checkpoints" / "step-00000002").is_dir()     # kept as they are
