"""The ``popplay`` command line: :func:`main` runs it. Each command module registers
itself on :mod:`popplay.cli.app`'s apps when it is imported, here."""
from __future__ import annotations

import os
import signal
import sys
import time
from importlib import import_module

import typer

from popplay.checkpoints import provenance
from popplay.cli import (  # noqa: F401  (registration)
    evaluate,
    export,
    inspect,
    lineage,
    play,
    plot,
    reproduce,
    tournament,
    train_plugin,  # noqa: F401  (after the hand-written train commands: it fills the gaps)
)
from popplay.cli.app import app, set_invocation
from popplay.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, PopplayError, error_line, show_warnings_plainly
from popplay.distributed.launch import in_rank, torchrun_rank


def _short_helps() -> None:
    """Command lists show each docstring's first paragraph as one flowing sentence
    (typer would keep the source's line breaks)."""
    apps = [app] + [group.typer_instance for group in app.registered_groups if group.typer_instance]
    for each in apps:
        for info in each.registered_commands:
            doc = info.help or (info.callback.__doc__ if info.callback is not None else None)
            if info.short_help is None and doc:
                info.short_help = " ".join(doc.strip().split("\n\n")[0].split())


_short_helps()


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


class _Interrupted(BaseException):
    """Ctrl-C outside a run's own stop handling. Not a KeyboardInterrupt: typer 0.29
    catches those and turns them into a silent exit 130, so nothing would say why."""


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted()


def plain_warnings_for_job() -> None:
    """Library warnings as one plain line (:func:`popplay.core.errors.show_warnings_plainly`).
    A rank other than 0 of a job whose ranks all run this command line names itself and
    leaves deprecations to rank 0, which meets the same ones."""
    rank = os.environ.get("RANK", "0") if in_rank() else "0"
    show_warnings_plainly(f"rank {rank}: " if rank != "0" else "", deprecations=rank == "0")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every failure becomes one ``Error: …`` line (exit 2 for usage)."""
    set_invocation(sys.argv[1:] if argv is None else argv)
    try:
        previous = signal.signal(signal.SIGINT, _raise_interrupted)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        return _main(argv)
    except _Interrupted:
        print_error("interrupted")
        return EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _main(argv: list[str] | None) -> int:
    try:
        provenance.set_command(list(argv) if argv is not None else sys.argv[1:])  # as typed, for run files
        result = app(args=argv, prog_name="popplay", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except _USAGE as error:
        if type(error).__name__ == "NoArgsIsHelpError":  # `popplay`, `popplay train`: the help is the answer
            message = error.format_message()
            if message.strip():  # plain (non-rich) help comes back as the message
                print(message)
            return EXIT_USAGE
        # typer 0.29 words a bad choice "Invalid value for '--x': Value error, 'y' is not one of ..."
        _say_for_the_job(error.format_message().replace(": Value error, ", ": "))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print_error("interrupted")
        return EXIT_INTERRUPTED
    except PopplayError as error:
        if str(error):  # none: another process of the job says what happened
            _say_for_the_job(str(error))
        return error.exit_code
    except _EXIT as error:
        return int(getattr(error, "exit_code", 0) or 0)
    except _ABORT:
        print_error("interrupted")
        return EXIT_INTERRUPTED
    except _CLICK as error:
        print_error(error.format_message())
        return int(getattr(error, "exit_code", 1))
    except Exception as error:  # the last line of defence: no tracebacks for users
        if os.environ.get("POPPLAY_DEBUG"):
            raise
        print_error(f"internal error: {type(error).__name__}: {error} (set POPPLAY_DEBUG=1 for a traceback)")
        return 1


#: How long a torchrun worker other than rank 0 holds back a failure's line: rank 0,
#: which finds the same problem in the same command line, says it, and its exit makes
#: torchrun end this worker first. A worker still here after that says it itself.
QUIET_RANK_SECONDS = 10.0


def _say_for_the_job(message: str) -> None:
    """One line for the whole job: under torchrun, rank 0 speaks for every worker."""
    if torchrun_rank() not in (None, 0):
        sys.stdout.flush()
        time.sleep(QUIET_RANK_SECONDS)
        message = f"rank {os.environ.get('RANK')}: {message}"
    print_error(message)


def print_error(message: str) -> None:
    """The one line a failure shows: ``Error: <message>`` on stderr."""
    print(error_line(message), file=sys.stderr)


def entry_point() -> None:
    sys.exit(main())
