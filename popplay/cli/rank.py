"""Entry point of one rank started by :func:`popplay.distributed.launch.launch_local`.

``python -m popplay.cli.rank "popplay rank R/N" ARGV...``: the first argument
is the role (shown by ``ps``; the environment carries the same string as
``POPPLAY_ROLE``), the rest is the ``popplay`` command line, run unchanged.
"""
from __future__ import annotations

import sys

from popplay.distributed.group import die_with_parent


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].startswith("popplay rank "):
        print("Error: usage: python -m popplay.cli.rank 'popplay rank R/N' ARGV...", file=sys.stderr)
        return 2
    die_with_parent()
    from popplay.cli.main import main as cli_main  # defers numpy: a killed launcher must not leave a loading rank

    return cli_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
