"""What OpenAI and text-embeddings-inference clients send, answered as those servers answer it: `dimensions`
(Matryoshka), token-id inputs, TEI's truncation_direction / normalize / /embed_all / /decode, each API's error shape;
and the routing a client meets: /docs, trailing slashes, HEAD, content types, /health without the model's path."""

from __future__ import annotations

import base64
import os

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from bertkit.serve import ServeConfig, ServerThread, absent_routes, make_app, model_endpoints, model_info  # noqa: E402
from test_serve_models import _save, _serve  # noqa: E402

LONG = "who ? " + "the cat sat " * 100          # 302 pieces; the server reads 256 tokens (254 pieces)
TAIL = "cat sat " + "the cat sat " * 84         # its last 254 pieces


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from bertkit.infer import Predictor
    pred = Predictor.load(_save(tmp_path_factory.mktemp("clients") / "mlm", "BertForMaskedLM"))
    srv = _serve(pred)
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield pred, srv, client
    srv.stop()


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


# --------------------------------------------------------------------------------------------------------- OpenAI

def test_openai_dimensions_are_the_first_k_components_renormalised(served):
    openai = pytest.importorskip("openai")
    pred, srv, _ = served
    texts = ["the cat sat .", "a dog sat on the mat ."]
    full = pred.embed(texts, normalize=True).astype(np.float64)
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    for k in (1, 8, 17, pred.embedding_dim):
        for fmt in ("float", "base64"):        # the client decodes base64 itself
            res = client.embeddings.create(model="m", input=texts, dimensions=k, encoding_format=fmt)
            got = np.array([d.embedding for d in res.data])
            if fmt == "base64":
                got = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in res.data])
            assert got.shape == (2, k) and np.abs(got - _unit(full[:, :k])).max() < 1e-6, (k, fmt)
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="m", input="the", dimensions=pred.embedding_dim + 1)
    assert e.value.param == "dimensions" and e.value.type == "invalid_request_error"
    assert f"this model's {pred.embedding_dim}" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="m", input="the", dimensions=0)
    assert e.value.param == "dimensions"


def test_openai_error_shape_on_every_v1_route(served):
    _, _, client = served
    cases = [("POST", "/v1/embeddings", {"json": {"input": 5, "model": "m"}}, 400, "input"),
             ("POST", "/v1/embeddings", {"json": {"input": "the"}}, 400, "model"),
             ("POST", "/v1/embeddings", {"json": {"input": "the", "model": "m", "dims": 3}}, 400, "dims"),
             ("POST", "/v1/embeddings", {"json": {"input": ["   "], "model": "m"}}, 400, "input"),
             ("POST", "/v1/embeddings", {"content": b"{nope"}, 400, None),
             ("POST", "/v1/embeddings", {"content": b"{}", "headers": {"content-type": "text/plain"}}, 415, None),
             ("GET", "/v1/embeddings", {}, 405, None),
             ("POST", "/v1/chat/completions", {"json": {}}, 404, None)]
    for method, path, kw, status, param in cases:
        resp = client.request(method, path, **kw)
        body = resp.json()
        assert resp.status_code == status and set(body) == {"error"}, (path, kw, body)
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"], body
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == param, body


def test_openai_token_id_inputs(served):
    openai = pytest.importorskip("openai")
    pred, srv, _ = served
    texts = ["the cat sat .", "who sat on the mat ?"]
    ids = [pred.tokenizer.encode(t) for t in texts]
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    for given in (ids, ids[0]):           # a list of id lists, or one list of ids
        res = client.embeddings.create(model="m", input=given, encoding_format="float")
        got = np.array([d.embedding for d in res.data])
        ref = pred.embed(texts[:len(got)], normalize=True)
        assert np.abs(got - ref).max() < 1e-5 and res.usage.prompt_tokens == sum(map(len, ids[:len(got)]))
    with pytest.raises(openai.BadRequestError, match="token id 99"):
        client.embeddings.create(model="m", input=[[2, 99, 3]])


# ------------------------------------------------------------------------------------ text-embeddings-inference

