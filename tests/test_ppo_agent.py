"""PPO: GAE and the clipped loss against a plain-Python reference, sampling,
save/load continuation, validation and a learning sanity check."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from popplay.deep.agents import ppo
from popplay.deep.agents.ppo import PPO
from popplay.deep.agents.ppo_params import PPOParams as PPOConfig
from popplay.deep.agents.rollout import Rollout
from tests.reference import ppo as reference


def _random_gae_inputs(T: int, B: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    episode_start = (torch.rand(T, B, generator=g) < 0.25).float()
    episode_start[0] = 1.0  # a fresh start in every column
    episode_start[T - 1, 0] = 1.0  # an episode ended just before the last row
    episode_start[1, 1] = 1.0  # ... and right after the first one
    last_episode_start = torch.tensor([1.0, 0.0] * (B // 2) + [1.0] * (B % 2))
    return {"reward": torch.randn(T, B, generator=g), "value": torch.randn(T, B, generator=g),
            "episode_start": episode_start, "last_value": torch.randn(B, generator=g),
            "last_episode_start": last_episode_start}


def _rollout(agent: PPO, T: int, B: int, seed: int, episode_length: int = 5) -> Rollout:
    """A rollout of the agent's own policy on random observations and rewards."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, B, agent.obs_dim, generator=g)
    actions, log_probs, values = [], [], []
    for t in range(T):
        a, lp, v = agent.act(obs[t].numpy(), g)
        actions.append(torch.as_tensor(a))
        log_probs.append(lp)
        values.append(v)
    steps = torch.arange(T).unsqueeze(1) + torch.arange(B)  # columns end episodes at different rows
    episode_start = (steps % episode_length == 0).float()
    return Rollout(obs, torch.stack(actions), torch.stack(log_probs), torch.stack(values),
                   torch.randn(T, B, generator=g), episode_start, agent.value_of(torch.randn(B, agent.obs_dim).numpy()),
                   ((steps[-1] + 1) % episode_length == 0).float())


def _reference_loss(agent: PPO, obs, action, old_log_prob, advantages, returns, clip_range) -> dict[str, float]:
    with torch.no_grad():
        logits = agent.policy(torch.as_tensor(obs)).double().tolist()
        values = agent.value(torch.as_tensor(obs)).squeeze(-1).double().tolist()
    log_prob = [reference.log_softmax(row)[int(a)] for row, a in zip(logits, action)]
    cfg = agent.config
    return reference.ppo_loss(log_prob, old_log_prob.tolist(), advantages.tolist(), returns.tolist(), values,
                              [reference.entropy(row) for row in logits], clip_range, cfg.value_coef,
                              cfg.entropy_coef, cfg.normalize_advantage)


# --- GAE -------------------------------------------------------------------------------

def test_gae_equals_the_reference_with_episode_ends_anywhere() -> None:
    x = _random_gae_inputs(9, 5, seed=0)
    adv, ret = ppo.gae(**x, gamma=0.97, lam=0.8)
    ref_adv, ref_ret = reference.gae(*(v.tolist() for v in x.values()), 0.97, 0.8)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-5, atol=1e-5)
    # the cut really cuts: the row before an episode start sees neither its successor nor beyond
    b = 0
    T = 9
    assert adv[T - 2, b].item() == pytest.approx((x["reward"][T - 2, b] - x["value"][T - 2, b]).item(), abs=1e-6)


def test_gae_equals_stable_baselines3() -> None:
    buffers = pytest.importorskip("stable_baselines3.common.buffers")
    from gymnasium import spaces
    T, B = 7, 4
    x = _random_gae_inputs(T, B, seed=1)
    buf = buffers.RolloutBuffer(T, spaces.Box(-1, 1, (2,)), spaces.Discrete(2), device="cpu", gamma=0.9,
                                gae_lambda=0.7, n_envs=B)
    buf.rewards[:] = x["reward"].numpy()
    buf.values[:] = x["value"].numpy()
    buf.episode_starts[:] = x["episode_start"].numpy()
    buf.compute_returns_and_advantage(x["last_value"], x["last_episode_start"].numpy())
    adv, ret = ppo.gae(**x, gamma=0.9, lam=0.7)
    np.testing.assert_allclose(adv.numpy(), buf.advantages, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret.numpy(), buf.returns, rtol=1e-5, atol=1e-6)


# --- the loss ----------------------------------------------------------------------------

