"""Standard corpora from local files in their distribution layout; no download ever happens."""

import logging
import sys
import types

import numpy as np
import pytest

from flaxformer_lite.data import SPLITS, corpus_names, get_corpus, standard, store


def _bytes(corpus, split):
    return bytes(np.asarray(corpus.split(split).data))


@pytest.fixture
def no_datasets(monkeypatch):
    """Makes `import datasets` fail even if it were installed."""
    monkeypatch.setitem(sys.modules, "datasets", None)


@pytest.fixture
def online(monkeypatch):
    """The connectivity probe says every host is reachable (the fake downloads below)."""
    monkeypatch.setattr(standard, "_unreachable", lambda url: None)


def test_wikitext_from_local_files(cache_env, no_datasets):
    directory = cache_env / "wikitext103"
    directory.mkdir()
    contents = {
        "train": b" = A = \n text \xe2\x80\x94 \n" * 50,
        "validation": b" = V = \n" * 20,
        "test": b" = T = \n" * 30,
    }
    for split, name in standard.WIKITEXT_FILES.items():
        (directory / name).write_bytes(contents[split])
    corpus = get_corpus("wikitext103")
    for s in SPLITS:
        assert _bytes(corpus, s) == contents[s]
    prov = corpus.provenance()
    ref = store.content_sha256(
        [(standard.WIKITEXT_FILES[s], directory / standard.WIKITEXT_FILES[s]) for s in SPLITS]
    )
    assert prov["sha256"] == ref
    assert prov["splits"]["test"] == {"num_bytes": len(contents["test"]), "num_files": 1}


def test_wikitext_in_unzipped_subfolder(tmp_path, no_datasets):
    sub = tmp_path / "wikitext103" / "wikitext-103-raw"
    sub.mkdir(parents=True)
    for name in standard.WIKITEXT_FILES.values():
        (sub / name).write_bytes(name.encode() * 10)
    corpus = standard.wikitext103(cache_dir=tmp_path, download=False)
    assert _bytes(corpus, "validation") == b"wiki.valid.raw" * 10


def test_enwik8_contiguous_split(cache_env, random_bytes, no_datasets):
    (cache_env / "enwik8").mkdir()
    data = random_bytes(20_000)
    (cache_env / "enwik8" / "enwik8").write_bytes(data)
    corpus = get_corpus("enwik8", download=False)
    assert _bytes(corpus, "train") == data[:18_000]
    assert _bytes(corpus, "validation") == data[18_000:19_000]
    assert _bytes(corpus, "test") == data[19_000:]
    assert corpus.provenance()["name"] == "enwik8"


def test_pg19_split_by_folder(cache_env, no_datasets):
    books = {}
    for split, count in (("train", 4), ("validation", 2), ("test", 3)):
        folder = cache_env / "pg19" / split
        folder.mkdir(parents=True)
        for i in range(count):
            text = f"{split} book {i} ".encode() * (i + 3)
            (folder / f"{100 + i}.txt").write_bytes(text)
            books.setdefault(split, []).append(text)
    (cache_env / "pg19" / "train" / "metadata.csv").write_bytes(b"ignored")
    corpus = get_corpus("pg19")
    for s in SPLITS:
        assert _bytes(corpus, s) == b"".join(b + b"\0" for b in books[s])
        assert corpus.split(s).num_files == len(books[s])
    assert corpus.provenance()["split_rule"].startswith("official split folders")


@pytest.mark.parametrize("name", ["wikitext103", "pg19", "enwik8"])
def test_missing_offline_error_says_what_and_where(tmp_path, name, no_datasets):
    with pytest.raises(FileNotFoundError) as info:
        get_corpus(name, cache_dir=tmp_path, download=False)
    msg = str(info.value)
    assert f"corpus {name!r} not found in {tmp_path / name}" in msg
    assert "download=False" in msg and "flaxformer-lite[corpora]" in msg
    expected = {"wikitext103": "wiki.train.raw", "pg19": "/validation/", "enwik8": "enwik8.zip"}
    assert expected[name] in msg
    with pytest.raises(FileNotFoundError, match="`datasets` is not installed") as info:
        get_corpus(name, cache_dir=tmp_path, download=True)
    # what a run config's user can do: no download=True (the CLI has no such flag)
    msg = str(info.value)
    assert "download=True" not in msg and "flaxformer-lite[corpora]" in msg
    assert "config.data.cache_dir" in msg and expected[name] in msg


class _FakeDatasets(types.ModuleType):
    """Stands in for the `datasets` package: records calls, serves rows from memory."""

    def __init__(self, tables=None, archive=None, fail=None):
        super().__init__("datasets")
        self.tables, self.archive, self.fail, self.calls = tables, archive, fail, []

    def load_dataset(self, *args):
        self.calls.append(args)
        if self.fail:
            raise self.fail
        return self.tables

    def DownloadManager(self):  # the real package's name
        fake = self

        class _Manager:
            def download_and_extract(self, url):
                fake.calls.append((url,))
                return str(fake.archive)

        return _Manager()


