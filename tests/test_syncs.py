"""GPU-shaped torch engines: the operations that would make the host wait for a GPU,
counted on the CPU with a dispatch mode, do not grow with agents or with the steps of
a phase; the sync-free normal draw equals the exact one."""
from __future__ import annotations

import dataclasses
import math

import h5py
import numpy as np
import pytest
import torch

from popplay import rng
from popplay.core.backend import Backend
from popplay.core.syncs import SyncCounter
from popplay.distributed.group import Dist
from popplay.xp import npx, th

TORCH = Backend("torch", "cpu")


def phase_syncs(experiment_type, params) -> tuple[int, dict[str, int]]:
    """Host waits in the second phase of a fresh experiment (the first warms caches)."""
    experiment = experiment_type(params, TORCH, dist=Dist())
    state = experiment.phase(experiment.initial_state(), time_left=None)
    with SyncCounter() as counter:
        experiment.phase(state, time_left=None)
    assert counter.ops > 100  # the counter saw the phase's work
    return counter.syncs, dict(counter.by_name)


def _greedy_cache_everywhere(monkeypatch, slots=lambda agents, s: agents) -> None:
    """The bandit's torch engine with its greedy cache at any number of arms and the
    scan slots given by ``slots(agents, step)`` (an int gathers that many rows)."""
    from popplay.games.bandit import _torch

    monkeypatch.setitem(_torch.CACHE_FROM_ARMS, "cpu", 0)
    monkeypatch.setattr(_torch.TorchBanditEngine, "_scan_slots",
                        lambda self, n_steps: [slots(self.shape[0] * self.shape[1], s) for s in range(n_steps)])


@pytest.mark.parametrize("differentiation", ["none", "bias", "top2", "none, greedy cache", "bias, greedy cache"])
def test_bandit_phase_waits_once_whatever_agents_or_steps(monkeypatch, differentiation: str) -> None:
    """Also with the greedy cache, whose scans gather the rows of the agents that need
    one into slots without asking how many there are (the phase's one wait also says
    whether they fit)."""
    from popplay.games.bandit.experiment import BanditExperiment
    from popplay.games.bandit.rules import BanditParams

    differentiation, cache = (differentiation.split(", ") + [""])[:2]
    if cache:
        _greedy_cache_everywhere(monkeypatch)

    def syncs(agents: int, share_every: int) -> tuple[int, dict[str, int]]:
        return phase_syncs(BanditExperiment, BanditParams(arms=6, agents=agents, trials=3, share_every=share_every,
                                                          steps_per_agent=2 * share_every,
                                                          differentiation=differentiation))

    base = syncs(4, 4)
    assert base == syncs(64, 4) == syncs(4, 16)
    assert base[0] <= 1, base  # whether a reward draw ran out of retry rounds or scans out of slots


def test_cartpole_phase_waits_a_fixed_number_of_times() -> None:
    from popplay.games.cartpole.experiment import CartPoleExperiment
    from popplay.games.cartpole.rules import CartPolePopulationParams

    def syncs(agents: int, share_every: int) -> tuple[int, dict[str, int]]:
        return phase_syncs(CartPoleExperiment, CartPolePopulationParams(
            agents=agents, trials=2, share_every=share_every, steps_per_agent=2 * share_every))

    base = syncs(4, 4)
    assert base == syncs(64, 4) == syncs(4, 16)
    assert base[0] <= 3, base  # the finite check, the share's input check, whether a step ran out of slots


