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
from enum import Enum
from typing import Annotated, Any, Callable

import typer

from popplay.cli.app import LazyCommands, train_app
from popplay.cli.common import (
    CheckpointOption,
    ConfigOption,
    DeviceName,
    DeviceOption,
    JsonOption,
    LogDirOption,
    OutOption,
    OverwriteOption,
    ResumeOption,
    SeedsOption,
    TimeBudgetOption,
    given,
)
from popplay.cli.train import load_resume, resume_time_budget, run_training
from popplay.checkpoints.validation import params_from_config
from popplay.core import registry
from popplay.core.errors import UsageError
from popplay.core.options import Spec, budget_fields, resume_fields, show, specs, user_message

#: The options every generated command has beside its domain's fields: how to run
#: (not what to learn), in the order help lists them.
_RUN_OPTIONS: list[tuple[str, Any, Any]] = [
    ("time_budget", TimeBudgetOption, None),
    ("device", DeviceOption, DeviceName.auto),
    ("out", OutOption, None),
    ("overwrite", OverwriteOption, False),
    ("json_output", JsonOption, False),
    ("checkpoint_every", CheckpointOption, None),
    ("resume", ResumeOption, None),
    ("seeds", SeedsOption, 1),
    ("config", ConfigOption, None),
    ("log_dir", LogDirOption, None),
    # Only to answer it: a deep run's ranks come from its layout (a one-line hint, not "No such option").
    ("nproc", Annotated[int, typer.Option(hidden=True)], 1),
]


def _option(spec: Spec) -> tuple[Any, Any]:
    """The annotation and default of one field's option."""
    form = spec.form
    names = [f"{spec.flag}/--no-{spec.flag[2:]}"] if spec.kind is bool else ([spec.flag] if form.name else [])
    bounds = {k: v for k, v in (("min", form.min), ("max", form.max)) if v is not None}
    if spec.kind is tuple:  # widths such as 64,64: typed as text, parsed by the dataclass
        return Annotated[str, typer.Option(*names, help=form.help, hidden=form.hidden)], show(spec.default)
    if form.choices:  # an Enum: typer shows and checks the choices (a|b|c)
        choices = Enum(spec.field.title().replace("_", ""), {c.replace("-", "_"): c for c in form.choices}, type=str)
        return Annotated[choices, typer.Option(*names, help=form.help, hidden=form.hidden)], choices(spec.default)
    return Annotated[spec.kind, typer.Option(*names, help=form.help, hidden=form.hidden, **bounds)], spec.default


def build_command(domain: str) -> Callable[..., None]:
    """The ``train DOMAIN`` function typer registers, its signature made from the
    domain's parameter fields and :data:`_RUN_OPTIONS`."""
    spec = registry.get(domain)
    params_type = spec.params_type()
    fields = specs(params_type)
    budgets = budget_fields(params_type)
    allowed_on_resume = set(resume_fields(params_type))

    def command(ctx: typer.Context, **values: Any) -> None:
        run = {name: values.pop(name) for name, _, _ in _RUN_OPTIONS}
        values = {k: v.value if isinstance(v, Enum) else v for k, v in values.items()}
        device: DeviceName = run["device"]
        if run["resume"] is not None:
            for field in fields:
                if field.key not in allowed_on_resume and given(ctx, field.key):
                    raise UsageError(f"{field.flag}: settings come from {run['resume']} when resuming; only the "
                                     "budget, --time-budget, --checkpoint-every, --device and --json may be given")
            stored = load_resume(ctx, domain, run["resume"])
            try:
                params = params_from_config(domain, stored.config, run_options=False)
            except (TypeError, ValueError) as error:
                raise UsageError(f"{stored.path}: damaged config ({error})") from None
            new = {f.field: values[f.key] for f in fields if f.key in allowed_on_resume and given(ctx, f.key)}
            if not new and not given(ctx, "time_budget"):
                raise UsageError("--resume needs a new budget: "
                                 + ", ".join(f.flag for f in fields if f.field in budgets) + " or --time-budget")
            params = dataclasses.replace(params, **new)
            if not given(ctx, "device"):  # the run continues where it ran
                device = DeviceName(stored.config.get("device", "cpu"))
            time_budget = resume_time_budget(ctx, stored, run["time_budget"], budgets[0] if budgets else "")
            out, resume = None, stored
        else:
            try:
                params = params_type(**{f.field: values[f.key] for f in fields})
            except (TypeError, ValueError) as error:
                raise UsageError(user_message(params_type, str(error))) from None
            time_budget, out, resume = run["time_budget"], run["out"], None
        try:
            params.validate()
        except ValueError as error:
            raise UsageError(user_message(params_type, str(error))) from None
        run_training(domain, params, backend="auto", device=device.value, time_budget=time_budget, out=out,
                     overwrite=run["overwrite"] or resume is not None, json_output=run["json_output"],
                     checkpoint_every=run["checkpoint_every"], resume=resume, seeds=run["seeds"],
                     log_dir=run["log_dir"], nproc=run["nproc"], timeout=float(getattr(params, "timeout", 60.0)))

    parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    for field in fields:
        annotation, default = _option(field)
        parameters.append(inspect.Parameter(field.key, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                            default=default))
    for name, annotation, default in _RUN_OPTIONS:
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                            default=default))
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__name__ = f"train_{domain}"
    doc = inspect.getdoc(params_type) or ""
    command.__doc__ = "\n\n".join(" ".join(paragraph.split()) for paragraph in doc.split("\n\n"))
    return command


def generated() -> list[str]:
    """The domains without a hand-written ``train`` command."""
    written = {info.name for info in train_app.registered_commands}
    return [name for name in registry.names() if name not in written]


def command(domain: str) -> Any:
    """The click command of ``train DOMAIN``, as typer makes it from :func:`build_command`."""
    single = typer.Typer()
    single.command(domain)(build_command(domain))
    return typer.main.get_command(single)


LazyCommands.factory = staticmethod(command)
LazyCommands.names = staticmethod(generated)
