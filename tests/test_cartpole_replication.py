"""Selective replication with variation in cart-pole training: who is copied over
whom, what a copy takes and keeps, variation, lineage, divergence, resume, options.

(That numba, torch and the plain-Python reference replicate identically, bit for bit,
is in test_cartpole_engines.py.)"""
from __future__ import annotations

import dataclasses
import json

import h5py
import numpy as np
import pytest

from popplay.operators import evolution as evo
from popplay.cli.main import main
from popplay.games.cartpole.rules import CartPolePopulationParams
from popplay.core.backend import Backend
from popplay.games.cartpole.experiment import CartPoleExperiment

PARAMS = CartPolePopulationParams(agents=6, trials=2, steps_per_agent=96, share_every=32, test_steps=200, seed=9,
                                  epsilon=0.05, replicate_every=1, replicate_fraction=1 / 3, mutate_q=0.02,
                                  mutate_params=1.5)


def _numpy(x):
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def _prepared(backend, params=PARAMS):
    """An experiment, a state with known failure counts and distinct tables, α,
    traces and carts per agent (what replicate acts on), and distinct start tables."""
    ex = CartPoleExperiment(params, Backend(backend, "cpu"))
    state = ex.initial_state()
    g = np.random.default_rng(1)
    shape = (params.trials, params.agents)
    failures = np.array([[3, 0, 5, 1, 2, 4], [2, 2, 0, 7, 1, 2]], dtype=np.int64)
    arrays = {"q": g.normal(size=shape + (72,)), "weight": g.uniform(0.0, 1.0, shape + (72,)),
              "trace": g.uniform(0.0, 1.0, shape + (72,)), "cart": g.normal(size=shape + (4,)),
              "alpha": g.uniform(0.1, 0.9, shape), "lam": g.uniform(0.1, 0.9, shape),
              "epsilon": g.uniform(0.0, 0.1, shape), "start": g.normal(size=shape + (72,))}
    state = state._replace(failures=failures, **{k: _kind(ex, v) for k, v in arrays.items() if k != "start"})
    return ex, state, arrays, failures


