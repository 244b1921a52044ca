"""``popplay train cartpole`` and ``popplay evaluate`` on cart-pole run files."""
from __future__ import annotations

import dataclasses
import inspect
import json
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from popplay.cli.main import app, main
from popplay.games.cartpole.rules import CartPolePopulationParams

SMALL = ["--agents", "4", "--trials", "3", "--agent-steps", "256", "--share-every", "16", "--test-steps", "300",
         "--seed", "3"]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _json(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_train_writes_a_run_file_and_evaluate_reproduces_its_quality(tmp_path, capsys):
    out = tmp_path / "cp.h5"
    assert main(["train", "cartpole", *SMALL, "--bias", "0.01", "--bias-decay", "2", "--out", str(out),
                 "--json"]) == 0
    summary = _json(capsys)
    for key in ("quality", "balanced", "agent_steps", "seconds", "agent_steps_per_second", "backend", "device",
                "out", "phases", "complete"):
        assert key in summary, key
    assert summary["agent_steps"] == 256 * 3 and summary["agent_steps_per_trial"] == 256
    assert summary["phases"] == 4 and summary["backend"] == "numba" and summary["complete"]
    assert 0 < summary["quality"] <= 300
    with h5py.File(out, "r") as f:
        assert _text(f.attrs["domain"]) == "cartpole"
        # Per-agent Q and weights are what a share makes them: not stored (docs/cartpole.md).
        assert "q" not in f["state"] and "weight" not in f["state"] and f["state/q_rows"].shape == (0, 4, 72)
        assert f["state/trace_codes"].shape == (3, 4, 72) and f["state/cart"].shape == (3, 4, 4)
        assert f["state/action"].shape == (3, 4) and f["state/shared"].shape == (3, 72)
        assert f["state"].attrs["step"] == 64 and f["state"].attrs["shares"] == 4
        assert f["state"].attrs["max_bias"] == 0.01 / 16
        assert _text(f["config"].attrs["algorithm"]) == "sarsa" and f["config"].attrs["steps_per_agent"] == 64
        assert list(f["curves/agent_steps"][()]) == [64, 128, 192, 256]
        assert f["curves/quality"][-1] == summary["quality"]
        assert f["results/balanced_steps"].shape == (3,)
        assert f["environment/physics"].shape == (13,)
    assert main(["evaluate", str(out), "--json"]) == 0
    evaluated = _json(capsys)
    assert evaluated["domain"] == "cartpole" and evaluated["quality"] == summary["quality"]
    assert evaluated["agent_steps"] == summary["agent_steps"]


def test_torch_backend_learns_the_same_population(tmp_path, capsys):
    results = {}
    for backend in ("numba", "torch"):
        out = tmp_path / f"{backend}.h5"
        assert main(["train", "cartpole", *SMALL, "--algorithm", "q", "--trace", "accumulating", "--alpha",
                     "0.2", "--backend", backend, "--out", str(out), "--json"]) == 0
        results[backend] = _json(capsys)
        with h5py.File(out, "r") as f:
            results[backend]["q"] = f["state/q_rows"][()]
            results[backend]["shared"] = f["state/shared"][()]
            results[backend]["trace"] = f["state/trace_values"][()][f["state/trace_codes"][()]]
    assert results["torch"]["backend"] == "torch"
    assert results["torch"]["quality"] == results["numba"]["quality"]
    for name in ("q", "shared", "trace"):
        np.testing.assert_array_equal(results["torch"][name], results["numba"][name])


def test_plain_console_output_without_json(tmp_path):
    result = CliRunner().invoke(app, ["train", "cartpole", *SMALL, "--out", str(tmp_path / "p.h5")])
    assert result.exit_code == 0, result.output
    assert "cartpole: quality" in result.output and "agent-steps/s" in result.output


@pytest.mark.parametrize("args, needle", [
    (["--lam", "1.5"], "--lam"),
    (["--gamma", "-0.1"], "--gamma"),
    (["--epsilon", "2"], "--epsilon"),
    (["--algorithm", "td"], "--algorithm"),
    (["--trace", "dutch"], "--trace"),
    (["--agents", "-1"], "--agents"),
    (["--trials", "0"], "--trials"),
    (["--share-every", "0"], "--share-every"),
    (["--test-steps", "-5"], "--test-steps"),
    (["--agents", "100", "--agent-steps", "10"], "--agent-steps"),
    (["--alpha", "0"], "--alpha"),
    (["--failure-reward", "0"], "--failure-reward"),
    (["--angle-boundary", "20"], "--angle-boundary"),
    (["--position-boundary", "3"], "--position-boundary"),
    (["--bias", "-1"], "--bias"),
    (["--bias-decay", "0.5"], "--bias-decay"),
    (["--backend", "jax"], "--backend"),
])
def test_bad_values_give_one_line_and_exit_2(tmp_path, capsys, args, needle):
    out = tmp_path / "bad.h5"
    assert main(["train", "cartpole", *SMALL, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error:") and needle in err[0], err
    assert not out.exists()


def test_cli_defaults_are_the_parameter_defaults():
    from popplay.cli.train_plugin import build_command

    defaults = CartPolePopulationParams()
    names = {"angle_boundary": "angle_boundary_degrees"}
    signature = inspect.signature(build_command("cartpole"))
    fields = {f.name for f in dataclasses.fields(CartPolePopulationParams)}
    checked = 0
    for name, parameter in signature.parameters.items():
        field = names.get(name, name)
        value = parameter.default
        value = getattr(value, "value", value)
        if field in fields:
            assert value == getattr(defaults, field), name
            checked += 1
    assert checked >= 20
    assert signature.parameters["agent_steps"].default == defaults.agents * defaults.steps_per_agent


def test_help_lists_the_issue_options():
    result = CliRunner().invoke(app, ["train", "cartpole", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in ("--agents", "--trials", "--agent-steps", "--share-every", "--alpha", "--gamma", "--lam",
                   "--epsilon", "--trace", "--algorithm", "--bias", "--bias-decay", "--test-steps",
                   "--time-budget", "--seed", "--backend", "--device", "--out", "--json", "--replicate-every",
                   "--replicate-fraction", "--mutate-q", "--mutate-params"):
        assert option in result.output, option


@pytest.mark.skipif(shutil.which("popplay") is None, reason="the popplay console script is not installed")
def test_console_script_in_a_real_subprocess(tmp_path):
    out = tmp_path / "sub.h5"
    done = subprocess.run(["popplay", "train", "cartpole", *SMALL, "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["domain"] == "cartpole" and out.exists()
    bad = subprocess.run(["popplay", "train", "cartpole", "--lam", "2", "--out", str(tmp_path / "x.h5")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Error" in bad.stderr and "Traceback" not in bad.stderr
    assert sys.executable  # the same interpreter family runs the script


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, capsys):
    half, whole = tmp_path / "half.h5", tmp_path / "whole.h5"
    assert main(["train", "cartpole", *SMALL[:4], "--agent-steps", "128", *SMALL[6:], "--out", str(half),
                 "--checkpoint-every", "64", "--json"]) == 0
    assert main(["train", "cartpole", "--resume", str(half), "--agent-steps", "256", "--json"]) == 0
    assert main(["train", "cartpole", *SMALL, "--out", str(whole), "--json"]) == 0
    capsys.readouterr()
    with h5py.File(half, "r") as a, h5py.File(whole, "r") as b:
        assert set(a["state"]) == set(b["state"]) and {"q_rows", "trace_codes", "cart"} <= set(a["state"])
        for name in [f"state/{key}" for key in a["state"]] + ["curves/agent_steps", "curves/quality"]:
            np.testing.assert_array_equal(a[name][()], b[name][()], err_msg=name)
        assert a["state"].attrs["max_bias"] == b["state"].attrs["max_bias"]
    assert main(["train", "cartpole", "--resume", str(half), "--alpha", "0.1"]) == 2
    assert "settings come from" in capsys.readouterr().err
