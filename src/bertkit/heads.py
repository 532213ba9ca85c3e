"""Task heads on top of BertModel, with their losses. Parameter names are the HF ones (`bert.*`, `cls.*`, ...).

    BertForPreTraining             MLM + NSP/SOP: cls.predictions (transform, decoder tied to the word embeddings,
                                   own bias) and cls.seq_relationship on the pooled [CLS]
    BertForMaskedLM                MLM only (no pooler)
    BertForSequenceClassification  pooled [CLS] -> dropout -> classifier; CE / MSE (num_labels == 1) / BCE
    BertForTokenClassification     every token -> dropout -> classifier; CE ignoring -100
    BertForReplacedTokenDetection  ELECTRA's discriminator: one "replaced?" logit a token; BCE over the real tokens
    BertForQuestionAnswering       every token -> qa_outputs (start, end); CE on clamped positions, averaged.
                                   Padded positions get the most negative logit (never an answer): the one
                                   deliberate difference from transformers, whose span softmax includes them.

MLM with `labels` and `masked_logits_only` (pre-training sets it): only the labelled rows go through the vocabulary
projection, logits (n_masked, vocab) in the order of `output.masked_positions` (flat batch * seq indices), the loss
exactly the full projection's. The last encoder layer then runs for those rows only (`output_rows`): the same values
and gradients, but with dropout the random stream (not its distribution) differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.config import BertConfig
from bertkit.activations import activation
from bertkit.families import family
from bertkit.model import BertModel, BertPreTrainedModel, classifier_dropout
from bertkit.modern import parts
from bertkit.outputs import ENCODER_INPUTS, ModelOutput, extra_field, finish, forward_flags

__all__ = ["BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification",
           "BertForQuestionAnswering", "BertForReplacedTokenDetection", "DiscriminatorHead", "PreTrainingOutput",
           "MaskedLMOutput", "SequenceClassifierOutput", "TokenClassifierOutput", "QuestionAnsweringOutput",
           "IGNORE_INDEX"]

IGNORE_INDEX = -100          # the label of a position no loss reads (transformers' convention); defined only here


# Fields in transformers' order (so out[i] and unpacking agree with it); bertkit's extras last, outside the tuple view
@dataclass
class PreTrainingOutput(ModelOutput):
    loss: Tensor | None = None
    prediction_logits: Tensor | None = None        # (batch, seq, vocab); with labels see masked_logits_only
    seq_relationship_logits: Tensor | None = None  # (batch, 2)
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    mlm_loss: Tensor | None = extra_field()
    nsp_loss: Tensor | None = extra_field()
    masked_positions: Tensor | None = extra_field()  # (n_masked,) flat indices into batch * seq, with labels
    logit_ids: Tensor | None = extra_field()          # training on a vocabulary subset: each logits column's id


@dataclass
class MaskedLMOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None                   # as prediction_logits above
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    masked_positions: Tensor | None = extra_field()
    logit_ids: Tensor | None = extra_field()          # as in PreTrainingOutput


@dataclass
class SequenceClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None                   # (batch, num_labels)
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class TokenClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None                   # (batch, seq, num_labels)
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class QuestionAnsweringOutput(ModelOutput):
    loss: Tensor | None = None
    start_logits: Tensor | None = None             # (batch, seq)
    end_logits: Tensor | None = None               # (batch, seq)
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


# ---------------------------------------------------------------------------------------------- MLM / NSP pieces
class BertPredictionHeadTransform(nn.Module):
    """dense -> act -> LayerNorm: the MLM head's first layer; ModernBERT's `head` before every head's output."""

    def __init__(self, config: BertConfig):
        super().__init__()
        dim = config.embedding_size or config.hidden_size              # back to the (tied) word embeddings' width
        part = parts(config)
        self.dense = nn.Linear(config.hidden_size, dim, bias=part.classifier_bias)
        self.act = activation(part.classifier_activation or family(config.model_type).mlm_act or config.hidden_act)
        self.LayerNorm = nn.LayerNorm(dim, eps=config.layer_norm_eps, bias=part.norm_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """transform -> x @ word_embeddings^T + bias. The decoder weight is the embedding matrix itself (tied), so
    the state_dict holds only `cls.predictions.bias` and the transform; no `decoder.weight` copy exists."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if parts(config).decoder_bias else None
        # a plain attribute (not a submodule): tied, so it is not registered twice
        self.__dict__["_word_embeddings"] = word_embeddings
        # restrict_to: in training, the vocabulary ids scored (None: all) and each id's logits column (-1: none)
        self.register_buffer("candidates", None, persistent=False)
        self.register_buffer("columns", None, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.restricted:                                # (..., n_candidates): column j is id candidates[j]
            bias = None if self.bias is None else self.bias.index_select(0, self.candidates)
            return F.linear(self.transform(x), self._word_embeddings.weight.index_select(0, self.candidates), bias)
        return F.linear(self.transform(x), self._word_embeddings.weight, self.bias)   # (..., vocab)

    @property
    def restricted(self) -> bool:
        return self.training and self.candidates is not None

    def restrict_to(self, ids: Tensor | None) -> None:
        """In training mode score only the vocabulary ids `ids` (a pre-training corpus uses a fraction of a 30k
        vocabulary; the others are never a target, and their softmax columns cost as much as the encoder). Labels
        are then mapped to columns by the loss; eval mode and `restrict_to(None)` score the whole vocabulary."""
        if ids is None:
            self.candidates = self.columns = None
            return
        device = self._word_embeddings.weight.device
        ids = torch.unique(ids.to(device=device, dtype=torch.long))                       # sorted
        columns = torch.full((self._word_embeddings.num_embeddings,), -1, dtype=torch.long, device=device)
        columns[ids] = torch.arange(ids.numel(), device=device)
        self.candidates, self.columns = ids, columns

    def tie_to(self, word_embeddings: nn.Embedding) -> None:
        """Decode with `word_embeddings` (replaced or resized): the bias keeps its rows, new ones start at zero."""
        self.__dict__["_word_embeddings"] = word_embeddings
        n, old = word_embeddings.num_embeddings, self.bias
        if old is not None and old.numel() != n:
            with torch.no_grad():
                bias = old.new_zeros(n)
                bias[: min(n, old.numel())] = old[:n]
            self.bias = nn.Parameter(bias, requires_grad=old.requires_grad)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)


def _masked_positions(labels: Tensor | None) -> Tensor | None:
    """(n_masked,) flat (batch * seq) indices of the labelled tokens, None without labels."""
    return None if labels is None else (labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)


def _masked_lm(predictions: BertLMPredictionHead, sequence_output: Tensor, labels: Tensor | None,
               positions: Tensor | None = None, masked_only: bool = True):
    """(logits, loss, masked_positions). With labels and `masked_only`, project only the rows whose label != -100
    (logits (n_masked, vocab)); `sequence_output` is (batch, seq, hidden), or already those rows, (n_masked, hidden),
    when `positions` is given. Without `masked_only` every row is projected (logits (batch, seq, vocab), as
    transformers returns them) and the loss still reads the masked rows only."""
    if labels is None:
        return predictions(sequence_output), None, None           # (batch, seq, vocab)
    flat = labels.reshape(-1)
    if positions is None:
        positions = _masked_positions(labels)                     # (n_masked,)
        if masked_only:
            sequence_output = sequence_output.reshape(-1, sequence_output.shape[-1]).index_select(0, positions)
    logits = predictions(sequence_output)                         # (n_masked, vocab) or (batch, seq, vocab)
    masked = logits if masked_only else logits.reshape(-1, logits.shape[-1]).index_select(0, positions)
    target = flat.index_select(0, positions)                      # (n_masked,) vocabulary ids
    if predictions.restricted:                                    # ids -> their logits columns
        target = predictions.columns.index_select(0, target)
    return logits, _mlm_loss(masked, target), positions


def _logit_ids(predictions: BertLMPredictionHead) -> Tensor | None:
    """The vocabulary id of each logits column when the head scores a subset (restrict_to), else None."""
    return predictions.candidates if predictions.restricted else None


def _mlm_loss(logits: Tensor, target: Tensor) -> Tensor:
    """Mean cross-entropy of the masked rows' (n_masked, vocab) logits against their labels."""
    if target.numel() == 0:
        return logits.sum() * 0.0  # no masked token: a zero that still has a graph (HF would give NaN)
    return F.cross_entropy(logits.float(), target)


class _HeadModel(BertPreTrainedModel):
    # True: MLM logits of the masked rows only (see the module docstring); forward(masked_logits_only=) per call
    masked_logits_only = False

    def _init_extra(self) -> None:
        for m in self.modules():
            if isinstance(m, BertLMPredictionHead) and m.bias is not None:
                nn.init.zeros_(m.bias)

    # transformers' Trainer passes num_items_in_batch to a forward with **kwargs unless told not to; bertkit's losses
    # are per-batch means, which the Trainer then scales for gradient accumulation itself
    accepts_loss_kwargs = False

    def _flags(self, flags: dict, mlm: bool = False) -> dict:
        """The forward's checked **flags (see bertkit.outputs), with masked_logits_only resolved for MLM heads."""
        flags = forward_flags(type(self).__name__, flags, ENCODER_INPUTS + (("masked_logits_only",) if mlm else ()))
        if mlm and flags.get("masked_logits_only") is None:
            flags["masked_logits_only"] = self.masked_logits_only
        return flags

    def _mlm(self, input_ids, token_type_ids, attention_mask, labels, outputs: tuple[bool, bool], flags: dict):
        """The encoder and the MLM head of BertForPreTraining / BertForMaskedLM: (encoder output, logits, loss,
        masked positions, checked flags); `outputs`: (output_attentions, output_hidden_states)."""
        flags = self._flags(flags, mlm=True)
        masked_only = flags["masked_logits_only"]
        rows = _masked_positions(labels) if self.masked_rows_only and masked_only else None
        out = self.bert(input_ids, token_type_ids, attention_mask, output_attentions=outputs[0],
                        output_hidden_states=outputs[1], output_rows=rows, **_encoder_inputs(flags))
        logits, loss, positions = _masked_lm(self.cls.predictions, out.last_hidden_state, labels, rows, masked_only)
        return out, logits, loss, positions, flags


def _encoder_inputs(flags: dict) -> dict:
    """transformers' position_ids / inputs_embeds among a head's **flags, for BertModel.forward."""
    return {k: flags[k] for k in ENCODER_INPUTS if k in flags}


def _hidden_layer(config: BertConfig) -> BertPredictionHeadTransform | None:
    """The dense + act + norm layer a family puts before every head's output (ModernBERT's `head`), or None."""
    return BertPredictionHeadTransform(config) if family(config.model_type).head_transform else None


def _pool(x: Tensor, attention_mask: Tensor | None, pooling: str) -> Tensor:
    """(batch, seq, hidden) -> (batch, hidden): position 0, or the mean over the real tokens."""
    if pooling == "cls":
        return x[:, 0]
    if attention_mask is None:
        return x.mean(dim=1)
    m = attention_mask.to(x.dtype).unsqueeze(-1)                                      # (batch, seq, 1)
    return (x * m).sum(dim=1) / m.sum(dim=1)


# ---------------------------------------------------------------------------------------------- heads
class BertForPreTraining(_HeadModel):
    """MLM + NSP/SOP; with labels the last layer runs for the masked rows and [CLS] only (`masked_rows_only`)."""
    _head_prefixes = ("cls.", "bert.pooler.")
    masked_rows_only = True

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.init_weights(self.cls)

    def forward(self, input_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None,
                labels: Tensor | None = None, next_sentence_label: Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False, **flags) -> PreTrainingOutput:
        """**flags: return_dict, masked_logits_only (see bertkit.outputs and _HeadModel.masked_logits_only)."""
        out, logits, mlm_loss, positions, flags = self._mlm(input_ids, token_type_ids, attention_mask, labels,
                                                            (output_attentions, output_hidden_states), flags)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)                     # (batch, 2)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.reshape(-1))
        loss = mlm_loss if nsp_loss is None else nsp_loss if mlm_loss is None else mlm_loss + nsp_loss
        return finish(PreTrainingOutput(loss=loss, mlm_loss=mlm_loss, nsp_loss=nsp_loss, prediction_logits=logits,
                                        seq_relationship_logits=nsp_logits, masked_positions=positions,
                                        logit_ids=_logit_ids(self.cls.predictions),
                                        hidden_states=out.hidden_states, attentions=out.attentions), flags)


