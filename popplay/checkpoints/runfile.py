"""HDF5 run files: written atomically, read without trusting the file.

Layout (schema 1; documented in ``docs/runfile.md``)::

    /                 attrs: format, schema_version, domain, complete, created,
                             popplay_version, learning_seconds, phases
    /config           attrs: every parameter of the experiment and run options;
                             config_json holds the same as one JSON object
    /versions         attrs: python, popplay, numpy, numba, torch, h5py
    /state/*          the population state between phases; attrs: its counters
    /<static>/*       fixed arrays (environment, per-agent attributes)
    /curves/*         agent_steps, seconds and one dataset per metric
    /results/*        per-trial results; attrs: final metrics

Nothing is pickled. Reading refuses links, external storage and virtual datasets
(nothing outside the file is ever read) and checks every shape against the config
before loading it.
"""
from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from popplay.checkpoints.h5io import (atomic_output, check_hdf5_path, check_tree, decode_attr, encode_attr,
                                      first_line, probe_directory, read_header)

FORMAT = "popplay-run"
SCHEMA_VERSION = 1
DIGEST = "content_sha256"


class RunFileError(Exception):
    """A run file that cannot be written or read; the message is one line for users."""


@dataclass
class RunFile:
    """A run file's contents, as plain Python and NumPy values."""

    path: Path
    domain: str
    complete: bool
    config: dict[str, Any]
    attrs: dict[str, Any]
    versions: dict[str, str]
    state: dict[str, np.ndarray]
    state_counters: dict[str, Any]
    static: dict[str, np.ndarray]
    curves: dict[str, np.ndarray]
    results: dict[str, np.ndarray]
    result_attrs: dict[str, Any]


def library_versions() -> dict[str, str]:
    import h5py
    import numba
    import torch

    import popplay

    return {
        "python": platform.python_version(), "popplay": popplay.__version__,
        "numpy": np.__version__, "numba": numba.__version__, "torch": torch.__version__,
        "h5py": h5py.__version__,
    }


