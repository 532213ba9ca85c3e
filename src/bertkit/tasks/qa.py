"""Extractive question answering, SQuAD v1.1 and v2.0 (the paper's figure 4 (c)).

A context longer than one window is cut into overlapping windows (none dropped):

    [CLS] question [SEP] context[w : w + window] [SEP]          token_type 0 ... 0 1 ... 1

A window without the whole answer points at [CLS], as run_squad.py does; decoding is `predict.answers.best_spans`
under run_squad's rule, SQuAD 2.0's null threshold tuned on dev. The rules in full: docs/architecture.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.atomic import write_text
from bertkit.errors import DataError
from bertkit.heads import BertForQuestionAnswering
from bertkit.predict.answers import Windows, best_spans
from bertkit.tasks import metrics as M
from bertkit.tasks.batching import predict_batches
from bertkit.tasks.readers import SquadExample, read_squad
from bertkit.tasks.task import Feature, Task

__all__ = ["QATask", "SpanFeature"]


@dataclass(kw_only=True)
class SpanFeature(Feature):
    """One window of a context: [CLS] question [SEP] context[a:b] [SEP], (a, b) = windows.spans[window]."""
    example: int                             # index of the example
    windows: Windows                         # every window of the example's context (shared by its features)
    window: int                              # which one this is


@dataclass
class QATask(Task):
    max_length: int = 384           # max_seq_length
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best: int = 20
    null_threshold: float = 0.0     # SQuAD 2.0: tuned on dev after training
    version_2: bool = False
    stats: dict = field(default_factory=lambda: {"examples": 0, "features": 0, "multi_window_examples": 0,
                                                 "truncated_questions": 0, "answer_outside_window": 0,
                                                 "fixed_offsets": 0})
    kind = "qa"
    labels = None
    model_class = BertForQuestionAnswering
    num_labels = 2
    main_metric = "f1"
    predictions_suffix = ".json"              # {id: answer}, as the official evaluation script reads it

    def read(self, path, require_label: bool = True) -> list[SquadExample]:
        data = read_squad(path, require_answers=require_label)
        self.version_2 |= data.version_2
        self.stats["fixed_offsets"] += data.fixed_offsets
        return data.examples

    def counts(self) -> dict:
        # unanswerable windows are the [CLS] targets; SQuAD 2.0 is decided by the data, not a flag
        return {**super().counts(), "version_2": self.version_2}

    def features(self, tok, examples: list[SquadExample], with_labels: bool = True) -> list[SpanFeature]:
        feats = []
        questions = tok.encode_pieces([e.question for e in examples])   # pieces and character offsets, no specials
        contexts = tok.encode_pieces([e.context for e in examples])
        for ei, e in enumerate(examples):
            q = questions.text(ei)[0]
            if len(q) > self.max_query_length:
                q = q[:self.max_query_length]
                self.stats["truncated_questions"] += 1
            ids, offs = contexts.text(ei)
            if not ids:
                raise DataError(f"{e.source}: question {e.id!r}: the context has no tokens")
            window = self.max_length - len(q) - tok.template.n_special(True)
            if window < 1:
                raise DataError(f"max_seq_length={self.max_length} leaves no room for context after a "
                                f"{len(q)}-piece question")
            a_start = a_end = None
            if with_labels and e.answers and not e.is_impossible:
                text, cs = e.answers[0]
                ce = cs + len(text)
                inside = [i for i, (s, t) in enumerate(offs) if s < ce and t > cs]
                if not inside:
                    raise DataError(f"{e.source}: question {e.id!r}: answer {text!r} at {cs} covers no token "
                                    f"of the context")
                a_start, a_end = inside[0], inside[-1]
            starts = list(range(0, max(len(ids) - window, 0) + 1, self.doc_stride))
            if starts[-1] + window < len(ids):
                starts.append(len(ids) - window)  # the tail is always covered
            self.stats["multi_window_examples"] += len(starts) > 1
            windows = Windows.of(tok, q, e.context, ids, offs, [(ws, min(ws + window, len(ids))) for ws in starts])
            off = windows.first                                    # position of a window's first context piece
            for k, (ws, we) in enumerate(windows.spans):
                f = SpanFeature(input_ids=windows.rows[k], token_type_ids=windows.types[k], example=ei,
                                windows=windows, window=k)
                if with_labels:
                    if a_start is not None and ws <= a_start and a_end < we:
                        f.start_positions, f.end_positions = a_start - ws + off, a_end - ws + off
                    else:
                        f.start_positions = f.end_positions = 0
                        if a_start is not None:
                            self.stats["answer_outside_window"] += 1
                feats.append(f)
            self.stats["examples"] += 1
        self.stats["features"] += len(feats)
        return feats

    def predict(self, model, examples: list[SquadExample], feats: list[SpanFeature], batch_size: int = 64,
                precision: str | bool | None = "auto") -> list[dict]:
        """Per example, the decoded answer (`decode`) of each window's start / end logits over its pieces."""
        logits: list = [None] * len(feats)
        for idx, o in predict_batches(model, feats, batch_size, precision):
            s, e = o.start_logits.float().cpu().numpy(), o.end_logits.float().cpu().numpy()
            for row, i in enumerate(idx):
                n = len(feats[i].input_ids)
                logits[i] = (s[row, :n], e[row, :n])
        return self.decode(examples, feats, logits)

    def decode(self, examples: list[SquadExample], feats: list[SpanFeature], logits) -> list[dict]:
        """Per example: best span text, its score, the null score, the margin (null - best) and the n-best list."""
        by_ex: dict[int, tuple] = {}                  # example -> its windows, and each one's (start, end) logits
        for f, lg in zip(feats, logits):
            by_ex.setdefault(f.example, (f.windows, [None] * len(f.windows.spans)))[1][f.window] = lg
        out = []
        for ei, e in enumerate(examples):
            spans, null = [], math.inf
            if ei in by_ex:
                windows, lgs = by_ex[ei]
                spans, null = best_spans(windows, [s for s, _ in lgs], [t for _, t in lgs], self.n_best,
                                         self.max_answer_length, rule="run_squad")
            nbest = [{"text": a["answer"], "score": a["score"], "start": a["start"],
                      "probability": a["probability"]} for a in spans]
            best = nbest[0] if nbest else {"text": "", "score": -1e9, "start": -1}
            out.append({"id": e.id, "text": best["text"], "score": best["score"], "null_score": null,
                        "margin": null - best["score"], "nbest": nbest})
        return out

    def final_answers(self, decoded: list[dict]) -> dict[str, str]:
        if not self.version_2:
            return {d["id"]: d["text"] for d in decoded}
        return {d["id"]: ("" if d["margin"] > self.null_threshold else d["text"]) for d in decoded}

    def tune(self, examples: list[SquadExample], decoded: list[dict]) -> dict:
        """SQuAD 2.0: the null threshold that maximises dev F1."""
        if not self.version_2:
            return {}
        gold = {e.id: [t for t, _ in e.answers] for e in examples}
        self.null_threshold, _ = M.best_null_threshold({d["id"]: d["text"] for d in decoded},
                                                       {d["id"]: d["margin"] for d in decoded}, gold, "f1")
        return {"null_threshold": self.null_threshold}

    def score(self, examples: list[SquadExample], feats, decoded: list[dict]) -> dict:
        gold = {e.id: [t for t, _ in e.answers] for e in examples}
        out = M.squad_scores(self.final_answers(decoded), gold)
        if self.version_2:
            out["null_threshold"] = self.null_threshold
        out["n"] = len(examples)
        return out

    def write_predictions(self, path: Path, examples, feats, decoded: list[dict]) -> Path:
        """predictions.json ({id: answer}) as the official script reads it, plus nbest in a sibling file."""
        write_text(path, json.dumps(self.final_answers(decoded), ensure_ascii=False, indent=1))
        write_text(path.with_name(path.stem + "_nbest.json"),
                   json.dumps({d["id"]: {"null_score": d["null_score"], "margin": d["margin"],
                                         "nbest": d["nbest"][:5]} for d in decoded}, ensure_ascii=False))
        return path
