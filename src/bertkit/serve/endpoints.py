"""The endpoints a `bertkit.infer.Predictor` supports, each a batch function over validated requests.

Every function takes a batch of requests (all queued for the same route) and runs the model once on all their texts;
a request whose input cannot be served (too long without `truncate`, a non-finite model output) fails alone.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Callable

import numpy as np

from bertkit import __version__
from bertkit.rerank import positive_label, single_text_kind
from bertkit.predict.decode import class_scores, relevance, score_function
from bertkit.serve import schemas as S
from bertkit.serve.app import Endpoint
from bertkit.serve.limits import DEFAULT_MAX_LENGTH, RequestError, ServeConfig
from bertkit.tokenizer.inputs import wrap

__all__ = ["model_endpoints", "model_info", "absent_routes"]

NON_FINITE = "the model produced non-finite values (NaN or Inf) for this input"


def _too_many(n: int, config: ServeConfig) -> None:
    if n > config.max_inputs:
        raise RequestError(422, f"{n} inputs in one request; the limit is {config.max_inputs}")


def _token_counts(predictor, texts: list[str]) -> list[int]:
    """Tokens per text with [CLS] and [SEP], untruncated."""
    bounds = predictor.tokenizer.encode_pieces(texts).bounds
    return (np.diff(bounds) + 2).tolist()


def _too_long(counts: list[int], max_length: int) -> RequestError | None:
    for i, n in enumerate(counts):
        if n > max_length:
            return RequestError(422, f"input {i} is {n} tokens; the limit is {max_length} (send truncate: true to cut it)")
    return None


def _tokens(config: ServeConfig) -> int:
    """Tokens per text for the heads' endpoints."""
    return config.max_length or DEFAULT_MAX_LENGTH


def _embed_tokens(predictor, config: ServeConfig) -> int:
    """Tokens per text for embeddings: --max-length, else the model's own max_seq_length, so that the vectors are
    SentenceTransformer's and `bertkit embed`'s."""
    return config.max_length or predictor.embed_max_length


# ------------------------------------------------------------------------------------------------------ embeddings

@dataclass
class _EmbedJob:
    texts: list[str]
    pooling: str | None = None          # None: the model's own (sentence-transformers modules, else mean)
    normalize: bool = True
    truncate: bool = True


def _embed_jobs(predictor, jobs: list[_EmbedJob], max_length: int) -> list:
    """Per job: (vectors (n, dims), tokens seen: None for a truncating job) or the exception that job alone fails
    with."""
    out: list = [None] * len(jobs)
    groups: dict[tuple, list[int]] = {}
    for i, job in enumerate(jobs):
        # a truncating job needs no count: skip a second tokenization of its texts (the forward tokenizes them)
        counts = None if job.truncate else _token_counts(predictor, job.texts)
        err = None if counts is None else _too_long(counts, max_length)
        out[i] = err or (counts and [min(n, max_length) for n in counts])
        if err is None:
            groups.setdefault((job.pooling, job.normalize), []).append(i)
    for (pooling, normalize), idx in groups.items():    # requests with the same options share one forward
        texts = [t for i in idx for t in jobs[i].texts]
        vecs = predictor.embed(texts, pooling=pooling, normalize=normalize, max_length=max_length,
                               batch_size=len(texts))
        start = 0
        for i in idx:
            v = vecs[start: start + len(jobs[i].texts)]
            start += len(v)
            out[i] = (v, out[i]) if np.isfinite(v).all() else RequestError(503, NON_FINITE)
    return out


def _embed_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    def run(reqs: list) -> list:
        jobs = [_EmbedJob([r.text], r.pooling, r.normalize) if isinstance(r, S.EmbedRequest)
                else _EmbedJob(r.inputs, normalize=r.normalize, truncate=r.truncate) for r in reqs]
        out = []
        for r, res in zip(reqs, _embed_jobs(predictor, jobs, _embed_tokens(predictor, config))):
            if isinstance(res, Exception):
                out.append(res)
            elif isinstance(r, S.EmbedRequest):
                out.append({"embedding": np.round(res[0][0].astype(np.float64), 6).tolist()})
            else:
                out.append(res[0].astype(np.float64).round(7).tolist())
        return out
    return run


