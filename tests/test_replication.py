"""Selective replication with variation inside knights training: what is copied, how
copies vary, what the lineage records, divergence, resume, and the options."""
import dataclasses
import json

import h5py
import numpy as np
import pytest

from popplay.operators import evolution as evo
from popplay.cli.main import main
from popplay.games.knights import rules as game
from popplay.games.knights.rules import KnightsParams
from popplay.core.backend import Backend
from popplay.games.knights.experiment import KnightsExperiment

NUMBA = Backend("numba", "cpu")
REPLICATING = KnightsParams(rows=4, cols=5, pieces=3, max_turns=40, agents=6, games_per_agent=4, episodes=8,
                            eval_every=4, eval_games=4, snapshot_every=4, seed=4, replicate_every=2,
                            replicate_fraction=1 / 3, mutate_weights=0.05, mutate_params=1.5, tournament_games=2)


def _episodes(params, n, state=None):
    experiment = KnightsExperiment(params, NUMBA)
    state = experiment.initial_state() if state is None else state
    for _ in range(n):
        state = experiment.phase(state, time_left=None)
        experiment.measure(state)
    return experiment, state


def test_best_are_copied_over_worst_with_recorded_variation():
    params = REPLICATING
    plain = dataclasses.replace(params, replicate_every=0)
    # two episodes without replication give the state the replication then acts on
    experiment, before = _episodes(plain, 2)
    replicating, after = _episodes(params, 2)
    flat = game.pack(before.networks)
    fitness = replicating.fitness(before, flat, np.ones(6, dtype=bool))
    parents, children = evo.select_replacements(fitness, params.replicate_fraction)
    assert len(children) == 2 and np.array_equal(after.fitness, fitness)
    child_ids = after.agent_id[children]
    assert child_ids.tolist() == [6, 7]  # fresh ids, in order
    survivors = np.setdiff1d(np.arange(6), children)
    assert np.array_equal(after.agent_id[survivors], before.agent_id[survivors])
    np.testing.assert_array_equal(game.pack(after.networks)[survivors], flat[survivors])
    noise = evo.gaussian_noise(params.seed, 2, child_ids, flat.shape[1], params.mutate_weights)
    np.testing.assert_array_equal(game.pack(after.networks)[children], flat[parents] + noise)
    factors = evo.vary_factors(params.seed, 2, child_ids, ("alpha", "lam", "epsilon"), params.mutate_params)
    np.testing.assert_array_equal(after.alpha[children], before.alpha[parents] * factors["alpha"])
    np.testing.assert_array_equal(after.lam[children], np.clip(before.lam[parents] * factors["lam"], 0, 1))
    assert not np.array_equal(after.alpha[children], before.alpha[parents])
    records = after.lineage.records
    copies = records["event"] == evo.EVENTS["copy"]
    mutations = records["event"] == evo.EVENTS["mutation"]
    assert records["agent"][copies].tolist() == child_ids.tolist()
    assert records["parent"][copies].tolist() == before.agent_id[parents].tolist()
    assert records["replaced"][copies].tolist() == before.agent_id[children].tolist()
    assert (records["generation"][copies | mutations] == 2).all()
    np.testing.assert_array_equal(records["alpha"][mutations], after.alpha[children])
    assert (records["noise"][mutations] == params.mutate_weights).all()


def test_variation_off_gives_exact_copies_and_learning_scores_can_rank():
    params = dataclasses.replace(REPLICATING, mutate_weights=0.0, mutate_params=1.0, tournament_games=0)
    _, before = _episodes(dataclasses.replace(params, replicate_every=0), 2)
    _, after = _episodes(params, 2)
    fitness = np.mean(np.stack(before.score_history[-2:]), axis=0)
    np.testing.assert_array_equal(after.fitness, fitness)
    parents, children = evo.select_replacements(fitness, params.replicate_fraction)
    np.testing.assert_array_equal(game.pack(after.networks)[children], game.pack(before.networks)[parents])
    np.testing.assert_array_equal(after.alpha, before.alpha)
    assert (after.lineage.records["event"] != evo.EVENTS["mutation"]).all()


