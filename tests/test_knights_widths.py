"""Knights agents of their own width in each hidden layer (--start-width, --mutate-width,
--start-width2, --mutate-width2): switched-off units
leave the network's value alone, never learn on either engine, and copies narrow or widen
exactly where their streams say, recorded in the lineage and resumed bit for bit."""
import dataclasses
import json

import h5py
import numpy as np
import pytest

from popplay.cli.main import main
from popplay.core.backend import Backend
from popplay.games.knights import rules as game
from popplay.games.knights.experiment import KnightsExperiment
from popplay.games.knights.rules import KnightsParams
from popplay.operators import evolution as evo

NUMBA, TORCH = Backend("numba", "cpu"), Backend("torch", "cpu")
NARROW = KnightsParams(rows=4, cols=5, pieces=3, max_turns=40, agents=4, games_per_agent=4, episodes=4, hidden=6,
                       start_width=2, eval_every=4, eval_games=4, snapshot_every=0, seed=5)


def _episodes(params, backend, n, state=None):
    experiment = KnightsExperiment(params, backend)
    state = experiment.initial_state() if state is None else state
    for _ in range(n):
        state = experiment.phase(state, time_left=None)
    return experiment, state


@pytest.mark.parametrize("hidden2", [0, 3])
def test_unit_parameters_are_exactly_the_weights_into_and_out_of_a_unit(hidden2):
    inputs, hidden = 2, 3
    count = game.parameter_count(inputs, hidden, hidden2)
    nets = game.unpack(np.arange(1.0, count + 1.0)[None, :], inputs, hidden, hidden2)
    units = np.array([[False, True, False]])
    mask = game.unit_parameters(units, inputs, hidden2)[0]
    # by hand, in pack's order: w1 column 1, b1[1], and the unit's outgoing weights
    expected = {float(v) for v in nets.w1[0, :, 1]} | {float(nets.b1[0, 1])}
    expected |= {float(v) for v in (nets.wm[0, 1, :] if hidden2 else [nets.w2[0, 1]])}
    assert set(game.pack(nets)[0][mask].tolist()) == expected and mask.sum() == len(expected)
    incoming = game.unit_parameters(units, inputs, hidden2, incoming_only=True)[0]
    assert set(game.pack(nets)[0][incoming].tolist()) == {float(v) for v in nets.w1[0, :, 1]} | {float(nets.b1[0, 1])}


@pytest.mark.parametrize("hidden2", [0, 3])
def test_a_network_with_units_off_values_boards_as_the_narrower_network(hidden2):
    params = KnightsParams(rows=4, cols=5, pieces=3, hidden=5, hidden2=hidden2, init_scale=0.5)
    nets = game.init_networks(1, np.arange(1), params.inputs, 5, 0.5, hidden2)
    flat = game.with_widths(game.pack(nets), np.array([2]), params.inputs, 5, hidden2)
    wide = game.unpack(flat, params.inputs, 5, hidden2)
    assert game.unit_widths(wide).tolist() == [2] and game.off_units(wide)[0].tolist() == [False] * 2 + [True] * 3
    narrow = game.Network(wide.w1[0, :, :2], wide.b1[0, :2], wide.w2[0] if hidden2 else wide.w2[0, :2],
                          np.asarray(wide.b2[0]), *((wide.wm[0, :2], wide.bm[0]) if hidden2 else ()))
    board = game.start_position(9, params.rows, params.cols, params.pieces)
    for player in (1, -1):
        assert game.value(wide.agent(0), board, player) == pytest.approx(game.value(narrow, board, player),
                                                                          rel=1e-14)
    assert game.value(game.unpack(game.pack(nets), params.inputs, 5, hidden2).agent(0), board, 1) != \
        pytest.approx(game.value(narrow, board, 1), rel=1e-6)  # the units switched off did matter


@pytest.mark.parametrize("backend", [NUMBA, TORCH], ids=["numba", "torch"])
def test_switched_off_units_never_learn_on_either_engine(backend):
    _, state = _episodes(NARROW, backend, 4)
    assert game.unit_widths(state.networks).tolist() == [2] * 4
    assert (state.w1[:, :, 2:] == 0).all() and (state.b1[:, 2:] == 0).all() and (state.w2[:, 2:] == 0).all()
    _, first = _episodes(NARROW, backend, 1)
    assert not np.array_equal(state.w1[:, :, :2], first.w1[:, :, :2])  # the units on did learn


def test_both_engines_learn_the_same_narrow_population():
    _, a = _episodes(NARROW, NUMBA, 3)
    _, b = _episodes(NARROW, TORCH, 3)
    assert a.turns == b.turns and np.array_equal(a.score, b.score)
    np.testing.assert_allclose(b.w1, a.w1, rtol=1e-9, atol=1e-12)
    assert (b.w1[:, :, 2:] == 0).all()


