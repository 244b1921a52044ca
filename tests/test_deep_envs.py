"""popplay's environments: our cart-pole against gymnasium's, vector envs, one-line errors."""
from __future__ import annotations

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")

from popplay.deep import envs  # noqa: E402


def test_popplay_cartpole_follows_gymnasium_step_by_step() -> None:
    envs.register()
    ours = gymnasium.make(envs.POPPLAY_CARTPOLE)
    theirs = gymnasium.make("CartPole-v1")
    rng = np.random.default_rng(5)
    steps = 0
    for episode in range(6):
        a, _ = ours.reset(seed=100 + episode)
        b, _ = theirs.reset(seed=100 + episode)
        assert np.array_equal(a, b)  # same start draws from the same np_random
        done = False
        while not done:
            action = int(rng.integers(2)) if episode % 2 else int(steps % 7 < 4)
            a, ra, ta, tra, _ = ours.step(action)
            b, rb, tb, trb, _ = theirs.step(action)
            steps += 1
            # Our sin/cos and operation order differ from NumPy's in the last bits only.
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
            assert (ra, ta, tra) == (rb, tb, trb)
            done = ta or tra
    assert steps > 60


def test_popplay_cartpole_reaches_the_time_limit() -> None:
    envs.register()
    env = gymnasium.make(envs.POPPLAY_CARTPOLE)
    env.reset(seed=0)
    # A hand policy that balances: push towards the side the pole falls to.
    obs, _ = env.reset(seed=1)
    total, truncated, terminated = 0, False, False
    while not (terminated or truncated):
        action = int(obs[2] + 0.5 * obs[3] > 0)
        obs, reward, terminated, truncated, _ = env.step(action)
        total += reward
    assert truncated and not terminated and total == 500


def test_vector_env_matches_single_envs_and_resets_in_the_same_step() -> None:
    vec = envs.make_vector(envs.POPPLAY_CARTPOLE, 3)
    assert type(vec).__name__ == "CartPoleVectorEnv"
    obs, _ = vec.reset(seed=3)
    single = [gymnasium.make("CartPole-v1").unwrapped for _ in range(3)]
    for i, env in enumerate(single):
        env.reset(seed=0)
        env.state = obs[i].astype(np.float64)
    saw_reset = False
    for t in range(40):
        actions = np.array([(t + i) % 2 for i in range(3)], dtype=np.int64)
        if t > 25:
            actions[:] = 1  # make every copy fail
        obs, reward, terminated, truncated, info = vec.step(actions)
        for i, env in enumerate(single):
            if env.state is None:
                continue
            b, _, tb, _, _ = env.step(int(actions[i]))
            assert bool(terminated[i]) == tb
            if tb:
                # The copy restarted: its last observation is in final_obs, obs is a new start.
                np.testing.assert_allclose(info["final_obs"][i], b, rtol=1e-5, atol=1e-6)
                assert np.all(np.abs(obs[i]) <= 0.05)
                env.state = None
                saw_reset = True
            else:
                np.testing.assert_allclose(obs[i], b, rtol=1e-5, atol=1e-6)
    assert saw_reset


def test_gymnasium_ids_become_same_step_vector_envs() -> None:
    vec = envs.make_vector("CartPole-v1", 2)
    info = envs.describe(vec, "CartPole-v1")
    assert (info.obs_dim, info.actions) == (4, 2)
    assert vec.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.SAME_STEP
    pend = envs.describe(envs.make_vector("Pendulum-v1", 1), "Pendulum-v1")
    assert pend.actions is None and pend.action_dim == 1 and pend.action_high == (2.0,)
    with pytest.raises(envs.EnvError, match="discrete"):
        envs.require_discrete(pend, "dqn")


