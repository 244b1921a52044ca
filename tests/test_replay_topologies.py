"""Any replay agent (DQN, TD3, DDPG) in any replay topology: Grandio's simulators and
EXARL's workflows meet the agents only through :class:`popplay.deep.agents.protocol.ReplayAgent`;
REINFORCE joins A2C and PPO in EXARL's workflows as an on-policy agent."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from popplay.deep import envs
from popplay.deep.agents.replay import episode_rows, rows_batch
from popplay.deep.envs.rollout import Episodes, play_episodes
from popplay.deep.topologies import wire
from popplay.deep.topologies.dqn import DQNParams
from popplay.deep.topologies.exarl import DDPGParams, TD3Params
from popplay.deep.topologies.families import FAMILIES
from popplay.deep.topologies.workflow_params import ON_POLICY_WORKFLOWS, REPLAY_TOPOLOGIES, WORKFLOWS

TINY = ["--hidden", "8", "--eval-episodes", "1", "--timeout", "60", "--batch-size", "16", "--json"]


def _learner(params: object) -> tuple[object, object]:
    env = envs.make_vector(params.env, 1)
    info = envs.describe(env, params.env)
    env.close()
    return params.new_learner(info), info


def test_every_multi_process_topology_has_one_family() -> None:
    assert set(FAMILIES) == (set(REPLAY_TOPOLOGIES) | set(ON_POLICY_WORKFLOWS)) - {"sequential"}
    assert set(WORKFLOWS) - {"sequential"} <= set(FAMILIES)  # the on-policy agents' too
    for family in set(FAMILIES.values()):
        for name in ("rank0", "serve", "role", "resume_problem"):
            assert callable(getattr(family, name)), (family, name)


@pytest.mark.parametrize("params", [DQNParams(hidden=(8,)), TD3Params(hidden=(8,)), DDPGParams(hidden=(8,))],
                         ids=["dqn", "td3", "ddpg"])
def test_replay_agents_meet_the_protocol(params: object) -> None:
    agent, info = _learner(params)
    assert agent.on_policy is False and agent.discrete == info.discrete
    assert agent.action_dim == wire.action_width(info)
    # Exploration follows learner updates: full before the first, less after many.
    assert agent.exploration_at(0) == 1.0 and agent.exploration_at(100_000) < 1.0
    explorer = agent.explorer(agent.policy, torch.Generator().manual_seed(0))
    explorer.exploration = 0.0
    obs = np.zeros((3, info.obs_dim), np.float32)
    actions = explorer(obs)
    assert actions.shape[0] == 3
    # With no exploration the explorer acts deterministically from the policy it was given.
    assert np.array_equal(actions, explorer(obs)) or not agent.discrete


def test_rows_carry_continuous_actions_and_empty_messages() -> None:
    env = envs.make_vector("Pendulum-v1", 1)
    played = play_episodes(env, lambda obs: np.full((obs.shape[0], 1), 0.5, np.float32), [3])
    env.close()
    width = wire.row_width(3, 1)
    data = wire.pack(played, 3)
    rows, returns, lengths = wire.unpack(data, played.steps, 1, width)
    batch = rows_batch(rows, 3, discrete=False)
    assert batch.action.shape == (played.steps, 1) and bool((batch.action == 0.5).all())
    assert lengths.tolist() == [played.steps] and returns[0] == pytest.approx(played.returns[0])
    empty = Episodes(*(getattr(played, f)[:0] for f in ("obs", "action", "reward", "next_obs", "terminated",
                                                         "returns", "lengths")))
    assert wire.pack(empty, 3).size == 0


def test_dqn_averages_its_gradients_through_the_hook() -> None:
    """The data-parallel learners' hook: an identity reduce changes nothing, a zero
    gradient leaves the network where it was (Adam's first step of 0 is 0)."""
    params = DQNParams(hidden=(8,), batch_size=4, learning_starts=0)
    plain, _ = _learner(params)
    hooked, _ = _learner(params)
    zeroed, _ = _learner(params)
    hooked.average_gradients(lambda g, weight: g.clone())
    zeroed.average_gradients(lambda g, weight: torch.zeros_like(g))
    before = torch.cat([p.detach().clone().reshape(-1) for p in zeroed.policy.parameters()])
    env = envs.make_vector("CartPole-v1", 1)
    played = play_episodes(env, lambda obs: np.zeros(obs.shape[0], np.int64), [1])
    env.close()
    batch = rows_batch(wire.pack(played, 4)[:played.steps * wire.row_width(4)].reshape(played.steps, -1), 4, True)
    for agent in (plain, hooked, zeroed):
        agent.receive(batch)
        agent.train(3)
    flat = [torch.cat([p.detach().reshape(-1) for p in a.policy.parameters()]) for a in (plain, hooked, zeroed)]
    assert torch.equal(flat[0], flat[1]) and not torch.equal(flat[0], before)
    assert torch.equal(flat[2], before)


@pytest.mark.parametrize("params", [
    DQNParams(hidden=(8,), batch_size=4, learning_starts=0),
    DDPGParams(env="Pendulum-v1", hidden=(8,), batch_size=4, learning_starts=0),
    TD3Params(env="Pendulum-v1", hidden=(8,), batch_size=4, learning_starts=0, per=True),
], ids=["dqn", "ddpg", "td3-per"])
def test_a_learner_without_replay_steps_with_its_peers_at_weight_zero(params: object) -> None:
    """A data-parallel learner whose peers have read every trajectory so far runs the
    updates owed with them: each step hands a blank batch's gradient to the mean with
    weight 0 and moves along its peers' mean; its replay stays empty and its loss NaN.
    Once it holds replay, its steps weigh 1."""
    agent, info = _learner(params)
    weights: list[float] = []

    def peers_mean(gradient: torch.Tensor, weight: float) -> torch.Tensor:
        weights.append(weight)
        return torch.full_like(gradient, 0.01)

    agent.average_gradients(peers_mean)
    before = [p.detach().clone() for p in agent.policy.parameters()]
    agent.update_credit = 3.0
    assert agent.train() == 3 and agent.updates == 3
    assert weights and set(weights) == {0.0}
    assert len(agent.replay) == 0 and np.isnan(agent.last_loss)
    assert all(not torch.equal(b, p) for b, p in zip(before, agent.policy.parameters()))
    weights.clear()
    env = envs.make_vector(params.env, 1)
    played = play_episodes(env, agent.explorer(agent.policy, torch.Generator().manual_seed(0)), [1])
    env.close()
    agent.receive(rows_batch(episode_rows(played), info.obs_dim, info.discrete))
    agent.train(2)
    assert weights and set(weights) == {1.0} and np.isfinite(agent.last_loss)


def test_reinforce_learns_alone_exactly_as_its_server_updates() -> None:
    """One episode through ``learn_shared`` with no peers is the parameter server's
    update with one worker (the episode gradient, then Adam)."""
    from popplay.deep.agents import networks
    from popplay.deep.agents.a2c import trajectory_from_episodes
    from popplay.deep.agents.reinforce import SampledPolicy, episode_gradient
    from popplay.deep.topologies.exarl_ranks import ALONE, rows_trajectory, trajectory_rows
    from popplay.deep.topologies.reinforce import ReinforceParams

    params = ReinforceParams(hidden=(8,), lr=0.05)
    agent, _ = _learner(params)
    server, _ = _learner(params)  # the same network, stepped by hand as the server does
    env = envs.make_vector("CartPole-v1", 1)
    played = play_episodes(env, SampledPolicy(agent.policy, torch.Generator().manual_seed(1)), [5])
    env.close()
    traj = rows_trajectory(trajectory_rows(trajectory_from_episodes(played, agent.policy)), 4)  # as the wire moves it
    agent.learn_shared(traj, ALONE)
    grad, _ = episode_gradient(server.policy, played.obs, played.action, played.reward, params.gamma)
    networks.set_flat_gradients(server.policy, grad)
    server.optimizer.step()
    assert agent.updates == 1
    assert torch.equal(networks.flat_parameters(agent.policy), networks.flat_parameters(server.policy))
    fresh, _ = _learner(params)
    assert not torch.equal(networks.flat_parameters(agent.policy), networks.flat_parameters(fresh.policy))


@pytest.mark.parametrize("args,message", [
    (["train", "a2c", "--workflow", "collective", "--episodes", "2"], "--workflow"),  # an on-policy agent: no replay
    (["train", "td3", "--workflow", "pipelined", "--actors", "2", "--episodes", "2"], "exactly one simulator"),
    (["train", "dqn", "--topology", "multi-learner", "--learners", "0", "--episodes", "2"], "--learners"),
])
def test_pairings_that_cannot_work_are_refused_in_one_line(cli, tmp_path: Path, args: list[str],
                                                           message: str) -> None:
    code, _, err = cli([*args, "--out", str(tmp_path / "x.h5")])
    assert code == 2
    err = err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and message in err[0], err
    assert not (tmp_path / "x.h5").exists()


def _train(jobs, agent: str, args: list[str], options: tuple[str, ...] = (*TINY,)) -> subprocess.Popen:
    return jobs.start(["train", agent, *args, *options])


@pytest.mark.procs
def test_each_agent_in_the_other_family_through_real_ranks(jobs, cli, tmp_path: Path) -> None:
    """TD3 and DDPG in Grandio's topologies, DQN and REINFORCE in EXARL's workflows: every
    transition played arrives exactly once (equal counts and checksums), data-parallel
    DQN learners stay identical, and the run files evaluate."""
    pendulum = ["--env", "Pendulum-v1", "--learning-starts", "200"]
    cartpole = ["--learning-starts", "50"]
    layouts = {
        "td3-collective": ("td3", ["--workflow", "collective", "--actors", "2", "--episodes", "2", *pendulum]),
        "ddpg-async": ("ddpg", ["--workflow", "async", "--actors", "2", "--env-steps", "300", "--per", *pendulum]),
        "dqn-multi-learner": ("dqn", ["--topology", "multi-learner", "--learners", "2", "--simulators", "2",
                                      "--episodes", "12", *cartpole]),
        "dqn-central-inference": ("dqn", ["--topology", "central-inference", "--simulators", "2", "--episodes", "6",
                                          *cartpole]),
    }
    started = {name: _train(jobs, agent, [*args, "--out", str(tmp_path / f"{name}.h5")])
               for name, (agent, args) in layouts.items()}
    started["reinforce-multi-learner"] = _train(
        jobs, "reinforce", ["--topology", "multi-learner", "--learners", "2", "--workers", "2", "--episodes", "8",
                            "--out", str(tmp_path / "reinforce.h5")],
        ("--hidden", "8", "--eval-episodes", "1", "--json"))
    runs = {name: jobs.summary(process, 150) for name, process in started.items()}
    for name in ("td3-collective", "ddpg-async"):
        run = runs[name]
        assert run["ranks"] == 3 and run["topology"] == name.split("-")[1]
        assert run["topology_sent"] == run["topology_received"] == run["env_steps"] == run["topology_replay_added"]
        assert run["topology_sent_checksum"] == run["topology_received_checksum"]
    assert runs["td3-collective"]["episodes"] == 2 and runs["ddpg-async"]["env_steps"] >= 300
    multi = runs["dqn-multi-learner"]
    assert multi["ranks"] == 4 and multi["episodes"] == 12
    assert multi["topology_produced"] == multi["topology_reads"] == 12
    assert multi["topology_produced_checksum"] == multi["topology_reads_checksum"]
    assert multi["topology_learners_identical"] == 1 and multi["updates"] > 0
    reinforce = runs["reinforce-multi-learner"]
    assert reinforce["ranks"] == 4 and reinforce["episodes"] == 8 and reinforce["updates"] > 0
    assert reinforce["topology_produced_checksum"] == reinforce["topology_reads_checksum"]
    assert reinforce["topology_learners_identical"] == 1
    central = runs["dqn-central-inference"]
    assert central["ranks"] == 3 and central["episodes"] == 6
    assert central["topology_produced_checksum"] == central["topology_reads_checksum"]

    assert cli(["evaluate", str(tmp_path / "dqn-multi-learner.h5"), "--episodes", "1", "--json"])[0] == 0
    # (A resume through Grandio's topologies is the family's, tested with DQN in test_deep_topologies.)