def _openai_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    dims = predictor.embedding_dim

    def shape(r: S.OpenAIEmbedRequest, vecs: np.ndarray, counts: list[int]) -> dict:
        if r.encoding_format == "base64":
            data = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vecs]
        else:
            data = vecs.astype(np.float64).round(7).tolist()
        return {"object": "list", "model": predictor.name,
                "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
                "usage": {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}}

    def run(reqs: list) -> list:
        jobs = [_EmbedJob(r.input, truncate=False) for r in reqs]
        out = []
        for r, res in zip(reqs, _embed_jobs(predictor, jobs, _embed_tokens(predictor, config))):
            if not isinstance(res, Exception) and r.dimensions not in (None, dims):
                res = RequestError(422, f"dimensions={r.dimensions}: this model's embeddings have {dims}")
            out.append(res if isinstance(res, Exception) else shape(r, *res))
        return out
    return run


# ------------------------------------------------------------------------------------------- classification heads

def _row_logits(predictor, rows: list[list[str]], max_length: int) -> np.ndarray:
    """(n, labels) logits of single texts ([a]) or pairs ([a, b]); rows of both kinds run as two forwards."""
    out = np.zeros((len(rows), predictor.model.config.num_labels), dtype=np.float32)
    for n in (1, 2):
        idx = [i for i, row in enumerate(rows) if len(row) == n]
        if idx:
            pairs = [rows[i][1] for i in idx] if n == 2 else None
            out[idx] = predictor.logits([rows[i][0] for i in idx], pairs, max_length, batch_size=len(idx))
    return out


def _rows_too_long(predictor, rows: list[list[str]], max_length: int) -> RequestError | None:
    counts = _token_counts(predictor, [t for row in rows for t in row])
    k, joined = 0, []
    for row in rows:
        joined.append(sum(counts[k: k + len(row)]) - (len(row) - 1))   # a pair shares one [CLS]
        k += len(row)
    return _too_long(joined, max_length)


def _class_logits(predictor, requests: list[tuple[list[list[str]], bool]], max_length: int) -> list:
    """Per request (rows, truncate): its (rows, labels) logits, all requests in one forward (two with pairs), or
    the RequestError of a request with a row too long to serve untruncated."""
    out: list = [None if truncate else _rows_too_long(predictor, rows, max_length) for rows, truncate in requests]
    ok = [i for i, err in enumerate(out) if err is None]
    logits = _row_logits(predictor, [row for i in ok for row in requests[i][0]], max_length) if ok else None
    start = 0
    for i in ok:
        out[i] = logits[start: start + len(requests[i][0])]
        start += len(requests[i][0])
    return out


def _scores(predictor, logits: np.ndarray, raw: bool) -> np.ndarray:
    """Per label: the logits (raw), else TEI's rule: sigmoid for one label or a multi-label model, softmax
    otherwise."""
    return class_scores(logits, "none" if raw else score_function(predictor.model.config, regression="sigmoid"))


def _labels(predictor, n: int) -> list[str]:
    return predictor.labels or [f"LABEL_{i}" for i in range(n)]


def _predict_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    def shape(r: S.PredictRequest, logits: np.ndarray):
        scores = _scores(predictor, logits, r.raw_scores)
        if not np.isfinite(scores).all():
            return RequestError(503, NON_FINITE)
        labels = _labels(predictor, scores.shape[-1])
        preds = [sorted(({"label": labels[j], "score": round(float(s), 6)} for j, s in enumerate(row)),
                        key=lambda p: -p["score"]) for row in scores]
        return preds if r.inputs.batch else preds[0]

    def run(reqs: list) -> list:
        logits = _class_logits(predictor, [(r.inputs.items, r.truncate) for r in reqs], _tokens(config))
        return [res if isinstance(res, Exception) else shape(r, res) for r, res in zip(reqs, logits)]
    return run


def _relevance(predictor, logits: np.ndarray, raw: bool) -> np.ndarray:
    """One score per pair: the log-odds of the positive label (as `bertkit rerank` picks it; a one-label
    cross-encoder's logit), or its sigmoid."""
    z = relevance(logits, positive_label(predictor.labels))
    return z if raw else 1.0 / (1.0 + np.exp(-z))


