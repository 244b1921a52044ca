"""The ``popplay`` executable and ``python -m popplay``: nothing is imported before
the guard, so Ctrl-C at any moment of start-up ends with one line and exit 130."""
import sys


def entry_point() -> None:
    try:
        from popplay.cli.main import main, plain_warnings_for_job  # defers numpy (Ctrl-C there: one line)
    except KeyboardInterrupt:
        print("Error: interrupted", file=sys.stderr)
        sys.exit(130)
    plain_warnings_for_job()
    sys.exit(main())