def check_writable(path: Path) -> None:
    """Fail early (before any learning) if ``path`` cannot be written."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if path.exists() and path.is_dir():
        raise RunFileError(f"--out {path}: is a directory")
    if not directory.exists():
        raise RunFileError(f"--out {path}: directory {directory} does not exist")
    problem = probe_directory(directory)
    if problem:
        raise RunFileError(f"--out {path}: cannot write in {directory} ({problem})")


def write_run(
    path: Path,
    *,
    domain: str,
    config: dict[str, Any],
    state: dict[str, np.ndarray],
    state_counters: dict[str, Any],
    static: dict[str, np.ndarray],
    curves: dict[str, np.ndarray],
    results: dict[str, np.ndarray],
    result_attrs: dict[str, Any],
    attrs: dict[str, Any],
    complete: bool,
) -> None:
    """Write a run file atomically: a temporary file in the same directory, fsynced,
    then renamed over ``path`` (and the directory fsynced). A crash at any moment
    leaves either the old file or the new one, never a half-written file."""
    import h5py

    with atomic_output(Path(path)) as tmp_name:
        # libver v110: checksummed superblock and object headers; fletcher32 on every
        # dataset: a flipped bit anywhere that matters is detected when read.
        with h5py.File(tmp_name, "w", libver=("v110", "latest")) as f:
            f.attrs["format"] = _attr(FORMAT)
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["domain"] = _attr(domain)
            f.attrs["complete"] = bool(complete)
            f.attrs["created"] = _attr(datetime.now(timezone.utc).isoformat(timespec="seconds"))
            for name, value in attrs.items():
                f.attrs[name] = _attr(value)
            group = f.create_group("config")
            for name, value in config.items():
                group.attrs[name] = _attr(value)
            group.attrs["config_json"] = _attr(json.dumps(config, sort_keys=True))
            group = f.create_group("versions")
            for name, value in library_versions().items():
                group.attrs[name] = _attr(str(value))
            group = f.create_group("state")
            for name, value in state_counters.items():
                group.attrs[name] = _attr(value)
            _write_arrays(group, state)
            _write_arrays(f, static)
            _write_arrays(f.create_group("curves"), curves)
            group = f.create_group("results")
            for name, value in result_attrs.items():
                group.attrs[name] = _attr(value)
            _write_arrays(group, results)
        with h5py.File(tmp_name, "r+") as f:
            f.attrs[DIGEST] = _attr(content_digest(f))


def read_run(path: Path, *, expected_domain: str | None = None) -> RunFile:
    """Read a run file, or raise :class:`RunFileError` with a one-line reason."""
    import h5py

    path = Path(path)
    _check_file(path)
    try:
        with h5py.File(path, "r") as f:
            return _read(f, path, expected_domain)
    except RunFileError:
        raise
    except Exception as error:  # h5py raises many kinds on damaged files
        raise RunFileError(f"{path}: damaged or unreadable run file ({_reason(error)})") from None


def summarize_run(path: Path) -> dict[str, Any]:
    """What ``popplay inspect`` shows, read from attributes and curve tails only."""
    import h5py

    path = Path(path)
    _check_file(path)
    try:
        with h5py.File(path, "r") as f:
            attrs = _header(f, path, None)
            _check_tree(f, path)
            config = json.loads(_plain(f["config"].attrs["config_json"]))
            state = f["state"]
            curves = f["curves"] if "curves" in f else {}
            last = {name: float(curves[name][-1]) for name in curves
                    if name not in ("agent_steps", "seconds") and curves[name].shape and curves[name].shape[0]}
            progress = {name: _plain(state.attrs[name]) for name in state.attrs}
            if "agent_steps" in curves and curves["agent_steps"].shape[0]:
                progress["agent_steps_per_trial"] = int(curves["agent_steps"][-1])
            population = {key: config[key] for key in ("trials", "agents", "arms", "games_per_agent") if key in config}
            return {
                "path": str(path), "domain": attrs.get("domain"), "complete": bool(attrs.get("complete")),
                "written": attrs.get("created"), "schema_version": attrs.get("schema_version"),
                "learning_seconds": attrs.get("learning_seconds"), "phases": attrs.get("phases"),
                "population": population, "progress": progress, "last": last, "config": config,
                "versions": {name: str(_plain(f["versions"].attrs[name])) for name in f["versions"].attrs}
                if "versions" in f else {},
                "provenance": _provenance(attrs),
            }
    except RunFileError:
        raise
    except Exception as error:
        raise RunFileError(f"{path}: damaged or unreadable run file ({_reason(error)})") from None


def _provenance(attrs: dict[str, Any]) -> dict[str, Any]:
    """The provenance attributes (popplay.provenance), JSON ones decoded; files written
    before they existed have none."""
    from popplay.provenance import KEYS

    out: dict[str, Any] = {}
    for key in KEYS:
        if key not in attrs:
            continue
        value = _plain(attrs[key])
        if key.endswith("_json"):
            try:
                value = json.loads(value)
            except (TypeError, ValueError):
                pass
            key = key[:-len("_json")]
        out[key] = value
    return out


def _check_file(path: Path) -> None:
    check_hdf5_path(path, RunFileError, "a run file")


_reason = first_line


def _header(f: Any, path: Path, expected_domain: str | None) -> dict[str, Any]:
    attrs = read_header(f, path, RunFileError, "run", FORMAT, SCHEMA_VERSION, advice=True)
    domain = attrs.get("domain")
    if expected_domain is not None and domain != expected_domain:
        raise RunFileError(f"{path}: a {domain} run, not a {expected_domain} run")
    return attrs


def content_digest(f: Any) -> str:
    """SHA-256 over every group, attribute and dataset of a file, in a fixed order.

    HDF5 checksums metadata and (with fletcher32) chunks, but not everything, e.g.
    variable-length strings; this digest makes any change to what popplay loads
    detectable.
    """
    import hashlib

    import h5py

    digest = hashlib.sha256()

    def visit(name: str, item: Any) -> None:
        digest.update(f"\0{name}\0{type(item).__name__}".encode())
        for key in sorted(item.attrs):
            if item.name == "/" and key == DIGEST:
                continue
            digest.update(f"\0@{key}={_plain(item.attrs[key])!r}".encode())
        if isinstance(item, h5py.Dataset):
            data = np.ascontiguousarray(item[()])
            digest.update(f"\0{data.dtype.str}{data.shape}".encode())
            digest.update(data.tobytes())
        else:
            for key in sorted(item):
                visit(f"{name}/{key}", item[key])

    visit("", f)
    return digest.hexdigest()


def _read(f: Any, path: Path, expected_domain: str | None) -> RunFile:
    attrs = _header(f, path, expected_domain)
    domain = attrs.get("domain")
    _check_tree(f, path)
    if attrs.get(DIGEST) != content_digest(f):
        raise RunFileError(f"{path}: damaged run file (content checksum mismatch)")
    config_group = f["config"]
    try:
        config = json.loads(_plain(config_group.attrs["config_json"]))
    except (KeyError, ValueError):
        raise RunFileError(f"{path}: damaged config") from None
    state_group = f["state"]
    results_group = f["results"] if "results" in f else None
    static = {}
    for top in f:
        if top in ("config", "versions", "state", "curves", "results"):
            continue
        for name, value in _read_arrays(f[top]).items():
            static[f"{top}/{name}"] = value
    return RunFile(
        path=path, domain=str(domain), complete=bool(attrs.get("complete", False)), config=config,
        attrs=attrs,
        versions={name: str(_plain(f["versions"].attrs[name])) for name in f["versions"].attrs} if "versions" in f else {},
        state=_read_arrays(state_group),
        state_counters={name: _plain(state_group.attrs[name]) for name in state_group.attrs},
        static=static,
        curves=_read_arrays(f["curves"]) if "curves" in f else {},
        results=_read_arrays(results_group) if results_group is not None else {},
        result_attrs={name: _plain(results_group.attrs[name]) for name in results_group.attrs} if results_group is not None else {},
    )


_MAX_ARRAY_BYTES = 64 * 2**30


def _check_tree(f: Any, path: Path) -> None:
    for required in ("config", "state"):
        if required not in f:
            raise RunFileError(f"{path}: damaged run file (no /{required})")
    check_tree(f, path, RunFileError, _MAX_ARRAY_BYTES)


def _read_arrays(group: Any) -> dict[str, np.ndarray]:
    import h5py

    return {name: np.asarray(group[name][()]) for name in group if isinstance(group[name], h5py.Dataset)}


def _write_arrays(group: Any, arrays: dict[str, np.ndarray]) -> None:
    for name, value in arrays.items():
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{name}: only numeric arrays go into run files (got {array.dtype})")
        kwargs: dict[str, Any] = {}
        if array.ndim and array.size:
            kwargs["fletcher32"] = True
            if array.size >= 4096:
                kwargs.update(compression="gzip", compression_opts=4, shuffle=True)
        group.create_dataset(name, data=array, **kwargs)


_attr = encode_attr
_plain = decode_attr
