"""What the tests share: real popplay processes started and finished within bounds
(``jobs``), the command line in this process (``cli``), and the knobs every test runs under."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

# Tests must not depend on the number of cores of the machine running them.
os.environ.setdefault("NUMBA_NUM_THREADS", "2")
# Two test workers share the cores: one torch thread each, or a deep population (which
# takes every core it may use) would spin against the other worker's.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# as `import popplay` sets it, before any test's first matrix product
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

ROOT = Path(__file__).resolve().parents[1]
#: Seconds for a whole job on a loaded 2-core machine: generous, never forever.
WAIT = 180


#: Small real runs whose warm-ups compile the numba kernels most tests use (the knights
#: kernel alone takes about 30 s on a cold cache).
WARM_RUNS = (
    ["train", "knights", "--agents", "4", "--games-per-agent", "4", "--episodes", "2", "--eval-every", "1",
     "--eval-games", "4", "--replicate-every", "1", "--max-turns", "40"],
    ["train", "cartpole", "--agents", "4", "--trials", "2", "--agent-steps", "64", "--share-every", "16",
     "--test-steps", "50", "--replicate-every", "1"],
    ["train", "bandit", "--agents", "4", "--trials", "4", "--agent-steps", "64", "--share-every", "16"],
)


def pytest_configure(config: pytest.Config) -> None:
    """Fill numba's on-disk cache once, before any test runs: otherwise every worker and
    every process a test starts on a cold cache (ranks, CLI subprocesses) compiles the
    same kernels again, side by side on two cores. Only the controller does it (xdist
    workers have ``workerinput``); POPPLAY_TEST_NO_WARM=1 skips it."""
    if hasattr(config, "workerinput"):
        return
    _compile_bytecode()
    if os.environ.get("POPPLAY_TEST_NO_WARM") == "1":
        return
    import tempfile

    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory(prefix="popplay-warm-") as tmp:
        # knights alone on one core, the others one after the other on the second
        chains = [[WARM_RUNS[0]], list(WARM_RUNS[1:])]
        scripts = [" && ".join(shlex.join([sys.executable, "-m", "popplay", *run, "--out",
                                           str(Path(tmp) / f"{run[1]}.h5")]) for run in chain)
                   for chain in chains]  # quoted: an interpreter or temporary path may hold spaces
        started = [subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True) for script in scripts]
        for process in started:  # a failed warm-up only costs time: the tests themselves report errors
            try:
                process.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                _kill(process)
                process.wait()


def _compile_bytecode() -> None:
    """Write popplay's bytecode once. An editable install has none, and where
    PYTHONDONTWRITEBYTECODE is set (as on this project's machines) no process writes it:
    each of the hundreds of processes the tests start would compile popplay's modules
    again (0.15-0.3 s of CPU each, on two cores shared by everything)."""
    import compileall

    compileall.compile_dir(str(ROOT / "popplay"), quiet=2)  # a read-only checkout: the processes compile, as before


class Jobs:
    """``python -m popplay ARGS`` as real processes, each in its own session so that a
    job that hangs is killed with all of its ranks; every job a test leaves running is
    killed when it ends."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, args: list[str], hooks: dict[str, float] | None = None, env: dict[str, str] | None = None,
              module: str = "popplay") -> subprocess.Popen:
        """Start ``python -m MODULE ARGS`` with this checkout first on the path;
        ``hooks`` set test hooks (:mod:`popplay.core.hooks`) in its environment."""
        from popplay.core.hooks import variable

        full_env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                    **{variable(k): str(v) for k, v in (hooks or {}).items()}, **(env or {})}
        process = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=full_env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.started.append(process)
        return process

    def finish(self, process: subprocess.Popen, timeout: float = WAIT,
               expect: int | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr); a job not done within ``timeout`` fails the test
        (after its whole process group is killed), and so does an exit code other than
        ``expect`` when one is given."""
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(process)
            out, err = process.communicate()
            pytest.fail(f"no result within {timeout:g}s: {err[-2000:]}")
        if expect is not None:
            assert process.returncode == expect, err[-4000:]
        return process.returncode, out, err

    def summary(self, process: subprocess.Popen, timeout: float = WAIT, expect: int = 0) -> dict[str, Any]:
        """The ``--json`` summary (the last line) of a job that must end with ``expect``."""
        _, out, _ = self.finish(process, timeout, expect=expect)
        return json.loads(out.strip().splitlines()[-1])

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                _kill(process)
                process.communicate()


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def jobs() -> Iterator[Jobs]:
    """Real popplay processes for this test (see :class:`Jobs`)."""
    started = Jobs()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    """``popplay ARGV`` in this process: (exit code, stdout, stderr)."""
    from popplay.cli.main import main

    def run(argv: list[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(argv)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


class SmallDisk:
    """A tmpfs of a few blocks mounted at ``path``; :meth:`fill` takes every free block."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fill(self) -> None:
        fd = os.open(self.path / "filler", os.O_WRONLY | os.O_CREAT)  # unbuffered: nothing left to flush
        try:
            while True:
                os.write(fd, b"\0" * 1024)
        except OSError:
            pass
        finally:
            os.close(fd)


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SmallDisk]:
    """A real small file system (its size from a ``disk_size`` marker, 256k by
    default); the test is skipped where mounting is not allowed."""
    marker = request.node.get_closest_marker("disk_size")
    size = marker.args[0] if marker is not None else "256k"
    path = tmp_path / "fs"
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (not root?)")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


def run_reproduce(out: Path, *argv: str) -> dict[str, Any]:
    """``popplay reproduce ARGV --out OUT --json`` in this process; its JSON summary."""
    import contextlib
    import io

    from popplay.cli.main import main

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["reproduce", *argv, "--out", str(out), "--json"]) == 0
    return json.loads(stdout.getvalue().strip().splitlines()[-1])
