"""Bell's knights figure of §3.4: a population's quality with and without selective
replication with variation, at equal compute.

Bell shows the best, worst and mean quality of 64 parallel agents against a benchmark
opponent over training, and then "the typical results when using selective
replication with variation with a group of 64 agents". ``knights_replication``
reproduces both as one figure: two populations of 64 TD(λ) self-play agents
(``popplay train knights`` defaults otherwise), the same seed, so the same initial
weights and the same learning games until the first selection, learn

* **without** replication, and
* **with** the setting ``docs/tournaments.md`` measured as best over 10 minutes, the
  *gentle* one: every 20 episodes a round robin of 2 games per pair (greedy play, Elo
  ratings) ranks the agents, the best 12.5 % (8 of 64) are copied over the worst 8, and
  every weight of a copy gets N(0, 0.01²) noise; learning parameters are not varied
  (``--mutate-params 1``: parameter variation drifted λ and ε and stalled learning there).

Quality is (wins + draws/2)/games against the ``greedy`` bot (a random capture if any,
else a random move; it beats ``random`` in every game), every agent on the same games,
measured every ``eval_every`` episodes; ``random`` is measured too. At the end every
agent of both final populations plays ``final_games`` more games against each bot.

**Equal compute, counted, not timed.** Both runs get the same budget of *agent-turns*:
every ply an agent network chooses a move by one-move lookahead — the plies of the
learning games (what ``popplay train knights`` reports as ``agent_steps``) plus, for
the replication run, the plies of its ranking round robins (greedy play, the same
lookahead without the TD(λ) bookkeeping; about 5 % of its compute in the gentle
setting). A run stops at the first evaluation point at which it has used the budget.
``docs/tournaments.md`` compared equal *learning time* instead, which is what a user
waits for; but wall time on a shared 2-core machine differs from run to run and from
machine to machine, while turns are deterministic: the same seed and scale give the
same figure on any machine and backend thread count (and the seconds are stored
beside the turns). Episodes would be a poor measure of compute here: a game lasts up
to 100 plies, and agents that have learned to capture finish theirs sooner, so an
episode of a better population costs less. Each run is exactly ``popplay train
knights`` with ``--episodes`` set to where it stopped (the ``command`` attribute of each
curve; tested).

Scales: ``tiny`` (8 agents, a few seconds; replication every 2 episodes so that it
happens at all), ``small`` (64 agents, 120 M turns per run: about a minute each on two
quiet cores; about where the gentle replication was furthest ahead of none in
``docs/tournaments.md``, its second minute), ``paper`` (64 agents, 600 M turns per run: about what the 600 s runs of
``docs/tournaments.md`` learned, one numba thread each).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from popplay.games.knights.rules import KnightsParams
from popplay.operators.evolution import BIRTH_EVENTS, EVENTS
from popplay.reproduce.data import FigureData, Group, round_finite
from popplay.reproduce.registry import Context, Figure, register
from popplay.training.loop import run as run_experiment

OPPONENT = "greedy"  # the benchmark of the figure
OPPONENTS = ("random", "greedy")  # measured at every evaluation point


@dataclass(frozen=True)
class Replication:
    """Selective replication with variation (``popplay train knights --replicate-*``)."""

    every: int = 20
    fraction: float = 0.125
    mutate_weights: float = 0.01
    mutate_params: float = 1.0
    tournament_games: int = 2

    def options(self) -> str:
        return (f"--replicate-every {self.every} --replicate-fraction {self.fraction} "
                f"--mutate-weights {self.mutate_weights} --mutate-params {self.mutate_params:g} "
                f"--tournament-games {self.tournament_games}")


GENTLE = Replication()  # docs/tournaments.md: best over 10 minutes with 64 agents


@dataclass(frozen=True)
class KnightsScale:
    """Sizes of one reproduction scale (everything else: ``popplay train knights`` defaults)."""

    name: str
    agents: int
    games_per_agent: int
    agent_turns: int  # compute budget per run: learning plies + ranking plies
    eval_every: int  # episodes between evaluations (the curves' points)
    eval_games: int  # games per agent and opponent at each point
    final_games: int  # games per agent and opponent against the final population
    replication: Replication = GENTLE


SCALES: dict[str, KnightsScale] = {
    # For the tests: seconds. Replication every 2 episodes so that it happens several times.
    "tiny": KnightsScale("tiny", agents=8, games_per_agent=8, agent_turns=80_000, eval_every=2, eval_games=10,
                         final_games=20, replication=Replication(every=2)),
    # Bell's population; about a minute per run on two quiet cores (numba: 1.4-2.8 M turns/s;
    # much slower while other processes compete). In docs/tournaments.md the gentle setting
    # was ahead of none by 0.37 in mean quality at about this compute (the second minute).
    "small": KnightsScale("small", agents=64, games_per_agent=64, agent_turns=120_000_000, eval_every=20,
                          eval_games=50, final_games=200),
    # About the compute of docs/tournaments.md's 600 s runs (570 M learning turns without
    # replication); final evaluation as there, 1000 games per agent.
    "paper": KnightsScale("paper", agents=64, games_per_agent=64, agent_turns=600_000_000, eval_every=20,
                          eval_games=100, final_games=1000),
}

RUNS = ("none", "replication")
LABELS = {"none": "without replication", "replication": "with selective replication and variation"}


def scale_for(ctx: Context) -> KnightsScale:
    return SCALES[ctx.scale]


def params_for(scale: KnightsScale, run: str, seed: int, episodes: int = 10**9) -> Any:
    """The run's :class:`KnightsParams` (``episodes``: effectively unbounded; the
    compute budget stops it)."""

    rep = scale.replication
    replicate = {} if run == "none" else {
        "replicate_every": rep.every, "replicate_fraction": rep.fraction, "mutate_weights": rep.mutate_weights,
        "mutate_params": rep.mutate_params, "tournament_games": rep.tournament_games}
    return KnightsParams(agents=scale.agents, games_per_agent=scale.games_per_agent, episodes=episodes,
                         eval_every=scale.eval_every, eval_games=scale.eval_games,
                         eval_opponents=",".join(OPPONENTS), snapshot_every=0, seed=seed, **replicate)


def command_for(scale: KnightsScale, run: str, seed: int, episodes: int) -> str:
    """The ``popplay train knights`` command that learns exactly this run."""
    text = (f"popplay train knights --agents {scale.agents} --games-per-agent {scale.games_per_agent} "
            f"--episodes {episodes} --eval-every {scale.eval_every} --eval-games {scale.eval_games} "
            f"--eval-opponents {','.join(OPPONENTS)} --seed {seed}")
    return text if run == "none" else f"{text} {scale.replication.options()}"


# ---------------------------------------------------------------------------
# The two runs (computed once per session)


@dataclass
class RunCurves:
    """One run: its curves at every evaluation point and its final population's quality."""

    arrays: dict[str, np.ndarray]  # per evaluation point
    final: dict[str, np.ndarray]  # per agent: quality_<opponent> over final_games
    episodes: int
    learning_turns: int
    ranking_turns: int
    learning_seconds: float
    copies: int  # agents copied by selection over the whole run
    command: str


