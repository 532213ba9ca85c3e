"""`-` for stdin wherever a command reads a file: the same bytes piped in give the same results as the file."""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
from pathlib import Path

import pytest

from bertkit.textfiles import sniff_suffix

MASKED = b"the [MASK] sat .\n\na [MASK] is eating food .\nparis is the [MASK] .\n"
# name, argv ("IN" is the input, W/ the workspace, O/ the run's scratch directory), the input (W/... or bytes)
CASES = [
    ("finetune --train", ["finetune", "--task", "classify", "--model", "W/tiny-bert", "--train", "IN", "--dev",
                          "W/data/sentiment/dev.csv", "--out", "O/ft", "--epochs", "1", "--batch-size", "16",
                          "--fp32", "--quiet", "--no-save"], "W/data/sentiment/train.csv"),
    ("evaluate --data", ["evaluate", "--model", "F", "--data", "IN", "--fp32"], "W/data/sentiment/test.csv"),
    ("predict --data", ["predict", "--model", "F", "--data", "IN", "--out", "O/predictions.jsonl", "--fp32"],
     "W/new.csv"),
    ("prepare --corpus", ["prepare", "--corpus", "IN", "--vocab", "W/my-vocab", "--out", "O/shards", "--json",
                          "--no-progress"], "W/corpus/a.txt"),
    ("convert --config", ["convert", "W/uncased_L-12_H-768_A-12", "O/conv", "--config", "IN", "--json"],
     "W/uncased_L-12_H-768_A-12/bert_config.json"),
    ("fill-mask --file", ["fill-mask", "W/tiny-bert", "--file", "IN", "--json", "--top-k", "2"], MASKED),
    ("embed --file", ["embed", "W/tiny-bert", "--file", "IN", "--search", "a man", "--top-k", "2"], "W/docs.txt"),
    ("rerank --file", ["rerank", "W/runs/pairs", "--query", "the cat", "--file", "IN", "--top-k", "3"], "W/docs.txt"),
    ("mine --data", ["mine", "W/tiny-bert", "--data", "IN", "--out", "O/mined.jsonl"], "W/pairs.jsonl"),
    ("mine --corpus", ["mine", "W/tiny-bert", "--data", "W/pairs.jsonl", "--corpus", "IN", "--out", "O/mined.jsonl"],
     "W/docs.txt"),
    ("evaluate --task embed --data", ["evaluate", "--task", "embed", "--model", "W/tiny-bert", "--data", "IN"],
     "W/pairs.jsonl"),
    ("plot", ["plot", "IN", "--out", "O/curves.png"], "R/metrics.jsonl"),
    ("quantize --check", ["quantize", "F", "O/q", "--check", "IN", "--json", "--precision", "fp32"],
     "W/data/sentiment/dev.csv"),
    ("prepare --corpus .gz", ["prepare", "--corpus", "IN", "--vocab", "W/my-vocab", "--out", "O/shards", "--json",
                              "--no-progress"], gzip.compress(b"the cat sat .\nhe was tired .\n\na dog ran .\n" * 20)),
    ("tokenize --vocab", ["tokenize", "--vocab", "IN", "the cat sat ."], "W/my-vocab/vocab.txt"),
]


def _argv(argv, given: str, ws: Path, finetuned: Path, run: Path, out: Path) -> list[str]:
    def one(a: str) -> str:
        if a == "IN":
            return given
        if a == "F":
            return str(finetuned)
        for key, base in (("W/", ws), ("O/", out), ("R/", run)):
            if a.startswith(key):
                return str(base / a[2:])
        return a
    return [one(a) for a in argv]


