"""The bandit population: backends against the plain-Python reference, determinism,
independence from layout and threads, learning quality (Bell's Figure 2)."""
import numba
import numpy as np
import pytest

from popplay.core.backend import Backend
from popplay.games.bandit import rules as game
from popplay.games.bandit.experiment import BanditExperiment
from popplay.games.bandit.rules import BanditParams
from popplay.training.loop import run
from tests.reference import bandit as reference

NUMBA = Backend("numba", "cpu")
TORCH = Backend("torch", "cpu")


def _history(params: BanditParams, backend: Backend):
    experiment = BanditExperiment(params, backend)
    state = experiment.initial_state()
    history = []
    while not experiment.finished(state, time_mode=False):
        state = experiment.phase(state, time_left=None)
        history.append((state.q.copy(), state.n.copy()))
    return history


def _reference_history(params: BanditParams):
    e = BanditExperiment(params, NUMBA)
    trials, agents = np.arange(params.trials), np.arange(params.agents)
    return reference.run(
        params, e.means.tolist(), game.agent_keys(params.seed, trials, agents),
        game.agent_static_keys(params.seed, trials, agents), e.epsilons.tolist(), e.topk.tolist(),
        e.groups.tolist(), e.n_groups,
    )


@pytest.mark.parametrize("differentiation", game.DIFFERENTIATIONS)
def test_backends_equal_reference_bit_for_bit(differentiation):
    params = BanditParams(arms=7, agents=5, trials=3, steps_per_agent=23, share_every=6, epsilon=0.2,
                          differentiation=differentiation, seed=11, explorer_fraction=0.4,
                          topk_fraction=0.6, bias_scale=0.3)
    expected = _reference_history(params)
    for backend in (NUMBA, TORCH):
        got = _history(params, backend)
        assert len(got) == len(expected) == 4  # phases of 6, 6, 6 and 5 steps
        for (q, n), (q_ref, n_ref) in zip(got, expected):
            assert np.array_equal(q, np.array(q_ref)), backend
            assert np.array_equal(n, np.array(n_ref)), backend


@pytest.mark.parametrize("noise_steps, choice_steps", [(4, 1), (32, 4)])
def test_torch_noise_drawn_in_blocks_that_end_inside_a_phase_is_the_same(monkeypatch, noise_steps, choice_steps):
    """The reward noise of a block of steps is drawn at once, the block sized by device
    (a GPU's holds 16 steps at 8.4 M agents) and kept across phases, and so are the
    choice words of a block: blocks that end inside the phases of 6 steps give the
    reference's tables bit for bit."""
    from popplay.games.bandit import _torch

    params = BanditParams(arms=7, agents=5, trials=3, steps_per_agent=23, share_every=6, epsilon=0.2, seed=11)
    monkeypatch.setitem(_torch.NOISE_BLOCK_DRAWS, "cpu", noise_steps * params.agents * params.trials)
    experiment = BanditExperiment(params, TORCH)
    assert (experiment._torch.noise_block, experiment._torch.choice_block) == (noise_steps, choice_steps)
    got = _history(params, TORCH)
    expected = _reference_history(params)
    assert len(got) == len(expected) == 4
    for (q, n), (q_ref, n_ref) in zip(got, expected):
        assert np.array_equal(q, np.array(q_ref)) and np.array_equal(n, np.array(n_ref))


def test_torch_each_run_draws_its_own_noise(monkeypatch):
    """A run's noise block is kept across its phases, not across runs: a second run
    on the same engine draws its noise again (and learns the same tables), so that
    timing whole runs on one engine times their noise too."""
    from popplay.games.bandit import _torch

    draws = []
    bounded = _torch._bounded_reward_noise

    def counting(keys, counters, words):
        draws.append(counters.shape[0])
        return bounded(keys, counters, words)

    monkeypatch.setattr(_torch, "_bounded_reward_noise", counting)
    params = BanditParams(arms=30, agents=5, trials=3, steps_per_agent=12, share_every=6, epsilon=0.2, seed=11)
    experiment = BanditExperiment(params, TORCH)
    tables = []
    for _ in range(2):
        state = experiment.initial_state()
        for _ in range(2):
            state = experiment.phase(state, time_left=None)
        tables.append((np.asarray(state.q).copy(), np.asarray(state.n).copy()))
    assert draws == [12, 12]  # one block of the run's 12 steps, once per run
    assert all(np.array_equal(a, b) for a, b in zip(*tables))


def _torch_scans(monkeypatch, margin: int = 1) -> list[int]:
    """Make the torch engine keep its greedy cache at any number of arms, with scan
    slots of ``margin`` beyond what the last phase needed; returns the slot counts
    of the steps that gathered only some agents' rows."""
    from popplay.games.bandit import _torch

    monkeypatch.setitem(_torch.CACHE_FROM_ARMS, "cpu", 0)
    monkeypatch.setattr(_torch, "SCAN_MARGIN", margin)
    capacities: list[int] = []
    agent_values = _torch.TorchBanditEngine._agent_values

    def counting(self, q, own, lanes):
        if lanes is not None:
            capacities.append(lanes.numel())
        return agent_values(self, q, own, lanes)

    monkeypatch.setattr(_torch.TorchBanditEngine, "_agent_values", counting)
    return capacities


