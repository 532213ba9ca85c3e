"""The endpoints a `bertkit.infer.Predictor` supports, each a batch function over validated requests.

Every function takes a batch of requests (all queued for the same route) and runs the model once on all their texts;
a request whose input cannot be served (too long without `truncate`, a non-finite model output) fails alone.
"""

from __future__ import annotations

import base64
import functools
from typing import Any, Callable, NamedTuple

import numpy as np

from bertkit import __version__
from bertkit.errors import ConfigError
from bertkit.predict.decode import class_scores, score_function
from bertkit.predict.engine import forward_batches, id_batch
from bertkit.rerank import CrossEncoder, single_text_kind
from bertkit.serve import schemas as S
from bertkit.serve.app import Endpoint, FieldError
from bertkit.serve.batcher import Part, chunks
from bertkit.serve.limits import DEFAULT_MAX_LENGTH, RequestError, ServeConfig
from bertkit.tokenizer.inputs import cut, pad_batch

__all__ = ["model_endpoints", "model_info", "absent_routes"]

NON_FINITE = "the model produced non-finite values (NaN or Inf) for this input"


def _pieces(flat, sizes: list[int]) -> list:
    """`flat` cut into consecutive pieces of the given sizes (one per request, or per row)."""
    ends = np.cumsum(sizes).tolist()
    return [flat[end - n: end] for n, end in zip(sizes, ends)]


def _each(reqs: list, results: list, shape: Callable) -> list:
    """shape(request, result) per request; a result that is an exception stays that request's failure."""
    return [res if isinstance(res, Exception) else shape(r, res) for r, res in zip(reqs, results)]


def _or_error(f: Callable, *args, **kwargs):
    """f(...), or the error it raised: that request alone fails (a ValueError, e.g. no [MASK] in the text: 422)."""
    try:
        return f(*args, **kwargs)
    except (RequestError, ValueError) as e:
        return e


def _batched(rows: list, run: Callable[[list], Any]) -> list:
    """Per request its rows' results, all requests' rows run at once: run(rows) -> one result per row; a request
    whose rows are an exception keeps it."""
    ok = [i for i, x in enumerate(rows) if not isinstance(x, Exception)]
    out = list(rows)
    for i, piece in zip(ok, _pieces(run([row for i in ok for row in rows[i]]), [len(rows[i]) for i in ok])):
        out[i] = piece
    return out


def _tokens(config: ServeConfig) -> int:
    """Tokens per text for the heads' endpoints."""
    return config.max_length or DEFAULT_MAX_LENGTH


def _embed_tokens(predictor, config: ServeConfig) -> int:
    """Tokens per text for embeddings: --max-length, else the model's own max_seq_length, so that the vectors are
    SentenceTransformer's and `bertkit embed`'s."""
    return config.max_length or predictor.embed_max_length


# ------------------------------------------------------------------------------------------------------ embeddings

def _cut(row: list[int], max_length: int, left: bool, specials: tuple[int, int]) -> list[int]:
    """row within max_length tokens, its leading and trailing specials kept: cut from its start (left) or end."""
    a, b = specials
    return row[:a] + cut(row[a:len(row) - b], max_length - a - b, "left" if left else "right") + row[len(row) - b:]


def _input_rows(predictor, inputs: list, max_length: int, truncate: bool, left: bool = False, prompt: str = "",
                lower: bool = False) -> list[list[int]]:
    """Each input as whole model ids, its one tokenization: a text after its prompt (lower-cased where the model's
    modules say so) within the tokenizer's specials; ids as given (no prompt: they are the model's whole input, as
    TEI takes them). Cut to max_length from the chosen end when truncating; otherwise too long is a RequestError."""
    tok = predictor.tokenizer
    texts = [prompt + x for x in inputs if isinstance(x, str)]
    encoded = iter(tok([t.lower() for t in texts] if lower else texts)["input_ids"] if texts else [])
    text_specials = tuple(map(len, tok.template.single))
    rows = []
    for i, x in enumerate(inputs):
        row = next(encoded) if isinstance(x, str) else x
        if not isinstance(x, str) and max(x) >= tok.vocab_size:
            raise RequestError(422, f"input {i} has token id {max(x)}; this model's vocabulary has {tok.vocab_size}")
        if len(row) > max_length and not truncate:
            raise RequestError(422, f"input {i} is {len(row)} tokens; the limit is {max_length} "
                                    f"(send truncate: true to cut it)")
        rows.append(row if len(row) <= max_length else
                    _cut(row, max_length, left, text_specials if isinstance(x, str) else (0, 0)))
    return rows


