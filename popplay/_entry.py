"""The ``popplay`` executable and ``python -m popplay``: nothing is imported before
the guard, so Ctrl-C at any moment of start-up ends with one line and exit 130."""
import sys


def entry_point() -> None:
    try:
        from popplay.cli.main import main, show_warnings_plainly  # defers numpy (Ctrl-C there: one line)
    except KeyboardInterrupt:
        print("Error: interrupted", file=sys.stderr)
        sys.exit(130)
    show_warnings_plainly()
    sys.exit(main())
