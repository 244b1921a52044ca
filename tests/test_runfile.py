"""Run files: atomic writes and reads that trust nothing in the file."""
import h5py
import numpy as np
import pytest

from popplay.checkpoints import runfile
from popplay.checkpoints.runfile import RunFileError, write_run
from popplay.checkpoints.validation import load_run


def _write(path, **overrides):
    kwargs = dict(
        domain="bandit", config={"agents": 2, "arms": 3, "note": None}, state={"q": np.ones((2, 3))},
        state_counters={"step": 4}, static={"environment/means": np.zeros((2, 3))},
        curves={"agent_steps": [1, 2], "seconds": [0.1, 0.2], "quality": [0.5, 0.75]},
        results={"correct": np.array([1.0, 0.5])}, result_attrs={"quality": 0.75},
        attrs={"phases": 2}, complete=True,
    )
    kwargs.update(overrides)
    write_run(path, **kwargs)


def test_round_trip(tmp_path):
    path = tmp_path / "r.h5"
    _write(path)
    run = load_run(path, expected_domain="bandit")
    assert run.domain == "bandit" and run.complete
    assert run.config == {"agents": 2, "arms": 3, "note": None}
    assert np.array_equal(run.state["q"], np.ones((2, 3))) and run.state_counters == {"step": 4}
    assert run.static["environment/means"].shape == (2, 3)
    assert run.curves["quality"].tolist() == [0.5, 0.75]
    assert run.result_attrs["quality"] == 0.75
    assert set(run.versions) >= {"python", "numpy", "numba", "torch", "h5py", "popplay"}


def test_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "r.h5"
    _write(path)
    before = path.read_bytes()
    with pytest.raises(TypeError):
        _write(path, results={"bad": np.array(["text"])})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.h5"]


def test_wrong_domain_and_schema_versions_are_explained(tmp_path):
    path = tmp_path / "r.h5"
    _write(path)
    with pytest.raises(RunFileError, match="a bandit run, not a knights run"):
        load_run(path, expected_domain="knights")
    intact = path.read_bytes()
    with h5py.File(path, "a") as f:  # an edited domain is damage, not another kind of run
        f.attrs["domain"] = "zzz"
    with pytest.raises(RunFileError, match="damaged run file"):
        load_run(path, expected_domain="knights")
    path.write_bytes(intact)
    for version, word in ((runfile.SCHEMA_VERSION + 1, "newer"), (0, "older")):
        with h5py.File(path, "a") as f:
            f.attrs["schema_version"] = version
        with pytest.raises(RunFileError, match=word):
            load_run(path)


def test_foreign_hdf5_is_not_a_run_file(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(RunFileError, match="not a popplay run file"):
        load_run(path)


def test_links_external_storage_and_virtual_datasets_are_refused(tmp_path):
    secret = tmp_path / "secret.h5"
    with h5py.File(secret, "w") as f:
        f["data"] = np.arange(4.0)
    raw = tmp_path / "raw.bin"
    np.arange(4.0).tofile(raw)
    cases = {
        "external link": lambda f: f["state"].__setitem__("q2", h5py.ExternalLink(str(secret), "data")),
        "soft link": lambda f: f["state"].__setitem__("q2", h5py.SoftLink("/state/q")),
        "external storage": lambda f: f["state"].create_dataset("q2", shape=(4,), dtype="f8",
                                                                external=[(str(raw), 0, 32)]),
        "virtual": lambda f: f["state"].create_virtual_dataset(
            "q2", _layout(secret)),
    }
    for name, craft in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.h5"
        _write(path)
        with h5py.File(path, "a") as f:
            craft(f)
        with pytest.raises(RunFileError, match="refused"):
            load_run(path)


def _layout(source):
    layout = h5py.VirtualLayout(shape=(4,), dtype="f8")
    layout[:] = h5py.VirtualSource(str(source), "data", shape=(4,))
    return layout


def test_check_writable(tmp_path):
    runfile.check_writable(tmp_path / "new.h5")
    with pytest.raises(RunFileError, match="does not exist"):
        runfile.check_writable(tmp_path / "nope" / "new.h5")
    with pytest.raises(RunFileError, match="directory"):
        runfile.check_writable(tmp_path)
