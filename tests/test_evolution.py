"""Selection returns parent indices; variation acts by index; lineage records it all."""
import numpy as np
import pytest
import torch

from popplay.operators.evolution import (EVENTS, Lineage, add_at, gaussian_noise, initial_ids, multiply_at,
                               replacement_count, replicate, select_replacements, vary_factors)


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
    for bad in (0.0, 0.6, -0.1):
        with pytest.raises(ValueError):
            select_replacements(np.zeros(4), bad)


def test_ineligible_agents_are_never_parents_and_go_first():
    scores = np.array([0.9, 0.8, 0.1, 0.2, 0.3, 0.4])
    eligible = np.array([0, 0, 1, 1, 1, 1], dtype=bool)  # the two best have diverged
    parents, children = select_replacements(scores, 0.5, eligible)
    assert set(children.tolist()) >= {0, 1} and eligible[parents].all()
    assert not set(parents.tolist()) & set(children.tolist())
    # one eligible agent only: it is the parent of every copy
    parents, children = select_replacements(scores, 0.5, np.arange(6) == 3)
    assert parents.tolist() == [3, 3, 3] and 3 not in children
    # a row without any eligible agent copies nothing; the other row still selects
    rows = np.stack([scores, scores])
    parents, children = select_replacements(rows, 0.25, np.stack([np.zeros(6, bool), np.ones(6, bool)]))
    assert np.array_equal(parents[0], children[0]) and parents[1].tolist() == [0, 1]


def test_replacement_count_never_overlaps_parents_and_children():
    assert replacement_count(3, 0.5) == 1 and replacement_count(64, 0.25) == 16 and replacement_count(2, 0.01) == 1
    for agents in range(2, 12):
        parents, children = select_replacements(np.random.default_rng(agents).random(agents), 0.5)
        assert not set(parents.tolist()) & set(children.tolist())
    with pytest.raises(ValueError):
        replacement_count(1, 0.5)


def test_replicate_copies_rows_by_index_and_leaves_the_input_alone():
    weights = np.arange(2 * 4 * 3, dtype=float).reshape(2, 4, 3)
    parents, children = np.array([[1], [3]]), np.array([[0], [2]])
    out = replicate(weights, parents, children)
    assert np.array_equal(out[0, 0], weights[0, 1]) and np.array_equal(out[1, 2], weights[1, 3])
    assert np.array_equal(out[0, 1:], weights[0, 1:]) and weights[0, 0, 0] == 0
    same = replicate(weights.copy(), parents, children, out=None)
    np.testing.assert_array_equal(same, out)
    inplace = weights.copy()
    assert replicate(inplace, parents, children, out=inplace) is inplace and np.array_equal(inplace, out)
    tensor = replicate(torch.from_numpy(weights), parents, children)
    assert isinstance(tensor, torch.Tensor) and np.array_equal(tensor.numpy(), out)
    with pytest.raises(ValueError, match="leading axes"):
        replicate(weights[0], parents, children)


def test_variation_by_index_on_a_trials_by_agents_population():
    # a tabular population shaped (trials, agents, states), e.g. cart-pole's Q tables
    q = np.ones((2, 4, 5))
    epsilon = np.full((2, 4), 0.5)
    children = np.array([[0, 1], [3, 2]])
    noise = np.arange(2 * 2 * 5, dtype=float).reshape(2, 2, 5)
    noisy = add_at(q, children, noise)
    assert np.array_equal(noisy[1, 3], 1 + noise[1, 0]) and np.array_equal(noisy[0, 2], q[0, 2])
    scaled = multiply_at(epsilon, children, np.array([[4.0, 0.5], [1.0, 3.0]]), low=0.0, high=1.0)
    assert scaled.tolist() == [[1.0, 0.25, 0.5, 0.5], [0.5, 0.5, 1.0, 0.5]]
    assert epsilon[0, 0] == 0.5  # a copy unless out= is given
    t = multiply_at(torch.from_numpy(epsilon), children, np.full((2, 2), 0.5))
    assert t[1, 3].item() == 0.25