class _Run(NamedTuple):
    """A run of one embedding request's inputs, tokenized (the batch function's item)."""
    request: Any                        # the whole request: its options, and its answer joined from its runs'
    rows: list[list[int]]               # model ids per input
    skips: list[int]                    # per input, the prompt tokens pooling leaves out (0: none)


def _embed_options(r) -> tuple:
    """(inputs, pooling, normalize, truncate, cut from the left, prompt name) of any embedding request."""
    if isinstance(r, S.EmbedRequest):
        return [r.text], r.pooling, r.normalize, True, False, None
    if isinstance(r, S.OpenAIEmbedRequest):
        return r.input, None, True, False, False, None
    return r.inputs, None, r.normalize, r.truncate, r.truncation_direction == "Left", r.prompt_name


def _embed_split(predictor, config: ServeConfig) -> Callable[[Any, int], list[Part]]:
    """(request, quantum) -> its parts: runs of its inputs of at most quantum padded tokens, each tokenized once here
    (the count the batcher budgets forwards by, and the ids the forward takes), so that a long request is
    interleaved with others."""
    limit = _embed_tokens(predictor, config)

    @functools.cache
    def skip(pooling: str | None, normalize: bool, prompt: str) -> int:
        """The prompt's tokens that pooling leaves out (include_prompt false), as the text path counts them."""
        return predictor.sentence_encoder(pooling, normalize).prompt_length(predictor.tokenizer, prompt, limit)

    def split(r, quantum: int) -> list[Part]:
        inputs, pooling, normalize, truncate, left, prompt_name = _embed_options(r)
        try:
            prompt = predictor.prompts.text(name=prompt_name)
        except ConfigError as e:
            raise RequestError(422, str(e)) from None
        lower = predictor.sentence_encoder(pooling, normalize).do_lower_case
        rows = _input_rows(predictor, inputs, limit, truncate, left, prompt, lower)
        skips = [skip(pooling, normalize, prompt) if isinstance(x, str) else 0 for x in inputs]
        return [Part(_Run(r, rows[a:b], skips[a:b]), b - a, longest)
                for a, b, longest in chunks([len(row) for row in rows], quantum)]
    return split


def _embed_run(predictor) -> Callable[[list[_Run]], list]:
    """Per run its part of the answer, or the 503 of a non-finite output; runs with the same pooling and
    normalisation share a forward."""
    def run(runs: list[_Run]) -> list:
        out: list = [None] * len(runs)
        groups: dict[tuple, list[int]] = {}
        for i, part in enumerate(runs):
            groups.setdefault(_embed_options(part.request)[1:3], []).append(i)
        for (pooling, normalize), idx in groups.items():
            rows, skips = [r for i in idx for r in runs[i].rows], [s for i in idx for s in runs[i].skips]
            vecs = predictor.embed_ids(rows, pooling=pooling, normalize=normalize, batch_size=len(rows),
                                       prompt_lengths=skips if any(skips) else None)
            for i, v in zip(idx, _pieces(vecs, [len(runs[i].rows) for i in idx])):
                out[i] = _embedded(runs[i], v) if np.isfinite(v).all() else RequestError(503, NON_FINITE)
        return out
    return run


def _embedded(run: _Run, vecs: np.ndarray):
    """A run's vectors as its request asks: bertkit's {embedding}, TEI's lists, OpenAI's (floats or base64, the
    run's token count)."""
    r = run.request
    if isinstance(r, S.EmbedRequest):
        return {"embedding": np.round(vecs[0].astype(np.float64), 6).tolist()}
    vecs = _matryoshka(vecs, r.dimensions, _embed_options(r)[2])
    if isinstance(r, S.OpenAIEmbedRequest) and r.encoding_format == "base64":
        data = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vecs]
    else:
        data = vecs.astype(np.float64).round(7).tolist()
    return (data, sum(map(len, run.rows))) if isinstance(r, S.OpenAIEmbedRequest) else data


def _dimensions(predictor) -> Callable[[Any], None]:
    """The check of a request's `dimensions`: at most the model's width (422; error_response makes it 400 on /v1)."""
    dims = predictor.embedding_dim

    def check(r) -> None:
        k = getattr(r, "dimensions", None)          # bertkit's own {text} body has none
        if k is not None and k > dims:
            raise FieldError(422, f"dimensions={k} is more than this model's {dims}", "dimensions")
    return check


