"""Bell's cart-pole figures (report §2.5): Figures 6, 7, 8 and 9.

Tabular Sarsa(λ) agents balance the Barto–Sutton–Anderson pole (``docs/cartpole.md``,
the defaults measured there: α 0.3, γ 0.999, λ 0.99, ε 0.001, replacing traces, 36
boxes). A single agent is compared with groups of 16 to 4096 agents that pool their Q
tables with equations (5)–(8) and, "with differentiation", get a decaying random bias
after each share, (9)–(10) (max bias 0.1, decay 1.2). Quality is §2.5's: the mean
number of steps the shared greedy policy balances from a random start, out of 8192,
averaged over the trials; every point also stores its standard error over the trials.

Each group shares at the interval measured best for its size in ``docs/cartpole.md``
(``python benchmarks/cartpole.py quality``): every 64 steps per agent for 16, 64 and
256 agents, 32 for 1024 and 16 for 4096 (Bell: "as agent group size increases, the
optimal number of time steps per agent between sharing decreases"). The single agent
"shares" (a no-op for one agent) only to mark the points of its curve.

Figure 6: quality against agent-time steps per trial (a budget of 262,144), without
differentiation: the algorithmic penalty of learning in parallel.

Figure 7: quality against learning time, without differentiation. Learning time is
the time *one trial alone* takes (:mod:`popplay.reproduce.timing`, as for the bandit's
Figure 3): the single agent on one CPU thread, a group on the chosen backend, the
fastest of ``repeats`` runs; quality at those points comes from the batch of all
trials (the timed trial is trial 0 of the batch). The window is the single agent's
time ``T`` for the 262,144-step budget; every group learns until it has used at least
``T``. (Bell's window was 200 ms of his hardware; ``T`` plays that role here.)

Figure 8: the same with differentiation. Bell showed "the improvement that occurred
during the first 100 ms", half of Figure 7's window. Here both figures span the same
window ``T`` so that they can be laid side by side, and Figure 8 draws Figure 7's group
curves again as faint dashed lines: the improvement is the gap between the two.
(The single agent is never differentiated; its curve is the same in both.)

Figure 9 ("the final learning quality including the impact of differentiation"): the
report gives no caption, only that it shows the final quality and "the success of the
parallel approach" with groups of at least 256 agents. Chosen here, in two panels:

* left, quality against agent-time steps *with* differentiation: Figure 6's
  counterpart, so that the four combinations (steps or time, with or without
  differentiation) are all drawn;
* right, bars of the final quality of every group and the single agent, at the step
  budget and at the single agent's learning time ``T``, each without and with
  differentiation (error bars: standard error over the trials). The bars are the
  last points of Figures 6, 9 (left), 7 and 8.

Learning time on a CPU: an agent-step costs about the same whether it belongs to one
agent or to a group, so the groups gain only what the numba kernel's lock-step
groups of agents and the CPU's threads give them; Bell's GPU ran a group's agents in
parallel. The figures record how busy the machine was while timing.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from popplay.core.backend import Backend
from popplay.games.cartpole.rules import CartPolePopulationParams
from popplay.reproduce import timing
from popplay.reproduce.data import FigureData, Group
from popplay.reproduce.registry import Context, Figure, register
from popplay.reproduce.timing import CurveData, GroupScale, agents_label

REPORT_AGENT_STEPS = 262144
REPORT_TEST_STEPS = 8192
REPORT_WINDOW_SECONDS = 0.2  # Figure 7's learning period in the report (Figure 8: the first 100 ms)
PAPER_GROUPS = ((16, 64), (64, 64), (256, 64), (1024, 32), (4096, 16))  # (agents, share every)


@dataclass(frozen=True)
class CartPoleScale(GroupScale):
    """Sizes of one reproduction scale."""

    test_steps: int = REPORT_TEST_STEPS  # the quality ceiling: steps of each greedy test
    bias: float = 0.1  # max bias of differentiation, equation (9)
    bias_decay: float = 1.2  # equation (10)

    def biases(self) -> tuple[float, float]:
        """Without and with differentiation."""
        return (0.0, self.bias)

    def validate(self) -> None:
        super().validate()
        if not self.bias > 0.0:
            raise ValueError(f"scale {self.name}: differentiation needs a positive bias")


SCALES: dict[str, CartPoleScale] = {
    # For the tests: seconds, not minutes.
    "tiny": CartPoleScale("tiny", agent_steps=4096, trials=8, groups=((16, 16), (64, 16), (256, 4)),
                          single_points=8, repeats=1, test_steps=256),
    # The report's budget, groups and test length with fewer trials (standard error of
    # a quality ≈ 250 steps): about a minute or two on a 2-core CPU for all four figures.
    "small": CartPoleScale("small", agent_steps=REPORT_AGENT_STEPS, trials=128, groups=PAPER_GROUPS,
                           single_points=32, repeats=3, test_steps=REPORT_TEST_STEPS),
    "paper": CartPoleScale("paper", agent_steps=REPORT_AGENT_STEPS, trials=1024, groups=PAPER_GROUPS,
                           single_points=32, repeats=20, test_steps=REPORT_TEST_STEPS),
}


def scale_for(ctx: Context) -> CartPoleScale:
    scale = SCALES[ctx.scale]
    scale.validate()
    return scale


def population_params(scale: CartPoleScale, seed: int, agents: int, trials: int, steps_per_agent: int,
                      share_every: int, bias: float, test_steps: int | None = None) -> Any:
    """The :class:`popplay.games.cartpole.rules.CartPolePopulationParams` of one curve: the
    package defaults but for these sizes (``popplay train cartpole`` with the same
    options runs the same experiment). A single agent is never differentiated."""

    return CartPolePopulationParams(agents=agents, trials=trials, steps_per_agent=steps_per_agent,
                                    share_every=share_every, bias=bias if agents > 1 else 0.0,
                                    bias_decay=scale.bias_decay,
                                    test_steps=scale.test_steps if test_steps is None else test_steps, seed=seed)


# ---------------------------------------------------------------------------
# Experiments shared by the figures (computed once per session; see timing.py)


def _effective_bias(agents: int, bias: float) -> float:
    return bias if agents > 1 else 0.0


def _stderr_of_point(experiment: Any, state: Any) -> dict[str, float]:
    """The standard error of a point's quality over the trials (the tests just run
    are cached by the experiment, so this costs nothing)."""
    per_trial = experiment.balanced_steps(state).mean(axis=1)
    spread = float(per_trial.std(ddof=1)) if per_trial.size > 1 else 0.0
    return {"stderr": spread / math.sqrt(per_trial.size)}


# What each figure reads: (bias, "steps") is a curve up to the step budget, (bias,
# "time") one up to the timed trial's last point; bias None: with differentiation.
_NEEDS: dict[str, tuple[tuple[float | None, str], ...]] = {
    "figure6": ((0.0, "steps"),),
    "figure7": ((0.0, "time"),),
    "figure8": ((None, "time"), (0.0, "time")),
    "figure9": ((None, "steps"), (0.0, "steps"), (None, "time"), (0.0, "time")),
}


def _plan(ctx: Context, scale: CartPoleScale) -> set[str]:
    """The figures this session will compute (filled by their ``prepare``)."""
    return ctx.memo(f"cartpole/{scale.name}/{ctx.seed}/plan", set)


def _planned_steps(ctx: Context, scale: CartPoleScale, agents: int, bias: float) -> int | None:
    """Steps per agent that the planned figures need of the batch (``agents``, effective
    ``bias``); None without a plan (figures computed directly, not by the driver)."""
    plan = _plan(ctx, scale)
    if not plan:
        return None
    needed = 0
    for figure in plan:
        for wanted, kind in _NEEDS[figure]:
            if _effective_bias(agents, scale.bias if wanted is None else wanted) != bias:
                continue
            if kind == "steps":
                needed = max(needed, scale.agent_steps // agents)
            else:  # taken in prepare, before any figure is computed
                needed = max(needed, int(timings(ctx, scale)[1][(agents, bias)][0][-1]) // agents)
    return needed


def batch_curve(ctx: Context, scale: CartPoleScale, agents: int, share_every: int, bias: float,
                steps_per_agent: int) -> CurveData:
    """Quality (and its standard error, ``extra["stderr"]``) over all trials up to
    ``steps_per_agent`` steps per agent; one batch per group and bias per session.

    Run by the driver, a batch learns once as far as any chosen figure needs and
    drops its state (4096 agents x 1024 trials hold 7 GB of tables); figures computed
    directly keep it and continue it when a later figure needs more steps."""
    from popplay.games.cartpole.experiment import CartPoleExperiment  # defers numba

    bias = _effective_bias(agents, bias)
    planned = _planned_steps(ctx, scale, agents, bias)

    def make(steps: int) -> CartPoleExperiment:
        return CartPoleExperiment(population_params(scale, ctx.seed, agents, scale.trials, steps, share_every, bias),
                                  ctx.backend)

    def describe(result: Any) -> str:
        return (f"cartpole: {agents_label(agents)}{_bias_note(agents, bias)} x {scale.trials} trials, "
                f"{result.curve.agent_steps[-1]:,} agent-steps: quality {result.curve.metrics['quality'][-1]:.0f} "
                f"({result.learning_seconds:.1f}s)")

    return timing.batch_curve(ctx, f"cartpole/{scale.name}/{ctx.seed}/batch/{agents}/{share_every}/{bias!r}", make,
                              steps_per_agent, agents, run_to=planned, keep_state=planned is None,
                              describe=describe, per_point=_stderr_of_point)


def _bias_note(agents: int, bias: float) -> str:
    return f" (bias {bias:g})" if agents > 1 and bias > 0 else ""


@dataclass
class TimeCurves:
    """Figures 7 and 8's curves and how they were timed."""

    reference: float  # T: the single agent's learning time for the whole budget
    curves: dict[tuple[int, float], tuple[CurveData, np.ndarray]]  # (agents, bias) -> (timed, batch s per trial)
    other_cpu: float  # share of the machine's CPU time other processes used while timing (NaN: unknown)


