"""Counter-based random streams.

Every random number popplay draws is a pure function of ``(seed, trial, agent,
counter)``: an agent's stream never depends on how the population is batched, how
many threads run it, or (later) how many processes share it, and restoring a
checkpoint only needs the counter. The generator is a keyed hash — SplitMix64's
output mix applied twice, once to the counter and once to ``key + mix(counter)`` —
written once in :mod:`popplay.xp` form so numba, torch and plain Python produce
the same 64-bit words.

Normal deviates come from a 256-layer ziggurat (Marsaglia & Tsang 2000) whose rare
wedge and tail tests use popplay's own ``exp`` and ``log``, built from IEEE
``+ - * /`` and ``ldexp`` only: library ``exp``/``log`` (and even torch's CPU
``sqrt``) differ in the last bit between numba, torch and CUDA, and the draws
must not.
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np

from popplay.xp import npx, py

GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB

# Purposes: separate key families so that, e.g., the environment of a trial and its
# first agent never share a stream.
TAG_ENVIRONMENT = 1
TAG_AGENT = 2
TAG_AGENT_STATIC = 3
TAG_EVALUATION = 4


def signed64(x: int) -> int:
    """The signed 64-bit integer with the same bits as ``x`` (numba/torch constants)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


_TWO_M32 = 2.0**-32
_TWO_M53 = 2.0**-53
_SQRT_HALF = 0.70710678118654752440
_LN2_HI = 6.93147180369123816490e-01  # few mantissa bits: e * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10

_INV_LN2 = 1.44269504088896338700
_ZIG_R = 3.6541528853610088  # start of the tail of the 256-layer ziggurat
_ZIG_V = 4.92867323399e-3  # area of each layer
_ZIG_MAX_ATTEMPTS = 64  # words per draw at most; 0.012**30 makes the cap unreachable
# Retry rounds of normal_bounded. Measured over 4M draws: 59,900 needed a retry round,
# 27,869 a second, 233 a third, 4 a fourth; shrinking by about 60x per round from
# there, six rounds leave roughly one draw in 10^9 unfinished (its phase is redone).
NORMAL_ROUNDS = 6


def make_elementary(xp: Any) -> SimpleNamespace:
    """``log`` and ``exp`` that give the same bits on every backend (see module doc)."""

    @xp.fn
    def log(x):
        """Natural log of a positive normal float, from + - * / and frexp only."""
        m, e = xp.frexp(x)
        low = xp.where(m < _SQRT_HALF, 1.0, 0.0)
        m = m * (1.0 + low)
        ef = xp.to_float(e) - low
        f = m - 1.0
        s = f / (2.0 + f)
        z = s * s
        p = 1.0 / 23.0
        p = p * z + 1.0 / 21.0
        p = p * z + 1.0 / 19.0
        p = p * z + 1.0 / 17.0
        p = p * z + 1.0 / 15.0
        p = p * z + 1.0 / 13.0
        p = p * z + 1.0 / 11.0
        p = p * z + 1.0 / 9.0
        p = p * z + 1.0 / 7.0
        p = p * z + 1.0 / 5.0
        p = p * z + 1.0 / 3.0
        log_m = 2.0 * s + 2.0 * s * (z * p)
        return ef * _LN2_HI + (ef * _LN2_LO + log_m)

    @xp.fn
    def exp(x):
        """e**x for |x| < 700, from + - * / and ldexp only."""
        k = xp.floor(x * _INV_LN2 + 0.5)
        f = (x - k * _LN2_HI) - k * _LN2_LO
        p = 1.0 / 6227020800.0
        p = p * f + 1.0 / 479001600.0
        p = p * f + 1.0 / 39916800.0
        p = p * f + 1.0 / 3628800.0
        p = p * f + 1.0 / 362880.0
        p = p * f + 1.0 / 40320.0
        p = p * f + 1.0 / 5040.0
        p = p * f + 1.0 / 720.0
        p = p * f + 1.0 / 120.0
        p = p * f + 1.0 / 24.0
        p = p * f + 1.0 / 6.0
        p = p * f + 0.5
        p = p * f + 1.0
        p = p * f + 1.0
        return xp.ldexp(p, xp.to_int(k))

    return SimpleNamespace(log=log, exp=exp)


