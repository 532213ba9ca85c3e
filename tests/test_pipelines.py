"""bertkit.pipeline against transformers.pipeline on tiny models transformers saved (same keys, types, top answers
and labels; scores within 1e-4), question-answering against a reference built on transformers' tokenizer windows
(transformers 5 has no such pipeline), feature-extraction on the real MiniLM; bertkit.load picks the class."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import bertkit
from bertkit import Tokenizer
from bertkit.errors import BertkitError, ConfigError

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ("the a an man woman is are was eating drinking food bread water piece of in on at to and paris london "
         "capital city france england river big small good bad film great movie loved hated it this that very "
         "john mary lives works where who ##s ##ing ##ed cap ##ital . , ! ? '").split()
VOCAB = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)}
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _save(root, name, cls, **cfg):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                     initializer_range=0.3, **cfg)
    cls(config).eval().save_pretrained(root / name)
    Tokenizer(VOCAB).save(root / name)
    return str(root / name)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipelines")
    return {"mlm": _save(root, "mlm", transformers.BertForMaskedLM),
            "clf": _save(root, "clf", transformers.BertForSequenceClassification,
                         id2label={0: "NEG", 1: "POS", 2: "NEU"}, label2id={"NEG": 0, "POS": 1, "NEU": 2}),
            "tag": _save(root, "tag", transformers.BertForTokenClassification, id2label=dict(enumerate(TAGS)),
                         label2id={t: i for i, t in enumerate(TAGS)}),
            "qa": _save(root, "qa", transformers.BertForQuestionAnswering)}


def _same(ours, theirs, where="result"):
    """Same structure, keys, strings and ints; floats within 1e-4 (ours a Python float, theirs may be numpy)."""
    if isinstance(theirs, (float, np.floating)):
        assert type(ours) is float, (where, type(ours))
        assert abs(ours - float(theirs)) <= 1e-4, (where, ours, theirs)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), (where, ours, theirs)
        for k in theirs:
            _same(ours[k], theirs[k], f"{where}[{k!r}]")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), (where, ours, theirs)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert type(ours) is type(theirs) and ours == theirs, (where, ours, theirs)


def _pair(task, directory, **options):
    return bertkit.pipeline(task, directory, **options), transformers.pipeline(task, model=directory, **options)


@pytest.mark.parametrize("call", [
    ("the man is [MASK] food .", {}),
    ("the man is [MASK] food .", {"top_k": 3}),
    ("the [MASK] is eating [MASK] .", {}),
    (["the man is [MASK] food .", "[MASK] lives in paris"], {"top_k": 2}),
    (["the [MASK] of france"], {}),
    ("the man is [MASK] food .", {"targets": ["bread", "water", "man"]}),
])
def test_fill_mask_matches_transformers(dirs, call):
    inputs, options = call
    ours, theirs = _pair("fill-mask", dirs["mlm"])
    _same(ours(inputs, **options), theirs(inputs, **options))


@pytest.mark.parametrize("call", [
    ("great film", {}),
    ("great film", {"top_k": None}),
    ("great film", {"top_k": 2}),
    (["great film", "a bad movie !"], {}),
    (["great film", "a bad movie !"], {"top_k": None}),
    ({"text": "the film", "text_pair": "it was great"}, {}),
    ("great film", {"function_to_apply": "sigmoid", "top_k": 1}),
])
def test_text_classification_matches_transformers(dirs, call):
    inputs, options = call
    ours, theirs = _pair("text-classification", dirs["clf"])
    _same(ours(inputs, **options), theirs(inputs, **options))


def test_text_classification_defaults_given_to_pipeline(dirs):
    ours, theirs = _pair("text-classification", dirs["clf"], top_k=None)
    _same(ours("great film"), theirs("great film"))
    _same(ours(["great film", "bad"]), theirs(["great film", "bad"]))


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_token_classification_matches_transformers(dirs, strategy):
    # "Zorglub" is not in the vocab ([UNK], shown as written), "capitals" splits into cap ##ital ##s
    texts = ["John lives in Paris, the capitals of France.", "Mary works in Zorglub city !", "the big river"]
    ours, theirs = _pair("token-classification", dirs["tag"], aggregation_strategy=strategy)
    for text in texts:
        _same(ours(text), theirs(text))
    _same(ours(texts), theirs(texts))
    _same(ours(texts[0], ignore_labels=[]), theirs(texts[0], ignore_labels=[]))


def test_feature_extraction_matches_transformers(dirs):
    ours, theirs = _pair("feature-extraction", dirs["mlm"])
    _same(ours("the man is eating food ."), theirs("the man is eating food ."))
    _same(ours(["paris", "the big river in london"]), theirs(["paris", "the big river in london"]))
    assert ours("paris", return_tensors=True).shape == (1, 3, 32)


def test_feature_extraction_on_minilm(minilm_dir):
    texts = ["A man is eating food.", "The girl is carrying a baby in the park, near the river."]
    ours, theirs = _pair("feature-extraction", str(minilm_dir))
    _same(ours(texts), theirs(texts))


# ---------------------------------------------------------------------------------------------- question answering
def _reference_qa(directory, question, context, max_seq_len=384, doc_stride=128, max_answer_len=15, top_k=1):
    """transformers 4.x's QA pipeline rule on transformers' own tokenizer windows, spelt out span by span."""
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.BertForQuestionAnswering.from_pretrained(directory).eval()
    enc = tok(question, context, truncation="only_second", max_length=max_seq_len, stride=doc_stride,
              return_overflowing_tokens=True, return_offsets_mapping=True, padding="longest", return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"],
                    attention_mask=enc["attention_mask"])
    final = enc.sequence_ids(len(enc["input_ids"]) - 1)
    last = enc["offset_mapping"][-1][max(i for i, s in enumerate(final) if s == 1)]       # the last context token
    if int(last[1]) < len(context.rstrip()):
        # tokenizers 0.23.2 returned only the first two overflow windows; the oracle cannot judge the rest
        pytest.skip(f"tokenizers {tokenizers.__version__}: its windows stop at character {int(last[1])} of "
                    f"{len(context)}, the oracle is broken")
    answers = {}
    for w in range(len(enc["input_ids"])):
        seq = enc.sequence_ids(w)
        ok = torch.tensor([i == 0 or s == 1 for i, s in enumerate(seq)])
        ps = torch.softmax(torch.where(ok, out.start_logits[w], torch.tensor(-10000.0)), -1)
        pe = torch.softmax(torch.where(ok, out.end_logits[w], torch.tensor(-10000.0)), -1)
        spans = [(float(ps[s] * pe[e]), s, e) for s in range(1, len(seq)) for e in range(s, len(seq))
                 if seq[s] == 1 and seq[e] == 1 and e - s < max_answer_len]
        for score, s, e in sorted(spans, key=lambda x: -x[0])[:top_k]:
            start = enc[w].word_to_chars(enc[w].token_to_word(s), sequence_index=1)[0]
            end = enc[w].word_to_chars(enc[w].token_to_word(e), sequence_index=1)[1]
            key = context[start:end].lower()
            prev = answers.get(key, {"score": 0.0})["score"]
            answers[key] = {"score": prev + score, "start": start, "end": end, "answer": context[start:end]}
    return sorted(answers.values(), key=lambda a: -a["score"])[:top_k]


CONTEXT = ("John lives in Paris, the capital of France. Mary works in London, a big city on a river. "
           "The woman was drinking water and eating bread in the city.")


def test_question_answering_matches_the_reference(dirs):
    qa = bertkit.pipeline("question-answering", dirs["qa"])
    got = qa(question="where does john live ?", context=CONTEXT)
    want = _reference_qa(dirs["qa"], "where does john live ?", CONTEXT)
    _same(got, want[0])
    assert got["answer"] == CONTEXT[got["start"]:got["end"]]
    _same(qa({"question": "who works in london ?", "context": CONTEXT}, top_k=3),
          _reference_qa(dirs["qa"], "who works in london ?", CONTEXT, top_k=3))
    both = qa(question=["where does john live ?", "who works ?"], context=CONTEXT)
    assert isinstance(both, list) and len(both) == 2 and set(both[0]) == {"score", "start", "end", "answer"}
    _same(qa("where does john live ?", CONTEXT), got)


def test_question_answering_windows_match_transformers_tokenizer(dirs):
    """A context longer than max_seq_len: windows overlapping by doc_stride, answers merged across them."""
    qa = bertkit.pipeline("question-answering", dirs["qa"], max_seq_len=24, doc_stride=8)
    for question in ("where does john live ?", "who was drinking water ?"):
        for k in (1, 4):
            got = qa(question=question, context=CONTEXT, top_k=k)
            want = _reference_qa(dirs["qa"], question, CONTEXT, max_seq_len=24, doc_stride=8, top_k=k)
            _same(got, want[0] if k == 1 else want)


def test_question_answering_impossible_answer_and_errors(dirs):
    qa = bertkit.pipeline("question-answering", dirs["qa"])
    answers = qa(question="who ?", context=CONTEXT, top_k=200, handle_impossible_answer=True)
    empty = [a for a in answers if a["answer"] == ""]            # the no-answer: p_start([CLS]) * p_end([CLS])
    assert len(empty) == 1 and (empty[0]["start"], empty[0]["end"]) == (0, 0) and 0 < empty[0]["score"] < 1
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    with pytest.raises(BertkitError, match="max_seq_len=8"):
        qa(question="where does john live in the city ?", context=CONTEXT, max_seq_len=8)
    with pytest.raises(BertkitError, match="question and context"):
        qa(question="", context=CONTEXT)


# ---------------------------------------------------------------------------------------------- entry points
def test_pipeline_errors_name_the_problem(dirs):
    with pytest.raises(ConfigError, match="summarization"):
        bertkit.pipeline("summarization", dirs["mlm"])
    with pytest.raises(BertkitError, match="mlm head"):
        bertkit.pipeline("fill-mask", dirs["clf"])
    with pytest.raises(ConfigError, match="unknown option.*topk"):
        bertkit.pipeline("fill-mask", dirs["mlm"], topk=3)
    with pytest.raises(BertkitError, match=r"no \[MASK\]"):
        bertkit.pipeline("fill-mask", dirs["mlm"])("no mask here")
    with pytest.raises(ConfigError, match="aggregation_strategy='sum'"):
        bertkit.pipeline("ner", dirs["tag"], aggregation_strategy="sum")("paris")
    assert bertkit.pipeline("sentiment-analysis", dirs["clf"])("great")[0]["label"] in {"NEG", "POS", "NEU"}


def test_load_picks_the_class_from_architectures(dirs, tmp_path, caplog):
    from bertkit import BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification, BertModel
    assert type(bertkit.load(dirs["mlm"])) is BertForMaskedLM
    assert type(bertkit.load(dirs["qa"])) is BertForQuestionAnswering
    clf = bertkit.load(dirs["clf"], dtype="bfloat16")
    assert type(clf) is BertForSequenceClassification and clf.config.id2label == {0: "NEG", 1: "POS", 2: "NEU"}
    assert next(clf.parameters()).dtype == torch.bfloat16
    torch.manual_seed(0)
    transformers.BertForMultipleChoice(transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64)).save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertkit.auto"):
        model = bertkit.load(tmp_path)
    assert type(model) is BertModel
    assert "BertForMultipleChoice" in caplog.text and "loading BertModel" in caplog.text
