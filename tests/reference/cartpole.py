"""Slow plain-Python reference of the cart-pole population (for tests only).

Written from the rules as stated, with Python lists and floats: Brownlee's
equations of motion with friction and explicit Euler steps, Bell's 36 boxes, dense
TD(λ) over all 72 state-actions (Sarsa(λ) or Watkins' Q(λ), replacing or
accumulating traces in the clock-scaled, deferred form of the package docs,
traces below the cutoff set to 0), equation (5) for the weights, equations (6)–(8) with sums over agents in the documented pairwise tree
(built level by level here, as a list of lists), equations (9)–(10), selective
replication with variation before the share (truncation selection on failures,
written here as a sort), and the greedy test of §2.5. It shares with the package
only the random streams, the variation draws of ``popplay.operators.evolution`` (keyed by
seed, generation and agent id) and the deterministic ``sin_cos`` (each tested on its
own against ``math``). Every agent carries its own α, λ and ε.

The arithmetic is spelled out in the same order as the package's rule (the physics
constants enter as the same precomputed reciprocals), so results agree bit for bit.
"""
from __future__ import annotations

import math

from popplay.games.cartpole.rules import CartPolePopulationParams, make_rules
from popplay.rng import make_rng
from popplay.xp import py

RNG = make_rng(py)
SIN_COS = make_rules(py).sin_cos
STATE_ACTIONS = 72
CLOCK_RESTARTS = [0]  # how often a clock fell below 2**-8 (lets tests see that path run)


def word(key: int, counter: int) -> int:
    return RNG.draw(int(key), RNG.mix_counter(counter))


def hi32(w: int) -> float:
    return ((w >> 32) & 0xFFFFFFFF) / 2.0**32


def lo32(w: int) -> float:
    return (w & 0xFFFFFFFF) / 2.0**32


def constants(params: CartPolePopulationParams) -> dict[str, float]:
    total = params.cart_mass + params.pole_mass
    ml = params.pole_mass * params.pole_half_length
    return {
        "g": params.gravity, "mp": params.pole_mass, "l": params.pole_half_length, "F": params.force,
        "tau": params.tau, "muc": params.cart_friction, "mup": params.pole_friction,
        "inv_total": 1.0 / total, "ml": ml, "inv_ml": 1.0 / ml, "x_limit": params.track_limit,
        "theta_limit": params.angle_limit_degrees * (math.pi / 180.0),
    }


def dynamics(state, action, c):
    """Brownlee (2005): θ̈ and ẍ with cart and pole friction, then one Euler step."""
    x, x_dot, theta, theta_dot = state
    force = c["F"] if action == 1 else -c["F"]
    sin, cos = SIN_COS(theta)
    sgn = 1.0 if x_dot > 0 else (-1.0 if x_dot < 0 else 0.0)
    friction = c["muc"] * sgn
    spin = theta_dot * theta_dot * sin
    temp = ((-force - c["ml"] * spin) + friction) * c["inv_total"]
    theta_acc = ((c["g"] * sin + cos * temp) - c["mup"] * theta_dot * c["inv_ml"]) / (
        c["l"] * (4.0 / 3.0 - c["mp"] * cos * cos * c["inv_total"]))
    x_acc = ((force + c["ml"] * (spin - theta_acc * cos)) - friction) * c["inv_total"]
    nxt = [x + c["tau"] * x_dot, x_dot + c["tau"] * x_acc, theta + c["tau"] * theta_dot,
           theta_dot + c["tau"] * theta_acc]
    failed = abs(nxt[0]) > c["x_limit"] or abs(nxt[2]) > c["theta_limit"]
    return nxt, failed


def box(state, params: CartPolePopulationParams) -> int:
    x, x_dot, theta, theta_dot = state
    xb = params.position_boundary
    ab = params.angle_boundary_degrees * (math.pi / 180.0)
    position = 0 if x < -xb else (2 if x > xb else 1)
    angle = 0 if theta < -ab else (2 if theta > ab else 1)
    return ((position * 3 + angle) * 2 + (1 if x_dot > 0 else 0)) * 2 + (1 if theta_dot > 0 else 0)


def start(key: int, step: int, start_range: float):
    w1, w2 = word(key, 3 * step + 1), word(key, 3 * step + 2)
    return [(2.0 * u - 1.0) * start_range for u in (hi32(w1), lo32(w1), hi32(w2), lo32(w2))]


def choose(w: int, q_left: float, q_right: float, epsilon: float) -> int:
    bit = (w >> 31) & 1
    if hi32(w) < epsilon:
        return bit
    if q_right > q_left:
        return 1
    if q_left > q_right:
        return 0
    return bit


def initial_agent(params: CartPolePopulationParams, key: int) -> dict:
    cart = start(key, 0, params.start_range)
    return {"q": [0.0] * STATE_ACTIONS, "e": [0.0] * STATE_ACTIONS,
            "w": [params.initial_weight] * STATE_ACTIONS, "cart": cart,
            "action": choose(word(key, 0), 0.0, 0.0, params.epsilon),
            "alpha": params.alpha, "lam": params.lam, "epsilon": params.epsilon}


