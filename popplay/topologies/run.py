"""A whole deep training run: the runner on rank 0, quality at the end, the summary.

Run files, checkpoints, the console and ``--resume`` are :func:`popplay.runner.train`'s;
this adds what deep runs report (``quality`` from greedy episodes, ``env_steps``,
``episodes``, the distributed backend) and, for multi-rank topologies, the launch of
the other ranks.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable


class DeepRunError(Exception):
    """A failure to report as one line (bad input: exit 2; a dead rank: exit 1)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def train_deep(domain: str, params: Any, *, out: Path, overwrite: bool = False,
               checkpoint_every: str | None = None, resume: Any = None, reporter: Any = None,
               should_stop: Callable[[], bool] | None = None, device: str = "cpu") -> dict[str, Any] | None:
    """Train ``params`` (a DQN or REINFORCE parameter set) and write ``out``; return the
    summary (None on ranks other than 0 of a multi-rank run)."""
    from popplay.distributed.collectives import CollectiveError
    from popplay.envs import EnvError
    from popplay.runner import CheckpointEvery, TrainOptions, UsageProblem, train

    device = deep_device(domain, device)
    limit_threads()
    try:
        every = CheckpointEvery.parse(checkpoint_every) if checkpoint_every else None
        options = TrainOptions(backend="torch", device=device, out=out, overwrite=overwrite, checkpoint_every=every)
        ranks = params.ranks
        if ranks == 1:
            outcome = train(domain, params, options, reporter=reporter, should_stop=should_stop, resume=resume)
            backend_name = "none"
        else:
            from popplay.topologies.launch import train_multirank

            ran = train_multirank(domain, params, options, reporter=reporter, should_stop=should_stop, resume=resume)
            if ran is None:
                return None  # a simulator or worker rank: rank 0 reports
            outcome, backend_name = ran
    except (UsageProblem, EnvError) as error:
        raise DeepRunError(str(error)) from None
    except CollectiveError as error:
        raise DeepRunError(str(error), error.exit_code) from None
    experiment, state = outcome.experiment, outcome.result.state
    quality = experiment.quality(state)
    summary: dict[str, Any] = {
        "domain": domain,
        "env": params.env,
        "topology": getattr(params, "topology", "parameter-server"),
        "ranks": ranks,
        "quality": None if math.isnan(quality) else quality,
        "eval_episodes": params.eval_episodes,
        "env_steps": int(state.env_steps),
        "episodes": int(state.episodes),
        "seconds": outcome.result.learning_seconds,
        "env_steps_per_second": state.env_steps / outcome.result.learning_seconds
        if outcome.result.learning_seconds > 0 else 0.0,
        "backend": backend_name,
        "device": device,
        "complete": not outcome.result.stopped,
        "out": str(out),
        **experiment.summary_extras(state),
    }
    return summary


#: Deep domains whose learner can run on a GPU (``--device cuda``).
CUDA_DOMAINS = ("dqn",)


def deep_device(domain: str, device: str) -> str:
    """The device a deep run's learner uses: ``cuda`` only when asked for (``auto`` is
    the CPU: at these network sizes acting step by step across the bus costs more than
    a GPU saves, and the CPU runs are the measured ones), and only for
    :data:`CUDA_DOMAINS`. Raises :class:`DeepRunError` (one line) otherwise."""
    if device != "cuda":
        return "cpu"
    if domain not in CUDA_DOMAINS:
        raise DeepRunError(f"--device cuda: {domain} runs on the CPU in this version "
                           f"(on a GPU: {', '.join(CUDA_DOMAINS)})")
    from popplay.populations.base import cuda_available

    if not cuda_available():
        raise DeepRunError("--device cuda: no CUDA GPU is available on this machine")
    return "cuda"


def limit_threads() -> None:
    """One torch thread per process: the networks are tiny, and on a shared machine
    intra-op threads spin against each other (measured: 10x slower with two)."""
    import torch

    torch.set_num_threads(1)
