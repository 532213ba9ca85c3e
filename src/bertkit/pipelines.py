"""`bertkit.pipeline(task, model)`: transformers' pipelines for BERT, with their inputs, options and output shapes
(docs/transformers.md), on top of bertkit's Predictor, so code written for transformers runs as is.

    fill = bertkit.pipeline("fill-mask", "runs/demo/pretrain/final")
    fill("Paris is the [MASK] of France.")     # [{"score", "token", "token_str", "sequence"}, ...] (top_k=5)
    bertkit.pipeline("text-classification", model)("great film")           # [{"label", "score"}]; top_k=None: all
    bertkit.pipeline("token-classification", model, aggregation_strategy="simple")(text)
                                               # [{"entity_group", "score", "word", "start", "end"}]
    bertkit.pipeline("question-answering", model)(question=q, context=c)  # {"score", "start", "end", "answer"}
    bertkit.pipeline("feature-extraction", model)(text)                    # nested lists (1, seq, hidden)

Differences: every score is a Python float; fill-mask normalises over the tokenizer's vocabulary (the model's can be
padded past it); inputs of one call run as padded batches of `batch_size`.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from bertkit.errors import BertkitError, ConfigError
from bertkit.hub import resolve_model_dir
from bertkit.infer import Predictor
from bertkit.predict.answers import Windows, best_spans
from bertkit.predict.decode import class_scores, label_names, score_function, top_fills, word_ids, word_labels
from bertkit.predict.engine import PRECISION, encode, forward

__all__ = ["pipeline", "Pipeline", "FillMaskPipeline", "FeatureExtractionPipeline", "TextClassificationPipeline",
           "TokenClassificationPipeline", "QuestionAnsweringPipeline", "TASKS"]

_UNSET = object()          # "not given", where None is a meaningful value (top_k=None: every label)


def pipeline(task: str, model, *, device: str = "cpu", revision: str | None = None, precision: str | None = None,
             **options) -> "Pipeline":
    """A callable for `task` over `model`: a directory, a Hugging Face repo id (see bertkit.hub) or a Predictor.
    `options` become the pipeline's defaults (e.g. top_k=3, aggregation_strategy="simple"); `precision` is the
    forwards' (default "fp32", as at every front door; "auto" / "bf16": bf16 autocast); a Predictor keeps its own."""
    name = _ALIASES.get(task, task)
    if name not in TASKS:
        raise ConfigError(f"pipeline task {task!r} is not supported; tasks: {', '.join(TASKS)}")
    if isinstance(model, Predictor):
        if precision not in (None, model.precision):
            raise ConfigError(f"pipeline(precision={precision!r}): this Predictor runs {model.precision!r}; give it "
                              f"to Predictor.load(..., precision=) instead")
        predictor = model
    else:
        predictor = Predictor.load(resolve_model_dir(model, revision=revision), device=device,
                                   precision=precision or PRECISION)
    return TASKS[name](predictor, **options)


class Pipeline:
    """A task over a Predictor; subclasses set `options` (name -> default) and `_one` (one input -> its result)."""

    task = ""
    options: dict[str, Any] = {}
    heads: tuple[str, ...] = ()             # Predictor.task values the pipeline can run on; () = any model

    def __init__(self, predictor: Predictor, **defaults):
        if self.heads and predictor.task not in self.heads:
            raise BertkitError(f"{predictor.name} is a {predictor.task} model; the {self.task} pipeline needs "
                               f"a model with a {'/'.join(self.heads)} head")
        self.predictor = predictor
        self.model = predictor.model
        self.tokenizer = predictor.tokenizer
        self.defaults = self._checked(defaults)

    def _checked(self, options: dict) -> dict:
        unknown = [k for k in options if k not in self.options and k != "batch_size"]
        if unknown:
            raise ConfigError(f"{self.task} pipeline: unknown option(s) {', '.join(unknown)}; it takes "
                              f"{', '.join([*self.options, 'batch_size'])}")
        # counts a caller may pass: a positive int (top_k None: every label), never a torch error later
        for name in ("batch_size", "top_k"):
            value = options.get(name, 1)
            if (value is None and name == "top_k") or value is _UNSET:
                continue
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{self.task} pipeline: {name} must be a positive int, got {value!r:.40}")
        return options

    def __call__(self, inputs, **options):
        opts = {"batch_size": 8, **self.options, **self.defaults, **self._checked(options)}
        if isinstance(inputs, (list, tuple)):
            return self._many(list(inputs), opts)
        return self._many([inputs], opts)[0]

    def _many(self, inputs: list, opts: dict) -> list:
        size = opts.pop("batch_size")
        return [out for start in range(0, len(inputs), size)
                for out in self._batch(inputs[start: start + size], **opts)]

    def _batch(self, inputs: list, **opts) -> list:
        """A task gives `_batch` (one call for the batch) or `_one` (called per input, as here)."""
        return [self._one(x, **opts) for x in inputs]

    def _encode(self, texts: list[str], pairs: list[str] | None = None, offsets: bool = False,
                truncation: bool = False) -> dict:
        """Padded model inputs of a batch (tensors on the model's device), plus "offsets" when asked; cut to the
        model's length only with `truncation`, as transformers' pipelines do."""
        limit = self.model.config.max_input_length
        max_length = min(self.tokenizer.model_max_length or limit, limit) if truncation else None
        return encode(self.tokenizer, texts, pairs, max_length, self.predictor.device, offsets)

    def _forward(self, batch: dict, model=None):
        return forward(model or self.model, batch, self.predictor.precision)

    def _decode(self, tokens: list[str]) -> str:
        """Token strings to text as transformers' WordPiece decoder joins them ("##" glued, clean-up spacing).
        A token outside the vocab (the original text of an [UNK]) stands for itself."""
        vocab, unk = self.tokenizer.vocab, self.tokenizer.unk_token_id
        text = self.tokenizer.decode([vocab.get(t, unk) for t in tokens], skip_special_tokens=False)
        for t in tokens:
            if t not in vocab:
                text = text.replace(self.tokenizer.unk_token, t, 1)
        return text


