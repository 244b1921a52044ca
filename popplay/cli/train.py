"""``popplay train DOMAIN``: the train command group (one module per domain)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from popplay.cli import app
from popplay.cli.common import CommandError, default_out, print_json, stop_on_signals

train_app = typer.Typer(help="Train a population on a domain and write a run file.", no_args_is_help=True)
app.add_typer(train_app, name="train")


from popplay.cli.common import given  # noqa: E402
# Options a resumed run may still be given: the new budget and how (not what) to run.
RESUME_ALLOWED = {"resume", "agent_steps", "episodes", "time_budget", "checkpoint_every", "backend", "device",
                  "json_output", "nproc", "timeout"}


def load_resume(ctx: typer.Context, domain: str, path: Path) -> Any:
    """Read the run file to resume; refuse options that would change its settings."""
    from popplay.checkpoints.runfile import RunFileError, read_run

    for param in ctx.command.params:
        if param.name in RESUME_ALLOWED:
            continue
        if given(ctx, param.name):
            raise CommandError(f"{param.opts[0]}: settings come from {path} when resuming; only the budget "
                               "(steps, episodes or --time-budget), --checkpoint-every, --backend, --device, "
                               "--nproc, --timeout and --json may be given")
    from popplay.checkpoints.lock import LockBusy, RunLock

    # The lock before the read, held until the last write (released when the command
    # ends): a concurrent resume cannot write an older state over this one's.
    if not _writes_here(ctx):
        # A launcher (--nproc) or a rank other than 0 never writes: rank 0 locks the file
        # in the runner, so a lock held here would only block it.
        try:
            return read_run(path, expected_domain=domain)
        except RunFileError as error:
            raise CommandError(str(error)) from None
    lock = RunLock(path)
    try:
        lock.acquire()
    except LockBusy as error:
        raise CommandError(str(error)) from None
    except OSError as error:
        raise CommandError(f"{path}: cannot lock the run file ({error.strerror})") from None
    ctx.call_on_close(lock.release)
    try:
        stored = read_run(path, expected_domain=domain)
    except RunFileError as error:
        lock.release()
        raise CommandError(str(error)) from None
    stored.lock = lock
    return stored


def _writes_here(ctx: typer.Context) -> bool:
    """Whether this process writes the run file: one process alone, or rank 0 of a job."""
    from popplay.distributed.group import env_world

    world = env_world()
    if world is not None:
        return world[0] == 0
    return int(ctx.params.get("nproc") or 1) <= 1


def resumed_params(domain: str, stored: Any, **budget: Any) -> Any:
    """The stored run's parameters with a new budget."""
    import dataclasses

    from popplay.validation import params_from_config

    try:
        params = params_from_config(domain, stored.config)
    except (TypeError, ValueError) as error:
        raise CommandError(f"{stored.path}: damaged config ({error})") from None
    return dataclasses.replace(params, **{k: v for k, v in budget.items() if v is not None})


def resume_time_budget(ctx: typer.Context, stored: Any, time_budget: float | None, steps_option: str) -> float | None:
    """The time budget of a resumed run: a new --time-budget (total learning seconds,
    at least what is already learned); none when a new step or episode budget is
    given (the run is extended to it, whatever budget it was trained under); else
    the stored one."""
    if given(ctx, "time_budget"):
        learned = float(stored.attrs.get("learning_seconds") or 0.0)
        if time_budget is not None and time_budget <= learned:
            raise CommandError(f"--time-budget ({time_budget:g}s) is not above what {stored.path} has already "
                               f"learned ({learned:.3g}s of learning)")
        return time_budget
    if given(ctx, steps_option):
        return None
    return stored.config.get("time_budget")