def test_copies_narrow_or_widen_where_their_streams_say_and_widening_keeps_their_play():
    params = dataclasses.replace(NARROW, agents=6, hidden=8, start_width=4, replicate_every=2,
                                 replicate_fraction=0.5, mutate_width=1.0, mutate_weights=0.0, mutate_params=1.0,
                                 tournament_games=0, seed=8)
    experiment, before = _episodes(dataclasses.replace(params, replicate_every=0), NUMBA, 2)
    _, after = _episodes(params, NUMBA, 2)
    copies = after.lineage.records["event"] == evo.EVENTS["copy"]
    children = after.lineage.records["slot"][copies]
    parents_ids = after.lineage.records["parent"][copies]
    parents = np.array([np.flatnonzero(before.agent_id == i)[0] for i in parents_ids])
    child_ids = after.agent_id[children]
    expected = evo.width_changes(params.seed, 2, child_ids, 1.0, np.full(len(children), 4), 8)
    widths = game.unit_widths(after.networks)
    assert widths[children].tolist() == expected.tolist() and set(expected.tolist()) <= {2, 8}
    assert len(set(expected.tolist())) == 2  # both directions occur in this draw
    survivors = np.setdiff1d(np.arange(6), children)
    assert (widths[survivors] == 4).all()
    mutations = after.lineage.records["event"] == evo.EVENTS["mutation"]
    np.testing.assert_array_equal(after.lineage.records["width"][mutations], expected)
    assert (after.lineage.records["width"][copies] == 4).all()  # a copy is recorded at its parent's width first
    board = game.start_position(3, params.rows, params.cols, params.pieces)
    for child, parent, width in zip(children, parents, expected):
        child_net, parent_net = after.networks.agent(int(child)), before.networks.agent(int(parent))
        if width == 8:  # widened: new input weights, zero output weights, the parent's values
            assert (child_net.w1[:, 4:] != 0).all() and (child_net.w2[4:] == 0).all()
            np.testing.assert_array_equal(child_net.w1[:, :4], parent_net.w1[:, :4])
            assert game.value(child_net, board, 1) == pytest.approx(game.value(parent_net, board, 1), rel=1e-14)
        else:  # narrowed: its last two units off
            assert (child_net.w1[:, 2:] == 0).all() and (child_net.w2[2:] == 0).all()
            np.testing.assert_array_equal(child_net.w2[:2], parent_net.w2[:2])


def test_weight_noise_never_switches_a_unit_back_on():
    params = dataclasses.replace(NARROW, agents=6, replicate_every=2, replicate_fraction=0.5, mutate_weights=0.05,
                                 mutate_width=0.5, tournament_games=0)
    experiment, state = _episodes(params, NUMBA, 4)
    widths = game.unit_widths(state.networks)
    metrics = experiment.measure(state)  # what the curves and the console show
    assert (metrics["width_mean"], metrics["width_max"]) == (widths.mean(), widths.max())
    events = state.lineage.records
    latest = {int(a): int(w) for a, w in zip(events["agent"], events["width"])}  # the last record of each agent
    assert widths.tolist() == [latest[int(a)] for a in state.agent_id]
    assert widths.tolist() != [2] * 6  # some copy changed its width


def test_width_options_are_checked(capsys):
    code = main(["train", "knights", "--hidden", "4", "--start-width", "5", "--episodes", "1"])
    assert code == 2 and "start" in capsys.readouterr().err
    code = main(["train", "knights", "--mutate-width", "1.5", "--episodes", "1"])
    assert code == 2 and "mutate-width" in capsys.readouterr().err


# The second hidden layer (--hidden2) has widths of its own: --start-width2, --mutate-width2.
NARROW2 = dataclasses.replace(NARROW, hidden=4, start_width=0, hidden2=6, start_width2=2)


def test_second_layer_unit_parameters_are_exactly_the_weights_into_and_out_of_a_unit():
    inputs, hidden, hidden2 = 2, 3, 4
    count = game.parameter_count(inputs, hidden, hidden2)
    nets = game.unpack(np.arange(1.0, count + 1.0)[None, :], inputs, hidden, hidden2)
    units2 = np.array([[False, False, True, False]])
    mask = game.unit_parameters2(units2, inputs, hidden)[0]
    # by hand: wm column 2, bm[2] and w2[2]
    incoming = {float(v) for v in nets.wm[0, :, 2]} | {float(nets.bm[0, 2])}
    expected = incoming | {float(nets.w2[0, 2])}
    assert set(game.pack(nets)[0][mask].tolist()) == expected and mask.sum() == len(expected)
    only_in = game.unit_parameters2(units2, inputs, hidden, incoming_only=True)[0]
    assert set(game.pack(nets)[0][only_in].tolist()) == incoming and only_in.sum() == len(incoming)


