"""A user's journey per encoder family, end to end: a directory transformers saved (random weights of the family,
its own kind of tokenizer.json) -> `bertkit finetune` -> transformers loads the result and predicts the same labels;
a sentence-transformers directory of the family -> `bertkit embed` equals `SentenceTransformer.encode`."""

from __future__ import annotations

import json
import os
import random

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from bertkit.cli import main  # noqa: E402
from bertkit.families import FAMILIES  # noqa: E402

from test_tasks_finetune import NEG, POS, WORDS, _sentiment_rows as _rows  # noqa: E402  the same sentiment data

CORPUS = [" ".join(random.Random(i).sample(WORDS + POS + NEG, 8)) for i in range(300)]
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
# tokenizer_config.json's special tokens by layout
BERT_NAMES = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
              "mask_token": "[MASK]"}
ROBERTA_NAMES = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>",
                 "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>"}


def _bert_template(tok, specials):
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")])


def family_tokenizer(model_type: str):
    """The kind of tokenizer.json the family ships: byte-level BPE (RoBERTa), Unigram + Metaspace (XLM-R <s>, ALBERT /
    DeBERTa [CLS]), WordPiece with <s> (MPNet) or [CLS] (DistilBERT, ELECTRA). -> (tokenizers.Tokenizer, names)"""
    if model_type in ("roberta", "modernbert"):
        specials = ROBERTA_SPECIALS if model_type == "roberta" else BERT_SPECIALS
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        if model_type == "roberta":
            tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
            return tok, ROBERTA_NAMES
        _bert_template(tok, specials)
        return tok, BERT_NAMES
    if model_type in ("xlm-roberta", "albert", "deberta-v2"):
        specials = ROBERTA_SPECIALS if model_type == "xlm-roberta" else BERT_SPECIALS
        tok = tokenizers.Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
        tok.decoder = decoders.Metaspace(prepend_scheme="always")
        unk = "<unk>" if model_type == "xlm-roberta" else "[UNK]"
        tok.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=120, special_tokens=specials, unk_token=unk))
        if model_type == "xlm-roberta":
            tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
            return tok, ROBERTA_NAMES
        _bert_template(tok, specials)
        return tok, BERT_NAMES
    specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"] if model_type == "mpnet" else BERT_SPECIALS
    tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    if model_type == "mpnet":
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        return tok, {**ROBERTA_NAMES, "unk_token": "[UNK]"}
    _bert_template(tok, specials)
    return tok, BERT_NAMES


def family_dir(root, model_type: str, head: str = "ForSequenceClassification"):
    """A transformers-saved directory of the family: tiny random weights and its kind of tokenizer."""
    tok, names = family_tokenizer(model_type)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=64, **names)
    shape = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=48, max_position_embeddings=72, pad_token_id=fast.pad_token_id)
    if model_type == "distilbert":
        shape = dict(vocab_size=shape["vocab_size"], dim=32, n_layers=2, n_heads=4, hidden_dim=48,
                     max_position_embeddings=72, pad_token_id=fast.pad_token_id)
    if model_type in ("electra", "albert"):
        shape["embedding_size"] = 16
    if model_type == "gte":             # gte-base-en-v1.5's: BERT's WordPiece, no token types
        shape["type_vocab_size"] = 0
    cfg = transformers.AutoConfig.for_model(model_type, **shape, id2label={0: "neg", 1: "pos"},
                                            label2id={"neg": 0, "pos": 1})
    torch.manual_seed(0)
    model = getattr(transformers, "AutoModel" + ("" if head == "Model" else head)).from_config(cfg)
    model.save_pretrained(root)
    fast.save_pretrained(root)
    return root


FAMILY_TYPES = [t for t in FAMILIES if t != "bert" and hasattr(transformers, FAMILIES[t].class_prefix + "Model")]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_finetune_a_transformers_directory_then_transformers_predicts_the_same(tmp_path, model_type, capsys):
    src = family_dir(tmp_path / "hf", model_type)
    train, dev = _jsonl(tmp_path / "train.jsonl", _rows(320, 0)), _jsonl(tmp_path / "dev.jsonl", _rows(40, 1))
    rc = main(["finetune", "--task", "classify", "--model", str(src), "--train", str(train), "--dev", str(dev),
               "--out", str(tmp_path / "run"), "--epochs", "8", "--lr", "1e-3", "--batch-size", "16", "--dropout", "0",
               "--precision", "fp32", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    out = next(p.parent for p in (tmp_path / "run").rglob("model.safetensors"))
    texts = [r["text"] for r in _rows(40, 1)]
    from bertkit.infer import Predictor
    ours = Predictor.load(out, precision="fp32").classify(texts)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        logits = model(**tok(texts, padding=True, return_tensors="pt")).logits
    theirs = [model.config.id2label[int(i)] for i in logits.argmax(-1)]
    assert [r["label"] for r in ours] == theirs
    probs = torch.softmax(logits, -1)
    np.testing.assert_allclose([[r["scores"][model.config.id2label[j]] for j in range(2)] for r in ours],
                               probs.numpy(), atol=1e-5)
    accuracy = np.mean([t == r["label"] for t, r in zip(theirs, _rows(40, 1))])
    assert accuracy >= 0.75, accuracy                       # it learned (one label is 0.675 of dev)


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_embed_a_sentence_transformers_directory_equals_sentence_transformers(tmp_path, model_type, capsys):
    st = pytest.importorskip("sentence_transformers")
    modules = pytest.importorskip("sentence_transformers.sentence_transformer.modules")
    src = family_dir(tmp_path / "hf", model_type, head="Model")
    word = modules.Transformer(str(src), max_seq_length=48)
    model = st.SentenceTransformer(modules=[word, modules.Pooling(word.get_word_embedding_dimension(), "mean")],
                                   device="cpu")
    model.save(str(tmp_path / "st"))
    texts = [r["text"] for r in _rows(6, 2)] + ["the end", "a very quite really rather boring film and plot"]
    theirs = model.encode(texts)
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    rc = main(["embed", str(tmp_path / "st"), "--file", str(tmp_path / "texts.txt"), "--precision", "fp32"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    ours = np.array([json.loads(line)["embedding"] for line in captured.out.splitlines()])
    cos = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cos.min() >= 0.99999, cos


def test_a_small_position_table_caps_the_default_length_and_the_padding(tmp_path, capsys):
    """A RoBERTa-style model with a 72-slot table takes 70 pieces: finetune's default --max-length (128) is capped
    there, and batches rounded up to a multiple of 8 stop at 70 instead of reaching 72 (both refused before)."""
    d = family_dir(tmp_path / "clf", "xlm-roberta")
    assert json.loads((d / "config.json").read_text())["max_position_embeddings"] == 72
    long = " ".join(["the film was great and the plot was boring"] * 12)
    data = _jsonl(tmp_path / "train.jsonl", [{"text": long, "label": "pos" if i % 2 else "neg"} for i in range(8)])
    rc = main(["finetune", "--task", "classify", "--model", str(d), "--train", str(data), "--dev", str(data),
               "--out", str(tmp_path / "ft"), "--epochs", "1", "--no-progress", "--quiet"])
    assert rc == 0, capsys.readouterr().err[-500:]
    saved = json.loads(next((tmp_path / "ft").rglob("config.json")).read_text())
    assert saved["bertkit_task"]["max_length"] == 70
