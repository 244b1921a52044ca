"""``popplay train DOMAIN``: the train command group (one module per domain)."""
from __future__ import annotations

import os
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
                  "json_output", "config", "nproc", "timeout", "log_dir"}


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
    # Resuming runs/latest-<domain>.h5 continues the run it links to, in place (an
    # atomic rewrite of the link itself would turn it into a separate copy).
    if path.is_symlink():
        target = Path(os.readlink(path))
        path = target if target.is_absolute() else path.parent / target
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
                 resume: Any = None, seeds: int = 1, nproc: int = 1, timeout: float = 60.0,
                 log_dir: Path | None = None) -> None:
    """Shared tail of every ``train`` command: run, report, exit 130 if stopped.

    ``seeds`` > 1 trains seeds ``params.seed``, +1, … one after another (a run file
    each) and reports every metric's mean and standard error over them. ``nproc`` > 1
    launches that many ranks of this command (popplay.distributed.train); inside a rank
    (ours or torchrun's) the run is sharded over the job."""
    from popplay.distributed import train as sharded
    from popplay.runner import CheckpointEvery, TrainOptions, UsageProblem

    try:
        every = CheckpointEvery.parse(checkpoint_every) if checkpoint_every is not None else None
    except UsageProblem as error:
        raise CommandError(str(error)) from None
    if seeds < 1:
        raise CommandError(f"--seeds must be at least 1 (got {seeds})")
    if seeds > 1 and resume is not None:
        raise CommandError("--seeds: resume each seed's run file on its own")
    if seeds > 1 and (nproc > 1 or sharded.in_rank()):
        raise CommandError("--seeds: run one seed per job when training over several ranks")
    defaulted = out is None and resume is None
    if resume is not None:
        out = resume.path
    base = out if out is not None else default_out(domain)
    if sharded.wants_launch(nproc):
        from popplay.cli import ARGV

        try:
            from popplay.populations.registry import DOMAINS

            sharded.check_divisible(params, nproc, splits_trials=DOMAINS[domain].splits_trials)
        except ValueError as error:
            raise CommandError(str(error)) from None
        if ARGV is None or not any(a == "--nproc" or a.startswith("--nproc=") for a in ARGV):
            raise CommandError("--nproc: start popplay from its command line (popplay.cli.main)")
        code = sharded.launch_training(ARGV, nproc, timeout, base)
        if code == 0 and defaulted:
            link_latest(domain, base)
        raise typer.Exit(code)
    if seeds == 1:
        plan = [(params, base)]
    else:
        import dataclasses

        plan = [(dataclasses.replace(params, seed=params.seed + k),
                 base.with_name(f"{base.stem}-seed{params.seed + k}{base.suffix}")) for k in range(seeds)]
        clash = [str(path) for _, path in plan if path.exists()]
        if clash and not overwrite:
            raise CommandError(f"--out {clash[0]}: file exists (pass --overwrite to replace it)")
    outcomes = []
    stop_requested = False
    for run_params, path in plan:
        logs = log_dir if log_dir is None or seeds == 1 else Path(log_dir) / f"seed{run_params.seed}"
        options = TrainOptions(backend=backend, device=device, time_budget=time_budget, out=path,
                               overwrite=overwrite, checkpoint_every=every, log_dir=logs)
        outcome, stop_requested = _train_one(domain, run_params, options, json_output=json_output, resume=resume,
                                             nproc=nproc, timeout=timeout)
        outcomes.append(outcome)
        if not outcome.summary["complete"] or stop_requested:
            break
    latest = link_latest(domain, plan[len(outcomes) - 1][1]) if defaulted else None
    summary = outcomes[-1].summary if seeds == 1 else aggregate(outcomes)
    if json_output:
        print_json(summary if latest is None else {**summary, "latest": str(latest)})
    elif seeds == 1:
        print(summary_text(domain, outcomes[0]) + (f" (and {latest})" if latest is not None else ""))
    else:
        for outcome in outcomes:
            print(summary_text(domain, outcome))
        print(aggregate_text(domain, summary, [name for name in outcomes[0].result.curve.metrics]))
    if not outcomes[-1].summary["complete"]:
        print(f"Stopped early; the run file {outcomes[-1].summary['out']} holds the state so far.", file=sys.stderr)
        raise typer.Exit(130)
    if stop_requested:  # announced during the last phase: it finished, and says so
        print(f"Interrupted during the last phase, which finished; the run file {outcomes[-1].summary['out']} "
              "is complete.", file=sys.stderr)
        raise typer.Exit(130)


