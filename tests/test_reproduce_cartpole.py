"""`popplay reproduce cartpole`: Bell's Figures 6-9 at the tiny scale."""
import contextlib
import io
import json

import h5py
import numpy as np
import pytest

from popplay.cli.main import main
from popplay.games.cartpole.rules import CartPolePopulationParams
from popplay.core.backend import Backend
from popplay.games.cartpole.experiment import CartPoleExperiment
from popplay.reproduce import cartpole, registry
from popplay.reproduce.data import read_figure
from popplay.training.loop import run
from tests.test_reproduce import _assert_png

TINY = cartpole.SCALES["tiny"]
FIGURES = ("figure6", "figure7", "figure8", "figure9")


@pytest.fixture(scope="module")
def tiny_cartpole(tmp_path_factory):
    """All four cart-pole figures at the tiny scale, computed once: (directory, JSON
    summary, progress notes)."""
    out = tmp_path_factory.mktemp("cartpole")
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        assert main(["reproduce", "cartpole", "--scale", "tiny", "--out", str(out), "--backend", "numba",
                     "--json"]) == 0
    return out, json.loads(stdout.getvalue().strip().splitlines()[-1]), stderr.getvalue()


def _curves(data, role="main"):
    return {name: g for name, g in data.groups.items() if "agents" in g.attrs and g.attrs["role"] == role}


def _stderr(per_trial):
    return per_trial.std(ddof=1) / np.sqrt(per_trial.size)


def test_every_figure_is_written_with_its_groups_and_summary(tiny_cartpole):
    out, summary, _ = tiny_cartpole
    assert summary["scale"] == "tiny" and [f["figure"] for f in summary["figures"]] == list(FIGURES)
    series = [a for a, _ in TINY.series()]
    names = [f"agents_{a}" for a in series]
    expected_groups = {"figure6": names, "figure7": names,
                       "figure8": names + [f"plain_agents_{a}" for a in series[1:]],
                       "figure9": names + ["bars"]}
    for entry in summary["figures"]:
        name = entry["figure"]
        assert entry["data"] == str(out / f"{name}.h5") and entry["png"] == str(out / f"{name}.png")
        _assert_png(out / f"{name}.png")
        with h5py.File(out / f"{name}.h5") as f:
            assert f.attrs["figure"] == name.encode() and f.attrs["domain"] == b"cartpole"
            assert json.loads(f.attrs["groups_json"]) == expected_groups[name]
            assert f.attrs["trials"] == TINY.trials and f.attrs["test_steps"] == TINY.test_steps
            assert f.attrs["agent_steps_budget"] == TINY.agent_steps and f.attrs["seed"] == 0
            assert f.attrs["backend"] == b"numba" and f.attrs["scale"] == b"tiny"
            params = json.loads(f.attrs["params_json"])
            assert (params["alpha"], params["lam"], params["bias_decay"]) == (0.3, 0.99, TINY.bias_decay)
    by_name = {f["figure"]: f for f in summary["figures"]}
    assert set(by_name["figure6"][f"quality_at_{TINY.agent_steps}_agent_steps"]) == {str(a) for a in series}
    assert set(by_name["figure9"]["quality_at_time_differentiated"]) == {str(a) for a in series}


def test_figure6_curves_sit_on_the_sharing_points_within_the_ceiling(tiny_cartpole):
    data = read_figure(tiny_cartpole[0] / "figure6.h5")
    assert data.attrs["differentiation"] == 0
    for agents, every in TINY.series():
        group = data.groups[f"agents_{agents}"]
        arrays = group.arrays
        points = TINY.agent_steps // agents // every
        assert arrays["agent_steps"].dtype == np.int64
        assert np.array_equal(arrays["agent_steps"], np.arange(1, points + 1) * every * agents)
        assert arrays["quality"].shape == arrays["stderr"].shape == (points,)
        assert np.all((arrays["quality"] > 0) & (arrays["quality"] <= TINY.test_steps))
        assert np.all(arrays["stderr"] >= 0) and np.all(arrays["stderr"] < TINY.test_steps)
        assert (group.attrs["agents"], group.attrs["share_every"], group.attrs["bias"]) == (agents, every, 0.0)


