"""The Python API: train, evaluate and compare populations from a script or a notebook.

Everything here is also re-exported by :mod:`popplay` itself (``popplay.train``,
``popplay.BanditParams`` …). The command line is a thin layer over the same calls.
Examples: ``docs/api.md``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from popplay.checkpoints.validation import load_run, params_from_config
from popplay.console import PlainReporter
from popplay.core import registry
from popplay.core.backend import Backend
from popplay.training.pipeline import CheckpointEvery, TrainOptions, TrainOutcome
from popplay.training.pipeline import train as run_train

__all__ = ["train", "evaluate", "tournament", "load", "knights_agent", "params_for", "TrainOptions",
           "TrainOutcome", "CheckpointEvery"]


def params_for(domain: str, **fields: Any) -> Any:
    """The parameters of ``domain`` ("bandit", "cartpole", "knights") with ``fields``
    changed from the defaults, validated (``ValueError`` names a bad field)."""

    if not registry.known(domain):
        raise ValueError(f"domain must be one of {', '.join(registry.names())} (got {domain!r})")
    params = registry.get(domain).params_type()(**fields)
    params.validate()
    return params


def _domain_of(params: Any) -> str:
    for name in registry.names():
        if isinstance(params, registry.get(name).params_type()):
            return name
    raise TypeError(f"not the parameters of a popplay domain: {type(params).__name__}")


def train(params: Any, *, out: str | Path | None = None, backend: str = "auto", device: str = "auto",
          compile: bool | None = None,
          time_budget: float | None = None, checkpoint_every: str | None = None, overwrite: bool = False,
          progress: bool = False, **fields: Any) -> TrainOutcome:
    """Train a population; return its outcome (summary, curves, final state).

    Args:
        params: a domain's parameters (``BanditParams(...)`` …) or a domain name, with
            ``fields`` setting its parameters (``train("bandit", agents=8, trials=4)``).
        out: run file to write (HDF5); None (the default) writes nothing.
        backend, device, compile: as ``--backend``/``--device``/``--compile`` (``compile=None``:
            on where the torch engine runs on CUDA, off elsewhere).
        time_budget: seconds of learning instead of the step budget.
        checkpoint_every: as ``--checkpoint-every`` ("30s", "5m", or a count); needs ``out``.
        overwrite: replace ``out`` if it exists.
        progress: print plain progress lines to stderr.

    Returns:
        :class:`popplay.training.pipeline.TrainOutcome`: ``summary`` (what ``--json`` prints),
        ``result.curve`` (``agent_steps``, ``seconds`` and ``metrics`` lists),
        ``result.state`` (the population's arrays) and ``warnings``.
    """
    if isinstance(params, str):
        params = params_for(params, **fields)
    elif fields:
        raise TypeError("give fields only with a domain name (or use dataclasses.replace on params)")
    every = CheckpointEvery.parse(checkpoint_every) if checkpoint_every else None
    domain = _domain_of(params)  # (auto is the CPU for deep agents: DomainSpec.backend)
    options = TrainOptions(backend=backend, device=device, compile=compile, time_budget=time_budget,
                           out=Path(out) if out is not None else None, overwrite=overwrite, checkpoint_every=every)
    return run_train(domain, params, options, reporter=PlainReporter(sys.stderr) if progress else None)


def load(run: str | Path) -> Any:
    """A run file's contents (:class:`popplay.checkpoints.runfile.RunFile`: domain,
    config, curves, state, results, versions)."""

    return load_run(Path(run))


def knights_agent(run: str | Path, agent: int = 0) -> tuple[Any, Any]:
    """Agent ``agent`` of a knights run: its value network
    (:class:`popplay.games.knights.rules.Network`) and the run's parameters (board,
    jumps), e.g. for :func:`popplay.games.knights.pettingzoo.agent_policy`."""
    stored = load(run)
    if stored.domain != "knights":
        raise ValueError(f"{run}: a {stored.domain} run, not knights")
    params = params_from_config("knights", stored.config, run_options=False)
    if not 0 <= agent < params.agents:
        raise ValueError(f"agent must lie in [0, {params.agents - 1}] (the run has {params.agents} agents)")
    state = registry.get("knights").build(params, Backend("numba", "cpu")).restore(stored.state,
                                                                                   stored.state_counters)
    return state.networks.agent(agent), params


def evaluate(run: str | Path, *, opponent: str = "greedy", games: int = 200, seed: int | None = None) -> dict[str, Any]:
    """Measure the population stored in ``run`` again (as ``popplay evaluate``).

    Bandit and cart-pole: the domain's metrics (``quality`` …). Knights: every agent
    against ``opponent`` over ``games`` games (rounded up to even, half moving first);
    ``quality`` is the best agent's score, ``per_agent`` the scores.
    """

    stored = load(run)
    params = params_from_config(stored.domain, stored.config, run_options=False)
    experiment = registry.get(stored.domain).build(params, Backend("numba", "cpu"))
    state = experiment.restore(stored.state, stored.state_counters)
    if stored.domain != "knights":
        return {"domain": stored.domain, "agent_steps_per_trial": experiment.agent_steps(state),
                "agent_steps": experiment.total_agent_steps(state), **experiment.measure(state)}
    from popplay.games.knights.opponents import quality  # defers numba

    games += games % 2
    q = quality(state.networks, opponent, games, params=params, seed=params.seed if seed is None else seed)
    return {"domain": "knights", "opponent": opponent, "games": games, "episode": state.episode,
            "quality": float(q.score.max()), "mean": float(q.score.mean()), "worst": float(q.score.min()),
            "per_agent": q.score.tolist()}


def tournament(runs: Sequence[str | Path], *, games: int = 10, anchor: str | None = None, seed: int = 0,
               snapshots: bool = False) -> dict[str, Any]:
    """Round robin between the knights agents of ``runs`` (as ``popplay tournament``):
    ``agents`` (names), ``ratings`` (Elo), ``total_score`` and the win/draw/loss matrices."""
    from popplay.tournaments.entrants import load_field  # defers numba
    from popplay.tournaments.roundrobin import TAG_TOURNAMENT, round_robin  # defers numba

    games += games % 2
    field = load_field([Path(r) for r in runs], snapshots=snapshots, anchor=anchor)
    if len(field.players) < 2:
        raise ValueError("a tournament needs at least two players (more runs, snapshots or an anchor)")
    result = round_robin(field.nets, field.players, games, params=field.params, seed=seed, tag=TAG_TOURNAMENT)
    return {"agents": [e.name for e in field.entrants], "ratings": result.ratings(anchor=field.anchor).tolist(),
            "total_score": result.total.tolist(), "wins": result.wins.tolist(), "draws": result.draws.tolist(),
            "losses": result.losses.tolist(), "games": games}
