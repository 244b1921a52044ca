"""Bell's bandit figures (report §1.4): Figures 2, 3 and 4.

100-armed bandits, ε = 0.1, a single agent against groups of 16 to 8192 agents
sharing with equations (1)–(4), quality averaged over the trials.

Figure 2: quality against agent-time steps per trial (a fixed budget of 131,072).

Figure 3: quality against learning time. Bell timed one trial alone (the single agent
on the CPU, each group on the GPU) and averaged quality over 1024 trials. popplay
runs the 1024 trials of a group as one batch, whose wall time says nothing about the
time one trial takes, so the two are measured apart, as Bell did:

* the learning time of a point is the time *one trial alone* takes to reach it
  (``trials = 1``, the same code path, learning and sharing included, measurement
  excluded), the fastest of ``repeats`` runs taken in rounds over the groups,
  because noise only ever adds time;
* the single agent's time to reach ``s`` steps is one uninterrupted run of ``s`` steps
  on one CPU thread (a lone agent never needs to stop, and cannot use a second
  thread), made non-decreasing across points; its time for the whole budget is the
  reference ``T``;
* a group's trial runs on the chosen backend with all its threads (numba) or the GPU;
* each group learns in time mode until it has used at least ``T`` (Bell: "at least
  as much time as the single agent"), stopping at a sharing point;
* quality at those points comes from the batch of all trials, run to the same number
  of steps; the timed trial is trial 0 of that batch (random streams are keyed by
  seed, trial and agent), so time and quality describe the same learning.

The batch's own wall time divided by the trials (the amortised time per trial) is
stored beside it as ``seconds_batch_per_trial``. The machinery (batches kept per
session, the timing loops, the drawing of curves and bars) is shared with the
cart-pole figures: :mod:`popplay.reproduce.timing`.

Figure 4: quality at the step budget and at ``T``, as bars.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from popplay.core.backend import Backend
from popplay.games.bandit.experiment import BanditExperiment
from popplay.games.bandit.rules import BanditParams
from popplay.reproduce import timing
from popplay.reproduce.data import FigureData, Group
from popplay.reproduce.registry import Context, Figure, register
from popplay.reproduce.timing import CurveData, GroupScale, agents_label

REPORT_AGENT_STEPS = 131072
REPORT_SINGLE_AGENT_SECONDS = 0.0377  # 131,072 single-agent steps on Bell's CPU
PAPER_GROUPS = ((16, 128), (64, 64), (256, 16), (1024, 8), (8192, 4))  # (agents, share every)


@dataclass(frozen=True)
class BanditScale(GroupScale):
    """Sizes of one reproduction scale."""

    arms: int = 100
    epsilon: float = 0.1


SCALES: dict[str, BanditScale] = {
    # For the tests: seconds, not minutes.
    "tiny": BanditScale("tiny", arms=10, agent_steps=4096, trials=32, groups=((16, 16), (64, 8), (256, 4)),
                        single_points=8, repeats=1),
    # The report's bandit and group sizes with fewer trials (quality noise ~±0.02).
    "small": BanditScale("small", arms=100, agent_steps=REPORT_AGENT_STEPS, trials=128, groups=PAPER_GROUPS,
                         single_points=32, repeats=5),
    "paper": BanditScale("paper", arms=100, agent_steps=REPORT_AGENT_STEPS, trials=1024, groups=PAPER_GROUPS,
                         single_points=32, repeats=20),
}


def scale_for(ctx: Context) -> BanditScale:
    scale = SCALES[ctx.scale]
    scale.validate()
    return scale


# ---------------------------------------------------------------------------
# Experiments shared by the figures (computed once per session; see timing.py)


def _params(scale: BanditScale, seed: int, agents: int, trials: int, steps_per_agent: int, share_every: int) -> Any:
    return BanditParams(arms=scale.arms, agents=agents, trials=trials, steps_per_agent=steps_per_agent,
                        share_every=share_every, epsilon=scale.epsilon, seed=seed)


def batch_curve(ctx: Context, scale: BanditScale, agents: int, share_every: int, steps_per_agent: int) -> CurveData:
    """Quality over all trials up to ``steps_per_agent`` steps per agent.

    A session keeps one batch per group and continues it (exactly, from its state)
    when a later figure needs more steps, so Figures 2 and 3 share their learning.
    """

    def make(steps: int) -> BanditExperiment:
        return BanditExperiment(_params(scale, ctx.seed, agents, scale.trials, steps, share_every), ctx.backend)

    def describe(result: Any) -> str:
        return (f"bandit: {agents_label(agents)} x {scale.trials} trials, {steps_per_agent * agents:,} agent-steps: "
                f"quality {result.curve.metrics['quality'][-1]:.3f} ({result.learning_seconds:.1f}s)")

    return timing.batch_curve(ctx, f"bandit/{scale.name}/{ctx.seed}/batch/{agents}/{share_every}", make,
                              steps_per_agent, agents, describe=describe)


def single_agent_timing(ctx: Context, scale: BanditScale) -> tuple[np.ndarray, np.ndarray]:
    """(agent-steps, seconds) of one trial of one agent, each point timed as its own
    uninterrupted run on the CPU (numba), the fastest of ``repeats``."""

    def measure() -> tuple[np.ndarray, np.ndarray]:
        cpu = Backend("numba", "cpu")  # Bell's single agent ran on the CPU
        steps = np.arange(1, scale.single_points + 1, dtype=np.int64) * scale.single_every
        seconds = timing.time_single_agent(
            lambda s: BanditExperiment(_params(scale, ctx.seed, 1, 1, s, s), cpu), steps, scale.repeats)
        ctx.note(f"bandit: one trial of 1 agent, {int(steps[-1]):,} steps: {1e3 * seconds[-1]:.2f} ms "
                 f"(fastest of {scale.repeats}; Bell: {1e3 * REPORT_SINGLE_AGENT_SECONDS:.1f} ms)")
        return steps, seconds

    return ctx.memo(f"bandit/{scale.name}/{ctx.seed}/single-timing", measure)


@dataclass
class TimeCurves:
    """Figure 3's curves and how they were timed."""

    reference: float  # T: the single agent's learning time for the whole budget
    curves: dict[int, tuple[CurveData, np.ndarray]]  # agents -> (timed curve, batch seconds per trial)
    other_cpu: float  # share of the machine's CPU time other processes used while timing (NaN: unknown)


