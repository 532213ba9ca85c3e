"""Readers: happy paths for every format and a clear bertkit error (file + line) for each kind of bad input."""

from __future__ import annotations

import json

import pytest

from bertkit.errors import DataError
from bertkit.tasks.readers import LabelMap, read_conll, read_squad, read_table


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_tsv_jsonl(tmp_path):
    csv = _write(tmp_path / "a.csv", 'text,text_pair,label\n"hello, world",there,pos\nbad,,neg\n')
    ex = read_table(csv)
    assert [e.text for e in ex] == ["hello, world", "bad"] and ex[0].text_pair == "there" and ex[1].label == "neg"
    assert ex[1].source.endswith("a.csv:3")
    tsv = _write(tmp_path / "a.tsv", "label\ttext\n1\tgood film\n0\tawful\n")
    assert [e.label for e in read_table(tsv)] == ["1", "0"]
    jl = _write(tmp_path / "a.jsonl", '{"text": "x", "label": 2}\n\n{"text": "y", "label": ["a", "b"]}\n')
    ex = read_table(jl)
    assert ex[0].label == "2" and ex[1].label == ["a", "b"] and ex[1].source.endswith(":3")
    jl2 = _write(tmp_path / "r.jsonl", '{"text": "x", "label": 0.25}\n')
    assert float(read_table(jl2)[0].label) == 0.25


def test_table_errors_name_file_and_line(tmp_path):
    with pytest.raises(DataError, match=r"b\.csv:3: empty 'text'"):
        read_table(_write(tmp_path / "b.csv", "text,label\nok,1\n ,0\n"))
    with pytest.raises(DataError, match=r"c\.csv:2: missing column\(s\) 'label'"):
        read_table(_write(tmp_path / "c.csv", "text,score\nok,1\n"))
    # prediction input may lack the label column
    assert read_table(tmp_path / "c.csv", require_label=False)[0].label is None
    with pytest.raises(DataError, match=r"d\.jsonl:2: missing value in column 'label'"):
        read_table(_write(tmp_path / "d.jsonl", '{"text": "a", "label": "x"}\n{"text": "b"}\n'))
    with pytest.raises(DataError, match=r"e\.jsonl:1: not valid JSON"):
        read_table(_write(tmp_path / "e.jsonl", '{"text": \n'))
    with pytest.raises(DataError, match=r"f\.tsv:3: 3 fields, the header has 2"):
        read_table(_write(tmp_path / "f.tsv", "text\tlabel\na\t1\nb\t1\textra\n"))
    with pytest.raises(DataError, match="unknown table format"):
        read_table(_write(tmp_path / "g.txt", "x"))
    with pytest.raises(DataError, match="no such file"):
        read_table(tmp_path / "missing.csv")


def test_label_map():
    lm = LabelMap.from_labels(["10", "2", "1", "2"])
    assert lm.labels == ["1", "2", "10"]
    assert LabelMap.from_labels(["pos", "neg"]).labels == ["neg", "pos"]
    assert lm.id("10") == 2
    with pytest.raises(DataError, match=r"dev\.csv:7: unknown label 'neutral'"):
        LabelMap(["neg", "pos"]).id("neutral", source="dev.csv:7")


CONLL = """-DOCSTART-\tbusiness/001.txt

John\tB-PER
lives\tO
in\tO
New\tB-LOC
York\tI-LOC

He\tO
left\tO

-DOCSTART-\tbusiness/002.txt

Acme\tB-ORG
"""


