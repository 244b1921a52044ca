"""What every popplay file writer and reader shares: safe atomic replacement, HDF5
attribute encoding, and the checks that let a reader refuse a file it cannot trust.

Run files (:mod:`popplay.checkpoints.runfile`), figure data files
(:mod:`popplay.reproduce.data`), plots (:mod:`popplay.plotting`) and lineage exports
all go through :func:`atomic_output`, so a crash, Ctrl-C or a full disk at any moment
leaves the old file or the new one under the name, never half of one, and nothing
that is not a regular file of the expected kind is ever replaced.
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from popplay.core.limits import format_bytes

# What a file of each kind (see :func:`file_kind`) is called in a refusal, article included.
KIND_NAMES = {"run": "a popplay run file", "figure": "a popplay figure file", "png": "a PNG image",
              "text": "a text file", "hdf5": "an HDF5 file", "binary": "a binary file"}
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# A temp file of ours older than this, left by a killed writer, is removed by the next
# successful write of the same file (writers of run files hold its lock: no age needed).
STALE_SECONDS = 3600.0


class OutputError(OSError):
    """An output that must not be (or could not be) replaced; the message is one line."""


class NoSpace(OSError):
    """The disk filled up during a write; the previous file (if any) is untouched."""

    def __init__(self, path: Path) -> None:
        super().__init__(errno.ENOSPC, "no space left on device", str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        return f"no space left on device: {self.path} was not written"


def resolve_output(path: Path) -> Path:
    """The file a write to ``path`` replaces: a symlink is followed (to its final
    target, which is written beside itself) instead of being replaced by a file."""
    path = Path(path)
    if path.is_symlink():
        return Path(os.path.realpath(path))
    return path


def name_max(directory: Path) -> int:
    """The longest file name (bytes) the file system of ``directory`` takes (255 when
    it does not say)."""
    try:
        return int(os.pathconf(directory, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


def sibling_name(path: Path, suffix: str, reserve: int = 0) -> str:
    """A hidden name beside ``path`` for its lock or temp files: ``.NAME<suffix>``, or,
    when that would pass the file system's name limit (a legal 245-character run name),
    a shortened name plus a hash of the full one, so that the two stay distinct."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    limit = name_max(directory) - reserve
    name = f".{path.name}{suffix}"
    if len(name.encode()) <= limit:
        return name
    digest = hashlib.sha256(path.name.encode()).hexdigest()[:12]
    keep = path.name.encode()[: max(1, limit - len(suffix.encode()) - 15)].decode("utf-8", "ignore")
    return f".{keep}~{digest}{suffix}"


_TEMP_RANDOM = 8  # characters mkstemp adds


def _temp_prefix(path: Path) -> str:
    return sibling_name(path, ".", reserve=_TEMP_RANDOM + len(".tmp"))


def file_kind(path: Path) -> str:
    """``run``, ``figure``, ``hdf5`` (any other HDF5 file), ``png``, ``text`` or
    ``binary``, from the first bytes (and an HDF5 file's root ``format`` attribute)."""
    with open(path, "rb") as handle:
        head = handle.read(8192)
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    import h5py  # defers h5py

    try:
        hdf5 = h5py.is_hdf5(str(path))
    except Exception:
        hdf5 = False
    if hdf5:
        try:
            with h5py.File(path, "r") as f:
                value = decode_attr(f.attrs.get("format"))
        except Exception:
            return "hdf5"
        return {"popplay-run": "run", "popplay-figure": "figure"}.get(value, "hdf5")
    if b"\0" in head:
        return "binary"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # not merely a character cut at the 8 KiB mark
            return "binary"
    return "text"


