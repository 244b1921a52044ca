"""A2C populations (``popplay train a2c --agents P``): the batched update against a
plain-Python reference, exact batching, resume, export and ranks."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from popplay.deep.agents import networks
from popplay.deep.agents.a2c_members import A2CMembers
from popplay.deep.topologies.exarl import A2CExperiment, A2CPopulation
from popplay.deep.topologies.exarl_params import A2CParams
from tests._population_helpers import assert_same_state, assert_two_ranks_equal_one_process, run_phases

A2C_SMALL = dict(agents=3, hidden=(8, 8), copies=2, n_steps=5, env_steps=3 * 2 * 150, phase_steps=30,
                 eval_episodes=1, seed=4, hp="lr=loguniform:1e-3:1e-2;entropy_coef=uniform:0.0:0.05")



def test_a2c_agents_build_a_population_and_one_agent_stays_exarl_s() -> None:
    params = A2CParams(**A2C_SMALL)  # type: ignore[arg-type]
    assert isinstance(A2CExperiment(params, None), A2CPopulation)
    assert not isinstance(A2CExperiment(dataclasses.replace(params, agents=1, hp=""), None), A2CPopulation)


def test_a2c_member_k_of_a_population_is_member_k_alone() -> None:
    params = A2CParams(**A2C_SMALL)  # type: ignore[arg-type]
    population = run_phases(A2CPopulation(params, None), 3)
    assert population.learner.updates == 3 * 30 // 5 and population.episodes > 0
    for k in (0, 2):
        alone = run_phases(A2CPopulation(params, None, members=np.array([k])), 3)
        assert torch.equal(population.learner.net.matrix[k], alone.learner.net.matrix[0])
        assert torch.equal(population.learner.adam.exp_avg_sq[k], alone.learner.adam.exp_avg_sq[0])
        assert np.array_equal(population.envs.obs[2 * k:2 * k + 2], alone.envs.obs)
    assert not torch.equal(population.learner.net.matrix[0], population.learner.net.matrix[1])


def _reference_update(row: torch.Tensor, split: int, rollout: dict, last_obs: torch.Tensor, last_start: torch.Tensor,
                      hypers: dict, hidden: tuple[int, ...], obs_dim: int, actions: int) -> torch.Tensor:
    """One member's A2C step written out plainly: n-step returns by a Python loop over
    time, torch modules, autograd, torch's clip and Adam."""
    policy = networks.mlp(obs_dim, actions, hidden, "tanh")
    value = networks.mlp(obs_dim, 1, hidden, "tanh")
    torch.nn.utils.vector_to_parameters(row[:split].clone(), policy.parameters())
    torch.nn.utils.vector_to_parameters(row[split:].clone(), value.parameters())
    obs, action, reward, start = rollout["obs"], rollout["action"], rollout["reward"], rollout["episode_start"]
    steps, copies = reward.shape
    gamma = float(hypers["gamma"])
    returns = torch.zeros(steps, copies)
    with torch.no_grad():
        for c in range(copies):
            following = float(value(last_obs[c])[0]) * (1.0 - float(last_start[c]))
            for t in reversed(range(steps)):
                following = float(reward[t, c]) + gamma * following
                returns[t, c] = following
                if float(start[t, c]):  # row t began an episode: nothing before it is bootstrapped from t
                    following = 0.0
    flat_obs, flat_action, flat_returns = obs.reshape(-1, obs_dim), action.reshape(-1), returns.reshape(-1)
    logp_all = torch.log_softmax(policy(flat_obs), dim=-1)
    logp = logp_all[torch.arange(len(flat_action)), flat_action]
    values = value(flat_obs).squeeze(-1)
    advantages = (flat_returns - values).detach()
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    loss = (-(advantages * logp).mean() + float(hypers["value_coef"]) * 0.5 * ((flat_returns - values) ** 2).mean()
            - float(hypers["entropy_coef"]) * entropy)
    optimiser = torch.optim.Adam([*policy.parameters(), *value.parameters()], lr=float(hypers["lr"]))
    loss.backward()
    torch.nn.utils.clip_grad_norm_([*policy.parameters(), *value.parameters()], float(hypers["max_grad_norm"]))
    optimiser.step()
    return torch.cat([networks.flat_parameters(policy), networks.flat_parameters(value)]).detach()


