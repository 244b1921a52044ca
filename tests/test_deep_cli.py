"""`popplay train dqn|reinforce` and `popplay evaluate` in one process (CliRunner)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from popplay.cli import _register, app, main
from popplay.checkpoints.runfile import read_run

_register()
TINY = ["--hidden", "16", "--learning-starts", "16", "--update-ratio", "1", "--batch-size", "8",
        "--target-every", "5", "--epsilon-updates", "50"]
KEYS = {"quality", "env_steps", "episodes", "seconds", "backend", "device", "out"}


def _run(args: list[str]) -> dict:
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_train_dqn_sequential_then_evaluate(tmp_path: Path) -> None:
    out = tmp_path / "dqn.h5"
    summary = _run(["train", "dqn", "--episodes", "6", "--eval-episodes", "3", "--out", str(out), "--json", *TINY])
    assert KEYS <= summary.keys()
    assert summary["episodes"] == 6 and summary["env_steps"] > 6 and summary["backend"] == "none"
    assert summary["updates"] > 0 and summary["quality"] >= 8  # CartPole lasts at least 8 steps
    stored = read_run(out)
    assert stored.domain == "dqn" and stored.complete
    assert stored.state["episode_returns"].shape == (6,)
    assert int(stored.state["replay.obs"].shape[0]) == summary["env_steps"]  # replay kept whole
    evaluated = _run(["evaluate", str(out), "--episodes", "3", "--json"])
    assert KEYS <= evaluated.keys()
    assert evaluated["quality"] == pytest.approx(summary["quality"])  # same greedy episodes
    assert evaluated["episodes"] == 6 and evaluated["env_steps"] == summary["env_steps"]


def test_dqn_resume_is_exact(tmp_path: Path) -> None:
    straight, split = tmp_path / "straight.h5", tmp_path / "split.h5"
    common = ["--eval-episodes", "0", "--json", *TINY]
    _run(["train", "dqn", "--episodes", "8", "--out", str(straight), *common])
    _run(["train", "dqn", "--episodes", "4", "--out", str(split), *common])
    resumed = _run(["train", "dqn", "--resume", str(split), "--episodes", "8", "--json"])
    assert resumed["episodes"] == 8
    a, b = read_run(straight).state, read_run(split).state
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_reinforce_local_reports_running_reward(tmp_path: Path) -> None:
    summary = _run(["train", "reinforce", "--topology", "local", "--workers", "2", "--episodes", "3",
                    "--hidden", "8", "--eval-episodes", "2", "--out", str(tmp_path / "r.h5"), "--json"])
    assert KEYS <= summary.keys() and "running_reward" in summary
    assert summary["episodes"] == 6 and summary["updates"] == 3 and summary["running_reward"] > 0


def test_bad_env_id_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "dqn", "--env", "CartPol-v1", "--episodes", "1", "--out", str(tmp_path / "x.h5")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("Error: --env CartPol-v1")
    code = main(["train", "dqn", "--env", "Pendulum-v1", "--episodes", "1", "--out", str(tmp_path / "x.h5")])
    err = capsys.readouterr().err
    assert code == 2 and "discrete" in err and err.count("\n") == 1
    assert not (tmp_path / "x.h5").exists()


def test_missing_extra_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gymnasium")
    try:
        import Box2D  # noqa: F401
        pytest.skip("box2d is installed here")
    except ImportError:
        pass
    code = main(["train", "dqn", "--env", "LunarLander-v3", "--episodes", "1", "--out", str(tmp_path / "x.h5")])
    err = capsys.readouterr().err
    assert code == 2 and err == "Error: --env LunarLander-v3 needs an extra that is not installed: " \
                                "pip install 'popplay[box2d]'\n"


def test_resume_refuses_new_settings_and_needs_a_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.h5"
    _run(["train", "dqn", "--episodes", "2", "--eval-episodes", "0", "--out", str(out), "--json", *TINY])
    assert main(["train", "dqn", "--resume", str(out), "--episodes", "4", "--lr", "0.1"]) == 2
    assert "--lr: settings come from" in capsys.readouterr().err
    assert main(["train", "dqn", "--resume", str(out)]) == 2
    assert "needs a new budget" in capsys.readouterr().err
    assert main(["train", "reinforce", "--resume", str(out), "--episodes", "3"]) == 2
    assert "a dqn run, not a reinforce run" in capsys.readouterr().err


def test_multi_rank_launch_honours_overwrite(tmp_path, monkeypatch):
    """An existing --out is replaced with --overwrite (and refused without it) before ranks start."""
    import typer

    from popplay.cli import train_dqn
    from popplay.cli.common import CommandError
    from popplay.topologies import launch as launching

    started = []
    monkeypatch.setattr(launching, "launch", lambda *args, **kwargs: started.append(kwargs["overwrite"]) or 0)
    out = tmp_path / "run.h5"
    out.write_bytes(b"an old run")
    with pytest.raises(CommandError, match="file exists"):
        train_dqn._launch("dqn", object(), out, False, True, None, None)
    assert started == []
    try:
        train_dqn._launch("dqn", object(), out, True, True, None, None)
    except typer.Exit as stop:  # pragma: no cover - a zero exit code is returned, not raised
        assert stop.exit_code == 0
    assert started == [True]


def test_progress_is_counted_in_the_budget_s_own_unit(tmp_path, capsys):
    """Deep runs count episodes or env-steps, not agent-steps per trial."""
    from popplay.cli import main

    assert main(["train", "dqn", "--episodes", "3", "--eval-episodes", "0", "--out", str(tmp_path / "e.h5")]) == 0
    err = capsys.readouterr().err
    assert "episodes 3/3" in err and "steps/trial" not in err
    assert main(["train", "dqn", "--env-steps", "60", "--eval-episodes", "0", "--out", str(tmp_path / "s.h5")]) == 0
    err = capsys.readouterr().err
    assert "env-steps 60/60" in err or "env-steps" in err.split("100.0%")[-1], err
