"""Every `bertkit ...` / `python -m bertkit ...` command README.md and its reference pages show runs, on tiny data,
so the docs cannot drift; README's five examples run as written, on the real model and data.

The commands are read from README.md and DOCS themselves (shell code blocks and inline code); each must have an entry
in CASES, so a new command fails here until it is given one. README's examples section is run whole instead (see
test_readme_example_runs_as_written). A command runs in a fresh copy of a workspace holding
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
# the reference pages README links (performance.md and architecture.md cite commands as measurements, not as steps)
DOCS = [REPO / "docs" / name for name in ("cli.md", "serving.md", "transformers.md")]
EXAMPLES = "## Five examples"          # README's section of copy-paste examples, run whole
TF_FIXTURE = REPO / "tests" / "fixtures" / "tf_bert_tiny"

PLACEHOLDERS = {"MODEL": "tiny-bert", "$MINILM": "tiny-bert", "path/to/hf-bert": "tiny-bert"}
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


def _pair_files(ws: Path, assets: dict) -> None:
    """data/pairs/{train,dev}.csv (text, text_pair, label) from the workspace's retrieval pairs; runs/pairs removed."""
    import csv
    shutil.rmtree(ws / "runs" / "pairs")
    pairs = [json.loads(line) for line in (ws / "pairs.jsonl").read_text().splitlines()]
    (ws / "data" / "pairs").mkdir(parents=True)
    for split in ("train", "dev"):
        with open(ws / "data" / "pairs" / f"{split}.csv", "w", newline="") as f:
            rows = csv.writer(f)
            rows.writerow(["text", "text_pair", "label"])
            for i, pair in enumerate(pairs):
                other = pairs[(i + 1) % len(pairs)]["positive"]
                rows.writerow([pair["anchor"], pair["positive"], 1])
                rows.writerow([pair["anchor"], other, 0])


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
    "bertkit -h": Case(["-h"], runner="help"),
    "bertkit serve -h": Case(["-h"], runner="help"),
    "bertkit vocab --files corpus/*.txt --vocab-size 30522 --out my-vocab/":
        Case(setup=_absent("my-vocab"), files=("my-vocab/vocab.txt",)),
    "bertkit vocab --model bpe --files corpus/*.txt --vocab-size 50265 --out my-bpe/":
        Case(files=("my-bpe/tokenizer.json", "my-bpe/tokenizer_config.json")),
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
    'bertkit finetune --task classify --model "$MINILM" --train data/sentiment/train.csv --dev data/sentiment/dev.csv '
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
    'bertkit fill-mask run/model "Paris is the [MASK] of France."': Case(setup=_earlier_pretrain),
    "bertkit embed MODEL --file sentences.txt --pooling mean --out emb.npy": Case(files=("emb.npy",)),
    'bertkit embed MODEL --file sentences.txt --search "a man is eating"': Case(json_out=True),
    'bertkit embed --pooling cls MODEL "some text"': Case(json_out=True),
    'bertkit attention MODEL "The cat sat because he was tired." --query he --out attention/':
        Case(files=("attention/attention_grid.png", "attention/attention_from_he.png")),
    "bertkit plot runs/sentiment/seed-1/train": Case(setup=_copy_finetuned,
                                                     files=("runs/sentiment/seed-1/train/curves.png",)),
    "bertkit serve MODEL --port 8080": Case(runner="serve", needs="fastapi"),
    "bertkit serve": Case(["serve", "tiny-bert", "--port", "8080"], runner="serve", needs="fastapi"),
    "bertkit serve MODEL --port 8080 --max-batch 32 --max-wait-ms 5": Case(runner="serve", needs="fastapi"),
    "bertkit export MODEL model.onnx": Case(json_out=True, files=("model.onnx",), needs="onnxruntime"),
    "bertkit --allow-non-finite COMMAND": Case(["--allow-non-finite", "embed", "tiny-bert", "a text"], json_out=True),
    "bertkit embed": Case(["embed", "tiny-bert", "the man is eating"], json_out=True),
    "bertkit task-data retrieval --out data/retrieval": Case(json_out=True, corpus="bbc_articles",
                                                             setup=_absent("data"),
                                                             files=("data/retrieval/train.jsonl",)),
    'bertkit finetune --task embed --model "$MINILM" --train data/retrieval/train.jsonl --dev data/retrieval/dev '
    "--test data/retrieval/test --out runs/retrieval --lr 2e-5 --epochs 1 --seeds 1,2,3":
        Case(json_out=True, files=("runs/retrieval/seed-3/modules.json",)),
    'bertkit evaluate --task embed --model runs/retrieval/seed-1 --baseline "$MINILM" --data data/retrieval/test':
        Case(json_out=True, setup=_embed_model),
    "bertkit embed runs/retrieval/seed-1 --file data/retrieval/test/corpus.jsonl --out index/ --dtype float16":
        Case(setup=_embed_model, files=("index/texts.jsonl",)),
    'bertkit search index/ --query "oil prices rise" --top-k 5 --rerank runs/pairs': Case(json_out=True, setup=_index),
    'bertkit rerank runs/pairs --query "oil prices rise" --file docs.txt': Case(json_out=True),
    'bertkit mine "$MINILM" --data data/retrieval/train.jsonl --out mined.jsonl --negatives 3':
        Case(files=("mined.jsonl",)),
    "bertkit task-data pairs --out data/pairs": Case(json_out=True, corpus="bbc_articles",
                                                     files=("data/pairs/train.csv",)),
    'bertkit finetune --task pair --model "$MINILM" --train data/pairs/train.csv --dev data/pairs/dev.csv '
    "--out runs/pairs --epochs 1": Case(json_out=True, setup=_pair_files, files=("runs/pairs/config.json",)),
    # --force: the tiny model's int8 may not measure faster than fp32 on the machine running the tests
    "bertkit quantize runs/sentiment/seed-1 sentiment-int8 --check data/sentiment/dev.csv --max-drop 0.5":
        Case(["quantize", "runs/sentiment/seed-1", "sentiment-int8", "--check", "data/sentiment/dev.csv",
              "--max-drop", "100", "--force"], setup=_copy_finetuned, files=("sentiment-int8/config.json",)),
    "bertkit quantize": Case(["quantize", "tiny-bert", "tiny-int8", "--force", "--json"], json_out=True,
                             files=("tiny-int8/config.json",)),
    "bertkit export MODEL model-int8.onnx --int8": Case(json_out=True, files=("model-int8.onnx",), needs="onnxruntime"),
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