def test_knights_phase_waits_only_every_few_plies() -> None:
    from popplay.games.knights import _torch
    from popplay.games.knights.experiment import KnightsExperiment
    from popplay.games.knights.rules import KnightsParams

    def syncs(agents: int, games: int, max_turns: int = 40, lookahead: int = 1) -> int:
        return phase_syncs(KnightsExperiment, KnightsParams(agents=agents, games_per_agent=games, episodes=3,
                                                            max_turns=max_turns, lookahead=lookahead))[0]

    bound = math.ceil(40 / _torch.SYNC_EVERY)
    assert syncs(4, 2) <= bound
    assert syncs(32, 2) <= bound and syncs(4, 8) <= bound
    assert syncs(4, 2, lookahead=2) <= bound and syncs(32, 2, lookahead=2) <= bound
    assert syncs(4, 2, max_turns=400) > bound  # the check is really there (and counted)


def test_knights_evaluation_waits_only_every_few_plies() -> None:
    """Evaluation games on the torch engine (every agent against greedy and random) ask
    the device as a learning phase does: a fixed number of times per opponent, whatever
    the agents or games."""
    from popplay.games.knights import _torch
    from popplay.games.knights.experiment import KnightsExperiment
    from popplay.games.knights.rules import KnightsParams

    def syncs(agents: int, games: int, max_turns: int = 40) -> int:
        experiment = KnightsExperiment(KnightsParams(agents=agents, games_per_agent=2, episodes=1,
                                                     max_turns=max_turns), TORCH, dist=Dist())
        with SyncCounter() as counter:
            experiment.evaluate(experiment.initial_state(), games, ("greedy", "random"), backend=TORCH)
        return counter.syncs

    bound = 2 * math.ceil(40 / _torch.SYNC_EVERY)
    assert syncs(4, 4) <= bound
    assert syncs(16, 4) == syncs(4, 4) == syncs(4, 16)
    assert syncs(4, 4, max_turns=400) > bound  # the check is really there (and counted)


def test_deep_updates_never_wait() -> None:
    from popplay.deep.agents.dqn import DoubleDQN, DQNConfig
    from popplay.deep.agents.replay import Batch

    agent = DoubleDQN(DQNConfig(hidden=(8,), batch_size=16, replay_capacity=64, target_every=3), 4, 2, seed=1)
    g = torch.Generator().manual_seed(0)
    agent.replay.add(Batch(torch.randn(64, 4, generator=g), torch.randint(2, (64,), generator=g),
                           torch.randn(64, generator=g), torch.randn(64, 4, generator=g), torch.zeros(64)))
    with SyncCounter() as counter:
        for _ in range(7):
            agent.update()
    assert counter.ops > 100 and counter.syncs == 0, counter.by_name


def _population(algo: str):
    """A three-member population of ``algo`` at a tiny size."""
    from popplay.deep.agents.ppo_params import PPOParams
    from popplay.deep.topologies.dqn import DQNParams, DQNPopulation
    from popplay.deep.topologies.exarl import A2CPopulation, ContinuousPopulation
    from popplay.deep.topologies.exarl_params import A2CParams, TD3Params
    from popplay.deep.topologies.reinforce import ReinforcePopulation
    from popplay.deep.topologies.reinforce_params import ReinforceParams
    from popplay.deep.topologies.rollout import PPOPopulation

    if algo == "dqn":
        return DQNPopulation(DQNParams(agents=3, hidden=(8,), batch_size=8, replay_capacity=200, learning_starts=20,
                                       phase_steps=60, seed=2), None)
    if algo == "ppo":
        return PPOPopulation(dataclasses.replace(PPOParams(), agents=3, hidden=(8,), n_steps=16, batch_size=8,
                                                 n_epochs=2, phase_steps=64, seed=2), None)
    if algo == "a2c":
        return A2CPopulation(A2CParams(agents=3, hidden=(8,), copies=2, n_steps=5, phase_steps=30, seed=2), None)
    if algo == "reinforce":  # an update needs an episode's end: a phase long enough for some
        return ReinforcePopulation(ReinforceParams(agents=3, hidden=(8,), episodes=0, phase_steps=120, seed=2), None)
    return ContinuousPopulation(TD3Params(agents=3, hidden=(8, 8), batch_size=8, replay_capacity=200,
                                          learning_starts=20, phase_steps=60, seed=2), None)


