"""The experiment plumbing every deep run repeats: the runner's budget and progress
methods, and the episode curves and topology counters of the run file (their
parameters' shared parts are :mod:`popplay.deep.topologies.deep_params`, light).

DQN, REINFORCE and the EXARL agents (``exarl._Experiment``) use these.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from popplay.deep import envs
from popplay.deep.topologies.common import budget_reached, estimated_budget_steps
from popplay.distributed.group import current


class DeepExperiment:
    """The runner's budget, progress and step-count methods of a deep experiment.

    The state carries ``env_steps``; ``_done`` gives the count the ``episodes`` budget
    is in (episodes, or server updates for REINFORCE).
    """

    params: Any

    def _open(self, params: Any, backend: Any, copies: int = 1) -> None:
        """Validate ``params`` and open ``copies`` environments (``self.info`` describes them)."""
        # One torch thread per process: the networks are tiny, and on a shared machine
        # intra-op threads spin against each other (measured: 10x slower with two).
        torch.set_num_threads(1)
        params.validate()
        self.params = params
        self.backend = backend
        self.config = params.agent_config()
        self._env = envs.make_vector(params.env, copies)
        self.info = envs.describe(self._env, params.env)

    def _done(self, state: Any) -> int:
        return state.episodes

    def _note(self, state: Any) -> None:
        # budget_agent_steps has no state argument: it estimates from the last seen.
        self._last = (self._done(state), state.env_steps)

    def warmup(self) -> None:
        pass

    #: Set once the networks held non-finite values: the run stops, saved and flagged.
    diverged: str | None = None
    diverged_phase: int | None = None

    def check_finite(self, state: Any, *, phase: int) -> list[str]:
        """Stop a run whose networks hold NaN or infinity (a learning rate too high):
        one event for the run file and the console; the summary then says ``diverged``
        and the command exits 1. Training on would only spread the NaN."""
        if self.diverged is not None:
            return []
        bad = non_finite_parameters(state)
        if not bad:
            return []
        self.diverged_phase = phase
        self.diverged = (f"phase {phase}: the agent diverged (non-finite values in {', '.join(bad[:3])}"
                         f"{' and more' if len(bad) > 3 else ''}); the run stops here")
        return [self.diverged]

    def finished(self, state: Any, *, time_mode: bool) -> bool:
        if self.diverged is not None:
            return True
        return budget_reached(self._done(state), state.env_steps, self.params.episodes, self.params.env_steps)

    def agent_steps(self, state: Any) -> int:
        return state.env_steps

    def total_agent_steps(self, state: Any) -> int:
        return state.env_steps

    def budget_agent_steps(self) -> int:
        s = getattr(self, "_last", (0, 0))
        return estimated_budget_steps(s[0], s[1], self.params.episodes, self.params.env_steps)

    #: What the ``episodes`` budget counts, as the console labels it.
    episode_unit = "episodes"
    #: What the console calls a step (rates and totals): an environment step.
    step_name = "env-steps"

    @property
    def progress_unit(self) -> str:
        """The console's label for :meth:`progress` (not agent-steps per trial)."""
        return "env-steps" if self.params.env_steps and not self.params.episodes else self.episode_unit

    def budget_progress(self) -> int:
        """The budget in :attr:`progress_unit`."""
        return self.params.env_steps if self.progress_unit == "env-steps" else self.params.episodes

    def progress(self, state: Any) -> int:
        """The budget's unit count, or environment steps with an --env-steps budget
        alone (the unit of --checkpoint-every)."""
        self._note(state)
        return state.env_steps if self.params.env_steps and not self.params.episodes else self._done(state)

    @staticmethod
    def role(params: Any, rank: int) -> str:
        """What rank ``rank`` of a multi-process run does (``ps`` shows it)."""
        return "learner" if rank == 0 else f"simulator {rank}"

    @staticmethod
    def serve(dist: Any, params: Any, resume: Any) -> None:
        """The work of a rank other than 0 until rank 0 tells it to stop."""
        raise NotImplementedError

    def summary_fields(self, state: Any, seconds: float) -> dict[str, Any]:
        """What a deep run reports beside the curves: ``quality`` from greedy episodes
        played at the end, environment steps and episodes, the topology and its ranks."""
        quality = self.quality(state) if self.diverged is None else math.nan  # NaN weights play nothing
        return {"env": self.params.env, "topology": getattr(self.params, "topology", "parameter-server"),
                "ranks": self.params.ranks, "quality": None if math.isnan(quality) else quality,
                "eval_episodes": self.params.eval_episodes, "env_steps": int(state.env_steps),
                "episodes": int(state.episodes),
                "env_steps_per_second": state.env_steps / seconds if seconds > 0 else 0.0,
                "backend": current().backend, **self.summary_extras(state),
                **({"diverged": self.diverged} if self.diverged is not None else {})}

    def static_arrays(self) -> dict[str, Any]:
        return {}

    def results(self, state: Any) -> dict[str, Any]:
        return {}


