"""``popplay evaluate RUN.h5`` for deep runs (dqn, reinforce): greedy episodes."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from popplay.checkpoints.validation import params_from_config
from popplay.cli.common import print_json
from popplay.core import registry
from popplay.core.backend import Backend
from popplay.core.errors import UsageError


def restored(run: Path, stored: Any) -> tuple[Any, Any, Any]:
    """(parameters, experiment, state) of a stored deep run, on the CPU in one process;
    a file that does not restore is one line (exit 2)."""
    from popplay.deep.envs import EnvError  # defers gymnasium

    if "diverged_phase" in stored.state_counters:  # saved as it stopped: the file is whole, its agents are not
        raise UsageError(f"{run}: this run diverged at phase {stored.state_counters['diverged_phase']} (every "
                         "member's parameters are non-finite); there is no policy to evaluate or export")
    try:
        params = params_from_config(stored.domain, stored.config, run_options=False)
        experiment = registry.get(stored.domain).build(params, Backend("torch", "cpu"))
        return params, experiment, experiment.restore(stored.state, stored.state_counters)
    except EnvError as error:
        raise UsageError(str(error)) from None
    except (TypeError, ValueError, KeyError) as error:
        raise UsageError(f"{run}: damaged run file ({error})") from None


def evaluate_deep(run: Path, stored: Any, episodes: int, seed: int | None, json_output: bool,
                  member: int | None = None) -> None:
    """Play the stored policy greedily for ``episodes`` episodes and report their mean
    return; a population's members each (or ``member`` alone)."""
    params, experiment, state = restored(run, stored)
    members = getattr(experiment, "member_returns", None)
    if members is None and member is not None:
        raise UsageError(f"--member: {run} holds one agent, not a population")
    if members is not None:
        _evaluate_members(run, stored, params, experiment, state, episodes, seed, json_output, member)
        return
    started = time.perf_counter()
    returns = experiment.returns_of_greedy(state, episodes, params.seed if seed is None else seed)
    seconds = time.perf_counter() - started
    payload = {
        "domain": stored.domain, "env": params.env, "path": str(run), "out": str(run), "complete": stored.complete,
        "quality": float(returns.mean()), "std": float(returns.std()), "min": float(returns.min()),
        "max": float(returns.max()), "eval_episodes": episodes,
        "env_steps": int(state.env_steps), "episodes": int(state.episodes),
        "seconds": float(stored.attrs.get("learning_seconds", 0.0)), "eval_seconds": seconds,
        "backend": str(stored.config.get("backend", "none")), "device": "cpu",
        **experiment.summary_extras(state),
    }
    if json_output:
        print_json(payload)
    else:
        print(f"{run}: {stored.domain} on {params.env} after {state.episodes:,} episodes "
              f"({state.env_steps:,} env-steps){'' if stored.complete else ' (stopped early)'}: greedy mean return "
              f"{payload['quality']:.1f} ± {payload['std']:.1f} over {episodes} episodes "
              f"(min {payload['min']:.0f}, max {payload['max']:.0f})")


def _evaluate_members(run: Path, stored: Any, params: Any, experiment: Any, state: Any, episodes: int,
                      seed: int | None, json_output: bool, member: int | None) -> None:
    if member is not None and not 0 <= member < params.agents:
        raise UsageError(f"--member must lie in [0, {params.agents - 1}] for {run} (got {member})")
    diverged = experiment.diverged_members(state)
    if member is not None and diverged[member]:
        raise UsageError(f"--member {member}: that member of {run} diverged (non-finite parameters) and has no "
                         "policy to play")
    if diverged.all():
        raise UsageError(f"{run}: every member diverged (non-finite parameters); there is no policy to play")
    started = time.perf_counter()
    returns = experiment.member_returns(state, episodes, params.seed if seed is None else seed, member)
    seconds = time.perf_counter() - started
    means = returns.mean(axis=1)  # NaN for a diverged member
    slots = list(range(params.agents)) if member is None else [member]
    known = means[~np.isnan(means)]
    best = int(np.nanargmax(means))
    plain = lambda values: [None if np.isnan(v) else float(v) for v in values]  # noqa: E731
    payload = {
        "domain": stored.domain, "env": params.env, "path": str(run), "out": str(run), "complete": stored.complete,
        "agents": params.agents, "members": slots, "eval_episodes": episodes,
        "member_quality": plain(means), "member_std": plain(returns.std(axis=1)),
        "diverged_members": [slot for slot in slots if diverged[slot]],
        "quality": float(known.max()), "quality_mean": float(known.mean()), "quality_worst": float(known.min()),
        "best_member": slots[best], "env_steps": int(state.env_steps), "episodes": int(state.episodes),
        "seconds": float(stored.attrs.get("learning_seconds", 0.0)), "eval_seconds": seconds,
        "backend": str(stored.config.get("backend", "none")), "device": "cpu",
    }
    if json_output:
        print_json(payload)
        return
    print(f"{run}: {stored.domain} population of {params.agents} on {params.env} after {state.env_steps:,} env-steps"
          f"{'' if stored.complete else ' (stopped early)'}: greedy mean return over {episodes} episodes")
    for slot, mean, std in zip(slots, means, returns.std(axis=1)):
        if diverged[slot]:
            print(f"  member {slot:>4}: diverged (non-finite parameters)")
            continue
        print(f"  member {slot:>4}: {mean:8.1f} ± {std:.1f}{'  (best)' if slot == slots[best] else ''}")
