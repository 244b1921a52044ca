"""The local launcher's guards, through real processes: a layout larger than the machine
is refused before any rank starts, and ranks never outlive a killed launcher, even
while they are still importing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.procs


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def _ranks_of(marker: str) -> list[int]:
    """Pids of the ranks whose command line names ``marker`` (what ps shows)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and "popplay rank " in cmdline:
            found.append(int(proc.name))
    return found


def test_a_layout_larger_than_the_machine_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    out = tmp_path / "big.h5"
    done = subprocess.run([sys.executable, "-m", "popplay", "train", "dqn", "--topology", "collective",
                           "--simulators", "3", "--episodes", "2", "--out", str(out)], env=_env(POPPLAY_MAX_RANKS="3"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "Error: this run would start 4 processes; this machine takes at most 3 (8 per core, or POPPLAY_MAX_RANKS): "
        "lower --nproc or the ranks of its layout (--simulators, --workers, --learners, --actors)"]
    assert not out.exists() and _ranks_of(str(out)) == []


def test_ranks_die_with_a_launcher_killed_while_they_import(tmp_path: Path) -> None:
    out = tmp_path / "orphans.h5"
    launcher = subprocess.Popen([sys.executable, "-m", "popplay", "train", "dqn", "--topology", "collective",
                                 "--simulators", "2", "--episodes", "1000", "--out", str(out)], env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(_ranks_of(str(out))) < 3 and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.01)
        assert len(_ranks_of(str(out))) == 3, "the ranks never started"
        launcher.kill()  # at once: the ranks are still importing torch
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _ranks_of(str(out)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _ranks_of(str(out)) == []
    finally:
        for pid in _ranks_of(str(out)):
            os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