def test_conll(tmp_path):
    s = read_conll(_write(tmp_path / "a.conll", CONLL))
    assert len(s) == 3 and s[0].words[3:] == ["New", "York"] and s[0].tags[0] == "B-PER"
    assert s[0].doc == s[1].doc == "business/001.txt" and s[2].doc == "business/002.txt"
    assert s[1].source.endswith("a.conll:9")
    bad = _write(tmp_path / "b.conll", "a\tO\nb\tB-X\textra\n")
    with pytest.raises(DataError, match=r"b\.conll:2: 3 column\(s\), expected 2"):
        read_conll(bad)
    with pytest.raises(DataError, match=r"c\.conll:1: a token line needs a tag column"):
        read_conll(_write(tmp_path / "c.conll", "word\n"))
    words_only = read_conll(tmp_path / "c.conll", require_tags=False)
    assert words_only[0].tags is None


def _squad(tmp_path, answers, impossible=None, name="s.json"):
    qa = {"id": "q1", "question": "Where?", "answers": answers}
    if impossible is not None:
        qa["is_impossible"] = impossible
    doc = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "He went to Paris. Paris is big.", "qas": [qa]}]}]}
    p = tmp_path / name
    p.write_text(json.dumps(doc, indent=1))
    return p


def test_squad(tmp_path):
    d = read_squad(_squad(tmp_path, [{"text": "Paris", "answer_start": 11}]))
    assert d.examples[0].answers == [("Paris", 11)] and not d.version_2 and d.fixed_offsets == 0
    # an offset that is off but whose text exists is moved to the nearest occurrence, and counted
    d = read_squad(_squad(tmp_path, [{"text": "Paris", "answer_start": 17}]))
    assert d.examples[0].answers == [("Paris", 18)] and d.fixed_offsets == 1
    with pytest.raises(DataError, match=r"s\.json:\d+: question 'q1': answer 'Paris' is not at answer_start=17"):
        read_squad(_squad(tmp_path, [{"text": "Paris", "answer_start": 17}]), fix_offsets=False)
    with pytest.raises(DataError, match="does not occur in the context"):
        read_squad(_squad(tmp_path, [{"text": "London", "answer_start": 0}]))
    d = read_squad(_squad(tmp_path, [], impossible=True))
    assert d.version_2 and d.examples[0].is_impossible and d.examples[0].answers == []
    with pytest.raises(DataError, match="has no answers and is not marked is_impossible"):
        read_squad(_squad(tmp_path, []))


def test_a_file_of_another_task_format_says_what_it_is(tmp_path):
    """A SQuAD document read as a table or as CoNLL, a table read as SQuAD, a directory: the message names what the
    file is, not only the line that failed."""
    from bertkit.tasks.readers import read_conll, read_squad, read_table
    squad = tmp_path / "dev.json"
    squad.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": []}]}, indent=1))
    with pytest.raises(DataError, match="one JSON document, not JSON Lines.*SQuAD file"):
        read_table(squad)
    with pytest.raises(DataError, match="JSON, not CoNLL"):
        read_conll(squad)
    table = tmp_path / "dev.csv"
    table.write_text("text,label\nnice,pos\n")
    with pytest.raises(DataError, match="a qa model reads SQuAD JSON"):
        read_squad(table)
    with pytest.raises(DataError, match="is a directory"):
        read_table(tmp_path)


def test_conll_whose_first_token_is_a_bracket_is_still_conll(tmp_path):
    from bertkit.tasks.readers import read_conll
    f = tmp_path / "p.conll"
    f.write_text("[ O\nBBC B-ORG\n] O\n\n{ O\n")
    assert [s.words for s in read_conll(f)] == [["[", "BBC", "]"], ["{"]]


