"""Deep populations (``train dqn --agents P``): batching is exact, the operators do what
Bell's and PBT's rules say on hand-made inputs, resume is exact, bad input is one line."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from popplay.cli.main import app
from popplay.deep.agents import networks
from popplay.deep.agents.ppo_params import PPOParams
from popplay.deep.agents.stacked import StackedAdam, StackedMLP, clip_rows_
from popplay.deep.topologies.dqn import DQNParams, DQNPopulation
from popplay.deep.topologies.rollout import PPOPopulation
from popplay.operators import hyper
from popplay.operators.evolution import EVENTS
from tests._population_helpers import assert_same_state, run_phases

SMALL = dict(agents=3, env="CartPole-v1", hidden=(16, 16), batch_size=8, replay_capacity=300, learning_starts=30,
             target_every=7, epsilon_updates=60, phase_steps=40, eval_episodes=2, seed=5,
             hp="lr=loguniform:1e-4:1e-2;gamma=choice:0.9,0.95,0.99;target_every=choice:5,7,11")


PPO_SMALL = dict(agents=3, hidden=(8, 8), copies=2, n_steps=16, n_epochs=2, batch_size=12, env_steps=3 * 2 * 160,
                 phase_steps=40, eval_episodes=1, seed=2, hp="lr=loguniform:1e-4:3e-3;clip_range=uniform:0.1:0.3")


def small(**changes: object) -> DQNParams:
    return dataclasses.replace(DQNParams(**SMALL), **changes)  # type: ignore[arg-type]



# --- the batched network and optimiser, against torch's own ------------------------

def test_stacked_gradient_matches_autograd_member_by_member() -> None:
    modules = [networks.seeded_mlp(s, 5, 3, (7, 6)) for s in range(4)]
    stack = StackedMLP.from_modules(modules)
    x = torch.randn(4, 9, 5, generator=torch.Generator().manual_seed(1))
    upstream = torch.randn(4, 9, 3, generator=torch.Generator().manual_seed(2))
    hidden: list[torch.Tensor] = []
    out = stack.forward(x, hidden)
    grad = stack.backward(x, hidden, upstream)
    for k, module in enumerate(modules):
        expected_out = module(x[k])
        torch.testing.assert_close(out[k], expected_out.detach())
        (expected_out * upstream[k]).sum().backward()
        expected = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
        torch.testing.assert_close(grad[k], expected)


def test_stacked_adam_and_clipping_match_torch_per_member() -> None:
    modules = [networks.seeded_mlp(s, 3, 2, (4,)) for s in range(3)]
    stack = StackedMLP.from_modules(modules)
    adam = StackedAdam(stack)
    lrs = torch.tensor([1e-3, 3e-2, 1e-1], dtype=torch.float64)
    max_norm = torch.tensor([0.5, 100.0, 1.0])
    optimisers = [torch.optim.Adam(m.parameters(), lr=float(lr)) for m, lr in zip(modules, lrs)]
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        grads = stack.grad.copy_(torch.randn(stack.matrix.shape, generator=g))
        for k, (module, optimiser) in enumerate(zip(modules, optimisers)):
            sizes = [p.numel() for p in module.parameters()]
            for p, piece in zip(module.parameters(), torch.split(grads[k].clone(), sizes)):
                p.grad = piece.view_as(p).clone()
            torch.nn.utils.clip_grad_norm_(module.parameters(), float(max_norm[k]))
            optimiser.step()
        clip_rows_(grads, max_norm)
        adam.step(grads, lrs)
    for k, module in enumerate(modules):
        torch.testing.assert_close(stack.matrix[k], networks.flat_parameters(module), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("members, width", [(64, 4610), (1, 4610), (2, 4610), (3, 4611), (5, 4625), (7, 4608),
                                            (64, 23), (3, 17), (4, 16), (9, 31), (13, 100)])
def test_adam_over_the_whole_stack_rounds_each_row_as_a_call_on_that_row(
        monkeypatch: pytest.MonkeyPatch, members: int, width: int) -> None:
    """The CPU's one call over the whole matrix (plus the pieces it steps again) gives
    every row the bits a fused call on that row alone gives, over several steps: row
    widths on and off whole 16-number units, one member and many (the size from which
    a stack takes it set to 0)."""
    from popplay.deep.agents import stacked

    monkeypatch.setattr(stacked, "WHOLE_STEP_FROM", 0)
    g = torch.Generator().manual_seed(members * 1000 + width)
    stacks = [StackedMLP(torch.randn(members, width, generator=g), [(width,)]) for _ in range(2)]
    stacks[1].matrix.copy_(stacks[0].matrix)
    whole, per_row = StackedAdam(stacks[0]), StackedAdam(stacks[1])
    per_row._whole = None  # each row a tensor of its own, as a GPU or a partial step does it
    assert whole._whole is not None
    lr = torch.rand(members, generator=g, dtype=torch.float64) * 1e-2
    for _ in range(4):
        grads = torch.randn(members, width, generator=g)
        grads[:, ::7] = 0.0  # some parameters idle, as dead units are
        for stack, adam in zip(stacks, (whole, per_row)):
            stack.grad.copy_(grads)
            adam.step(stack.grad, lr)
    for table in ("exp_avg", "exp_avg_sq", "steps"):
        assert torch.equal(getattr(whole, table), getattr(per_row, table))
    assert torch.equal(stacks[0].matrix, stacks[1].matrix)


def test_adam_takes_the_whole_stack_call_from_its_size_on() -> None:
    from popplay.deep.agents.stacked import WHOLE_STEP_FROM

    assert StackedAdam(StackedMLP(torch.zeros(64, 4610), [(4610,)]))._whole is not None  # 295,040 parameters
    assert StackedAdam(StackedMLP(torch.zeros(2, 4610), [(4610,)]))._whole is None
    assert 2 * 4610 < WHOLE_STEP_FROM <= 64 * 4610


def test_adam_steps_rows_apart_when_members_have_made_different_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole-matrix call takes one step count; members at other counts (a partial
    step before) are stepped row by row, with their own bias corrections."""
    from popplay.deep.agents import stacked

    monkeypatch.setattr(stacked, "WHOLE_STEP_FROM", 0)
    stacks = [StackedMLP(torch.linspace(-1, 1, 3 * 40).view(3, 40).clone(), [(40,)]) for _ in range(2)]
    adams = [StackedAdam(stack) for stack in stacks]
    adams[1]._whole = None
    lr = torch.full((3,), 1e-2, dtype=torch.float64)
    for rows in ([0], None, None):
        for stack, adam in zip(stacks, adams):
            stack.grad.copy_(torch.cos(torch.arange(120.0)).view(3, 40))
            adam.step(stack.grad, lr, rows=rows)
    assert adams[0].steps.tolist() == [3.0, 2.0, 2.0]
    assert torch.equal(stacks[0].matrix, stacks[1].matrix)
    assert torch.equal(adams[0].exp_avg, adams[1].exp_avg)