@pytest.mark.parametrize("share_every", [6, 7])  # a phase of 7 steps keeps a slot for each of the 7 arms
@pytest.mark.parametrize("differentiation", ["none", "partition", "bias", "explorers"])
def test_torch_greedy_cache_with_few_scan_slots_equals_reference(monkeypatch, differentiation, share_every):
    """The torch engine's greedy cache (an agent scans its arms only when they may tie
    or its leader fell below the bound) and its own tallies of the arms it pulled give
    the reference's tables, also where a step gathers only a few agents' rows."""
    capacities = _torch_scans(monkeypatch)
    params = BanditParams(arms=7, agents=5, trials=3, steps_per_agent=23, share_every=share_every, epsilon=0.2,
                          differentiation=differentiation, seed=11, explorer_fraction=0.4, bias_scale=0.3)
    expected = _reference_history(params)
    got = _history(params, TORCH)
    assert len(got) == len(expected) == 4
    for (q, n), (q_ref, n_ref) in zip(got, expected):
        assert np.array_equal(q, np.array(q_ref)) and np.array_equal(n, np.array(n_ref))
    assert capacities and max(capacities) < params.agents * params.trials  # some steps scanned few rows


def test_torch_greedy_cache_equals_numba_where_more_arms_than_steps(monkeypatch):
    """Where an agent pulls fewer arms in a phase than there are, its slots are found
    by arm; greedy agents on a tied table (the first phase) scan often."""
    capacities = _torch_scans(monkeypatch)
    params = BanditParams(arms=40, agents=24, trials=3, steps_per_agent=60, share_every=5, epsilon=0.05, seed=4)
    for (q, n), (q_numba, n_numba) in zip(_history(params, TORCH), _history(params, NUMBA), strict=True):
        assert np.array_equal(q, q_numba) and np.array_equal(n, n_numba)
    assert capacities


@pytest.mark.parametrize("differentiation", ["none", "top2"])
def test_torch_agents_ranking_every_step_equal_numba_at_many_arms(monkeypatch, differentiation):
    """Without the greedy cache (as on CUDA, and for top-k agents) every agent ranks its
    arms at every step; from 32 arms on the tie count runs along each agent's row."""
    from popplay.games.bandit import _torch

    monkeypatch.setitem(_torch.CACHE_FROM_ARMS, "cpu", 10**9)
    params = BanditParams(arms=40, agents=24, trials=3, steps_per_agent=60, share_every=5, epsilon=0.05, seed=4,
                          differentiation=differentiation)
    assert _torch.ROW_MAJOR_COUNT_ARMS <= params.arms
    for (q, n), (q_numba, n_numba) in zip(_history(params, TORCH), _history(params, NUMBA), strict=True):
        assert np.array_equal(q, q_numba) and np.array_equal(n, n_numba)


def test_a_torch_phase_that_needed_more_scans_than_slots_is_learned_again(monkeypatch):
    """A step whose scans did not fit its slots makes the phase run again with a slot
    for every agent; the tables are the same as without the shortage."""
    from popplay.games.bandit import _torch

    _torch_scans(monkeypatch)
    params = BanditParams(arms=30, agents=16, trials=2, steps_per_agent=20, share_every=5, seed=8)
    expected = _history(params, NUMBA)
    monkeypatch.setattr(_torch.TorchBanditEngine, "_scan_slots", lambda self, n_steps: [1] * n_steps)
    learn = _torch.TorchBanditEngine._learn
    calls: list[list] = []

    def spying(self, q, n, first_step, n_steps, exact, slots):
        calls.append(slots)
        return learn(self, q, n, first_step, n_steps, exact, slots)

    monkeypatch.setattr(_torch.TorchBanditEngine, "_learn", spying)
    got = _history(params, TORCH)
    assert [s[0] for s in calls] == [1, None] * 4  # every phase overflowed its one slot and ran again
    for (q, n), (q_numba, n_numba) in zip(got, expected, strict=True):
        assert np.array_equal(q, q_numba) and np.array_equal(n, n_numba)


def _scanning(experiment: BanditExperiment) -> BanditExperiment:
    """The same experiment with the ranked rescans of the numba engine turned off."""
    experiment._ranked = False
    return experiment


