"""Answer spans of a question-answering head: one window structure, one span decoder, two scoring rules.

`Windows` are [CLS] question [SEP] context[a:b] [SEP] over the context's pieces, placed as transformers' pipeline
places them (`Windows.build`) or by `QATask`; `best_spans` decodes them by `rule`: "pipeline" (transformers'
question-answering pipeline: p(start) * p(end)) or "run_squad" (google-research/bert: start + end logit over
max-context windows). Each rule in full: docs/architecture.md.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch

from bertkit.errors import BertkitError, ConfigError
from bertkit.tokenizer.inputs import pad_batch

__all__ = ["RULES", "Windows", "best_spans"]

RULES = ("pipeline", "run_squad")
_OUTSIDE = -10000.0        # the logit transformers gives tokens that cannot be in the answer


@dataclass
class Windows:
    context: str
    offsets: list[tuple[int, int]]        # each context piece's character span
    word_starts: list[bool]               # each context piece: does it start a word (not continue one)
    rows: list[list[int]]                 # the windows' input ids: [CLS] question [SEP] context[a:b] [SEP]
    types: list[list[int]]                # their token types
    spans: list[tuple[int, int]]          # the context pieces [a, b) of each window
    first: int                            # position of the first context token in every window

    @classmethod
    def of(cls, tok, question: list[int], context: str, pieces: list[int], offsets: list[tuple[int, int]],
           spans: list[tuple[int, int]]) -> "Windows":
        """The windows `spans` of a context's `pieces` under the question's piece ids."""
        enc = tok.build_inputs([question] * len(spans), [pieces[a:b] for a, b in spans])
        starts = [not c for c in tok.continues_word(pieces)]
        first = tok.template.first_len(len(question))      # [CLS] q [SEP]: +2; RoBERTa's <s> q </s></s>: +3
        return cls(context, offsets, starts, enc["input_ids"], enc["token_type_ids"], spans, first)

    @classmethod
    def build(cls, tok, question: str, context: str, max_seq_len: int, doc_stride: int,
              max_question: int | None = None) -> "Windows":
        """Windows of `context` under `question` (cut to its first `max_question` pieces, if given), placed as
        transformers' pipeline places them: consecutive windows overlap by doc_stride pieces."""
        pieces = tok.encode_pieces([question, context])
        q_ids = pieces.text(0)[0][:max_question]
        c_ids, offsets = pieces.text(1)
        room = max_seq_len - len(q_ids) - tok.template.n_special(True)
        if room <= doc_stride or room <= 0:
            raise BertkitError(f"question-answering: a {len(q_ids)}-token question leaves {room} of max_seq_len="
                               f"{max_seq_len} tokens for the context, not more than doc_stride={doc_stride}; "
                               f"raise max_seq_len or lower doc_stride")
        spans, start = [], 0
        while True:
            stop = min(start + room, len(c_ids))
            spans.append((start, stop))
            if stop == len(c_ids):
                break
            start += room - doc_stride
        return cls.of(tok, q_ids, context, c_ids, offsets, spans)

    def batch(self, pad_id: int, device) -> dict:
        return pad_batch(self.rows, self.types, pad_id, device=device)

    def char_span(self, window: int, s: int, e: int, align_to_words: bool) -> tuple[int, int]:
        """Characters of window tokens s..e (positions in the window); [CLS] counts as (0, 0)."""
        a, b = self.spans[window]
        ps, pe = a + s - self.first, a + e - self.first                    # context piece indices
        start = self.offsets[ps][0] if s else 0
        end = self.offsets[pe][1] if e else 0
        if align_to_words and s and e:
            while ps > 0 and not self.word_starts[ps]:                     # the word's first piece in the context
                ps -= 1
            while pe + 1 < len(self.word_starts) and not self.word_starts[pe + 1]:     # and its last
                pe += 1
            start, end = self.offsets[ps][0], self.offsets[pe][1]
        return start, end

    def max_context(self) -> list[int]:
        """Per context piece, the window where it has the most context on both sides (the first one on a tie)."""
        best = [(-math.inf, 0)] * len(self.offsets)
        for w, (a, b) in enumerate(self.spans):
            for p in range(a, b):
                score = min(p - a, b - 1 - p) + 0.01 * (b - a)
                if score > best[p][0]:
                    best[p] = (score, w)
        return [w for _, w in best]


