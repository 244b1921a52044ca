"""Helpers for the multi-rank tests: run the CLI as a real process, compare run files."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WAIT = 180  # seconds for a whole job on a loaded 2-core machine: generous, never forever
TIMING = {"curves/seconds"}  # wall-clock datasets: the only ones allowed to differ


def popplay(*args: str, timeout: float = WAIT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m popplay ARGS`` with this checkout first on the path."""
    full_env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "popplay", *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def finish(process: subprocess.Popen, timeout: float = WAIT, what: str = "the job") -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a started job; a job that hangs fails the test
    within ``timeout`` instead of holding the suite."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate(timeout=30)
        raise AssertionError(f"{what} did not end within {timeout:g}s: {err[-2000:]}") from None
    return process.returncode, out, err


def datasets(path: Path) -> dict[str, np.ndarray]:
    import h5py

    found: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        def visit(name: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset):
                found[name] = obj[()]
        f.visititems(visit)
    return found


def assert_same_run(a: Path, b: Path, ignore: set[str] = TIMING) -> dict[str, np.ndarray]:
    """Every dataset of two run files equal bit for bit (timings aside)."""
    left, right = datasets(a), datasets(b)
    assert sorted(left) == sorted(right)
    different = [name for name in left if name not in ignore
                 and np.asarray(left[name]).tobytes() != np.asarray(right[name]).tobytes()]
    assert not different, f"{a} and {b} differ in {different}"
    return left
