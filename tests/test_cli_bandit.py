"""`popplay train bandit` and `popplay evaluate` as a user meets them."""
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

from popplay.cli.main import main
from popplay.core.backend import cuda_available

SMALL = ["train", "bandit", "--arms", "10", "--agents", "8", "--trials", "32", "--agent-steps", "512",
         "--share-every", "16"]


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_train_json_evaluate_round_trip(tmp_path, capsys):
    out = tmp_path / "run.h5"
    code, stdout, _ = _run(capsys, SMALL + ["--out", str(out), "--json", "--seed", "4"])
    assert code == 0
    summary = json.loads(stdout.strip().splitlines()[-1])
    for key in ("quality", "agent_steps", "seconds", "agent_steps_per_second", "backend", "device", "out"):
        assert key in summary
    assert summary["agent_steps"] == 512 * 32  # every agent-step of every trial
    # auto: numba on the CPU, or the torch engine where a GPU is present
    expected = ("torch", "cuda") if cuda_available() else ("numba", "cpu")
    assert (summary["backend"], summary["device"]) == expected
    assert summary["compile"] is cuda_available()  # compiled by default only on CUDA
    assert summary["agent_steps_per_second"] == pytest.approx(summary["agent_steps"] / summary["seconds"])
    code, stdout, _ = _run(capsys, ["evaluate", str(out), "--json"])
    assert code == 0
    evaluated = json.loads(stdout.strip().splitlines()[-1])
    assert evaluated["quality"] == summary["quality"]
    # A 95% Wilson interval over the 32 trials around the rate, and its standard error.
    low, high = evaluated["quality_ci95"]
    assert low <= evaluated["quality"] <= high and high - low > 0.01
    assert 0.0 <= low and high <= 1.0 and "Wilson" in evaluated["quality_ci_method"]
    assert evaluated["quality_se"] == pytest.approx(np.sqrt(summary["quality"] * (1 - summary["quality"]) / 31),
                                                    rel=0.2)
    with h5py.File(out) as f:
        assert f.attrs["domain"].decode() == "bandit" and f["config"].attrs["agents"] == 8
        assert f["curves/quality"].shape == f["curves/seconds"].shape == (4,)
        assert f["results/correct"].shape == (32,)
        assert np.mean(f["results/correct"][()]) == summary["quality"]


def test_compile_defaults_to_on_only_where_the_torch_engine_runs_on_cuda(monkeypatch):
    from popplay.core import backend as backends

    monkeypatch.setattr(backends, "cuda_available", lambda: True)  # a GPU, as far as the choice goes
    assert backends.resolve_backend("auto", "auto") == backends.Backend("torch", "cuda", True)
    assert backends.resolve_backend("torch", "cuda", compile=False).compile is False
    assert backends.resolve_backend("torch", "cpu") == backends.Backend("torch", "cpu", False)
    assert backends.resolve_backend("numba", "auto") == backends.Backend("numba", "cpu", False)
    assert backends.resolve_backend("auto", "cpu", compile=True) == backends.Backend("torch", "cpu", True)
    monkeypatch.setattr(backends, "cuda_available", lambda: False)
    assert backends.resolve_backend("auto", "auto") == backends.Backend("numba", "cpu", False)


def test_torch_backend_gives_the_same_run_as_numba(tmp_path, capsys):
    results = []
    for backend in ("numba", "torch"):
        out = tmp_path / f"{backend}.h5"
        assert main(SMALL + ["--backend", backend, "--out", str(out), "--json"]) == 0
        with h5py.File(out) as f:
            results.append(f["state/q"][()])
    capsys.readouterr()
    assert np.array_equal(results[0], results[1])


def test_plain_progress_lines_without_a_terminal(tmp_path, capsys):
    code, stdout, stderr = _run(capsys, SMALL + ["--out", str(tmp_path / "r.h5")])
    assert code == 0
    assert "\x1b[" not in stdout + stderr
    assert "quality=" in stderr and "agent-steps/s" in stderr  # progress: stderr
    assert "quality=" not in stdout and stdout.startswith("bandit: quality")  # results: stdout
    assert "wrote" in stdout.splitlines()[-1]


@pytest.mark.parametrize("extra, fragment", [
    (["--agents", "0"], "--agents"),
    (["--epsilon", "1.5"], "--epsilon"),
    (["--arms", "1"], "--arms"),
    (["--share-every", "0"], "--share-every"),
    (["--agent-steps", "4"], "--agent-steps"),
    (["--backend", "jax"], "--backend"),
    (["--differentiation", "sideways"], "--differentiation"),
    (["--time-budget", "-1"], "--time-budget"),
])
def test_bad_options_are_one_line_usage_errors(tmp_path, capsys, extra, fragment):
    out = tmp_path / "r.h5"
    code, stdout, stderr = _run(capsys, SMALL + ["--out", str(out)] + extra)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error") and fragment in lines[0]
    assert "Traceback" not in stderr
    assert not out.exists()


@pytest.mark.skipif(cuda_available(), reason="a GPU is present")
def test_cuda_without_gpu_is_a_usage_error(tmp_path, capsys):
    code, _, stderr = _run(capsys, SMALL + ["--device", "cuda", "--out", str(tmp_path / "r.h5")])
    assert code == 2 and "--device cuda" in stderr and "GPU" in stderr


def test_unwritable_or_existing_out_is_refused_before_learning(tmp_path, capsys):
    code, _, stderr = _run(capsys, SMALL + ["--out", str(tmp_path / "missing" / "r.h5")])
    assert code == 2 and "does not exist" in stderr
    code, _, stderr = _run(capsys, SMALL + ["--out", str(tmp_path)])
    assert code == 2 and "--out" in stderr
    existing = tmp_path / "keep.h5"
    existing.write_bytes(b"precious")
    code, _, stderr = _run(capsys, SMALL + ["--out", str(existing)])
    assert code == 2 and "--overwrite" in stderr
    assert existing.read_bytes() == b"precious"
    assert main(SMALL + ["--out", str(existing), "--overwrite"]) == 0
    assert h5py.is_hdf5(existing)


@pytest.mark.parametrize("content, fragment", [
    (None, "no such file"), (b"", "empty"), (b"not hdf5 at all" * 10, "not an HDF5"),
])
def test_evaluate_refuses_missing_or_foreign_files(tmp_path, capsys, content, fragment):
    path = tmp_path / "x.h5"
    if content is not None:
        path.write_bytes(content)
    code, _, stderr = _run(capsys, ["evaluate", str(path)])
    assert code == 2 and fragment in stderr and len(stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, fragment", [
    (["--help"], "train"), (["train", "--help"], "bandit"),
    (["train", "bandit", "--help"], "--differentiation"), (["evaluate", "--help"], "RUN"),
])
def test_every_command_has_help(argv, fragment):
    from typer.testing import CliRunner

    from popplay.cli.main import app

    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 0 and fragment in result.output


def test_real_subprocess_reports_errors_without_traceback(tmp_path):
    ok = subprocess.run(["popplay", *SMALL, "--out", str(tmp_path / "r.h5"), "--json"],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1])["domain"] == "bandit"
    bad = subprocess.run(["popplay", *SMALL, "--epsilon", "2", "--out", str(tmp_path / "b.h5")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.startswith("Error") and "Traceback" not in bad.stderr
    assert sys.executable  # the console script runs in this interpreter's environment
