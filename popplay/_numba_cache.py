"""Where numba keeps popplay's compiled kernels when the installed package is read-only.

numba writes a kernel's cache beside its source (``__pycache__``) or, failing that, under
the user's cache directory; when neither can be written (a package installed by root and
run by another user whose home is read-only, a container) it refuses to decorate a
``cache=True`` function at all, so popplay would not even import. We then point numba at a
private directory under the system's temp dir instead.
"""
from __future__ import annotations

import os
import stat
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _writable(directory: str) -> bool:
    """Whether files can be created in ``directory`` (created if missing), tried as numba
    tries it (``os.access`` says yes to root even on a read-only file system). Plain
    system calls, no ``tempfile``: this runs while ``import popplay`` runs, and start-up
    must stay short enough that Ctrl-C lands in the CLI's guard."""
    probe = os.path.join(directory, f".popplay-write-probe-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError:
        return False
    return True


def _user_cache_dir() -> str:
    """numba's user-wide cache location (its appdirs rule on Linux and macOS)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "numba")


def _temp_root() -> str:
    """The temp dir as ``tempfile.gettempdir`` finds it (TMPDIR, TEMP, TMP, then the usual
    places), without importing tempfile: it pulls in random, shutil and compression
    modules, a few milliseconds in which a Ctrl-C at start-up would find no guard yet."""
    candidates = [os.environ.get(name) for name in ("TMPDIR", "TEMP", "TMP")] + ["/tmp", "/var/tmp", "/usr/tmp"]
    for directory in candidates:
        if directory and os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK):
            return directory
    return os.getcwd()


def _private_temp_dir() -> str | None:
    """A directory only this user can write, under the temp dir; None if one cannot be had.

    Loading a numba cache runs code from it, so a directory planted by someone else (or a
    symlink) must never be used."""

    path = os.path.join(_temp_root(), f"popplay-numba-cache-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        return None
    return path


def choose_cache_dir(package_dir: str = _PACKAGE_DIR, user_cache_dir: str | None = None) -> str | None:
    """The directory numba should be told to use, or None when its own choice works."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    if _writable(os.path.join(package_dir, "__pycache__")):
        return None
    if _writable(user_cache_dir if user_cache_dir is not None else _user_cache_dir()):
        return None
    return _private_temp_dir()


def configure() -> None:
    """Set ``NUMBA_CACHE_DIR`` before numba is imported, if numba's own places are read-only."""
    chosen = choose_cache_dir()
    if chosen is None:
        return
    os.environ["NUMBA_CACHE_DIR"] = chosen

    config = getattr(sys.modules.get("numba"), "config", None)
    if config is not None:  # numba already imported: it read the environment at import
        config.CACHE_DIR = chosen
