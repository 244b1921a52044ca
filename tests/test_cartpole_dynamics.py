"""Cart-pole dynamics: hand-computed transitions, friction variants, bit-exact rules."""
from __future__ import annotations

import math

import numba
import numpy as np
import pytest
import torch

from popplay.games.cartpole import rules as cartpole
from popplay.games.cartpole.rules import CartPoleParams, box_index, make_rules, step
from popplay.xp import nb, py, th

FRICTIONLESS = CartPoleParams(cart_friction=0.0, pole_friction=0.0)


def barto(state, action, p: CartPoleParams):
    """Brownlee's equations with friction, in textbook form with math.sin/cos."""
    x, x_dot, theta, theta_dot = state
    force = p.force if action == 1 else -p.force
    m, mc, l, g = p.pole_mass, p.cart_mass, p.pole_half_length, p.gravity
    sgn = float(np.sign(x_dot))
    s, c = math.sin(theta), math.cos(theta)
    theta_acc = (g * s + c * ((-force - m * l * theta_dot**2 * s + p.cart_friction * sgn) / (mc + m))
                 - p.pole_friction * theta_dot / (m * l)) / (l * (4.0 / 3.0 - m * c * c / (mc + m)))
    x_acc = (force + m * l * (theta_dot**2 * s - theta_acc * c) - p.cart_friction * sgn) / (mc + m)
    return np.array([x + p.tau * x_dot, x_dot + p.tau * x_acc, theta + p.tau * theta_dot,
                     theta_dot + p.tau * theta_acc])


def test_push_right_from_rest_matches_hand_computation():
    # temp = 100/11, θ̈ = -(100/11) / (0.5 (4/3 - 1/11)) = -600/41, ẍ = 400/41.
    nxt, failed = step(np.zeros(4), 1, FRICTIONLESS)
    np.testing.assert_allclose(nxt, [0.0, 0.02 * 400 / 41, 0.0, -0.02 * 600 / 41], rtol=0, atol=1e-15)
    assert not failed
    left, _ = step(np.zeros(4), 0, FRICTIONLESS)
    np.testing.assert_array_equal(left, -nxt)


def test_friction_at_rest_changes_nothing_and_default_is_barto():
    assert CartPoleParams().cart_friction == 0.0005 and CartPoleParams().pole_friction == 0.000002
    np.testing.assert_array_equal(step(np.zeros(4), 1)[0], step(np.zeros(4), 1, FRICTIONLESS)[0])


def test_cart_friction_opposes_motion_by_hand():
    # ẋ = 1 > 0: temp = (-10 + 0.0005)/1.1, θ̈ = temp·66/41, ẍ = (10 - 0.05 θ̈ - 0.0005)/1.1.
    temp = (-10 + 0.0005) / 1.1
    theta_acc = temp * 66 / 41
    x_acc = (10 - 0.05 * theta_acc - 0.0005) / 1.1
    nxt, _ = step(np.array([0.0, 1.0, 0.0, 0.0]), 1)
    np.testing.assert_allclose(nxt, [0.02, 1 + 0.02 * x_acc, 0.0, 0.02 * theta_acc], rtol=0, atol=1e-14)
    frictionless, _ = step(np.array([0.0, 1.0, 0.0, 0.0]), 1, FRICTIONLESS)
    assert nxt[1] < frictionless[1]  # friction slows a cart moving right
    assert nxt[1] - frictionless[1] == pytest.approx(-0.02 * 0.0005 / 1.1 * (1 + 0.05 * 66 / 41 / 1.1),
                                                     rel=1e-6)


def test_pole_friction_damps_rotation_by_hand():
    # θ̇ = 1, θ = 0: the pole term -μ_p θ̇ / (m l) = -0.00004 enters θ̈'s numerator.
    with_friction, _ = step(np.array([0.0, 0.0, 0.0, 1.0]), 1, CartPoleParams(cart_friction=0.0))
    without, _ = step(np.array([0.0, 0.0, 0.0, 1.0]), 1, FRICTIONLESS)
    assert with_friction[3] - without[3] == pytest.approx(-0.02 * 0.00004 * 66 / 41, rel=1e-9)
    assert with_friction[1] - without[1] == pytest.approx(0.02 * 0.05 * 0.00004 * 66 / 41 / 1.1, rel=1e-6)