def test_moments_of_dead_parameters_reach_zero_without_going_subnormal() -> None:
    # A gradient of 1 once and 0 after (a unit that died): the first moment falls by 0.9 a
    # step and, left alone, would be float32-subnormal from about step 800 on, where each
    # operation on it is slow (see StackedAdam).
    from popplay.deep.agents.stacked import MOMENT_FLOOR

    stack = StackedMLP.from_modules([networks.seeded_mlp(s, 3, 2, (4,)) for s in range(2)])
    adam = StackedAdam(stack)
    lrs = torch.tensor([1e-3, 1e-2], dtype=torch.float64)
    tiny = torch.finfo(torch.float32).tiny
    stack.grad.fill_(1.0)
    adam.step(stack.grad, lrs)
    stack.grad.zero_()
    stack.grad[1, 0] = float("nan")  # a diverged member keeps its NaN
    for step in range(1000):
        adam.step(stack.grad, lrs)
        for moment in (adam.exp_avg, adam.exp_avg_sq):
            assert not ((moment != 0) & (moment.abs() < tiny)).any(), step
        if step == 700:  # 0.1·0.9^701 is about 8e-34: a normal float32, but under the floor
            assert torch.equal(adam.exp_avg[0], torch.zeros_like(adam.exp_avg[0]))
        stack.grad[1, 0] = 0.0
    assert adam.exp_avg[1, 0].isnan() and adam.exp_avg_sq[1, 0].isnan()
    # above the floor nothing moves: the second moments (0.001·0.999^t) are all still there
    assert (adam.exp_avg_sq[0] > MOMENT_FLOOR).all()
    # only the members that step are floored (REINFORCE steps those whose episodes ended)
    adam.exp_avg[:, 1] = 1e-31
    adam.step(stack.grad, lrs, rows=[1])
    assert adam.exp_avg[0, 1] == 1e-31 and adam.exp_avg[1, 1] == 0.0


# --- exactness: member k of P is member k alone -----------------------------------

@pytest.mark.parametrize(("inputs", "outputs", "hidden"), [(3, 1, (64, 64)), (4, 2, (64, 64)), (11, 5, (100, 37))])
def test_each_member_of_a_stack_computes_what_it_computes_alone(inputs: int, outputs: int, hidden: tuple) -> None:
    # Shapes at which MKL's alignment-dependent paths (a member's rows start wherever its
    # index puts them) or torch's lone-product kernels gave a member other bits alone
    # (session 16), before MKL_CBWR=AUTO,STRICT and `stacked.batched`.
    from popplay.deep.agents.stacked import layer_shapes

    shapes = layer_shapes(inputs, outputs, hidden)
    g = torch.Generator().manual_seed(4)
    matrix = torch.randn(6, sum(int(np.prod(s)) for s in shapes), generator=g) * 0.1
    stack = StackedMLP(matrix, shapes)
    for rows in (1, 33, 64):  # acting on one observation, odd and even minibatches
        x = torch.randn(6, rows, inputs, generator=g)
        upstream = torch.randn(6, rows, outputs, generator=g)
        hidden_all: list[torch.Tensor] = []
        out = stack.forward(x, hidden_all)
        grad = stack.backward(x, hidden_all, upstream).clone()
        for k in range(6):
            alone = StackedMLP(matrix[k:k + 1].clone(), shapes)
            hidden_k: list[torch.Tensor] = []
            assert torch.equal(alone.forward(x[k:k + 1].clone(), hidden_k)[0], out[k]), (rows, k)
            assert torch.equal(alone.backward(x[k:k + 1].clone(), hidden_k, upstream[k:k + 1].clone())[0], grad[k])


@pytest.mark.parametrize("whole_step_from", [None, 0], ids=["adam-as-sized", "adam-whole-stack"])
def test_member_k_of_a_population_is_member_k_alone(monkeypatch: pytest.MonkeyPatch, whole_step_from: int | None
                                                    ) -> None:
    if whole_step_from is not None:  # every stack, the one member's too, through the whole-stack Adam step
        from popplay.deep.agents import stacked

        monkeypatch.setattr(stacked, "WHOLE_STEP_FROM", whole_step_from)
    params = small()
    population = run_phases(DQNPopulation(params, None), 3)
    assert population.learner.updates > 20  # the comparison covers learning, not just acting
    assert len(set(population.learner.hypers["lr"])) == 3  # members differ: a mix-up would show
    for k in (0, 2):
        alone = run_phases(DQNPopulation(params, None, members=np.array([k])), 3)
        for name in ("online", "target"):
            assert torch.equal(getattr(population.learner, name).matrix[k], getattr(alone.learner, name).matrix[0])
        assert torch.equal(population.learner.adam.exp_avg_sq[k], alone.learner.adam.exp_avg_sq[0])
        assert torch.equal(population.learner.replay.tables["obs"][k], alone.learner.replay.tables["obs"][0])
        assert np.array_equal(population.envs.obs[k], alone.envs.obs[0])
        mine = [r for m, r in zip(population.episode_member, population.episode_return) if m == k]
        assert mine == alone.episode_return


def _threads_cases() -> list:
    # sizes at which torch and MKL do split the work between two threads
    dqn = small(agents=8, hidden=(64, 64), batch_size=64, replay_capacity=400, learning_starts=40,
                replicate_every=60, share_every=90)
    ppo = dataclasses.replace(PPOParams(**PPO_SMALL), agents=8, hidden=(64, 64), n_steps=32, batch_size=64,
                              env_steps=8 * 2 * 160, replicate_every=60, share_every=90)
    return [pytest.param(DQNPopulation, dqn, id="dqn"), pytest.param(PPOPopulation, ppo, id="ppo")]