def timings(ctx: Context, scale: BanditScale) -> tuple[float, dict[int, tuple[np.ndarray, np.ndarray]], float]:
    """Every group's per-trial timing: (T, agents -> (agent-steps, seconds), the share
    of the machine's CPU time that other processes used meanwhile)."""

    def measure() -> tuple[float, dict[int, tuple[np.ndarray, np.ndarray]], float]:
        ctx.note("bandit: timing one trial of each group alone (Figure 3's learning time)")
        watch = timing.OtherCpu()
        single = single_agent_timing(ctx, scale)
        reference = float(single[1][-1])
        timed = {1: single}
        makes = {agents: (lambda a=agents, e=every: BanditExperiment(_params(scale, ctx.seed, a, 1, e, e),
                                                                     ctx.backend))
                 for agents, every in scale.groups}
        timed_groups = timing.time_groups(makes, reference, scale.repeats)
        for agents, every in scale.groups:
            seconds = timed_groups[agents]
            steps = np.arange(1, len(seconds) + 1, dtype=np.int64) * every * agents
            timed[agents] = (steps, seconds)
            ctx.note(f"bandit: one trial of {agents_label(agents)} reaches {int(steps[-1]):,} agent-steps in "
                     f"{1e3 * seconds[-1]:.2f} ms (fastest of {scale.repeats})")
        other = watch.share()
        timing.warn_if_busy(ctx, other)
        return reference, timed, other

    return ctx.memo(f"bandit/{scale.name}/{ctx.seed}/timings", measure)


