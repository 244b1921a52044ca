"""The ``popplay`` command line: the typer apps (:mod:`~popplay.cli.app`), one module per
command, and :func:`popplay.cli.main.main`, which runs them."""