def test_diverged_agents_are_never_copied_and_resets_are_recorded():
    experiment, state = _episodes(REPLICATING, 1)
    flat = game.pack(state.networks)
    best = int(np.argmax(experiment.fitness(state, flat, np.ones(6, dtype=bool))))
    state.w1[best, 0, 0] = np.nan
    old_id = int(state.agent_id[best])
    replicated = experiment.replicate(state._replace(episode=2))
    assert np.isnan(replicated.fitness[best])
    records = replicated.lineage.records
    copies = records["event"] == evo.EVENTS["copy"]
    assert old_id not in records["parent"][copies] and old_id in records["replaced"][copies]
    assert np.isfinite(game.pack(replicated.networks)).all()  # its slot now holds a copy
    # without a replication in between, check_finite resets it as a new founder
    events = experiment.check_finite(state, phase=1)
    assert len(events) == 1 and f"agent {old_id}" in events[0]
    new_id = int(state.agent_id[best])
    assert new_id != old_id and new_id == state.lineage.next_id - 1
    reset = state.lineage.records
    assert reset["event"][-1] == evo.EVENTS["reset"] and reset["replaced"][-1] == old_id
    assert reset["parent"][-1] == -1 and reset["slot"][-1] == best


def test_resume_with_replication_is_bit_identical(tmp_path, capsys):
    argv = ["train", "knights", "--agents", "5", "--games-per-agent", "4", "--rows", "4", "--cols", "5", "--pieces",
            "3", "--max-turns", "40", "--eval-every", "3", "--eval-games", "4", "--snapshot-every", "3",
            "--replicate-every", "2", "--replicate-fraction", "0.4", "--mutate-weights", "0.05",
            "--mutate-params", "1.5", "--mutate-lookahead", "0.5", "--tournament-games", "1", "--seed", "7", "--json"]
    half, whole = tmp_path / "half.h5", tmp_path / "whole.h5"
    assert main(argv + ["--episodes", "5", "--out", str(half)]) == 0
    assert main(["train", "knights", "--resume", str(half), "--episodes", "10", "--json"]) == 0
    assert main(argv + ["--episodes", "10", "--out", str(whole)]) == 0
    capsys.readouterr()
    with h5py.File(half) as a, h5py.File(whole) as b:
        names = [f"state/{name}" for name in b["state"]] + [f"curves/{name}" for name in b["curves"]
                                                           if name != "seconds"]
        assert "state/lineage_agent" in names and "state/fitness" in names
        for name in names:
            assert np.array_equal(a[name][()], b[name][()], equal_nan=True), name
        assert a["state/lineage_generation"][()].max() == 10
        assert (a["state/lineage_event"][()] == evo.EVENTS["mutation"]).sum() == 5 * 2


def test_replication_options_are_checked(tmp_path, capsys):
    base = ["train", "knights", "--agents", "4", "--episodes", "1", "--out", str(tmp_path / "x.h5")]
    for options, name in ((["--replicate-fraction", "0"], "--replicate-fraction"),
                          (["--replicate-fraction", "0.6"], "--replicate-fraction"),
                          (["--mutate-params", "0.5"], "--mutate-params"),
                          (["--mutate-weights", "-1"], "--mutate-weights"),
                          (["--tournament-games", "-1"], "--tournament-games"),
                          (["--replicate-every", "-2"], "--replicate-every")):
        capsys.readouterr()
        assert main(base + options) == 2, options
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("Error:") and name in err[0], err
    assert main(base[:3] + ["1", "--replicate-every", "1", "--out", str(tmp_path / "y.h5")]) == 2
    assert "--agents" in capsys.readouterr().err
    assert not (tmp_path / "x.h5").exists()


