"""share_counts: Bell's equations (1)-(4) over the agent axis."""
import numpy as np
import pytest
import torch

from popplay.operators.sharing import share_counts


def _reference_share(values, counts):
    """Equations (1)-(4) with Python loops over one (agents, arms) block."""
    agents, arms = len(values), len(values[0])
    out_q = [[0.0] * arms for _ in range(agents)]
    out_n = [[0.0] * arms for _ in range(agents)]
    for j in range(arms):
        n_total = sum(counts[i][j] for i in range(agents))
        if n_total > 0:
            q_total = sum(counts[i][j] * values[i][j] for i in range(agents)) / n_total
        else:
            q_total = sum(values[i][j] for i in range(agents)) / agents
        for i in range(agents):
            out_q[i][j] = q_total
            out_n[i][j] = n_total / agents
    return np.array(out_q), np.array(out_n)


def test_hand_computed_example():
    values = np.array([[1.0, 4.0], [3.0, 0.0]])
    counts = np.array([[1.0, 0.0], [3.0, 0.0]])
    q, n = share_counts(values, counts)
    assert q.tolist() == [[2.5, 2.0], [2.5, 2.0]]  # (1·1 + 3·3)/4; no pulls: plain mean
    assert n.tolist() == [[2.0, 0.0], [2.0, 0.0]]


def test_matches_reference_and_preserves_total_counts():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, 4, 6, 5))
    counts = rng.integers(0, 5, size=values.shape).astype(float)
    q, n = share_counts(values, counts)
    for index in np.ndindex(values.shape[:2]):
        q_ref, n_ref = _reference_share(values[index].tolist(), counts[index].tolist())
        np.testing.assert_allclose(q[index], q_ref, rtol=1e-13)
        np.testing.assert_allclose(n[index], n_ref, rtol=1e-13)
    np.testing.assert_allclose(n.sum(axis=-2), counts.sum(axis=-2))
    assert np.all(q == q[..., :1, :])  # every agent holds the block estimate


def test_torch_and_numpy_agree_and_inputs_are_untouched():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(8, 7))
    counts = rng.integers(0, 3, size=(8, 7)).astype(float)
    keep = values.copy(), counts.copy()
    q, n = share_counts(values, counts)
    tq, tn = share_counts(torch.from_numpy(values), torch.from_numpy(counts))
    assert isinstance(tq, torch.Tensor)
    np.testing.assert_allclose(tq.numpy(), q, rtol=1e-13)
    np.testing.assert_allclose(tn.numpy(), n, rtol=1e-13)
    assert np.array_equal(values, keep[0]) and np.array_equal(counts, keep[1])


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="same shape"):
        share_counts(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="non-negative"):
        share_counts(np.zeros((2, 3)), -np.ones((2, 3)))
    with pytest.raises(ValueError, match="two axes"):
        share_counts(np.zeros(3), np.zeros(3))
    with pytest.raises(TypeError):
        share_counts(np.zeros((2, 3)), torch.zeros(2, 3))
