"""`popplay reproduce knights`: Bell §3.4's population quality with and without selective
replication, at equal compute (tiny scale)."""
import shlex

import h5py
import numpy as np
import pytest

from popplay.cli.main import main
from popplay.reproduce import knights, registry
from popplay.reproduce.data import read_figure
from tests.conftest import run_reproduce

TINY = knights.SCALES["tiny"]
NAME = "knights_replication"


@pytest.fixture(scope="module")
def tiny_knights(tmp_path_factory):
    """The knights figure at the tiny scale, computed once; (directory, JSON summary)."""
    out = tmp_path_factory.mktemp("figures")
    return out, run_reproduce(out, "knights", "--scale", "tiny")


def test_the_domain_selects_the_figure_and_the_figure_is_not_the_domain():
    assert [f.name for f in registry.resolve("knights")] == [NAME]
    assert registry.resolve("Knights_Replication")[0].domain == "knights"
    assert NAME != "knights" and "knights" not in registry.figures()
    assert NAME in {f.name for f in registry.resolve("all")}
    # The documented best setting (docs/tournaments.md: gentle), at the two real scales.
    for scale in ("small", "paper"):
        s = knights.SCALES[scale]
        assert s.agents == 64 and s.replication == knights.Replication(20, 0.125, 0.01, 1.0, 2)


def test_both_runs_are_stored_at_equal_compute_with_ordered_best_mean_worst(tiny_knights):
    out, summary = tiny_knights
    data = read_figure(out / f"{NAME}.h5")
    assert data.domain == "knights" and data.scale == "tiny"
    assert list(data.groups) == ["none", "replication", "final"]
    budget = data.attrs["agent_turns_budget"]
    assert budget == TINY.agent_turns and data.attrs["opponent"] == "greedy"
    for run in ("none", "replication"):
        a = data.groups[run].arrays
        n = len(a["episode"])
        assert n >= 4 and all(v.shape == (n,) for v in a.values())
        # evaluation points: the first episode, then every eval_every episodes
        assert a["episode"][0] == 1 and np.all(a["episode"][1:] % TINY.eval_every == 0)
        assert np.all(np.diff(a["episode"]) > 0) and np.all(np.diff(a["seconds"]) >= 0)
        # compute = learning plies + ranking plies; the run stopped at the first point past the budget
        assert np.array_equal(a["agent_turns"], a["learning_turns"] + a["ranking_turns"])
        assert a["agent_turns"][-2] < budget <= a["agent_turns"][-1]
        for opponent in ("random", "greedy"):
            best, mean, worst = (a[f"{opponent}_{s}"] for s in ("best", "mean", "worst"))
            assert np.all((worst >= 0) & (best <= 1))
            assert np.all(best >= mean) and np.all(mean >= worst)
        assert np.any(a["random_best"] > a["random_worst"])  # not a degenerate all-equal curve
        final = data.groups["final"].arrays[f"{run}_quality_greedy"]
        assert final.shape == (TINY.agents,)
        attrs = data.groups[run].attrs
        assert attrs["episodes"] == a["episode"][-1] and attrs["agent_turns"] == a["agent_turns"][-1]
        assert (attrs["final_best"], attrs["final_mean"], attrs["final_worst"]) == (
            final.max(), pytest.approx(final.mean()), final.min())
        entry = summary["figures"][0][run]
        assert entry["greedy_mean"] == pytest.approx(final.mean(), abs=1e-4)
        assert entry["episodes"] == attrs["episodes"]
    assert np.all(data.groups["none"].arrays["ranking_turns"] == 0)
    assert data.groups["replication"].arrays["ranking_turns"][-1] > 0


def test_the_replication_run_replicated_and_the_other_did_not(tiny_knights):
    data = read_figure(tiny_knights[0] / f"{NAME}.h5")
    none, rep = data.groups["none"].arrays, data.groups["replication"].arrays
    assert np.all(none["copies"] == 0) and np.all(none["founders"] == TINY.agents)
    # one copy (12.5 % of 8 agents) at every replication, i.e. every 2 episodes
    per_generation = round(TINY.replication.fraction * TINY.agents)
    assert np.array_equal(rep["copies"], rep["episode"] // TINY.replication.every * per_generation)
    assert rep["founders"][-1] < TINY.agents and np.all(np.diff(rep["founders"]) <= 0)
    # Same seed: the same learning until the first selection, different populations after it.
    assert none["random_mean"][0] == rep["random_mean"][0] and none["greedy_mean"][0] == rep["greedy_mean"][0]
    assert none["learning_turns"][0] == rep["learning_turns"][0]
    final = data.groups["final"].arrays
    assert not np.array_equal(final["none_quality_random"], final["replication_quality_random"])


@pytest.mark.parametrize("run", ["none", "replication"])
def test_each_run_is_the_training_run_its_command_names(tiny_knights, tmp_path, capsys, run):
    """The curves are `popplay train knights` with --episodes where the run stopped."""
    data = read_figure(tiny_knights[0] / f"{NAME}.h5")
    group = data.groups[run]
    argv = shlex.split(group.attrs["command"])
    assert argv[:3] == ["popplay", "train", "knights"]
    assert ("--replicate-every" in argv) == (run == "replication")
    path = tmp_path / "run.h5"
    assert main(argv[1:] + ["--out", str(path), "--json"]) == 0
    capsys.readouterr()
    with h5py.File(path) as f:
        curves = {name: f[f"curves/{name}"][()] for name in f["curves"]}
        events = f["state/lineage_event"][()]
    episode = np.arange(1, len(curves["agent_steps"]) + 1)
    fresh = curves["eval_episode"] == episode
    a = group.arrays
    assert np.array_equal(episode[fresh], a["episode"])
    assert np.array_equal(curves["agent_steps"][fresh], a["learning_turns"])
    for name in ("random_best", "random_mean", "random_worst", "greedy_best", "greedy_mean", "greedy_worst"):
        assert np.array_equal(curves[name][fresh], a[name]), name
    assert np.count_nonzero(events == 1) == a["copies"][-1]  # lineage copy records


def test_plot_redraws_the_figure(tiny_knights, tmp_path, capsys):
    import matplotlib.image

    png = tmp_path / "again.png"
    assert main(["plot", str(tiny_knights[0] / f"{NAME}.h5"), "--out", str(png)]) == 0
    assert NAME in capsys.readouterr().out
    image = matplotlib.image.imread(png)
    assert image.shape[1] > 1200  # three panels side by side
    assert (image[..., :3] < 0.9).mean() > 0.005
    red = (image[..., 0] > 0.7) & (image[..., 1] < 0.35) & (image[..., 2] < 0.35)
    blue = (image[..., 2] > 0.6) & (image[..., 0] < 0.3)
    assert red.sum() > 100 and blue.sum() > 100  # both runs drawn
