"""EXARL's agent cores (issue 16): V-trace, prioritised replay, TD3, DDPG, A2C."""
from __future__ import annotations

import math
import random

import pytest
import torch

from popplay.deep.agents.vtrace import nstep_returns, vtrace


@pytest.fixture(autouse=True)
def _one_thread():
    # tiny networks: thread hand-offs cost more than they save on a shared machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------- V-trace


def _vtrace_reference(blp, tlp, rewards, values, bootstrap, discounts, rho_bar, c_bar, pg_rho_bar):
    """IMPALA's equation (1) as written: explicit sums of products, one trajectory at a time."""
    T = len(rewards)

    def clip(x, level):
        return x if level is None else min(level, x)

    ratios = [math.exp(t - b) for t, b in zip(tlp, blp)]
    v = list(values) + [bootstrap]
    vs = []
    for s in range(T):
        total = v[s]
        for t in range(s, T):
            weight = 1.0
            for i in range(s, t):
                weight *= discounts[i] * clip(ratios[i], c_bar)
            delta = clip(ratios[t], rho_bar) * (rewards[t] + discounts[t] * v[t + 1] - v[t])
            total += weight * delta
        vs.append(total)
    vs_next = vs[1:] + [bootstrap]
    adv = [
        clip(ratios[s], pg_rho_bar if pg_rho_bar is not None else rho_bar)
        * (rewards[s] + discounts[s] * vs_next[s] - v[s])
        for s in range(T)
    ]
    return vs, adv


@pytest.mark.parametrize(
    "rho_bar,c_bar,pg_rho_bar", [(1.0, 1.0, None), (2.0, 0.5, 1.0), (None, None, None), (0.7, 1.3, 3.0)]
)
def test_vtrace_matches_plain_python_reference(rho_bar, c_bar, pg_rho_bar):
    rng = random.Random(7)
    T, B = 6, 5
    blp = [[math.log(rng.uniform(0.05, 1.0)) for _ in range(B)] for _ in range(T)]
    tlp = [[math.log(rng.uniform(0.05, 1.0)) for _ in range(B)] for _ in range(T)]
    rewards = [[rng.gauss(0, 1) for _ in range(B)] for _ in range(T)]
    values = [[rng.gauss(0, 2) for _ in range(B)] for _ in range(T)]
    # about one step in five ends an episode
    discounts = [[0.0 if rng.random() < 0.2 else 0.95 for _ in range(B)] for _ in range(T)]
    bootstrap = [rng.gauss(0, 2) for _ in range(B)]

    tt = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    out = vtrace(
        tt(blp), tt(tlp), tt(rewards), tt(values), tt(bootstrap), tt(discounts),
        rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar,
    )
    for b in range(B):
        col = lambda m: [m[t][b] for t in range(T)]  # noqa: E731
        vs, adv = _vtrace_reference(
            col(blp), col(tlp), col(rewards), col(values), bootstrap[b], col(discounts), rho_bar, c_bar, pg_rho_bar
        )
        assert out.vs[:, b].tolist() == pytest.approx(vs, rel=1e-12, abs=1e-12)
        assert out.pg_advantages[:, b].tolist() == pytest.approx(adv, rel=1e-12, abs=1e-12)


def _hand_trajectory(discounts):
    # ratios pi/mu = 2, 0.5, 1
    blp = torch.log(torch.tensor([0.25, 0.5, 0.4], dtype=torch.float64))
    tlp = torch.log(torch.tensor([0.5, 0.25, 0.4], dtype=torch.float64))
    return vtrace(
        blp,
        tlp,
        torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64),
        torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64),
        torch.tensor(4.0, dtype=torch.float64),
        torch.tensor(discounts, dtype=torch.float64),
        rho_bar=1.0,
        c_bar=1.0,
    )


def test_vtrace_hand_computed_three_steps():
    # rho = c = (1, 0.5, 1) after truncation at 1; gamma 0.9
    # deltas: 1*(1 + .9*2 - 1) = 1.8, .5*(0 + .9*3 - 2) = .35, 1*(2 + .9*4 - 3) = 2.6
    # v2 - V2 = 2.6;  v1 - V1 = .35 + .9*.5*2.6 = 1.52;  v0 - V0 = 1.8 + .9*1*1.52 = 3.168
    # A0 = 1*(1 + .9*3.52 - 1) = 3.168,  A1 = .5*(0 + .9*5.6 - 2) = 1.52,  A2 = 2.6
    out = _hand_trajectory([0.9, 0.9, 0.9])
    assert out.vs.tolist() == pytest.approx([4.168, 3.52, 5.6], abs=1e-12)
    assert out.pg_advantages.tolist() == pytest.approx([3.168, 1.52, 2.6], abs=1e-12)
    assert out.rhos.tolist() == pytest.approx([2.0, 0.5, 1.0])