@pytest.mark.parametrize("algo", ["dqn", "ppo", "a2c", "reinforce", "td3"])
def test_deep_population_updates_never_wait(algo: str) -> None:
    """Every deep population's updates queue on the device without the host waiting."""
    experiment = _population(algo)
    state = experiment.initial_state()
    learner = state.learner
    counts: list[tuple[int, int]] = []
    train = learner.train

    def counted(*args, **kwargs):
        with SyncCounter() as counter:
            result = train(*args, **kwargs)
        counts.append((counter.syncs, counter.ops))
        return result

    learner.train = counted
    experiment.phase(state, time_left=None)
    assert sum(ops for _, ops in counts) > 100  # some updates ran
    assert all(syncs == 0 for syncs, _ in counts)


# --- the sync-free normal draw --------------------------------------------------------

@pytest.mark.parametrize("xp", [th, npx], ids=["torch", "numpy"])
def test_bounded_normal_equals_the_exact_one(xp) -> None:
    exact_rng, bounded_rng = rng.make_rng(th), rng.make_rng(xp)
    n = 40_000
    key = torch.full((n,), 31, dtype=torch.int64)
    counter = torch.arange(n, dtype=torch.int64).view(200, 200)
    word = exact_rng.draw(key.view(200, 200), exact_rng.mix_counter(counter))
    exact = exact_rng.normal(key.view(200, 200), counter, word)
    as_xp = (lambda t: t) if xp is th else (lambda t: t.numpy())
    x, short = bounded_rng.normal_bounded(as_xp(key.view(200, 200)), as_xp(counter), as_xp(word), 1200)
    assert not bool(short)
    np.testing.assert_array_equal(np.asarray(x), exact.numpy())
    # too few slots, or too few rounds, say so (and only then may x differ)
    assert bool(bounded_rng.normal_bounded(as_xp(key.view(200, 200)), as_xp(counter), as_xp(word), 50)[1])
    assert bool(bounded_rng.normal_bounded(as_xp(key.view(200, 200)), as_xp(counter), as_xp(word), 1200,
                                           rounds=1)[1])


@pytest.mark.parametrize("size, density, capacity", [(0, 0.5, 4), (1, 1.0, 1), (37, 0.3, 8), (37, 0.3, 64),
                                                     (5000, 0.015, 100), (5000, 0.5, 100), (5000, 0.0, 16)])
def test_packing_by_library_equals_packing_by_count(size, density, capacity) -> None:
    """Eager on a CPU, ``th.compact`` packs with ``nonzero_static``; compiled and on
    GPUs with a running count. Same lanes, the same unused slots (lane 0), the same
    valid slots and overflow, whether the true lanes fit or not."""
    mask = torch.rand(size, generator=torch.Generator().manual_seed(size)) < density
    by_library, by_count = th._compact_by_library(mask, capacity), th._compact_by_count(mask, capacity)
    for got, expected in zip(by_library, by_count):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert bool(by_count[2]) == (int(mask.sum()) > capacity)


def test_bounded_normal_never_waits() -> None:
    r = rng.make_rng(th)
    key = torch.arange(5000, dtype=torch.int64)
    word = r.draw(key, r.mix_counter(torch.tensor(3)))
    with SyncCounter() as counter:
        r.normal_bounded(key, torch.tensor(3), word, 200)
    with SyncCounter() as exact:
        r.normal(key, torch.tensor(3), word)
    assert counter.syncs == 0 and exact.syncs > 0  # the exact draw does wait: the counter sees it


# --- compiled steps: one graph each, same results -----------------------------------

def _one_graph(step):
    """``step`` compiled as one graph by dynamo alone (the ``eager`` backend: no code
    generation, so the test is quick); a graph break raises."""
    return torch.compile(step, fullgraph=True, dynamic=False, backend="eager")


