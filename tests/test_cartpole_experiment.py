"""The cart-pole experiment: runner contract, parameters, state round trips, quality."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from popplay.training import loop as runner
from popplay.games.cartpole.rules import CartPoleParams, CartPolePopulationParams, CartPoleState
from popplay.core import registry
from popplay.core.backend import Backend
from popplay.games.cartpole.experiment import CartPoleExperiment
from popplay.checkpoints.validation import params_from_config

SMALL = CartPolePopulationParams(agents=4, trials=3, steps_per_agent=96, share_every=32, test_steps=256,
                                 test_starts=2, bias=0.01, bias_decay=2.0, seed=11)


def _run(params, backend="numba", phases=None):
    ex = CartPoleExperiment(params, Backend(backend, "cpu"))
    state = ex.initial_state()
    done = 0
    while not ex.finished(state, time_mode=False) and (phases is None or done < phases):
        state = ex.phase(state, time_left=None)
        done += 1
    return ex, state


def test_registry_builds_it_and_params_round_trip_through_a_config():
    spec = registry.get("cartpole")
    assert spec.params_type() is CartPolePopulationParams
    assert spec.experiment_type() is CartPoleExperiment
    config = {**SMALL.to_dict(), "backend": "numba", "device": "cpu", "time_budget": None}
    assert params_from_config("cartpole", config, run_options=False) == SMALL
    physics = SMALL.physics()
    assert isinstance(physics, CartPoleParams)
    assert dataclasses.asdict(physics) == {f.name: getattr(SMALL, f.name) for f in dataclasses.fields(CartPoleParams)}


def test_runner_contract_shapes_and_counters():
    ex, state = _run(SMALL)
    assert isinstance(state, CartPoleState)
    assert state.q.shape == state.trace.shape == state.weight.shape == (3, 4, 72)
    assert state.cart.shape == (3, 4, 4) and state.action.shape == (3, 4) and state.shared.shape == (3, 72)
    assert state.step == 96 and state.shares == 3 and state.max_bias == 0.01 / 8
    assert ex.finished(state, time_mode=False) and not ex.finished(state, time_mode=True)
    assert ex.agent_steps(state) == 96 * 4 and ex.total_agent_steps(state) == 96 * 4 * 3
    assert ex.budget_agent_steps() == 96 * 4
    metrics = ex.measure(state)
    assert 0 <= metrics["quality"] <= 256 and 0 <= metrics["balanced"] <= 1
    results = ex.results(state)
    assert results["balanced_steps"].shape == (3,)
    assert results["balanced_steps"].mean() == pytest.approx(metrics["quality"])
    assert (state.weight == SMALL.initial_weight).all()
    # After a share every agent holds Q_total plus its own bias of at most max_bias.
    before = SMALL.bias / 4  # the bias of the last share, before its decay
    assert np.abs(state.q - state.shared[:, None, :]).max() <= before
    assert np.abs(state.q - state.shared[:, None, :]).max() > 0


def test_without_bias_every_agent_holds_the_shared_table():
    _, state = _run(dataclasses.replace(SMALL, bias=0.0))
    np.testing.assert_array_equal(state.q, np.broadcast_to(state.shared[:, None, :], state.q.shape))
    assert state.max_bias == 0.0


def test_phases_do_not_modify_their_input_state():
    ex = CartPoleExperiment(SMALL, Backend("numba", "cpu"))
    state = ex.initial_state()
    state = ex.phase(state, time_left=None)
    copies = {name: np.array(getattr(state, name)) for name in ("q", "trace", "weight", "cart", "action", "shared")}
    ex.phase(state, time_left=None)
    for name, copy in copies.items():
        np.testing.assert_array_equal(getattr(state, name), copy)


def test_kept_states_are_never_overwritten_by_recycled_buffers():
    """Phases reuse their output arrays once nobody refers to them; states that a
    caller keeps (here, a whole history) must stay as they were."""
    ex = CartPoleExperiment(dataclasses.replace(SMALL, steps_per_agent=32 * 8), Backend("numba", "cpu"))
    state = ex.initial_state()
    history, copies = [], []
    for _ in range(8):
        state = ex.phase(state, time_left=None)
        history.append(state)
        copies.append({name: np.array(getattr(state, name)) for name in ("q", "trace", "weight", "cart")})
    for kept, copy in zip(history, copies):
        for name, value in copy.items():
            np.testing.assert_array_equal(getattr(kept, name), value)
    # Dropped states' arrays are reused: the runner's pattern allocates nothing new.
    # A fresh experiment, because the history above still holds every pooled set: ids
    # of fresh arrays would then count only where the allocator reuses an address.
    ex = CartPoleExperiment(dataclasses.replace(SMALL, steps_per_agent=32 * 8), Backend("numba", "cpu"))
    state = ex.initial_state()
    seen = set()
    for _ in range(6):
        state = ex.phase(state, time_left=None)
        seen.add(id(state.q))
        assert any(state.q is pooled[0] for pooled in ex._buffers._sets)
    assert len(seen) == 2 and len(ex._buffers._sets) == 2


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_state_round_trip_continues_bit_identically(backend):
    """Save the state arrays/counters after one phase, restore them into a fresh
    experiment and continue: the result equals the uninterrupted run."""
    ex, whole = _run(SMALL, backend)
    first, state = _run(SMALL, backend, phases=1)
    arrays = {k: np.array(v) for k, v in first.state_arrays(state).items()}
    counters = dict(first.state_counters(state))
    fresh = CartPoleExperiment(SMALL, Backend(backend, "cpu"))
    resumed = fresh.restore(arrays, counters)
    while not fresh.finished(resumed, time_mode=False):
        resumed = fresh.phase(resumed, time_left=None)
    for name, value in ex.state_arrays(whole).items():
        np.testing.assert_array_equal(fresh.state_arrays(resumed)[name], value)
    assert fresh.state_counters(resumed) == ex.state_counters(whole)
    assert fresh.measure(resumed) == ex.measure(whole)


def test_restore_checks_shapes_and_values():
    ex, state = _run(SMALL, phases=1)
    arrays, counters = ex.state_arrays(state), ex.state_counters(state)
    with pytest.raises(ValueError, match="shape"):
        ex.restore({**arrays, "cart": arrays["cart"][:, :2]}, counters)
    with pytest.raises(ValueError, match="shape"):
        ex.restore({**arrays, "q_rows": np.zeros((1, 4, 72))}, counters)
    with pytest.raises(ValueError, match="q_trials"):
        ex.restore({**arrays, "q_trials": np.array([7]), "q_rows": np.zeros((1, 4, 72))}, counters)
    with pytest.raises(ValueError, match="missing"):
        ex.restore({k: v for k, v in arrays.items() if k != "trace_values"}, counters)
    with pytest.raises(ValueError, match="codes outside"):
        ex.restore({**arrays, "trace_codes": np.full_like(arrays["trace_codes"], arrays["trace_values"].size)},
                   counters)
    with pytest.raises(ValueError, match="missing"):
        ex.restore({k: v for k, v in arrays.items() if k not in ("trace_codes", "trace_values")}, counters)
    with pytest.raises(ValueError, match="action"):
        ex.restore({**arrays, "action": arrays["action"] + 2}, counters)
    with pytest.raises(ValueError, match="max_bias"):
        ex.restore(arrays, {**counters, "max_bias": -1.0})


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("bias", [0.0, 0.01])
def test_run_files_store_no_table_that_a_share_makes_redundant(backend, bias):
    """After a share Q is the shared table plus a bias the streams give again and every
    weight is initial_weight: neither is stored, yet restore gives back every bit; a
    trial reset after non-finite values (Q = 0, no bias) is stored as it is."""
    params = dataclasses.replace(SMALL, bias=bias)
    ex, state = _run(params, backend, phases=2)
    arrays = ex.state_arrays(state)
    assert "q" not in arrays and "weight" not in arrays and "trace" not in arrays
    assert arrays["q_trials"].size == 0 and arrays["q_rows"].shape == (0, 4, 72)
    assert arrays["trace_codes"].dtype == np.uint8 and arrays["trace_values"][0] == 0.0
    restored = ex.restore(arrays, ex.state_counters(state))
    for name in ("q", "trace", "weight", "cart", "shared"):
        np.testing.assert_array_equal(np.asarray(getattr(restored, name)), np.asarray(getattr(state, name)))
    state.q[1, 2, 5] = float("nan")
    assert len(ex.check_finite(state, phase=2)) == 1  # trial 1 starts again with Q = 0
    arrays = ex.state_arrays(state)
    # Without bias the reset trial's Q (0) is still its shared table (0): nothing stored.
    assert arrays["q_trials"].tolist() == ([1] if bias else []) and (arrays["q_rows"] == 0).all()
    restored = ex.restore(arrays, ex.state_counters(state))
    np.testing.assert_array_equal(np.asarray(restored.q), np.asarray(state.q))


def test_same_seed_same_results_other_seed_differs():
    _, a = _run(SMALL)
    _, b = _run(SMALL)
    _, c = _run(dataclasses.replace(SMALL, seed=12))
    np.testing.assert_array_equal(a.q, b.q)
    assert not np.array_equal(a.q, c.q)


def test_numba_and_torch_experiments_measure_the_same():
    ex_nb, s_nb = _run(SMALL, "numba")
    ex_th, s_th = _run(SMALL, "torch")
    assert ex_nb.measure(s_nb) == ex_th.measure(s_th)


def test_time_mode_runs_whole_phases_past_the_step_budget():
    params = dataclasses.replace(SMALL, steps_per_agent=32)
    ex = CartPoleExperiment(params, Backend("numba", "cpu"))
    result = runner.run(ex, time_budget=0.2)
    assert result.state.step % params.share_every == 0 and result.state.step > 0
    assert len(result.curve) == result.state.shares


@pytest.mark.parametrize("field, value, message", [
    ("agents", 0, "agents must be at least 1"),
    ("gamma", 1.5, "gamma must lie in"),
    ("lam", -0.1, "lam must lie in"),
    ("alpha", 0.0, "alpha must lie in"),
    ("epsilon", 2.0, "epsilon must lie in"),
    ("algorithm", "td", "algorithm must be one of"),
    ("trace", "dutch", "trace must be one of"),
    ("failure_reward", 0.0, "failure_reward must be negative"),
    ("bias_decay", 0.5, "bias_decay must be at least 1"),
    ("angle_boundary_degrees", 12.0, "failure angle"),
    ("position_boundary", 2.5, "track limit"),
    ("test_steps", 0, "test_steps must be at least 1"),
    ("alpha", float("nan"), "alpha must be finite"),
    ("pole_mass", -1.0, "pole_mass must be positive"),
])
def test_validation_names_the_bad_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(SMALL, **{field: value}).validate()
    with pytest.raises(ValueError):
        CartPoleExperiment(dataclasses.replace(SMALL, **{field: value}), Backend("numba", "cpu"))


@pytest.mark.slow
def test_population_is_at_least_as_good_as_one_agent_at_equal_agent_steps():
    """Bell §2.5 at the issue's size: 262,144 agent-time steps, 256 trials, defaults.
    A population of 256 sharing agents must match or beat the single agent."""
    budget = 262144
    single = CartPolePopulationParams(agents=1, trials=256, steps_per_agent=budget, share_every=budget)
    population = CartPolePopulationParams(agents=256, trials=256, steps_per_agent=budget // 256)
    quality = {}
    for name, params in (("single", single), ("population", population)):
        ex, state = _run(params)
        quality[name] = ex.measure(state)["quality"]
    assert quality["population"] >= quality["single"], quality


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_a_diverged_agent_is_reset_and_never_merged_into_the_share(backend):
    params = CartPolePopulationParams(agents=4, trials=2, steps_per_agent=64, share_every=16, test_steps=32)
    experiment = CartPoleExperiment(params, Backend(backend, "cpu"))
    state = experiment.phase(experiment.initial_state(), time_left=None)
    q = state.q.clone() if backend == "torch" else state.q.copy()
    q[1, 2, :] = float("nan")  # one agent's whole table diverges
    state = experiment.phase(state._replace(q=q), time_left=None)
    shared = np.asarray(state.shared)
    assert np.isfinite(shared).all() and np.isfinite(np.asarray(state.q)).all()
    events = experiment.check_finite(state, phase=2)
    assert len(events) == 1 and "trial 1 agent 2" in events[0] and "left out of the share" in events[0]
    assert experiment.check_finite(state, phase=3) == []
