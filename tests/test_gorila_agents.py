"""Gorila runs any off-policy agent that says how a parameter server runs it (DQN,
DDPG, TD3): the agents' server side against their own sequential updates, the
config's refusals, and a real TD3 job through the console script (DDPG's server side is
the same class, checked against its own update above)."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch

from popplay.checkpoints.validation import load_run
from popplay.cli.main import main
from popplay.deep.agents import networks
from popplay.deep.agents.replay import Batch
from popplay.deep.envs import EnvInfo
from popplay.deep.topologies import gorila as G
from popplay.deep.topologies.gorila_params import GorilaConfig

PENDULUM = EnvInfo("Pendulum-v1", 3, None, 1, (-2.0,), (2.0,))
CARTPOLE = EnvInfo("CartPole-v1", 4, 2, 1)


def _batch(n: int = 16, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(torch.randn(n, 3, generator=g), torch.rand(n, 1, generator=g) * 4 - 2, torch.randn(n, generator=g),
                 torch.randn(n, 3, generator=g), (torch.rand(n, generator=g) < 0.2).float())


def _server(agent: str, **knobs):
    config = GorilaConfig(agent=agent, env="Pendulum-v1" if agent != "dqn" else "CartPole-v1", hidden=(8, 8),
                          env_steps=10, **knobs)
    return config.agent_params().server_agent(PENDULUM if agent != "dqn" else CARTPOLE)


@pytest.mark.parametrize("agent", ["ddpg", "td3"])
def test_a_server_gradient_is_the_gradient_the_agent_s_own_update_steps_with(agent: str) -> None:
    """Laid out as the vector (actor, then critics), the critics' part is the gradient
    the sequential update hands its critic optimiser, and the actor's part the one it
    hands its actor optimiser (the critic held still, as the server's gradient sees it)."""
    server = _server(agent, policy_delay=1) if agent == "td3" else _server(agent)
    learner, batch = server.learner, _batch()
    server.load_target(server.initial())
    seen: dict[str, torch.Tensor] = {}

    def capture(name: str, optimizer: torch.optim.Optimizer):
        def step(*args, **kwargs) -> None:  # record the gradient, move nothing
            seen[name] = torch.cat([p.grad.reshape(-1) for g in optimizer.param_groups for p in g["params"]])
        return step

    learner.critic_opt.step = capture("critics", learner.critic_opt)
    learner.actor_opt.step = capture("actor", learner.actor_opt)
    smoothing_state = learner.smoothing.get_state() if agent == "td3" else None
    grad, loss = server.gradient(batch, 0, networks.generator(5))
    if smoothing_state is not None:  # the update below draws its smoothing noise from the same stream
        learner.smoothing.set_state(networks.generator(5).get_state())
    learner.learn(batch, None)
    actor_size = networks.parameter_count(learner.actor)
    assert grad.shape == server.initial().shape and np.isfinite(loss)
    torch.testing.assert_close(grad[actor_size:], seen["critics"], rtol=0, atol=0)
    torch.testing.assert_close(grad[:actor_size], seen["actor"], rtol=1e-6, atol=1e-7)
    assert grad[:actor_size].abs().sum() > 0


def test_td3_s_server_gradient_moves_the_actor_every_policy_delay_steps() -> None:
    server = _server("td3", policy_delay=3)
    server.load_target(server.initial())
    actor_size = networks.parameter_count(server.learner.actor)
    moved = [bool(server.gradient(_batch(), step, networks.generator(1))[0][:actor_size].abs().sum() > 0)
             for step in range(6)]
    assert moved == [False, False, True, False, False, True]


def test_td3_s_smoothing_draws_from_the_learner_s_generator() -> None:
    server = _server("td3")
    server.load_target(server.initial())
    same = [server.gradient(_batch(), 0, networks.generator(9))[0] for _ in range(2)]
    other = server.gradient(_batch(), 0, networks.generator(10))[0]
    torch.testing.assert_close(same[0], same[1], rtol=0, atol=0)
    assert not torch.equal(same[0], other)


@pytest.mark.parametrize("agent", ["dqn", "ddpg", "td3"])
def test_the_counted_vector_size_is_the_built_one(agent: str) -> None:
    """check_stored counts the vector without building it (a crafted width stays cheap)."""
    config = GorilaConfig(agent=agent, hidden=(8, 5), env_steps=10)
    info = PENDULUM if agent != "dqn" else CARTPOLE
    measured = {"obs_dim": info.obs_dim, "actions": info.actions, "action_dim": info.action_dim,
                "action_low": list(info.action_low), "action_high": list(info.action_high)}
    assert G.vector_size(config, measured) == config.agent_params().server_agent(info).initial().numel()


def test_explorers_act_from_pulled_vectors_by_the_server_s_version() -> None:
    ddpg = _server("ddpg")
    explorer = ddpg.explorer(networks.generator(0))
    obs = np.zeros((1, 3), dtype=np.float32)
    explorer.load(ddpg.initial(), 0)
    assert explorer.exploration == 1.0  # uniform until the server has applied an update
    explorer.load(ddpg.initial() + 0.5, 7)
    assert explorer.exploration == 0.0
    torch.testing.assert_close(networks.flat_parameters(explorer.actor), ddpg.initial()[:explorer._actor_size] + 0.5)
    assert -2.0 <= float(explorer(obs)[0, 0]) <= 2.0
    dqn = _server("dqn", epsilon_updates=100)
    greedy = dqn.explorer(networks.generator(0))
    greedy.load(dqn.initial(), 50)
    assert greedy.epsilon == pytest.approx(1.0 + 0.5 * (0.05 - 1.0))


@pytest.mark.parametrize(("args", "message"), [
    (["--agent", "ppo"], "--agent must be one of dqn, td3, ddpg (got 'ppo')"),
    (["--agent", "dqn", "--policy-delay", "3"], "--policy-delay is not a parameter of --agent dqn"),
    (["--agent", "td3", "--env", "Pendulum-v1", "--epsilon-updates", "9"],
     "--epsilon-updates is not a parameter of --agent td3"),
    (["--agent", "td3", "--env", "CartPole-v1"],
     "--env CartPole-v1: --agent td3 needs continuous actions (this environment's are discrete)"),
    (["--agent", "dqn", "--env", "Pendulum-v1"],
     "--env Pendulum-v1: --agent dqn needs discrete actions (this environment's are continuous)"),
])
def test_gorila_refuses_an_agent_it_cannot_run_in_one_line(tmp_path, capsys, args: list[str], message: str) -> None:
    out = tmp_path / "g.h5"
    code = main(["train", "gorila", *args, "--env-steps", "100", "--out", str(out)])
    assert (code, capsys.readouterr().err) == (2, f"Error: {message}\n")
    assert not out.exists()


TINY = ["--hidden", "16", "--batch-size", "16", "--learning-starts", "64", "--update-ratio", "0.5",
        "--learner-sync", "2", "--actor-sync", "20", "--target-every", "10", "--eval-episodes", "2",
        "--timeout", "20", "--actors", "1", "--learners", "1", "--shards", "2"]


def _popplay(*args: str) -> dict:
    done = subprocess.run(["popplay", *args, "--json"], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _trained(agent: str, out, steps: int) -> dict:
    summary = _popplay("train", "gorila", "--agent", agent, "--env", "Pendulum-v1", "--env-steps", str(steps),
                       "--seed", "2", *TINY, "--out", str(out))
    assert summary["complete"] and summary["lost"] == []
    assert summary["transitions_received"] == summary["env_steps"] == steps  # every transition reached a learner
    assert summary["gradients_sent"] > 10 and np.isfinite(summary["quality"])
    assert summary["gradients_applied"] + summary["stale_discarded"] == 2 * summary["gradients_sent"]  # both shards
    return summary


@pytest.mark.procs
def test_gorila_trains_td3_into_a_run_file_that_evaluate_reads_and_resume_continues(tmp_path, capsys) -> None:
    out = tmp_path / "td3.h5"
    first = _trained("td3", out, 400)
    assert main(["evaluate", str(out), "--episodes", "2", "--json"]) == 0  # in this process: no rank to start
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["domain"] == "gorila" and np.isfinite(evaluated["quality"])
    resumed = _popplay("train", "gorila", "--resume", str(out), "--env-steps", "800")
    assert resumed["complete"] and resumed["env_steps"] >= 800
    assert resumed["server_versions"][0] > first["server_versions"][0]  # the stored vector went on learning


def test_each_agent_keeps_its_own_gradient_clipping_under_gorila() -> None:
    """DQN clips its gradient as its own update does; DDPG and TD3 clip nothing (a joint
    clip would shrink the actor's part by the critics' norm)."""
    assert _server("dqn").max_grad_norm == GorilaConfig().max_grad_norm == 10.0
    assert _server("td3").max_grad_norm == _server("ddpg").max_grad_norm == 0.0
    with pytest.raises(ValueError, match="max_grad_norm is not a parameter of --agent td3"):
        GorilaConfig(agent="td3", env="Pendulum-v1", env_steps=10, max_grad_norm=1.0).validate()


@pytest.mark.procs
def test_gorila_takes_the_pipeline_s_seeds_time_budget_and_log_dir(tmp_path) -> None:
    """One pipeline: ``--seeds``, ``--time-budget`` (alone a budget; the run complete when
    it ends) and ``--log-dir`` work for Gorila as for every domain, and a resume goes on
    under a new time budget."""
    out, logs = tmp_path / "g.h5", tmp_path / "logs"
    both = _popplay("train", "gorila", "--seeds", "2", "--time-budget", "2", "--hidden", "16", "--actors", "1",
                    "--learners", "1", "--shards", "1", "--eval-episodes", "2", "--timeout", "20",
                    "--log-dir", str(logs), "--out", str(out))
    assert both["seeds"] == 2 and both["complete"] and len(both["quality_values"]) == 2
    assert both["quality_sem"] is not None and both["return_values"]
    runs = [tmp_path / "g-seed0.h5", tmp_path / "g-seed1.h5"]
    assert both["out"] == [str(p) for p in runs] and all(p.exists() for p in runs)
    for k, run in enumerate(both["runs"]):
        assert run["complete"] and 2.0 <= run["seconds"] < 9.0 and run["env_steps"] > 0  # stopped by the clock
        rows = (logs / f"seed{k}" / "curves.csv").read_text().splitlines()
        assert rows[0] == "agent_steps,seconds,return" and len(rows) == run["episodes"] + 1
    first = load_run(runs[0])
    assert first.config["time_budget"] == 2.0
    # The new budget counts from the time learned so far, which a loaded machine's
    # shutdown can stretch past 2 s: two seconds more than that, whatever it was.
    budget = round(float(first.attrs["learning_seconds"]) + 2.0, 3)
    resumed = _popplay("train", "gorila", "--resume", str(runs[0]), "--time-budget", str(budget))
    assert resumed["complete"] and resumed["env_steps"] > both["runs"][0]["env_steps"]
    assert budget <= load_run(runs[0]).attrs["learning_seconds"] < budget + 6.0
