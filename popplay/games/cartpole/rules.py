"""Cart-pole populations (Bell, section 2): tabular TD(λ) with sharing and differentiation.

The system is the pole balancer of Barto, Sutton & Anderson (1983) as set out in
Brownlee's 2005 benchmark report: a cart on a track carries a hinged pole; each step
the agent pushes the cart left or right with a fixed force and the state
``[x, ẋ, θ, θ̇]`` advances by one explicit Euler step of τ seconds. The episode fails
when the cart leaves the track (|x| > 2.4 m) or the pole leans too far (|θ| > 12°).
With both friction coefficients at zero it is the frictionless variant most RL
libraries ship.

Learning follows §2.1–2.5: the continuous state falls into one of 36 boxes (3 cart
positions × 3 pole angles × the signs of ẋ and θ̇), each agent learns Q(box, action)
by Sarsa(λ) or Watkins' Q(λ) with replacing or accumulating eligibility traces and
ε-greedy actions, reward 0 per step and ``failure_reward`` on failure, and restarts
from a random state after each failure. Every agent has its own α, λ and ε (the
run's values until selective replication varies them). Between learning phases the
agents of a trial share their tables with equations (5)–(8)
(:func:`popplay.operators.sharing.share_weighted`) and, optionally, are differentiated with
equations (9)–(10) (:func:`popplay.operators.sharing.differentiate`); optionally, just before
a share, the fittest agents are replicated over the least fit
(:mod:`popplay.games.cartpole.experiment`).

Traces. All traces of an agent decay by the same factor γλ every step, so an agent
keeps scaled traces ê with a clock c: the true trace is e = ê·c and c ← γλc each
step. Between two visits of a state-action its ê is constant, so the dense TD(λ)
update (Q += αδe and equation (5)'s w += αe for all 72 state-actions, every step)
can be paid per stretch of constant ê: with D = Σ_t αδ_t c_t and C = Σ_t c_t
running per agent, Q = q + ê(D − D_start) and w gains αê(C − C_start), folded in
("flushed") when the stretch ends. A step is then O(1): the visited state-action is
flushed, its ê set to 1/c (replacing) or raised by 1/c (accumulating); D and C
advance; a trace dies (flushed, ê ← 0) once ê < cutoff/c, i.e. e < cutoff. Clocks
restart (everything flushed, c = 1, C = D = 0) when traces are cleared (failure,
Watkins' cut), when c falls below 2**-8 (so that D − D_start keeps its precision)
and at phase ends, where q and the true traces e = ê·c are stored. These are the
rules every backend follows; the numba kernels keep a list of each agent's live
traces, the torch engine a lower bound on its smallest live ê (the trace to die first:
all share the clock) and passes over an agent's 72 entries only when it is reached.

Bit-exactness. ``make_rules(xp)`` is the only statement of the dynamics and the
learning rules; the numba kernels, the torch engine and :func:`step` are built from
it. It uses only IEEE ``+ - * /``, ``floor`` and comparisons, and never divides by a
Python scalar (torch on CUDA turns that into a multiplication by the reciprocal), so
every backend follows the same trajectory bit for bit. Library ``sin``/``cos`` differ
in the last bit between numba, torch and CUDA, so :func:`make_rules` carries its own
(fdlibm's kernel polynomials after a Cody–Waite reduction by π/2, within about one
ulp of the correctly rounded value for |θ| < 2**19·π/2).

Random numbers. Every draw is a word of a counter-based stream keyed by (seed, tag,
trial, agent) (:mod:`popplay.rng`). Learning streams use the counter
``3 * step + slot``: slot 0 is the ε-greedy word of the action taken at that step,
slots 1 and 2 give the random start state of an episode that begins at that step.
Test streams are keyed by (seed, tag, trial, start) and use the same layout with
slot 0 breaking ties of the greedy policy. The variation of copies comes from
:mod:`popplay.operators.evolution`'s streams, keyed by (seed, generation, agent id).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

from popplay import rng as _rng
from popplay.core.options import option
from popplay.games.schedule import replication_warning, share_warning
from popplay.operators.evolution import Lineage, initial_ids
from popplay.xp import npx

# Stream families of this domain (popplay.rng reserves tags below 16).
TAG_CARTPOLE_LEARN = 16
TAG_CARTPOLE_BIAS = 17
TAG_CARTPOLE_TEST = 18

RENORMALIZE_BELOW = 2.0**-8  # a clock this small restarts (see "Traces")
WORDS_PER_STEP = 3  # slot 0: ε-greedy / tie word, slots 1-2: a random start state
BOXES = 36
ACTIONS = 2
STATE_ACTIONS = BOXES * ACTIONS  # Q is indexed by 2 * box + action
ALGORITHMS = ("sarsa", "q")
TRACES = ("replacing", "accumulating")

# Cody–Waite split of π/2 (fdlibm's pio2_1/pio2_1t): k * _PIO2_HI is exact for |k| < 2**20.
_TWO_OVER_PI = 6.36619772367581382433e-01
_PIO2_HI = 1.57079632673412561417e+00
_PIO2_LO = 6.07710050650619224932e-11
# fdlibm __kernel_sin / __kernel_cos minimax coefficients on |r| <= π/4.
_S1 = -1.66666666666666324348e-01
_S2 = 8.33333333332248946124e-03
_S3 = -1.98412698298579493134e-04
_S4 = 2.75573137070700676789e-06
_S5 = -2.50507602534068634195e-08
_S6 = 1.58969099521155010221e-10
_C1 = 4.16666666666666019037e-02
_C2 = -1.38888888888741095749e-03
_C3 = 2.48015872894767294178e-05
_C4 = -2.75573143513906633035e-07
_C5 = 2.08757232129817482790e-09
_C6 = -1.13596475577881948265e-11
TRIG_DOMAIN = 2.0**19 * math.pi / 2  # |θ| up to here keeps k * _PIO2_HI exact

# Positions of the constants in the vector a rule receives (see CartPoleParams.vector).
(_G, _MC, _MP, _L, _F, _TAU, _MUC, _MUP, _INV_TOTAL, _ML, _INV_ML, _X_LIMIT,
 _THETA_LIMIT) = range(13)


@dataclass(frozen=True)
class CartPoleParams:
    """Physical constants of the cart-pole (Barto et al. 1983; Brownlee 2005).

    Friction defaults are Barto's; set both to 0 for the frictionless variant.
    """

    gravity: float = 9.8  # m/s²
    cart_mass: float = 1.0  # kg
    pole_mass: float = 0.1  # kg
    pole_half_length: float = 0.5  # m
    force: float = 10.0  # N, pushed left or right every step
    tau: float = 0.02  # s per Euler step
    cart_friction: float = 0.0005  # μ_c, cart on track
    pole_friction: float = 0.000002  # μ_p, pole on cart
    track_limit: float = 2.4  # m: failure when |x| exceeds it
    angle_limit_degrees: float = 12.0  # failure when |θ| exceeds it

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        for name in ("gravity", "cart_mass", "pole_mass", "pole_half_length", "force", "tau",
                     "track_limit", "angle_limit_degrees"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f"{name} must be positive and finite (got {value!r})")
        for name in ("cart_friction", "pole_friction"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be non-negative and finite (got {value!r})")
        if self.angle_limit_degrees >= 90.0:
            raise ValueError(f"angle_limit_degrees must be below 90 (got {self.angle_limit_degrees!r})")

    @property
    def angle_limit(self) -> float:
        """The failure angle in radians."""
        return self.angle_limit_degrees * (math.pi / 180.0)

    def vector(self) -> np.ndarray:
        """The constants as rules read them, derived ones computed once here so that
        every backend multiplies by the very same reciprocals."""
        total = self.cart_mass + self.pole_mass
        ml = self.pole_mass * self.pole_half_length
        return np.array([
            self.gravity, self.cart_mass, self.pole_mass, self.pole_half_length, self.force, self.tau,
            self.cart_friction, self.pole_friction, 1.0 / total, ml, 1.0 / ml, self.track_limit,
            self.angle_limit,
        ], dtype=np.float64)


_PHYSICS_FIELDS = tuple(f.name for f in fields(CartPoleParams))


@dataclass(frozen=True)
class CartPolePopulationParams:
    """Train cart-pole populations: tabular Sarsa(λ)/Q(λ) over 36 boxes with weighted
    sharing, equations (5)–(8), optional differentiation, (9)–(10), and optional
    selective replication with variation before a share (--replicate-every). Quality =
    mean steps the shared greedy policy balances from random starts (ceiling --test-steps).

    The physical constants are flattened in (same names as :class:`CartPoleParams`)
    so that the run file's config is one flat mapping; :meth:`physics` gathers them.
    Defaults were chosen by measurement (``docs/cartpole.md``).
    """

    agents: int = option(256, "Agents per trial (they share with each other).", min=1)
    trials: int = option(1024, "Independent trials; quality is averaged over them.", min=1)
    steps_per_agent: int = option(1024, "Agent-time steps per trial, split evenly over the agents (Bell's x-axis).",
                                  min=1, name="--agent-steps", per="agents", budget=True)
    share_every: int = option(64, "Steps per agent between sharing points (each is followed by a test).", min=1)
    algorithm: str = option("sarsa", "sarsa: Sarsa(λ); q: Watkins' Q(λ) (traces cut after exploratory actions).",
                            choices=ALGORITHMS)
    trace: str = option("replacing", "Eligibility traces: set to 1 or incremented on a visit.", choices=TRACES)
    alpha: float = option(0.3, "Learning rate α (> 0).", min=0.0, max=1.0)
    gamma: float = option(0.999, "Discount γ.", min=0.0, max=1.0)
    lam: float = option(0.99, "Trace decay λ.", min=0.0, max=1.0)
    epsilon: float = option(0.001, "Exploration probability ε.", min=0.0, max=1.0)
    failure_reward: float = option(-1.0, "Reward on failure (negative); 0 otherwise.", max=0.0)
    trace_cutoff: float = option(0.03, "Traces below this become 0 (only live traces cost time).", min=0.0, max=1.0)
    initial_weight: float = option(0.01, "Sharing weight every agent restarts from, equation (8).", min=0.0)
    bias: float = option(0.1, "Initial max bias of differentiation, equation (9); 0 turns it off (a single agent "
                              "is never differentiated).", min=0.0)
    bias_decay: float = option(1.2, "Divides the max bias at every share, equation (10).", min=1.0)
    # m: the 3 cart ranges are x < -b, |x| <= b, x > b
    position_boundary: float = option(1.0, "Cart position box boundary ±b in m (3 ranges).", min=0.0)
    angle_boundary_degrees: float = option(2.0, "Pole angle box boundary ±b in degrees (3 ranges).", min=0.0,
                                           name="--angle-boundary")
    start_range: float = option(0.05, "Random starts are uniform in [-r, r) on x, ẋ, θ and θ̇.", min=0.0)
    test_steps: int = option(8192, "Steps of each greedy test; the quality ceiling (§2.5).", min=1)
    test_starts: int = option(1, "Random test starts per trial.", min=1)
    replicate_every: int = option(
        0, "Shares between selective replications: just before that share, within each trial, the agents that "
           "failed least since the last replication are copied over those that failed most (0: off).")
    replicate_fraction: float = option(0.25, "Fraction of each trial's agents replaced at a replication, "
                                             "in (0, 0.5].")
    mutate_q: float = option(0.0, "Std of Gaussian noise added to every Q value of a copy (0: exact copies).")
    mutate_params: float = option(1.0, "A copy's alpha, lambda, epsilon are multiplied by log-uniform factors in "
                                        "[1/S, S] (1: unchanged; all three stay in [0, 1]).")
    seed: int = option(0, "Seed of every random stream.")
    gravity: float = 9.8
    cart_mass: float = 1.0
    pole_mass: float = 0.1
    pole_half_length: float = 0.5
    force: float = 10.0
    tau: float = 0.02
    cart_friction: float = option(0.0005, "Cart friction μ_c (Barto: 0.0005).", min=0.0)
    pole_friction: float = option(0.000002, "Pole friction μ_p (Barto: 0.000002).", min=0.0)
    track_limit: float = 2.4
    angle_limit_degrees: float = 12.0

    def schedule_warnings(self) -> list[str]:
        """What a step budget will not do that the settings ask for."""
        shares = -(-self.steps_per_agent // self.share_every)
        return (share_warning(self.steps_per_agent, self.share_every)
                + replication_warning(self.replicate_every, shares, "shares"))

    def physics(self) -> CartPoleParams:
        return CartPoleParams(**{name: getattr(self, name) for name in _PHYSICS_FIELDS})

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be finite (got {value!r})")
        checks = [
            (self.agents >= 1, "agents", "must be at least 1"),
            (self.trials >= 1, "trials", "must be at least 1"),
            (self.steps_per_agent >= 1, "steps_per_agent", "must be at least 1"),
            (self.share_every >= 1, "share_every", "must be at least 1"),
            (self.algorithm in ALGORITHMS, "algorithm", f"must be one of {', '.join(ALGORITHMS)}"),
            (self.trace in TRACES, "trace", f"must be one of {', '.join(TRACES)}"),
            (0.0 < self.alpha <= 1.0, "alpha", "must lie in (0, 1]"),
            (0.0 <= self.gamma <= 1.0, "gamma", "must lie in [0, 1]"),
            (0.0 <= self.lam <= 1.0, "lam", "must lie in [0, 1]"),
            (0.0 <= self.epsilon <= 1.0, "epsilon", "must lie in [0, 1]"),
            (self.failure_reward < 0.0, "failure_reward", "must be negative"),
            (0.0 <= self.trace_cutoff < 1.0, "trace_cutoff", "must lie in [0, 1)"),
            (self.initial_weight >= 0.0, "initial_weight", "must be non-negative"),
            (self.bias >= 0.0, "bias", "must be non-negative"),
            (self.bias_decay >= 1.0, "bias_decay", "must be at least 1"),
            (self.position_boundary > 0.0, "position_boundary", "must be positive"),
            (self.position_boundary < self.track_limit, "position_boundary",
             f"must be below the track limit ({self.track_limit} m)"),
            (self.angle_boundary_degrees > 0.0, "angle_boundary_degrees", "must be positive"),
            (self.angle_boundary_degrees < self.angle_limit_degrees, "angle_boundary_degrees",
             f"must be below the failure angle ({self.angle_limit_degrees} degrees)"),
            (self.start_range >= 0.0, "start_range", "must be non-negative"),
            (self.test_steps >= 1, "test_steps", "must be at least 1"),
            (self.test_starts >= 1, "test_starts", "must be at least 1"),
            (self.replicate_every >= 0, "replicate_every", "must be non-negative (0: no replication)"),
            (self.replicate_every == 0 or self.agents >= 2, "agents", "must be at least 2 to replicate"),
            (0.0 < self.replicate_fraction <= 0.5, "replicate_fraction", "must lie in (0, 0.5]"),
            (self.mutate_q >= 0.0, "mutate_q", "must be non-negative (0: exact copies)"),
            (self.mutate_params >= 1.0, "mutate_params", "must be at least 1 (1: no variation)"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name} {message} (got {getattr(self, name)!r})")
        self.physics().validate()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def bounds(self) -> np.ndarray:
        """The box boundaries as rules read them: [position, angle in radians]."""
        return np.array([self.position_boundary, self.angle_boundary_degrees * (math.pi / 180.0)])


class CartPoleState(NamedTuple):
    """Changing state between phases; population axes lead.

    The learning arrays (``q`` to ``shared`` and the per-agent ``alpha``, ``lam``,
    ``epsilon``) are NumPy on the numba backend and torch tensors on the torch
    backend (so a GPU population stays on its device); the bookkeeping of selection
    (``agent_id``, ``fitness``, ``failures``, ``lineage``) is NumPy on both. Run files
    hold NumPy copies.
    """

    q: Any  # (trials, agents, 72) float64: each agent's Q(box, action) at 2 * box + action
    trace: Any  # (trials, agents, 72) float64: eligibility traces (carried across phases)
    weight: Any  # (trials, agents, 72) float64: sharing weights, equation (5)
    cart: Any  # (trials, agents, 4) float64: each agent's current [x, ẋ, θ, θ̇]
    action: Any  # (trials, agents) int64: the action already chosen for that state
    shared: Any  # (trials, 72) float64: Q_total of the last share (what tests measure)
    max_bias: float  # the current max-bias of equation (9)
    step: int  # steps per agent done so far
    shares: int  # sharing points passed
    alpha: Any = None  # (trials, agents) float64: each agent's step size α
    lam: Any = None  # (trials, agents) float64: each agent's trace decay λ
    epsilon: Any = None  # (trials, agents) float64: each agent's exploration ε
    agent_id: Any = None  # (trials, agents) int64: stable identity of the agent in each slot (lineage)
    fitness: Any = None  # (trials, agents) float64: what the last selection ranked by (NaN before any)
    failures: Any = None  # (trials, agents) int64: failures since the last selection (since the start
    #   without replication)
    lineage: Any = None  # popplay.operators.evolution.Lineage: every copy, mutation, share, quarantine and reset


# Parameters the lineage records for cart-pole agents (values after each event;
# ``noise``: the std of the Gaussian noise a mutation added to the copied Q values).
LINEAGE_PARAMETERS = ("alpha", "lam", "epsilon", "noise")


def make_rules(xp: Any) -> SimpleNamespace:
    """The cart-pole's dynamics and learning rules for array namespace ``xp``.

    ``phys`` arguments are :meth:`CartPoleParams.vector` (an array or a sequence of
    floats), ``bounds`` is :meth:`CartPolePopulationParams.bounds`. Flags such as
    ``accumulate`` are static Python/numba booleans, never tensors.
    """
    rng = _rng.make_rng(xp)
    srl = rng.srl
    uniform_hi32 = rng.uniform_hi32
    uniform_lo32 = rng.uniform_lo32

    @xp.fn
    def sin_cos(x):
        """(sin x, cos x) from + - * / and floor: fdlibm kernels after reduction by π/2."""
        k = xp.floor(x * _TWO_OVER_PI + 0.5)
        r = (x - k * _PIO2_HI) - k * _PIO2_LO
        z = r * r
        v = z * r
        ps = _S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))
        s = r + v * (_S1 + z * ps)
        pc = z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * (_C5 + z * _C6)))))
        hz = 0.5 * z
        w = 1.0 - hz
        c = w + (((1.0 - w) - hz) + z * pc)
        quadrant = k - 4.0 * xp.floor(k * 0.25)
        sin = xp.where(quadrant == 0.0, s, xp.where(quadrant == 1.0, c, xp.where(quadrant == 2.0, -s, -c)))
        cos = xp.where(quadrant == 0.0, c, xp.where(quadrant == 1.0, -s, xp.where(quadrant == 2.0, -c, s)))
        return sin, cos

    @xp.fn
    def sign(v):
        """-1, 0 or 1 as a float (via integers: torch's where of two Python floats
        would be float32)."""
        return xp.to_float(xp.where(v > 0.0, 1, 0)) - xp.to_float(xp.where(v < 0.0, 1, 0))

    @xp.fn
    def dynamics(x, x_dot, theta, theta_dot, action, phys):
        """One Euler step (Brownlee 2005, eqs. for θ̈ and ẍ with friction).

        Returns ``(x, ẋ, θ, θ̇, failed)`` of the next state; ``failed`` when the
        next state is off the track or past the angle limit.
        """
        force = phys[_F] * xp.to_float(2 * action - 1)
        sin, cos = sin_cos(theta)
        friction_cart = phys[_MUC] * sign(x_dot)
        spin = theta_dot * theta_dot * sin
        temp = ((-force - phys[_ML] * spin) + friction_cart) * phys[_INV_TOTAL]
        numerator = (phys[_G] * sin + cos * temp) - phys[_MUP] * theta_dot * phys[_INV_ML]
        denominator = phys[_L] * (4.0 / 3.0 - phys[_MP] * cos * cos * phys[_INV_TOTAL])
        theta_acc = numerator / denominator
        x_acc = ((force + phys[_ML] * (spin - theta_acc * cos)) - friction_cart) * phys[_INV_TOTAL]
        nx = x + phys[_TAU] * x_dot
        nx_dot = x_dot + phys[_TAU] * x_acc
        ntheta = theta + phys[_TAU] * theta_dot
        ntheta_dot = theta_dot + phys[_TAU] * theta_acc
        failed = ((nx < -phys[_X_LIMIT]) | (nx > phys[_X_LIMIT])
                  | (ntheta < -phys[_THETA_LIMIT]) | (ntheta > phys[_THETA_LIMIT]))
        return nx, nx_dot, ntheta, ntheta_dot, failed

    @xp.fn
    def box(x, x_dot, theta, theta_dot, bounds):
        """Bell's 36 boxes: ((position * 3 + angle) * 2 + [ẋ > 0]) * 2 + [θ̇ > 0]."""
        position = xp.where(x < -bounds[0], 0, xp.where(x > bounds[0], 2, 1))
        angle = xp.where(theta < -bounds[1], 0, xp.where(theta > bounds[1], 2, 1))
        return ((position * 3 + angle) * 2 + xp.where(x_dot > 0.0, 1, 0)) * 2 + xp.where(theta_dot > 0.0, 1, 0)

    @xp.fn
    def coin(word):
        """A fair bit (bit 31), independent of the ε test (bits 32-63)."""
        return srl(word, 31) & 1

    @xp.fn
    def greedy(q_left, q_right, tie):
        """The greedy action; ``tie`` (0 or 1) where both values are equal."""
        return xp.where(q_right > q_left, 1, xp.where(q_left > q_right, 0, tie))

    @xp.fn
    def choose(word, q_left, q_right, epsilon):
        """ε-greedy: explore when the word's high half is below ε."""
        bit = coin(word)
        return xp.where(uniform_hi32(word) < epsilon, bit, greedy(q_left, q_right, bit))

    @xp.fn
    def start_value(u, start_range):
        return (2.0 * u - 1.0) * start_range

    @xp.fn
    def start_state(word1, word2, start_range):
        """A random start: each variable uniform in [-r, r) from 32 bits."""
        return (start_value(uniform_hi32(word1), start_range), start_value(uniform_lo32(word1), start_range),
                start_value(uniform_hi32(word2), start_range), start_value(uniform_lo32(word2), start_range))

    @xp.fn
    def target(q_left, q_right, action, watkins):
        """Q(s', a') for Sarsa; max_a Q(s', a) for Watkins' Q(λ)."""
        if watkins:
            return xp.where(q_left > q_right, q_left, q_right)
        return xp.where(action == 1, q_right, q_left)

    @xp.fn
    def td_error(failed, failure_reward, gamma, q_next, q_sa):
        """δ = r + γ Q' - Q(s, a); at a failure r = failure_reward and Q' = 0."""
        return xp.where(failed, failure_reward, gamma * q_next) - q_sa

    @xp.fn
    def bump(e_hat, inv_clock, accumulate):
        """The scaled trace of the visited state-action: 1 (replacing) or e + 1
        (accumulating) in true units, i.e. ``1 / clock`` added or set."""
        if accumulate:
            return e_hat + inv_clock
        return inv_clock + 0.0 * e_hat

    @xp.fn
    def effective(q, e_hat, d_sum, d_start):
        """Q of a state-action whose pending updates Σ_t αδ_t e_t = ê (D - D_start) have
        not been folded in yet (exactly q where ê = 0)."""
        return q + e_hat * (d_sum - d_start)

    @xp.fn
    def advance(d_sum, step_size, clock):
        """D += αδc: this step's update of every live trace, in ê units."""
        return d_sum + step_size * clock

    @xp.fn
    def flush(w, alpha, e_hat, clock_sum, start):
        """Equation (5) summed over a stretch of steps: w += α Σ_t e_t = α ê (C - C_start)."""
        return w + (alpha * e_hat) * (clock_sum - start)

    return SimpleNamespace(
        sin_cos=sin_cos, sign=sign, dynamics=dynamics, box=box, coin=coin, greedy=greedy,
        choose=choose, start_state=start_state, target=target, td_error=td_error, bump=bump,
        effective=effective, advance=advance, flush=flush, rng=rng,
    )


