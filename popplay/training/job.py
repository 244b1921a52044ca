"""A training job, for every domain: one or several seeds, in this process or over
ranks, each run through :func:`popplay.training.pipeline.train`.

The command line and the Python API describe what to learn (a domain's parameters)
and how (:class:`JobOptions`); this module decides where it runs:

- several ranks are needed (``--nproc N`` for a population, a deep topology's
  actors, simulators or workers) and this process is not one of them: it launches
  them, each running the same command line (:func:`popplay.distributed.launch.launch_local`);
- inside a rank: the process group is started; population ranks all run the phases
  together (each holds a share of the population), a deep topology's rank 0 runs
  the phases while the other ranks serve it (``experiment.serve``);
- ``seeds`` > 1: the seeds one after another, a run file each, and every metric's
  mean and standard error over them.
"""
from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from popplay.checkpoints.runfile import check_writable
from popplay.core.errors import EXIT_INTERRUPTED, UsageError
from popplay.core.registry import POPULATION, DomainSpec
from popplay.distributed.group import set_role
from popplay.distributed.launch import in_rank, launch_local
from popplay.training import ranks as sharded
from popplay.training.pipeline import CheckpointEvery, TrainOptions, TrainOutcome, train


@dataclass(frozen=True)
class JobOptions:
    """How to run a job (as opposed to what to learn: the domain's parameters)."""

    backend: str = "auto"
    device: str = "auto"
    compile: bool | None = None  # the torch engines' steps through torch.compile; None: on CUDA only
    time_budget: float | None = None
    out: Path | None = None  # the run file (its seeds' files are named after it)
    overwrite: bool = False
    checkpoint_every: str | None = None
    seeds: int = 1
    nproc: int = 1  # ranks a population is sharded over
    timeout: float = 60.0  # seconds a rank may go silent
    log_dir: Path | None = None
    #: The command line (after ``popplay``) every launched rank runs; needed to launch.
    argv: list[str] | None = None


@dataclass
class JobOutcome:
    """What the job did: every seed's outcome (empty in a launcher, and on ranks that
    only serve), the summary to report, and how it ended."""

    outcomes: list[TrainOutcome] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    stop_requested: bool = False  # a stop was asked for during the last phase, which finished
    exit_code: int | None = None  # a launcher: the job's exit code; a serving rank: 0 or 130
    outs: list[Path] = field(default_factory=list)

    @property
    def reports(self) -> bool:
        """Whether this process reports the results (one process alone, or rank 0)."""
        return self.exit_code is None


def symmetric(spec: DomainSpec, params: Any) -> bool:
    """Whether every rank runs the phases on its share of the members (a population:
    Bell's, or a deep agent's ``--agents P``) rather than serving rank 0 in a topology."""
    return spec.kind == POPULATION or bool(getattr(params, "shards_members", False))


def world_size(spec: DomainSpec, params: Any, options: JobOptions) -> int:
    """How many ranks the job has: ``--nproc`` for a population, the topology's ranks for a deep agent."""
    return options.nproc if symmetric(spec, params) else int(getattr(params, "ranks", 1))


def run(spec: DomainSpec, params: Any, options: JobOptions, *, resume: Any = None,
        reporter: Callable[[bool], Any] | None = None) -> JobOutcome:
    """Run the job; ``reporter(quiet)`` makes the console of one run (None: none)."""
    every = CheckpointEvery.parse(options.checkpoint_every) if options.checkpoint_every is not None else None
    if options.seeds < 1:
        raise UsageError(f"--seeds must be at least 1 (got {options.seeds})")
    if options.seeds > 1 and resume is not None:
        raise UsageError("--seeds: resume each seed's run file on its own")
    world = world_size(spec, params, options)
    # a device the run cannot use: refused before any rank starts
    spec.backend(options.backend, options.device, compile=options.compile)
    if not symmetric(spec, params) and options.nproc > 1:
        raise UsageError(f"--nproc: a {spec.name} run's ranks come from its layout (--topology or --workflow and "
                         f"its rank counts: {world} here), not --nproc")
    if options.seeds > 1 and (world > 1 or in_rank()):
        raise UsageError("--seeds: run one seed per job when training over several ranks")
    base = Path(options.out)
    if world > 1 and not in_rank():
        return JobOutcome(exit_code=_launch(spec, params, options, base, world, resume), outs=[base])
    plan = seed_plan(params, base, options.seeds, options.overwrite)
    job = JobOutcome()
    for run_params, path in plan:
        logs = seed_log_dir(options.log_dir, options.seeds, run_params.seed)
        train_options = TrainOptions(backend=options.backend, device=options.device, compile=options.compile,
                                     time_budget=options.time_budget, out=path, overwrite=options.overwrite,
                                     checkpoint_every=every, log_dir=logs)
        outcome, job.stop_requested = _train_one(spec, run_params, train_options, world=world, timeout=options.timeout,
                                                 resume=resume, reporter=reporter)
        if outcome is None:  # a rank that served rank 0: nothing of its own to report
            return JobOutcome(exit_code=0 if not job.stop_requested else EXIT_INTERRUPTED)
        job.outcomes.append(outcome)
        job.outs.append(path)
        if not outcome.summary["complete"] or job.stop_requested:
            break
    job.summary = job.outcomes[0].summary if options.seeds == 1 else aggregate(job.outcomes)
    return job


