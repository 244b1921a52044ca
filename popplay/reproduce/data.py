"""Figure data files: what ``popplay reproduce`` computes, as HDF5 (h5py only).

Layout (``format = popplay-figure``, schema 1)::

    /            attrs: format, schema_version, figure, domain, scale, title, created,
                        groups_json (the groups in drawing order), content_sha256,
                        and the figure's own attributes (reference values, settings)
    /versions    attrs: python, popplay, numpy, numba, torch, h5py
    /<group>/*   numeric datasets (one group per curve or bar chart); attrs: its settings

Written atomically like run files; read without trusting the file (no links,
external storage or virtual datasets; numeric datasets only; content digest).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "popplay-figure"
SCHEMA_VERSION = 1
_RESERVED = ("format", "schema_version", "figure", "domain", "scale", "title", "created", "groups_json")
_MAX_ARRAY_BYTES = 2**30


class FigureFileError(Exception):
    """A figure data file that cannot be written or read; the message is one line."""


@dataclass
class Group:
    """One curve (or one set of bars): equal-length numeric arrays and its settings."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class FigureData:
    """Everything needed to draw one figure again without recomputing it."""

    figure: str
    domain: str
    scale: str
    title: str
    attrs: dict[str, Any] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)  # insertion order = drawing order


def write_figure(path: Path, data: FigureData) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename)."""
    import h5py

    from popplay.checkpoints.runfile import DIGEST, content_digest, library_versions

    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        readable_by_others(tmp_name)
        with h5py.File(tmp_name, "w", libver=("v110", "latest")) as f:
            f.attrs["format"] = _attr(FORMAT)
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["figure"] = _attr(data.figure)
            f.attrs["domain"] = _attr(data.domain)
            f.attrs["scale"] = _attr(data.scale)
            f.attrs["title"] = _attr(data.title)
            f.attrs["created"] = _attr(datetime.now(timezone.utc).isoformat(timespec="seconds"))
            f.attrs["groups_json"] = _attr(json.dumps(list(data.groups)))
            for name, value in data.attrs.items():
                if name in _RESERVED or name == DIGEST:
                    raise ValueError(f"figure attribute {name!r} is reserved")
                f.attrs[name] = _attr(value)
            versions = f.create_group("versions")
            for name, value in library_versions().items():
                versions.attrs[name] = _attr(str(value))
            for name, group in data.groups.items():
                if name == "versions" or "/" in name:
                    raise ValueError(f"bad group name {name!r}")
                target = f.create_group(name)
                for key, value in group.attrs.items():
                    target.attrs[key] = _attr(value)
                for key, value in group.arrays.items():
                    array = np.asarray(value)
                    if array.dtype.kind not in "biuf":
                        raise TypeError(f"{name}/{key}: only numeric arrays go into figure files")
                    target.create_dataset(key, data=array, fletcher32=bool(array.ndim and array.size))
        with h5py.File(tmp_name, "r+") as f:
            f.attrs[DIGEST] = _attr(content_digest(f))
        fd = os.open(tmp_name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise


def readable_by_others(path: str) -> None:
    """Give a temporary file (mode 0600) the mode a plain ``open()`` would: these are
    results to share, not secrets."""
    umask = os.umask(0o022)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def read_figure(path: Path) -> FigureData:
    """Read a figure data file, or raise :class:`FigureFileError` with a one-line reason."""
    import h5py

    path = Path(path)
    _check_file(path)
    try:
        with h5py.File(path, "r") as f:
            return _read(f, path)
    except FigureFileError:
        raise
    except Exception as error:  # h5py raises many kinds on damaged files
        raise FigureFileError(f"{path}: damaged or unreadable figure file ({_reason(error)})") from None


def file_format(path: Path) -> str | None:
    """The ``format`` attribute of an HDF5 file (``popplay-run``, ``popplay-figure``),
    None if it has none; raises :class:`FigureFileError` for a missing or non-HDF5 file.
    Only the root attributes are read, so nothing the file links to is touched."""
    import h5py

    path = Path(path)
    _check_file(path)
    try:
        with h5py.File(path, "r") as f:
            value = f.attrs.get("format")
    except Exception as error:
        raise FigureFileError(f"{path}: damaged or unreadable HDF5 file ({_reason(error)})") from None
    return None if value is None else str(_plain(value))


def _read(f: Any, path: Path) -> FigureData:
    import h5py

    from popplay.checkpoints.runfile import DIGEST, content_digest

    attrs = {name: _plain(f.attrs[name]) for name in f.attrs}
    if attrs.get("format") != FORMAT:
        raise FigureFileError(f"{path}: not a popplay figure file")
    version = attrs.get("schema_version")
    if version != SCHEMA_VERSION:
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        raise FigureFileError(f"{path}: figure file schema {version} is {'newer' if newer else 'older'} than "
                              f"this popplay reads ({SCHEMA_VERSION})")
    _check_tree(f, path)
    if attrs.get(DIGEST) != content_digest(f):
        raise FigureFileError(f"{path}: damaged figure file (content checksum mismatch)")
    try:
        order = json.loads(attrs["groups_json"])
        if not isinstance(order, list) or not all(isinstance(name, str) for name in order):
            raise ValueError
    except (KeyError, ValueError, TypeError):
        raise FigureFileError(f"{path}: damaged figure file (bad groups_json)") from None
    groups: dict[str, Group] = {}
    for name in order:
        if name not in f or not isinstance(f[name], h5py.Group):
            raise FigureFileError(f"{path}: damaged figure file (group {name!r} missing)")
        item = f[name]
        groups[name] = Group(
            arrays={key: np.asarray(item[key][()]) for key in item if isinstance(item[key], h5py.Dataset)},
            attrs={key: _plain(item.attrs[key]) for key in item.attrs},
        )
    own = {k: v for k, v in attrs.items() if k not in _RESERVED and k != DIGEST}
    return FigureData(figure=str(attrs.get("figure")), domain=str(attrs.get("domain")),
                      scale=str(attrs.get("scale")), title=str(attrs.get("title", "")), attrs=own, groups=groups)


def _check_tree(f: Any, path: Path) -> None:
    """Refuse anything that could make h5py read outside the file."""
    import h5py

    def visit(group: Any) -> None:
        for name in group:
            link = group.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):
                raise FigureFileError(f"{path}: contains a {type(link).__name__} at {group.name}/{name}; refused")
            item = group[name]
            if isinstance(item, h5py.Group):
                visit(item)
            elif isinstance(item, h5py.Dataset):
                if item.is_virtual:
                    raise FigureFileError(f"{path}: contains a virtual dataset at {item.name}; refused")
                if item.external:
                    raise FigureFileError(f"{path}: contains external storage at {item.name}; refused")
                if item.dtype.kind not in "biuf":
                    raise FigureFileError(f"{path}: unexpected data type {item.dtype} at {item.name}")
                if item.size * item.dtype.itemsize > _MAX_ARRAY_BYTES:
                    raise FigureFileError(f"{path}: dataset {item.name} is implausibly large")

    visit(f)


def _check_file(path: Path) -> None:
    import h5py

    if not path.exists():
        raise FigureFileError(f"{path}: no such file")
    if path.is_dir():
        raise FigureFileError(f"{path}: is a directory, not an HDF5 file")
    if path.stat().st_size == 0:
        raise FigureFileError(f"{path}: empty file, not an HDF5 file")
    try:
        hdf5 = h5py.is_hdf5(path)
    except Exception:
        hdf5 = False
    if not hdf5:
        raise FigureFileError(f"{path}: not an HDF5 file")


def _reason(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return text or type(error).__name__


def _attr(value: Any) -> Any:
    # Fixed-length UTF-8 bytes, as in run files: they live in the checksummed
    # object header rather than in HDF5's unchecksummed global heap.
    if value is None:
        value = "none"
    elif not isinstance(value, (bool, int, float, str, np.generic)):
        value = json.dumps(value)
    if isinstance(value, str):
        return np.bytes_(value.encode("utf-8") or b"\0")
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    return value
