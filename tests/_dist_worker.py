"""A rank for tests/test_distributed_core.py: ``python -m tests._dist_worker ROLE SCENARIO OUTDIR``."""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np


def main() -> int:
    role, scenario, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    assert role.startswith("popplay rank ")
    from popplay.distributed import collectives as C
    from popplay.distributed.group import init_from_env, shutdown

    dist = init_from_env(timeout=float(os.environ.get("TEST_TIMEOUT", "10")))
    try:
        if scenario == "gather":
            agents = 12
            rng = np.random.default_rng(5)
            values = rng.standard_normal((3, agents, 4))
            mine = values[:, C.shard(agents, dist), :]
            whole = C.all_gather_axis(mine, axis=1)
            total = C.tree_sum(mine, axis=1)
            keys = C.all_gather_axis(np.arange(agents, dtype=np.uint64)[C.shard(agents, dist)] * np.uint64(2**63 + 1), 0)
            flag = C.any_flag(dist.rank == dist.world_size - 1)
            count = C.sum_int(dist.rank + 1)
            if dist.rank == 0:
                np.save(os.path.join(outdir, "whole.npy"), whole)
                np.save(os.path.join(outdir, "total.npy"), total)
                np.save(os.path.join(outdir, "keys.npy"), keys)
                with open(os.path.join(outdir, "scalars.txt"), "w") as f:
                    f.write(f"{flag} {count} {os.environ['POPPLAY_ROLE']} {os.environ['NUMBA_NUM_THREADS']}")
            return 0
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
        if scenario == "stop":
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
