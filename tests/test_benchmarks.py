"""``python benchmarks/run.py --quick``: runs, and writes the report it promises.

No timing assertions (the machine running the tests may be busy); only that every
section produces rows that say what was measured, with positive rates and ratios.
The dev install includes gymnasium, so every row, cart-pole's included, has its peer.
"""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench_run():
    """benchmarks/run.py as a module; sys.path and sys.modules restored afterwards."""
    path, modules = list(sys.path), set(sys.modules)
    spec = importlib.util.spec_from_file_location("popplay_benchmarks_run", ROOT / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if name in ("bandit", "cartpole", "knights", "_common", "popplay_benchmarks_run"):
            del sys.modules[name]


def test_quick_run_writes_json_and_markdown(bench_run, tmp_path, capsys):
    from popplay.core.backend import cuda_available

    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    report = bench_run.main(["--quick", "--quiet", "--json", str(out_json), "--markdown", str(out_md)])
    printed = capsys.readouterr().out

    data = json.loads(out_json.read_text())
    assert data["quick"] is True
    assert printed.startswith("WARNING: --quick") and out_md.read_text().startswith("WARNING: --quick")
    machine = data["machine"]
    for key in ("cpu", "cores", "numba_threads", "torch", "numba", "numpy", "gpu"):
        assert key in machine
    expected = ["bandit", "cartpole", "knights", "scaling-population", "scaling-threads"]
    assert data["sections"] == expected + (["gpu"] if cuda_available() else [])
    if not cuda_available():
        assert "no CUDA GPU: GPU rows skipped" in printed

    rows = data["rows"]
    assert len(rows) == len(report["rows"])
    assert {r["section"] for r in rows} == set(data["sections"])
    for row in rows:
        for key in ("domain", "backend", "device", "agents", "steps", "seconds", "rate", "rounds", "peer", "ratio",
                    "unit"):
            assert key in row, (key, row)
        assert row["steps"] > 0 and row["seconds"] > 0 and row["rate"] > 0
        assert row["rate"] == pytest.approx(row["steps"] / row["seconds"])
        if row["domain"] == "bandit":
            assert row["arms"] and row["trials"]
        if row["domain"] == "knights":
            assert row["games_per_agent"] and row["unit"] == "agent-turns/s"
        peer = row["peer"]
        assert peer is not None, row
        assert peer["rate"] > 0 and peer["name"]
        assert row["ratio"] == pytest.approx(row["rate"] / peer["rate"])

    bandit = [r for r in rows if r["section"] == "bandit"]
    assert {r["backend"] for r in bandit} >= {"numba", "torch"}
    assert any(r["peer"]["name"].startswith("Bell's report") for r in bandit)
    assert any(r["peer"]["name"].startswith("numpy") for r in bandit)
    threads = [r for r in rows if r["section"] == "scaling-threads"]
    assert {r["threads"] for r in threads} >= {1}
    assert data["knights_ceiling"]["turns_per_second"] > 0

    markdown = out_md.read_text()
    assert markdown.count("| domain | backend |") == len(data["sections"])
    assert "best of" in printed and "ratio" in printed


def test_gpu_section_runs_its_rows_on_torch_cpu(bench_run):
    """Without a GPU the GPU section's plumbing (sizes, OOM halving, rows, notes) still
    runs, on torch's CPU, so that a lent GPU does not meet it for the first time."""
    bench = bench_run.Bench(bench_run.QUICK, lambda text: None)
    bench.gpu(device="cpu")
    rows = [r for r in bench.rows if r["section"] == "gpu"]
    assert [r["domain"] for r in rows] == ["bandit", "cartpole", "knights"]
    for row in rows:
        assert row["backend"] == "torch" and row["device"] == "cpu"
        assert row["rate"] > 0 and row["peer"]["rate"] > 0
    assert rows[0]["agents"] * rows[0]["trials"] == 256 * 16
    assert "games per episode" in rows[2]["notes"]
    assert any("GPU memory" in note for note in bench.notes["gpu"])


def test_gpu_benchmark_without_a_gpu_says_so_in_one_line(capsys):
    from popplay.core.backend import cuda_available

    if cuda_available():
        pytest.skip("a GPU is here: benchmarks/gpu.py would measure")
    path, modules = list(sys.path), set(sys.modules)
    spec = importlib.util.spec_from_file_location("popplay_benchmarks_gpu", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        assert module.main([]) == 0
        assert module.main(["--domains", "bandit,chess"]) == 2  # refused before anything runs, GPU or not
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            if name in ("run", "bandit", "cartpole", "knights", "_common", "popplay_benchmarks_gpu"):
                del sys.modules[name]
    captured = capsys.readouterr()
    assert captured.out == "benchmarks/gpu.py: no CUDA GPU on this machine; nothing measured\n"
    assert captured.err == "benchmarks/gpu.py: --domains: unknown engine 'chess' (bandit, cartpole, knights)\n"


def test_only_a_whole_default_run_writes_the_project_figures(bench_run):
    import argparse

    def path(**given):
        args = argparse.Namespace(**{"quick": False, "markdown": None, "compile": False, "json": None, **given})
        return bench_run.report_path(args, given.pop("wanted", list(bench_run.SECTIONS)))

    assert path().endswith("results/run.json")
    assert path(markdown="bandit.md") is None and path(quick=True) is None and path(compile=True) is None
    assert bench_run.report_path(argparse.Namespace(quick=False, markdown=None, compile=False, json=None),
                                 ["bandit"]) is None
    assert path(markdown="x.md", json="mine.json") == "mine.json"
