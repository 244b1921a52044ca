"""Results that must not change when the code is reorganised: every command of
``tests/pinned/commands.py`` gives the run-file datasets and ``--json`` numbers recorded
in ``tests/pinned/golden.json``, bit for bit, and every command keeps its options."""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "pinned"))
import commands  # noqa: E402

GOLDEN = json.loads(commands.GOLDEN.read_text())


def _in_process(argv: list[str]) -> tuple[int, str]:
    from popplay.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = tmp_path_factory.mktemp("pinned")
    here = Path.cwd()
    os.chdir(workdir)  # the commands name their files relative to the working directory
    try:
        return commands.run_all(workdir, in_process=_in_process)
    finally:
        os.chdir(here)


@pytest.mark.parametrize("name", [name for name, *_ in commands.COMMANDS])
def test_command_gives_the_pinned_results(results: dict, name: str) -> None:
    expected, got = GOLDEN[name], results[name]
    assert got["json"] == expected["json"]
    if "file" in expected:
        changed = sorted(k for k in set(expected["file"]) | set(got["file"])
                         if expected["file"].get(k) != got["file"].get(k))
        assert not changed, f"{name}: datasets or attributes changed: {changed}"


def test_every_command_keeps_its_options() -> None:
    for argv in commands.HELP_COMMANDS:
        key = " ".join(argv)
        missing = sorted(set(GOLDEN["options"][key]) - set(commands.options_of(argv)))
        assert not missing, f"popplay {key} lost {missing}"