class BertForMaskedLM(_HeadModel):
    _head_prefixes = ("cls.",)
    masked_rows_only = True                        # see BertForPreTraining

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config, self.bert.embeddings.word_embeddings)
        self.init_weights(self.cls)

    def forward(self, input_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None,
                labels: Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False, **flags) -> MaskedLMOutput:
        """**flags: return_dict, masked_logits_only (see bertkit.outputs and _HeadModel.masked_logits_only)."""
        out, logits, loss, positions, flags = self._mlm(input_ids, token_type_ids, attention_mask, labels,
                                                        (output_attentions, output_hidden_states), flags)
        return finish(MaskedLMOutput(loss=loss, logits=logits, masked_positions=positions,
                                     logit_ids=_logit_ids(self.cls.predictions),
                                     hidden_states=out.hidden_states, attentions=out.attentions), flags)


class BertForSequenceClassification(_HeadModel):
    """The pooled [CLS] is all the head reads, so the last layer runs for [CLS] only (`first_token_only`; False:
    the full layer)."""
    _head_prefixes = ("classifier.", "bert.pooler.")
    first_token_only = True

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.head = _hidden_layer(config)                 # ModernBERT: pooled tokens -> its `head`, no pooler
        self.bert = BertModel(config, add_pooling_layer=self.head is None, classifier=True)   # the family's layer
        self.pooling = parts(config).classifier_pooling
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights(self.classifier)
        if self.head is not None:
            self.init_weights(self.head)

    def problem_type(self, labels: Tensor) -> str:
        """config.problem_type, else inferred as HF does: 1 label -> regression; integer labels -> single-label."""
        if self.config.problem_type is not None:
            return self.config.problem_type
        if self.num_labels == 1:
            return "regression"
        if labels.dtype in (torch.long, torch.int32, torch.int16, torch.int8, torch.uint8):
            return "single_label_classification"
        return "multi_label_classification"

    def forward(self, input_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None,
                labels: Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False, **flags) -> SequenceClassifierOutput:
        flags = self._flags(flags)                              # return_dict (see bertkit.outputs)
        out = self.bert(input_ids, token_type_ids, attention_mask, output_attentions=output_attentions,
                        output_hidden_states=output_hidden_states,
                        first_token_only=self.first_token_only and self.pooling == "cls", **_encoder_inputs(flags))
        pooled = out.pooler_output
        if self.head is not None:
            pooled = self.head(_pool(out.last_hidden_state, attention_mask, self.pooling))
        logits = self.classifier(self.dropout(pooled))                               # (batch, num_labels)
        loss = None
        if labels is not None:
            kind = self.problem_type(labels)
            if kind == "regression":
                if self.num_labels == 1:
                    loss = F.mse_loss(logits.float().squeeze(-1), labels.float().reshape(-1))
                else:
                    loss = F.mse_loss(logits.float(), labels.float())
            elif kind == "single_label_classification":
                loss = F.cross_entropy(logits.float().reshape(-1, self.num_labels), labels.reshape(-1).long())
            else:
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        return finish(SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                               attentions=out.attentions), flags)


