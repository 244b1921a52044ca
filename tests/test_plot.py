"""`popplay plot RUN.h5`: the curves of any run file as one PNG; clear one-line errors."""
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from popplay.checkpoints.runfile import write_run
from popplay.cli.main import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _image(path: Path) -> np.ndarray:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert (image[..., :3] < 0.9).mean() > 0.005  # something is drawn
    assert len(np.unique(image.reshape(-1, image.shape[2]).round(2), axis=0)) >= 4
    return image


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in stderr
    return lines[0]


@pytest.fixture(scope="module")
def bandit_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "bandit.h5"
    assert main(["train", "bandit", "--arms", "10", "--agents", "8", "--trials", "16", "--agent-steps", "512",
                 "--share-every", "16", "--out", str(out), "--json"]) == 0
    return out


def _fake_run(path: Path, domain: str, curves: dict, complete: bool = True) -> Path:
    """A run file of another domain, written by the run-file writer every domain uses."""
    write_run(path, domain=domain, config={"agents": 64, "games_per_agent": 4, "seed": 1},
              state={"w": np.zeros((64, 3))}, state_counters={"episode": 7}, static={}, curves=curves,
              results={}, result_attrs={}, attrs={"learning_seconds": 1.0, "phases": 3}, complete=complete)
    return path


def test_plot_a_bandit_run_beside_it_by_default(bandit_run, capsys):
    code, stdout, _ = _run(capsys, ["plot", str(bandit_run)])
    png = bandit_run.with_suffix(".png")
    assert code == 0 and stdout.strip() == f"{bandit_run}: drew bandit run curves; wrote {png}"
    image = _image(png)
    assert image.shape[:2] == (380, 1180)  # one panel (quality ± its standard error): one row, two columns


def _knights_curves():
    steps = np.arange(1, 7, dtype=np.int64) * 64
    evaluated = np.array([0.0, 0, 2, 2, 4, 4])  # evaluations at episodes 0, 2, 4; repeated between
    greedy = {"greedy_best": np.array([0.5, 0.5, 0.6, 0.6, 0.7, 0.7]),
              "greedy_mean": np.array([0.4, 0.4, 0.45, 0.45, 0.5, 0.5]),
              "greedy_worst": np.array([0.1, 0.1, 0.2, 0.2, 0.3, 0.3])}
    return {"agent_steps": steps, "seconds": np.arange(1, 7) * 0.5, "quality": greedy["greedy_mean"],
            "quality_se": np.full(6, 0.05), **greedy,
            **{name.replace("greedy", "random"): values + 0.2 for name, values in greedy.items()},
            "score_best": np.linspace(0.5, 0.9, 6), "score_worst": np.linspace(0.1, 0.3, 6), "eval_episode": evaluated}


def test_knights_runs_draw_best_mean_worst_of_every_opponent_on_one_axis():
    from popplay.plotting import _panels

    panels = _panels("knights", {k: v for k, v in _knights_curves().items() if k not in ("agent_steps", "seconds")})
    assert [name for name, _ in panels] == ["quality against", "score"]  # no eval_episode, quality_se curve
    assert [label for _, label, _ in panels[0][1]] == [f"{s} agent vs {o}" for o in ("greedy", "random")
                                                       for s in ("best", "mean", "worst")]


def test_plot_a_knights_run_into_a_missing_directory(tmp_path, capsys):
    run = _fake_run(tmp_path / "knights.h5", "knights", _knights_curves(), complete=False)
    png = tmp_path / "new" / "dir" / "out.png"
    code, stdout, _ = _run(capsys, ["plot", str(run), "--out", str(png), "--json"])
    assert code == 0 and '"domain": "knights"' in stdout and f'"png": "{png}"' in stdout
    assert _image(png).shape[:2] == (660, 1180)  # two panels: two rows


def test_plot_without_seconds_draws_against_agent_steps_only(tmp_path, capsys):
    run = _fake_run(tmp_path / "cp.h5", "cartpole", {"agent_steps": np.arange(1, 4) * 10,
                                                      "quality": np.array([10.0, 50.0, 90.0]),
                                                      "quality_se": np.array([1.0, 2.0, 3.0])})
    code, _, _ = _run(capsys, ["plot", str(run)])
    assert code == 0 and _image(run.with_suffix(".png")).shape[:2] == (380, 720)