def test_train_json_reports_population_quality_curves(tmp_path, capsys):
    out = tmp_path / "q.h5"
    assert main(["train", "knights", "--agents", "4", "--games-per-agent", "4", "--episodes", "4", "--rows", "4",
                 "--cols", "5", "--pieces", "3", "--max-turns", "40", "--eval-every", "2", "--eval-games", "4",
                 "--eval-opponents", "greedy", "--replicate-every", "2", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for stat in ("best", "mean", "worst"):
        assert f"greedy_{stat}" in summary
    with h5py.File(out) as f:
        best, mean, worst = (f[f"curves/greedy_{s}"][()] for s in ("best", "mean", "worst"))
        assert best.shape == (4,) and (best >= mean).all() and (mean >= worst).all()
        assert f["config"].attrs["replicate_every"] == 2


def test_old_run_files_without_lineage_still_load():
    experiment, state = _episodes(dataclasses.replace(REPLICATING, replicate_every=0), 1)
    arrays = {k: v for k, v in experiment.state_arrays(state).items()
              if not k.startswith("lineage_") and k != "fitness"}
    restored = experiment.restore(arrays, experiment.state_counters(state))
    assert len(restored.lineage) == 6 and restored.lineage.next_id == 6 and np.isnan(restored.fitness).all()
    bad = {**experiment.state_arrays(state), "lineage_next_id": np.array([2])}
    with pytest.raises(ValueError, match="lineage|ids"):
        experiment.restore(bad, experiment.state_counters(state))


def test_copies_switch_their_chooser_depth_with_mutate_lookahead():
    """--mutate-lookahead: a copy takes its parent's depth and switches it (1 <-> 2) where
    its own stream says so; survivors keep theirs; the lineage records the depths, and
    the next episode's games are chosen at them (the bank carries them)."""
    params = dataclasses.replace(REPLICATING, mutate_lookahead=0.5, agents=8, replicate_fraction=0.5)
    _, before = _episodes(dataclasses.replace(params, replicate_every=0), 2)
    replicating, after = _episodes(params, 2)
    parents = after.lineage.records["parent"][after.lineage.records["event"] == evo.EVENTS["copy"]]
    children = after.lineage.records["slot"][after.lineage.records["event"] == evo.EVENTS["copy"]]
    assert len(children) == 4 and (before.plies == 1).all()
    switch = evo.switches(params.seed, 2, after.agent_id[children], params.mutate_lookahead)
    assert switch.any() and not switch.all()  # both outcomes are exercised
    np.testing.assert_array_equal(after.plies[children], np.where(switch, 2, 1))
    survivors = np.setdiff1d(np.arange(8), children)
    assert (after.plies[survivors] == 1).all()
    assert len(parents) == 4
    mutations = after.lineage.records["event"] == evo.EVENTS["mutation"]
    np.testing.assert_array_equal(after.lineage.records["plies"][mutations], after.plies[children])
    assert np.array_equal(replicating.bank(after)[0].plies, after.plies)
    # the state's depths are what the games use: forcing all to 1 changes the next episode
    nxt = replicating.phase(after, time_left=None)
    flat = replicating.phase(after._replace(plies=np.ones_like(after.plies)), time_left=None)
    assert not np.array_equal(game.pack(nxt.networks), game.pack(flat.networks))


def test_evo_switches_draw_each_id_with_its_probability():
    ids = np.arange(4000)
    drawn = evo.switches(3, 5, ids, 0.25)
    assert abs(drawn.mean() - 0.25) < 0.03
    assert np.array_equal(drawn, evo.switches(3, 5, ids, 0.25))  # from the ids' own streams
    assert not evo.switches(3, 5, ids, 0.0).any() and evo.switches(3, 5, ids, 1.0).all()
    with pytest.raises(ValueError):
        evo.switches(3, 5, ids, 1.5)


def test_old_run_files_without_chooser_depths_load_with_the_runs_lookahead():
    params = dataclasses.replace(REPLICATING, lookahead=2)
    experiment, state = _episodes(params, 2)
    arrays = {k: v for k, v in experiment.state_arrays(state).items()
              if k not in ("plies", "snapshot_plies", "lineage_plies")}
    restored = experiment.restore(arrays, experiment.state_counters(state))
    assert (restored.plies == 2).all() and all((s.plies == 2).all() for s in restored.snapshots)
    assert np.isnan(restored.lineage.records["plies"]).all()
    bad = {**experiment.state_arrays(state), "plies": np.full(6, 3)}
    with pytest.raises(ValueError, match="plies"):
        experiment.restore(bad, experiment.state_counters(state))
