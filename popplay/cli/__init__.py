"""The ``popplay`` command line (typer). One module per command; see :func:`main`."""
from __future__ import annotations

import os
import signal
import sys
from importlib import import_module
from typing import Any

import typer

app = typer.Typer(
    name="popplay",
    help="Evolutionary population reinforcement learning: train, evaluate and compare populations.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from popplay import __version__

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
    try:
        from typer import core
        from typer._display import describe_number_range  # noqa: F401  (checks the internals are there)
    except ImportError:
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


def _register() -> None:
    """Import every command module (each registers itself on ``app``); lazily, so
    that importing :mod:`popplay.cli` stays cheap."""
    from popplay.cli import (evaluate, export, inspect, lineage, play, plot, reproduce,  # noqa: F401
                             tournament, train)

    # Command lists show each docstring's first paragraph as one flowing sentence
    # (typer would keep the source's line breaks).
    apps = [app] + [group.typer_instance for group in app.registered_groups if group.typer_instance]
    for each in apps:
        for info in each.registered_commands:
            doc = info.help or (info.callback.__doc__ if info.callback is not None else None)
            if info.short_help is None and doc:
                info.short_help = " ".join(doc.strip().split("\n\n")[0].split())


def _click_exceptions(name: str) -> tuple[type[BaseException], ...]:
    """``name`` from whichever click typer runs on: typer 0.29 and newer vendor their own
    copy (``typer._click``) and no longer depend on click; older releases use click itself,
    which they then install. Importing click unconditionally broke fresh machines."""
    found: list[type[BaseException]] = []
    for module_name in ("typer._click.exceptions", "click.exceptions"):
        try:
            module = import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, name):
            found.append(getattr(module, name))
    for module in (typer, getattr(typer, "exceptions", None)):
        if module is not None and hasattr(module, name):
            found.append(getattr(module, name))
    return tuple(dict.fromkeys(found))


_USAGE = _click_exceptions("UsageError")
_EXIT = _click_exceptions("Exit")
_ABORT = _click_exceptions("Abort")
_CLICK = _click_exceptions("ClickException")


#: The command line being run (after ``popplay``): ``--nproc`` hands it to every rank.
ARGV: list[str] | None = None


class _Interrupted(BaseException):
    """Ctrl-C outside a run's own stop handling. Not a KeyboardInterrupt: typer 0.29
    catches those and turns them into a silent exit 130, so nothing would say why."""


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every failure becomes one ``Error: …`` line (exit 2 for usage)."""
    global ARGV
    ARGV = list(sys.argv[1:] if argv is None else argv)
    try:
        previous = signal.signal(signal.SIGINT, _raise_interrupted)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        return _main(argv)
    except _Interrupted:
        _error("interrupted")
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _main(argv: list[str] | None) -> int:
    try:
        # Imports and command registration inside the guard: Ctrl-C at start-up is
        # "interrupted" like Ctrl-C anywhere else, never a traceback.
        _register()
        from popplay import provenance

        provenance.set_command(list(argv) if argv is not None else sys.argv[1:])  # as typed, for run files
        result = app(args=argv, prog_name="popplay", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except _USAGE as error:
        if type(error).__name__ == "NoArgsIsHelpError":  # `popplay`, `popplay train`: the help is the answer
            message = error.format_message()
            if message.strip():  # plain (non-rich) help comes back as the message
                print(message)
            return 2
        _error(error.format_message())
        return 2
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except _command_error() as error:
        _error(str(error))
        return error.exit_code
    except _EXIT as error:
        return int(getattr(error, "exit_code", 0) or 0)
    except _ABORT:
        _error("interrupted")
        return 130
    except _CLICK as error:
        _error(error.format_message())
        return int(getattr(error, "exit_code", 1))
    except Exception as error:  # the last line of defence: no tracebacks for users
        if os.environ.get("POPPLAY_DEBUG"):
            raise
        _error(f"internal error: {type(error).__name__}: {error} (set POPPLAY_DEBUG=1 for a traceback)")
        return 1


def _command_error() -> type[BaseException]:
    from popplay.cli.common import CommandError

    return CommandError


def _error(message: str) -> None:
    print(f"Error: {' '.join(str(message).split())}", file=sys.stderr)


def entry_point() -> None:
    sys.exit(main())
