"""Answer spans of a question-answering head, found the way transformers' (4.x) pipeline finds them.

The context is cut into windows: [CLS] question [SEP] context[a:b] [SEP] of at most max_seq_len tokens, each window
starting doc_stride tokens before the previous one ends (the question is never cut). In each window the start and
end logits outside the context (question, separators, padding) are set to -10000 before the softmax ([CLS] takes
part in it, then gets probability 0), a span's score is p(start) * p(end), spans run start <= end < start +
max_answer_len, and each window gives its top_k. The character span is the tokens' offsets, widened to whole words
(align_to_words: the words of the tokenizer's pre-splitting, i.e. a piece and its "##" continuations). Answers with
equal text, compared without case, add their scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertkit.errors import BertkitError
from bertkit.tokenizer.inputs import pad_batch

__all__ = ["Windows", "best_spans"]

_OUTSIDE = -10000.0        # the logit transformers gives tokens that cannot be in the answer


@dataclass
class Windows:
    context: str
    offsets: list[tuple[int, int]]        # each context piece's character span
    word_starts: list[bool]               # each context piece: does it start a word (not a "##" continuation)
    rows: list[list[int]]                 # the windows' input ids: [CLS] question [SEP] context[a:b] [SEP]
    types: list[list[int]]                # their token types
    spans: list[tuple[int, int]]          # the context pieces [a, b) of each window
    first: int                            # position of the first context token in every window

    @classmethod
    def build(cls, tok, question: str, context: str, max_seq_len: int, doc_stride: int,
              max_question: int | None = None) -> "Windows":
        """Windows of `context` under `question` (cut to its first `max_question` pieces, if given)."""
        pieces = tok.encode_pieces([question, context])
        q_ids = pieces.text(0)[0][:max_question]
        c_ids, offsets = pieces.text(1)
        room = max_seq_len - len(q_ids) - 3
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
        enc = tok.build_inputs([q_ids] * len(spans), [c_ids[a:b] for a, b in spans])
        starts = [not tok.ids_to_tokens[t].startswith("##") for t in c_ids]
        return cls(context, offsets, starts, enc["input_ids"], enc["token_type_ids"], spans, len(q_ids) + 2)

    def batch(self, pad_id: int, device) -> dict:
        """The windows as one padded batch of model inputs."""
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


def _probabilities(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.where(allowed, logits, torch.full_like(logits, _OUTSIDE)), -1)


def best_spans(windows: Windows, start_logits, end_logits, top_k: int, max_answer_len: int, align_to_words: bool,
               merge: str = "sum") -> tuple[list[dict], float]:
    """Start / end logits per window (a (windows, seq) tensor, or one row each) -> the answers of every window (merged by text, unsorted: their scores added as transformers' pipeline does,
    or merge="max": the best window's, a probability) and the no-answer score (min over windows of
    p_start([CLS]) * p_end([CLS]))."""
    answers: dict[str, dict] = {}
    null = 1000000.0
    for w, (a, b) in enumerate(windows.spans):
        n = len(windows.rows[w])
        allowed = torch.zeros(n, dtype=torch.bool)
        allowed[0] = True
        allowed[windows.first: windows.first + b - a] = True
        ps = _probabilities(start_logits[w][:n], allowed)
        pe = _probabilities(end_logits[w][:n], allowed)
        null = min(null, float(ps[0] * pe[0]))
        ps[0] = pe[0] = 0.0
        scores = torch.triu(torch.tril(ps[:, None] * pe[None, :], max_answer_len - 1))   # end in [start, +len)
        flat = scores.flatten()
        # the top_k of a stable sort, without sorting all n^2 spans: every span at or above the k-th best score
        kth = flat.topk(min(top_k, flat.numel())).values[-1]
        candidates = torch.nonzero(flat >= kth).flatten()
        order = candidates[torch.sort(-flat[candidates], stable=True).indices][:top_k].tolist()
        for index in order:
            s, e = divmod(index, n)
            if not (allowed[s] and allowed[e]):
                continue
            start, end = windows.char_span(w, s, e, align_to_words)
            text = windows.context[start:end]
            found = answers.get(text.lower())
            if found is not None:
                score = float(flat[index])
                found["score"] = found["score"] + score if merge == "sum" else max(found["score"], score)
            else:
                answers[text.lower()] = {"score": float(flat[index]), "start": start, "end": end, "answer": text}
    return list(answers.values()), null
