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

import hashlib
import json
import os
import platform
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any, Collection, Protocol

import numpy as np

import popplay
from popplay.checkpoints.h5io import (
    STALE_SECONDS,
    NoSpace,
    OutputError,
    check_hdf5_path,
    check_replaceable,
    check_tree,
    decode_attr,
    encode_attr,
    first_line,
    read_header,
    resolve_output,
    sibling_name,
    write_hdf5_atomically,
)
from popplay.checkpoints.lock import held_here
from popplay.checkpoints.provenance import KEYS
from popplay.core.errors import EXIT_FAILURE, EXIT_USAGE, PopplayError
from popplay.core.limits import available_bytes

FORMAT = "popplay-run"
SCHEMA_VERSION = 1
DIGEST = "content_sha256"


class RunFileError(PopplayError):
    """A run file that cannot be written or read; the message is one line for users.
    ``exit_code``: 2 for bad input (the usual case), 1 for a failure of the machine."""

    exit_code = EXIT_USAGE


class NoSpaceError(RunFileError):
    """The disk filled up while writing; the previous run file is intact."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.path = path


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
    lock: Any = None  # the run file's lock, when it was read to be written again (--resume)


def library_versions() -> dict[str, str]:
    import h5py  # defers h5py

    # torch's and numba's versions from their metadata: importing torch for it would cost
    # the numba paths seconds at every save, and numba a few tenths the deep processes.
    return {
        "python": platform.python_version(), "popplay": popplay.__version__,
        "numpy": np.__version__, "numba": version("numba"), "torch": version("torch"),
        "h5py": h5py.__version__,
    }


def display_name(path: Path | str) -> str:
    """A run file's own name: through a link such as ``runs/latest-knights.h5``, the
    name of the file it points to (titles and labels should name the run, not the link)."""
    path = Path(path)
    return path.resolve().name if path.is_symlink() else path.name


def check_writable(path: Path, *, overwrite: bool = False, resume: bool = False) -> None:
    """Fail early (before any learning) if ``path`` cannot be written: a directory
    that does not exist or refuses files, an existing file that is not a regular file
    (devices, FIFOs and directories are never replaced), a read-only or hard-linked
    file, a file other than a popplay run file without ``overwrite``, or a name too
    long for the lock and temporary files beside it."""

    path = Path(path)
    option = "--resume" if resume else "--out"
    target = check_replaceable(path, RunFileError, kind="run", overwrite=overwrite or not resume, option=option)
    if not resume and path.exists() and not overwrite:
        raise RunFileError(f"--out {path}: file exists (pass --overwrite to replace it)")
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.exists():
        raise RunFileError(f"{option} {path}: directory {directory} does not exist")
    # A temporary file by the very name writes will use, created and removed.
    try:
        fd, probe = tempfile.mkstemp(prefix=sibling_name(target, ".", reserve=12), suffix=".tmp", dir=directory)
    except OSError as error:
        raise RunFileError(f"{option} {path}: cannot write in {directory} ({error.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def no_space_message(path: Path) -> str:
    """'no space left on device: the run file at PATH still holds step N', read from
    the previous file's counters (or: nothing was written to PATH)."""
    import h5py  # defers h5py

    path = Path(path)
    if not path.exists():
        return f"no space left on device: nothing was written to {path}"
    held = "its previous state"
    try:
        with h5py.File(path, "r") as f:
            counters = {k: decode_attr(v) for k, v in f["state"].attrs.items()}
        for name in ("step", "episode"):
            if isinstance(counters.get(name), int):
                held = f"{name} {counters[name]}"
                break
    except Exception:
        pass
    return f"no space left on device: the run file at {path} still holds {held}"


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

    def fill(f: Any) -> None:
        # libver v110: checksummed superblock and object headers; fletcher32 on every
        # dataset: a flipped bit anywhere that matters is detected when read.
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
        f.attrs[DIGEST] = _attr(content_digest(f))

    path = Path(path)
    # Under the run file's lock no other writer of it exists: every temp file of its
    # name is a leftover of a killed writer, whatever its age.
    stale = 0.0 if held_here(path) else STALE_SECONDS
    try:
        write_hdf5_atomically(path, fill, stale_seconds=stale)
    except NoSpace:
        raise NoSpaceError(no_space_message(resolve_output(path)), path) from None
    except OutputError as error:
        raise RunFileError(str(error)) from None