def check_replaceable(path: Path, error: type[Exception], *, kind: str | None, overwrite: bool = False,
                      option: str = "--out") -> Path:
    """Refuse (``error``, one line) to write ``path`` unless it is absent, or a regular
    writable file that is of ``kind`` or that ``overwrite`` allows to replace; return
    the file actually written (symlinks resolved). Devices, FIFOs, sockets and
    directories are never replaced, whatever the options."""
    target = resolve_output(path)
    shown = f"{option} {path}" if option else str(path)
    try:
        info = os.stat(target)
    except FileNotFoundError:
        if Path(path).is_symlink():
            raise error(f"{shown}: a symbolic link to a missing file; refused") from None
        return target
    except NotADirectoryError:
        blocking = next((p for p in reversed(target.parents) if p.exists() and not p.is_dir()), target.parent)
        raise error(f"{shown}: {blocking} is not a directory") from None
    except OSError as problem:
        raise error(f"{shown}: cannot check the existing file ({problem.strerror})") from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{shown}: is a directory")
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{shown}: not a regular file (a device, FIFO or socket); refused")
    if not info.st_mode & stat.S_IWUSR:
        raise error(f"{shown}: the file is read-only; refused")
    if info.st_nlink > 1:
        raise error(f"{shown}: the file has {info.st_nlink} hard links, which replacing it would break; "
                    "refused (write to another name)")
    if overwrite:
        return target
    try:
        found = file_kind(target)
    except OSError as problem:
        raise error(f"{shown}: cannot read the existing file ({problem.strerror})") from None
    if kind is None or found != kind:
        what = KIND_NAMES[found]
        advice = " (pass --overwrite to replace it)" if kind == "run" else ""
        expected = f"; only {KIND_NAMES[kind]} is replaced" if kind in KIND_NAMES else ""
        raise error(f"{shown}: exists and is {what}{expected}; refused{advice}")
    return target


def check_new_output(path: Path, error: type[Exception], *, kind: str, overwrite: bool,
                     option: str = "--out") -> Path:
    """:func:`check_replaceable` for a file a command writes on request (an export, a
    lineage): an existing file is refused unless ``overwrite``, as ``train`` refuses an
    existing run file, because a file of the same kind (a CSV, a torch file) may be the
    user's own; with ``overwrite`` still only one of ``kind``, never a run file."""
    if not overwrite and os.path.lexists(path):
        check_replaceable(path, error, kind=kind, option=option)  # its more specific refusals first
        raise error(f"{option} {path}: exists; refused (pass --overwrite to replace it)")
    return check_replaceable(path, error, kind=kind, option=option)


def make_parent(path: Path, error: type[Exception], *, option: str = "--out") -> None:
    """Create the missing directories above an output a command writes on request (an
    export, a lineage, a plot), as ``reproduce`` creates its folder. Called once the
    checks on the output itself have passed, so that a refused output leaves none behind.
    ``train`` refuses a missing directory instead: there a mistyped path would hide the
    run file from the ``--resume`` that looks for it."""
    directory = Path(path).parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as problem:
        raise error(f"{option} {path}: cannot create {problem.filename or directory} "
                    f"({problem.strerror or problem})") from None


@contextmanager
def atomic_output(path: Path, *, stale_seconds: float = STALE_SECONDS) -> Iterator[str]:
    """Yield a temporary file name beside ``path`` (beside a symlink's target); on a
    clean exit the file is fsynced and renamed over it (and the directory fsynced),
    otherwise removed. The replaced file's permission bits are kept; a new file gets
    the mode a plain ``open()`` would give (mkstemp makes it 0600). Anything but a
    regular file at the name raises :class:`OutputError` before anything is written;
    a full disk raises :class:`NoSpace` with the previous file untouched. After a
    success, temp files of the same name older than ``stale_seconds`` (left by killed
    writers) are removed.
    """
    target = resolve_output(Path(path))
    directory = target.parent if str(target.parent) else Path(".")
    mode = _existing_mode(target)
    owner = _existing_owner(target)
    fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        if mode is None:
            umask = os.umask(0o022)
            os.umask(umask)
            mode = 0o666 & ~umask
        yield tmp_name
        if owner is not None:  # root rewriting someone's run file leaves it theirs
            os.chown(tmp_name, *owner)
        os.chmod(tmp_name, mode)  # after writing: the kept mode may be read-only
        fd = os.open(tmp_name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if _existing_mode(target) is None and target.exists():  # became a non-file meanwhile
            raise OutputError(f"{target}: not a regular file; refused")
        os.replace(tmp_name, target)
        _fsync_directory(directory)
    except BaseException as error:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        if isinstance(error, OSError) and error.errno in _NO_SPACE and not isinstance(error, NoSpace):
            raise NoSpace(target) from None
        raise
    clean_stale_temps(target, older_than=stale_seconds)


def _existing_mode(target: Path) -> int | None:
    """The permission bits of the regular file at ``target``; None if there is none;
    :class:`OutputError` for anything that is not a regular file."""
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"{target}: {'is a directory' if stat.S_ISDIR(info.st_mode) else 'not a regular file'}; "
                          "refused")
    return stat.S_IMODE(info.st_mode)


