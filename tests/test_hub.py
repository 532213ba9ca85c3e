"""Hub names: repo ids resolve through a (fake) local Hugging Face cache; local paths win; offline and uncached is
one line naming the cache and the fix; huggingface_hub downloads when it may."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit import BertConfig, BertForMaskedLM, BertModel, Tokenizer
from bertkit.errors import CheckpointError
from bertkit.hub import hub_cache_dir, is_repo_id, resolve_model_dir

WORDS = ["the", "a", "man", "is", "eating", "food", "paris", "capital", "france", "."]
VOCAB = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)}
HASH = "0123456789abcdef0123456789abcdef01234567"
HASH_V1 = "fedcba9876543210fedcba9876543210fedcba98"


def _save_tiny(directory, seed=0, layers=2):
    torch.manual_seed(seed)
    cfg = BertConfig.preset("tiny", vocab_size=len(VOCAB), num_hidden_layers=layers)
    BertForMaskedLM(cfg).save_pretrained(directory, tokenizer=Tokenizer(VOCAB))


def _fake_cache(root, repo="org/tiny"):
    """<root>/models--org--tiny with refs main -> HASH (2 layers) and v1 -> HASH_V1 (1 layer)."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    for ref, commit, layers in (("main", HASH, 2), ("v1", HASH_V1, 1)):
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)
        _save_tiny(repo_dir / "snapshots" / commit, layers=layers)
    return repo_dir


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    cache = tmp_path / "hub-cache"
    _fake_cache(cache)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    return cache


def test_repo_id_resolves_through_hf_hub_cache(hf_cache):
    assert resolve_model_dir("org/tiny") == hf_cache / "models--org--tiny" / "snapshots" / HASH
    model = BertForMaskedLM.from_pretrained("org/tiny")
    assert model.config.num_hidden_layers == 2
    assert BertModel.from_pretrained("org/tiny", revision="v1").config.num_hidden_layers == 1
    assert BertModel.from_pretrained("org/tiny", revision=HASH_V1).config.num_hidden_layers == 1
    assert BertConfig.from_pretrained("org/tiny", num_labels=5).num_labels == 5
    assert BertConfig.from_pretrained("org/tiny", revision="v1").num_hidden_layers == 1


def test_hf_home_hub_is_the_cache_when_hf_hub_cache_is_unset(hf_cache, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    _fake_cache(tmp_path / "home" / "hub", repo="other/model")
    assert BertModel.from_pretrained("other/model").config.num_hidden_layers == 2
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"


def test_a_local_path_wins_over_the_cache(hf_cache, tmp_path):
    _save_tiny(tmp_path / "org" / "tiny", layers=3)              # ./org/tiny exists: it is the model
    assert BertModel.from_pretrained("org/tiny").config.num_hidden_layers == 3
    assert resolve_model_dir("org/tiny").resolve() == tmp_path / "org" / "tiny"


def test_offline_and_uncached_is_one_line_naming_the_cache_and_the_fix(hf_cache, monkeypatch):
    pytest.importorskip("huggingface_hub")                        # importable, yet offline: no download tried
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained("org/missing")
    msg = str(e.value)
    assert "\n" not in msg
    assert str(hf_cache / "models--org--missing") in msg
    assert "huggingface-cli download org/missing" in msg and "HF_HUB_OFFLINE" in msg and "local" in msg
    with pytest.raises(CheckpointError, match="revision 'v2'"):
        BertModel.from_pretrained("org/tiny", revision="v2")
    with pytest.raises(CheckpointError, match="not found"):
        BertModel.from_pretrained("./no/such/dir")


def test_uncached_downloads_with_snapshot_download(hf_cache, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    calls = []

    def fake_snapshot_download(repo_id, revision=None, cache_dir=None, allow_patterns=None):
        calls.append((repo_id, revision, cache_dir, allow_patterns))
        target = hf_cache / "models--org--fresh" / "snapshots" / HASH
        _save_tiny(target, layers=1)
        return str(target)

    monkeypatch.setattr(hub, "snapshot_download", fake_snapshot_download)
    assert BertModel.from_pretrained("org/fresh").config.num_hidden_layers == 1
    assert calls == [("org/fresh", "main", str(hf_cache), ["*.json", "*.txt", "*.safetensors"])]

    def failing(*args, **kwargs):
        raise OSError("Connection refused\nmore detail")

    monkeypatch.setattr(hub, "snapshot_download", failing)
    with pytest.raises(CheckpointError, match=r"download failed \(OSError: Connection refused\)") as e:
        BertModel.from_pretrained("org/unreachable")
    assert "\n" not in str(e.value)


def test_repo_id_shape():
    assert is_repo_id("org/name") and is_repo_id("bert-base-uncased") and is_repo_id("a.b/c_d-1")
    assert not is_repo_id("/abs/path") and not is_repo_id("a/b/c") and not is_repo_id("a--b/c")
    assert not is_repo_id("./x") and not is_repo_id("a/../b")


def test_predictor_and_commands_take_repo_ids(hf_cache, capsys):
    from bertkit.cli import main
    from bertkit.infer import Predictor
    assert Predictor.load("org/tiny").task == "mlm"
    assert main(["embed", "org/tiny", "the man is eating food ."]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert len(row["embedding"]) == 128
    assert main(["tokenize", "--model", "org/tiny", "paris"]) == 0
    assert "paris" in capsys.readouterr().out


def test_command_error_for_an_uncached_repo_is_one_line(hf_cache, monkeypatch, capsys):
    from bertkit.cli import main
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["embed", "org/absent", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "huggingface-cli download org/absent" in err
