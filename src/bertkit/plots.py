"""Pictures as PNG files: training curves, attention heatmaps, confusion matrices.

matplotlib (the extra `bertkit[plots]`) is imported when a picture is drawn, with the headless Agg backend. Without
it a picture raises `PlotsMissing` (an ImportError and a ConfigError) after one logged line: a command that draws on
the side skips its pictures and goes on, one that only draws says which extra to install (`require()`).

Metrics files (`metrics.jsonl`, a JSON object a line) have no fixed schema: a numeric field whose name holds "loss"
goes on the loss panel, one holding "acc", "f1", "exact", "corr", ... on the score panel, against "step" (else
"global_step", else "epoch", else the line number); a record's "split" / "phase" ("train" / "eval") prefixes its
series' names, so train and held-out curves of one quantity are told apart.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Sequence

from bertkit.atomic import replacing
from bertkit.errors import ConfigError, DataError
from bertkit.progress import say
from bertkit.textfiles import parse_json, utf8_errors

__all__ = ["PlotsMissing", "require", "optional", "read_metrics", "plot_run", "plot_attention", "plot_attention_from", "plot_confusion",
           "find_metrics_file"]

_X_KEYS = ("step", "global_step", "epoch")
_LOSS_WORDS = ("loss", "perplexity", "ppl")
_SCORE_WORDS = ("acc", "f1", "exact", "corr", "precision", "recall", "mcc")
_SPLIT_KEYS = ("split", "phase", "kind")


class PlotsMissing(ConfigError, ImportError):
    """matplotlib is not installed."""


_MISSING = "matplotlib is not installed: pip install 'bertkit[plots]'"
_said: list[bool] = []


def require() -> None:
    """PlotsMissing (one line naming the extra) unless pictures can be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotsMissing(_MISSING) from None


@contextlib.contextmanager
def optional():
    """Pictures drawn in the block are skipped when matplotlib is missing (the one line is logged)."""
    try:
        yield
    except PlotsMissing:
        pass


def _pyplot():
    try:
        require()
    except PlotsMissing:
        if not _said:        # one line per process, however many pictures are skipped
            _said.append(True)
            say(f"bertkit: pictures skipped: {_MISSING}")
        raise
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# ----------------------------------------------------------------------------------------------------------- curves

