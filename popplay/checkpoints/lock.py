"""One writer per run file: an advisory lock on a hidden file beside it.

The lock is taken *before* the run file is read (``--resume``) and held until the
last write, so no second process can read an older state and write it back over a
newer one. The lock file is removed on release, which is safe because every taker
checks, once it holds the lock, that the name still points to the file it locked
(a taker that opened the old file just before its removal sees that and tries again
on the new one, where it meets the new holder). Nothing here is pickled or shared
between processes but the file system's own locks.
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, Callable

from popplay.checkpoints.h5io import resolve_output, sibling_name

#: Run-file locks a process hands to the program it ``exec``s into: JSON {path: fd}.
INHERITED_ENV = "POPPLAY_INHERITED_LOCKS"
_HELD: dict[str, int] = {}  # resolved run-file path -> holders in this process
# Called between opening the lock file and locking it: tests widen that window here
# to drive the race with a concurrent release deterministically.
_BEFORE_LOCK: Callable[[], None] | None = None


class LockBusy(Exception):
    """Another process holds the run file's lock; the message is one line."""


def lock_path(path: Path) -> Path:
    target = resolve_output(Path(path))
    return target.with_name(sibling_name(target, ".lock"))


def held_here(path: Path) -> bool:
    """Whether this process holds the lock of the run file ``path``."""

    return _HELD.get(str(resolve_output(Path(path)).absolute()), 0) > 0


class RunLock:
    """Refuses a second writer of the same run file (an advisory lock beside it).

    A context manager; :meth:`acquire` and :meth:`release` for a lock held across a
    read and the writes that follow (release is idempotent).
    """

    def __init__(self, path: Any, error: type[Exception] = LockBusy) -> None:
        self.path = Path(path)
        self.lock_path = lock_path(self.path)
        self._key = str(resolve_output(self.path).absolute())
        self._error = error
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        for _ in range(100):
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            if _BEFORE_LOCK is not None:
                _BEFORE_LOCK()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise self._error(f"{self.path}: another popplay process is writing this run file") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # released and removed meanwhile: lock the file now under the name
        else:  # pragma: no cover - a lock file replaced 100 times in a row
            raise self._error(f"{self.path}: cannot lock the run file")
        try:  # the holder's pid, for people; optional (a full disk must not stop the save)
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError:
            pass
        self._fd = fd
        _HELD[self._key] = _HELD.get(self._key, 0) + 1
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.lock_path)  # still ours: removed while held, then unlocked
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None
        count = _HELD.get(self._key, 1) - 1
        if count > 0:
            _HELD[self._key] = count
        else:
            _HELD.pop(self._key, None)

    def keep_across_exec(self) -> None:
        """Let the program this process ``exec``s into hold the lock on: the lock file
        stays open through the exec, named in :data:`INHERITED_ENV` for
        :func:`adopt_inherited` there."""
        if self._fd is None:
            raise ValueError("keep_across_exec: the lock is not held")
        os.set_inheritable(self._fd, True)
        held = json.loads(os.environ.get(INHERITED_ENV) or "{}")
        held[str(self.path)] = self._fd
        os.environ[INHERITED_ENV] = json.dumps(held)

    def __enter__(self) -> "RunLock":
        return self if self._fd is not None else self.acquire()  # taken earlier: held through the block

    def __exit__(self, *exc: Any) -> None:
        self.release()


def adopt_inherited() -> list[RunLock]:
    """The locks the program before an ``exec`` handed over
    (:meth:`RunLock.keep_across_exec`), held by this process from now on; the variable
    naming them is cleared, so no child of this process believes it holds them."""
    try:
        held = json.loads(os.environ.pop(INHERITED_ENV, None) or "{}")
    except ValueError:
        return []
    locks = []
    for path, fd in held.items():
        try:
            os.fstat(int(fd))
        except (OSError, ValueError, TypeError):
            continue  # not open here: nothing to adopt
        lock = RunLock(path)
        lock._fd = int(fd)
        os.set_inheritable(lock._fd, False)
        _HELD[lock._key] = _HELD.get(lock._key, 0) + 1
        locks.append(lock)
    return locks
