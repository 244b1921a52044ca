"""What the reproduced figures of every domain share: batches of trials kept per
session, Bell's per-trial learning-time measurement, and the drawing of curves and bars.

Bell measured *learning time* as the time one trial takes alone (the single agent on
the CPU, a group of agents on the GPU) and *quality* as an average over 1024 trials.
popplay runs the trials of a group as one batch, whose wall time says nothing about
the time one trial takes, so the two are measured apart:

* :func:`time_single_agent`: the single agent's time to reach each point is one
  uninterrupted run of that many steps (a lone agent never needs to stop) on one CPU
  thread (it cannot use a second one), the fastest of ``repeats`` (noise only ever
  adds time), made non-decreasing across points;
* :func:`time_groups`: one trial of each group learns in time mode on the chosen
  backend until it has used at least the reference time ``T`` (Bell: "at least as
  much time as the single agent"), stopping at a sharing point; per sharing point the
  fastest of ``repeats`` runs, taken in rounds over the groups (:func:`fastest_until`);
* :func:`batch_curve`: quality at those points comes from the batch of all trials,
  kept per session and continued exactly from its state when a figure needs more
  steps; random streams are keyed by seed, trial and agent, so the timed trial is
  trial 0 of the batch and time and quality describe the same learning;
* :class:`OtherCpu`: how busy the rest of the machine was while timing (timings are
  inflated on a loaded machine; the figures say so).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from popplay.reproduce.data import FigureData, Group
from popplay.reproduce.registry import Context
from popplay.training.loop import run

MakeExperiment = Callable[[int], Any]  # steps per agent -> a popplay.core.experiment.Experiment


@dataclass(frozen=True)
class GroupScale:
    """Sizes of one reproduction scale of a figure set comparing a single agent with
    sharing groups under one budget of agent-time steps per trial."""

    name: str
    agent_steps: int  # agent-time steps per trial (the figures' budget)
    trials: int
    groups: tuple[tuple[int, int], ...]  # (agents, steps per agent between shares)
    single_points: int  # measurement points on the single agent's curve
    repeats: int  # timing runs per curve; the fastest counts

    @property
    def single_every(self) -> int:
        return self.agent_steps // self.single_points

    def series(self) -> list[tuple[int, int]]:
        """(agents, share every) of every curve, the single agent first."""
        return [(1, self.single_every), *self.groups]

    def validate(self) -> None:
        # Sharing points must fall on the budget exactly, so that a batch continued
        # past the budget (the learning-time figures) has the same points as one
        # stopped on it.
        for agents, every in self.series():
            per_agent = self.agent_steps // agents
            if self.agent_steps % agents or per_agent % every:
                raise ValueError(f"scale {self.name}: {agents} agents sharing every {every} steps do not "
                                 f"divide {self.agent_steps} agent-steps evenly")


@dataclass
class CurveData:
    """One learning curve: agent-time steps per trial, seconds, quality, and any
    further per-point values (``extra``, e.g. a standard error)."""

    agent_steps: np.ndarray
    seconds: np.ndarray
    quality: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Batches of all trials, one per group and session


def batch_curve(ctx: Context, key: str, make: MakeExperiment, steps_per_agent: int, agents: int, *,
                run_to: int | None = None, keep_state: bool = True,
                describe: Callable[[Any], str] | None = None,
                per_point: Callable[[Any, Any], dict[str, float]] | None = None) -> CurveData:
    """The curve of the batch ``make(n)`` up to ``steps_per_agent`` steps per agent.

    A session keeps one batch per ``key``. ``make(n)`` builds the experiment with a
    budget of ``n`` steps per agent (everything else equal). When the batch has not
    got that far it learns (on from its state) to ``run_to`` (default: just
    ``steps_per_agent``) steps per agent, so the figures of one run share their
    learning. With ``keep_state`` false the state (all the agents' tables: gigabytes
    for the largest groups) is dropped after the run, for a caller that asked for
    every step it will need at once; should more be asked for after all, the batch
    learns again from the start (the same numbers: random streams are keyed by seed,
    trial and agent). ``describe(result)`` gives the progress note of a run;
    ``per_point(experiment, state)`` adds values to every point (``CurveData.extra``).
    """

    def fresh() -> dict[str, Any]:
        return {"state": None, "curve": None, "seconds": 0.0, "steps": 0, "extra": {}}

    record = ctx.memo(key, fresh)
    if record["steps"] < steps_per_agent:
        if record["steps"] and record["state"] is None:  # dropped: learn again from the start
            record.update(fresh())
        target = max(steps_per_agent, run_to or 0)
        experiment = make(target)
        extra: dict[str, list[float]] = record["extra"]

        def after_phase(state: Any, curve: Any, seconds: float) -> None:
            for name, value in per_point(experiment, state).items():
                extra.setdefault(name, []).append(float(value))

        result = run(experiment, state=record["state"], curve=record["curve"], learning_seconds=record["seconds"],
                     after_phase=after_phase if per_point is not None else None)
        record.update(state=result.state if keep_state else None, curve=result.curve,
                      seconds=result.learning_seconds, steps=target)
        if describe is not None:
            ctx.note(describe(result))
    curve = record["curve"]
    steps = np.asarray(curve.agent_steps, dtype=np.int64)
    keep = steps <= steps_per_agent * agents
    return CurveData(steps[keep], np.asarray(curve.seconds, dtype=np.float64)[keep],
                     np.asarray(curve.metrics["quality"], dtype=np.float64)[keep],
                     {name: np.asarray(values, dtype=np.float64)[keep] for name, values in record["extra"].items()})


# ---------------------------------------------------------------------------
# Learning time of one trial


def time_single_agent(make: MakeExperiment, steps: Sequence[int], repeats: int) -> np.ndarray:
    """Seconds of one trial of one agent to reach each of ``steps`` (steps per agent),
    each point its own uninterrupted run of ``make(s)``, on one numba thread, the
    fastest of ``repeats``, made non-decreasing. ``make(s)`` must build a one-trial,
    one-agent experiment on the CPU that learns ``s`` steps in one phase."""
    import numba  # defers numba


    best = np.full(len(steps), np.inf)
    threads = numba.get_num_threads()
    # A lone agent is sequential work: one thread. Letting numba wake a second
    # thread it cannot use only adds a barrier (milliseconds when cores are busy).
    numba.set_num_threads(1)
    try:
        for _ in range(repeats):
            for i, s in enumerate(steps):
                best[i] = min(best[i], run(make(int(s))).learning_seconds)
    finally:
        numba.set_num_threads(threads)
    # Separate runs may disagree by noise; a longer run never takes less time.
    return np.maximum.accumulate(best)


def time_groups(makes: dict[Hashable, Callable[[], Any]], budget: float, repeats: int) -> dict[Hashable, np.ndarray]:
    """Per group, the seconds at each sharing point of one trial learning (time mode)
    until it has used at least ``budget`` seconds: the fastest of ``repeats`` runs per
    point (:func:`fastest_until`). ``makes[key]()`` builds the one-trial experiment.

    Rounds over the groups rather than a group's repeats back to back, so that a
    passing disturbance slows one repeat of several groups, not all of one group's."""

    runs: dict[Hashable, list[np.ndarray]] = {key: [] for key in makes}
    for _ in range(repeats):
        for key, make in makes.items():
            runs[key].append(np.asarray(run(make(), time_budget=budget).curve.seconds, dtype=np.float64))
    return {key: fastest_until(found, budget) for key, found in runs.items()}


