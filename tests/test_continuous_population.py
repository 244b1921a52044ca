"""DDPG and TD3 populations (``popplay train td3|ddpg --agents P``): each member's update
against the one-agent rule, exact batching, resume, export and refusals."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from popplay.deep.agents import networks
from popplay.deep.agents.continuous_members import _SAMPLE, ContinuousMembers
from popplay.deep.agents.ddpg import DDPG, Actor, DDPGConfig, ddpg_update
from popplay.deep.agents.replay import Batch
from popplay.deep.agents.td3 import TD3, TD3Config, td3_update
from popplay.deep.topologies.exarl import ContinuousPopulation, DDPGExperiment, TD3Experiment
from popplay.deep.topologies.exarl_params import DDPGParams, TD3Params
from tests._population_helpers import assert_same_state, assert_two_ranks_equal_one_process, run_phases

SMALL = dict(agents=3, hidden=(8, 8), batch_size=8, replay_capacity=300, learning_starts=40, phase_steps=50,
             eval_episodes=1, seed=3, hp="actor_lr=loguniform:1e-4:1e-2;tau=uniform:0.005:0.05")


def test_td3_and_ddpg_agents_build_populations() -> None:
    td3 = TD3Experiment(TD3Params(**SMALL), None)  # type: ignore[arg-type]
    ddpg = DDPGExperiment(DDPGParams(**SMALL), None)  # type: ignore[arg-type]
    assert isinstance(td3, ContinuousPopulation) and isinstance(ddpg, ContinuousPopulation)
    assert td3.initial_state().learner.critic_count == 2 and ddpg.initial_state().learner.critic_count == 1
    alone = dataclasses.replace(TD3Params(**SMALL), agents=1, hp="")  # type: ignore[arg-type]
    assert not isinstance(TD3Experiment(alone, None), ContinuousPopulation)


def test_td3_member_k_of_a_population_is_member_k_alone() -> None:
    # minibatches of more than 8 rows: the critics' targets take forward_layers' W·hᵀ form
    params = TD3Params(**{**SMALL, "batch_size": 12})  # type: ignore[arg-type]
    population = run_phases(ContinuousPopulation(params, None), 2)
    assert population.learner.updates > 40  # learning is covered, not only acting
    for k in (0, 2):
        alone = run_phases(ContinuousPopulation(params, None, members=np.array([k])), 2)
        for mine, its in zip(population.learner.member_tables(replay=True), alone.learner.member_tables(replay=True)):
            assert torch.equal(mine[k], its[0])
        assert np.array_equal(population.envs.obs[k], alone.envs.obs[0])
    assert not torch.equal(population.learner.actor.matrix[0], population.learner.actor.matrix[1])


def _one_agent(kind: str, config, learner: ContinuousMembers, m: int):
    """Member ``m`` as the one agent: its networks and hyper-parameters in a TD3 or DDPG."""
    h = {name: float(values[m]) for name, values in learner.hypers.items()}
    config = dataclasses.replace(config, actor_lr=h["actor_lr"], critic_lr=h["critic_lr"], gamma=h["gamma"],
                                 tau=h["tau"])
    agent = (TD3 if kind == "td3" else DDPG)(config, learner.obs_dim, (-2.0,), (2.0,), 0)
    torch.nn.utils.vector_to_parameters(learner.actor.matrix[m].clone(), agent.actor.net.parameters())
    torch.nn.utils.vector_to_parameters(learner.actor_target[m].clone(), agent.actor_target.net.parameters())
    critics = [agent.critic1, agent.critic2] if kind == "td3" else [agent.critic]
    targets = [agent.critic1_target, agent.critic2_target] if kind == "td3" else [agent.critic_target]
    for source, modules in ((learner.critic.matrix[m], critics), (learner.critic_target[m], targets)):
        torch.nn.utils.vector_to_parameters(source.clone(), [q for c in modules for q in c.net.parameters()])
    return agent, critics, targets


@pytest.mark.parametrize("kind", ["td3", "ddpg"])
def test_each_member_updates_by_the_one_agent_rule(kind: str) -> None:
    """Two updates (TD3: a critic step, then a critic and actor step with the soft
    updates; DDPG: both full) of two members with their own hyper-parameters, against
    the one agent's ``td3_update`` / ``ddpg_update`` on the same minibatches (TD3's target
    smoothing off: its draws come from another stream)."""
    config = (TD3Config(hidden=(8, 8), batch_size=6, replay_capacity=50, learning_starts=10, target_smoothing=False)
              if kind == "td3" else DDPGConfig(hidden=(8, 8), batch_size=6, replay_capacity=50, learning_starts=10))
    hypers = {"actor_lr": np.array([1e-2, 3e-3]), "critic_lr": np.array([3e-3, 1e-2]), "gamma": np.array([0.9, 0.99]),
              "tau": np.array([0.05, 0.2]), "exploration_noise": np.array([0.1, 0.1])}
    learner = ContinuousMembers(config, 3, (-2.0,), (2.0,), 5, np.array([0, 1]), hypers)
    generator = np.random.default_rng(4)
    for _ in range(12):
        learner.receive(generator.normal(size=(2, 3)).astype(np.float32),
                        generator.uniform(-2, 2, size=(2, 1)).astype(np.float32),
                        generator.normal(size=2).astype(np.float32), generator.normal(size=(2, 3)).astype(np.float32),
                        generator.random(2) < 0.3, np.zeros(2, dtype=bool))
    agents = [_one_agent(kind, config, learner, m) for m in (0, 1)]
    for _ in range(2):
        index = learner.replay.sample_index(learner._rng, learner._keys[_SAMPLE], learner.updates)
        rows = learner.replay.batch(index)
        learner.update()
        for m, (agent, _, _) in enumerate(agents):
            batch = Batch(rows["obs"][m], rows["action"][m], rows["reward"][m], rows["next_obs"][m],
                          rows["terminated"][m])
            (td3_update if kind == "td3" else ddpg_update)(agent, batch)
    for m, (agent, critics, targets) in enumerate(agents):
        close = lambda a, b: torch.allclose(a, b, atol=1e-6, rtol=1e-5)  # noqa: E731
        assert close(learner.actor.matrix[m], networks.flat_parameters(agent.actor.net)), (kind, m)
        assert close(learner.actor_target[m], networks.flat_parameters(agent.actor_target.net)), (kind, m)
        assert close(learner.critic.matrix[m], torch.cat([networks.flat_parameters(c.net) for c in critics]))
        assert close(learner.critic_target[m], torch.cat([networks.flat_parameters(c.net) for c in targets]))
    assert learner.updates == 2 and learner.adam_actor.steps.tolist() == ([1.0, 1.0] if kind == "td3" else [2.0, 2.0])


FLAGS = ["--agents", "2", "--hidden", "8,8", "--batch-size", "8", "--replay", "200", "--learning-starts", "30",
         "--phase-steps", "40", "--eval-episodes", "1", "--hp", "critic_lr=loguniform:1e-4:1e-2",
         "--replicate-every", "80"]


def test_a_td3_population_resumes_exactly_and_exports_its_actor(tmp_path: Path, cli) -> None:
    straight, split = tmp_path / "straight.h5", tmp_path / "split.h5"
    assert cli(["train", "td3", *FLAGS, "--env-steps", "480", "--out", str(straight)])[0] == 0
    assert cli(["train", "td3", *FLAGS, "--env-steps", "240", "--out", str(split)])[0] == 0
    code, out, err = cli(["train", "td3", "--resume", str(split), "--env-steps", "480", "--json"])
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["agents"] == 2 and summary["replications"] >= 2
    names = assert_same_state(straight, split)
    assert "members.critic_target" in names and "members.replay.action" in names
    code, out, _ = cli(["evaluate", str(split), "--member", "1", "--episodes", "1", "--json"])
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["best_member"] in (0, 1)
    assert cli(["export", str(split), "--member", "1", "--out", str(tmp_path / "actor.pt")])[0] == 0
    actor = Actor(3, (-2.0,), (2.0,), (8, 8))
    actor.load_state_dict(torch.load(tmp_path / "actor.pt", weights_only=True))


@pytest.mark.procs
def test_a_td3_population_on_two_ranks_equals_one_process(tmp_path: Path) -> None:
    """The member axis split over two real ranks (DDPG's members are the same class)."""
    flags = ["train", "td3", "--agents", "4", *FLAGS[2:], "--share-every", "80", "--share-group", "2",
             "--env-steps", "640"]
    assert_two_ranks_equal_one_process(flags, tmp_path)


@pytest.mark.parametrize("args, message", [
    (["train", "ddpg", "--agents", "2", "--per"], "a population's members keep uniform replay"),
    (["train", "td3", "--agents", "2", "--workflow", "multi-learner"], "give --workflow sequential"),
    (["train", "td3", "--agents", "2", "--hp", "lr=uniform:1e-4:1e-3"], "not a per-member hyper-parameter"),
    (["train", "td3", "--agents", "2", "--env", "CartPole-v1"], "needs continuous actions"),
])
def test_continuous_population_options_that_cannot_work_are_one_line(tmp_path: Path, cli, args: list[str],
                                                                      message: str) -> None:
    code, _, err = cli([*args, "--env-steps", "100", "--out", str(tmp_path / "x.h5")])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "x.h5").exists()
