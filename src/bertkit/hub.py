"""Model names as transformers takes them: a local directory, or a Hugging Face Hub repo id found in the local
cache (or downloaded into it with `huggingface_hub`); the rules are in docs/transformers.md.

    resolve_model_dir("runs/demo/model")                        # an existing path always wins, used as it is
    resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")  # <cache>/models--sentence-transformers--all-...
    resolve_model_dir("org/name", revision="v1.0")              # a branch, tag or commit hash (default "main")

A revision already cached is used without contacting the hub, so a cached model loads the same without network.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from bertkit.errors import CheckpointError

__all__ = ["resolve_model_dir", "hub_cache_dir", "is_repo_id", "is_offline", "cli_model_arg"]

# huggingface_hub's rule for a repo id: [namespace/]name of letters, digits, "-", "_", "."; no "--" or ".."
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
_TRUE = {"1", "ON", "YES", "TRUE"}
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# what a BERT directory needs; the weights pattern comes second (see _download)
_FILES = ["*.json", "*.txt", "*.safetensors"]
_PT_FILES = ["pytorch_model.bin"]


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache this process would use, by huggingface_hub's environment rules."""
    # HUGGINGFACE_HUB_CACHE: the older spelling of HF_HUB_CACHE
    for var, below in (("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""), ("HF_HOME", "hub")):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser() / below
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def is_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (huggingface_hub reads them once, at import)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def is_repo_id(name: str) -> bool:
    """Whether `name` has the shape of a Hub repo id ("org/name" or "name")."""
    return bool(_REPO_ID.match(name)) and "--" not in name and ".." not in name and not name.endswith(".")


def _cached_snapshot(cache: Path, repo_id: str, revision: str) -> Path | None:
    """snapshots/<hash> for `revision` (a ref name or a commit hash) when it holds a config.json, else None."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = revision
    ref = repo / "refs" / revision
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
    elif not _COMMIT.match(revision):
        return None
    snapshot = repo / "snapshots" / commit
    return snapshot if (snapshot / "config.json").is_file() else None


def _download(repo_id: str, revision: str, cache: Path) -> Path:
    """snapshot_download of what a BERT directory needs. Raises whatever huggingface_hub raises."""
    from huggingface_hub import snapshot_download
    path = Path(snapshot_download(repo_id, revision=revision, cache_dir=str(cache), allow_patterns=_FILES))
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    if not any((path / n).is_file() for n in weights):      # an older repo: PyTorch pickles only
        path = Path(snapshot_download(repo_id, revision=revision, cache_dir=str(cache), allow_patterns=_PT_FILES))
    return path


def _why_not_downloaded() -> str | None:
    """Why no download can be tried, or None when it can."""
    if is_offline():
        return "HF_HUB_OFFLINE is set"
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return "huggingface_hub is not installed (pip install 'bertkit[hub]' to download)"
    return None


def resolve_model_dir(name_or_path: str | os.PathLike, revision: str | None = None) -> Path:
    """The local directory for a model: the path itself when it exists, else the cached (or downloaded) snapshot of
    the Hub repo `name_or_path` at `revision` (default "main"). Raises CheckpointError in one line otherwise."""
    if not isinstance(name_or_path, (str, os.PathLike)) or isinstance(name_or_path, bytes):
        raise CheckpointError(f"model: expected a directory or a Hugging Face repo id, got "
                              f"{type(name_or_path).__name__}")
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    name = str(name_or_path)
    if not is_repo_id(name):
        raise CheckpointError(f"model directory not found: {path} (nor is it a Hugging Face repo id like org/name)")
    revision = revision or "main"
    cache = hub_cache_dir()
    snapshot = _cached_snapshot(cache, name, revision)
    if snapshot is not None:
        return snapshot
    why = _why_not_downloaded()
    if why is None:
        try:
            return _download(name, revision, cache)
        except Exception as e:  # network, auth, missing repo: all reported the same way, in one line
            why = f"the download failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    raise CheckpointError(
        f"model not found: {name!r} is no local directory, and revision {revision!r} of the Hugging Face repo "
        f"{name!r} is not in the cache (searched {cache / ('models--' + name.replace('/', '--'))}; cache from "
        f"HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub); {why}. Fix: run `huggingface-cli download "
        f"{name}` on a connected machine and copy its cache here (or point HF_HUB_CACHE at it), or pass a local "
        f"directory")


def cli_model_arg(value: str, keep: tuple[str, ...] = ()) -> str:
    """A command's model argument as a directory path: `keep` (e.g. preset names) and existing paths unchanged."""
    if value in keep or Path(value).expanduser().exists():
        return value
    return str(resolve_model_dir(value))
