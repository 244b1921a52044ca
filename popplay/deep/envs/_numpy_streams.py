"""NumPy's seeded uniform draws in numba (private): what
``gymnasium.utils.seeding.np_random(seed)[0].uniform(low, high, size)`` returns for a
32-bit ``seed``, without building a ``SeedSequence``, a ``PCG64`` and a ``Generator``
per seed (about 10 µs of Python objects, paid at every episode's reset of every member
of a deep population; here a fraction of a microsecond).

The algorithms are NumPy's own, word for word: ``SeedSequence`` (O'Neill's seed_seq
hash of one 32-bit entropy word into a pool of four, then ``generate_state(4,
uint64)``), ``PCG64``'s ``srandom`` from those words and its XSL-RR output, and
``random_uniform``'s ``low + (high - low) * next_double``. ``tests/test_deep_envs.py``
holds them to NumPy's draws over thousands of seeds.
"""
from __future__ import annotations

import numba
import numpy as np

_U32 = np.uint64(0xFFFFFFFF)
_INIT_A, _MULT_A = np.uint64(0x43B0D7E5), np.uint64(0x931E8875)
_INIT_B, _MULT_B = np.uint64(0x8B51F9DD), np.uint64(0x58F38DED)
_MIX_L, _MIX_R = np.uint64(0xCA01F9DD), np.uint64(0x4973F715)
_SHIFT16, _SHIFT32, _SHIFT11 = np.uint64(16), np.uint64(32), np.uint64(11)
# PCG's default 128-bit multiplier, high and low halves
_PCG_MULT_HI, _PCG_MULT_LO = np.uint64(2549297995355413924), np.uint64(4865540595714422341)
_TWO_M53 = 1.0 / 9007199254740992.0


@numba.njit(cache=True, inline="always")
def _hashmix(value: np.uint64, hash_const: np.uint64, multiplier: np.uint64) -> tuple[np.uint64, np.uint64]:
    """SeedSequence's hash step on 32-bit words held in uint64 (its pool mixing with
    ``_MULT_A``, its ``generate_state`` with ``_MULT_B``): (mixed value, next constant)."""
    value = (value ^ hash_const) & _U32
    hash_const = (hash_const * multiplier) & _U32
    value = (value * hash_const) & _U32
    return value ^ (value >> _SHIFT16), hash_const


@numba.njit(cache=True, inline="always")
def _mix(x: np.uint64, y: np.uint64) -> np.uint64:
    result = (_MIX_L * x - _MIX_R * y) & _U32
    return result ^ (result >> _SHIFT16)


@numba.njit(cache=True, inline="always")
def _mul128(a_hi: np.uint64, a_lo: np.uint64, b_hi: np.uint64, b_lo: np.uint64) -> tuple[np.uint64, np.uint64]:
    """(a · b) mod 2^128 on (high, low) 64-bit halves."""
    a0, a1 = a_lo & _U32, a_lo >> _SHIFT32
    b0, b1 = b_lo & _U32, b_lo >> _SHIFT32
    low_low = a0 * b0
    middle = a1 * b0 + (low_low >> _SHIFT32)
    middle2 = a0 * b1 + (middle & _U32)
    high = a1 * b1 + (middle >> _SHIFT32) + (middle2 >> _SHIFT32)
    low = (middle2 << _SHIFT32) | (low_low & _U32)
    return high + a_hi * b_lo + a_lo * b_hi, low


@numba.njit(cache=True, inline="always")
def _add128(a_hi: np.uint64, a_lo: np.uint64, b_hi: np.uint64, b_lo: np.uint64) -> tuple[np.uint64, np.uint64]:
    low = a_lo + b_lo
    carry = np.uint64(1) if low < a_lo else np.uint64(0)
    return a_hi + b_hi + carry, low


@numba.njit(cache=True)
def seeded_uniforms(seeds: np.ndarray, low: float, high: float, out: np.ndarray) -> None:
    """``out[i, :]``: ``np.random.default_rng``-style draws of ``uniform(low, high,
    out.shape[1])`` from ``PCG64(SeedSequence(seeds[i]))``, for seeds in [0, 2^32)."""
    span = high - low
    pool = np.empty(4, dtype=np.uint64)
    words = np.empty(8, dtype=np.uint64)
    for i in range(seeds.shape[0]):
        # SeedSequence(seed).pool: one entropy word, the other three hash zero
        hash_const = _INIT_A
        for j in range(4):
            entropy = np.uint64(seeds[i]) & _U32 if j == 0 else np.uint64(0)
            pool[j], hash_const = _hashmix(entropy, hash_const, _MULT_A)
        for src in range(4):
            for dst in range(4):
                if src != dst:
                    mixed, hash_const = _hashmix(pool[src], hash_const, _MULT_A)
                    pool[dst] = _mix(pool[dst], mixed)
        # generate_state(4, uint64): eight 32-bit words, paired little-endian
        hash_const = _INIT_B
        for j in range(8):
            words[j], hash_const = _hashmix(pool[j % 4], hash_const, _MULT_B)
        seed_hi, seed_lo = words[0] | (words[1] << _SHIFT32), words[2] | (words[3] << _SHIFT32)
        seq_hi, seq_lo = words[4] | (words[5] << _SHIFT32), words[6] | (words[7] << _SHIFT32)
        # PCG64's srandom: inc = (seq << 1) | 1; step; state += seed; step
        inc_hi = (seq_hi << np.uint64(1)) | (seq_lo >> np.uint64(63))
        inc_lo = (seq_lo << np.uint64(1)) | np.uint64(1)
        state_hi, state_lo = inc_hi, inc_lo  # the first step from state 0
        state_hi, state_lo = _add128(state_hi, state_lo, seed_hi, seed_lo)
        state_hi, state_lo = _mul128(state_hi, state_lo, _PCG_MULT_HI, _PCG_MULT_LO)
        state_hi, state_lo = _add128(state_hi, state_lo, inc_hi, inc_lo)
        for j in range(out.shape[1]):
            state_hi, state_lo = _mul128(state_hi, state_lo, _PCG_MULT_HI, _PCG_MULT_LO)
            state_hi, state_lo = _add128(state_hi, state_lo, inc_hi, inc_lo)
            rotation = state_hi >> np.uint64(58)
            folded = state_hi ^ state_lo
            word = (folded >> rotation) | (folded << ((np.uint64(64) - rotation) & np.uint64(63)))
            out[i, j] = low + span * (np.float64(word >> _SHIFT11) * _TWO_M53)