def _rerank_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    def shape(r: S.RerankRequest, logits: np.ndarray):
        scores = _relevance(predictor, logits, r.raw_scores)
        if not np.isfinite(scores).all():
            return RequestError(503, NON_FINITE)
        ranks = [{"index": i, "score": round(float(s), 6), **({"text": r.texts[i]} if r.return_text else {})}
                 for i, s in enumerate(scores)]
        return sorted(ranks, key=lambda x: -x["score"])

    def run(reqs: list) -> list:
        logits = _class_logits(predictor, [([[r.query, t] for t in r.texts], r.truncate) for r in reqs],
                               _tokens(config))
        return [res if isinstance(res, Exception) else shape(r, res) for r, res in zip(reqs, logits)]
    return run


# ---------------------------------------------------------------------------------------------- other endpoints

def _tokenize_run(predictor) -> Callable[[list], list]:
    tok = predictor.tokenizer
    itos = tok.ids_to_tokens

    def special(i: int) -> dict:
        return {"id": i, "text": itos[i], "special": True, "start": None, "stop": None}

    def one(r: S.TokenizeRequest) -> list:
        pieces = tok.encode_pieces(r.inputs)
        out = []
        for n, text in enumerate(r.inputs):
            ids, offsets = pieces.text(n)
            toks = [{"id": i, "text": text[a:b], "special": False, "start": a, "stop": b}
                    for i, (a, b) in zip(ids, offsets)]
            out.append(wrap(toks, cls=special(tok.cls_token_id), sep=special(tok.sep_token_id))
                       if r.add_special_tokens else toks)
        return out
    return lambda reqs: [one(r) for r in reqs]


def _fill_check(config: ServeConfig) -> Callable[[S.FillMaskRequest], None]:
    def check(r: S.FillMaskRequest) -> None:
        masks = r.text.count("[MASK]")
        for what, value, limit in (("[MASK]s", masks, config.max_masks), ("top_k", r.top_k, config.max_top_k),
                                   ("beam_size", r.beam_size, config.max_beam_size)):
            if value > limit:
                raise RequestError(422, f"{what} = {value} is over this server's limit of {limit}")
    return check


def _fill_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    def one(r: S.FillMaskRequest):
        try:
            return predictor.fill_mask(r.text, top_k=r.top_k, beam_size=r.beam_size, max_length=_tokens(config))
        except ValueError as e:   # e.g. no [MASK] in the text: that request alone gets 422
            return e
    return lambda reqs: [one(r) for r in reqs]


def _classify_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    def run(reqs: list) -> list:
        out: list = [None] * len(reqs)
        for paired in (False, True):
            idx = [i for i, r in enumerate(reqs) if (r.pair is not None) == paired]
            if idx:
                pairs = [reqs[i].pair for i in idx] if paired else None
                res = predictor.classify([reqs[i].text for i in idx], max_length=_tokens(config), pairs=pairs,
                                         batch_size=len(idx))
                for i, x in zip(idx, res):
                    out[i] = x
        return out
    return run


# -------------------------------------------------------------------------------------------------------- wiring

def _texts(field: str) -> Callable:
    return lambda r: len(getattr(r, field))


def _inputs_check(field: str, config: ServeConfig) -> Callable:
    return lambda r: _too_many(len(getattr(r, field)), config)


def _reranks(predictor) -> bool:
    return (predictor.task == "classify" and predictor.model.config.num_labels in (1, 2)
            and single_text_kind(predictor) is None)


