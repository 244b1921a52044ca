"""`popplay tournament` as a user meets it: runs, snapshots, anchors, bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from popplay.cli.main import main

TINY = ["train", "knights", "--agents", "3", "--games-per-agent", "4", "--episodes", "4", "--eval-every", "4",
        "--eval-games", "4", "--snapshot-every", "2", "--max-turns", "40", "--json"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tournament")
    paths = {"a": root / "a.h5", "b": root / "b.h5", "small": root / "small.h5", "bandit": root / "bandit.h5"}
    assert main(TINY + ["--out", str(paths["a"]), "--seed", "1"]) == 0
    assert main(TINY + ["--out", str(paths["b"]), "--seed", "2", "--hidden", "6"]) == 0
    assert main(TINY + ["--out", str(paths["small"]), "--rows", "4", "--cols", "5", "--pieces", "3"]) == 0
    assert main(["train", "bandit", "--arms", "4", "--agents", "2", "--trials", "2", "--agent-steps", "8",
                 "--share-every", "4", "--out", str(paths["bandit"]), "--json"]) == 0
    return paths


def _json(capsys, argv):
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _error(capsys, argv):
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("Error:"), err
    return lines[0]


def test_two_runs_and_an_anchor_in_one_tournament(runs, capsys):
    data = _json(capsys, ["tournament", str(runs["a"]), str(runs["b"]), "--games", "4", "--anchor", "greedy",
                          "--json"])
    assert len(data["agents"]) == 7 and data["agents"][-1] == "greedy"
    assert data["agents"][0].startswith("a#") and data["agents"][3].startswith("b#")
    assert [info["hidden"] for info in data["agent_info"]] == [4, 4, 4, 6, 6, 6, 0]
    wins, draws, losses = (np.array(data[k]) for k in ("wins", "draws", "losses"))
    assert np.array_equal(losses, wins.T) and np.array_equal(draws, draws.T)
    score = np.array([[np.nan if v is None else v for v in row] for row in data["score"]])
    off = ~np.eye(7, dtype=bool)
    np.testing.assert_allclose((score + score.T)[off], 1.0)
    assert ((wins + draws + losses)[off] == 4).all()
    assert data["ratings"][-1] == 0.0 and "Elo" in data["convention"]
    # Standard errors: 0 for the anchor, positive and of a plausible size for 24 games each.
    assert data["rating_se"][-1] == 0.0 and all(40 < se < 1000 for se in data["rating_se"][:-1])
    again = _json(capsys, ["tournament", str(runs["a"]), str(runs["b"]), "--games", "4", "--anchor", "greedy",
                           "--json"])
    assert again == data  # reproducible for a seed
    other = _json(capsys, ["tournament", str(runs["a"]), str(runs["b"]), "--games", "4", "--anchor", "greedy",
                           "--seed", "5", "--json"])
    assert other["wins"] != data["wins"] or other["draws"] != data["draws"]


def test_snapshots_enter_every_stored_generation(runs, capsys):
    data = _json(capsys, ["tournament", str(runs["a"]), "--games", "2", "--snapshots", "--json"])
    episodes = [info["episode"] for info in data["agent_info"]]
    assert episodes == [0, 0, 0, 2, 2, 2, 4, 4, 4]  # snapshots at 0 and 2, and the final population
    assert data["agents"][0].startswith("a@0#")
    data = _json(capsys, ["tournament", str(runs["a"]), "--games", "2", "--snapshots", "--snapshot-every", "4",
                          "--json"])
    assert [info["episode"] for info in data["agent_info"]] == [0, 0, 0, 4, 4, 4]


def test_table_ranks_by_rating(runs, capsys):
    capsys.readouterr()
    assert main(["tournament", str(runs["a"]), "--games", "2", "--anchor", "random"]) == 0
    out = capsys.readouterr().out
    assert "rank" in out and "rating" in out and "a#0" in out and "random" in out


def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys):
    line = _error(capsys, ["tournament", str(runs["a"]), str(runs["small"]), "--games", "2"])
    assert "different game" in line and "4x5" in line
    assert "knights" in _error(capsys, ["tournament", str(runs["bandit"]), "--games", "2"])
    assert "--games" in _error(capsys, ["tournament", str(runs["a"]), "--games", "0"])
    assert "no such file" in _error(capsys, ["tournament", str(tmp_path / "none.h5")])
    text = tmp_path / "text.h5"
    text.write_text("not a run")
    assert "HDF5" in _error(capsys, ["tournament", str(text)])
    assert "--snapshots" in _error(capsys, ["tournament", str(runs["a"]), "--snapshot-every", "2"])
    assert "--anchor" in _error(capsys, ["tournament", str(runs["a"]), "--anchor", "perfect"])


def test_console_script_in_a_real_process(runs):
    script = Path(sys.executable).with_name("popplay")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "popplay"]
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    done = subprocess.run(command + ["tournament", str(runs["a"]), "--games", "2", "--json"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(data) >= {"agents", "score", "wins", "draws", "losses", "ratings"} and len(data["agents"]) == 3
    bad = subprocess.run(command + ["tournament", str(runs["a"]), "--games", "0"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("Error:") and "Traceback" not in bad.stderr


def test_odd_games_round_up_and_mixed_runs_are_announced(runs, tmp_path, capsys):
    data = _json(capsys, ["tournament", str(runs["a"]), "--games", "3", "--json"])
    assert data["games"] == 4  # as `evaluate` does: each side moves first equally often
    wins, draws, losses = (np.array(data[k]) for k in ("wins", "draws", "losses"))
    assert ((wins + draws + losses)[~np.eye(3, dtype=bool)] == 4).all()
    capsys.readouterr()
    assert main(["tournament", str(runs["a"]), str(runs["b"]), "--games", "2", "--json"]) == 0
    err = capsys.readouterr().err
    assert "2 run files enter one round robin" in err and f"{runs['a']} (3 players)" in err
    link = tmp_path / "latest-knights.h5"
    link.symlink_to(runs["a"])
    data = _json(capsys, ["tournament", str(runs["a"]), str(link), "--games", "2", "--json"])
    assert len(data["agents"]) == 3  # one population, named twice
