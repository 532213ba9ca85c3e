"""ELECTRA replaced-token detection (Clark et al. 2020) as a pre-training objective.

A small BERT generator predicts the masked tokens (its MLM loss is trained too); each masked position gets a token
*sampled* from its softmax (a sample equal to the original counts as original, as in the paper); the discriminator
(encoder + DiscriminatorHead) tells each real token replaced or not. Loss: generator MLM + 50 x discriminator BCE
(the paper's lambda).

The two share the embedding module (the paper shares token and position embeddings). Without an embedding-to-hidden
projection, sharing needs equal widths, so a fresh generator is smaller in *depth* (a third of the layers) and
feed-forward width (half), not in hidden size as in the paper. `from_pretrained` continues a transformers pair
(ElectraForPreTraining + ElectraForMaskedLM generator, narrower, both projecting the shared embeddings); the
generator's own copy of the embeddings is not read, as the paper ties them. After pre-training the discriminator is
the model to fine-tune (`save_pretrained`). Shard batches are used as they are: labels != -100 mark the masked
positions; `next_sentence_label` is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.config import BertConfig
from bertkit.errors import ConfigError
from bertkit.heads import IGNORE_INDEX, BertForMaskedLM, BertForReplacedTokenDetection, DiscriminatorHead
from bertkit.model import BertModel, BertPreTrainedModel

__all__ = ["ElectraForPreTraining", "ElectraOutput", "generator_config"]


@dataclass
class ElectraOutput:
    loss: Tensor
    mlm_loss: Tensor                  # generator MLM loss
    rtd_loss: Tensor                  # discriminator replaced-token-detection loss (unweighted)
    prediction_logits: Tensor         # generator logits at the masked positions, (n_masked, vocab)
    rtd_logits: Tensor                # (batch, seq)
    rtd_correct: Tensor               # () correct replaced/original decisions over non-padding tokens
    rtd_count: Tensor                 # () non-padding tokens
    replaced_share: Tensor            # () share of non-padding tokens that were actually replaced


def generator_config(config: BertConfig, layers: int | None = None, intermediate_size: int | None = None) -> BertConfig:
    """The generator's config: same width (embeddings are shared), a third of the layers, half the FFN width."""
    return config.replace(num_hidden_layers=layers or max(1, config.num_hidden_layers // 3),
                          intermediate_size=intermediate_size or max(1, config.intermediate_size // 2))


class ElectraForPreTraining(nn.Module):
    def __init__(self, config: BertConfig, rtd_weight: float = 50.0, generator: BertConfig | None = None):
        super().__init__()
        self.config = config
        self.rtd_weight = rtd_weight          # the paper's lambda: the binary loss is ~50x smaller than the MLM loss
        self.discriminator = BertModel(config, add_pooling_layer=False)
        self.discriminator_predictions = DiscriminatorHead(config)
        gcfg = generator or generator_config(config)
        width = [(c.embedding_size or c.hidden_size, c.vocab_size) for c in (gcfg, config)]
        if width[0] != width[1]:
            raise ConfigError(f"the generator's embeddings (width, vocab) {width[0]} differ from the discriminator's "
                              f"{width[1]}: the two share them")
        self.generator = BertForMaskedLM(gcfg)
        self.generator.masked_logits_only = True     # sampling below reads the masked rows' (n_masked, vocab) logits
        # share the embedding module; the generator's tied MLM decoder follows the shared word embeddings
        self.generator.bert.embeddings = self.discriminator.embeddings
        self.generator.cls.predictions.__dict__["_word_embeddings"] = self.discriminator.embeddings.word_embeddings
        self.discriminator.init_weights(self.discriminator_predictions)

    @classmethod
    def from_pretrained(cls, path, generator=None, rtd_weight: float = 50.0, **overrides) -> "ElectraForPreTraining":
        """The pair from checkpoints (module docstring): the discriminator and its head from path, the generator from
        the `generator` directory where given, else a fresh one; overrides are config fields of the discriminator."""
        disc = BertForReplacedTokenDetection.from_pretrained(path, **overrides)
        drop = {k: v for k, v in overrides.items() if k.endswith("dropout_prob")}    # --dropout: both halves, as fresh
        gen = BertForMaskedLM.from_pretrained(generator, **drop) if generator is not None else None
        try:
            model = cls(disc.config, rtd_weight, gen.config if gen is not None else None)
        except ConfigError as e:
            raise ConfigError(f"--generator {generator}: {e}") from None
        model.discriminator.load_state_dict(disc.bert.state_dict())
        model.discriminator_predictions.load_state_dict(disc.discriminator_predictions.state_dict())
        if gen is not None:     # all but the embeddings, which are the discriminator's
            state = {k: v for k, v in gen.state_dict().items() if not k.startswith("bert.embeddings.")}
            missing, unexpected = model.generator.load_state_dict(state, strict=False)
            assert not unexpected and all(k.startswith("bert.embeddings.") for k in missing), (missing, unexpected)
            model.generator.masked_logits_only = True
        return model

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                labels: Tensor | None = None, next_sentence_label: Tensor | None = None) -> ElectraOutput:
        if labels is None:
            raise ValueError("ELECTRA pre-training needs `labels` (the masked positions)")
        gen = self.generator(input_ids, token_type_ids, attention_mask, labels=labels)
        masked = labels != IGNORE_INDEX                                          # (batch, seq)
        original = torch.where(masked, labels, input_ids)
        with torch.no_grad():
            probs = torch.softmax(gen.logits.detach().float(), dim=-1)         # (n_masked, vocab)
            sampled = torch.multinomial(probs, 1).squeeze(1) if probs.numel() else original[masked]
            corrupt = original.clone()
            corrupt[masked] = sampled                                            # row-major, as the logits
            replaced = (corrupt != original).float()                             # (batch, seq)
        hidden = self.discriminator(corrupt, token_type_ids, attention_mask).last_hidden_state
        rtd_logits = self.discriminator_predictions(hidden)                      # (batch, seq)
        active = attention_mask.bool() if attention_mask is not None else torch.ones_like(masked)
        logits_a, target_a = rtd_logits[active].float(), replaced[active]
        rtd_loss = F.binary_cross_entropy_with_logits(logits_a, target_a)
        loss = gen.loss + self.rtd_weight * rtd_loss
        with torch.no_grad():
            correct = ((logits_a > 0).float() == target_a).sum()
        return ElectraOutput(loss=loss, mlm_loss=gen.loss, rtd_loss=rtd_loss, prediction_logits=gen.logits,
                             rtd_logits=rtd_logits, rtd_correct=correct,
                             rtd_count=torch.tensor(float(target_a.numel())),
                             replaced_share=target_a.mean() if target_a.numel() else target_a.sum())

    def save_pretrained(self, path, tokenizer=None) -> None:
        """The discriminator (the model to fine-tune) as an HF-format BertModel directory."""
        self.discriminator.save_pretrained(path, tokenizer=tokenizer)

    num_parameters = BertPreTrainedModel.num_parameters     # parameters() lists the shared embeddings once