@pytest.mark.parametrize("params", [CartPoleParams(), FRICTIONLESS], ids=["barto", "frictionless"])
def test_step_agrees_with_textbook_equations(params):
    rng = np.random.default_rng(3)
    states = rng.uniform([-2.4, -3, -0.21, -3], [2.4, 3, 0.21, 3], size=(500, 4))
    actions = rng.integers(0, 2, 500)
    nxt, failed = step(states, actions, params)
    expected = np.array([barto(s, a, params) for s, a in zip(states, actions)])
    np.testing.assert_allclose(nxt, expected, rtol=1e-12, atol=1e-12)
    limit = params.angle_limit
    np.testing.assert_array_equal(failed, (np.abs(expected[:, 0]) > 2.4) | (np.abs(expected[:, 2]) > limit))


def test_frictionless_matches_gymnasium():
    # A plain import: the dev install includes gymnasium, and a cross-check that skips checks nothing.
    import gymnasium

    env = gymnasium.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for state, action in zip(rng.uniform(-0.2, 0.2, (200, 4)), rng.integers(0, 2, 200)):
        env.state = state.copy()
        env.step(int(action))
        np.testing.assert_allclose(step(state, action, FRICTIONLESS)[0], np.asarray(env.state), rtol=0, atol=1e-15)


def test_failure_flags_and_limits():
    states = np.array([
        [2.39, 1.0, 0.0, 0.0],  # x' = 2.41 > 2.4
        [-2.39, -1.0, 0.0, 0.0],
        [0.0, 0.0, 0.2, 1.0],  # θ' = 0.22 > 12°
        [0.0, 0.0, -0.2, -1.0],
        [2.3, 1.0, 0.2, 0.0],  # inside on both
    ])
    _, failed = step(states, 1)
    np.testing.assert_array_equal(failed, [True, True, True, True, False])
    _, failed = step(np.array([0.0, 0.0, 0.2, 1.0]), 1, CartPoleParams(angle_limit_degrees=15.0))
    assert not failed


def test_step_broadcasts_and_rejects_bad_input():
    states = np.zeros((3, 2, 4))
    nxt, failed = step(states, 1)
    assert nxt.shape == (3, 2, 4) and failed.shape == (3, 2)
    nxt, _ = step(states, np.array([0, 1]))
    assert nxt[0, 0, 1] < 0 < nxt[0, 1, 1]
    with pytest.raises(ValueError, match="shaped"):
        step(np.zeros(3), 1)
    with pytest.raises(ValueError, match="action"):
        step(np.zeros(4), 2)
    with pytest.raises(ValueError, match="action"):
        step(np.zeros(4), 0.5)
    with pytest.raises(ValueError, match="finite"):
        step(np.array([0.0, np.nan, 0.0, 0.0]), 1)
    with pytest.raises(ValueError, match="pole_mass"):
        step(np.zeros(4), 1, CartPoleParams(pole_mass=0.0))
    with pytest.raises(ValueError, match="cart_friction"):
        step(np.zeros(4), 1, CartPoleParams(cart_friction=-1.0))
    state = np.zeros(4)
    step(state, 1)
    assert not state.any()  # input untouched


def test_box_index_by_hand():
    cases = {
        (0.0, -1.0, 0.0, -1.0): ((1 * 3 + 1) * 2 + 0) * 2 + 0,  # centre, both velocities negative
        (0.0, 1.0, 0.0, 1.0): ((1 * 3 + 1) * 2 + 1) * 2 + 1,
        (-1.5, 0.0, 0.0, 0.0): ((0 * 3 + 1) * 2 + 0) * 2 + 0,  # ẋ = 0 counts as not positive
        (1.5, 0.5, -0.05, -0.5): ((2 * 3 + 0) * 2 + 1) * 2 + 0,
        (1.0, 0.5, 0.05, 0.5): ((1 * 3 + 2) * 2 + 1) * 2 + 1,  # the boundary itself is the middle range
    }
    states = np.array(list(cases))
    np.testing.assert_array_equal(box_index(states), list(cases.values()))
    spread = np.random.default_rng(0).uniform([-3, -1, -0.1, -1], [3, 1, 0.1, 1], (5000, 4))
    assert set(box_index(spread).tolist()) == set(range(36))
    assert box_index(np.array([0.5, 0, 0, 0]), position_boundary=0.4) == ((2 * 3 + 1) * 2) * 2