def test_variation_is_reproducible_per_agent_id():
    a = vary_factors(7, 3, np.array([10, 11, 12]), ("alpha", "lam"), spread=1.5)
    b = vary_factors(7, 3, np.array([12]), ("alpha", "lam"), spread=1.5)
    assert a["alpha"][2] == b["alpha"][0]
    assert np.all((a["alpha"] >= 1 / 1.5) & (a["alpha"] <= 1.5)) and not np.allclose(a["alpha"], a["lam"])
    assert np.all(vary_factors(7, 3, np.array([1, 2]), ("alpha",), spread=1.0)["alpha"] == 1.0)
    grid = vary_factors(7, 3, np.array([[10, 11], [12, 13]]), ("alpha",), spread=1.5)["alpha"]
    assert grid.shape == (2, 2) and grid[1, 0] == a["alpha"][2]
    many = np.log(vary_factors(1, 0, np.arange(4000), ("x",), spread=2.0)["x"]) / np.log(2.0)
    assert abs(many.mean()) < 0.05 and abs(many.var() - 1 / 3) < 0.03  # log-uniform on [-1, 1]
    noise = gaussian_noise(7, 3, np.arange(200), 50, std=0.1)
    assert noise.shape == (200, 50) and abs(noise.std() - 0.1) < 0.005
    assert np.array_equal(noise[5], gaussian_noise(7, 3, np.array([5]), 50, std=0.1)[0])
    assert not np.array_equal(noise[5], gaussian_noise(7, 4, np.array([5]), 50, std=0.1)[0])
    assert not gaussian_noise(7, 3, np.arange(3), 4, std=0.0).any()
    with pytest.raises(ValueError):
        vary_factors(7, 3, np.arange(3), ("alpha",), spread=0.5)


def test_lineage_tracks_ids_parents_and_round_trips():
    ids = initial_ids((4,))
    lineage = Lineage.start(ids, parameters=("alpha",), values={"alpha": np.full(4, 0.1)})
    ids, child_ids = lineage.replace(1, ids, np.array([2]), np.array([0]), values={"alpha": [0.1]})
    assert child_ids.tolist() == [4] and ids.tolist() == [4, 1, 2, 3]
    lineage.record(1, "mutation", 4, parents=2, slots=0, values={"alpha": 0.05})
    arrays = lineage.to_arrays()
    assert arrays["parent"].tolist() == [-1, -1, -1, -1, 2, 2]
    assert arrays["replaced"].tolist() == [-1, -1, -1, -1, 0, -1]
    assert arrays["event"].tolist() == [EVENTS["initial"]] * 4 + [EVENTS["copy"], EVENTS["mutation"]]
    assert arrays["alpha"][0] == 0.1 and arrays["alpha"][-1] == 0.05
    again = Lineage.from_arrays(arrays, parameters=("alpha",))
    assert again.next_id == 5 and len(again) == 6
    for name, values in again.to_arrays().items():
        np.testing.assert_array_equal(values, arrays[name])
    with pytest.raises(ValueError, match="lengths"):
        Lineage.from_arrays({**arrays, "slot": arrays["slot"][:-1]}, parameters=("alpha",))
    with pytest.raises(ValueError, match="alpha"):
        Lineage.from_arrays({k: v for k, v in arrays.items() if k != "alpha"}, parameters=("alpha",))


def test_lineage_of_batched_populations_and_family_trees():
    ids = initial_ids((2, 3))  # 2 trials x 3 agents: ids 0..5
    lineage = Lineage.start(ids)
    parents = np.array([[0], [2]])
    children = np.array([[2], [2]])  # trial 1: parent == child, nothing to copy
    ids, child_ids = lineage.replace(1, ids, parents, children)
    assert ids.tolist() == [[0, 1, 6], [3, 4, 5]] and child_ids.tolist() == [[6], [5]]
    records = lineage.records
    assert records["group"][-1] == 0 and records["slot"][-1] == 2 and records["replaced"][-1] == 2
    for generation in range(2, 40):  # a long chain: buffers grow, ancestry stays exact
        ids, _ = lineage.replace(generation, ids, np.array([[2], [0]]), np.array([[1], [1]]))
    assert len(lineage) == 6 + 1 + 2 * 38
    nodes = {n.agent: n for n in lineage.family(ids.reshape(-1))}
    assert set(ids.reshape(-1).tolist()) <= set(nodes)
    assert all(n.alive == (n.agent in ids) for n in nodes.values())
    assert 2 not in nodes and 4 not in nodes  # lines that died out are not in the family tree
    agent = int(ids[0, 1])
    while nodes[agent].parent >= 0:  # trial 0: every copy descends from founder 0
        agent = nodes[agent].parent
    assert agent == 0 and nodes[0].event == "initial"
    everyone = lineage.family(ids.reshape(-1), everyone=True)
    assert len(everyone) == lineage.next_id


def test_group_wide_records_round_trip_and_stay_out_of_family_trees():
    ids = initial_ids((2, 2))
    lineage = Lineage.start(ids)
    lineage.record(3, "share", np.full(2, -1), groups=np.arange(2), slots=-1)  # one share per trial
    again = Lineage.from_arrays(lineage.to_arrays())
    assert again.records["event"][-2:].tolist() == [EVENTS["share"]] * 2
    assert [n.agent for n in again.family(ids.reshape(-1))] == [0, 1, 2, 3]