def _kind(ex, array):
    """A copy of ``array`` as the experiment's backend holds it (replicate acts in place)."""
    return ex._to_backend(ex.initial_state()._replace(q=np.array(array)))[0]


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_the_fittest_are_copied_over_the_least_fit_by_index(backend):
    params = dataclasses.replace(PARAMS, mutate_q=0.0, mutate_params=1.0)
    ex, state, arrays, failures = _prepared(backend, params)
    ids_before = state.agent_id.copy()
    records_before = len(state.lineage)
    after = ex.replicate(state, 7, np.ones(failures.shape, dtype=bool), _kind(ex, arrays["start"]))
    # 2 of 6 per trial: fewest failures (ties: lower slot) over most failures (worst first)
    parents = {0: [1, 3], 1: [2, 4]}
    children = {0: [2, 5], 1: [3, 5]}
    start = arrays["start"]
    for t in range(2):
        c, par = children[t], parents[t]
        survivors = [i for i in range(6) if i not in c]
        for name in ("alpha", "lam", "epsilon"):
            got = _numpy(getattr(after, name))[t]
            np.testing.assert_array_equal(got[c], arrays[name][t][par], err_msg=name)
            np.testing.assert_array_equal(got[survivors], arrays[name][t][survivors], err_msg=name)
        # the parent's start table plus the child's own learned change
        q = _numpy(after.q)[t]
        np.testing.assert_array_equal(q[c], arrays["q"][t][c] + (start[t][par] - start[t][c]))
        np.testing.assert_allclose(q[c] - start[t][par], arrays["q"][t][c] - start[t][c], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(q[survivors], arrays["q"][t][survivors])
        for name in ("weight", "trace", "cart"):  # a copy keeps its own experience and cart
            np.testing.assert_array_equal(_numpy(getattr(after, name))[t], arrays[name][t], err_msg=name)
    np.testing.assert_array_equal(after.fitness, -failures.astype(float))
    assert not after.failures.any()  # counting starts again
    # new ids for the copies only, handed out row-major; the log names parent and replaced ids
    assert after.agent_id[0, [2, 5]].tolist() == [12, 13] and after.agent_id[1, [3, 5]].tolist() == [14, 15]
    changed = after.agent_id != ids_before
    assert changed.sum() == 4
    records = {k: v[records_before:] for k, v in after.lineage.records.items()}
    assert (records["event"] == evo.EVENTS["copy"]).all() and (records["generation"] == 7).all()
    assert records["agent"].tolist() == [12, 13, 14, 15]
    assert records["parent"].tolist() == [ids_before[0, 1], ids_before[0, 3], ids_before[1, 2], ids_before[1, 4]]
    assert records["replaced"].tolist() == [ids_before[0, 2], ids_before[0, 5], ids_before[1, 3], ids_before[1, 5]]
    assert records["group"].tolist() == [0, 0, 1, 1] and records["slot"].tolist() == [2, 5, 3, 5]
    np.testing.assert_array_equal(records["alpha"], [arrays["alpha"][0, 1], arrays["alpha"][0, 3],
                                                     arrays["alpha"][1, 2], arrays["alpha"][1, 4]])


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_copies_vary_by_the_streams_of_their_ids(backend):
    ex, state, arrays, failures = _prepared(backend)
    records_before = len(state.lineage)
    after = ex.replicate(state, 3, np.ones(failures.shape, dtype=bool), _kind(ex, arrays["start"]))
    child_ids = np.array([after.agent_id[0, [2, 5]], after.agent_id[1, [3, 5]]])
    noise = evo.gaussian_noise(PARAMS.seed, 3, child_ids, 72, PARAMS.mutate_q)
    factors = evo.vary_factors(PARAMS.seed, 3, child_ids, ("alpha", "lam", "epsilon"), PARAMS.mutate_params)
    start = arrays["start"]
    for t, (parents, children) in enumerate((([1, 3], [2, 5]), ([2, 4], [3, 5]))):
        inherited = arrays["q"][t, children] + (start[t, parents] - start[t, children])
        np.testing.assert_array_equal(_numpy(after.q)[t, children], inherited + noise[t])
        for name in ("alpha", "lam", "epsilon"):
            expected = np.clip(arrays[name][t, parents] * factors[name][t], 0.0, 1.0)
            np.testing.assert_array_equal(_numpy(getattr(after, name))[t, children], expected, err_msg=name)
    assert not np.allclose(_numpy(after.alpha)[0, [2, 5]], arrays["alpha"][0, [1, 3]])
    records = {k: v[records_before:] for k, v in after.lineage.records.items()}
    mutations = records["event"] == evo.EVENTS["mutation"]
    assert mutations.sum() == 4 and (records["noise"][mutations] == PARAMS.mutate_q).all()
    np.testing.assert_array_equal(records["agent"][mutations], child_ids.reshape(-1))
    np.testing.assert_array_equal(records["lam"][mutations], _numpy(after.lam)[[0, 0, 1, 1], [2, 5, 3, 5]])


def test_an_agent_that_may_not_be_a_parent_is_replaced_first():
    ex, state, arrays, failures = _prepared("numba", dataclasses.replace(PARAMS, mutate_q=0.0, mutate_params=1.0))
    eligible = np.ones(failures.shape, dtype=bool)
    eligible[0, 1] = False  # the fittest of trial 0
    after = ex.replicate(state, 2, eligible, arrays["start"])
    np.testing.assert_array_equal(after.alpha[0, 1], arrays["alpha"][0, 3])  # replaced by the best eligible
    np.testing.assert_array_equal(after.alpha[0, 2], arrays["alpha"][0, 4])  # the worst by failures: the next
    assert np.isnan(after.fitness[0, 1])


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_a_diverged_agent_is_never_copied_and_its_slot_gets_a_healthy_copy(backend):
    ex = CartPoleExperiment(PARAMS, Backend(backend, "cpu"))
    state = ex.phase(ex.initial_state(), time_left=None)
    ex.check_finite(state, phase=1)
    q = state.q.clone() if backend == "torch" else state.q.copy()
    q[1, 4, :] = float("nan")
    diverged = int(state.agent_id[1, 4])
    before = len(state.lineage)
    state = ex.phase(state._replace(q=q), time_left=None)
    events = ex.check_finite(state, phase=2)
    assert len(events) == 1 and "trial 1 agent 4" in events[0]
    assert np.isfinite(_numpy(state.q)).all() and np.isfinite(_numpy(state.shared)).all()
    records = {k: v[before:] for k, v in state.lineage.records.items()}
    quarantined = records["event"] == evo.EVENTS["quarantine"]
    assert records["agent"][quarantined].tolist() == [diverged]
    copies = records["event"] == evo.EVENTS["copy"]
    assert diverged not in records["parent"][copies]
    assert diverged in records["replaced"][copies]
    assert state.agent_id[1, 4] != diverged and np.isnan(state.fitness[1, 4])


def test_every_share_and_trial_reset_is_recorded():
    ex = CartPoleExperiment(PARAMS, Backend("numba", "cpu"))
    state = ex.initial_state()
    for _ in range(2):
        state = ex.phase(state, time_left=None)
    records = state.lineage.records
    shares = records["event"] == evo.EVENTS["share"]
    assert records["generation"][shares].tolist() == [1, 1, 2, 2] and records["group"][shares].tolist() == [0, 1] * 2
    assert (records["agent"][shares] == -1).all()
    assert (records["generation"][records["event"] == evo.EVENTS["copy"]] > 0).all()
    # a trial whose shared table diverged starts again with new founders and the run's α, λ, ε
    state.shared[0, 3] = np.nan
    old = state.agent_id[0].copy()
    events = ex.check_finite(state, phase=2)
    assert len(events) == 1 and "trial 0" in events[0]
    resets = state.lineage.records["event"] == evo.EVENTS["reset"]
    assert state.lineage.records["replaced"][resets].tolist() == old.tolist()
    assert state.agent_id[0].tolist() == state.lineage.records["agent"][resets].tolist()
    assert (state.alpha[0] == PARAMS.alpha).all() and (state.lam[0] == PARAMS.lam).all()


def test_replication_every_n_shares_ranks_by_the_failures_since_the_last_one():
    params = dataclasses.replace(PARAMS, replicate_every=2, mutate_q=0.0, mutate_params=1.0, steps_per_agent=128)
    plain = dataclasses.replace(params, replicate_every=0)
    ex = CartPoleExperiment(params, Backend("numba", "cpu"))
    state = ex.initial_state()
    counts, states = [], []
    for phase in range(1, 5):
        state = ex.phase(state, time_left=None)
        states.append(state)
        copies = state.lineage.records["event"] == evo.EVENTS["copy"]
        counts.append(int(copies.sum()))
    assert counts == [0, 4, 4, 8]  # 2 of 6 agents in each of 2 trials at shares 2 and 4
    assert states[0].failures.sum() > 0 and np.isnan(states[0].fitness).all()
    assert not states[1].failures.any()
    # Until the first selection both runs learn the same: it ranked the failures of phases 1 and 2.
    unreplicated = CartPoleExperiment(plain, Backend("numba", "cpu"))
    s = unreplicated.phase(unreplicated.phase(unreplicated.initial_state(), time_left=None), time_left=None)
    assert len(np.unique(s.failures)) > 2
    np.testing.assert_array_equal(states[1].fitness, -s.failures.astype(float))


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_state_round_trip_with_replication_continues_bit_identically(backend):
    def run(phases=None, state=None, ex=None):
        ex = ex or CartPoleExperiment(PARAMS, Backend(backend, "cpu"))
        state = ex.initial_state() if state is None else state
        done = 0
        while not ex.finished(state, time_mode=False) and (phases is None or done < phases):
            state = ex.phase(state, time_left=None)
            done += 1
        return ex, state

    ex, whole = run()
    first, half = run(phases=1)
    arrays = {k: np.array(v) for k, v in first.state_arrays(half).items()}
    fresh = CartPoleExperiment(PARAMS, Backend(backend, "cpu"))
    _, resumed = run(state=fresh.restore(arrays, dict(first.state_counters(half))), ex=fresh)
    expected = ex.state_arrays(whole)
    got = fresh.state_arrays(resumed)
    assert set(got) == set(expected) and "lineage_parent" in got
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert fresh.measure(resumed) == ex.measure(whole)


def test_restore_checks_the_new_arrays_and_reads_files_without_them():
    ex = CartPoleExperiment(PARAMS, Backend("numba", "cpu"))
    state = ex.phase(ex.initial_state(), time_left=None)
    arrays, counters = ex.state_arrays(state), ex.state_counters(state)
    for name, bad, message in (("alpha", arrays["alpha"] * 0.0, "alpha"), ("lam", arrays["lam"] + 1.0, "lam"),
                               ("agent_id", arrays["agent_id"][:, :2], "shape"),
                               ("agent_id", arrays["agent_id"] * 0, "twice"),
                               ("agent_id", arrays["agent_id"] + 10_000, "never handed out"),
                               ("failures", arrays["failures"] - 1, "negative")):
        with pytest.raises(ValueError, match=message):
            ex.restore({**arrays, name: bad}, counters)
    # Files of that time hold the full tables.
    old = {k: np.asarray(getattr(state, k)) for k in ("q", "trace", "weight", "cart", "action", "shared")}
    restored = ex.restore(old, counters)
    assert (restored.alpha == PARAMS.alpha).all() and restored.agent_id.tolist() == np.arange(12).reshape(2, 6).tolist()
    assert len(restored.lineage) == 12
    ex.phase(restored, time_left=None)  # and it goes on


SMALL = ["--agents", "4", "--trials", "3", "--share-every", "16", "--test-steps", "300", "--seed", "3",
         "--replicate-every", "2", "--replicate-fraction", "0.25", "--mutate-q", "0.01", "--mutate-params", "1.2"]


def test_cli_resume_with_replication_is_bit_identical(tmp_path, capsys):
    half, whole = tmp_path / "half.h5", tmp_path / "whole.h5"
    assert main(["train", "cartpole", *SMALL, "--agent-steps", "320", "--out", str(half), "--json"]) == 0
    assert main(["train", "cartpole", "--resume", str(half), "--agent-steps", "640", "--json"]) == 0
    assert main(["train", "cartpole", *SMALL, "--agent-steps", "640", "--out", str(whole), "--json"]) == 0
    capsys.readouterr()
    with h5py.File(half, "r") as a, h5py.File(whole, "r") as b:
        names = [f"state/{k}" for k in b["state"]] + [f"curves/{k}" for k in b["curves"] if k != "seconds"]
        assert "state/lineage_agent" in names and "curves/alpha_mean" in names
        assert sorted(a["state"]) == sorted(b["state"])
        for name in names:
            np.testing.assert_array_equal(a[name][()], b[name][()], err_msg=name)
        assert int(b["state/lineage_next_id"][0]) > 12  # copies happened
        assert b["config"].attrs["replicate_every"] == 2 and b["config"].attrs["mutate_q"] == 0.01
    assert main(["train", "cartpole", "--resume", str(half), "--replicate-every", "1"]) == 2
    assert "settings come from" in capsys.readouterr().err


def test_lineage_command_shows_one_trial(tmp_path, capsys):
    out = tmp_path / "rep.h5"
    assert main(["train", "cartpole", *SMALL, "--agent-steps", "320", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    assert main(["lineage", str(out), "--group", "1", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    with h5py.File(out, "r") as f:
        assert data["population"] == f["state/agent_id"][1].tolist()
    assert data["parameters"] == ["alpha", "lam", "epsilon", "noise"]
    assert all(n["group"] == 1 for n in data["nodes"])
    assert any(n["event"] == "copy" and n["alive"] for n in data["nodes"])
    assert main(["lineage", str(out), "--group", "1"]) == 0
    tree = capsys.readouterr().out
    assert "4 agents now" in tree and "born gen" in tree and "α=" in tree


@pytest.mark.parametrize("args, needle", [
    (["--replicate-every", "-1"], "--replicate-every"),
    (["--replicate-fraction", "0"], "--replicate-fraction"),
    (["--replicate-fraction", "0.6"], "--replicate-fraction"),
    (["--mutate-q", "-0.1"], "--mutate-q"),
    (["--mutate-q", "nan"], "--mutate-q"),
    (["--mutate-params", "0.5"], "--mutate-params"),
    (["--agents", "1", "--agent-steps", "64", "--replicate-every", "1"], "--agents"),
])
def test_bad_replication_options_give_one_line_and_exit_2(tmp_path, capsys, args, needle):
    out = tmp_path / "bad.h5"
    assert main(["train", "cartpole", "--agents", "4", "--trials", "2", "--agent-steps", "64", *args,
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error:") and needle in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("field, value, message", [
    ("replicate_every", -1, "replicate_every must be non-negative"),
    ("replicate_fraction", 0.0, "replicate_fraction must lie in"),
    ("replicate_fraction", 0.75, "replicate_fraction must lie in"),
    ("mutate_q", -1.0, "mutate_q must be non-negative"),
    ("mutate_q", float("inf"), "mutate_q must be finite"),
    ("mutate_params", 0.9, "mutate_params must be at least 1"),
    ("agents", 1, "agents must be at least 2 to replicate"),
])
def test_replication_params_are_validated(field, value, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(PARAMS, **{field: value}).validate()