def test_wikitext_download_through_datasets(tmp_path, monkeypatch, online):
    rows = {s: [{"text": f" = {s} = \n"}, {"text": ""}, {"text": "line \u00e9\n"}] for s in SPLITS}
    fake = _FakeDatasets(tables=rows)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    corpus = standard.wikitext103(cache_dir=tmp_path)
    assert fake.calls == [standard.WIKITEXT_HF]
    assert _bytes(corpus, "test") == " = test = \nline \u00e9\n".encode()
    assert (tmp_path / "wikitext103" / "wiki.valid.raw").is_file()
    assert [p.name for p in (tmp_path / "wikitext103").iterdir() if p.name.startswith(".")] == []
    standard.wikitext103(cache_dir=tmp_path)  # second call reads the files, downloads nothing
    assert len(fake.calls) == 1


def test_pg19_download_through_datasets(tmp_path, monkeypatch, online):
    rows = {
        s: [
            {"url": f"http://www.gutenberg.org/ebooks/{i + 10}", "text": f"{s} {i} " * 5}
            for i in range(3)
        ]
        for s in SPLITS
    }
    monkeypatch.setitem(sys.modules, "datasets", _FakeDatasets(tables=rows))
    corpus = standard.pg19(cache_dir=tmp_path)
    assert sorted(p.name for p in (tmp_path / "pg19" / "test").iterdir()) == [
        "10.txt",
        "11.txt",
        "12.txt",
    ]
    assert _bytes(corpus, "validation") == b"".join(
        f"validation {i} ".encode() * 5 + b"\0" for i in range(3)
    )


def test_enwik8_download_is_verified(tmp_path, monkeypatch, random_bytes, online):
    archive = tmp_path / "extracted"
    archive.mkdir()
    (archive / "enwik8").write_bytes(random_bytes(1000))
    monkeypatch.setitem(sys.modules, "datasets", _FakeDatasets(archive=archive))
    with pytest.raises(FileNotFoundError, match="downloaded enwik8 has 1000 bytes, expected"):
        standard.enwik8(cache_dir=tmp_path / "c")
    assert not (tmp_path / "c" / "enwik8" / "enwik8").exists()
    monkeypatch.setattr(standard, "ENWIK8_NUM_BYTES", 1000)
    corpus = standard.enwik8(cache_dir=tmp_path / "c")
    assert corpus.split("test").num_tokens == 50


def test_failed_download_names_the_cause(tmp_path, monkeypatch, online):
    fake = _FakeDatasets(fail=ConnectionError("no route to host"))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(FileNotFoundError, match="download failed: ConnectionError: no route"):
        standard.wikitext103(cache_dir=tmp_path)


@pytest.mark.parametrize("name", ["wikitext103", "enwik8"])
def test_offline_fails_at_once_without_the_client(tmp_path, monkeypatch, name):
    """Offline, `datasets` is never called (its client retried for 30 s, logging each try
    twice): the probe's failure is the error."""
    for var in standard._PROXY_ENV + standard._HF_OFFLINE_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")  # .invalid never resolves
    monkeypatch.setattr(standard, "ENWIK8_URL", "http://enwik8.invalid/enwik8.zip")
    fake = _FakeDatasets(fail=AssertionError("called"))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    host = {"wikitext103": "hub.invalid:443", "enwik8": "enwik8.invalid:80"}[name]
    with pytest.raises(FileNotFoundError, match=f"cannot reach {host}") as info:
        get_corpus(name, cache_dir=tmp_path)
    assert fake.calls == []
    assert "run again with network access" in str(info.value)


def test_hub_logs_print_once(tmp_path, monkeypatch, online):
    """A record of the Hugging Face client (a retried request) is printed by its own handler
    only, not also by the root logger's handler that absl.app installs."""
    printed = {"hub": [], "root": []}

    class Keep(logging.Handler):
        def __init__(self, key):
            super().__init__()
            self.key = key

        def emit(self, record):
            printed[self.key].append(record.getMessage())

    hub, root = logging.getLogger("huggingface_hub"), logging.getLogger()
    own, absl_like = Keep("hub"), Keep("root")
    hub.addHandler(own)
    root.addHandler(absl_like)

    class Retrying(_FakeDatasets):
        def load_dataset(self, *args):
            logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s")
            raise ConnectionError("no route to host")

    monkeypatch.setitem(sys.modules, "datasets", Retrying())
    try:
        with pytest.raises(FileNotFoundError, match="download failed"):
            standard.wikitext103(cache_dir=tmp_path)
        assert hub.propagate  # restored
    finally:
        hub.removeHandler(own)
        root.removeHandler(absl_like)
    assert printed == {"hub": ["Retrying in 1s"], "root": []}


def test_unknown_corpus_lists_names():
    assert corpus_names() == ("enwik8", "path", "pg19", "stdlib", "wikitext103")
    with pytest.raises(ValueError, match=r"unknown corpus name 'wikitext'; valid names: \['enw"):
        get_corpus("wikitext")


def test_path_registry_entry(tmp_path, random_bytes):
    (tmp_path / "c.bin").write_bytes(random_bytes(1000))
    corpus = get_corpus("path", path=tmp_path / "c.bin", name="mine")
    assert corpus.provenance()["name"] == "mine"
    assert corpus.split("train").num_tokens == 900