class FillMaskPipeline(Pipeline):
    """One text: [{"score", "token", "token_str", "sequence"}] over its [MASK] (a list of those per mask when it
    has several, each mask predicted on its own); a list of texts: one such result each."""

    task = "fill-mask"
    options = {"top_k": 5, "targets": None}
    heads = ("mlm",)

    def __call__(self, inputs, **options):
        out = super().__call__(inputs, **options)
        return out[0] if isinstance(inputs, list) and len(inputs) == 1 else out      # as transformers does

    def _one(self, text: str, top_k: int, targets) -> list:
        ids = self.predictor.masked_ids(text)
        positions = [i for i, t in enumerate(ids) if t == self.tokenizer.mask_token_id]
        probs = self.predictor.log_probs([ids], positions)[0].exp()                   # (masks, vocab)
        target_ids = self._target_ids(targets)
        if target_ids is not None:
            probs = probs[:, target_ids]
        single = len(positions) == 1
        rows = []
        for pos, values, picks in zip(positions, *top_fills(probs, None, top_k)):
            rows.append([self._proposal(ids, pos, target_ids[p] if target_ids is not None else p, v, single)
                         for v, p in zip(values.tolist(), picks.tolist())])
        return rows[0] if single else rows

    def _proposal(self, ids: list[int], pos: int, token: int, score: float, single: bool) -> dict:
        filled = [token if i == pos else t for i, t in enumerate(ids) if t != self.tokenizer.pad_token_id]
        # with several masks the other [MASK]s stay visible in the sequence, as in transformers
        return {"score": score, "token": token, "token_str": self.tokenizer.decode([token], skip_special_tokens=False),
                "sequence": self.tokenizer.decode(filled, skip_special_tokens=single)}

    def _target_ids(self, targets) -> list[int] | None:
        """Vocabulary ids of `targets` (a word not in the vocab: its first piece, as transformers does)."""
        if targets is None:
            return None
        tok = self.tokenizer
        ids = []
        for t in [targets] if isinstance(targets, str) else targets:
            ids.extend([tok.vocab[t]] if t in tok.vocab else tok.convert_tokens_to_ids(tok.tokenize(t))[:1])
        if not ids:
            raise ConfigError(f"fill-mask: targets={targets!r} gives no vocabulary token")
        return sorted(set(ids))


class FeatureExtractionPipeline(Pipeline):
    """The encoder's last hidden states: nested lists (1, seq, hidden) per text (return_tensors=True: a tensor).
    prompt (or prompt_name, one of the model's sentence-transformers prompts) goes before each text; none unless
    asked, as transformers' pipeline has none."""

    task = "feature-extraction"
    options = {"truncation": False, "return_tensors": False, "prompt_name": None, "prompt": None}

    def _batch(self, texts: list[str], truncation: bool, return_tensors: bool, prompt_name: str | None,
               prompt: str | None) -> list:
        prompt = self.predictor.prompts.text(prompt, prompt_name) if prompt or prompt_name else ""
        batch = self._encode([prompt + t for t in texts], truncation=truncation)
        hidden = self._forward(batch, self.predictor.encoder).last_hidden_state.float()   # (batch, seq, hidden)
        lengths = batch["attention_mask"].sum(1).tolist()
        out = [hidden[i: i + 1, :n].cpu() for i, n in enumerate(lengths)]
        return out if return_tensors else [h.tolist() for h in out]