def run_training(domain: str, params: Any, *, backend: str, device: str, time_budget: float | None,
                 out: Path | None, overwrite: bool, json_output: bool, checkpoint_every: str | None = None,
                 resume: Any = None, nproc: int = 1, timeout: float = 60.0) -> None:
    """Shared tail of every ``train`` command: run, report, exit 130 if stopped.

    ``nproc`` > 1 launches that many ranks of this command (popplay.distributed.train);
    inside a rank (ours or torchrun's) the run is sharded over the job."""
    from popplay.checkpoints.runfile import RunFileError
    from popplay.console import reporter_for
    from popplay.distributed import train as sharded
    from popplay.runner import CheckpointEvery, TrainOptions, UsageProblem, train

    try:
        every = CheckpointEvery.parse(checkpoint_every) if checkpoint_every is not None else None
    except UsageProblem as error:
        raise CommandError(str(error)) from None
    if resume is not None:
        out = resume.path
    out = out if out is not None else default_out(domain)
    if sharded.wants_launch(nproc):
        from popplay.cli import ARGV

        try:
            sharded.check_divisible(params, nproc)
        except ValueError as error:
            raise CommandError(str(error)) from None
        if ARGV is None:
            raise CommandError("--nproc: start popplay from its command line (popplay.cli.main)")
        raise typer.Exit(sharded.launch_training(ARGV, nproc, timeout, out))
    reporter = None
    stop_requested = False
    try:
        with sharded.rank_session(nproc, timeout, device) as dist:
            sharded.check_supported(dist, domain=domain, time_budget=time_budget)
            resume = sharded.restarted_resume(domain, params, out, resume)
            options = TrainOptions(backend=backend, device=device, time_budget=time_budget, out=out,
                                   overwrite=overwrite, checkpoint_every=every, writer=dist.is_writer)
            reporter = reporter_for(sys.stderr if json_output else sys.stdout,
                                    quiet=(json_output and not sys.stderr.isatty()) or not dist.is_writer)
            with stop_on_signals() as should_stop:
                outcome = train(domain, params, options, reporter=reporter,
                                should_stop=sharded.agreed_stop(should_stop, dist), resume=resume)
                stop_requested = should_stop()
    except RunFileError as error:  # a full disk while saving: exit 1, the message says what is kept where
        raise CommandError(str(error), getattr(error, "exit_code", 2)) from None
    except (UsageProblem, ValueError) as error:
        raise CommandError(str(error)) from None
    except RuntimeError as error:
        raise CommandError(str(error), exit_code=getattr(error, "exit_code", 1)) from None
    finally:
        if reporter is not None:
            reporter.close()
    if not dist.is_writer:
        raise typer.Exit(0 if outcome.summary["complete"] else 130)
    outcome.summary.update(sharded.summary_fields(dist))
    for warning in outcome.warnings:
        print(f"Warning: {warning}", file=sys.stderr)
    summary = outcome.summary
    if json_output:
        print_json(summary)
    else:
        metrics = ", ".join(f"{k} {summary[k]:.4g}" for k in outcome.result.curve.metrics)
        print(f"{domain}: {metrics} after {summary['agent_steps']:,} agent-steps in "
              f"{summary['seconds']:.2f}s of learning ({summary['agent_steps_per_second']:,.0f} agent-steps/s, "
              f"{summary['backend']} on {summary['device']}{ranks_note(summary)}); wrote {summary['out']}")
    if not summary["complete"]:
        print(f"Stopped early; the run file {summary['out']} holds the state so far.", file=sys.stderr)
        raise typer.Exit(130)
    if stop_requested:  # announced during the last phase: it finished, and says so
        print(f"Interrupted during the last phase, which finished; the run file {summary['out']} is complete.",
              file=sys.stderr)
        raise typer.Exit(130)


def ranks_note(summary: dict[str, Any]) -> str:
    world = int(summary.get("world_size", 1))
    return f", {world} ranks" if world > 1 else ""


# Each domain module registers its `popplay train <domain>` subcommand on import.
from popplay.cli import train_bandit, train_cartpole, train_knights  # noqa: E402,F401
from popplay.cli import train_dqn, train_exarl, train_gorila, train_reinforce  # noqa: E402,F401
