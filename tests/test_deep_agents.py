"""Agents: the Double DQN target by hand, replay, REINFORCE's returns, loss and gradients."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from popplay.deep.agents import dqn
from popplay.deep.agents import networks
from popplay.deep.agents import reinforce
from popplay.deep.agents.replay import Batch, ReplayBuffer


def _linear(weight: list[list[float]]) -> nn.Linear:
    layer = nn.Linear(len(weight[0]), len(weight), bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
    return layer


def test_double_dqn_target_against_a_hand_computed_batch() -> None:
    # Q_online(s') = W_o s', Q_target(s') = W_t s' for 3 actions and 2-d states.
    online = _linear([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    target = _linear([[2.0, 0.0], [0.0, -1.0], [1.0, 1.0]])
    batch = Batch(
        obs=torch.zeros(3, 2), action=torch.tensor([0, 1, 2]),
        reward=torch.tensor([1.0, -1.0, 0.5]),
        next_obs=torch.tensor([[3.0, 1.0], [1.0, 4.0], [2.0, 2.0]]),
        terminated=torch.tensor([0.0, 0.0, 1.0]),
    )
    # Row 0: online Q(s') = (3, 1, 2) -> action 0; target values it 2*3 = 6 -> 1 + 0.9*6 = 6.4.
    # Row 1: online (1, 4, 2.5) -> action 1; target -4 -> -1 + 0.9*(-4) = -4.6
    #        (vanilla DQN would take the target's own max, 2*1 = 2: -1 + 1.8 = 0.8).
    # Row 2: terminated -> just the reward 0.5.
    y = dqn.double_dqn_targets(batch, online, target, gamma=0.9)
    assert torch.allclose(y, torch.tensor([6.4, -4.6, 0.5]))


def test_huber_loss_of_the_taken_actions() -> None:
    online = _linear([[1.0, 0.0], [0.0, 1.0]])
    batch = Batch(torch.tensor([[1.0, 5.0], [2.0, 0.0]]), torch.tensor([1, 0]), torch.zeros(2),
                  torch.zeros(2, 2), torch.zeros(2))
    # Q(s, a) = 5 and 2; errors 3 (linear part: 3 - 0.5) and 0.5 (quadratic: 0.125).
    loss = dqn.dqn_loss(batch, online, torch.tensor([2.0, 1.5]))
    assert float(loss.detach()) == pytest.approx((2.5 + 0.125) / 2)


def test_the_learners_written_out_gradient_is_equation_1_with_huber() -> None:
    agent = dqn.DoubleDQN(dqn.DQNConfig(hidden=(8,)), obs_dim=2, actions=3, seed=0)
    with torch.no_grad():
        for p in agent.target.parameters():
            p.add_(0.3)  # make the target differ from the online network
    g = torch.Generator().manual_seed(5)  # its own stream: the global one depends on what ran before
    batch = Batch(torch.randn(16, 2, generator=g), torch.randint(3, (16,), generator=g),
                  4 * torch.randn(16, generator=g), torch.randn(16, 2, generator=g),
                  (torch.arange(16) % 4 == 0).float())
    reference = dqn.dqn_loss(batch, agent.online, dqn.double_dqn_targets(batch, agent.online, agent.target, 0.99))
    reference.backward()
    grad, errors = dqn.double_dqn_gradient(batch, agent._online, agent._target, 0.99)
    assert dqn.huber(errors) == pytest.approx(float(reference.detach()), rel=1e-6)
    assert bool((errors.abs() > 1).any()) and bool((errors.abs() < 1).any())  # both parts of the Huber loss
    torch.testing.assert_close(grad, networks.flat_gradients(agent.online), rtol=1e-5, atol=1e-7)


def test_epsilon_falls_linearly_with_learner_updates() -> None:
    config = dqn.DQNConfig(epsilon_start=1.0, epsilon_end=0.1, epsilon_updates=100)
    assert dqn.epsilon(0, config) == 1.0
    assert dqn.epsilon(50, config) == pytest.approx(0.55)
    assert dqn.epsilon(100, config) == pytest.approx(0.1)
    assert dqn.epsilon(10_000, config) == pytest.approx(0.1)


def test_learning_rate_falls_linearly_to_lr_end_and_reaches_adam() -> None:
    config = dqn.DQNConfig(hidden=(8,), lr=1e-2, lr_end=1e-3, lr_updates=10, learning_starts=0, batch_size=4)
    assert dqn.learning_rate(0, config) == 1e-2
    assert dqn.learning_rate(5, config) == pytest.approx(5.5e-3)
    assert dqn.learning_rate(10, config) == pytest.approx(1e-3)
    assert dqn.learning_rate(1_000, config) == pytest.approx(1e-3)
    assert dqn.learning_rate(1_000, dqn.DQNConfig(lr=1e-2)) == 1e-2  # lr_updates 0: constant
    agent = dqn.DoubleDQN(config, obs_dim=2, actions=2, seed=0)
    agent.replay.add(_batch(16))
    used = []
    for _ in range(12):
        agent.update()
        used.append(agent.adam.lr)
    assert used[0] == 1e-2 and used[5] == pytest.approx(5.5e-3) and used[-1] == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="lr_updates"):
        dqn.DQNConfig(lr_updates=-1).validate()


def _batch(n: int, start: int = 0) -> Batch:
    v = torch.arange(start, start + n, dtype=torch.float32)
    return Batch(torch.stack([v, -v], 1), (v % 2).long(), v * 0.5, torch.stack([v + 1, -v], 1), (v % 3 == 0).float())


def test_replay_ring_overwrites_the_oldest_and_round_trips() -> None:
    buf = ReplayBuffer(5, 2)
    buf.add(_batch(3))
    buf.add(_batch(4, start=3))
    assert len(buf) == 5 and buf.added == 7
    assert buf.ordered().obs[:, 0].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    copy = ReplayBuffer(5, 2)
    copy.load(buf.arrays(), buf.added)
    assert copy.added == 7
    for a, b in zip(copy.ordered(), buf.ordered()):
        assert torch.equal(a, b)
    copy.add(_batch(1, start=7))
    buf.add(_batch(1, start=7))
    assert sorted(copy.ordered().obs[:, 0].tolist()) == sorted(buf.ordered().obs[:, 0].tolist())
    g1, g2 = networks.generator(3), networks.generator(3)
    assert torch.equal(buf.sample(8, g1).obs.sum(1), buf.sample(8, g2).obs.sum(1))


def test_double_dqn_state_round_trips_and_continues_identically() -> None:
    config = dqn.DQNConfig(hidden=(8,), batch_size=4, learning_starts=4, update_ratio=1.0, target_every=3,
                           replay_capacity=16)
    a = dqn.DoubleDQN(config, obs_dim=2, actions=2, seed=1)
    a.receive(_batch(10))
    assert a.train() == 10
    b = dqn.DoubleDQN(config, obs_dim=2, actions=2, seed=99)
    b.load(a.arrays(), a.counters())
    a.receive(_batch(5, start=10))
    b.receive(_batch(5, start=10))
    a.train()
    b.train()
    assert torch.equal(networks.flat_parameters(a.online), networks.flat_parameters(b.online))
    assert torch.equal(networks.flat_parameters(a.target), networks.flat_parameters(b.target))
    assert a.updates == b.updates == 15


def test_discounted_and_normalised_returns() -> None:
    g = reinforce.discounted_returns([1.0, 1.0, 1.0], gamma=0.5)
    assert g.tolist() == [1.75, 1.5, 1.0]
    n = reinforce.normalised_returns(g)
    std = float(np.std([1.75, 1.5, 1.0], ddof=1))
    assert torch.allclose(n, (g - g.mean()) / (std + 0.001))
    assert reinforce.normalised_returns(torch.tensor([3.0])).tolist() == [0.0]
    assert reinforce.update_running_reward(10.0, 30.0) == pytest.approx(11.0)


def test_batched_episode_gradient_equals_the_step_by_step_loss() -> None:
    config = reinforce.ReinforceConfig(hidden=(6,))
    policy = reinforce.policy_network(0, 4, 2, config)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(7, 4)).astype(np.float32)
    actions = rng.integers(2, size=7)
    rewards = np.ones(7, dtype=np.float32)
    grad, loss = reinforce.episode_gradient(policy, obs, actions, rewards, gamma=0.99)
    # The parameter-server draft's way: one log-prob per step, loss = sum of -log_prob * R.
    policy.zero_grad()
    weights = reinforce.normalised_returns(reinforce.discounted_returns(rewards.tolist(), 0.99))
    terms = []
    for t in range(7):
        logp = torch.log_softmax(policy(torch.as_tensor(obs[t])), dim=-1)[int(actions[t])]
        terms.append(-logp * weights[t])
    reference = torch.stack(terms).sum()
    reference.backward()
    assert loss == pytest.approx(float(reference.detach()), rel=1e-5)
    assert torch.allclose(grad, networks.flat_gradients(policy), atol=1e-6)


def test_flat_parameters_round_trip() -> None:
    a = networks.seeded_mlp(1, 3, 2, (5,))
    b = networks.seeded_mlp(2, 3, 2, (5,))
    assert not torch.equal(networks.flat_parameters(a), networks.flat_parameters(b))
    networks.load_flat_parameters(b, networks.flat_parameters(a))
    assert torch.equal(networks.flat_parameters(a), networks.flat_parameters(b))
    assert networks.parameter_count(a) == 3 * 5 + 5 + 5 * 2 + 2


def test_a_wrapped_replay_ring_reloads_each_transition_into_its_slot() -> None:
    """Minibatches draw slots: a ring that has wrapped must come back with every
    transition where it was, or a resumed run learns from other minibatches than an
    unbroken one (it did until the ring's position was restored from ``added``)."""
    def rows(start: int, n: int) -> Batch:
        x = torch.arange(start, start + n, dtype=torch.float32)
        return Batch(x.view(-1, 1).repeat(1, 3), x.long(), x, x.view(-1, 1).repeat(1, 3) + 0.5, torch.zeros(n))

    for total in (7, 10, 23):  # not full, exactly full, wrapped twice and a bit
        ring = ReplayBuffer(10, 3)
        for start in range(0, total, 3):
            ring.add(rows(start, min(3, total - start)))
        again = ReplayBuffer(10, 3)
        again.load(ring.arrays(), ring.added)
        assert (again.position, again.size, again.added) == (ring.position, ring.size, ring.added)
        for name in Batch._fields:
            assert torch.equal(getattr(again, name), getattr(ring, name)), (total, name)
        again.add(rows(100, 1))
        ring.add(rows(100, 1))
        assert torch.equal(again.obs, ring.obs)