def model_endpoints(predictor, config: ServeConfig | None = None) -> dict[str, Endpoint]:
    """Route name -> Endpoint for what the predictor's head supports (embed and tokenize always)."""
    config = config or ServeConfig()
    L = _tokens(config)
    embed_weight = lambda r: 1 if isinstance(r, S.EmbedRequest) else len(r.inputs)  # noqa: E731
    eps = [
        Endpoint("embed", S.AnyEmbedRequest, _embed_run(predictor, config), S.AnyEmbedResult,
                 "sentence embedding: {text} -> {embedding}, or TEI's {inputs} -> [[...], ...]", embed_weight,
                 lambda r: None if isinstance(r, S.EmbedRequest) else _too_many(len(r.inputs), config)),
        Endpoint("v1/embeddings", S.OpenAIEmbedRequest, _openai_run(predictor, config), S.OpenAIEmbedResponse,
                 "OpenAI-compatible embeddings", _texts("input"), _inputs_check("input", config)),
        Endpoint("tokenize", S.TokenizeRequest, _tokenize_run(predictor), list[list[S.SimpleToken]],
                 "WordPiece tokens with their character offsets", _texts("inputs"), _inputs_check("inputs", config)),
    ]
    if predictor.has_mlm:
        eps.append(Endpoint("fill-mask", S.FillMaskRequest, _fill_run(predictor, config), S.FillMaskResult,
                            "fill [MASK] tokens (several masks are decoded jointly)", check=_fill_check(config)))
    if predictor.task == "classify":
        eps.append(Endpoint("classify", S.ClassifyRequest, _classify_run(predictor, config), S.ClassifyResult,
                            "sequence classification (of a text, or of a text pair)"))
        eps.append(Endpoint("predict", S.PredictRequest, _predict_run(predictor, config),
                            S.PredictResult, "classification, TEI's shape: labels by score",
                            lambda r: len(r.inputs.items), lambda r: _too_many(len(r.inputs.items), config)))
    if _reranks(predictor):
        eps.append(Endpoint("rerank", S.RerankRequest, _rerank_run(predictor, config), list[S.Rank],
                            "score (query, text) pairs with the cross-encoder, best first", _texts("texts"),
                            _inputs_check("texts", config)))
    if predictor.task == "tag":
        eps.append(Endpoint("tag", S.TagRequest,
                            lambda rs: predictor.tag([r.text for r in rs], max_length=L, batch_size=len(rs)),
                            list[S.TaggedWord], "token classification (per word)"))
    if predictor.task == "answer":
        eps.append(Endpoint("answer", S.AnswerRequest,
                            lambda rs: predictor.answer([r.question for r in rs], [r.context for r in rs], max_length=L,
                                                        batch_size=len(rs)),
                            S.AnswerResult, "extractive question answering"))
    return {ep.name: ep for ep in eps}



def absent_routes(predictor) -> dict[str, str]:
    """Why a known route is missing for this model: the 404 says so instead of just 'not found'."""
    why = {}
    if not predictor.has_mlm:
        why["fill-mask"] = f"this is a {predictor.task} model: /fill-mask needs a masked-LM head"
    if predictor.task != "classify":
        for name in ("classify", "predict", "rerank"):
            why[name] = (f"this is a {predictor.task} model: /{name} needs a sequence-classification "
                         f"(cross-encoder) head")
    elif not _reranks(predictor):
        why["rerank"] = (f"/rerank needs a cross-encoder (fine-tuned on pairs) with one or two labels; this "
                         f"classifier has {predictor.model.config.num_labels}, fine-tuned on "
                         f"{'single texts' if single_text_kind(predictor) else 'pairs'}")
    if predictor.task != "tag":
        why["tag"] = f"this is a {predictor.task} model: /tag needs a token-classification head"
    if predictor.task != "answer":
        why["answer"] = f"this is a {predictor.task} model: /answer needs a question-answering head"
    return why


def _quantization(predictor) -> str | None:
    qc = getattr(predictor.model.config, "extra", {}).get("quantization_config")
    return qc.get("method") if isinstance(qc, dict) else None


def model_info(predictor, config: ServeConfig) -> dict:
    kind = {"classify": "classifier", "tag": "tagger", "answer": "question-answering"}.get(predictor.task, "embedding")
    labels = predictor.labels if predictor.task in ("classify", "tag") else None
    return {"model_id": predictor.name, "model_type": kind, "task": predictor.task,
            "dims": predictor.embedding_dim, "quantization": _quantization(predictor),
            "max_input_length": _embed_tokens(predictor, config) if kind == "embedding" else _tokens(config),
            "max_client_batch_size": config.max_inputs, "max_batch_requests": config.max_batch,
            "max_concurrent_requests": config.max_connections, "labels": labels, "version": __version__,
            "precision": predictor.precision}
