"""The torch engines on CUDA (skipped on machines without a GPU)."""
import numpy as np
import pytest

from popplay.checkpoints.validation import params_from_config
from popplay.core.backend import Backend, cuda_available

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU")]


def host(array):
    """A state field as a NumPy array: the torch engines keep their state on the device."""
    return array.detach().cpu().numpy() if hasattr(array, "detach") else np.asarray(array)


@pytest.mark.parametrize("differentiation", ["none", "bias", "top2", "none, greedy cache", "bias, greedy cache"])
def test_bandit_on_cuda_matches_numba(monkeypatch, differentiation):
    from popplay.games.bandit import _torch
    from popplay.games.bandit.experiment import BanditExperiment
    from popplay.games.bandit.rules import BanditParams
    from popplay.training.loop import run

    differentiation, cache = (differentiation.split(", ") + [""])[:2]
    if cache:  # the CPU's greedy cache, not used on CUDA until measured there
        monkeypatch.setitem(_torch.CACHE_FROM_ARMS, "cuda", 0)

    params = BanditParams(arms=50, agents=64, trials=32, steps_per_agent=128, share_every=16,
                          differentiation=differentiation, seed=3)
    cpu = run(BanditExperiment(params, Backend("numba", "cpu"))).state
    gpu = run(BanditExperiment(params, Backend("torch", "cuda"))).state
    # +, -, *, / and floor are IEEE-exact on CUDA too, and the random words are integer
    # hashes: the runs agree to the last bit unless a kernel fuses a multiply-add.
    np.testing.assert_array_equal(host(gpu.n), host(cpu.n))
    np.testing.assert_allclose(host(gpu.q), host(cpu.q), rtol=0, atol=1e-12)


