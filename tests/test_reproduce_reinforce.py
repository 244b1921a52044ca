"""`popplay reproduce reinforce_workers`: the parameter-server draft's running reward for several worker
counts (tiny scale), and that each curve is what `popplay train reinforce` learns."""

import numpy as np
import pytest

from popplay.checkpoints.validation import load_run
from popplay.cli.main import main
from popplay.reproduce import registry, reinforce
from popplay.reproduce.data import read_figure
from tests.conftest import run_reproduce

TINY = reinforce.SCALES["tiny"]
NAME = "reinforce_workers"


@pytest.fixture(scope="module")
def tiny_figure(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    return out, run_reproduce(out, "reinforce", "--scale", "tiny", "--seed", "3")


def test_the_domain_selects_the_figure_and_the_paper_scale_is_the_seeds():
    assert [f.name for f in registry.resolve("reinforce")] == [NAME]
    assert NAME in {f.name for f in registry.resolve("all")}
    paper = reinforce.SCALES["paper"]
    assert paper.workers == (1, 5, 10, 15) and paper.seeds >= 8 and paper.updates == 200


def test_every_worker_count_has_every_seed_and_their_statistics(tiny_figure):
    out, summary = tiny_figure
    data = read_figure(out / f"{NAME}.h5")
    assert (out / f"{NAME}.png").stat().st_size > 0
    assert list(data.groups) == [f"workers_{w}" for w in TINY.workers]
    for workers in TINY.workers:
        group = data.groups[f"workers_{workers}"]
        a = group.arrays
        assert np.array_equal(a["update"], np.arange(1, TINY.updates + 1))
        seeds = np.stack([a[f"seed_{3 + k}"] for k in range(TINY.seeds)])
        assert seeds.shape == (TINY.seeds, TINY.updates)
        assert not np.array_equal(seeds[0], seeds[1])  # different seeds, different runs
        np.testing.assert_allclose(a["mean"], seeds.mean(axis=0))
        np.testing.assert_allclose(a["std"], seeds.std(axis=0))
        assert np.all(a["min"] <= a["mean"]) and np.all(a["mean"] <= a["max"])
        assert group.attrs["final_mean"] == pytest.approx(seeds[:, -1].mean())
        assert summary["figures"][0][f"workers_{workers}"]["final_mean"] == pytest.approx(seeds[:, -1].mean(), abs=0.01)
        assert group.attrs["env_steps"] >= TINY.seeds * workers * TINY.updates * 8  # CartPole lasts >= 8 steps


def test_a_curve_is_the_running_reward_of_popplay_train_reinforce(tiny_figure, tmp_path):
    data = read_figure(tiny_figure[0] / f"{NAME}.h5")
    run = tmp_path / "run.h5"
    assert main(["train", "reinforce", "--topology", "local", "--workers", "2", "--episodes", str(TINY.updates),
                 "--seed", "4", "--eval-episodes", "0", "--out", str(run)]) == 0
    stored = load_run(run).state["running_curve"]
    np.testing.assert_array_equal(data.groups["workers_2"].arrays["seed_4"], stored)
