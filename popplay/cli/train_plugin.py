"""``popplay train DOMAIN`` for every plug-in without a hand-written command: the
options are generated from the fields of the domain's parameter dataclass (their
help, bounds and names in ``metadata``: :mod:`popplay.core.options`), so a
hyper-parameter is written once, and the run goes through the one pipeline
(:func:`popplay.cli.train.run_training`: seeds, time budget, logs, resume).

A command is built when it is first asked for (:class:`popplay.cli.app.LazyCommands`):
starting popplay imports no plug-in. :mod:`popplay.cli.main` imports this module after
every hand-written command.
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from popplay.checkpoints.validation import params_from_config
from popplay.cli.app import LazyCommands, train_app
from popplay.cli.common import (
    BackendName,
    BackendOption,
    CheckpointOption,
    CompileOption,
    ConfigOption,
    DeviceName,
    DeviceOption,
    DistTimeoutOption,
    JsonOption,
    LogDirOption,
    NprocOption,
    OutOption,
    OverwriteOption,
    QuietOption,
    ResumeOption,
    SeedsOption,
    TimeBudgetOption,
    default_out,
    given,
    print_json,
)
from popplay.cli.train import (
    aggregate_text,
    check_schedule,
    link_latest,
    load_resume,
    resume_time_budget,
    run_training,
    warn,
)
from popplay.core import registry
from popplay.core.errors import UsageError
from popplay.core.experiment import RunRequest
from popplay.core.options import Spec, budget_fields, resume_fields, show, specs, user_message
from popplay.core.registry import DEEP, POPULATION
from popplay.training.job import aggregate_summaries, seed_log_dir, seed_plan, stop_on_signals

#: The options every generated command has beside its domain's fields: how to run
#: (not what to learn), in the order help lists them; ``None`` kinds: every domain.
_RUN_OPTIONS: list[tuple[str, Any, Any, str | None]] = [
    ("time_budget", TimeBudgetOption, None, None),
    ("backend", BackendOption, BackendName.auto, POPULATION),
    ("device", DeviceOption, DeviceName.auto, None),
    ("compile", CompileOption, None, POPULATION),
    ("out", OutOption, None, None),
    ("overwrite", OverwriteOption, False, None),
    ("json_output", JsonOption, False, None),
    ("quiet", QuietOption, False, None),
    ("checkpoint_every", CheckpointOption, None, None),
    ("resume", ResumeOption, None, None),
    ("seeds", SeedsOption, 1, None),
    ("config", ConfigOption, None, None),
    ("nproc", NprocOption, 1, POPULATION),
    # A deep population (--agents P) splits its members over --nproc ranks (its --agents help says
    # so); a deep topology's ranks come from its layout (--nproc there gets a one-line hint). Kept off
    # the help so that a top-level `nproc` in a --config, meant for the populations, leaves it alone.
    ("nproc", Annotated[int, typer.Option(min=1, hidden=True)], 1, DEEP),
    ("timeout", DistTimeoutOption, 60.0, POPULATION),  # a deep agent's is one of its fields
    ("log_dir", LogDirOption, None, None),
]


def _run_options(kind: str) -> list[tuple[str, Any, Any]]:
    return [(name, annotation, default) for name, annotation, default, only in _RUN_OPTIONS if only in (None, kind)]


def _option(spec: Spec) -> tuple[Any, Any]:
    """The annotation and default of one field's option."""
    form = spec.form
    names = [f"{spec.flag}/--no-{spec.flag[2:]}"] if spec.kind is bool else ([spec.flag] if form.name else [])
    bounds = {k: v for k, v in (("min", form.min), ("max", form.max)) if v is not None}
    if form.repeat:  # --hp a --hp b: one text field, the values joined with ';'
        return (Annotated[Optional[list[str]], typer.Option(*names, help=form.help, hidden=form.hidden,
                                                            metavar=form.metavar or "TEXT")], None)
    if spec.kind is tuple:  # widths such as 64,64: typed as text, parsed by the dataclass
        return Annotated[str, typer.Option(*names, help=form.help, hidden=form.hidden)], show(spec.default)
    if form.choices:  # an Enum: typer shows and checks the choices (a|b|c)
        choices = Enum(spec.field.title().replace("_", ""), {c.replace("-", "_"): c for c in form.choices}, type=str)
        return Annotated[choices, typer.Option(*names, help=form.help, hidden=form.hidden)], choices(spec.default)
    return Annotated[spec.kind, typer.Option(*names, help=form.help, hidden=form.hidden, **bounds)], spec.default


