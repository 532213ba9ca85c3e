"""Serving: the dynamic batcher batches, the HTTP layer answers every client mistake with a 4xx and a message
(never a 500), timeouts give 504, and a real model serves fill-mask / embed through one padded forward."""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bertkit.serve import Batcher, Endpoint, Field, ServeConfig, close_server, make_server


def _echo_endpoints(calls: list, delay: float = 0.0):
    def run(items):
        calls.append(len(items))
        time.sleep(delay)
        return [{"upper": it["text"].upper(), "n": it["n"]} for it in items]
    return {"echo": Endpoint("echo", [Field("text", "string"), Field("n", "integer", required=False, default=1,
                                                                     minimum=1, maximum=10)], run)}


@pytest.fixture()
def server():
    started = []

    def start(endpoints, **cfg):
        srv = make_server(endpoints, ServeConfig(port=0, **cfg))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return srv.server_address[1]
    yield start
    for srv in started:
        close_server(srv)


def _request(port, method, path, body=None, headers=None, raw: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
    resp = conn.getresponse()
    payload = json.loads(resp.read() or b"null")
    conn.close()
    return resp.status, payload


def test_batcher_groups_concurrent_requests():
    sizes = []
    b = Batcher(lambda items: (sizes.append(len(items)), [x["v"] * 2 for x in items])[1], max_batch=8, max_wait_ms=50)
    futs = [b.submit({"v": i}) for i in range(20)]
    assert [f.result(timeout=5) for f in futs] == [2 * i for i in range(20)]
    assert sum(sizes) == 20 and max(sizes) == 8 and len(sizes) <= 4
    b.close()
    one = Batcher(lambda items: [len(items)] * len(items), max_batch=1)
    assert {one.submit({}).result(timeout=5) for _ in range(5)} == {1}
    one.close()


def test_batcher_lone_request_does_not_wait():
    """Sparse traffic: a request that comes long after the one before it runs at once, not after max_wait_ms."""
    b = Batcher(lambda items: [len(items)] * len(items), max_batch=8, max_wait_ms=400)
    for _ in range(2):
        t0 = time.monotonic()
        assert b.submit({}).result(timeout=5) == 1
        assert time.monotonic() - t0 < 0.2
        time.sleep(0.45)                     # longer than max_wait: the next one is sparse traffic too
    # a burst still batches: the first goes alone at once, the rest wait for each other
    futs = [b.submit({}) for _ in range(6)]
    assert sum(f.result(timeout=5) > 1 for f in futs) >= 4
    b.close()


def test_batcher_isolates_per_item_errors():
    b = Batcher(lambda items: [ValueError("bad") if x["v"] < 0 else x["v"] for x in items], max_batch=4, max_wait_ms=20)
    good, bad = b.submit({"v": 1}), b.submit({"v": -1})
    assert good.result(timeout=5) == 1
    with pytest.raises(ValueError, match="bad"):
        bad.result(timeout=5)
    b.close()


def test_health_openapi_and_ok(server):
    calls = []
    port = server(_echo_endpoints(calls))
    status, health = _request(port, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["endpoints"] == ["echo"]
    status, spec = _request(port, "GET", "/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    schema = spec["paths"]["/echo"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["text"] and schema["properties"]["n"]["maximum"] == 10
    assert _request(port, "POST", "/echo", {"text": "hi", "n": 3}) == (200, {"upper": "HI", "n": 3})


@pytest.mark.parametrize("raw, status, words", [
    (b"{not json", 400, "malformed JSON"),
    (b"\xff\xfe", 400, "malformed JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"text": 5}', 400, "must be a string"),
    (b'{"text": "a", "n": "3"}', 400, "must be a integer"),
    (b'{"text": "a", "n": true}', 400, "must be a integer"),
    (b'{"text": "a", "n": 11}', 422, "outside"),
    (b'{"text": "   "}', 422, "empty"),
    (b'{}', 400, "missing required field"),
    (b'{"text": "a", "extra": 1}', 400, "unknown field"),
    (b'{"text": "' + b"x" * 300 + b'"}', 413, "characters"),
])
def test_client_mistakes_get_4xx_with_message(server, raw, status, words):
    port = server(_echo_endpoints([]), max_text_chars=200)
    got, payload = _request(port, "POST", "/echo", raw=raw)
    assert got == status and words in payload["error"]


def test_oversized_body_unknown_path_and_missing_length(server):
    port = server(_echo_endpoints([]), max_body_bytes=1000)
    got, payload = _request(port, "POST", "/echo", raw=json.dumps({"text": "x" * 5000}).encode())
    assert got == 413 and "exceeds" in payload["error"]
    assert _request(port, "POST", "/nope", {"text": "a"})[0] == 404
    assert _request(port, "GET", "/nope")[0] == 404
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.putrequest("POST", "/echo")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 411 and "Content-Length" in json.loads(resp.read())["error"]
    conn.close()


def test_timeout_gives_504(server):
    port = server(_echo_endpoints([], delay=1.0), timeout_s=0.2)
    got, payload = _request(port, "POST", "/echo", {"text": "slow"})
    assert got == 504 and "no answer" in payload["error"]


def test_concurrent_requests_share_forwards(server):
    calls = []
    port = server(_echo_endpoints(calls, delay=0.02), max_batch=16, max_wait_ms=20)
    with ThreadPoolExecutor(16) as pool:
        res = list(pool.map(lambda i: _request(port, "POST", "/echo", {"text": f"t{i}"}), range(48)))
    assert all(s == 200 and p["upper"] == f"T{i}" for i, (s, p) in enumerate(res))
    assert sum(calls) == 48 and len(calls) < 48 and max(calls) > 1


def test_real_model_endpoints(server, tmp_path):
    import torch
    from bertkit import BertConfig, BertForMaskedLM, Tokenizer
    from bertkit.infer import Predictor
    from bertkit.serve import model_endpoints
    torch.manual_seed(0)
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on",
                                         "mat", "a", "dog", "."])}
    BertForMaskedLM(BertConfig.preset("tiny", vocab_size=len(vocab))).save_pretrained(tmp_path, tokenizer=Tokenizer(vocab))
    pred = Predictor.load(tmp_path)
    cfg = ServeConfig(port=0)
    port = server(model_endpoints(pred, cfg), max_batch=8, max_wait_ms=10)
    assert sorted(_request(port, "GET", "/health")[1]["endpoints"]) == ["embed", "fill-mask"]
    status, res = _request(port, "POST", "/fill-mask", {"text": "the cat [MASK] on the mat .", "top_k": 3})
    assert status == 200 and res["masks"] == 1 and len(res["candidates"]) == 3, res
    assert res == pred.fill_mask("the cat [MASK] on the mat .", top_k=3)
    status, res = _request(port, "POST", "/fill-mask", {"text": "no mask at all"})
    assert status == 422 and "[MASK]" in res["error"]
    texts = ["the cat sat .", "a dog sat on the mat ."] * 4
    with ThreadPoolExecutor(8) as pool:
        out = list(pool.map(lambda t: _request(port, "POST", "/embed", {"text": t}), texts))
    ref = pred.embed(texts)
    for (status, r), v in zip(out, ref):
        assert status == 200 and max(abs(a - b) for a, b in zip(r["embedding"], v.tolist())) < 1e-4
    assert _request(port, "POST", "/embed", {"text": "the", "pooling": "max"})[0] == 422
    assert _request(port, "POST", "/classify", {"text": "the"})[0] == 404


@pytest.mark.parametrize("cls_name, endpoint, body, check", [
    ("BertForSequenceClassification", "classify", {"text": "the cat sat .", "pair": "a dog ."},
     lambda r: r["label"] in ("neg", "pos") and abs(sum(r["scores"].values()) - 1) < 1e-4),
    ("BertForTokenClassification", "tag", {"text": "The  Cat sat on thé mat"},      # original case, accents, spans
     lambda r: [w["word"] for w in r] == ["The", "Cat", "sat", "on", "thé", "mat"]
     and [(w["start"], w["end"]) for w in r] == [(0, 3), (5, 8), (9, 12), (13, 15), (16, 19), (20, 23)]
     and all(w["label"] in ("neg", "pos") for w in r)),
    ("BertForQuestionAnswering", "answer", {"question": "who sat ?", "context": "The Cat sat on the Mat ."},
     lambda r: r["answer"] and r["answer"] == "The Cat sat on the Mat ."[r["start"]:r["end"]]
     and r["answer"] == r["answer"].strip()),
])
def test_task_heads_get_their_endpoint(server, tmp_path, cls_name, endpoint, body, check):
    import torch
    import bertkit
    from bertkit import BertConfig, Tokenizer
    from bertkit.infer import Predictor
    from bertkit.serve import model_endpoints
    torch.manual_seed(0)
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on",
                                         "mat", "a", "dog", ".", "who", "?"])}
    cfg = BertConfig.preset("tiny", vocab_size=len(vocab), id2label={0: "neg", 1: "pos"})
    getattr(bertkit, cls_name)(cfg).save_pretrained(tmp_path, tokenizer=Tokenizer(vocab))
    pred = Predictor.load(tmp_path)
    port = server(model_endpoints(pred, ServeConfig(port=0)))
    eps = _request(port, "GET", "/health")[1]["endpoints"]
    assert sorted(eps) == sorted(["embed", endpoint])
    status, res = _request(port, "POST", f"/{endpoint}", body)
    assert status == 200 and check(res), res