def make_rng(xp: Any) -> SimpleNamespace:
    """Build the random-stream functions for array namespace ``xp``.

    Returns a namespace with ``mix64``, ``combine``, ``draw``, ``uniform53``,
    ``uniform_hi32``, ``uniform_lo32``, ``normal``, ``log`` and ``sqrt_tail``.
    """
    elementary = make_elementary(xp)
    log = elementary.log
    exp = elementary.exp
    mix1 = signed64(_MIX1)
    mix2 = signed64(_MIX2)
    golden = signed64(GOLDEN)

    @xp.fn
    def srl(x, s):
        """Logical right shift of a signed 64-bit value."""
        return (x >> s) & ((1 << (64 - s)) - 1)

    @xp.fn
    def mix64(x):
        x = xp.mul64(x ^ srl(x, 30), mix1)
        x = xp.mul64(x ^ srl(x, 27), mix2)
        return x ^ srl(x, 31)

    @xp.fn
    def mix_counter(counter):
        """The counter half of :func:`draw`; shared by every agent at a step."""
        return mix64(xp.add64(counter, golden))

    @xp.fn
    def draw(key, mixed_counter):
        """The 64-bit word at ``counter`` of stream ``key``."""
        return mix64(xp.add64(key, mixed_counter))

    @xp.fn
    def combine(key, x):
        """Derive a child key (a trial, an agent, a purpose) from a parent key."""
        return draw(key, mix_counter(x))

    @xp.fn
    def uniform53(word):
        """Uniform on [0, 1) with 53 random bits."""
        return xp.to_float(srl(word, 11)) * _TWO_M53

    @xp.fn
    def uniform_hi32(word):
        return xp.to_float(srl(word, 32)) * _TWO_M32

    @xp.fn
    def uniform_lo32(word):
        return xp.to_float(word & 0xFFFFFFFF) * _TWO_M32

    @xp.fn
    def open53(word):
        """Uniform on (0, 1), never 0 or 1 (for logs)."""
        return (xp.to_float(srl(word, 11)) + 0.5) * _TWO_M53

    @xp.fn
    def retry_word(key, counter, attempt):
        """Word ``attempt`` (>= 1) of a draw that needed more than one word.

        Retry counters are negative, so they never meet the non-negative counters
        that callers use for first words.
        """
        return draw(key, mix_counter(xp.add64(xp.mul64(counter, -_ZIG_MAX_ATTEMPTS), -attempt)))

    @xp.fn
    def wedge_accepts(layer, x, word):
        y = ZF[layer] + uniform53(word) * (ZF[layer + 1] - ZF[layer])
        return y < exp(-0.5 * x * x)

    @xp.fn
    def tail_point(word1, word2):
        """Marsaglia's tail beyond R: (candidate, accepted)."""
        xt = -log(open53(word1)) / _ZIG_R
        yt = -log(open53(word2))
        return _ZIG_R + xt, yt + yt > xt * xt

    # A 256-layer ziggurat: one word, a table look-up and a compare for 98.8 % of
    # draws; the rest take retry words. Scalar backends loop, tensor backends run
    # the same state machine over the pending lanes.
    if not xp.vectorized:
        ZX = _ZIG_X
        ZF = _ZIG_F

        @xp.fn
        def normal_slow(key, counter, word):
            """The ziggurat's retry loop: wedge tests, the tail, fresh words."""
            in_tail = False
            attempt = 0
            negative = 0
            x = 0.0
            while True:
                if in_tail:
                    x, accepted = tail_point(retry_word(key, counter, attempt + 1),
                                             retry_word(key, counter, attempt + 2))
                    attempt += 2
                    if accepted:
                        break
                else:
                    layer = word & 255
                    negative = srl(word, 8) & 1
                    x = uniform53(word) * ZX[layer]
                    if x < ZX[layer + 1]:
                        break
                    if layer == 0:
                        in_tail = True
                        continue
                    attempt += 1
                    if wedge_accepts(layer, x, retry_word(key, counter, attempt)):
                        break
                    attempt += 1
                    word = retry_word(key, counter, attempt)
                if attempt >= _ZIG_MAX_ATTEMPTS - 2:
                    break
            return -x if negative else x

        @xp.fn
        def normal(key, counter, word):
            """A standard normal deviate; ``word = draw(key, mix_counter(counter))``."""
            layer = word & 255
            x = uniform53(word) * ZX[layer]
            if x < ZX[layer + 1]:
                return -x if srl(word, 8) & 1 else x
            return normal_slow(key, counter, word)

    else:
        ZX = xp.table(_ZIG_X)
        ZF = xp.table(_ZIG_F)

        def _first_try(key, counter, word):
            """The table step of every lane: (x, pending) with x final where not pending."""
            key, counter, word = xp.broadcast(key, counter, word)
            layer = word & 255
            x = uniform53(word) * ZX[layer]
            x = xp.where(srl(word, 8) & 1 == 1, -x, x)
            return key, counter, word, x, xp.abs(x) >= ZX[layer + 1]

        def normal(key, counter, word):
            """A standard normal deviate; ``word = draw(key, mix_counter(counter))``."""
            key, counter, word, x, pending = _first_try(key, counter, word)
            pending = xp.nonzero(pending)
            if xp.size(pending[0]):
                x[pending] = _pending_normals(key[pending], counter[pending], word[pending])
            return x

        def normal_bounded(key, counter, word, capacity, rounds=NORMAL_ROUNDS):
            """:func:`normal` with shapes fixed in advance, so the host never waits for
            the device: the pending lanes (about 1.5 %) are packed into ``capacity``
            slots and run ``rounds`` rounds of the retry state machine. Returns (x,
            short): ``short`` (a 0-d boolean array) is true when some lane did not fit
            or did not finish, and then ``x`` is not the normal's value there: the
            caller reads ``short`` once per phase and redoes the phase with
            :func:`normal`, which is exact. Where ``short`` is false, x equals
            :func:`normal`'s bit for bit."""
            key, counter, word, x, pending = _first_try(key, counter, word)
            lanes, valid, overflow = xp.compact(pending, capacity)
            value, finished = _bounded_pending(xp.flat_take(key, lanes), xp.flat_take(counter, lanes),
                                               xp.flat_take(word, lanes), rounds)
            return xp.flat_put(x, lanes, valid, value), overflow | (valid & ~finished).any()

        def _retry_round(key, counter, word, in_tail, attempt, negative):
            """One round of normal_slow's state machine on every lane given: (value,
            finished, and the next round's word, in_tail, attempt, negative)."""
            layer = word & 255
            zig_x = uniform53(word) * ZX[layer]
            zig = ~in_tail
            negative = xp.where(zig, srl(word, 8) & 1, negative)
            fast = zig & (zig_x < ZX[layer + 1])
            to_tail = zig & ~fast & (layer == 0)
            wedge = zig & ~fast & (layer != 0)
            wedge_ok = wedge & wedge_accepts(layer, zig_x, retry_word(key, counter, attempt + 1))
            tail_x, tail_ok = tail_point(retry_word(key, counter, attempt + 1),
                                         retry_word(key, counter, attempt + 2))
            tail_ok = in_tail & tail_ok
            attempt = xp.where(wedge | in_tail, attempt + 2, attempt)
            word = xp.where(wedge & ~wedge_ok, retry_word(key, counter, attempt), word)
            candidate = xp.where(in_tail, tail_x, zig_x)
            finished = fast | wedge_ok | tail_ok | (~to_tail & (attempt >= _ZIG_MAX_ATTEMPTS - 2))
            value = xp.where(negative == 1, -candidate, candidate)
            return value, finished, word, in_tail | to_tail, attempt, negative

        def _pending_normals(key, counter, word):
            # normal_slow's state machine, run over all still-pending lanes at once.
            lanes = xp.arange(xp.size(word), word)
            out = xp.empty_float(word)
            in_tail = xp.zeros_bool(word)
            attempt = xp.zeros_like(word)
            negative = xp.zeros_like(word)
            while xp.size(lanes):
                value, finished, word, in_tail, attempt, negative = _retry_round(
                    key, counter, word, in_tail, attempt, negative)
                done = xp.nonzero(finished)
                out[lanes[done]] = value[done]
                keep = xp.nonzero(~finished)
                lanes, key, counter, word = lanes[keep], key[keep], counter[keep], word[keep]
                in_tail, attempt, negative = in_tail[keep], attempt[keep], negative[keep]
            return out

        def _bounded_pending(key, counter, word, rounds):
            # The same state machine on fixed lanes for a fixed number of rounds: a
            # finished lane keeps the value of the round it finished in.
            out = xp.zeros_float(word)
            done = xp.zeros_bool(word)
            in_tail = xp.zeros_bool(word)
            attempt = xp.zeros_like(word)
            negative = xp.zeros_like(word)
            for _ in range(rounds):
                value, finished, word, in_tail, attempt, negative = _retry_round(
                    key, counter, word, in_tail, attempt, negative)
                out = xp.where(finished & ~done, value, out)
                done = done | finished
            return out, done

    return SimpleNamespace(
        srl=srl, mix64=mix64, mix_counter=mix_counter, draw=draw, combine=combine,
        uniform53=uniform53, uniform_hi32=uniform_hi32, uniform_lo32=uniform_lo32,
        open53=open53, log=log, exp=exp, retry_word=retry_word, normal=normal,
        normal_bounded=normal_bounded if xp.vectorized else None,
        normal_slow=normal_slow if not xp.vectorized else None,
    )