def build_command(domain: str) -> Callable[..., None]:
    """The ``train DOMAIN`` function typer registers, its signature made from the
    domain's parameter fields and the run options of its kind."""
    spec = registry.get(domain)
    params_type = spec.params_type()
    fields = specs(params_type)
    by_field = {f.field: f for f in fields}
    budgets = [by_field[name] for name in budget_fields(params_type)]
    allowed_on_resume = set(resume_fields(params_type))
    run_options = _run_options(spec.kind)

    def field_value(f: Spec, values: dict[str, Any], per: int | None = None) -> Any:
        """A field's value from its option; an option per something (``--agent-steps``
        per trial) divided by it."""
        value = values[f.key]
        if f.form.repeat:  # a list from the command line (or TOML), or already one text
            if isinstance(value, str):
                return value
            # an empty item (a shell variable that expanded to nothing) would join as "no spec"
            blank = next((item for item in value or () if not str(item).replace(";", "").strip()), None)
            if blank is not None:
                raise UsageError(f"{f.flag} {blank!r}: expected a value such as {f.form.metavar or 'TEXT'}")
            return ";".join(value or ())
        if f.form.per is None:
            return value
        divisor = per if per is not None else values[by_field[f.form.per].key]
        if value < divisor:
            raise UsageError(f"{f.flag} ({value}) must be at least {by_field[f.form.per].flag} ({divisor}): "
                             "every agent needs at least one step")
        return value // divisor

    def command(ctx: typer.Context, **values: Any) -> None:
        run = {name: values.pop(name) for name, _, _ in run_options}
        values = {k: v.value if isinstance(v, Enum) else v for k, v in values.items()}
        for f in fields:  # run files (and every rank's generators) hold 64-bit integers
            value = values.get(f.key)
            if f.kind is int and isinstance(value, int) and not -2**63 <= value < 2**63:
                raise UsageError(f"{f.flag} must fit in a signed 64-bit integer (got {value})")
        backend, device = run.get("backend", BackendName.auto), run["device"]
        compile_steps = run.get("compile")
        per_option = next((f for f in budgets if f.form.per is not None), None)
        if run["resume"] is not None:
            stored = load_resume(ctx, domain, run["resume"], {f.key for f in fields if f.field in allowed_on_resume})
            try:
                # A population resumes on its stored backend and device: they must be there.
                params = params_from_config(domain, stored.config, run_options=spec.kind == POPULATION)
            except (TypeError, ValueError) as error:
                raise UsageError(f"{stored.path}: damaged config ({error})") from None
            new = {}
            for f in fields:
                if f.field in allowed_on_resume and given(ctx, f.key):
                    per = getattr(params, f.form.per) if f.form.per is not None else None
                    new[f.field] = field_value(f, values, per)
            asked = any(f.field in new for f in budgets) or given(ctx, "time_budget")
            if spec.kind == DEEP and not asked and stored.complete:
                raise UsageError("--resume needs a new budget: " + " or ".join(f.flag for f in budgets)
                                 + f" ({stored.path} reached its own)")
            if spec.kind == DEEP and asked:  # (a stopped run resumed without one goes on to its own)
                # The new budget is the run's: a deep run stops at whichever budget it
                # reaches first, so a stored one not given again must not cut it short.
                new.update({f.field: 0 for f in budgets if f.field not in new})
            stretched_by = getattr(params, "schedules_stretched_by", None)  # what anneals over the old budget
            resumed = dataclasses.replace(params, **new)
            stretched = stretched_by(resumed) if stretched_by is not None else []
            params = resumed
            _check_learned(spec, stored, params, by_field)
            try:
                if not given(ctx, "backend") and spec.kind == POPULATION:  # the run continues where it ran
                    backend = BackendName(stored.config["backend"])
                if not given(ctx, "device"):
                    device = DeviceName(stored.config.get("device", "cpu"))
                # Compiled or not as it ran (knights' compiled ply rounds differently in
                # the last bits), unless asked otherwise or moved to an engine without it.
                if spec.kind == POPULATION and compile_steps is None and backend != BackendName.numba:
                    stored_compile = stored.config.get("compile")
                    compile_steps = None if stored_compile is None else bool(stored_compile)
            except (KeyError, TypeError, ValueError):
                raise UsageError(f"{stored.path}: damaged config (backend {stored.config.get('backend')!r}, device "
                                 f"{stored.config.get('device')!r})") from None
            time_budget = resume_time_budget(ctx, stored, run["time_budget"], [f.key for f in budgets])
            out, resume, schedule_time = None, stored, stored.config.get("time_budget")
            if stretched:
                warn(f"--resume with a new budget changes how {' and '.join(stretched)} anneal from here on "
                     "(over the whole --env-steps budget: stretched to a larger one, held at the start without "
                     "one): the run will differ from one made with this budget in one go")
        else:
            try:
                params = params_type(**{f.field: field_value(f, values) for f in fields})
            except (TypeError, ValueError) as error:
                raise UsageError(user_message(params_type, str(error))) from None
            time_budget, out, resume = run["time_budget"], run["out"], None
            schedule_time = time_budget
        try:
            check_environment = getattr(params, "check_environment", None)
            if check_environment is not None:  # cheap, before validation imports the agents (torch)
                check_environment()
            params.validate()
            idle = getattr(params, "idle_options", None)  # options that would do nothing: refused, not ignored
            problem = idle() if idle is not None and resume is None else None  # (a stored run is not re-judged)
            if problem is not None:
                raise ValueError(problem)
        except ValueError as error:
            raise UsageError(user_message(params_type, str(error))) from None
        if spec.runner is not None:
            _hand_to_runner(ctx, spec, params, run, resume, time_budget)
            return
        # the step budget as asked, for the rounding warning: given, or the default where it is the budget
        steps_asked = per_option is not None and (given(ctx, per_option.key)
                                                  or (resume is None and time_budget is None))
        given_per = values[per_option.key] if steps_asked else None
        check_schedule(params, domain=domain, time_budget=schedule_time, agent_steps=given_per)
        run_training(domain, params, backend=backend.value, device=device.value, compile=compile_steps,
                     time_budget=time_budget, out=out,
                     overwrite=run["overwrite"] or resume is not None, json_output=run["json_output"],
                     checkpoint_every=run["checkpoint_every"], resume=resume, seeds=run["seeds"],
                     log_dir=run["log_dir"], nproc=run["nproc"], quiet=run["quiet"],
                     timeout=float(run["timeout"] if "timeout" in run else getattr(params, "timeout", 60.0)))

    parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    for field in fields:
        annotation, default = _option(field)
        parameters.append(inspect.Parameter(field.key, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                            default=default))
    for name, annotation, default in run_options:
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                            default=default))
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__name__ = f"train_{domain}"
    doc = inspect.getdoc(params_type) or ""
    command.__doc__ = "\n\n".join(" ".join(paragraph.split()) for paragraph in doc.split("\n\n"))
    return command


