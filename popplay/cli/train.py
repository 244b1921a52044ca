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
RESUME_ALLOWED = {"resume", "agent_steps", "episodes", "checkpoint_every", "backend", "device", "json_output",
                  "log_dir"}


def load_resume(ctx: typer.Context, domain: str, path: Path) -> Any:
    """Read the run file to resume; refuse options that would change its settings."""
    from popplay.checkpoints.runfile import RunFileError, read_run

    for param in ctx.command.params:
        if param.name in RESUME_ALLOWED:
            continue
        if given(ctx, param.name):
            raise CommandError(f"{param.opts[0]}: settings come from {path} when resuming; only the budget, "
                               "--checkpoint-every, --backend, --device and --json may be given")
    try:
        return read_run(path, expected_domain=domain)
    except RunFileError as error:
        raise CommandError(str(error)) from None


def resumed_params(domain: str, stored: Any, **budget: Any) -> Any:
    """The stored run's parameters with a new budget."""
    import dataclasses

    from popplay.populations import registry

    try:
        params = registry.params_from_config(domain, stored.config)
    except (TypeError, ValueError) as error:
        raise CommandError(f"{stored.path}: damaged config ({error})") from None
    return dataclasses.replace(params, **{k: v for k, v in budget.items() if v is not None})


def run_training(domain: str, params: Any, *, backend: str, device: str, time_budget: float | None,
                 out: Path | None, overwrite: bool, json_output: bool, checkpoint_every: str | None = None,
                 resume: Any = None, log_dir: Path | None = None) -> None:
    """Shared tail of every ``train`` command: run, report, exit 130 if stopped."""
    from popplay.console import reporter_for
    from popplay.runner import CheckpointEvery, TrainOptions, UsageProblem, train

    try:
        every = CheckpointEvery.parse(checkpoint_every) if checkpoint_every else None
    except UsageProblem as error:
        raise CommandError(str(error)) from None
    if resume is not None:
        out = resume.path
    options = TrainOptions(backend=backend, device=device, time_budget=time_budget,
                           out=out if out is not None else default_out(domain), overwrite=overwrite,
                           checkpoint_every=every, log_dir=log_dir)
    reporter = reporter_for(sys.stderr if json_output else sys.stdout, quiet=json_output and not sys.stderr.isatty())
    try:
        with stop_on_signals() as should_stop:
            outcome = train(domain, params, options, reporter=reporter, should_stop=should_stop, resume=resume)
    except UsageProblem as error:
        raise CommandError(str(error)) from None
    finally:
        reporter.close()
    for warning in outcome.warnings:
        print(f"Warning: {warning}", file=sys.stderr)
    summary = outcome.summary
    if json_output:
        print_json(summary)
    else:
        metrics = ", ".join(f"{k} {summary[k]:.4g}" for k in outcome.result.curve.metrics)
        print(f"{domain}: {metrics} after {summary['agent_steps']:,} agent-steps in "
              f"{summary['seconds']:.2f}s of learning ({summary['agent_steps_per_second']:,.0f} agent-steps/s, "
              f"{summary['backend']} on {summary['device']}); wrote {summary['out']}")
    if not summary["complete"]:
        print(f"Stopped early; the run file {summary['out']} holds the state so far.", file=sys.stderr)
        raise typer.Exit(130)


# Each domain module registers its `popplay train <domain>` subcommand on import.
from popplay.cli import train_bandit, train_cartpole, train_knights  # noqa: E402,F401