def test_a_network_with_second_layer_units_off_values_boards_as_the_narrower_network():
    params = KnightsParams(rows=4, cols=5, pieces=3, hidden=3, hidden2=5, init_scale=0.5)
    nets = game.init_networks(1, np.arange(1), params.inputs, 3, 0.5, 5)
    flat = game.with_widths(game.pack(nets), np.array([3]), params.inputs, 3, 5, np.array([2]))
    wide = game.unpack(flat, params.inputs, 3, 5)
    assert game.unit_widths(wide).tolist() == [3] and game.unit_widths2(wide).tolist() == [2]
    assert game.off_units2(wide)[0].tolist() == [False] * 2 + [True] * 3 and not game.off_units(wide).any()
    narrow = game.Network(wide.w1[0], wide.b1[0], wide.w2[0, :2], np.asarray(wide.b2[0]), wide.wm[0, :, :2],
                          wide.bm[0, :2])
    board = game.start_position(9, params.rows, params.cols, params.pieces)
    for player in (1, -1):
        assert game.value(wide.agent(0), board, player) == pytest.approx(game.value(narrow, board, player),
                                                                          rel=1e-14)
    assert game.value(nets.agent(0), board, 1) != pytest.approx(game.value(narrow, board, 1), rel=1e-6)
    assert game.unit_widths2(nets).tolist() == [5]  # before: every unit on


@pytest.mark.parametrize("backend", [NUMBA, TORCH], ids=["numba", "torch"])
def test_switched_off_second_layer_units_never_learn_on_either_engine(backend):
    _, state = _episodes(NARROW2, backend, 4)
    nets = state.networks
    assert game.unit_widths2(nets).tolist() == [2] * 4 and game.unit_widths(nets).tolist() == [4] * 4
    assert (nets.wm[:, :, 2:] == 0).all() and (nets.bm[:, 2:] == 0).all() and (nets.w2[:, 2:] == 0).all()
    _, first = _episodes(NARROW2, backend, 1)
    assert not np.array_equal(nets.wm[:, :, :2], first.networks.wm[:, :, :2])  # the units on did learn


def test_both_engines_learn_the_same_population_narrow_in_its_second_layer():
    _, a = _episodes(NARROW2, NUMBA, 3)
    _, b = _episodes(NARROW2, TORCH, 3)
    assert a.turns == b.turns and np.array_equal(a.score, b.score)
    np.testing.assert_allclose(b.networks.wm, a.networks.wm, rtol=1e-9, atol=1e-12)
    assert (b.networks.wm[:, :, 2:] == 0).all()


def test_copies_change_their_second_layer_where_its_own_stream_says():
    params = dataclasses.replace(NARROW2, agents=6, hidden2=8, start_width2=4, replicate_every=2,
                                 replicate_fraction=0.5, mutate_width2=1.0, mutate_weights=0.0, tournament_games=0,
                                 seed=8)
    _, before = _episodes(dataclasses.replace(params, replicate_every=0), NUMBA, 2)
    _, after = _episodes(params, NUMBA, 2)
    records = after.lineage.records
    copies = records["event"] == evo.EVENTS["copy"]
    children = records["slot"][copies]
    parents = np.array([np.flatnonzero(before.agent_id == i)[0] for i in records["parent"][copies]])
    child_ids = after.agent_id[children]
    expected = evo.width_changes(params.seed, 2, child_ids, 1.0, np.full(len(children), 4), 8, layer=2)
    assert len(set(expected.tolist())) == 2  # both directions occur in this draw
    # the first layer's stream would have drawn otherwise: the layers change independently
    assert not np.array_equal(expected, evo.width_changes(params.seed, 2, child_ids, 1.0,
                                                          np.full(len(children), 4), 8))
    widths2 = game.unit_widths2(after.networks)
    assert widths2[children].tolist() == expected.tolist()
    assert (widths2[np.setdiff1d(np.arange(6), children)] == 4).all()
    assert (game.unit_widths(after.networks) == 4).all()  # --mutate-width is off: the first layer stays whole
    mutations = records["event"] == evo.EVENTS["mutation"]
    np.testing.assert_array_equal(records["width2"][mutations], expected)
    assert (records["width2"][copies] == 4).all() and (records["width"][copies] == 4).all()
    board = game.start_position(3, params.rows, params.cols, params.pieces)
    for child, parent, width2 in zip(children, parents, expected):
        child_net, parent_net = after.networks.agent(int(child)), before.networks.agent(int(parent))
        if width2 == 8:  # widened: new input weights, zero output weights, the parent's values
            assert (child_net.wm[:, 4:] != 0).all() and (child_net.bm[4:] != 0).all()
            assert (child_net.w2[4:] == 0).all()
            np.testing.assert_array_equal(child_net.wm[:, :4], parent_net.wm[:, :4])
            assert game.value(child_net, board, 1) == pytest.approx(game.value(parent_net, board, 1), rel=1e-14)
        else:  # narrowed: its last two second-layer units off
            assert (child_net.wm[:, 2:] == 0).all() and (child_net.w2[2:] == 0).all()
            np.testing.assert_array_equal(child_net.w2[:2], parent_net.w2[:2])