def test_a_field_longer_than_csvs_default_limit_is_read(tmp_path):
    long = "word " * 40000                       # 200000 characters: csv's default limit is 131072
    for name, sep in (("long.csv", ","), ("long.tsv", "\t")):
        ex = read_table(_write(tmp_path / name, f"text{sep}label\n{long}{sep}pos\nshort{sep}neg\n"))
        assert ex[0].text == long and ex[1].label == "neg"


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    from bertkit.textfiles import read_text, sniff_suffix
    bom = "\ufeff"
    assert read_table(_write(tmp_path / "a.csv", bom + "text,label\nnice,pos\n"))[0].text == "nice"
    assert read_table(_write(tmp_path / "a.tsv", bom + "text\tlabel\nnice\tpos\n"))[0].label == "pos"
    assert read_table(_write(tmp_path / "a.jsonl", bom + '{"text": "nice", "label": "pos"}\n'))[0].label == "pos"
    assert read_conll(_write(tmp_path / "a.conll", bom + "Paris B-LOC\n"))[0].words == ["Paris"]
    squad = _squad(tmp_path, [{"text": "Paris", "answer_start": 11}])
    squad.write_text(bom + squad.read_text(), encoding="utf-8")
    assert read_squad(squad).examples[0].id == "q1"
    assert read_text(_write(tmp_path / "a.txt", bom + "line\n")) == "line\n"
    assert sniff_suffix((bom + '{"text": "nice"}\n').encode()) == ".jsonl"
    # a bad byte after the mark is still reported at its own line
    (tmp_path / "b.csv").write_bytes(bom.encode() + b"text,label\nnice,pos\ncaf\xe9,neg\n")
    with pytest.raises(DataError, match=r"b\.csv:3: not UTF-8"):
        read_table(tmp_path / "b.csv")


def test_a_duplicate_column_is_refused(tmp_path):
    with pytest.raises(DataError, match=r"d\.csv: duplicate column 'label' in the header"):
        read_table(_write(tmp_path / "d.csv", "text,label,label\nnice,pos,neg\n"))
    with pytest.raises(DataError, match=r"d\.tsv: duplicate column 'text' in the header"):
        read_table(_write(tmp_path / "d.tsv", "text\tlabel\ttext\nnice\tpos\tawful\n"))


def test_a_duplicate_squad_question_id_is_refused(tmp_path):
    p = _squad(tmp_path, [{"text": "Paris", "answer_start": 11}])
    doc = json.loads(p.read_text())
    qas = doc["data"][0]["paragraphs"][0]["qas"]
    qas.append({**qas[0], "question": "Which city?"})
    p.write_text(json.dumps(doc, indent=1))
    with pytest.raises(DataError, match=r"s\.json: duplicate question id 'q1' \(lines \d+, \d+\)"):
        read_squad(p)


def test_regression_labels_must_be_finite_numbers(tmp_path):
    from bertkit.tasks.classify import SequenceTask
    from bertkit.tokenizer import Tokenizer
    tok = Tokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "nice"])})
    task = SequenceTask("regress")
    assert task.features(tok, read_table(_write(tmp_path / "ok.csv", "text,label\nnice,0.5\n")))[0].labels == 0.5
    for i, bad in enumerate(("nan", "inf", "-inf", "NaN")):
        rows = _write(tmp_path / f"r{i}.csv", f"text,label\nnice,1\nnice,{bad}\n")
        with pytest.raises(DataError, match=rf"r{i}\.csv:3: regression label '{bad}' is not a finite number"):
            task.features(tok, task.read(rows))
    rows = _write(tmp_path / "r.jsonl", '{"text": "nice", "label": NaN}\n')     # Python's json reads NaN
    with pytest.raises(DataError, match=r"r\.jsonl:1: regression label 'nan' is not a finite number"):
        task.features(tok, task.read(rows))


def test_a_list_label_is_for_multilabel_only(tmp_path):
    from bertkit.tasks.classify import SequenceTask
    rows = _write(tmp_path / "l.jsonl", '{"text": "nice", "label": "pos"}\n{"text": "bad", "label": ["neg"]}\n')
    for kind in ("classify", "regress"):
        with pytest.raises(DataError, match=rf"l\.jsonl:2: label \['neg'\] is a list; --task {kind} wants a single "
                                            r"value \(lists of labels are for --task multilabel\)"):
            SequenceTask(kind).read(rows)
    assert SequenceTask("multilabel").read(rows)[1].label == ["neg"]
