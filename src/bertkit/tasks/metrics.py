"""Evaluation metrics for the fine-tuning tasks, in plain Python / numpy (no scikit-learn, no seqeval): classification
and regression as scikit-learn / scipy compute them (Spearman = Pearson of average ranks), entity scores by the
CoNLL conlleval / seqeval default conventions (IOB1, IOB2 and BIOES alike), SQuAD v1.1 / v2.0 as the official
script scores them.
"""

from __future__ import annotations

import collections
import math
import re
import string

import numpy as np

__all__ = ["accuracy", "prf", "f1_binary", "f1_macro", "mcc", "pearson", "spearman", "confusion_matrix",
           "classification_report", "get_entities", "convert_tags", "entity_scores",
           "normalize_answer", "squad_exact", "squad_f1", "squad_scores", "best_null_threshold"]


# --------------------------------------------------------------------------------------------- classification

def accuracy(y_true, y_pred) -> float:
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return float((y_true == y_pred).mean()) if len(y_true) else 0.0


def prf(tp: float, fp: float, fn: float) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


def f1_binary(y_true, y_pred, positive: int = 1) -> float:
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    tp = float(((y_pred == positive) & (y_true == positive)).sum())
    fp = float(((y_pred == positive) & (y_true != positive)).sum())
    fn = float(((y_pred != positive) & (y_true == positive)).sum())
    return prf(tp, fp, fn)[2]


def confusion_matrix(y_true, y_pred, num_labels: int | None = None) -> np.ndarray:
    """(num_labels, num_labels) counts, rows = gold, columns = predicted."""
    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    n = num_labels or int(max(y_true.max(initial=-1), y_pred.max(initial=-1)) + 1)
    cm = np.zeros((n, n), dtype=np.int64)
    np.add.at(cm, (y_true, y_pred), 1)
    return cm


def _per_class(cm: np.ndarray) -> list[tuple[float, float, float]]:
    """(precision, recall, f1) of each class of a confusion matrix (rows gold, columns predicted)."""
    tp = np.diag(cm).astype(float)
    return [prf(tp[k], cm[:, k].sum() - tp[k], cm[k].sum() - tp[k]) for k in range(len(cm))]


def f1_macro(y_true, y_pred, num_labels: int | None = None) -> float:
    """Unweighted mean of per-class F1 over the classes present in gold or predictions (as scikit-learn)."""
    cm = confusion_matrix(y_true, y_pred, num_labels)
    present = (cm.sum(0) + cm.sum(1)) > 0
    f1s = [f for k, (_, _, f) in enumerate(_per_class(cm)) if present[k]]
    return float(np.mean(f1s)) if f1s else 0.0


def mcc(y_true, y_pred, num_labels: int | None = None) -> float:
    """Matthews correlation coefficient, multi-class (R_K statistic); 0 when undefined."""
    cm = confusion_matrix(y_true, y_pred, num_labels).astype(float)
    t, p = cm.sum(1), cm.sum(0)          # gold / predicted counts per class
    c, s = np.trace(cm), cm.sum()
    num = c * s - t @ p
    den = math.sqrt(s * s - p @ p) * math.sqrt(s * s - t @ t)
    return float(num / den) if den else 0.0


def classification_report(y_true, y_pred, labels: list[str]) -> dict:
    """Accuracy, macro F1, MCC, (binary F1 for two classes), per-class P/R/F1/support and the confusion matrix."""
    cm = confusion_matrix(y_true, y_pred, len(labels))
    per = {name: {"precision": p, "recall": r, "f1": f, "support": int(cm[k].sum())}
           for k, (name, (p, r, f)) in enumerate(zip(labels, _per_class(cm)))}
    out = {"accuracy": accuracy(y_true, y_pred), "f1_macro": f1_macro(y_true, y_pred, len(labels)),
           "mcc": mcc(y_true, y_pred, len(labels)), "per_class": per, "confusion_matrix": cm.tolist()}
    if len(labels) == 2:
        out["f1"] = f1_binary(y_true, y_pred, 1)
    return out