def _feed(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def _main(argv, capsys) -> tuple[int, str, str]:
    from bertkit.cli import main
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _outputs(out: Path) -> dict[str, bytes]:
    """The files a run wrote that do not name their own path (predictions, mined rows): compared byte for byte."""
    return {p.name: p.read_bytes() for p in out.rglob("*") if p.name.startswith(("predictions", "mined"))}


@pytest.mark.parametrize("name,argv,given", CASES, ids=[c[0] for c in CASES])
def test_dash_gives_what_the_file_gives(name, argv, given, tiny_workspace, tmp_path, monkeypatch, capsys):
    ws, run, finetuned = tiny_workspace["ws"], tiny_workspace["run"], tiny_workspace["finetuned"]
    if isinstance(given, bytes):
        name = "input.txt.gz" if given[:2] == b"\x1f\x8b" else "input.txt"
        (tmp_path / name).write_bytes(given)
        given = str(tmp_path / name)
    path = _argv([given], "", ws, finetuned, run, tmp_path)[0]
    results = []
    for how in ("file", "stdin"):
        out = tmp_path / how
        out.mkdir()
        _feed(monkeypatch, Path(path).read_bytes() if how == "stdin" else b"")
        rc, stdout, err = _main(_argv(argv, "-" if how == "stdin" else path, ws, finetuned, run, out), capsys)
        assert rc == 0, err[-2000:]
        # a result naming its input names stdin '-'; timings differ run to run
        timeless = re.sub(r'"(\w*_s|\w*seconds)": [0-9.e+-]+', r'"\1": T', stdout.replace(str(out), "OUT").replace(path, "-"))
        results.append((timeless, _outputs(out)))
    assert results[0][0].strip(), "the command printed nothing to compare"
    assert results[1] == results[0]


def test_two_dashes_are_one_line_exit_2(tiny_workspace, tmp_path, monkeypatch, capsys):
    ws = tiny_workspace["ws"]
    _feed(monkeypatch, (ws / "data/sentiment/train.csv").read_bytes())
    rc, out, err = _main(["finetune", "--task", "classify", "--model", str(ws / "tiny-bert"), "--train", "-", "--dev",
                          "-", "--out", str(tmp_path / "ft")], capsys)
    assert rc == 2 and err.count("\n") == 1 and "--train, --dev" in err and "stdin" in err, err
    assert not (tmp_path / "ft").exists()
    rc, out, err = _main(["tokenize", "--vocab", "-", "--file", "-"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "--file" in err and "--vocab" in err, err


def test_an_error_in_stdin_data_names_stdin(tiny_workspace, monkeypatch, capsys):
    _feed(monkeypatch, b"text,label\nthe film was great,pos\n,neg\n")
    rc, out, err = _main(["evaluate", "--model", str(tiny_workspace["finetuned"]), "--data", "-"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "<stdin>:3" in err and "bertkit-stdin" not in err, err


def test_the_copy_of_stdin_is_removed(tiny_workspace, monkeypatch, capsys):
    import tempfile
    before = set(Path(tempfile.gettempdir()).glob("bertkit-stdin-*"))
    _feed(monkeypatch, MASKED)
    assert _main(["fill-mask", str(tiny_workspace["ws"] / "tiny-bert"), "--file", "-"], capsys)[0] == 0
    assert set(Path(tempfile.gettempdir()).glob("bertkit-stdin-*")) == before


def test_plot_from_stdin_needs_out(tiny_workspace, monkeypatch, capsys):
    _feed(monkeypatch, (tiny_workspace["run"] / "metrics.jsonl").read_bytes())
    rc, out, err = _main(["plot", "-"], capsys)
    assert rc == 2 and "--out" in err and err.count("\n") == 1, err


def test_stdin_format_overrides_the_sniffing(tiny_workspace, monkeypatch, capsys):
    rows = (tiny_workspace["ws"] / "data/sentiment/test.csv").read_text().replace(",", "\t")
    _feed(monkeypatch, rows.encode())
    argv = ["evaluate", "--model", str(tiny_workspace["finetuned"]), "--data", "-", "--fp32"]
    assert _main(argv, capsys)[0] == 0                           # sniffed: .tsv
    _feed(monkeypatch, rows.encode())
    rc, out, err = _main([*argv, "--stdin-format", "csv"], capsys)
    assert rc == 2 and "<stdin>" in err, err                      # read as CSV: no 'text' column


SQUAD = json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": []}]})


@pytest.mark.parametrize("data,suffix", [
    (b'{"text": "a", "label": "pos"}\n{"text": "b", "label": "neg"}\n', ".jsonl"),
    (b'\n\n  {"text": "a"}\n', ".jsonl"),
    (SQUAD.encode(), ".json"),
    (json.dumps(json.loads(SQUAD), indent=2).encode(), ".json"),
    (b"text\tlabel\nthe film\tpos\n", ".tsv"),
    (b"text,label\nthe film,pos\n", ".csv"),
    (b"the film was great\n", ".csv"),
    (b"-DOCSTART- -X- O O\n\nEU NNP B-ORG\nrejects VBZ O\n\nPeter NNP B-PER\n", ".conll"),
    (b"EU B-ORG\nrejects O\n\nPeter B-PER\nBlackburn I-PER\n", ".conll"),
    (b"EU\tB-ORG\nrejects\tO\n\nPeter\tB-PER\n", ".conll"),
    (b"text\tlabel\ngood\tpos\nbad\tneg\n", ".tsv"),      # one sentence of tokens would be CoNLL; a table has no gaps
    (gzip.compress(b'{"text": "a"}\n'), ".jsonl.gz"),
])
def test_sniffed_suffix(data, suffix):
    assert sniff_suffix(data) == suffix


def test_a_run_records_stdin_as_dash(tiny_workspace, tmp_path, monkeypatch, capsys):
    ws = tiny_workspace["ws"]
    _feed(monkeypatch, (ws / "data/sentiment/train.csv").read_bytes())
    rc, out, err = _main(["finetune", "--task", "classify", "--model", str(ws / "tiny-bert"), "--train", "-", "--dev",
                          str(ws / "data/sentiment/dev.csv"), "--out", str(tmp_path / "ft"), "--epochs", "1",
                          "--fp32", "--quiet", "--no-save"], capsys)
    assert rc == 0, err
    config = json.loads((tmp_path / "ft" / "summary.json").read_text())["config"]
    assert config["train"] == "-" and config["dev"] == str(ws / "data/sentiment/dev.csv")