def _train_one(domain: str, params: Any, options: Any, *, json_output: bool, resume: Any, nproc: int = 1,
               timeout: float = 60.0) -> tuple[Any, bool]:
    """One run (this rank's share of it, inside a job): the outcome, and whether a stop
    was asked for during it. A rank other than 0 exits here: only rank 0 reports."""
    import dataclasses

    from popplay.checkpoints.runfile import RunFileError
    from popplay.console import reporter_for
    from popplay.distributed import train as sharded
    from popplay.runner import UsageProblem, train

    reporter = None
    stop_requested = False
    try:
        with sharded.rank_session(nproc, timeout, options.device) as dist:
            sharded.check_supported(dist, domain=domain)
            resume = sharded.restarted_resume(domain, params, options.out, resume)
            options = dataclasses.replace(options, writer=dist.is_writer)
            # Progress and status lines go to stderr: stdout carries only the results (the
            # summary, or the --json object), so `popplay train ... > result.txt` stays clean.
            reporter = reporter_for(sys.stderr, quiet=(json_output and not sys.stderr.isatty()) or not dist.is_writer)
            with stop_on_signals() as should_stop:
                outcome = train(domain, params, options, reporter=reporter,
                                should_stop=sharded.agreed_stop(should_stop, dist), resume=resume,
                                ranks=sharded.rank_sync(dist))
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
    return outcome, stop_requested


def aggregate(outcomes: list[Any]) -> dict[str, Any]:
    """Several seeds' summaries as one: each metric's mean (under its own name), its
    standard error over seeds (``<name>_sem``, sample standard deviation / sqrt(n))
    and values (``<name>_values``); agent-steps and seconds summed; ``runs`` holds
    every seed's own summary."""
    import math

    summaries = [o.summary for o in outcomes]
    first = summaries[0]
    out: dict[str, Any] = {"domain": first["domain"], "seeds": len(summaries), "runs": summaries,
                           "backend": first["backend"], "device": first["device"],
                           "complete": all(s["complete"] for s in summaries), "out": [s["out"] for s in summaries]}
    for name in outcomes[0].result.curve.metrics:
        values = [float(s[name]) for s in summaries]
        mean = sum(values) / len(values)
        sem = (math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
               if len(values) > 1 else None)  # a stop after the first seed: no spread to report
        out.update({name: mean, f"{name}_sem": sem, f"{name}_values": values})
    out["agent_steps"] = sum(s["agent_steps"] for s in summaries)
    out["agent_steps_per_trial"] = first["agent_steps_per_trial"]
    out["seconds"] = sum(s["seconds"] for s in summaries)
    out["agent_steps_per_second"] = out["agent_steps"] / out["seconds"] if out["seconds"] > 0 else 0.0
    out["phases"] = sum(s["phases"] for s in summaries)
    return out


def aggregate_text(domain: str, summary: dict[str, Any], metrics: list[str]) -> str:
    from popplay.console import format_metric

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
    """One ``Warning: …`` line on stderr, before training starts."""
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
            from popplay.limits import check_run_fits

            check_run_fits(domain, params)
    except ValueError as error:
        raise CommandError(str(error)) from None
    agents = getattr(params, "agents", 1)
    if agent_steps is not None and params.steps_per_agent * agents != agent_steps:
        warn(f"--agent-steps {agent_steps:,} is not a multiple of --agents {agents:,}: training "
             f"{params.steps_per_agent * agents:,} agent-steps per trial ({params.steps_per_agent:,} per agent)")
    if time_budget is not None:
        return
    per_agent = getattr(params, "steps_per_agent", None)
    share_every = getattr(params, "share_every", None)
    if per_agent is not None and share_every is not None and share_every > per_agent:
        warn(f"--share-every {share_every:,} is more than the {per_agent:,} steps each agent takes: the agents "
             "learn alone and share only once, at the end")
    replicate_every = getattr(params, "replicate_every", 0)
    if replicate_every:
        if hasattr(params, "episodes"):
            phases, unit = params.episodes, "episodes"
        else:
            phases, unit = -(-per_agent // share_every), "shares"
        if replicate_every > phases:
            warn(f"--replicate-every {replicate_every:,} is more than the run's {phases:,} {unit}: "
                 "no replication will happen")


SUMMARY_WIDTH = 100


def ranks_note(summary: dict[str, Any]) -> str:
    world = int(summary.get("world_size", 1))
    return f", {world} ranks" if world > 1 else ""


def summary_text(domain: str, outcome: Any) -> str:
    """The human summary: short lines broken between items (a terminal must never wrap
    a number), agent-steps counted over every trial and labelled where they are not."""
    from popplay.console import format_metric, format_rate
    from popplay.runner import PER_TRIAL

    summary = outcome.summary
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


# Each domain module registers its `popplay train <domain>` subcommand on import.
from popplay.cli import train_bandit, train_cartpole, train_knights  # noqa: E402,F401
from popplay.cli import train_dqn, train_exarl, train_gorila, train_reinforce  # noqa: E402,F401