#: Local ranks a machine may be asked to hold, per core: beyond it a layout's processes
#: only fight over the cores and the memory (a typo such as --simulators 100000 once
#: started hundreds of ranks and woke the kernel's OOM killer). POPPLAY_MAX_RANKS sets
#: the bound itself.
RANKS_PER_CORE = 8


def max_local_ranks() -> int:
    """How many ranks one local job may start on this machine."""
    try:
        return max(1, int(os.environ["POPPLAY_MAX_RANKS"]))
    except (KeyError, ValueError):
        return RANKS_PER_CORE * (os.cpu_count() or 1)


def _launch(spec: DomainSpec, params: Any, options: JobOptions, out: Path, world: int, resume: Any) -> int:
    """Start ``world`` local ranks running this job's command line; their exit code."""
    limit = max_local_ranks()
    if world > limit:
        raise UsageError(f"this run would start {world:,} processes; this machine takes at most {limit:,} "
                         f"({RANKS_PER_CORE} per core, or POPPLAY_MAX_RANKS): lower --nproc or the ranks of its "
                         "layout (--simulators, --workers, --learners, --actors)")
    if symmetric(spec, params):
        try:
            sharded.check_divisible(params, world, splits_trials=spec.splits_trials)
            own = getattr(params, "check_ranks", None)  # what else the parameters cannot do over ranks
            if own is not None:
                own(world)
        except ValueError as error:
            raise UsageError(str(error)) from None
    if spec.kind != POPULATION:
        check_writable(out, overwrite=options.overwrite, resume=resume is not None)
    if options.argv is None:
        raise UsageError("several ranks: start popplay from its command line (popplay.cli.main)")
    argv = sharded.with_out(options.argv, out)
    # Deep topologies' networks are tiny: one thread a rank (more only spin against each
    # other); populations, deep ones included, share the usable cores between their ranks.
    threads = None if spec.kind == POPULATION or symmetric(spec, params) else 1
    return launch_local(argv, world, timeout=options.timeout, threads_per_rank=threads,
                        describe_lost=lambda: sharded.describe_checkpoint(out))


def _train_one(spec: DomainSpec, params: Any, options: TrainOptions, *, world: int, timeout: float, resume: Any,
               reporter: Callable[[bool], Any] | None) -> tuple[TrainOutcome | None, bool]:
    """One run (this rank's part of it, inside a job): its outcome (None on a rank that
    only serves rank 0), and whether a stop was asked for during it."""
    console = None
    stop_requested = False
    experiment_type = spec.experiment_type()
    every_rank = symmetric(spec, params)  # every rank runs the phases, on its share of the population
    # A deep topology's messages travel over gloo as CPU tensors, wherever its learner computes.
    with sharded.rank_session(world, timeout if every_rank else getattr(params, "timeout", timeout),
                              options.device if every_rank else "cpu") as dist:
        sharded.check_supported(dist, spec=spec, world=world, symmetric=every_rank)
        if dist.distributed and not every_rank:
            set_role(experiment_type.role(params, dist.rank))
            if dist.rank != 0:
                # The launcher forwards Ctrl-C to every rank; rank 0 alone decides when to stop.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                experiment_type.serve(dist, params, resume)
                return None, False
        resume = sharded.restarted_resume(spec.name, params, options.out, resume)
        options = dataclasses.replace(options, writer=dist.is_writer)
        console = reporter(not dist.is_writer) if reporter is not None else None
        try:
            with stop_on_signals() as should_stop:
                outcome = train(spec.name, params, options, reporter=console,
                                should_stop=sharded.agreed_stop(should_stop, dist) if every_rank else should_stop,
                                resume=resume, ranks=sharded.rank_sync(dist) if every_rank else None)
                stop_requested = should_stop()
        finally:
            if console is not None:
                console.close()
    if not dist.is_writer:
        return None, stop_requested
    outcome.summary.update(sharded.summary_fields(dist) if every_rank else {})
    return outcome, stop_requested


