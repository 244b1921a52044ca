"""Both backends against the plain-Python reference, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from popplay.core.backend import Backend
from popplay.games.cartpole.experiment import CartPoleExperiment
from popplay.games.cartpole.rules import CartPolePopulationParams, initial_state
from tests.reference import cartpole as ref

FIELDS = ("q", "trace", "weight", "cart", "action", "shared", "alpha", "lam", "epsilon")

CASES = {
    "sarsa-replacing": dict(algorithm="sarsa", trace="replacing"),
    "q-accumulating-bias": dict(algorithm="q", trace="accumulating", bias=0.05, bias_decay=1.5, trace_cutoff=0.1),
    "sarsa-accumulating-nocutoff": dict(algorithm="sarsa", trace="accumulating", bias=0.01, trace_cutoff=0.0),
    "sarsa-clock-restarts": dict(algorithm="sarsa", trace="accumulating", gamma=0.2, lam=0.005, trace_cutoff=0.0,
                                 epsilon=0.0),
    "q-replacing-frictionless": dict(algorithm="q", trace="replacing", trace_cutoff=0.3, cart_friction=0.0,
                                     pole_friction=0.0, initial_weight=0.0),
    # selection before every share, noisy copies, varied α/λ/ε: later phases learn
    # with per-agent parameters on every engine
    "sarsa-replication": dict(agents=5, replicate_every=1, replicate_fraction=0.4, mutate_q=0.05, mutate_params=2.0,
                              bias=0.02, trace="accumulating"),
    "q-replication-every-2": dict(agents=4, replicate_every=2, replicate_fraction=0.25, mutate_q=0.0,
                                  mutate_params=3.0, algorithm="q"),
}


def _params(**overrides) -> CartPolePopulationParams:
    base = dict(agents=3, trials=2, steps_per_agent=70, share_every=32, epsilon=0.2, alpha=0.3,
                test_steps=300, test_starts=2, seed=5)
    return CartPolePopulationParams(**{**base, **overrides})


def _states(params, backend, per_agent=None):
    ex = CartPoleExperiment(params, Backend(backend, "cpu"))
    state = ex.initial_state()
    if per_agent:
        state = state._replace(**{name: ex._to_backend(state._replace(**{name: np.array(v)}))._asdict()[name]
                                  for name, v in per_agent.items()})
    history = []
    while not ex.finished(state, time_mode=False):
        state = ex.phase(state, time_left=None)
        history.append(state)
    return ex, history


@pytest.mark.parametrize("case", list(CASES))
def test_numba_and_torch_equal_the_reference_exactly(case):
    params = _params(**CASES[case])
    ex, numba_history = _states(params, "numba")
    _, torch_history = _states(params, "torch")
    restarts = ref.CLOCK_RESTARTS[0]
    reference = ref.run(params, ex._keys.tolist(), ex._bias_keys.tolist())
    if case == "sarsa-clock-restarts":
        assert ref.CLOCK_RESTARTS[0] > restarts  # the clock-restart path ran
    assert len(reference) == len(numba_history) == len(torch_history) == 3
    failures = sum(sum(map(sum, snap["failures"])) for snap in reference)
    assert failures > 5  # the reset path ran
    for expected, got_nb, got_th in zip(reference, numba_history, torch_history):
        for name in FIELDS:
            np.testing.assert_array_equal(np.asarray(getattr(got_nb, name)), np.asarray(expected[name]), err_msg=name)
            np.testing.assert_array_equal(getattr(got_th, name).numpy(), np.asarray(expected[name]), err_msg=name)
        assert got_nb.max_bias == got_th.max_bias == expected["max_bias"]
        assert got_nb.step == expected["step"] and got_nb.shares == expected["shares"]
        np.testing.assert_array_equal(got_nb.agent_id, expected["agent_id"])
        np.testing.assert_array_equal(got_th.agent_id, expected["agent_id"])
    if params.replicate_every:
        assert reference[-1]["agent_id"] != reference[0]["agent_id"]  # copies happened
        if params.mutate_params > 1.0:
            assert len(set(np.ravel(reference[-1]["alpha"]))) > 1  # and varied the parameters
    last = reference[-1]["shared"]
    tests = [[ref.greedy_test(last[t], params, ex._test_keys[t, k]) for k in range(2)] for t in range(2)]
    np.testing.assert_array_equal(ex.balanced_steps(numba_history[-1]), tests)


@pytest.mark.parametrize("case", ["sarsa-replacing", "q-accumulating-bias", "sarsa-clock-restarts",
                                  "q-replication-every-2"])
def test_torch_results_do_not_depend_on_its_slot_count(case, monkeypatch):
    """The torch engine gives the passes over whole rows (deaths, failures, clock
    restarts) to a few slots a step; with room for almost none, phases overflow and are
    learned again with more, and every agent still equals numba's bit for bit."""
    from popplay.games.cartpole import _torch

    monkeypatch.setattr(_torch, "SLOT_MARGIN", 0)
    monkeypatch.setattr(_torch, "FIRST_PHASE_SHARE", 10_000)  # a first phase starts with 1 slot
    runs = []
    run = _torch.TorchCartPoleEngine._run
    monkeypatch.setattr(_torch.TorchCartPoleEngine, "_run", lambda self, *args: runs.append(min(args[-1])) or run(
        self, *args))
    params = _params(**{**CASES[case], "agents": 6, "trials": 3})
    _, numba_history = _states(params, "numba")
    _, torch_history = _states(params, "torch")
    assert len(runs) > len(torch_history)  # some phases overflowed and were learned again
    assert min(runs) < params.agents * params.trials  # with fewer slots than lanes
    for got_nb, got_th in zip(numba_history, torch_history):
        for name in FIELDS:
            np.testing.assert_array_equal(np.asarray(getattr(got_nb, name)), getattr(got_th, name).numpy(),
                                          err_msg=name)