@pytest.mark.parametrize(("population_class", "params"), _threads_cases())
def test_a_population_computes_the_same_bits_on_one_thread_and_on_two(
        population_class: type, params: object, monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
            population = population_class(params, None)
            assert torch.get_num_threads() == threads
            runs.append(run_phases(population, 4))
    finally:
        torch.set_num_threads(before)
    one, two = runs
    assert one.learner.updates > 2 and one.replications and one.shares
    for mine, theirs in zip(one.learner.member_tables(replay=True), two.learner.member_tables(replay=True)):
        assert torch.equal(mine, theirs)
    assert one.episode_return == two.episode_return


def test_a_cpu_quota_caps_the_cores(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from popplay.core import limits

    cores = len(__import__("os").sched_getaffinity(0))
    v2, quota, period = tmp_path / "cpu.max", tmp_path / "quota", tmp_path / "period"
    monkeypatch.setattr(limits, "CPU_QUOTA_FILES", ((str(v2), None), (str(quota), str(period))))
    assert limits.usable_cores() == cores  # no file: the affinity mask
    v2.write_text("max 100000\n")
    assert limits.usable_cores() == cores
    v2.write_text("50000 100000\n")  # half a core: one
    assert limits.usable_cores() == 1
    v2.unlink()
    quota.write_text("-1\n")
    period.write_text("100000\n")
    assert limits.usable_cores() == cores
    quota.write_text("100000\n")  # v1: one core
    assert limits.usable_cores() == 1
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert limits.cores_per_process() == 1


def test_a_population_takes_the_cores_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from popplay.core.limits import cores_per_process, usable_cores

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cores_per_process() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    cores = usable_cores()
    assert cores_per_process() == cores
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    assert cores_per_process() == max(1, cores // 2)  # the ranks on this machine share its cores
    monkeypatch.setenv("OMP_NUM_THREADS", "zero")  # not a count: ignored
    assert cores_per_process() == max(1, cores // 2)


def test_exploration_draws_made_in_blocks_are_each_steps_own_word() -> None:
    from popplay import rng
    from popplay.deep.agents.dqn_members import _EXPLORE, EXPLORE_BLOCK
    from popplay.xp import th

    learner = DQNPopulation(small(), None).initial_state().learner
    r = rng.make_rng(th)
    for step in (0, 1, EXPLORE_BLOCK - 1, EXPLORE_BLOCK, 3 * EXPLORE_BLOCK + 5, 2):  # back into an earlier block
        word = r.draw(learner._keys[_EXPLORE], r.mix_counter(torch.tensor(step, dtype=torch.int64)))
        chance, action = learner._explore_draws(step)
        assert isinstance(chance, np.ndarray) and isinstance(action, np.ndarray)  # the CPU's choice is NumPy's
        assert torch.equal(torch.as_tensor(chance), r.uniform_hi32(word))
        assert torch.equal(torch.as_tensor(action), (r.uniform_lo32(word) * learner.actions).to(torch.int64))
    assert len(set(learner._explore_draws(7)[0].tolist())) == learner.count  # members draw from their own streams


@pytest.mark.parametrize("copies", [1, 2])
def test_ended_episodes_enter_the_lists_and_each_members_window_in_environment_order(copies: int) -> None:
    """The episodes of a step go into the run's lists and shift each member's window of
    recent returns as one episode at a time would, in environment order: with several
    copies a member whose copies end together takes both, the later copy last."""
    from types import SimpleNamespace

    experiment = DQNPopulation(small(agents=4), None)
    state = experiment.initial_state()
    experiment.copies = copies
    state.recent = np.arange(4 * 3, dtype=np.float64).reshape(4, 3)
    expected = state.recent.copy()
    ended = np.array([0, 2, 3]) if copies == 1 else np.array([0, 1, 4, 7])
    returns = np.array([10.5, 20.5, 30.5, 40.5])[:len(ended)]
    for env, ret in zip(ended, returns):  # one episode at a time
        expected[env // copies] = [*expected[env // copies][1:], ret]
    state.member_steps = 5
    experiment._record_episodes(state, SimpleNamespace(ended=ended, returns=returns, lengths=ended + 7))
    np.testing.assert_array_equal(state.recent, expected)
    assert state.episode_member == (ended // copies).tolist() and state.episode_return == returns.tolist()
    assert state.episode_length == (ended + 7).tolist() and state.episode_step == [state.env_steps] * len(ended)


def test_greedy_members_act_on_the_first_maximum_of_their_q_values_nan_counting_as_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Acting picks each greedy member's action in NumPy; it must be torch's argmax:
    the first maximum, a NaN counting as the maximum (a diverged member), ties and
    signed zeros to the first; exploring members take their random action."""
    learner = DQNPopulation(small(agents=6), None).initial_state().learner
    nan = float("nan")
    rows = [[nan, 1.0], [1.0, nan], [2.0, 2.0], [-0.0, 0.0], [1.0, 3.0], [float("-inf"), -1e30]]
    q = torch.tensor([rows[k % len(rows)] for k in range(learner.count)], dtype=torch.float32).unsqueeze(1)
    monkeypatch.setattr(learner, "q_values", lambda obs: q)
    monkeypatch.setattr(learner, "epsilons", lambda: np.zeros(learner.count))  # every member greedy
    obs = np.zeros((learner.count, learner.obs_dim), dtype=np.float32)
    assert learner.act(obs, 3).tolist() == q[:, 0].argmax(dim=1).tolist()
    assert learner.act(obs, 3).tolist()[:6] == [0, 1, 0, 0, 1, 1]
    monkeypatch.setattr(learner, "epsilons", lambda: np.ones(learner.count))  # every member explores
    learner._epsilons_at = -1
    assert learner.act(obs, 3).tolist() == learner._explore_draws(3)[1].tolist()


def test_minibatch_slots_drawn_in_blocks_are_each_updates_own_words() -> None:
    from popplay import rng
    from popplay.deep.agents.member_replay import SAMPLE_BLOCK, MemberReplay
    from popplay.xp import th

    r = rng.make_rng(th)
    replay = MemberReplay(3, 50, 2, (), torch.int64, batch_size=4, learning_starts=1, update_ratio=1.0)
    replay.size = 37
    keys = torch.tensor([11, -5, 2**40], dtype=torch.int64)

    def expected(update: int) -> torch.Tensor:
        counters = r.mix_counter(torch.arange(update * 4, (update + 1) * 4, dtype=torch.int64))
        return (r.uniform53(r.draw(keys.unsqueeze(1), counters.unsqueeze(0))) * replay.size).to(torch.int64)

    for update in (0, 1, SAMPLE_BLOCK - 1, SAMPLE_BLOCK, 3 * SAMPLE_BLOCK + 5, 2):  # back into an earlier block
        assert torch.equal(replay.sample_index(r, keys, update), expected(update))
    keys[1] = 7  # keys changed in place: the block is drawn again
    assert torch.equal(replay.sample_index(r, keys, 2), expected(2))
    other = keys.clone()
    other[0] = 8  # other keys (another tensor)
    assert not torch.equal(replay.sample_index(r, other, 2), expected(2))
    keys = other
    assert torch.equal(replay.sample_index(r, keys, 2), expected(2))
    replay._host_packed = None  # the tensor path a GPU's rings take gives the same slots
    for update in (2, SAMPLE_BLOCK + 1):
        assert torch.equal(replay.sample_index(r, keys, update), expected(update))



def test_replay_rings_hold_each_members_transition_in_its_slot_written_in_place_or_staged() -> None:
    """On the CPU a transition is written into the rings through a NumPy view; elsewhere
    it is staged and copied in. Both leave each member's fields in the ring's slot,
    wrapping round, as the minibatches read them."""
    from popplay.deep.agents.member_replay import MemberReplay

    def filled(staged: bool) -> MemberReplay:
        replay = MemberReplay(3, 4, 2, (), torch.int64, batch_size=2, learning_starts=1, update_ratio=1.0)
        if staged:
            replay._host_packed = None  # the path a GPU's rings take
        for t in range(6):
            obs = np.arange(6, dtype=np.float32).reshape(3, 2) + 10 * t
            replay.store(obs, np.array([t % 2, 1, 0]), np.full(3, t, dtype=np.float32), obs + 0.5,
                         np.array([t == 5, False, True]))
        return replay

    in_place, staged = filled(False), filled(True)
    assert in_place._host_packed is not None
    assert torch.equal(in_place.packed, staged.packed)
    rows = in_place.batch(torch.tensor([[1, 0], [1, 3], [0, 2]]))  # slot 1 holds step 5, slot 0 step 4
    assert rows["obs"][0].tolist() == [[50.0, 51.0], [40.0, 41.0]]
    assert rows["next_obs"][1].tolist() == [[52.5, 53.5], [32.5, 33.5]]
    assert rows["action"].tolist() == [[1, 0], [1, 1], [0, 0]] and rows["action"].dtype == torch.int64
    assert rows["reward"][0].tolist() == [5.0, 4.0] and rows["terminated"].tolist() == [[1.0, 0.0], [0.0, 0.0],
                                                                                        [1.0, 1.0]]


def test_ppo_member_k_of_a_population_is_member_k_alone() -> None:
    params = PPOParams(**PPO_SMALL)  # type: ignore[arg-type]
    population = run_phases(PPOPopulation(params, None), 3)
    assert population.learner.rollouts >= 7 and population.episodes > 0
    for k in (0, 2):
        alone = run_phases(PPOPopulation(params, None, members=np.array([k])), 3)
        assert torch.equal(population.learner.net.matrix[k], alone.learner.net.matrix[0])
        assert torch.equal(population.learner.adam.exp_avg_sq[k], alone.learner.adam.exp_avg_sq[0])
        assert np.array_equal(population.envs.obs[2 * k:2 * k + 2], alone.envs.obs)
    assert not torch.equal(population.learner.net.matrix[0], population.learner.net.matrix[1])


# --- operators on hand-made inputs --------------------------------------------------

def test_pbt_copies_weights_optimiser_and_hypers_from_the_best_and_records_them() -> None:
    params = small(agents=4, replicate_fraction=0.25, resample=0.0)  # replicated by hand below
    experiment = DQNPopulation(params, None)
    state = run_phases(experiment, 2)
    learner = state.learner
    before = {name: t.clone() for name, t in (("online", learner.online.matrix), ("adam", learner.adam.exp_avg))}
    hypers_before = {name: v.copy() for name, v in learner.hypers.items()}
    replay_before = learner.replay.tables["obs"].clone()
    records = len(state.lineage)
    parents, children = experiment.replicate(state, scores=np.array([10.0, 40.0, 20.0, 30.0]))
    assert parents.tolist() == [1] and children.tolist() == [0]
    assert torch.equal(learner.online.matrix[0], before["online"][1])
    assert torch.equal(learner.adam.exp_avg[0], before["adam"][1])
    assert torch.equal(learner.online.matrix[1:], before["online"][1:])  # nobody else moved
    assert torch.equal(learner.replay.tables["obs"], replay_before)  # replay kept by default
    # explore: each spec'd value x0.8 or x1.2 of the parent's (clipped to its range), or the neighbouring choice
    lr = learner.hypers["lr"][0]
    assert np.isclose(lr, np.clip(hypers_before["lr"][1] * 0.8, 1e-4, 1e-2)) or \
        np.isclose(lr, np.clip(hypers_before["lr"][1] * 1.2, 1e-4, 1e-2))
    assert learner.hypers["epsilon_end"][0] == hypers_before["epsilon_end"][1]  # no spec: copied as is
    assert abs([0.9, 0.95, 0.99].index(learner.hypers["gamma"][0])
               - [0.9, 0.95, 0.99].index(hypers_before["gamma"][1])) <= 1
    new = {name: values[records:] for name, values in state.lineage.records.items()}
    assert new["event"].tolist() == [EVENTS["copy"], EVENTS["mutation"]]
    assert new["parent"][0] == 1 and new["replaced"][0] == 0 and new["slot"].tolist() == [0, 0]
    assert new["agent"].tolist() == [4, 4] and state.ids.tolist() == [4, 1, 2, 3]
    assert new["lr"][0] == hypers_before["lr"][1] and new["lr"][1] == lr
    assert np.array_equal(state.recent[0], state.recent[1], equal_nan=True)  # ranked as its parent until it plays


def test_window_means_and_errors_follow_the_sample_formula() -> None:
    from popplay.operators.evolution import window_means

    recent = np.array([[1.0, 2.0, 3.0, np.nan], [5.0, np.nan, np.nan, np.nan], [np.nan] * 4])
    means, errors = window_means(recent)
    assert means[0] == 2.0 and errors[0] == np.sqrt(((1 + 0 + 1) / 2) / 3)  # s / sqrt(n), s with n - 1
    assert means[1] == 5.0 and errors[1] == np.inf  # one return: no spread to judge by
    assert np.isnan(means[2]) and errors[2] == np.inf


def test_greedy_ranking_plays_fresh_greedy_episodes_and_copies_their_best_over_their_worst() -> None:
    from popplay import rng
    from popplay.deep.topologies.population import TAG_RANKING, evaluate_members

    params = small(agents=4, replicate_fraction=0.25, rank_by="greedy", rank_episodes=3, replicate_every=40)
    experiment = DQNPopulation(params, None)
    state = run_phases(experiment, 2)
    seed = rng.key_path(params.seed, TAG_RANKING, state.member_env_steps)
    returns = evaluate_members(params.env, seed, experiment.slots, experiment.greedy(state), 3)
    means = returns.mean(axis=1)
    assert not np.allclose(means, means[0])  # the members differ, so the ranking means something
    assert not np.array_equal(returns, evaluate_members(params.env, params.seed, experiment.slots,
                                                        experiment.greedy(state), 3))  # not the final evaluation's
    before = state.learner.online.matrix.clone()
    parents, children = experiment.replicate(state)
    order = np.argsort(means, kind="stable")
    assert children.tolist() == [int(order[0])] and parents.tolist() == [int(order[-1])]
    assert torch.equal(state.learner.online.matrix[children[0]], before[parents[0]])
    assert state.ranking_env_steps >= returns.shape[0] * 3 * 8  # every step of every member's episodes at least


def test_significant_pbt_copies_only_a_parent_clearly_better_and_always_a_diverged_child() -> None:
    params = small(agents=4, replicate_fraction=0.5, resample=0.0, window=4, replicate_when="significant")
    experiment = DQNPopulation(params, None)
    state = run_phases(experiment, 1)
    # Members 0 and 1 the worst; member 3's returns are far above member 0's, member
    # 2's overlap member 1's: only 3 -> 0 is carried out.
    state.recent = np.array([[10.0, 11.0, 12.0, 10.0], [20.0, 60.0, 25.0, 70.0],
                             [30.0, 90.0, 20.0, 80.0], [100.0, 101.0, 99.0, 100.0]])
    online = state.learner.online.matrix.clone()
    parents, children = experiment.replicate(state)
    assert parents.tolist() == [3] and children.tolist() == [0]
    assert torch.equal(state.learner.online.matrix[1], online[1])  # kept: not shown worse than member 2
    # A member whose parameters went non-finite is replaced whatever its window says.
    state.recent = np.array([[100.0, 101.0, 99.0, 100.0], [20.0, 60.0, 25.0, 70.0],
                             [30.0, 90.0, 20.0, 80.0], [100.0, 101.0, 99.0, 100.0]])
    state.learner.online.matrix[2, 0] = float("nan")
    assert experiment.check_finite(state, phase=2)[0].startswith("phase 2: member 2 diverged")
    parents, children = experiment.replicate(state)
    assert 2 in children.tolist() and torch.isfinite(state.learner.online.matrix).all()
    # The same windows under "always": both pairs are carried out.
    always = DQNPopulation(dataclasses.replace(params, replicate_when="always"), None)
    state = run_phases(always, 1)
    state.recent = np.array([[10.0, 11.0, 12.0, 10.0], [20.0, 60.0, 25.0, 70.0],
                             [30.0, 90.0, 20.0, 80.0], [100.0, 101.0, 99.0, 100.0]])
    assert sorted(always.replicate(state)[1].tolist()) == [0, 1]


def test_no_pbt_step_before_replicate_after() -> None:
    params = small(agents=2, replicate_fraction=0.5, replicate_every=20, phase_steps=20, replicate_after=60)
    experiment = DQNPopulation(params, None)
    state = experiment.initial_state()
    steps = []
    for _ in range(4):
        state = experiment.phase(state, time_left=None)
        steps.append((int(state.member_env_steps), int(state.replications)))
    assert steps == [(20, 0), (40, 0), (60, 3), (80, 4)]


def test_copy_replay_takes_the_parents_memory_too() -> None:
    experiment = DQNPopulation(small(agents=2, replicate_fraction=0.5, copy_replay=True), None)
    state = run_phases(experiment, 1)
    experiment.replicate(state, scores=np.array([1.0, 0.0]))
    assert torch.equal(state.learner.replay.tables["obs"][1], state.learner.replay.tables["obs"][0])


def test_sharing_is_the_experience_weighted_mean_of_each_group() -> None:
    params = small(agents=4, share_every=40, share_group=2)
    experiment = DQNPopulation(params, None)
    state = experiment.initial_state()
    learner = state.learner
    assert (learner.online.matrix == learner.online.matrix[0]).all()  # sharing members start alike
    gen = torch.Generator().manual_seed(0)
    learner.online.matrix.copy_(torch.randn(learner.online.matrix.shape, generator=gen))
    before = learner.online.matrix.clone().double()
    state.member_steps = 30
    experiment.share(state)
    for group in ((0, 1), (2, 3)):
        expected = (before[group[0]] * 30 + before[group[1]] * 30) / 60
        for k in group:
            torch.testing.assert_close(learner.online.matrix[k].double(), expected, rtol=2**-23, atol=0)  # float32
    assert not torch.equal(learner.online.matrix[0], learner.online.matrix[2])
    assert torch.equal(learner.target.matrix[0], learner.target.matrix[1])  # the target is shared alike
    share = state.lineage.records
    assert share["event"][-2:].tolist() == [EVENTS["share"]] * 2 and share["group"][-2:].tolist() == [0, 1]
    # a diverged member gives nothing (its NaN would be its group's) and keeps its own rows
    learner.online.matrix.copy_(before.float())
    learner.online.matrix[1, 3] = float("nan")
    with_nan = learner.online.matrix.clone()
    state.member_steps = 60
    experiment.share(state)
    assert torch.equal(learner.online.matrix[0], with_nan[0])  # the mean of itself alone
    torch.testing.assert_close(learner.online.matrix[1], with_nan[1], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(learner.online.matrix[2].double(), (before[2] + before[3]) / 2, rtol=2**-23, atol=0)


def test_differentiation_after_sharing_moves_each_member_by_at_most_the_bias() -> None:
    experiment = DQNPopulation(small(agents=2, share_every=40, differentiation=0.01, bias_decay=2.0), None)
    state = experiment.initial_state()
    state.member_steps = 40
    mean = state.learner.online.matrix.double().mean(dim=0)
    experiment.share(state)
    moved = state.learner.online.matrix.double() - mean
    assert 0 < moved.abs().max() <= 0.01 + 1e-6
    assert not torch.equal(moved[0], moved[1])  # each member its own noise
    assert state.max_bias == 0.005


# --- hyper-parameter specs -----------------------------------------------------------

def test_hyper_samples_depend_on_the_member_not_the_population() -> None:
    specs = hyper.parse("lr=loguniform:1e-4:1e-2; gamma=choice:0.9,0.99", {"lr": hyper.Bounds(0, low_open=True),
                                                                          "gamma": hyper.Bounds(0, 1)})
    whole = hyper.sample(specs, 3, np.arange(8), {"lr": 1e-3, "gamma": 0.99, "tau": 0.5})
    part = hyper.sample(specs, 3, np.array([5]), {"lr": 1e-3, "gamma": 0.99, "tau": 0.5})
    assert whole["lr"][5] == part["lr"][0] and whole["gamma"][5] == part["gamma"][0]
    assert ((whole["lr"] >= 1e-4) & (whole["lr"] <= 1e-2)).all() and len(set(whole["lr"])) == 8
    assert set(whole["gamma"]) <= {0.9, 0.99} and (whole["tau"] == 0.5).all()


@pytest.mark.parametrize("spec, message", [
    ("lr=loguniform:0:1", "positive LOW"),
    ("foo=uniform:0:1", "not a per-member hyper-parameter here (one of epsilon_end, "),  # names as --hp takes them
    ("gamma=uniform:0.9:1.5", "gamma must be"), ("lr=normal:1:2", "kind must be"),
    ("target_every=uniform:1:5", "whole number"), ("lr", "NAME=KIND"), ("lr=uniform:2:1", "LOW < HIGH"),
    ("lr=choice:1e-3;lr=choice:1e-2", "twice"), ("target_every=choice:2.5,3", "whole number"),
    ("", "--hp '': expected a value such as NAME=KIND:ARGS"),  # an empty shell variable: not "no spec"
    (";", "--hp ';': expected a value such as NAME=KIND:ARGS"),  # "$A;$B" with both empty
])
def test_bad_hp_specs_are_one_line_with_exit_2(cli, spec: str, message: str) -> None:
    code, out, err = cli(["train", "dqn", "--agents", "2", "--env-steps", "100", "--hp", spec])
    assert code == 2, err
    assert message in err and "Traceback" not in err and not out
    assert len([line for line in err.splitlines() if line.strip()]) == 1


@pytest.mark.parametrize("args, message", [
    (["--hp", "lr=uniform:1e-4:1e-3"], "--agents 2 or more"),
    (["--agents", "2", "--topology", "collective", "--simulators", "2"], "give --topology sequential"),
    (["--agents", "100000", "--replay", "1000000"], "memory"),
    (["--agents", "1000000", "--replay", "10", "--learning-starts", "0"], "memory"),  # the environments alone
    (["--agents", "4", "--share-every", "10", "--share-group", "3"], "divisor"),
    # over ranks, refused by the launcher before any rank starts
    (["--agents", "4", "--nproc", "2", "--episodes", "40"], "--episodes 40: a population over several ranks"),
    (["--agents", "3", "--nproc", "2"], "3 agents cannot be split evenly over 2 ranks"),
    (["--nproc", "2"], "come from its layout"),  # one agent: its topology counts its ranks
    (["--agents", "2", "--replay", "100", "--learning-starts", "500"],
     "--learning-starts (500) exceeds the replay capacity (100): the memory never holds that many"),
    # options that would do nothing: refused, not silently ignored
    (["--window", "20"], "--agents 2 or more"),
    (["--copy-replay"], "--agents 2 or more"),
    (["--agents", "2", "--copy-replay"], "give --replicate-every too"),
    (["--agents", "2", "--replicate-when", "significant"], "give --replicate-every too"),
    (["--agents", "2", "--differentiation", "0.01"], "give --share-every too"),
    (["--agents", "4", "--share-group", "2"], "give --share-every too"),
])
def test_population_options_that_cannot_work_are_refused_in_one_line(cli, args: list[str], message: str) -> None:
    code, out, err = cli(["train", "dqn", "--env-steps", "100", *args])
    assert code == 2, err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("algo", ["ppo", "a2c", "reinforce"])
def test_copying_a_replay_memory_is_refused_where_members_keep_none(cli, algo: str) -> None:
    code, out, err = cli(["train", algo, "--agents", "2", "--env-steps", "100", "--replicate-every", "50",
                          "--copy-replay"])
    assert code == 2, err
    assert "keep no replay memory" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_budget_the_population_steps_overshoot_is_announced(cli, tmp_path) -> None:
    flags = ["--agents", "4", "--hidden", "8", "--eval-episodes", "0", "--learning-starts", "30", "--replay", "300"]
    code, out, err = cli(["train", "dqn", *flags, "--env-steps", "401", "--out", str(tmp_path / "a.h5"), "--json"])
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["env_steps"] == 404
    assert "Warning: --env-steps 401 is not a multiple of the 4 env-steps of one population step" in err
    code, _, err = cli(["train", "dqn", *flags, "--env-steps", "400", "--out", str(tmp_path / "b.h5")])
    assert code == 0 and "Warning" not in err


@pytest.mark.parametrize("toml", ['hp = "lr=uniform:1e-4:1e-3;gamma=choice:0.9,0.99"',
                                  '[dqn]\nhp = ["lr=uniform:1e-4:1e-3", "gamma=choice:0.9,0.99"]'])
def test_hp_specs_come_from_a_toml_config_as_text_or_a_list(tmp_path, cli, toml: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(toml + "\nagents = 3\n" if toml.startswith("hp") else toml + "\nagents = 3\n")
    code, out, err = cli(["train", "dqn", "--config", str(config), "--env-steps", "60", "--eval-episodes", "0",
                          "--learning-starts", "10", "--phase-steps", "10", "--json", "--out", str(tmp_path / "r.h5")])
    assert code == 0, err
    hypers = json.loads(out.strip().splitlines()[-1])["hypers"]
    assert set(hypers) == {"lr", "gamma"} and set(hypers["gamma"]) <= {0.9, 0.99} and len(hypers["lr"]) == 3


# --- the run file: exact resume, lineage, evaluate, export ------------------------------

FLAGS = ["--agents", "3", "--hidden", "16,16", "--batch-size", "8", "--replay", "300", "--learning-starts", "30",
         "--phase-steps", "50", "--eval-episodes", "1", "--hp", "lr=loguniform:1e-4:1e-2",
         "--replicate-every", "100", "--share-every", "150", "--differentiation", "0.001"]


def test_resume_is_exact_and_the_run_file_serves_lineage_evaluate_and_export(tmp_path, cli) -> None:
    runner = CliRunner()
    straight, split = tmp_path / "straight.h5", tmp_path / "split.h5"
    assert cli(["train", "dqn", *FLAGS, "--env-steps", "900", "--out", str(straight)])[0] == 0
    code, _, err = cli(["train", "dqn", *FLAGS, "--env-steps", "450", "--out", str(split)])
    assert code == 0, err
    code, out, err = cli(["train", "dqn", "--resume", str(split), "--env-steps", "900", "--json"])
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["agents"] == 3 and summary["replications"] >= 2 and summary["shares"] >= 1
    names = assert_same_state(straight, split)
    assert "members.online" in names and "lineage_event" in names
    lineage = runner.invoke(app, ["lineage", str(split), "--json"])
    assert lineage.exit_code == 0 and json.loads(lineage.output)["parameters"] == ["lr"]
    evaluated = runner.invoke(app, ["evaluate", str(split), "--episodes", "2", "--member", "1", "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.output.strip().splitlines()[-1])["members"] == [1]
    out = tmp_path / "member.pt"
    exported = runner.invoke(app, ["export", str(split), "--member", "2", "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    module = networks.mlp(4, 2, (16, 16))
    module.load_state_dict(torch.load(out, weights_only=True))
    with h5py.File(split) as f:
        assert torch.equal(networks.flat_parameters(module), torch.as_tensor(f["state"]["members.online"][2]))
    code, _, err = cli(["export", str(split), "--member", "2", "--out", str(straight)])
    assert code == 2 and "refused" in err


def test_greedy_ranked_pbt_resumes_exactly_and_reports_its_ranking_steps(tmp_path, cli) -> None:
    flags = [*FLAGS[:FLAGS.index("--share-every")], "--rank-by", "greedy", "--rank-episodes", "2"]
    straight, split = tmp_path / "straight.h5", tmp_path / "split.h5"
    code, out, err = cli(["train", "dqn", *flags, "--env-steps", "600", "--out", str(straight), "--json"])
    assert code == 0, err
    whole = json.loads(out.strip().splitlines()[-1])
    assert cli(["train", "dqn", *flags, "--env-steps", "300", "--out", str(split)])[0] == 0
    code, out, err = cli(["train", "dqn", "--resume", str(split), "--env-steps", "600", "--json"])
    assert code == 0, err
    resumed = json.loads(out.strip().splitlines()[-1])
    assert whole["replications"] == 2 and whole["ranking_env_steps"] > 0
    assert resumed["ranking_env_steps"] == whole["ranking_env_steps"]
    assert_same_state(straight, split)


def test_a_population_trains_in_a_real_process(tmp_path) -> None:
    out = tmp_path / "run.h5"
    done = subprocess.run([sys.executable, "-m", "popplay", "train", "dqn", *FLAGS, "--env-steps", "300", "--out",
                           str(out), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["env_steps"] == 300 and len(summary["member_quality"]) == 3
    assert summary["quality"] == max(summary["member_quality"])


def test_a_ppo_population_resumes_exactly_and_exports_its_policy(tmp_path, cli) -> None:
    flags = ["--agents", "2", "--hidden", "8,8", "--copies", "2", "--n-steps", "16", "--n-epochs", "2",
             "--batch-size", "12", "--phase-steps", "24", "--eval-episodes", "1", "--hp", "lr=loguniform:1e-4:3e-3",
             "--replicate-every", "96"]
    straight, split = tmp_path / "straight.h5", tmp_path / "split.h5"
    # an --episodes budget: PPO's schedules anneal over an --env-steps one, which a resume changes
    assert cli(["train", "ppo", *flags, "--episodes", "40", "--out", str(straight)])[0] == 0
    assert cli(["train", "ppo", *flags, "--episodes", "20", "--out", str(split)])[0] == 0
    code, out, err = cli(["train", "ppo", "--resume", str(split), "--episodes", "40", "--json"])
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["replications"] >= 2
    assert_same_state(straight, split)
    assert cli(["export", str(split), "--member", "1", "--out", str(tmp_path / "policy.pt")])[0] == 0
    policy = networks.mlp(4, 2, (8, 8), "tanh")
    policy.load_state_dict(torch.load(tmp_path / "policy.pt", weights_only=True))
    # an --env-steps budget: a resume that changes it stretches the annealing, and says so
    annealed = str(tmp_path / "annealed.h5")
    assert cli(["train", "ppo", *flags, "--env-steps", "128", "--out", annealed])[0] == 0
    code, _, err = cli(["train", "ppo", "--resume", annealed, "--env-steps", "192"])
    assert code == 0 and "Warning: --resume with a new budget changes how the learning rate" in err
    flat = str(tmp_path / "flat.h5")  # nothing anneals: nothing to say
    assert cli(["train", "ppo", *flags[:flags.index("--hp")], "--env-steps", "128", "--lr", "1e-3",
                "--lr-end", "1e-3", "--clip-range-end", "0.2", "--out", flat])[0] == 0
    code, _, err = cli(["train", "ppo", "--resume", flat, "--env-steps", "192"])
    assert code == 0 and "Warning" not in err, err


def test_a_diverged_member_is_replaced_not_the_run_stopped() -> None:
    experiment = DQNPopulation(small(agents=4, replicate_fraction=0.25), None)
    state = run_phases(experiment, 1)
    state.learner.online.matrix[2, 5] = float("nan")
    warned = experiment.check_finite(state, phase=1)
    assert len(warned) == 1 and warned[0].startswith("phase 1: member 2 diverged") and experiment.diverged is None
    assert experiment.check_finite(state, phase=2) == []  # said once
    assert np.isnan(state.recent[2]).all()  # it ranks last from now on
    parents, children = experiment.replicate(state, scores=np.array([1.0, 2.0, 99.0, 3.0]))
    assert children.tolist() == [2] and parents.tolist() == [3]  # the NaN member never parents, whatever its score
    assert torch.isfinite(state.learner.online.matrix).all()
    state.learner.online.matrix.fill_(float("nan"))
    assert experiment.check_finite(state, phase=2) and experiment.diverged  # every member: the run stops


DIVERGING = ["--agents", "2", "--hidden", "8", "--batch-size", "8", "--replay", "500", "--learning-starts", "100",
             "--phase-steps", "500", "--eval-episodes", "2", "--seed", "0", "--hp", "lr=choice:1e-3,1e30"]


def test_a_member_that_diverges_without_pbt_leaves_the_others_usable(tmp_path, cli) -> None:
    """Without PBT a diverged member stays as it is, and the run file still serves the
    others: a warning names it, evaluate and the summary leave it out (never the best),
    export and evaluate --member refuse it in one line, and the run resumes exactly."""
    split, straight = str(tmp_path / "split.h5"), str(tmp_path / "straight.h5")
    code, out, err = cli(["train", "dqn", *DIVERGING, "--env-steps", "3000", "--out", split, "--json"])
    summary = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and summary["hypers"]["lr"] == [1e30, 1e-3]  # member 0 takes the absurd rate
    assert "Warning: phase" in err and "member 0 diverged" in err
    assert summary["member_quality"][0] is None and summary["best_member"] == 1 and summary["quality"] is not None
    code, out, _ = cli(["evaluate", split, "--episodes", "2", "--json"])
    evaluated = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and evaluated["diverged_members"] == [0] and evaluated["best_member"] == 1
    assert evaluated["member_quality"][0] is None and evaluated["member_quality"][1] is not None
    for command in (["evaluate", split, "--member", "0"], ["export", split, "--member", "0"]):
        code, out, err = cli(command)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "member 0" in err and "diverged" in err
    code, _, err = cli(["export", split, "--member", "1", "--out", "-"])
    assert code == 2 and err.startswith("Error: --out -")
    assert cli(["export", split, "--member", "1", "--out", str(tmp_path / "m1.pt")])[0] == 0

    code, _, err = cli(["train", "dqn", "--resume", split, "--env-steps", "5000"])
    assert code == 0, err
    assert cli(["train", "dqn", *DIVERGING, "--env-steps", "5000", "--out", straight])[0] == 0
    with h5py.File(split) as a, h5py.File(straight) as b:
        for name in ("members.online", "members.adam.exp_avg", "env.obs", "episode_returns"):
            np.testing.assert_array_equal(a["state"][name][()], b["state"][name][()])  # NaN where NaN



def test_updates_are_owed_from_learning_starts_on_as_for_one_agent() -> None:
    """No burst of updates when learning starts: as UpdateCredit, a member owes
    update_ratio updates per transition only once learning_starts are stored."""
    experiment = DQNPopulation(small(agents=2, learning_starts=30, update_ratio=0.25, phase_steps=38), None)
    state = run_phases(experiment, 1)
    assert state.learner.updates == 2  # transitions 30..38 owe 9 x 0.25 = 2.25: two paid


def test_pbt_leaves_every_member_it_never_replaced_as_it_would_be_alone() -> None:
    """Exploit and explore act on the children only: a member PBT never replaced ends
    bit-identical to the same member with the operators off."""
    params = small(agents=8, replicate_every=80, replicate_fraction=0.25, phase_steps=40, window=3)
    with_pbt = run_phases(DQNPopulation(params, None), 12)
    alone = run_phases(DQNPopulation(dataclasses.replace(params, replicate_every=0), None), 12)
    records = with_pbt.lineage.records
    replaced = set(records["slot"][records["event"] == EVENTS["copy"]].tolist())
    untouched = sorted(set(range(8)) - replaced)
    assert replaced and untouched  # the test means something only with both kinds
    for k in range(8):
        same = torch.equal(with_pbt.learner.online.matrix[k], alone.learner.online.matrix[k])
        assert same == (k in untouched), k


def test_exports_never_replace_a_file_unasked_and_evaluate_refuses_knights_options(tmp_path, cli) -> None:
    """A file at --out may be the user's own (a model, notes): export and lineage refuse
    it unless --overwrite, and never replace a run file even then; evaluate refuses the
    options that only knights runs read instead of ignoring them."""
    run = str(tmp_path / "run.h5")
    code, _, err = cli(["train", "dqn", "--agents", "2", "--hidden", "8", "--env-steps", "200",
                        "--learning-starts", "50", "--phase-steps", "50", "--eval-episodes", "1", "--out", run])
    assert code == 0, err
    model, notes = tmp_path / "mine.pt", tmp_path / "notes.txt"
    model.write_bytes(b"PK\x03\x04\x00\x00 my own model")
    notes.write_text("my notes\n")
    refusals = [(["export", run, "--member", "1", "--out", str(model)], model),
                (["export", run, "--out", str(notes)], notes),
                (["lineage", run, "--format", "csv", "--out", str(notes)], notes)]
    for command, victim in refusals:
        kept = victim.read_bytes()
        code, _, err = cli(command)
        assert code == 2 and "pass --overwrite" in err and len(err.strip().splitlines()) == 1, (command, err)
        assert victim.read_bytes() == kept
        code, _, err = cli([*command, "--overwrite"])
        assert code == 0 and victim.read_bytes() != kept, (command, err)
    fresh = tmp_path / "new" / "deeper"  # written on request: missing directories are made, as plot's
    for command, made in ((["export", run, "--member", "1", "--out", str(fresh / "m.pt")], fresh / "m.pt"),
                          (["export", run, "--out", str(fresh / "c.csv")], fresh / "c.csv"),
                          (["lineage", run, "--out", str(fresh / "l.txt")], fresh / "l.txt")):
        code, _, err = cli(command)
        assert code == 0 and made.is_file(), (command, err)
    code, _, err = cli(["export", run, "--member", "0", "--out", str(notes / "m.pt")])  # under a file
    assert code == 2 and f"{notes} is not a directory" in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")  # a folder that cannot be made: one line, nothing made
    for command in (["export", run, "--member", "0", "--out", str(tmp_path / "gone" / "m.pt")],
                    ["lineage", run, "--out", str(tmp_path / "gone" / "x" / "l.txt")]):
        code, _, err = cli(command)
        assert code == 2 and "cannot create" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = cli(["export", run, "--member", "5", "--out", str(tmp_path / "unmade" / "m.pt")])
    assert code == 2 and not (tmp_path / "unmade").exists(), err  # refused: no folder left behind
    kept = Path(run).read_bytes()
    for command in (["export", run, "--out", run, "--overwrite"],
                    ["export", str(tmp_path / "copy.h5"), "--member", "0", "--out", run, "--overwrite"],
                    ["lineage", run, "--out", run, "--overwrite"]):
        Path(tmp_path / "copy.h5").write_bytes(kept)
        code, _, err = cli(command)
        assert code == 2 and ("refused" in err or "would overwrite" in err), (command, err)
    assert Path(run).read_bytes() == kept
    for option in (["--opponent", "search4"], ["--games", "4"], ["--ladder"], ["--lookahead", "2"]):
        code, out, err = cli(["evaluate", run, "--episodes", "1", *option])
        assert code == 2 and option[0] in err and "knights" in err and not out, (option, err)
        assert len(err.strip().splitlines()) == 1
    assert cli(["evaluate", run, "--episodes", "1", "--seed", "3"])[0] == 0


def test_idle_options_are_named_for_new_runs_but_a_stored_config_still_validates() -> None:
    """train refuses an option that would do nothing; a run file written with one (before
    that check) must still evaluate and resume, so validate() itself does not judge it."""
    stored = small(agents=2, copy_replay=True, differentiation=0.01)
    stored.validate()
    assert stored.idle_options() == "copy_replay acts on PBT's steps: give --replicate-every too"
    assert small(agents=2, replicate_every=40, copy_replay=True, share_every=40, differentiation=0.01).idle_options() \
        is None
    assert dataclasses.replace(small(), agents=1, hp="", window=4).idle_options() == \
        "window acts on a population: give --agents 2 or more"
    assert dataclasses.replace(small(), agents=1, hp="", phase_steps=7).idle_options() is None
    assert PPOParams(agents=2, replicate_every=40, copy_replay=True).idle_options().startswith(
        "copy_replay: these members keep no replay memory")
