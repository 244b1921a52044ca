"""Knights as a PettingZoo AEC environment, so that other libraries' agents can play it.

    pip install "popplay[pettingzoo]"

    from popplay.games.knights.pettingzoo import env
    game = env(render_mode="ansi")
    game.reset(seed=42)
    for agent in game.agent_iter():
        observation, reward, termination, truncation, info = game.last()
        action = None if termination or truncation else game.action_space(agent).sample(observation["action_mask"])
        game.step(action)

``env()`` follows PettingZoo's own classic games (``raw_env`` wrapped so that an illegal
move ends the game with −1 for its player, actions out of range are refused, and the
call order is enforced). Agents ``"player_0"`` (X, moves first) and ``"player_1"`` (O).

* **Observation** (from the mover's side): ``{"observation": (2, rows, cols) int8 —
  plane 0 the agent's own pieces, plane 1 the opponent's; "action_mask": int8}``.
* **Action**: ``from_square · jumps + j`` moves the piece on ``from_square`` by jump
  ``j`` of the pattern (the order of :func:`popplay.games.knights.rules.geometry`);
  the last action passes and is legal only when no move is (the rules' pass).
* **Rewards**: +1 to the side that captures the opponent's last piece, −1 to the other;
  after ``max_turns`` plies both are truncated with 0 (the rules' draw).
* **Starts**: the rules' random starting positions; ``reset(seed=s)`` repeats them.

:func:`agent_policy` makes a popplay agent (a trained value network) an opponent for
this environment: it plays the move whose after-state its network values most, as in
popplay's own greedy play (:func:`popplay.games.knights.rules.best_move`).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from gymnasium import spaces

try:
    from pettingzoo import AECEnv
    from pettingzoo.utils import AgentSelector, wrappers
except ImportError as error:  # an optional extra: say how to get it, in one line
    raise ImportError("popplay.games.knights.pettingzoo needs PettingZoo: pip install \"popplay[pettingzoo]\"") \
        from error

from popplay.games.knights import rules as game

__all__ = ["env", "raw_env", "agent_policy"]


def env(**kwargs: Any) -> AECEnv:
    """The wrapped environment (the factory convention of PettingZoo's environments)."""
    wrapped = raw_env(**kwargs)
    wrapped = wrappers.TerminateIllegalWrapper(wrapped, illegal_reward=-1)
    wrapped = wrappers.AssertOutOfBoundsWrapper(wrapped)
    return wrappers.OrderEnforcingWrapper(wrapped)


class raw_env(AECEnv):  # noqa: N801  (PettingZoo's name for the unwrapped class)
    """The knights game of :mod:`popplay.games.knights.rules` as an AEC environment."""

    metadata = {"render_modes": ["human", "ansi"], "name": "popplay_knights_v0", "is_parallelizable": False}

    def __init__(self, rows: int = 5, cols: int = 7, pieces: int = 5, jumps: str = "knight",
                 max_turns: int = game.DEFAULT_MAX_TURNS, render_mode: str | None = None) -> None:
        super().__init__()
        params = game.KnightsParams(rows=rows, cols=cols, pieces=pieces, jumps=jumps, max_turns=max_turns)
        params.validate()
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {', '.join(self.metadata['render_modes'])} or None")
        self.params = params
        self.render_mode = render_mode
        self.table = params.geometry.table[:-1]  # (squares, jumps); the engines' extra row is not a square
        self.n_jumps = self.table.shape[1]
        self.pass_action = rows * cols * self.n_jumps
        self.possible_agents = ["player_0", "player_1"]
        self._player = {"player_0": 1, "player_1": -1}  # X moves first
        observation = spaces.Dict({
            "observation": spaces.Box(0, 1, (2, rows, cols), dtype=np.int8),
            "action_mask": spaces.Box(0, 1, (self.pass_action + 1,), dtype=np.int8),
        })
        self.observation_spaces = {agent: observation for agent in self.possible_agents}
        self.action_spaces = {agent: spaces.Discrete(self.pass_action + 1) for agent in self.possible_agents}
        self.board = np.zeros((rows, cols), dtype=np.int8)
        self.plies = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        rng = np.random.default_rng(seed)
        p = self.params
        self.board = game.start_position(int(rng.integers(0, 2**62)), p.rows, p.cols, p.pieces)
        self.plies = 0
        self.agents = self.possible_agents[:]
        self.rewards = {agent: 0.0 for agent in self.agents}
        self._cumulative_rewards = {agent: 0.0 for agent in self.agents}
        self.terminations = {agent: False for agent in self.agents}
        self.truncations = {agent: False for agent in self.agents}
        self.infos = {agent: {} for agent in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.next()

    def action_mask(self, agent: str) -> np.ndarray:
        """1 for every legal action of ``agent`` now (the pass only when nothing else is)."""
        mask = np.zeros(self.pass_action + 1, dtype=np.int8)
        for start, target in game.legal_moves(self.board, self._player[agent], self.params.jumps):
            mask[game.move_action(self.table, (start, target))] = 1
        if not mask.any():
            mask[self.pass_action] = 1
        return mask

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        me = self._player[agent]
        planes = np.stack([self.board == me, self.board == -me]).astype(np.int8)
        return {"observation": planes, "action_mask": self.action_mask(agent)}

    def step(self, action: int | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        move = game.action_move(self.table, action)
        if move is not None:  # the pass (the only other action a mask allows)
            self.board = game.apply_move(self.board, move, self.params.jumps)
        self.plies += 1
        self._cumulative_rewards[agent] = 0.0
        won = game.winner(self.board)
        if won:
            for name in self.agents:
                self.rewards[name] = 1.0 if self._player[name] == won else -1.0
                self.terminations[name] = True
        elif self.plies >= self.params.max_turns:
            self.truncations = {name: True for name in self.agents}
        self.agent_selection = self._selector.next()
        self._accumulate_rewards()
        if self.render_mode == "human":
            self.render()

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        cols = self.params.cols
        lines = ["  " + " ".join(chr(ord("a") + c) for c in range(cols))]
        for r, row in enumerate(self.board):
            lines.append(f"{r + 1} " + " ".join({1: "X", -1: "O"}.get(int(v), ".") for v in row))
        text = "\n".join(lines)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        pass


def agent_policy(net: game.Network, *, cols: int = 7, jumps: str = "knight",
                 lookahead: int | None = None) -> Callable[[dict[str, Any]], int]:
    """A popplay agent as a policy for this environment: ``policy(observation) ->
    action``. ``net``: one agent's network, e.g. from ``net, params =
    popplay.api.knights_agent("runs/latest-knights.h5", 3)`` (then pass
    ``cols=params.cols, jumps=params.jumps``: the board it learned on). It chooses its
    moves as deep as it learned to (``net.plies``) unless ``lookahead`` says otherwise."""
    from popplay.games.knights.opponents import agent_move  # defers numba

    def policy(observation: dict[str, Any]) -> int:
        planes = np.asarray(observation["observation"])
        board = (planes[0].astype(np.int8) - planes[1].astype(np.int8)).reshape(-1, cols)
        move = agent_move(net, board, 1, jumps, lookahead)  # the agent is +1 on its own view of the board
        mask = np.asarray(observation["action_mask"])
        if move is None:
            return len(mask) - 1
        return game.move_action(game.geometry(board.shape[0], cols, jumps).table, move)

    return policy
