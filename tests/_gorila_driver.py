"""A stand-in learner (and a silent actor) for tests/test_gorila_processes.py.

``python -m tests._gorila_driver learner|actor CONFIG.json OUT.npz``: joins a Gorila job
whose shards are the real ones (:mod:`popplay.deep.topologies.gorila_ranks`), sends them a
fixed gradient sequence with the real message format, pulls the parameters back and
writes them to ``OUT.npz``; the actor only joins the group (the layout needs one).
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch


def gradient_sequence(n: int, count: int = 30) -> list[torch.Tensor]:
    """Gradients over several decades with exact zeros (where fused kernels would differ)."""
    g = torch.Generator().manual_seed(123)
    out = []
    for _ in range(count):
        v = torch.randn(n, generator=g) * 10.0 ** torch.randint(-3, 3, (n,), generator=g).float()
        v[torch.rand(n, generator=g) < 0.1] = 0.0
        out.append(v)
    return out


def main() -> int:
    import torch.distributed as dist

    from popplay.deep.topologies import gorila as G
    from popplay.deep.topologies import gorila_ranks as R

    role, config_path, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    raw = json.loads(config_path.read_text())
    config = G.GorilaConfig.from_dict(raw)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=dist.PrefixStore("gorila", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    if role == "learner":
        ctx = R.Context(config, config_path.parent, rank, store,
                        {k: raw[k] for k in ("obs_dim", "actions", "action_dim", "action_low", "action_high")})
        for version, grad in enumerate(gradient_sequence(ctx.initial.numel())):
            for s, (a, b) in enumerate(ctx.bounds):
                dist.send(torch.tensor([R.GRAD, version, 0, 0], dtype=torch.int64), dst=s, tag=R.TAG_REQ)
                dist.send(grad[a:b].contiguous(), dst=s, tag=R.TAG_GRAD)
        pulled = ctx.initial.clone()
        versions = R._pull(ctx, pulled)
        np.savez(out, params=pulled.numpy(), versions=np.array(versions))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