class TextClassificationPipeline(Pipeline):
    """[{"label", "score"}] for one text (the best label); with top_k (None: every label) the top labels, best
    first. A text pair is {"text": a, "text_pair": b}. Scores: softmax, sigmoid (one label or multi-label) or the
    raw value (regression), or as function_to_apply says."""

    task = "text-classification"
    options = {"top_k": _UNSET, "function_to_apply": None, "truncation": False}
    heads = ("classify",)

    def __call__(self, inputs, **options):
        out = super().__call__(inputs, **options)
        # transformers wraps one text's result in a list unless top_k was passed to the call (a pair's: never)
        return [out] if isinstance(inputs, str) and "top_k" not in options else out

    def _batch(self, inputs: list, top_k, function_to_apply, truncation: bool) -> list:
        texts, pairs = _split_pairs(inputs)
        logits = self._forward(self._encode(texts, pairs, truncation=truncation)).logits.float().cpu()
        labels = label_names(self.model.config)
        out = []
        for row in class_scores(logits, function_to_apply or score_function(self.model.config)).tolist():
            ranked = [{"label": labels[i], "score": s} for i, s in enumerate(row)]
            if top_k is _UNSET:
                out.append(max(ranked, key=lambda r: r["score"]))
            else:
                ranked.sort(key=lambda r: r["score"], reverse=True)
                out.append(ranked if top_k is None else ranked[:top_k])
        return out


def _split_pairs(inputs: list) -> tuple[list[str], list[str] | None]:
    """Texts, or {"text", "text_pair"} dicts -> (texts, pairs or None)."""
    if all(isinstance(x, str) for x in inputs):
        return inputs, None
    if all(isinstance(x, dict) and set(x) == {"text", "text_pair"} for x in inputs):
        return [x["text"] for x in inputs], [x["text_pair"] for x in inputs]
    raise BertkitError("text-classification takes texts or {'text': ..., 'text_pair': ...} dicts (not mixed)")


_STRATEGIES = ("none", "simple", "first", "average", "max")


class TokenClassificationPipeline(Pipeline):
    """Per text, the tokens (aggregation_strategy="none": {"entity", "score", "index", "word", "start", "end"}) or the
    entities ("simple": adjacent tokens of one type grouped; "first" / "average" / "max": words first, as in
    transformers: {"entity_group", "score", "word", "start", "end"}), leaving out `ignore_labels` (["O"])."""

    task = "token-classification"
    options = {"aggregation_strategy": "none", "ignore_labels": None}
    heads = ("tag",)

    def _batch(self, texts: list[str], aggregation_strategy: str, ignore_labels) -> list:
        strategy = str(aggregation_strategy).lower()
        if strategy not in _STRATEGIES:
            raise ConfigError(f"aggregation_strategy={aggregation_strategy!r} is not one of {_STRATEGIES}")
        ignore = ["O"] if ignore_labels is None else list(ignore_labels)
        batch = self._encode(texts, offsets=True, truncation=True)
        scores = torch.softmax(self._forward(batch).logits.float(), -1).cpu()           # (batch, seq, labels)
        out = []
        for b, text in enumerate(texts):
            tokens = self._tokens(text, batch["input_ids"][b].tolist(), batch["offsets"][b])
            entities = self._aggregate(tokens, scores[b], strategy)
            out.append([e for e in entities if e.get("entity", e.get("entity_group")) not in ignore])
        return out

    def _tokens(self, text: str, ids: list[int], offsets: list) -> list[dict]:
        """Each token but [CLS] / [SEP] / padding: its word, span, position and whether it continues a word."""
        tok = self.tokenizer
        added = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id}
        # transformers' rule: a "##" piece is longer than its span; without such a prefix (BPE, Unigram) a piece
        # continues a word when no space precedes it
        prefixed = bool(getattr(tok, "continuing_subword_prefix", None))
        out = []
        for i, (t, (start, end)) in enumerate(zip(ids, offsets)):
            if t in added or (t == tok.unk_token_id and text[start:end] == tok.unk_token):
                continue                                   # tokens the tokenizer added or matched as special
            word = tok.ids_to_tokens[t]
            subword = len(word) != end - start if prefixed else start > 0 and " " not in text[start - 1:start + 1]
            if t == tok.unk_token_id:                      # an unknown word is shown as written
                word, subword = text[start:end], False
            out.append({"word": word, "start": start, "end": end, "index": i, "is_subword": subword})
        return out

    def _aggregate(self, tokens: list[dict], scores: torch.Tensor, strategy: str) -> list[dict]:
        """Labelled tokens ("none", "simple": each token is its own word) or words, as transformers groups them: a
        word starts at the first token and at every token that does not continue one."""
        per_token = strategy in ("none", "simple")
        words: list[int | None] = [None] * len(scores)                    # each position's word
        members: dict[int, list[dict]] = {}
        for t, w in zip(tokens, range(len(tokens)) if per_token else word_ids([t["is_subword"] for t in tokens])):
            words[t["index"]] = w
            members.setdefault(w, []).append(t)
        labels, entities = label_names(self.model.config), []
        for w, (j, p) in word_labels(scores, words, "first" if per_token else strategy).items():
            ts = members[w]
            entities.append({"entity": labels[j], "score": p, "index": ts[0]["index"],
                             "word": ts[0]["word"] if per_token else self._decode([t["word"] for t in ts]),
                             "start": ts[0]["start"], "end": ts[-1]["end"]})
        return entities if strategy == "none" else self._group(entities)

    def _group(self, entities: list[dict]) -> list[dict]:
        """Adjacent entities of one type become one group; a B- tag starts a new group."""
        groups: list[list[dict]] = []
        for e in entities:
            bi, tag = _bio(e["entity"])
            if groups and bi != "B" and _bio(groups[-1][-1]["entity"])[1] == tag:
                groups[-1].append(e)
            else:
                groups.append([e])
        return [{"entity_group": g[0]["entity"].split("-", 1)[-1], "score": sum(e["score"] for e in g) / len(g),
                 "word": self._decode([e["word"] for e in g]), "start": g[0]["start"], "end": g[-1]["end"]}
                for g in groups]