def test_sin_cos_within_one_ulp_of_libm_and_identical_on_every_backend():
    rng = np.random.default_rng(1)
    xs = np.concatenate([rng.uniform(-0.25, 0.25, 3000), rng.uniform(-math.pi, math.pi, 3000),
                         rng.uniform(-1e4, 1e4, 3000), np.array([0.0, -0.0, math.pi / 4, 1e-300])])
    rp, rt = make_rules(py), make_rules(th)
    ref = np.array([rp.sin_cos(float(x)) for x in xs])
    libm = np.array([(math.sin(x), math.cos(x)) for x in xs])
    ulps = np.abs(ref - libm) / np.spacing(np.maximum(np.abs(libm), 1e-300))
    assert ulps.max() <= 1.0
    sin_cos_nb = make_rules(nb).sin_cos

    @numba.njit(cache=True)
    def batch(values, out):
        for i in range(values.size):
            out[i, 0], out[i, 1] = sin_cos_nb(values[i])

    out = np.empty((xs.size, 2))
    batch(xs, out)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(torch.stack(rt.sin_cos(torch.from_numpy(xs)), -1).numpy(), ref)


def test_dynamics_rule_is_bit_identical_on_numba_torch_and_python():
    from popplay.games.cartpole import _numba as kernels

    rng = np.random.default_rng(2)
    states = rng.uniform([-2.4, -3, -0.21, -3], [2.4, 3, 0.21, 3], size=(2000, 4))
    states[:10, 1] = 0.0  # sgn(0) = 0
    actions = rng.integers(0, 2, 2000)
    phys = tuple(float(v) for v in CartPoleParams().vector())
    dyn_nb = kernels._dynamics

    @numba.njit(cache=True)
    def batch(s, a, out, failed):
        for i in range(a.size):
            out[i, 0], out[i, 1], out[i, 2], out[i, 3], failed[i] = dyn_nb(s[i, 0], s[i, 1], s[i, 2], s[i, 3],
                                                                           a[i], phys)

    out = np.empty_like(states)
    failed = np.empty(2000, dtype=np.bool_)
    batch(states, actions, out, failed)
    rp = make_rules(py)
    expected = [rp.dynamics(*map(float, s), int(a), phys) for s, a in zip(states, actions)]
    np.testing.assert_array_equal(out, np.array([e[:4] for e in expected]))
    np.testing.assert_array_equal(failed, [e[4] for e in expected])
    torch_out, torch_failed = step(states, actions)
    np.testing.assert_array_equal(torch_out, out)
    np.testing.assert_array_equal(torch_failed, failed)


def test_trajectory_is_bit_identical_over_many_steps():
    """Unstable dynamics amplify any last-bit difference; 300 steps of the torch rule
    (the public step) and the Python rule must not drift at all."""
    rp = make_rules(py)
    phys = tuple(float(v) for v in FRICTIONLESS.vector())
    state = np.array([0.01, 0.0, 0.02, 0.0])
    py_state = [float(v) for v in state]
    for n in range(300):
        action = n % 3 == 0
        state, _ = step(state, int(action), FRICTIONLESS)
        py_state = list(rp.dynamics(*py_state, int(action), phys)[:4])
    np.testing.assert_array_equal(state, py_state)
    assert abs(state[2]) > 0.05  # it really went somewhere


def test_params_vector_and_validation():
    v = CartPoleParams().vector()
    assert v[cartpole._INV_TOTAL] == 1.0 / 1.1 and v[cartpole._ML] == 0.05
    assert CartPoleParams().angle_limit == pytest.approx(math.radians(12))
    with pytest.raises(ValueError, match="angle_limit_degrees"):
        CartPoleParams(angle_limit_degrees=95.0).validate()
