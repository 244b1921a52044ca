"""The typer apps every command registers on (``popplay``, ``popplay train``) and the
command line being run; :mod:`popplay.cli.main` imports every command module."""
from __future__ import annotations

from typing import Any, Callable

import typer
from typer.core import TyperGroup as _TyperGroup

from popplay import __version__

try:  # typer's internals, which the help below adjusts (left alone where they differ)
    from typer import core
    from typer._display import describe_number_range  # noqa: F401  (checks the internals are there)
except ImportError:
    core = None

app = typer.Typer(
    name="popplay",
    help="Evolutionary population reinforcement learning: train, evaluate and compare populations.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"popplay {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main_options(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                 help="Print popplay's version and exit."),
) -> None:
    """Evolutionary population reinforcement learning: train, evaluate and compare populations."""


_TYPE_NAMES = {"int": "INTEGER", "int range": "INTEGER", "float": "NUMBER", "float range": "NUMBER",
               "str": "TEXT", "file": "FILE", "path": "PATH", "directory": "DIRECTORY"}


def _natural_help() -> None:
    """Help that reads naturally: typer 0.29 shows Python types (``<bool>`` on flags,
    ``<list[Path]>``, ``<int range> [x>=1]``) and braces required arguments
    (``{RUN.h5}``). Show click's words instead (INTEGER, NUMBER, FILE, choices as
    a|b), nothing on flags or on arguments that have a metavar, ranges in words, and
    arguments by name. Left as typer has it if its internals differ."""
    if core is None:
        return
    base = getattr(core, "_TyperParameter", None)
    if base is None or not hasattr(base, "display_type"):
        return
    original = base.display_type

    def display_type(self: Any, ctx: Any) -> Any:
        desc = self.type_descriptor
        if desc.annotation is bool or (isinstance(self, core.TyperArgument) and self.metavar is not None):
            return None
        label = str(original(self, ctx)).strip("<>")
        return _TYPE_NAMES.get(label, label)

    def number_range(self: Any) -> str | None:
        low, high = getattr(self, "min", None), getattr(self, "max", None)
        if getattr(self, "count", False) and low == 0 and high is None:
            return None
        if low is None and high is None:
            return None
        if low is None:
            return f"at most {high}"
        if high is None:
            return f"at least {low}"
        return f"{low} to {high}"

    def usage_name(self: Any) -> str:
        name = self.display_name_raw
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 and self.metavar is None else "")

    base.display_type = display_type
    for cls in (core.TyperArgument, core.TyperOption):
        if hasattr(cls, "_get_number_range_help_str"):
            cls._get_number_range_help_str = number_range
    if hasattr(core.TyperArgument, "_usage_display_name"):
        core.TyperArgument._usage_display_name = usage_name


_natural_help()

class LazyCommands(_TyperGroup):  # type: ignore[misc, valid-type]
    """A command group whose generated commands are built when first asked for
    (:mod:`popplay.cli.train_plugin` sets :attr:`factory`), so that starting popplay
    imports no plug-in: building one imports its domain's parameters."""

    #: ``(name) -> command or None`` for the commands no module wrote by hand.
    factory: Callable[[str], Any] | None = None
    #: ``() -> names`` of those commands, in the order help lists them.
    names: Callable[[], list[str]] | None = None

    #: ``() -> names`` of every domain, in the order command lists show them.
    order: Callable[[], list[str]] | None = None

    def list_commands(self, ctx: Any) -> list[str]:
        written = list(super().list_commands(ctx))
        lazy = self.names() if self.names else []
        known = [n for n in (self.order() if self.order else []) if n in written or n in lazy]
        return known + [n for n in written if n not in known]

    def get_command(self, ctx: Any, name: str) -> Any:
        command = super().get_command(ctx, name)
        if command is None and self.factory is not None and self.names is not None and name in self.names():
            command = self.factory(name)
            self.add_command(command, name)
        return command


train_app = typer.Typer(help="Train a population or a deep agent and write a run file.", no_args_is_help=True,
                        cls=LazyCommands)
app.add_typer(train_app, name="train")

_ARGV: list[str] | None = None


def set_invocation(argv: list[str]) -> None:
    """Remember the command line being run (after ``popplay``)."""
    global _ARGV
    _ARGV = list(argv)


def invocation() -> list[str] | None:
    """The command line being run (``--nproc`` hands it to every rank); None when a
    command was called without :func:`popplay.cli.main.main`."""
    return _ARGV