@pytest.mark.parametrize("normalize", [True, False])
def test_minibatch_loss_equals_the_reference(normalize: bool) -> None:
    cfg = PPOConfig(hidden=(16, 16), entropy_coef=0.03, value_coef=0.7, normalize_advantage=normalize)
    agent = PPO(cfg, obs_dim=3, actions=4, seed=2)
    g = torch.Generator().manual_seed(3)
    n = 37
    obs = torch.randn(n, 3, generator=g)
    action = torch.randint(4, (n,), generator=g)
    with torch.no_grad():
        logp = torch.log_softmax(agent.policy(obs), -1).gather(1, action.view(-1, 1)).squeeze(1)
    old_log_prob = logp + 0.3 * torch.randn(n, generator=g)  # ratios on both sides of the clip
    advantages = torch.randn(n, generator=g)
    returns = torch.randn(n, generator=g)
    out = ppo.ppo_loss(agent.policy, agent.value, obs, action, old_log_prob, advantages, returns, 0.2, cfg)
    clip_fraction, approx_kl = ppo.ppo_statistics(out.log_ratio, 0.2)
    ref = _reference_loss(agent, obs, action, old_log_prob, advantages, returns, 0.2)
    assert 0.0 < ref["clip_fraction"] < 1.0
    got = {"loss": out.loss.item(), "policy_loss": out.policy_loss.item(), "value_loss": out.value_loss.item(),
           "entropy": out.entropy.item(), "clip_fraction": clip_fraction.item(), "approx_kl": approx_kl.item()}
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert out.loss.requires_grad


def test_learn_reports_the_loss_before_its_only_step() -> None:
    # one epoch, one minibatch: what learn reports is the loss on the rollout as it was given
    cfg = PPOConfig(hidden=(8,), n_epochs=1, batch_size=1000, entropy_coef=0.01, gamma=0.9, gae_lambda=0.6)
    agent = PPO(cfg, obs_dim=3, actions=2, seed=4)
    r = _rollout(agent, T=6, B=5, seed=5)
    adv, ret = reference.gae(r.reward.tolist(), r.value.tolist(), r.episode_start.tolist(), r.last_value.tolist(),
                             r.last_episode_start.tolist(), 0.9, 0.6)
    ref = _reference_loss(agent, r.obs.reshape(30, 3), r.action.reshape(30), r.log_prob.reshape(30),
                          torch.tensor(adv).reshape(30), torch.tensor(ret).reshape(30), 0.2)
    before = [p.detach().clone() for p in agent.networks().parameters()]
    stats = agent.learn(r)
    for key in ("loss", "policy_loss", "value_loss", "entropy"):
        assert stats[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key
    assert stats["clip_fraction"] == 0.0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)  # ratio 1
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.networks().parameters()))
    assert (agent.updates, agent.rollouts) == (1, 1)


def test_a_tiny_clip_range_and_big_steps_clip() -> None:
    cfg = PPOConfig(hidden=(16,), lr=0.05, clip_range=1e-3, n_epochs=4, batch_size=16)
    agent = PPO(cfg, obs_dim=3, actions=3, seed=6)
    stats = agent.learn(_rollout(agent, T=8, B=4, seed=7))
    assert stats["clip_fraction"] > 0.0
    assert agent.last_clip_fraction == stats["clip_fraction"] and agent.last_approx_kl > 0.0
    assert agent.updates == 4 * 2


def test_schedules_decay_linearly_with_progress() -> None:
    cfg = PPOConfig(lr=1e-3, lr_end=1e-4, clip_range=0.2, clip_range_end=0.0)
    assert cfg.schedule(1.0) == (1e-3, 0.2)
    assert cfg.schedule(0.5) == pytest.approx((5.5e-4, 0.1))
    assert cfg.schedule(0.0) == pytest.approx((1e-4, 0.0))
    agent = PPO(dataclasses.replace(cfg, hidden=(8,), n_epochs=1), obs_dim=2, actions=2, seed=0)
    stats = agent.learn(_rollout(agent, T=4, B=2, seed=1), progress_remaining=0.25)
    assert stats["lr"] == pytest.approx(3.25e-4) and agent.optimizer.param_groups[0]["lr"] == stats["lr"]
    assert stats["clip_range"] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="^progress_remaining"):
        agent.learn(_rollout(agent, T=4, B=2, seed=1), progress_remaining=1.5)


# --- acting ------------------------------------------------------------------------------

def test_act_is_deterministic_given_the_generator_and_reports_its_log_probs() -> None:
    agent = PPO(PPOConfig(hidden=(8,)), obs_dim=3, actions=3, seed=8)
    obs = np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32)
    a1, lp1, v1 = agent.act(obs, torch.Generator().manual_seed(11))
    a2, lp2, v2 = agent.act(obs, torch.Generator().manual_seed(11))
    a3, _, _ = agent.act(obs, torch.Generator().manual_seed(12))
    assert a1.dtype == np.int64 and a1.shape == (64,) and lp1.shape == (64,) and v1.shape == (64,)
    assert np.array_equal(a1, a2) and torch.equal(lp1, lp2) and torch.equal(v1, v2)
    assert not np.array_equal(a1, a3)
    with torch.no_grad():
        logp = torch.log_softmax(agent.policy(torch.as_tensor(obs)), -1)
    assert torch.allclose(lp1, logp[torch.arange(64), torch.as_tensor(a1)])
    assert torch.equal(v1, agent.value_of(obs))
    assert np.array_equal(agent.greedy(obs), logp.argmax(-1).numpy())