def learn(agent: dict, params: CartPolePopulationParams, key: int, first_step: int, n_steps: int) -> int:
    """Advance one agent in place; return its failures.

    TD(λ) in the deferred, clock-scaled form (``popplay.games.cartpole.rules``, "Traces"):
    e = ê·c with c ← γλc; D = Σ αδc and C = Σ c; Q = q + ê(D − D_start) and
    w gains αê(C − C_start) when a stretch of constant ê ends (bump, death, clear,
    clock restart below 2**-8, phase end); a trace dies when ê < cutoff/c.
    """
    c = constants(params)
    p = params
    alpha, lam, epsilon = agent["alpha"], agent["lam"], agent["epsilon"]
    q, w = agent["q"], agent["w"]
    e_hat = list(agent["e"])
    c_start = [0.0] * STATE_ACTIONS
    d_start = [0.0] * STATE_ACTIONS
    clock, clock_sum, d_sum = 1.0, 0.0, 0.0
    cart, a = agent["cart"], agent["action"]
    failures = 0

    def value(j):
        return q[j] + e_hat[j] * (d_sum - d_start[j])

    def fold(j):
        q[j] = value(j)
        w[j] = w[j] + (alpha * e_hat[j]) * (clock_sum - c_start[j])

    for step in range(first_step, first_step + n_steps):
        s = box(cart, p)
        nxt, failed = dynamics(cart, a, c)
        wd = word(key, 3 * (step + 1))
        sa = 2 * s + a
        if failed:
            delta = p.failure_reward - value(sa)
            keep = False
        else:
            s2 = box(nxt, p)
            left, right = value(2 * s2), value(2 * s2 + 1)
            a2 = choose(wd, left, right, epsilon)
            if p.algorithm == "q":
                q_next = max(left, right)
                keep = (right if a2 == 1 else left) == q_next
            else:
                q_next = right if a2 == 1 else left
                keep = True
            delta = p.gamma * q_next - value(sa)
        fold(sa)
        e_hat[sa] = e_hat[sa] + 1.0 / clock if p.trace == "accumulating" else 1.0 / clock
        c_start[sa], d_start[sa] = clock_sum, d_sum
        clock_sum = clock_sum + clock
        d_sum = d_sum + (alpha * delta) * clock
        decayed = clock * (p.gamma * lam)
        for j in range(STATE_ACTIONS):
            if e_hat[j] != 0.0 and (not keep or e_hat[j] < p.trace_cutoff / decayed):
                fold(j)
                e_hat[j] = 0.0
        if keep and decayed < 2.0**-8:
            CLOCK_RESTARTS[0] += 1
            for j in range(STATE_ACTIONS):
                if e_hat[j] != 0.0:
                    fold(j)
                    e_hat[j] = e_hat[j] * decayed
                c_start[j] = d_start[j] = 0.0
            clock, clock_sum, d_sum = 1.0, 0.0, 0.0
        elif keep:
            clock = decayed
        else:
            clock, clock_sum, d_sum = 1.0, 0.0, 0.0
        if failed:
            failures += 1
            cart = start(key, step + 1, p.start_range)
            s2 = box(cart, p)
            a2 = choose(wd, q[2 * s2], q[2 * s2 + 1], epsilon)
        else:
            cart = nxt
        a = a2
    for j in range(STATE_ACTIONS):
        if e_hat[j] != 0.0:
            fold(j)
    agent["e"] = [v * clock for v in e_hat]
    agent["cart"], agent["action"] = cart, a
    return failures


