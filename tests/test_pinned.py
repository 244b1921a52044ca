"""Results that must not change when the code is reorganised: every command of
``tests/pinned/commands.py`` gives the run-file datasets and ``--json`` numbers recorded
in ``tests/pinned/golden.json``, bit for bit, and every command keeps its options."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "pinned"))
import commands  # noqa: E402

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

GOLDEN = json.loads(commands.GOLDEN.read_text())
#: Test hooks that were parameters when the results were recorded; they are environment
#: knobs now (popplay.core.hooks) and no longer reach a run file.
HOOKS = {"slow_learner", "slow_simulator", "inject_stale_every", "inject_huge_every"}
#: Parameters a command gained since the recording (their defaults change nothing it did):
#: DQN and REINFORCE run in EXARL's workflows, whose layout they now record; both have
#: populations (--agents P), whose options they record too.
POPULATION_KEYS = {"agents", "hp", "phase_steps", "replicate_every", "replicate_fraction", "window", "resample",
                   "replicate_when", "replicate_confidence", "replicate_after",
                   "copy_replay", "share_every", "share_group", "differentiation", "bias_decay",  # --agents P
                   "rank_by", "tournament_games", "rank_episodes"}  # PBT ranked by games played for it
ADDED = {name: {"learners", "selection", "queue_capacity"} | POPULATION_KEYS
         for name in ("dqn", "dqn-train-every", "dqn-collective", "reinforce-local", "reinforce-server")}
for _name in ("a2c", "td3", "ddpg-per"):  # A2C, TD3 and DDPG populations (--agents P)
    ADDED[_name] = POPULATION_KEYS
#: Knights options added since the pins (their defaults leave a run as it was): the torch
#: engine's dtype, the league, significance-based replacement, adaptive pairing.
ADDED["knights"] = {"dtype", "alpha_half_life", "league", "league_fraction", "league_sampling", "tournament_pairing",
                    "replicate_when", "replicate_confidence", "state/league_score", "lookahead", "hidden2", "td_leaf",
                    "mutate_lookahead", "state/plies", "state/snapshot_plies", "state/lineage_plies",
                    "eval_every_seconds", "start_width", "mutate_width", "state/lineage_width",
                    "state/half_life", "state/lineage_half_life",
                    "start_width2", "mutate_width2", "state/lineage_width2"}
#: Every run's config records whether its torch engine was compiled (the default became:
#: on CUDA only; the deep agents never are).
for _name, *_ in commands.COMMANDS:
    ADDED[_name] = ADDED.get(_name, set()) | {"compile"}


def _same(got: object, expected: object) -> bool:
    """Equal, where a float (pinned as its repr) may differ in its last bits: linear
    algebra (the tournament's rating errors) rounds differently across BLAS builds; a
    nested object (a per-agent row) may have gained fields."""
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(_same(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):  # e.g. per-agent rows: fields may be added
        return all(name in got and _same(got[name], value) for name, value in expected.items())
    if isinstance(expected, str) and isinstance(got, str) and got != expected:
        try:
            return math.isclose(float(got), float(expected), rel_tol=1e-12, abs_tol=1e-300)
        except ValueError:
            return False
    return got == expected


def _without_hooks(value: object, added: frozenset[str] | set[str] = frozenset()) -> object:
    """A digest without the hooks (and the ``added`` parameters), in attributes and in
    the stored config."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key in HOOKS or key in added:
            continue
        if key == "config_json" and isinstance(item, str):
            item = json.dumps({k: v for k, v in json.loads(item).items() if k not in HOOKS | set(added)},
                              sort_keys=True)
        out[key] = _without_hooks(item, added)
    return out


def _in_process(argv: list[str]) -> tuple[int, str]:
    from popplay.cli.main import main

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
    added = ADDED.get(name, set())
    recorded, here = expected.get("by_machine"), commands.machine()
    # A machine class without a record: the same numbers printed, the same datasets
    # (names, types, shapes) and attributes; their values unchecked.
    exact = recorded is None or here in recorded
    if recorded is not None:
        expected = recorded[here] if exact else next(iter(recorded.values()))
    if exact:  # every number the command printed is still printed, the same; one pipeline may add fields
        changed = sorted(k for k in expected["json"] if not _same(got["json"].get(k), expected["json"][k]))
        assert not changed, f"{name}: --json changed: {[(k, expected['json'][k], got['json'].get(k)) for k in changed]}"
    else:
        missing = sorted(set(expected["json"]) - set(got["json"]))
        assert not missing, f"{name}: --json lost {missing}"
    if "file" in expected:
        seen = (lambda entry: entry) if exact else _layout
        before, after = _without_hooks(expected["file"], added), _without_hooks(got["file"], added)
        changed = sorted(k for k in set(before) | set(after) if seen(before.get(k)) != seen(after.get(k)))
        assert not changed, f"{name}: datasets or attributes changed: {changed}"
    if not exact:
        pytest.skip(f"{name}: results recorded for {sorted(recorded)}, not for this machine ({here}); "
                    "record them with `python tests/pinned/commands.py --write-machine`")


def _layout(entry: object) -> object:
    """A digest entry without its values: a dataset's type and shape, an attribute's names."""
    if isinstance(entry, list):
        return entry[:2]
    if isinstance(entry, dict):
        return sorted(entry)
    return entry


#: Options a command listed only to refuse them: `train ddpg` took TD3's switches and
#: answered "applies to td3 only"; generated from DDPG's own fields, it no longer lists them.
REFUSED_BEFORE = {"train ddpg": {"--clipped-double-q", "--no-clipped-double-q", "--policy-delay", "--target-smoothing",
                                 "--no-target-smoothing", "--target-noise", "--noise-clip"}}


def _help_text(argv: list[str]) -> str:
    from typer.testing import CliRunner

    from popplay.cli.main import app

    done = CliRunner().invoke(app, [*argv, "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert done.exit_code == 0, done.output
    return done.output


def test_every_command_keeps_its_options() -> None:
    for argv in commands.HELP_COMMANDS:
        key = " ".join(argv)
        listed = set(commands.options_of(argv, help_text=_help_text))
        missing = sorted(set(GOLDEN["options"][key]) - listed - REFUSED_BEFORE.get(key, set()))
        assert not missing, f"popplay {key} lost {missing}"
