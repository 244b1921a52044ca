"""Environments for the deep agents: gymnasium ids, stepped as vector environments.

:func:`make_vector` turns a user's ``--env`` id into a gymnasium vector environment
whose finished copies restart in the same step (``AutoresetMode.SAME_STEP``), or
raises :class:`EnvError` with one line for the user: an unknown id, or an id whose
extra is not installed (naming the pip command). popplay's own cart-pole registers as
``popplay/CartPole-v1`` (:mod:`popplay.deep.envs.cartpole`) with a numba vector environment,
and its knights game as ``popplay/Knights-v0`` against a random opponent
(``popplay/KnightsGreedy-v0``, ``popplay/KnightsSearch2-v0`` ...: stronger ones;
:mod:`popplay.deep.envs.knights`), a two-player game whose members can rank by playing
each other.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Iterator

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from popplay.deep.envs.single import SingleCopyVectorEnv

POPPLAY_CARTPOLE = "popplay/CartPole-v1"
POPPLAY_KNIGHTS = "popplay/Knights-v0"
#: The fixed opponents a knights environment can play (the ladder's fast rungs): random
#: is popplay/Knights-v0's; each other has its own id, popplay/KnightsGreedy-v0 ...
KNIGHTS_OPPONENTS = ("random", "greedy", "search1", "search2", "search3", "search4")


def knights_id(opponent: str) -> str:
    """The registered id of knights against ``opponent``."""
    return POPPLAY_KNIGHTS if opponent == "random" else f"popplay/Knights{opponent.capitalize()}-v0"

# Families of gymnasium environments that need an extra, and the pip command for it.
_EXTRAS = {
    "LunarLander": "box2d", "BipedalWalker": "box2d", "CarRacing": "box2d",
    "Ant": "mujoco", "HalfCheetah": "mujoco", "Hopper": "mujoco", "Humanoid": "mujoco",
    "HumanoidStandup": "mujoco", "InvertedDoublePendulum": "mujoco", "InvertedPendulum": "mujoco",
    "Pusher": "mujoco", "Reacher": "mujoco", "Swimmer": "mujoco", "Walker2d": "mujoco",
}


class EnvError(ValueError):
    """An environment that cannot be made here; the message is one line for users."""


@dataclass(frozen=True)
class EnvInfo:
    """What an agent needs to know about an environment's spaces."""

    env_id: str
    obs_dim: int
    actions: int | None  # number of discrete actions; None for continuous actions
    action_dim: int
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

    @property
    def discrete(self) -> bool:
        return self.actions is not None


_registered = False


def register() -> None:
    """Register popplay's environments with gymnasium (idempotent)."""
    global _registered
    if _registered:
        return

    if POPPLAY_CARTPOLE not in gymnasium.registry:
        gymnasium.register(id=POPPLAY_CARTPOLE, entry_point="popplay.deep.envs.cartpole:CartPoleEnv",
                           vector_entry_point="popplay.deep.envs.cartpole:CartPoleVectorEnv",
                           max_episode_steps=500, reward_threshold=475.0)
    for opponent in KNIGHTS_OPPONENTS:  # the game ends itself: after max_turns plies, a draw
        if knights_id(opponent) not in gymnasium.registry:
            gymnasium.register(id=knights_id(opponent), entry_point="popplay.deep.envs.knights:KnightsEnv",
                               kwargs={"opponent": opponent})
    _registered = True


def install_hint(env_id: str) -> str | None:
    """The pip command that provides ``env_id``'s extra, if it needs one."""
    family = env_id.rpartition(":")[2].split("/")[-1].split("-v")[0]
    extra = _EXTRAS.get(family)
    if extra is None:
        return None
    return f"pip install 'popplay[{extra}]'"


def resolve_id(env_id: str) -> str:
    """``env_id`` without gymnasium's ``module:`` prefix, once that module (which
    registers the environment) is imported; :class:`EnvError` if it cannot be."""
    module, colon, bare = env_id.rpartition(":")
    if not colon:
        return env_id
    if not module or not bare:
        raise EnvError(f"--env {env_id}: expected MODULE:ID, as gymnasium.make takes it")
    try:
        import_module(module)
    except Exception as error:  # any failure of the user's module is theirs to see, in one line
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise EnvError(f"--env {env_id}: cannot import {module} ({reason})") from None
    return bare


