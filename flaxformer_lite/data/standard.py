"""Standard corpora by name: WikiText-103 (raw), PG-19 and enwik8, read as byte corpora.

Each corpus lives in `<cache root>/<name>/` (cache root: the `cache_dir` argument, else
`$FLAXFORMER_LITE_CACHE`, else `~/.cache/flaxformer_lite`) in the layout its original
distribution unpacks to, so a copy downloaded by hand works as well as one fetched here:

* `wikitext103`: `wiki.train.raw`, `wiki.valid.raw`, `wiki.test.raw` (one file per split);
* `pg19`: `train/*.txt`, `validation/*.txt`, `test/*.txt` (split by folder, one book per file);
* `enwik8`: `enwik8`, 100,000,000 bytes (contiguous 90M / 5M / 5M byte split).

When the files are missing and `download=True` (the default, and what every run config uses),
they are fetched once with the optional `datasets` package
(`pip install 'flaxformer-lite[corpora]'`), imported only here, and written into that layout
atomically (temporary name, then rename). Before a download, one TCP connection to the
source's host (`_unreachable`, a few seconds at most) tells whether the machine is online:
offline, the call fails at once instead of after 30 s of the Hugging Face client's retries; during
a download, that client's log records print once, not also through absl (`_hub_logs_once`).
Without `datasets`, without network or with `download=False`, a FileNotFoundError says what to
install or download and where to put it. Nothing in the test suite downloads: tests create
small files in these layouts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import tempfile
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from flaxformer_lite.data import store
from flaxformer_lite.data.corpus import ByteCorpus

WIKITEXT_FILES = {
    "train": "wiki.train.raw",
    "validation": "wiki.valid.raw",
    "test": "wiki.test.raw",
}
WIKITEXT_HF = ("Salesforce/wikitext", "wikitext-103-raw-v1")
PG19_HF = "emozilla/pg19"
ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
ENWIK8_NUM_BYTES = 100_000_000
EXTRA_HINT = "pip install 'flaxformer-lite[corpora]'"
HF_ENDPOINT = "https://huggingface.co"  # the hub, unless $HF_ENDPOINT names another
PROBE_SECONDS = 5.0  # the connectivity probe's timeout
_PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_HF_OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")

_MANUAL = {
    "wikitext103": (
        "unzip wikitext-103-raw-v1.zip (Merity et al. 2016; also on the Hugging Face hub as "
        f"{WIKITEXT_HF[0]}, config {WIKITEXT_HF[1]}) so that wiki.train.raw, wiki.valid.raw and "
        "wiki.test.raw lie directly in {dir}"
    ),
    "pg19": (
        "copy the PG-19 books (Rae et al. 2020; gs://deepmind-gutenberg, or the Hugging Face "
        f"dataset {PG19_HF}) as one .txt file per book into {{dir}}/train/, {{dir}}/validation/ "
        "and {dir}/test/"
    ),
    "enwik8": (
        f"download {ENWIK8_URL} (Hutter Prize; unzips to one file of {ENWIK8_NUM_BYTES} bytes) "
        "and put the unzipped file enwik8 at {dir}/enwik8"
    ),
}


def corpus_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the standard corpus `name` is read from: `<cache root>/<name>`."""
    return store.cache_root(cache_dir) / name


def _missing(
    name: str, directory: Path, reason: str, fetch: str = "run again online"
) -> FileNotFoundError:
    """The error for a corpus that is not in ``directory``: why (``reason``), how to have it
    fetched (``fetch``) and how to put a copy there by hand."""
    return FileNotFoundError(
        f"corpus {name!r} not found in {directory} ({reason}). To have it downloaded once into "
        f"that folder: {fetch}. Or put a copy there by hand: "
        + _MANUAL[name].format(dir=directory)
        + f". The cache root ({directory.parent}) is the cache_dir argument (in a run config: "
        f"config.data.cache_dir), else ${store.CACHE_ENV}, else ~/.cache/flaxformer_lite."
    )