def split_examples(text: str) -> tuple[str, str]:
    """README's text without its EXAMPLES section, and that section."""
    start = text.index(EXAMPLES)
    end = text.find("\n## ", start + len(EXAMPLES))
    end = len(text) if end < 0 else end + 1
    return text[:start] + text[end:], text[start:end]


@dataclass
class Example:
    title: str
    language: str      # sh | python
    code: str


def readme_examples(section: str) -> tuple[str, list[Example]]:
    """The examples section's shell setup (its first code block) and each `### N. title` example's code block."""
    blocks = re.findall(r"^(?:### (.+?)\n.*?)?```(\w+)\n(.*?)^```", section, re.M | re.S)
    setup = blocks[0][2]
    return setup, [Example(title, language, code) for title, language, code in blocks[1:]]


_README_TEXT, _EXAMPLES_TEXT = split_examples(README.read_text(encoding="utf-8"))
COMMANDS = list(dict.fromkeys(readme_commands(_README_TEXT)
                              + [c for page in DOCS for c in readme_commands(page.read_text(encoding="utf-8"))]))
SETUP, EXAMPLES_RUN = readme_examples(_EXAMPLES_TEXT)


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
    assert not missing, f"README.md / docs commands with no entry in tests/test_readme.py CASES: {missing}"
    stale = [c for c in CASES if c not in COMMANDS]
    assert not stale, f"CASES entries no longer in README.md or docs: {stale}"