class BertForTokenClassification(_HeadModel):
    _head_prefixes = ("classifier.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.head = _hidden_layer(config)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights(self.classifier)
        if self.head is not None:
            self.init_weights(self.head)

    def forward(self, input_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None,
                labels: Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False, **flags) -> TokenClassifierOutput:
        flags = self._flags(flags)                              # return_dict (see bertkit.outputs)
        out = self.bert(input_ids, token_type_ids, attention_mask, output_attentions=output_attentions,
                        output_hidden_states=output_hidden_states, **_encoder_inputs(flags))
        x = out.last_hidden_state if self.head is None else self.head(out.last_hidden_state)
        logits = self.classifier(self.dropout(x))                                    # (batch, seq, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, self.num_labels), labels.reshape(-1).long(),
                                   ignore_index=IGNORE_INDEX)
        return finish(TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                            attentions=out.attentions), flags)


class BertForQuestionAnswering(_HeadModel):
    _head_prefixes = ("qa_outputs.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.head = _hidden_layer(config)
        self.dropout = classifier_dropout(config) if self.head is not None else nn.Identity()
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights(self.qa_outputs)
        if self.head is not None:
            self.init_weights(self.head)

    def forward(self, input_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None,
                start_positions: Tensor | None = None, end_positions: Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False, **flags
                ) -> QuestionAnsweringOutput:
        flags = self._flags(flags)                              # return_dict (see bertkit.outputs)
        out = self.bert(input_ids, token_type_ids, attention_mask, output_attentions=output_attentions,
                        output_hidden_states=output_hidden_states, **_encoder_inputs(flags))
        x = out.last_hidden_state if self.head is None else self.head(out.last_hidden_state)
        logits = self.qa_outputs(self.dropout(x))                                    # (batch, seq, 2)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
        if attention_mask is not None:
            # padding can never hold an answer: exclude it from the span softmax (transformers keeps it, so its
            # loss depends on whatever the padded rows computed; ours is the same for every backend)
            pad = attention_mask == 0
            start_logits = start_logits.masked_fill(pad, torch.finfo(start_logits.dtype).min)
            end_logits = end_logits.masked_fill(pad, torch.finfo(end_logits.dtype).min)
        loss = None
        if start_positions is not None and end_positions is not None:
            # positions outside the sequence (answer truncated away) are clamped to seq and ignored, as in HF
            s = start_logits.shape[1]
            start = start_positions.reshape(-1).clamp(0, s)
            end = end_positions.reshape(-1).clamp(0, s)
            loss = (F.cross_entropy(start_logits.float(), start, ignore_index=s)
                    + F.cross_entropy(end_logits.float(), end, ignore_index=s)) / 2
        return finish(QuestionAnsweringOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                              hidden_states=out.hidden_states, attentions=out.attentions), flags)


