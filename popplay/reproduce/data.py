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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from popplay.checkpoints.h5io import (
    NoSpace,
    OutputError,
    check_hdf5_path,
    check_tree,
    decode_attr,
    encode_attr,
    first_line,
    read_header,
    write_hdf5_atomically,
)
from popplay.checkpoints.runfile import DIGEST, content_digest, library_versions
from popplay.core.limits import available_bytes

FORMAT = "popplay-figure"
SCHEMA_VERSION = 1
_RESERVED = ("format", "schema_version", "figure", "domain", "scale", "title", "created", "groups_json")
_MAX_ARRAY_BYTES = 2**30


def round_finite(value: Any, digits: int) -> float:
    """``value`` rounded for a summary (NaN and infinities pass unchanged)."""
    value = float(value)
    return round(value, digits) if np.isfinite(value) else value


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
    """Write ``data`` to ``path`` atomically (built in memory, then a temporary file,
    fsync, rename; a full disk leaves the previous file)."""

    def fill(f: Any) -> None:
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
        f.attrs[DIGEST] = _attr(content_digest(f))

    try:
        write_hdf5_atomically(Path(path), fill)
    except NoSpace:
        raise FigureFileError(f"no space left on device: {path} was not written") from None
    except OutputError as error:
        raise FigureFileError(str(error)) from None


def read_figure(path: Path) -> FigureData:
    """Read a figure data file, or raise :class:`FigureFileError` with a one-line reason."""
    import h5py  # defers h5py

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
    import h5py  # defers h5py

    path = Path(path)
    _check_file(path)
    try:
        with h5py.File(path, "r") as f:
            value = f.attrs.get("format")
    except Exception as error:
        raise FigureFileError(f"{path}: damaged or unreadable HDF5 file ({_reason(error)})") from None
    return None if value is None else str(_plain(value))


def _read(f: Any, path: Path) -> FigureData:
    import h5py  # defers h5py


    attrs = read_header(f, path, FigureFileError, "figure", FORMAT, SCHEMA_VERSION)
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
    check_tree(f, path, FigureFileError, _MAX_ARRAY_BYTES, max_total_bytes=available_bytes() // 2)


def _check_file(path: Path) -> None:
    check_hdf5_path(path, FigureFileError, "an HDF5 file")


_reason = first_line
_attr = encode_attr
_plain = decode_attr