def _existing_owner(target: Path) -> tuple[int, int] | None:
    """The owner of the file at ``target`` when it is not ours and we may give files
    away (root); None otherwise."""
    try:
        info = os.stat(target)
    except OSError:
        return None
    if os.geteuid() != 0 or (info.st_uid, info.st_gid) == (os.geteuid(), os.getegid()):
        return None
    return info.st_uid, info.st_gid


def clean_stale_temps(path: Path, *, older_than: float = STALE_SECONDS) -> list[str]:
    """Remove this file's own temp files (``.NAME.XXXXXXXX.tmp``) older than
    ``older_than`` seconds; return their names."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    prefix = _temp_prefix(target)
    length = len(prefix) + _TEMP_RANDOM + len(".tmp")
    removed = []
    now = time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp") and len(name) == length):
            continue
        candidate = directory / name
        try:
            info = os.lstat(candidate)
            if stat.S_ISREG(info.st_mode) and now - info.st_mtime >= older_than:
                os.unlink(candidate)
                removed.append(name)
        except OSError:
            pass
    return removed


def write_file_atomically(path: Path, fill: Callable[[Any], None], *, stale_seconds: float = STALE_SECONDS) -> None:
    """Write ``path`` through :func:`atomic_output` with ``fill(handle)`` writing bytes
    to a binary handle; a full disk raises :class:`NoSpace`."""
    with atomic_output(path, stale_seconds=stale_seconds) as tmp_name:
        with open(tmp_name, "wb") as handle:
            fill(handle)


def write_hdf5_atomically(path: Path, fill: Callable[[Any], None], *, stale_seconds: float = STALE_SECONDS) -> None:
    """Build an HDF5 file in memory with ``fill(h5py_file)``, then write its bytes
    through :func:`atomic_output`. HDF5 never touches the disk itself: a full disk
    while h5py flushes or closes a file can crash the process (a segfault in
    ``File.close()``), whereas a plain write fails with an ordinary ENOSPC that leaves
    the previous file intact."""
    import h5py  # defers h5py

    # The name is only a label: backing_store=False keeps everything in memory.
    with h5py.File(f"popplay-{os.getpid()}-{id(fill)}.h5", "w", driver="core", backing_store=False,
                   libver=("v110", "latest")) as f:
        fill(f)
        f.flush()
        image = f.id.get_file_image()
    write_file_atomically(path, lambda handle: handle.write(image), stale_seconds=stale_seconds)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def probe_directory(directory: Path) -> str | None:
    """None if a file can be created in ``directory``, else the OS's reason."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".popplay-probe-", dir=directory)
    except OSError as error:
        return error.strerror or type(error).__name__
    os.close(fd)
    os.unlink(probe)
    return None


def encode_attr(value: Any) -> Any:
    """An attribute value as stored. Strings become fixed-length UTF-8 bytes: they
    live inside the checksummed object header, whereas variable-length strings live
    in HDF5's global heap, which has no checksum and whose corruption can hang the
    reader. Anything that is not a scalar is stored as JSON."""

    if value is None:
        value = "none"
    elif not isinstance(value, (bool, int, float, str, np.generic)):
        value = json.dumps(value)
    if isinstance(value, str):
        return np.bytes_(value.encode("utf-8") or b"\0")
    return value


def decode_attr(value: Any) -> Any:
    """The Python value of a stored attribute (the inverse of :func:`encode_attr` for scalars)."""

    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def first_line(error: BaseException) -> str:
    """A one-line reason for an exception (h5py's messages run over several lines)."""
    text = str(error).splitlines()[0] if str(error) else ""
    return text or type(error).__name__


def read_header(f: Any, path: Path, error: type[Exception], noun: str, file_format: str, schema_version: int,
                advice: bool = False) -> dict[str, Any]:
    """The root attributes of a popplay HDF5 file, decoded, once its ``format`` and
    ``schema_version`` are the ones this popplay writes; otherwise ``error`` naming
    the file (with ``advice``: and what to do about a newer or older schema)."""
    attrs = {name: decode_attr(f.attrs[name]) for name in f.attrs}
    if attrs.get("format") != file_format:
        raise error(f"{path}: not a popplay {noun} file")
    version = attrs.get("schema_version")
    if version != schema_version:
        newer = isinstance(version, int) and version > schema_version
        what_now = f"; {'upgrade popplay' if newer else 'it cannot be loaded'}" if advice else ""
        raise error(f"{path}: {noun} file schema {version} is {'newer' if newer else 'older'} than this "
                    f"popplay reads ({schema_version}){what_now}")
    return attrs


