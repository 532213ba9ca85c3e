"""Several masks, decoded jointly vs each mask's independent argmax, scored on held-out sentences (`bertkit demo`'s
fill-mask stage, `benchmarks/fillmask.py`). The decoders are the Predictor's; this module picks words and counts.

    multi_mask_eval(Predictor.load("runs/demo/pretrain/model"), sentences, MultiMaskOptions(span="scattered"))
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from bertkit.errors import ConfigError, DataError
from bertkit.infer import Predictor
from bertkit.predict.decode import join_pieces, top_fills
from bertkit.progress import bar as progress_bar


__all__ = ["MultiMaskOptions", "multi_mask_eval", "SPANS"]

SPANS = ("contiguous", "scattered")


@dataclass(frozen=True)
class MultiMaskOptions:
    n_masks: tuple[int, ...] = (2, 3)   # words masked in a sentence: one of these, drawn per sentence
    # contiguous: k adjacent words, where the masks depend on each other most ("prime minister");
    # scattered: k words anywhere in the sentence
    span: str = "contiguous"
    limit: int = 200                    # sentences scored at most
    beam_size: int = 8
    seed: int = 0
    max_length: int = 128               # longer sentences (in pieces, with [CLS] and [SEP]) are passed over
    progress: bool = False

    def __post_init__(self):
        if self.span not in SPANS:
            raise ConfigError(f"span={self.span!r} is not one of {SPANS}")
        if not self.n_masks or min(self.n_masks) < 1:
            raise ConfigError(f"n_masks={self.n_masks!r} must hold mask counts >= 1")


def multi_mask_eval(predictor: "Predictor", sentences: Sequence[str], options: MultiMaskOptions | None = None) -> dict:
    """Mask whole one-piece words (alphabetic: one [MASK] = one word) of held-out sentences and compare the decoders:
    counts and rates of exact sentences (every mask right) and of right masks, plus a few examples."""
    opts = options or MultiMaskOptions()
    cases = _mask_cases(predictor.tokenizer, sentences, opts)
    if not cases:
        raise DataError("no sentence had enough one-piece words to mask")
    stats, examples = _decode_cases(predictor, cases, opts)
    n, n_masks = len(cases), sum(len(c[1]) for c in cases)
    out = {"span": opts.span, "sentences": n, "masks": n_masks, "beam_size": opts.beam_size}
    for name, (exact, right) in stats.items():
        out.update({f"{name}_exact": exact / n, f"{name}_per_mask": right / n_masks, f"{name}_exact_count": exact})
    return {**out, "examples": examples}


def _mask_cases(tok, sentences: Sequence[str], opts: MultiMaskOptions) -> list[tuple[list[int], list[int], list[int]]]:
    """Up to `opts.limit` (ids with [MASK]s, mask positions, the masked words' ids), one per usable sentence."""
    rng = random.Random(opts.seed)
    cases = []
    for s in sentences:
        words = tok.basic_tokenize(s)
        pieces = [tok.tokenize(w) for w in words]
        if sum(len(p) for p in pieces) + 2 > opts.max_length or len(words) < 6:
            continue
        ok = [len(p) == 1 and words[i].isalpha() and p[0] in tok.vocab for i, p in enumerate(pieces)]
        chosen = _choose_words(ok, rng.choice(list(opts.n_masks)), opts.span, rng)
        if chosen is None:
            continue
        body, positions, truth = [], [], []
        for i, p in enumerate(pieces):
            if i in chosen:
                positions.append(len(body) + 1)                     # +1: [CLS]
                truth.append(tok.vocab[p[0]])
                body.append(tok.mask_token_id)
            else:
                body.extend(tok.convert_tokens_to_ids(p))
        cases.append((tok.build_inputs([body])["input_ids"][0], positions, truth))
        if len(cases) >= opts.limit:
            break
    return cases


def _choose_words(ok: list[bool], k: int, span: str, rng: random.Random) -> list[int] | None:
    """Indices of k maskable words (`ok`): adjacent ones for span "contiguous", else any; None if there are none."""
    if span == "contiguous":
        starts = [i for i in range(len(ok) - k + 1) if all(ok[i:i + k])]
        if not starts:
            return None
        st = rng.choice(starts)
        return list(range(st, st + k))
    cand = [i for i, o in enumerate(ok) if o]
    if len(cand) < k:
        return None
    return sorted(rng.sample(cand, k))


def _decode_cases(predictor: "Predictor", cases, opts: MultiMaskOptions) -> tuple[dict, list[dict]]:
    """Per decoder [exact matches, correct masks], and up to 8 sentences where joint and independent differ."""
    tok = predictor.tokenizer
    it = progress_bar(cases, show=opts.progress, desc=f"fill-mask eval ({opts.span})", unit="sent")
    # "independent_words": the per-mask argmax with joint's word-start constraint, so what joint decoding adds
    # shows apart from what the constraint adds
    stats = {"joint": [0, 0], "independent": [0, 0], "independent_words": [0, 0]}
    examples = []
    for ids, positions, truth in it:
        joint = tok.convert_tokens_to_ids(
            predictor.joint_fill(ids, positions, top_k=1, beam_size=opts.beam_size)[0].tokens)
        lp = predictor.log_probs([ids], positions)[0]                    # one forward for both baselines
        indep = top_fills(lp, predictor.fills.not_special, 1)[1][:, 0].tolist()
        indep_w = top_fills(lp, predictor.fills.word_start, 1)[1][:, 0].tolist()
        for name, pred in (("joint", joint), ("independent", indep), ("independent_words", indep_w)):
            stats[name][0] += int(pred == truth)
            stats[name][1] += sum(int(a == b) for a, b in zip(pred, truth))
        if len(examples) < 8 and joint != indep:
            examples.append({"masked": join_pieces(tok, ids[1:-1]),
                             "truth": tok.convert_ids_to_tokens(truth), "joint": tok.convert_ids_to_tokens(joint),
                             "independent": tok.convert_ids_to_tokens(indep)})
    return stats, examples
