"""Contrastive and scored-pair losses on the column embeddings a batch produced, each (batch, dim), in column order:

    MultipleNegativesRankingLoss   [anchors, positives, negatives_1, ..., negatives_n]      (InfoNCE)
    CoSENTLoss, CosineMSELoss      [texts, text_pairs] + scores (batch,)

Multiple-negatives ranking (in-batch negatives, Henderson et al. 2017) scores anchor i against every candidate, laid
out as sentence-transformers lays them out, [positives (B), negatives_1 (B), ...], so candidate i is its positive:
logits = scale * cos(anchors, candidates), (B, B * (1 + n)); loss = cross_entropy(logits, arange(B)). `symmetric`
averages in the positive -> anchors direction. With `keys` (equal for equal texts: `text_keys`), false negatives
(positive i's text, or the positive of a row whose anchor has anchor i's text) are masked out of row i.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import ConfigError

__all__ = ["MultipleNegativesRankingLoss", "CoSENTLoss", "CosineMSELoss", "cosine_matrix", "text_keys",
           "false_negative_mask"]


def _at_least_fp32(x: Tensor) -> Tensor:
    """Scores in fp32 even under bf16 autocast: a softmax over a large batch needs the digits."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """(n, dim), (m, dim) -> (n, m) cosine similarities."""
    return F.normalize(a, p=2, dim=-1) @ F.normalize(b, p=2, dim=-1).T


def text_keys(texts: Sequence[str]) -> Tensor:
    """(n,) int64: equal texts get equal keys (first-seen order), for the false-negative mask."""
    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(t, len(seen)) for t in texts], dtype=torch.long)


def false_negative_mask(anchor_keys: Tensor, candidate_keys: Tensor) -> Tensor:
    """(B,), (B * (1 + n),) keys -> (B, B * (1 + n)) bool, True where candidate j must not be a negative of
    anchor i: it has positive i's text, or it is the positive of a row whose anchor has anchor i's text.
    Row i's own positive (j = i) is never masked."""
    b = anchor_keys.shape[0]
    same_text = candidate_keys.unsqueeze(0) == candidate_keys[:b].unsqueeze(1)            # (B, B(1+n))
    same_anchor = anchor_keys.unsqueeze(0) == anchor_keys.unsqueeze(1)                    # (B, B)
    same_text[:, :b] |= same_anchor
    same_text[torch.arange(b), torch.arange(b)] = False
    return same_text


class MultipleNegativesRankingLoss(nn.Module):
    """InfoNCE over in-batch and hard negatives; see the module docstring."""

    def __init__(self, scale: float = 20.0, learnable_scale: bool = False, symmetric: bool = False,
                 max_scale: float = 100.0):
        super().__init__()
        if not (scale > 0 and math.isfinite(scale)):
            raise ConfigError(f"scale must be a positive number, got {scale!r}")
        if learnable_scale and not scale <= max_scale:
            raise ConfigError(f"scale={scale} exceeds max_scale={max_scale}")
        self.symmetric = symmetric
        self.max_scale = max_scale
        self.learnable = learnable_scale
        self.fixed_scale = float(scale)                  # exact: a float32 log round trip would shift it
        # a learnable temperature trains in log space (as CLIP's logit scale): positive and scale-free steps
        self.log_scale = nn.Parameter(torch.tensor(math.log(scale))) if learnable_scale else None

    @property
    def scale(self) -> Tensor | float:
        if self.log_scale is None:
            return self.fixed_scale
        return self.log_scale.exp().clamp(max=self.max_scale)

    def logits(self, embeddings: Sequence[Tensor], keys: Sequence[Tensor] | None = None) -> Tensor:
        """The (B, B * (1 + n)) scaled cosine scores, -inf at masked false negatives."""
        if len(embeddings) < 2:
            raise ConfigError(f"MultipleNegativesRankingLoss needs anchors and positives, got {len(embeddings)} "
                              f"column(s)")
        anchors, candidates = embeddings[0], torch.cat(list(embeddings[1:]), dim=0)       # (B, d), (B(1+n), d)
        logits = cosine_matrix(_at_least_fp32(anchors), _at_least_fp32(candidates)) * self.scale
        if keys is not None:
            mask = false_negative_mask(keys[0], torch.cat(list(keys[1:]), dim=0))
            logits = logits.masked_fill(mask, float("-inf"))
        return logits

    def forward(self, embeddings: Sequence[Tensor], keys: Sequence[Tensor] | None = None) -> Tensor:
        logits = self.logits(embeddings, keys)                                            # (B, B(1+n))
        b = logits.shape[0]
        target = torch.arange(b, device=logits.device)
        loss = F.cross_entropy(logits, target)
        if self.symmetric:
            # positive i against every anchor: the transposed positives block, masked by the same rule
            loss = (loss + F.cross_entropy(logits[:, :b].T, target)) / 2
        return loss


class CoSENTLoss(nn.Module):
    """CoSENT (Su 2022): every pair (i, j) with score_i > score_j should have cos_i > cos_j:

        loss = log(1 + sum over score_i > score_j of exp(scale * (cos_j - cos_i)))
    """

    def __init__(self, scale: float = 20.0):
        super().__init__()
        self.scale = scale

    def forward(self, embeddings: Sequence[Tensor], scores: Tensor) -> Tensor:
        a, b = embeddings
        cos = F.cosine_similarity(_at_least_fp32(a), _at_least_fp32(b), dim=-1) * self.scale  # (B,)
        diff = cos.unsqueeze(0) - cos.unsqueeze(1)                                        # [i, j] = cos_j - cos_i
        scores = scores.reshape(-1).to(cos.device)
        ordered = scores.unsqueeze(1) > scores.unsqueeze(0)                               # score_i > score_j
        terms = diff.masked_fill(~ordered, float("-inf")).reshape(-1)
        return torch.logsumexp(torch.cat([terms.new_zeros(1), terms]), dim=0)             # the 1 is exp(0)


class CosineMSELoss(nn.Module):
    """Mean squared error between cos(a, b) and the gold score (scores in [-1, 1] or [0, 1])."""

    def forward(self, embeddings: Sequence[Tensor], scores: Tensor) -> Tensor:
        a, b = embeddings
        cos = F.cosine_similarity(_at_least_fp32(a), _at_least_fp32(b), dim=-1)          # (B,)
        return F.mse_loss(cos, scores.reshape(-1).to(cos))
