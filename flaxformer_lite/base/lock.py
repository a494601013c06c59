"""One writer per workdir: an advisory lock (``fcntl.flock``) on ``WORKDIR/.lock``.

    with WorkdirLock(workdir):
        ...  # nothing else holding this lock writes into workdir meanwhile

The holder writes ``pid=<pid> host=<host> since=<UTC time>`` into the lock file; a second
process is refused at once with `WorkdirBusyError` (a `ConfigError`, so the scripts print one
line and exit 2) naming that pid. The kernel releases a ``flock`` when its process dies, however
it dies (SIGKILL, a crashed machine's reboot), so the lock of a dead process is simply taken
over: the file that remains is never trusted, only the lock on it. The lock file is never
written through a link: it is opened with ``O_NOFOLLOW | O_NOCTTY | O_CLOEXEC`` and must be a
regular file with one name (``fstat``), else `io.UnsafeFileError` (one line naming the path;
the link and its target are left as they are).

Limits: the lock is advisory (a process that does not ask for it is not stopped), and
``flock`` is only as good as the file system's support: local file systems and NFSv4 (where
Linux maps it onto byte-range locks) honour it across processes; on a file system without
locks (``ENOLCK``/``EOPNOTSUPP``) a `RuntimeWarning` says the run proceeds unlocked.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import socket
import time
import warnings
from pathlib import Path

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.base.io import UnsafeFileError, open_regular, write_error

LOCK_FILE = ".lock"
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


class WorkdirBusyError(ConfigError):
    """Another process holds the workdir's lock; the message names its pid."""


class WorkdirLock:
    """``flock(LOCK_EX | LOCK_NB)`` on ``workdir/.lock`` (created, with its directory, if
    missing), held from `acquire` (or ``with``) to `release`; not re-entrant."""

    def __init__(self, workdir: str | Path):
        self.workdir = Path(workdir)
        self.path = self.workdir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> WorkdirLock:
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            fd = open_regular(self.path, os.O_RDWR | os.O_CREAT)
        except UnsafeFileError:
            raise
        except OSError as e:
            raise write_error(e, self.path) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(fd)
            os.close(fd)
            raise WorkdirBusyError(
                f"workdir={str(self.workdir)!r}: in use by another process ({holder}, "
                f"holding {self.path}); wait for it to end or stop it, or use another workdir"
            ) from None
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                os.close(fd)
                raise
            warnings.warn(
                f"cannot lock {self.path} ({e.strerror}): this file system has no locks; "
                "proceeding unlocked (make sure one process at a time writes this workdir)",
                RuntimeWarning,
                stacklevel=2,
            )
        try:
            since = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            os.ftruncate(fd, 0)
            holder = f"pid={os.getpid()} host={socket.gethostname()} since={since}\n"
            os.pwrite(fd, holder.encode(), 0)
        except OSError as e:
            os.close(fd)
            raise write_error(e, self.path) from e
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no stale pid for a reader (the next holder rewrites it anyway)
        os.close(fd)  # closing the last descriptor releases the flock

    def _holder(self, fd: int) -> str:
        """``pid 123 on host h since t`` from the lock file open on ``fd`` (the holder writes
        it right after locking: a reader may come in between, so retry briefly)."""
        for _ in range(20):
            try:
                text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            except OSError:
                text = ""
            if text:
                fields = dict(f.partition("=")[::2] for f in text.split())
                if fields.get("pid"):
                    return (
                        f"pid {fields['pid']} on host {fields.get('host', '?')} "
                        f"since {fields.get('since', '?')}"
                    )
            time.sleep(0.05)
        return "pid unknown"

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
