"""`popplay reproduce` as a user meets it: data files, PNGs, errors, the figure registry."""
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from popplay.cli.main import main
from popplay.reproduce import bandit, registry
from popplay.reproduce.data import FigureData, Group, read_figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = bandit.SCALES["tiny"]


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _assert_png(path: Path, min_colours: int = 4) -> np.ndarray:
    """A real PNG with a drawing in it (not a blank canvas)."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200
    colours = np.unique(image.reshape(-1, image.shape[2]).round(2), axis=0)
    assert len(colours) >= min_colours
    assert (image[..., :3] < 0.9).mean() > 0.005  # a fair amount of ink
    return image


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    errors = [line for line in stderr.strip().splitlines() if line.startswith("Error")]
    assert len(errors) == 1
    assert stderr.strip().splitlines()[-1] == errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def tiny_bandit(tmp_path_factory):
    """All three bandit figures at the tiny scale, computed once for this module."""
    out = tmp_path_factory.mktemp("figures")
    assert main(["reproduce", "bandit", "--scale", "tiny", "--out", str(out), "--json"]) == 0
    return out


def test_reproduce_writes_every_bandit_figure_and_a_json_summary(tiny_bandit, capsys):
    # The fixture's stdout went to pytest; run figure2 alone again for the JSON line.
    code, stdout, _ = _run(capsys, ["reproduce", "figure2", "--scale", "tiny", "--out", str(tiny_bandit),
                                    "--json"])
    assert code == 0
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert [f["figure"] for f in summary["figures"]] == ["figure2"]
    entry = summary["figures"][0]
    assert entry["data"] == str(tiny_bandit / "figure2.h5") and entry["png"] == str(tiny_bandit / "figure2.png")
    finals = entry[f"quality_at_{TINY.agent_steps}_agent_steps"]
    assert set(finals) == {str(a) for a, _ in TINY.series()}
    for name in ("figure2", "figure3", "figure4"):
        assert (tiny_bandit / f"{name}.h5").is_file()
        _assert_png(tiny_bandit / f"{name}.png")


def test_figure2_data_has_one_curve_per_group_on_its_sharing_points(tiny_bandit):
    with h5py.File(tiny_bandit / "figure2.h5") as f:
        assert f.attrs["format"] == b"popplay-figure" and f.attrs["figure"] == b"figure2"
        assert f.attrs["arms"] == TINY.arms and f.attrs["trials"] == TINY.trials
        assert json.loads(f.attrs["groups_json"]) == [f"agents_{a}" for a, _ in TINY.series()]
        for agents, every in TINY.series():
            group = f[f"agents_{agents}"]
            steps, quality = group["agent_steps"][()], group["quality"][()]
            points = TINY.agent_steps // agents // every
            assert steps.dtype == np.int64 and steps.shape == quality.shape == (points,)
            assert np.array_equal(steps, np.arange(1, points + 1) * every * agents)
            assert np.all((quality >= 0) & (quality <= 1))
            assert group.attrs["agents"] == agents and group.attrs["share_every"] == every


def test_figure2_matches_a_train_run_with_the_same_settings(tiny_bandit, tmp_path, capsys):
    """reproduce and `popplay train bandit` are the same experiment, point for point."""
    agents, every = TINY.groups[0]
    run = tmp_path / "run.h5"
    code, _, _ = _run(capsys, ["train", "bandit", "--arms", str(TINY.arms), "--agents", str(agents),
                               "--trials", str(TINY.trials), "--agent-steps", str(TINY.agent_steps),
                               "--share-every", str(every), "--seed", "0", "--out", str(run), "--json"])
    assert code == 0
    data = read_figure(tiny_bandit / "figure2.h5")
    with h5py.File(run) as f:
        assert np.array_equal(f["curves/agent_steps"][()], data.groups[f"agents_{agents}"].arrays["agent_steps"])
        assert np.array_equal(f["curves/quality"][()], data.groups[f"agents_{agents}"].arrays["quality"])


def test_figure3_times_one_trial_and_every_group_gets_the_single_agents_time(tiny_bandit):
    data = read_figure(tiny_bandit / "figure3.h5")
    reference = data.attrs["single_agent_seconds"]
    assert reference > 0 and data.attrs["report_single_agent_seconds"] == pytest.approx(0.0377)
    assert 0.0 <= data.attrs["other_cpu_while_timing"] <= 1.0 and data.attrs["cpu_count"] >= 1
    single = data.groups["agents_1"].arrays
    assert single["agent_steps"][-1] == TINY.agent_steps and single["seconds"][-1] == reference
    for agents, every in TINY.series():
        arrays = data.groups[f"agents_{agents}"].arrays
        seconds, steps = arrays["seconds"], arrays["agent_steps"]
        assert steps.shape == seconds.shape == arrays["quality"].shape == arrays["seconds_batch_per_trial"].shape
        assert np.all(np.diff(seconds) >= 0) and np.all(seconds > 0)
        assert np.array_equal(steps, np.arange(1, len(steps) + 1) * every * agents)
        if agents > 1:
            assert seconds[-1] >= reference  # at least the single agent's learning time
            assert len(seconds) == 1 or seconds[-2] < reference  # ...and stopped at the first such point
    # Quality at a point is the batch's: the same as Figure 2's at the same agent-steps.
    fig2 = read_figure(tiny_bandit / "figure2.h5")
    for name, group in data.groups.items():
        steps2, quality2 = fig2.groups[name].arrays["agent_steps"], fig2.groups[name].arrays["quality"]
        common = np.isin(group.arrays["agent_steps"], steps2)
        assert np.array_equal(group.arrays["quality"][common], quality2[np.isin(steps2, group.arrays["agent_steps"])])


def test_figure4_bars_are_the_ends_of_figures_2_and_3(tiny_bandit):
    bars = read_figure(tiny_bandit / "figure4.h5").groups["bars"].arrays
    fig2, fig3 = read_figure(tiny_bandit / "figure2.h5"), read_figure(tiny_bandit / "figure3.h5")
    assert bars["agents"].tolist() == [a for a, _ in TINY.series()]
    for i, agents in enumerate(bars["agents"]):
        assert bars["quality_at_steps"][i] == fig2.groups[f"agents_{agents}"].arrays["quality"][-1]
        assert bars["quality_at_time"][i] == fig3.groups[f"agents_{agents}"].arrays["quality"][-1]
        assert bars["agent_steps_at_time"][i] == fig3.groups[f"agents_{agents}"].arrays["agent_steps"][-1]
    assert np.all(bars["stderr_at_steps"] >= 0) and np.all(bars["stderr_at_steps"] < 0.1)


def test_plot_redraws_a_figure_data_file(tiny_bandit, tmp_path, capsys):
    png = tmp_path / "again.png"
    code, stdout, _ = _run(capsys, ["plot", str(tiny_bandit / "figure4.h5"), "--out", str(png)])
    assert code == 0 and "figure4" in stdout and str(png) in stdout
    _assert_png(png)


def test_missing_matplotlib_keeps_the_data_and_fails_in_one_line(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # `import matplotlib...` now fails
    code, _, stderr = _run(capsys, ["reproduce", "figure2", "--scale", "tiny", "--out", str(tmp_path)])
    assert code == 2
    line = _one_error_line(stderr)
    assert 'pip install "popplay[plot]"' in line and str(tmp_path / "figure2.h5") in line
    assert not (tmp_path / "figure2.png").exists()
    data = read_figure(tmp_path / "figure2.h5")  # no work lost
    assert set(data.groups) == {f"agents_{a}" for a, _ in TINY.series()}


@pytest.mark.parametrize("argv, fragment", [
    (["reproduce", "figure99", "--scale", "tiny"], ("figure2, figure3, figure4",)),
    (["reproduce", "figure2", "--scale", "huge"], ("--scale",)),
    # numba has no CUDA; without a GPU the device is refused first
    (["reproduce", "figure2", "--scale", "tiny", "--device", "cuda", "--backend", "numba"], ("--backend", "--device")),
])
def test_bad_arguments_are_one_line_usage_errors(tmp_path, capsys, argv, fragment):
    code, _, stderr = _run(capsys, argv + ["--out", str(tmp_path / "figs")])
    assert code == 2
    line = _one_error_line(stderr)
    assert any(f in line for f in fragment)
    assert not (tmp_path / "figs").exists() or not any((tmp_path / "figs").iterdir())


def test_out_that_cannot_be_a_directory_is_refused_before_learning(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for out in (blocker, blocker / "sub"):
        code, stdout, stderr = _run(capsys, ["reproduce", "figure2", "--scale", "tiny", "--out", str(out)])
        assert code == 2 and "--out" in _one_error_line(stderr)
        assert "bandit:" not in stdout  # nothing was learned
    assert blocker.read_text() == "not a directory"


def test_scales_and_registry():
    paper = bandit.SCALES["paper"]
    assert (paper.arms, paper.agent_steps, paper.trials) == (100, 131072, 1024)
    assert [a for a, _ in paper.series()] == [1, 16, 64, 256, 1024, 8192]
    for scale in bandit.SCALES.values():
        scale.validate()
    assert [f.name for f in registry.resolve("bandit")] == ["figure2", "figure3", "figure4"]
    assert registry.resolve("Figure3")[0].name == "figure3"
    assert {"figure2", "figure3", "figure4"} <= {f.name for f in registry.resolve("all")}
    with pytest.raises(ValueError, match="figure2"):
        registry.resolve("figure1")


def test_a_new_domain_registers_its_figures_and_the_driver_runs_them(tmp_path, capsys, monkeypatch):
    """How cart-pole and knights add theirs: register a Figure; reproduce and plot follow."""
    monkeypatch.setattr(registry, "_FIGURES", dict(registry.figures()))

    def compute(ctx):
        steps = np.arange(1, 5) * 10
        return FigureData("toy1", "toy", ctx.scale, "A toy figure", attrs={"seed": ctx.seed},
                          groups={"curve": Group({"agent_steps": steps, "quality": steps / 40.0}, {"label": "toy"})})

    def draw(data, fig):
        ax = fig.add_subplot(1, 1, 1)
        group = data.groups["curve"]
        ax.plot(group.arrays["agent_steps"], group.arrays["quality"], marker="o", label=group.attrs["label"])
        ax.legend()

    registry.register(registry.Figure("toy1", "toy", "Toy", "a toy figure", compute, draw,
                                      lambda data: {"last": float(data.groups["curve"].arrays["quality"][-1])}))
    code, stdout, _ = _run(capsys, ["reproduce", "toy", "--scale", "tiny", "--out", str(tmp_path), "--seed", "3",
                                    "--json"])
    assert code == 0
    entry = json.loads(stdout.strip().splitlines()[-1])["figures"][0]
    assert entry["figure"] == "toy1" and entry["last"] == 1.0
    data = read_figure(tmp_path / "toy1.h5")
    assert data.domain == "toy" and data.attrs["seed"] == 3
    assert data.groups["curve"].arrays["quality"].tolist() == [0.25, 0.5, 0.75, 1.0]
    _assert_png(tmp_path / "toy1.png", min_colours=3)


def test_an_interrupted_reproduce_keeps_finished_figures_and_computes_the_rest(tmp_path, capsys, monkeypatch):
    """Issue 30 #12: figures are written as they finish; run again, the same settings
    keep them (nothing recomputed), the missing ones are computed; --fresh or other
    settings recompute."""
    monkeypatch.setattr(registry, "_FIGURES", dict(registry.figures()))
    computed = []

    def toy(name):
        def compute(ctx):
            computed.append(name)
            if name == "toy2" and len(computed) == 2:
                raise KeyboardInterrupt  # Ctrl-C while the second figure computes
            steps = np.arange(1, 4)
            return FigureData(name, "toy", ctx.scale, name, attrs={"seed": ctx.seed},
                              groups={"c": Group({"agent_steps": steps, "quality": steps * ctx.seed}, {"label": "c"})})

        def draw(data, fig):
            fig.add_subplot(1, 1, 1).plot(data.groups["c"].arrays["quality"])

        return registry.Figure(name, "toy", name, name, compute, draw,
                               lambda data: {"last": float(data.groups["c"].arrays["quality"][-1])})

    registry.register(toy("toy1"))
    registry.register(toy("toy2"))
    argv = ["reproduce", "toy", "--scale", "tiny", "--out", str(tmp_path), "--seed", "2"]
    with pytest.raises(KeyboardInterrupt):
        from popplay.reproduce.driver import ReproduceConfig, reproduce

        reproduce(ReproduceConfig("toy", "tiny", tmp_path, seed=2))
    assert (tmp_path / "toy1.h5").is_file() and (tmp_path / "toy1.png").is_file()
    assert not (tmp_path / "toy2.h5").exists()
    code, stdout, stderr = _run(capsys, argv + ["--json"])
    assert code == 0 and computed == ["toy1", "toy2", "toy2"]  # toy1 kept, toy2 computed
    entries = json.loads(stdout.strip().splitlines()[-1])["figures"]
    assert [(e["figure"], e["kept"], e["last"]) for e in entries] == [("toy1", True, 6.0), ("toy2", False, 6.0)]
    assert f"toy1: kept {tmp_path / 'toy1.h5'}" in stderr  # with --json, notes go to stderr
    assert _run(capsys, argv)[0] == 0 and computed == ["toy1", "toy2", "toy2"]  # both kept
    assert _run(capsys, argv[:-1] + ["3"])[0] == 0 and computed[3:] == ["toy1", "toy2"]  # another seed
    assert read_figure(tmp_path / "toy1.h5").groups["c"].arrays["quality"].tolist() == [3, 6, 9]
    assert _run(capsys, argv[:-1] + ["3", "--fresh"])[0] == 0 and computed[5:] == ["toy1", "toy2"]


def test_console_script_in_a_real_process(tmp_path):
    script = Path(sys.executable).with_name("popplay")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "popplay"]
    proc = subprocess.run(command + ["reproduce", "figure2", "--scale", "tiny", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"figure2: wrote {tmp_path / 'figure2.h5'} and {tmp_path / 'figure2.png'}" in proc.stdout
    _assert_png(tmp_path / "figure2.png")
    proc = subprocess.run(command + ["reproduce", "figure5", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("Error: unknown figure 'figure5'")
    assert len(proc.stderr.strip().splitlines()) == 1