@pytest.mark.parametrize("case, fragment", [
    ("missing", "no such file"),
    ("text", "not an HDF5 file"),
    ("foreign", "not a popplay run file"),
    ("damaged", "damaged"),
    ("empty curves", "no learning-curve points"),
    ("external link", "ExternalLink"),
])
def test_bad_files_are_one_line_errors(tmp_path, capsys, bandit_run, case, fragment):
    path = tmp_path / "bad.h5"
    if case == "text":
        path.write_text("hello")
    elif case == "foreign":
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(3)
    elif case == "damaged":
        data = bytearray(bandit_run.read_bytes())
        with h5py.File(bandit_run) as f:
            offset = f["curves/quality"].id.get_chunk_info(0).byte_offset  # chunked (fletcher32)
        data[offset] ^= 0xFF  # flip bits inside the quality curve
        path.write_bytes(bytes(data))
    elif case == "empty curves":
        _fake_run(path, "bandit", {"agent_steps": np.zeros(0, dtype=np.int64), "seconds": np.zeros(0),
                                   "quality": np.zeros(0)})
    elif case == "external link":
        _fake_run(path, "knights", {"agent_steps": np.arange(3), "seconds": np.arange(3.0),
                                    "quality": np.arange(3.0)})
        with h5py.File(path, "a") as f:
            f["curves/elsewhere"] = h5py.ExternalLink(str(bandit_run), "/curves/quality")
    code, _, stderr = _run(capsys, ["plot", str(path)])
    assert code == 2
    assert fragment in _one_error_line(stderr)
    assert not path.with_suffix(".png").exists()


@pytest.mark.parametrize("out, fragment", [
    ("SELF", "overwrite"),
    ("figure.jpg", "ending in .png"),
])
def test_bad_out_is_a_one_line_error(bandit_run, tmp_path, capsys, out, fragment):
    target = bandit_run if out == "SELF" else tmp_path / out
    before = bandit_run.read_bytes()
    code, _, stderr = _run(capsys, ["plot", str(bandit_run), "--out", str(target)])
    assert code == 2 and fragment in _one_error_line(stderr)
    assert bandit_run.read_bytes() == before


def test_missing_matplotlib_is_one_line_with_the_install_command(bandit_run, tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    png = tmp_path / "x.png"
    code, _, stderr = _run(capsys, ["plot", str(bandit_run), "--out", str(png)])
    assert code == 2
    assert 'pip install "popplay[plot]"' in _one_error_line(stderr)
    assert not png.exists()


def test_console_script_in_a_real_process(bandit_run, tmp_path):
    script = Path(sys.executable).with_name("popplay")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "popplay"]
    png = tmp_path / "curves.png"
    proc = subprocess.run(command + ["plot", str(bandit_run), "--out", str(png)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"wrote {png}")
    _image(png)


def test_report_curves_stop_at_the_axis_and_carry_standard_error_bands():
    from popplay.plotting import new_figure
    from popplay.reproduce.data import Group
    from popplay.reproduce.timing import plot_curves

    ax = new_figure().add_subplot(1, 1, 1)
    group = Group(arrays={"seconds": np.array([1.0, 2.0, 3.0, 9.0]), "quality": np.array([0.1, 0.2, 0.3, 0.4]),
                          "stderr": np.array([0.01, 0.02, 0.03, 0.04])}, attrs={"agents": 4, "label": "4 agents"})
    right = plot_curves(ax, [("g", group)], "seconds", until=2.5)
    assert right == 3.0  # the first point at or past 2.5 is the last one drawn
    assert list(ax.lines[0].get_xdata()) == [1.0, 2.0, 3.0]
    assert len(ax.collections) == 1  # the ±1 s.e. band


def test_titles_and_labels_name_the_run_not_the_latest_link(tmp_path):
    from popplay.checkpoints.runfile import display_name
    from popplay.tournaments.entrants import _labels

    real = tmp_path / "knights-20261126-101500.h5"
    real.write_bytes(b"")
    link = tmp_path / "latest-knights.h5"
    link.symlink_to(real.name)
    assert display_name(link) == real.name and display_name(real) == real.name
    assert _labels([link]) == ["knights-20261126-101500"]