RESCUE_ENV = "POPPLAY_RESCUE_DIR"


def rescue_directories(failed: Path) -> list[Path]:
    """Where a state that could not be saved at ``failed`` is tried next:
    ``POPPLAY_RESCUE_DIR`` if set, the temporary directory, the home directory and the
    working directory (each once, the failed file's own directory left out)."""

    candidates = [os.environ.get(RESCUE_ENV), tempfile.gettempdir(), os.path.expanduser("~"), os.getcwd()]
    own = os.path.realpath(Path(failed).parent)
    seen, found = {own}, []
    for candidate in candidates:
        if not candidate:
            continue
        real = os.path.realpath(candidate)
        if real not in seen and os.path.isdir(real):
            seen.add(real)
            found.append(Path(real))
    return found


def rescue(error: NoSpaceError, contents: dict[str, Any]) -> None:
    """After a full disk: write the same run (``write_run`` keyword arguments) to the
    first of :func:`rescue_directories` that takes it, and raise :class:`NoSpaceError`
    saying where it went (or that it could not be kept anywhere)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(error.path)
    for directory in rescue_directories(path):
        where = directory / f"{path.stem[:100]}-rescued-{stamp}.h5"
        try:
            write_run(where, **contents)
        except (RunFileError, OSError):
            continue
        raise NoSpaceError(f"{error}; this run's latest state was saved to {where} instead", path) from None
    raise NoSpaceError(f"{error}; the latest state could not be saved anywhere else either", path) from None


def check_storable(config: dict[str, Any], what: str = "setting") -> None:
    """Raise :class:`RunFileError` unless every value of ``config`` can be stored as
    a run-file attribute (checked before training, not at the first save)."""
    import h5py  # defers h5py

    with h5py.File(f"popplay-check-{id(config)}.h5", "w", driver="core", backing_store=False) as f:
        for name, value in config.items():
            try:
                f.attrs[name] = _attr(value)
            except (TypeError, ValueError, OverflowError) as error:
                shown = f"--{name.replace('_', '-')}" if what == "setting" else name
                raise RunFileError(f"{shown} cannot be stored in a run file (got {value!r}: {first_line(error)})") \
                    from None
        try:
            json.dumps(config, sort_keys=True, allow_nan=True)
        except (TypeError, ValueError) as error:
            raise RunFileError(f"the settings cannot be stored in a run file ({first_line(error)})") from None


class RunCheck(Protocol):
    """The rules a run file's contents must follow beyond its layout and checksum: its
    settings by the command line's rules, its counters and bookkeeping. Each method
    raises ``ValueError`` (or ``TypeError``) with a one-line reason."""

    def settings(self, domain: str, config: dict[str, Any], counters: dict[str, Any], *,
                 known: Collection[str] | None = None) -> None: ...

    def contents(self, run: "RunFile") -> None: ...


def read_run(path: Path, *, check: RunCheck, expected_domain: str | None = None) -> RunFile:
    """Read a run file, or raise :class:`RunFileError` with a one-line reason.
    ``check`` judges what the file holds (:data:`popplay.checkpoints.validation.RUN_CHECK`:
    by the registered domains' rules); nothing is returned that it refused."""
    import h5py  # defers h5py

    path = Path(path)
    _check_file(path)
    try:
        with h5py.File(path, "r") as f:
            return _read(f, path, expected_domain, check)
    except RunFileError:
        raise
    except Exception as error:  # h5py raises many kinds on damaged files
        raise RunFileError(f"{path}: damaged or unreadable run file ({_reason(error)})") from None


def summarize_run(path: Path, *, check: RunCheck) -> dict[str, Any]:
    """What ``popplay inspect`` shows, from attributes and curve tails, once the file's
    layout and content checksum are verified (streamed; no array is kept)."""
    import h5py  # defers h5py

    path = Path(path)
    _check_file(path)
    try:
        with h5py.File(path, "r") as f:
            attrs = _header(f, path, None)
            _check_tree(f, path)
            config = _config(f, path)
            # Streamed: as cheap in memory as the attributes; the run file is checked
            # exactly as the commands that load it will check it.
            _check_digest(f, path, attrs)
            state = f["state"]
            curves = f["curves"] if "curves" in f else {}
            last = {name: float(curves[name][-1]) for name in curves
                    if name not in ("agent_steps", "seconds") and curves[name].shape and curves[name].shape[0]}
            progress = _counters(state, path)
            _check_settings(check, path, attrs.get("domain"), config, progress, attrs)
            if "agent_steps" in curves and curves["agent_steps"].shape[0]:
                progress["agent_steps_per_trial"] = int(curves["agent_steps"][-1])
            population = {key: config[key] for key in ("trials", "agents", "arms", "games_per_agent") if key in config}
            return {
                "path": str(path), "domain": attrs.get("domain"), "complete": bool(attrs.get("complete")),
                "written": attrs.get("created"), "schema_version": attrs.get("schema_version"),
                "learning_seconds": attrs.get("learning_seconds"), "phases": attrs.get("phases"),
                "population": population, "progress": progress, "last": last, "config": config,
                "checksum": "verified",
                "versions": {name: str(_plain(f["versions"].attrs[name])) for name in f["versions"].attrs}
                if "versions" in f else {},
                "provenance": _provenance(attrs, path),
            }
    except RunFileError:
        raise
    except Exception as error:
        raise RunFileError(f"{path}: damaged or unreadable run file ({_reason(error)})") from None


#: The JSON provenance attributes and what each must decode to.
_PROVENANCE_JSON = {"given_json": dict, "history_json": list}


def _provenance(attrs: dict[str, Any], path: Path) -> dict[str, Any]:
    """The provenance attributes (popplay.checkpoints.provenance), JSON ones decoded (a
    JSON attribute that is not what popplay writes is damage); files written before
    they existed have none."""

    out: dict[str, Any] = {}
    for key in KEYS:
        if key not in attrs:
            continue
        value = _plain(attrs[key])
        if key in _PROVENANCE_JSON:
            kind = _PROVENANCE_JSON[key]
            try:
                value = json.loads(value)
            except (TypeError, ValueError):
                value = None
            if not isinstance(value, kind):
                raise RunFileError(f"{path}: damaged run file (attribute {key} is not a JSON "
                                   f"{'object' if kind is dict else 'list'})")
            key = key[:-len("_json")]
        out[key] = value
    return out


def _counters(group: Any, path: Path) -> dict[str, Any]:
    """A group's counters (``/state``'s attributes): each one number or text, as popplay
    writes them; an array in their place is damage."""
    counters = {}
    for name in group.attrs:
        value = _plain(group.attrs[name])
        if not isinstance(value, (bool, int, float, str)):
            raise RunFileError(f"{path}: damaged run file (state counter {name} is not a single value)")
        counters[name] = value
    return counters


def _check_file(path: Path) -> None:
    check_hdf5_path(path, RunFileError, "a run file")


_reason = first_line


def _header(f: Any, path: Path, expected_domain: str | None) -> dict[str, Any]:
    attrs = read_header(f, path, RunFileError, "run", FORMAT, SCHEMA_VERSION, advice=True)
    domain = attrs.get("domain")
    if expected_domain is not None and domain != expected_domain:
        # A damaged file's domain is not to be trusted: its kind is named only once the
        # whole file is known to be as written (the rare path pays the digest).
        _check_tree(f, path)
        _check_digest(f, path, attrs)
        raise RunFileError(f"{path}: a {domain} run, not a {expected_domain} run")
    return attrs


_DIGEST_SLICE_BYTES = 32 * 2**20


def content_digest(f: Any) -> str:
    """SHA-256 over every group, attribute and dataset of a file, in a fixed order.

    HDF5 checksums metadata and (with fletcher32) chunks, but not everything, e.g.
    variable-length strings; this digest makes any change to what popplay loads
    detectable.
    """

    import h5py  # defers h5py

    digest = hashlib.sha256()

    def visit(name: str, item: Any) -> None:
        digest.update(f"\0{name}\0{type(item).__name__}".encode())
        for key in sorted(item.attrs):
            if item.name == "/" and key == DIGEST:
                continue
            digest.update(f"\0@{key}={_plain(item.attrs[key])!r}".encode())
        if isinstance(item, h5py.Dataset):
            # Read in slices of the first axis: the same bytes as the whole array,
            # without ever holding more than one slice of a large dataset.
            shape = tuple(item.shape)
            digest.update(f"\0{item.dtype.str}{shape}".encode())
            if not shape:
                digest.update(np.ascontiguousarray(item[()]).tobytes())
            else:
                row = max(1, item.dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64)))
                step = max(1, _DIGEST_SLICE_BYTES // row)
                for start in range(0, shape[0], step):
                    digest.update(np.ascontiguousarray(item[start:start + step]).tobytes())
        else:
            for key in sorted(item):
                visit(f"{name}/{key}", item[key])

    visit("", f)
    return digest.hexdigest()


def _check_settings(check: RunCheck, path: Path, domain: Any, config: dict[str, Any],
                    counters: dict[str, Any], attrs: dict[str, Any]) -> None:
    try:
        check.settings(domain, config, counters, known=known_settings(attrs))
    except (TypeError, ValueError) as error:
        raise RunFileError(f"{path}: damaged run file ({error})") from None


def known_settings(attrs: dict[str, Any]) -> frozenset[str] | None:
    """The settings a file's writer had (its ``config_settings`` attribute, a JSON list
    of names): a missing one of these is damage; a setting it did not have was added
    since and takes its default. None for files written before the list existed (the
    earlier ``config_complete`` mark alone said "every setting", which a setting added
    later made false). ValueError (one line) for a list that is not one."""
    if "config_settings" not in attrs:
        return None
    text = attrs["config_settings"]
    try:
        names = json.loads(text.decode() if isinstance(text, bytes) else str(text))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        names = None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ValueError("config_settings is not a list of setting names")
    return frozenset(names)


def _read(f: Any, path: Path, expected_domain: str | None, check: RunCheck) -> RunFile:
    attrs = _header(f, path, expected_domain)
    domain = attrs.get("domain")
    # Metadata and the config first: nothing is read from a dataset until every one
    # is known to fit in memory and to be stored as popplay stores it.
    _check_tree(f, path)
    config = _config(f, path)
    _check_settings(check, path, domain, config, _counters(f["state"], path), attrs)
    _provenance(attrs, path)  # a command that loads the file refuses what inspect refuses
    _check_digest(f, path, attrs)
    state_group = f["state"]
    results_group = f["results"] if "results" in f else None
    static = {}
    for top in f:
        if top in ("config", "versions", "state", "curves", "results"):
            continue
        for name, value in _read_arrays(f[top]).items():
            static[f"{top}/{name}"] = value
    run = RunFile(
        path=path, domain=str(domain), complete=bool(attrs.get("complete", False)), config=config,
        attrs=attrs,
        versions={name: str(_plain(f["versions"].attrs[name])) for name in f["versions"].attrs} if "versions" in f else {},
        state=_read_arrays(state_group),
        state_counters=_counters(state_group, path),
        static=static,
        curves=_read_arrays(f["curves"]) if "curves" in f else {},
        results=_read_arrays(results_group) if results_group is not None else {},
        result_attrs={name: _plain(results_group.attrs[name]) for name in results_group.attrs} if results_group is not None else {},
    )
    try:
        check.contents(run)
    except (TypeError, ValueError) as error:
        raise RunFileError(f"{path}: damaged run file ({error})") from None
    return run


def _config(f: Any, path: Path) -> dict[str, Any]:
    """The config as one JSON object (refused otherwise: a list, null, a number)."""
    try:
        config = json.loads(_plain(f["config"].attrs["config_json"]))
    except (KeyError, ValueError, TypeError):
        raise RunFileError(f"{path}: damaged config") from None
    if not isinstance(config, dict):
        raise RunFileError(f"{path}: damaged config (a JSON {type(config).__name__}, not an object)")
    return config


_MAX_ARRAY_BYTES = 64 * 2**30


def _check_digest(f: Any, path: Path, attrs: dict[str, Any]) -> None:
    """Refuse a file whose content no longer matches the checksum written with it."""
    if attrs.get(DIGEST) != content_digest(f):
        raise RunFileError(f"{path}: damaged run file (content checksum mismatch)")


def _check_tree(f: Any, path: Path) -> None:
    import h5py  # defers h5py


    for required in ("config", "state"):
        if required not in f or not isinstance(f.get(required, getlink=True), h5py.HardLink):
            raise RunFileError(f"{path}: damaged run file (no /{required})")
    # Loading keeps every array, plus one slice at a time for the checksum.
    check_tree(f, path, RunFileError, _MAX_ARRAY_BYTES, max_total_bytes=available_bytes() // 2)


def _read_arrays(group: Any) -> dict[str, np.ndarray]:
    import h5py  # defers h5py

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