def find_metrics_file(run_dir: str | Path) -> Path:
    """The metrics JSONL of a run: `metrics.jsonl` if present, else the only / newest `*.jsonl` in the directory."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        return run_dir
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: no such run directory")
    direct = run_dir / "metrics.jsonl"
    if direct.is_file():
        return direct
    found = sorted(run_dir.rglob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise DataError(f"{run_dir}: no metrics.jsonl (or any *.jsonl) in the run directory")
    return found[-1]


def read_metrics(path: str | Path) -> dict[str, list[tuple[float, float]]]:
    """Series name -> [(x, value)] from a metrics JSONL (see the module docstring for how fields are picked)."""
    return _read_metrics_file(find_metrics_file(path))


@utf8_errors
def _read_metrics_file(path: Path) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            rec = parse_json(line, f"{path}:{lineno}")
            if not isinstance(rec, dict):
                continue
            x = next((rec[k] for k in _X_KEYS if _finite(rec.get(k))), lineno)
            split = next((str(rec[k]) for k in _SPLIT_KEYS if isinstance(rec.get(k), str)), None)
            for key, value in rec.items():
                if key in _X_KEYS or not isinstance(value, (int, float)) or isinstance(value, bool):
                    continue
                name = f"{split}/{key}" if split and "/" not in key else key
                # NaN / Infinity (a diverged step): a gap in the curve
                series.setdefault(name, []).append((float(x), float(value) if _finite(value) else math.nan))
    return {name: points for name, points in series.items() if any(math.isfinite(y) for _, y in points)}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_loss(name: str) -> bool:
    return any(w in name.lower() for w in _LOSS_WORDS)


def plot_run(run_dir: str | Path, out_png: str | Path, title: str | None = None) -> Path:
    """Loss curves (left, log scale when they span > 1 decade) and accuracy-like curves (right) of one run."""
    series = read_metrics(run_dir)
    losses = {k: v for k, v in series.items() if _is_loss(k)}
    scores = {k: v for k, v in series.items() if not _is_loss(k) and any(w in k.lower() for w in _SCORE_WORDS)}
    if not losses and not scores:
        raise DataError(f"{find_metrics_file(run_dir)}: no finite loss or accuracy values to plot "
                        f"(fields with one: {', '.join(sorted(series)) or 'none'})")
    plt = _pyplot()
    panels = [(n, s) for n, s in (("loss", losses), ("score", scores)) if s]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.2), squeeze=False)
    for ax, (kind, group) in zip(axes[0], panels):
        for name, points in sorted(group.items()):
            xs, ys = zip(*points)
            style = "-" if len(xs) > 12 else "o-"
            held_out = name.startswith("eval")   # drawn on top: dense per-step training series would hide it
            ax.plot(xs, ys, style, label=name, linewidth=2.0 if held_out else 0.8, markersize=4,
                    zorder=3 if held_out else 2, alpha=1.0 if held_out else 0.45)
        ax.set(xlabel="step", ylabel=kind)
        if kind == "loss":
            values = [y for pts in group.values() for _, y in pts if math.isfinite(y)]
            if min(values) > 0 and max(values) / min(values) > 10:
                ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or f"run: {Path(run_dir).name}")
    fig.tight_layout()
    return _save(fig, out_png)


def _save(fig, out_png: str | Path) -> Path:
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out_png) as tmp:         # a viewer never sees half a png; the temp name has no image suffix
        fig.savefig(tmp, dpi=110, format=out_png.suffix[1:] or "png")
    _pyplot().close(fig)
    return out_png


# -------------------------------------------------------------------------------------------------------- attention

def _as_numpy_layers(attn) -> list:
    """Accept a list/tuple of per-layer tensors (batch=1 or no batch dim) or one (layers, heads, S, S) array."""
    import numpy as np
    layers = []
    for a in attn:
        a = a.detach().float().cpu().numpy() if hasattr(a, "detach") else np.asarray(a, dtype=np.float32)
        if a.ndim == 4:   # (batch, heads, S, S): take the first sentence
            a = a[0]
        if a.ndim != 3:
            raise ValueError(f"attention of a layer must be (heads, seq, seq) or (1, heads, seq, seq), got {a.shape}")
        layers.append(a)
    return layers


def plot_attention(attn, tokens: Sequence[str], out_png: str | Path, layers: Sequence[int] | None = None,
                   title: str | None = None) -> Path:
    """A grid with one (query x key) heatmap per layer (rows) and head (columns). attn: per-layer attention
    probabilities, each (heads, seq, seq) or (1, heads, seq, seq), rows = queries."""
    mats = _as_numpy_layers(attn)
    layers = list(range(len(mats))) if layers is None else list(layers)
    heads = range(mats[0].shape[0])
    n = len(tokens)
    if mats[0].shape[-1] != n:
        raise ValueError(f"{len(tokens)} tokens but attention over {mats[0].shape[-1]} positions")
    plt = _pyplot()
    cell = max(1.6, min(3.2, 0.16 * n + 0.6))
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(cell * len(heads) + 1.0, cell * len(layers) + 0.8),
                             squeeze=False)
    show_labels = n <= 40
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            ax.imshow(mats[layer][head], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"head {head}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=9)
            if show_labels and r == len(layers) - 1:
                ax.set_xticks(range(n), tokens, rotation=90, fontsize=5)
            if show_labels and c == 0:
                ax.set_yticks(range(n), tokens, fontsize=5)
    fig.suptitle(title or "attention per layer (rows) and head (columns); in each map rows = query token, "
                 "columns = key token", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save(fig, out_png)


def plot_attention_from(attn, tokens: Sequence[str], query: int | str, out_png: str | Path,
                        title: str | None = None) -> Path:
    """Where one token looks: a (layer.head x key token) heatmap of the attention weights from `query`, a position
    or a token string (its first occurrence): the book's "he -> Bert" picture for every head at once."""
    import numpy as np
    mats = _as_numpy_layers(attn)
    if isinstance(query, str) and query not in tokens:
        raise ValueError(f"query token {query!r} is not among the tokens {list(tokens)}")
    qpos = list(tokens).index(query) if isinstance(query, str) else int(query)
    rows = [m[hi, qpos] for m in mats for hi in range(m.shape[0])]
    labels = [f"L{li}.H{hi}" for li, m in enumerate(mats) for hi in range(m.shape[0])]
    grid = np.stack(rows)                                    # (layers*heads, seq)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * len(tokens) + 2.0), max(3.0, 0.22 * len(rows) + 1.5)))
    im = ax.imshow(grid, cmap="magma", aspect="auto", vmin=0.0, vmax=float(grid.max()))
    ax.set_xticks(range(len(tokens)), tokens, rotation=60, ha="right", fontsize=8)
    ax.get_xticklabels()[qpos].set_color("tab:purple")
    ax.set_yticks(range(len(labels)), labels, fontsize=6 if len(labels) > 24 else 8)
    ax.set(xlabel="key token (attended to)", ylabel="layer.head")
    fig.colorbar(im, ax=ax, fraction=0.025, pad=0.02, label="attention weight")
    ax.set_title(title or f"attention from {tokens[qpos]!r} (position {qpos})")
    fig.tight_layout()
    return _save(fig, out_png)


# -------------------------------------------------------------------------------------------------------- confusion

def plot_confusion(matrix, labels: Sequence[str], out_png: str | Path, title: str | None = None) -> Path:
    """Rows = true label, columns = predicted. Colours are row-normalised (recall per class); cells show counts."""
    import numpy as np
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] != len(labels):
        raise ValueError(f"confusion matrix must be ({len(labels)}, {len(labels)}), got {m.shape}")
    norm = m / np.maximum(m.sum(axis=1, keepdims=True), 1.0)
    plt = _pyplot()
    k = len(labels)
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * k + 1.5, 0.8 + 0.8 * k + 0.8))
    im = ax.imshow(norm, cmap="Blues", vmin=0.0, vmax=1.0)
    for i in range(k):
        for j in range(k):
            ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=9,
                    color="white" if norm[i, j] > 0.55 else "black")
    ax.set_xticks(range(k), labels, rotation=45, ha="right")
    ax.set_yticks(range(k), labels)
    ax.set(xlabel="predicted", ylabel="true")
    acc = float(np.trace(m) / max(m.sum(), 1.0))
    ax.set_title(title or f"confusion matrix (accuracy {acc:.3f})")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="row share")
    fig.tight_layout()
    return _save(fig, out_png)