def test_both_layers_change_together_and_noise_switches_no_unit_on():
    params = dataclasses.replace(NARROW2, agents=6, hidden=6, start_width=3, hidden2=6, start_width2=3,
                                 replicate_every=2, replicate_fraction=0.5, mutate_weights=0.05, mutate_width=0.5,
                                 mutate_width2=0.5, tournament_games=0)
    experiment, state = _episodes(params, NUMBA, 6)
    nets = state.networks
    widths, widths2 = game.unit_widths(nets), game.unit_widths2(nets)
    metrics = experiment.measure(state)
    assert (metrics["width2_mean"], metrics["width2_max"]) == (widths2.mean(), widths2.max())
    assert (metrics["width_mean"], metrics["width_max"]) == (widths.mean(), widths.max())
    latest = {int(a): (int(w), int(w2)) for a, w, w2 in zip(*(state.lineage.records[k]
                                                               for k in ("agent", "width", "width2")))}
    assert list(zip(widths.tolist(), widths2.tolist())) == [latest[int(a)] for a in state.agent_id]
    assert widths2.tolist() != [3] * 6 and widths.tolist() != [3] * 6
    # an off first-layer unit reaches no second-layer unit, a grown one included
    for k in range(6):
        off = game.off_units(nets)[k]
        assert (nets.wm[k][off] == 0).all() and (nets.w1[k][:, off] == 0).all()


def test_resume_with_both_layers_changing_width_is_bit_identical(tmp_path, capsys):
    argv = ["train", "knights", "--agents", "6", "--games-per-agent", "4", "--rows", "4", "--cols", "5", "--pieces",
            "3", "--max-turns", "40", "--eval-every", "3", "--eval-games", "4", "--snapshot-every", "3",
            "--hidden", "6", "--start-width", "3", "--mutate-width", "0.5", "--hidden2", "6", "--start-width2", "3",
            "--mutate-width2", "0.5", "--replicate-every", "2", "--replicate-fraction", "0.5",
            "--tournament-games", "0", "--seed", "2", "--json"]
    half, whole = tmp_path / "half.h5", tmp_path / "whole.h5"
    assert main(argv + ["--episodes", "4", "--out", str(half)]) == 0
    assert main(["train", "knights", "--resume", str(half), "--episodes", "8", "--json"]) == 0
    assert main(argv + ["--episodes", "8", "--out", str(whole)]) == 0
    capsys.readouterr()
    with h5py.File(half) as a, h5py.File(whole) as b:
        for name in b["state"]:
            assert np.array_equal(a[f"state/{name}"][()], b[f"state/{name}"][()], equal_nan=True), name
        assert set(b["state/lineage_width"][()].tolist()) > {3.0}
        assert set(b["state/lineage_width2"][()].tolist()) > {3.0}
        nets = game.Networks(*(b[f"state/{n}"][()] for n in ("w1", "b1", "w2", "b2", "wm", "bm")))
    assert main(["evaluate", str(whole), "--games", "2", "--json"]) == 0  # who each agent is, widths included
    per_agent = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["per_agent"]
    assert [row["width"] for row in per_agent] == game.unit_widths(nets).tolist()
    assert [row["width2"] for row in per_agent] == game.unit_widths2(nets).tolist()
    assert {row["half_life"] for row in per_agent} == {0.0}


@pytest.mark.parametrize(("argv", "named"), [
    (["--mutate-width2", "0.5"], "hidden2"),
    (["--hidden2", "3", "--start-width2", "4"], "start-width2"),
    (["--hidden2", "3", "--mutate-width2", "1.5"], "mutate-width2"),
])
def test_second_layer_width_options_are_checked(capsys, argv, named):
    assert main(["train", "knights", "--episodes", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1
