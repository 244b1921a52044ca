"""Torch engine of the cart-pole population (private; see :mod:`popplay.games.cartpole.rules`).

Every step advances all (trial, agent) pairs at once: the dynamics on (trials,
agents) tensors and the TD(λ) update densely on (trials, agents, 72) tensors. It
draws the same words and applies the same rules as the numba kernels (whose sparse
update skips exactly the zero traces that leave Q and w unchanged here), so on the
CPU both give bit-identical populations.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from popplay.games.cartpole.rules import RENORMALIZE_BELOW, STATE_ACTIONS, WORDS_PER_STEP, make_rules
from popplay.xp import th

_rules = make_rules(th)
_rng = _rules.rng


class TorchCartPoleEngine:
    """Runs learning phases for a whole population on one device."""

    def __init__(self, *, keys: np.ndarray, phys: np.ndarray, bounds: np.ndarray, gamma: float,
                 failure_reward: float, cutoff: float, start_range: float, accumulate: bool, watkins: bool,
                 device: str, compile: bool = False) -> None:
        self.device = torch.device(device)
        self.keys = torch.as_tensor(np.ascontiguousarray(keys), device=self.device)
        self.phys = tuple(float(v) for v in phys)
        self.bounds = tuple(float(v) for v in bounds)
        self.gamma = float(gamma)
        self.failure_reward = float(failure_reward)
        self.cutoff = float(cutoff)
        self.start_range = float(start_range)
        self.accumulate = bool(accumulate)
        self.watkins = bool(watkins)
        self._step = th.compiled(self._learning_step, compile)
        self._columns = torch.arange(STATE_ACTIONS, device=self.device) if compile else None  # see th.put_along

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
        ``action``); returns (q, e, w, cart, action, failures)."""
        r = _rules
        if self._columns is None:  # the eager step writes into its tables: the caller's stay as they are
            q, w, e = q.clone(), w.clone(), e.clone()
        e_hat = e
        c_start = torch.zeros_like(e_hat)
        d_start = torch.zeros_like(e_hat)
        clock = torch.ones(action.shape, dtype=torch.float64, device=self.device)
        clock_sum = torch.zeros_like(clock)
        d_sum = torch.zeros_like(clock)
        x, x_dot, theta, theta_dot = (cart[..., i].clone() for i in range(4))
        a = action.clone()
        failures = torch.zeros(a.shape, dtype=torch.int64, device=self.device)
        s = r.box(x, x_dot, theta, theta_dot, self.bounds)
        mixed = self._mixed(first_step + 1, n_steps)

        state = (q, w, e_hat, c_start, d_start, clock, clock_sum, d_sum, x, x_dot, theta, theta_dot, s, a, failures)
        for k in range(n_steps):
            state = self._step(state, mixed[WORDS_PER_STEP * k:WORDS_PER_STEP * (k + 1)], alpha, lam, epsilon)
        q, w, e_hat, c_start, d_start, clock, clock_sum, d_sum, x, x_dot, theta, theta_dot, s, a, failures = state
        q, w = _fold(e_hat != 0.0, q, w, e_hat, alpha[..., None], clock_sum, c_start, d_sum, d_start)
        e = e_hat * clock[..., None]
        return q, e, w, torch.stack([x, x_dot, theta, theta_dot], dim=-1), a, failures

    def _learning_step(self, state: tuple[torch.Tensor, ...], words: torch.Tensor, alpha: torch.Tensor,
                       lam: torch.Tensor, epsilon: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One step of every agent: the state tuple of :meth:`phase`'s loop, advanced."""
        r = _rules
        q, w, e_hat, c_start, d_start, clock, clock_sum, d_sum, x, x_dot, theta, theta_dot, s, a, failures = state
        alpha_item = alpha[..., None]  # broadcast over the 72 state-actions
        gamma_lambda = self.gamma * lam  # the same product the numba caller forms

        def value(index: torch.Tensor) -> torch.Tensor:
            """Q (pending updates included) at ``index`` along the last axis."""
            return r.effective(q.gather(-1, index), e_hat.gather(-1, index), d_sum[..., None],
                               d_start.gather(-1, index))

        def fold(mask: torch.Tensor) -> None:
            """Fold the pending updates of the state-actions in ``mask`` into q and w."""
            nonlocal q, w
            q, w = _fold(mask, q, w, e_hat, alpha_item, clock_sum, c_start, d_sum, d_start)

        x, x_dot, theta, theta_dot, failed = r.dynamics(x, x_dot, theta, theta_dot, a, self.phys)
        sa = (2 * s + a)[..., None]
        word = _rng.draw(self.keys, words[0])
        s2 = r.box(x, x_dot, theta, theta_dot, self.bounds)
        q_left = value((2 * s2)[..., None])[..., 0]
        q_right = value((2 * s2 + 1)[..., None])[..., 0]
        a2 = r.choose(word, q_left, q_right, epsilon)
        q_next = r.target(q_left, q_right, a2, self.watkins)
        q_sa = value(sa)
        delta = r.td_error(failed, self.failure_reward, self.gamma, q_next, q_sa[..., 0])
        keep = ~failed
        if self.watkins:
            keep = keep & (torch.where(a2 == 1, q_right, q_left) == q_next)
        e_sa = e_hat.gather(-1, sa)
        columns = self._columns
        q = th.put_along(q, sa, q_sa, columns)
        w = th.put_along(w, sa, r.flush(w.gather(-1, sa), alpha_item, e_sa, clock_sum[..., None],
                                        c_start.gather(-1, sa)), columns)
        e_hat = th.put_along(e_hat, sa, r.bump(e_sa, (1.0 / clock)[..., None], self.accumulate), columns)
        c_start = th.put_along(c_start, sa, clock_sum[..., None], columns)
        d_start = th.put_along(d_start, sa, d_sum[..., None], columns)
        clock_sum = clock_sum + clock
        d_sum = r.advance(d_sum, alpha * delta, clock)
        decayed = clock * gamma_lambda
        dying = (e_hat != 0.0) & ((~keep)[..., None] | (e_hat < (self.cutoff / decayed)[..., None]))
        fold(dying)
        e_hat = torch.where(dying, 0.0, e_hat)
        # Unconditional (no .any()): a host sync every step would stall a GPU.
        restart = keep & (decayed < RENORMALIZE_BELOW)
        fold(restart[..., None] & (e_hat != 0.0))
        e_hat = torch.where(restart[..., None], e_hat * decayed[..., None], e_hat)
        c_start = torch.where(restart[..., None], 0.0, c_start)
        d_start = torch.where(restart[..., None], 0.0, d_start)
        fresh_clock = ~keep | restart
        clock = torch.where(fresh_clock, 1.0, decayed)
        clock_sum = torch.where(fresh_clock, 0.0, clock_sum)
        d_sum = torch.where(fresh_clock, 0.0, d_sum)
        fresh = r.start_state(_rng.draw(self.keys, words[1]),
                              _rng.draw(self.keys, words[2]), self.start_range)
        x, x_dot, theta, theta_dot = (torch.where(failed, new, old) for new, old in
                                      zip(fresh, (x, x_dot, theta, theta_dot)))
        s_fresh = r.box(*fresh, self.bounds)
        # A failed agent has no live traces left: its q is its Q.
        a_fresh = r.choose(word, q.gather(-1, (2 * s_fresh)[..., None])[..., 0],
                           q.gather(-1, (2 * s_fresh + 1)[..., None])[..., 0], epsilon)
        s = torch.where(failed, s_fresh, s2)
        a = torch.where(failed, a_fresh, a2)
        failures = failures + failed.to(torch.int64)
        return (q, w, e_hat, c_start, d_start, clock, clock_sum, d_sum, x, x_dot, theta, theta_dot, s, a, failures)


def _fold(mask: torch.Tensor, q: torch.Tensor, w: torch.Tensor, e_hat: torch.Tensor, alpha_item: torch.Tensor,
          clock_sum: torch.Tensor, c_start: torch.Tensor, d_sum: torch.Tensor,
          d_start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and w with the pending updates of the state-actions in ``mask`` folded in."""
    q = torch.where(mask, _rules.effective(q, e_hat, d_sum[..., None], d_start), q)
    w = torch.where(mask, _rules.flush(w, alpha_item, e_hat, clock_sum[..., None], c_start), w)
    return q, w