def tree_sum(values: list[float]) -> float:
    """Pairs (0, 1), (2, 3), … at each level; an odd last element moves up as is."""
    level = list(values)
    while len(level) > 1:
        nxt = [level[2 * i] + level[2 * i + 1] for i in range(len(level) // 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def share(agents: list[dict], initial_weight: float) -> list[float]:
    """Equations (6)-(8) in place; returns Q_total."""
    n = len(agents)
    total = []
    for j in range(STATE_ACTIONS):
        weighted = tree_sum([ag["q"][j] * ag["w"][j] for ag in agents])
        weight = tree_sum([ag["w"][j] for ag in agents])
        plain = tree_sum([ag["q"][j] for ag in agents]) * (1.0 / n)
        total.append(weighted / weight if weight > 0.0 else plain)
    for ag in agents:
        ag["q"] = list(total)
        ag["w"] = [initial_weight] * STATE_ACTIONS
    return total


def differentiate(agents: list[dict], bias_keys, counter: int, max_bias: float) -> None:
    """Equation (9) in place: Rand(-1, 1) from a 32-bit half of a word per item."""
    for ag, key in zip(agents, bias_keys):
        for j in range(STATE_ACTIONS):
            w = word(key, counter + j // 2)
            u = lo32(w) if j % 2 else hi32(w)
            ag["q"][j] = ag["q"][j] + (2.0 * u - 1.0) * max_bias


def select(fitness: list[float], fraction: float) -> tuple[list[int], list[int]]:
    """Truncation selection in one trial: sort the agents best first (ties: lower
    index first); the k-th worst (child) is replaced by the k-th best (parent)."""
    n = len(fitness)
    count = min(n // 2, max(1, round(fraction * n)))
    order = sorted(range(n), key=lambda i: (-fitness[i], i))
    return order[:count], order[::-1][:count]


def replicate(trials: list[list[dict]], starts: list[list[list[float]]], since: list[list[int]],
              ids: list[list[int]], next_id: int, params: CartPolePopulationParams, generation: int) -> int:
    """Selective replication with variation in place (before the share); returns the
    next free id. Fitness: minus the failures since the last selection. A child's
    table becomes its own learned table plus (parent's start table − its own start
    table); it keeps its weights; α, λ, ε are the parent's times the variation."""
    from popplay.operators.evolution import gaussian_noise, vary_factors

    p = params
    for t, agents in enumerate(trials):
        parents, children = select([-float(f) for f in since[t]], p.replicate_fraction)
        snapshot = [{name: ag[name] for name in ("alpha", "lam", "epsilon")} for ag in agents]
        for parent, child in zip(parents, children):
            ag = agents[child]
            ag["q"] = [v + (a - b) for v, a, b in zip(ag["q"], starts[t][parent], starts[t][child])]
            ids[t][child] = next_id
            next_id += 1
            factors = vary_factors(p.seed, generation, [ids[t][child]], ("alpha", "lam", "epsilon"), p.mutate_params)
            noise = gaussian_noise(p.seed, generation, [ids[t][child]], STATE_ACTIONS, p.mutate_q)[0]
            for name in ("alpha", "lam", "epsilon"):
                ag[name] = min(max(snapshot[parent][name] * float(factors[name][0]), 0.0), 1.0)
            ag["q"] = [v + float(n) for v, n in zip(ag["q"], noise)]
    return next_id


def run(params: CartPolePopulationParams, keys, bias_keys, per_agent: dict | None = None) -> list[dict]:
    """Every phase of every trial; returns a snapshot after each share.

    ``per_agent`` optionally maps "alpha", "lam", "epsilon" to (trials, agents)
    nested lists: each agent's own value from the start."""
    p = params
    trials = [[initial_agent(p, keys[t][i]) for i in range(p.agents)] for t in range(p.trials)]
    for name, values in (per_agent or {}).items():
        for t, agents in enumerate(trials):
            for i, ag in enumerate(agents):
                ag[name] = float(values[t][i])
    ids = [[t * p.agents + i for i in range(p.agents)] for t in range(p.trials)]
    next_id = p.trials * p.agents
    since = [[0] * p.agents for _ in range(p.trials)]
    shared = [[0.0] * STATE_ACTIONS for _ in range(p.trials)]
    max_bias = p.bias
    step = 0
    shares = 0
    history = []
    while step < p.steps_per_agent:
        length = min(p.share_every, p.steps_per_agent - step)
        starts = [[list(ag["q"]) for ag in agents] for agents in trials]
        failures = [[learn(ag, p, keys[t][i], step, length) for i, ag in enumerate(trials[t])]
                    for t in range(p.trials)]
        since = [[a + b for a, b in zip(row, new)] for row, new in zip(since, failures)]
        if p.replicate_every and (shares + 1) % p.replicate_every == 0:
            next_id = replicate(trials, starts, since, ids, next_id, p, shares + 1)
            since = [[0] * p.agents for _ in range(p.trials)]
        for t in range(p.trials):
            shared[t] = share(trials[t], p.initial_weight)
            if max_bias > 0.0 and p.agents > 1:
                differentiate(trials[t], bias_keys[t], shares * STATE_ACTIONS, max_bias)
        if max_bias > 0.0 and p.agents > 1:
            max_bias = max_bias / p.bias_decay
        step += length
        shares += 1
        history.append({
            "q": [[list(ag["q"]) for ag in agents] for agents in trials],
            "trace": [[list(ag["e"]) for ag in agents] for agents in trials],
            "weight": [[list(ag["w"]) for ag in agents] for agents in trials],
            "cart": [[list(ag["cart"]) for ag in agents] for agents in trials],
            "action": [[ag["action"] for ag in agents] for agents in trials],
            "shared": [list(row) for row in shared],
            "alpha": [[ag["alpha"] for ag in agents] for agents in trials],
            "lam": [[ag["lam"] for ag in agents] for agents in trials],
            "epsilon": [[ag["epsilon"] for ag in agents] for agents in trials],
            "agent_id": [list(row) for row in ids],
            "failures": failures, "max_bias": max_bias, "step": step, "shares": shares,
        })
    return history


def greedy_test(shared: list[float], params: CartPolePopulationParams, key: int) -> int:
    """Steps balanced by the greedy policy of ``shared`` from the start of ``key``."""
    c = constants(params)
    cart = start(key, 0, params.start_range)
    for n in range(params.test_steps):
        s = box(cart, params)
        left, right = shared[2 * s], shared[2 * s + 1]
        if right > left:
            a = 1
        elif left > right:
            a = 0
        else:
            a = (word(key, 3 * n) >> 31) & 1
        cart, failed = dynamics(cart, a, c)
        if failed:
            return n
    return params.test_steps
