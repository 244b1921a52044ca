"""The ``popplay`` command line (typer). One module per command; see :func:`main`."""
from __future__ import annotations

import os
import sys
from importlib import import_module

import typer

app = typer.Typer(
    name="popplay",
    help="Evolutionary population reinforcement learning: train, evaluate and compare populations.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    """Import every command module (each registers itself on ``app``); lazily, so
    that importing :mod:`popplay.cli` stays cheap."""
    from popplay.cli import (evaluate, export, inspect, lineage, play, plot, reproduce,  # noqa: F401
                             tournament, train)


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


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every failure becomes one ``Error: …`` line (exit 2 for usage)."""
    from popplay.cli.common import CommandError

    _register()
    from popplay import provenance

    provenance.set_command(list(argv) if argv is not None else sys.argv[1:])  # as typed, for run files
    try:
        result = app(args=argv, prog_name="popplay", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except _USAGE as error:
        _error(error.format_message())
        return 2
    except CommandError as error:
        _error(str(error))
        return error.exit_code
    except _EXIT as error:
        return int(getattr(error, "exit_code", 0) or 0)
    except (*_ABORT, KeyboardInterrupt):
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


def _error(message: str) -> None:
    print(f"Error: {' '.join(str(message).split())}", file=sys.stderr)


def entry_point() -> None:
    sys.exit(main())