def test_vtrace_hand_computed_episode_end_cuts_trace_and_bootstrap():
    # the episode ends at step 1: delta1 = .5*(0 + 0 - 2) = -1, no trace from step 2
    # v1 - V1 = -1;  v0 - V0 = 1.8 + .9*(-1) = .9;  step 2 (next episode) unchanged
    # A0 = 1*(1 + .9*1 - 1) = .9,  A1 = .5*(0 - 2) = -1,  A2 = 2.6
    out = _hand_trajectory([0.9, 0.0, 0.9])
    assert out.vs.tolist() == pytest.approx([1.9, 1.0, 5.6], abs=1e-12)
    assert out.pg_advantages.tolist() == pytest.approx([0.9, -1.0, 2.6], abs=1e-12)


def test_vtrace_on_policy_reduces_to_nstep_returns():
    g = torch.Generator().manual_seed(3)
    T, B = 8, 4
    lp = torch.log(torch.rand(T, B, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    discounts = torch.where(torch.rand(T, B, generator=g) < 0.15, 0.0, 0.99).to(torch.float64)

    out = vtrace(lp, lp.clone(), rewards, values, bootstrap, discounts, rho_bar=1.0, c_bar=1.0)

    # n-step returns by hand, independent of nstep_returns
    expected = torch.empty(T, B, dtype=torch.float64)
    for b in range(B):
        g_t = float(bootstrap[b])
        for t in reversed(range(T)):
            g_t = float(rewards[t, b]) + float(discounts[t, b]) * g_t
            expected[t, b] = g_t
    assert torch.allclose(out.vs, expected, atol=1e-12)
    assert torch.allclose(nstep_returns(rewards, bootstrap, discounts), expected, atol=1e-12)
    # on policy the advantage is the n-step return minus the baseline
    assert torch.allclose(out.pg_advantages, expected - values, atol=1e-12)
    # off policy it is not
    off = vtrace(lp, lp + 0.3, rewards, values, bootstrap, discounts, rho_bar=None, c_bar=None)
    assert not torch.allclose(off.vs, expected, atol=1e-6)


def test_vtrace_truncation_levels_matter_and_targets_are_detached():
    g = torch.Generator().manual_seed(5)
    T, B = 5, 3
    blp = torch.log(torch.rand(T, B, generator=g, dtype=torch.float64) * 0.5 + 0.05)
    tlp = torch.log(torch.rand(T, B, generator=g, dtype=torch.float64) * 0.5 + 0.5)  # ratios > 1
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64, requires_grad=True)
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    discounts = torch.full((T, B), 0.9, dtype=torch.float64)
    a = vtrace(blp, tlp, rewards, values, bootstrap, discounts, rho_bar=1.0, c_bar=1.0)
    b = vtrace(blp, tlp, rewards, values, bootstrap, discounts, rho_bar=2.0, c_bar=1.0)
    c = vtrace(blp, tlp, rewards, values, bootstrap, discounts, rho_bar=1.0, c_bar=2.0)
    assert not torch.allclose(a.vs, b.vs)
    assert not torch.allclose(a.vs, c.vs)
    assert not a.vs.requires_grad and not a.pg_advantages.requires_grad


def test_vtrace_rejects_bad_shapes_and_levels():
    x = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="bootstrap_value"):
        vtrace(x, x, x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="discounts"):
        vtrace(x, x, x, x, torch.zeros(2), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="rho_bar"):
        vtrace(x, x, x, x, torch.zeros(2), x, rho_bar=0.0)


# --------------------------------------------------------------------------- prioritised replay

from popplay.deep.agents.per import PrioritizedReplay, SumTree, annealed_beta  # noqa: E402
from popplay.deep.agents.replay import Batch  # noqa: E402


def _rows(n, start=0):
    v = torch.arange(start, start + n, dtype=torch.float32)
    return Batch(torch.stack([v, 2 * v + 1], 1), (v % 2).long(), v, torch.stack([v + 1, v], 1), torch.zeros(n))


def _filled_buffer(n, capacity=None, **kwargs):
    buf = PrioritizedReplay(capacity or n, 2, **kwargs)
    buf.add(_rows(n))
    return buf


def test_sumtree_find_matches_cumulative_sums():
    rng = random.Random(11)
    values = [rng.choice([0.0, rng.uniform(0.01, 3.0)]) for _ in range(37)]  # zeros never drawn
    tree = SumTree(37)
    tree.update(torch.arange(37), torch.tensor(values, dtype=torch.float64))
    assert tree.total == pytest.approx(sum(values))
    assert tree.min == min(values)
    masses = [rng.uniform(0, sum(values)) for _ in range(500)]
    found = tree.find(torch.tensor(masses, dtype=torch.float64)).tolist()
    for m, idx in zip(masses, found):
        lo = sum(values[:idx])
        assert lo <= m < lo + values[idx] + 1e-12, (m, idx)
    # repeated indices in one update: the last value wins and the sums stay exact
    tree.update(torch.tensor([3, 3, 5]), torch.tensor([9.0, 1.5, 0.25], dtype=torch.float64))
    values[3], values[5] = 1.5, 0.25
    assert tree.total == pytest.approx(sum(values), rel=1e-14)


