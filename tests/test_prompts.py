"""sentence-transformers prompts (config_sentence_transformers.json) and SentenceTransformer.encode's call, at every
front door: `bertkit embed`, serve's TEI route, Predictor.encode / embed, the feature-extraction pipeline, and
`finetune --task embed` keeping them. The oracle is sentence-transformers itself."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from bertkit.cli import main as cli
from bertkit.errors import BertkitError, CheckpointError
from bertkit.infer import Predictor

st = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.modules import Dense, Normalize, Transformer          # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling                # noqa: E402

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "what is the capital of France?",
         "x", "A man is playing a guitar on stage while people watch."]
PROMPTS = {"query": "query: ", "passage": "passage: ", "classify": "Represent the sentence for classification: "}


def _cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, minilm_dir):
    """A random 2-layer BERT with MiniLM's vocabulary, saved by bertkit (HF format)."""
    from bertkit import BertConfig, BertModel, Tokenizer
    torch.manual_seed(0)
    tok = Tokenizer.from_pretrained(minilm_dir)
    cfg = BertConfig.preset("tiny", vocab_size=tok.vocab_size, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
    d = tmp_path_factory.mktemp("tiny-encoder")
    BertModel(cfg).save_pretrained(d, tokenizer=tok)
    return d


def _st_model(encoder_dir, out, mode="mean", include_prompt=True, default=None, dense=False, normalize=False,
              max_seq_length=64):
    """A SentenceTransformer built on `encoder_dir` with PROMPTS, saved to `out`; returns the model."""
    word = Transformer(str(encoder_dir), max_seq_length=max_seq_length)
    dim = word.get_embedding_dimension()
    modules = [word, Pooling(dim, pooling_mode=mode, include_prompt=include_prompt)]
    if dense:
        torch.manual_seed(1)
        modules.append(Dense(dim, 24, activation_function=torch.nn.Tanh()))
    if normalize:
        modules.append(Normalize())
    model = st.SentenceTransformer(modules=modules, prompts=PROMPTS, default_prompt_name=default, device="cpu")
    model.save(str(out))
    return model


CASES = [("mean", True, None), ("mean", True, "query"), ("mean", False, None), ("mean", False, "passage"),
         ("weightedmean", False, "query"), ("cls", False, None), ("max", False, "classify"),
         ("lasttoken", False, None)]


@pytest.mark.parametrize("mode,include_prompt,default", CASES)
def test_predictor_encode_equals_sentence_transformers(encoder_dir, tmp_path, mode, include_prompt, default):
    model = _st_model(encoder_dir, tmp_path, mode, include_prompt, default)
    p = Predictor.load(tmp_path)
    for name in (None, "query", "passage", "classify"):
        theirs = model.encode(TEXTS, prompt_name=name)
        ours = p.encode(TEXTS, prompt_name=name)
        assert _cosines(ours, theirs).min() >= 0.99999, (name, _cosines(ours, theirs))
        assert np.abs(ours - theirs).max() < 1e-4
    literal = "Instruct: find the answer\nQuery: "
    assert _cosines(p.encode(TEXTS, prompt=literal), model.encode(TEXTS, prompt=literal)).min() >= 0.99999
    if not include_prompt or default:             # the prompt changed the vectors: it was not ignored
        assert _cosines(p.encode(TEXTS, prompt_name="query"), p.encode(TEXTS, prompt="")).min() < 0.9999


def test_cli_embed_and_serve_equal_sentence_transformers(encoder_dir, tmp_path, capsys):
    httpx = pytest.importorskip("httpx")
    from tests.test_serve_models import _serve
    model = _st_model(encoder_dir, tmp_path / "m", "mean", False, "query")
    for args, name in (([], "query"), (["--prompt-name", "passage"], "passage"), (["--prompt", ""], None)):
        assert cli(["embed", str(tmp_path / "m"), *TEXTS, "--out", str(tmp_path / "v.npy"), "--overwrite",
                    *args]) == 0
        theirs = model.encode(TEXTS, prompt_name=name) if name else model.encode(TEXTS, prompt="")
        assert _cosines(np.load(tmp_path / "v.npy"), theirs).min() >= 0.99999, args
    srv = _serve(Predictor.load(tmp_path / "m"))
    try:
        for body, name in (({}, "query"), ({"prompt_name": "passage"}, "passage"),
                           ({"truncation_direction": "Left"}, "query")):      # laid out as id rows, prompt left out
            got = httpx.post(f"{srv.url}/embed", json={"inputs": TEXTS, **body}, timeout=30)
            assert got.status_code == 200
            assert _cosines(got.json(), model.encode(TEXTS, prompt_name=name)).min() >= 0.99999, body
        got = httpx.post(f"{srv.url}/v1/embeddings", json={"input": TEXTS, "model": "m"}, timeout=30)
        vecs = [d["embedding"] for d in got.json()["data"]]
        assert _cosines(vecs, model.encode(TEXTS)).min() >= 0.99999     # the default prompt on the OpenAI route
        bad = httpx.post(f"{srv.url}/embed", json={"inputs": TEXTS, "prompt_name": "nope"}, timeout=30)
        assert bad.status_code == 422 and "nope" in bad.json()["error"]
    finally:
        srv.stop()
    capsys.readouterr()
    assert cli(["embed", str(tmp_path / "m"), "x", "--prompt-name", "nope"]) == 2
    assert "prompt name 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("setting", ["tokenizer_config", "tokenizer_args", "processor_kwargs"])
def test_left_truncation_cuts_the_prompt_and_still_skips_its_length(encoder_dir, tmp_path, setting):
    """A tokenizer that truncates from the left cuts a long text's prompt away, and sentence-transformers still
    leaves the first prompt-length tokens out of the pooling ([CLS] and the text's first pieces then): every door
    does the same, whichever file asks for the left side."""
    httpx = pytest.importorskip("httpx")
    from tests.test_serve_models import _serve
    _st_model(encoder_dir, tmp_path / "m", "mean", False, "classify", max_seq_length=16)
    config = tmp_path / "m" / ("tokenizer_config.json" if setting == "tokenizer_config" else
                               "sentence_bert_config.json")
    cfg = json.loads(config.read_text())
    cfg.update({"truncation_side": "left"} if setting == "tokenizer_config" else {setting: {"truncation_side": "left"}})
    config.write_text(json.dumps(cfg))
    model = st.SentenceTransformer(str(tmp_path / "m"), device="cpu")
    assert model[0].tokenizer.truncation_side == "left"
    texts = [" ".join(TEXTS[1:]), TEXTS[0]]                  # the first is cut, prompt and all; the second is whole
    theirs = model.encode(texts)
    assert _cosines(Predictor.load(tmp_path / "m").encode(texts), theirs).min() >= 0.99999
    assert cli(["embed", str(tmp_path / "m"), *texts, "--out", str(tmp_path / "v.npy")]) == 0
    assert _cosines(np.load(tmp_path / "v.npy"), theirs).min() >= 0.99999
    srv = _serve(Predictor.load(tmp_path / "m"))
    try:
        got = httpx.post(f"{srv.url}/embed", json={"inputs": texts, "truncate": True, "truncation_direction": "Left"},
                         timeout=30)
        assert got.status_code == 200 and _cosines(got.json(), theirs).min() >= 0.99999
    finally:
        srv.stop()
    model[0].tokenizer.truncation_side = "right"            # the prompt kept: other vectors, so the side was used
    assert _cosines(theirs, model.encode(texts))[0] < 0.9999


def test_encode_call_and_defaults_follow_the_model(encoder_dir, tmp_path):
    """max pooling + Dense, no Normalize: vectors as SentenceTransformer gives them, unnormalised; Normalize in the
    modules normalises; the ST options format the output."""
    model = _st_model(encoder_dir, tmp_path / "raw", "max", dense=True)
    p = Predictor.load(tmp_path / "raw")
    theirs, ours = model.encode(TEXTS), p.encode(TEXTS)
    assert ours.shape == theirs.shape == (len(TEXTS), 24) and ours.dtype == np.float32
    assert np.allclose(np.linalg.norm(ours, axis=1), np.linalg.norm(theirs, axis=1), atol=1e-5)
    assert np.linalg.norm(ours, axis=1).min() > 1.5                      # not unit vectors
    assert np.abs(p.embed(TEXTS) - ours).max() == 0                      # embed: the same defaults, the same path
    unit = p.encode(TEXTS, normalize_embeddings=True, batch_size=2, show_progress_bar=False)
    assert np.abs(unit - model.encode(TEXTS, normalize_embeddings=True)).max() < 1e-5
    tensor = p.encode(TEXTS, convert_to_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tensor.shape == (len(TEXTS), 24)
    listed = p.encode(TEXTS, convert_to_numpy=False)
    assert isinstance(listed, list) and all(isinstance(v, torch.Tensor) and v.shape == (24,) for v in listed)
    one = p.encode(TEXTS[0])
    assert one.shape == (24,) and np.abs(one - model.encode(TEXTS[0])).max() < 1e-5
    cut = p.encode(TEXTS, truncate_dim=8, normalize_embeddings=True)
    assert np.abs(cut - model.encode(TEXTS, truncate_dim=8, normalize_embeddings=True)).max() < 1e-5
    with pytest.raises(BertkitError, match="output_value"):
        p.encode(TEXTS, output_value="token_embeddings")
    with pytest.raises(BertkitError, match="prompt name 'nope'"):
        p.encode(TEXTS, prompt_name="nope")
    normed = _st_model(encoder_dir, tmp_path / "unit", "max", dense=True, normalize=True)
    q = Predictor.load(tmp_path / "unit")
    assert np.allclose(np.linalg.norm(q.encode(TEXTS), axis=1), 1.0, atol=1e-5)
    assert _cosines(q.encode(TEXTS), normed.encode(TEXTS)).min() >= 0.99999


def test_prompts_saved_back_and_refused_when_broken(encoder_dir, tmp_path):
    from bertkit.embed.st_format import load_sentence_encoder, save_sentence_encoder
    _st_model(encoder_dir, tmp_path / "m", "mean", False, "query")
    enc, tok = load_sentence_encoder(tmp_path / "m")
    assert enc.prompts.named["query"] == "query: " and enc.prompts.default_name == "query"
    assert not enc.pooling.include_prompt
    save_sentence_encoder(enc, tok, tmp_path / "again")
    again = st.SentenceTransformer(str(tmp_path / "again"), device="cpu")
    assert again.prompts["passage"] == "passage: " and again.default_prompt_name == "query"
    assert not again[1].include_prompt
    assert _cosines(enc.encode(tok, TEXTS), again.encode(TEXTS)).min() >= 0.99999
    cfg_path = tmp_path / "m" / "config_sentence_transformers.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["default_prompt_name"] = "missing"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="config_sentence_transformers.json: default_prompt_name 'missing'"):
        load_sentence_encoder(tmp_path / "m")


def test_feature_extraction_pipeline_takes_a_prompt(encoder_dir, tmp_path):
    from bertkit import pipeline
    _st_model(encoder_dir, tmp_path, "mean", True, "query")
    pipe = pipeline("feature-extraction", str(tmp_path))
    plain = pipe("hello world", return_tensors=True)                    # transformers' pipeline: no prompt
    prompted = pipe("hello world", prompt_name="query", return_tensors=True)
    literal = pipe("query: hello world", return_tensors=True)
    assert plain.shape[1] + 2 == prompted.shape[1] and torch.equal(prompted, literal)


def test_module_paths_outside_the_directory_are_refused(encoder_dir, tmp_path, capsys):
    _st_model(encoder_dir, tmp_path / "m", "mean")
    shutil.copytree(tmp_path / "m" / "1_Pooling", tmp_path / "outside_pool")
    spec = json.loads((tmp_path / "m" / "modules.json").read_text())
    spec[1]["path"] = "../outside_pool"
    (tmp_path / "m" / "modules.json").write_text(json.dumps(spec))
    capsys.readouterr()
    assert cli(["embed", str(tmp_path / "m"), "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "modules.json" in err and "'../outside_pool' leaves the model directory" in err
    with pytest.raises(CheckpointError, match="leaves the model directory"):
        Predictor.load(tmp_path / "m").embed(["hello"])


def _pairs(path):
    rows = [{"anchor": f"question {i} about {w}", "positive": f"the {w} answer {i}"}
            for i, w in enumerate(["rivers", "music", "oil", "football", "rain", "cities", "bread", "games"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_finetune_embed_keeps_the_models_prompts_and_saves_the_trained_ones(encoder_dir, tmp_path, capsys):
    _st_model(encoder_dir, tmp_path / "m", "mean", False, "query")
    pairs = _pairs(tmp_path / "pairs.jsonl")
    args = ["finetune", "--task", "embed", "--model", tmp_path / "m", "--train", pairs, "--dev", pairs,
            "--batch-size", "4", "--lr", "1e-3", "--epochs", "1", "--pooling", "mean", "--quiet"]
    assert cli([str(a) for a in [*args, "--out", tmp_path / "kept"]]) == 0
    saved = st.SentenceTransformer(str(tmp_path / "kept"), device="cpu")
    assert saved.prompts["query"] == "query: " and saved.default_prompt_name == "query"
    assert saved.prompts["passage"] == "passage: " and not saved[1].include_prompt
    p = Predictor.load(tmp_path / "kept")
    assert _cosines(p.encode(TEXTS, prompt_name="passage"), saved.encode(TEXTS, prompt_name="passage")).min() >= 0.99999
    trained = '{"anchor": "search_query: ", "positive": "search_document: "}'
    assert cli([str(a) for a in [*args, "--out", tmp_path / "run", "--prompts", trained]]) == 0
    saved = st.SentenceTransformer(str(tmp_path / "run"), device="cpu")
    assert saved.prompts["query"] == "search_query: " and saved.prompts["document"] == "search_document: "
    assert _cosines(Predictor.load(tmp_path / "run").encode(TEXTS), saved.encode(TEXTS)).min() >= 0.99999
    capsys.readouterr()
    assert cli([str(a) for a in [*args, "--out", tmp_path / "bad", "--prompts", '{"query": "q: "}']]) == 2
    assert "--prompts: column 'query' is not one of" in capsys.readouterr().err


def test_training_batches_are_prompted_as_sentence_transformers_collates(encoder_dir, tmp_path):
    """The trainer's columns with their prompts: the same pieces, and the prompt left out of the pooling, as
    SentenceTransformer.preprocess / forward."""
    from bertkit.embed.losses import MultipleNegativesRankingLoss
    from bertkit.embed.runner import training_prompts
    from bertkit.embed.st_format import load_sentence_encoder
    from bertkit.embed.train import EmbedDataset, EmbedModel
    model = _st_model(encoder_dir, tmp_path / "m", "mean", False)
    enc, tok = load_sentence_encoder(tmp_path / "m")
    data = EmbedDataset.read(_pairs(tmp_path / "pairs.jsonl"))
    batches = data.batches(enc, tok, 4, shuffle=False)
    batches.prompts = training_prompts('{"anchor": "query: "}', data.columns, "pairs.jsonl")
    batch = batches.collate([0, 1, 2, 3])
    theirs = model.preprocess([t[0] for t in data.texts[:4]], prompt="query: ")
    assert torch.equal(batch["anchor.input_ids"], theirs["input_ids"])
    assert batch["anchor.prompt_length"].tolist() == [theirs["prompt_length"]] * 4
    assert "positive.prompt_length" not in batch
    ours = EmbedModel(enc, MultipleNegativesRankingLoss()).eval()(
        **{f: batch[f"anchor.{f}"] for f in ("input_ids", "token_type_ids", "attention_mask", "prompt_length")})
    with torch.no_grad():
        want = model(theirs)["sentence_embedding"]
    assert torch.allclose(ours, want, atol=1e-5)
    assert training_prompts("p: ", data.columns, "x") == {"anchor": "p: ", "positive": "p: "}