def check_hdf5_path(path: Path, error: type[Exception], noun: str) -> None:
    """Raise ``error`` with a one-line reason unless ``path`` is a non-empty HDF5 file."""
    import h5py  # defers h5py

    if not path.exists():
        raise error(f"{path}: no such file")
    if path.is_dir():
        raise error(f"{path}: is a directory, not {noun}")
    if path.stat().st_size == 0:
        raise error(f"{path}: empty file, not {noun}")
    try:
        hdf5 = h5py.is_hdf5(path)
    except Exception:
        hdf5 = False
    if not hdf5:
        raise error(f"{path}: not an HDF5 file")


# deflate (with or without shuffle) compresses at most about 1032:1, so a dataset whose
# declared size is far beyond what it stores was never written (its chunks would be
# made up from the fill value) or was crafted: refused before anything is read.
_MAX_COMPRESSION = 1100
# popplay's writers let h5py pick chunks of kilobytes; millions of tiny chunks make
# HDF5 itself use gigabytes of memory (about a kilobyte per chunk read). Rows of a
# table as chunks (64 bytes or more on average) are fine, up to a million chunks.
_MIN_BYTES_PER_CHUNK = 64
_MAX_CHUNKS = 1_000_000
_MAX_DIMENSIONS = 8


def check_tree(f: Any, path: Path, error: type[Exception], max_array_bytes: int,
               max_total_bytes: int | None = None) -> int:
    """Refuse anything that could make h5py read outside the file (soft, external
    and virtual links or storage), non-numeric datasets, and anything whose reading
    would take memory out of proportion to the file: implausible declared sizes,
    storage far smaller than the declared size, millions of tiny chunks, or more
    bytes in all than ``max_total_bytes``. Only metadata is read. Returns the total
    declared bytes of every dataset."""

    import h5py  # defers h5py

    total = 0

    def visit(group: Any) -> None:
        nonlocal total
        for name in group:
            where = f"{group.name.rstrip('/')}/{name}"
            link = group.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):
                raise error(f"{path}: contains a {type(link).__name__} at {where}; refused")
            item = group[name]
            if isinstance(item, h5py.Group):
                visit(item)
                continue
            if not isinstance(item, h5py.Dataset):
                raise error(f"{path}: unexpected object at {where}")
            if item.is_virtual:
                raise error(f"{path}: contains a virtual dataset at {where}; refused")
            if item.external:
                raise error(f"{path}: contains external storage at {where}; refused")
            if item.dtype.kind not in "biuf" or item.dtype.itemsize > 8:
                raise error(f"{path}: unexpected data type {item.dtype} at {where}")
            shape = item.shape
            if shape is None or len(shape) > _MAX_DIMENSIONS:
                raise error(f"{path}: unexpected shape at {where}")
            declared = math.prod(shape) * item.dtype.itemsize
            if declared > max_array_bytes:
                raise error(f"{path}: dataset {where} is implausibly large ({_size(declared)})")
            if item.chunks is not None:
                chunks = math.prod(-(-s // max(c, 1)) for s, c in zip(shape, item.chunks))
                if chunks > min(_MAX_CHUNKS, 1 + declared // _MIN_BYTES_PER_CHUNK):
                    raise error(f"{path}: dataset {where} is split into {chunks:,} chunks for {_size(declared)}; "
                                "refused (crafted or damaged)")
            if declared:
                stored = item.id.get_storage_size()
                if stored * _MAX_COMPRESSION + 4096 < declared:
                    raise error(f"{path}: dataset {where} declares {_size(declared)} but stores only "
                                f"{_size(stored)}; refused (never written, damaged or crafted)")
            total += declared
            if max_total_bytes is not None and total > max_total_bytes:
                raise error(f"{path}: loading it needs more than {_size(max_total_bytes)} of memory, more than "
                            "this machine has available; refused")

    visit(f)
    return total


def _size(n: float) -> str:
    return format_bytes(n)