Timings = tuple[float, dict[tuple[int, float], tuple[np.ndarray, np.ndarray]], float]


def timings(ctx: Context, scale: CartPoleScale) -> Timings:
    """Per-trial timing of the single agent and of every group without and with
    differentiation: (T, (agents, bias) -> (agent-steps, seconds), the share of the
    machine's CPU time that other processes used meanwhile)."""

    def measure() -> Timings:
        from popplay.games.cartpole.experiment import CartPoleExperiment  # defers numba

        ctx.note("cartpole: timing one trial of each group alone (learning time of Figures 7-9)")
        watch = timing.OtherCpu()
        cpu = Backend("numba", "cpu")  # Bell's single agent ran on the CPU
        steps = np.arange(1, scale.single_points + 1, dtype=np.int64) * scale.single_every
        # Timing runs test nothing worth keeping: one test step (untimed anyway).
        seconds = timing.time_single_agent(
            lambda s: CartPoleExperiment(population_params(scale, ctx.seed, 1, 1, s, s, 0.0, test_steps=1), cpu),
            steps, scale.repeats)
        reference = float(seconds[-1])
        ctx.note(f"cartpole: one trial of 1 agent, {int(steps[-1]):,} steps: {1e3 * reference:.2f} ms "
                 f"(fastest of {scale.repeats})")
        timed: dict[tuple[int, float], tuple[np.ndarray, np.ndarray]] = {(1, 0.0): (steps, seconds)}
        makes = {(agents, bias): (lambda a=agents, e=every, b=bias: CartPoleExperiment(
                     population_params(scale, ctx.seed, a, 1, e, e, b, test_steps=1), ctx.backend))
                 for bias in scale.biases() for agents, every in scale.groups}
        found = timing.time_groups(makes, reference, scale.repeats)
        for bias in scale.biases():
            for agents, every in scale.groups:
                group_seconds = found[(agents, bias)]
                group_steps = np.arange(1, len(group_seconds) + 1, dtype=np.int64) * every * agents
                timed[(agents, bias)] = (group_steps, group_seconds)
                ctx.note(f"cartpole: one trial of {agents_label(agents)}{_bias_note(agents, bias)} reaches "
                         f"{int(group_steps[-1]):,} agent-steps in {1e3 * group_seconds[-1]:.2f} ms "
                         f"(fastest of {scale.repeats})")
        other = watch.share()
        timing.warn_if_busy(ctx, other)
        return reference, timed, other

    return ctx.memo(f"cartpole/{scale.name}/{ctx.seed}/timings", measure)