def _counts(buf, draws, batch, generator):
    counts = torch.zeros(buf.size, dtype=torch.int64)
    for _ in range(draws):
        s = buf.sample_prioritized(batch, generator=generator)
        counts += torch.bincount(s.indices, minlength=buf.size)
    return counts.tolist()


def test_per_sampling_proportions_follow_priorities():
    from scipy.stats import chisquare

    errors = [0.5, 1.0, 1.5, 2.0, 4.0, 0.1, 3.0, 2.5]
    alpha = 0.7
    buf = _filled_buffer(len(errors), alpha=alpha)
    buf.update_priorities(torch.arange(len(errors)), torch.tensor(errors))
    g = torch.Generator().manual_seed(1)
    counts = _counts(buf, 300, 64, g)
    p = [(abs(e) + buf.eps) ** alpha for e in errors]
    expected = [sum(counts) * x / sum(p) for x in p]
    assert chisquare(counts, expected).pvalue > 1e-3
    # the same counts are far from uniform, so the check above has teeth
    assert chisquare(counts).pvalue < 1e-9
    # with alpha = 0 sampling is uniform whatever the priorities
    flat = _filled_buffer(len(errors), alpha=0.0)
    flat.update_priorities(torch.arange(len(errors)), torch.tensor(errors))
    assert chisquare(_counts(flat, 200, 64, g)).pvalue > 1e-3


def test_per_priority_update_changes_proportions():
    from scipy.stats import chisquare

    buf = _filled_buffer(6, alpha=1.0)
    buf.update_priorities(torch.arange(6), torch.ones(6))
    g = torch.Generator().manual_seed(2)
    before = _counts(buf, 100, 60, g)
    assert chisquare(before).pvalue > 1e-3
    buf.update_priorities(torch.tensor([2]), torch.tensor([-6.0]))  # |delta| counts
    after = _counts(buf, 100, 60, g)
    p = [1 + buf.eps] * 6
    p[2] = 6 + buf.eps
    assert chisquare(after, [sum(after) * x / sum(p) for x in p]).pvalue > 1e-3
    assert after[2] / sum(after) == pytest.approx(6 / 11, abs=0.03)
    assert before[2] / sum(before) == pytest.approx(1 / 6, abs=0.03)


def test_per_importance_weights_and_annealed_beta():
    errors = [0.2, 1.0, 3.0, 0.7, 5.0]
    alpha, beta0, beta_steps = 0.6, 0.4, 10
    buf = _filled_buffer(5, alpha=alpha, beta0=beta0, beta_steps=beta_steps)
    buf.update_priorities(torch.arange(5), torch.tensor(errors, dtype=torch.float64))
    p = [(e + buf.eps) ** alpha for e in errors]
    P = [x / sum(p) for x in p]
    N = 5
    g = torch.Generator().manual_seed(4)
    for draw in range(14):
        beta = beta0 + (1 - beta0) * min(1.0, draw / beta_steps)
        assert buf.beta == pytest.approx(beta)
        s = buf.sample_prioritized(16, generator=g)
        max_w = max((N * q) ** -beta for q in P)
        expected = [(N * P[i]) ** -beta / max_w for i in s.indices.tolist()]
        assert s.weights.tolist() == pytest.approx(expected, rel=1e-6)
        assert s.probabilities.tolist() == pytest.approx([P[i] for i in s.indices.tolist()], rel=1e-12)
        assert max(s.weights.tolist()) <= 1.0 + 1e-7  # only the rarest item reaches 1
    assert buf.beta == 1.0 and annealed_beta(3, 0.5, 0) == 1.0
    # the drawn rows are the stored rows of the drawn indices
    assert s.batch.reward.tolist() == [float(i) for i in s.indices.tolist()]
    assert s.batch.obs[:, 1].tolist() == [2.0 * i + 1 for i in s.indices.tolist()]