def make_step(xp: Any) -> Any:
    """The dynamics rule alone: ``step(x, ẋ, θ, θ̇, action, phys) -> (x, ẋ, θ, θ̇, failed)``
    for namespace ``xp`` (see :func:`make_rules`)."""
    return make_rules(xp).dynamics


# ---------------------------------------------------------------------------
# Public NumPy API


def step(state: np.ndarray, action: Any, params: CartPoleParams | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Advance cart-pole states by one Euler step.

    Args:
        state: float array shaped (..., 4) ordered [x, ẋ, θ, θ̇] (m, m/s, rad, rad/s).
        action: 0 (push left) or 1 (push right), broadcastable to ``state.shape[:-1]``.
        params: physical constants (default :class:`CartPoleParams`, Barto's friction).

    Returns:
        ``(next_state, failed)``: the next states shaped like ``state`` and a boolean
        array that is True where the next state is off the track or past the angle
        limit. The same rule, bit for bit, drives both backends' learning loops.
    """
    import torch  # defers torch

    from popplay.xp import th  # defers torch

    params = params if params is not None else CartPoleParams()
    params.validate()
    s = np.asarray(state, dtype=np.float64)
    if s.ndim < 1 or s.shape[-1] != 4:
        raise ValueError(f"state must be shaped (..., 4) as [x, x_dot, theta, theta_dot] (got {s.shape})")
    a = np.asarray(action)
    if a.dtype.kind not in "biu" or not np.isin(a, (0, 1)).all():
        raise ValueError("action must be 0 (push left) or 1 (push right)")
    a = np.broadcast_to(a.astype(np.int64), s.shape[:-1])
    if not np.isfinite(s).all():
        raise ValueError("state must be finite")
    if (np.abs(s[..., 2]) > TRIG_DOMAIN).any():
        raise ValueError(f"theta must satisfy |theta| <= {TRIG_DOMAIN:.6g}")
    rules = _rules_for(th)
    t = torch.from_numpy(s.copy())  # copies: ascontiguousarray would make 0-d arrays 1-d
    nx, nxd, nth, nthd, failed = rules.dynamics(t[..., 0], t[..., 1], t[..., 2], t[..., 3],
                                                torch.from_numpy(a.copy()),
                                                tuple(float(v) for v in params.vector()))
    out = torch.stack([nx, nxd, nth, nthd], dim=-1).numpy()
    return out, np.asarray(failed.numpy(), dtype=bool)


def box_index(state: np.ndarray, position_boundary: float = 1.0, angle_boundary_degrees: float = 2.0) -> np.ndarray:
    """Bell's box (0..35) of each state shaped (..., 4); see :func:`make_rules`."""
    import torch  # defers torch

    from popplay.xp import th  # defers torch

    s = np.asarray(state, dtype=np.float64)
    if s.ndim < 1 or s.shape[-1] != 4:
        raise ValueError(f"state must be shaped (..., 4) (got {s.shape})")
    bounds = (float(position_boundary), float(angle_boundary_degrees) * (math.pi / 180.0))
    t = torch.from_numpy(s.copy())
    return _rules_for(th).box(t[..., 0], t[..., 1], t[..., 2], t[..., 3], bounds).numpy()


_RULES: dict[str, SimpleNamespace] = {}


def _rules_for(xp: Any) -> SimpleNamespace:
    if xp.__name__ not in _RULES:
        _RULES[xp.__name__] = make_rules(xp)
    return _RULES[xp.__name__]


# ---------------------------------------------------------------------------
# Streams and the state before learning


def learn_keys(seed: int, trials: np.ndarray, agents: np.ndarray) -> np.ndarray:
    """Key of each (trial, agent) learning stream, shaped (len(trials), len(agents))."""
    return _rng.stream_keys(seed, TAG_CARTPOLE_LEARN, trials, agents)


def bias_keys(seed: int, trials: np.ndarray, agents: np.ndarray) -> np.ndarray:
    """Key of each (trial, agent) differentiation stream (equation (9))."""
    return _rng.stream_keys(seed, TAG_CARTPOLE_BIAS, trials, agents)


def test_keys(seed: int, trials: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Key of each (trial, test start) stream of the greedy test (§2.5)."""
    return _rng.stream_keys(seed, TAG_CARTPOLE_TEST, trials, starts)


def initial_state(params: CartPolePopulationParams, keys: np.ndarray | None = None) -> CartPoleState:
    """Q = 0, no traces, initial weights, the run's α, λ, ε for every agent, and every
    agent at a random start (the words of step 0) with its first ε-greedy action
    already chosen (NumPy arrays). Agents get ids 0, 1, … (row-major over trials and
    agents), each recorded as a founder in a new lineage log.

    ``keys`` may be the learning keys of a block of trials (a rank of the trial
    layout): the tables, traces, weights, carts, actions and failure counts are then
    that block's, everything else the whole population's."""

    p = params
    if keys is None:
        keys = learn_keys(p.seed, np.arange(p.trials), np.arange(p.agents))
    r = _rules_for(npx)  # NumPy: the numba path must not pay for importing torch
    k = np.ascontiguousarray(keys, dtype=np.int64)
    word = [r.rng.draw(k, r.rng.mix_counter(np.int64(slot))) for slot in range(WORDS_PER_STEP)]
    x, xd, th_, thd = r.start_state(word[1], word[2], p.start_range)
    zeros = np.zeros(keys.shape, dtype=np.float64)
    action = r.choose(word[0], zeros, zeros, p.epsilon)
    block = k.shape
    shape = block + (STATE_ACTIONS,)
    population = (p.trials, p.agents)
    ids = initial_ids(population)
    lineage = Lineage.start(ids, LINEAGE_PARAMETERS, {"alpha": p.alpha, "lam": p.lam, "epsilon": p.epsilon})
    return CartPoleState(
        q=np.zeros(shape), trace=np.zeros(shape), weight=np.full(shape, p.initial_weight),
        cart=np.stack(np.broadcast_arrays(x, xd, th_, thd), axis=-1).astype(np.float64),
        action=np.asarray(action).astype(np.int64),
        shared=np.zeros((p.trials, STATE_ACTIONS)), max_bias=float(p.bias), step=0, shares=0,
        alpha=np.full(population, float(p.alpha)), lam=np.full(population, float(p.lam)),
        epsilon=np.full(population, float(p.epsilon)), agent_id=ids, fitness=np.full(population, np.nan),
        failures=np.zeros(block, dtype=np.int64), lineage=lineage,
    )
