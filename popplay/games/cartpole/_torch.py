"""Torch engine of the cart-pole population (private; see :mod:`popplay.games.cartpole.rules`).

Every step advances all (trial, agent) lanes at once and touches a lane's numbers only
where the rule reads or writes them: the two state-actions of the next box and the one
just left, found by index in one table that keeps a state-action's five numbers (q, w,
ê, C_start, D_start) side by side, a lane's 72 state-actions in a row. The passes over
a whole row that failures, Watkins' cuts, clock restarts and dying traces call for (see
"Traces" in the rules) run only on the lanes that need one that step, packed into the
slots planned for that step (from what it needed in the last two phases) without asking
the device how many there are; a lane keeps a
lower bound on its smallest live ê (all its traces share the clock, so the smallest
dies first) to know when a trace may die. A phase in which some step needed more passes
than there were slots (each try's one question to the device says so) is learned again
with more, so results never depend on the slot count. The values follow the same rules
in the same order as the numba kernels, which skip the same untouched state-actions, so
on the CPU both give bit-identical populations.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from popplay.games.cartpole.rules import RENORMALIZE_BELOW, STATE_ACTIONS, WORDS_PER_STEP, make_rules
from popplay.xp import th

_rules = make_rules(th)
_rng = _rules.rng

FIELDS = 5  # per state-action: q, w, ê, C at its last visit, D at its last visit
_Q, _W, _E, _C, _D = range(FIELDS)
SLOT_MARGIN = 16  # slots beyond 1.25x what the same step of the last two phases needed
FIRST_PHASE_SHARE = 16  # before any phase was seen, room for one lane in 16 (a first phase needed 1 in 16)


class _Step(NamedTuple):
    """What one step carries to the next (lanes along the first axis)."""

    # ((lanes + 1) * 72, 5): each lane's 72 state-actions, then the dummy lane's, where
    # spare slots read and write; never a view (compiled, a write through one copies it)
    table: torch.Tensor
    least_trace: torch.Tensor  # (lanes + 1,): at most the smallest live ê of the lane (inf: none)
    clock: torch.Tensor
    clock_sum: torch.Tensor
    d_sum: torch.Tensor
    x: torch.Tensor
    x_dot: torch.Tensor
    theta: torch.Tensor
    theta_dot: torch.Tensor
    s: torch.Tensor
    a: torch.Tensor
    failures: torch.Tensor
    count: torch.Tensor  # 0-d: how many lanes needed a pass in the last step
    overflow: torch.Tensor  # 0-d bool: some step needed more passes than there were slots


class TorchCartPoleEngine:
    """Runs learning phases for a whole population on one device."""

    def __init__(self, *, keys: np.ndarray, phys: np.ndarray, bounds: np.ndarray, gamma: float,
                 failure_reward: float, cutoff: float, start_range: float, accumulate: bool, watkins: bool,
                 device: str, compile: bool = False) -> None:
        self.device = torch.device(device)
        # one stream per lane, in the lanes' order (the tables' rows)
        self.keys = torch.as_tensor(np.ascontiguousarray(keys), device=self.device).reshape(-1)
        self.phys = tuple(float(v) for v in phys)
        self.bounds = tuple(float(v) for v in bounds)
        self.gamma = float(gamma)
        self.failure_reward = float(failure_reward)
        self.cutoff = float(cutoff)
        self.start_range = float(start_range)
        self.accumulate = bool(accumulate)
        self.watkins = bool(watkins)
        self._step = th.compiled(self._learning_step, compile)
        # Passes a phase's step k needed, in the last two phases: the same steps of
        # different phases need about as many (measured), and a step's slots are planned
        # from them.
        self._needs: list[list[int]] = []
        self._room = th.Rooms(self.device)

    def start_run(self) -> None:
        """Forget an earlier run's slot plans: a run plans its first phases as it would
        in a process of its own."""
        self._needs = []

    def tensor(self, array: Any) -> torch.Tensor:
        return torch.as_tensor(array, device=self.device)

    def _mixed(self, first_step: int, n_steps: int) -> torch.Tensor:
        """mix_counter of every word of steps first_step .. first_step + n_steps - 1,
        computed once per phase on the device (no host-to-device copy per step)."""
        counters = torch.arange(first_step * WORDS_PER_STEP, (first_step + n_steps) * WORDS_PER_STEP,
                                dtype=torch.int64, device=self.device)
        return _rng.mix_counter(counters)

    def phase(self, q: torch.Tensor, e: torch.Tensor, w: torch.Tensor, cart: torch.Tensor, action: torch.Tensor,
              alpha: torch.Tensor, lam: torch.Tensor, epsilon: torch.Tensor, first_step: int,
              n_steps: int) -> tuple[torch.Tensor, ...]:
        """``n_steps`` steps of every agent with its own α, λ, ε (each shaped like
        ``action``); returns (q, e, w, cart, action, failures). The inputs are left as
        they are."""
        lanes = action.numel()
        plan = self.plan(n_steps, lanes)
        while True:
            result, counts, overflow = self._run(q, e, w, cart, action, alpha, lam, epsilon, first_step, n_steps,
                                                 plan)
            *counts, overflow = torch.stack(counts + [overflow.to(torch.int64)]).tolist()  # the try's one wait
            if not overflow:
                break
            # Learned again from the same inputs: results never depend on the slot count.
            plan = [min(max(2 * slots, _slots_for(count)), lanes) for slots, count in zip(plan, counts)]
        self._needs = (self._needs + [counts])[-2:]
        return result

    def plan(self, n_steps: int, lanes: int) -> list[int]:
        """Slots for each step of the next phase: room for 1.25x the passes that step
        needed in the last two phases (their busiest step where they were shorter; one
        lane in 16 before any phase), a power of two, at most a slot per lane."""
        if not self._needs:
            return [min(_slots_for(lanes / FIRST_PHASE_SHARE), lanes)] * n_steps
        busiest = max(max(counts, default=0) for counts in self._needs)
        return [min(_slots_for(max(counts[k] if k < len(counts) else busiest for counts in self._needs)), lanes)
                for k in range(n_steps)]

    def _run(self, q: torch.Tensor, e: torch.Tensor, w: torch.Tensor, cart: torch.Tensor, action: torch.Tensor,
             alpha: torch.Tensor, lam: torch.Tensor, epsilon: torch.Tensor, first_step: int, n_steps: int,
             plan: list[int]) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor], torch.Tensor]:
        shape = action.shape
        lanes = action.numel()
        f64 = dict(dtype=torch.float64, device=self.device)
        # A new clock starts every phase: ê = e, C_start = D_start = 0.
        table = torch.zeros(lanes + 1, STATE_ACTIONS, FIELDS, **f64)
        for field, values in ((_Q, q), (_W, w), (_E, e)):
            table[:lanes, :, field] = values.reshape(lanes, STATE_ACTIONS)
        least = _least_live(table[:, :, _E])
        table = table.view(-1, FIELDS)
        x, x_dot, theta, theta_dot = (cart.reshape(lanes, 4)[:, i].clone() for i in range(4))
        a = action.reshape(lanes).clone()
        s = _rules.box(x, x_dot, theta, theta_dot, self.bounds)
        flat = lambda v: v.reshape(lanes)  # noqa: E731
        alpha, lam, epsilon = flat(alpha), flat(lam), flat(epsilon)
        state = _Step(table, least, torch.ones(lanes, **f64), torch.zeros(lanes, **f64), torch.zeros(lanes, **f64),
                      x, x_dot, theta, theta_dot, s, a, torch.zeros(lanes, dtype=torch.int64, device=self.device),
                      torch.zeros((), dtype=torch.int64, device=self.device),
                      torch.zeros((), dtype=torch.bool, device=self.device))
        mixed = self._mixed(first_step + 1, n_steps)
        counts = []
        for k in range(n_steps):
            state = self._step(state, mixed[WORDS_PER_STEP * k:WORDS_PER_STEP * (k + 1)], alpha, lam, epsilon,
                               self._room(plan[k]))
            counts.append(state.count)
        t = state.table.view(lanes + 1, STATE_ACTIONS, FIELDS)[:lanes]
        q_end, w_end, e_end, c_start, d_start = t.unbind(dim=-1)
        live = e_end != 0.0
        q_end, w_end = _fold(live, q_end, w_end, e_end, alpha[:, None], state.clock_sum[:, None], c_start,
                             state.d_sum[:, None], d_start)
        e_end = e_end * state.clock[:, None]
        table_shape = shape + (STATE_ACTIONS,)
        cart_end = torch.stack([state.x, state.x_dot, state.theta, state.theta_dot], dim=-1).reshape(shape + (4,))
        result = (q_end.reshape(table_shape), e_end.reshape(table_shape), w_end.reshape(table_shape), cart_end,
                  state.a.reshape(shape), state.failures.reshape(shape))
        return result, counts, state.overflow

    def _learning_step(self, state: _Step, words: torch.Tensor, alpha: torch.Tensor, lam: torch.Tensor,
                       epsilon: torch.Tensor, room: torch.Tensor) -> _Step:
        """One step of every lane. ``room``'s length fixes how many lanes may have a
        pass over their rows this step (its values are not read)."""
        r = _rules
        (table, least, clock, clock_sum, d_sum, x, x_dot, theta, theta_dot, s, a, failures, _,
         overflow) = state
        lanes = a.shape[0]
        base = torch.arange(lanes, device=a.device) * STATE_ACTIONS

        def value(fields: torch.Tensor) -> torch.Tensor:
            """Q (pending updates included) from a state-action's five numbers."""
            return r.effective(fields[:, _Q], fields[:, _E], d_sum, fields[:, _D])

        x, x_dot, theta, theta_dot, failed = r.dynamics(x, x_dot, theta, theta_dot, a, self.phys)
        sa = base + 2 * s + a
        word = _rng.draw(self.keys, words[0])
        s2 = r.box(x, x_dot, theta, theta_dot, self.bounds)
        left = base + 2 * s2
        read = table.index_select(0, torch.cat([left, left + 1, sa])).view(3, lanes, FIELDS)
        q_left, q_right, q_sa = value(read[0]), value(read[1]), value(read[2])
        a2 = r.choose(word, q_left, q_right, epsilon)
        q_next = r.target(q_left, q_right, a2, self.watkins)
        delta = r.td_error(failed, self.failure_reward, self.gamma, q_next, q_sa)
        keep = ~failed
        if self.watkins:
            keep = keep & (torch.where(a2 == 1, q_right, q_left) == q_next)
        visited = read[2]
        e_sa = r.bump(visited[:, _E], 1.0 / clock, self.accumulate)
        table.index_copy_(0, sa, torch.stack([
            q_sa, r.flush(visited[:, _W], alpha, visited[:, _E], clock_sum, visited[:, _C]), e_sa, clock_sum, d_sum,
        ], dim=-1))
        clock_sum = clock_sum + clock
        d_sum = r.advance(d_sum, alpha * delta, clock)
        decayed = clock * (self.gamma * lam)
        dying_below = self.cutoff / decayed
        restart = keep & (decayed < RENORMALIZE_BELOW)
        lane_least = torch.minimum(least[:lanes], e_sa)
        # Unconditional (no .any()): a host sync every step would stall a GPU.
        needs_pass = ~keep | restart | (lane_least < dying_below)
        count = needs_pass.sum()
        slots = room.shape[0]
        packed, valid, ran_out = th.compact(needs_pass, slots)
        which = torch.where(valid, packed, lanes)  # spare slots read and write the dummy lane's rows
        owner = which.clamp(max=lanes - 1)  # and some lane's numbers
        per_lane = torch.stack([keep.to(clock.dtype), restart.to(clock.dtype), decayed, dying_below, alpha,
                                clock_sum, d_sum], dim=-1).index_select(0, owner)
        passed = (which[:, None] * STATE_ACTIONS + torch.arange(STATE_ACTIONS, device=a.device)).reshape(-1)
        # Read as whole rows (a view is fine for reading); written back entry by entry.
        rows = table.view(lanes + 1, STATE_ACTIONS * FIELDS).index_select(0, which)
        fields = rows.view(slots, STATE_ACTIONS, FIELDS)
        lane_keep, lane_restart, lane_decayed, lane_below, lane_alpha, lane_c, lane_d = (
            per_lane[:, i, None] for i in range(7))
        q, w, e_hat, c_start, d_start = fields.unbind(dim=-1)
        dying = (e_hat != 0.0) & ((lane_keep == 0.0) | (e_hat < lane_below))
        q, w = _fold(dying, q, w, e_hat, lane_alpha, lane_c, c_start, lane_d, d_start)
        e_hat = torch.where(dying, 0.0, e_hat)
        restarting = lane_restart != 0.0
        q, w = _fold(restarting & (e_hat != 0.0), q, w, e_hat, lane_alpha, lane_c, c_start, lane_d, d_start)
        e_hat = torch.where(restarting, e_hat * lane_decayed, e_hat)
        c_start = torch.where(restarting, 0.0, c_start)
        d_start = torch.where(restarting, 0.0, d_start)
        table.index_copy_(0, passed, torch.stack([q, w, e_hat, c_start, d_start], dim=-1).view(-1, FIELDS))
        least = torch.cat([lane_least, least[lanes:]]).index_copy(0, which, _least_live(e_hat))
        fresh_clock = ~keep | restart
        clock = torch.where(fresh_clock, 1.0, decayed)
        clock_sum = torch.where(fresh_clock, 0.0, clock_sum)
        d_sum = torch.where(fresh_clock, 0.0, d_sum)
        # A failed lane always has a slot: its new episode is drawn there, not in every lane.
        slot_keys, slot_word = self.keys.index_select(0, owner), word.index_select(0, owner)
        fresh = r.start_state(_rng.draw(slot_keys, words[1]), _rng.draw(slot_keys, words[2]), self.start_range)
        s_fresh = r.box(*fresh, self.bounds)
        # A failed lane has no live traces left: its q is its Q.
        start_q = q.gather(1, torch.stack([2 * s_fresh, 2 * s_fresh + 1], dim=-1))
        a_fresh = r.choose(slot_word, start_q[:, 0], start_q[:, 1], epsilon.index_select(0, owner))

        def on_lanes(values: torch.Tensor) -> torch.Tensor:
            """Per-slot values laid out per lane (spare slots write past the end)."""
            return values.new_zeros(lanes + 1).index_copy(0, which, values)[:lanes]

        x, x_dot, theta, theta_dot = (torch.where(failed, on_lanes(new), old) for new, old in
                                      zip(fresh, (x, x_dot, theta, theta_dot)))
        s = torch.where(failed, on_lanes(s_fresh), s2)
        a = torch.where(failed, on_lanes(a_fresh), a2)
        failures = failures + failed.to(torch.int64)
        return _Step(table, least, clock, clock_sum, d_sum, x, x_dot, theta, theta_dot, s, a, failures,
                     count, overflow | ran_out)


def _fold(mask: torch.Tensor, q: torch.Tensor, w: torch.Tensor, e_hat: torch.Tensor, alpha_item: torch.Tensor,
          clock_sum: torch.Tensor, c_start: torch.Tensor, d_sum: torch.Tensor,
          d_start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and w with the pending updates of the state-actions in ``mask`` folded in."""
    q = torch.where(mask, _rules.effective(q, e_hat, d_sum, d_start), q)
    w = torch.where(mask, _rules.flush(w, alpha_item, e_hat, clock_sum, c_start), w)
    return q, w


def _least_live(e_hat: torch.Tensor) -> torch.Tensor:
    """Each row's smallest live ê (inf where none is live): its trace that dies first."""
    return torch.where(e_hat != 0.0, e_hat, torch.inf).amin(dim=-1)


def _slots_for(lanes_needing_a_pass: float) -> int:
    """Room for 1.25x that many passes in a step, rounded up to a power of two."""
    return 1 << max(0, int(1.25 * lanes_needing_a_pass) + SLOT_MARGIN - 1).bit_length()