def fastest_until(runs: list[np.ndarray], budget: float) -> np.ndarray:
    """Per sharing point the fastest of the runs that reached it, cut at the first
    point whose time reaches ``budget`` (the last point of the longest run always
    does: time mode stops a run only once it has reached the budget)."""
    length = max(len(r) for r in runs)
    best = np.array([min(r[i] for r in runs if len(r) > i) for i in range(length)])
    end = int(np.argmax(best >= budget)) + 1
    return best[:end]


class OtherCpu:
    """How much CPU other processes take from a measurement: the share of the
    machine's CPU time, from the start until :meth:`share`, not spent by this
    process (Linux /proc/stat; NaN elsewhere)."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                values = [int(v) for v in f.readline().split()[1:9]]
            hz = float(os.sysconf("SC_CLK_TCK"))
        except (OSError, ValueError, AttributeError):
            return None
        total, idle = sum(values), values[3] + values[4]
        return total / hz, (total - idle) / hz, time.process_time()

    def share(self) -> float:
        end = self._sample()
        if self._start is None or end is None or end[0] <= self._start[0]:
            return float("nan")
        total, busy, own = (b - a for a, b in zip(self._start, end))
        return min(1.0, max(0.0, (busy - own) / total))


def warn_if_busy(ctx: Context, other: float) -> None:
    """The user's warning when other processes took more than 5 % of the CPU while timing."""
    if math.isfinite(other) and other > 0.05:
        ctx.note(f"Warning: other processes used {100 * other:.0f}% of the CPU while timing; learning "
                 "times are inflated (rerun on a quiet machine)")


def timing_attrs(reference: float, report_reference: float | None, other: float) -> dict[str, Any]:
    """Figure attributes of a learning-time figure: the reference time ``T``, the
    report's (when it gives one), and how busy the machine was while timing."""
    attrs: dict[str, Any] = {"single_agent_seconds": reference}
    if report_reference is not None:
        attrs["report_single_agent_seconds"] = report_reference
    # Other work on the machine inflates timings: say how busy it was.
    return {**attrs, "other_cpu_while_timing": other, "cpu_count": os.cpu_count() or 0}


