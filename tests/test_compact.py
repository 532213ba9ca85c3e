"""The compact word-embedding table (bertkit.train.compact): same maths as training the full table."""

from __future__ import annotations

import random

import pytest
import torch

from bertkit.errors import ConfigError


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _config(**kw):
    from bertkit.config import BertConfig
    base = dict(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=64, num_labels=3)
    base.update(kw)
    return BertConfig(**base)


def _batches(n, used, seed=0, batch=8):
    """Ragged padded batches whose ids come from `used` (pad id 0 in the padding)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lens = [rng.randint(3, 20) for _ in range(batch)]
        ids = torch.zeros(batch, max(lens), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, n_tok in enumerate(lens):
            ids[i, :n_tok] = torch.tensor([rng.choice(used) for _ in range(n_tok)])
            mask[i, :n_tok] = 1
        out.append({"input_ids": ids, "attention_mask": mask,
                    "labels": torch.tensor([rng.randrange(3) for _ in range(batch)])})
    return out


def _train(model, batches, tmp_path, steps, name, eval_fn=None):
    from bertkit.train import TrainConfig, train
    cfg = TrainConfig(max_steps=steps, lr=3e-3, warmup=0.2, weight_decay=0.01, max_grad_norm=1.0, precision="fp32",
                      seed=5, progress=False, tensorboard=False, plot=False, save_final=False, overwrite=True,
                      eval_every_steps=6 if eval_fn else None)
    return train(model, batches, cfg, tmp_path / name, eval_fn=eval_fn)


def _logit_probe(batch, store):
    """An eval_fn that records the logits of a batch holding ids training never sees (a dev set's)."""
    def fn(model):
        device = next(model.parameters()).device                 # the loop puts the model on CUDA where there is one
        store.append(model(input_ids=batch["input_ids"].to(device),
                           attention_mask=batch["attention_mask"].to(device)).logits.cpu())
        return {}
    return fn


def test_forward_state_dict_and_unseen_ids():
    from bertkit.heads import BertForSequenceClassification
    from bertkit.train.compact import CompactEmbedding, compact_word_embeddings, restore_word_embeddings
    torch.manual_seed(0)
    model = BertForSequenceClassification(_config()).eval()
    plain = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[2, 17, 33, 3, 0, 0], [2, 250, 399, 17, 3, 0]])
    mask = (ids != 0).long()
    ref = model(input_ids=ids, attention_mask=mask).logits
    emb = compact_word_embeddings(model, torch.tensor([0, 2, 3, 17, 33]))
    assert isinstance(model.bert.embeddings.word_embeddings, CompactEmbedding) and emb.rows.shape == (6, 32)
    # the first row's ids are all trained rows, the second's are not (250, 399): both equal the plain model
    with torch.no_grad():                                   # (inference GEMM kernels: equal to rounding)
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(model(input_ids=ids[:1], attention_mask=mask[:1]).logits, ref[:1], rtol=1e-5, atol=1e-7)
    with pytest.raises(ConfigError, match=r"ids \[250, 399\] are not among the 5 trained rows"):
        model(input_ids=ids, attention_mask=mask)          # with grad: an untrained row would move the sentinel
    sd = model.state_dict()
    assert list(sd) == list(plain) and all(torch.equal(sd[k], plain[k]) for k in plain)
    assert [n for n, _ in model.named_parameters()].count("bert.embeddings.word_embeddings.rows") == 1
    # loading a table (a checkpoint, the best dev state) re-gathers the rows and resets the decay sentinel
    other = {k: v + 1.0 if k == "bert.embeddings.word_embeddings.weight" else v for k, v in plain.items()}
    with torch.no_grad():
        emb.rows[-1].fill_(0.5)
    model.load_state_dict(other)
    assert torch.equal(model.state_dict()["bert.embeddings.word_embeddings.weight"],
                       plain["bert.embeddings.word_embeddings.weight"] + 1.0)
    with pytest.raises(RuntimeError, match="size mismatch"):
        model.load_state_dict({**other, "bert.embeddings.word_embeddings.weight": torch.zeros(5, 32)})
    restore_word_embeddings(model)
    assert type(model.bert.embeddings.word_embeddings) is torch.nn.Embedding
    assert model.bert.embeddings.word_embeddings.padding_idx == 0
    assert torch.equal(model.state_dict()["bert.embeddings.word_embeddings.weight"],
                       plain["bert.embeddings.word_embeddings.weight"] + 1.0)


