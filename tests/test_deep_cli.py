"""`popplay train dqn|reinforce` and `popplay evaluate` in one process (CliRunner)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from popplay.checkpoints.validation import load_run
from popplay.cli.main import app, main
from tests._dist_helpers import popplay

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
    stored = load_run(out)
    assert stored.domain == "dqn" and stored.complete
    assert stored.state["episode_returns"].shape == (6,)
    assert int(stored.state["replay.obs"].shape[0]) == summary["env_steps"]  # replay kept whole
    evaluated = _run(["evaluate", str(out), "--episodes", "3", "--json"])
    assert KEYS <= evaluated.keys()
    assert evaluated["quality"] == pytest.approx(summary["quality"])  # same greedy episodes
    assert evaluated["episodes"] == 6 and evaluated["env_steps"] == summary["env_steps"]


@pytest.mark.parametrize("schedule", [[], ["--train-every", "7"]], ids=["after-episodes", "every-7-steps"])
def test_dqn_resume_is_exact(tmp_path: Path, schedule: list[str]) -> None:
    straight, split = tmp_path / "straight.h5", tmp_path / "split.h5"
    common = ["--eval-episodes", "0", "--json", *TINY, *schedule]
    _run(["train", "dqn", "--episodes", "8", "--out", str(straight), *common])
    _run(["train", "dqn", "--episodes", "4", "--out", str(split), *common])
    resumed = _run(["train", "dqn", "--resume", str(split), "--episodes", "8", "--json"])
    assert resumed["episodes"] == 8
    a, b = load_run(straight).state, load_run(split).state
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_a_run_saved_before_its_first_update_resumes(tmp_path: Path) -> None:
    """Its loss is not measured yet (NaN): the file must not read as damaged."""
    out = tmp_path / "early.h5"
    first = _run(["train", "dqn", "--episodes", "2", "--eval-episodes", "0", "--hidden", "16", "--out", str(out),
                  "--json"])
    assert first["updates"] == 0  # fewer transitions than --learning-starts (1000)
    assert "last_loss" not in load_run(out).state_counters
    resumed = _run(["train", "dqn", "--resume", str(out), "--episodes", "4", "--json"])
    assert resumed["episodes"] == 4 and resumed["updates"] == 0


def test_dqn_trains_every_k_env_steps_mid_episode_too() -> None:
    """--train-every K: the owed updates run whenever the run's env-step count reaches a
    multiple of K (SB3's train_freq), not at episode ends."""
    from popplay.deep.topologies.dqn import DQNExperiment, DQNParams

    params = DQNParams(env_steps=200, hidden=(8,), learning_starts=0, update_ratio=0.5, train_every=8, batch_size=4,
                       eval_episodes=0)
    experiment = DQNExperiment(params, backend=None)
    state = experiment.initial_state()
    trained_at: list[tuple[int, int]] = []  # (env-steps, updates) after each training
    train = state.agent.train
    state.agent.train = lambda: trained_at.append((state.env_steps, state.agent.updates + train()))
    while not experiment.finished(state, time_mode=False):
        experiment.phase(state, time_left=None)
    steps = state.env_steps
    assert steps >= 200 and state.episodes > 1
    assert [s for s, _ in trained_at] == list(range(8, steps + 1, 8))
    assert [u for _, u in trained_at] == [s // 2 for s in range(8, steps + 1, 8)]  # 4 updates per 8 steps
    assert state.agent.updates == 4 * (steps // 8) and state.agent.replay.added == steps
    assert any(s not in np.cumsum(state.lengths) for s, _ in trained_at)  # mid-episode
    assert int(np.sum(state.lengths)) == steps and len(state.returns) == state.episodes


def test_train_every_is_for_the_sequential_topology_only() -> None:
    from popplay.deep.topologies.dqn import DQNParams

    with pytest.raises(ValueError, match="train_every"):
        DQNParams(env_steps=100, topology="collective", simulators=2, train_every=4).validate()
    with pytest.raises(ValueError, match="train_every"):
        DQNParams(env_steps=100, train_every=-1).validate()


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


def test_a_bad_choice_is_one_plain_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """typer's own wording of a choice outside the list, less its "Value error," prefix."""
    code = main(["train", "dqn", "--topology", "foo", "--episodes", "1", "--out", str(tmp_path / "x.h5")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Value error" not in err, err
    assert err.startswith("Error: Invalid value for '--topology': 'foo' is not one of 'sequential'"), err
    assert not (tmp_path / "x.h5").exists()


def test_device_cuda_is_one_line_where_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from popplay.core.backend import cuda_available

    out = tmp_path / "x.h5"
    code = main(["train", "reinforce", "--device", "cuda", "--episodes", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err == "Error: --device cuda: reinforce runs on the CPU in this version (on a GPU: dqn)\n"
    if not cuda_available():
        code = main(["train", "dqn", "--device", "cuda", "--episodes", "1", "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and err == "Error: --device cuda: no CUDA GPU is available on this machine\n"
    assert not out.exists()
    # auto: the CPU for the deep agents, said in the summary
    summary = _run(["train", "dqn", "--device", "auto", "--episodes", "2", "--eval-episodes", "0",
                    "--out", str(out), "--json", *TINY])
    assert summary["device"] == "cpu"


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


def test_a_stopped_run_resumed_without_a_budget_goes_on_to_its_own(tmp_path, monkeypatch, capsys) -> None:
    from contextlib import contextmanager

    import h5py

    from popplay.training import job

    calls = []

    @contextmanager
    def stop_at_once():  # a Ctrl-C in the first phase
        yield lambda: calls.append(1) or len(calls) > 1

    out, whole = tmp_path / "s.h5", tmp_path / "w.h5"
    args = ["train", "dqn", "--agents", "2", "--env-steps", "600", "--phase-steps", "100", "--eval-episodes", "0",
            *TINY]
    with monkeypatch.context() as patch:
        patch.setattr(job, "stop_on_signals", stop_at_once)
        assert main([*args, "--out", str(out)]) == 130
    assert not load_run(out).complete
    capsys.readouterr()
    assert main(["train", "dqn", "--resume", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["env_steps"] == 600
    assert main([*args, "--out", str(whole)]) == 0
    with h5py.File(out) as a, h5py.File(whole) as b:
        np.testing.assert_array_equal(a["state"]["members.online"][()], b["state"]["members.online"][()])


def test_multi_rank_launch_honours_overwrite_and_hands_ranks_the_command_line(tmp_path, monkeypatch, capsys):
    """An existing --out is refused without --overwrite before any rank starts; the ranks
    run the very command line given (so they learn its device, budget and options)."""
    from popplay.cli.main import main
    from popplay.training import job

    started = []
    monkeypatch.setattr(job, "launch_local", lambda argv, world, **kwargs: started.append((argv, world)) or 0)
    out = tmp_path / "run.h5"
    out.write_bytes(b"an old run")
    argv = ["train", "dqn", "--topology", "collective", "--simulators", "2", "--episodes", "4", "--device", "cpu",
            "--out", str(out)]
    assert main(argv) == 2
    assert "file exists" in capsys.readouterr().err and started == []
    assert main([*argv, "--overwrite"]) == 0
    assert len(started) == 1
    ranks_argv, world = started[0]
    assert world == 3 and ranks_argv[ranks_argv.index("--device") + 1] == "cpu" and "--overwrite" in ranks_argv
    assert ranks_argv[ranks_argv.index("--out") + 1] == str(out)


def test_progress_is_counted_in_the_budget_s_own_unit(tmp_path, capsys):
    """Deep runs count episodes or env-steps, not agent-steps per trial."""
    from popplay.cli.main import main

    assert main(["train", "dqn", "--episodes", "3", "--eval-episodes", "0", "--out", str(tmp_path / "e.h5")]) == 0
    err = capsys.readouterr().err
    assert "episodes 3/3" in err and "steps/trial" not in err
    assert main(["train", "dqn", "--env-steps", "60", "--eval-episodes", "0", "--out", str(tmp_path / "s.h5")]) == 0
    err = capsys.readouterr().err
    assert "env-steps 60/60" in err or "env-steps" in err.split("100.0%")[-1], err


def test_a_deep_resume_locks_the_run_file_before_it_reads_it(tmp_path, capsys, monkeypatch):
    """Two resumes of one file: the second is refused before it reads a state the first
    is about to replace (it used to read, train, and write over the first's episodes)."""
    from popplay.checkpoints.lock import RunLock
    from popplay.cli import train as train_cli
    from popplay.cli.main import main

    out = tmp_path / "r.h5"
    assert main(["train", "dqn", "--episodes", "3", "--hidden", "8", "--eval-episodes", "0", "--out", str(out)]) == 0
    before = out.read_bytes()
    reads = []
    real_load = train_cli.load_run
    monkeypatch.setattr(train_cli, "load_run", lambda *a, **k: reads.append(a) or real_load(*a, **k))
    capsys.readouterr()
    with RunLock(out):  # another process's resume, mid-run
        assert main(["train", "dqn", "--resume", str(out), "--episodes", "6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"Error: {out}: another popplay process is writing this run file"]
    assert reads == [] and out.read_bytes() == before
    assert main(["train", "dqn", "--resume", str(out), "--episodes", "6", "--json"]) == 0  # once it is free
    assert len(reads) == 1 and load_run(out).state_counters["episodes"] == 6


def test_a_diverged_deep_run_is_flagged_saved_readable_and_not_resumed(tmp_path, capsys):
    """--lr 1e30 used to exit 0 with a "complete" file that no reader would then take."""
    from popplay.cli.main import main

    out = tmp_path / "nan.h5"
    assert main(["train", "dqn", "--episodes", "60", "--lr", "1e30", "--hidden", "8", "--eval-episodes", "1",
                 "--out", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    errors = [line for line in err if line.startswith("Error")]
    assert len(errors) == 1 and "the agent diverged" in errors[0] and str(out) in errors[0]
    assert sum("the agent diverged" in line for line in err) == 1  # said once, not also as a warning
    stored = load_run(out)  # whole and readable: what it learned, and where it went wrong
    phase = stored.state_counters["diverged_phase"]
    assert any("diverged" in event for event in json.loads(stored.result_attrs["events_json"]))
    assert stored.state_counters["episodes"] == phase < 60
    assert main(["train", "dqn", "--resume", str(out), "--episodes", "80"]) == 2
    assert f"this run diverged at phase {phase}" in capsys.readouterr().err
    assert main(["evaluate", str(out)]) == 2  # not "damaged": the file is whole, its network is not
    assert f"this run diverged at phase {phase}" in capsys.readouterr().err


def test_a_crafted_nan_in_a_deep_state_is_refused_when_loading(tmp_path, capsys):
    import h5py

    from popplay.checkpoints import runfile
    from popplay.cli.main import main

    out = tmp_path / "ok.h5"
    assert main(["train", "dqn", "--episodes", "30", "--hidden", "8", "--learning-starts", "16", "--eval-episodes",
                 "1", "--out", str(out)]) == 0
    with h5py.File(out, "r+") as f:
        f["state/adam.0.exp_avg"][0] = np.nan
        f.attrs[runfile.DIGEST] = np.bytes_(runfile.content_digest(f).encode())
    capsys.readouterr()
    assert main(["train", "dqn", "--resume", str(out), "--episodes", "40"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "non-finite values in adam.0.exp_avg" in errors[0]
    assert main(["evaluate", str(out), "--episodes", "1"]) == 2
    assert "non-finite values in adam.0.exp_avg" in capsys.readouterr().err


@pytest.mark.parametrize("domain,budget", [("dqn", ["--episodes", "2"]), ("gorila", ["--env-steps", "100"]),
                                           ("bandit", [])])
def test_a_seed_beyond_64_bits_is_one_line_before_anything_starts(tmp_path: Path, cli, domain: str,
                                                                  budget: list[str]) -> None:
    code, _, err = cli(["train", domain, "--seed", str(2**64), *budget, "--out", str(tmp_path / "s.h5")])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--seed must fit in a signed 64-bit integer" in lines[0], lines
    assert not (tmp_path / "s.h5").exists() and not (tmp_path / "s.h5.parts").exists()


def test_a_gorila_out_too_long_for_its_working_directory_is_one_line(tmp_path: Path, cli) -> None:
    out = tmp_path / ("g" * 250 + ".h5")  # a legal name; with ".parts" added it is not
    code, _, err = cli(["train", "gorila", "--env-steps", "100", "--out", str(out)])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "too long for Gorila's working directory" in lines[0], lines
    assert list(tmp_path.iterdir()) == []


def test_a_deep_command_line_is_checked_and_refused_before_torch_loads(tmp_path: Path) -> None:
    """Issue 30: an unknown environment took 3-9 s to refuse, most of it importing torch.
    The parameter modules are light; `--help` and the refusal come before the agents load."""
    import subprocess
    import sys

    code = (
        "import contextlib, io, sys\n"
        "from popplay.cli.main import main\n"
        "for domain, budget in [('dqn', '--episodes'), ('reinforce', '--episodes'), ('a2c', '--episodes'),\n"
        "                       ('td3', '--episodes'), ('ddpg', '--episodes'), ('ppo', '--env-steps'),\n"
        "                       ('gorila', '--env-steps')]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        helped = main(['train', domain, '--help'])\n"
        "    refused = main(['train', domain, '--env', 'Nope-v0', budget, '100'])\n"
        "    print(domain, helped, refused, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = done.stdout.split("\n")
    assert [line.split()[1:] for line in lines if line] == [["0", "2", "False"]] * 7, done.stdout + done.stderr
    assert done.stderr.count("Error: --env Nope-v0: not a gymnasium environment") == 7, done.stderr


@pytest.mark.procs
def test_a_deep_launcher_checks_its_settings_and_runs_its_ranks_without_torch(tmp_path: Path) -> None:
    """The agents' configs import no torch: a launcher that only checks the settings,
    starts ranks and waits for them took 2.0-2.3 s of CPU with torch, 0.4-0.8 s without
    (Gorila's launcher does need it: it hosts the job's c10d store)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from popplay.core import registry\n"
        "for domain in ('dqn', 'reinforce', 'a2c', 'td3', 'ddpg', 'ppo'):\n"
        "    registry.get(domain).params_type()().validate()\n"
        "print('validated', 'torch' in sys.modules)\n"
        "from popplay.cli.main import main\n"
        "code = main(['train', 'dqn', '--topology', 'central-inference', '--simulators', '1', '--episodes', '2',\n"
        "             '--learning-starts', '20', '--hidden', '8', '--eval-episodes', '0', '--out', 'run.h5'])\n"
        "print('ran', code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    said = [line for line in done.stdout.splitlines() if line.startswith(("validated ", "ran "))]
    assert said == ["validated False", "ran 0 False"], done.stdout + done.stderr[-2000:]
    assert (tmp_path / "run.h5").exists()


_ADAM_DAMAGE = {
    "missing": lambda f: f.__delitem__("state/adam.1.exp_avg_sq"),
    "an extra axis": lambda f: _rewrite(f, "state/adam.1.exp_avg", lambda a: a[None]),
    "one element short": lambda f: _rewrite(f, "state/adam.1.exp_avg", lambda a: a.reshape(-1)[:-1]),
}


def _rewrite(f, name, transform):
    data = transform(f[name][()])
    del f[name]
    f[name] = data


@pytest.mark.parametrize("damage", list(_ADAM_DAMAGE))
@pytest.mark.parametrize("domain,budget", [("a2c", ["--episodes", "4"]), ("ppo", ["--env-steps", "512"]),
                                           ("reinforce", ["--topology", "local", "--episodes", "3"])])
def test_a_damaged_optimiser_state_is_refused_in_one_line(tmp_path, cli, domain, budget, damage):
    """The 2026-11-26 campaign: a deleted Adam moment was taken in and failed at the next
    step ("internal error: KeyError: 'exp_avg_sq'"); a misshapen one passed torch's own
    message through with exit 1."""
    import h5py

    from popplay.checkpoints import runfile

    path = tmp_path / f"{domain}.h5"
    code, _, err = cli(["train", domain, *budget, "--out", str(path), "--quiet"])
    assert code == 0, err
    with h5py.File(path, "a") as f:
        _ADAM_DAMAGE[damage](f)
        f.attrs[runfile.DIGEST] = np.bytes_(runfile.content_digest(f).encode())
    more = [budget[0], str(int(budget[1]) * 2)] if budget[0] != "--topology" else ["--episodes", "6"]
    code, _, err = cli(["train", domain, "--resume", str(path), *more, "--quiet"])
    assert code == 2 and err.count("Error:") == 1 and "adam.1." in err, err
    assert "internal error" not in err and "broadcast" not in err


def test_error_lines_spell_out_terminal_escapes(tmp_path, cli):
    code, _, err = cli(["train", "dqn", "--env", "\x1b[31mRed\x1b[2J", "--episodes", "2", "--out",
                        str(tmp_path / "e.h5")])
    assert code == 2 and "\x1b" not in err and "\\x1b[31mRed\\x1b[2J" in err, err


def test_library_warnings_are_plain_one_line_warnings(tmp_path):
    """gymnasium's deprecation of CartPole-v0 is said as popplay says its own warnings:
    one line, no terminal colour codes, no library source line (a real process: the
    executable sets this up, not main(), which leaves a host program's warnings alone)."""
    done = popplay("train", "dqn", "--env", "CartPole-v0", "--episodes", "2", "--eval-episodes", "1", "--quiet",
                   "--out", str(tmp_path / "v0.h5"), *TINY)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 0 and lines and all(line.startswith("Warning: ") for line in lines), done.stderr
    assert any("CartPole-v0 is out of date" in line for line in lines)
    assert "\x1b" not in done.stderr and "WARN:" not in done.stderr


@pytest.mark.procs
def test_a_jobs_ranks_say_a_deprecation_once(tmp_path):
    """Every rank meets gymnasium's CartPole-v0 deprecation; the job says it once: rank 0
    (which meets it at two places) for --nproc, the launcher for gorila."""
    done = popplay("train", "dqn", "--env", "CartPole-v0", "--agents", "2", "--nproc", "2", "--env-steps", "200",
                   "--hidden", "8", "--learning-starts", "50", "--phase-steps", "50", "--eval-episodes", "1",
                   "--quiet", "--out", str(tmp_path / "v0-ranks.h5"))
    assert done.returncode == 0 and done.stderr.count("Warning: The environment CartPole-v0") == 1, done.stderr
    done = popplay("train", "gorila", "--env", "CartPole-v0", "--actors", "2", "--learners", "1", "--shards", "1",
                   "--env-steps", "400", "--quiet", "--out", str(tmp_path / "v0-gorila.h5"))
    assert done.returncode == 0 and done.stderr.count("CartPole-v0 is out of date") == 1, done.stderr
