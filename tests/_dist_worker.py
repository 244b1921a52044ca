"""A rank for tests/test_distributed_core.py: ``python -m tests._dist_worker ROLE SCENARIO OUTDIR``."""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np


def _gather(dist, outdir: str) -> None:
    """Every collective once; rank 0 stores what it got."""
    from popplay.distributed import collectives as C

    agents = 12
    values = np.random.default_rng(5).standard_normal((3, agents, 4))
    mine = values[:, C.shard(agents, dist), :]
    whole = C.all_gather_axis(mine, axis=1)
    total = C.tree_sum(mine, axis=1)
    keys = C.all_gather_axis(np.arange(agents, dtype=np.uint64)[C.shard(agents, dist)] * np.uint64(2**63 + 1), 0)
    flag = C.any_flag(dist.rank == dist.world_size - 1)
    count = C.sum_int(dist.rank + 1)
    # Lengths that differ between ranks (rank 1 has none), and a dtype gloo lacks.
    ragged = C.all_gather_ragged(np.arange(3 * (1 - dist.rank), dtype=np.int64) + 10 * dist.rank, dist)
    rows = np.full((dist.rank + 1, 2, 3), dist.rank + 1, dtype=np.uint16)
    gathered = C.gather_rows(rows, [r + 1 for r in range(dist.world_size)], dist=dist)
    assert (gathered is None) == (dist.rank != 0)
    if dist.rank == 0:
        np.save(os.path.join(outdir, "ragged.npy"), ragged)
        np.save(os.path.join(outdir, "rows.npy"), gathered)
        np.save(os.path.join(outdir, "whole.npy"), whole)
        np.save(os.path.join(outdir, "total.npy"), total)
        np.save(os.path.join(outdir, "keys.npy"), keys)
        with open(os.path.join(outdir, "scalars.txt"), "w") as f:
            f.write(f"{flag} {count} {os.environ['POPPLAY_ROLE']}")


def run_cartpole_with_faults(experiment) -> tuple[object, list[str]]:
    """Four phases of a small cart-pole population in which one agent diverges in a
    selection phase (2), another in a plain phase (3), and trial 0's shared table
    after phase 3 (a trial reset). Poisons only what this rank holds, so a sharded
    run meets the same faults as one process."""
    state, events = experiment.initial_state(), []
    rows = experiment._rows
    for phase in range(1, 5):
        for when, trial, agent in ((2, 1, 2), (3, 3, 0)):
            if phase == when and rows.start <= trial < rows.stop:  # rows: every trial but in the trial layout
                q = state.q.copy()
                q[trial - rows.start, agent, :] = float("nan")
                state = state._replace(q=q)
        state = experiment.phase(state, time_left=None)
        if phase == 3:
            state.shared[0, 3] = float("nan")
        events += experiment.check_finite(state, phase=phase)
    return state, events


def _cartpole_faults(dist, outdir: str) -> None:
    import json

    from popplay.core.backend import Backend
    from popplay.games.cartpole.experiment import CartPoleExperiment

    experiment = CartPoleExperiment(CARTPOLE_FAULTS, Backend("numba", "cpu"), dist=dist)
    state, events = run_cartpole_with_faults(experiment)
    arrays = experiment.state_arrays(state)
    if dist.rank == 0:
        np.savez(os.path.join(outdir, "state.npz"), **arrays)
        with open(os.path.join(outdir, "events.json"), "w") as f:
            json.dump({"events": events, "layout": experiment.layout}, f)


def _cartpole_params():
    from popplay.games.cartpole.rules import CartPolePopulationParams

    return CartPolePopulationParams(agents=6, trials=4, steps_per_agent=64, share_every=16, test_steps=32,
                                    test_starts=2, bias=0.5, replicate_every=2, mutate_q=0.01, mutate_params=1.5,
                                    seed=7)


CARTPOLE_FAULTS = _cartpole_params()


def main() -> int:
    role, scenario, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    assert role.startswith("popplay rank ")
    from popplay.distributed import collectives as C
    from popplay.distributed.group import init_from_env, shutdown

    dist = init_from_env(timeout=float(os.environ.get("TEST_TIMEOUT", "10")))
    try:
        if scenario == "die":
            if dist.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.2)
            C.all_gather_axis(np.zeros(3), 0)
            C.barrier()
            return 0
        if scenario == "hang":
            if dist.rank == 1:
                time.sleep(600)
            C.barrier()
            return 0
        if scenario == "cartpole_faults":
            _cartpole_faults(dist, outdir)
            return 0
        if scenario == "gather_then_stop":
            _gather(dist, outdir)
            requested = {"stop": False}
            signal.signal(signal.SIGINT, lambda *a: requested.update(stop=True))
            open(os.path.join(outdir, f"ready{dist.rank}"), "w").close()
            for _ in range(2000):
                if C.any_flag(requested["stop"]):
                    if dist.rank == 0:
                        with open(os.path.join(outdir, "saved"), "a") as f:
                            f.write("saved\n")
                    return 130
                time.sleep(0.02)
            return 1
        return 2
    except C.CollectiveError as error:
        print(f"Error: {error}", file=sys.stderr)
        return C.PEER_LOST_EXIT
    finally:
        shutdown()


if __name__ == "__main__":
    sys.exit(main())
