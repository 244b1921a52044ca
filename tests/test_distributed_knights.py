"""Knights populations sharded over real ranks (gloo): opponents from the whole
population, selection by a round robin, evaluation; bit-identical to one process."""
from __future__ import annotations

import pytest

from pathlib import Path

from tests._dist_helpers import assert_same_run, popplay

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

TINY = ["train", "knights", "--agents", "4", "--games-per-agent", "4", "--episodes", "4", "--hidden", "4",
        "--max-turns", "12", "--eval-every", "2", "--eval-games", "2", "--replicate-every", "2",
        "--tournament-games", "2", "--mutate-weights", "0.01", "--mutate-params", "1.5", "--seed", "2",
        "--backend", "numba"]


def test_two_ranks_equal_one_process(tmp_path: Path) -> None:
    from popplay.cli.main import main

    one = tmp_path / "one.h5"
    assert main([*TINY, "--out", str(one), "--json"]) == 0
    out = tmp_path / "n2.h5"
    done = popplay(*TINY, "--nproc", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "2 ranks" in done.stdout
    assert_same_run(one, out)


def test_stronger_agents_on_two_ranks_equal_one_process(tmp_path: Path) -> None:
    """A second hidden layer, the two-ply chooser, TD-Leaf, a step-size schedule,
    copies that switch their depth and agents of their own widths (both layers) are per-game choices of
    the kernels and per-agent state: sharding the games changes nothing."""
    from popplay.cli.main import main

    args = [*TINY, "--hidden2", "3", "--lookahead", "2", "--td-leaf", "--alpha-half-life", "2",
            "--mutate-lookahead", "0.5", "--start-width", "2", "--mutate-width", "0.5", "--start-width2", "2",
            "--mutate-width2", "0.5"]
    one = tmp_path / "one.h5"
    assert main([*args, "--out", str(one)]) == 0
    out = tmp_path / "n2.h5"
    done = popplay(*args, "--nproc", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert_same_run(one, out)


def test_learning_opponents_two_and_four_ranks_equal_one_process(tmp_path: Path) -> None:
    """Both sides learn: a network's change sums games played on several ranks, which
    continue one running sum in game order (collectives.chain); a league of frozen past
    generations takes some of the games (its members never learn)."""
    from popplay.cli.main import main

    args = [*TINY, "--opponents-learn", "--league", "2", "--snapshot-every", "1", "--league-sampling", "pfsp"]
    one = tmp_path / "one.h5"
    assert main([*args, "--out", str(one)]) == 0
    for n in (2, 4):
        out = tmp_path / f"n{n}.h5"
        done = popplay(*args, "--nproc", str(n), "--out", str(out))
        assert done.returncode == 0, done.stderr
        assert_same_run(one, out)


def test_tournament_three_ranks_equal_one_process(tmp_path: Path) -> None:
    """10 pairs over 3 ranks: uneven blocks, the counts still land in pair order."""
    import json

    from popplay.cli.main import main

    run = tmp_path / "run.h5"
    assert main([*TINY, "--episodes", "2", "--out", str(run), "--json"]) == 0
    args = ["tournament", str(run), "--games", "3", "--anchor", "greedy", "--json"]
    done = popplay(*args, "--nproc", "3")
    assert done.returncode == 0, done.stderr
    sharded = json.loads(done.stdout.strip().splitlines()[-1])
    assert sharded.pop("world_size") == 3
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(args) == 0
    single = json.loads(buffer.getvalue().strip().splitlines()[-1])
    assert single.pop("world_size") == 1
    assert sharded == single
    assert sum(map(sum, single["wins"])) + sum(map(sum, single["draws"])) > 0
