"""`popplay train knights`, `popplay evaluate` and `popplay play` as a user meets them."""
import io
import json
import subprocess

import h5py
import numpy as np
import pytest
from rich.console import Console

from popplay import stats
from popplay.cli.main import main
from popplay.cli.play import Session, parse_move, render_board
from popplay.games.knights import rules as game
from popplay.games.knights.rules import KnightsParams
from popplay.checkpoints.validation import load_run, params_from_config

SMALL = ["train", "knights", "--agents", "3", "--games-per-agent", "6", "--episodes", "8", "--eval-every", "4",
         "--eval-games", "10", "--snapshot-every", "4", "--max-turns", "60"]


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("knights") / "run.h5"
    assert main(SMALL + ["--out", str(path), "--json", "--seed", "2"]) == 0
    return path


def test_train_json_and_run_file(run_file, tmp_path, capsys):
    out = tmp_path / "again.h5"
    code, stdout, _ = _run(capsys, SMALL + ["--out", str(out), "--json", "--seed", "2"])
    assert code == 0
    summary = json.loads(stdout.strip().splitlines()[-1])
    for key in ("quality", "random_best", "random_mean", "random_worst", "greedy_best", "greedy_mean",
                "greedy_worst", "score_best", "agent_steps", "seconds", "agent_steps_per_second", "phases"):
        assert key in summary, key
    assert summary["domain"] == "knights" and summary["phases"] == 8 and summary["backend"] == "numba"
    assert summary["agent_steps_per_second"] == pytest.approx(summary["agent_steps"] / summary["seconds"])
    with h5py.File(out) as f:
        domain = f.attrs["domain"]
        assert (domain.decode() if isinstance(domain, bytes) else domain) == "knights"
        assert f["config"].attrs["games_per_agent"] == 6
        assert f["state/w1"].shape == (3, 70, 4) and f["state/alpha"].shape == (3,)
        assert f["state"].attrs["episode"] == 8 and f["state"].attrs["turns"] == summary["agent_steps"]
        assert f["state/snapshot_episode"][()].tolist() == [0, 4, 8]
        assert f["state/snapshot_w1"].shape == (3, 3, 70, 4)
        assert f["curves/quality"].shape == (8,) and f["curves/greedy_mean"].shape == (8,)
        assert f["results/quality_greedy"].shape == (3,)
        assert f["results/quality_greedy"][()].mean() == pytest.approx(summary["quality"])
        assert f["game/offsets"].shape == (8, 2)
    with h5py.File(run_file) as a, h5py.File(out) as b:  # same seed, same population
        assert np.array_equal(a["state/w1"][()], b["state/w1"][()])


def test_evaluate_json_has_per_agent_best_mean_worst(run_file, capsys):
    code, stdout, _ = _run(capsys, ["evaluate", str(run_file), "--opponent", "random", "--games", "21", "--json"])
    assert code == 0
    payload = json.loads(stdout.strip().splitlines()[-1])
    assert payload["opponent"] == "random" and payload["games"] == 22  # rounded up to even
    scores = [row["quality"] for row in payload["per_agent"]]
    assert len(scores) == 3 and payload["best"] == max(scores) and payload["worst"] == min(scores)
    assert payload["mean"] == pytest.approx(np.mean(scores))
    assert all(row["wins"] + row["draws"] + row["losses"] == 22 for row in payload["per_agent"])
    # Intervals: Wilson per agent (containing its score), mean ± 1.96 SE for the population.
    for row in payload["per_agent"]:
        low, high = row["quality_ci95"]
        assert 0.0 <= low <= row["quality"] <= high <= 1.0 and high - low > 0.05
        assert row["score_ci95"] == [float(v) for v in stats.score_interval(row["wins"], row["draws"], row["losses"])]
    assert payload["quality"] == payload["mean"]
    assert payload["quality_se"] == pytest.approx(np.std(scores, ddof=1) / np.sqrt(3))
    low, high = payload["quality_ci95"]
    assert low == pytest.approx(payload["mean"] - 1.96 * payload["quality_se"], abs=1e-3)
    assert payload["best_ci95"] == payload["per_agent"][payload["best_agent"]]["quality_ci95"]
    code, stdout, _ = _run(capsys, ["evaluate", str(run_file)])
    assert code == 0 and "greedy" in stdout and "best" in stdout and "95% interval" in stdout


