"""A knights self-play population on either backend (what the runner drives).

One phase is one learning episode (Bell §3.3): every agent plays ``games_per_agent``
games at once, one per copy of itself, each against a population member drawn at
random for that episode (game slot g: the agent is X when g is even). Copies play
with the agent's master weights and accumulate their TD(λ) changes; the master
weights take the summed change, scaled by the agent's α, at the end of the episode.
Opponents play with their own master weights (ε-greedy as in learning) and, unless
``opponents_learn``, do not learn from the game.

With ``replicate_every`` = N > 0, every N-th episode ends with selective replication
with variation (Bell §3.4), part of the timed phase: a ranking (a round robin of
``tournament_games`` games per pair, greedy play, Elo ratings; or, with 0 games, each
agent's mean learning score since the last selection), truncation selection (the best
``replicate_fraction`` copied over the worst; agents with non-finite weights or
parameters are never parents and are replaced first), then variation of the copies
(α, λ, ε times log-uniform factors in [1/``mutate_params``, ``mutate_params``], λ and ε
kept in [0, 1]; Gaussian noise of std ``mutate_weights`` on every weight). Copies get new
ids; the state's :class:`popplay.operators.evolution.Lineage` records every copy, mutation and reset.

``measure`` records the learning scores of every episode and, every ``eval_every``
episodes (and at the first), every agent's quality against the benchmark opponents;
in between it repeats the last evaluation (``eval_episode`` says when it was made).
Evaluations are untimed (they are not learning) and kept in the state. With
``eval_every_seconds`` an evaluation is also due once that much learning time (this
process's phases) passed since the last: a study of learning time gets points where
episodes grow slow; learning is the same, only where the points fall depends on speed.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from popplay import rng as _rng
from popplay import stats
from popplay.core.backend import Backend
from popplay.distributed import collectives
from popplay.distributed.group import Dist, current
from popplay.games.knights import _numba as kernels
from popplay.games.knights import engine
from popplay.games.knights import opponents as bots
from popplay.games.knights import rules as game
from popplay.games.knights.rules import (
    KIND_NET,
    LINEAGE_PARAMETERS,
    GameBatch,
    KnightsParams,
    KnightsState,
    Networks,
    Snapshot,
)
from popplay.operators import evolution as evo
from popplay.operators import league as league_ops
from popplay.tournaments.ladder import ladder, ladder_elo
from popplay.tournaments.ratings import elo_ratings, elo_standard_errors
from popplay.tournaments.roundrobin import TAG_SELECTION, adaptive_round_robin, round_robin
from popplay.xp import npx

_VARIED = ("alpha", "lam", "epsilon")
_LINEAGE_PREFIX = "lineage_"

_SNAPSHOT_FIELDS = ("w1", "b1", "w2", "b2", "alpha", "lam", "epsilon", "agent_id", "plies")
_MIDDLE = ("wm", "bm")  # a second hidden layer's arrays (only with --hidden2)
_STATE_FIELDS = ("w1", "b1", "w2", "b2", "alpha", "lam", "epsilon", "agent_id", "plies", "half_life", "score",
                 "eval_record", "eval_episode")


class KnightsExperiment:
    """Learning episodes of a knights population; state between them: :class:`KnightsState`."""

    domain = "knights"

    def __init__(self, params: KnightsParams, backend: Backend, dist: Any = None) -> None:
        params.validate()
        self.params = params
        self.backend = backend
        p = params
        # Sharded over ranks, this process plays the games of a contiguous block of
        # home agents against opponents from the whole population (every rank holds
        # all weights); the per-network changes and the results are gathered in agent
        # order, so the update, selection and evaluation run as in one process.
        self.dist = current() if dist is None else dist
        self._mine = collectives.shard(p.agents, self.dist)
        if self.dist.distributed and backend.name == "torch":
            # The torch engine adds ∇V with index_add_, whose order of duplicate rows
            # depends on the batch: a rank's share of the games would differ in the last bits.
            raise ValueError("knights runs on several ranks with --backend numba only (the torch engine's "
                             "sums depend on the batch, so a sharded run would not be bit-identical)")
        if self.dist.distributed and p.eval_every_seconds:
            # each rank's clock would put the evaluations (collective over the ranks) elsewhere
            raise ValueError("--eval-every-seconds evaluates by this process's clock; over several ranks, "
                             "evaluate by episodes (--eval-every)")
        if p.dtype != "float64" and backend.name != "torch":
            # said of the run, not of an option: a resumed run takes its dtype from its file
            raise ValueError(f"this run computes in {p.dtype} (--dtype), which only the torch engine does: give "
                             "--backend torch (auto picks numba where there is no GPU); the numba engine "
                             "computes in float64")
        agents, slots = np.arange(p.agents), np.arange(p.games_per_agent)
        self.play_keys = _rng.stream_keys(p.seed, game.TAG_PLAY, agents, slots).reshape(-1)
        self.opponent_keys = _rng.stream_keys(p.seed, game.TAG_OPPONENT, agents, slots)
        self.league_keys = _rng.stream_keys(p.seed, game.TAG_LEAGUE, agents, slots)
        self.words_per_game = game.words_per_game(p.pieces, p.max_turns)
        self.home = np.repeat(agents, p.games_per_agent)
        self.home_side = np.tile(slots % 2, p.agents)
        self.eval_opponents = game.parse_opponents(p.eval_opponents)
        self._turns_per_episode = p.agents * p.games_per_agent * min(p.max_turns, 60)
        self._seen = (0, 0)  # (episode, turns) of the latest state, for the budget projection
        # Plies of the ranking round robins this experiment has played (not agent steps:
        # no agent learns from them; ``popplay reproduce knights`` counts them as compute).
        self.ranking_turns = 0
        # With every rung evaluated, the curves get the population's ladder Elo (the
        # ladder is rated on first use, then cached).
        self.ladder_metrics = True
        self.fitness_errors = np.full(p.agents, np.inf)  # the latest ranking's rating errors
        # learning time of this process's phases, and what it was at the latest evaluation
        # (--eval-every-seconds; not in the state: it changes when points fall, never what is learned)
        self.learned_seconds = 0.0
        self._evaluated_at = 0.0

    # -- the runner's interface -------------------------------------------------

    def initial_state(self) -> KnightsState:
        return game.initial_state(self.params)

    def warmup(self) -> None:
        """Compile (or load from numba's cache) the kernels on a tiny population."""
        p = self.params
        tiny = KnightsParams(rows=p.rows, cols=p.cols, pieces=p.pieces, jumps=p.jumps,
                             max_turns=min(p.max_turns, 8), agents=2, games_per_agent=2, hidden=p.hidden,
                             hidden2=p.hidden2, lookahead=p.lookahead,
                             eval_games=2, snapshot_every=0, eval_opponents=p.eval_opponents,
                             replicate_every=1 if p.replicate_every else 0,
                             tournament_games=min(p.tournament_games, 2), mutate_weights=p.mutate_weights,
                             mutate_params=p.mutate_params)

        small = KnightsExperiment(tiny, self.backend, dist=Dist())
        small.ladder_metrics = False  # a ladder of this tiny game would be rated for nothing
        state = small.phase(small.initial_state(), time_left=None)
        small.measure(state)

    def finished(self, state: KnightsState, *, time_mode: bool) -> bool:
        return state.episode >= self.params.episodes

    def phase(self, state: KnightsState, *, time_left: float | None) -> KnightsState:
        """One learning episode: all games of all agents, then the weight update and,
        every ``replicate_every`` episodes, selective replication with variation (an
        episode is the unit of work, so ``time_left`` does not shorten it)."""
        started = time.perf_counter()
        try:
            return self._episode(state)
        finally:
            self.learned_seconds += time.perf_counter() - started

    def _episode(self, state: KnightsState) -> KnightsState:
        p = self.params
        league = self.league_opponents(state)
        batch = self.episode_batch(state, league)
        bank, lam = self.bank(state)
        if self.dist.distributed:
            played = self._play_sharded(state, batch, bank, lam)
        else:
            played = engine.run_batch(bank, lam, batch, params=p,
                                    base=state.episode * self.words_per_game, backend=self.backend)
        self.backend.synchronize()
        change = self.step_sizes(state)[:, None] * played.delta[:p.agents]  # league members never learn
        if p.widths_vary:  # a switched-off unit stays off: its weights never learn
            change[game.frozen_parameters(state.networks, p.inputs)] = 0.0
        flat = game.pack(state.networks) + change
        nets = game.unpack(flat, p.inputs, p.hidden, p.hidden2)
        sign = np.where(self.home_side == 0, 1, -1)
        points = np.where(played.result == 0, 0.5, np.where(played.result == sign, 1.0, 0.0))
        score = points.reshape(p.agents, p.games_per_agent).mean(axis=1)
        turns = int(played.plies.sum())
        self._turns_per_episode = turns
        self._seen = (state.episode + 1, state.turns + turns)
        league_score = self.league_scores(state)
        if p.league:
            first = len(state.snapshots) - len(self.league_members(state))
            met = np.where(league >= 0, first + league // p.agents, -1)
            league_score = league_ops.updated_scores(league_score, met, points)
        new = state.with_networks(nets, score=score, episode=state.episode + 1, turns=state.turns + turns,
                                  score_history=state.score_history + (score,), league_score=league_score)
        if p.replicate_every and new.episode % p.replicate_every == 0:
            new = self.replicate(new)
        if p.snapshot_every and new.episode % p.snapshot_every == 0:
            new = new._replace(snapshots=state.snapshots + (new.snapshot(),),
                               league_score=np.append(new.league_score, 0.5))
        return new

    def step_sizes(self, state: KnightsState) -> np.ndarray:
        """Every agent's TD(λ) step size this episode: its α, on its own schedule."""
        half_life = state.half_life
        if not self.params.alpha_half_life or half_life is None:
            return state.alpha
        scheduled = half_life > 0.0
        return np.where(scheduled, state.alpha * 2.0 ** (-state.episode / np.where(scheduled, half_life, 1.0)),
                        state.alpha)

    # -- the league of past generations -------------------------------------------

    def league_members(self, state: KnightsState) -> tuple[Snapshot, ...]:
        """The frozen snapshots the population may meet: the last ``--league`` taken."""
        k = self.params.league
        return state.snapshots[-k:] if k else ()

    def league_scores(self, state: KnightsState) -> np.ndarray:
        """The population's running score against every snapshot (0.5 before any game)."""
        if state.league_score is not None and len(state.league_score) == len(state.snapshots):
            return np.asarray(state.league_score, dtype=np.float64)
        return np.full(len(state.snapshots), 0.5)

    def bank(self, state: KnightsState) -> tuple[Networks, np.ndarray]:
        """The networks games may refer to, and their λ: the population's, then every
        league member's agents (snapshot after snapshot), frozen copies."""
        members = self.league_members(state)
        if not members:
            return state.networks, state.lam
        nets = state.networks.stacked([s.networks for s in members])
        return nets, np.concatenate([state.lam] + [s.lam for s in members])

    def league_opponents(self, state: KnightsState) -> np.ndarray:
        """(agents, games_per_agent): the league member (bank index − agents) each game
        slot meets this episode, −1 for a game within the population. The draws come
        from the slots' own league streams at the episode's counters."""
        p = self.params
        members = self.league_members(state)
        if not members:
            return np.full((p.agents, p.games_per_agent), -1, dtype=np.int64)
        rules = _numpy_rules()
        words = [rules.rng.draw(self.league_keys, rules.rng.mix_counter(np.int64(2 * state.episode + i)))
                 for i in range(2)]
        scores = self.league_scores(state)[-len(members):]
        weights = (league_ops.pfsp_weights(scores) if p.league_sampling == "pfsp"
                   else np.full(len(members), 1.0 / len(members)))
        return league_ops.league_opponents(rules.rng.uniform_hi32(words[0]), rules.rng.uniform_lo32(words[0]),
                                           rules.rng.uniform53(words[1]), weights, p.league_fraction, p.agents)

    def _play_sharded(self, state: KnightsState, batch: GameBatch, bank: Networks, lam: np.ndarray) -> Any:
        """This rank's games (its home agents' slots), then everything gathered in
        agent order, with the same bits as one process. When only a game's home side
        learns, a network's change is the sum over its own games, all on the rank that
        played them: the per-network sums are gathered. With ``opponents_learn`` a
        network also learns from games on other ranks; one process adds its changes
        game after game, so the ranks continue one running sum in rank (= game) order
        (:func:`popplay.distributed.collectives.chain`)."""

        p = self.params
        games = slice(self._mine.start * p.games_per_agent, self._mine.stop * p.games_per_agent)
        local = GameBatch(*(np.ascontiguousarray(np.asarray(field)[games]) for field in batch))
        played = engine.run_batch(bank, lam, local, params=p,
                                base=state.episode * self.words_per_game, backend=self.backend,
                                summed=not p.opponents_learn)
        result = collectives.all_gather_axis(np.asarray(played.result).astype(np.int64), 0, dist=self.dist)
        plies = collectives.all_gather_axis(np.asarray(played.plies).astype(np.int64), 0, dist=self.dist)
        delta = None
        if p.opponents_learn:
            # Every game's home side learns, so every rank has rows to add.
            rows, learning = played.delta, engine.learning_sides(local)
            delta = collectives.chain(
                lambda partial: kernels.sum_by_network(rows, local.net, learning, p.agents, initial=partial),
                np.zeros((p.agents, game.parameter_count(p.inputs, p.hidden, p.hidden2))), dist=self.dist)
        elif played.delta is not None:
            mine = np.ascontiguousarray(np.asarray(played.delta)[self._mine])
            delta = collectives.all_gather_axis(mine, 0, dist=self.dist)
        return type(played)(result.astype(np.asarray(played.result).dtype), plies, delta)

    # -- selective replication with variation -----------------------------------

    def replicate(self, state: KnightsState) -> KnightsState:
        """Rank, copy the best over the worst, vary the copies, record it all (the
        generation is the episode count). Returns a new state; the lineage log is
        appended to in place."""
        p = self.params
        generation = state.episode
        flat = game.pack(state.networks)
        eligible = (np.isfinite(flat).all(axis=1) & np.isfinite(state.alpha) & np.isfinite(state.lam)
                    & np.isfinite(state.epsilon))
        fitness = self.fitness(state, flat, eligible)
        parents, children = evo.select_replacements(fitness, p.replicate_fraction, eligible)
        copies = parents != children
        if p.replicate_when == "significant":
            copies &= evo.significant(parents, children, fitness, self.fitness_errors, p.replicate_confidence)
        parents, children = parents[copies], children[copies]
        if not len(children):
            return state._replace(fitness=fitness)
        parent_ids = state.agent_id[parents]
        widths, widths2 = game.unit_widths(state.networks), game.unit_widths2(state.networks)
        ids, child_ids = state.lineage.replace(
            generation, state.agent_id, parents, children,
            values={"alpha": state.alpha[parents], "lam": state.lam[parents], "epsilon": state.epsilon[parents],
                    "plies": state.plies[parents], "width": widths[parents], "width2": widths2[parents],
                    "half_life": state.half_life[parents]})
        flat = evo.replicate(flat, parents, children, out=flat)
        alpha, lam, epsilon, plies, half_life = (evo.replicate(getattr(state, name), parents, children)
                                                 for name in (*_VARIED, "plies", "half_life"))
        widths, widths2 = evo.replicate(widths, parents, children), evo.replicate(widths2, parents, children)
        if p.copies_vary:
            switch = evo.switches(p.seed, generation, child_ids, p.mutate_lookahead)
            plies[children] = np.where(switch, 3 - plies[children], plies[children])  # 1 <-> 2
            flat[children], widths[children], widths2[children] = self._vary_widths(
                flat[children], widths[children], widths2[children], generation, child_ids)
            # the half-life's factor is a fourth word: α's, λ's and ε's are those of runs before it
            factors = evo.vary_factors(p.seed, generation, child_ids, (*_VARIED, "half_life"), p.mutate_params)
            alpha = evo.multiply_at(alpha, children, factors["alpha"], out=alpha)
            half_life = evo.multiply_at(half_life, children, factors["half_life"], out=half_life)  # 0 stays 0
            # λ and ε are probabilities/decays: a factor must not take them past 1
            lam = evo.multiply_at(lam, children, factors["lam"], low=0.0, high=1.0, out=lam)
            epsilon = evo.multiply_at(epsilon, children, factors["epsilon"], low=0.0, high=1.0, out=epsilon)
            noise = evo.gaussian_noise(p.seed, generation, child_ids, flat.shape[1], p.mutate_weights)
            if p.widths_vary:  # noise would switch a unit back on
                noise[game.frozen_parameters(game.unpack(flat[children], p.inputs, p.hidden, p.hidden2),
                                             p.inputs)] = 0.0
            flat = evo.add_at(flat, children, noise, out=flat)
            state.lineage.record(generation, "mutation", child_ids, parents=parent_ids, slots=children,
                                 values={"alpha": alpha[children], "lam": lam[children],
                                         "epsilon": epsilon[children], "noise": p.mutate_weights,
                                         "plies": plies[children], "width": widths[children],
                                         "width2": widths2[children], "half_life": half_life[children]})
        nets = game.unpack(flat, p.inputs, p.hidden, p.hidden2).choosing(plies)
        return state.with_networks(nets, alpha=alpha, lam=lam, epsilon=epsilon, agent_id=ids, fitness=fitness,
                                   half_life=half_life)

    def _vary_widths(self, flat: np.ndarray, widths: np.ndarray, widths2: np.ndarray, generation: int,
                     child_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies' networks and widths (both hidden layers) after ``--mutate-width`` and
        ``--mutate-width2``: a copy that narrows a layer switches its last units off; one
        that widens switches the next units on with input weights drawn as a founder's
        (uniform on ±``--init-scale``, from its own stream) and zero output weights, so
        it plays exactly as before until it learns."""
        p = self.params
        new = evo.width_changes(p.seed, generation, child_ids, p.mutate_width, widths, p.hidden)
        new2 = evo.width_changes(p.seed, generation, child_ids, p.mutate_width2, widths2, p.hidden2, layer=2)
        if np.array_equal(new, widths) and np.array_equal(new2, widths2):
            return flat, widths, widths2
        incoming = game.unit_parameters(game.units_between(widths, new, p.hidden), p.inputs, p.hidden2,
                                        incoming_only=True)
        if p.hidden2:
            # weights from first-layer units that are off come out zero again in with_widths
            incoming |= game.unit_parameters2(game.units_between(widths2, new2, p.hidden2), p.inputs, p.hidden,
                                              incoming_only=True)
        fresh = evo.uniform_values(p.seed, generation, child_ids, flat.shape[1], p.init_scale)
        flat = np.where(incoming, fresh, flat)
        return game.with_widths(flat, new, p.inputs, p.hidden, p.hidden2, new2), new, new2

    def fitness(self, state: KnightsState, flat: np.ndarray, eligible: np.ndarray) -> np.ndarray:
        """What selection ranks by (NaN for agents that may not be parents).

        With ``tournament_games`` G > 0: Elo ratings (mean 0) from a round robin of G
        games per pair, greedy play, starting positions fresh every generation. With
        G = 0: each agent's mean learning score over the episodes since the last
        selection, which costs nothing: an episode is already a randomised round
        robin (games_per_agent games against uniformly drawn members, half as X).
        """
        p = self.params
        if p.tournament_games > 0:
            safe = np.where(eligible[:, None], flat, 0.0)  # diverged agents play (and rank) as blanks
            play = adaptive_round_robin if p.tournament_pairing == "adaptive" else round_robin
            nets = game.unpack(safe, p.inputs, p.hidden, p.hidden2).choosing(state.plies)
            result = play(nets, np.arange(p.agents), p.tournament_games,
                          params=p, seed=p.seed, tag=TAG_SELECTION, base=state.episode * self.words_per_game,
                          backend=self.backend)
            self.ranking_turns += int(result.turns)
            fitness = elo_ratings(result.wins, result.draws)
            self.fitness_errors = elo_standard_errors(fitness, result.wins, result.draws)
        else:
            recent = state.score_history[-p.replicate_every:]
            fitness = np.mean(np.stack(recent), axis=0) if recent else state.score.copy()
        return np.where(eligible, fitness, np.nan)

    def episode_batch(self, state: KnightsState, league: np.ndarray | None = None) -> GameBatch:
        """Who plays whom in this episode's games (agent-major, game slot minor); with
        ``league`` (:meth:`league_opponents`) some slots meet frozen past generations,
        which play with the ε they had and never learn."""
        p = self.params
        opponent = self.opponents(state.episode).reshape(-1)
        from_league = np.zeros(opponent.shape, dtype=bool)
        if league is not None:
            league = league.reshape(-1)
            from_league = league >= 0
            opponent = np.where(from_league, p.agents + league, opponent)
        home_x = self.home_side == 0
        net = np.stack([np.where(home_x, self.home, opponent), np.where(home_x, opponent, self.home)], axis=1)
        learn = np.stack([home_x, ~home_x], axis=1)
        if p.opponents_learn:
            learn = np.ones_like(learn)
        learn &= ~np.stack([~home_x & from_league, home_x & from_league], axis=1)  # a league member's side
        epsilon = np.concatenate([state.epsilon] + [s.epsilon for s in self.league_members(state)])
        kind = np.full(net.shape, KIND_NET, dtype=np.int64)
        return GameBatch(kind, net.astype(np.int64), epsilon[net], learn, self.play_keys)

    def opponents(self, episode: int) -> np.ndarray:
        """(agents, games_per_agent): the population member each game slot meets."""
        p = self.params
        if p.agents == 1:
            return np.zeros((1, p.games_per_agent), dtype=np.int64)
        rules = _numpy_rules()  # NumPy: the numba path must not pay for importing torch
        u = rules.rng.uniform53(rules.rng.draw(self.opponent_keys, rules.rng.mix_counter(np.int64(episode))))
        agents = np.arange(p.agents, dtype=np.int64)[:, None]
        return np.asarray(rules.opponent(agents, u, np.int64(p.agents))).astype(np.int64)

    def measure(self, state: KnightsState) -> dict[str, float]:
        """Learning scores now; benchmark qualities every ``eval_every`` episodes.

        Evaluations happen at episodes that are multiples of ``eval_every`` (and at the
        first measurement) and are kept in the state (``eval_record``, ``eval_episode``),
        so a resumed run measures exactly what an uninterrupted one does.
        """
        p = self.params
        due = state.episode % p.eval_every == 0 or state.eval_episode[0] < 0
        due = due or bool(p.eval_every_seconds) and self.learned_seconds - self._evaluated_at >= p.eval_every_seconds
        if due and state.eval_episode[0] != state.episode:
            self.store_evaluation(state)
        metrics: dict[str, float] = {}
        top = bots.strongest(list(self.eval_opponents))
        for name, q in self.stored_qualities(state).items():
            if name == top:
                # The population's quality is its mean agent's: the best of P agents
                # measured over a few games is biased upwards by the selection itself.
                metrics["quality"] = float(q.score.mean())
                metrics.update(stats.error_metric("quality", q.score))
            for stat, v in q.summary().items():
                metrics[f"{name}_{stat}"] = v
        if self.ladder_metrics and set(game.LADDER_RUNGS) <= set(self.eval_opponents):
            stored = self.stored_qualities(state)
            elo = ladder_elo({name: (q.wins, q.draws, q.losses) for name, q in stored.items()}, ladder(self.params))
            metrics.update({f"ladder_elo_{stat}": v for stat, v in elo.summary().items()})
        metrics["score_best"] = float(state.score.max())
        metrics["score_worst"] = float(state.score.min())
        metrics["eval_episode"] = float(state.eval_episode[0])
        if p.replicate_every and p.mutate_params > 1.0:  # selection may drift them: show it live
            for name in _VARIED:
                metrics[f"{name}_mean"] = float(np.mean(getattr(state, name)))
        if p.replicate_every and p.mutate_params > 1.0 and p.alpha_half_life:
            metrics["half_life_mean"] = float(np.mean(state.half_life))
        if p.widths_vary:  # the widths selection keeps, in the curves and the console
            widths = game.unit_widths(state.networks)
            metrics["width_mean"], metrics["width_max"] = float(widths.mean()), float(widths.max())
        if p.widths2_vary:
            widths2 = game.unit_widths2(state.networks)
            metrics["width2_mean"], metrics["width2_max"] = float(widths2.mean()), float(widths2.max())
        first = {name: metrics.pop(name) for name in ("quality", "quality_se") if name in metrics}
        return {**first, **metrics}

    def store_evaluation(self, state: KnightsState) -> None:
        """Evaluate every agent now and keep the counts in ``state`` (in place)."""
        for i, q in enumerate(self.evaluate(state, self.params.eval_games).values()):
            state.eval_record[i] = np.stack([q.wins, q.draws, q.losses], axis=1)
        state.eval_episode[0] = state.episode
        self._evaluated_at = self.learned_seconds

    def stored_qualities(self, state: KnightsState, record: np.ndarray | None = None) -> dict[str, bots.Quality]:
        record = state.eval_record if record is None else record
        out = {}
        for i, name in enumerate(self.eval_opponents):
            wins, draws, losses = (record[i, :, j] for j in range(3))
            games = np.maximum(wins + draws + losses, 1)
            out[name] = bots.Quality(name, wins, draws, losses, (wins + 0.5 * draws) / games)
        return out

    def evaluate(self, state: KnightsState, games: int, opponents: tuple[str, ...] | None = None,
                 *, backend: Backend | None = None) -> dict[str, bots.Quality]:
        """Every agent's quality against each benchmark opponent (greedy play, ε = 0)."""
        names = opponents if opponents is not None else self.eval_opponents
        games += games % 2
        return {name: bots.quality(state.networks, name, games, params=self.params, seed=self.params.seed,
                                   backend=backend) for name in names}

    def progress(self, state: KnightsState) -> int:
        """Episodes done (the unit of ``--episodes`` and ``--checkpoint-every``)."""
        return state.episode

    def check_finite(self, state: KnightsState, *, phase: int) -> list[str]:
        """An agent whose weights or learning parameters became non-finite gets fresh
        initial weights (of its slot's stream) and the run's α, λ, ε; in place."""
        p = self.params
        flat = game.pack(state.networks)
        bad = ~(np.isfinite(flat).all(axis=1) & np.isfinite(state.alpha) & np.isfinite(state.lam)
                & np.isfinite(state.epsilon))
        if not bad.any():
            return []
        slots = np.flatnonzero(bad)
        fresh = game.founders(p, slots)
        for name, values in fresh.arrays().items():
            getattr(state, name)[slots] = values
        state.alpha[slots], state.lam[slots], state.epsilon[slots] = p.alpha, p.lam, p.epsilon
        state.half_life[slots] = p.alpha_half_life
        # A reset agent shares nothing learned with the diverged one: a new founder.
        old = state.agent_id[slots].copy()
        new = state.lineage.new_ids(len(slots))
        state.agent_id[slots] = new
        state.lineage.record(state.episode, "reset", new, replaced=old, slots=slots,
                             values={"alpha": p.alpha, "lam": p.lam, "epsilon": p.epsilon,
                                     "plies": state.plies[slots], "width": p.start_width or p.hidden,
                                     "width2": p.start_width2 or p.hidden2, "half_life": p.alpha_half_life})
        return [f"episode {state.episode}: agent {int(o)} (slot {a}) had non-finite weights; it was reset to "
                f"fresh initial weights as agent {int(n)}" for o, a, n in zip(old, slots, new)]

    def agent_steps(self, state: KnightsState) -> int:
        """Agent turns so far (every ply of every learning game: both sides are agents)."""
        return state.turns

    def total_agent_steps(self, state: KnightsState) -> int:
        return state.turns

    #: The budget and ``--checkpoint-every`` count episodes (see :meth:`progress`).
    progress_unit = "episodes"

    def budget_progress(self) -> int:
        """The episode budget (the agent-step total is only projected)."""
        return self.params.episodes

    def budget_agent_steps(self) -> int:
        """Turns at the episode budget: those done plus the remaining episodes at the
        last episode's length (games get shorter as agents learn)."""
        episode, turns = self._seen
        return turns + max(0, self.params.episodes - episode) * self._turns_per_episode

    # -- run files --------------------------------------------------------------

    def _network_fields(self) -> tuple[str, ...]:
        """The state's per-agent arrays in a run file (a second layer's only where there is one)."""
        return _STATE_FIELDS + (_MIDDLE if self.params.hidden2 else ())

    def state_arrays(self, state: KnightsState) -> dict[str, Any]:
        arrays: dict[str, Any] = {name: getattr(state, name) for name in self._network_fields()}
        arrays["fitness"] = state.fitness
        for name, values in state.lineage.to_arrays().items():
            arrays[_LINEAGE_PREFIX + name] = values
        arrays["score_history"] = (np.stack(state.score_history) if state.score_history
                                   else np.zeros((0, self.params.agents)))
        snaps = state.snapshots
        arrays["league_score"] = self.league_scores(state)
        arrays["snapshot_episode"] = np.array([s.episode for s in snaps], dtype=np.int64)
        for name in _SNAPSHOT_FIELDS + (_MIDDLE if self.params.hidden2 else ()):
            template = getattr(state, name)
            arrays[f"snapshot_{name}"] = (np.stack([getattr(s, name) for s in snaps]) if snaps
                                          else np.zeros((0,) + template.shape, dtype=template.dtype))
        return arrays

    def state_counters(self, state: KnightsState) -> dict[str, int]:
        return {"episode": state.episode, "turns": state.turns}

    def restore(self, arrays: dict[str, np.ndarray], counters: dict[str, int]) -> KnightsState:
        """Rebuild a state from :meth:`state_arrays`; every shape is checked."""
        p = self.params
        a, inputs, hidden, hidden2 = p.agents, p.inputs, p.hidden, p.hidden2
        shapes = {"w1": (a, inputs, hidden), "b1": (a, hidden), "w2": (a, hidden2 or hidden), "b2": (a,),
                  "alpha": (a,), "lam": (a,), "epsilon": (a,), "agent_id": (a,), "plies": (a,), "half_life": (a,),
                  "score": (a,),
                  "eval_record": (len(self.eval_opponents), a, 3), "eval_episode": (1,)}
        if hidden2:
            shapes.update(wm=(a, hidden, hidden2), bm=(a, hidden2))
        integer = ("agent_id", "plies", "eval_record", "eval_episode")
        # Run files written before agents chose their own depth: the run's --lookahead for all.
        arrays = {"plies": np.full(a, p.lookahead), **arrays}
        # ... and before each agent kept its own step-size half-life: the run's for all.
        arrays = {"half_life": np.full(a, float(p.alpha_half_life)), **arrays}
        if "snapshot_episode" in arrays and "snapshot_plies" not in arrays:
            arrays["snapshot_plies"] = np.full((len(np.asarray(arrays["snapshot_episode"]).reshape(-1)), a),
                                               p.lookahead)
        values = {}
        for name, shape in shapes.items():
            if name not in arrays:
                raise ValueError(f"state has no {name}")
            values[name] = np.array(arrays[name], dtype=np.int64 if name in integer else np.float64)
            if values[name].shape != shape:
                raise ValueError(f"state {name} has shape {values[name].shape}, expected {shape}")
        if not np.isin(values["plies"], (1, 2)).all() or not np.isin(arrays.get("snapshot_plies", 1), (1, 2)).all():
            raise ValueError("state plies (the agents' chooser depths) must be 1 or 2")
        if not (np.isfinite(values["half_life"]).all() and (values["half_life"] >= 0).all()):
            raise ValueError("state half_life (the agents' step-size half-lives) must be finite and non-negative")
        episodes = np.asarray(arrays.get("snapshot_episode", np.zeros(0)), dtype=np.int64).reshape(-1)
        snaps = []
        for i, episode in enumerate(episodes.tolist()):
            fields = {}
            for name in _SNAPSHOT_FIELDS + (_MIDDLE if hidden2 else ()):
                stack = np.asarray(arrays[f"snapshot_{name}"])
                if stack.shape != (len(episodes),) + shapes[name]:
                    raise ValueError(f"state snapshot_{name} has shape {stack.shape}")
                fields[name] = stack[i].astype(np.int64 if name in integer else np.float64)
            snaps.append(Snapshot(int(episode), **fields))
        history = np.array(arrays.get("score_history", np.zeros((0, a))), dtype=np.float64)
        if history.ndim != 2 or history.shape[1] != a:
            raise ValueError(f"state score_history has shape {history.shape}, expected (episodes, {a})")
        # Run files written before selective replication existed have no fitness and
        # no lineage: start them as they would have started.
        fitness = np.array(arrays.get("fitness", np.full(a, np.nan)), dtype=np.float64)
        if fitness.shape != (a,):
            raise ValueError(f"state fitness has shape {fitness.shape}, expected ({a},)")
        columns = {name[len(_LINEAGE_PREFIX):]: value for name, value in arrays.items()
                   if name.startswith(_LINEAGE_PREFIX)}
        # written before depths (widths, half-lives, second-layer widths) were recorded
        for name in ("plies", "width", "half_life", "width2"):
            if columns and name not in columns and "agent" in columns:
                columns[name] = np.full(np.asarray(columns["agent"]).reshape(-1).shape, np.nan)
        if columns:
            lineage = evo.Lineage.from_arrays(columns, LINEAGE_PARAMETERS)
            if values["agent_id"].size and values["agent_id"].max() >= lineage.next_id:
                raise ValueError("state agent_id holds ids the lineage never handed out")
        else:
            nets = game.Networks(values["w1"], values["b1"], values["w2"], values["b2"], values.get("wm"),
                                 values.get("bm"))
            lineage = evo.Lineage.start(values["agent_id"], LINEAGE_PARAMETERS,
                                        {"alpha": values["alpha"], "lam": values["lam"],
                                         "epsilon": values["epsilon"], "plies": values["plies"],
                                         "half_life": values["half_life"], "width": game.unit_widths(nets),
                                         "width2": game.unit_widths2(nets)})
        # Run files written before the league existed have no league scores: 0.5 each.
        league_score = np.array(arrays.get("league_score", np.full(len(snaps), 0.5)), dtype=np.float64)
        if league_score.shape != (len(snaps),):
            raise ValueError(f"state league_score has shape {league_score.shape}, expected ({len(snaps)},)")
        return KnightsState(**values, episode=int(counters["episode"]), turns=int(counters["turns"]),
                            snapshots=tuple(snaps), score_history=tuple(history), fitness=fitness,
                            lineage=lineage, league_score=league_score)

    def static_arrays(self) -> dict[str, np.ndarray]:
        geo = self.params.geometry
        return {"game/offsets": np.array(geo.offsets, dtype=np.int64), "game/jump_table": geo.table[:-1]}

    def results(self, state: KnightsState) -> dict[str, np.ndarray]:
        """Per agent: quality, wins, draws and losses against each benchmark opponent
        (evaluated at the final state) and the learning score of the last episode."""
        record = state.eval_record
        if state.eval_episode[0] != state.episode:  # evaluated for the file, not stored in the state
            record = np.stack([np.stack([q.wins, q.draws, q.losses], axis=1)
                               for q in self.evaluate(state, self.params.eval_games).values()])
        out: dict[str, np.ndarray] = {"score": state.score}
        for name, q in self.stored_qualities(state, record).items():
            out[f"quality_{name}"] = q.score
            out[f"wins_{name}"] = q.wins
            out[f"draws_{name}"] = q.draws
            out[f"losses_{name}"] = q.losses
        return out


_RULES: list[Any] = []


def _numpy_rules() -> Any:
    """The game's rules on NumPy arrays (built once)."""
    if not _RULES:

        _RULES.append(game.make_rules(npx))
    return _RULES[0]
