"""`popplay lineage`: the family tree of the current population, and its exports."""
import csv
import io
import json

import h5py
import numpy as np
import pytest

from popplay.cli.main import main


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lineage") / "run.h5"
    assert main(["train", "knights", "--agents", "6", "--games-per-agent", "4", "--episodes", "12", "--rows", "4",
                 "--cols", "5", "--pieces", "3", "--max-turns", "40", "--eval-every", "12", "--eval-games", "4",
                 "--replicate-every", "2", "--replicate-fraction", "0.5", "--mutate-weights", "0.01",
                 "--mutate-params", "1.2", "--tournament-games", "1", "--seed", "3", "--out", str(path),
                 "--json"]) == 0
    return path


def _out(capsys, argv):
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_json_holds_the_family_of_the_current_population(run_file, capsys):
    data = json.loads(_out(capsys, ["lineage", str(run_file), "--format", "json"]))
    with h5py.File(run_file) as f:
        ids = f["state/agent_id"][()].tolist()
        events = len(f["state/lineage_event"][()])
    assert data["population"] == ids and data["events"] == events
    nodes = {n["agent"]: n for n in data["nodes"]}
    assert {a for a, n in nodes.items() if n["alive"]} == set(ids)
    for agent in ids:  # every line goes back to a founder of generation 0 through recorded copies
        steps = 0
        while nodes[agent]["parent"] >= 0:
            assert nodes[agent]["event"] == "copy" and nodes[nodes[agent]["parent"]]["born"] <= nodes[agent]["born"]
            agent = nodes[agent]["parent"]
            steps += 1
        assert nodes[agent]["event"] == "initial" and nodes[agent]["born"] == 0
    assert max(ids) >= 6  # copies happened (3 per replication)
    copied = [n for n in nodes.values() if n["event"] == "copy"]
    assert copied and all(n["noise"] == 0.01 and 0 <= n["lam"] <= 1 for n in copied)
    full = json.loads(_out(capsys, ["lineage", str(run_file), "--format", "json", "--all"]))
    assert len(full["nodes"]) == full["next_id"] and len(full["records"]["agent"]) == events


def test_csv_and_out_file(run_file, tmp_path, capsys):
    text = _out(capsys, ["lineage", str(run_file), "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows and set(rows[0]) >= {"agent", "parent", "born", "event", "slot", "alive", "alpha", "lam", "epsilon"}
    alive = sorted(int(r["agent"]) for r in rows if r["alive"] == "1")
    with h5py.File(run_file) as f:
        assert alive == sorted(f["state/agent_id"][()].tolist())
    target = tmp_path / "tree.csv"
    assert _out(capsys, ["lineage", str(run_file), "--format", "csv", "--out", str(target)]) == ""
    assert target.read_text() == text


def test_tree_names_every_living_agent(run_file, capsys):
    text = _out(capsys, ["lineage", str(run_file)])
    with h5py.File(run_file) as f:
        ids = f["state/agent_id"][()].tolist()
    assert "6 agents now" in text
    for slot, agent in enumerate(ids):
        assert f"#{agent} slot {slot}" in text


def test_runs_without_agents_are_refused(tmp_path, capsys):
    bandit = tmp_path / "b.h5"
    assert main(["train", "bandit", "--arms", "4", "--agents", "2", "--trials", "2", "--agent-steps", "8",
                 "--share-every", "4", "--out", str(bandit), "--json"]) == 0
    capsys.readouterr()
    assert main(["lineage", str(bandit)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "agent ids" in err[0]
    assert main(["lineage", str(tmp_path / "missing.h5")]) == 2
    assert main(["lineage", str(bandit), "--format", "xml"]) == 2


def test_batched_populations_show_one_group(tmp_path, capsys):
    # a (trials, agents) population as a tabular domain would store it
    from popplay.checkpoints.runfile import write_run
    from popplay.operators.evolution import Lineage, initial_ids

    ids = initial_ids((2, 3))
    log = Lineage.start(ids)
    ids, _ = log.replace(1, ids, np.array([[0], [1]]), np.array([[2], [2]]))
    path = tmp_path / "batched.h5"
    write_run(path, domain="cartpole", config={}, state={"agent_id": ids, **{f"lineage_{k}": v for k, v in
                                                                          log.to_arrays().items()}},
              state_counters={}, static={}, curves={}, results={}, result_attrs={}, attrs={}, complete=True)
    data = json.loads(_out(capsys, ["lineage", str(path), "--format", "json", "--group", "1"]))
    assert data["population"] == [3, 4, 7]
    assert {n["agent"] for n in data["nodes"]} == {3, 4, 7} and all(n["group"] == 1 for n in data["nodes"])
    assert [n["parent"] for n in data["nodes"] if n["agent"] == 7] == [4]
    everyone = json.loads(_out(capsys, ["lineage", str(path), "--format", "json"]))
    assert len(everyone["population"]) == 6
    capsys.readouterr()
    assert main(["lineage", str(path), "--group", "2"]) == 2


def test_json_is_spelled_as_everywhere_else(run_file, capsys):
    assert _out(capsys, ["lineage", str(run_file), "--json"]) == _out(capsys, ["lineage", str(run_file), "--format",
                                                                                "json"])
    capsys.readouterr()
    assert main(["lineage", str(run_file), "--json", "--format", "csv"]) == 2
    assert "disagree" in capsys.readouterr().err