# ------------------------------------------------------------------------------------------------- regression

def pearson(x, y) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    den = math.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / den) if den else 0.0


def _ranks(x) -> np.ndarray:
    """1-based ranks, ties get the average of the ranks they span."""
    _, which, counts = np.unique(np.asarray(x, dtype=np.float64), return_inverse=True, return_counts=True,
                                 equal_nan=False)
    last = np.cumsum(counts)            # the rank of each distinct value's last copy; its copies average down
    return (last - (counts - 1) / 2)[which]


def spearman(x, y) -> float:
    return pearson(_ranks(x), _ranks(y))


# ---------------------------------------------------------------------------------------- sequence labelling

def _split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''); a bare 'PER' reads as ('I', 'PER') (IO tagging)."""
    if tag in ("O", "", "-"):
        return "O", ""
    if len(tag) > 1 and tag[1] in "-_" and tag[0] in "BIESLU":
        prefix = {"L": "E", "U": "S"}.get(tag[0], tag[0])  # BILOU spelling
        return prefix, tag[2:]
    return "I", tag


def _chunk_ends(prev: str, prev_type: str, cur: str, cur_type: str) -> bool:
    if prev in ("E", "S"):
        return True
    if prev in ("B", "I"):
        return cur in ("B", "S", "O") or cur_type != prev_type
    return False


def _chunk_starts(prev: str, prev_type: str, cur: str, cur_type: str) -> bool:
    if cur in ("B", "S"):
        return True
    if cur in ("I", "E"):
        return prev in ("O", "E", "S") or cur_type != prev_type
    return False


def get_entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """Chunks of one sentence as (type, start, end) with `end` inclusive (seqeval's convention), any scheme."""
    out = []
    prev, prev_type, start = "O", "", None
    for i, tag in enumerate(list(tags) + ["O"]):
        cur, cur_type = _split_tag(tag)
        if start is not None and _chunk_ends(prev, prev_type, cur, cur_type):
            out.append((prev_type, start, i - 1))
            start = None
        if _chunk_starts(prev, prev_type, cur, cur_type):
            start = i
        prev, prev_type = cur, cur_type
    return out


def convert_tags(tags: list[str], to: str = "IOB2") -> list[str]:
    """Re-encode one sentence's tags (any of IOB1/IOB2/BIOES) in scheme `to`."""
    scheme = to.upper()
    out = ["O"] * len(tags)
    prev_end, prev_type = -2, None
    for typ, s, e in get_entities(tags):                  # in order of their starts
        for i in range(s, e + 1):
            out[i] = f"I-{typ}"
        if scheme == "IOB2":
            out[s] = f"B-{typ}"
        elif scheme == "IOB1":
            if prev_end == s - 1 and prev_type == typ:  # B only separates two adjacent chunks of one type
                out[s] = f"B-{typ}"
        elif scheme == "BIOES":
            if s == e:
                out[s] = f"S-{typ}"
            else:
                out[s], out[e] = f"B-{typ}", f"E-{typ}"
        else:
            raise ValueError(f"unknown tagging scheme {scheme!r}; use IOB1, IOB2 or BIOES")
        prev_end, prev_type = e, typ
    return out


def entity_scores(gold: list[list[str]], pred: list[list[str]]) -> dict:
    """Entity-level micro P/R/F1 overall and per type (exact type + span match), seqeval's default mode."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
    tp, n_gold, n_pred = collections.Counter(), collections.Counter(), collections.Counter()
    for g, p in zip(gold, pred):
        if len(g) != len(p):
            raise ValueError(f"a sentence has {len(g)} gold tags but {len(p)} predicted")
        ge, pe = set(get_entities(g)), set(get_entities(p))
        n_gold.update(t for t, *_ in ge)
        n_pred.update(t for t, *_ in pe)
        tp.update(t for t, *_ in ge & pe)
    per = {}
    for t in sorted(set(n_gold) | set(n_pred)):
        p, r, f = prf(tp[t], n_pred[t] - tp[t], n_gold[t] - tp[t])
        per[t] = {"precision": p, "recall": r, "f1": f, "support": n_gold[t]}
    T, G, P = sum(tp.values()), sum(n_gold.values()), sum(n_pred.values())
    p, r, f = prf(T, P - T, G - T)
    n_tok = sum(len(g) for g in gold)
    acc = sum(a == b for g, q in zip(gold, pred) for a, b in zip(g, q)) / n_tok if n_tok else 0.0
    return {"precision": p, "recall": r, "f1": f, "support": G, "token_accuracy": acc, "per_type": per}


# ----------------------------------------------------------------------------------------------------- SQuAD

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """The official SQuAD normalisation: lower, remove punctuation, remove articles, collapse white space."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def squad_exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not p or not g:  # v2.0: no-answer is right only against no-answer
        return float(p == g)
    same = sum((collections.Counter(p) & collections.Counter(g)).values())     # tokens in common
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _gold_texts(answers: list[str]) -> list[str]:
    """Gold answers as the v2.0 script sees them: those that normalise to nothing are dropped; none left = ''."""
    return [a for a in answers if normalize_answer(a)] or [""]


def squad_scores(predictions: dict[str, str], gold: dict[str, list[str]]) -> dict:
    """EM / F1 in percent over the gold questions (a missing prediction counts as ""), plus HasAns / NoAns
    breakdowns when both kinds occur. `gold[qid]` is the list of gold answer texts ([] = unanswerable)."""
    em, f1 = {}, {}
    for qid, answers in gold.items():
        golds = _gold_texts(answers)
        pred = predictions.get(qid, "")
        em[qid] = max(squad_exact(pred, a) for a in golds)
        f1[qid] = max(squad_f1(pred, a) for a in golds)
    n = len(gold)
    out = {"exact": 100.0 * sum(em.values()) / n if n else 0.0, "f1": 100.0 * sum(f1.values()) / n if n else 0.0,
           "total": n}
    has = [q for q, a in gold.items() if any(normalize_answer(x) for x in a)]
    no = [q for q in gold if q not in set(has)]
    if has and no:
        for name, ids in (("HasAns", has), ("NoAns", no)):
            out[f"{name}_exact"] = 100.0 * sum(em[q] for q in ids) / len(ids)
            out[f"{name}_f1"] = 100.0 * sum(f1[q] for q in ids) / len(ids)
            out[f"{name}_total"] = len(ids)
    return out


def best_null_threshold(span_predictions: dict[str, str], null_margins: dict[str, float],
                        gold: dict[str, list[str]], metric: str = "f1") -> tuple[float, float]:
    """The SQuAD 2.0 threshold sweep. `span_predictions[qid]` is the best non-null answer, `null_margins[qid]` the
    null score minus that answer's score (higher = more likely unanswerable); a question is predicted unanswerable
    when its margin > threshold. Returns (best threshold, best score in percent) for `metric` in {"exact", "f1"}.
    """
    score_fn = squad_f1 if metric == "f1" else squad_exact
    qids = list(gold)
    cur = 0.0
    span_gain = {}
    for q in qids:
        golds = _gold_texts(gold[q])
        null_score = max(score_fn("", a) for a in golds)
        span_score = max(score_fn(span_predictions.get(q, ""), a) for a in golds)
        cur += null_score
        span_gain[q] = span_score - null_score
    best, best_thresh = cur, max(null_margins.values(), default=0.0) + 1e-6  # above every margin: all null
    for q in sorted(qids, key=lambda q: null_margins.get(q, 0.0)):     # from all null, by increasing margin
        cur += span_gain[q]
        if cur > best:
            best, best_thresh = cur, null_margins.get(q, 0.0)  # margins <= this one answer, as the sweep went
    # the last switched margin is *included* in "answer", so the predict-null rule is margin > threshold
    return float(best_thresh), 100.0 * best / len(qids) if qids else 0.0