def test_tei_truncation_direction_and_normalize(served):
    pred, _, client = served

    def embed(**body):
        resp = client.post("/embed", json={"inputs": [LONG], "truncate": True, **body})
        assert resp.status_code == 200, resp.text
        return np.array(resp.json())
    right, left = embed(), embed(truncation_direction="Left")
    assert np.abs(embed(truncation_direction="Right") - right).max() == 0
    assert np.abs(right - pred.embed([LONG], normalize=True)).max() < 1e-5  # Right keeps the start
    assert np.abs(left - pred.embed([TAIL], normalize=True)).max() < 1e-5  # Left keeps the end
    assert np.abs(left - right).max() > 1e-3
    raw = embed(truncation_direction="Left", normalize=False)
    assert np.abs(raw - pred.embed([TAIL], normalize=False)).max() < 1e-5 and abs(np.linalg.norm(raw) - 1) > 1e-3
    resp = client.post("/embed", json={"inputs": [LONG], "truncation_direction": "Left"})     # no cut unasked
    assert resp.status_code == 422 and "truncate" in resp.json()["error"]
    resp = client.post("/embed", json={"inputs": "a", "truncation_direction": "left"})        # TEI's spelling only
    assert resp.status_code == 422 and "truncation_direction" in resp.json()["error"]
    # TEI's `dimensions` too: the first k components, normalised only when asked
    full = pred.embed(["the cat"], normalize=False)
    got = np.array(client.post("/embed", json={"inputs": "the cat", "dimensions": 5}).json())
    assert np.abs(got - _unit(full[:, :5])).max() < 1e-6
    got = np.array(client.post("/embed", json={"inputs": "the cat", "dimensions": 5, "normalize": False}).json())
    assert np.abs(got - full[:, :5]).max() < 1e-5
    resp = client.post("/embed", json={"inputs": "the", "dimensions": pred.embedding_dim + 1})
    assert resp.status_code == 422 and resp.json()["error_type"] == "Validation"


def test_tei_token_id_inputs(served):
    pred, _, client = served
    texts = ["the cat sat .", "a dog"]
    ids = [pred.tokenizer.encode(t) for t in texts]
    ref = pred.embed(texts, normalize=True)
    for inputs, want in ((ids[0], ref[:1]), (ids, ref), ([ids[0], texts[1]], ref)):    # mixed with texts too
        resp = client.post("/embed", json={"inputs": inputs})
        assert resp.status_code == 200 and np.abs(np.array(resp.json()) - want).max() < 1e-5, inputs
    long = pred.tokenizer.encode(LONG)                                   # 304 ids: past 256, cut from either end
    assert client.post("/embed", json={"inputs": [long]}).status_code == 422
    right = client.post("/embed", json={"inputs": [long], "truncate": True}).json()
    left = client.post("/embed", json={"inputs": [long], "truncate": True, "truncation_direction": "Left"}).json()
    assert np.abs(np.array(right) - pred.embed_ids([long[:256]], normalize=True)).max() < 1e-5
    assert np.abs(np.array(left) - pred.embed_ids([long[-256:]], normalize=True)).max() < 1e-5
    for bad, status, words in (([[2, 5000, 3]], 422, "token id 5000"), ([[2, -1, 3]], 422, "negative"),
                               ([[]], 422, "empty"), ([[2, True]], 400, "item 0"), ([{"a": 1}], 400, "item 0"),
                               ([[2, 5.0]], 400, "item 0")):
        resp = client.post("/embed", json={"inputs": bad})
        assert resp.status_code == status and words in resp.json()["error"], (bad, resp.text)


def test_tei_embed_all_gives_every_token_vector(served):
    import torch
    pred, _, client = served
    text = "who sat on the mat ?"
    enc = pred.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        ref = pred.encoder(**enc).last_hidden_state[0].numpy()
    resp = client.post("/embed_all", json={"inputs": [text, enc["input_ids"][0].tolist()]})
    got = resp.json()
    assert resp.status_code == 200 and len(got) == 2
    for one in got:                       # (tokens, hidden): [CLS] ... [SEP], unpooled, unnormalised
        assert np.array(one).shape == ref.shape and np.abs(np.array(one) - ref).max() < 1e-5
    single = client.post("/embed_all", json={"inputs": text}).json()
    assert len(single) == 1 and np.abs(np.array(single[0]) - ref).max() < 1e-5
    cut = client.post("/embed_all", json={"inputs": LONG, "truncate": True, "truncation_direction": "Left"}).json()
    assert np.array(cut).shape == (1, 256, ref.shape[1])
    resp = client.post("/embed_all", json={"inputs": LONG})
    assert resp.status_code == 422 and set(resp.json()) == {"error", "error_type"}