def test_one_a2c_update_matches_a_plain_python_reference() -> None:
    params = A2CParams(**{**A2C_SMALL, "agents": 2, "copies": 3, "n_steps": 6})  # type: ignore[arg-type]
    hypers = {"lr": np.array([3e-3, 1e-2]), "gamma": np.array([0.9, 0.99]), "entropy_coef": np.array([0.0, 0.05]),
              "value_coef": np.array([0.5, 1.5]), "max_grad_norm": np.array([0.5, 0.05])}
    learner = A2CMembers(params, 4, 2, 7, np.array([0, 1]), hypers)
    before = learner.net.matrix.clone()
    generator = np.random.default_rng(1)
    obs = generator.normal(size=(6, 4)).astype(np.float32)
    for step in range(params.n_steps):
        action = learner.act(obs, step)
        successor = generator.normal(size=(6, 4)).astype(np.float32)
        terminated = generator.random(6) < 0.2  # episodes end inside the rollout, and at its last row
        terminated[0] |= step == params.n_steps - 1
        learner.receive(obs, action, generator.normal(size=6).astype(np.float32), successor, terminated,
                        np.zeros(6, dtype=bool))
        obs = successor
    rollout = {name: table.clone() for name, table in learner.rollout.items()}
    last_start = learner.next_start.clone()
    assert learner.train() == 1 and learner.filled == 0
    assert float(rollout["episode_start"][1:].sum()) > 0 and float(last_start.sum()) > 0
    for m in (0, 1):
        member_rollout = {name: table[:, m] for name, table in rollout.items()}
        expected = _reference_update(before[m], learner._split, member_rollout,
                                     torch.as_tensor(obs).view(2, 3, 4)[m], last_start[m],
                                     {k: v[m] for k, v in hypers.items()}, params.hidden, 4, 2)
        assert torch.allclose(learner.net.matrix[m], expected, atol=1e-6, rtol=1e-5), m
        assert not torch.allclose(learner.net.matrix[m], before[m])


@pytest.fixture
def a2c_flags() -> list[str]:
    return ["--agents", "2", "--hidden", "8,8", "--copies", "2", "--n-steps", "5", "--phase-steps", "25",
            "--eval-episodes", "1", "--hp", "lr=loguniform:1e-3:1e-2", "--replicate-every", "50"]


def test_an_a2c_population_resumes_exactly_and_exports_its_policy(tmp_path: Path, cli, a2c_flags) -> None:
    straight, split = tmp_path / "straight.h5", tmp_path / "split.h5"
    assert cli(["train", "a2c", *a2c_flags, "--env-steps", "800", "--out", str(straight)])[0] == 0
    assert cli(["train", "a2c", *a2c_flags, "--env-steps", "400", "--out", str(split)])[0] == 0
    code, out, err = cli(["train", "a2c", "--resume", str(split), "--env-steps", "800", "--json"])
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["agents"] == 2 and summary["replications"] >= 3 and summary["topology"] == "population"
    assert_same_state(straight, split)
    code, out, _ = cli(["evaluate", str(split), "--member", "1", "--episodes", "2", "--json"])
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["best_member"] in (0, 1)
    assert cli(["export", str(split), "--member", "1", "--out", str(tmp_path / "policy.pt")])[0] == 0
    policy = networks.mlp(4, 2, (8, 8), "tanh")
    policy.load_state_dict(torch.load(tmp_path / "policy.pt", weights_only=True))


@pytest.mark.parametrize("args, message", [
    (["--agents", "2", "--hp", "clip_range=uniform:0.1:0.3"], "clip_range is not a per-member hyper-parameter"),
    (["--agents", "2", "--workflow", "multi-learner"], "give --workflow sequential"),
    (["--hp", "lr=uniform:1e-4:1e-3"], "hp acts on a population"),
])
def test_a2c_population_options_that_cannot_work_are_one_line(tmp_path: Path, cli, args: list[str],
                                                              message: str) -> None:
    code, _, err = cli(["train", "a2c", *args, "--env-steps", "100", "--out", str(tmp_path / "x.h5")])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.procs
def test_an_a2c_population_on_two_ranks_equals_one_process(tmp_path: Path, a2c_flags) -> None:
    flags = ["train", "a2c", *a2c_flags[2:], "--agents", "4", "--share-every", "75", "--share-group", "2",
             "--env-steps", "800"]
    assert_two_ranks_equal_one_process(flags, tmp_path)