def test_figure6_matches_a_train_run_with_the_same_settings(tiny_cartpole, tmp_path):
    """reproduce and `popplay train cartpole` are the same experiment, bit for bit."""
    agents, every = TINY.groups[0]
    path = tmp_path / "run.h5"
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["train", "cartpole", "--agents", str(agents), "--trials", str(TINY.trials),
                     "--agent-steps", str(TINY.agent_steps), "--share-every", str(every), "--bias", "0",
                     "--test-steps", str(TINY.test_steps), "--seed", "0", "--backend", "numba", "--out", str(path),
                     "--json"])
    assert code == 0
    arrays = read_figure(tiny_cartpole[0] / "figure6.h5").groups[f"agents_{agents}"].arrays
    with h5py.File(path) as f:
        assert np.array_equal(f["curves/agent_steps"][()], arrays["agent_steps"])
        assert np.array_equal(f["curves/quality"][()], arrays["quality"])
        assert arrays["stderr"][-1] == pytest.approx(_stderr(f["results/balanced_steps"][()]), rel=1e-12)


def test_each_batch_learns_once_as_far_as_the_chosen_figures_need(tiny_cartpole):
    notes = [line for line in tiny_cartpole[2].splitlines() if f" x {TINY.trials} trials, " in line]
    batches = [line.split(" x ")[0] for line in notes]
    assert sorted(batches) == sorted(
        ["cartpole: 1 agent"] + [f"cartpole: {a} agents{suffix}" for a, _ in TINY.groups
                                 for suffix in ("", f" (bias {TINY.bias:g})")])


def test_figures_computed_directly_continue_their_batches_to_the_same_numbers(tiny_cartpole):
    """Without the driver's plan a batch keeps its state: Figure 8's shorter runs are
    continued for Figure 9 and give the numbers of the driver's single runs."""
    from popplay.reproduce.driver import Session

    session = Session("tiny", 0, Backend("numba", "cpu"))
    short = cartpole.compute_figure8(session)
    assert any(short.groups[f"agents_{a}"].arrays["agent_steps"][-1] < TINY.agent_steps for a, _ in TINY.groups)
    direct = cartpole.compute_figure9(session)
    stored = read_figure(tiny_cartpole[0] / "figure9.h5")
    for agents, _ in TINY.series():
        for key in ("agent_steps", "quality", "stderr"):
            assert np.array_equal(direct.groups[f"agents_{agents}"].arrays[key],
                                  stored.groups[f"agents_{agents}"].arrays[key])


def test_differentiated_curves_match_an_uninterrupted_experiment(tiny_cartpole):
    """Figure 9's curves are plain CartPoleExperiment runs with differentiation."""
    data = read_figure(tiny_cartpole[0] / "figure9.h5")
    assert data.attrs["differentiation"] == 1
    for agents, every in TINY.groups:
        params = CartPolePopulationParams(agents=agents, trials=TINY.trials, steps_per_agent=TINY.agent_steps // agents,
                                          share_every=every, bias=TINY.bias, bias_decay=TINY.bias_decay,
                                          test_steps=TINY.test_steps, seed=0)
        result = run(CartPoleExperiment(params, Backend("numba", "cpu")))
        arrays = data.groups[f"agents_{agents}"].arrays
        assert data.groups[f"agents_{agents}"].attrs["bias"] == TINY.bias
        assert np.array_equal(np.array(result.curve.agent_steps), arrays["agent_steps"])
        assert np.array_equal(np.array(result.curve.metrics["quality"]), arrays["quality"])
    # Differentiation changes the learning: some group's curve differs from Figure 6's.
    plain = read_figure(tiny_cartpole[0] / "figure6.h5")
    assert any(not np.array_equal(plain.groups[f"agents_{a}"].arrays["quality"],
                                  data.groups[f"agents_{a}"].arrays["quality"]) for a, _ in TINY.groups)
    # ...but not the single agent's, which is never differentiated.
    assert np.array_equal(plain.groups["agents_1"].arrays["quality"], data.groups["agents_1"].arrays["quality"])