# ---------------------------------------------------------------------------
# Drawing (matplotlib is imported by the caller; ``ax`` is a matplotlib Axes)


def agents_label(n: int) -> str:
    return "1 agent" if n == 1 else f"{n} agents"


def series(data: FigureData, **match: Any) -> list[tuple[str, Group]]:
    """The curve groups of a figure (those with an ``agents`` attribute) in drawing
    order, optionally only those whose attributes equal ``match``."""
    return [(name, group) for name, group in data.groups.items()
            if "agents" in group.attrs and all(group.attrs.get(k) == v for k, v in match.items())]


def line_style(index: int, agents: int) -> dict[str, Any]:
    markers = "osD^vP*X"
    return {"marker": markers[index % len(markers)], "markersize": 4 if agents == 1 else 5, "linewidth": 1.4}


def plot_curves(ax: Any, groups: list[tuple[str, Group]], x: str, y: str = "quality", *, x_scale: float = 1.0,
                label: Callable[[Group], str] | None = None, errors: Callable[[Group], Any] | None = None,
                until: float | None = None, **style: Any) -> float:
    """One line per group: ``arrays[y]`` against ``arrays[x] * x_scale``, colours and
    markers by position, so that the same groups look the same in every figure.

    Each curve carries a ±1 standard-error band: ``arrays["stderr"]`` where the data
    holds it, else ``errors(group)`` (None: no band). With ``until``, a curve stops at
    its first point at or past ``until`` (in scaled units), so that no curve runs on
    beyond the axis. Returns the largest x drawn (for the axis limit)."""
    right = 0.0
    for i, (_, group) in enumerate(groups):
        agents = int(group.attrs["agents"])
        kwargs = {"color": f"C{i}", **line_style(i, agents), **style}
        xs = np.asarray(group.arrays[x], dtype=np.float64) * x_scale
        ys = np.asarray(group.arrays[y], dtype=np.float64)
        band = group.arrays.get("stderr") if errors is None else errors(group)
        keep = slice(None)
        if until is not None and xs.size:
            past = np.flatnonzero(xs >= until)
            keep = slice(0, int(past[0]) + 1 if past.size else xs.size)
        xs, ys = xs[keep], ys[keep]
        ax.plot(xs, ys, label=(label(group) if label is not None else str(group.attrs["label"])), **kwargs)
        if band is not None:
            band = np.asarray(band, dtype=np.float64)[keep]
            ax.fill_between(xs, ys - band, ys + band, color=kwargs["color"], alpha=0.15, linewidth=0)
        if xs.size:
            right = max(right, float(np.nanmax(xs)))
    return right


def reference_time_line(ax: Any, seconds: float, budget: int) -> None:
    """The dashed vertical line at the single agent's learning time ``T`` (ms axis)."""
    ax.axvline(1e3 * seconds, color="0.4", linestyle="--", linewidth=1,
               label=f"single agent's time for {budget:,} steps ({1e3 * seconds:.2f} ms)")


def timing_note(data: FigureData) -> str:
    """A subtitle line saying how busy the machine was while timing ('' if unknown)."""
    a = data.attrs
    other = a.get("other_cpu_while_timing")
    if isinstance(other, float) and math.isfinite(other):
        return (f"\ntimed on {a.get('cpu_count')} CPU cores while other processes used "
                f"{100 * other:.0f}% of them")
    return ""


def grouped_bars(ax: Any, categories: Sequence[str], bars: Sequence[dict[str, Any]], *, fmt: str,
                 pad: float) -> None:
    """Bars side by side per category, value labels above the error bars.

    Each entry of ``bars``: ``values``, ``errors`` and matplotlib bar keywords (``color``,
    ``label``, ``hatch``...). ``pad`` lifts the labels above the error bar."""
    x = np.arange(len(categories))
    width = 0.76 / len(bars)
    for k, bar in enumerate(bars):
        options = {key: value for key, value in bar.items() if key not in ("values", "errors")}
        offset = (k - (len(bars) - 1) / 2) * width
        values, errors = np.asarray(bar["values"]), np.asarray(bar["errors"])
        ax.bar(x + offset, values, width, yerr=errors, capsize=2, ecolor="0.3", **options)
        for xi, value, error in zip(x + offset, values, errors):
            ax.text(xi, value + error + pad, format(value, fmt), ha="center", va="bottom",
                    fontsize=7 if len(bars) <= 2 else 6, rotation=0 if len(bars) <= 2 else 90)
    ax.set_xticks(x, list(categories))
