"""share_weighted (equations (5)–(8)) and differentiate ((9)–(10)) over batched arrays."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from popplay import rng
from popplay.operators.sharing import differentiate, share_weighted
from tests.reference import cartpole as ref


def _random(shape, seed=0):
    g = np.random.default_rng(seed)
    return g.normal(size=shape), g.uniform(0.0, 3.0, size=shape)


@pytest.mark.parametrize("shape", [(1, 1, 5), (2, 7, 72), (3, 64, 9), (2, 33, 17), (2, 1, 3, 5, 4)])
def test_share_weighted_is_the_weighted_mean_in_the_reference_tree_order(shape):
    values, weights = _random(shape)
    new_values, new_weights = share_weighted(values, weights, 0.25)
    flat_v = values.reshape(-1, *shape[-2:])
    flat_w = weights.reshape(flat_v.shape)
    expected = np.array([[ref.tree_sum(list(v[:, j] * w[:, j])) / ref.tree_sum(list(w[:, j]))
                          for j in range(shape[-1])] for v, w in zip(flat_v, flat_w)])
    out = new_values.reshape(flat_v.shape)
    for i in range(shape[-2]):
        np.testing.assert_array_equal(out[:, i, :], expected)  # exact: same sums, same order
    np.testing.assert_allclose(expected, (flat_v * flat_w).sum(1) / flat_w.sum(1), rtol=1e-13)
    assert new_weights.shape == shape and (new_weights == 0.25).all()


def test_share_weighted_torch_is_bit_identical_and_inputs_are_untouched():
    values, weights = _random((3, 45, 72), seed=1)
    keep_v, keep_w = values.copy(), weights.copy()
    nv, nw = share_weighted(values, weights, 0.5)
    tv, tw = share_weighted(torch.from_numpy(values), torch.from_numpy(weights), 0.5)
    assert isinstance(tv, torch.Tensor) and isinstance(tw, torch.Tensor)
    np.testing.assert_array_equal(tv.numpy(), nv)
    np.testing.assert_array_equal(tw.numpy(), nw)
    np.testing.assert_array_equal(values, keep_v)
    np.testing.assert_array_equal(weights, keep_w)


def test_share_weighted_favours_heavier_agents_and_falls_back_to_the_plain_mean():
    values = np.array([[[1.0, 4.0], [3.0, 8.0]]])
    weights = np.array([[[3.0, 0.0], [1.0, 0.0]]])
    out, _ = share_weighted(values, weights, 0.0)
    np.testing.assert_array_equal(out[0, :, 0], [1.5, 1.5])  # (3·1 + 1·3) / 4
    np.testing.assert_array_equal(out[0, :, 1], [6.0, 6.0])  # no weight anywhere: plain mean
    out_t, _ = share_weighted(torch.from_numpy(values), torch.from_numpy(weights), 0.0)
    np.testing.assert_array_equal(out_t.numpy(), out)


def test_share_weighted_rejects_bad_input():
    v, w = _random((2, 3, 4))
    with pytest.raises(ValueError, match="non-negative"):
        share_weighted(v, -w, 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        share_weighted(torch.from_numpy(v), torch.from_numpy(-w), 1.0)
    with pytest.raises(ValueError, match="initial_weight"):
        share_weighted(v, w, -1.0)
    with pytest.raises(ValueError, match="same shape"):
        share_weighted(v, w[:, :2], 1.0)
    with pytest.raises(TypeError):
        share_weighted(v, torch.from_numpy(w), 1.0)
    with pytest.raises(ValueError, match="two axes"):
        share_weighted(v[0, 0], w[0, 0], 1.0)


def test_differentiate_draws_bounded_layout_free_biases():
    keys = rng.stream_keys(7, 17, np.arange(3), np.arange(5))
    values = np.zeros((3, 5, 72))
    out, nxt = differentiate(values, 0.2, keys, counter=144, bias_decay=2.0)
    assert nxt == 0.1
    assert np.abs(out).max() <= 0.2 and np.abs(out).max() > 0.15
    assert abs(out.mean()) < 0.02 and len(np.unique(out)) == out.size
    # The bias of (trial, agent, item) depends only on its stream and counter.
    part, _ = differentiate(values[1:, 2:4], 0.2, keys[1:, 2:4], counter=144)
    np.testing.assert_array_equal(part, out[1:, 2:4])
    later, _ = differentiate(values[:, :, :10], 0.2, keys, counter=144 + 31)
    np.testing.assert_array_equal(later[..., :10], out[..., 62:])
    # Equation (9) by hand for two entries: the high and low halves of one word.
    w = ref.word(keys[2, 4], 144 + 2)
    assert out[2, 4, 4] == (2.0 * (((w >> 32) & 0xFFFFFFFF) / 2.0**32) - 1.0) * 0.2
    assert out[2, 4, 5] == (2.0 * ((w & 0xFFFFFFFF) / 2.0**32) - 1.0) * 0.2
    again, _ = differentiate(values + 1.0, 0.2, keys, counter=144)
    np.testing.assert_array_equal(again, 1.0 + out)


def test_differentiate_torch_is_bit_identical():
    keys = rng.stream_keys(1, 17, np.arange(2), np.arange(6))
    values = np.random.default_rng(0).normal(size=(2, 6, 72))
    out, _ = differentiate(values, 0.05, keys, 72)
    out_t, nxt = differentiate(torch.from_numpy(values), 0.05, torch.from_numpy(keys), 72, 1.5)
    odd, _ = differentiate(values[..., :5], 0.05, keys, 72)  # an odd number of items
    np.testing.assert_array_equal(odd, out[..., :5])
    np.testing.assert_array_equal(out_t.numpy(), out)
    assert nxt == 0.05 / 1.5


def test_differentiate_rejects_bad_input():
    keys = rng.stream_keys(1, 17, np.arange(2))
    values = np.zeros((2, 3))
    with pytest.raises(ValueError, match="max_bias"):
        differentiate(values, -0.1, keys, 0)
    with pytest.raises(ValueError, match="keys"):
        differentiate(values, 0.1, keys[:1], 0)
    with pytest.raises(ValueError, match="counter"):
        differentiate(values, 0.1, keys, -1)
    with pytest.raises(TypeError):
        differentiate(values, 0.1, torch.from_numpy(keys), 0)