def _source_url(name: str) -> str:
    """Where `name` is downloaded from (the hub's endpoint for the Hugging Face datasets)."""
    if name == "enwik8":
        return ENWIK8_URL
    return os.environ.get("HF_ENDPOINT") or HF_ENDPOINT


def _unreachable(url: str, timeout: float = PROBE_SECONDS) -> str | None:
    """None if a TCP connection to ``url``'s host opens within ``timeout`` seconds, else why
    not. Also None (not probed) behind a proxy ($HTTPS_PROXY, ...: only the download itself can
    tell) and in the Hugging Face offline mode ($HF_HUB_OFFLINE: `datasets` reads its own cache)."""
    if any(os.environ.get(v) for v in _PROXY_ENV + _HF_OFFLINE_ENV):
        return None
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as err:
        return f"offline? cannot reach {parts.hostname}:{port}: {err}"
    return None


@contextlib.contextmanager
def _hub_logs_once() -> Iterator[None]:
    """While downloading: records of `huggingface_hub` and `datasets` (a retried request, ...)
    print once. Both libraries give their logger a stderr handler of its own and let records
    propagate to the root logger too, where `absl.app` installs its handler: every record
    would print twice. Loggers with their own handler stop propagating until the download
    ends."""
    changed = []
    for logger in map(logging.getLogger, ("huggingface_hub", "datasets")):
        if logger.handlers and logger.propagate:
            logger.propagate = False
            changed.append(logger)
    try:
        yield
    finally:
        for logger in changed:
            logger.propagate = True


def _fetch(name: str, directory: Path, download: bool, fetcher: Callable) -> None:
    """Runs `fetcher(datasets_module, directory)`, turning every failure into `_missing`."""
    if not download:
        fetch = f"call again with download=True, online, with `datasets` installed ({EXTRA_HINT})"
        raise _missing(name, directory, "download=False", fetch)
    try:
        import datasets  # optional extra; imported only when a download is needed
    except ImportError:
        reason = "the optional package `datasets` is not installed"
        fetch = f"install it ({EXTRA_HINT}) and run again online"
        raise _missing(name, directory, reason, fetch) from None
    offline = _unreachable(_source_url(name))
    if offline is not None:  # fail now, not after the client's retries
        raise _missing(name, directory, offline, "run again with network access")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _hub_logs_once():
            fetcher(datasets, directory)
    except Exception as err:
        raise _missing(name, directory, f"download failed: {type(err).__name__}: {err}") from err


T = TypeVar("T")


def _find_or_fetch(
    name: str, directory: Path, download: bool, find: Callable[[Path], T | None], fetcher: Callable
) -> T:
    """What ``find(directory)`` finds there; when it finds nothing (None), `_fetch` with
    ``fetcher`` and look once more, so a download that leaves no files is a `_missing` error."""
    found = find(directory)
    if found is None:
        _fetch(name, directory, download, fetcher)
        found = find(directory)
        if found is None:
            raise _missing(name, directory, "download left no files")
    return found


