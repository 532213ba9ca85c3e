"""The core install without its extras: with matplotlib unimportable a fine-tuning run still succeeds and skips its
pictures with one line naming `bertkit[plots]`; the commands that only draw, and `serve` without FastAPI, say which
extra to install in one line (exit 2); py.typed ships."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from test_tasks_finetune import _sentiment_rows, _write_csv, one_thread, tiny_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
# `bertkit ARGV` with the named modules unimportable (None in sys.modules: `import x` raises ImportError)
CHILD = """
import sys
hidden, argv = sys.argv[1].split(","), sys.argv[2:]
for name in hidden:
    sys.modules[name] = None
from bertkit.cli import main
sys.exit(main(argv))
"""


def _without(modules: str, *argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-c", CHILD, modules, *map(str, argv)], env=env, capture_output=True,
                          text=True, timeout=600)


def _lines_naming(stderr: str, text: str) -> list[str]:
    return [line for line in stderr.splitlines() if text in line]


def test_finetune_without_matplotlib_skips_the_pictures_in_one_line(tiny_dir, tmp_path):
    train = _write_csv(tmp_path / "train.csv", _sentiment_rows(32, 0))
    dev = _write_csv(tmp_path / "dev.csv", _sentiment_rows(16, 1))
    r = _without("matplotlib", "finetune", "--task", "classify", "--model", tiny_dir, "--train", train, "--dev", dev,
                 "--test", dev, "--out", tmp_path / "run", "--epochs", "1", "--batch-size", "16", "--fp32")
    assert r.returncode == 0, r.stderr
    assert _lines_naming(r.stderr, "pip install 'bertkit[plots]'") == [
        "bertkit: pictures skipped: matplotlib is not installed: pip install 'bertkit[plots]'"]
    assert (tmp_path / "run" / "model.safetensors").is_file() and not list((tmp_path / "run").glob("*.png"))
    r = _without("matplotlib", "plot", tmp_path / "run" / "train")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr     # `plot` only draws
    assert "matplotlib is not installed: pip install 'bertkit[plots]'" in r.stderr


def test_serve_without_fastapi_names_the_extra(tiny_dir):
    r = _without("fastapi,uvicorn", "serve", tiny_dir)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "pip install 'bertkit[serve]'" in r.stderr


def test_dependencies_are_what_the_core_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    core = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["project"]["dependencies"]}
    assert "matplotlib" not in core and "regex" not in core
    assert "matplotlib" in " ".join(project["project"]["optional-dependencies"]["plots"])
    assert (ROOT / "src" / "bertkit" / "py.typed").is_file()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["bertkit"]
