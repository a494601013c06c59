"""The embedded default corpus: the running interpreter's standard-library `.py` sources.

Every Python installation carries several MB of real, human-written code and prose (docstrings,
comments) with long-range structure: indentation levels, matching brackets, names defined in one
place and reused hundreds of lines later. It needs no download, and its sha256 and the Python
version in `provenance()` say exactly which corpus a result came from.

Files: every `*.py` below `sysconfig.get_paths()["stdlib"]` (or `$FLAXFORMER_LITE_STDLIB`), sorted
by relative POSIX path, except
* anything inside a directory named one of `EXCLUDED_DIRS` (test suites such as `test/`,
  `tests/`, `idlelib/idle_test/`, `lib2to3/tests/`, `unittest/test/`; third-party packages in
  `site-packages/`; `__pycache__/`, `lib-dynload/`, the frozen test package `__phello__/`) or a
  directory whose name starts with `config-` (build configuration) or `.`;
* generated files: `_sysconfigdata_*.py`, and files whose first 5 lines match
  `GENERATED_MARKER` (e.g. the charmap codecs in `encodings/` made by gencodec.py,
  `pydoc_data/topics.py` made by Sphinx, `token.py`, `keyword.py`, `stringprep.py`).
Split: by file, `corpus.split_for_name` with fractions (0.9, 0.05, 0.05). Storage: one file per
split under `<cache root>/stdlib-<python version>-<key>/`, each document followed by a 0x00 byte
(see `store`).
"""

from __future__ import annotations

import os
import platform
import re
import sys
import sysconfig
from pathlib import Path

from flaxformer_lite.data import store
from flaxformer_lite.data.corpus import DEFAULT_FRACTIONS, ByteCorpus, split_for_name

EXCLUDED_DIRS = frozenset(
    {
        "test",
        "tests",
        "idle_test",
        "site-packages",
        "dist-packages",
        "__pycache__",
        "lib-dynload",
        "__phello__",
    }
)
GENERATED_MARKER = re.compile(
    rb"(?i)(auto-?generated|automatically generated|do not edit|gencodec\.py|"
    rb"this file is generated|mapping codec\b.{0,40}\bgenerated)"
)
_HEAD_LINES = 5
# the standard library to read instead of the running interpreter's (`default_stdlib_dir`)
STDLIB_ENV = "FLAXFORMER_LITE_STDLIB"


def _excluded_dir(name: str) -> bool:
    return name in EXCLUDED_DIRS or name.startswith(("config-", "."))


def _is_generated(path: Path) -> bool:
    if path.name.startswith("_sysconfigdata_"):
        return True
    with open(path, "rb") as f:
        head = b"".join(f.readline() for _ in range(_HEAD_LINES))
    return GENERATED_MARKER.search(head) is not None


def default_stdlib_dir() -> Path:
    """`$FLAXFORMER_LITE_STDLIB` if set, else the running interpreter's standard-library directory.

    The variable lets a machine with another Python rebuild a study's corpus from a copy of the
    library it was made from (the corpus sha256 in the rows says whether it is the same text)."""
    override = os.environ.get(STDLIB_ENV)
    if not override:
        return Path(sysconfig.get_paths()["stdlib"])
    if not Path(override).is_dir():
        raise FileNotFoundError(
            f"${STDLIB_ENV}={override!r}: no such directory; it names a copy of a Python "
            "standard library (e.g. .../lib/python3.11), or is unset for this interpreter's"
        )
    return Path(override)


def stdlib_files(root: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """`(relative POSIX name, path)` of the corpus files under `root` (default:
    `default_stdlib_dir()`), sorted by name, after the exclusions of the module docstring."""
    root = Path(root) if root is not None else default_stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"stdlib_dir: no such directory: {root}")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not _excluded_dir(d)]
        for f in filenames:
            path = Path(dirpath) / f
            if f.endswith(".py") and path.is_file() and not _is_generated(path):
                found.append((path.relative_to(root).as_posix(), path))
    found.sort()
    return found


def stdlib_corpus(
    *,
    cache_dir: str | os.PathLike | None = None,
    stdlib_dir: str | os.PathLike | None = None,
    rebuild: bool = False,
) -> ByteCorpus:
    """The default byte corpus (registry name "stdlib"), built and cached on first use.

    Args:
      cache_dir: cache root (default `$FLAXFORMER_LITE_CACHE`, else `~/.cache/flaxformer_lite`);
        the corpus lives in `<root>/stdlib-<python version>-<key>/`.
      stdlib_dir: read the sources from this directory instead of `default_stdlib_dir()`
        (`python_version` in the provenance stays the running interpreter's; `stdlib_dir` and
        `sha256` say which text it is).
      rebuild: rebuild the cache even if it looks complete.
    """
    root = Path(stdlib_dir) if stdlib_dir is not None else default_stdlib_dir()
    files = stdlib_files(root)
    documents = [store.Document(n, p, split_for_name(n, DEFAULT_FRACTIONS)) for n, p in files]
    version = platform.python_version()
    return ByteCorpus.from_documents(
        documents,
        name="stdlib",
        fractions=DEFAULT_FRACTIONS,
        cache_dir=cache_dir,
        rebuild=rebuild,
        prefix=f"stdlib-{version}",
        info={
            "python_version": version,
            "python_implementation": platform.python_implementation(),
            "python_version_full": sys.version,
            "stdlib_dir": str(root),
            "file_rule": "*.py under stdlib_dir, sorted; tests, site-packages and generated "
            "files excluded (flaxformer_lite.data.stdlib)",
        },
    )