def _final_state(experiment_type, params, compile_step=None):
    experiment = experiment_type(params, TORCH, dist=Dist())
    if compile_step is not None:
        compile_step(experiment)
    state = experiment.initial_state()
    for _ in range(2):
        state = experiment.phase(state, time_left=None)
    return state


@pytest.mark.parametrize("differentiation", ["none", "bias", "top2", "none, greedy cache", "bias, greedy cache",
                                             "bias, greedy cache, a slot per arm"])
def test_bandit_step_is_one_graph(monkeypatch, differentiation: str) -> None:
    from popplay.games.bandit.experiment import BanditExperiment
    from popplay.games.bandit.rules import BanditParams

    differentiation, cache, per_arm = (differentiation.split(", ") + ["", ""])[:3]
    if cache:  # steps that scan every agent and steps that gather some agents' rows
        _greedy_cache_everywhere(monkeypatch, lambda agents, s: None if s % 2 else agents)
    share_every = 8 if per_arm else 4  # phases of at least as many steps as arms keep a slot per arm
    params = BanditParams(arms=5, agents=3, trials=2, share_every=share_every, steps_per_agent=2 * share_every,
                          differentiation=differentiation)

    def compile_step(experiment) -> None:
        from popplay.games.bandit import _torch

        experiment._torch._step = _one_graph(experiment._torch._learning_step)
        experiment._torch._cached = _one_graph(experiment._torch._cached_step)
        experiment._torch._noise_words = _one_graph(_torch._noise_words)
        experiment._torch._compile = True  # the one-hot writes of compiled steps

    plain, compiled = _final_state(BanditExperiment, params), _final_state(BanditExperiment, params, compile_step)
    np.testing.assert_array_equal(plain.q, compiled.q)
    np.testing.assert_array_equal(plain.n, compiled.n)


def test_a_compiled_bandit_step_is_built_once_for_every_room(monkeypatch) -> None:
    """The greedy cache's scans gather a different number of rows at different steps
    (the room, as a dynamic size): one build for the steps that scan every agent and
    one for all the rooms, where a build per room cost seconds each (and made the
    compiled CPU engine 30x slower than the eager one at 100 arms)."""
    from torch._dynamo.testing import CompileCounter

    from popplay.games.bandit.experiment import BanditExperiment
    from popplay.games.bandit.rules import BanditParams

    rooms = [None, 2, 3, 5, 6, 4]
    _greedy_cache_everywhere(monkeypatch, lambda agents, s: rooms[s % len(rooms)])
    params = BanditParams(arms=5, agents=3, trials=2, share_every=6, steps_per_agent=12)
    counter = CompileCounter()

    def compile_step(experiment) -> None:
        experiment._torch._cached = torch.compile(experiment._torch._cached_step, fullgraph=True, dynamic=False,
                                                  backend=counter)

    torch._dynamo.reset()
    plain, compiled = _final_state(BanditExperiment, params), _final_state(BanditExperiment, params, compile_step)
    np.testing.assert_array_equal(plain.q, compiled.q)
    assert counter.frame_count == 2


def test_cartpole_step_is_one_graph() -> None:
    from popplay.games.cartpole.experiment import CartPoleExperiment
    from popplay.games.cartpole.rules import CartPolePopulationParams

    params = CartPolePopulationParams(agents=3, trials=2, share_every=8, steps_per_agent=16, algorithm="q")

    def compile_step(experiment) -> None:
        experiment._torch._step = _one_graph(experiment._torch._learning_step)

    plain = _final_state(CartPoleExperiment, params)
    compiled = _final_state(CartPoleExperiment, params, compile_step)
    for name in ("q", "weight", "trace", "cart", "action", "failures"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(compiled, name), err_msg=name)


