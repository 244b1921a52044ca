"""`popplay reproduce knights_ladder` (tiny scale): issue 28's study of ladder Elo against
learning time, its slopes and the best agents against the two-ply search."""

import numpy as np
import pytest

from popplay.reproduce import knights_ladder, registry
from popplay.reproduce.data import read_figure
from tests.conftest import run_reproduce


@pytest.fixture(scope="module")
def tiny_ladder(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    return out, run_reproduce(out, "ladder", "--scale", "tiny")


def test_every_setting_is_on_the_ladder_with_its_slope_and_its_best_agent_against_search(tiny_ladder):
    out, summary = tiny_ladder
    assert [f.name for f in registry.resolve("ladder")] == ["knights_ladder"]
    data = read_figure(out / "knights_ladder.h5")
    assert list(data.groups) == ["a-0", "b-0", "c-0", "d-0"]
    for name, group in data.groups.items():
        elo = group.arrays
        assert elo["episode"].tolist() == [1, 10, 20, 30]  # every evaluation point (the first after episode 1)
        assert np.all(elo["elo_worst"] <= elo["elo_mean"]) and np.all(elo["elo_mean"] <= elo["elo_best"])
        assert 0.0 <= group.attrs["versus_search_ci95_low"] <= group.attrs["versus_search_best"] \
            <= group.attrs["versus_search_ci95_high"] <= 1.0
        assert group.attrs["versus_search_games"] == 20
        # the agent chosen there, alone on 40 games of another seed
        assert group.attrs["confirmed_games"] == 40
        assert 0.0 <= group.attrs["confirmed_ci95_low"] <= group.attrs["confirmed_best"] \
            <= group.attrs["confirmed_ci95_high"] <= 1.0
        assert 0.0 <= group.attrs["confirmed_score_ci95_low"] < group.attrs["confirmed_score_ci95_high"] <= 1.0
        assert group.attrs["command"].startswith("popplay train knights --agents 8 --episodes 30")
    assert "--hidden 32" in data.groups["d-0"].attrs["command"] and "--league 4" in data.groups["c-0"].attrs["command"]
    assert "--replicate-every 5" in data.groups["b-0"].attrs["command"]  # tiny's schedule, so that it happens
    assert (out / "knights_ladder.png").exists()
    run = summary["figures"][0]["a-0"]  # --json: strict JSON, no NaN (too few points for a slope: None)
    assert run["episodes"] == 30 and (run["slope_elo_per_minute"] is None or np.isfinite(run["slope_elo_per_minute"]))
    assert run["versus_search_best"] == round(data.groups["a-0"].attrs["versus_search_best"], 4)
    assert run["confirmed_best"] == round(data.groups["a-0"].attrs["confirmed_best"], 4)


def test_the_slope_is_least_squares_over_the_last_third_with_its_interval():
    seconds = np.arange(0.0, 601.0, 60.0)  # 11 points, 10 minutes
    elo = 100.0 + 7.0 * seconds / 60.0  # 7 Elo a minute, exactly
    trend = knights_ladder.slope(seconds, elo)
    assert trend["points"] == 4 and np.isclose(trend["elo_per_minute"], 7.0)
    assert np.isclose(trend["ci95"][0], 7.0) and np.isclose(trend["ci95"][1], 7.0)
    noisy = elo + np.array([0, 5, -5, 0, 5, -5, 0, 3, -8, 6, -2], dtype=float)
    trend = knights_ladder.slope(seconds, noisy)
    assert trend["ci95"][0] < trend["elo_per_minute"] < trend["ci95"][1]
    assert knights_ladder.slope(seconds[:2], elo[:2])["elo_per_minute"] is None