#: Run options of the one pipeline that a domain with its own runner does not take.
_PIPELINE_ONLY = (("checkpoint_every", "--checkpoint-every"),)


def _hand_to_runner(ctx: typer.Context, spec: Any, params: Any, run: dict[str, Any], stored: Any,
                    time_budget: float | None) -> None:
    """The rest of ``train DOMAIN`` for a domain that runs its own job (``DomainSpec.runner``):
    each seed's run through it, then the report (every seed's and their mean and
    standard error, as the pipeline's)."""
    for name, flag in _PIPELINE_ONLY:
        if given(ctx, name):
            raise UsageError(f"{flag}: {spec.name} runs its own processes and does not take it in this version")
    seeds = int(run["seeds"])
    if seeds > 1 and stored is not None:
        raise UsageError("--seeds: resume each seed's run file on its own")
    spec.backend(device=run["device"].value)  # --device cuda: one line where it cannot run
    defaulted = run["out"] is None and stored is None
    base = run["out"] if run["out"] is not None else (stored.path if stored is not None else default_out(spec.name))
    plan = seed_plan(params, Path(base), seeds, bool(run["overwrite"]))
    results = []
    with stop_on_signals() as should_stop:
        for seed_params, out in plan:
            logs = seed_log_dir(run["log_dir"], seeds, seed_params.seed)
            result = spec.runner_type()(seed_params, RunRequest(
                out, stored, bool(run["overwrite"]), bool(run["json_output"]), should_stop, quiet=bool(run["quiet"]),
                time_budget=time_budget, log_dir=logs))
            results.append(result)
            if not run["json_output"]:
                print(result.text)
            for note in result.notes:
                print(note, file=sys.stderr)
            if result.exit_code:
                break
    if seeds > 1 and len(results) == seeds:
        summary = aggregate_summaries([r.summary for r in results], [
            name for name in results[0].metrics if all(isinstance(r.summary.get(name), (int, float)) for r in results)])
        if not run["json_output"]:
            print(aggregate_text(spec.name, summary, [m for m in results[0].metrics if m in summary]))
    else:
        summary = results[-1].summary
    if run["json_output"]:
        print_json(summary)
    code = results[-1].exit_code
    if code == 0 and defaulted:
        link_latest(spec.name, plan[-1][1])
    if code:
        raise typer.Exit(code)


def _check_learned(spec: Any, stored: Any, params: Any, by_field: dict[str, Spec]) -> None:
    """A resumed population's budget may not fall below what it has already learned."""
    if not spec.budget_counter:
        return
    counter, field = spec.budget_counter
    done = int(stored.state_counters.get(counter, 0))
    budget = getattr(params, field)
    if budget >= done:
        return
    f = by_field[field]
    if f.form.per is not None:
        per = getattr(params, f.form.per)
        raise UsageError(f"{f.flag} ({budget * per}) is below what {stored.path} has already learned "
                         f"({done * per} agent-steps per trial)")
    raise UsageError(f"{f.flag} ({budget}) is below what {stored.path} has already learned ({done} {f.key})")


def generated() -> list[str]:
    """The domains without a hand-written ``train`` command."""
    written = {info.name for info in train_app.registered_commands}
    return [name for name in registry.names() if name not in written]


def command(domain: str) -> Any:
    """The click command of ``train DOMAIN``, as typer makes it from :func:`build_command`."""
    single = typer.Typer(add_completion=False)
    single.command(domain)(build_command(domain))
    return typer.main.get_command(single)


LazyCommands.factory = staticmethod(command)
LazyCommands.names = staticmethod(generated)
LazyCommands.order = staticmethod(registry.names)