def test_a_cartpole_phase_leaves_its_inputs_alone() -> None:
    """The steps write into a table of the phase's own, never into the tables the phase
    is given (replication compares the phase's result with the state it started from)."""
    from popplay.games.cartpole.experiment import CartPoleExperiment
    from popplay.games.cartpole.rules import CartPolePopulationParams

    params = CartPolePopulationParams(agents=3, trials=2, share_every=8, steps_per_agent=16, replicate_every=1)
    experiment = CartPoleExperiment(params, TORCH, dist=Dist())
    state = experiment.phase(experiment.initial_state(), time_left=None)
    before = {name: getattr(state, name).clone() for name in ("q", "weight", "trace", "cart", "action")}
    after = experiment.phase(state, time_left=None)
    assert not torch.equal(after.q, state.q)  # the phase learned
    for name, value in before.items():
        assert torch.equal(getattr(state, name), value), name


@pytest.mark.parametrize("lookahead, td_leaf", [(1, False), (2, False), (2, True)])
def test_knights_ply_is_one_graph(lookahead: int, td_leaf: bool) -> None:
    from popplay.games.knights import engine
    from popplay.games.knights.experiment import KnightsExperiment
    from popplay.games.knights.rules import KnightsParams

    params = KnightsParams(agents=3, games_per_agent=2, episodes=2, max_turns=30, lookahead=lookahead,
                           td_leaf=td_leaf, hidden2=3 if td_leaf else 0)
    plain = _final_state(KnightsExperiment, params)
    torch_engine = engine._torch_engine(params.geometry.table, params.pieces, params.max_turns, "cpu")
    torch_engine._ply = _one_graph(torch_engine._one_ply)
    try:
        compiled = _final_state(KnightsExperiment, params)
    finally:
        engine._ENGINES.clear()
    np.testing.assert_array_equal(plain.w1, compiled.w1)
    np.testing.assert_array_equal(plain.score, compiled.score)


def test_put_along_refuses_a_value_of_another_dtype() -> None:
    from popplay.xp import th

    table = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(TypeError, match="float64 value into a torch.int64 table"):
        th.put_along(table, torch.zeros(2, 1, dtype=torch.int64), torch.ones(2, 1, dtype=torch.float64),
                     torch.arange(3))


def test_put_along_writes_in_place_or_selects_the_same_values() -> None:
    from popplay.xp import th

    table = torch.arange(12.0).reshape(2, 2, 3)
    index = torch.tensor([[[2], [0]], [[1], [1]]])
    value = -torch.arange(1.0, 5.0).reshape(2, 2, 1)
    selected = th.put_along(table, index, value, torch.arange(3))
    assert selected.data_ptr() != table.data_ptr() and table[0, 0, 2] == 2.0  # the input is left alone
    expected = table.clone()
    for t, a in np.ndindex(2, 2):
        expected[t, a, index[t, a, 0]] = value[t, a, 0]
    np.testing.assert_array_equal(selected, expected)
    written = th.put_along(table, index, value)
    assert written.data_ptr() == table.data_ptr()  # eager: one element a row, in place
    np.testing.assert_array_equal(table, expected)


def test_train_compile_runs_the_inductor_build_and_agrees() -> None:
    import popplay

    fields = dict(arms=4, agents=2, trials=2, steps_per_agent=8, share_every=4)
    plain = popplay.train("bandit", backend="torch", **fields)
    compiled = popplay.train("bandit", compile=True, **fields)  # --compile alone picks the torch engine
    assert compiled.summary["backend"] == "torch"
    np.testing.assert_array_equal(plain.result.state.q, compiled.result.state.q)


