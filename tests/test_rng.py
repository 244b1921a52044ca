"""The counter-based random streams: identical bits everywhere, right distributions."""
import math
from statistics import NormalDist

import numba
import numpy as np
import pytest
import torch

from popplay import rng
from popplay.xp import nb, npx, py, th

R_NB, R_TH, R_PY = rng.make_rng(nb), rng.make_rng(th), rng.make_rng(py)
_draw_nb, _mix_nb, _normal_nb = R_NB.draw, R_NB.mix_counter, R_NB.normal


@numba.njit(cache=True)
def _stream_nb(key, n, words, normals):
    for i in range(n):
        words[i] = _draw_nb(key, _mix_nb(i))
        normals[i] = _normal_nb(key, i, words[i])


def _stream(key: int, n: int):
    words, normals = np.empty(n, np.int64), np.empty(n)
    _stream_nb(key, n, words, normals)
    return words, normals


def test_mix64_matches_splitmix64_finaliser_on_known_values():
    # SplitMix64 seeded with 0 yields 0xE220A8397B1DCDAF first: mix64(0 + golden).
    assert R_PY.mix64(rng.signed64(rng.GOLDEN)) == rng.signed64(0xE220A8397B1DCDAF)
    assert R_PY.mix_counter(0) == rng.signed64(0xE220A8397B1DCDAF)


def test_words_and_normals_identical_on_numba_torch_and_python():
    key = rng.key_path(7, 3, 11)
    words, normals = _stream(key, 50_000)
    counters = torch.arange(50_000, dtype=torch.int64)
    t_words = R_TH.draw(torch.tensor(key), R_TH.mix_counter(counters))
    t_normals = R_TH.normal(torch.tensor(key), counters, t_words)
    assert np.array_equal(t_words.numpy(), words)
    assert np.array_equal(t_normals.numpy(), normals)
    # NumPy twin (set-up work without torch), tail and wedge lanes included.
    r_np = rng.make_rng(npx)
    n_counters = np.arange(50_000, dtype=np.int64)
    n_words = r_np.draw(np.int64(key), r_np.mix_counter(n_counters))
    assert np.array_equal(n_words, words)
    assert np.array_equal(r_np.normal(np.int64(key), n_counters, n_words), normals)
    assert (np.abs(normals) > rng._ZIG_R).any()  # the tail was exercised
    p_words = [R_PY.draw(key, R_PY.mix_counter(i)) for i in range(3000)]
    assert p_words == words[:3000].tolist()
    assert [R_PY.normal(key, i, w) for i, w in enumerate(p_words)] == normals[:3000].tolist()


def test_numba_hash_is_not_folded_for_loop_counters():
    # numba's signed int ops carry "no signed wrap"; a loop with a known range once
    # let LLVM fold the whole hash to a constant. Every counter must give its own word.
    words, _ = _stream(5, 64)
    assert len(set(words.tolist())) == 64
    assert words.tolist() == [R_PY.draw(5, R_PY.mix_counter(i)) for i in range(64)]


def test_normals_pass_distribution_checks():
    from scipy import stats

    _, z = _stream(rng.key_path(1, 2), 400_000)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert abs(z.var() - 1) < 0.01
    # the tail beyond the ziggurat's base (r = 3.654) has its own sampler
    tail = 2 * stats.norm.sf(3.6541528853610088) * z.size
    observed = (np.abs(z) > 3.6541528853610088).sum()
    assert abs(observed - tail) < 5 * math.sqrt(tail)


def test_uniforms_cover_unit_interval_evenly():
    words, _ = _stream(99, 100_000)
    for convert in (R_TH.uniform53, R_TH.uniform_hi32, R_TH.uniform_lo32):
        u = convert(torch.from_numpy(words)).numpy()
        assert u.min() >= 0.0 and u.max() < 1.0
        counts, _ = np.histogram(u, bins=20, range=(0, 1))
        assert counts.min() > 0.9 * u.size / 20 and counts.max() < 1.1 * u.size / 20


def test_elementary_log_and_exp_are_accurate():
    e = rng.make_elementary(py)
    for x in np.exp(np.linspace(-40, 5, 2001)):
        assert e.log(float(x)) == pytest.approx(math.log(x), rel=4e-16, abs=4e-16)
    for x in np.linspace(-30, 5, 2001):
        assert e.exp(float(x)) == pytest.approx(math.exp(x), rel=4e-16)


def test_ziggurat_tables_are_consistent():
    x, f = rng._ZIG_X, rng._ZIG_F
    assert x[1] == rng._ZIG_R and x[256] == 0.0
    assert np.all(np.diff(x[1:]) < 0)
    # every layer has the same area v
    areas = x[1:256] * (f[2:257] - f[1:256])
    np.testing.assert_allclose(areas, rng._ZIG_V, rtol=1e-9)
    assert NormalDist().pdf(0) > 0  # sanity of the comparison library


def test_stream_keys_depend_only_on_indices():
    full = rng.stream_keys(3, rng.TAG_AGENT, np.arange(4), np.arange(6))
    part = rng.stream_keys(3, rng.TAG_AGENT, [2, 3], [5, 1])
    assert part[0, 0] == full[2, 5] and part[1, 1] == full[3, 1]
    assert len(set(full.ravel().tolist())) == full.size
    assert not np.array_equal(rng.stream_keys(4, rng.TAG_AGENT, np.arange(4), np.arange(6)), full)
    assert not np.array_equal(rng.stream_keys(3, rng.TAG_ENVIRONMENT, np.arange(4), np.arange(6)), full)