def test_training_step_never_builds_the_full_table(monkeypatch):
    """A training forward reads only the compact rows: building the (vocab, hidden) table per step cost fine-tuning
    ~28 ms a step on MiniLM (more than the embedding lookup saves)."""
    from bertkit.heads import BertForSequenceClassification
    from bertkit.train.compact import CompactEmbedding, compact_word_embeddings
    torch.manual_seed(0)
    model = BertForSequenceClassification(_config()).train()
    compact_word_embeddings(model, torch.tensor([0, 2, 3, 17, 33]))
    built = []
    full = CompactEmbedding.weight.fget
    monkeypatch.setattr(CompactEmbedding, "weight", property(lambda self: built.append(1) or full(self)))
    ids = torch.tensor([[2, 17, 33, 3, 0, 0], [2, 33, 3, 0, 0, 0]])
    out = model(input_ids=ids, attention_mask=(ids != 0).long(), labels=torch.tensor([0, 2]))
    out.loss.backward()
    assert built == [] and model.bert.embeddings.word_embeddings.rows.grad is not None


def test_training_matches_the_full_table(tmp_path):
    """Same losses, same trained rows and other weights, unused rows decayed only, dropout on, clipping on."""
    from bertkit.heads import BertForSequenceClassification
    from bertkit.train.compact import compact_word_embeddings, restore_word_embeddings
    used = [0, 2, 3] + random.Random(1).sample(range(5, 400), 60)
    batches = _batches(12, used[1:])
    torch.manual_seed(0)
    full = BertForSequenceClassification(_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    compact = BertForSequenceClassification(_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    compact.load_state_dict(full.state_dict())
    w0 = full.state_dict()["bert.embeddings.word_embeddings.weight"].clone()
    dev = _batches(1, list(range(1, 400)), seed=9)[0]                  # mostly ids outside `used`
    seen_full, seen_comp = [], []
    r_full = _train(full, batches, tmp_path, 24, "full", _logit_probe(dev, seen_full))
    compact_word_embeddings(compact, torch.tensor(used))
    r_comp = _train(compact, batches, tmp_path, 24, "compact", _logit_probe(dev, seen_comp))
    restore_word_embeddings(compact)
    assert r_full.losses == pytest.approx(r_comp.losses, rel=1e-5)
    # the evaluations during training (steps 6, 12, 18, 24, fused AdamW in between) see the current weights
    assert len(seen_full) == len(seen_comp) == 4
    for a, b in zip(seen_full, seen_comp):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(seen_full[0], seen_full[-1], atol=1e-4)
    a, b = full.cpu().state_dict(), compact.cpu().state_dict()          # the loop may have left them on CUDA
    assert list(a) == list(b)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
    unused = torch.ones(400, dtype=torch.bool)
    unused[used] = False
    w = a["bert.embeddings.word_embeddings.weight"]
    assert not torch.equal(w[unused], w0[unused])                       # they did decay ...
    ratio = w[unused] / w0[unused]
    assert float(ratio.max() - ratio.min()) < 1e-5                      # ... all by one factor (to rounding)
    assert not torch.allclose(w[used[1:]], w0[used[1:]], atol=1e-4)     # the used rows trained


def test_refuses_tied_tables_and_lamb():
    from bertkit.heads import BertForMaskedLM, BertForSequenceClassification
    from bertkit.train.compact import compact_word_embeddings
    with pytest.raises(ConfigError, match="tied"):
        compact_word_embeddings(BertForMaskedLM(_config()), torch.tensor([0, 1]))
    with pytest.raises(ConfigError, match="AdamW"):
        compact_word_embeddings(BertForSequenceClassification(_config()), torch.tensor([0]), optimizer="lamb")


def test_finetune_runner_same_result_with_and_without(tmp_path):
    """The fine-tuning runner uses the compact table by default: same dev metrics and saved weights as the full."""
    from safetensors.torch import load_file

    from bertkit.config import BertConfig
    from bertkit.model import BertModel
    from bertkit.tasks.readers import write_table
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    from bertkit.tokenizer import Tokenizer

    words = [f"w{i}" for i in range(200)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + ["good", "bad"]
    d = tmp_path / "m"
    d.mkdir()
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    BertModel(_config(vocab_size=len(vocab))).save_pretrained(d, tokenizer=Tokenizer.from_pretrained(d / "vocab.txt"))
    rng = random.Random(0)

    def rows(n, pool):
        out = []
        for _ in range(n):
            lab = rng.choice(["good", "bad"])
            out.append({"text": " ".join(rng.sample(pool, 6) + [lab]), "label": lab})
        return out
    train = str(write_table(tmp_path / "train.csv", rows(96, words[:80])))
    dev = str(write_table(tmp_path / "dev.csv", rows(32, words)))          # dev has ids training never saw
    out = {}
    for flag in (True, False):
        cfg = FinetuneConfig(task="classify", model=str(d), train=train, dev=dev, out=str(tmp_path / f"r{flag}"),
                             batch_size=16, quiet=True, compact_embeddings=flag,
                             training=finetune_recipe(lr=1e-3, epochs=2, precision="fp32"))
        out[flag] = finetune(cfg)
    assert out[True]["dev"]["accuracy"]["mean"] == out[False]["dev"]["accuracy"]["mean"]
    a = load_file(tmp_path / "rTrue" / "model.safetensors")
    b = load_file(tmp_path / "rFalse" / "model.safetensors")
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