def _matryoshka(vecs: np.ndarray, k: int | None, normalize: bool) -> np.ndarray:
    """The first k components of each vector (all where k is None), rescaled to unit length when normalize."""
    if k is None:
        return vecs
    vecs = vecs[:, :k].astype(np.float64)
    return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12) if normalize else vecs


def _embed_join(r, results: list):
    return results[0] if isinstance(r, S.EmbedRequest) else [v for res in results for v in res]


def _openai_join(name: str) -> Callable[[Any, list], dict]:
    def join(r, results: list) -> dict:
        data = [e for res, _ in results for e in res]
        tokens = sum(n for _, n in results)
        return {"object": "list", "model": name,
                "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return join


def _embed_all_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    """TEI's /embed_all: the encoder's last hidden state of every token of every input (specials included), as
    sentence-transformers' token_embeddings."""
    max_length = _embed_tokens(predictor, config)

    def states(rows: list[list[int]]) -> list[np.ndarray]:
        """(tokens, hidden) per row, all rows in one forward."""
        out: list = [None] * len(rows)
        batches = forward_batches(predictor.encoder, [len(r) for r in rows], lambda idx: id_batch(
            predictor.tokenizer, [rows[i] for i in idx], predictor.device), max(len(rows), 1), predictor.precision)
        for idx, _, o in batches:
            for i, h in zip(idx, o.last_hidden_state.float().cpu().numpy()):
                out[i] = h[:len(rows[i])]
        return out

    def run(reqs: list) -> list:
        lower = predictor.sentence_encoder().do_lower_case
        rows = [_or_error(_input_rows, predictor, r.inputs, max_length, r.truncate, r.truncation_direction == "Left",
                          lower=lower) for r in reqs]
        return _each(reqs, _batched(rows, states), shape)

    def shape(r, hs: list[np.ndarray]):
        if not all(np.isfinite(h).all() for h in hs):
            return RequestError(503, NON_FINITE)
        return [h.astype(np.float64).round(7).tolist() for h in hs]
    return run


def _decode_run(predictor) -> Callable[[list], list]:
    tok = predictor.tokenizer

    def one(r: S.DecodeRequest) -> list[str] | RequestError:
        top = max(max(ids, default=0) for ids in r.ids)
        if top >= tok.vocab_size:
            return RequestError(422, f"token id {top} is outside this model's vocabulary of {tok.vocab_size}")
        return [tok.decode(ids, skip_special_tokens=r.skip_special_tokens) for ids in r.ids]
    return lambda reqs: [one(r) for r in reqs]


# ------------------------------------------------------------------------------------------- classification heads

def _singles_then_pairs(items: list, paired: Callable[[Any], bool], run: Callable[[list[int], bool], Any]) -> list:
    """run(indices, paired) on the single-text items, then on the pairs (a tokenizer call or a forward each); per
    item its result, in the items' order."""
    out: list = [None] * len(items)
    for kind in (False, True):
        idx = [i for i, x in enumerate(items) if paired(x) == kind]
        if idx:
            for i, res in zip(idx, run(idx, kind)):
                out[i] = res
    return out


def _encoded_rows(predictor, rows: list[list[str]], max_length: int, truncate: bool) -> list[tuple[list, list]]:
    """(model ids, token types) of each row, a single text ([a]) or a pair ([a, b]), its one tokenization: cut
    longest-first to max_length when truncating; otherwise a row too long is a RequestError."""
    cut = {"max_length": max_length, "truncation": "longest_first"} if truncate else {}

    def encode(idx: list[int], paired: bool) -> list:
        enc = predictor.tokenizer([rows[i][0] for i in idx], [rows[i][1] for i in idx] if paired else None, **cut)
        return list(zip(enc["input_ids"], enc["token_type_ids"]))
    encoded = _singles_then_pairs(rows, lambda row: len(row) == 2, encode)
    for i, (ids, _) in enumerate(encoded):
        if len(ids) > max_length:
            raise RequestError(422, f"input {i} is {len(ids)} tokens; the limit is {max_length} "
                                    f"(send truncate: true to cut it)")
    return encoded


def _class_run(predictor, max_length: int, rows: Callable, scores: Callable, shape: Callable) -> Callable:
    """A route over a request's rows(request), all requests' rows in one forward: scores(request, its (rows, labels)
    logits), then shape(request, scores) unless a score is not finite (503)."""
    def logits(encoded: list[tuple[list, list]]) -> np.ndarray:
        ids, types = [r for r, _ in encoded], [t for _, t in encoded]
        out = np.zeros((len(ids), predictor.model.config.num_labels), dtype=np.float32)
        for idx, _, o in forward_batches(predictor.model, [len(r) for r in ids], lambda idx: pad_batch(
                [ids[i] for i in idx], [types[i] for i in idx], predictor.tokenizer.pad_token_id,
                device=predictor.device), max(len(ids), 1), predictor.precision):
            out[idx] = o.logits.float().cpu().numpy()
        return out

    def one(r, z: np.ndarray):
        z = scores(r, z)
        return shape(r, z) if np.isfinite(z).all() else RequestError(503, NON_FINITE)

    def run(reqs: list) -> list:
        encoded = [_or_error(_encoded_rows, predictor, rows(r), max_length, r.truncate) for r in reqs]
        return _each(reqs, _batched(encoded, logits), one)
    return run


def _predict_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    def shape(r: S.PredictRequest, scores: np.ndarray):
        preds = [sorted(({"label": predictor.labels[j], "score": round(float(s), 6)} for j, s in enumerate(row)),
                        key=lambda p: -p["score"]) for row in scores]
        return preds if r.inputs.batch else preds[0]
    # TEI's rule: sigmoid for one label or a multi-label model, softmax otherwise; raw_scores: the logits
    function = score_function(predictor.model.config, regression="sigmoid")
    return _class_run(predictor, _tokens(config), lambda r: r.inputs.items,
                      lambda r, logits: class_scores(logits, "none" if r.raw_scores else function), shape)


def _rerank_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    ce = CrossEncoder(predictor, predictor.name)          # the scores of `bertkit rerank` and CrossEncoder.predict

    def shape(r: S.RerankRequest, scores: np.ndarray):
        ranks = [{"index": i, "score": round(float(s), 6), **({"text": r.texts[i]} if r.return_text else {})}
                 for i, s in enumerate(scores)]
        return sorted(ranks, key=lambda x: -x["score"])
    return _class_run(predictor, config.max_length or ce.max_length, lambda r: [[r.query, t] for t in r.texts],
                      lambda r, logits: ce.from_logits(logits, r.raw_scores), shape)


# ---------------------------------------------------------------------------------------------- other endpoints

def _tokenize_run(predictor) -> Callable[[list], list]:
    tok = predictor.tokenizer

    def special(i: int) -> dict:
        return {"id": i, "text": tok.ids_to_tokens[i], "special": True, "start": None, "stop": None}

    def one(r: S.TokenizeRequest) -> list:
        pieces = tok.encode_pieces(r.inputs)
        out = []
        for n, text in enumerate(r.inputs):
            ids, offsets = pieces.text(n)
            toks = [{"id": i, "text": text[a:b], "special": False, "start": a, "stop": b}
                    for i, (a, b) in zip(ids, offsets)]
            pre, post = tok.template.single                     # the tokenizer's own specials around a text
            out.append([*map(special, pre), *toks, *map(special, post)] if r.add_special_tokens else toks)
        return out
    return lambda reqs: [one(r) for r in reqs]


def _fill_check(config: ServeConfig, mask: str) -> Callable[[S.FillMaskRequest], None]:
    def check(r: S.FillMaskRequest) -> None:
        masks = r.text.count(mask)                  # the model's own mask token: "[MASK]", RoBERTa's "<mask>"
        for what, value, limit in (("[MASK]s", masks, config.max_masks), ("top_k", r.top_k, config.max_top_k),
                                   ("beam_size", r.beam_size, config.max_beam_size)):
            if value > limit:
                raise RequestError(422, f"{what} = {value} is over this server's limit of {limit}")
    return check


def _fill_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    return lambda reqs: [_or_error(predictor.fill_mask, r.text, top_k=r.top_k, beam_size=r.beam_size,
                                   max_length=_tokens(config)) for r in reqs]


def _classify_run(predictor, config: ServeConfig) -> Callable[[list], list]:
    def run(reqs: list) -> list:
        def classify(idx: list[int], paired: bool) -> list:
            pairs = [reqs[i].pair for i in idx] if paired else None
            return predictor.classify([reqs[i].text for i in idx], max_length=_tokens(config), pairs=pairs,
                                      batch_size=len(idx))
        return _singles_then_pairs(reqs, lambda r: r.pair is not None, classify)
    return run


# -------------------------------------------------------------------------------------------------------- wiring

def _reranks(predictor) -> bool:
    return predictor.task == "classify" and single_text_kind(predictor) is None


def model_endpoints(predictor, config: ServeConfig | None = None) -> dict[str, Endpoint]:
    """Route name -> Endpoint for what the predictor's head supports (embed and tokenize always)."""
    config = config or ServeConfig()
    L = _tokens(config)
    embed_split, dims = _embed_split(predictor, config), _dimensions(predictor)
    eps = [
        Endpoint("embed", S.AnyEmbedRequest, _embed_run(predictor), S.AnyEmbedResult,
                 "sentence embedding: {text} -> {embedding}, or TEI's {inputs} -> [[...], ...]",
                 lambda r: 1 if isinstance(r, S.EmbedRequest) else len(r.inputs), dims, embed_split, _embed_join),
        Endpoint("embed_all", S.EmbedAllRequest, _embed_all_run(predictor, config), list[list[list[float]]],
                 "every token's vector (the encoder's last hidden state), TEI's shape", lambda r: len(r.inputs)),
        Endpoint("v1/embeddings", S.OpenAIEmbedRequest, _embed_run(predictor), S.OpenAIEmbedResponse,
                 "OpenAI-compatible embeddings", lambda r: len(r.input), dims, embed_split,
                 _openai_join(predictor.name)),
        Endpoint("tokenize", S.TokenizeRequest, _tokenize_run(predictor), list[list[S.SimpleToken]],
                 "WordPiece tokens with their character offsets", lambda r: len(r.inputs)),
        Endpoint("decode", S.DecodeRequest, _decode_run(predictor), list[str], "token ids -> text, TEI's /decode",
                 lambda r: len(r.ids)),
    ]
    if predictor.has_mlm:
        eps.append(Endpoint("fill-mask", S.FillMaskRequest, _fill_run(predictor, config), S.FillMaskResult,
                            "fill [MASK] tokens (several masks are decoded jointly)",
                            check=_fill_check(config, predictor.tokenizer.mask_token)))
    if predictor.task == "classify":
        eps.append(Endpoint("classify", S.ClassifyRequest, _classify_run(predictor, config), S.ClassifyResult,
                            "sequence classification (of a text, or of a text pair)"))
        eps.append(Endpoint("predict", S.PredictRequest, _predict_run(predictor, config),
                            S.PredictResult, "classification, TEI's shape: labels by score",
                            lambda r: len(r.inputs.items)))
    if _reranks(predictor):
        eps.append(Endpoint("rerank", S.RerankRequest, _rerank_run(predictor, config), list[S.Rank],
                            "score (query, text) pairs with the cross-encoder, best first", lambda r: len(r.texts)))
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
    task = predictor.task
    cross_encoder = ("classify", "a sequence-classification (cross-encoder) head")
    needs = {"fill-mask": ("mlm", "a masked-LM head"), "classify": cross_encoder, "predict": cross_encoder,
             "rerank": cross_encoder, "tag": ("tag", "a token-classification head"),
             "answer": ("answer", "a question-answering head")}          # route -> (Predictor.task, its head)
    why = {name: f"this is a {task} model: /{name} needs {head}" for name, (kind, head) in needs.items()
           if not (predictor.has_mlm if kind == "mlm" else task == kind)}
    if task == "classify" and not _reranks(predictor):
        why["rerank"] = ("/rerank needs a cross-encoder (fine-tuned on pairs); this classifier was fine-tuned on "
                         "single texts")
    return why


def model_info(predictor, config: ServeConfig) -> dict:
    kind = {"classify": "classifier", "tag": "tagger", "answer": "question-answering"}.get(predictor.task, "embedding")
    labels = predictor.labels if predictor.task in ("classify", "tag") else None
    qc = getattr(predictor.model.config, "extra", {}).get("quantization_config")
    return {"model_id": predictor.name, "model_type": kind, "task": predictor.task,
            "dims": predictor.embedding_dim, "quantization": qc.get("method") if isinstance(qc, dict) else None,
            "max_input_length": _embed_tokens(predictor, config) if kind == "embedding" else _tokens(config),
            "max_client_batch_size": config.max_inputs, "max_batch_requests": config.max_batch,
            "max_concurrent_requests": config.max_connections, "labels": labels, "version": __version__,
            "precision": predictor.precision}
