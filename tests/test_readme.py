"""Every `bertkit ...` / `python -m bertkit ...` command README.md shows runs, on tiny data, so the README cannot drift.

The commands are read from README.md itself (shell code blocks and inline code); each must have an entry in CASES,
so a new README command fails here until it is given one. A command runs in a fresh copy of a workspace holding
tiny stand-ins at the paths the README names (corpus/, my-vocab/, vocab.txt, shards128/, data/sentiment/, ...);
PLACEHOLDERS names the model the README calls MODEL, and SWAPS shrinks settings that would run for long
(`--preset base` -> tiny, `--budget 15m` -> 2s). Commands whose stdout is JSON must print JSON there and nothing else.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TF_FIXTURE = REPO / "tests" / "fixtures" / "tf_bert_tiny"

PLACEHOLDERS = {"MODEL": "tiny-bert", "MODEL_DIR": "tiny-bert", "MINILM_DIR": "tiny-bert", "path/to/hf-bert": "tiny-bert"}
# (flag, README value) -> tiny value: the same command, minutes of work cut to a second
SWAPS = {("--preset", p): "tiny" for p in ("mini", "small", "medium", "base", "large")}
SWAPS.update({("--budget", "15m"): "2s", ("--steps", "1000000"): "2", ("--steps", "20000"): "2",
              ("--global-batch", "256"): "64"})


@dataclass
class Case:
    argv: list[str] | None = None      # None: the README command itself, with PLACEHOLDERS and SWAPS applied
    json_out: bool = False             # stdout is JSON (one document or JSON lines) and nothing else
    files: tuple[str, ...] = ()        # what the command must have written
    setup: Callable[[Path, dict], None] | None = None   # earlier outputs the command reads
    runner: str = "main"               # main (in process) | help | module (`python -m MOD` in process) | serve
                                       # (started, /health answered, stopped) | torchrun | process
    slow: bool = False
    needs: str | None = None           # an optional module the command needs
    corpus: str | None = None          # a bertkit.datasets corpus it reads (skipped when offline and uncached)


def _absent(*paths: str) -> Callable[[Path, dict], None]:
    """Setup for a command whose output the workspace holds as an input of other commands: remove it first."""
    return lambda ws, assets: [shutil.rmtree(ws / p) for p in paths]


def _copy_finetuned(ws: Path, assets: dict) -> None:
    shutil.copytree(assets["finetuned"], ws / "runs" / "sentiment" / "seed-1")


def _earlier_pretrain(ws: Path, assets: dict) -> None:
    from bertkit.cli import main
    assert main(["pretrain", "shards128/", "--preset", "tiny", "--out", "run/", "--steps", "2", "--save-every", "1",
                 "--precision", "fp32", "--no-progress"]) == 0


def _embed_model(ws: Path, assets: dict) -> None:
    shutil.copytree(ws / "tiny-bert", ws / "runs" / "retrieval" / "seed-1")


def _index(ws: Path, assets: dict) -> None:
    from bertkit.cli import main
    assert main(["embed", "tiny-bert", "--file", "docs.jsonl", "--out", "index/"]) == 0


def _run_dir(ws: Path, assets: dict) -> None:
    shutil.copytree(assets["run"], ws / "runs" / "x")


def _tf_prefix(ws: Path, assets: dict) -> None:
    (ws / "run").mkdir(exist_ok=True)
    for f in TF_FIXTURE.glob("bert_model.ckpt.*"):
        shutil.copy(f, ws / "run" / f.name.replace("bert_model.ckpt", "model.ckpt-100000"))
    shutil.copy(TF_FIXTURE / "bert_config.json", ws / "bert_config.json")


RESUME = ["pretrain", "shards128/", "--preset", "tiny", "--out", "run/", "--steps", "4", "--precision", "fp32",
          "--resume"]
TORCHRUN = ["pretrain", "shards128/", "--preset", "tiny", "--out", "run/", "--steps", "2", "--precision", "fp32",
            "--no-progress"]

CASES: dict[str, Case] = {
    "python -m bertkit demo --force": Case(["demo", "--force", "--out", "runs/demo", "--pretrain-budget", "20",
                                            "--sentiment-train-examples", "200", "--quiet"], slow=True),
    "python -m bertkit.hardware": Case(["bertkit.hardware"], runner="module"),
    "python -m bertkit ...": Case(["--version"], runner="process"),
    "bertkit COMMAND -h": Case(["-h"], runner="help"),          # every subcommand's -h, and bertkit -h
    "bertkit vocab --files corpus/*.txt --vocab-size 30522 --out my-vocab/":
        Case(setup=_absent("my-vocab"), files=("my-vocab/vocab.txt",)),
    'bertkit tokenize --model my-vocab/ "Paris is the capital of France."': Case(json_out=True),
    "bertkit tokenize --vocab vocab.txt --file lines.txt --processes 2 > tokens.jsonl":
        Case(json_out=True, files=("tokens.jsonl",)),
    "bertkit convert uncased_L-12_H-768_A-12/ bert-base-uncased/": Case(files=("bert-base-uncased/config.json",)),
    "bertkit convert run/model.ckpt-100000 my-bert/ --config bert_config.json --vocab vocab.txt --cased":
        Case(setup=_tf_prefix, files=("my-bert/model.safetensors",)),
    "bertkit prepare --corpus corpus/*.txt --vocab my-vocab/ --out shards128/ --seq-len 128 --task nsp --masking wwm":
        Case(setup=_absent("shards128"), files=("shards128/manifest.json",)),
    "bertkit pretrain shards128/ --preset mini --out run/ --budget 15m --eval-shards heldout/":
        Case(json_out=True, files=("run/model/config.json", "run/summary.md")),
    "bertkit pretrain shards128/ --phase2 shards512/ --preset base --out run/ --global-batch 256 --steps 1000000":
        Case(json_out=True, files=("run/model/config.json",)),
    "bertkit pretrain shards/ --init path/to/hf-bert --objective mlm --out run/ --budget 15m":
        Case(json_out=True, files=("run/model/config.json",)),
    "bertkit pretrain shards/ --preset small --objective electra --out run/ --steps 20000":
        Case(json_out=True, files=("run/model/config.json",)),
    "bertkit pretrain ... --resume": Case(RESUME, json_out=True, setup=_earlier_pretrain),
    "torchrun --nproc_per_node=2 -m bertkit pretrain ...": Case(TORCHRUN, runner="torchrun", slow=True),
    "torchrun --nnodes=N --nproc_per_node=G --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 --rdzv_id=RUN "
    "-m bertkit pretrain ...": Case(TORCHRUN, runner="torchrun", slow=True),      # several nodes: run as one here
    "bertkit task-data sentiment --out data/sentiment/": Case(json_out=True, files=("data/sentiment/train.csv",),
                                                              setup=_absent("data"),
                                                              corpus="rotten_tomatoes"),
    "bertkit finetune --task classify --model MODEL_DIR --train data/sentiment/train.csv --dev data/sentiment/dev.csv "
    "--test data/sentiment/test.csv --out runs/sentiment --seeds 1,2,3":
        Case(json_out=True, files=("runs/sentiment/seed-1/config.json", "runs/sentiment/summary.json")),
    "bertkit evaluate --model runs/sentiment/seed-1 --data data/sentiment/test.csv":
        Case(json_out=True, setup=_copy_finetuned),
    "bertkit predict --model runs/sentiment/seed-1 --data new.csv --out preds.jsonl":
        Case(setup=_copy_finetuned, files=("preds.jsonl",)),
    # the tiny teacher has 2 layers: a 1-layer student
    "bertkit distill --teacher runs/sentiment/seed-1 --student-layers 3 --train data/sentiment/train.csv "
    "--dev data/sentiment/dev.csv --test data/sentiment/test.csv --out runs/sentiment-l3 --alpha 0.5":
        Case(["distill", "--teacher", "runs/sentiment/seed-1", "--student-layers", "1", "--train",
              "data/sentiment/train.csv", "--dev", "data/sentiment/dev.csv", "--test", "data/sentiment/test.csv",
              "--out", "runs/sentiment-l3", "--alpha", "0.5", "--epochs", "1", "--quiet"], json_out=True,
             setup=_copy_finetuned, files=("runs/sentiment-l3/config.json", "runs/sentiment-l3/summary.json")),
    'bertkit fill-mask MODEL "Paris is the [MASK] of France."': Case(),
    "bertkit embed MODEL --file sentences.txt --pooling mean --out emb.npy": Case(files=("emb.npy",)),
    'bertkit embed MODEL --file sentences.txt --search "a man is eating"': Case(json_out=True),
    'bertkit embed --pooling cls MODEL "some text"': Case(json_out=True),
    'bertkit attention MODEL "The cat sat because he was tired." --query he --out attention/':
        Case(files=("attention/attention_grid.png", "attention/attention_from_he.png")),
    "bertkit plot runs/x": Case(setup=_run_dir, files=("runs/x/curves.png",)),
    "bertkit serve MODEL --port 8080": Case(runner="serve", needs="fastapi"),
    "bertkit serve MODEL --port 8080 --max-batch 32 --max-wait-ms 5": Case(runner="serve", needs="fastapi"),
    "bertkit export MODEL model.onnx": Case(json_out=True, files=("model.onnx",), needs="onnxruntime"),
    "bertkit --allow-non-finite COMMAND": Case(["--allow-non-finite", "embed", "tiny-bert", "a text"], json_out=True),
    "bertkit embed": Case(["embed", "tiny-bert", "the man is eating"], json_out=True),
    "bertkit task-data retrieval --out data/retrieval": Case(json_out=True, corpus="bbc_articles",
                                                             setup=_absent("data"),
                                                             files=("data/retrieval/train.jsonl",)),
    "bertkit finetune --task embed --model MINILM_DIR --train data/retrieval/train.jsonl --dev data/retrieval/dev "
    "--test data/retrieval/test --out runs/retrieval --lr 2e-5 --epochs 1 --seeds 1,2,3":
        Case(json_out=True, files=("runs/retrieval/seed-3/modules.json",)),
    "bertkit evaluate --task embed --model runs/retrieval/seed-1 --baseline MINILM_DIR --data data/retrieval/test":
        Case(json_out=True, setup=_embed_model),
    "bertkit embed runs/retrieval/seed-1 --file docs.jsonl --out index/ --dtype float16":
        Case(setup=_embed_model, files=("index/texts.jsonl",)),
    'bertkit search index/ --query "oil prices rise" --top-k 5 --rerank runs/pairs': Case(json_out=True, setup=_index),
    'bertkit rerank runs/pairs --query "oil prices rise" --file docs.txt': Case(json_out=True),
    "bertkit mine MINILM_DIR --data pairs.jsonl --out mined.jsonl --negatives 3": Case(files=("mined.jsonl",)),
    # --force: the tiny model's int8 may not measure faster than fp32 on the machine running the tests
    "bertkit quantize MODEL MODEL-int8 --check dev.csv --max-drop 0.5":
        Case(["quantize", "runs/sentiment/seed-1", "sentiment-int8", "--check", "data/sentiment/dev.csv",
              "--max-drop", "100", "--force"], setup=_copy_finetuned, files=("sentiment-int8/config.json",)),
    "bertkit quantize": Case(["quantize", "tiny-bert", "tiny-int8", "--force", "--json"], json_out=True,
                             files=("tiny-int8/config.json",)),
    "bertkit export MODEL model-int8.onnx --int8": Case(json_out=True, files=("model-int8.onnx",), needs="onnxruntime"),
    "bertkit finetune": Case(["finetune", "--task", "classify", "--model", "tiny-bert", "--train",
                              "data/sentiment/train.csv", "--dev", "data/sentiment/dev.csv", "--out", "runs/ft",
                              "--epochs", "1", "--quiet"], json_out=True, files=("runs/ft/summary.json",)),
}


# ------------------------------------------------------------------------------------------- reading README.md

_COMMAND = re.compile(r"(bertkit |python -m bertkit\b|torchrun .*-m bertkit )")


def readme_commands(text: str) -> list[str]:
    """The bertkit command lines README.md shows, in order: shell code blocks (indented or fenced, not python),
    `\\`-continued lines joined and `# comments` dropped, and inline code spans."""
    commands, fence, lines = [], None, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif (fence is not None and fence not in ("python", "py")) or (fence is None and line.startswith("    ")):
            cmd = line.strip()
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
            if _COMMAND.match(cmd):
                commands.append(_normal(cmd))
        elif fence is None:
            commands += [_normal(span) for span in re.findall(r"`([^`]+)`", line) if _COMMAND.match(span)]
        i += 1
    return list(dict.fromkeys(commands))


def _normal(cmd: str) -> str:
    """The command without its trailing comment, whitespace collapsed (quotes kept as written)."""
    return " ".join(re.sub(r"\s+#\s.*$", "", cmd).split())


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def _argv(readme: str) -> list[str]:
    """The README command's arguments after `bertkit`, with PLACEHOLDERS and SWAPS applied."""
    words = shlex.split(readme)
    words = words[3:] if words[:3] == ["python", "-m", "bertkit"] else words[1:]
    out = [PLACEHOLDERS.get(w, w) for w in words]
    for k in range(1, len(out)):
        out[k] = SWAPS.get((out[k - 1], out[k]), out[k])
    return out


