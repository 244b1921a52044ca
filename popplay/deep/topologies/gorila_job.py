"""Gorila's job as the generated ``popplay train gorila`` runs it (``DomainSpec.runner``).

Gorila's ranks are not phases of one experiment: its actors and learners may be lost
while the run goes on, and its shards keep their own checkpoints, so its launcher
(:func:`popplay.deep.topologies.gorila.run_gorila`) and, under ``torchrun``,
:mod:`popplay.deep.topologies.gorila_torchrun` run it. What the command line shares with
every other domain (the options generated from :class:`GorilaConfig`'s fields, ``--out``,
``--overwrite``, ``--resume``, ``--json``, one-line errors) comes from the one generated
command; this module takes over from there.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from popplay.checkpoints.lock import LockBusy, RunLock
from popplay.checkpoints.runfile import RunFileError, check_writable
from popplay.checkpoints.scalars import LogError, open_log
from popplay.core.errors import EXIT_INTERRUPTED, PopplayError, UsageError
from popplay.core.experiment import RunRequest, RunResult
from popplay.deep.topologies import gorila_torchrun
from popplay.deep.topologies.gorila import (
    GorilaConfig,
    GorilaJobLost,
    check_stored,
    parts_name_problem,
    played_before,
    remaining,
    spaces,
    summary_text,
    train_gorila,
)
from popplay.deep.topologies.gorila_params import SPEC


def run(config: GorilaConfig, request: RunRequest) -> RunResult:
    """Run (or, under torchrun, become one rank of) a Gorila job. Under torchrun every
    worker finds the same problems; rank 0 alone says them (``popplay.cli.main``)."""
    return _run(config, request, gorila_torchrun.under_torchrun())


def _run(config: GorilaConfig, request: RunRequest, torchrun: bool) -> RunResult:
    if not (config.env_steps or config.episodes or request.time_budget):
        raise UsageError("a budget is needed: --episodes, --env-steps or --time-budget")
    if request.time_budget is not None and not request.time_budget > 0:
        raise UsageError(f"--time-budget must be positive (got {request.time_budget:g})")
    if torchrun and (request.time_budget is not None or request.log_dir is not None):
        raise UsageError("--time-budget and --log-dir: a gorila job under torchrun does not take them in this "
                         "version (run it with the local launcher)")
    resume_state = None
    if request.resume is not None:
        try:
            check_stored(config, request.resume.state, request.resume.state_counters)
        except ValueError as error:
            raise UsageError(f"{request.resume.path}: damaged run file ({error})") from None
        resume_state = {**request.resume.state, "version": request.resume.state_counters["version"]}
        # The budget is the run's total, as every domain's: only what is left is played.
        steps, episodes = played_before(request.resume)
        learned = float(request.resume.attrs.get("learning_seconds") or 0.0)
        if request.time_budget is not None and request.time_budget <= learned:
            raise UsageError(f"--resume {request.resume.path}: the run has already learned its time budget "
                             f"({learned:.3g}s of {request.time_budget:g}s)")
        if remaining(config, steps, episodes)[1]:
            raise UsageError(f"--resume {request.resume.path}: the run has already reached this budget "
                             f"({steps} env-steps, {episodes} episodes played)")
    if torchrun:
        problem = gorila_torchrun.layout_problem(config)  # before anything waits for a peer
        if problem is not None:
            raise UsageError(problem)
    _check_env(config)

    def check_out(path: Path) -> None:
        too_long = parts_name_problem(path)
        if too_long is not None:
            raise UsageError(too_long)
        if path.exists() and not request.overwrite and request.resume is None:
            raise UsageError(f"--out {path}: file exists (pass --overwrite to replace it)")
        try:
            check_writable(path, overwrite=request.overwrite, resume=request.resume is not None)
        except RunFileError as error:
            raise UsageError(str(error)) from None

    progress = 0.0 if request.quiet else 2.0  # progress lines on stderr, with --json too
    if torchrun:
        # Rank 0 checks --out (unless this is a restart of the job), prepares the
        # attempt; then this process becomes its rank (exec) and does not return.
        gorila_torchrun.start(config, request.out, json_output=request.json_output, progress_every=progress,
                              resume_state=resume_state, check_out=check_out,
                              held=getattr(request.resume, "lock", None), before=request.resume)
    check_out(request.out)
    should_stop = request.should_stop
    notes: list[str] = []
    scalar_log = open_log(request.log_dir, notes) if request.log_dir is not None else None
    # One writer per run file, as every other run: a resume holds the lock since its
    # read (the command took it); a fresh run takes it here, before its working files.
    lock = RunLock(request.out) if request.resume is None else contextlib.nullcontext()
    try:
        with lock:
            summary = train_gorila(config, request.out, resume_state=resume_state, should_stop=should_stop,
                                   log=sys.stderr, progress_every=progress, before=request.resume,
                                   time_budget=request.time_budget, scalar_log=scalar_log)
    except (LockBusy, LogError) as error:
        raise UsageError(str(error)) from None
    except GorilaJobLost as error:
        advice = f": resume with --resume {request.out}" if request.out.exists() else ""
        raise PopplayError(f"{error}{advice}", error.exit_code) from None
    finally:
        if scalar_log is not None:
            scalar_log.close()
    summary.pop("started_at", None)
    summary = {"domain": SPEC.name, **summary}
    notes += [f"Lost during the run: {line}" for line in summary["lost"]]
    code = 0
    if not summary["complete"] and not (summary["lost"] and not should_stop()):
        # A run that went on without lost ranks is a result; one stopped early is not.
        notes.append(f"Stopped early; the run file {summary['out']} holds the state so far.")
        code = EXIT_INTERRUPTED
    return RunResult(summary, summary_text(summary, config), notes, code, metrics=("quality", "return"))


def _check_env(config: GorilaConfig) -> None:
    try:
        spaces(config)  # makes one: an unknown id, a missing extra or actions of the wrong kind say so here
    except ValueError as error:
        raise UsageError(str(error)) from None