def test_per_new_items_get_max_priority_ring_wraps_and_round_trips():
    buf = PrioritizedReplay(4, 2, alpha=1.0)
    buf.add(_rows(3))
    idx = torch.arange(3)
    # before any update every item has priority 1
    assert buf.probabilities(idx).tolist() == pytest.approx([1 / 3] * 3)
    buf.update_priorities(idx, torch.tensor([0.5, 9.0, 2.0], dtype=torch.float64))
    buf.add(_rows(2, start=10))  # slots 3 and 0: the oldest item is overwritten
    assert len(buf) == 4
    top = 9.0 + buf.eps
    total = top + 2.0 + buf.eps + top + top
    assert buf.probabilities(torch.tensor([3, 0, 1, 2])).tolist() == pytest.approx(
        [top / total, top / total, top / total, (2.0 + buf.eps) / total]
    )
    assert buf.reward.tolist() == [11.0, 1.0, 2.0, 10.0]
    # run-file arrays carry the priorities, oldest first
    arrays = buf.arrays("replay")
    assert arrays["replay.reward"].tolist() == [1.0, 2.0, 10.0, 11.0]
    assert arrays["replay.priority"].tolist() == pytest.approx([top, 2.0 + buf.eps, top, top])
    other = PrioritizedReplay(4, 2, alpha=1.0)
    other.load(arrays, buf.added, "replay")
    # every transition and its priority back in its slot (minibatches draw slots: a resume samples alike)
    assert other.reward.tolist() == buf.reward.tolist() and other.position == buf.position
    assert other.probabilities(torch.arange(4)).tolist() == pytest.approx(buf.probabilities(torch.arange(4)).tolist())
    assert other.max_priority == buf.max_priority and other.draws == buf.draws
    # uniform-replay callers get prioritised batches too
    assert isinstance(other.sample(5, torch.Generator().manual_seed(0)), Batch)


# --------------------------------------------------------------------------- TD3 and DDPG

import copy  # noqa: E402

from popplay.deep.agents.ddpg import DDPG, DDPGConfig, GaussianExplorer, ddpg_targets, ddpg_update, soft_update  # noqa: E402
from popplay.deep.agents.td3 import TD3, TD3Config, target_actions, td3_targets, td3_update  # noqa: E402

_LOW, _HIGH = (-2.0, -1.0), (2.0, 3.0)


def _batch(n=32, seed=0, obs_dim=3):
    g = torch.Generator().manual_seed(seed)
    low, high = torch.tensor(_LOW), torch.tensor(_HIGH)
    return Batch(
        obs=torch.randn(n, obs_dim, generator=g),
        action=low + (high - low) * torch.rand(n, 2, generator=g),
        reward=torch.randn(n, generator=g),
        next_obs=torch.randn(n, obs_dim, generator=g),
        terminated=(torch.rand(n, generator=g) < 0.25).to(torch.float32),
    )


def _td3(**kw):
    return TD3(TD3Config(hidden=(16, 16), **kw), 3, _LOW, _HIGH, seed=1)


def _ddpg(**kw):
    return DDPG(DDPGConfig(**{"hidden": (16, 16), **kw}), 3, _LOW, _HIGH, seed=3)


