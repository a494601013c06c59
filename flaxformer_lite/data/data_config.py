"""What a run trains and evaluates on, as a frozen dataclass: a byte corpus or a synthetic task.

`DataConfig` is the ``config.data`` section of a run config; `open_dataset` opens what it
names (the corpus, with its train/validation/test splits, or the task). Standard library and
numpy only, like the rest of the data layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flaxformer_lite.base.checks import ConfigError, check_path, fail
from flaxformer_lite.data.corpus import ByteCorpus
from flaxformer_lite.data.registry import get_corpus, get_task
from flaxformer_lite.data.tasks import Task

SOURCES = ("corpus", "task")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: str = "corpus"  # "corpus" (byte-level LM) or "task" (synthetic task)
    corpus: str = "stdlib"  # corpus registry name (flaxformer_lite.data.corpus_names())
    path: str = ""  # file, folder or list of files when corpus="path"
    cache_dir: str = ""  # corpus cache directory ("" = the library default)
    task: str = ""  # task registry name when source == "task"
    train_length: int = 64  # L: tokens per training sequence (task: the task length parameter)
    batch_size: int = 32  # sequences per training step

    @property
    def is_task(self) -> bool:
        return self.source == "task"

    def validate(self) -> None:
        """Static checks (no file is opened); raises `ConfigError` naming ``config.data.*``."""
        if self.source not in SOURCES:
            fail("config.data.source", self.source, f"allowed: {list(SOURCES)}")
        if self.is_task and not self.task:
            fail(
                "config.data.task",
                self.task,
                "a task name is required when config.data.source='task'",
            )
        for name in ("train_length", "batch_size"):
            if not getattr(self, name) > 0:
                fail(f"config.data.{name}", getattr(self, name), "must be > 0")
        for name in ("path", "cache_dir"):
            check_path(f"config.data.{name}", getattr(self, name))

    def open_task(self) -> Task:
        """The synthetic task (``source="task"``); `ConfigError` for an unknown name."""
        try:
            return get_task(self.task)
        except ValueError as e:
            raise ConfigError(f"config.data.task={self.task!r}: {e}") from None


def open_dataset(cfg: DataConfig) -> ByteCorpus | Task:
    """The corpus or task ``cfg`` names; `ConfigError` (naming ``config.data``) when it
    cannot be opened (unknown name, missing files)."""
    if cfg.is_task:
        return cfg.open_task()
    if cfg.corpus == "path":
        kwargs: dict[str, Any] = {"path": cfg.path}
    else:
        kwargs = {"cache_dir": cfg.cache_dir} if cfg.cache_dir else {}
    try:
        return get_corpus(cfg.corpus, **kwargs)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"config.data: {e}") from None
    except OSError as e:  # reading a path given by the user (too long, unreadable, ...)
        name, value = ("path", cfg.path) if cfg.corpus == "path" else ("cache_dir", cfg.cache_dir)
        fail(f"config.data.{name}", value, f"cannot be read ({e.strerror or e})")
