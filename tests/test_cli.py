"""The `bertkit` command's own conventions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bertkit

REPO = Path(__file__).resolve().parents[1]


def test_version_on_stdout_exit_0():
    r = subprocess.run([sys.executable, "-m", "bertkit", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"bertkit {bertkit.__version__}" and r.stderr == ""


# ------------------------------------------------------------------------- results on stdout, logs on stderr

def _ws(tiny_workspace, tmp_path, monkeypatch) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(tiny_workspace["ws"], ws)
    monkeypatch.chdir(ws)
    return ws


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The command in its own process: what a shell sees on each stream (logging set up by the command included)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "bertkit", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def test_finetune_prints_numbers_on_stdout_and_logs_on_stderr(tiny_workspace, tmp_path, monkeypatch):
    ws = _ws(tiny_workspace, tmp_path, monkeypatch)
    r = _run(["finetune", "--task", "classify", "--model", "tiny-bert", "--train", "data/sentiment/train.csv",
              "--dev", "data/sentiment/dev.csv", "--test", "data/sentiment/test.csv", "--out", "ft", "--seeds", "1,2",
              "--epochs", "1", "--batch-size", "16", "--fp32"], ws)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)                              # one JSON document, nothing else
    for split in ("dev", "test"):
        acc = result[split]["accuracy"]
        assert isinstance(acc["mean"], float) and isinstance(acc["std"], float) and 0 <= acc["mean"] <= 1
    assert result["seeds"] == [1, 2] and Path(result["summary"]).is_file()
    assert "finetune classify:" in r.stderr and "[seed 2] step" in r.stderr
    assert f"dev accuracy {result['dev']['accuracy']['mean']:.4f} +- " in r.stderr


def test_pretrain_prints_one_json_line_and_logs_on_stderr(tiny_workspace, tmp_path, monkeypatch):
    ws = _ws(tiny_workspace, tmp_path, monkeypatch)
    r = _run(["pretrain", "shards128/", "--preset", "tiny", "--out", "run", "--steps", "2", "--precision", "fp32"], ws)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["steps"] == 2 and isinstance(result["tokens"], int) and result["summary"].endswith("summary.md")
    assert "pre-training" in r.stderr and r.stderr.count("\n") >= 1
    assert "train:" not in r.stderr                            # no bar: stderr is not a terminal


@pytest.mark.parametrize("argv, kind", [
    (["evaluate", "--model", "FINETUNED", "--data", "data/sentiment/test.csv"], "json"),
    (["embed", "tiny-bert", "--file", "sentences.txt", "--batch-size", "4"], "jsonl"),
    (["embed", "tiny-bert", "--file", "sentences.txt", "--search", "a man is eating"], "jsonl"),
    (["fill-mask", "tiny-bert", "--json", "the [MASK] sat .", "a [MASK] is eating ."], "jsonl"),
    (["tokenize", "--model", "my-vocab", "--file", "lines.txt"], "jsonl"),
    (["vocab", "--files", "corpus/a.txt", "--vocab-size", "120", "--out", "v2", "--json"], "json"),
    (["prepare", "--corpus", "corpus", "--vocab", "my-vocab", "--out", "s2", "--json"], "json"),
    (["convert", "uncased_L-12_H-768_A-12", "converted", "--json"], "json"),
    (["task-data", "nonexistent-task", "--out", "x"], "error"),
])
def test_stdout_holds_only_results(argv, kind, tiny_workspace, tmp_path, monkeypatch, capsys):
    from bertkit.cli import main
    _ws(tiny_workspace, tmp_path, monkeypatch)
    argv = [str(tiny_workspace["finetuned"]) if a == "FINETUNED" else a for a in argv]
    rc = main(argv)
    out, err = capsys.readouterr()
    if kind == "error":
        assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith(f"bertkit {argv[0]}: error: ")
        return
    assert rc == 0, err
    docs = [json.loads(out)] if kind == "json" else [json.loads(line) for line in out.splitlines()]
    assert docs and all(isinstance(d, dict) for d in docs)
    assert "\r" not in out and "%|" not in out                   # no bar on stdout


def test_progress_bars_go_to_stderr_only_when_asked_off_a_terminal(tiny_workspace, tmp_path, monkeypatch, capsys):
    from bertkit.cli import main
    _ws(tiny_workspace, tmp_path, monkeypatch)
    model = str(tiny_workspace["finetuned"])
    for cmd, extra in (("evaluate", ["--data", "data/sentiment/test.csv", "--batch-size", "4"]),
                       ("predict", ["--data", "new.csv", "--out", "p.jsonl", "--batch-size", "4"])):
        assert main([cmd, "--model", model, *extra]) == 0
        out, err = capsys.readouterr()
        assert "%|" not in err and "%|" not in out                # captured stderr is no terminal: no bar
        extra = [a.replace("p.jsonl", "p2.jsonl") for a in extra]
        assert main([cmd, "--model", model, *extra, "--progress"]) == 0
        out, err = capsys.readouterr()
        assert f"{cmd}: 100%|" in err and "%|" not in out
        assert ("4/4 [" if cmd == "evaluate" else "2/2 [") in err  # one step per batch: 16 rows / 4, 8 rows / 4
    assert main(["embed", "tiny-bert", "--file", "sentences.txt", "--batch-size", "4", "--progress"]) == 0
    out, err = capsys.readouterr()
    assert "embed: 100%|" in err and len(out.splitlines()) == 21
    assert main(["embed", "tiny-bert", "--file", "docs.jsonl", "--out", "index/", "--batch-size", "8", "--progress"]) == 0
    out, err = capsys.readouterr()
    assert "embed: 100%|" in err and "5/5" in err and json.loads(out)["count"] == 40     # an index: 40 docs / 8
    assert main(["rerank", "runs/pairs", "--query", "a man", "--query", "the city", "--file", "docs.txt",
                 "--batch-size", "4", "--progress"]) == 0
    out, err = capsys.readouterr()                              # 2 queries x 8 docs / 4
    assert "rerank: 100%|" in err and "4/4" in err and [len(json.loads(x)["results"]) for x in out.splitlines()] == [8, 8]
    assert main(["mine", "tiny-bert", "--data", "pairs.jsonl", "--out", "mined.jsonl", "--progress"]) == 0
    out, err = capsys.readouterr()
    assert "mine: " in err and json.loads(out)["rows"] == 40


def test_finetune_quiet_prints_only_the_result(tiny_workspace, tmp_path, monkeypatch, capsys):
    from bertkit.cli import main
    _ws(tiny_workspace, tmp_path, monkeypatch)
    assert main(["finetune", "--task", "classify", "--model", "tiny-bert", "--train", "data/sentiment/train.csv",
                 "--dev", "data/sentiment/dev.csv", "--out", "ft", "--epochs", "1", "--fp32", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["dev"]["accuracy"]["std"] == 0.0


def test_a_multi_seed_run_directory_names_its_models(tmp_path, capsys):
    from bertkit.cli import main
    for seed in (1, 2):
        (tmp_path / "run" / f"seed-{seed}").mkdir(parents=True)
        (tmp_path / "run" / f"seed-{seed}" / "config.json").write_text("{}")
    assert main(["evaluate", "--model", str(tmp_path / "run"), "--data", "x.csv"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "one model per seed (seed-1, seed-2)" in err and "run/seed-1" in err


# ------------------------------------------------------------------------------- options and positionals in any order

# every subcommand with positionals: (its positionals, some of its options)
ANY_ORDER = {
    "tokenize": (["a text", "another"], ["--vocab", "v.txt", "--max-length", "8"]),
    "pretrain": (["shards/"], ["--out", "run/", "--steps", "3", "--preset", "tiny"]),
    "task-data": (["sentiment"], ["--out", "d/", "--seed", "1"]),
    "fill-mask": (["model/", "a [MASK] b", "c [MASK]"], ["--top-k", "3", "--json"]),
    "embed": (["model/", "some text", "more"], ["--pooling", "cls", "--batch-size", "2"]),
    "attention": (["model/", "the cat sat"], ["--query", "cat", "--out", "att/"]),
    "plot": (["runs/x"], ["--out", "c.png"]),
    "serve": (["model/"], ["--port", "9000", "--max-batch", "4"]),
    "export": (["model/", "m.onnx"], ["--opset", "17", "--no-check"]),
    "convert": (["ckpt/", "out/"], ["--config", "c.json", "--cased"]),
    "search": (["index/"], ["--query", "q", "--top-k", "3"]),
    "rerank": (["model/"], ["--query", "q", "--file", "docs.txt"]),
    "mine": (["model/"], ["--data", "pairs.jsonl", "--out", "m.jsonl"]),
    "quantize": (["model/", "int8/"], ["--max-drop", "0.5", "--json"]),
}


def _subparsers():
    import argparse
    from bertkit.cli import build_parser
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_any_order_table_covers_every_subcommand_with_positionals():
    with_positionals = {name for name, p in _subparsers().items() if p._get_positional_actions()}
    assert with_positionals == set(ANY_ORDER)


@pytest.mark.parametrize("command", sorted(ANY_ORDER))
def test_options_and_positionals_in_any_order(command):
    from bertkit.cli import build_parser
    positionals, options = ANY_ORDER[command]
    parser = build_parser()
    orders = ([*positionals, *options], [*options, *positionals], [positionals[0], *options, *positionals[1:]],
              [*options[:2], *positionals, *options[2:]])
    parsed = [{k: v for k, v in vars(parser.parse_args([command, *argv])).items() if k != "func"} for argv in orders]
    assert all(p == parsed[0] for p in parsed[1:]), parsed
    assert positionals[-1] in json.dumps(parsed[0])


@pytest.mark.parametrize("argv, model, texts", [
    (["embed", "--model", "M", "some text", "more"], "M", ["some text", "more"]),
    (["embed", "some text", "--model", "M"], "M", ["some text"]),
    (["embed", "M", "some text", "--pooling", "cls"], "M", ["some text"]),
    (["fill-mask", "a [MASK] .", "--json", "--model", "M"], "M", ["a [MASK] ."]),
    (["attention", "--model", "M", "the cat", "--query", "cat"], "M", "the cat"),
    (["export", "--model", "M", "m.onnx"], "M", None),
    (["serve", "--port", "9000", "--model", "M"], "M", None),
    (["rerank", "--query", "q", "--model", "M", "--file", "d.txt"], "M", None),
    (["mine", "--model", "M", "--data", "p.jsonl", "--out", "m.jsonl"], "M", None),
    (["quantize", "--json", "--model", "M", "int8/"], "M", None),
])
def test_model_as_positional_or_option(argv, model, texts):
    from bertkit.cli import build_parser
    from bertkit.commands import settle_model
    args = build_parser().parse_args(argv)
    settle_model(args)
    assert args.model == model and "model_option" not in vars(args)
    if texts is not None:
        assert (args.texts if "texts" in vars(args) else args.text) == texts


@pytest.mark.parametrize("argv, words", [(["embed", "some text"], None), (["attention", "M", "t", "--model", "N"],
                                                                             "given twice"),
                                         (["export", "m.onnx"], "MODEL or --model")])
def test_model_missing_or_twice_is_one_line(argv, words, capsys):
    from bertkit.cli import main
    if words is None:       # the one positional is taken as the model: a missing directory, one line
        assert main(argv) == 2
        assert capsys.readouterr().err.count("\n") == 1
        return
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_fill_mask_over_a_file_results_on_stdout_bar_on_stderr(tiny_workspace, tmp_path, monkeypatch, capsys):
    from bertkit.cli import main
    ws = _ws(tiny_workspace, tmp_path, monkeypatch)
    (ws / "masked.txt").write_text("the [MASK] sat .\n\na [MASK] is eating food .\nparis is the [MASK] .\n")
    assert main(["fill-mask", "--file", "masked.txt", "tiny-bert", "--json", "--top-k", "2", "--progress"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in rows] == ["the [MASK] sat .", "a [MASK] is eating food .", "paris is the [MASK] ."]
    assert all(len(r["candidates"]) == 2 for r in rows) and "fill-mask: 100%|" in err and "3/3" in err
    assert main(["fill-mask", "tiny-bert", "--top-k", "2"]) == 2
    assert "no texts" in capsys.readouterr().err


def test_the_command_line_starts_without_torch():
    """`bertkit -h` and the argument parsing of every subcommand stay off torch's import (~1-3 s on a small CPU):
    a command imports what it runs."""
    import subprocess
    import sys
    code = "import sys, bertkit.cli; bertkit.cli.build_parser(); sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_the_parsers_choices_are_the_trainers():
    """The choices spelled in the parser (kept off torch's import) are exactly what the training loop accepts."""
    from bertkit.cli import build_parser
    from bertkit.hardware import PRECISIONS
    from bertkit.optim import OPTIMIZERS, SCHEDULES
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["pretrain"]
    choices = {a.dest: tuple(a.choices) for a in sub._actions if a.choices}
    assert set(choices["optimizer"]) == set(OPTIMIZERS) and set(choices["schedule"]) == set(SCHEDULES)
    assert set(choices["precision"]) == set(PRECISIONS)