def test_evaluate_member_plays_one_agents_games_of_the_whole_evaluation(run_file, capsys):
    """``--member K`` plays agent K's own games (against a bot every agent meets the same
    games), so it reproduces K's row of the whole population's evaluation, on the ladder too."""
    args = ["evaluate", str(run_file), "--opponent", "search", "--games", "30", "--json"]
    whole = json.loads(_run(capsys, args)[1].strip().splitlines()[-1])
    alone = json.loads(_run(capsys, args + ["--member", "2"])[1].strip().splitlines()[-1])
    assert [row["agent"] for row in alone["per_agent"]] == [2] and alone["best_agent"] == 2
    assert alone["per_agent"][0] == whole["per_agent"][2] and "quality_se" not in alone
    assert len({row["quality"] for row in whole["per_agent"]}) > 1  # a row taken from the wrong agent would show
    ladder = ["evaluate", str(run_file), "--ladder", "--rungs", "random,greedy", "--games", "20", "--json"]
    whole = json.loads(_run(capsys, ladder)[1].strip().splitlines()[-1])
    alone = json.loads(_run(capsys, ladder + ["--member", "1"])[1].strip().splitlines()[-1])
    assert alone["per_agent"] == [whole["per_agent"][1]] and alone["best_agent"] == 1
    code, stdout, _ = _run(capsys, ["evaluate", str(run_file), "--member", "0", "--games", "10"])
    assert code == 0 and "agent 0:" in stdout
    code, _, stderr = _run(capsys, ["evaluate", str(run_file), "--member", "3"])
    assert code == 2 and "--member 3" in stderr and "0 to 2" in stderr and len(stderr.strip().splitlines()) == 1


def test_td_leaf_follows_each_agents_depth_when_copies_switch_to_two_plies(tmp_path, capsys):
    """``--td-leaf --mutate-lookahead`` from one-ply founders: the same games and choices
    with and without it until a copy looks two plies deep; then those copies learn from
    leaves, so the weights part."""
    mixed = {leaf: tmp_path / f"mixed{leaf}.h5" for leaf in (True, False)}
    for leaf, path in mixed.items():
        assert main(SMALL + ["--out", str(path), "--json", "--mutate-lookahead", "1", "--replicate-every", "2",
                             "--replicate-fraction", "0.34", "--tournament-games", "2"] + ["--td-leaf"] * leaf) == 0
    capsys.readouterr()
    with h5py.File(mixed[True]) as a, h5py.File(mixed[False]) as b:
        assert 2 in a["state/plies"][()] and 1 in a["state/plies"][()]
        assert np.array_equal(a["state/plies"][()], b["state/plies"][()])
        assert not np.array_equal(a["state/w1"][()], b["state/w1"][()])  # the deep copies learned otherwise
    code, _, stderr = _run(capsys, SMALL + ["--out", str(tmp_path / "no.h5"), "--td-leaf"])
    assert code == 2 and "--mutate-lookahead" in stderr and len(stderr.strip().splitlines()) == 1


def test_agents_can_be_evaluated_and_trained_with_the_two_ply_chooser(run_file, tmp_path, capsys):
    """``--lookahead 2``: evaluate plays the stored agents with it (what they learned is
    unchanged), and a population trains with it; the search plays the same either way."""
    args = ["evaluate", str(run_file), "--opponent", "search", "--games", "40", "--json"]
    one = json.loads(_run(capsys, args)[1].strip().splitlines()[-1])
    two = json.loads(_run(capsys, args + ["--lookahead", "2"])[1].strip().splitlines()[-1])
    assert (one["lookahead"], two["lookahead"]) == (1, 2)
    assert [r["quality"] for r in one["per_agent"]] != [r["quality"] for r in two["per_agent"]]
    out = tmp_path / "two.h5"
    code, stdout, _ = _run(capsys, SMALL + ["--lookahead", "2", "--out", str(out), "--json", "--seed", "2"])
    assert code == 0 and json.loads(stdout.strip().splitlines()[-1])["phases"] == 8
    assert params_from_config("knights", load_run(out).config).lookahead == 2
    with h5py.File(out) as a, h5py.File(run_file) as b:  # the same seed learned other games
        assert not np.array_equal(a["state/w1"][()], b["state/w1"][()])


