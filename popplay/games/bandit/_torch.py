"""Torch engine of the bandit population (private; see :mod:`popplay.games.bandit.rules`).

Every step advances all (trial, agent) pairs at once, on arm-major tensors. Where
arms are many, an agent keeps its greedy arm between scans and its own tallies for
the arms it pulled only, as the numba kernel does; where they are few (or an agent
picks among its top k), it ranks all its arms at every step. It draws the same
words and applies the same rules as the numba kernels, so on the CPU both give
bit-identical shared tables.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from popplay.games.bandit.rules import WORDS_PER_STEP, make_rules
from popplay.xp import th

_rules = make_rules(th)
_rng = _rules.rng
# Reward draws made at once, at most, by device type: 32 MiB of words on a CPU; on a
# GPU 1 GiB, so that the normal draws' retry rounds (hundreds of small launches that
# keep the GPU waiting) are paid once per 16 steps at 8.4 M agents, not at every step.
NOISE_BLOCK_DRAWS = {"cpu": 2**22, "cuda": 2**27}
# By device type, the fewest arms from which agents keep a greedy cache rather than
# rank their arms at every step. On a CPU (measured) a pass over fewer arms costs less
# than keeping the cache; on CUDA the pass was measured (docs/performance.md) and the
# cache was not, so agents there rank at every step.
CACHE_FROM_ARMS = {"cpu": 25}
# Scan slots a step gets beyond 1.25x the agents the same step of the last phase scanned.
SCAN_MARGIN = 64


class _Own(NamedTuple):
    """Every agent's own tallies in a phase, for the arms it pulled only, shaped
    (slots, trials, agents) so that a step's work on a slot runs along the agents:
    slot i holds an arm (``arms`` while unused), its pulls and integer reward sum since
    the share, and its greedy value (estimate plus bias)."""

    arm: torch.Tensor
    pulls: torch.Tensor
    rewards: torch.Tensor
    value: torch.Tensor
    used: torch.Tensor  # (trials, agents): slots in use


class _Greedy(NamedTuple):
    """Every agent's greedy cache, as the numba kernel keeps it (``rules.update_greedy``):
    an arm holding its maximum, that maximum, an upper bound on its other arms, and
    whether the leader fell below that bound (then the cache must be rebuilt)."""

    best_arm: torch.Tensor
    best: torch.Tensor
    second: torch.Tensor
    stale: torch.Tensor


class TorchBanditEngine:
    """Runs learning phases and shares for a whole population on one device."""

    def __init__(self, *, means: np.ndarray, keys: np.ndarray, static_keys: np.ndarray,
                 epsilons: np.ndarray, topk: np.ndarray, groups: np.ndarray, n_groups: int,
                 bias_scale: float, use_bias: bool, device: str, total_agents: int | None = None,
                 reduce_sums: Any = None, compile: bool = False, run_steps: int | None = None) -> None:
        self.device = torch.device(device)
        put = lambda a: torch.as_tensor(np.ascontiguousarray(a), device=self.device)  # noqa: E731
        self.means = put(means)
        self.keys = put(keys)
        self.epsilons = put(epsilons)
        self.topk = put(topk)
        self.groups = put(groups)
        self.n_groups = n_groups
        self.any_topk = bool((topk > 1).any())
        trials, agents = keys.shape
        arms = means.shape[1]
        # With the agents sharded over ranks, ``keys`` holds this rank's agents only:
        # the shared count is still split over the whole trial, and the integer pull
        # and reward sums (exact in any order) are completed by ``reduce_sums``.
        self.total_agents = agents if total_agents is None else int(total_agents)
        self.reduce_sums = reduce_sums
        self.shape = (trials, agents, arms)
        self.topk_agent = (self.topk > 1).expand(trials, agents) if self.any_topk else None
        # Top-k agents rank their arms at every step; so does everyone where arms are
        # few (CACHE_FROM_ARMS).
        self.ranks_every_step = self.any_topk or arms < CACHE_FROM_ARMS.get(self.device.type, arms + 1)
        self._step = th.compiled(self._learning_step, compile)
        self._cached = th.compiled(self._cached_step, compile)
        # Agents needing a scan at each step of the last phase (see ``_scan_slots``).
        self._scan_history: list[int] = []
        self._compile = compile
        self._room = th.Rooms(self.device)
        self._slot_numbers = torch.arange(1, arms + 1, device=self.device)[:, None, None]
        self._slot_numbers_u8 = self._slot_numbers[:255].to(torch.uint8)
        # arm numbers in slots, and the unused slots' ``arms``, in the smallest integers that hold them
        self._slot_arms = torch.arange(arms, device=self.device,
                                       dtype=torch.int16 if arms < 2**15 else torch.int64)
        # flat index of each agent's trial row in (trials, arms) tables, and of each
        # agent in (trials, agents) ones
        self._trial_cells = (torch.arange(trials, device=self.device)[:, None] * arms).expand(trials, agents)
        self._lanes = torch.arange(trials * agents, device=self.device).view(trials, agents)
        # The noise words are most of a step's arithmetic (a hash per draw, hundreds
        # of elementwise operations): compiled, they run as one fused kernel. The
        # ziggurat's retry rounds stay eager: compiled with them, the CPU build took
        # minutes, and frexp's int32 exponent breaks inductor's C++ vectoriser (torch 2.13).
        self._noise_words = th.compiled(_noise_words, compile)
        # The reward noise of a block of steps is drawn at once (it depends on the
        # keys and the step only): few, large operations instead of the retry rounds
        # at every step. A block outlives its phase (the retry rounds of a draw cost
        # about as much for 16 steps as for 512) but not the run's ``run_steps``.
        block = NOISE_BLOCK_DRAWS.get(self.device.type, NOISE_BLOCK_DRAWS["cpu"])  # other devices: the CPU's
        self.noise_block = max(1, block // (trials * agents))
        # the choice words likewise, in blocks of about a quarter of a noise block's bytes (17 bytes a step and agent)
        self.choice_block = max(1, block // 8 // (trials * agents))
        self.run_steps = run_steps
        self._noise: tuple[int, torch.Tensor, torch.Tensor] | None = None  # first step, noise, fell short
        self.bias = None
        if use_bias:
            static = put(static_keys)[:, :, None]
            counters = torch.arange(arms, dtype=torch.int64, device=self.device)
            # arm-major, (arms, trials, agents), as every table of a phase
            self.bias = _rules.arm_bias(_rng.draw(static, _rng.mix_counter(counters)),
                                        bias_scale).permute(2, 0, 1).contiguous()

    def start_run(self) -> None:
        """Forget what an earlier run left: its noise block and its scan plans. A run
        draws its own noise, as it would in a process of its own; a benchmark that
        times whole runs on one engine would otherwise time the later runs without
        their noise."""
        self._noise = None
        self._scan_history = []

    def phase(self, q: torch.Tensor, n: torch.Tensor, first_step: int,
              n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Learn ``n_steps`` steps from the shared tables ``q, n``; return the next shares.

        Every step has the same shapes and no step asks the device anything, so the
        host queues a whole phase without waiting. The one read of a phase says
        whether a reward's normal draw ran past its fixed budget of retry rounds
        (about one draw in 10^9) or more agents needed a scan than a step had slots
        for (see :meth:`_scan_slots`); then the phase is learned again with the exact,
        waiting draw and every agent's slot. Either way the tables are the same.
        """
        slots = self._scan_slots(n_steps)
        pull_sums, reward_sums, short, overflow, scans = self._learn(q, n, first_step, n_steps, False, slots)
        if bool(short | overflow):
            if bool(short):
                self._noise = None  # drawn again, exactly
            pull_sums, reward_sums, _, _, scans = self._learn(q, n, first_step, n_steps, bool(short),
                                                              [None] * n_steps)
        # Read after the wait above, when the device has finished the phase: a copy
        # of n_steps counts, not a second stall.
        self._scan_history = scans.tolist()
        if self.reduce_sums is not None:
            pull_sums, reward_sums = self.reduce_sums(pull_sums, reward_sums)
        n_new = n + pull_sums
        q_new = _rules.shared_estimate(q, n, n_new, reward_sums)
        return q_new, n_new

    def _scan_slots(self, n_steps: int) -> list[int | None]:
        """How many agents each step of the next phase may scan (None: all of them).

        An agent keeps its greedy arm, that arm's value and a bound on the others
        (``rules.update_greedy``) and scans its arms only when they tie or its leader
        fell below the bound: once the tables fill, a fraction of a percent of the
        agents a step (docs/performance.md), so a step gathers only their rows. How many there will be is not asked
        (that would stall a GPU at every step): each step gets 1.25x what the same
        step of the last phase scanned plus ``SCAN_MARGIN``, rounded up to a power of
        two (few compiled shapes); a step without such a count (the first phase, or
        a longer one), or with slots for half the agents, scans every agent."""
        agents = self.shape[0] * self.shape[1]
        slots: list[int | None] = []
        for s in range(n_steps):
            if self.ranks_every_step or s >= len(self._scan_history):
                slots.append(None)
                continue
            wanted = 1 << max(0, int(1.25 * self._scan_history[s]) + SCAN_MARGIN - 1).bit_length()
            slots.append(None if 2 * wanted > agents else wanted)
        return slots

    def _learn(self, q: torch.Tensor, n: torch.Tensor, first_step: int, n_steps: int, exact: bool,
               slots: list[int | None]) -> tuple[torch.Tensor, ...]:
        """The phase's pull and reward sums per (trial, arm), whether a bounded normal
        draw fell short (never with ``exact``) or a step had too few scan ``slots``, and
        how many agents each step scanned.

        With top-k agents or few arms (``CACHE_FROM_ARMS``) every agent ranks all its
        arms at every step (:meth:`_learning_step`); otherwise agents keep their
        greedy arm between scans and their own estimates for the arms they pulled
        only (:meth:`_cached_step`). Both pick the arm the numba kernel picks."""
        dev = self.device
        trials, agents, arms = self.shape
        n_share = n / self.total_agents
        counters = torch.arange(first_step * WORDS_PER_STEP, (first_step + n_steps) * WORDS_PER_STEP,
                                dtype=torch.int64, device=dev)
        mixed = _rng.mix_counter(counters[::WORDS_PER_STEP])[:, None, None]
        short = torch.zeros((), dtype=torch.bool, device=dev)
        overflow = torch.zeros((), dtype=torch.bool, device=dev)
        scans = []
        # each (trial, arm)'s shared value, shared count per agent and mean, one row
        trial_tables = torch.stack([q, n_share, self.means]).reshape(3, -1).T.contiguous()
        # Tables of a phase are arm-major, (arms, trials, agents): a pass over an
        # agent's arms is then an element-wise pass over slabs of agents, where a
        # reduction along a short last axis runs several times slower.
        by_arm = (arms, trials, agents)
        # Right after a share an agent's values are the trial's (plus its bias).
        shared = q.T[:, :, None] if self.bias is None else q.T[:, :, None] + self.bias
        if self.ranks_every_step:
            biased = shared.expand(by_arm).contiguous()
            pulls = torch.zeros(by_arm, dtype=torch.int64, device=dev)
            rewards = torch.zeros(by_arm, dtype=torch.int64, device=dev)
        else:
            # An agent pulls at most min(steps, arms) arms in a phase; where that is
            # every arm, slot a holds arm a and starts at the shared value.
            slots_shape = (min(n_steps, arms), trials, agents)
            direct = slots_shape[0] == arms
            own = _Own(self._slot_arms[:, None, None].expand(slots_shape).clone() if direct
                       else torch.full(slots_shape, arms, dtype=self._slot_arms.dtype, device=dev),
                       torch.zeros(slots_shape, dtype=torch.int64, device=dev),
                       torch.zeros(slots_shape, dtype=torch.int64, device=dev),
                       shared.expand(by_arm).contiguous() if direct
                       else torch.zeros(slots_shape, dtype=q.dtype, device=dev),
                       torch.zeros((trials, agents), dtype=torch.int64, device=dev))
            # contiguous, as every later step's cache is: one compiled step for both
            greedy = _Greedy(*(x.expand(trials, agents).contiguous() for x in _top2(shared)),
                             torch.zeros((trials, agents), dtype=torch.bool, device=dev))
        for s in range(n_steps):
            if s % self.choice_block == 0:
                # The choice words of a block of steps at once: the hash's dozens of
                # operations run once over (steps, trials, agents), not once a step.
                words = _rng.draw(self.keys, mixed[s:s + self.choice_block])
                u_choices = _rng.uniform_lo32(words)
                explores = _rng.uniform_hi32(words) < self.epsilons
            u_choice, explore = u_choices[s % self.choice_block], explores[s % self.choice_block]
            noise, fell_short = self._noise_at(first_step + s, first_step + n_steps, exact)
            short |= fell_short
            if self.ranks_every_step:
                biased, pulls, rewards = self._step(biased, pulls, rewards, trial_tables, u_choice, explore,
                                                    noise)
                continue
            own, greedy, scanned, fell_over = self._cached(own, greedy, q, trial_tables, u_choice, explore, noise,
                                                           None if slots[s] is None else self._room(slots[s]))
            scans.append(scanned)
            overflow |= fell_over
        if self.ranks_every_step:  # no scans to count: every agent ranks at every step
            return pulls.sum(dim=2).T, rewards.sum(dim=2).T, short, overflow, torch.zeros(0, dtype=torch.int64)
        # Unused slots hold no pulls, so they may add their zeros to any arm.
        cells = (self._trial_cells + own.arm.clamp(max=arms - 1).to(torch.int64)).reshape(-1)
        sums = [torch.zeros(trials * arms, dtype=torch.int64, device=dev).index_add_(0, cells, x.reshape(-1))
                .view(trials, arms) for x in (own.pulls, own.rewards)]
        return sums[0], sums[1], short, overflow, torch.stack(scans)

    def _noise_at(self, step: int, phase_end: int, exact: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Every agent's reward noise at ``step``, from the block that holds it (drawn
        here if none does), and whether that block's bounded draw fell short (a phase
        that drew a short block is learned again with ``exact``, which draws anew)."""
        held = self._noise
        if held is None or not held[0] <= step < held[0] + len(held[1]):
            end = max(phase_end, self.run_steps or 0)
            first = step * WORDS_PER_STEP + 1
            counters = torch.arange(first, first + WORDS_PER_STEP * min(self.noise_block, end - step),
                                    WORDS_PER_STEP, dtype=torch.int64, device=self.device)[:, None, None]
            words = self._noise_words(self.keys, counters)
            draw = _exact_reward_noise if exact else _bounded_reward_noise
            held = self._noise = (step, *draw(self.keys, counters, words))
        return held[1][step - held[0]], held[2]

    def _cached_step(self, own: "_Own", greedy: "_Greedy", q: torch.Tensor, trial_tables: torch.Tensor,
                     u_choice: torch.Tensor, explore: torch.Tensor, noise: torch.Tensor,
                     room: torch.Tensor | None) -> tuple[Any, ...]:
        """One step of every agent that keeps a greedy cache (:class:`_Greedy`) and its
        own estimates of the arms it pulled (:class:`_Own`). An agent scans all its
        arms only when the cache is stale, or when it acts greedily and its arms may
        tie; at most ``room``'s length of agents (None: all) scan. Returns the new
        estimates and cache, how many agents wanted a scan and whether that was more
        than the room."""
        arms = self.shape[2]
        best_arm, best, second, stale = greedy
        scan = stale | (~explore & ~(best > second))
        wanted = scan.sum()
        # A scan rebuilds a cache exactly, which is as good as the cache it replaces,
        # and where the agent needed none its pick is its one leader (or it explores):
        # so the scans' results are written without asking which agents wanted them.
        if room is None:
            best_arm, best, second, greedy_arm = (x.view(scan.shape) for x in _top2_pick(
                self._agent_values(q, own, None), u_choice.reshape(-1)))
            fell_over = torch.zeros((), dtype=torch.bool, device=scan.device)
        else:
            # The slots past the last scanning agent hold lane 0: agent 0 is scanned
            # again, which is harmless by the above.
            lanes, _, fell_over = th.compact(scan, room.shape[0])
            new_arm, new_best, new_second, pick = _top2_pick(self._agent_values(q, own, lanes),
                                                             th.flat_take(u_choice, lanes))
            best_arm, best, second = (_put_lanes(old, lanes, new) for old, new in
                                      ((best_arm, new_arm), (best, new_best), (second, new_second)))
            greedy_arm = _put_lanes(best_arm, lanes, pick)
        arm = torch.where(explore, _rules.explore_arm(u_choice, self.groups, self.n_groups, arms), greedy_arm)
        # The arm's slot: where the agent pulled it before in this phase, else its next free one.
        width = own.arm.shape[0]
        if width == arms:
            slot, seen = arm[None], None
        else:
            # slot number + 1 where the agent pulled the arm before (slots hold distinct
            # arms), else 0: a maximum over the slots, where an argmax over them is
            # slow, in the smallest integers that hold it
            match = own.arm == arm.to(own.arm.dtype)
            if width < 256:
                found = (match.view(torch.uint8) * self._slot_numbers_u8[:width]).amax(dim=0)
            else:
                found = torch.where(match, self._slot_numbers[:width], 0).amax(dim=0)
            seen = found > 0
            slot = torch.where(seen, found.to(torch.int64) - 1, own.used)[None]
        shared_q, shared_n, mean = trial_tables.index_select(0, (self._trial_cells + arm).reshape(-1)).T
        reward = _rules.reward_fixed(mean.view(arm.shape), noise)[None]
        pulls_at = own.pulls.gather(0, slot) + 1
        rewards_at = own.rewards.gather(0, slot) + reward
        value = _rules.estimate(shared_q.view(slot.shape), shared_n.view(slot.shape), pulls_at, rewards_at)
        if self.bias is not None:
            value = value + self.bias.gather(0, arm[None])
        columns = self._slot_rows(own.arm.shape[0])
        slot_arm = own.arm if seen is None else th.put_along(own.arm, slot, arm[None].to(own.arm.dtype), columns,
                                                             dim=0)
        own = _Own(slot_arm,
                   th.put_along(own.pulls, slot, pulls_at, columns, dim=0),
                   th.put_along(own.rewards, slot, rewards_at, columns, dim=0),
                   th.put_along(own.value, slot, value, columns, dim=0),
                   own.used if seen is None else own.used + (~seen).to(torch.int64))
        return own, _Greedy(*_rules.update_greedy(arm, value[0], best_arm, best, second)), wanted, fell_over

    def _agent_values(self, q: torch.Tensor, own: "_Own", lanes: torch.Tensor | None) -> torch.Tensor:
        """The greedy value of every arm of the agents at flat ``lanes`` (None: every
        agent), one column each, (arms, agents): the trial's shared value plus the
        agent's bias, or its own estimate where it pulled the arm in this phase."""
        trials, agents, arms = self.shape
        width = own.arm.shape[0]
        arm, value = own.arm.reshape(width, -1), own.value.reshape(width, -1)
        if width == arms:  # slot a holds arm a, from the shared value on
            return value if lanes is None else value[:, lanes]
        if lanes is None:
            columns, shared, bias = (trials, agents), q.T[:, :, None], self.bias
        else:
            columns, shared = lanes.shape, q.T[:, lanes // agents]
            bias = None if self.bias is None else self.bias.reshape(arms, -1)[:, lanes]
            arm, value = arm[:, lanes], value[:, lanes]
        # filled in place (the shared rows broadcast once); a spare row takes the
        # writes of unused slots (arm index ``arms``)
        values = value.new_empty(arms + 1, *columns)
        if bias is None:
            values[:arms] = shared
        else:
            torch.add(shared, bias, out=values[:arms])
        return values.view(arms + 1, -1).scatter_(0, arm.to(torch.int64), value)[:arms]

    def _slot_rows(self, width: int) -> torch.Tensor | None:
        """The slot numbers, shaped for ``th.put_along``'s one-hot writes along the first axis,
        in a compiled step."""
        return torch.arange(width, device=self.device)[:, None, None] if self._compile else None

    def _learning_step(self, biased: torch.Tensor, pulls: torch.Tensor, rewards: torch.Tensor,
                       trial_tables: torch.Tensor, u_choice: torch.Tensor, explore: torch.Tensor,
                       noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of every agent: choose arms, draw rewards; returns the next
        ``biased`` (greedy values, bias included), ``pulls`` and ``rewards``."""
        arms = self.shape[2]
        arm = _random_argmax(biased, u_choice)
        if self.topk_agent is not None:
            order = torch.sort(biased, dim=0, descending=True, stable=True).indices
            rank = torch.floor(u_choice * self.topk).to(torch.int64)
            arm = torch.where(self.topk_agent, order.gather(0, rank[None])[0], arm)
        arm = torch.where(explore, _rules.explore_arm(u_choice, self.groups, self.n_groups, arms), arm)
        shared_q, shared_n, mean = trial_tables.index_select(0, (self._trial_cells + arm).reshape(-1)).T
        reward = _rules.reward_fixed(mean.view(arm.shape), noise)
        cell = arm * self._lanes.numel() + self._lanes
        pulls_at = pulls.take(cell) + 1
        rewards_at = rewards.take(cell) + reward
        new_value = _rules.estimate(shared_q.view(arm.shape), shared_n.view(arm.shape), pulls_at, rewards_at)
        if self.bias is not None:
            new_value = new_value + self.bias.take(cell)
        rows = self._slot_rows(arms)
        index = arm[None]
        return (th.put_along(biased, index, new_value[None], rows, dim=0),
                th.put_along(pulls, index, pulls_at[None], rows, dim=0),
                th.put_along(rewards, index, rewards_at[None], rows, dim=0))


def _noise_words(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """The random words of every agent's reward noise at each of ``counters`` (shaped
    (steps, 1, 1))."""
    return _rng.draw(keys, _rng.mix_counter(counters))


def _exact_reward_noise(keys: torch.Tensor, counters: torch.Tensor,
                        words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reward noise from its :func:`_noise_words`, with as many retry rounds as each
    draw needs (the host waits for them)."""
    return _rng.normal(keys, counters, words), torch.zeros((), dtype=torch.bool, device=keys.device)


def _bounded_reward_noise(keys: torch.Tensor, counters: torch.Tensor,
                          words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_exact_reward_noise` with a fixed budget of retry slots and rounds: the
    normals and whether a draw fell short of that budget (then redone exactly)."""
    draws = words.numel()
    # slots for the draws that need retry rounds: about 1.5 %, plus eight binomial
    # standard deviations and a floor
    expected = 0.015 * draws
    return _rng.normal_bounded(keys, counters, words, min(draws, int(expected + 8 * expected ** 0.5 + 16)))


def _put_lanes(x: torch.Tensor, lanes: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` with ``values`` at its flat ``lanes`` (repeated lanes get equal values)."""
    return x.reshape(-1).scatter(0, lanes, values.to(x.dtype)).view(x.shape)


# From this many arms on, a pass that counts tied arms runs along each agent's row
# (a copy to row-major first): a running count down the arm axis of arm-major
# tables ran 5-25x slower than along rows at 100-1000 arms (and faster at 10).
ROW_MAJOR_COUNT_ARMS = 32


class _TieCount(NamedTuple):
    """The running count of the arms tied at an agent's maximum: down the arm axis,
    (arms, agents), or along each agent's row, (agents, arms)."""

    running: torch.Tensor
    along_rows: bool

    def total(self) -> torch.Tensor:
        """How many arms tie at the maximum."""
        return self.running[:, -1] if self.along_rows else self.running[-1]

    def nth(self, rank: torch.Tensor) -> torch.Tensor:
        """The index of the rank-th (from 0, in index order) tied arm: along rows the
        first slot whose count passes ``rank`` (a binary search), else the number of
        arms whose count is at most ``rank``."""
        rank = rank.to(self.running.dtype)
        if self.along_rows:
            return torch.searchsorted(self.running, (rank + 1)[:, None])[:, 0]
        return (self.running <= rank).sum(dim=0, dtype=self.running.dtype).to(torch.int64)


def _ties(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, _TieCount]:
    """For agents with ``values`` shaped (arms, agents): the maximum, which arms hold
    it, and their running count, in 16-bit integers where they fit (converting a mask
    to int64 for the count cost more than the rest of a greedy pass)."""
    top = values.amax(dim=0)
    ties = values == top
    dtype = torch.int16 if values.shape[0] < 2**15 else torch.int64
    if values.shape[0] >= ROW_MAJOR_COUNT_ARMS:
        return top, ties, _TieCount(ties.T.contiguous().view(torch.uint8).cumsum(dim=1, dtype=dtype), True)
    return top, ties, _TieCount(ties.view(torch.uint8).cumsum(dim=0, dtype=dtype), False)


def _random_argmax(values: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per agent (values shaped (arms, ...)), the floor(u * c)-th (in index order) of
    the c arms holding the maximum."""
    count = _ties(values.reshape(values.shape[0], -1))[2]
    return count.nth(torch.floor(u.reshape(-1) * count.total())).view(u.shape)


def _top2(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per agent (values shaped (arms, ...)) the first arm holding the maximum, the
    maximum and the largest value of the other arms (the maximum again where it ties),
    as the numba kernel's cache."""
    shape = values.shape[1:]
    first, top, second, _ = _top2_pick(values.reshape(values.shape[0], -1).clone(), None)
    return first.view(shape), top.view(shape), second.view(shape)


def _top2_pick(values: torch.Tensor, u: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """:func:`_top2` of agents with ``values`` shaped (arms, agents), which it changes
    and restores, and (unless ``u`` is None) their :func:`_random_argmax`."""
    top, ties, count = _ties(values)
    first = count.nth(torch.zeros_like(top))
    # The others' maximum: the first maximum hidden for one pass (a select over the
    # whole table ran 8x slower at 1000 arms), then put back.
    values.scatter_(0, first[None], -torch.inf)
    second = values.amax(dim=0)
    values.scatter_(0, first[None], top[None])
    pick = None if u is None else count.nth(torch.floor(u * count.total()))
    return first, top, second, pick
