"""Hostile and unlucky inputs (issue 18): what is not ours is never replaced, crafted
files cannot drive memory or crash a command, a full disk loses nothing, lock races."""
import errno
import json
import os
import stat
import threading

import h5py
import numpy as np
import pytest

from popplay.checkpoints import h5io, runfile
from popplay.checkpoints.runfile import RunFileError, read_run
from popplay.cli import main

SMALL = ["train", "bandit", "--arms", "5", "--agents", "4", "--trials", "8", "--share-every", "4"]


def _train(path, steps=64, *extra):
    return main(SMALL + ["--agent-steps", str(steps), "--out", str(path), "--json", *extra])


def _step(path):
    with h5py.File(path, "r") as f:
        return int(f["state"].attrs["step"])


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "small.h5"
    assert _train(path) == 0
    return path


@pytest.fixture
def run_copy(small_run, tmp_path):
    path = tmp_path / "run.h5"
    path.write_bytes(small_run.read_bytes())
    return path


def _error_line(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("Error: ") and "internal error" not in err, err
    return err


# -- 1. never replace what is not ours -------------------------------------------


def test_fifos_and_directories_are_never_replaced(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _train(fifo, 64, "--overwrite") == 2
    assert "not a regular file" in _error_line(capsys)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "dir.h5").mkdir()
    assert _train(tmp_path / "dir.h5", 64, "--overwrite") == 2
    assert "directory" in _error_line(capsys)
    # the writer itself refuses too, whoever calls it
    with pytest.raises(h5io.OutputError):
        with h5io.atomic_output(fifo) as tmp_name:
            open(tmp_name, "w").close()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["dir.h5", "fifo"]


def test_plot_and_lineage_do_not_overwrite_a_run_file(run_copy, tmp_path, capsys):
    other = tmp_path / "other.h5"
    other.write_bytes(run_copy.read_bytes())
    before = other.read_bytes()
    assert main(["plot", str(run_copy), "--out", str(other)]) == 2
    assert "popplay run file" in _error_line(capsys)
    assert main(["lineage", str(run_copy), "--format", "csv", "--out", str(other)]) == 2
    _error_line(capsys)
    assert other.read_bytes() == before
    # a PNG replaces a PNG; a text export replaces text
    png = tmp_path / "curves.png"
    assert main(["plot", str(run_copy), "--out", str(png)]) == 0
    assert main(["plot", str(run_copy), "--out", str(png)]) == 0
    capsys.readouterr()


def test_resume_through_a_symlink_writes_the_target_and_keeps_its_mode(run_copy, tmp_path, capsys):
    os.chmod(run_copy, 0o600)
    link = tmp_path / "link.h5"
    link.symlink_to(run_copy.name)
    assert main(["train", "bandit", "--resume", str(link), "--agent-steps", "128", "--json"]) == 0
    capsys.readouterr()
    assert link.is_symlink() and os.readlink(link) == run_copy.name
    assert _step(run_copy) == 32 and stat.S_IMODE(os.stat(run_copy).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.h5", "run.h5"]  # nothing left beside it


def test_read_only_and_hard_linked_files_are_refused(run_copy, tmp_path, capsys):
    os.chmod(run_copy, 0o444)
    assert _train(run_copy, 64, "--overwrite") == 2
    assert "read-only" in _error_line(capsys)
    os.chmod(run_copy, 0o644)
    os.link(run_copy, tmp_path / "twin.h5")
    assert main(["train", "bandit", "--resume", str(run_copy), "--agent-steps", "128"]) == 2
    assert "hard links" in _error_line(capsys)
    assert _step(run_copy) == 16 and os.stat(run_copy).st_nlink == 2


def test_overwrite_replaces_only_regular_files(tmp_path, capsys):
    foreign = tmp_path / "notes.txt"
    foreign.write_text("mine")
    assert _train(foreign) == 2  # no --overwrite
    assert "exists" in _error_line(capsys) and foreign.read_text() == "mine"
    assert _train(foreign, 64, "--overwrite") == 0
    capsys.readouterr()
    assert read_run(foreign).complete