def test_knights_options_of_evaluate_are_refused_for_other_domains(tmp_path, capsys):
    bandit = tmp_path / "b.h5"
    assert main(["train", "bandit", "--arms", "5", "--agents", "2", "--trials", "2", "--agent-steps", "8",
                 "--share-every", "4", "--out", str(bandit), "--json"]) == 0
    capsys.readouterr()
    code, _, stderr = _run(capsys, ["evaluate", str(bandit), "--opponent", "greedy"])
    assert code == 2 and "--opponent" in stderr and "knights" in stderr and len(stderr.strip().splitlines()) == 1
    code, _, stderr = _run(capsys, ["evaluate", str(bandit), "--member", "0"])
    assert code == 2 and "--member" in stderr and "bandit run" in stderr and len(stderr.strip().splitlines()) == 1
    code, _, stderr = _run(capsys, ["play", str(bandit)])
    assert code == 2 and "knights run" in stderr and len(stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("extra, fragment", [
    (["--agents", "0"], "--agents"),
    (["--epsilon", "1.5"], "--epsilon"),
    (["--alpha", "0"], "--alpha"),
    (["--lam", "-0.1"], "--lam"),
    (["--pieces", "20"], "--pieces"),
    (["--max-turns", "0"], "--max-turns"),
    (["--jumps", "sideways"], "--jumps"),
    (["--eval-opponents", "chess"], "--eval-opponents"),
    (["--hidden", "0"], "--hidden"),
    (["--backend", "jax"], "--backend"),
    (["--time-budget", "-1"], "--time-budget"),
    (["--lookahead", "3"], "--lookahead"),
    (["--td-leaf"], "add --lookahead 2 (or --mutate-lookahead"),
    (["--hidden2", "-1"], "--hidden2"),
])
def test_bad_options_are_one_line_usage_errors(tmp_path, capsys, extra, fragment):
    out = tmp_path / "r.h5"
    code, _, stderr = _run(capsys, SMALL + ["--out", str(out)] + extra)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error") and fragment in lines[0]
    assert not out.exists()


def test_resume_continues_to_the_same_population(run_file, tmp_path, capsys):
    half = tmp_path / "half.h5"
    episodes = SMALL.index("--episodes") + 1
    assert main(SMALL[:episodes] + ["4"] + SMALL[episodes + 1:] + ["--out", str(half), "--json", "--seed", "2"]) == 0
    assert main(["train", "knights", "--resume", str(half), "--episodes", "8", "--json"]) == 0
    capsys.readouterr()
    with h5py.File(run_file) as a, h5py.File(half) as b:
        for name in ("w1", "b2", "eval_record", "snapshot_w2"):
            assert np.array_equal(a[f"state/{name}"][()], b[f"state/{name}"][()]), name
        assert np.array_equal(a["curves/quality"][()], b["curves/quality"][()])


def _session(run_file, human=1, seed=0):
    from popplay.checkpoints.validation import load_run
    from popplay.games.knights.experiment import KnightsExperiment
    from popplay.core.backend import Backend

    stored = load_run(run_file)
    params = params_from_config("knights", stored.config, run_options=False)
    state = KnightsExperiment(params, Backend("numba", "cpu")).restore(stored.state, stored.state_counters)
    text = io.StringIO()
    console = Console(file=text, width=100, color_system=None)
    return Session(params, state.networks.agent(0), 0, console, human=human, seed=seed), text


@pytest.mark.parametrize("human", [1, -1])
def test_a_person_can_play_whole_games_with_bad_input_in_between(run_file, human):
    session, text = _session(run_file, human=human, seed=5)
    rng = np.random.default_rng(human + 5)
    junk = iter(["", "help", "moves", "z9 a1", "a1", "[/x]", "a1 a2", "99 3", "b1 c3 d5"] * 200)
    asked = {"moves": 0, "again": 0}

    def ask(prompt):
        if prompt.startswith("Play again"):
            asked["again"] += 1
            return "y" if asked["again"] < 2 else "n"
        asked["moves"] += 1
        if asked["moves"] % 3:
            return next(junk)
        a, b = session.moves[rng.integers(len(session.moves))]
        return f"{game.square_name(a, 7)}-{game.square_name(b, 7)}" if asked["moves"] % 2 else f"{a} {b}"

    session.run(ask)
    shown = text.getvalue()
    assert asked["again"] == 2  # two games were played to their end
    assert shown.count("You win!") + shown.count("The agent wins.") + shown.count("Draw:") == 2
    assert "Agent plays" in shown and "is not a legal move" in shown and "is not a square" in shown
    assert "Legal moves:" in shown and shown.rstrip().endswith("Bye.")
    # after each move: pieces left, plies towards the draw, the agent's estimate
    assert "Pieces: you 5, agent 5. Ply 1 of" in shown and "chance to win:" in shown
    assert "captures a piece" in shown  # whole games end by capturing everything (or a draw after captures)


def test_end_of_input_and_ctrl_c_end_the_session_cleanly(run_file):
    for error in (EOFError, KeyboardInterrupt):
        session, text = _session(run_file)

        def ask(prompt, error=error):
            raise error

        session.run(ask)
        assert text.getvalue().rstrip().endswith("Bye.")


def test_play_command_reads_moves_from_stdin(run_file):
    from typer.testing import CliRunner

    from popplay.cli.main import app

    result = CliRunner().invoke(app, ["play", str(run_file), "--seed", "3", "--side", "o"],
                                input="nonsense\nmoves\nquit\n")
    assert result.exit_code == 0, result.output
    assert "Agent plays" in result.output and "not two squares" in result.output and "Bye." in result.output
    result = CliRunner().invoke(app, ["play", str(run_file), "--agent", "7"])
    assert result.exit_code != 0


def test_moves_parse_in_every_spelling_and_the_board_renders():
    for text in ("b1 c3", "b1c3", "B1-C3", "1,16", "1 16"):
        assert parse_move(text, 5, 7) == (1, 16)
    for bad in ("b1", "b1 c3 d5", "x1 c3", ""):
        with pytest.raises(ValueError):
            parse_move(bad, 5, 7)
    board = game.random_board(seed=1)
    text = io.StringIO()
    Console(file=text, width=80, color_system=None).print(render_board(board, (0, 9)))
    drawn = text.getvalue()
    assert drawn.count("X") == 5 and drawn.count("O") == 5 and "a" in drawn and "5" in drawn


def test_every_command_has_help():
    from typer.testing import CliRunner

    from popplay.cli.main import app

    for argv, fragment in ((["train", "knights", "--help"], "--games-per-agent"), (["play", "--help"], "RUN"),
                           (["evaluate", "--help"], "--opponent")):
        result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
        assert result.exit_code == 0 and fragment in result.output


def test_real_subprocess_trains_and_evaluates(tmp_path):
    out = tmp_path / "r.h5"
    trained = subprocess.run(["popplay", *SMALL, "--out", str(out), "--json"], capture_output=True, text=True,
                             timeout=300)
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout.strip().splitlines()[-1])["domain"] == "knights"
    evaluated = subprocess.run(["popplay", "evaluate", str(out), "--opponent", "search", "--games", "4", "--json"],
                               capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["opponent"] == "search"
    bad = subprocess.run(["popplay", *SMALL, "--pieces", "40", "--out", str(tmp_path / "b.h5")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("Error") and "Traceback" not in bad.stderr
    assert KnightsParams().max_turns == game.DEFAULT_MAX_TURNS


def test_a_second_hidden_layer_trains_resumes_evaluates_and_plays_tournaments(tmp_path, capsys):
    """``--hidden2``: the run file holds the second layer (and its snapshots); a run
    split by a resume ends where the unbroken run does, with replication and a league
    moving second layers; evaluate plays it two plies deep; a tournament of runs with
    and without the layer is refused in one line, with two such runs it is played."""
    two = SMALL + ["--hidden2", "3", "--replicate-every", "2", "--league", "2", "--mutate-weights", "0.01",
                   "--seed", "4"]
    whole, half = tmp_path / "whole.h5", tmp_path / "half.h5"
    assert main(two + ["--out", str(whole), "--json"]) == 0
    episodes = two.index("--episodes") + 1
    assert main(two[:episodes] + ["4"] + two[episodes + 1:] + ["--out", str(half), "--json"]) == 0
    assert main(["train", "knights", "--resume", str(half), "--episodes", "8", "--json"]) == 0
    with h5py.File(whole) as a, h5py.File(half) as b:
        assert a["state/wm"].shape == (3, 4, 3) and a["state/bm"].shape == (3, 3) and a["state/w2"].shape == (3, 3)
        assert a["state/snapshot_wm"].shape == (3, 3, 4, 3)
        for name in ("w1", "wm", "bm", "w2", "snapshot_wm"):
            assert np.array_equal(a[f"state/{name}"][()], b[f"state/{name}"][()]), name
        assert not np.array_equal(a["state/snapshot_wm"][0], a["state/snapshot_wm"][2])  # it learns
    capsys.readouterr()
    code, out, err = _run(capsys, ["evaluate", str(whole), "--games", "4", "--lookahead", "2", "--json"])
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["lookahead"] == 2
    leaf = tmp_path / "leaf.h5"  # a TD-Leaf run played one ply deep: how it learned does not matter
    assert main(SMALL + ["--out", str(leaf), "--json", "--episodes", "1", "--lookahead", "2", "--td-leaf"]) == 0
    capsys.readouterr()
    code, out, err = _run(capsys, ["evaluate", str(leaf), "--games", "4", "--lookahead", "1", "--json"])
    assert code == 0, err
    one = tmp_path / "one.h5"
    assert main(SMALL + ["--out", str(one), "--json", "--episodes", "1"]) == 0
    capsys.readouterr()
    code, out, err = _run(capsys, ["tournament", str(whole), str(one), "--games", "2"])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "second hidden layer" in lines[0], err
    code, out, err = _run(capsys, ["tournament", str(whole), str(half), "--games", "2", "--json"])
    assert code == 0, err
