"""Does knights self-play keep improving? Ladder Elo against learning time (issue 28's study).

Bell closes §3 claiming that selective replication with variation lets a population
"continue to improve over time". ``knights_ladder`` measures that on a scale that does
not saturate: the ladder of fixed players (random, greedy, material search at depths
1-4; :mod:`popplay.tournaments.ladder`, random = 0). Four settings, each ``popplay train
knights --eval-opponents ladder`` with the same learning time per run:

* **a** Bell's: self-play within the population, no replication;
* **b** a + selective replication with variation (every 20 episodes an eighth replaced,
  weight noise 0.01: the setting docs/results.md measured);
* **c** b + a league of the last 4 snapshots (every 50 episodes, drawn by PFSP for half
  the games), significance-based replacement and adaptive tournament pairing;
* **d** c + stronger agents: 32 hidden units instead of 4, and copies that may switch
  their move chooser to two plies (``--mutate-lookahead 0.25``: selection decides).

Each curve point is the population's best, mean and worst ladder Elo at an evaluation.
Reported per run: the slope of the mean over the last third of the run (least squares,
Elo per minute, with its 95 % interval: a population that keeps improving has one above
zero), the final ladder Elo, and the best agent's score against the two-ply search over
``final_games`` games with its Wilson interval (the issue's goal: 0.5); then that agent
alone over ``confirm_games`` held-out games (another seed), a score its choice did not
bias upwards.

Learning time is wall time, so curves differ a little from run to run and machine to
machine (the ``command`` attribute of each run says how to learn it again). Scales:
``tiny`` (8 agents, 30 episodes, seconds; replication and snapshots more often, so that
they happen), ``small`` (64 agents, 2 minutes per run, one seed: about 12 minutes),
``paper`` (the issue's study: 64 agents, 30 minutes per run, 3 seeds: about 6.5 hours).
``benchmarks/knights_ladder.py`` runs the same settings two at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from popplay import stats
from popplay.games.knights.rules import KnightsParams
from popplay.reproduce.data import FigureData, Group, round_finite
from popplay.reproduce.registry import Context, Figure, register
from popplay.training.loop import run as run_experiment

REPLICATION = {"replicate_every": 20, "replicate_fraction": 0.125, "mutate_weights": 0.01}
LEAGUE = {"league": 4, "snapshot_every": 50, "league_sampling": "pfsp", "league_fraction": 0.5,
          "replicate_when": "significant", "tournament_pairing": "adaptive", "tournament_games": 4}
#: The settings' parameters beyond ``popplay train knights``' defaults.
SETTINGS: dict[str, dict[str, Any]] = {
    "a": {},
    "b": REPLICATION,
    "c": {**REPLICATION, **LEAGUE},
    "d": {**REPLICATION, **LEAGUE, "hidden": 32, "mutate_lookahead": 0.25},
}
LABELS = {"a": "a: Bell's self-play", "b": "b: + replication with variation",
          "c": "c: + league (PFSP), significant replacement, adaptive pairing", "d": "d: c + 32 hidden units, depth by selection"}
OPPONENT = "search"  # the two-ply material search: the goal's opponent
GOAL = 0.5
# The best of the final agents on ``final_games`` games is chosen partly by its luck on
# them (its score there is biased upwards); it then plays ``confirm_games`` games alone on
# this seed offset, which it was not chosen on (benchmarks/knights_ladder.py uses the same).
CONFIRM_SEED_OFFSET = 1_000


def options(setting: str, scale: "LadderScale | None" = None) -> list[str]:
    """The ``popplay train knights`` options of ``setting`` (at ``scale``, with its schedule)."""
    chosen = SETTINGS[setting] if scale is None else chosen_settings(scale, setting)
    return [text for name, value in chosen.items() for text in (f"--{name.replace('_', '-')}", str(value))]


@dataclass(frozen=True)
class LadderScale:
    """Sizes of one scale of the study."""

    name: str
    agents: int
    seeds: int
    seconds: float | None  # learning time per run (None: the episode budget alone)
    episodes: int
    eval_every: int
    eval_games: int  # games per agent and rung at each evaluation
    final_games: int  # games of every final agent against the two-ply search
    confirm_games: int  # held-out games of the agent chosen as best there (another seed)
    overrides: dict[str, int] = field(default_factory=dict)  # schedule changes, for the settings that have them
    # episodes between evaluations where a setting differs: d's two-ply agents play ~35x
    # fewer episodes per minute than c's, and its slope over the last third needs points there
    setting_eval_every: dict[str, int] = field(default_factory=dict)
    # also evaluate after this much learning time since the last (0: by episodes only),
    # so that a slope over the last third has points where episodes grow slow
    eval_seconds: float = 0.0


SCALES: dict[str, LadderScale] = {
    "tiny": LadderScale("tiny", agents=8, seeds=1, seconds=None, episodes=30, eval_every=10, eval_games=4,
                        final_games=20, confirm_games=40, overrides={"replicate_every": 5, "snapshot_every": 10}),
    "small": LadderScale("small", agents=64, seeds=1, seconds=120.0, episodes=20_000, eval_every=100, eval_games=20,
                         final_games=200, confirm_games=1000, setting_eval_every={"d": 5}, eval_seconds=10.0),
    "paper": LadderScale("paper", agents=64, seeds=3, seconds=1800.0, episodes=20_000, eval_every=100,
                         eval_games=20, final_games=1000, confirm_games=4000,
                         setting_eval_every={"d": 20}, eval_seconds=90.0),
}


def chosen_settings(scale: LadderScale, setting: str) -> dict[str, Any]:
    """``setting``'s parameters with ``scale``'s schedule changes (for those it has)."""
    chosen = dict(SETTINGS[setting])
    chosen.update({k: v for k, v in scale.overrides.items() if k in chosen})
    return chosen


def params_for(scale: LadderScale, setting: str, seed: int) -> KnightsParams:
    return KnightsParams(agents=scale.agents, episodes=scale.episodes, eval_opponents="ladder",
                         eval_every=scale.setting_eval_every.get(setting, scale.eval_every),
                         eval_games=scale.eval_games, eval_every_seconds=scale.eval_seconds, seed=seed,
                         **chosen_settings(scale, setting))


def command_for(scale: LadderScale, setting: str, seed: int) -> str:
    p = params_for(scale, setting, seed)
    extra = " ".join(options(setting, scale))
    budget = f" --time-budget {scale.seconds:g}" if scale.seconds is not None else ""
    by_time = f" --eval-every-seconds {p.eval_every_seconds:g}" if p.eval_every_seconds else ""
    return (f"popplay train knights --agents {p.agents} --episodes {p.episodes}{budget} --eval-opponents ladder "
            f"--eval-every {p.eval_every}{by_time} --eval-games {p.eval_games} --seed {seed} {extra}").rstrip()


def slope(seconds: np.ndarray, values: np.ndarray) -> dict[str, Any]:
    """Least-squares slope (Elo per minute) of ``values`` over the last third of the
    run, with its 95 % interval (±1.96 standard errors); None with fewer than 3 points."""
    seconds, values = np.asarray(seconds, dtype=np.float64), np.asarray(values, dtype=np.float64)
    keep = seconds >= seconds.max() * 2 / 3 if seconds.size else np.zeros(0, dtype=bool)
    t, y = seconds[keep] / 60.0, values[keep]
    if len(t) < 3 or np.ptp(t) == 0:
        return {"elo_per_minute": None, "ci95": None, "points": int(len(t))}
    design = np.stack([t, np.ones_like(t)], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    error = float(np.sqrt(residual @ residual / (len(t) - 2) / ((t - t.mean()) ** 2).sum()))
    return {"elo_per_minute": float(coef[0]), "ci95": [float(coef[0] - stats.Z95 * error),
                                                       float(coef[0] + stats.Z95 * error)], "points": int(len(t))}


def learn(ctx: Context, scale: LadderScale, setting: str, seed: int) -> Group:
    """One run: its ladder curve, and its final agents against the two-ply search."""

    def make() -> Group:
        from popplay.games.knights import opponents as bots  # defers numba
        from popplay.games.knights.experiment import KnightsExperiment  # defers numba

        experiment = KnightsExperiment(params_for(scale, setting, seed), ctx.backend)
        rows: dict[str, list[float]] = {k: [] for k in ("episode", "seconds", "elo_best", "elo_mean", "elo_worst")}

        def after_phase(state: Any, curve: Any, seconds: float) -> None:
            if int(state.eval_episode[0]) != state.episode:
                return  # between evaluations the runner repeats the last one
            rows["episode"].append(state.episode)
            rows["seconds"].append(seconds)
            for stat in ("best", "mean", "worst"):
                rows[f"elo_{stat}"].append(curve.metrics[f"ladder_elo_{stat}"][-1])

        ctx.note(f"knights_ladder: setting {setting}, seed {seed}: learning"
                 + (f" for {scale.seconds:g} s" if scale.seconds is not None else f" {scale.episodes} episodes"))
        result = run_experiment(experiment, time_budget=scale.seconds, after_phase=after_phase)
        versus = experiment.evaluate(result.state, scale.final_games, (OPPONENT,))[OPPONENT]
        best = int(np.argmax(versus.score))
        games = float(versus.wins[best] + versus.draws[best] + versus.losses[best])
        low, high = stats.wilson_score_interval(versus.wins[best], versus.draws[best], versus.losses[best])
        held = bots.quality(result.state.networks.take([best]), OPPONENT, scale.confirm_games,
                            params=experiment.params, seed=seed + CONFIRM_SEED_OFFSET)
        held_games = float(held.wins[0] + held.draws[0] + held.losses[0])
        held_low, held_high = stats.wilson_score_interval(held.wins[0], held.draws[0], held.losses[0])
        held_score_low, held_score_high = stats.score_interval(held.wins[0], held.draws[0], held.losses[0])
        arrays = {k: np.asarray(v, dtype=np.int64 if k == "episode" else np.float64) for k, v in rows.items()}
        trend = slope(arrays["seconds"], arrays["elo_mean"])
        ctx.note(f"knights_ladder: setting {setting}, seed {seed}: final ladder Elo mean "
                 f"{arrays['elo_mean'][-1]:.0f}, best {arrays['elo_best'][-1]:.0f}; best agent against "
                 f"{OPPONENT} {versus.score[best]:.3f} [{float(low):.3f}, {float(high):.3f}], on held-out games "
                 f"{held.score[0]:.3f} [{float(held_low):.3f}, {float(held_high):.3f}]")
        return Group(arrays=arrays, attrs={
            "setting": setting, "seed": seed, "label": LABELS[setting], "episodes": result.state.episode,
            "learning_seconds": result.learning_seconds, "command": command_for(scale, setting, seed),
            "slope_elo_per_minute": trend["elo_per_minute"] if trend["elo_per_minute"] is not None else np.nan,
            "slope_ci95_low": trend["ci95"][0] if trend["ci95"] else np.nan,
            "slope_ci95_high": trend["ci95"][1] if trend["ci95"] else np.nan,
            "versus_search_best": float(versus.score[best]), "versus_search_best_agent": best,
            "versus_search_ci95_low": float(low), "versus_search_ci95_high": float(high),
            "versus_search_games": int(games), "versus_search_mean": float(np.mean(versus.score)),
            "confirmed_best": float(held.score[0]), "confirmed_ci95_low": float(held_low),
            "confirmed_ci95_high": float(held_high), "confirmed_games": int(held_games),
            "confirmed_score_ci95_low": float(held_score_low), "confirmed_score_ci95_high": float(held_score_high)})

    key = f"knights_ladder/{scale.name}/{seed}/{setting}/{ctx.backend.name}/{ctx.backend.device}"
    return ctx.memo(key, make)


def compute(ctx: Context) -> FigureData:
    scale = SCALES[ctx.scale]
    data = FigureData("knights_ladder", "ladder", scale.name,
                      "Knights populations on the ladder: Elo against learning time, four settings",
                      attrs={"agents": scale.agents, "seeds": scale.seeds, "first_seed": ctx.seed,
                             "seconds": scale.seconds if scale.seconds is not None else np.nan,
                             "episodes": scale.episodes, "eval_every": scale.eval_every,
                             "eval_games": scale.eval_games, "final_games": scale.final_games,
                             "confirm_games": scale.confirm_games,
                             "opponent": OPPONENT, "goal": GOAL, "backend": ctx.backend.name,
                             "device": ctx.backend.device})
    for setting in SETTINGS:
        for seed in range(ctx.seed, ctx.seed + scale.seeds):
            data.groups[f"{setting}-{seed}"] = learn(ctx, scale, setting, seed)
    return data


COLOURS = {"a": "tab:grey", "b": "tab:blue", "c": "tab:orange", "d": "tab:green"}


def draw(data: FigureData, fig: Any) -> None:
    fig.set_size_inches(13.0, 5.0)
    a = data.attrs
    curves, final = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    labelled: set[str] = set()
    for group in data.groups.values():
        setting = str(group.attrs["setting"])
        minutes = group.arrays["seconds"] / 60.0
        colour = COLOURS.get(setting, "black")
        curves.fill_between(minutes, group.arrays["elo_worst"], group.arrays["elo_best"], color=colour, alpha=0.12,
                            linewidth=0)
        curves.plot(minutes, group.arrays["elo_mean"], color=colour, linewidth=1.8,
                    label=str(group.attrs["label"]) if setting not in labelled else None)
        labelled.add(setting)
    curves.set_xlabel("learning time (minutes)")
    curves.set_ylabel("ladder Elo (random = 0): mean line, best-worst band")
    curves.grid(True, alpha=0.3)
    curves.legend(fontsize=7, loc="lower right")
    names = list(data.groups)
    x = np.arange(len(names))
    score = np.array([float(data.groups[n].attrs["versus_search_best"]) for n in names])
    low = np.array([float(data.groups[n].attrs["versus_search_ci95_low"]) for n in names])
    high = np.array([float(data.groups[n].attrs["versus_search_ci95_high"]) for n in names])
    final.bar(x, score, color=[COLOURS.get(str(data.groups[n].attrs["setting"]), "black") for n in names])
    final.errorbar(x, score, yerr=[score - low, high - score], fmt="none", ecolor="black", capsize=3)
    held = np.array([float(data.groups[n].attrs.get("confirmed_best", np.nan)) for n in names])
    if np.isfinite(held).any():  # the same agent on held-out games: no selection in it
        def bound(n: str, side: str) -> float:  # draw-aware where the group has it (most games are drawn)
            g = data.groups[n].attrs
            return float(g.get(f"confirmed_score_ci95_{side}", g.get(f"confirmed_ci95_{side}", np.nan)))

        held_low = np.array([bound(n, "low") for n in names])
        held_high = np.array([bound(n, "high") for n in names])
        final.errorbar(x + 0.25, held, yerr=[held - held_low, held_high - held], fmt="D", color="black",
                       markersize=4, capsize=2, label="that agent on held-out games")
    final.axhline(float(a["goal"]), color="tab:red", linestyle="--", linewidth=1.0, label=f"goal {a['goal']}")
    final.set_xticks(x, names, fontsize=8)
    final.set_ylim(0.0, 1.0)
    final.set_ylabel(f"best agent against the two-ply {a['opponent']} (95 % Wilson interval)")
    final.set_xlabel("setting-seed")
    final.grid(True, axis="y", alpha=0.3)
    final.legend(fontsize=8)
    budget = f"{float(a['seconds']):g} s of learning" if np.isfinite(float(a["seconds"])) else \
        f"{int(a['episodes'])} episodes"
    fig.suptitle(f"Knights on the ladder: {int(a['agents'])} agents, {budget} per run, {int(a['seeds'])} seed(s) "
                 f"from {a['first_seed']}; final {int(a['final_games'])} games against search (scale {data.scale}, "
                 f"{a['backend']} on {a['device']})", fontsize=10)


def _number(value: Any, digits: int) -> float | None:
    """A summary number; None where there is none (a slope from fewer than 3 points):
    JSON has no NaN."""
    value = round_finite(value, digits)
    return value if np.isfinite(value) else None


def summary(data: FigureData) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, group in data.groups.items():
        g = group.attrs
        out[name] = {"episodes": int(g["episodes"]), "learning_seconds": _number(g["learning_seconds"], 1),
                     "elo_mean_final": _number(group.arrays["elo_mean"][-1], 1),
                     "elo_best_final": _number(group.arrays["elo_best"][-1], 1),
                     "slope_elo_per_minute": _number(g["slope_elo_per_minute"], 2),
                     "slope_ci95": [_number(g["slope_ci95_low"], 2), _number(g["slope_ci95_high"], 2)],
                     "versus_search_best": _number(g["versus_search_best"], 4),
                     "versus_search_ci95": [_number(g["versus_search_ci95_low"], 4),
                                            _number(g["versus_search_ci95_high"], 4)],
                     # figures computed before the held-out games (cached) have none
                     "confirmed_best": _number(g.get("confirmed_best", np.nan), 4),
                     "confirmed_ci95": [_number(g.get("confirmed_ci95_low", np.nan), 4),
                                        _number(g.get("confirmed_ci95_high", np.nan), 4)],
                     "confirmed_score_ci95": [_number(g.get("confirmed_score_ci95_low", np.nan), 4),
                                              _number(g.get("confirmed_score_ci95_high", np.nan), 4)]}
    return out


KNIGHTS_LADDER = register(Figure(
    "knights_ladder", "ladder", "Knights: does self-play keep improving? Ladder Elo against learning time",
    "four settings (Bell's self-play; + replication; + league, significant replacement, adaptive pairing; + 32 "
    "hidden units): the population's ladder Elo over learning time, its slope over the last third, and the best "
    "agent against the two-ply search (goal 0.5).", compute, draw, summary))