def time_curves(ctx: Context, scale: CartPoleScale, bias: float) -> TimeCurves:
    """Per group (``bias`` 0: without differentiation): per-trial timing with the
    batch's quality at the same points (and the batch's seconds per trial)."""
    reference, timed, other = timings(ctx, scale)
    out: dict[tuple[int, float], tuple[CurveData, np.ndarray]] = {}
    for agents, every in scale.series():
        key = (agents, _effective_bias(agents, bias))
        steps, seconds = timed[key]
        batch = batch_curve(ctx, scale, agents, every, bias, int(steps[-1]) // agents)
        if not np.array_equal(batch.agent_steps, steps):
            raise RuntimeError(f"cartpole: timing and batch points differ for {agents} agents")  # a bug, not input
        out[key] = (CurveData(steps, seconds, batch.quality, batch.extra), batch.seconds / scale.trials)
    return TimeCurves(reference, out, other)


def _prepare(figure: str) -> Any:
    def prepare(ctx: Context) -> None:
        """Note the figure in the session's plan; take the wall-clock measurements
        first, before the long batches load the machine."""
        scale = scale_for(ctx)
        _plan(ctx, scale).add(figure)
        if any(kind == "time" for _, kind in _NEEDS[figure]):
            timings(ctx, scale)

    return prepare


# ---------------------------------------------------------------------------
# Figures


def _common_attrs(ctx: Context, scale: CartPoleScale) -> dict[str, Any]:
    example = population_params(scale, ctx.seed, 256, scale.trials, scale.agent_steps // 256, 64, scale.bias)
    settings = {k: v for k, v in example.to_dict().items()
                if k not in ("agents", "steps_per_agent", "share_every", "bias", "trials", "seed")}
    return {"agent_steps_budget": scale.agent_steps, "trials": scale.trials, "test_steps": scale.test_steps,
            "bias": scale.bias, "bias_decay": scale.bias_decay, "seed": ctx.seed, "backend": ctx.backend.name,
            "device": ctx.backend.device, "repeats": scale.repeats,
            # Everything else every curve shares (CartPolePopulationParams fields).
            "params_json": json.dumps(settings, sort_keys=True)}


def _curve_group(agents: int, every: int, bias: float, arrays: dict[str, np.ndarray], role: str = "main") -> Group:
    bias = _effective_bias(agents, bias)
    return Group(arrays=arrays, attrs={"agents": agents, "share_every": every, "bias": bias, "role": role,
                                       "label": agents_label(agents)})


def _step_curves(ctx: Context, scale: CartPoleScale, bias: float) -> dict[str, Group]:
    groups = {}
    for agents, every in scale.series():
        curve = batch_curve(ctx, scale, agents, every, bias, scale.agent_steps // agents)
        groups[f"agents_{agents}"] = _curve_group(agents, every, bias, {
            "agent_steps": curve.agent_steps, "quality": curve.quality, "stderr": curve.extra["stderr"],
            "seconds_batch": curve.seconds})
    return groups


def _time_groups(scale: CartPoleScale, timed: TimeCurves, bias: float, role: str, prefix: str,
                 skip_single: bool = False) -> dict[str, Group]:
    groups = {}
    for agents, every in scale.series():
        if skip_single and agents == 1:
            continue
        curve, batch_per_trial = timed.curves[(agents, _effective_bias(agents, bias))]
        groups[f"{prefix}agents_{agents}"] = _curve_group(agents, every, bias, {
            "agent_steps": curve.agent_steps, "seconds": curve.seconds, "quality": curve.quality,
            "stderr": curve.extra["stderr"], "seconds_batch_per_trial": batch_per_trial}, role)
    return groups


def _timing_attrs(timed: TimeCurves) -> dict[str, Any]:
    return {**timing.timing_attrs(timed.reference, None, timed.other_cpu),
            "report_window_seconds": REPORT_WINDOW_SECONDS,
            "timing": "one trial alone, fastest of repeats; quality averaged over the trials"}


def compute_figure6(ctx: Context) -> FigureData:
    scale = scale_for(ctx)
    data = FigureData("figure6", "cartpole", scale.name,
                      "Learning quality by agent-time steps, without differentiation",
                      attrs={**_common_attrs(ctx, scale), "differentiation": 0})
    data.groups.update(_step_curves(ctx, scale, 0.0))
    return data


def compute_figure7(ctx: Context) -> FigureData:
    scale = scale_for(ctx)
    timed = time_curves(ctx, scale, 0.0)
    data = FigureData("figure7", "cartpole", scale.name,
                      "Learning quality by learning time, without differentiation",
                      attrs={**_common_attrs(ctx, scale), **_timing_attrs(timed), "differentiation": 0})
    data.groups.update(_time_groups(scale, timed, 0.0, "main", ""))
    return data


def compute_figure8(ctx: Context) -> FigureData:
    scale = scale_for(ctx)
    plain = time_curves(ctx, scale, 0.0)
    timed = time_curves(ctx, scale, scale.bias)
    data = FigureData("figure8", "cartpole", scale.name,
                      "Learning quality by learning time, with differentiation",
                      attrs={**_common_attrs(ctx, scale), **_timing_attrs(timed), "differentiation": 1})
    data.groups.update(_time_groups(scale, timed, scale.bias, "main", ""))
    # Figure 7's group curves for comparison (the single agent's is the same curve).
    data.groups.update(_time_groups(scale, plain, 0.0, "comparison", "plain_", skip_single=True))
    return data


def compute_figure9(ctx: Context) -> FigureData:
    scale = scale_for(ctx)
    data = FigureData("figure9", "cartpole", scale.name,
                      "Final learning quality with and without differentiation",
                      attrs={**_common_attrs(ctx, scale), "differentiation": 1})
    data.groups.update(_step_curves(ctx, scale, scale.bias))
    bars: dict[str, list[float]] = {}
    for name, bias in (("plain", 0.0), ("differentiated", scale.bias)):
        timed = time_curves(ctx, scale, bias)
        data.attrs.update(_timing_attrs(timed))
        for agents, every in scale.series():
            fixed = batch_curve(ctx, scale, agents, every, bias, scale.agent_steps // agents)
            curve, _ = timed.curves[(agents, _effective_bias(agents, bias))]
            for key, value in (("quality_at_steps", fixed.quality[-1]), ("stderr_at_steps", fixed.extra["stderr"][-1]),
                               ("quality_at_time", curve.quality[-1]), ("stderr_at_time", curve.extra["stderr"][-1]),
                               ("agent_steps_at_time", curve.agent_steps[-1]),
                               ("seconds_at_time", curve.seconds[-1])):
                bars.setdefault(f"{key}_{name}", []).append(value)
    arrays = {"agents": np.array([a for a, _ in scale.series()], dtype=np.int64)}
    for key, values in bars.items():
        arrays[key] = np.array(values, dtype=np.int64 if key.startswith("agent_steps") else np.float64)
    data.groups["bars"] = Group(arrays=arrays, attrs={
        "label": "final quality at the step budget and at the single agent's learning time, "
                 "without (plain) and with (differentiated) differentiation"})
    return data


# ---------------------------------------------------------------------------
# Drawing (matplotlib is imported by the caller; ``fig`` is a matplotlib Figure)


def _subtitle(data: FigureData, differentiation: bool | None = None) -> str:
    a = data.attrs
    params = json.loads(a.get("params_json", "{}"))
    algorithm = {"sarsa": "Sarsa", "q": "Q"}.get(params.get("algorithm"), str(params.get("algorithm")))
    learner = (f"{algorithm}(λ) α {params.get('alpha')}, λ {params.get('lam')}, "
               f"ε {params.get('epsilon')}")
    if differentiation is None:
        diff = ""
    elif differentiation:
        diff = f", bias {a.get('bias')} / {a.get('bias_decay')} per share"
    else:
        diff = ", no differentiation"
    return (f"{learner}{diff}\nquality over {a.get('trials')} trials x {a.get('test_steps')} test steps "
            f"(scale {data.scale}, {a.get('backend')} on {a.get('device')})") + timing.timing_note(data)


def _share_label(group: Group) -> str:
    agents = int(group.attrs["agents"])
    return f"{group.attrs['label']}" + ("" if agents == 1 else f", share every {group.attrs['share_every']}")


def _quality_axis(ax: Any, data: FigureData) -> None:
    ceiling = float(data.attrs["test_steps"])
    ax.axhline(ceiling, color="0.6", linewidth=0.8, linestyle=":")
    ax.set_ylim(0, ceiling * 1.04)
    ax.set_ylabel(f"learning quality (mean steps balanced, of {int(ceiling):,})")
    ax.grid(True, alpha=0.3)


def _draw_steps(ax: Any, data: FigureData, title: str) -> None:
    timing.plot_curves(ax, timing.series(data), "agent_steps", label=_share_label)
    ax.set_xlabel("agent-time steps per trial")
    ax.set_xlim(0, float(data.attrs["agent_steps_budget"]) * 1.02)
    _quality_axis(ax, data)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")


def _draw_time(ax: Any, data: FigureData, title: str) -> None:
    main = timing.series(data, role="main")
    reference = float(data.attrs["single_agent_seconds"])
    # Each curve ends at its first sharing point at or after T, and the axis reaches
    # it: a curve never runs off the edge, nor a group with a late first share vanish.
    right = timing.plot_curves(ax, main, "seconds", x_scale=1e3, until=1e3 * reference)
    colours = {int(group.attrs["agents"]): f"C{i}" for i, (_, group) in enumerate(main)}
    comparison = timing.series(data, role="comparison")
    for _, group in comparison:
        seconds = 1e3 * np.asarray(group.arrays["seconds"], dtype=np.float64)
        past = np.flatnonzero(seconds >= 1e3 * reference)
        end = int(past[0]) + 1 if past.size else seconds.size
        ax.plot(seconds[:end], np.asarray(group.arrays["quality"])[:end],
                color=colours.get(int(group.attrs["agents"])), linestyle="--", linewidth=1.0, alpha=0.45)
        right = max(right, float(seconds[:end].max()) if end else 0.0)
    if comparison:
        ax.plot([], [], color="0.4", linestyle="--", linewidth=1.0, alpha=0.6, label="(dashed: without differentiation)")
    timing.reference_time_line(ax, reference, int(data.attrs["agent_steps_budget"]))
    ax.set_xlabel("learning time of one trial (ms)")
    ax.set_xlim(0, max(1e3 * reference * 1.15, right * 1.03))
    _quality_axis(ax, data)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")


def draw_figure6(data: FigureData, fig: Any) -> None:
    _draw_steps(fig.add_subplot(1, 1, 1), data, f"Figure 6: {data.title}\n{_subtitle(data, False)}")


def draw_figure7(data: FigureData, fig: Any) -> None:
    _draw_time(fig.add_subplot(1, 1, 1), data, f"Figure 7: {data.title}\n{_subtitle(data, False)}")


def draw_figure8(data: FigureData, fig: Any) -> None:
    _draw_time(fig.add_subplot(1, 1, 1), data, f"Figure 8: {data.title}\n{_subtitle(data, True)}")


def draw_figure9(data: FigureData, fig: Any) -> None:
    fig.set_size_inches(14, 5.5)
    left, right = fig.subplots(1, 2, width_ratios=(1, 1.25))
    _draw_steps(left, data, "with differentiation, by agent-time steps")
    bars = data.groups["bars"].arrays
    reference = float(data.attrs["single_agent_seconds"])
    budget = int(data.attrs["agent_steps_budget"])
    labels = ["1 (single)" if a == 1 else str(int(a)) for a in bars["agents"]]
    timing.grouped_bars(right, labels, [
        {"values": bars["quality_at_steps_plain"], "errors": bars["stderr_at_steps_plain"], "color": "lightsteelblue",
         "label": f"{budget:,} agent-steps, without differentiation"},
        {"values": bars["quality_at_steps_differentiated"], "errors": bars["stderr_at_steps_differentiated"],
         "color": "tab:blue", "label": f"{budget:,} agent-steps, with differentiation"},
        {"values": bars["quality_at_time_plain"], "errors": bars["stderr_at_time_plain"], "color": "darkseagreen",
         "label": f"learning time {1e3 * reference:.1f} ms, without differentiation"},
        {"values": bars["quality_at_time_differentiated"], "errors": bars["stderr_at_time_differentiated"],
         "color": "tab:green", "label": f"learning time {1e3 * reference:.1f} ms, with differentiation"},
    ], fmt=".0f", pad=0.01 * float(data.attrs["test_steps"]))
    right.set_xlabel("agents per trial (the single agent is never differentiated)")
    _quality_axis(right, data)
    ceiling = float(data.attrs["test_steps"])
    right.set_ylim(0, ceiling * 1.25)  # room for the labels and the legend; no ticks there
    right.set_yticks(np.linspace(0, ceiling, 5))
    right.grid(False)
    right.grid(True, axis="y", alpha=0.3)
    right.set_title("final quality at the step budget and at the single agent's learning time", fontsize=10)
    right.legend(fontsize=7, loc="upper left", ncols=2)
    fig.suptitle(f"Figure 9: {data.title}\n{_subtitle(data, True)}", fontsize=10)


def _final(data: FigureData, role: str = "main") -> dict[str, float]:
    return {str(group.attrs["agents"]): float(group.arrays["quality"][-1])
            for _, group in timing.series(data, role=role)}


def summary_figure6(data: FigureData) -> dict[str, Any]:
    return {f"quality_at_{int(data.attrs['agent_steps_budget'])}_agent_steps": _final(data)}


def summary_figure7(data: FigureData) -> dict[str, Any]:
    return {"single_agent_seconds": float(data.attrs["single_agent_seconds"]),
            "quality_at_single_agent_time": _final(data),
            "agent_steps_at_single_agent_time": {str(g.attrs["agents"]): int(g.arrays["agent_steps"][-1])
                                                 for _, g in timing.series(data, role="main")}}


def summary_figure8(data: FigureData) -> dict[str, Any]:
    return {**summary_figure7(data), "quality_at_single_agent_time_without_differentiation":
            {"1": _final(data)["1"], **_final(data, "comparison")}}


def summary_figure9(data: FigureData) -> dict[str, Any]:
    bars = data.groups["bars"].arrays
    keys = [str(int(a)) for a in bars["agents"]]
    return {"single_agent_seconds": float(data.attrs["single_agent_seconds"]),
            **{f"quality_at_{where}_{name}": dict(zip(keys, map(float, bars[f"quality_at_{where}_{name}"])))
               for where in ("steps", "time") for name in ("plain", "differentiated")}}


FIGURE6 = register(Figure(
    "figure6", "cartpole", "Pole balancing: learning quality by agent-time steps, without differentiation",
    "cart-pole quality against agent-time steps per trial, single agent against sharing groups, no differentiation.",
    compute_figure6, draw_figure6, summary_figure6, _prepare("figure6")))
FIGURE7 = register(Figure(
    "figure7", "cartpole", "Pole balancing: learning quality by learning time, without differentiation",
    "cart-pole quality against the learning time of one trial, no differentiation.",
    compute_figure7, draw_figure7, summary_figure7, _prepare("figure7")))
FIGURE8 = register(Figure(
    "figure8", "cartpole", "Pole balancing: learning quality by learning time, with differentiation",
    "cart-pole quality against the learning time of one trial, with differentiation (dashed: without).",
    compute_figure8, draw_figure8, summary_figure8, _prepare("figure8")))
FIGURE9 = register(Figure(
    "figure9", "cartpole", "Pole balancing: final learning quality with and without differentiation",
    "cart-pole quality by agent-time steps with differentiation, and bars of the final quality of every group.",
    compute_figure9, draw_figure9, summary_figure9, _prepare("figure9")))
