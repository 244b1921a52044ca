"""The torch engines on CUDA (skipped on machines without a GPU)."""
import numpy as np
import pytest

from popplay.populations.base import Backend, cuda_available

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU")]


@pytest.mark.parametrize("differentiation", ["none", "bias", "top2"])
def test_bandit_on_cuda_matches_numba(differentiation):
    from popplay.games.bandit import BanditParams
    from popplay.populations.bandit import BanditExperiment
    from popplay.runner import run

    params = BanditParams(arms=50, agents=64, trials=32, steps_per_agent=128, share_every=16,
                          differentiation=differentiation, seed=3)
    cpu = run(BanditExperiment(params, Backend("numba", "cpu"))).state
    gpu = run(BanditExperiment(params, Backend("torch", "cuda"))).state
    # +, -, *, / and floor are IEEE-exact on CUDA too, and the random words are integer
    # hashes: the runs agree to the last bit unless a kernel fuses a multiply-add.
    np.testing.assert_array_equal(gpu.n, cpu.n)
    np.testing.assert_allclose(gpu.q, cpu.q, rtol=0, atol=1e-12)