def _bio(label: str) -> tuple[str, str]:
    """("B" | "I", type) of a label; a label without a B-/I- prefix continues ("I") its own type."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


class QuestionAnsweringPipeline(Pipeline):
    """{"score", "start", "end", "answer"}: the best span of the context (a list of top_k of them when top_k > 1).
    Long contexts run as windows of max_seq_len tokens overlapping by doc_stride; a span's score is
    p(start) * p(end) over the context tokens, answers of equal text (any case) from several windows add up."""

    task = "question-answering"
    options = {"top_k": 1, "doc_stride": None, "max_answer_len": 15, "max_seq_len": None,
               "max_question_len": 64, "handle_impossible_answer": False, "align_to_words": True}
    heads = ("answer",)

    def __call__(self, *args, **options):
        items = _qa_items(args, options.pop("question", None), options.pop("context", None))
        out = Pipeline.__call__(self, items, **options)
        return out[0] if len(items) == 1 else out                     # one example: its result, as transformers

    def _one(self, item: dict, **opts):
        """max_question_len is accepted and unused, as in transformers' fast-tokenizer path."""
        top_k, max_answer_len = opts["top_k"], opts["max_answer_len"]
        if top_k < 1 or max_answer_len < 1:
            raise ConfigError(f"question-answering: top_k and max_answer_len must be >= 1, got {top_k}, "
                              f"{max_answer_len}")
        limit = opts["max_seq_len"] or min(self.tokenizer.model_max_length or 384, 384)
        stride = min(limit // 2, 128) if opts["doc_stride"] is None else opts["doc_stride"]
        windows = Windows.build(self.tokenizer, item["question"], item["context"], limit, stride)
        out = self._forward(windows.batch(self.tokenizer.pad_token_id, self.predictor.device))
        answers, null = best_spans(windows, out.start_logits.float().cpu(), out.end_logits.float().cpu(), top_k,
                                   max_answer_len, align_to_words=opts["align_to_words"])
        if opts["handle_impossible_answer"]:
            answers.append({"score": null, "start": 0, "end": 0, "answer": ""})
        answers = sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]
        return answers[0] if len(answers) == 1 else answers


def _qa_items(args: tuple, question, context) -> list[dict]:
    """transformers' ways to give questions and contexts -> [{"question", "context"}]."""
    if len(args) == 2 and all(isinstance(a, str) for a in args):
        items = [{"question": args[0], "context": args[1]}]
    elif len(args) == 1:
        items = [args[0]] if isinstance(args[0], dict) else list(args[0])
    elif question is not None and context is not None:
        qs = question if isinstance(question, list) else [question]
        cs = context if isinstance(context, list) else [context] * len(qs)
        if len(qs) != len(cs):
            raise BertkitError(f"question-answering: {len(qs)} questions but {len(cs)} contexts")
        items = [{"question": q, "context": c} for q, c in zip(qs, cs)]
    else:
        raise BertkitError("question-answering takes (question, context), question=..., context=..., or "
                           "{'question': ..., 'context': ...} dicts")
    for item in items:
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) and item[k] for k in
                                                 ("question", "context")):
            raise BertkitError(f"question-answering: each input needs a non-empty question and context, got "
                               f"{str(item)[:80]}")
    return items


TASKS = {"fill-mask": FillMaskPipeline, "feature-extraction": FeatureExtractionPipeline,
         "text-classification": TextClassificationPipeline, "token-classification": TokenClassificationPipeline,
         "question-answering": QuestionAnsweringPipeline}
_ALIASES = {"sentiment-analysis": "text-classification", "ner": "token-classification"}