def founder_count(lineage: Any, ids: np.ndarray) -> int:
    """How many founders (initial or reset agents) the agents ``ids`` descend from."""

    records = lineage.records
    births = np.isin(records["event"], BIRTH_EVENTS) & (records["agent"] >= 0)
    parent = np.full(max(lineage.next_id, 1), -1, dtype=np.int64)
    parent[records["agent"][births]] = records["parent"][births]
    current = np.asarray(ids, dtype=np.int64).copy()
    while True:
        up = parent[current]
        moving = up >= 0
        if not moving.any():
            return int(len(np.unique(current)))
        current[moving] = up[moving]


def learn(ctx: Context, scale: KnightsScale, run: str) -> RunCurves:
    """Train one population until it has used ``scale.agent_turns`` of compute, stopping
    at an evaluation point; record every evaluation point."""

    def make() -> RunCurves:
        from popplay.games.knights.experiment import KnightsExperiment  # defers numba

        experiment = KnightsExperiment(params_for(scale, run, ctx.seed), ctx.backend)
        names = [f"{o}_{s}" for o in OPPONENTS for s in ("best", "mean", "worst")]
        rows: dict[str, list[float]] = {k: [] for k in ("episode", "agent_turns", "learning_turns",
                                                          "ranking_turns", "seconds", "founders", "copies",
                                                          *names)}
        done = {"stop": False, "reported": 0}

        def after_phase(state: Any, curve: Any, seconds: float) -> None:
            if int(state.eval_episode[0]) != state.episode:
                return  # between evaluations the runner repeats the last one
            ranking = experiment.ranking_turns
            compute = state.turns + ranking
            rows["episode"].append(state.episode)
            rows["agent_turns"].append(compute)
            rows["learning_turns"].append(state.turns)
            rows["ranking_turns"].append(ranking)
            rows["seconds"].append(seconds)
            rows["founders"].append(founder_count(state.lineage, state.agent_id))
            rows["copies"].append(int(np.count_nonzero(state.lineage.column("event") == EVENTS["copy"])))
            for name in names:
                rows[name].append(curve.metrics[name][-1])
            # Stop at the first evaluation point at which the budget is spent.
            done["stop"] = compute >= scale.agent_turns and state.episode % scale.eval_every == 0
            tenth = min(10, 10 * compute // scale.agent_turns)
            if tenth > done["reported"] or done["stop"]:
                done["reported"] = tenth
                ctx.note(f"knights: {LABELS[run]}: {_turns(compute)} of {_turns(scale.agent_turns)} "
                         f"agent-turns, episode {state.episode}, against {OPPONENT} best/mean/worst "
                         f"{rows[f'{OPPONENT}_best'][-1]:.2f}/{rows[f'{OPPONENT}_mean'][-1]:.2f}/"
                         f"{rows[f'{OPPONENT}_worst'][-1]:.2f} ({seconds:.1f}s of learning)")

        result = run_experiment(experiment, should_stop=lambda: done["stop"], after_phase=after_phase)
        state = result.state
        final = {f"quality_{name}": q.score for name, q in
                 experiment.evaluate(state, scale.final_games, OPPONENTS).items()}
        integer = ("episode", "agent_turns", "learning_turns", "ranking_turns", "founders", "copies")
        arrays = {k: np.asarray(v, dtype=np.int64 if k in integer else np.float64) for k, v in rows.items()}
        return RunCurves(arrays, final, state.episode, state.turns, experiment.ranking_turns,
                         result.learning_seconds, int(arrays["copies"][-1]),
                         command_for(scale, run, ctx.seed, state.episode))

    return ctx.memo(f"knights/{scale.name}/{ctx.seed}/{ctx.backend.name}/{ctx.backend.device}/{run}", make)


# ---------------------------------------------------------------------------
# The figure


def compute_replication(ctx: Context) -> FigureData:
    scale = scale_for(ctx)
    rep = scale.replication

    defaults = KnightsParams()
    data = FigureData(
        "knights_replication", "knights", scale.name,
        "Population quality against greedy with and without selective replication",
        attrs={"agents": scale.agents, "games_per_agent": scale.games_per_agent,
               "agent_turns_budget": scale.agent_turns, "eval_every": scale.eval_every,
               "eval_games": scale.eval_games, "final_games": scale.final_games, "opponent": OPPONENT,
               "replicate_every": rep.every, "replicate_fraction": rep.fraction,
               "mutate_weights": rep.mutate_weights, "mutate_params": rep.mutate_params,
               "tournament_games": rep.tournament_games, "hidden": defaults.hidden, "alpha": defaults.alpha,
               "lam": defaults.lam, "epsilon": defaults.epsilon, "max_turns": defaults.max_turns,
               "board": f"{defaults.rows}x{defaults.cols}, {defaults.pieces} knights a side",
               "seed": ctx.seed, "backend": ctx.backend.name, "device": ctx.backend.device,
               "compute": "agent-turns: plies of the learning games plus plies of the ranking round robins"})
    final: dict[str, np.ndarray] = {}
    for run in RUNS:
        curves = learn(ctx, scale, run)
        q = curves.final[f"quality_{OPPONENT}"]
        data.groups[run] = Group(arrays=curves.arrays, attrs={
            "label": LABELS[run], "replication": run != "none", "episodes": curves.episodes,
            "agent_turns": curves.learning_turns + curves.ranking_turns, "learning_turns": curves.learning_turns,
            "ranking_turns": curves.ranking_turns, "learning_seconds": curves.learning_seconds,
            "copies": curves.copies, "founders": int(curves.arrays["founders"][-1]), "command": curves.command,
            "final_best": float(q.max()), "final_mean": float(q.mean()), "final_worst": float(q.min())})
        for name, values in curves.final.items():
            final[f"{run}_{name}"] = values
    data.groups["final"] = Group(arrays=final, attrs={
        "label": f"every agent of the final populations, {scale.final_games} games against each bot"})
    return data


def draw_replication(data: FigureData, fig: Any) -> None:
    fig.set_size_inches(14.0, 5.0)
    a = data.attrs
    runs = [name for name in RUNS if name in data.groups]
    colours = {"none": "tab:blue", "replication": "tab:red"}
    axes = [fig.add_subplot(1, 3, i + 1) for i in range(3)]
    axes[1].sharey(axes[0])
    for ax, run in zip(axes, runs):
        group = data.groups[run]
        x = group.arrays["agent_turns"] / 1e6
        colour = colours[run]
        best, mean, worst = (group.arrays[f"{OPPONENT}_{s}"] for s in ("best", "mean", "worst"))
        ax.fill_between(x, worst, best, color=colour, alpha=0.15, linewidth=0)
        ax.plot(x, best, color=colour, linewidth=1.0, linestyle="--", label="best agent")
        ax.plot(x, mean, color=colour, linewidth=2.0, label="mean")
        ax.plot(x, worst, color=colour, linewidth=1.0, linestyle=":", label="worst agent")
        other = [o for o in runs if o != run]
        for o in other:
            og = data.groups[o]
            ax.plot(og.arrays["agent_turns"] / 1e6, og.arrays[f"{OPPONENT}_mean"], color=colours[o],
                    linewidth=1.0, alpha=0.6, label=f"mean {LABELS[o]}")
        ax.plot(x, group.arrays["random_mean"], color="0.45", linewidth=0.9, linestyle="-.",
                label="mean against random")
        attrs = group.attrs
        what = LABELS[run].capitalize()
        if run == "replication":
            what += (f"\nevery {a['replicate_every']} episodes: best {100 * a['replicate_fraction']:g}% "
                     f"over worst, weight noise {a['mutate_weights']}")
        ax.set_title(f"{what}\n{int(attrs['episodes']):,} episodes, {float(attrs['learning_seconds']):.0f} s "
                     f"of learning; founders left: {int(attrs['founders'])}", fontsize=9)
        ax.set_xlabel("compute (million agent-turns)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel(f"quality against {OPPONENT} ((wins + draws/2) / games)")
    # The final populations, every agent, on more games.
    ax = axes[2]
    final = data.groups["final"].arrays
    for run in runs:
        q = np.sort(final[f"{run}_quality_{OPPONENT}"])[::-1]
        ax.plot(np.arange(1, len(q) + 1), q, color=colours[run], marker="o", markersize=3, linewidth=1.0,
                label=f"{LABELS[run]}: mean {q.mean():.3f}")
        ax.axhline(q.mean(), color=colours[run], linewidth=0.8, alpha=0.6)
    ax.set_xlabel("agent (ranked)")
    ax.set_ylabel(f"quality against {OPPONENT}")
    ax.set_title(f"Final populations, {int(a['final_games'])} games per agent", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(
        f"Knights (Bell §3.4): {int(a['agents'])} agents, best / mean / worst quality against {OPPONENT}, "
        f"{a['eval_games']} games per agent every {a['eval_every']} episodes; equal compute "
        f"{int(a['agent_turns_budget']) / 1e6:g}M agent-turns per run\n(scale {data.scale}, seed {a['seed']}, "
        f"{a['backend']} on {a['device']}; the replication run's turns include its ranking round robins)",
        fontsize=10)


def summary_replication(data: FigureData) -> dict[str, Any]:
    out: dict[str, Any] = {"agent_turns_budget": int(data.attrs["agent_turns_budget"]),
                           "final_games": int(data.attrs["final_games"])}
    for run in RUNS:
        attrs = data.groups[run].attrs
        out[run] = {f"{OPPONENT}_{s}": _round(attrs[f"final_{s}"]) for s in ("mean", "best", "worst")}
        out[run].update(episodes=int(attrs["episodes"]), agent_turns=int(attrs["agent_turns"]),
                        learning_seconds=_round(attrs["learning_seconds"], 1), copies=int(attrs["copies"]),
                        founders=int(attrs["founders"]))
    return out


def _turns(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def _round(value: Any, digits: int = 4) -> float:
    return round_finite(value, digits)


KNIGHTS_REPLICATION = register(Figure(
    "knights_replication", "knights", "Knights: population quality with and without selective replication",
    "best, mean and worst quality of a population (64 agents at the small and paper scales) against greedy "
    "over training, with and without selective replication with variation, at equal compute (agent-turns).",
    compute_replication, draw_replication, summary_replication))