@pytest.mark.parametrize("name", ["figure7", "figure8"])
def test_learning_time_curves_are_timed_per_trial_up_to_the_single_agents_time(tiny_cartpole, name):
    out = tiny_cartpole[0]
    data = read_figure(out / f"{name}.h5")
    reference = data.attrs["single_agent_seconds"]
    assert reference > 0 and 0.0 <= data.attrs["other_cpu_while_timing"] <= 1.0
    steps_figure = read_figure(out / ("figure6.h5" if name == "figure7" else "figure9.h5"))
    single = data.groups["agents_1"].arrays
    assert single["agent_steps"][-1] == TINY.agent_steps and single["seconds"][-1] == reference
    for agents, every in TINY.series():
        arrays = data.groups[f"agents_{agents}"].arrays
        seconds, steps = arrays["seconds"], arrays["agent_steps"]
        assert steps.shape == seconds.shape == arrays["quality"].shape == arrays["stderr"].shape
        assert np.all(np.diff(seconds) >= 0) and np.all(seconds > 0)
        assert np.array_equal(steps, np.arange(1, len(steps) + 1) * every * agents)
        if agents > 1:
            assert seconds[-1] >= reference  # at least the single agent's learning time
            assert len(seconds) == 1 or seconds[-2] < reference  # ...and stopped at the first such point
        # Quality at a point is the batch's: the same as the step figure's at equal agent-steps.
        other = steps_figure.groups[f"agents_{agents}"].arrays
        mine, theirs = np.isin(steps, other["agent_steps"]), np.isin(other["agent_steps"], steps)
        assert mine.any()
        assert np.array_equal(arrays["quality"][mine], other["quality"][theirs])
        assert np.array_equal(arrays["stderr"][mine], other["stderr"][theirs])


def test_figure8_draws_figure7s_curves_for_comparison(tiny_cartpole):
    fig7, fig8 = (read_figure(tiny_cartpole[0] / f"{n}.h5") for n in ("figure7", "figure8"))
    assert fig8.attrs["single_agent_seconds"] == fig7.attrs["single_agent_seconds"]
    comparison = _curves(fig8, "comparison")
    assert sorted(comparison) == sorted(f"plain_agents_{a}" for a, _ in TINY.groups)
    for name, group in comparison.items():
        plain = fig7.groups[name.removeprefix("plain_")]
        assert group.attrs["bias"] == 0.0
        for key in ("agent_steps", "seconds", "quality"):
            assert np.array_equal(group.arrays[key], plain.arrays[key])
    for agents, _ in TINY.groups:
        assert fig8.groups[f"agents_{agents}"].attrs["bias"] == TINY.bias


def test_figure9_bars_are_the_ends_of_the_curves(tiny_cartpole):
    out = tiny_cartpole[0]
    fig = {n: read_figure(out / f"{n}.h5") for n in FIGURES}
    bars = fig["figure9"].groups["bars"].arrays
    assert bars["agents"].tolist() == [a for a, _ in TINY.series()]
    sources = {("steps", "plain"): "figure6", ("steps", "differentiated"): "figure9",
               ("time", "plain"): "figure7", ("time", "differentiated"): "figure8"}
    for (where, kind), source in sources.items():
        for i, agents in enumerate(bars["agents"]):
            curve = fig[source].groups[f"agents_{agents}"].arrays
            assert bars[f"quality_at_{where}_{kind}"][i] == curve["quality"][-1]
            assert bars[f"stderr_at_{where}_{kind}"][i] == curve["stderr"][-1]
            if where == "time":
                assert bars[f"agent_steps_at_time_{kind}"][i] == curve["agent_steps"][-1]
                assert bars[f"seconds_at_time_{kind}"][i] == curve["seconds"][-1]
    # The single agent is the same with and without differentiation.
    assert bars["quality_at_steps_plain"][0] == bars["quality_at_steps_differentiated"][0]
    assert bars["quality_at_time_plain"][0] == bars["quality_at_time_differentiated"][0]


def test_plot_redraws_a_figure_data_file(tiny_cartpole, tmp_path):
    for name in ("figure7", "figure9"):
        png = tmp_path / f"{name}.png"
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            assert main(["plot", str(tiny_cartpole[0] / f"{name}.h5"), "--out", str(png)]) == 0
        assert name in stdout.getvalue() and str(png) in stdout.getvalue()
        _assert_png(png)


def test_scales_and_registry():
    paper = cartpole.SCALES["paper"]
    assert (paper.agent_steps, paper.trials, paper.test_steps) == (262144, 1024, 8192)
    assert [a for a, _ in paper.series()] == [1, 16, 64, 256, 1024, 4096]
    assert (paper.bias, paper.bias_decay) == (0.1, 1.2)
    for scale in cartpole.SCALES.values():
        scale.validate()
    with pytest.raises(ValueError, match="divide"):
        cartpole.CartPoleScale("bad", 4096, 8, ((16, 48),), 8, 1, 256).validate()
    assert [f.name for f in registry.resolve("cartpole")] == list(FIGURES)
    assert registry.resolve("Figure8")[0].name == "figure8"
    assert set(FIGURES) <= {f.name for f in registry.resolve("all")}
