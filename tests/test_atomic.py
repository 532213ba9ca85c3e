"""Outputs are written whole or not at all, and a link of the output's name keeps its target."""

import os

import pytest

from bertkit.atomic import replacing, write_json, write_text
from bertkit.errors import BertkitError


def test_write_replaces_a_hard_link_instead_of_writing_through(tmp_path):
    target = tmp_path / "train.csv"
    target.write_text("precious\n")
    out = tmp_path / "predictions.jsonl"
    os.link(target, out)
    write_text(out, "new\n")
    assert target.read_text() == "precious\n" and out.read_text() == "new\n"


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    out = tmp_path / "metrics.json"
    write_json(out, {"a": 1})
    with pytest.raises(RuntimeError):
        with replacing(out) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert out.read_text() == '{\n  "a": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_an_os_error_is_one_bertkit_line_naming_the_file(tmp_path):
    with pytest.raises(BertkitError, match="cannot write .*missing-dir/x.json"):
        write_json(tmp_path / "missing-dir" / "x.json", [])
