"""Gorila's pure pieces: the sharded AdaGrad server and the two guards (no processes)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from popplay.deep.agents import networks
from popplay.deep.agents.adagrad_shard import (AdaGradShard, adagrad_reference, adagrad_update_, gather, make_shards,
                                          shard_bounds)
from popplay.deep.topologies.gorila_guards import OutlierGuard, StalenessGuard


def _gradients(n: int, count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # Magnitudes spanning several decades, exact zeros and sign changes: the cases
    # where a fused or reordered kernel would round differently.
    out = []
    for i in range(count):
        v = torch.randn(n, generator=g) * 10.0 ** torch.randint(-4, 3, (n,), generator=g).float()
        v[torch.rand(n, generator=g) < 0.05] = 0.0
        out.append(v)
    return out


def test_shard_bounds_cover_the_vector_contiguously():
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_bounds(5, 5) == [(i, i + 1) for i in range(5)]
    for n, s in [(1, 1), (17, 4), (100, 7)]:
        b = shard_bounds(n, s)
        assert b[0][0] == 0 and b[-1][1] == n
        assert all(b[i][1] == b[i + 1][0] for i in range(s - 1))
        assert max(y - x for x, y in b) - min(y - x for x, y in b) <= 1
    with pytest.raises(ValueError):
        shard_bounds(3, 4)
    with pytest.raises(ValueError):
        shard_bounds(3, 0)


@pytest.mark.parametrize("shards", [2, 3, 5])
def test_sharded_server_is_bitwise_the_unsharded_one(shards):
    # A real Q-network's flat vector (4 -> 16 -> 16 -> 2: 386 values).
    net = networks.seeded_mlp(3, 4, 2, (16, 16))
    vector = networks.flat_parameters(net)
    grads = _gradients(vector.numel(), 40, seed=shards)
    whole = AdaGradShard.from_vector(vector, 0, vector.numel(), lr=0.01, initial_accumulator=0.1)
    parts = make_shards(vector, shards, lr=0.01, initial_accumulator=0.1)
    for grad in grads:
        whole.apply(grad)
        for shard in parts:  # each shard sees only its slice
            shard.apply(grad[shard.start:shard.stop].clone())
    params, acc = gather(parts)
    # Bitwise: AdaGrad is elementwise and built from separate correctly rounded
    # operations, so an element's result cannot depend on its slice.
    assert torch.equal(params, whole.params)
    assert torch.equal(acc, whole.accumulator)
    assert [s.version for s in parts] == [len(grads)] * shards
    assert not torch.equal(params, vector)  # something happened


def test_adagrad_matches_torch_and_a_plain_python_reference():
    vector = torch.linspace(-1, 1, 50)
    grads = _gradients(50, 25, seed=9)
    shard = AdaGradShard.from_vector(vector, 0, 50, lr=0.05, eps=1e-10)
    p = torch.nn.Parameter(vector.clone())
    opt = torch.optim.Adagrad([p], lr=0.05, eps=1e-10)
    for grad in grads:
        shard.apply(grad)
        p.grad = grad.clone()
        opt.step()
    # torch fuses multiply-adds: equal to rounding only.
    torch.testing.assert_close(shard.params, p.detach(), rtol=1e-5, atol=1e-6)
    ref_params, ref_acc = adagrad_reference(vector.numpy(), [g.numpy() for g in grads], lr=0.05, eps=1e-10)
    np.testing.assert_allclose(shard.params.numpy(), ref_params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(shard.accumulator.numpy(), ref_acc, rtol=1e-5)


def test_adagrad_rejects_mismatched_slices():
    shard = AdaGradShard.from_vector(torch.zeros(10), 2, 6, lr=0.1)
    with pytest.raises(ValueError, match="holds 4"):
        shard.apply(torch.zeros(5))
    with pytest.raises(ValueError):
        adagrad_update_(torch.zeros(3), torch.zeros(3), torch.zeros(4), 0.1, 0.0)
    with pytest.raises(ValueError):
        AdaGradShard.from_vector(torch.zeros(10), 8, 12, lr=0.1)


def test_staleness_guard_drops_exactly_the_old_gradients_and_counts_ages():
    guard = StalenessGuard(max_staleness=3)
    # (server version, gradient version) -> ages 0, 3, 4, 1, 9, 3
    cases = [(5, 5), (8, 5), (9, 5), (10, 9), (19, 10), (22, 19)]
    verdicts = [guard.admit(s, g) for s, g in cases]
    assert verdicts == [True, True, False, True, False, True]
    assert (guard.accepted, guard.discarded) == (4, 2)
    assert guard.histogram.tolist() == [1, 1, 0, 2, 2]  # ages 0..3, then "older than 3"
    with pytest.raises(ValueError, match="ahead"):
        guard.admit(3, 4)


def test_staleness_guard_of_zero_admits_only_fresh_gradients():
    guard = StalenessGuard(max_staleness=0)
    assert [guard.admit(s, 4) for s in (4, 5, 6)] == [True, False, False]
    assert guard.histogram.tolist() == [1, 2]


def _noisy_ones(n: int) -> list[float]:
    # A periodic wobble: no ordinary value is more than 1.3 standard deviations out, so
    # only the injected norms can cross a bar of k = 2.5.
    return [(0.9, 1.0, 1.1)[i % 3] for i in range(n)]


def test_outlier_guard_drops_exactly_the_injected_huge_norms():
    norms = _noisy_ones(60)
    for i in (3, 15, 40):  # 3 comes before min_samples: admitted, and it raises the bar
        norms[i] = 1e3
    norms[25] = math.nan
    guard = OutlierGuard(k=2.5, window=10, min_samples=5)
    dropped = [i for i, n in enumerate(norms) if not guard.admit(n)]
    # 5..12 still see index 3's 1e3 in their window, so nothing ordinary is dropped there.
    assert dropped == [15, 25, 40]
    assert (guard.accepted, guard.discarded) == (57, 3)
    assert math.nan not in guard.history and len(guard.history) == 10


@pytest.mark.parametrize("k, second_dropped", [(2.5, True), (4.0, False)])
def test_a_second_outlier_in_a_row_passes_only_when_k_exceeds_sqrt_of_window_minus_one(k, second_dropped):
    # Window 10: one outlier x among nine ones gives mean 0.1x + 0.9 and std 0.3(x - 1),
    # so the bar is x exactly at k = 3; below it the second x is dropped, above admitted.
    norms = [1.0] * 12 + [1e3, 1e3] + [1.0] * 3
    guard = OutlierGuard(k=k, window=10, min_samples=5)
    verdicts = [guard.admit(n) for n in norms]
    assert verdicts[12] is False
    assert verdicts[13] is (not second_dropped)
    assert all(verdicts[:12]) and all(verdicts[14:])


def test_outlier_guard_bound_is_mean_plus_k_std_of_the_window():
    guard = OutlierGuard(k=2.0, window=4, min_samples=4)
    for n in (1.0, 2.0, 3.0, 4.0):
        assert guard.admit(n)
    bound = 2.5 + 2.0 * math.sqrt(1.25)
    assert guard.bound() == pytest.approx(bound)
    assert not guard.admit(bound + 1e-9)
    assert list(guard.history) == [2.0, 3.0, 4.0, pytest.approx(bound + 1e-9)]  # discarded, still counted
    with pytest.raises(ValueError):
        OutlierGuard(window=5, min_samples=6)


def test_the_summary_line_counts_in_words() -> None:
    from popplay.deep.topologies.gorila import GorilaConfig, summary_text

    summary = {"quality": 9.5, "env": "CartPole-v1", "episodes": 3, "env_steps": 120, "seconds": 1.0,
               "gradients_applied": 7, "stale_discarded": 0, "outliers_discarded": 0, "staleness_histogram": [7],
               "out": "g.h5", "restarts": 1}
    line = summary_text(summary, GorilaConfig(actors=1, learners=1, shards=2))
    assert "(1 actor, 1 learner, 2 shards and 1 restart)" in line