def test_torch_compile_time_is_not_learning_time(cli, tmp_path) -> None:
    """The compile clock counts torch.compile's builds (announced once), as it counts
    numba's, so a compiled run's learning seconds and --time-budget leave them out."""
    import json
    import time

    from popplay.training.loop import CompileClock

    said = []
    doubled = torch.compile(lambda x: x * 2.0 + 1.0, fullgraph=True, dynamic=False)
    started = time.perf_counter()
    with CompileClock(lambda: said.append(1), torch_compile=True) as clock:
        doubled(torch.ones(3, dtype=torch.float64))
        doubled(torch.ones(3, dtype=torch.float64))  # compiled already: not counted again
    first_call = time.perf_counter() - started
    assert said == [1] and 0.5 * first_call < clock.seconds <= first_call
    with CompileClock(torch_compile=False) as idle:
        torch.compile(lambda x: x - 3.0, fullgraph=True)(torch.ones(2))
    assert idle.seconds == 0.0

    code, stdout, err = cli(["train", "bandit", "--agents", "2", "--trials", "2", "--share-every", "4",
                             "--agent-steps", "8", "--compile", "--out", str(tmp_path / "c.h5"), "--json"])
    assert code == 0 and "compiling the torch engine" in err
    assert json.loads(stdout.splitlines()[-1])["seconds"] < 0.5  # eight steps; the build took seconds


def test_a_resumed_run_stays_compiled_unless_told_otherwise(cli, tmp_path) -> None:
    """--resume takes --compile from the run file like the backend and device (knights'
    compiled ply rounds differently, so a resume must not change it silently); an
    explicit --no-compile, or a move to numba, runs uncompiled."""
    import json

    out = str(tmp_path / "run.h5")
    small = ["--agents", "2", "--trials", "2", "--share-every", "4"]
    code, stdout, _ = cli(["train", "bandit", *small, "--agent-steps", "8", "--compile", "--out", out, "--json"])
    assert code == 0 and json.loads(stdout.splitlines()[-1])["compile"] is True
    for extra, backend, compiled in ((["--agent-steps", "12"], "torch", True),
                                     (["--agent-steps", "16", "--no-compile"], "torch", False),
                                     (["--agent-steps", "20", "--backend", "numba"], "numba", False)):
        code, stdout, err = cli(["train", "bandit", "--resume", out, *extra, "--json"])
        summary = json.loads(stdout.splitlines()[-1])
        assert code == 0, err
        assert (summary["backend"], summary["compile"]) == (backend, compiled)
        with h5py.File(out) as f:
            assert bool(f["config"].attrs["compile"]) is compiled


def test_compile_with_numba_is_refused_in_one_line(cli) -> None:
    code, out, err = cli(["train", "bandit", "--backend", "numba", "--compile", "--agents", "2", "--trials", "1",
                          "--agent-steps", "8", "--share-every", "4"])
    assert code == 2 and out == ""
    assert err == ("Error: --compile compiles the torch engine, and this run is on the numba engine, compiled "
                   "already (--backend torch to compile)\n")


def test_a_bandit_phase_whose_draw_fell_short_is_learned_again_exactly(monkeypatch) -> None:
    from popplay.games.bandit import _torch
    from popplay.games.bandit.experiment import BanditExperiment
    from popplay.games.bandit.rules import BanditParams

    params = BanditParams(arms=5, agents=3, trials=2, share_every=4, steps_per_agent=8)
    exact = _final_state(BanditExperiment, params)
    bounded, exact_draw = _torch._bounded_reward_noise, _torch._exact_reward_noise
    calls = []

    def always_short(keys, counters, words):
        noise, _ = bounded(keys, counters, words)
        calls.append("bounded")
        return noise * 0.0, torch.tensor(True)  # wrong noise, flagged

    def exact_noise(keys, counters, words):
        calls.append("exact")
        return exact_draw(keys, counters, words)

    monkeypatch.setattr(_torch, "_bounded_reward_noise", always_short)
    monkeypatch.setattr(_torch, "_exact_reward_noise", exact_noise)
    redone = _final_state(BanditExperiment, params)
    assert "bounded" in calls and "exact" in calls  # the bounded draw fell short, the exact one redid the phase
    np.testing.assert_array_equal(redone.q, exact.q)