def best_spans(windows: Windows, start_logits, end_logits, top_k: int, max_answer_len: int, rule: str = "pipeline",
               align_to_words: bool = False, merge: str = "sum") -> tuple[list[dict], float]:
    """Start / end logits per window (a (windows, seq) tensor or array, or one row each) -> the answers
    [{"score", "start", "end", "answer"}] and the no-answer score, as `rule` decodes them (docs/architecture.md):
    "pipeline" gives them unsorted, merged by text (`merge`); "run_squad" best first, with "probability"."""
    if rule not in RULES:
        raise ConfigError(f"answer spans: rule={rule!r} is not one of {RULES}")
    found, null = [], math.inf                          # (score, window, s, e) in the rule's order
    owner = windows.max_context() if rule == "run_squad" else None
    for w, (a, b) in enumerate(windows.spans):
        n = len(windows.rows[w])
        lo, hi = windows.first, windows.first + b - a                        # the window's context positions
        if rule == "pipeline":
            cls_score, spans = _pipeline_window(start_logits[w][:n], end_logits[w][:n], lo, hi, top_k, max_answer_len)
        else:                                           # starts whose max-context window this is
            mine = [owner[p] == w for p in range(a, b)]
            cls_score, spans = _squad_window(start_logits[w][:n], end_logits[w][:n], lo, hi, top_k, max_answer_len,
                                             mine)
        null = min(null, cls_score)
        found += [(score, w, s, e) for score, s, e in spans]
    if rule == "pipeline":
        return _by_text(windows, found, align_to_words, merge), null
    return _by_span(windows, found, top_k), null


def _pipeline_window(start_logits, end_logits, lo: int, hi: int, top_k: int, max_answer_len: int):
    """p_start([CLS]) * p_end([CLS]), and the window's top_k spans (score, s, e) inside the context."""
    n = len(start_logits)
    allowed = torch.zeros(n, dtype=torch.bool)
    allowed[0] = True
    allowed[lo:hi] = True
    ps, pe = (torch.softmax(torch.where(allowed, x, torch.full_like(x, _OUTSIDE)), -1)
              for x in (start_logits, end_logits))
    cls_score = float(ps[0] * pe[0])
    ps[0] = pe[0] = 0.0
    flat = torch.triu(torch.tril(ps[:, None] * pe[None, :], max_answer_len - 1)).flatten()   # end in [start, +len)
    # the top_k of a stable sort, without sorting all n^2 spans: every span at or above the k-th best score
    kth = flat.topk(min(top_k, flat.numel())).values[-1]
    candidates = torch.nonzero(flat >= kth).flatten()
    order = candidates[torch.sort(-flat[candidates], stable=True).indices][:top_k].tolist()
    spans = [(float(flat[i]), *divmod(i, n)) for i in order]
    return cls_score, [(score, s, e) for score, s, e in spans if allowed[s] and allowed[e]]


def _squad_window(start_logits, end_logits, lo: int, hi: int, top_k: int, max_answer_len: int, mine: list[bool]):
    """The [CLS] start + end logit, and the pairs of the top_k start and end logits over the context (context
    positions lo..hi), the start one of `mine`."""
    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    s_top = lo + np.argsort(-start_logits[lo:hi])[:top_k]
    e_top = lo + np.argsort(-end_logits[lo:hi])[:top_k]
    spans = [(float(start_logits[s] + end_logits[e]), s, e) for s in s_top if mine[s - lo] for e in e_top
             if s <= e and e - s + 1 <= max_answer_len]
    return float(start_logits[0] + end_logits[0]), spans


def _by_text(windows: Windows, found: list, align_to_words: bool, merge: str) -> list[dict]:
    """Answers keyed by their lower-cased text: scores added (merge="sum") or the best one kept."""
    answers: dict[str, dict] = {}
    for score, w, s, e in found:
        start, end = windows.char_span(w, s, e, align_to_words)
        text = windows.context[start:end]
        seen = answers.get(text.lower())
        if seen is None:
            answers[text.lower()] = {"score": score, "start": start, "end": end, "answer": text}
        else:
            seen["score"] = seen["score"] + score if merge == "sum" else max(seen["score"], score)
    return list(answers.values())


def _by_span(windows: Windows, found: list, top_k: int) -> list[dict]:
    """The top_k character spans, best first, each at its best score, with their probabilities."""
    best: dict[tuple[int, int], float] = {}
    for score, w, s, e in sorted(found, key=lambda c: -c[0]):
        best.setdefault(windows.char_span(w, s, e, False), score)
    answers = [{"score": score, "start": a, "end": b, "answer": windows.context[a:b]}
               for (a, b), score in itertools.islice(best.items(), top_k)]
    p = np.exp(np.array([x["score"] for x in answers]) - (answers[0]["score"] if answers else 0.0))   # best first
    for x, pr in zip(answers, p / p.sum()):
        x["probability"] = float(pr)
    return answers
