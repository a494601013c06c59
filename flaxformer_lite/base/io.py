"""Files that are never torn: atomic replacement of whole files, tolerant JSON-lines reading,
and `StateWriteError`, the one error for "the run's state could not be written".

A run's state (configs, metrics, checkpoints, rows, results) is written by code that knows the
file; an OS error there (disk full, quota, file-size limit, read-only or failing disk) becomes a
`StateWriteError` naming that file, e.g. ``cannot write runs/rope-seed0/rows.jsonl: [Errno 28]
No space left on device``. The study runner stops on it (the next cell would fail the same
way) and the scripts print it as one line with `StateWriteError.hint`.

Nothing is written through a link: a file written in place (`open_regular`: the workdir lock,
`append_text`: ``metrics.jsonl``) is opened with ``O_NOFOLLOW | O_NOCTTY`` and must be a
regular file with one link (``fstat``), else `UnsafeFileError`; `atomic_write_text` creates
its temporary file anew (``O_EXCL | O_NOFOLLOW``) and ``os.replace`` replaces a link at the
destination, never its target.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from flaxformer_lite.base import faults, interrupt
from flaxformer_lite.base.checks import ConfigError

# OS errors that say the machine cannot hold more state, not that one run went wrong.
ENVIRONMENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM}
)
_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
_TENSORSTORE_ERRNO = re.compile(r"os_error_code='?(\d+)")
_TENSORSTORE_FILE = re.compile(r'(?:Failed writing|local file|Error writing file): "([^"]+)"')


class StateWriteError(OSError):
    """Writing a run's state failed: ``str()`` names the file and the OS's reason; ``file``,
    when the state is a directory (a checkpoint step), is the file inside it whose write
    failed, e.g. ``cannot write runs/rope-seed0/checkpoints/4: [Errno 28] No space left on
    device (writing runs/rope-seed0/checkpoints/4.orbax-checkpoint-tmp/.../d/3f2a...)``."""

    def __init__(self, code: int | None, reason: str, path: str | Path, file: str | None = None):
        super().__init__(code, reason, str(path))
        self.file = file

    def __str__(self) -> str:
        code = f"[Errno {self.errno}] " if self.errno is not None else ""
        inside = f" (writing {self.file})" if self.file else ""
        return f"cannot write {self.filename}: {code}{self.strerror}{inside}"

    @property
    def hint(self) -> str:
        """What to do: free space, make the directory writable, or fix the cause; then rerun."""
        if self.errno in _SPACE:
            return "free space and rerun the same command to resume"
        if self.errno in _WRITABLE:
            return "make it writable and rerun the same command to resume"
        return "fix the cause and rerun the same command to resume"


class UnsafeFileError(StateWriteError, ConfigError):
    """A file the run would write in place is a symbolic link, a hard link or not a regular
    file: refused, never written through. Both a `StateWriteError` (a study stops at once) and
    a `ConfigError` (the scripts print one line and exit 2)."""

    def __init__(self, path: str | Path, what: str):
        super().__init__(errno.ELOOP, what, path)

    def __str__(self) -> str:
        return f"refusing to write {self.filename}: {self.strerror}; {self.hint}"

    @property
    def hint(self) -> str:
        return "remove it (only a regular file, or nothing, may stand there) and rerun"


_NO_FOLLOW = os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK


def open_regular(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC)`` of a regular file with
    one link (checked with ``fstat`` on the descriptor): a symbolic link, a hard link, a
    directory, a FIFO or a device at ``path`` raises `UnsafeFileError` naming it; another OS
    error is raised as is (callers wrap it with `write_error`)."""
    path = Path(path)
    try:
        fd = os.open(path, flags | _NO_FOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(path):
            raise UnsafeFileError(path, _link_what(path)) from None
        if e.errno == errno.EISDIR:
            raise UnsafeFileError(path, "not a regular file (a directory)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(path, f"not a regular file ({_kind(st.st_mode)})")
        if st.st_nlink != 1:
            raise UnsafeFileError(
                path,
                f"a hard link ({st.st_nlink} names share it); a file written in place "
                "must have one name",
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _link_what(path: Path) -> str:
    try:
        target = f" to {os.readlink(path)!r}"
    except OSError:
        target = ""
    return f"a symbolic link{target}; nothing is written through a link"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` to ``path`` (created if missing) through `open_regular`: never through
    a link; an OS error is raised as `StateWriteError` naming ``path``."""
    try:
        fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError as e:  # an `UnsafeFileError` is raised as it is
        raise write_error(e, path) from e
    try:
        data = text.encode()
        while data:
            data = data[os.write(fd, data) :]
    except OSError as e:
        raise write_error(e, path) from e
    finally:
        os.close(fd)


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def write_error(error: BaseException, path: str | Path) -> StateWriteError:
    """``error`` (raised while writing ``path``) as a `StateWriteError` naming ``path``:
    the first OS error in its chain, or an errno in a TensorStore/orbax message; and, when
    the error names a file inside ``path`` (a directory: a checkpoint step, or its orbax
    temporary directory ``path.orbax-checkpoint-tmp*``), that file."""
    for e in _chain(error):
        if isinstance(e, StateWriteError):
            return e
        if isinstance(e, OSError) and (e.errno is not None or e.strerror):
            file = _inside(path, e.filename) or _inside(path, *_TENSORSTORE_FILE.findall(str(e)))
            return StateWriteError(e.errno, e.strerror or str(e), path, file)
    text = str(error)
    match = _TENSORSTORE_ERRNO.search(text)
    file = _inside(path, *_TENSORSTORE_FILE.findall(text))
    if match:
        code = int(match.group(1))
        return StateWriteError(code, os.strerror(code), path, file)
    return StateWriteError(None, f"{type(error).__name__}: {error}", path, file)


def _inside(path: str | Path, *files: object) -> str | None:
    """The last of ``files`` (the innermost a message names) that lies inside the directory
    ``path`` or its orbax temporary directory; None if none does."""
    root = str(path).rstrip("/")
    for file in reversed(files):
        file = os.fsdecode(file) if isinstance(file, str | bytes) else None
        if file and file.rstrip("/") != root and file.startswith(root):
            rest = file[len(root) :]
            if rest.startswith("/") or rest.startswith(".orbax-checkpoint-tmp"):
                return file
    return None


def environment_error(error: BaseException) -> StateWriteError | None:
    """The `StateWriteError` in ``error``'s chain, or one built from an OS error in it whose
    errno is in `ENVIRONMENT_ERRNOS`; None if ``error`` is not about the machine's storage."""
    for e in _chain(error):
        if isinstance(e, StateWriteError):
            return e
        if isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS:
            return StateWriteError(e.errno, e.strerror, e.filename or "a file")
    return None


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace`` (never torn).

    The temporary file is created beside ``path``, exclusively and never through a link, and
    synced before the rename. On any failure it is removed and ``path`` is untouched; an OS
    error is raised as `StateWriteError` naming ``path``. A SIGINT/SIGTERM arriving meanwhile
    is held until the file is in place (`interrupt.deferred`).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with interrupt.deferred():
        try:
            tmp.unlink(missing_ok=True)  # a stale temporary file (or a link planted there)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with open(os.open(tmp, flags, 0o644), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            faults.hit(f"write:{path.name}")  # test-only fault point (flaxformer_lite.base.faults)
            os.replace(tmp, path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if isinstance(e, OSError):
                raise write_error(e, path) from e
            raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; a torn or corrupted line is skipped (callers may report)."""
    rows = []
    path = Path(path)
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
