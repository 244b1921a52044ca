"""Multi-rank deep runs: the launch (``popplay train ...`` re-run as N ranks by
:func:`popplay.distributed.launch.launch_local`, or started by ``torchrun``) and what
each rank does once it is running.

Every rank runs the same command line. Rank 0 (learner, server) drives the experiment
through :func:`popplay.runner.train` and alone writes the run file; the others
(simulators, workers) run their loop until rank 0 tells them to stop. Each rank names
itself by its role (``learner``, ``simulator 2``, ``server``, ``worker 3``) for ``ps -e``
and ``pgrep``; the launcher's command line says ``popplay rank R/N``.
"""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Callable

# DQN parameter names whose option is not "--" + name with dashes.
_OPTION = {"replay_capacity": "--replay"}


def command_line(domain: str, params: Any, *, out: Path, overwrite: bool, checkpoint_every: str | None,
                 json_output: bool, resume: Path | None, device: str = "cpu") -> list[str]:
    """The ``popplay`` arguments every rank runs: every setting spelled out (so that the
    ranks cannot disagree, e.g. on a default --out with a time stamp)."""
    argv = ["train", domain]
    if resume is not None:
        argv += ["--resume", str(resume), "--episodes", str(params.episodes), "--env-steps", str(params.env_steps),
                 "--timeout", str(params.timeout)]
    else:
        for name, value in params.to_dict().items():
            option = _OPTION.get(name, "--" + name.replace("_", "-"))
            if isinstance(value, bool):  # typer's --name/--no-name flags take no value
                argv.append(option if value else "--no-" + option[2:])
                continue
            if isinstance(value, (list, tuple)):
                value = ",".join(str(v) for v in value)
            argv += [option, str(value)]
        argv += ["--out", str(out)]
        if overwrite:
            argv.append("--overwrite")
    if checkpoint_every:
        argv += ["--checkpoint-every", checkpoint_every]
    if json_output:
        argv.append("--json")
    if device != "cpu":
        argv += ["--device", device]
    return argv


def launch(domain: str, params: Any, *, out: Path, overwrite: bool, checkpoint_every: str | None,
           json_output: bool, resume: Path | None, device: str = "cpu") -> int:
    """Start ``params.ranks`` local ranks running this command; return the job's exit code."""
    from popplay.distributed.launch import launch_local

    argv = command_line(domain, params, out=out, overwrite=overwrite, checkpoint_every=checkpoint_every,
                        json_output=json_output, resume=resume, device=device)

    def where() -> str:
        return f"the last checkpoint is {out}" if Path(out).exists() else f"no checkpoint was written to {out}"

    return launch_local(argv, params.ranks, timeout=params.timeout, threads_per_rank=1, describe_lost=where)


#: The domains whose multi-rank runs are EXARL workflows (:mod:`exarl_ranks`).
EXARL_DOMAINS = ("a2c", "td3", "ddpg")


def role_of(domain: str, rank: int, params: Any = None) -> str:
    if domain in EXARL_DOMAINS:
        from popplay.topologies.exarl_ranks import layout

        learners, _ = layout(params)
        if params.workflow == "central-inference":
            return "server" if rank == 0 else f"actor {rank - 1}"
        return f"learner {rank}" if rank in learners else f"actor {rank - len(learners)}"
    if domain == "reinforce":
        return "server" if rank == 0 else f"worker {rank}"
    return "learner" if rank == 0 else f"simulator {rank}"


def train_multirank(domain: str, params: Any, options: Any, reporter: Any = None,
                    should_stop: Callable[[], bool] | None = None, resume: Any = None) -> tuple[Any, str] | None:
    """This rank's part of a multi-rank run. Rank 0 returns the runner's outcome and
    the backend's name; the other ranks return None when told to stop."""
    from popplay.distributed.group import init_from_env, shutdown
    from popplay.runner import UsageProblem
    from popplay.topologies.wire import set_role

    dist = init_from_env(device="cpu", timeout=params.timeout)
    if dist.world_size != params.ranks:
        raise UsageProblem(f"this run needs {params.ranks} ranks (rank 0 and {params.ranks - 1} others); "
                           f"the job has {dist.world_size}")
    set_role(role_of(domain, dist.rank, params))
    try:
        return _run_rank(domain, dist, params, options, reporter, should_stop, resume)
    finally:
        # Leave the group before exiting: a process that exits with gloo's threads still
        # running aborts ("terminate called without an active exception").
        shutdown()


def _run_rank(domain: str, dist: Any, params: Any, options: Any, reporter: Any, should_stop: Any,
              resume: Any) -> tuple[Any, str] | None:
    from popplay.runner import train

    if dist.rank != 0:
        # The launcher forwards Ctrl-C to every rank; only rank 0 decides when to stop.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if domain in EXARL_DOMAINS:
            from popplay.topologies.exarl_ranks import rank_loop

            rank_loop(dist, params, resume)
        elif domain == "reinforce":
            from popplay.topologies.reinforce_ranks import worker_loop

            worker_loop(dist, params, resume)
        else:
            from popplay.topologies.dqn_ranks import simulator_loop

            simulator_loop(dist, params, resume)
        return None
    outcome = None
    try:
        outcome = train(domain, params, options, reporter=reporter, should_stop=should_stop, resume=resume)
    finally:
        if outcome is not None:
            outcome.experiment.close(outcome.result.state)
    return outcome, dist.backend
