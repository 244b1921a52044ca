"""``popplay train DOMAIN``: the train command group (one module per domain)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from popplay.checkpoints.lock import LockBusy, RunLock
from popplay.checkpoints.runfile import RunFileError
from popplay.checkpoints.validation import load_run
from popplay.cli.app import (
    invocation,
    train_app,  # noqa: F401  (the train_* modules register on it)
)
from popplay.cli.common import (
    default_out,
    given,  # noqa: E402
    print_json,
)
from popplay.console import format_metric, format_rate, reporter_for
from popplay.core import registry
from popplay.core.errors import PopplayError, UsageError
from popplay.core.experiment import PER_TRIAL
from popplay.core.limits import check_run_fits
from popplay.distributed.group import env_world
from popplay.distributed.launch import in_rank, speaks_for_job
from popplay.training import job
from popplay.training.job import JobOptions

#: How (not what) a resumed run may be told to run; what it learns may change only
#: in the fields its parameters mark as budget or ``on_resume``.
RESUME_RUN_OPTIONS = {"resume", "seeds", "time_budget", "checkpoint_every", "backend", "device", "compile",
                      "json_output", "quiet",
                      "config", "nproc", "timeout", "log_dir"}
RESUME_HOW = ("--checkpoint-every, --backend, --device, --compile/--no-compile, --nproc, --timeout, --log-dir, "
              "--config, --quiet, --json")


def load_resume(ctx: typer.Context, domain: str, path: Path, fields: set[str] = frozenset()) -> Any:
    """Read the run file to resume; refuse options that would change its settings (all
    but :data:`RESUME_RUN_OPTIONS` and the parameters named in ``fields``)."""

    for param in ctx.command.params:
        if param.name in RESUME_RUN_OPTIONS or param.name in fields:
            continue
        if given(ctx, param.name):
            source = ctx.get_parameter_source(param.name)
            where = (f"{param.name.replace('_', '-')} in the --config file" if source is not None
                     and source.name == "DEFAULT_MAP" else param.opts[0])  # the user typed no option there
            raise UsageError(f"{where}: settings come from {path} when resuming; only the budget "
                             f"(steps, episodes or --time-budget) and how to run ({RESUME_HOW}) may be given")
    # Resuming runs/latest-<domain>.h5 continues the run it links to, in place (an
    # atomic rewrite of the link itself would turn it into a separate copy).
    if path.is_symlink():
        target = Path(os.readlink(path))
        path = target if target.is_absolute() else path.parent / target

    # The lock before the read, held until the last write (released when the command
    # ends): a concurrent resume cannot write an older state over this one's.
    if not _writes_here(ctx):
        # A launcher (--nproc) or a rank other than 0 never writes: rank 0 locks the file
        # in the runner, so a lock held here would only block it.
        try:
            return load_run(path, expected_domain=domain)
        except RunFileError as error:
            raise UsageError(str(error)) from None
    lock = RunLock(path)
    try:
        lock.acquire()
    except LockBusy as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"{path}: cannot lock the run file ({error.strerror})") from None
    ctx.call_on_close(lock.release)
    try:
        stored = load_run(path, expected_domain=domain)
    except RunFileError as error:
        lock.release()
        raise UsageError(str(error)) from None
    stored.lock = lock
    return stored


def _writes_here(ctx: typer.Context) -> bool:
    """Whether this process writes the run file: one process alone, or rank 0 of a job."""

    world = env_world()
    if world is not None:
        return world[0] == 0
    return int(ctx.params.get("nproc") or 1) <= 1


def resume_time_budget(ctx: typer.Context, stored: Any, time_budget: float | None,
                       steps_option: str | list[str]) -> float | None:
    """The time budget of a resumed run: a new --time-budget (total learning seconds,
    at least what is already learned); none when a new step or episode budget is
    given (the run is extended to it, whatever budget it was trained under); else
    the stored one."""
    if given(ctx, "time_budget"):
        learned = float(stored.attrs.get("learning_seconds") or 0.0)
        if time_budget is not None and time_budget <= learned:
            raise UsageError(f"--time-budget ({time_budget:g}s) is not above what {stored.path} has already "
                               f"learned ({learned:.3g}s of learning)")
        return time_budget
    if any(given(ctx, name) for name in ([steps_option] if isinstance(steps_option, str) else steps_option)):
        return None
    return stored.config.get("time_budget")


def run_training(domain: str, params: Any, *, backend: str, device: str, time_budget: float | None,
                 out: Path | None, overwrite: bool, json_output: bool, checkpoint_every: str | None = None,
                 resume: Any = None, seeds: int = 1, nproc: int = 1, timeout: float = 60.0,
                 log_dir: Path | None = None, compile: bool | None = None, quiet: bool = False) -> None:
    """Shared tail of every ``train`` command: run the job (:func:`popplay.training.job.run`:
    seeds, ranks, resume), report, exit 130 if stopped."""
    defaulted = out is None and resume is None
    if resume is not None:
        out = resume.path
    base = out if out is not None else default_out(domain)
    options = JobOptions(backend=backend, device=device, compile=compile, time_budget=time_budget, out=base,
                         overwrite=overwrite, checkpoint_every=checkpoint_every, seeds=seeds, nproc=nproc,
                         timeout=timeout, log_dir=log_dir, argv=invocation())

    def reporter(silent: bool) -> Any:
        # Progress and status lines go to stderr, with --json too: stdout carries only
        # the results (the summary, or the --json object), so `popplay train ... >
        # result.txt` stays clean, and a long start is never silent. --quiet silences them.
        return reporter_for(sys.stderr, quiet=quiet or silent)

    spec = registry.get(domain)
    if resume is not None:  # before any rank starts
        problem = getattr(spec.experiment_type(), "resume_problem", lambda _: None)(params)
        if problem is not None:
            raise UsageError(problem)
        if job.world_size(spec, params, options) > 1 and not in_rank() and getattr(resume, "lock", None):
            # This process only launches the ranks (a deep topology's come from its layout,
            # which only the file said): rank 0 locks and writes the file, not the launcher.
            resume.lock.release()
    try:
        done = job.run(spec, params, options, resume=resume, reporter=reporter)
    except RunFileError as error:  # a full disk while saving: exit 1, the message says what is kept where
        raise PopplayError(str(error), getattr(error, "exit_code", 2)) from None
    except PopplayError:
        raise
    except ValueError as error:
        raise UsageError(str(error)) from None
    except RuntimeError as error:
        raise PopplayError(str(error), getattr(error, "exit_code", 1)) from None
    if not done.reports:  # a launcher (rank 0 reported) or a rank that only served
        if done.exit_code == 0 and defaulted and not in_rank():
            latest = link_latest(domain, base)
            if latest is not None:  # rank 0's summary could not name the link the launcher makes
                print(f"{latest} links to {base.name}", file=sys.stderr)
        raise typer.Exit(done.exit_code or 0)
    outcomes = done.outcomes
    diverged = [o.summary for o in outcomes if o.summary.get("diverged")]
    for outcome in outcomes:
        for warning in outcome.warnings:
            if not (diverged and outcome.summary is diverged[0] and warning == diverged[0]["diverged"]):
                print(f"Warning: {warning}", file=sys.stderr)  # (the first divergence is the error below)
    latest = link_latest(domain, done.outs[-1]) if defaulted else None
    summary = done.summary
    if json_output:
        print_json(summary if latest is None else {**summary, "latest": str(latest)})
    elif seeds == 1:
        print(summary_text(domain, outcomes[0]) + (f" (and {latest})" if latest is not None else ""))
    else:
        for outcome in outcomes:
            print(summary_text(domain, outcome))
        print(aggregate_text(domain, summary, job.aggregated_metrics(outcomes)))
    if not outcomes[-1].summary["complete"]:
        print(f"Stopped early; the run file {outcomes[-1].summary['out']} holds the state so far.", file=sys.stderr)
        raise typer.Exit(130)
    if diverged:  # saved whole, flagged in the run file's events: a NaN is not a result
        print(f"Error: {diverged[0]['diverged']}; the run file {diverged[0]['out']} holds it", file=sys.stderr)
        raise typer.Exit(1)
    if done.stop_requested:  # announced during the last phase: it finished, and says so
        print(f"Interrupted during the last phase, which finished; the run file {outcomes[-1].summary['out']} "
              "is complete.", file=sys.stderr)
        raise typer.Exit(130)


def aggregate_text(domain: str, summary: dict[str, Any], metrics: list[str]) -> str:
    shown = [f"{name} {format_metric(summary[name])}" + (
        f" ± {format_metric(summary[name + '_sem'])}" if summary[name + "_sem"] is not None else "")
        for name in metrics]
    lines = [f"{domain} over {summary['seeds']} seeds (mean ± standard error):"]
    for i in range(0, len(shown), 3):
        lines.append("  " + ", ".join(shown[i:i + 3]))
    return "\n".join(lines)


def link_latest(domain: str, path: Path) -> Path | None:
    """Point ``latest-<domain>.h5`` beside ``path`` at it (a relative symlink, replaced
    atomically), so that commands can name the newest run of a domain however many
    runs the directory holds. None where the file system has no symlinks."""
    link = path.parent / f"latest-{domain}.h5"
    temporary = path.parent / f".latest-{domain}.h5.{os.getpid()}"
    try:
        if temporary.is_symlink():
            temporary.unlink()
        os.symlink(path.name, temporary)
        os.replace(temporary, link)
    except OSError:
        return None
    return link


def warn(message: str) -> None:
    """One ``Warning: …`` line on stderr, before training starts (once per job)."""
    if speaks_for_job():
        print(f"Warning: {message}", file=sys.stderr, flush=True)


def check_schedule(params: Any, *, time_budget: float | None, agent_steps: int | None = None,
                   domain: str | None = None) -> None:
    """Validate ``params``, then warn where the run will not do what the options say:
    an ``agent_steps`` budget rounded down to whole steps per agent, or operators the
    budget never reaches (silently no sharing or no replication is not what anyone
    asking for them wants)."""
    try:
        params.validate()
        if domain is not None:  # a run that cannot start needs its refusal, not warnings about its schedule

            check_run_fits(domain, params)
    except ValueError as error:
        raise UsageError(str(error)) from None
    agents = getattr(params, "agents", 1)
    if agent_steps is not None and params.steps_per_agent * agents != agent_steps:
        warn(f"--agent-steps {agent_steps:,} is not a multiple of --agents {agents:,}: training "
             f"{params.steps_per_agent * agents:,} agent-steps per trial ({params.steps_per_agent:,} per agent)")
    if time_budget is not None:
        return
    own = getattr(params, "schedule_warnings", None)
    if own is not None:  # each domain knows which of its operators the budget reaches
        for line in own():
            warn(line)


SUMMARY_WIDTH = 100


def ranks_note(summary: dict[str, Any]) -> str:
    world = int(summary.get("world_size", 1))
    return f", {world} ranks" if world > 1 else ""


def summary_text(domain: str, outcome: Any) -> str:
    """The human summary: short lines broken between items (a terminal must never wrap
    a number), agent-steps counted over every trial and labelled where they are not."""

    summary = outcome.summary
    if registry.get(domain).kind == registry.DEEP:
        return deep_summary_text(domain, summary)
    experiment = outcome.experiment
    unit = getattr(experiment, "progress_unit", PER_TRIAL)
    trials = getattr(getattr(experiment, "params", None), "trials", None)
    items = [f"{k} {format_metric(summary[k])}" for k in outcome.result.curve.metrics]
    lines, line = [], f"{domain}:"
    for item in items:
        if len(line) + len(item) + 2 > SUMMARY_WIDTH and line != f"{domain}:":
            lines.append(line + ",")
            line = " "
        line += (" " if line.endswith(":") or line == " " else ", ") + item
    lines.append(line)
    if unit == PER_TRIAL and trials:
        budget = f"{summary['agent_steps_per_trial']:,} agent-steps per trial x {trials:,} trials = "
    else:
        budget = f"{experiment.progress(outcome.result.state):,} {unit}: "
    lines.append(f"  {budget}{summary['agent_steps']:,} agent-steps")
    lines.append(f"  {summary['seconds']:.2f}s of learning, {format_rate(summary['agent_steps_per_second'])} "
                 f"agent-steps/s ({summary['backend']} on {summary['device']}{ranks_note(summary)})")
    lines.append(f"  wrote {summary['out']}")
    return "\n".join(lines)



def deep_summary_text(domain: str, summary: dict[str, Any]) -> str:
    """A deep run's summary: quality from greedy episodes, env-steps and their rate."""
    quality = "not measured" if summary["quality"] is None else f"{summary['quality']:.1f}"
    if summary.get("agents", 1) > 1 and summary["quality"] is not None:  # a population: its spread too
        quality = (f"{quality} (member {summary['best_member']}; mean {summary['quality_mean']:.1f}, "
                   f"worst {summary['quality_worst']:.1f} of {summary['agents']} members)")
    extra = f", running reward {summary['running_reward']:.1f}" if "running_reward" in summary else ""
    ranks = summary["ranks"]
    return (f"{domain} on {summary['env']} ({summary['topology']}, {ranks} rank{'s' if ranks != 1 else ''}): quality "
            f"{quality} (mean of {summary['eval_episodes']} greedy episodes){extra} after {summary['episodes']:,} "
            f"episodes, {summary['env_steps']:,} env-steps in {summary['seconds']:.1f}s "
            f"({summary['env_steps_per_second']:,.0f} env-steps/s); wrote {summary['out']}")