def test_tei_decode(served):
    pred, _, client = served
    ids = pred.tokenizer.encode("who sat on the mat ?")
    tok = pred.tokenizer
    assert client.post("/decode", json={"ids": ids}).json() == [tok.decode(ids, skip_special_tokens=True)]
    assert client.post("/decode", json={"ids": ids}).json() == ["who sat on the mat?"]
    got = client.post("/decode", json={"ids": [ids, ids[:3]], "skip_special_tokens": False}).json()
    assert got == [tok.decode(ids), tok.decode(ids[:3])] and got[0].startswith("[CLS] who")
    for bad, status in (({"ids": [2, 5000]}, 422), ({"ids": [2, -1]}, 422), ({"ids": "the"}, 400), ({}, 400)):
        resp = client.post("/decode", json=bad)
        assert resp.status_code == status and resp.json()["error_type"] == "Validation", (bad, resp.text)


def test_tei_error_shape_on_tei_routes(served):
    _, _, client = served
    for path, body, status in (("/embed", {"inputs": 5}, 400), ("/embed", {}, 400), ("/embed_all", {}, 400),
                               ("/tokenize", {"inputs": 5}, 400), ("/decode", {"ids": [[1], 7]}, 400),
                               ("/embed", {"inputs": ["a"] * 33}, 422), ("/nope", {}, 404)):
        resp = client.post(path, json=body)
        assert resp.status_code == status and set(resp.json()) == {"error", "error_type"}, (path, resp.text)
        assert resp.json()["error_type"] == "Validation" and resp.json()["error"]


# ------------------------------------------------------------------------------------------------------ routing

def test_docs_trailing_slashes_and_head(served):
    pred, _, client = served
    resp = client.get("/docs")
    assert resp.status_code == 200 and "swagger" in resp.text.lower()
    assert "/embed_all" in client.get("/openapi.json").json()["paths"]
    for path in ("/embed/", "/embed//"):                      # answered as the route, not an empty 307
        resp = client.post(path, json={"inputs": "the cat"})
        ref = pred.embed(["the cat"], normalize=True)
        assert resp.status_code == 200 and np.abs(np.array(resp.json()) - ref).max() < 1e-5
    assert client.get("/health/").json()["status"] == "ok"
    resp = client.post("/embedx/", json={})
    assert resp.status_code == 404 and "/embed" in resp.json()["error"]
    for path in ("/health", "/info", "/metrics"):
        resp = client.head(path)
        assert resp.status_code == 200 and resp.content == b"" and int(resp.headers["content-length"]) > 0, path
    resp = client.head("/embed")
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"


def test_only_json_bodies_are_parsed(served):
    _, _, client = served
    body = b'{"inputs": "the cat"}'
    for ctype, status in (("text/plain", 415), ("multipart/form-data; boundary=x", 415), ("application/xml", 415),
                          ("application/json", 200), ("application/json; charset=utf-8", 200),
                          ("Application/JSON", 200), ("application/vnd.api+json", 200),
                          ("application/x-www-form-urlencoded", 200)):        # curl -d's default
        resp = client.post("/embed", content=body, headers={"content-type": ctype})
        assert resp.status_code == status, (ctype, resp.text)
    resp = client.post("/embed", content=body, headers={"content-type": "text/plain"})
    assert "not JSON" in resp.json()["error"] and resp.json()["error_type"] == "Validation"
    resp = client.post("/embed", content=body, headers={"content-type": "text/plain"})    # the connection lives on
    assert resp.status_code == 415


def test_health_names_the_model_directory_not_its_path(served, tmp_path):
    pred, _, _ = served
    model_dir = os.path.abspath(tmp_path / "models" / "my-model")
    os.makedirs(model_dir)
    config = ServeConfig(port=0)
    app = make_app(model_endpoints(pred, config), config, model_name=model_dir, info=model_info(pred, config),
                   absent=absent_routes(pred))
    with ServerThread(app, config).start() as srv:
        health = httpx.get(f"{srv.url}/health")
        spec = httpx.get(f"{srv.url}/openapi.json")
    assert health.json()["model"] == "my-model" and str(tmp_path) not in health.text + spec.text
    hub = make_app(model_endpoints(pred, config), config, model_name="org/name-not-on-disk")
    assert hub.title == "bertkit: org/name-not-on-disk"          # a hub name stays whole
