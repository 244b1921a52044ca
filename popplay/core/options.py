"""Hyper-parameters written once: each field of a domain's parameter dataclass carries
its help and its command-line form in ``metadata``, and the command line, the TOML
``--config`` keys, error messages and ``--resume``'s rules are all derived from it.

    @dataclass(frozen=True)
    class MyParams:
        lr: float = option(1e-3, "Adam learning rate.", min=0.0)
        episodes: int = option(100, "Budget: episodes.", budget=True)

A field without metadata is not a command-line option (derived or internal state).
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

#: metadata key holding an :class:`Option` on a dataclass field.
KEY = "popplay_option"


@dataclass(frozen=True)
class Option:
    """How one hyper-parameter appears to users."""

    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    #: The option's name when it is not ``--`` + the field's name with dashes.
    name: str | None = None
    #: Part of the run's budget: a resumed run may be given a new one (the run's total).
    budget: bool = False
    #: Something else a resumed run may change (how long waits may take, a layout).
    on_resume: bool = False
    #: Shown as ``--flag/--no-flag`` (booleans) or parsed from ``1,2,3`` (integer tuples);
    #: a repeatable text option's value as help shows it.
    metavar: str | None = None
    #: Kept off the command line's help (still accepted).
    hidden: bool = False
    #: The option gives this field times the field named here (``--agent-steps`` per
    #: trial is ``steps_per_agent`` x ``agents``); the field is the option's whole quotient.
    per: str | None = None
    #: A text option that may be given several times; the values are joined with ``;``.
    repeat: bool = False


def option(default: Any, help: str, **how: Any) -> Any:
    """A dataclass field with ``default`` whose command-line form is ``Option(help, **how)``."""
    return dataclasses.field(default=default, metadata={KEY: Option(help, **how)})


@dataclass(frozen=True)
class Spec:
    """One option of a command, resolved: its field, Python type, default and form."""

    field: str
    kind: Any  # int, float, str, bool or tuple (of ints)
    default: Any
    form: Option

    @property
    def flag(self) -> str:
        return self.form.name or "--" + self.field.replace("_", "-")

    @property
    def key(self) -> str:
        """The command's parameter name (and the TOML key, with dashes)."""
        return self.flag[2:].replace("-", "_")


def specs(params_type: type) -> list[Spec]:
    """The command-line options of a parameter dataclass, in field order."""
    hints = typing.get_type_hints(params_type)
    out = []
    for field in dataclasses.fields(params_type):
        form = field.metadata.get(KEY)
        if form is None:
            continue
        kind = hints[field.name]
        if typing.get_origin(kind) is tuple:
            kind = tuple
        default = field.default
        if form.per is not None:  # shown as the product, e.g. agent-steps per trial
            default = default * next(f.default for f in dataclasses.fields(params_type) if f.name == form.per)
        out.append(Spec(field.name, kind, default, form))
    return out


def option_name(params_type: type, field: str) -> str:
    """The option a field is given by (``--`` + its name with dashes unless renamed)."""
    for spec in specs(params_type):
        if spec.field == field:
            return spec.flag
    return "--" + field.replace("_", "-")


def user_message(params_type: type, message: str) -> str:
    """A ``validate()`` message that starts with a field's name, in the user's terms
    (the option's name instead)."""
    field, _, rest = str(message).partition(" ")
    names = {f.name for f in dataclasses.fields(params_type)}
    return f"{option_name(params_type, field)} {rest}" if field in names and rest else str(message)


def budget_fields(params_type: type) -> list[str]:
    return [spec.field for spec in specs(params_type) if spec.form.budget]


def resume_fields(params_type: type) -> list[str]:
    """Fields a resumed run may be given: its budget and what ``on_resume`` allows."""
    return [spec.field for spec in specs(params_type) if spec.form.budget or spec.form.on_resume]


def parse_widths(text: str, name: str = "--hidden") -> tuple[int, ...]:
    """``"128,128"`` -> ``(128, 128)``; ValueError naming the option otherwise."""
    try:
        widths = tuple(int(v) for v in str(text).replace(" ", "").split(",") if v)
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated widths such as 128,128 (got {text!r})") from None
    if not widths:
        raise ValueError(f"{name}: expected comma-separated widths such as 128,128 (got {text!r})")
    return widths


def show(value: Any) -> Any:
    """A field's value as the command line spells it (tuples as ``1,2``)."""
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return value
