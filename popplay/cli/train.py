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


def run_training(domain: str, params: Any, *, backend: str, device: str, time_budget: float | None,
                 out: Path | None, overwrite: bool, json_output: bool) -> None:
    """Shared tail of every ``train`` command: run, report, exit 130 if stopped."""
    from popplay.console import reporter_for
    from popplay.runner import TrainOptions, UsageProblem, train

    options = TrainOptions(backend=backend, device=device, time_budget=time_budget,
                           out=out if out is not None else default_out(domain), overwrite=overwrite)
    reporter = reporter_for(sys.stderr if json_output else sys.stdout, quiet=json_output and not sys.stderr.isatty())
    try:
        with stop_on_signals() as should_stop:
            outcome = train(domain, params, options, reporter=reporter, should_stop=should_stop)
    except UsageProblem as error:
        raise CommandError(str(error)) from None
    finally:
        reporter.close()
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


def _register_domains() -> None:
    from importlib import import_module

    for name in ("train_bandit", "train_cartpole", "train_knights"):
        module = f"popplay.cli.{name}"
        try:
            import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:  # a real import failure inside the module
                raise


_register_domains()
