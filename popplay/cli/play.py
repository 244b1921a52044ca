"""``popplay play RUN.h5``: play knights against the best agent of a run, in the terminal."""
from __future__ import annotations

import os
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from popplay.checkpoints.runfile import RunFileError
from popplay.checkpoints.validation import load_run, params_from_config
from popplay.cli.app import app
from popplay.core import registry
from popplay.core.backend import Backend
from popplay.core.errors import UsageError
from popplay.games.knights import rules as game
from popplay.games.knights.rules import parse_square, square_name


def help_text(cols: int = 7) -> str:
    """How to enter moves; square numbers count from a1 = 0 along the rows (b1 c3 on a
    board ``cols`` wide is '1 {2 * cols + 2}')."""
    return (f"Type a move as two squares, e.g. 'b1 c3' (or 'b1c3', 'b1-c3', or square numbers counted from "
            f"a1 = 0 along each row: '1 {2 * cols + 2}'). 'moves' lists your legal moves, 'quit' ends the session.")


HELP_TEXT = help_text()


class Side(str, Enum):
    x = "x"
    o = "o"


@app.command("play")
def play(
    run: Annotated[Path, typer.Argument(help="A knights run file written by `popplay train knights`.",
                                        metavar="RUN.h5", dir_okay=False)],
    side: Annotated[Side, typer.Option(help="Your pieces: x moves first, o second.")] = Side.x,
    agent: Annotated[Optional[int], typer.Option(
        min=0, help="The agent to play (default: the best against the strongest benchmark opponent).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the starting positions (default: random).")] = None,
) -> None:
    """Play the run's best agent (it picks the move with the highest learned value)."""


    try:
        stored = load_run(run)
    except RunFileError as error:
        raise UsageError(str(error)) from None
    if stored.domain != "knights":
        raise UsageError(f"{run}: a {stored.domain} run; play needs a knights run")
    try:
        params = params_from_config("knights", stored.config, run_options=False)
        experiment = registry.get("knights").build(params, Backend("numba", "cpu"))
        state = experiment.restore(stored.state, stored.state_counters)
    except (TypeError, ValueError, KeyError) as error:
        raise UsageError(f"{run}: damaged run file ({error})") from None
    if agent is not None and agent >= params.agents:
        raise UsageError(f"--agent must be below {params.agents} (the run has {params.agents} agents)")
    chosen = agent if agent is not None else best_agent(stored.results, params.agents)
    console = Console(highlight=False)
    session = Session(params, state.networks.agent(chosen), chosen, console, human=1 if side == Side.x else -1,
                      seed=seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
    session.run(input)


def best_agent(results: dict[str, Any], agents: int) -> int:
    """The agent with the best stored quality against the strongest opponent evaluated."""

    for name in ("search", "greedy", "random"):
        values = results.get(f"quality_{name}")
        if values is not None and np.shape(values) == (agents,) and np.isfinite(values).all():
            return int(np.argmax(values))
    return 0


class Session:
    """Games between a person (reading lines from ``ask``) and one agent."""

    def __init__(self, params: Any, net: Any, agent: int, console: Any, *, human: int, seed: int) -> None:
        self.params = params
        self.net = net
        self.agent = agent
        self.console = console
        self.human = human
        self.seed = seed
        self.board: Any = None
        self.moves: list[tuple[int, int]] = []

    def run(self, ask: Callable[[str], str]) -> None:
        """Play games until the person quits (or input ends); never raises on bad input.
        The agent chooses its moves as it learned to (as deep as it chose to look)."""
        game_number = 0
        self.console.print(f"Playing agent {self.agent} of the run. You are "
                           f"{'X (moving first)' if self.human == 1 else 'O (moving second)'}. "
                           f"{help_text(self.params.cols)}")
        try:
            while True:
                if not self.play_one(ask, game_number):
                    break
                game_number += 1
                try:
                    answer = ask("Play again? [y/N] ").strip().lower()
                except UnicodeDecodeError:
                    answer = ""
                if answer not in ("y", "yes"):
                    break
        except (EOFError, KeyboardInterrupt):
            self.console.print("\nBye.")
            return
        self.console.print("Bye.")

    def play_one(self, ask: Callable[[str], str], game_number: int) -> bool:
        """One game; False if the person quit."""
        from popplay.games.knights.opponents import agent_move  # defers numba (the two-ply chooser)

        p = self.params
        board = game.random_board(p.rows, p.cols, p.pieces, seed=self.seed, game=game_number)

        last: tuple[int, int] | None = None
        for ply in range(p.max_turns):
            player = 1 if ply % 2 == 0 else -1
            self.console.print(render_board(board, last))
            moves = game.legal_moves(board, player, p.jumps)
            self.board, self.moves = board, moves  # what the person sees (and tests answer from)
            if not moves:
                self.console.print(f"{'You have' if player == self.human else 'The agent has'} no legal move: pass.")
                continue
            if player == self.human:
                move = self.ask_move(ask, board, moves)
                if move is None:
                    return False
            else:
                move = agent_move(self.net, board, player, p.jumps)
                self.console.print(f"Agent plays {_move_name(move, p.cols)}")
            captured = int(board.flat[move[1]]) == -player
            board = game.apply_move(board, move, p.jumps)
            last = move
            self.console.print(self.status_line(board, ply + 1, player, captured))
            won = game.winner(board)
            if won:
                self.console.print(render_board(board, last))
                self.console.print("You win!" if won == self.human else "The agent wins.")
                return True
        self.console.print(render_board(board, last))
        self.console.print(f"Draw: {p.max_turns} plies without a winner.")
        return True

    def status_line(self, board: Any, plies: int, mover: int, captured: bool) -> str:
        """After a move: a capture, the pieces left, the plies towards the draw, and
        the agent's estimate of its chance to win (its value of the position)."""

        yours, agents = int((board == self.human).sum()), int((board == -self.human).sum())
        who = "You capture" if mover == self.human else "The agent captures"
        estimate = game.value(self.net, board, -self.human) if mover == -self.human else \
            1.0 - game.value(self.net, board, self.human)
        return (f"{who + ' a piece. ' if captured else ''}Pieces: you {yours}, agent {agents}. "
                f"Ply {plies} of {self.params.max_turns} (then a draw). "
                f"Agent's estimate of its chance to win: {estimate:.0%}")

    def ask_move(self, ask: Callable[[str], str], board: Any, moves: list[tuple[int, int]]) -> tuple[int, int] | None:
        """Read a legal move; re-ask on anything else. None: the person quit."""

        p = self.params
        while True:
            try:
                text = ask("Your move: ").strip().lower()
            except UnicodeDecodeError:
                self.console.print("[red]That was not text.[/red] Type 'help' for how to enter moves.")
                continue
            if text in ("q", "quit", "exit"):
                return None
            if text in ("", "?", "h", "help"):
                self.console.print(help_text(p.cols))
                continue
            if text in ("m", "moves"):
                self.console.print("Legal moves: " + ", ".join(_move_name(m, p.cols) for m in moves))
                continue
            try:
                move = parse_move(text, p.rows, p.cols)
            except ValueError as error:
                self.console.print(f"[red]{escape(str(error))}.[/red] Type 'help' for how to enter moves.")
                continue
            if move not in moves:
                self.console.print(f"[red]{_move_name(move, p.cols)} is not a legal move.[/red] "
                                   "Type 'moves' to list them.")
                continue
            return move


def parse_move(text: str, rows: int, cols: int) -> tuple[int, int]:
    """A move from 'b1 c3', 'b1c3', 'b1-c3' or square numbers ('1 16' on a 7-wide board)."""


    parts = [part for part in re.split(r"[\s,\-:>]+", text.strip().lower()) if part]
    if len(parts) == 1:
        found = re.fullmatch(r"([a-z]\d+)([a-z]\d+)", parts[0])
        if found:
            parts = [found.group(1), found.group(2)]
    if len(parts) != 2:
        raise ValueError(f"{text!r} is not two squares")
    return parse_square(parts[0], rows, cols), parse_square(parts[1], rows, cols)


def _move_name(move: tuple[int, int], cols: int) -> str:
    return f"{square_name(move[0], cols)}-{square_name(move[1], cols)}"


def render_board(board: Any, last: tuple[int, int] | None = None) -> Any:
    """The board as a rich table: X and O pieces, the last move's squares highlighted."""

    rows, cols = board.shape
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 1), show_edge=False)
    table.add_column("")
    for c in range(cols):
        table.add_column(chr(ord("a") + c), justify="center")
    marked = set(last) if last is not None else set()
    for r in range(rows):
        cells = [Text(str(r + 1), style="bold")]
        for c in range(cols):
            v = int(board[r, c])
            symbol, style = {1: ("X", "bold cyan"), -1: ("O", "bold magenta"), 0: ("·", "dim")}[v]
            if r * cols + c in marked:
                style += " on grey23"
            cells.append(Text(symbol, style=style))
        table.add_row(*cells)
    return table