def time_curves(ctx: Context, scale: BanditScale) -> TimeCurves:
    """Per group: per-trial timing with the batch's quality at the same points (and
    the batch's seconds per trial); the single agent's reference time ``T``."""
    reference, timed, other = timings(ctx, scale)
    out: dict[int, tuple[CurveData, np.ndarray]] = {}
    for agents, every in scale.series():
        steps, seconds = timed[agents]
        batch = batch_curve(ctx, scale, agents, every, int(steps[-1]) // agents)
        if not np.array_equal(batch.agent_steps, steps):
            raise RuntimeError(f"bandit: timing and batch points differ for {agents} agents")  # a bug, not input
        out[agents] = (CurveData(steps, seconds, batch.quality), batch.seconds / scale.trials)
    return TimeCurves(reference, out, other)


def prepare_timings(ctx: Context) -> None:
    """Take the wall-clock measurements first, before the long batches load the machine."""
    timings(ctx, scale_for(ctx))


# ---------------------------------------------------------------------------
# Figures


def _common_attrs(ctx: Context, scale: BanditScale) -> dict[str, Any]:
    return {"arms": scale.arms, "agent_steps_budget": scale.agent_steps, "trials": scale.trials,
            "epsilon": scale.epsilon, "seed": ctx.seed, "backend": ctx.backend.name, "device": ctx.backend.device,
            "repeats": scale.repeats}


def compute_figure2(ctx: Context) -> FigureData:
    scale = scale_for(ctx)
    data = FigureData("figure2", "bandit", scale.name, "Learning quality by agent-time steps",
                      attrs=_common_attrs(ctx, scale))
    for agents, every in scale.series():
        curve = batch_curve(ctx, scale, agents, every, scale.agent_steps // agents)
        data.groups[f"agents_{agents}"] = Group(
            arrays={"agent_steps": curve.agent_steps, "quality": curve.quality, "seconds_batch": curve.seconds},
            attrs={"agents": agents, "share_every": every, "label": agents_label(agents)},
        )
    return data


def compute_figure3(ctx: Context) -> FigureData:
    scale = scale_for(ctx)
    timed = time_curves(ctx, scale)
    data = FigureData("figure3", "bandit", scale.name, "Learning quality as a function of learning time",
                      attrs={**_common_attrs(ctx, scale), **_timing_attrs(timed),
                             "timing": "one trial alone, fastest of repeats; quality averaged over the trials"})
    for agents, every in scale.series():
        curve, batch_per_trial = timed.curves[agents]
        data.groups[f"agents_{agents}"] = Group(
            arrays={"agent_steps": curve.agent_steps, "seconds": curve.seconds, "quality": curve.quality,
                    "seconds_batch_per_trial": batch_per_trial},
            attrs={"agents": agents, "share_every": every, "label": agents_label(agents)},
        )
    return data


def compute_figure4(ctx: Context) -> FigureData:
    scale = scale_for(ctx)
    timed = time_curves(ctx, scale)
    agents_list, at_steps, at_time, steps_at_time, seconds_at_time = [], [], [], [], []
    for agents, every in scale.series():
        fixed = batch_curve(ctx, scale, agents, every, scale.agent_steps // agents)
        curve, _ = timed.curves[agents]
        agents_list.append(agents)
        at_steps.append(fixed.quality[-1])
        at_time.append(curve.quality[-1])
        steps_at_time.append(curve.agent_steps[-1])
        seconds_at_time.append(curve.seconds[-1])
    at_steps_a, at_time_a = np.array(at_steps), np.array(at_time)
    data = FigureData("figure4", "bandit", scale.name,
                      "Summary: groups of agents compared to the single agent",
                      attrs={**_common_attrs(ctx, scale), **_timing_attrs(timed)})
    data.groups["bars"] = Group(arrays={
        "agents": np.array(agents_list, dtype=np.int64),
        "quality_at_steps": at_steps_a,
        "quality_at_time": at_time_a,
        "stderr_at_steps": _stderr(at_steps_a, scale.trials),
        "stderr_at_time": _stderr(at_time_a, scale.trials),
        "agent_steps_at_time": np.array(steps_at_time, dtype=np.int64),
        "seconds_at_time": np.array(seconds_at_time, dtype=np.float64),
    }, attrs={"label": "quality at the step budget and at the single agent's learning time"})
    return data


def _timing_attrs(timed: TimeCurves) -> dict[str, Any]:
    return timing.timing_attrs(timed.reference, REPORT_SINGLE_AGENT_SECONDS, timed.other_cpu)


def _band(data: FigureData) -> Any:
    """The standard-error band of a bandit curve, from its quality and the trials."""
    trials = int(data.attrs.get("trials", 0))
    return lambda group: _stderr(np.asarray(group.arrays["quality"]), trials) if trials > 0 else None


def _stderr(quality: np.ndarray, trials: int) -> np.ndarray:
    """Binomial standard error of a fraction of ``trials`` (ties make it a slight overestimate)."""
    return np.sqrt(np.clip(quality * (1.0 - quality), 0.0, None) / trials)


# ---------------------------------------------------------------------------
# Drawing (matplotlib is imported by the caller; ``fig`` is a matplotlib Figure)


def _subtitle(data: FigureData) -> str:
    a = data.attrs
    return (f"{a.get('arms')} arms, ε = {a.get('epsilon')}, quality over {a.get('trials')} trials "
            f"(scale {data.scale}, {a.get('backend')} on {a.get('device')})") + timing.timing_note(data)


def draw_figure2(data: FigureData, fig: Any) -> None:
    ax = fig.add_subplot(1, 1, 1)
    timing.plot_curves(ax, timing.series(data), "agent_steps", label=_share_label, errors=_band(data))
    ax.set_xlabel("agent-time steps per trial")
    ax.set_ylabel("learning quality (fraction of trials finding the best arm)")
    ax.set_xlim(0, float(data.attrs.get("agent_steps_budget", ax.get_xlim()[1])) * 1.02)
    ax.set_title(f"Figure 2: {data.title}\n{_subtitle(data)}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def draw_figure3(data: FigureData, fig: Any) -> None:
    ax = fig.add_subplot(1, 1, 1)
    reference = float(data.attrs["single_agent_seconds"])
    right = timing.plot_curves(ax, timing.series(data), "seconds", x_scale=1e3, errors=_band(data),
                               until=1e3 * reference)
    timing.reference_time_line(ax, reference, int(data.attrs["agent_steps_budget"]))
    ax.set_xlabel("learning time of one trial (ms)")
    ax.set_ylabel("learning quality (fraction of trials finding the best arm)")
    ax.set_xlim(0, max(1e3 * reference * 1.15, right * 1.03))
    ax.set_title(f"Figure 3: {data.title}\n{_subtitle(data)}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def draw_figure4(data: FigureData, fig: Any) -> None:
    bars = data.groups["bars"].arrays
    agents = bars["agents"]
    reference = float(data.attrs["single_agent_seconds"])
    ax = fig.add_subplot(1, 1, 1)
    budget = int(data.attrs["agent_steps_budget"])
    # Tick labels are the agent counts only (long notes under them collided at small
    # sizes); a group whose first share came well after T says when, inside its bar.
    labels = ["1 (single)" if a == 1 else str(int(a)) for a in agents]
    late = bars["seconds_at_time"] > 1.1 * reference
    timing.grouped_bars(ax, labels, [
        {"values": bars["quality_at_steps"], "errors": bars["stderr_at_steps"], "color": "tab:blue",
         "label": f"{budget:,} agent-time steps"},
        {"values": bars["quality_at_time"], "errors": bars["stderr_at_time"], "color": "tab:green",
         "label": f"single agent's learning time ({1e3 * reference:.2f} ms)"
                  + (", or the first share after it (in the bar)" if late.any() else "")},
    ], fmt=".3f", pad=0.004)
    ax.set_xlabel("agents per trial (bars: ± 1 standard error)")
    ax.set_ylabel("learning quality (fraction of trials finding the best arm)", fontsize=9)
    low = float(min(bars["quality_at_steps"].min(), bars["quality_at_time"].min()))
    bottom = max(0.0, math.floor((low - 0.1) * 10) / 10)
    for i in np.flatnonzero(late):
        ax.text(i + 0.19, bottom + 0.01 * (1.06 - bottom), f"first share {1e3 * bars['seconds_at_time'][i]:.1f} ms",
                rotation=90, ha="center", va="bottom", fontsize=7, color="white")
    ax.set_ylim(bottom, 1.06)  # room above 1 for the labels; no ticks there
    ax.set_yticks([t for t in np.linspace(bottom, 1.0, int(round((1.0 - bottom) / 0.05)) + 1)])
    ax.set_title(f"Figure 4: {data.title}\n{_subtitle(data)}", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def _share_label(group: Group) -> str:
    agents = int(group.attrs["agents"])
    return f"{group.attrs['label']}" + ("" if agents == 1 else f", share every {group.attrs['share_every']}")


def _final(data: FigureData) -> dict[str, Any]:
    return {str(group.attrs["agents"]): float(group.arrays["quality"][-1]) for _, group in timing.series(data)}


def summary_figure2(data: FigureData) -> dict[str, Any]:
    return {f"quality_at_{int(data.attrs['agent_steps_budget'])}_agent_steps": _final(data)}


def summary_figure3(data: FigureData) -> dict[str, Any]:
    return {"single_agent_seconds": float(data.attrs["single_agent_seconds"]),
            "quality_at_single_agent_time": _final(data),
            "agent_steps_at_single_agent_time": {str(g.attrs["agents"]): int(g.arrays["agent_steps"][-1])
                                                 for _, g in timing.series(data)}}


def summary_figure4(data: FigureData) -> dict[str, Any]:
    bars = data.groups["bars"].arrays
    keys = [str(int(a)) for a in bars["agents"]]
    return {"single_agent_seconds": float(data.attrs["single_agent_seconds"]),
            "quality_at_steps": dict(zip(keys, map(float, bars["quality_at_steps"]))),
            "quality_at_time": dict(zip(keys, map(float, bars["quality_at_time"])))}


FIGURE2 = register(Figure(
    "figure2", "bandit", "Learning quality by agent-time steps",
    "quality against agent-time steps per trial, a single agent against groups sharing their estimates.",
    compute_figure2, draw_figure2, summary_figure2))
FIGURE3 = register(Figure(
    "figure3", "bandit", "Learning quality as a function of learning time",
    "quality against the learning time of one trial; every group learns at least as long as the single agent.",
    compute_figure3, draw_figure3, summary_figure3, prepare_timings))
FIGURE4 = register(Figure(
    "figure4", "bandit", "Summary of groups against the single agent",
    "bars: quality at the agent-time step budget and at the single agent's learning time.",
    compute_figure4, draw_figure4, summary_figure4, prepare_timings))
