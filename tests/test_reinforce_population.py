"""REINFORCE populations (``popplay train reinforce --agents P``): each member's update
against the one-agent rule, exact batching, resume, export, refusals and ranks."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from popplay.deep.agents import networks
from popplay.deep.agents.reinforce import episode_gradient
from popplay.deep.agents.reinforce_members import ReinforceMembers
from popplay.deep.topologies.reinforce import ReinforceExperiment, ReinforcePopulation
from popplay.deep.topologies.reinforce_params import ReinforceParams
from tests._population_helpers import assert_same_state, assert_two_ranks_equal_one_process, run_phases

SMALL = dict(agents=3, hidden=(8,), episodes=0, env_steps=3 * 150, phase_steps=50, eval_episodes=1, seed=6,
             hp="lr=loguniform:1e-3:3e-2;gamma=choice:0.9,0.99")



def test_reinforce_agents_build_a_population() -> None:
    params = ReinforceParams(**SMALL)  # type: ignore[arg-type]
    assert isinstance(ReinforceExperiment(params, None), ReinforcePopulation)
    assert not isinstance(ReinforceExperiment(dataclasses.replace(params, agents=1, hp="", topology="local"), None),
                          ReinforcePopulation)


def test_reinforce_member_k_of_a_population_is_member_k_alone() -> None:
    params = ReinforceParams(**SMALL)  # type: ignore[arg-type]
    population = run_phases(ReinforcePopulation(params, None), 3)
    assert population.episodes >= 6 and population.learner.updates >= 3
    assert len(set(population.learner.hypers["lr"])) == 3
    for k in (0, 2):
        alone = run_phases(ReinforcePopulation(params, None, members=np.array([k])), 3)
        assert torch.equal(population.learner.net.matrix[k], alone.learner.net.matrix[0])
        assert torch.equal(population.learner.adam.exp_avg_sq[k], alone.learner.adam.exp_avg_sq[0])
        assert population.learner.adam.steps[k] == alone.learner.adam.steps[0] > 0
        assert np.array_equal(population.envs.obs[k], alone.envs.obs[0])
        mine = [r for m, r in zip(population.episode_member, population.episode_return) if m == k]
        assert mine == alone.episode_return


def test_each_member_steps_by_the_one_agent_rule_when_its_own_episode_ends() -> None:
    """Member 0's episode ends after 3 steps, member 1's after 5: member 0 alone moves
    at step 3, by :func:`episode_gradient` (the one-agent REINFORCE) and torch's Adam;
    member 1 then, by its own episode."""
    params = ReinforceParams(agents=2, hidden=(8,), seed=1)  # type: ignore[arg-type]
    hypers = {"lr": np.array([1e-2, 3e-3]), "gamma": np.array([0.9, 0.99])}
    learner = ReinforceMembers(params, 4, 2, 3, np.array([0, 1]), hypers, horizon=8)
    generator = np.random.default_rng(2)
    episode: dict[int, list] = {0: [], 1: []}
    ends = {0: 3, 1: 5}
    for step in range(5):
        obs = generator.normal(size=(2, 4)).astype(np.float32)
        before = learner.net.matrix.clone()
        action = learner.act(obs, step)
        reward = generator.normal(size=2).astype(np.float32)
        terminated = np.array([step + 1 == ends[0], step + 1 == ends[1]])
        for m in (0, 1):
            if step < ends[m]:
                episode[m].append((obs[m], int(action[m]), float(reward[m])))
        learner.receive(obs, action, reward, obs, terminated, np.zeros(2, dtype=bool))
        learned = learner.train()
        assert learned == int(terminated.sum())
        for m in (0, 1):
            if not terminated[m]:
                assert torch.equal(learner.net.matrix[m], before[m])  # a member between episode ends stays
                continue
            policy = networks.mlp(4, 2, (8,))
            torch.nn.utils.vector_to_parameters(before[m].clone(), policy.parameters())
            rows = episode[m]
            grad, _ = episode_gradient(policy, np.stack([r[0] for r in rows]), np.array([r[1] for r in rows]),
                                       np.array([r[2] for r in rows]), float(hypers["gamma"][m]))
            optimiser = torch.optim.Adam(policy.parameters(), lr=float(hypers["lr"][m]))
            start = 0
            for q in policy.parameters():
                q.grad = grad[start:start + q.numel()].view_as(q).clone()
                start += q.numel()
            optimiser.step()
            expected = networks.flat_parameters(policy)
            assert torch.allclose(learner.net.matrix[m], expected, atol=1e-7, rtol=1e-6), (step, m)
            assert not torch.equal(learner.net.matrix[m], before[m])
    assert learner.length.tolist() == [2, 0]  # member 0's next episode is under way


FLAGS = ["--agents", "2", "--hidden", "8", "--episodes", "0", "--phase-steps", "40", "--eval-episodes", "1",
         "--hp", "lr=loguniform:1e-3:3e-2", "--replicate-every", "80"]


def test_a_reinforce_population_resumes_exactly_mid_episode_and_exports_its_policy(tmp_path: Path, cli) -> None:
    straight, split = tmp_path / "straight.h5", tmp_path / "split.h5"
    assert cli(["train", "reinforce", *FLAGS, "--env-steps", "600", "--out", str(straight)])[0] == 0
    assert cli(["train", "reinforce", *FLAGS, "--env-steps", "300", "--out", str(split)])[0] == 0
    with h5py.File(split) as f:
        assert f["state"]["members.episode.length"][()].max() > 0  # saved with episodes under way
    code, out, err = cli(["train", "reinforce", "--resume", str(split), "--env-steps", "600", "--json"])
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["agents"] == 2 and summary["replications"] >= 3
    assert_same_state(straight, split)
    assert cli(["export", str(split), "--member", "0", "--out", str(tmp_path / "policy.pt")])[0] == 0
    policy = networks.mlp(4, 2, (8,))
    policy.load_state_dict(torch.load(tmp_path / "policy.pt", weights_only=True))


@pytest.mark.parametrize("args, message", [
    (["--agents", "2", "--workers", "2"], "give --workers 1"),
    (["--agents", "2", "--max-steps", "100"], "needs a time limit of at most --max-steps 100"),
    (["--agents", "2", "--topology", "multi-learner"], "give --topology sequential"),
    (["--agents", "2", "--hp", "entropy_coef=uniform:0:0.1"], "not a per-member hyper-parameter"),
])
def test_reinforce_population_options_that_cannot_work_are_one_line(tmp_path: Path, cli, args: list[str],
                                                                    message: str) -> None:
    code, _, err = cli(["train", "reinforce", *args, "--episodes", "0", "--env-steps", "100",
                        "--out", str(tmp_path / "x.h5")])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.procs
def test_a_reinforce_population_on_two_ranks_equals_one_process(tmp_path: Path) -> None:
    flags = ["train", "reinforce", *FLAGS[2:], "--agents", "4", "--share-every", "60", "--share-group", "2",
             "--env-steps", "800"]
    assert_two_ranks_equal_one_process(flags, tmp_path)
