"""`train --log-dir` (CSV and TensorBoard scalars) and `popplay export RUN.h5 --csv`."""
import csv
import subprocess
import sys

import h5py
import numpy as np

from popplay.checkpoints.scalars import CSV_NAME, ScalarLog
from popplay.cli.main import main

BANDIT = ["train", "bandit", "--arms", "10", "--agents", "8", "--trials", "16", "--agent-steps", "512",
          "--share-every", "16", "--seed", "2"]


def _rows(path):
    with open(path, newline="") as handle:
        return list(csv.reader(handle))


def _curves(run):
    with h5py.File(run) as f:
        return {name: f["curves"][name][()] for name in f["curves"]}


def _check_csv(path, run):
    rows = _rows(path)
    curves = _curves(run)
    assert rows[0][:2] == ["agent_steps", "seconds"] and set(rows[0]) == set(curves)
    assert len(rows) == 1 + len(curves["agent_steps"])
    for column, name in enumerate(rows[0]):
        np.testing.assert_array_equal(np.array([float(r[column]) for r in rows[1:]]), curves[name])


def test_log_dir_writes_the_curves_as_csv_and_tensorboard_scalars(tmp_path, capsys):
    run, logs = tmp_path / "run.h5", tmp_path / "logs" / "bandit"
    assert main([*BANDIT, "--out", str(run), "--log-dir", str(logs), "--json"]) == 0
    _check_csv(logs / "curves.csv", run)
    events = list(logs.glob("events.out.tfevents.*"))
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        assert not events and "pip install" in capsys.readouterr().err
        return
    assert len(events) == 1
    accumulator = EventAccumulator(str(logs))
    accumulator.Reload()
    scalars = accumulator.Scalars("quality")
    curves = _curves(run)
    assert [s.step for s in scalars] == curves["agent_steps"].tolist()
    np.testing.assert_allclose([s.value for s in scalars], curves["quality"], rtol=1e-6)


def test_without_tensorboard_the_csv_is_written_and_one_line_names_the_extra(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m.startswith("tensorboard.")] + ["tensorboard"]:
        monkeypatch.setitem(sys.modules, name, None)
    run, logs = tmp_path / "run.h5", tmp_path / "logs"
    assert main([*BANDIT, "--out", str(run), "--log-dir", str(logs), "--json"]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "tensorboard package" in line]  # (the test's path names it too)
    assert len(notes) == 1 and 'pip install "popplay[tensorboard]"' in notes[0]
    assert not list(logs.glob("events.out.tfevents.*"))
    _check_csv(logs / "curves.csv", run)


def test_export_csv_of_an_existing_run(tmp_path, capsys):
    run = tmp_path / "run.h5"
    assert main([*BANDIT, "--out", str(run), "--json"]) == 0
    capsys.readouterr()
    assert main(["export", str(run), "--csv"]) == 0
    assert "wrote 4 curve points" in capsys.readouterr().out
    _check_csv(run.with_suffix(".csv"), run)
    target = tmp_path / "new" / "curves.csv"
    assert main(["export", str(run), "--csv", "--out", str(target)]) == 0
    _check_csv(target, run)
    capsys.readouterr()
    assert main(["export", str(run), "--csv", "--out", "-"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == ",".join(_rows(target)[0])
    assert main(["export", str(run), "--out", "-"]) == 0  # CSV is the default: no format to name
    assert capsys.readouterr().out.splitlines()[0] == ",".join(_rows(target)[0])
    assert main(["export", str(tmp_path / "missing.h5"), "--csv"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ")


def test_export_in_a_real_process(tmp_path, capsys):
    run = tmp_path / "run.h5"
    assert main([*BANDIT, "--out", str(run), "--json"]) == 0
    done = subprocess.run([sys.executable, "-m", "popplay", "export", str(run), "--csv", "--out", "-"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("agent_steps,seconds,quality")
    assert len(done.stdout.strip().splitlines()) == 5 and done.stderr == ""


def _targets(tmp_path):
    """What no CSV may be written through: another run file (directly or by a symlink) and a FIFO."""
    import os
    import shutil

    victim = tmp_path / "victim.h5"
    assert main([*BANDIT, "--agent-steps", "64", "--agents", "4", "--out", str(victim)]) == 0
    kept = victim.read_bytes()
    link = tmp_path / "link.csv"
    link.symlink_to(victim)
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    return victim, kept, {"run file": victim, "symlink to a run file": link, "fifo": fifo}, shutil


def test_export_never_writes_through_a_run_file_a_symlink_or_a_fifo(tmp_path, capsys):
    victim, kept, targets, _ = _targets(tmp_path)
    source = tmp_path / "source.h5"
    assert main([*BANDIT, "--agent-steps", "64", "--agents", "4", "--out", str(source)]) == 0
    capsys.readouterr()
    for name, target in targets.items():
        assert main(["export", str(source), "--csv", "--out", str(target)]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "refused" in err[0], (name, err)
    assert victim.read_bytes() == kept


def test_log_dir_never_writes_through_a_run_file_or_a_fifo(tmp_path, capsys):
    victim, kept, targets, shutil = _targets(tmp_path)
    for name in ("symlink to a run file", "fifo"):
        logs = tmp_path / f"logs-{name.split()[0]}"
        logs.mkdir()
        shutil.move(str(targets[name]), logs / "curves.csv")
        capsys.readouterr()
        assert main([*BANDIT, "--out", str(tmp_path / "r.h5"), "--overwrite", "--log-dir", str(logs)]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--log-dir" in err[0] and "refused" in err[0], (name, err)
        assert not (tmp_path / "r.h5").exists()
    assert victim.read_bytes() == kept


def test_a_log_that_goes_bad_mid_run_stops_logging_and_says_so_once(tmp_path):
    """What the pipeline and Gorila do when --log-dir breaks during a run: the log stops,
    the run goes on, the user is told once."""
    log = ScalarLog(tmp_path, tensorboard=False)
    assert log.follow([1], [0.5], {"return": [2.0]}) is None
    (tmp_path / CSV_NAME).unlink()
    (tmp_path / CSV_NAME).mkdir()  # the CSV can no longer be written
    message = log.follow([1, 2], [0.5, 1.0], {"return": [2.0, 3.0]})
    assert message is not None and message.startswith("--log-dir: stopped logging (")
    assert log.follow([1, 2, 3], [0.5, 1.0, 1.5], {"return": [2.0, 3.0, 4.0]}) is None