def test_the_readme_is_a_door():
    assert len(README.read_text(encoding="utf-8").split()) <= 1500
    assert [e.title for e in EXAMPLES_RUN] == ["1. The Python API", "2. Fine-tune, then predict",
                                               "3. Embed, then search", "4. Serve, then curl",
                                               "5. Coming from transformers"]
    text = README.read_text(encoding="utf-8")
    assert "\n    make demo " in text and "\n    make test " in text      # the two commands .ci/run and Makefile keep


def test_help_lists_subcommands_by_stage_and_every_option_default(capsys):
    import argparse
    from bertkit.cli import GROUPS, build_parser
    parser = build_parser()
    top = parser.format_help()
    assert "commands, by stage:" in top and "other" not in top.split("commands, by stage:")[1]
    for title in GROUPS:
        assert f"\n  {title}\n" in top, title
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        text = command.format_help()
        assert "default" in text, name
        flat = " ".join(text.split())
        for action in command._actions:   # every value default shows, unless the option's own help says it
            valued = action.nargs != 0 and action.default not in (None, "", [], (), argparse.SUPPRESS)
            if valued and "default" not in (action.help or "").lower():
                value = ",".join(map(str, action.default)) if isinstance(action.default, (list, tuple)) \
                    else str(action.default)
                assert f"(default: {value})" in flat, (name, action.dest)
    assert "--batch-size BATCH_SIZE\n                        (default: 128)" in sub.choices["predict"].format_help()


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
    """Start the server as the README does (on a port the kernel picks: a port found free and then handed over can
    be taken in between), wait for /health, stop it."""
    argv = ["0" if a == "8080" else a for a in argv]
    argv += [] if "--port" in argv else ["--port", "0"]
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bertkit", *argv], cwd=ws, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        started = proc.stdout.readline()            # "bertkit serve: MODEL on http://HOST:PORT  endpoints: ..."
        port = started.split("http://", 1)[-1].split()[0].rsplit(":", 1)[-1] if "http://" in started else "0"
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


# ------------------------------------------------------------------------------------------ README's examples

def _example_shell(tmp: Path) -> dict:
    """The environment of a fresh clone after `make`: `. .venv/bin/activate` puts `python` and `bertkit` (this
    checkout's, on this interpreter) first on PATH."""
    import os
    bin_dir = tmp / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, run in (("python", ""), ("bertkit", " -m bertkit")):   # scripts: a symlink would lose the venv
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}"{run} "$@"\n')
        (bin_dir / name).chmod(0o755)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"; export PATH\n')
    return {**os.environ, "PYTHONPATH": str(REPO / "src")}


# fine-tuning runs half a minute on 2 idle cores, minutes on busy ones: with the slow tests
_EXAMPLE_PARAMS = [pytest.param(e, id=e.title, marks=[pytest.mark.slow] if "bertkit finetune" in e.code else [])
                   for e in EXAMPLES_RUN]


@pytest.mark.parametrize("example", _EXAMPLE_PARAMS)
def test_readme_example_runs_as_written(example, tmp_path):
    """Each example of README's examples section, after its shell setup, in an empty directory, exactly as written
    (the port of the serve example aside: a free one, as other tests may hold 8080)."""
    from bertkit import datasets
    from bertkit.errors import DatasetUnavailable
    try:
        datasets.minilm_dir()
    except DatasetUnavailable as e:
        pytest.skip(f"MiniLM-L6 unavailable offline: {e}")
    code = example.code
    if "bertkit serve" in code:
        pytest.importorskip("fastapi")
        if shutil.which("curl") is None:
            pytest.skip("no curl")
        code = code.replace("8080", str(_free_port()))
    if "task-data" in code:
        _skip_without_corpus("rotten_tomatoes" if "sentiment" in code else "bbc_articles")
    env = _example_shell(tmp_path)
    if example.language == "python":
        (tmp_path / "example.py").write_text(code)
        code = "python example.py\n"
    script = f"set -e\n{SETUP}\n{code}"
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{example.title}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}"
    assert r.stdout.strip(), example.title


def _skip_without_corpus(name: str):
    from bertkit import datasets
    from bertkit.errors import DatasetUnavailable
    try:
        getattr(datasets, name)()
    except DatasetUnavailable as e:
        pytest.skip(f"dataset unavailable offline: {e}")