def _write_atomic(path: Path, chunks: Iterable[bytes]) -> int:
    """Writes `chunks` to `path` through a temporary file and a rename; returns the byte count."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    n = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                n += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return n


# ----------------------------------------------------------------------------------- WikiText-103


def _wikitext_files(directory: Path) -> dict[str, Path] | None:
    for d in (directory, directory / "wikitext-103-raw"):
        files = {s: d / f for s, f in WIKITEXT_FILES.items()}
        if all(p.is_file() for p in files.values()):
            return files
    return None


def _fetch_wikitext(datasets, directory: Path) -> None:
    ds = datasets.load_dataset(*WIKITEXT_HF)
    for split, fname in WIKITEXT_FILES.items():
        # The hub copy holds one row per line of the original file; rows are concatenated as given.
        _write_atomic(directory / fname, (row["text"].encode("utf-8") for row in ds[split]))


def wikitext103(*, cache_dir: str | os.PathLike | None = None, download: bool = True) -> ByteCorpus:
    """WikiText-103 raw (Merity et al. 2016) as bytes: the ALiBi paper's benchmark corpus.

    The three files are memory-mapped as they are (splits: the official train/valid/test).
    """
    directory = corpus_dir("wikitext103", cache_dir)
    files = _find_or_fetch("wikitext103", directory, download, _wikitext_files, _fetch_wikitext)
    return ByteCorpus.from_split_files(files, name="wikitext103")


# ------------------------------------------------------------------------------------------ PG-19


def _pg19_documents(directory: Path) -> list[store.Document] | None:
    documents = []
    for split in store.SPLITS:
        folder = directory / split
        if not folder.is_dir():
            return None
        names = sorted(p.name for p in folder.iterdir() if p.suffix == ".txt" and p.is_file())
        if not names:
            return None
        documents += [store.Document(f"{split}/{n}", folder / n, split) for n in names]
    return documents


def _book_id(row: dict, index: int) -> str:
    match = re.search(r"(\d+)/?$", str(row.get("url", "")))
    return match.group(1) if match else f"{index:06d}"


def _fetch_pg19(datasets, directory: Path) -> None:
    ds = datasets.load_dataset(PG19_HF)
    for split in store.SPLITS:
        if (directory / split).is_dir():
            shutil.rmtree(directory / split)
        tmp = Path(tempfile.mkdtemp(prefix=f".{split}.tmp-", dir=directory))
        try:
            for i, row in enumerate(ds[split]):
                (tmp / f"{_book_id(row, i)}.txt").write_bytes(row["text"].encode("utf-8"))
            os.rename(tmp, directory / split)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def pg19(
    *,
    cache_dir: str | os.PathLike | None = None,
    download: bool = True,
    rebuild: bool = False,
) -> ByteCorpus:
    """PG-19 (Rae et al. 2020): 28,602 / 50 / 100 Project Gutenberg books before 1919 as bytes.

    Splits are the official folders. Each split's books (sorted by file name, each followed by
    the 0x00 separator) are concatenated once into `<cache root>/pg19-<key>/` and memory-mapped.
    """
    directory = corpus_dir("pg19", cache_dir)
    documents = _find_or_fetch("pg19", directory, download, _pg19_documents, _fetch_pg19)
    return ByteCorpus.from_documents(
        documents,
        name="pg19",
        fractions=None,
        cache_dir=cache_dir,
        rebuild=rebuild,
        prefix="pg19",
        split_rule="official split folders train/, validation/, test/",
        info={"source": str(directory)},
    )


# ----------------------------------------------------------------------------------------- enwik8


def _fetch_enwik8(datasets, directory: Path) -> None:
    extracted = Path(datasets.DownloadManager().download_and_extract(ENWIK8_URL))
    source = extracted / "enwik8" if extracted.is_dir() else extracted
    size = source.stat().st_size
    if size != ENWIK8_NUM_BYTES:
        raise ValueError(f"downloaded enwik8 has {size} bytes, expected {ENWIK8_NUM_BYTES}")
    with open(source, "rb") as f:
        _write_atomic(directory / "enwik8", iter(lambda: f.read(1 << 20), b""))


def enwik8(*, cache_dir: str | os.PathLike | None = None, download: bool = True) -> ByteCorpus:
    """enwik8 (the first 10^8 bytes of an English Wikipedia XML dump, Hutter Prize) as bytes.

    Split by contiguous bytes 90 % / 5 % / 5 %: for the 10^8-byte file, the standard first 90M
    bytes for train, next 5M for validation, last 5M for test (Al-Rfou et al. 2019; Dai et al.
    2019). The file is memory-mapped in place.
    """
    directory = corpus_dir("enwik8", cache_dir)
    path = directory / "enwik8"
    if not path.is_file():
        _fetch("enwik8", directory, download, _fetch_enwik8)
    return ByteCorpus.from_path(path, name="enwik8")


STANDARD_CORPORA = {"wikitext103": wikitext103, "pg19": pg19, "enwik8": enwik8}