def non_finite_parameters(state: Any) -> list[str]:
    """The names of the learned tensors in ``state`` (its agent's, or its own networks)
    that hold NaN or infinity, and an infinite last loss (weights of 1e30 are finite, but
    no longer learn anything)."""
    holder = getattr(state, "agent", state)
    named = [(f"{attribute}.{name}", p) for attribute, value in sorted(vars(holder).items())
             if isinstance(value, torch.nn.Module) for name, p in value.named_parameters()]
    bad = []
    # One question to the device for all tensors; names only when something is wrong.
    if named and not bool(torch.stack([torch.isfinite(p).all() for _, p in named]).all()):
        bad = [name for name, p in named if not bool(torch.isfinite(p).all())]
    loss = getattr(holder, "last_loss", None)  # NaN before the first update; infinite never
    if isinstance(loss, float) and math.isinf(loss):
        bad.append(f"the loss ({loss})")
    return bad


def check_finite_arrays(arrays: dict[str, Any]) -> None:
    """Refuse a stored state with NaN or infinity in a float array (a diverged run, or a
    crafted file): it would spread to every weight it touches."""
    bad = [name for name, value in sorted(arrays.items())
           if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all()]
    if bad:
        raise ValueError(f"non-finite values in {', '.join(bad[:3])}{' and more' if len(bad) > 3 else ''}")


def count_episodes(state: Any, returns: Any, lengths: Any, steps: int) -> None:
    """Add finished episodes to the state's counters and curves."""
    state.episodes += len(returns)
    state.env_steps += steps
    state.returns.extend(float(r) for r in returns)
    state.lengths.extend(int(n) for n in lengths)


def curve_arrays(state: Any) -> dict[str, Any]:
    return {"episode_returns": np.asarray(state.returns, dtype=np.float64),
            "episode_lengths": np.asarray(state.lengths, dtype=np.int64)}


def restore_curves(state: Any, arrays: dict[str, Any]) -> None:
    state.returns = [float(r) for r in arrays["episode_returns"]]
    state.lengths = [int(n) for n in arrays["episode_lengths"]]


def restore_progress(state: Any, arrays: dict[str, Any], counters: dict[str, Any]) -> None:
    """Phases, episodes, env-steps and the episode curves of a restored state, checked
    against each other."""
    state.phases = int(counters["phases"])
    state.episodes = int(counters["episodes"])
    state.env_steps = int(counters["env_steps"])
    restore_curves(state, arrays)
    if len(state.returns) != state.episodes:
        raise ValueError(f"{len(state.returns)} episode returns stored for {state.episodes} episodes")


def topology_counters(extra: dict[str, Any]) -> dict[str, Any]:
    return {f"topology_{k}": v for k, v in extra.items()}


def topology_extra(counters: dict[str, Any]) -> dict[str, Any]:
    return {k[len("topology_"):]: v for k, v in counters.items() if k.startswith("topology_")}