def test_torch_slots_follow_the_same_steps_of_the_last_two_phases():
    from popplay.games.cartpole import _torch

    assert _torch._slots_for(0) == 16
    assert _torch._slots_for(100) == 256  # 1.25 x 100 + 16 = 141
    assert _torch._slots_for(500) == 1024
    params = _params(agents=64, trials=16, steps_per_agent=192, share_every=64)
    ex = CartPoleExperiment(params, Backend("torch", "cpu"))
    engine = ex._torch
    assert engine.plan(3, 1024) == [128] * 3  # before any phase: room for one lane in 16 (1.25 x 64 + 16)
    state = ex.initial_state()
    needs = []
    for _ in range(3):
        state = ex.phase(state, time_left=None)
        needs.append(engine._needs[-1])
    assert engine._needs == needs[1:] and all(len(n) == 64 for n in needs)
    assert len(set(needs[-1])) > 1  # steps of a phase needed different numbers of passes
    plan = engine.plan(64, 1024)
    assert plan == [min(_torch._slots_for(max(a, b)), 1024) for a, b in zip(*needs[1:])]
    assert len(set(plan)) > 1 and max(plan) < 1024  # steps get different room, all fewer than the lanes
    assert engine.plan(66, 1024)[64:] == [min(_torch._slots_for(max(max(n) for n in needs[1:])), 1024)] * 2
    # a new run on the same engine plans as a run in a process of its own would
    ex.initial_state()
    assert engine.plan(3, 1024) == [128] * 3


def test_per_agent_parameters_equal_the_reference_exactly():
    """Every agent learns with its own α, λ and ε, on every engine, bit for bit."""
    params = _params(agents=4, trials=2, steps_per_agent=64, share_every=32, bias=0.0, epsilon=0.1)
    g = np.random.default_rng(7)
    per_agent = {"alpha": g.uniform(0.05, 1.0, (2, 4)), "lam": g.uniform(0.0, 1.0, (2, 4)),
                 "epsilon": g.uniform(0.0, 0.5, (2, 4))}
    ex, numba_history = _states(params, "numba", per_agent)
    _, torch_history = _states(params, "torch", per_agent)
    reference = ref.run(params, ex._keys.tolist(), ex._bias_keys.tolist(),
                        {name: v.tolist() for name, v in per_agent.items()})
    _, uniform = _states(params, "numba")
    assert not np.array_equal(uniform[0].shared, numba_history[0].shared)  # the parameters mattered
    for expected, got_nb, got_th in zip(reference, numba_history, torch_history):
        for name in FIELDS:
            np.testing.assert_array_equal(np.asarray(getattr(got_nb, name)), np.asarray(expected[name]), err_msg=name)
            np.testing.assert_array_equal(getattr(got_th, name).numpy(), np.asarray(expected[name]), err_msg=name)


def test_initial_state_matches_the_reference():
    params = _params()
    ex = CartPoleExperiment(params, Backend("numba", "cpu"))
    state = initial_state(params)
    for t in range(params.trials):
        for i in range(params.agents):
            agent = ref.initial_agent(params, ex._keys[t, i])
            assert state.cart[t, i].tolist() == agent["cart"]
            assert state.action[t, i] == agent["action"]
    assert np.abs(state.cart).max() <= params.start_range
    assert (state.weight == params.initial_weight).all() and not state.q.any() and not state.trace.any()


def test_live_trace_bookkeeping_survives_long_phases():
    """Long phases with many failures, traces dying at the cutoff and Watkins cuts:
    the sparse numba update must still equal the dense torch one."""
    params = _params(agents=4, trials=2, steps_per_agent=600, share_every=300, epsilon=0.1, lam=0.95,
                     trace_cutoff=1e-4, algorithm="q", alpha=0.5)
    _, numba_history = _states(params, "numba")
    _, torch_history = _states(params, "torch")
    for got_nb, got_th in zip(numba_history, torch_history):
        for name in FIELDS:
            np.testing.assert_array_equal(np.asarray(getattr(got_nb, name)), getattr(got_th, name).numpy())
    live = (numba_history[-1].trace != 0).sum(-1)
    assert live.max() > 1


def test_results_do_not_depend_on_threads_or_population_layout():
    """An agent's stream depends on (seed, trial, agent) only: a trial run alone
    learns exactly what it learns inside a bigger batch (one agent, no sharing mix)."""
    big = _params(agents=1, trials=5, steps_per_agent=200, share_every=50)
    small = _params(agents=1, trials=2, steps_per_agent=200, share_every=50)
    _, hist_big = _states(big, "numba")
    _, hist_small = _states(small, "numba")
    np.testing.assert_array_equal(hist_big[-1].q[:2], hist_small[-1].q)
    np.testing.assert_array_equal(hist_big[-1].cart[:2], hist_small[-1].cart)


@pytest.mark.cuda
def test_torch_on_cuda_equals_numba():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    params = _params(**CASES["q-accumulating-bias"])
    _, numba_history = _states(params, "numba")
    ex = CartPoleExperiment(params, Backend("torch", "cuda"))
    state = ex.initial_state()
    for expected in numba_history:
        state = ex.phase(state, time_left=None)
        for name in FIELDS:
            np.testing.assert_array_equal(getattr(state, name).cpu().numpy(), np.asarray(getattr(expected, name)),
                                          err_msg=name)
    assert ex.measure(state) == CartPoleExperiment(params, Backend("numba", "cpu")).measure(numba_history[-1])
