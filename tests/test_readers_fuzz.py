"""Every reader of a user's file, fed arbitrary bytes and malformed structures: the result is valid, or one
BertkitError line, never another exception (a traceback). Readers: task files (CSV / TSV / JSONL / CoNLL / SQuAD),
config.json, vocab.txt / tokenizer.json / tokenizer_config.json, model.safetensors.index.json and weights files,
pretraining shard manifests and corpora, embedding index manifests.

Bounded: FUZZ_EXAMPLES examples per property (env BERTKIT_FUZZ_EXAMPLES, default 60), no deadline.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bertkit.errors import BertkitError  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("BERTKIT_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=not os.environ.get("BERTKIT_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# JSON values of every kind, nested a little
_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
            | st.text(max_size=12) | st.sampled_from(["", "0", "-1", "[UNK]", "WordPiece", "../x", "/etc/passwd"]))
JSON = st.recursive(_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                    max_leaves=12)
# text that looks like a task file: separators, quotes, braces, newlines, odd code points
_chars = st.sampled_from(list("ab \t,;\"'{}[]:\n\r\\|-0123456789.") + ["\x00", "\ufeff", "\u2028", "é", "\udcff"])
TEXTISH = st.lists(_chars, max_size=200).map("".join)


def _write(path: Path, data) -> Path:
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    path.write_bytes(data)
    return path


def _one_line_or_ok(fn, *args, **kwargs):
    """Call fn; a BertkitError must be one line; any other exception fails the test."""
    try:
        return fn(*args, **kwargs)
    except BertkitError as e:
        assert "\n" not in str(e), str(e)
        return None


def _mutate(template, draw, depth=0):
    """`template` with some leaves / members replaced by arbitrary JSON, deleted, or kept."""
    if isinstance(template, dict):
        out = {}
        for k, v in template.items():
            choice = draw(st.integers(0, 9))
            if choice == 0:
                continue                                   # member dropped
            out[k] = draw(JSON) if choice == 1 else _mutate(v, draw, depth + 1)
        return out
    if isinstance(template, list):
        items = [_mutate(v, draw, depth + 1) for v in template]
        return items if draw(st.integers(0, 5)) else draw(JSON)
    return draw(JSON) if draw(st.integers(0, 3)) == 0 else template


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _fresh(work: Path, name: str) -> Path:
    d = work / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    return d


# ------------------------------------------------------------------------------------------------ task files
@FUZZ
@given(data=st.binary(max_size=400) | TEXTISH, ext=st.sampled_from(["csv", "tsv", "jsonl", "csv.gz"]),
       require_label=st.booleans())
def test_table_reader(work, data, ext, require_label):
    from bertkit.tasks.readers import read_table
    path = _write(work / f"t.{ext}", data)
    rows = _one_line_or_ok(read_table, path, require_label=require_label)
    for r in rows or []:
        assert isinstance(r.text, str) and r.text.strip()


@FUZZ
@given(rows=st.lists(st.dictionaries(st.sampled_from(["text", "text_pair", "label", "x"]), JSON, max_size=4),
                     max_size=4) | st.lists(JSON, max_size=3))
def test_jsonl_reader_structures(work, rows):
    from bertkit.tasks.readers import read_table
    path = _write(work / "s.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    _one_line_or_ok(read_table, path)


@FUZZ
@given(data=st.binary(max_size=400) | TEXTISH)
def test_conll_reader(work, data):
    from bertkit.tasks.readers import read_conll
    _one_line_or_ok(read_conll, _write(work / "c.conll", data))


_SQUAD = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.", "qas": [
    {"id": "q1", "question": "Where?", "answers": [{"text": "France", "answer_start": 12}], "is_impossible": False},
    {"id": "q2", "question": "Who?", "answers": [], "is_impossible": True}]}]}]}


@FUZZ
@given(data=st.data())
def test_squad_reader(work, data):
    from bertkit.tasks.readers import read_squad
    doc = data.draw(st.just(_SQUAD).map(lambda t: t) | JSON | st.binary(max_size=200), label="kind")
    if doc is _SQUAD:
        doc = _mutate(_SQUAD, data.draw)
    raw = doc if isinstance(doc, bytes) else json.dumps(doc)
    for require in (True, False):
        _one_line_or_ok(read_squad, _write(work / "q.json", raw), require_answers=require)


# ------------------------------------------------------------------------------------------------ model files
_CONFIG = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "intermediate_size": 64, "max_position_embeddings": 64, "type_vocab_size": 2, "hidden_act": "gelu",
           "layer_norm_eps": 1e-12, "id2label": {"0": "a", "1": "b"}, "label2id": {"a": 0, "b": 1},
           "classifier_dropout": None, "problem_type": None, "architectures": ["BertModel"], "torch_dtype": "float32"}


@FUZZ
@given(data=st.data())
def test_config_readers(work, data):
    from bertkit.config import read_config
    from bertkit.config import BertConfig
    kind = data.draw(st.integers(0, 2))
    raw = (data.draw(st.binary(max_size=200)) if kind == 0 else json.dumps(data.draw(JSON)) if kind == 1
           else json.dumps(_mutate(_CONFIG, data.draw)))
    d = _fresh(work, "cfg")
    _write(d / "config.json", raw)
    _one_line_or_ok(BertConfig.from_json, d / "config.json")
    _one_line_or_ok(read_config, d, {})


def _vocab_text(extra: list[str]) -> str:
    return "".join(t + "\n" for t in SPECIALS + ["a", "b", "##c"] + extra)


@FUZZ
@given(vocab=st.binary(max_size=300) | st.lists(TEXTISH, max_size=5).map(_vocab_text))
def test_vocab_txt(work, vocab):
    from bertkit.tokenizer import Tokenizer
    d = _fresh(work, "vocab")
    _write(d / "vocab.txt", vocab)
    tok = _one_line_or_ok(Tokenizer.from_pretrained, d)
    if tok is not None:
        assert tok.convert_ids_to_tokens(tok.encode("a b c"))


def _tokenizer_json() -> dict:
    from bertkit.tokenizer.hfjson import tokenizer_json
    vocab = {t: i for i, t in enumerate(SPECIALS + ["a", "b", "##c"])}
    return tokenizer_json(vocab, lowercase=True, strip_accents=None)


@FUZZ
@given(data=st.data())
def test_tokenizer_json_and_config(work, data):
    from bertkit.tokenizer import Tokenizer
    d = _fresh(work, "tokjson")
    kind = data.draw(st.integers(0, 2))
    tj = (data.draw(st.binary(max_size=200)) if kind == 0 else json.dumps(data.draw(JSON)) if kind == 1
          else json.dumps(_mutate(_tokenizer_json(), data.draw)))
    _write(d / "tokenizer.json", tj)
    if data.draw(st.booleans()):
        cfg = {"do_lower_case": True, "model_max_length": 512, "unk_token": "[UNK]", "strip_accents": None,
               "tokenize_chinese_chars": True}
        _write(d / "tokenizer_config.json", json.dumps(_mutate(cfg, data.draw)))
    if data.draw(st.booleans()):
        _write(d / "special_tokens_map.json", json.dumps(_mutate({"mask_token": "[MASK]", "pad_token": "[PAD]"},
                                                                 data.draw)))
    tok = _one_line_or_ok(Tokenizer.from_pretrained, d)
    if tok is not None:
        tok("a b c")


@FUZZ
@given(data=st.data())
def test_weights_and_shard_index(work, data):
    from bertkit.checkpoint import read_weights
    d = _fresh(work, "weights")
    kind = data.draw(st.sampled_from(["index", "safetensors", "bin"]))
    if kind == "index":
        index = data.draw(JSON | st.builds(lambda m: {"weight_map": m},
                                           st.dictionaries(st.text(max_size=6), JSON, max_size=4)))
        _write(d / "model.safetensors.index.json", json.dumps(index))
        _write(d / "a.safetensors", data.draw(st.binary(max_size=100)))
    else:
        name = "model.safetensors" if kind == "safetensors" else "pytorch_model.bin"
        _write(d / name, data.draw(st.binary(max_size=300)))
    _one_line_or_ok(read_weights, d)


# ------------------------------------------------------------------------------------------------ pretraining
@pytest.fixture(scope="module")
def shard_template(work) -> dict:
    """A real manifest (from a tiny build), the template the mutations start from."""
    from bertkit.pretraining import PrepareConfig, prepare
    corpus = work / "corpus.txt"
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    corpus.write_text("\n\n".join(" ".join(words[(i + j) % 8] for j in range(12)) + ". " +
                                  " ".join(words[(i * 3 + j) % 8] for j in range(9)) + "." for i in range(40)))
    vocab = work / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in SPECIALS + words + ["."]))
    out = work / "shards"
    prepare(PrepareConfig(corpus, vocab, out, seq_len=16, task="nsp", masking="token", examples_per_shard=20))
    return json.loads((out / "manifest.json").read_text())


@FUZZ
@given(data=st.data())
def test_shard_manifest(work, shard_template, data):
    from bertkit.pretraining import ShardReader
    src = work / "shards"
    d = _fresh(work, "shards-fuzz")
    for f in src.iterdir():
        if f.name != "manifest.json":
            shutil.copy(f, d / f.name)
    kind = data.draw(st.integers(0, 3))
    raw = (data.draw(st.binary(max_size=200)) if kind == 0 else json.dumps(data.draw(JSON)) if kind == 1
           else json.dumps(_mutate(shard_template, data.draw)))
    _write(d / "manifest.json", raw)
    if kind == 3:                                  # the manifest intact, a shard file damaged instead
        _write(d / "manifest.json", json.dumps(shard_template))
        victim = data.draw(st.sampled_from(sorted(p.name for p in d.iterdir() if p.suffix in (".npy", ".json")
                                                  and p.name != "manifest.json")))
        _write(d / victim, data.draw(st.binary(max_size=300)))
    reader = _one_line_or_ok(ShardReader, d, 4, verify="size")
    if reader is not None:
        _one_line_or_ok(lambda: next(iter(reader)))


@FUZZ
@given(data=st.binary(max_size=500) | TEXTISH, fmt=st.sampled_from(["auto", "prose", "lines"]))
def test_corpus_reader(work, data, fmt):
    from bertkit.pretraining.corpus import FORMATS, iter_documents
    if fmt not in FORMATS:
        fmt = "auto"
    path = _write(work / "corpus-fuzz.txt", data)
    docs = _one_line_or_ok(lambda: list(iter_documents(path, fmt=fmt)))
    for doc in docs or []:
        assert all(isinstance(s, str) and s for s in doc.sentences)


# ------------------------------------------------------------------------------------------------ embedding index
@pytest.fixture(scope="module")
def index_template(work) -> dict:
    import numpy as np
    from bertkit.embed.index import write_index
    write_index(work / "index", np.eye(4, 8, dtype=np.float32), ["a", "b", "c", "d"], model_hash="m")
    return json.loads((work / "index" / "manifest.json").read_text())


@FUZZ
@given(data=st.data())
def test_embedding_index_manifest(work, index_template, data):
    import numpy as np
    from bertkit.embed.index import EmbeddingIndex
    d = _fresh(work, "index-fuzz")
    for f in (work / "index").iterdir():
        shutil.copy(f, d / f.name)
    kind = data.draw(st.integers(0, 2))
    raw = (data.draw(st.binary(max_size=200)) if kind == 0 else json.dumps(data.draw(JSON)) if kind == 1
           else json.dumps(_mutate(index_template, data.draw)))
    _write(d / "manifest.json", raw)
    index = _one_line_or_ok(EmbeddingIndex.open, d)
    if index is not None:
        _one_line_or_ok(index.search, np.ones((1, index.dim), dtype=np.float32), k=2)


# ------------------------------------------------------------------------------------------------ named regressions
def test_non_utf8_task_files_name_file_and_line(tmp_path):
    from bertkit.tasks.readers import read_conll, read_squad, read_table
    from bertkit.errors import DataError
    bad = b"text,label\nfine,pos\ncaf\xe9,neg\n"
    for name, read in (("t.csv", read_table), ("t.conll", read_conll), ("t.json", read_squad)):
        path = _write(tmp_path / name, bad)
        with pytest.raises(DataError, match=rf"{path}:3: not UTF-8 text \(byte 0xe9"):
            read(path)


def test_shard_manifest_file_outside_the_directory_refused(work, shard_template):
    from bertkit.errors import DataError
    from bertkit.pretraining import ShardReader
    d = _fresh(work, "shards-escape")
    for f in (work / "shards").iterdir():
        shutil.copy(f, d / f.name)
    m = json.loads(json.dumps(shard_template))
    m["shards"][0]["files"]["tokens"]["file"] = "../shards/" + m["shards"][0]["files"]["tokens"]["file"]
    _write(d / "manifest.json", json.dumps(m))
    with pytest.raises(DataError, match="is not a file name in the shard directory"):
        ShardReader(d, 4)
