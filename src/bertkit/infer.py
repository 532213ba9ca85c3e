"""Predictor: the Python front door to inference: fill-mask (jointly over several masks), embeddings, similarity
search, the heads' predictions, attention maps. It parses inputs and shapes outputs; loading, batching, the forward
pass, precision (fp32 unless `precision=`) and the heads' decoders are the engine's (bertkit.predict).

    p = Predictor.load("runs/demo/pretrain/final")       # any HF-format BERT directory
    p.fill_mask("Paris is the [MASK] of France.")        # top-k words with probabilities
    p.fill_mask("The [MASK] [MASK] said on Monday.")     # both masks decoded jointly
    p.embed(["A man is eating food."])                    # (n, dims) numpy, the model's pooling and modules
    p.encode(["what is BERT?"], prompt_name="query")      # SentenceTransformer.encode's call
    p.attention("Bert notices the hat ...")               # tokens + per-layer (heads, seq, seq) maps

Fill-mask, one mask: the top-k word-start pieces, and the words the vocabulary splits ("cap ##ital"): the slot as
2..max_pieces masks decoded left to right (beam of `beam_size`), scored by the product of the pieces' conditional
probabilities; a split of a word the vocabulary holds whole is dropped (the tokenizer never splits it so).
Several masks: each mask's argmax from one pass gives incoherent fills ("the prime prime minister"), so a beam
search fills the most confident open mask per step, re-running the model, and re-ranks the beams by
pseudo-log-likelihood (PLL); the independent argmax joins the re-ranking, so the joint answer never scores below it.

Embeddings: the model's own modules (a sentence-transformers directory's pooling, Dense, Normalize and default
prompt; else the mean of the token vectors), or `pooling="mean"` / `"cls"` (special tokens included, as
sentence-transformers pools) over the last layer or the mean of `layers=[-1, -2]`; `normalize=True` L2-normalises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from bertkit import runtime
from bertkit.embed.index import search_vectors
from bertkit.embed.pooling import Pooling, Prompts, SentenceEncoder
from bertkit.embed.st_format import is_sentence_transformers_dir, load_tokenizer, read_prompts, sentence_pipeline
from bertkit.errors import BertkitError, CheckpointError, ConfigError
from bertkit.heads import IGNORE_INDEX
from bertkit.hub import resolve_model_dir
from bertkit.predict.answers import Windows, best_spans
from bertkit.predict.decode import (FillVocab, class_scores, join_pieces, label_names, score_function, top_fills,
                                    word_ids, word_labels)
from bertkit.predict.engine import PRECISION, encode, forward, forward_batches
from bertkit.predict.load import head_of
from bertkit.textfiles import read_lines
from bertkit.tokenizer.inputs import pad_batch

__all__ = ["Predictor", "cosine_search", "read_lines"]


@dataclass
class FillResult:
    tokens: list[str]        # one per mask
    score: float             # probability (one mask) or exp(PLL) (several masks)
    sequence: str

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "score": float(f"{self.score:.4g}"),
                "log_pll": round(math.log(max(self.score, 1e-300)), 4), "sequence": self.sequence}


EMBED_MAX_LENGTH = 256      # pieces per text `embed` reads where the model does not say (no sentence-transformers config)


def _require_strings(texts) -> list[str]:
    """`texts` as a list of strings; a bare string (not a list of them) or a non-string item is one error line."""
    if isinstance(texts, str):
        raise BertkitError(f"expected a list of texts, got the string {texts!r:.40}")
    texts = list(texts)
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise BertkitError(f"texts[{bad}] is {type(texts[bad]).__name__} {texts[bad]!r:.40}, expected a string")
    return texts


class Predictor:
    """A loaded model + tokenizer with the inference entry points. `task` is mlm | classify | tag | answer | encoder."""

    def __init__(self, model, tokenizer, task: str, labels: list[str] | None = None, name: str = "model",
                 st_dir: Path | None = None, precision: str = PRECISION, directory: Path | None = None):
        self.model = model.eval()
        self.directory = directory          # a CrossEncoder's activation is read there
        self._st_dir = st_dir               # a sentence-transformers directory: its pooling / Dense modules
        self._encoders: dict[tuple, SentenceEncoder] = {}     # by sentence_encoder's options
        self.tokenizer = tokenizer
        self.task = task
        self.labels = labels or (label_names(model.config) if task in ("classify", "tag") else None)
        self.name = name
        self.precision = precision
        self.device = next(model.parameters()).device
        self._special = {tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
                         tokenizer.mask_token_id, tokenizer.unk_token_id}
        self.fills = FillVocab.of(tokenizer)
        # the vocab can be padded past the tokenizer (multiple of 8): never predict the padding rows
        self._n_vocab = len(tokenizer.ids_to_tokens)

    # ---------------------------------------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", precision: str = PRECISION) -> "Predictor":
        try:
            torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise ConfigError(f"device={device!r:.40}: not a torch device (cpu, cuda, cuda:N, mps)") from None
        model_dir = resolve_model_dir(path)
        if not model_dir.is_dir():
            raise CheckpointError(f"{model_dir}: no such model directory")
        model_class, task = head_of(model_dir)
        # frozen: fused, cast-once (and where this machine measured it faster, prepacked) inference weights
        model = runtime.freeze(model_class.from_pretrained(str(model_dir)).to(device))
        tok = load_tokenizer(model_dir)
        st_dir = model_dir if is_sentence_transformers_dir(model_dir) else None
        return cls(model, tok, task, name=model_dir.name, st_dir=st_dir, precision=precision,
                   directory=model_dir)

    @cached_property
    def pipeline(self):
        """The directory's sentence-transformers modules around self.encoder, built on first use (only embeddings
        read modules.json)."""
        if self._st_dir is not None:
            return sentence_pipeline(self._st_dir, self.encoder, self.tokenizer).to(self.device).eval()
        return None

    @property
    def embedding_dim(self) -> int:
        """Width of `embed`'s default vectors (after a sentence-transformers Dense projection, if any)."""
        return self.pipeline.dim if self.pipeline is not None else self.encoder.config.hidden_size

    @property
    def embed_max_length(self) -> int:
        """Pieces per text `embed` reads by default: a sentence-transformers directory's max_seq_length, else
        EMBED_MAX_LENGTH within the model's positions (also where its modules cannot run: `pooling=` still can)."""
        fallback = min(EMBED_MAX_LENGTH, self.encoder.config.max_input_length)
        try:
            pipe = self.pipeline             # the module list only: a spoiled prompts file does not change the length
        except CheckpointError:
            return fallback
        return pipe.max_seq_length if pipe is not None else fallback

    @property
    def has_mlm(self) -> bool:
        return self.task == "mlm"

    @property
    def encoder(self):
        """The BertModel inside a head model (HF naming: `.bert`), or the model itself."""
        return getattr(self.model, "bert", self.model)

    # ---------------------------------------------------------------------------------------------- helpers
    def inputs(self, texts: Sequence[str], pairs: Sequence[str] | None = None, max_length: int = 256) -> dict:
        """Model inputs on the device: [CLS] a [SEP] (b [SEP]) per text, cut longest-first to max_length."""
        return encode(self.tokenizer, _require_strings(texts), pairs, max_length, self.device)

    def logits(self, texts: Sequence[str], pairs: Sequence[str] | None = None, max_length: int = 256,
               batch_size: int = 64) -> np.ndarray:
        """(n, labels) float32 logits of a sequence classifier for texts (or text pairs)."""
        texts = _require_strings(texts)
        pairs = None if pairs is None else _require_strings(pairs)
        lengths = [len(t) + (len(pairs[i]) if pairs is not None else 0) for i, t in enumerate(texts)]
        out = np.zeros((len(texts), self.model.config.num_labels), dtype=np.float32)
        batches = forward_batches(
            self.model, lengths,
            lambda idx: self.inputs([texts[i] for i in idx], pairs and [pairs[i] for i in idx], max_length),
            batch_size, self.precision)
        for idx, _, o in batches:
            out[idx] = o.logits.float().cpu().numpy()
        return out

    def masked_ids(self, text: str, max_length: int | None = None) -> list[int]:
        """The model inputs of `text`, each literal mask token ("[MASK]", RoBERTa's "<mask>") as the mask id."""
        tok = self.tokenizer
        if not isinstance(text, str):
            raise BertkitError(f"fill-mask takes text with {tok.ids_to_tokens[tok.mask_token_id]}, got "
                               f"{type(text).__name__}")
        ids = list(tok(text)["input_ids"])
        if tok.mask_token_id not in ids:
            raise BertkitError(f"fill-mask: no {tok.mask_token} in the text {text[:80]!r}")
        if max_length is not None and len(ids) > max_length:
            raise BertkitError(f"text is {len(ids)} tokens; the limit is {max_length}")
        return ids

    def log_probs(self, rows: list[list[int]], positions: Sequence[int]) -> torch.Tensor:
        """Masked-LM log-probabilities at `positions` of equal-length rows: (n, len(positions), vocab). The positions
        go to the head as labels, so only those rows are projected onto the vocabulary (most of the cost otherwise)."""
        order = sorted(set(positions))
        batch = pad_batch(rows, None, self.tokenizer.pad_token_id, device=self.device)
        batch["labels"] = torch.full_like(batch["input_ids"], IGNORE_INDEX)
        batch["labels"][:, order] = 0                        # any valid id: we only want the logits
        out = forward(self.model, batch, self.precision, masked_logits_only=True)
        # BertForPreTraining names them prediction_logits, BertForMaskedLM logits
        logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
        if logits.dim() == 3:                                # a head that ignores labels: (n, seq, vocab)
            logits = logits[:, order]
        logits = logits.reshape(len(rows), len(order), -1)[..., : self._n_vocab].float()
        lp = torch.log_softmax(logits, dim=-1).cpu()
        where = {p: i for i, p in enumerate(order)}
        return lp[:, [where[p] for p in positions]]

    # ---------------------------------------------------------------------------------------------- fill-mask
    def fill_mask(self, text: str, top_k: int = 5, beam_size: int = 8, whole_word: bool = True, max_pieces: int = 3,
                  max_length: int = 512) -> dict:
        """One mask: {"masks": 1, "candidates": [{"word", "score", "pieces", "sequence"}]}.
        Several masks: {"masks": n, "candidates": [{"tokens", "score", "sequence"}]} from joint decoding."""
        self._require_mlm()
        vocab = self.encoder.config.vocab_size      # no more candidates (or beams) than there are pieces
        top_k, beam_size = min(top_k, vocab), min(beam_size, vocab)
        ids = self.masked_ids(text, max_length)
        positions = [i for i, t in enumerate(ids) if t == self.tokenizer.mask_token_id]
        if len(positions) == 1:
            cands = self._fill_one(ids, positions[0], top_k, beam_size, max_pieces if whole_word else 1)
            return {"masks": 1, "candidates": cands}
        results = self.joint_fill(ids, positions, top_k=top_k, beam_size=beam_size)
        return {"masks": len(positions), "candidates": [r.as_dict() for r in results]}

    def _require_mlm(self):
        if not self.has_mlm:
            raise BertkitError(f"{self.name} has no masked-LM head (it is a {self.task} model); fill-mask needs one")

    def _fill_one(self, ids: list[int], pos: int, top_k: int, beam_size: int, max_pieces: int) -> list[dict]:
        vals, idx = top_fills(self.log_probs([ids], [pos])[0, 0], self.fills.word_start, top_k)
        cands = {join_pieces(self.tokenizer, [i]): (v, [i]) for v, i in zip(vals.tolist(), idx.tolist())}
        for n in range(2, max_pieces + 1):
            for pieces, score in self._fill_word(ids, pos, n, beam_size):
                word = join_pieces(self.tokenizer, pieces)
                if word in self.tokenizer.vocab:      # the tokenizer would keep it whole: not a real split
                    continue
                if word not in cands or cands[word][0] < score:
                    cands[word] = (score, pieces)
        ranked = sorted(cands.items(), key=lambda kv: -kv[1][0])[:top_k]
        tok = self.tokenizer
        return [{"word": word, "score": round(math.exp(score), 6), "pieces": tok.convert_ids_to_tokens(pieces),
                 "sequence": join_pieces(tok, ids[:pos] + pieces + ids[pos + 1:], self._special)}
                for word, (score, pieces) in ranked]

    def _fill_word(self, ids: list[int], pos: int, n: int, beam_size: int) -> list[tuple[list[int], float]]:
        """Replace the mask at `pos` by n masks; decode them left to right: word-start piece, then ## pieces."""
        mask = self.tokenizer.mask_token_id
        base = ids[:pos] + [mask] * n + ids[pos + 1:]
        beams: list[tuple[list[int], float]] = [([], 0.0)]
        for step in range(n):
            if not beams:        # e.g. a vocabulary without "##" pieces
                return []
            rows = [base[:pos] + p + base[pos + step:] for p, _ in beams]
            lp = self.log_probs(rows, [pos + step])[:, 0]             # (beams, vocab)
            allowed = self.fills.word_start if step == 0 else self.fills.continuation
            scores = lp + torch.tensor([s for _, s in beams]).unsqueeze(1)
            vals, flat = top_fills(scores.flatten(), allowed.repeat(len(beams)), beam_size)
            V = lp.shape[1]
            beams = [(beams[f // V][0] + [f % V], v) for v, f in zip(vals.tolist(), flat.tolist()) if v > -math.inf]
        return beams

    def independent_fill(self, ids: list[int], positions: list[int], words: bool = False) -> list[int]:
        """Baseline: the argmax of each mask from one forward pass with every mask still masked (transformers'
        fill-mask pipeline per mask). words=True: only pieces that start a word (no "##" pieces)."""
        self._require_mlm()
        return top_fills(self.log_probs([ids], positions)[0], self.fills.allowed(words), 1)[1][:, 0].tolist()

    def pseudo_log_likelihood(self, rows: list[list[int]], positions: list[int]) -> list[float]:
        """sum_i log p(row[i] | row with only position i masked), for each row (same mask positions)."""
        mask = self.tokenizer.mask_token_id
        probe = [row[:p] + [mask] + row[p + 1:] for row in rows for p in positions]
        lp = self.log_probs(probe, positions)                             # (rows * masks, masks, vocab)
        k = len(positions)
        return [sum(float(lp[b * k + j, j, row[p]]) for j, p in enumerate(positions)) for b, row in enumerate(rows)]

    def joint_fill(self, ids: list[int], positions: list[int], top_k: int = 5, beam_size: int = 8,
                   words: bool = True) -> list[FillResult]:
        """Beam search over the masks (most confident unfilled mask first), re-ranked by pseudo-log-likelihood.

        words=True (the default, as for one mask): every [MASK] stands for one word, so it takes only pieces that
        start a word (a "##" piece would glue onto the word before it)."""
        self._require_mlm()
        beams: list[tuple[list[int], float]] = [(list(ids), 0.0)]
        for _ in range(len(positions)):
            # (beams, masks, beam_size): each mask's best pieces in each beam
            tops, picks = top_fills(self.log_probs([b for b, _ in beams], positions), self.fills.allowed(words),
                                    beam_size)
            candidates: dict[tuple, float] = {}
            for bi, (row, score) in enumerate(beams):
                open_j = [j for j, p in enumerate(positions) if row[p] == self.tokenizer.mask_token_id]
                # the mask the model is surest about goes first: it then conditions the harder ones
                best_j = max(open_j, key=lambda j: float(tops[bi, j, 0]))
                best = positions[best_j]
                for v, t in zip(tops[bi, best_j].tolist(), picks[bi, best_j].tolist()):
                    new = list(row)
                    new[best] = t
                    key = tuple(new)
                    if score + v > candidates.get(key, -math.inf):
                        candidates[key] = score + v
            beams = sorted(((list(k), s) for k, s in candidates.items()), key=lambda b: -b[1])[:beam_size]
        rows = [b for b, _ in beams]
        # the independent per-mask argmax joins the re-ranking, so the joint answer never scores below it
        indep = list(ids)
        for p, t in zip(positions, self.independent_fill(ids, positions, words=words)):
            indep[p] = t
        if indep not in rows:
            rows.append(indep)
        pll = self.pseudo_log_likelihood(rows, positions)
        order = sorted(range(len(rows)), key=lambda i: -pll[i])[:top_k]
        return [FillResult(tokens=self.tokenizer.convert_ids_to_tokens([rows[i][p] for p in positions]),
                           score=math.exp(pll[i]), sequence=join_pieces(self.tokenizer, rows[i], self._special))
                for i in order]

    # ---------------------------------------------------------------------------------------------- embeddings
    @cached_property
    def prompts(self) -> Prompts:
        """The model's named prompts (a sentence-transformers directory's config_sentence_transformers.json)."""
        return read_prompts(self._st_dir) if self._st_dir is not None else Prompts()

    def embed(self, texts: Sequence[str] | str, pooling: str | None = None, layers: Sequence[int] | None = None,
              normalize: bool | None = None, max_length: int | None = None, batch_size: int = 32,
              progress: bool = False, prompt: str | None = None) -> np.ndarray:
        """(n, dims) float32 sentence vectors, or (dims,) for one string as SentenceTransformer.encode gives it; see
        the module docstring for pooling / layers / normalize (None: as the model's modules say). max_length: pieces
        per text, default embed_max_length. prompt: put before each text (None: the model's default prompt)."""
        if isinstance(texts, str):
            return self.embed([texts], pooling, layers, normalize, max_length, batch_size, progress, prompt)[0]
        encoder = self.sentence_encoder(pooling, normalize, layers)
        return encoder.encode(self.tokenizer, _require_strings(texts), batch_size, self.precision, max_length,
                              progress, prompt)               # None: the encoder's max_seq_length (embed_max_length)

    def embed_ids(self, rows: Sequence[list[int]], pooling: str | None = None, normalize: bool | None = None,
                  batch_size: int = 32, prompt_lengths: Sequence[int] | None = None) -> np.ndarray:
        """(n, dims) float32 sentence vectors, as `embed` makes them, of whole model inputs given as ids ([CLS] and
        [SEP] included), each within the model's length; prompt_lengths: see SentenceEncoder.encode_ids."""
        return self.sentence_encoder(pooling, normalize).encode_ids(self.tokenizer, rows, batch_size, self.precision,
                                                                    prompt_lengths)

    def sentence_encoder(self, pooling: str | None = None, normalize: bool | None = None,
                         layers: Sequence[int] | None = None) -> SentenceEncoder:
        """`embed`'s SentenceEncoder: the directory's modules (or the pooling asked for) over this encoder, built
        once per option set. normalize None: as the model's modules say."""
        if pooling not in (None, "mean", "cls"):
            raise BertkitError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        pipe = self.pipeline if pooling is None else None
        normalize = bool(pipe and pipe.normalize) if normalize is None else normalize
        key = (pooling, normalize, None if layers is None else tuple(layers))
        if key not in self._encoders:
            limit = self.encoder.config.max_input_length
            self._encoders[key] = SentenceEncoder(
                self.encoder, pipe.pooling if pipe else Pooling(pooling or "mean"), normalize,
                list(pipe.dense) if pipe else None, pipe.max_seq_length if pipe else min(EMBED_MAX_LENGTH, limit),
                pipe.do_lower_case if pipe else False, layers, self.prompts).eval()
        return self._encoders[key]

    def encode(self, sentences: Sequence[str] | str, prompt_name: str | None = None, prompt: str | None = None,
               batch_size: int = 32, show_progress_bar: bool | None = None, convert_to_numpy: bool = True,
               convert_to_tensor: bool = False, normalize_embeddings: bool = False, **options):
        """SentenceTransformer.encode's call and defaults over `embed`: the model's own modules (its Normalize
        module, if any, and its default prompt); normalize_embeddings=True L2-normalises on top. Of its other
        options, truncate_dim (the first k dimensions, before normalize_embeddings) and
        output_value="sentence_embedding" are taken."""
        unknown = set(options) - {"truncate_dim", "output_value"}
        if unknown or options.get("output_value", "sentence_embedding") != "sentence_embedding":
            bad = sorted(unknown) or [f"output_value={options['output_value']!r}"]
            raise BertkitError(f"Predictor.encode: {', '.join(bad)} not supported (sentence embeddings only)")
        vecs = torch.from_numpy(self.embed([sentences] if isinstance(sentences, str) else sentences,
                                           batch_size=batch_size, progress=bool(show_progress_bar),
                                           prompt=self.prompts.text(prompt, prompt_name)))
        vecs = vecs[:, :options.get("truncate_dim")]
        if normalize_embeddings:
            vecs = torch.nn.functional.normalize(vecs, p=2, dim=1)
        out = vecs if convert_to_tensor else vecs.numpy() if convert_to_numpy else list(vecs)
        return out[0] if isinstance(sentences, str) else out

    # ---------------------------------------------------------------------------------------------- task heads
    def classify(self, texts: Sequence[str], max_length: int = 256, pairs: Sequence[str] | None = None,
                 batch_size: int = 64) -> list[dict]:
        """[{"label", "score", "scores": {label: p}}] (regression models: {"value"}, a list for several outputs)."""
        if self.task != "classify":
            raise BertkitError(f"{self.name} is a {self.task} model, not a sequence classifier")
        logits = self.logits(texts, pairs, max_length, batch_size)
        function = score_function(self.model.config)
        if function == "none":
            values = [[round(float(x), 6) for x in row] for row in logits]
            return [{"value": v[0] if len(v) == 1 else v} for v in values]
        probs = class_scores(logits, function)
        labels = self.labels
        return [{"label": labels[int(np.argmax(row))], "score": round(max(row), 6),
                 "scores": {labels[i]: round(p, 6) for i, p in enumerate(row)}} for row in probs.tolist()]

    def tag(self, texts: Sequence[str], max_length: int = 256, batch_size: int = 64) -> list[list[dict]]:
        """Per word (the tokenizer's basic words): [{"word", "start", "end", "label", "score"}]: the word as written
        in the text (original case and accents), its character span, and the label of its first piece. Words past
        `max_length` pieces get label None."""
        if self.task != "tag":
            raise BertkitError(f"{self.name} is a {self.task} model, not a token classifier")
        texts = _require_strings(texts)
        pieces = self.tokenizer.encode_pieces(texts)
        encoded = [pieces.text(i) for i in range(len(texts))]          # (ids, offsets) per text, uncut
        keep = max_length - 2                                           # pieces that fit beside [CLS] and [SEP]

        def batch(idx):
            return self.tokenizer.build_inputs([encoded[i][0][:keep] for i in idx], padding=True,
                                               padding_side="right", return_tensors="pt").to(self.device)
        out: list = [None] * len(texts)
        for idx, _, o in forward_batches(self.model, [len(ids) for ids, _ in encoded], batch, batch_size,
                                         self.precision):
            probs = torch.softmax(o.logits.float(), -1).cpu()             # (batch, seq, labels)
            for row, i in enumerate(idx):
                out[i] = self._tagged_words(texts[i], *encoded[i], probs[row, 1:], keep)   # 1: after [CLS]
        return out

    def _tagged_words(self, text: str, ids: list[int], offsets: list, probs: torch.Tensor, keep: int) -> list[dict]:
        words = word_ids(self.tokenizer.continues_word(ids))
        best = word_labels(probs, words[:keep])
        labels = self.labels
        spans: dict[int, list[int]] = {}                                # word -> [first piece, last piece]
        for pos, w in enumerate(words):
            spans.setdefault(w, [pos, pos])[1] = pos
        tagged = []
        for w, (a, b) in spans.items():
            start, end = offsets[a][0], offsets[b][1]
            j, p = best.get(w, (None, None))                            # a word past max_length: no label
            tagged.append({"word": text[start:end], "start": start, "end": end,
                           "label": None if j is None else labels[j], "score": None if p is None else round(p, 6)})
        return tagged

    def answer(self, questions: Sequence[str], contexts: Sequence[str], max_length: int = 384,
               max_answer_pieces: int = 64, batch_size: int = 64) -> list[dict]:
        """The best context span: {"answer", "score", "start", "end"}: the answer as written in the context and its
        character span (context[start:end]); spans start and end on word boundaries. A context longer than one
        window is read as windows of max_length pieces overlapping by up to 128; a question keeps its first
        max_length // 3 pieces."""
        if self.task != "answer":
            raise BertkitError(f"{self.name} is a {self.task} model, not a question-answering model")
        questions, contexts = _require_strings(questions), _require_strings(contexts)
        stride = min(128, (max_length - max_length // 3 - 3) // 2)
        windows = [Windows.build(self.tokenizer, q, c, max_length, stride, max_question=max_length // 3)
                   for q, c in zip(questions, contexts)]
        rows = [r for win in windows for r in win.rows]                # every example's windows, one list
        types = [t for win in windows for t in win.types]
        starts, ends = [None] * len(rows), [None] * len(rows)           # start / end logits per window row

        def batch(idx):
            return pad_batch([rows[i] for i in idx], [types[i] for i in idx], self.tokenizer.pad_token_id,
                             device=self.device)
        for idx, _, o in forward_batches(self.model, [len(r) for r in rows], batch, batch_size, self.precision):
            for r, i in enumerate(idx):
                starts[i], ends[i] = o.start_logits[r].float().cpu(), o.end_logits[r].float().cpu()
        out, first = [], 0
        for win in windows:                                             # best_spans reads each row's own length
            mine = slice(first, first + len(win.rows))
            first += len(win.rows)
            answers, _ = best_spans(win, starts[mine], ends[mine], 1, max_answer_pieces, align_to_words=True,
                                    merge="max")
            best = max((a for a in answers if a["answer"]), key=lambda a: a["score"], default=None)
            out.append({"answer": "", "score": 0.0, "start": None, "end": None} if best is None else
                       {"answer": best["answer"], "score": round(best["score"], 6), "start": best["start"],
                        "end": best["end"]})
        return out

    # ---------------------------------------------------------------------------------------------- attention
    def attention(self, text: str, max_length: int = 128) -> tuple[list[str], list[np.ndarray]]:
        """Tokens of `text` ([CLS] .. [SEP], at most `max_length` or the model's positions) and each layer's
        attention probabilities (heads, seq, seq)."""
        limit = min(max_length, self.encoder.config.max_input_length)
        batch = self.inputs([text], max_length=limit)
        out = forward(self.encoder, batch, self.precision, output_attentions=True)
        atts = getattr(out, "attentions", None)
        if not atts:
            raise BertkitError("the model returned no attention maps (output_attentions=True unsupported?)")
        tokens = self.tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
        return tokens, [a[0].float().cpu().numpy() for a in atts]


def cosine_search(query_vecs: np.ndarray, corpus_vecs: np.ndarray, top_k: int = 5) -> list[list[tuple[int, float]]]:
    """For each query row, the top_k (index, cosine) of the corpus rows (vectors need not be normalised)."""
    scores, rows = search_vectors(query_vecs, corpus_vecs, top_k, cosine=True)
    return [[(int(i), float(s)) for i, s in zip(r, sc)] for r, sc in zip(rows, scores)]