def check_env_id(env_id: str) -> str:
    """The registered id ``env_id`` names (:func:`resolve_id`); :class:`EnvError` unless
    it names a registered environment."""

    register()
    bare = resolve_id(env_id)
    try:
        gymnasium.spec(bare)
    except gymnasium.error.Error as error:
        reason = " ".join(str(error).split())
        raise EnvError(f"--env {env_id}: not a gymnasium environment ({reason})") from None
    return bare


@contextmanager
def _needs_extras(env_id: str) -> Iterator[None]:
    """Missing extras as one :class:`EnvError` line naming the pip command."""
    try:
        yield
    except gymnasium.error.DependencyNotInstalled as error:
        hint = install_hint(env_id)
        reason = " ".join(str(error).split())
        raise EnvError(f"--env {env_id} needs an extra that is not installed: "
                       f"{hint or 'see ' + repr(reason)}") from None
    except (ImportError, ModuleNotFoundError) as error:
        hint = install_hint(env_id)
        raise EnvError(f"--env {env_id} needs an extra that is not installed ({error.name or error}): "
                       f"{hint or 'pip install gymnasium[all]'}") from None


def make_vector(env_id: str, num_envs: int = 1, **kwargs: Any) -> Any:
    """A gymnasium vector environment of ``num_envs`` copies of ``env_id`` that resets
    finished copies in the same step. Raises :class:`EnvError` (one line)."""

    bare = check_env_id(env_id)
    spec = gymnasium.spec(bare)
    with _needs_extras(env_id):
        if spec.vector_entry_point is not None and bare == POPPLAY_CARTPOLE:
            return gymnasium.make_vec(bare, num_envs=num_envs, **kwargs)
        if num_envs == 1:
            env = gymnasium.make(bare, **kwargs)
            if isinstance(env.observation_space, gymnasium.spaces.Box):
                return SingleCopyVectorEnv(env)  # SyncVectorEnv's steps, without its N-copy bookkeeping
            env.close()
        # Other ids' own vector entry points (gymnasium's CartPole) reset on the next
        # step; the synchronous wrapper is told to reset in the same one.
        return gymnasium.make_vec(bare, num_envs=num_envs, vectorization_mode="sync",
                                  vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **kwargs)


def make_single(env_id: str, **kwargs: Any) -> Any:
    """One plain gymnasium environment of ``env_id`` (the caller resets it). Raises
    :class:`EnvError` (one line)."""
    bare = check_env_id(env_id)
    with _needs_extras(env_id):
        return gymnasium.make(bare, **kwargs)



def time_limit(env_id: str) -> int | None:
    """The steps after which ``env_id`` cuts an episode (its registered
    ``max_episode_steps``), or None where it has none."""
    limit = gymnasium.spec(check_env_id(env_id)).max_episode_steps
    return int(limit) if limit is not None else None

def describe(env: Any, env_id: str) -> EnvInfo:
    """The spaces of a vector environment made by :func:`make_vector`."""
    return _describe(env.single_observation_space, env.single_action_space, env_id)


def describe_single(env: Any, env_id: str) -> EnvInfo:
    """The spaces of an environment made by :func:`make_single`."""
    return _describe(env.observation_space, env.action_space, env_id)


def _describe(obs: Any, act: Any, env_id: str) -> EnvInfo:
    if not isinstance(obs, spaces.Box) or len(obs.shape) != 1:
        raise EnvError(f"--env {env_id}: only flat vector observations are supported (got {obs})")
    if isinstance(act, spaces.Discrete):
        return EnvInfo(env_id, int(obs.shape[0]), int(act.n), 1)
    if isinstance(act, spaces.Box) and len(act.shape) == 1:
        return EnvInfo(env_id, int(obs.shape[0]), None, int(act.shape[0]),
                       tuple(float(v) for v in np.asarray(act.low)), tuple(float(v) for v in np.asarray(act.high)))
    raise EnvError(f"--env {env_id}: unsupported action space {act}")


def require_discrete(info: EnvInfo, agent: str) -> None:
    if not info.discrete:
        raise EnvError(f"--env {info.env_id}: {agent} needs discrete actions (this environment's are continuous)")