def test_every_readme_command_has_a_case():
    assert len(COMMANDS) >= 25, COMMANDS
    missing = [c for c in COMMANDS if c not in CASES]
    assert not missing, f"README.md commands with no entry in tests/test_readme.py CASES: {missing}"
    stale = [c for c in CASES if c not in COMMANDS]
    assert not stale, f"CASES entries no longer in README.md: {stale}"


def test_reading_the_readme_finds_blocks_continuations_and_inline_code():
    text = ("Run `bertkit tokenize --vocab v.txt hi` or `bertkit.hub`.\n\n    bertkit embed MODEL \\\n"
            "        --file f.txt   # a comment\n    src/bertkit/\n\n```python\nbertkit.load('x')  # bertkit x\n```\n"
            "```sh\npython -m bertkit plot runs/x\n```\n")
    assert readme_commands(text) == ["bertkit tokenize --vocab v.txt hi", "bertkit embed MODEL --file f.txt",
                                     "python -m bertkit plot runs/x"]


@pytest.fixture(scope="module")
def assets(tiny_workspace) -> dict:
    return tiny_workspace


# -------------------------------------------------------------------------------------------------- running

def _in_process(argv: list[str], ws: Path, capsys) -> tuple[int, str, str]:
    from bertkit.cli import main
    redirect = None
    if ">" in argv:
        argv, redirect = argv[:argv.index(">")], argv[argv.index(">") + 1]
    rc = main(argv)
    out, err = capsys.readouterr()
    if redirect:
        (ws / redirect).write_text(out)
    return rc, out, err


