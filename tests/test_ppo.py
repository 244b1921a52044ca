"""PPO through the one pipeline: ``popplay train ppo`` (options generated from
:class:`popplay.deep.agents.ppo_params.PPOParams`), exact resume by replaying each
copy's episode, ``evaluate``, ``plot``, ``--seeds``, and one-line refusals."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from popplay.checkpoints import runfile
from popplay.checkpoints.validation import load_run
from popplay.cli.main import main

# Constant schedules: a resumed run then learns exactly as an uninterrupted one (an
# annealed schedule stretches over each run's own --env-steps budget).
TINY = ["--copies", "4", "--n-steps", "16", "--n-epochs", "2", "--batch-size", "32", "--hidden", "8",
        "--lr-end", "0.001", "--clip-range-end", "0.2", "--eval-episodes", "2", "--seed", "3"]


def _json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_train_ppo_reports_quality_env_steps_and_seconds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.h5"
    assert main(["train", "ppo", *TINY, "--env-steps", "256", "--out", str(out), "--json"]) == 0
    summary = _json(capsys)
    assert summary["domain"] == "ppo" and summary["topology"] == "sequential"
    assert summary["env_steps"] == 256 and summary["seconds"] > 0 and summary["quality"] > 0
    stored = load_run(out)
    assert stored.complete and stored.config["n_epochs"] == 2 and stored.config["hidden"] == [8]
    assert stored.state_counters["updates"] == 4 * 2 * 2  # 4 rollouts x 2 epochs x 2 minibatches of 32


def test_a_resumed_run_is_bit_identical_to_an_uninterrupted_one(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    whole, split = tmp_path / "whole.h5", tmp_path / "split.h5"
    # 16-step rollouts on 4 copies: episodes run on across the resume (CartPole's last far longer)
    assert main(["train", "ppo", *TINY, "--env-steps", "640", "--out", str(whole), "--json"]) == 0
    assert main(["train", "ppo", *TINY, "--env-steps", "384", "--out", str(split), "--json"]) == 0
    capsys.readouterr()
    with h5py.File(split, "r") as f:
        assert f["state/copies.steps"][()].max() > 0  # the resume has a half-played episode to replay
    assert main(["train", "ppo", "--resume", str(split), "--env-steps", "640", "--json"]) == 0
    resumed = _json(capsys)
    a, b = load_run(whole), load_run(split)
    assert sorted(a.state) == sorted(b.state)
    for name in a.state:
        np.testing.assert_array_equal(a.state[name], b.state[name], err_msg=name)
    assert a.state_counters == b.state_counters
    np.testing.assert_array_equal(a.curves["return"], b.curves["return"])
    assert resumed["env_steps"] == 640


def test_resume_refuses_an_environment_that_does_not_replay(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.h5"
    assert main(["train", "ppo", *TINY, "--env-steps", "128", "--out", str(out)]) == 0
    with h5py.File(out, "r+") as f:  # as if the environment had drifted: another observation
        f["state/copies.obs"][0, 0] += 1.0
        f.attrs[runfile.DIGEST] = np.bytes_(runfile.content_digest(f).encode())
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(out), "--env-steps", "256"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "did not replay to the stored state" in errors[0]


def test_evaluate_and_plot_read_a_ppo_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.h5"
    assert main(["train", "ppo", *TINY, "--env-steps", "256", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(out), "--episodes", "3", "--json"]) == 0
    assert _json(capsys)["eval_episodes"] == 3
    assert main(["plot", str(out), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0


def test_seeds_report_mean_and_standard_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.h5"
    assert main(["train", "ppo", *TINY, "--env-steps", "128", "--seeds", "2", "--out", str(out), "--json"]) == 0
    summary = _json(capsys)
    assert summary["seeds"] == 2 and len(summary["quality_values"]) == 2 and "quality_sem" in summary
    assert (tmp_path / "s-seed3.h5").exists() and (tmp_path / "s-seed4.h5").exists()


@pytest.mark.parametrize("argv,message", [
    (["--clip-range", "-1", "--env-steps", "64"], "Error: --clip-range must be positive (got -1.0)"),
    (["--env", "Pendulum-v1", "--env-steps", "64"], "ppo needs discrete actions"),
    (["--eval-episodes", "0"], "a budget is needed"),
    (["--env-steps", "64", "--hidden", "8,x"], "--hidden"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                             message: str) -> None:
    assert main(["train", "ppo", *argv, "--out", str(tmp_path / "bad.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and message in err[0]
    assert not (tmp_path / "bad.h5").exists()


def test_train_ppo_runs_as_a_real_command(jobs, tmp_path: Path) -> None:
    summary = jobs.summary(jobs.start(["train", "ppo", *TINY, "--env-steps", "128", "--out", str(tmp_path / "c.h5"),
                                       "--json"]), timeout=120)
    assert summary["env_steps"] == 128


@pytest.mark.procs
def test_multi_learner_workflow_through_real_ranks(jobs, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """EXARL's multi-learner workflow: 2 data-parallel learners fed whole episodes by 2
    actors; every episode played is learned from once, and the learners stay identical."""
    out = tmp_path / "ml.h5"
    summary = jobs.summary(jobs.start(["train", "ppo", "--workflow", "multi-learner", "--learners", "2", "--actors",
                                       "2", "--episodes", "8", "--hidden", "8", "--n-epochs", "2", "--batch-size",
                                       "16", "--eval-episodes", "1", "--timeout", "60", "--out", str(out), "--json"]),
                           timeout=150)
    assert summary["backend"] == "gloo" and summary["ranks"] == 4 and summary["topology"] == "multi-learner"
    assert summary["topology_produced"] == summary["topology_reads"] == summary["episodes"] == 8
    assert summary["topology_produced_checksum"] == summary["topology_reads_checksum"]
    assert summary["topology_learners_identical"] == 1 and summary["updates"] > 0
    assert load_run(out).state_counters["received"] == summary["env_steps"] > 0
    assert main(["evaluate", str(out), "--episodes", "2", "--json"]) == 0  # in one process
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(out), "--episodes", "16"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "cannot be resumed" in errors[0]


@pytest.mark.procs
def test_the_other_workflows_through_real_ranks(jobs, tmp_path: Path) -> None:
    """master-learner (learner 0 hands out what the actors send it) and central-inference
    (one model acts for every actor and learns from each finished episode), side by side."""
    common = ["--episodes", "6", "--hidden", "8", "--n-epochs", "2", "--batch-size", "16", "--eval-episodes", "1",
              "--timeout", "60", "--json"]
    started = {name: jobs.start(["train", "ppo", "--workflow", name, *layout, *common,
                                 "--out", str(tmp_path / f"{name}.h5")])
               for name, layout in (("master-learner", ["--learners", "2", "--actors", "1"]),
                                    ("central-inference", ["--actors", "2"]))}
    summaries = {name: jobs.summary(process, timeout=150) for name, process in started.items()}
    master, central = summaries["master-learner"], summaries["central-inference"]
    for summary in (master, central):
        assert summary["topology_produced"] == summary["topology_reads"] == summary["episodes"] == 6
        assert summary["topology_produced_checksum"] == summary["topology_reads_checksum"]
    assert master["ranks"] == 3 and master["topology_learners_identical"] == 1 and master["updates"] > 0
    # central-inference: one PPO update (2 epochs of 16-row minibatches) per finished episode
    assert central["ranks"] == 3 and central["updates"] >= 6 * 2


def test_a_resume_runs_to_its_new_budget_and_refuses_one_already_reached(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.h5"
    assert main(["train", "ppo", *TINY, "--env-steps", "256", "--out", str(out)]) == 0
    done = load_run(out).state_counters["episodes"]
    # a budget in episodes now: the stored --env-steps 256 no longer cuts the run short
    assert main(["train", "ppo", "--resume", str(out), "--episodes", str(done + 3), "--json"]) == 0
    assert _json(capsys)["episodes"] >= done + 3
    assert main(["train", "ppo", "--resume", str(out), "--env-steps", "128"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "has already reached this budget" in errors[0]


def test_generated_commands_offer_no_shell_completion_and_config_keeps_nproc_for_populations(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from typer.testing import CliRunner

    from popplay.cli.main import app

    for domain in ("bandit", "ppo"):
        text = CliRunner().invoke(app, ["train", domain, "--help"], env={"COLUMNS": "200"}).output
        assert "--install-completion" not in text and "--show-completion" not in text
    config = tmp_path / "n.toml"
    config.write_text("nproc = 2\n")  # for the population commands; a deep run's ranks come from its layout
    assert main(["train", "ppo", *TINY, "--env-steps", "64", "--config", str(config), "--out",
                 str(tmp_path / "n.h5")]) == 0


@pytest.mark.procs
def test_a_workflow_that_diverges_stops(tmp_path: Path) -> None:
    out = tmp_path / "nan.h5"
    done = subprocess.run([sys.executable, "-m", "popplay", "train", "ppo", "--workflow", "multi-learner",
                           "--learners", "1", "--actors", "1", "--episodes", "200", "--hidden", "8", "--n-epochs", "1",
                           "--batch-size", "16", "--eval-episodes", "1", "--lr", "1e38", "--timeout", "60",
                           "--out", str(out), "--json"], capture_output=True, text=True, timeout=150)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "the agent diverged" in errors[0]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["episodes"] < 200 and summary["quality"] is None


def test_seeds_on_resume_get_their_own_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.h5"
    assert main(["train", "ppo", *TINY, "--env-steps", "64", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(out), "--env-steps", "128", "--seeds", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["Error: --seeds: resume each seed's run file on its own"]