class DiscriminatorHead(nn.Module):
    """ELECTRA's discriminator head (its pre-training and transformers' ElectraForPreTraining)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.dense_prediction(self.act(self.dense(x))).squeeze(-1)          # (..., ) one logit a token


class BertForReplacedTokenDetection(_HeadModel):
    """ELECTRA's discriminator: for every token, the logit that a generator replaced it."""
    _head_prefixes = ("discriminator_predictions.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.discriminator_predictions = DiscriminatorHead(config)
        self.init_weights(self.discriminator_predictions)

    def forward(self, input_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None,
                labels: Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False, **flags) -> TokenClassifierOutput:
        """labels: (batch, seq), 1 where the token was replaced; the loss reads the real (unpadded) tokens."""
        flags = self._flags(flags)                              # return_dict (see bertkit.outputs)
        out = self.bert(input_ids, token_type_ids, attention_mask, output_attentions=output_attentions,
                        output_hidden_states=output_hidden_states, **_encoder_inputs(flags))
        logits = self.discriminator_predictions(out.last_hidden_state)               # (batch, seq)
        loss = None
        if labels is not None:
            real = attention_mask.bool() if attention_mask is not None else torch.ones_like(labels, dtype=torch.bool)
            loss = F.binary_cross_entropy_with_logits(logits.float()[real], labels[real].float())
        return finish(TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                            attentions=out.attentions), flags)