def _help(capsys) -> tuple[int, str, str]:
    import argparse
    from bertkit.cli import build_parser, main
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for argv in [["-h"], *([name, "-h"] for name in sub.choices)]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        out = capsys.readouterr().out
        assert e.value.code == 0 and out.startswith("usage: bertkit"), argv
    return 0, "", ""


def _module(name: str, capsys) -> tuple[int, str, str]:
    import runpy
    import warnings
    with warnings.catch_warnings():   # the module is imported already (bertkit imports it): runpy says so
        warnings.simplefilter("ignore", RuntimeWarning)
        runpy.run_module(name, run_name="__main__")
    out, err = capsys.readouterr()
    return 0, out, err


def _process(cmd: list[str], ws: Path, timeout: float = 120) -> tuple[int, str, str]:
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ws, capture_output=True, text=True, timeout=timeout, env=env)
    return r.returncode, r.stdout, r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(argv: list[str], ws: Path) -> tuple[int, str, str]:
    """Start the server as the README does (on a free port), wait for /health, stop it."""
    port = str(_free_port())
    argv = [port if a == "8080" else a for a in argv]
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bertkit", *argv], cwd=ws, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return 0, "", ""
            except OSError:
                time.sleep(0.3)
        proc.kill()
        out, err = proc.communicate(timeout=10)
        return proc.returncode or 1, out, err
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=30)


