"""Vocabulary training: layout, coverage, exact size, determinism, the merge algorithm against a brute-force
reference, streaming/pruning, bad input, the CLI, and quality against tokenizers' WordPieceTrainer on a BBC slice."""

from __future__ import annotations

import gzip
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertkit import vocab as V
from bertkit.cli import main as cli_main
from bertkit.errors import ConfigError, DataError
from bertkit.tokenizer import Tokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

TEXT = """The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away!
Café déjà vu: naïve résumé — Ünïcödé words, 東京 and 北京 are cities. Emoji 🙂 too.
Numbers like 3.14159 and 2,718 appear, as do e-mail@example.com and #hashtags.
Running runners run; jumping jumpers jumped. Unbelievable, unbelievably, believer, believe.
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path) -> Path:
    rng = random.Random(0)
    lines = TEXT.splitlines()
    return write(tmp_path / "corpus.txt", "\n".join(rng.choice(lines) for _ in range(200)) + "\n")


def corpus_chars(path: Path, lowercase: bool = True) -> set[str]:
    bt = Tokenizer({t: i for i, t in enumerate(SPECIALS)}, lowercase=lowercase).basic_tokenize
    return {c for line in path.read_text(encoding="utf-8").splitlines() for w in bt(line) for c in w}


# ------------------------------------------------------------------------------------------------ layout & coverage

def test_layout_specials_first_size_exact_and_full_coverage(corpus):
    tok = V.train_vocab(corpus, vocab_size=200)
    tokens = tok.ids_to_tokens
    assert tokens[:5] == SPECIALS
    assert len(tokens) == 200 == tok.vocab_size
    assert len(set(tokens)) == len(tokens)
    chars = corpus_chars(corpus)
    assert {"東", "京", "🙂", "e", "."} <= chars
    for c in chars:
        assert c in tok.vocab and "##" + c in tok.vocab, c
    # uncased: no uppercase letters or accented letters survive normalisation
    assert not any(ch.isupper() for t in tokens[5:] for ch in t)
    assert "é" not in tok.vocab and "e" in tok.vocab
    # the alphabet is followed by learned multi-char pieces, both word-initial and continuation
    assert "the" in tok.vocab and any(t.startswith("##") and len(t) > 3 for t in tokens)
    assert tok.pad_token_id == 0 and tok.unk_token_id == 1 and tok.mask_token_id == 4


def test_no_unk_on_training_text_and_frequent_words_are_one_piece(corpus):
    tok = V.train_vocab(corpus, vocab_size=230)
    for line in corpus.read_text(encoding="utf-8").splitlines():
        assert "[UNK]" not in tok.tokenize(line), line
    for word in ("the", "fox", "dog", "jumps"):
        assert tok.tokenize(word) == [word]


def test_cased_keeps_case_and_accents(corpus):
    tok = V.train_vocab(corpus, vocab_size=240, lowercase=False)
    assert not tok.lowercase
    assert {"T", "C", "é", "Ü", "##é"} <= set(tok.vocab)
    assert "[UNK]" not in tok.tokenize("Café Ünïcödé")


def test_deterministic_and_save_roundtrip(corpus, tmp_path):
    a = V.train_vocab(corpus, vocab_size=180)
    b = V.train_vocab(corpus, vocab_size=180)
    assert a.ids_to_tokens == b.ids_to_tokens and a.vocab_hash == b.vocab_hash
    out = a.save(tmp_path / "out")
    c = Tokenizer.from_pretrained(out)
    assert c.ids_to_tokens == a.ids_to_tokens and c.lowercase is True
    text = "The quick brown fox, unbelievably!"
    assert c.tokenize(text) == a.tokenize(text)
    assert c.convert_tokens_to_ids(c.tokenize(text)) == a.convert_tokens_to_ids(a.tokenize(text))
    cased = Tokenizer.from_pretrained(V.train_vocab(corpus, vocab_size=180, lowercase=False).save(tmp_path / "c"))
    assert cased.lowercase is False


def test_vocab_smaller_when_corpus_runs_out(tmp_path):
    path = write(tmp_path / "tiny.txt", "abc abc abd\n")
    res = V.learn_vocab(path, V.VocabTrainingConfig(vocab_size=1000))
    # specials + 4 chars x 2 + merges ab, abc (abd appears once: below min_frequency 2)
    assert res.tokens == SPECIALS + ["a", "b", "c", "d", "##a", "##b", "##c", "##d", "ab", "abc"]
    assert res.stats["vocab_size"] == 15 and "min_frequency" in res.stats["stop_reason"]
    res1 = V.learn_vocab(path, V.VocabTrainingConfig(vocab_size=1000, min_frequency=1))
    assert res1.tokens[-1] == "abd" and res1.stats["stop_reason"] == "no pairs left"


def test_verbatim_special_tokens_are_not_counted(tmp_path):
    path = write(tmp_path / "s.txt", "the [MASK] sat on the [SEP] mat [CLS]\n" * 3)
    tok = V.train_vocab(path, vocab_size=60)
    assert not any(ch.isupper() for t in tok.ids_to_tokens[5:] for ch in t)
    assert "[M" not in tok.vocab and tok.ids_to_tokens.count("[MASK]") == 1


def test_long_words_do_not_train_but_their_chars_are_covered(tmp_path):
    long = "x" * 150
    path = write(tmp_path / "l.txt", (long + " ab ab\n") * 5)
    res = V.learn_vocab(path, V.VocabTrainingConfig(vocab_size=100))
    assert "x" in res.tokens and "##x" in res.tokens
    assert "xx" not in res.tokens and "ab" in res.tokens


def test_limit_alphabet_keeps_most_frequent_chars(corpus):
    res = V.learn_vocab(corpus, V.VocabTrainingConfig(vocab_size=200, limit_alphabet=20))
    assert res.stats["alphabet"] == 20
    singles = [t for t in res.tokens[5:] if len(t) == 1]
    assert len(singles) == 20 and "e" in singles and "東" not in singles


# ------------------------------------------------------------------------------------- the merge algorithm itself

def brute_force(word_counts: dict[str, int], vocab_size: int, min_frequency: int) -> list[str]:
    """The specification, recomputing every pair count after every merge."""
    chars = sorted({c for w in word_counts for c in w})
    tokens = SPECIALS + chars + ["##" + c for c in chars]
    ids = {t: i for i, t in enumerate(tokens)}
    words = {w: [ids[w[0]]] + [ids["##" + c] for c in w[1:]] for w in word_counts if 2 <= len(w) <= 100}
    while len(tokens) < vocab_size:
        pairs: Counter = Counter()
        for w, syms in words.items():
            for p in zip(syms, syms[1:]):
                pairs[p] += word_counts[w]
        if not pairs:
            break
        (a, b), n = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if n < min_frequency:
            break
        piece = tokens[a] + tokens[b][2:]
        if piece not in ids:
            ids[piece] = len(tokens)
            tokens.append(piece)
        new = ids[piece]
        for w, syms in words.items():
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[w] = out
    return tokens


@pytest.mark.parametrize("seed", range(6))
def test_incremental_merges_equal_brute_force(seed):
    rng = random.Random(seed)
    alphabet = "ab" if seed < 2 else "abcde"  # tiny alphabets force ties, repeats (abab) and duplicate strings
    words = {"".join(rng.choices(alphabet, k=rng.randint(1, 9))): rng.randint(1, 6) for _ in range(120)}
    chars = Counter()
    for w, n in words.items():
        for c in w:
            chars[c] += n
    for size, min_freq in ((40, 2), (400, 1)):
        config = V.VocabTrainingConfig(vocab_size=size, special_tokens=tuple(SPECIALS), min_frequency=min_freq)
        got = V.learn_wordpieces(dict(words), chars, config)
        assert got == brute_force(words, size, min_freq), (seed, size)


# ----------------------------------------------------------------------------------------- streaming and pruning

def test_gzip_glob_and_chunked_long_lines_count_the_same(tmp_path, monkeypatch):
    text = " ".join(f"word{i % 37} ünï{i % 5}" for i in range(3000))  # one 40 kB line, no newline at the end
    write(tmp_path / "a.txt", text)
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write(text + "\nsecond line\n")
    bt = Tokenizer({t: i for i, t in enumerate(SPECIALS)}).basic_tokenize
    expect = Counter(bt(text) * 2 + bt("second line"))
    monkeypatch.setattr(V, "_CHUNK_BYTES", 1000)  # force the long line through many bounded chunks
    chunks = [c for p in V.expand_files(str(tmp_path / "*.t*")) for c in V.iter_text(p)]
    assert max(map(len, chunks)) <= 1000 and len(chunks) > 60
    counts, _ = V.count_words(chunks, bt, 10**6)
    assert counts == expect


def test_pruning_bounds_the_word_table_and_keeps_coverage(tmp_path):
    lines = []
    for i in range(400):  # frequent words everywhere + a stream of distinct rare words
        lines.append("common words repeat often " + " ".join(f"rare{i}x{j}" for j in range(10)) + " ζ" * (i == 7))
    path = write(tmp_path / "p.txt", "\n".join(lines) + "\n")
    bt = Tokenizer({t: i for i, t in enumerate(SPECIALS)}).basic_tokenize
    stats: dict = {}
    counts, chars = V.count_words(V.iter_text(path), bt, max_distinct_words=200, stats=stats)
    assert stats["prune_rounds"] > 5 and stats["pruned_words"] > 3000
    assert len(counts) <= 200 + 14
    assert counts["common"] == 400  # frequent words are never pruned
    assert "ζ" in chars  # the rare line's char survived although its words were pruned
    tok = V.train_vocab(path, vocab_size=100, max_distinct_words=200)
    assert "ζ" in tok.vocab and "common" in tok.vocab


# ------------------------------------------------------------------------------------------------------- bad input

def test_bad_input_raises_bertkit_errors_naming_the_culprit(tmp_path, corpus):
    with pytest.raises(DataError, match="nope.txt: no such file"):
        V.train_vocab(tmp_path / "nope.txt", vocab_size=100)
    with pytest.raises(DataError, match=r"\*.zzz: the pattern matches no file"):
        V.train_vocab(str(tmp_path / "*.zzz"), vocab_size=100)
    with pytest.raises(DataError, match="is a directory"):
        V.train_vocab(tmp_path, vocab_size=100)
    empty = write(tmp_path / "empty.txt", "\n  \n\x00\x01\n")
    with pytest.raises(DataError, match="empty.txt: the corpus has no words"):
        V.train_vocab(empty, vocab_size=100)
    with pytest.raises(ConfigError, match=r"vocab_size=20 .*use vocab_size >= \d+"):
        V.train_vocab(corpus, vocab_size=20)
    with pytest.raises(ConfigError, match="vocab_size must be a positive integer"):
        V.train_vocab(corpus, vocab_size=0)
    with pytest.raises(ConfigError, match=r"missing \['\[MASK\]'\]"):
        V.train_vocab(corpus, vocab_size=200, special_tokens=SPECIALS[:4])
    bad_gz = tmp_path / "bad.txt.gz"
    bad_gz.write_bytes(b"this is not gzip data")
    with pytest.raises(DataError, match="bad.txt.gz:1: cannot read"):
        V.train_vocab(bad_gz, vocab_size=100)
    with pytest.raises(TypeError, match="paths or glob patterns"):
        V.train_vocab([corpus, 3], vocab_size=100)



def test_train_vocab_keywords_are_config_fields(corpus):
    with pytest.raises(ConfigError, match="unknown option vocabsize"):
        V.train_vocab(corpus, vocabsize=100)
    with pytest.raises(ConfigError, match="config must be a VocabTrainingConfig"):
        V.train_vocab(corpus, 100)
    base = V.VocabTrainingConfig(vocab_size=180, lowercase=False)
    overridden = V.train_vocab(corpus, base, vocab_size=200)
    assert overridden.vocab == V.train_vocab(corpus, vocab_size=200, lowercase=False).vocab

def test_invalid_utf8_follows_the_replace_policy(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9 ok caf\xe9 ok\n".encode("latin-1") + "naïve naïve\n".encode("utf-8"))
    res = V.learn_vocab(path, V.VocabTrainingConfig(vocab_size=40))
    assert res.stats["replacement_chars"] == 2
    assert "\ufffd" not in res.tokens and "i" in res.tokens and "caf" in res.tokens  # U+FFFD dropped by cleaning


# ------------------------------------------------------------------------------------------------------------- CLI

def test_cli_writes_vocab_and_prints_summary(corpus, tmp_path, capsys):
    out = tmp_path / "cli-out"
    rc = cli_main(["vocab", "--files", str(corpus), "--vocab-size", "200", "--out", str(out), "--cased"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "200 pieces" in printed and "cased" in printed
    tok = Tokenizer.from_pretrained(out)
    assert tok.vocab_size == 200 and tok.lowercase is False


def test_cli_user_errors_exit_2_with_one_line(tmp_path, corpus, capsys):
    assert cli_main(["vocab", "--files", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "missing.txt: no such file" in err
    assert cli_main(["vocab", "--files", str(corpus), "--vocab-size", "7", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "vocab_size=7" in err


# ------------------------------------------------------------------------------------------ quality vs the oracle

def test_quality_matches_wordpiece_trainer_on_a_bbc_slice(bbc_articles, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, normalizers, pre_tokenizers, trainers
    train = [a.text for a in bbc_articles[:400:2]]
    heldout = [a.text for a in bbc_articles[1:400:8]]
    path = write(tmp_path / "bbc.txt", "\n".join(train) + "\n")
    ours = V.train_vocab(path, vocab_size=3000)
    hf = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    hf.normalizer = normalizers.BertNormalizer(lowercase=True)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.train([str(path)], trainers.WordPieceTrainer(vocab_size=3000, min_frequency=2, special_tokens=SPECIALS,
                                                     show_progress=False))
    theirs = Tokenizer({t: i for t, i in hf.get_vocab().items()})
    assert ours.vocab_size == theirs.vocab_size == 3000
    words = sum(len(ours.basic_tokenize(t)) for t in heldout)
    ppw = {name: sum(len(tok.tokenize(t)) for t in heldout) / words for name, tok in (("ours", ours), ("hf", theirs))}
    unk = {name: sum(tok.tokenize(t).count("[UNK]") for t in heldout) for name, tok in (("ours", ours), ("hf", theirs))}
    assert ppw["ours"] <= 1.03 * ppw["hf"], ppw
    assert unk["ours"] <= unk["hf"], unk


# ------------------------------------------------------------------------------------- arbitrary Unicode coverage


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.text(min_size=1, max_size=60), min_size=1, max_size=8), lowercase=st.booleans())
def test_any_unicode_corpus_trains_and_encodes_without_unk(tmp_path, lines, lowercase):
    path = tmp_path / "u.txt"
    path.write_bytes("\n".join(lines).encode("utf-8", errors="surrogatepass"))  # lone surrogates: invalid UTF-8
    bt = Tokenizer({t: i for i, t in enumerate(SPECIALS)}, lowercase=lowercase).basic_tokenize
    text = path.read_bytes().decode("utf-8", errors="replace")
    words = [w for w in bt(text) if w not in SPECIALS]
    if not words:
        with pytest.raises(DataError, match="no words"):
            V.train_vocab(path, vocab_size=10_000, lowercase=lowercase)
        return
    tok = V.train_vocab(path, vocab_size=10_000, lowercase=lowercase, min_frequency=1)
    assert tok.ids_to_tokens[:5] == SPECIALS and len(set(tok.ids_to_tokens)) == tok.vocab_size
    for w in words:
        assert w[0] in tok.vocab and all("##" + c in tok.vocab for c in w[1:]), w
    assert "[UNK]" not in tok.tokenize(" ".join(w for w in words if len(w) <= 100))
    # and it survives a save / load round trip
    again = Tokenizer.from_pretrained(tok.save(tmp_path / f"rt{int(lowercase)}"))
    assert again.ids_to_tokens == tok.ids_to_tokens


# ------------------------------------------------------------------------------------ memory vs corpus size (slow)

CAP = "50000"  # the word-table cap under test: without it (5M) the peak measured 1027 MB vs 182 MB
_PEAK_WORKER = r"""
import sys
from bertkit.vocab import train_vocab
train_vocab([sys.argv[1]], vocab_size=500, max_distinct_words=int(sys.argv[2]))
with open("/proc/self/status") as f:  # VmHWM: this process's own peak RSS (ru_maxrss would include the parent's)
    print(next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) // 1024)
"""


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_corpus_size(tmp_path):
    import subprocess
    import sys
    rng = random.Random(0)
    peaks = {}
    for n_lines in (20_000, 160_000):  # 8x the text, 8x the distinct words (each line has 10 new ones)
        path = tmp_path / f"c{n_lines}.txt"
        with open(path, "w", encoding="utf-8") as f:
            for i in range(n_lines):
                f.write("the news of the day " + " ".join(f"w{rng.random():.12f}x{i}"[3:] for _ in range(10)) + "\n")
        out = subprocess.run([sys.executable, "-c", _PEAK_WORKER, str(path), CAP], capture_output=True,
                             text=True, check=True)
        peaks[n_lines] = int(out.stdout.split()[-1])
    assert peaks[160_000] < 1.25 * peaks[20_000], peaks
