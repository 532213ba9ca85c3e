"""Corpus reading: both layouts, gzip, globs / directories, the sentence splitter, and bad input counted."""

from __future__ import annotations

import gzip

import pytest

from bertkit.errors import DataError
from bertkit.pretraining.corpus import CorpusStats, detect_format, expand_corpus, iter_documents, split_sentences


@pytest.mark.parametrize("text, expected", [
    ("Mr. Smith went to Washington. He said hello.", ["Mr. Smith went to Washington.", "He said hello."]),
    ("He moved to the U.S. in 1990. It was cold.", ["He moved to the U.S. in 1990.", "It was cold."]),
    ("Sales rose in the U.S. The rest fell.", ["Sales rose in the U.S.", "The rest fell."]),
    ("Shares rose 3.5% to $11.1bn. Profits fell.", ["Shares rose 3.5% to $11.1bn.", "Profits fell."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ('"Stop!" he said. She ran.', ['"Stop!" he said.', "She ran."]),
    ("J. R. R. Tolkien wrote it. Dr. Who watched.", ["J. R. R. Tolkien wrote it.", "Dr. Who watched."]),
    ("Is it? Yes! (Really.) Fine", ["Is it?", "Yes!", "(Really.)", "Fine"]),
    ("Apple Inc. said profits, e.g. margins, rose on Jan. 5. Good.",
     ["Apple Inc. said profits, e.g. margins, rose on Jan. 5.", "Good."]),
    ("see www.bbc.co.uk for more. Or not.", ["see www.bbc.co.uk for more.", "Or not."]),
    ("", []),
])
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_lines_and_prose_layouts(tmp_path):
    google = tmp_path / "google.txt"
    google.write_text("First sentence of doc one.\nSecond one, Mr. X.\n\n\nDoc two only sentence.\n")
    prose = tmp_path / "prose.txt"
    prose.write_text("A paragraph. With two sentences.\nAnother paragraph here! And more.\n\nSecond doc. Yes.\n")
    docs = list(iter_documents(google, "lines"))
    assert [d.sentences for d in docs] == [["First sentence of doc one.", "Second one, Mr. X."],
                                           ["Doc two only sentence."]]
    docs = list(iter_documents(prose, "prose"))
    assert [d.sentences for d in docs] == [["A paragraph.", "With two sentences.", "Another paragraph here!",
                                            "And more."], ["Second doc.", "Yes."]]
    assert [d.index for d in docs] == [0, 1]
    assert detect_format(prose.read_text().splitlines()) == "prose"
    assert detect_format(google.read_text().splitlines()) == "lines"
    assert [d.sentences for d in iter_documents(prose)] == [d.sentences for d in docs]        # auto


def test_gzip_globs_dirs_and_streaming(tmp_path):
    (tmp_path / "sub").mkdir()
    with gzip.open(tmp_path / "sub" / "a.txt.gz", "wt") as f:
        f.write("One. Two.\n\nThree.\n")
    (tmp_path / "b.txt").write_text("Four.\n")
    files = expand_corpus([str(tmp_path / "**" / "*.gz"), tmp_path / "b.txt"])
    assert [p.name for p in files] == ["a.txt.gz", "b.txt"]
    assert [p.name for p in expand_corpus(tmp_path)] == ["b.txt", "a.txt.gz"]
    st = CorpusStats()
    it = iter_documents(files, "lines", stats=st)
    assert next(it).sentences == ["One. Two."] and st.documents == 1      # a generator: one document at a time
    assert [d.sentences for d in it] == [["Three."], ["Four."]]
    assert st.files == 2 and st.documents == 3


def test_missing_inputs_are_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        expand_corpus(tmp_path / "nope.txt")
    with pytest.raises(DataError, match="matches no file"):
        expand_corpus(str(tmp_path / "*.none"))
    with pytest.raises(DataError, match="format"):
        list(iter_documents(tmp_path, "xml"))


def test_bad_input_is_skipped_and_counted(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_bytes(b"\n\n  \n")
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "mixed.txt").write_bytes(
        b"Good line one.\n"
        b"bad \xff\xfe utf-8 here.\n"
        + b"x" * 1_000_000 + b" a 1 MB line.\n"
        b"junk \x01\x02\x03 control bytes.\n"
        b"Good line two.\n\n"
        b"One sentence document.\n")
    st = CorpusStats()
    docs = list(iter_documents(tmp_path, "lines", stats=st))
    assert [d.sentences for d in docs] == [["Good line one.", "Good line two."], ["One sentence document."]]
    assert (st.empty_files, st.binary_files, st.invalid_utf8_lines, st.long_lines, st.binary_lines) == (2, 1, 1, 1, 1)
    assert st.skipped() == {"empty_files": 2, "binary_files": 1, "invalid_utf8_lines": 1, "binary_lines": 1,
                            "long_lines": 1}


def test_corrupt_gzip_is_an_error(tmp_path):
    data = gzip.compress(b"Hello there.\n" * 10000)
    (tmp_path / "cut.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="cut.gz"):
        list(iter_documents(tmp_path / "cut.gz"))


def test_prose_joins_hard_wrapped_lines(tmp_path):
    """In prose, a line that stops mid-sentence and a next line that goes on in lower case are one paragraph;
    a heading without a period stays a sentence of its own."""
    p = tmp_path / "wrapped.txt"
    p.write_text("A Heading Line\nThe quick brown fox jumped over\nthe lazy dog. It was\n42 degrees outside.\n"
                 "Next paragraph starts here.\n")
    docs = list(iter_documents(p, "prose"))
    assert docs[0].sentences == ["A Heading Line", "The quick brown fox jumped over the lazy dog.",
                                 "It was 42 degrees outside.", "Next paragraph starts here."]


def test_documents_without_blank_lines_are_cut(tmp_path):
    p = tmp_path / "noblank.txt"
    p.write_text("".join(f"Sentence number {i}.\n" for i in range(25)))
    st = CorpusStats()
    docs = list(iter_documents(p, "lines", stats=st, max_document_lines=10))
    assert [len(d.sentences) for d in docs] == [10, 10, 5] and st.split_documents == 2