def _params(module):
    return [p.detach().clone() for p in module.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("clipped", [True, False])
def test_td3_clipped_double_q_switch(clipped):
    agent = _td3(clipped_double_q=clipped, target_smoothing=False)
    b = _batch()
    with torch.no_grad():
        a = agent.actor_target(b.next_obs)
        q1 = agent.critic1_target(b.next_obs, a)
        # shift the second twin so that it is the smaller one on about half of the batch
        agent.critic2_target.net[-1].bias += (q1 - agent.critic2_target(b.next_obs, a)).median()
        q2 = agent.critic2_target(b.next_obs, a)
    assert 8 <= int((q2 < q1).sum()) <= 24  # the min picks each twin often: the switch is visible
    targets = lambda: td3_targets(b, agent.actor_target, agent.critic1_target, agent.critic2_target, agent.config)  # noqa: E731
    q = torch.minimum(q1, q2) if clipped else q1
    assert torch.allclose(targets(), b.reward + 0.99 * (1 - b.terminated) * q, atol=1e-6)
    other = torch.minimum(q1, q2) if not clipped else q1
    assert not torch.allclose(targets(), b.reward + 0.99 * (1 - b.terminated) * other, atol=1e-4)
    # both critics learn either way
    c2 = _params(agent.critic2)
    td3_update(agent, b)
    assert not _same(c2, _params(agent.critic2))


@pytest.mark.parametrize("delay", [1, 2, 3])
def test_td3_policy_delay(delay):
    agent = _td3(policy_delay=delay)
    for step in range(1, 7):
        actor, critic = _params(agent.actor), _params(agent.critic1)
        targets = [_params(m) for m in (agent.actor_target, agent.critic1_target, agent.critic2_target)]
        stats = td3_update(agent, _batch(seed=step))
        due = step % delay == 0
        assert stats.actor_updated == due
        assert (stats.actor_loss is not None) == due
        assert _same(actor, _params(agent.actor)) != due
        for before, m in zip(targets, (agent.actor_target, agent.critic1_target, agent.critic2_target)):
            assert _same(before, _params(m)) != due
        assert not _same(critic, _params(agent.critic1))  # the critics step every call


def test_td3_target_policy_smoothing_switch():
    b = _batch(n=256)
    off = _td3(target_smoothing=False)
    with torch.no_grad():
        raw = off.actor_target(b.next_obs)
    assert torch.equal(target_actions(b.next_obs, off.actor_target, off.config, torch.Generator().manual_seed(9)), raw)

    on = _td3(target_smoothing=True, target_noise=1.0, noise_clip=0.5)
    smoothed = target_actions(b.next_obs, on.actor_target, on.config, torch.Generator().manual_seed(9))
    scale = (torch.tensor(_HIGH) - torch.tensor(_LOW)) / 2
    noise = torch.randn(raw.shape, generator=torch.Generator().manual_seed(9)).clamp(-0.5, 0.5) * scale
    expected = torch.maximum(torch.minimum(raw + noise, torch.tensor(_HIGH)), torch.tensor(_LOW))
    assert torch.allclose(smoothed, expected, atol=1e-6)
    diff = smoothed - raw
    assert bool((diff.abs() <= 0.5 * scale + 1e-6).all())
    assert bool(((diff.abs() - 0.5 * scale).abs() < 1e-5).any())  # some noise hit the clip
    assert not torch.allclose(smoothed, raw)
    y_on = td3_targets(b, on.actor_target, on.critic1_target, on.critic2_target, on.config, torch.Generator().manual_seed(9))
    y_off = td3_targets(b, off.actor_target, off.critic1_target, off.critic2_target, off.config)
    assert not torch.allclose(y_on, y_off)


def test_soft_update_is_polyak_average():
    src, dst = _ddpg().critic, DDPG(DDPGConfig(hidden=(16, 16)), 3, _LOW, _HIGH, seed=4).critic
    s, d = _params(src), _params(dst)
    soft_update(dst, src, 0.3)
    for x, y, z in zip(s, d, _params(dst)):
        assert torch.allclose(z, 0.3 * x + 0.7 * y, atol=1e-7)
    soft_update(dst, src, 1.0)
    assert _same(s, _params(dst))
    with pytest.raises(ValueError, match="tau"):
        soft_update(dst, src, 1.5)
    # DDPG's update moves its targets by exactly tau of the way
    agent = _ddpg(tau=0.25)
    target = _params(agent.critic_target)
    ddpg_update(agent, _batch())
    for t_old, c_new, t_new in zip(target, _params(agent.critic), _params(agent.critic_target)):
        assert torch.allclose(t_new, 0.25 * c_new + 0.75 * t_old, atol=1e-6)


def test_ddpg_update_and_importance_weights():
    b = _batch()
    agent = _ddpg(tau=0.1)
    twin, zero = copy.deepcopy(agent), copy.deepcopy(agent)
    with torch.no_grad():
        y = b.reward + 0.99 * (1 - b.terminated) * agent.critic_target(b.next_obs, agent.actor_target(b.next_obs))
        td = y - agent.critic(b.obs, b.action)
    assert torch.allclose(ddpg_targets(b, agent.actor_target, agent.critic_target, 0.99), y)
    critic = _params(agent.critic)
    s1 = ddpg_update(agent, b)
    assert torch.allclose(s1.td_errors, td, atol=1e-6)
    assert not _same(critic, _params(agent.critic))
    # unit weights are uniform replay; zero weights leave the critic alone
    s2 = ddpg_update(twin, b, torch.ones(32))
    assert s2.critic_loss == pytest.approx(s1.critic_loss, rel=1e-6)
    assert all(torch.allclose(x, z, atol=1e-6) for x, z in zip(_params(agent.critic), _params(twin.critic)))
    ddpg_update(zero, b, torch.zeros(32))
    assert _same(critic, _params(zero.critic))


@pytest.mark.parametrize("make", [_ddpg, lambda **kw: _td3(**kw)])
def test_per_learners_send_td_errors_as_priorities(make):
    n = 40
    agent = make(per=True, batch_size=16, learning_starts=n)
    assert isinstance(agent.replay, PrioritizedReplay)
    b = _batch(n=n)
    agent.receive(b)
    assert agent.owed_updates() == n
    before = agent.replay.tree.values(torch.arange(n)).clone()
    assert torch.allclose(before, torch.ones(n, dtype=torch.float64))  # new items: max priority 1
    # a copy of the learner (generators included) sees the draw the learner will see
    probe = copy.deepcopy(agent)
    draw = probe.replay.sample_prioritized(16, probe.sampler)
    b = draw.batch
    if isinstance(probe, DDPG):
        y = ddpg_targets(b, probe.actor_target, probe.critic_target, 0.99)
        q = probe.critic(b.obs, b.action)
    else:
        y = td3_targets(b, probe.actor_target, probe.critic1_target, probe.critic2_target, probe.config, probe.smoothing)
        q = probe.critic1(b.obs, b.action)
    td = (y - q).detach()
    agent.train(max_updates=1)
    assert agent.updates == 1 and agent.replay.draws == 1
    after = agent.replay.tree.values(torch.arange(n))
    changed = sorted(set((after != before).nonzero().reshape(-1).tolist()))
    assert changed == sorted(set(draw.indices.tolist()))  # exactly the drawn items were re-prioritised
    # the new priority of a drawn item is (|y - Q(s, a)| + eps)^alpha under the pre-update critic
    for i, e in zip(draw.indices.tolist(), td.tolist()):
        assert float(after[i]) == pytest.approx((abs(e) + agent.replay.eps) ** 0.6, rel=1e-5)
    assert agent.replay.max_priority == pytest.approx(max(abs(e) for e in td.tolist()) + agent.replay.eps, rel=1e-5)


def test_learner_arrays_round_trip():
    agent = _td3(per=True, batch_size=8, learning_starts=8)
    agent.receive(_batch(n=20))
    agent.train(max_updates=3)
    copy_ = _td3(per=True, batch_size=8, learning_starts=8)
    copy_.load(agent.arrays(), agent.counters())
    assert copy_.counters() == agent.counters()
    agent.train(max_updates=2)
    copy_.train(max_updates=2)
    for name, m in agent.modules().items():
        assert _same(_params(m), _params(copy_.modules()[name])), name
    assert torch.equal(agent.replay.tree.values(torch.arange(20)), copy_.replay.tree.values(torch.arange(20)))


def test_explorer_is_uniform_first_then_noisy_around_the_actor():
    agent = _td3(exploration_noise=0.1)
    explorer = GaussianExplorer(agent.actor, agent.config.exploration_noise, torch.Generator().manual_seed(0))
    obs = torch.randn(2000, 3).numpy()
    low, high = torch.tensor(_LOW), torch.tensor(_HIGH)
    first = torch.as_tensor(explorer(obs))
    assert bool(((first >= low) & (first <= high)).all())
    assert first.mean(0).tolist() == pytest.approx(((low + high) / 2).tolist(), abs=0.1)
    explorer.uniform = False
    with torch.no_grad():
        mu = agent.actor(torch.as_tensor(obs))
    noisy = torch.as_tensor(explorer(obs))
    assert bool(((noisy >= low) & (noisy <= high)).all())
    inside = ((mu - low) > 0.5) & ((high - mu) > 0.5)  # away from the clip
    spread = (noisy - mu)[inside[:, 0], 0].std()
    assert float(spread) == pytest.approx(0.1 * 2.0, rel=0.15)


def test_td3_and_ddpg_learn_a_one_step_task():
    # reward -|a - goal(s)|^2 and the episode ends at once: the actor must move towards
    # the goal (a sign error in its loss would drive it to the box's corners instead)
    g = torch.Generator().manual_seed(1)
    obs = torch.rand(512, 3, generator=g) * 2 - 1
    goal = torch.stack([obs[:, 0], 1 + obs[:, 1]], dim=1)  # inside the box
    low, high = torch.tensor(_LOW), torch.tensor(_HIGH)
    kw = dict(hidden=(32, 32), actor_lr=3e-3, critic_lr=3e-3)
    for agent, update in (
        (TD3(TD3Config(policy_delay=1, **kw), 3, _LOW, _HIGH, seed=1), td3_update),
        (DDPG(DDPGConfig(**kw), 3, _LOW, _HIGH, seed=1), ddpg_update),
    ):
        data = torch.rand(512, 2, generator=g) * (high - low) + low
        reward = -((data - goal) ** 2).sum(dim=1)
        with torch.no_grad():
            err0 = float(((agent.actor(obs) - goal) ** 2).sum(dim=1).mean())
        for _ in range(200):
            i = torch.randint(0, 512, (64,), generator=g)
            update(agent, Batch(obs[i], data[i], reward[i], obs[i], torch.ones(64)))
        with torch.no_grad():
            err = float(((agent.actor(obs) - goal) ** 2).sum(dim=1).mean())
        assert err < 0.5 * err0, (type(agent).__name__, err0, err)


# --------------------------------------------------------------------------- A2C

import numpy as np  # noqa: E402

from popplay.deep.agents import networks  # noqa: E402
from popplay.deep.agents.a2c import A2C, A2CConfig, Trajectory, a2c_loss, log_probs, trajectory_from_episodes  # noqa: E402
from popplay.deep.envs.rollout import Episodes  # noqa: E402


def _trajectory(seed=0, T=4, B=3, obs_dim=4, actions=3, policy=None, lag=0.0):
    """Column 0 terminates at t=1 and restarts; column 1 is cut by a time limit at t=2;
    column 2 terminates at t=2 and is padded at t=3."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, B, obs_dim, generator=g)
    next_obs = torch.cat([obs[1:], torch.randn(1, B, obs_dim, generator=g)])
    terminated = torch.zeros(T, B)
    truncated = torch.zeros(T, B)
    mask = torch.ones(T, B)
    terminated[1, 0] = 1
    next_obs[1, 0] = torch.randn(obs_dim, generator=g)  # the real successor, not row 2
    truncated[2, 1] = 1
    next_obs[2, 1] = torch.randn(obs_dim, generator=g)
    terminated[2, 2] = 1
    mask[3, 2] = 0
    action = torch.randint(actions, (T, B), generator=g)
    reward = torch.randn(T, B, generator=g)
    if policy is not None:
        blp = log_probs(policy, obs, action) + lag * (2 * torch.rand(T, B, generator=g) - 1)
    else:
        blp = torch.log(torch.rand(T, B, generator=g) * 0.8 + 0.1)
    return Trajectory(obs, action, reward, next_obs, terminated, truncated, blp.detach(), mask)


def _a2c_loss_reference(traj, policy, value, cfg):
    """Per column, over its real steps: delta_t uses V(real successor) (0 after a
    termination), traces stop at every episode end, then IMPALA's sums."""
    T, B = traj.reward.shape
    with torch.no_grad():
        logp_all = torch.log_softmax(policy(traj.obs), -1).double()
        V = value(traj.obs).squeeze(-1).double()
        Vn = value(traj.next_obs).squeeze(-1).double()
    clip = lambda x, lvl: min(x, lvl)  # noqa: E731
    pg = vl = ent = 0.0
    n = 0
    for b in range(B):
        L = int(traj.mask[:, b].sum())
        lp = [float(logp_all[t, b, int(traj.action[t, b])]) for t in range(L)]
        ratio = [math.exp(lp[t] - float(traj.behaviour_log_prob[t, b])) if cfg.vtrace else 1.0 for t in range(L)]
        term = [float(traj.terminated[t, b]) for t in range(L)]
        done = [max(term[t], float(traj.truncated[t, b])) for t in range(L)]
        r = [float(traj.reward[t, b]) for t in range(L)]
        gnext = [0.0 if term[t] else cfg.gamma for t in range(L)]
        delta = [clip(ratio[t], cfg.rho_bar) * (r[t] + gnext[t] * float(Vn[t, b]) - float(V[t, b])) for t in range(L)]
        vs = []
        for s in range(L):
            total, weight = float(V[s, b]), 1.0
            for t in range(s, L):
                total += weight * delta[t]
                if done[t]:
                    break
                weight *= cfg.gamma * clip(ratio[t], cfg.c_bar)
            vs.append(total)
        for s in range(L):
            succ = vs[s + 1] if (s + 1 < L and not done[s]) else float(Vn[s, b])
            adv = clip(ratio[s], cfg.rho_bar) * (r[s] + gnext[s] * succ - float(V[s, b]))
            pg -= adv * lp[s]
            vl += 0.5 * (vs[s] - float(V[s, b])) ** 2
            p = [math.exp(float(x)) for x in logp_all[s, b]]
            ent += -sum(q * math.log(q) for q in p)
            n += 1
    return (pg + cfg.value_coef * vl - cfg.entropy_coef * ent) / n, pg / n, vl / n, ent / n


@pytest.mark.parametrize("use_vtrace,rho_bar,c_bar", [(True, 1.0, 1.0), (True, 2.0, 0.5), (False, 1.0, 1.0)])
def test_a2c_loss_matches_reference(use_vtrace, rho_bar, c_bar):
    cfg = A2CConfig(hidden=(8,), vtrace=use_vtrace, rho_bar=rho_bar, c_bar=c_bar, entropy_coef=0.03, value_coef=0.7)
    agent = A2C(cfg, 4, 3, seed=2)
    traj = _trajectory()
    out = a2c_loss(traj, agent.policy, agent.value, cfg)
    total, pg, vl, ent = _a2c_loss_reference(traj, agent.policy, agent.value, cfg)
    assert out.policy_loss == pytest.approx(pg, rel=1e-4, abs=1e-5)
    assert out.value_loss == pytest.approx(vl, rel=1e-4, abs=1e-5)
    assert out.entropy == pytest.approx(ent, rel=1e-5)
    assert float(out.loss.detach()) == pytest.approx(total, rel=1e-4, abs=1e-5)


def test_a2c_with_and_without_vtrace_agree_on_policy_only():
    agent = A2C(A2CConfig(hidden=(8,)), 4, 3, seed=2)
    on = _trajectory(policy=agent.policy)
    off = _trajectory(policy=agent.policy, lag=1.0)  # the actor's copy lagged: ratios != 1
    with_vt = A2CConfig(hidden=(8,), vtrace=True)
    without = A2CConfig(hidden=(8,), vtrace=False)
    a, b = a2c_loss(on, agent.policy, agent.value, with_vt), a2c_loss(on, agent.policy, agent.value, without)
    assert a.mean_rho == pytest.approx(1.0, abs=1e-6)
    assert float(a.loss.detach()) == pytest.approx(float(b.loss.detach()), abs=1e-6)
    assert torch.allclose(a.vs, b.vs, atol=1e-6)
    c, d = a2c_loss(off, agent.policy, agent.value, with_vt), a2c_loss(off, agent.policy, agent.value, without)
    assert abs(c.mean_rho - 1.0) > 0.1
    assert abs(float(c.loss.detach()) - float(d.loss.detach())) > 1e-3
    # without V-trace the behaviour policy is ignored altogether
    assert float(d.loss.detach()) == pytest.approx(float(b.loss.detach()), abs=1e-6)


def test_a2c_data_parallel_gradients_average_to_the_full_batch():
    agent = A2C(A2CConfig(hidden=(8,)), 4, 3, seed=5)
    traj = _trajectory(T=5, B=4)
    left = Trajectory(*(t[:, :2] for t in traj))
    right = Trajectory(*(t[:, 2:] for t in traj))
    n_l, n_r = float(left.mask.sum()), float(right.mask.sum())  # 10 and 9 real steps
    assert n_l != n_r
    full, _ = agent.gradients(traj)
    gl, _ = agent.gradients(left)
    gr, _ = agent.gradients(right)
    # what learners all-reducing mean gradients compute, weighted by their real steps
    assert torch.allclose((gl * n_l + gr * n_r) / (n_l + n_r), full, atol=1e-6)
    before = networks.flat_parameters(agent.policy)
    agent.apply(full)
    assert agent.updates == 1 and not torch.equal(before, networks.flat_parameters(agent.policy))


def test_a2c_learns_a_two_armed_bandit_from_lagging_actors():
    # one-step episodes, arm 1 pays 1 and arm 0 pays 0; the actors play a stale copy
    for use_vtrace in (True, False):
        agent = A2C(A2CConfig(hidden=(16,), lr=1e-2, vtrace=use_vtrace, entropy_coef=0.0), 2, 2, seed=0)
        g = torch.Generator().manual_seed(0)
        obs = torch.ones(1, 64, 2)
        stale = copy.deepcopy(agent.policy)
        for step in range(60):
            if step % 5 == 0:
                stale.load_state_dict(agent.policy.state_dict())
            with torch.no_grad():
                probs = torch.softmax(stale(obs), -1)[0]
            action = torch.multinomial(probs, 1, generator=g).T
            traj = Trajectory(obs, action, action.float(), obs, torch.ones(1, 64), torch.zeros(1, 64),
                              log_probs(stale, obs, action), torch.ones(1, 64))
            agent.learn(traj)
        with torch.no_grad():
            p1 = float(torch.softmax(agent.policy(obs[0, :1]), -1)[0, 1])
        assert p1 > 0.9, (use_vtrace, p1)
        assert agent.received == 60 * 64


def test_trajectory_from_episodes_pads_and_marks_time_limits():
    # two episodes: 3 steps ending by termination, 2 steps cut by a time limit
    obs = np.arange(10, dtype=np.float32).reshape(5, 2)
    ep = Episodes(obs=obs, action=np.array([0, 1, 1, 0, 1]), reward=np.ones(5, dtype=np.float32),
                  next_obs=obs + 100, terminated=np.array([False, False, True, False, False]),
                  returns=np.array([3.0, 2.0]), lengths=np.array([3, 2]))
    policy = networks.seeded_mlp(0, 2, 2, (8,))
    traj = trajectory_from_episodes(ep, policy)
    assert traj.obs.shape == (3, 2, 2)
    assert traj.mask.T.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert traj.terminated.T.tolist() == [[0, 0, 1], [0, 0, 0]]
    assert traj.truncated.T.tolist() == [[0, 0, 0], [0, 1, 0]]
    assert traj.next_obs[1, 1].tolist() == [108.0, 109.0]
    assert torch.allclose(traj.behaviour_log_prob[:2, 1], log_probs(policy, torch.as_tensor(obs[3:]), torch.tensor([0, 1])))
    agent = A2C(A2CConfig(hidden=(8,)), 2, 2, seed=0)
    agent.learn(traj)
    twin = A2C(A2CConfig(hidden=(8,)), 2, 2, seed=0)
    twin.load(agent.arrays(), agent.counters())
    assert torch.equal(networks.flat_parameters(twin.policy), networks.flat_parameters(agent.policy))
    assert twin.counters() == agent.counters() and agent.received == 5