def test_act_samples_the_softmax_and_greedy_breaks_ties_low() -> None:
    agent = PPO(PPOConfig(hidden=(4,)), obs_dim=2, actions=3, seed=0)
    with torch.no_grad():
        agent.policy[-1].weight.zero_()
        agent.policy[-1].bias.copy_(torch.tensor([0.0, float(np.log(3.0)), 0.0]))  # pi = (0.2, 0.6, 0.2)
    obs = np.zeros((20_000, 2), np.float32)
    actions, log_probs, _ = agent.act(obs, torch.Generator().manual_seed(0))
    np.testing.assert_allclose(np.bincount(actions, minlength=3) / len(actions), [0.2, 0.6, 0.2], atol=0.015)
    assert torch.allclose(log_probs, torch.log(torch.tensor([0.2, 0.6, 0.2]))[torch.as_tensor(actions)])
    with torch.no_grad():
        agent.policy[-1].bias.zero_()
    assert np.array_equal(agent.greedy(obs[:3]), [0, 0, 0])


# --- run-file arrays ---------------------------------------------------------------------

def test_save_then_load_continues_bit_identically() -> None:
    cfg = PPOConfig(hidden=(16, 16), n_epochs=3, batch_size=12, entropy_coef=0.01)  # 3 minibatches, last partial
    first = PPO(cfg, obs_dim=3, actions=2, seed=20)
    r1, r2 = _rollout(first, T=8, B=4, seed=21), _rollout(first, T=8, B=4, seed=22)
    uninterrupted = PPO(cfg, obs_dim=3, actions=2, seed=20)
    uninterrupted.learn(r1, 1.0)
    uninterrupted.learn(r2, 0.5)

    saved = PPO(cfg, obs_dim=3, actions=2, seed=20)
    saved.learn(r1, 1.0)
    arrays = {k: np.array(v) for k, v in saved.arrays().items()}
    counters = dict(saved.counters())
    assert "rng.shuffle" in arrays and any(k.startswith("adam.") for k in arrays)
    resumed = PPO(cfg, obs_dim=3, actions=2, seed=99)  # nothing of its own survives the load
    resumed.load(arrays, counters)
    resumed.learn(r2, 0.5)

    for a, b in zip(uninterrupted.networks().parameters(), resumed.networks().parameters()):
        assert torch.equal(a, b)
    for key, value in uninterrupted.arrays().items():
        assert np.array_equal(value, resumed.arrays()[key]), key
    assert uninterrupted.counters() == resumed.counters()
    assert resumed.updates == 2 * 3 * 3 and resumed.rollouts == 2
    assert set(resumed.optimizers()) == {"adam"}


# --- validation --------------------------------------------------------------------------

@pytest.mark.parametrize("field,value,message", [
    ("clip_range", -1.0, "clip_range must be positive (got -1"),
    ("clip_range_end", -0.1, "clip_range_end must be non-negative"),
    ("lr", 0.0, "lr must be positive"),
    ("lr_end", -1e-3, "lr_end must be non-negative"),
    ("gamma", 1.5, "gamma must be in [0, 1]"),
    ("gae_lambda", -0.1, "gae_lambda must be in [0, 1]"),
    ("n_epochs", 0, "n_epochs must be at least 1"),
    ("batch_size", 0, "batch_size must be at least 1"),
    ("value_coef", -0.5, "value_coef must be non-negative"),
    ("entropy_coef", -0.01, "entropy_coef must be non-negative"),
    ("max_grad_norm", 0.0, "max_grad_norm must be positive"),
    ("adam_eps", 0.0, "adam_eps must be positive"),
    ("hidden", (64, 0), "hidden must list positive layer widths"),
])
def test_validation_rejects_bad_configs(field: str, value, message: str) -> None:
    cfg = dataclasses.replace(PPOConfig(), **{field: value})
    with pytest.raises(ValueError) as info:
        cfg.validate()
    assert str(info.value).startswith(message)
    with pytest.raises(ValueError):
        PPO(cfg, obs_dim=2, actions=2, seed=0)
    PPOConfig().validate()


# --- learning ----------------------------------------------------------------------------

def test_learns_to_prefer_the_rewarded_action_of_a_bandit() -> None:
    # one-step episodes: action 1 pays 1, action 0 pays 0, whatever the (random) observation
    cfg = PPOConfig(hidden=(16,), lr=3e-3, n_epochs=4, batch_size=64)
    agent = PPO(cfg, obs_dim=3, actions=2, seed=30)
    g = torch.Generator().manual_seed(31)
    T, B, rounds = 4, 32, 40
    ones = torch.ones(T, B)
    for k in range(rounds):
        obs = torch.randn(T, B, 3, generator=g)
        steps = [agent.act(obs[t].numpy(), g) for t in range(T)]
        action = torch.stack([torch.as_tensor(a) for a, _, _ in steps])
        rollout = Rollout(obs, action, torch.stack([lp for _, lp, _ in steps]), torch.stack([v for _, _, v in steps]),
                          (action == 1).float(), ones, torch.zeros(B), torch.ones(B))
        agent.learn(rollout, progress_remaining=1.0 - k / rounds)
    assert agent.updates == rounds * cfg.n_epochs * 2
    obs = torch.randn(500, 3, generator=g)
    with torch.no_grad():
        p1 = torch.softmax(agent.policy(obs), -1)[:, 1]
    assert float(p1.mean()) > 0.9
    assert (agent.greedy(obs.numpy()) == 1).all()
