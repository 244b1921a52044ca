"""Cart-pole populations sharded over real ranks (gloo): sharing, differentiation and
selective replication on, bit-identical to one process, lineage included."""
from __future__ import annotations

import json
from pathlib import Path

from tests._dist_helpers import assert_same_run, popplay

TINY = ["train", "cartpole", "--agents", "8", "--trials", "2", "--agent-steps", "800", "--share-every", "20",
        "--bias", "0.5", "--replicate-every", "2", "--mutate-q", "0.01", "--mutate-params", "1.5",
        "--test-steps", "50", "--test-starts", "2", "--seed", "3"]


def test_four_ranks_equal_one_process(tmp_path: Path) -> None:
    from popplay.cli import main

    one = tmp_path / "one.h5"
    assert main([*TINY, "--out", str(one), "--json"]) == 0
    out = tmp_path / "n4.h5"
    done = popplay(*TINY, "--nproc", "4", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["world_size"] == 4
    data = assert_same_run(one, out)
    # Selection copied and mutated agents (the lineage says so): replication really ran.
    from popplay.evolution import EVENTS

    events = set(data["state/lineage_event"].tolist())
    assert {EVENTS["copy"], EVENTS["mutation"]} <= events
