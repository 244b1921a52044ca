"""What a user sees from `popplay train` through a real process: results on stdout,
progress and status on stderr, prompt output, honest warnings."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from popplay.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["train", "bandit", "--arms", "10", "--agents", "4", "--trials", "8", "--agent-steps", "64",
        "--backend", "numba"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_stdout_holds_results_and_stderr_the_progress(tmp_path):
    done = subprocess.run([sys.executable, "-m", "popplay", *TINY, "--out", str(tmp_path / "r.h5")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env())
    assert done.returncode == 0, done.stderr
    out, err = done.stdout.splitlines(), done.stderr.splitlines()
    assert out[0].startswith("bandit: quality") and out[-1].endswith("r.h5") and "%" not in done.stdout
    assert "64 agent-steps per trial x 8 trials = 512 agent-steps" in done.stdout
    progress = [line for line in err if "%" in line]
    assert len(progress) == 1 and progress[0].startswith("bandit 100.0% steps/trial 64/64")  # not printed twice
    assert any(line.startswith("saving run file") for line in err)
    assert all(len(line) <= 120 for line in err + out if str(tmp_path) not in line)  # a path is as long as it is
    with_json = subprocess.run([sys.executable, "-m", "popplay", *TINY, "--json", "--out", str(tmp_path / "j.h5")],
                               capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env())
    assert with_json.returncode == 0 and len(with_json.stdout.splitlines()) == 1
    assert json.loads(with_json.stdout)["agent_steps"] == 512


def test_the_numba_path_starts_without_torch_and_speaks_first(tmp_path):
    code = ("import sys, time; from popplay.cli.main import main; main(sys.argv[1:]); "
            "print('TORCH', 'torch' in sys.modules)")
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code, *TINY, "--out", str(tmp_path / "r.h5")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=_env())
    first = proc.stderr.readline()
    first_seconds = time.monotonic() - started
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert first.startswith("training bandit with numba on cpu")
    assert "TORCH False" in out  # importing torch costs seconds the numba path does not need
    # Under 2 s on a quiet machine (see the report); loose here: CI machines are shared.
    assert first_seconds < 60


def test_silent_adjustments_are_announced(tmp_path, capsys):
    assert main(["train", "bandit", "--arms", "10", "--agents", "256", "--trials", "2", "--agent-steps", "1000",
                 "--out", str(tmp_path / "a.h5"), "--json"]) == 0
    err = capsys.readouterr().err
    assert "Warning: --agent-steps 1,000 is not a multiple of --agents 256: training 768 agent-steps" in err
    assert err.count("--share-every 16 is more than the 3 steps each agent takes") == 1  # said once
    assert main(["train", "bandit", "--arms", "10", "--agents", "4", "--trials", "2", "--agent-steps", "64",
                 "--share-every", "4", "--out", str(tmp_path / "b.h5"), "--json"]) == 0
    assert "Warning" not in capsys.readouterr().err
    # a time budget: the default step budget is not the run's, so its rounding is no news
    assert main(["train", "bandit", "--arms", "10", "--agents", "6", "--trials", "2", "--time-budget", "0.05",
                 "--out", str(tmp_path / "c.h5"), "--json"]) == 0
    assert "Warning" not in capsys.readouterr().err


def _help(argv):
    from typer.testing import CliRunner

    from popplay.cli.main import app

    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_version_and_bare_commands_print_help_without_an_empty_error(capsys):
    from popplay import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"popplay {__version__}"
    for argv in ([], ["train"]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 2 and "Usage: popplay" in out and "Error" not in err + out


def test_help_reads_naturally_everywhere():
    commands = [["train", d] for d in ("bandit", "cartpole", "knights")] + [
        [c] for c in ("evaluate", "inspect", "lineage", "play", "plot", "reproduce", "tournament")]
    for argv in [[], ["train"], *commands]:
        text = _help([*argv, "--help"])
        for python_type in ("<bool>", "<list", "<int", "<float", "<file>", "{RUN", "x>=", "<=x"):
            assert python_type not in text, (argv, python_type)
    assert "INTEGER [at least 2]" in _help(["train", "bandit", "--help"])
    assert "NUMBER [0.0 to 1.0]" in _help(["train", "bandit", "--help"])
    assert "Usage: popplay tournament [OPTIONS] RUN.h5 [MORE.h5 ...]" in _help(["tournament", "--help"])
    evaluate = _help(["evaluate", "--help"])
    assert all(domain in evaluate for domain in ("bandit", "cartpole", "knights"))


def test_play_help_example_names_the_squares_it_means():
    from popplay.cli.play import help_text, parse_move

    assert "'1 16'" in help_text(7)
    assert parse_move("1 16", 5, 7) == parse_move("b1 c3", 5, 7)
    assert parse_move("1 12", 5, 5) == parse_move("b1 c3", 5, 5) and "'1 12'" in help_text(5)


def test_config_file_sets_options_and_the_command_line_overrides_it(tmp_path, capsys):
    from popplay.checkpoints.validation import load_run

    config = tmp_path / "bandit.toml"
    config.write_text('arms = 10\nagents = 4\ntrials = 8\nagent-steps = 64\ndifferentiation = "top2"\n'
                      '[cartpole]\nagents = 99\n')
    out = tmp_path / "r.h5"
    assert main(["train", "bandit", "--config", str(config), "--trials", "2", "--out", str(out), "--json"]) == 0
    stored = load_run(out).config
    assert (stored["arms"], stored["agents"], stored["trials"], stored["steps_per_agent"]) == (10, 4, 2, 16)
    assert stored["differentiation"] == "top2"
    table = tmp_path / "tables.toml"
    table.write_text('[bandit]\narms = 5\nagents = 2\ntrials = 2\nagent-steps = 8\n[knights]\nagents = 3\n')
    assert main(["train", "bandit", "--config", str(table), "--out", str(tmp_path / "t.h5"), "--json"]) == 0
    assert load_run(tmp_path / "t.h5").config["arms"] == 5
    capsys.readouterr()
    (tmp_path / "typo.toml").write_text("agentz = 3\n")
    (tmp_path / "broken.toml").write_text("agents = \n")
    for name, fragment in (("typo.toml", "'agentz' is not an option"), ("broken.toml", "not valid TOML"),
                           ("none.toml", "No such file")):
        assert main(["train", "bandit", "--config", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("Error: --config") and fragment in err[0]


def test_config_top_level_keys_apply_to_every_command_and_tables_override_them(tmp_path, capsys):
    """Top-level keys used to be dropped as soon as the file had any table."""
    import os

    from popplay.checkpoints.validation import load_run

    config = tmp_path / "c.toml"
    # games-per-agent is a knights option: the bandit command leaves it to knights
    config.write_text('agents = 8\narms = 10\nagent-steps = 64\ngames-per-agent = 2\n'
                      '[bandit]\ntrials = 4\n[cartpole]\nagents = 99\n')
    assert main(["train", "bandit", "--config", str(config), "--out", str(tmp_path / "b.h5"), "--json"]) == 0
    stored = load_run(tmp_path / "b.h5").config
    assert (stored["agents"], stored["arms"], stored["trials"], stored["steps_per_agent"]) == (8, 10, 4, 8)
    both = tmp_path / "both.toml"
    both.write_text('agents = 8\ntrials = 4\n[bandit]\nagents = 2\n')  # the table wins
    assert main(["train", "bandit", "--config", str(both), "--arms", "10", "--agent-steps", "64",
                 "--out", str(tmp_path / "t.h5"), "--json"]) == 0
    assert load_run(tmp_path / "t.h5").config["agents"] == 2
    capsys.readouterr()
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for name, text, fragment in (("table.toml", "[bandt]\nagents = 2\n", "[bandt] is not a train command"),
                                 ("key.toml", "[bandit]\ngames-per-agent = 2\n",
                                  "[bandit] 'games-per-agent' is not an option of `popplay train bandit`"),
                                 ("bool.toml", "agents = true\n", "agents = True is not a value it takes"),
                                 ("fifo.toml", None, "not a regular file"),
                                 ("inline.toml", "agents = { count = 8 }\n", "[agents] is not a train command"),
                                 ("latin1.toml", b"arms = 10 # caf\xe9\n", "not valid TOML"),
                                 ("deep.toml", "arms = " + "[" * 100_000 + "]" * 100_000 + "\n", "not valid TOML"),
                                 ("huge.toml", "# padding\n" * 120_000, "not an options file")):
        if isinstance(text, bytes):
            (tmp_path / name).write_bytes(text)
        elif text is not None:
            (tmp_path / name).write_text(text)
        assert main(["train", "bandit", "--config", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("Error: --config") and fragment in err[0], err


def test_several_seeds_in_one_command_are_aggregated(tmp_path, capsys):
    import math

    out = tmp_path / "s.h5"
    args = ["train", "bandit", "--arms", "10", "--agents", "4", "--trials", "16", "--agent-steps", "64",
            "--out", str(out)]
    assert main([*args, "--seeds", "3", "--seed", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["seeds"] == 3 and data["out"] == [str(tmp_path / f"s-seed{k}.h5") for k in (4, 5, 6)]
    assert (data["backend"], data["compile"]) == ("numba", False)  # as each run says
    values = [run["quality"] for run in data["runs"]]
    assert data["quality_values"] == values and data["quality"] == sum(values) / 3
    mean = sum(values) / 3
    assert math.isclose(data["quality_sem"], math.sqrt(sum((v - mean) ** 2 for v in values) / 2 / 3))
    assert data["agent_steps"] == 3 * 64 * 16
    for k in (4, 5, 6):  # each seed alone gives the same run
        assert main([*args[:-1], str(tmp_path / f"alone{k}.h5"), "--seed", str(k), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["quality"] == values[k - 4]
    assert main([*args, "--seeds", "2", "--seed", "4"]) == 2  # s-seed4.h5 exists: nothing trained
    assert "file exists" in capsys.readouterr().err
    assert main([*args, "--seeds", "2", "--seed", "4", "--overwrite"]) == 0
    assert "bandit over 2 seeds (mean ± standard error):" in capsys.readouterr().out


def test_compile_message_when_numba_loads_only_inside_the_run(tmp_path):
    # numba is imported lazily by the kernels; the runner must listen from the start.
    code = """