def aggregate(outcomes: list[TrainOutcome]) -> dict[str, Any]:
    """Several seeds' summaries as one: each metric's mean (under its own name), its
    standard error over seeds (``<name>_sem``, sample standard deviation / sqrt(n))
    and values (``<name>_values``); steps and seconds summed; ``runs`` holds every
    seed's own summary."""
    return aggregate_summaries([o.summary for o in outcomes], aggregated_metrics(outcomes))


def aggregate_summaries(summaries: list[dict[str, Any]], metrics: list[str]) -> dict[str, Any]:
    """:func:`aggregate` of the seeds' ``--json`` summaries, averaging ``metrics`` (a
    domain with its own runner names them)."""
    first = summaries[0]
    out: dict[str, Any] = {"domain": first["domain"], "seeds": len(summaries), "runs": summaries,
                           "backend": first.get("backend"), "device": first.get("device"),
                           "complete": all(s["complete"] for s in summaries), "out": [s["out"] for s in summaries]}
    if "compile" in first:  # every seed runs as the first did
        out["compile"] = first["compile"]
    for name in metrics:
        values = [float(s[name]) for s in summaries]
        mean = sum(values) / len(values)
        sem = (math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
               if len(values) > 1 else None)  # a stop after the first seed: no spread to report
        out.update({name: mean, f"{name}_sem": sem, f"{name}_values": values})
    for steps in ("agent_steps", "env_steps", "phases"):
        if steps in first:
            out[steps] = sum(s[steps] for s in summaries)
    if "agent_steps_per_trial" in first:
        out["agent_steps_per_trial"] = first["agent_steps_per_trial"]
    out["seconds"] = sum(s["seconds"] for s in summaries)
    steps = out.get("agent_steps", out.get("env_steps", 0))
    out["agent_steps_per_second"] = steps / out["seconds"] if out["seconds"] > 0 else 0.0
    return out


def seed_plan(params: Any, base: Path, seeds: int, overwrite: bool) -> list[tuple[Any, Path]]:
    """Each seed's parameters and run file (``OUT-seedS.h5`` beside ``--out``), refusing
    files that exist unless ``overwrite``."""
    if seeds == 1:
        return [(params, base)]
    plan = [(dataclasses.replace(params, seed=params.seed + k),
             base.with_name(f"{base.stem}-seed{params.seed + k}{base.suffix}")) for k in range(seeds)]
    clash = [str(path) for _, path in plan if path.exists()]
    if clash and not overwrite:
        raise UsageError(f"--out {clash[0]}: file exists (pass --overwrite to replace it)")
    return plan


def seed_log_dir(log_dir: Path | None, seeds: int, seed: int) -> Path | None:
    """Where seed ``seed``'s scalar logs go: ``--log-dir`` itself for one seed, a
    ``seedS`` directory in it for several."""
    return log_dir if log_dir is None or seeds == 1 else Path(log_dir) / f"seed{seed}"


def aggregated_metrics(outcomes: list[TrainOutcome]) -> list[str]:
    """The numbers every seed reports that :func:`aggregate` averages: the curves'
    metrics and, where a run measures it at the end only (deep agents), ``quality``."""
    names = list(outcomes[0].result.curve.metrics)
    if "quality" not in names and all(isinstance(o.summary.get("quality"), (int, float)) for o in outcomes):
        names.insert(0, "quality")
    return names


@contextmanager
def stop_on_signals() -> Iterator[Callable[[], bool]]:
    """First Ctrl-C (or SIGTERM) asks the run to stop after the current phase and
    save; the run file is then written before the process exits."""
    requested = {"stop": False}
    previous = {}

    def handler(signum: int, frame: Any) -> None:
        if requested["stop"]:
            return  # a second request must not interrupt the save
        requested["stop"] = True
        print("\nStopping after the current phase and saving the run file...", file=sys.stderr, flush=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. inside some test runners)
            pass
    try:
        yield lambda: requested["stop"]
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
