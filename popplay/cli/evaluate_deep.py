"""``popplay evaluate RUN.h5`` for deep runs (dqn, reinforce): greedy episodes."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from popplay.checkpoints.validation import params_from_config
from popplay.cli.common import print_json
from popplay.core import registry
from popplay.core.backend import Backend
from popplay.core.errors import UsageError


def evaluate_deep(run: Path, stored: Any, episodes: int, seed: int | None, json_output: bool) -> None:
    """Play the stored policy greedily for ``episodes`` episodes and report their mean return."""
    from popplay.deep.envs import EnvError  # defers gymnasium

    try:
        params = params_from_config(stored.domain, stored.config, run_options=False)
        experiment = registry.get(stored.domain).build(params, Backend("torch", "cpu"))
        state = experiment.restore(stored.state, stored.state_counters)
    except EnvError as error:
        raise UsageError(str(error)) from None
    except (TypeError, ValueError, KeyError) as error:
        raise UsageError(f"{run}: damaged run file ({error})") from None
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
