"""Byte-level corpora, synthetic length-generalisation tasks and batching (numpy only).

May import: `flaxformer_lite.base`, numpy and the standard library (no jax or flax; the
optional `datasets` package only inside the function that downloads a standard corpus).
`data_config.DataConfig` is the ``config.data`` section of a run and `open_dataset` opens it.

Corpora: `get_corpus(name)` with `corpus_names()` = enwik8, path, pg19, stdlib (the default: the
running interpreter's standard library, no download), wikitext103. A `ByteCorpus` has
`.split("train" | "validation" | "test")` -> `Split` with `num_tokens`, `sample_batch`,
`eval_windows`, `eval_batches`; and `.provenance()`.

Tasks: `get_task(name)` with `task_names()`; each has `sample`, `exact_match`,
`sequence_length`, `train_lengths`, `eval_lengths`. See docs/data.md.
"""

from flaxformer_lite.data.corpus import (
    DEFAULT_FRACTIONS,
    VOCAB_SIZE,
    ByteCorpus,
    Split,
    split_for_name,
)
from flaxformer_lite.data.registry import (
    DEFAULT_CORPUS,
    corpus_names,
    get_corpus,
    get_task,
    task_names,
)
from flaxformer_lite.data.standard import corpus_dir, enwik8, pg19, wikitext103
from flaxformer_lite.data.stdlib import stdlib_corpus, stdlib_files
from flaxformer_lite.data.store import CACHE_ENV, SEPARATOR, SPLITS, cache_root
from flaxformer_lite.data.tasks import (
    AdditionTask,
    AssociativeRecallTask,
    CopyTask,
    DuplicateTask,
    ParityTask,
    PasskeyTask,
    ReverseTask,
    SortTask,
    Task,
)

__all__ = [
    "CACHE_ENV",
    "DEFAULT_CORPUS",
    "DEFAULT_FRACTIONS",
    "SEPARATOR",
    "SPLITS",
    "VOCAB_SIZE",
    "AdditionTask",
    "AssociativeRecallTask",
    "ByteCorpus",
    "CopyTask",
    "DuplicateTask",
    "ParityTask",
    "PasskeyTask",
    "ReverseTask",
    "SortTask",
    "Split",
    "Task",
    "cache_root",
    "corpus_dir",
    "corpus_names",
    "enwik8",
    "get_corpus",
    "get_task",
    "pg19",
    "split_for_name",
    "stdlib_corpus",
    "stdlib_files",
    "task_names",
    "wikitext103",
]
