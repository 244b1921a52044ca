"""Entry point of one rank started by :func:`popplay.distributed.launch.launch_local`.

``python -m popplay.cli.rank "popplay rank R/N" ARGV...``: the first argument
is the role (shown by ``ps``; the environment carries the same string as
``POPPLAY_ROLE``), the rest is the ``popplay`` command line, run unchanged.

The first thing it does, before importing anything of popplay's beyond the light
package itself, is ask Linux to kill it when the launcher dies, and leave at once if
the launcher is already gone: a launcher killed while its ranks import torch (seconds)
must not leave them behind.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys


def _die_with_launcher() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the launcher's own clean-up must do
        return
    launcher = os.environ.get("POPPLAY_LAUNCHER_PID", "")
    if launcher.isdigit() and os.getppid() != int(launcher):  # it died before the request: nobody waits for us
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].startswith("popplay rank "):
        print("Error: usage: python -m popplay.cli.rank 'popplay rank R/N' ARGV...", file=sys.stderr)
        return 2
    from popplay.cli import main as cli  # defers numpy: a killed launcher must not leave a loading rank

    cli.plain_warnings_for_job()
    return cli.main(args[1:])


def _leave(code: int) -> None:
    """End the rank without the interpreter's finalization: gloo's C++ threads may still
    hold objects whose destruction then needs a GIL being torn down, and abort (seen
    under load: a worker of a finished parameter-server job killed by SIGABRT after the
    run file was saved, which the launcher must report as a lost rank). Every file is
    closed and the group left by now; only the standard streams need flushing."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said there
            pass
    os._exit(code)


if __name__ == "__main__":
    _die_with_launcher()
    _leave(main())
