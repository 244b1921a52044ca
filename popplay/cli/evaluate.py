"""``popplay evaluate RUN.h5``: measure a stored population again."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from popplay.cli import app
from popplay.cli.common import CommandError, print_json


@app.command("evaluate")
def evaluate(
    run: Annotated[Path, typer.Argument(help="A run file written by `popplay train`.", metavar="RUN.h5", dir_okay=False)],
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on the last line.")] = False,
) -> None:
    """Re-measure the population stored in a run file (bandit: block-estimate quality)."""
    from popplay.checkpoints.runfile import RunFileError, read_run
    from popplay.populations import registry
    from popplay.populations.base import Backend

    try:
        stored = read_run(run)
    except RunFileError as error:
        raise CommandError(str(error)) from None
    if stored.domain not in registry.DOMAINS:
        raise CommandError(f"{run}: unknown domain {stored.domain!r}")
    try:
        params = registry.params_from_config(stored.domain, stored.config)
        experiment = registry.build(stored.domain, params, Backend("numba", "cpu"))
        state = experiment.restore(stored.state, stored.state_counters)
    except (TypeError, ValueError, KeyError) as error:
        raise CommandError(f"{run}: damaged run file ({error})") from None
    metrics = experiment.measure(state)
    payload = {"domain": stored.domain, "path": str(run), "complete": stored.complete,
               "agent_steps_per_trial": experiment.agent_steps(state),
               "agent_steps": experiment.total_agent_steps(state), **metrics}
    if json_output:
        print_json(payload)
    else:
        shown = ", ".join(f"{name} {value:.4g}" for name, value in metrics.items())
        print(f"{run}: {stored.domain} run, {payload['agent_steps_per_trial']:,} agent-steps per trial"
              f"{'' if stored.complete else ' (stopped early)'}: {shown}")