def _json_documents(out: str) -> list:
    text = out.strip()
    assert text, "nothing on stdout"
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines()]


def _params():
    for cmd in COMMANDS:
        case = CASES.get(cmd)
        marks = [pytest.mark.slow] if case is not None and case.slow else []
        yield pytest.param(cmd, marks=marks, id=cmd[:80])


@pytest.mark.parametrize("readme", list(_params()))
def test_readme_command_runs(readme, assets, tmp_path, monkeypatch, capsys):
    case = CASES.get(readme)
    if case is None:
        pytest.fail(f"README command with no entry in CASES: {readme}")
    if case.needs:
        pytest.importorskip(case.needs)
    monkeypatch.setenv("BERTKIT_ALLOW_NON_FINITE", "")        # --allow-non-finite sets it: undone after the test
    ws = tmp_path / "ws"
    shutil.copytree(assets["ws"], ws)
    monkeypatch.chdir(ws)
    if case.setup:
        case.setup(ws, assets)
        capsys.readouterr()
    argv = case.argv if case.argv is not None else _argv(readme)
    if case.corpus:
        _skip_without_corpus(case.corpus)
    if case.runner == "main":
        rc, out, err = _in_process(argv, ws, capsys)
    elif case.runner == "help":
        rc, out, err = _help(capsys)
    elif case.runner == "module":
        rc, out, err = _module(argv[0], capsys)
    elif case.runner == "serve":
        rc, out, err = _serve(argv, ws)
    elif case.runner == "torchrun":
        rc, out, err = _process([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "bertkit",
                                 *argv], ws, timeout=600)
    else:
        rc, out, err = _process([sys.executable, "-m", "bertkit", *argv], ws)
    assert rc == 0, f"{readme}\n-> {argv}\nstdout: {out[-2000:]}\nstderr: {err[-3000:]}"
    if case.json_out:
        _json_documents(out)
    for f in case.files:
        assert (ws / f).exists(), f"{readme}: no {f} (stderr: {err[-2000:]})"


def _skip_without_corpus(name: str):
    from bertkit import datasets
    from bertkit.errors import DatasetUnavailable
    try:
        getattr(datasets, name)()
    except DatasetUnavailable as e:
        pytest.skip(f"dataset unavailable offline: {e}")