@pytest.mark.parametrize("env_id, steps", [("CartPole-v1", 700), ("Pendulum-v1", 450)])
def test_one_copy_steps_exactly_as_gymnasiums_sync_vector_env(env_id: str, steps: int) -> None:
    """make_vector's one-copy class against gymnasium's SyncVectorEnv: the same
    observations, rewards, flags and final observations bit for bit, through episodes
    ended by failure (CartPole) and by the time limit (Pendulum's 200 steps)."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from popplay.deep.envs.single import SingleCopyVectorEnv

    ours = envs.make_vector(env_id, 1)
    assert isinstance(ours, SingleCopyVectorEnv)
    theirs = SyncVectorEnv([lambda: gymnasium.make(env_id)], autoreset_mode=AutoresetMode.SAME_STEP)
    assert ours.observation_space == theirs.observation_space and ours.action_space == theirs.action_space
    a, info_a = ours.reset(seed=[11])
    b, info_b = theirs.reset(seed=11)
    assert np.array_equal(a, b) and a.dtype == b.dtype and a.shape == (1, *ours.single_observation_space.shape)
    rng = np.random.default_rng(0)
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(steps):
        action = ours.action_space.sample() if env_id != "CartPole-v1" else rng.integers(2, size=1)
        a, ra, ta, tra, info_a = ours.step(action)
        b, rb, tb, trb, info_b = theirs.step(action)
        assert np.array_equal(a, b) and np.array_equal(ra, rb) and ra.dtype == rb.dtype
        assert np.array_equal(ta, tb) and np.array_equal(tra, trb)
        assert sorted(info_a) == sorted(info_b)
        if ta[0] or tra[0]:
            assert np.array_equal(info_a["final_obs"][0], info_b["final_obs"][0]) and info_a["_final_obs"][0]
            ends["terminated" if ta[0] else "truncated"] += 1
    assert ends["terminated" if env_id == "CartPole-v1" else "truncated"] >= 2
    ours.close()
    assert ours.closed


def test_bad_env_id_is_one_line() -> None:
    with pytest.raises(envs.EnvError) as caught:
        envs.make_vector("CartPol-v1")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("--env CartPol-v1") and "CartPole" in message


def test_missing_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*args: object, **kwargs: object) -> None:
        raise gymnasium.error.DependencyNotInstalled("Box2D is not installed, run `pip install swig`\nand more")

    monkeypatch.setattr(gymnasium, "make_vec", missing)
    monkeypatch.setattr(gymnasium, "make", missing)  # one copy is made with gymnasium.make
    for copies in (1, 2):
        with pytest.raises(envs.EnvError) as caught:
            envs.make_vector("LunarLander-v3", copies)
        assert str(caught.value) == ("--env LunarLander-v3 needs an extra that is not installed: "
                                     "pip install 'popplay[box2d]'")


def test_lunar_lander_without_box2d_names_the_extra() -> None:
    try:
        import Box2D  # noqa: F401
    except ImportError:
        with pytest.raises(envs.EnvError, match=r"pip install 'popplay\[box2d\]'"):
            envs.make_vector("LunarLander-v3")
    else:
        assert envs.describe(envs.make_vector("LunarLander-v3"), "LunarLander-v3").actions == 4


CORRIDOR = '''
import gymnasium
import numpy as np
from gymnasium import spaces


class Corridor(gymnasium.Env):
    """Walk right to the end of a 5-cell corridor: -1 a step, done at the end."""

    observation_space = spaces.Box(0.0, 4.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.cell = max(0, self.cell + (1 if action == 1 else -1))
        return np.array([self.cell], np.float32), -1.0, self.cell == 4, False, {}


gymnasium.register("Corridor-v0", entry_point=Corridor, max_episode_steps=50)
'''


def test_gymnasium_module_syntax_names_a_users_environment(tmp_path, monkeypatch, capsys):
    """``--env my_module:Corridor-v0`` imports the module that registers it, as gymnasium.make does."""
    import json

    from popplay.cli.main import main

    (tmp_path / "corridor_env.py").write_text(CORRIDOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "c.h5"
    assert main(["train", "ppo", "--env", "corridor_env:Corridor-v0", "--env-steps", "128", "--copies", "2",
                 "--n-steps", "16", "--n-epochs", "1", "--hidden", "4", "--eval-episodes", "1", "--out", str(out),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["env"] == "corridor_env:Corridor-v0" and summary["quality"] <= -4
    assert main(["evaluate", str(out), "--episodes", "1", "--json"]) == 0
    capsys.readouterr()
    assert main(["train", "ppo", "--env", "no_such_module_here:Corridor-v0", "--env-steps", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["Error: --env no_such_module_here:Corridor-v0: cannot import no_such_module_here "
                   "(ModuleNotFoundError: No module named 'no_such_module_here')"]


def test_the_install_hint_survives_a_module_prefix():
    assert envs.install_hint("LunarLander-v3") == "pip install 'popplay[box2d]'"
    assert envs.install_hint("my_pkg.envs:LunarLander-v3") == "pip install 'popplay[box2d]'"
    assert envs.install_hint("my_pkg.envs:Corridor-v0") is None


def test_member_envs_step_popplay_cartpole_in_one_batch_as_the_single_environments_would(monkeypatch) -> None:
    """popplay/CartPole-v1 offers ``batched``: a population's environments become one
    array stepped by one numba loop. Everything a member sees (observations, rewards,
    ends, time-limit cuts, resets from its episode seeds) and the run-file replay are
    what the per-copy gymnasium objects give."""
    from popplay.deep.envs.cartpole import CartPoleEnv
    from popplay.deep.envs.members import MemberEnvs, episode_seed

    members = np.array([0, 3, 5])
    actions = np.random.default_rng(1).integers(0, 2, size=(1400, 6))
    actions[:, 1] = 0  # copy 1 fails fast and often

    def trace() -> tuple[list, dict]:
        member_envs = MemberEnvs(envs.POPPLAY_CARTPOLE, 9, members, copies=2)
        seen = []
        for row in actions:
            obs = member_envs.obs[4]
            row[4] = int(obs[2] + 0.5 * obs[3] > 0)  # copy 4 balances (PD on the pole) until the 500-step cut
            step = member_envs.step(row)
            seen.append((step.obs.tobytes(), step.reward.tobytes(), step.successor.tobytes(),
                         step.terminated.tolist(), step.truncated.tolist(), step.ended.tolist(),
                         step.returns.tolist()))
        return seen, member_envs.arrays()

    batched = MemberEnvs(envs.POPPLAY_CARTPOLE, 9, members, copies=2)
    assert batched.batch is not None and len(batched.envs) == 1
    single = CartPoleEnv()  # member 3's copy 1 (row 3) starts its episode 0 from its episode seed
    np.testing.assert_array_equal(batched.obs[3], single.reset(seed=episode_seed(9, 3, 1, 0))[0])
    fast, stored = trace()
    monkeypatch.delattr(CartPoleEnv, "batched")
    plain = MemberEnvs(envs.POPPLAY_CARTPOLE, 9, members, copies=2)
    assert plain.batch is None and len(plain.envs) == 6
    slow, stored_slow = trace()
    assert fast == slow
    assert any(truncated for row in fast for truncated in row[4])  # the time limit was met
    for name, value in stored.items():
        np.testing.assert_array_equal(value, stored_slow[name])
    monkeypatch.undo()
    resumed = MemberEnvs(envs.POPPLAY_CARTPOLE, 9, members, copies=2)
    resumed.load(stored)  # replays each copy's episode through the batch
    np.testing.assert_array_equal(resumed.obs, stored["env.obs"])


def test_numba_seeded_starts_are_numpys_draws_bit_for_bit() -> None:
    """A batch reset draws each start in numba; it must be gymnasium's
    ``seeding.np_random(seed)[0].uniform(...)`` for every 32-bit seed (edges included),
    and a seed outside 32 bits is refused in one line."""
    from gymnasium.utils import seeding

    from popplay.deep.envs._numpy_streams import seeded_uniforms
    from popplay.deep.envs.cartpole import CartPoleBatch

    seeds = np.concatenate([[0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF],
                            np.random.default_rng(3).integers(0, 1 << 32, 2000)]).astype(np.int64)
    got = np.empty((len(seeds), 6))
    seeded_uniforms(seeds, -0.25, 0.75, got)
    expected = np.array([seeding.np_random(int(s))[0].uniform(-0.25, 0.75, size=6) for s in seeds])
    np.testing.assert_array_equal(got.view(np.int64), expected.view(np.int64))

    batch = CartPoleBatch(4, 500)
    first = batch.reset(np.array([2, 0]), np.array([7, 0xFFFFFFFF]))
    np.testing.assert_array_equal(first[0], seeding.np_random(7)[0].uniform(-0.05, 0.05, size=4).astype(np.float32))
    np.testing.assert_array_equal(batch.state[2], seeding.np_random(7)[0].uniform(-0.05, 0.05, size=4))
    assert batch.steps.tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"one seed in \[0, 2\^32\) per row"):
        batch.reset(np.array([1]), np.array([1 << 32]))



def test_episode_seeds_of_many_copies_are_each_copys_episode_seed() -> None:
    """A population derives the seeds of the copies it resets in one numba call; each
    must be :func:`episode_seed` of its copy and episode, keys at the int64 edges too."""
    from popplay import rng
    from popplay.deep.envs.members import copy_key, episode_seed, episode_seeds

    draws = np.random.default_rng(5)
    members, copies = draws.integers(0, 1 << 20, 500), draws.integers(0, 4, 500)
    episodes = np.concatenate([np.arange(10), draws.integers(0, 1 << 40, 490)])
    keys = np.array([rng.signed64(copy_key(11, int(m), int(c))) for m, c in zip(members, copies)])
    expected = [episode_seed(11, int(m), int(c), int(e)) for m, c, e in zip(members, copies, episodes)]
    assert episode_seeds(keys, episodes).tolist() == expected
    edges = np.array([(1 << 63) - 1, -(1 << 63), -1, 0])
    assert episode_seeds(edges, np.full(4, 3)).tolist() == \
        [rng.key_extend(int(k) & ((1 << 64) - 1), 3) & 0xFFFFFFFF for k in edges]
    with pytest.raises(ValueError, match="one episode index per key"):
        episode_seeds(keys[:3], episodes[:2])


def test_a_cartpole_batch_ends_episodes_as_its_time_limit_says_and_refuses_bad_input_untouched() -> None:
    """The batch's one-loop step: a copy that fails at its last allowed step is
    terminated, not truncated; one that survives it is truncated; no limit never
    truncates. A bad action, a wrong count, a row outside the batch or a seed outside
    32 bits is refused in one line, and nothing moves."""
    from popplay.deep.envs.cartpole import CartPoleBatch

    batch = CartPoleBatch(3, 5)
    batch.reset(np.arange(3), np.array([1, 2, 3]))
    batch.state[0, 2:] = 0.2094, 1.0  # about to pass 12 degrees
    batch.steps[:] = [4, 4, 3]
    successors, reward, failed, truncated = batch.step(np.array([1, 1, 1]))
    assert failed.tolist() == [True, False, False] and truncated.tolist() == [False, True, False]
    assert batch.steps.tolist() == [5, 5, 4] and reward.tolist() == [1.0, 1.0, 1.0]
    np.testing.assert_array_equal(successors, batch.state.astype(np.float32))
    unlimited = CartPoleBatch(2, None)
    unlimited.reset(np.arange(2), np.array([4, 5]))
    unlimited.steps[:] = 10**6
    assert unlimited.step(np.array([0, 1]))[3].tolist() == [False, False]

    before, steps = batch.state.copy(), batch.steps.copy()
    for actions, message in ((np.array([0, 2, 1]), "actions must be 0 or 1"),
                             (np.array([0, 1]), r"one action per copy expected \(3, got 2\)")):
        with pytest.raises(ValueError, match=message):
            batch.step(actions)
    for rows, seeds in (([3], [7]), ([-1], [7]), ([0, 1], [7, 1 << 32]), ([0, 1], [-1, 7]), ([0], [1, 2])):
        with pytest.raises(ValueError, match=r"one seed in \[0, 2\^32\) per row in \[0, 3\)"):
            batch.reset(np.array(rows), np.array(seeds))
    np.testing.assert_array_equal(batch.state, before)
    np.testing.assert_array_equal(batch.steps, steps)


@pytest.mark.parametrize("trim_every", [1, 3, 256])
def test_member_envs_keep_each_current_episodes_actions_through_trims_and_resumes(
        monkeypatch: pytest.MonkeyPatch, trim_every: int) -> None:
    """The run file holds each environment's actions in its current episode. They are
    kept as one log of the steps, cut back as episodes end; against a plain list per
    environment, the stored actions match at every check, also after a resume
    continues the same steps."""
    from popplay.deep.envs import members as member_envs

    monkeypatch.setattr(member_envs, "_TRIM_EVERY", trim_every)
    live = member_envs.MemberEnvs(envs.POPPLAY_CARTPOLE, 4, np.arange(3), copies=2)
    draws = np.random.default_rng(2)
    current: list[list[int]] = [[] for _ in range(6)]

    def check(run: member_envs.MemberEnvs) -> None:
        stored = run.arrays()
        assert stored["env.action_counts"].tolist() == [len(c) for c in current]
        assert stored["env.actions"].tolist() == [a for c in current for a in c]
        assert stored["env.actions"].dtype == np.int64

    resumed = None
    for t in range(600):
        # mostly pushing back towards upright, so some episodes outlast several cuts
        lean = live.obs[:, 2] + 0.5 * live.obs[:, 3]
        actions = np.where(draws.random(6) < 0.8, (lean > 0).astype(np.int64), draws.integers(0, 2, 6))
        steps = [run.step(actions) for run in (live, resumed) if run is not None]
        for i in range(6):
            current[i].append(int(actions[i]))
        for i in steps[0].ended.tolist():
            current[i] = []
        for step in steps[1:]:
            assert step.ended.tolist() == steps[0].ended.tolist()
            np.testing.assert_array_equal(step.successor, steps[0].successor)
        if t % 50 == 7:
            check(live)
        if t == 250:
            assert max(len(c) for c in current) > 3 * trim_every or trim_every == 256
            resumed = member_envs.MemberEnvs(envs.POPPLAY_CARTPOLE, 4, np.arange(3), copies=2)
            resumed.load(live.arrays())
        if resumed is not None and t % 50 == 9:
            check(resumed)
    assert max(len(c) for c in current) > 1
    if trim_every < 256:  # cut back at episode ends: the log spans about the oldest current episode
        for run in (live, resumed):
            assert run is not None and len(run._taken) <= max(len(c) for c in current) + trim_every
