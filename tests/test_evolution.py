"""Selection returns parent indices; variation acts by index; lineage records it all."""
import numpy as np
import pytest

from popplay.evolution import Lineage, gaussian_noise, replicate, select_replacements, vary_factors


def test_truncation_selection_copies_best_over_worst():
    scores = np.array([0.5, 0.9, 0.1, 0.7, 0.3, 0.2])
    parents, children = select_replacements(scores, 1 / 3)
    assert parents.tolist() == [1, 3] and children.tolist() == [2, 5]
    batched = np.stack([scores, scores[::-1]])
    parents, children = select_replacements(batched, 0.5)
    assert parents.shape == children.shape == (2, 3)
    assert parents[1].tolist() == [4, 2, 5] and children[1].tolist() == [3, 0, 1]


def test_selection_ties_nan_and_ineligible_agents():
    parents, children = select_replacements(np.array([1.0, 1.0, 0.0, 0.0]), 0.25)
    assert parents.tolist() == [0] and children.tolist() == [3]
    parents, children = select_replacements(np.array([np.nan, 0.5, 0.2, 0.9]), 0.25)
    assert parents.tolist() == [3] and children.tolist() == [0]
    parents, _ = select_replacements(np.array([0.9, 0.5, 0.2, 0.1]), 0.25, eligible=np.array([0, 1, 1, 1]))
    assert parents.tolist() == [1]
    for bad in (0.0, 0.6):
        with pytest.raises(ValueError):
            select_replacements(np.zeros(4), bad)


def test_replicate_copies_rows_by_index_and_leaves_the_input_alone():
    weights = np.arange(2 * 4 * 3, dtype=float).reshape(2, 4, 3)
    parents, children = np.array([[1], [3]]), np.array([[0], [2]])
    out = replicate(weights, parents, children)
    assert np.array_equal(out[0, 0], weights[0, 1]) and np.array_equal(out[1, 2], weights[1, 3])
    assert np.array_equal(out[0, 1:], weights[0, 1:]) and weights[0, 0, 0] == 0


def test_variation_is_reproducible_per_agent_id():
    a = vary_factors(7, 3, np.array([10, 11, 12]), ("alpha", "lam"), spread=1.5)
    b = vary_factors(7, 3, np.array([12]), ("alpha", "lam"), spread=1.5)
    assert a["alpha"][2] == b["alpha"][0]
    assert np.all((a["alpha"] >= 1 / 1.5) & (a["alpha"] <= 1.5)) and not np.allclose(a["alpha"], a["lam"])
    assert np.all(vary_factors(7, 3, np.array([1, 2]), ("alpha",), spread=1.0)["alpha"] == 1.0)
    noise = gaussian_noise(7, 3, np.arange(200), 50, std=0.1)
    assert noise.shape == (200, 50) and abs(noise.std() - 0.1) < 0.005
    assert np.array_equal(noise[5], gaussian_noise(7, 3, np.array([5]), 50, std=0.1)[0])


def test_lineage_tracks_ids_parents_and_round_trips():
    lineage = Lineage.start((4,), parameters=("alpha",))
    new = lineage.replace(1, np.array([2]), np.array([0]))
    assert new.tolist() == [4] and lineage.ids.tolist() == [4, 1, 2, 3]
    lineage.record(1, "mutation", 4, 2, 0, {"alpha": 0.05})
    arrays = lineage.to_arrays()
    assert arrays["parent"].tolist() == [-1, -1, -1, -1, 2, 2]
    assert np.isnan(arrays["alpha"][0]) and arrays["alpha"][-1] == 0.05
    again = Lineage.from_arrays(arrays, parameters=("alpha",))
    assert again.next_id == 5
    for name, values in again.to_arrays().items():
        np.testing.assert_array_equal(values, arrays[name])
