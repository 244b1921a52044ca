"""The players of a tournament, gathered from knights run files.

Every agent of each run's final population enters; with ``snapshots`` so does every
agent of each stored snapshot taken before the end (a cross-generation tournament).
A benchmark bot may join as the anchor of the rating scale. All runs must play the
same game: board size, pieces per side, jump pattern and turn limit. Networks with
different hidden layers play in one batch after zero-padding (exactly the same value
functions; see :func:`popplay.tournaments.roundrobin.pad_hidden`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from popplay.checkpoints.runfile import RunFileError, display_name
from popplay.checkpoints.validation import load_run, params_from_config
from popplay.core import registry
from popplay.core.backend import Backend
from popplay.games.knights import rules as game
from popplay.games.knights.rules import OPPONENTS, KnightsParams, Networks
from popplay.tournaments.roundrobin import stack_networks

GAME_FIELDS = ("rows", "cols", "pieces", "jumps", "max_turns")


class EntrantError(ValueError):
    """A run file that cannot join the tournament; the message is one line for users."""


class Entrant(NamedTuple):
    """One player: an agent of a population stored in a run file, or a bot."""

    name: str
    kind: str  # "agent" or "bot"
    path: str  # run file ("" for a bot)
    episode: int  # episodes the population had learned (-1 for a bot)
    slot: int  # index in that population (-1 for a bot)
    agent_id: int  # stable id (lineage); -1 for a bot
    hidden: int  # hidden units (0 for a bot)

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


class Field(NamedTuple):
    """Everything a round robin needs: the game, the networks and who is who."""

    params: KnightsParams  # the shared game (and the first run's other settings)
    nets: Networks  # every agent's network, padded to one hidden size
    players: np.ndarray  # (n,) player codes for round_robin
    entrants: list[Entrant]
    anchor: int | None  # index of the anchor bot among the players


def describe_game(params: KnightsParams) -> str:
    jumps = "knight" if game.parse_jumps(params.jumps) == game.KNIGHT else params.jumps
    return (f"{params.rows}x{params.cols} board, {params.pieces} pieces a side, {jumps} jumps, "
            f"{params.max_turns}-ply limit")


def _same_game(a: KnightsParams, b: KnightsParams) -> bool:
    return ((a.rows, a.cols, a.pieces, a.max_turns) == (b.rows, b.cols, b.pieces, b.max_turns)
            and game.parse_jumps(a.jumps) == game.parse_jumps(b.jumps))


def load_population(path: Path) -> tuple[KnightsParams, Any]:
    """A knights run's parameters and restored state; EntrantError otherwise."""

    try:
        stored = load_run(Path(path), expected_domain="knights")
    except RunFileError as error:
        raise EntrantError(str(error)) from None
    try:
        params = params_from_config("knights", stored.config, run_options=False)
        params.validate()
        experiment = registry.get("knights").build(params, Backend("numba", "cpu"))
        state = experiment.restore(stored.state, stored.state_counters)
    except (TypeError, ValueError, KeyError) as error:
        raise EntrantError(f"{path}: damaged knights run file ({error})") from None
    return params, state


def _labels(paths: Sequence[Path]) -> list[str]:
    """Short names for the run files: their stems, or their paths where stems repeat."""
    stems = [Path(display_name(p)).stem for p in paths]
    return [stem if stems.count(stem) == 1 else str(p) for stem, p in zip(stems, paths)]


def load_field(paths: Sequence[Path], *, snapshots: bool = False, snapshot_every: int | None = None,
               anchor: str | None = None) -> Field:
    """The players from ``paths`` (see the module docstring).

    Args:
        paths: knights run files (at least one).
        snapshots: also enter the populations of the stored snapshots (those taken
            before each run's last episode; the final population enters anyway).
        snapshot_every: with ``snapshots``, only snapshots whose episode is a multiple of this.
        anchor: a benchmark bot (random, greedy, search) to enter as the rating anchor.
    """
    if not paths:
        raise EntrantError("give at least one run file")
    if anchor is not None and anchor not in OPPONENTS:
        raise EntrantError(f"--anchor must be one of {', '.join(OPPONENTS)} (got {anchor!r})")
    if snapshot_every is not None and snapshot_every < 1:
        raise EntrantError(f"--snapshot-every must be at least 1 (got {snapshot_every})")
    first: tuple[Path, KnightsParams] | None = None
    parts: list[Networks] = []
    entrants: list[Entrant] = []
    for path, label in zip(paths, _labels(paths)):
        params, state = load_population(path)
        if first is None:
            first = (Path(path), params)
        elif not _same_game(first[1], params):
            raise EntrantError(f"{path} plays a different game ({describe_game(params)}) from {first[0]} "
                               f"({describe_game(first[1])}); all runs in one tournament must share board size, "
                               "pieces, jumps and turn limit")
        populations = []
        if snapshots:
            populations = [s for s in state.snapshots if s.episode < state.episode
                           and (snapshot_every is None or s.episode % snapshot_every == 0)]
        populations.append(state.snapshot())
        for snap in populations:
            nets = snap.networks
            parts.append(nets)
            tag = f"{label}@{snap.episode}" if snapshots else label
            for slot, agent_id in enumerate(np.asarray(snap.agent_id).tolist()):
                entrants.append(Entrant(f"{tag}#{agent_id}", "agent", str(path), int(snap.episode), slot,
                                        int(agent_id), int(nets.w1.shape[2])))
    assert first is not None
    try:
        nets = stack_networks(parts)
    except ValueError as error:
        raise EntrantError(f"{error}: enter runs of one kind") from None
    players = list(range(nets.count))
    anchor_index = None
    if anchor is not None:
        anchor_index = len(players)
        players.append(OPPONENTS[anchor])
        entrants.append(Entrant(anchor, "bot", "", -1, -1, -1, 0))
    return Field(first[1], nets, np.asarray(players, dtype=np.int64), entrants, anchor_index)
