"""What every popplay file writer and reader shares: atomic replacement, HDF5
attribute encoding, and the checks that let a reader refuse a file it cannot trust.

Run files (:mod:`popplay.checkpoints.runfile`), figure data files
(:mod:`popplay.reproduce.data`) and plots (:mod:`popplay.plotting`) all go through
:func:`atomic_output`, so a crash or Ctrl-C at any moment leaves the old file or the
new one under the name, never half of one.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


@contextmanager
def atomic_output(path: Path) -> Iterator[str]:
    """Yield a temporary file name beside ``path``; on a clean exit the file is
    fsynced and renamed over ``path`` (and the directory fsynced), otherwise removed.

    The temporary file gets the mode a plain ``open()`` would give (mkstemp makes it
    0600): run files and figures are results to share, not secrets.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        yield tmp_name
        fd = os.open(tmp_name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, path)
        _fsync_directory(directory)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise


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
    import numpy as np

    if value is None:
        value = "none"
    elif not isinstance(value, (bool, int, float, str, np.generic)):
        value = json.dumps(value)
    if isinstance(value, str):
        return np.bytes_(value.encode("utf-8") or b"\0")
    return value


def decode_attr(value: Any) -> Any:
    """The Python value of a stored attribute (the inverse of :func:`encode_attr` for scalars)."""
    import numpy as np

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
    import h5py

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


def check_tree(f: Any, path: Path, error: type[Exception], max_array_bytes: int) -> None:
    """Refuse anything that could make h5py read outside the file (soft, external
    and virtual links or storage), non-numeric datasets, and implausible sizes."""
    import h5py

    def visit(group: Any) -> None:
        for name in group:
            link = group.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):
                raise error(f"{path}: contains a {type(link).__name__} at {group.name}/{name}; refused")
            item = group[name]
            if isinstance(item, h5py.Group):
                visit(item)
            elif isinstance(item, h5py.Dataset):
                if item.is_virtual:
                    raise error(f"{path}: contains a virtual dataset at {item.name}; refused")
                if item.external:
                    raise error(f"{path}: contains external storage at {item.name}; refused")
                if item.dtype.kind not in "biuf":
                    raise error(f"{path}: unexpected data type {item.dtype} at {item.name}")
                if item.size * item.dtype.itemsize > max_array_bytes:
                    raise error(f"{path}: dataset {item.name} is implausibly large")

    visit(f)
