"""Continued ELECTRA pre-training from a transformers-saved pair: the discriminator (ElectraForPreTraining) and its
own, narrower generator (ElectraForMaskedLM) load into bertkit's replaced-token-detection objective with their
weights, so that both halves compute what transformers computes; `bertkit pretrain --init D --generator G` trains
the pair."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertkit.cli import main  # noqa: E402
from bertkit.errors import ConfigError  # noqa: E402
from bertkit.pretraining.electra import ElectraForPreTraining  # noqa: E402
from test_family_journeys import family_tokenizer  # noqa: E402

CORPUS = "the film was great and the plot was boring but the music was lovely at the end of the show\n" * 24


def _pair(root, generator_embedding: int = 16):
    """(discriminator dir, generator dir): hidden 32 / 16, the embeddings (width 16) shared as the paper trains."""
    tok, names = family_tokenizer("electra")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=64, **names)
    shape = dict(vocab_size=tok.get_vocab_size(), max_position_embeddings=72, pad_token_id=fast.pad_token_id)
    torch.manual_seed(0)
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        **shape, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48))
    gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        **shape, embedding_size=generator_embedding, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=24))
    if generator_embedding == 16:
        gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
        gen.tie_weights()
    dirs = root / "disc", root / "gen"
    for model, d in zip((disc, gen), dirs):
        model.save_pretrained(d)
        fast.save_pretrained(d)
    return dirs


def test_the_pair_loads_with_both_halves_equal_to_transformers(tmp_path):
    disc_dir, gen_dir = _pair(tmp_path)
    ours = ElectraForPreTraining.from_pretrained(disc_dir, gen_dir).eval()
    assert ours.generator.config.hidden_size == 16 and ours.generator.bert.embeddings is ours.discriminator.embeddings
    disc = transformers.ElectraForPreTraining.from_pretrained(disc_dir).eval()
    gen = transformers.ElectraForMaskedLM.from_pretrained(gen_dir).eval()
    ids = torch.randint(5, disc.config.vocab_size, (2, 12))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ours.generator.masked_logits_only = False
        got_gen = ours.generator(ids, attention_mask=mask).logits
        got_rtd = ours.discriminator_predictions(ours.discriminator(ids, attention_mask=mask).last_hidden_state)
        assert torch.allclose(got_gen, gen(ids, attention_mask=mask).logits, atol=1e-5)
        assert torch.allclose(got_rtd, disc(ids, attention_mask=mask).logits, atol=1e-5)


def test_a_generator_of_other_embeddings_is_one_line(tmp_path):
    disc_dir, gen_dir = _pair(tmp_path, generator_embedding=8)
    with pytest.raises(ConfigError, match=r"--generator .*gen: the generator's embeddings \(width, vocab\) \(8, "):
        ElectraForPreTraining.from_pretrained(disc_dir, gen_dir)


def test_pretrain_continues_the_pair(tmp_path, capsys):
    disc_dir, gen_dir = _pair(tmp_path)
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    assert main(["prepare", "--corpus", str(tmp_path / "corpus.txt"), "--vocab", str(disc_dir), "--out",
                 str(tmp_path / "shards"), "--seq-len", "32", "--task", "none"]) == 0
    run = ["pretrain", str(tmp_path / "shards"), "--init", str(disc_dir), "--objective", "electra", "--steps", "2",
           "--batch-size", "2", "--no-progress"]
    assert main([*run, "--generator", str(gen_dir), "--out", str(tmp_path / "pt")]) == 0, capsys.readouterr().err
    saved = json.loads(next((tmp_path / "pt").rglob("model/config.json")).read_text())
    assert saved["model_type"] == "electra" and saved["hidden_size"] == 32
    assert main([*run[:1], str(tmp_path / "shards"), "--preset", "tiny", "--generator", str(gen_dir), "--steps", "2",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "--generator is the generator of an ELECTRA pair" in capsys.readouterr().err


def test_a_rotary_pair_continued_at_a_new_base_keeps_its_loss_weight_and_generator(tmp_path):
    """--init with --objective electra and --rope-theta: the pair is rebuilt at the new base (both halves), with the
    run's discriminator loss weight and the loaded generator's shape."""
    from bertkit.config import BertConfig
    from bertkit.heads import BertForMaskedLM
    from bertkit.train.pretrain import PretrainConfig, build_model
    config = BertConfig(model_type="modernbert", vocab_size=600, hidden_size=32, num_hidden_layers=3,
                        num_attention_heads=4, intermediate_size=48, max_position_embeddings=32, pad_token_id=0,
                        extra={"local_attention": 8, "global_attn_every_n_layers": 1})
    BertForMaskedLM(config).save_pretrained(tmp_path / "disc")
    BertForMaskedLM(config.replace(num_hidden_layers=2)).save_pretrained(tmp_path / "gen")
    pc = PretrainConfig(shards="unused", out=str(tmp_path / "out"), init=str(tmp_path / "disc"),
                        generator=str(tmp_path / "gen"), objective="electra", electra_weight=7.0, rope_theta=5e5)
    model, _ = build_model(pc, {"shards": {"vocab_size": 600, "seq_len": 64}}, "electra")
    assert model.rtd_weight == 7.0 and model.generator.config.num_hidden_layers == 2
    thetas = {m.theta for m in model.modules() if getattr(m, "theta", None) is not None}
    assert thetas == {5e5}
    gen = BertForMaskedLM.from_pretrained(tmp_path / "gen")
    torch.testing.assert_close(model.generator.bert.encoder.state_dict(), gen.bert.encoder.state_dict())


def test_dropout_reaches_a_loaded_generator_as_it_reaches_a_fresh_one(tmp_path):
    disc_dir, gen_dir = _pair(tmp_path)
    ours = ElectraForPreTraining.from_pretrained(disc_dir, gen_dir, hidden_dropout_prob=0.0,
                                                 attention_probs_dropout_prob=0.0)
    for half in (ours.discriminator, ours.generator):
        assert (half.config.hidden_dropout_prob, half.config.attention_probs_dropout_prob) == (0.0, 0.0)
