"""Name registries: corpora (`get_corpus`, `corpus_names`) and tasks (`get_task`, `task_names`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from flaxformer_lite.data.corpus import ByteCorpus
from flaxformer_lite.data.standard import STANDARD_CORPORA
from flaxformer_lite.data.stdlib import stdlib_corpus
from flaxformer_lite.data.tasks import TASKS, Task

DEFAULT_CORPUS = "stdlib"


def _path_corpus(*, path: str | os.PathLike | Sequence[str | os.PathLike], **kwargs) -> ByteCorpus:
    """Registry entry "path": `ByteCorpus.from_path(path, **kwargs)`."""
    return ByteCorpus.from_path(path, **kwargs)


_CORPORA: dict[str, Callable[..., ByteCorpus]] = {
    "stdlib": stdlib_corpus,
    **STANDARD_CORPORA,
    "path": _path_corpus,
}


def corpus_names() -> tuple[str, ...]:
    """Names accepted by `get_corpus`, sorted."""
    return tuple(sorted(_CORPORA))


def get_corpus(name: str = DEFAULT_CORPUS, /, **kwargs) -> ByteCorpus:
    """The corpus registered as `name`; `kwargs` go to its constructor.

    "stdlib" -> `stdlib_corpus(cache_dir=..., rebuild=...)`; "wikitext103", "pg19", "enwik8" ->
    `standard.<name>(cache_dir=..., download=...)`; "path" -> `ByteCorpus.from_path(path, ...)`.
    """
    if name not in _CORPORA:
        raise ValueError(f"unknown corpus name {name!r}; valid names: {list(corpus_names())}")
    return _CORPORA[name](**kwargs)


def task_names() -> tuple[str, ...]:
    """Names accepted by `get_task`, sorted."""
    return tuple(sorted(TASKS))


def get_task(name: str, /, **kwargs) -> Task:
    """The task registered as `name`, built with keyword hyper-parameters `kwargs`."""
    if name not in TASKS:
        raise ValueError(f"unknown task name {name!r}; valid names: {list(task_names())}")
    return TASKS[name](**kwargs)