def _ziggurat_tables() -> tuple[Any, Any]:
    """Layer edges x_i and f(x_i) = exp(-x_i**2 / 2), with popplay's own exp/log so
    the tables are the same on every platform (sqrt is correctly rounded by IEEE)."""



    r = make_elementary(py)
    x = np.zeros(257)
    x[0] = _ZIG_V / r.exp(-0.5 * _ZIG_R * _ZIG_R)
    x[1] = _ZIG_R
    for i in range(1, 255):
        x[i + 1] = math.sqrt(-2.0 * r.log(_ZIG_V / x[i] + r.exp(-0.5 * x[i] * x[i])))
    f = np.array([r.exp(-0.5 * v * v) for v in x])
    f[256] = 1.0
    return x, f


def root_key(seed: int) -> int:
    """The key of a run's seed (any Python int; reduced to 64 bits)."""
    return _py_rng().combine(signed64(GOLDEN), signed64(seed))


def stream_keys(seed: int, tag: int, *axes: Any) -> Any:
    """Keys of a family of streams, one per combination of indices (outer product).

    ``stream_keys(seed, TAG_AGENT, trials, agents)`` is shaped (len(trials),
    len(agents)); the key at (t, a) depends only on (seed, tag, t, a), so any slice of
    a population (a shard of agents, one trial) gets the same keys as the whole.
    """

    r = _numpy_rng()
    keys = np.array([key_path(seed, tag)], dtype=np.int64)
    for axis in axes:
        index = np.ascontiguousarray(axis, dtype=np.int64).reshape(-1)
        keys = r.combine(keys[..., None], index)
    return keys.reshape(keys.shape[1:] if axes else keys.shape)


