"""Feature-based use of BERT (the paper's section 5.3, ELMo-style): a frozen encoder, chosen layers combined, a small
classifier trained on top; the encoder is never updated, so features are computed once for any number of probes.

    X = extract_features(encoder, tok, texts, layers=(-1, -2, -3, -4), combine="concat", pooling="mean")
    probe, info = train_probe(X_train, y_train, X_dev, y_dev, num_labels, ProbeConfig(hidden=0))
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from bertkit import runtime
from bertkit.errors import ConfigError
from bertkit.heads import SequenceClassifierOutput
from bertkit.options import with_options
from bertkit.embed.pooling import Pooling
from bertkit.tasks.batching import BucketBatchSampler, predict_batches
from bertkit.tasks.metrics import accuracy
from bertkit.tasks.task import Feature
from bertkit.train.loop import TrainConfig, seed_everything, train

__all__ = ["extract_features", "FeatureOptions", "ProbeConfig", "Probe", "train_probe"]


@dataclass(frozen=True)
class FeatureOptions:
    layers: tuple[int, ...] = (-1, -2, -3, -4)     # the paper's best feature-based choice: the top four layers
    combine: str = "concat"                        # concat | sum | mean over the layers
    pooling: str = "mean"                          # cls | mean | tokens (one array per text)
    max_length: int = 128
    batch_size: int = 64
    bf16: bool = False

    def __post_init__(self):
        if self.combine not in ("concat", "sum", "mean"):
            raise ConfigError(f"combine={self.combine!r}: use concat, sum or mean")
        if self.pooling not in ("cls", "mean", "tokens"):
            raise ConfigError(f"pooling={self.pooling!r}: use cls, mean or tokens")


def extract_features(model, tok, texts: list[str], pairs: list[str] | None = None,
                     options: FeatureOptions | None = None, **overrides):
    """Frozen-encoder features for `texts`; keywords override fields of `FeatureOptions`.
    `model` is a BertModel or any bertkit model with a `.bert` encoder. Returns a (n, dim) float32 array, or a list
    of (n_pieces, dim) arrays for pooling="tokens"."""
    opts = with_options(FeatureOptions, options, overrides, "extract_features")
    layers, combine, pooling, batch_size = opts.layers, opts.combine, opts.pooling, opts.batch_size
    encoder = getattr(model, "bert", model)
    n_hidden = encoder.config.num_hidden_layers + 1
    for li in layers:
        if not -n_hidden <= li < n_hidden:
            raise ConfigError(f"layer {li} does not exist: the model has hidden states 0..{n_hidden - 1} "
                              f"(0 = embeddings) or -1..-{n_hidden}")
    enc = tok(texts, pairs, max_length=opts.max_length, truncation=True)
    feats = [Feature(input_ids=list(enc["input_ids"][i]), token_type_ids=list(enc["token_type_ids"][i]))
             for i in range(len(texts))]
    # a frozen inference copy: fused, cast-once weights; the caller's (perhaps training) model is left as it is
    encoder = encoder if runtime.is_frozen(encoder) else runtime.freeze(copy.deepcopy(encoder))
    pool = None if pooling == "tokens" else Pooling(pooling)
    out: list = [None] * len(feats)
    for idx, o in predict_batches(encoder, feats, batch_size, opts.bf16, tok.pad_token_id,
                                  {"output_hidden_states": True}):
        hs = [o.hidden_states[li].float() for li in layers]                  # each (batch, seq, hidden)
        h = torch.cat(hs, -1) if combine == "concat" else torch.stack(hs).sum(0)
        if combine == "mean":
            h = h / len(hs)
        lengths = [len(feats[i].input_ids) for i in idx]
        if pool is not None:
            mask = (torch.arange(h.shape[1]) < torch.tensor(lengths)[:, None]).to(h.device)   # (batch, seq)
            h = pool(h, mask)                                                   # (batch, dim)
        for row, (i, n) in enumerate(zip(idx, lengths)):
            out[i] = (h[row, :n] if pool is None else h[row]).cpu().numpy()
    return out if pooling == "tokens" else np.stack(out).astype(np.float32)


@dataclass
class ProbeConfig:
    hidden: int = 0            # 0: linear probe; > 0: one hidden ReLU layer of this width
    dropout: float = 0.1
    lr: float = 1e-3           # a fresh small head learns at a far higher rate than fine-tuning uses
    batch_size: int = 32
    epochs: int = 10
    weight_decay: float = 0.0
    seed: int = 0


class Probe(nn.Module):
    """A small classifier on fixed features; forward(features, labels) -> object with .loss / .logits, like the
    bertkit heads, so the shared training loop can train it."""

    def __init__(self, dim: int, num_labels: int, cfg: ProbeConfig):
        super().__init__()
        layers: list[nn.Module] = [nn.Dropout(cfg.dropout)]
        if cfg.hidden:
            layers += [nn.Linear(dim, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout)]
            dim = cfg.hidden
        layers.append(nn.Linear(dim, num_labels))
        self.net = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None):
        logits = self.net(features)                                              # (batch, num_labels)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


class _FeatureBatches(BucketBatchSampler):
    """Random mini-batches of (features, labels) tensors (one length: no buckets), reshuffled per epoch."""

    def __init__(self, X: np.ndarray, y: np.ndarray, batch_size: int, seed: int):
        super().__init__([1] * len(y), batch_size, seed, bucket_batches=1)
        self.X, self.y = torch.from_numpy(np.asarray(X, dtype=np.float32)), torch.as_tensor(y, dtype=torch.long)

    def __iter__(self):
        for idx in self.batches():
            yield {"features": self.X[idx], "labels": self.y[idx]}


def train_probe(X_train, y_train, X_dev, y_dev, num_labels: int, cfg: ProbeConfig | None = None,
                out_dir: str | None = None) -> tuple[Probe, dict]:
    """Train a `Probe` on fixed features with the shared loop (`bertkit.train`, fp32, linear decay, 10% warmup);
    the state with the best dev accuracy is kept. Returns (probe, {"dev_accuracy", "best_step", "history"})."""
    cfg = cfg or ProbeConfig()
    seed_everything(cfg.seed)
    probe = Probe(np.asarray(X_train).shape[1], num_labels, cfg)
    batches = _FeatureBatches(X_train, y_train, cfg.batch_size, cfg.seed)
    Xd = torch.from_numpy(np.asarray(X_dev, dtype=np.float32))
    best = {"acc": -1.0, "state": None, "step": 0, "history": [], "evals": 0}

    def on_eval(m) -> dict:
        best["evals"] += 1
        acc = accuracy(y_dev, m(Xd.to(next(m.parameters()).device)).logits.argmax(-1).cpu().numpy())
        best["history"].append(acc)
        if acc > best["acc"]:
            best.update(acc=acc, step=best["evals"] * len(batches),
                        state={k: v.clone() for k, v in m.state_dict().items()})
        return {"accuracy": acc}

    tcfg = TrainConfig(max_steps=max(1, int(len(batches) * cfg.epochs)), lr=cfg.lr, warmup=0.1,
                       weight_decay=cfg.weight_decay, precision="fp32", seed=cfg.seed, eval_every_steps=len(batches),
                       save_final=False, progress=False, tensorboard=False, plot=False, log_every_steps=50,
                       overwrite=True)
    with tempfile.TemporaryDirectory() as tmp:
        train(probe, batches, tcfg, out_dir or tmp, eval_fn=on_eval)
    probe.load_state_dict(best["state"])
    probe.cpu().eval()            # the loop may have placed it on CUDA; callers score numpy features on the CPU
    return probe, {"dev_accuracy": best["acc"], "best_step": best["step"], "history": best["history"]}