def test_dqn_learner_on_cuda_trains_saves_and_resumes_on_the_cpu(tmp_path):
    """The DQN learner on the GPU (networks, Adam, replay); its run file continues on
    the CPU, and its written-out gradient agrees with autograd there."""
    import json

    import torch
    from typer.testing import CliRunner

    from popplay.checkpoints.validation import load_run
    from popplay.cli.main import app
    from popplay.deep.agents import dqn, networks
    from popplay.deep.agents.replay import Batch

    agent = dqn.DoubleDQN(dqn.DQNConfig(hidden=(32, 32)), obs_dim=3, actions=2, seed=0, device="cuda")
    batch = Batch(torch.randn(16, 3), torch.randint(2, (16,)), torch.randn(16), torch.randn(16, 3),
                  torch.zeros(16))
    on_gpu = Batch(*(t.cuda() for t in batch))
    grad, _ = dqn.double_dqn_gradient(on_gpu, agent._online, agent._target, 0.99)
    loss = dqn.dqn_loss(on_gpu, agent.online, dqn.double_dqn_targets(on_gpu, agent.online, agent.target, 0.99))
    loss.backward()
    torch.testing.assert_close(grad, networks.flat_gradients(agent.online), rtol=1e-4, atol=1e-5)

    out = tmp_path / "gpu.h5"
    tiny = ["--hidden", "16", "--learning-starts", "16", "--update-ratio", "1", "--batch-size", "8",
            "--eval-episodes", "3", "--json"]
    result = CliRunner().invoke(app, ["train", "dqn", "--device", "cuda", "--episodes", "6", "--out", str(out),
                                      *tiny], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["device"] == "cuda" and summary["updates"] > 0
    stored = load_run(out)
    assert stored.config["device"] == "cuda" and stored.state["online.0.weight"].shape == (16, 4)
    # the stored weights are the GPU learner's: a CPU copy gives its Q values to rounding
    from popplay.core.backend import Backend
    from popplay.deep.topologies.dqn import DQNExperiment

    params = params_from_config("dqn", stored.config, run_options=False)
    on_cpu = DQNExperiment(params, Backend("torch", "cpu")).restore(stored.state, stored.state_counters)
    on_gpu = DQNExperiment(params, Backend("torch", "cuda")).restore(stored.state, stored.state_counters)
    obs = torch.randn(32, 4)
    torch.testing.assert_close(on_gpu.agent.q_values(obs), on_cpu.agent.q_values(obs), rtol=1e-4, atol=1e-5)
    assert on_gpu.agent.online[0].weight.is_cuda and on_gpu.agent.replay.obs.is_cuda
    result = CliRunner().invoke(app, ["train", "dqn", "--resume", str(out), "--device", "cpu", "--episodes", "9",
                                      "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["episodes"] == 9


def test_a_dqn_population_on_cuda_learns_and_its_member_matches_the_member_alone(tmp_path):
    """A DQN population on the GPU: member k equals member k alone there too (the batched
    products of one device), and the run file resumes on the CPU."""
    import torch
    from typer.testing import CliRunner

    from popplay.cli.main import app
    from popplay.deep.topologies.dqn import DQNParams, DQNPopulation

    params = DQNParams(agents=3, hidden=(16, 16), batch_size=8, replay_capacity=300, learning_starts=30,
                       phase_steps=40, eval_episodes=1, hp="lr=loguniform:1e-4:1e-2")
    backend = Backend("torch", "cuda")
    runs = []
    for members in (None, np.array([1])):
        experiment = DQNPopulation(params, backend, members=members)
        state = experiment.initial_state()
        for _ in range(3):
            state = experiment.phase(state, time_left=None)
        runs.append(state.learner.online.matrix)
    assert runs[0].is_cuda
    torch.testing.assert_close(runs[0][1], runs[1][0], rtol=1e-3, atol=1e-4)
    assert not torch.allclose(runs[0][0], runs[1][0], rtol=1e-3, atol=1e-4)  # another member is not
    out = tmp_path / "run.h5"
    flags = ["--agents", "3", "--hidden", "16,16", "--learning-starts", "30", "--eval-episodes", "1"]
    first = CliRunner().invoke(app, ["train", "dqn", *flags, "--device", "cuda", "--env-steps", "600",
                                     "--out", str(out)])
    assert first.exit_code == 0, first.output
    resumed = CliRunner().invoke(app, ["train", "dqn", "--resume", str(out), "--device", "cpu", "--env-steps", "900"])
    assert resumed.exit_code == 0, resumed.output


def test_cartpole_and_knights_on_cuda_match_the_cpu():
    from popplay.games.cartpole.experiment import CartPoleExperiment
    from popplay.games.cartpole.rules import CartPolePopulationParams
    from popplay.games.knights.experiment import KnightsExperiment
    from popplay.games.knights.rules import KnightsParams
    from popplay.training.loop import run

    params = CartPolePopulationParams(agents=32, trials=4, steps_per_agent=256, share_every=64, seed=2)
    cpu = run(CartPoleExperiment(params, Backend("numba", "cpu"))).state
    gpu = run(CartPoleExperiment(params, Backend("torch", "cuda"))).state
    np.testing.assert_allclose(host(gpu.q), host(cpu.q), rtol=0, atol=1e-9)
    knights = KnightsParams(agents=8, games_per_agent=8, episodes=3, max_turns=60)
    cpu_k = run(KnightsExperiment(knights, Backend("numba", "cpu"))).state
    gpu_k = run(KnightsExperiment(knights, Backend("torch", "cuda"))).state
    assert np.mean(host(cpu_k.score) == host(gpu_k.score)) > 0.8  # CUDA's exp may flip a near-tie now and then


@pytest.mark.parametrize("domain", ["bandit", "cartpole", "knights"])
def test_compiled_engines_on_cuda_agree_with_the_uncompiled(domain):
    """--compile on CUDA: one graph per step (fullgraph), the same population up to the
    compiler's reordering of floating point."""
    import popplay

    sizes = {"bandit": dict(arms=10, agents=64, trials=16, steps_per_agent=64, share_every=16),
             "cartpole": dict(agents=64, trials=4, steps_per_agent=128, share_every=64),
             "knights": dict(agents=8, games_per_agent=8, episodes=2, max_turns=60)}[domain]
    plain = popplay.train(domain, backend="torch", device="cuda", compile=False, **sizes).result.state
    compiled = popplay.train(domain, backend="torch", device="cuda", compile=True, **sizes).result.state
    for name in ("q", "n", "w1"):
        if hasattr(plain, name) and getattr(plain, name) is not None:
            np.testing.assert_allclose(host(getattr(compiled, name)), host(getattr(plain, name)), rtol=1e-6,
                                       atol=1e-9)


def test_knights_float32_on_cuda_plays_like_float64():
    import dataclasses

    from popplay.games.knights.experiment import KnightsExperiment
    from popplay.games.knights.rules import KnightsParams
    from popplay.training.loop import run

    params = KnightsParams(agents=8, games_per_agent=8, episodes=2, max_turns=60)
    f64 = run(KnightsExperiment(params, Backend("torch", "cuda"))).state
    f32 = run(KnightsExperiment(dataclasses.replace(params, dtype="float32"), Backend("torch", "cuda"))).state
    np.testing.assert_allclose(host(f32.w1), host(f64.w1), rtol=1e-3, atol=1e-4)