_NUMPY_RNG: Any = None
_PY_RNG: Any = None


def _py_rng() -> SimpleNamespace:
    """The streams over Python ints (built once: a deep population derives a key at
    every episode's reset, and building the namespace cost more than the key)."""
    global _PY_RNG
    if _PY_RNG is None:
        _PY_RNG = make_rng(py)
    return _PY_RNG


def _numpy_rng() -> SimpleNamespace:
    """The streams over NumPy arrays (built once): set-up work such as keys and arm
    means runs here, so that the numba paths never import torch."""
    global _NUMPY_RNG
    if _NUMPY_RNG is None:

        _NUMPY_RNG = make_rng(npx)
    return _NUMPY_RNG


def key_path(seed: int, *path: int) -> int:
    """The key reached from ``seed`` through ``path`` (e.g. tag, trial, agent)."""
    return key_extend(root_key(seed), *path)


def key_extend(key: int, *path: int) -> int:
    """The key reached from ``key`` through ``path``: ``key_path(seed, *a, *b)`` is
    ``key_extend(key_path(seed, *a), *b)``, so a prefix used often is derived once."""
    rng = _py_rng()
    for part in path:
        key = rng.combine(key, signed64(int(part)))
    return key


_ZIG_X, _ZIG_F = _ziggurat_tables()