@pytest.mark.parametrize("differentiation", ["none", "top2", "top4", "bias"])
def test_ranked_rescans_choose_exactly_what_full_scans_choose(differentiation):
    # Greedy agents on tables full of ties, where the ranked shortcut is taken most.
    params = BanditParams(arms=40, agents=24, trials=3, steps_per_agent=60, share_every=5, epsilon=0.05, seed=4,
                          differentiation=differentiation)
    ranked = BanditExperiment(params, NUMBA)
    assert ranked._ranked
    scanning = _scanning(BanditExperiment(params, NUMBA))
    states = []
    for experiment in (ranked, scanning):
        state = experiment.initial_state()
        while not experiment.finished(state, time_mode=False):
            state = experiment.phase(state, time_left=None)
        states.append(state)
    assert np.array_equal(states[0].q, states[1].q) and np.array_equal(states[0].n, states[1].n)
    small = BanditParams(arms=12, agents=6, trials=2, steps_per_agent=30, share_every=5, epsilon=0.0, seed=9)
    for (q, n), (q_ref, n_ref) in zip(_history(small, NUMBA), _reference_history(small)):
        assert np.array_equal(q, np.array(q_ref)) and np.array_equal(n, np.array(n_ref))


def test_ties_at_the_start_are_broken_at_random():
    # all estimates start equal: greedy first pulls must spread over the arms
    params = BanditParams(arms=10, agents=200, trials=1, steps_per_agent=1, share_every=1, epsilon=0.0)
    (q, n), = _history(params, NUMBA)
    assert n.sum() == 200
    assert (n[0] > 0).sum() == 10


def test_sharing_preserves_total_pulls_and_counts_every_step():
    params = BanditParams(arms=13, agents=9, trials=4, steps_per_agent=40, share_every=7, seed=3)
    for step, (q, n) in zip([7, 14, 21, 28, 35, 40], _history(params, NUMBA)):
        assert np.array_equal(n.sum(axis=1), np.full(4, 9.0 * step))


def test_same_seed_same_result_and_other_seed_differs():
    params = BanditParams(arms=20, agents=16, trials=8, steps_per_agent=64, share_every=8, seed=5)
    a, b = _history(params, NUMBA), _history(params, NUMBA)
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(a, b))
    c = _history(BanditParams(**{**params.to_dict(), "seed": 6}), NUMBA)
    assert not np.array_equal(a[-1][0], c[-1][0])


def test_results_do_not_depend_on_thread_count_or_trial_batch():
    params = BanditParams(arms=30, agents=33, trials=6, steps_per_agent=50, share_every=10, seed=2)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single = _history(params, NUMBA)[-1]
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(_history(params, NUMBA)[-1][0], single[0])
    # a trial's streams depend only on (seed, trial, agent): fewer trials, same tables
    fewer = _history(BanditParams(**{**params.to_dict(), "trials": 2}), NUMBA)[-1]
    assert np.array_equal(fewer[0], single[0][:2]) and np.array_equal(fewer[1], single[1][:2])


def test_time_budget_learns_for_the_given_learning_time():
    # One phase's step budget and a time budget that many phases fit in: under a loaded
    # suite a 4-step phase once took 25 ms, and 0.05 s ended after the second phase.
    params = BanditParams(arms=10, agents=8, trials=16, steps_per_agent=4, share_every=4)
    experiment = BanditExperiment(params, NUMBA)
    result = run(experiment, time_budget=0.2)
    assert result.learning_seconds >= 0.2
    assert result.state.step > params.steps_per_agent  # the step budget is ignored
    assert np.all(np.diff(result.curve.seconds) > 0)
    assert result.curve.agent_steps[-1] == result.state.step * params.agents


def test_block_correctness_counts_ties_as_the_chance_of_picking_best():
    means = np.array([[0.0, 1.0, 0.5], [2.0, 0.0, 1.0], [0.0, 1.0, 0.5]])
    q = np.array([[0.2, 0.9, 0.1], [0.3, 0.3, 0.3], [0.9, 0.2, 0.1]])
    assert game.block_correctness(q, means).tolist() == [1.0, 1 / 3, 0.0]


def test_parameters_are_validated():
    with pytest.raises(ValueError, match="epsilon"):
        BanditParams(epsilon=1.5).validate()
    with pytest.raises(ValueError, match="arms"):
        BanditParams(arms=1).validate()
    with pytest.raises(ValueError, match="differentiation"):
        BanditParams(differentiation="sideways").validate()


def test_differentiated_agents_are_spread_evenly():
    assert game.differentiated(8, 0.25).sum() == 2
    assert game.differentiated(8, 0.0).sum() == 0 and game.differentiated(8, 1.0).sum() == 8
    groups, n_groups = game.explore_groups(BanditParams(arms=4, agents=6, differentiation="partition"))
    assert n_groups == 4 and groups.tolist() == [0, 1, 2, 3, 0, 1]


@pytest.mark.slow
def test_figure2_sharing_population_beats_single_agent():
    # Bell's Figure 2 setting at full size: 100 arms, 131,072 agent-time steps, 1024 trials
    def quality(agents: int, share_every: int) -> float:
        params = BanditParams(arms=100, agents=agents, trials=1024, steps_per_agent=131072 // agents,
                              share_every=share_every, epsilon=0.1, seed=0)
        return run(BanditExperiment(params, NUMBA)).curve.metrics["quality"][-1]

    population = quality(256, 16)
    single = quality(1, 1024)
    assert population >= 0.97
    assert population >= single + 0.02