import io, sys
from popplay.console import PlainReporter
from popplay.games.bandit.rules import BanditParams
from popplay.games.bandit.experiment import BanditExperiment
from popplay.core.backend import Backend
from popplay.training.loop import run
assert "numba" not in sys.modules
experiment = BanditExperiment(BanditParams(arms=4, agents=2, trials=2, steps_per_agent=4, share_every=2),
                              Backend("numba", "cpu"))
def warmup():
    import numba
    numba.njit(lambda x: x * 2 + 1)(3)  # uncached: a compilation, as on a fresh machine
experiment.warmup = warmup
stream = io.StringIO()
run(experiment, reporter=PlainReporter(stream, interval=0))
print(stream.getvalue().splitlines()[0])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "compiling kernels (first run only)…"


def test_status_lines_go_to_stderr_with_json_too_and_quiet_silences_them(tmp_path, cli):
    args = ["train", "bandit", "--agents", "2", "--trials", "1", "--agent-steps", "16", "--share-every", "4",
            "--json", "--out", str(tmp_path / "run.h5")]
    code, out, err = cli(args)
    assert code == 0 and out.strip().startswith("{")
    assert "training bandit" in err  # a long start is never silent, --json or not
    code, out, err = cli([*args, "--overwrite", "--quiet"])
    assert code == 0 and out.strip().startswith("{") and err == ""
