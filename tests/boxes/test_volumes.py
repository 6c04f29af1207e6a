"""Tests of perturb/boxes/volumes.py: hard, soft and Gumbel volumes, and the Bessel backward."""
import math

import numpy as np
import pytest
import scipy.special as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb._validation import set_validation
from perturb.boxes import EULER_GAMMA, Box, gumbel_side_length, volume
from perturb.boxes._bessel import _LogK0Exp, _u_max

SEPARATIONS = [-3.0, -1.0, -0.5, -0.1, 0.0, 0.2, 1.0, 2.5, 10.0]
BETAS = [0.05, 0.3, 1.0, 2.0]


def _exact_side(x: float, beta: float) -> float:
    """2β K0(2 exp(−x/(2β))) with scipy, in log space when K0 underflows."""
    z = 2.0 * math.exp(-x / (2.0 * beta))
    return 2.0 * beta * sp.k0(z)


def _exact_log_side(x: float, beta: float) -> float:
    z = 2.0 * math.exp(-x / (2.0 * beta))
    return math.log(2.0 * beta) + math.log(sp.k0e(z)) - z


def _mc_side(x: float, beta: float, n: int, gen: torch.Generator, wrong: bool = False):
    """Monte-Carlo mean and standard error of max(0, X_hi − X_lo), μ_lo = 0, μ_hi = x.

    Right orientation: X_lo ~ MaxGumbel(0, β), X_hi ~ MinGumbel(x, β) = −MaxGumbel(−x, β).
    ``wrong=True`` swaps them (MinGumbel lower corner, MaxGumbel upper corner).
    """
    g1 = -torch.log(-torch.log(torch.rand(n, generator=gen, dtype=torch.float64)))
    g2 = -torch.log(-torch.log(torch.rand(n, generator=gen, dtype=torch.float64)))
    if wrong:
        lo, hi = -beta * g1, x + beta * g2
    else:
        lo, hi = beta * g1, x - beta * g2
    s = (hi - lo).clamp(min=0)
    return s.mean().item(), s.std().item() / math.sqrt(n)


# ---------------------------------------------------------------------- exact Bessel form
@pytest.mark.parametrize("beta", BETAS)
def test_exact_side_matches_scipy(beta):
    x = torch.tensor(SEPARATIONS, dtype=torch.float64) * beta * 3
    got = gumbel_side_length(torch.zeros_like(x), x, beta)
    want = torch.tensor([_exact_side(v, beta) for v in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    got32 = gumbel_side_length(torch.zeros_like(x).float(), x.float(), beta)
    torch.testing.assert_close(got32, want.float(), rtol=2e-5, atol=0)


@pytest.mark.parametrize("x_over_beta", [-200.0, -50.0, -8.0, 0.0, 8.0, 39.0, 41.0, 60.0,
                                         200.0, 1000.0])
def test_exact_log_side_matches_scipy_in_log_space(x_over_beta):
    beta = 0.7
    x = torch.tensor([x_over_beta * beta], dtype=torch.float64)
    got = gumbel_side_length(torch.zeros_like(x), x, beta, log=True).item()
    want = _exact_log_side(x.item(), beta)
    assert got == pytest.approx(want, rel=1e-12)


def test_example_values_from_the_design():
    # The numbers quoted in DESIGN.md / docs: x = 0, β = 0.3 -> 0.0683; x = −0.5 -> 0.0034.
    x = torch.tensor([0.0, -0.5], dtype=torch.float64)
    exact = gumbel_side_length(torch.zeros_like(x), x, 0.3)
    approx = gumbel_side_length(torch.zeros_like(x), x, 0.3, approx=True)
    torch.testing.assert_close(exact, torch.tensor([0.06834, 0.003431], dtype=torch.float64),
                               rtol=1e-3, atol=0)
    torch.testing.assert_close(approx, torch.tensor([0.08221, 0.01735], dtype=torch.float64),
                               rtol=1e-3, atol=0)
    # the approximation is five times too large for separated corners
    assert approx[1] / exact[1] > 5
    # seed 001's "Example 1" box [0.2, 0.8]^2 at β = 0.1: expected volume 0.236 (not 0.35)
    b = Box(torch.full((2,), 0.2, dtype=torch.float64), torch.full((2,), 0.8, dtype=torch.float64))
    assert volume(b, beta=0.1).item() == pytest.approx(0.2364, abs=1e-4)


@pytest.mark.parametrize("x,beta", [(0.0, 0.3), (-0.5, 0.3), (1.0, 0.5), (0.4, 1.0)])
def test_exact_side_matches_monte_carlo(x, beta, generator):
    n = 200_000
    mean, se = _mc_side(x, beta, n, generator)
    want = gumbel_side_length(torch.tensor(0.0, dtype=torch.float64),
                              torch.tensor(x, dtype=torch.float64), beta).item()
    assert abs(mean - want) < 5 * se


def test_wrong_orientation_breaks_the_formula(generator):
    # MinGumbel lower / MaxGumbel upper corners (as some texts state it): the expected side is
    # 0.415 at x = 0, β = 0.3, far from the Bessel formula's 0.068.
    n = 200_000
    mean, se = _mc_side(0.0, 0.3, n, generator, wrong=True)
    formula = gumbel_side_length(torch.tensor(0.0), torch.tensor(0.0), 0.3).item()
    assert abs(mean - 0.415) < 5 * se
    assert abs(mean - formula) > 100 * se


@settings(max_examples=30, deadline=None)
@given(x=st.floats(-20, 20), beta=st.floats(0.01, 5.0))
def test_exact_side_jensen_and_positive(x, beta):
    # E[max(0, X_hi − X_lo)] >= max(0, E[X_hi − X_lo]) = max(0, x − 2βγ), and > 0.
    xt = torch.tensor(x, dtype=torch.float64)
    side = gumbel_side_length(torch.tensor(0.0, dtype=torch.float64), xt, beta)
    assert side.item() > 0 or x < -10 * beta  # underflows to 0 only far inside the tail
    assert side.item() >= max(0.0, x - 2 * beta * EULER_GAMMA) - 1e-12
    log_side = gumbel_side_length(torch.tensor(0.0, dtype=torch.float64), xt, beta, log=True)
    assert math.isfinite(log_side.item())


def test_side_is_increasing_and_tends_to_mean_width():
    beta = 0.4
    x = torch.linspace(-30, 30, 2001, dtype=torch.float64)
    ls = gumbel_side_length(torch.zeros_like(x), x, beta, log=True)
    assert bool((ls.diff() > 0).all())
    big = torch.tensor([20.0, 40.0], dtype=torch.float64)
    side = gumbel_side_length(torch.zeros_like(big), big, beta)
    torch.testing.assert_close(side, big - 2 * beta * EULER_GAMMA, rtol=1e-12, atol=0)


# ---------------------------------------------------------------------- approximation
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_approx_matches_its_formula(dtype):
    beta = 0.3
    x = torch.tensor([-3.0, -0.5, 0.0, 0.5, 4.0], dtype=dtype)
    got = gumbel_side_length(torch.zeros_like(x), x, beta, approx=True)
    want = beta * torch.log1p(torch.exp(x / beta - 2 * EULER_GAMMA))
    torch.testing.assert_close(got, want)
    # in log space even where softplus underflows
    far = torch.tensor([-1000.0 * beta], dtype=dtype)
    lg = gumbel_side_length(torch.zeros_like(far), far, beta, approx=True, log=True)
    assert lg.item() == pytest.approx(math.log(beta) - 1000.0 - 2 * EULER_GAMMA, rel=1e-6)


# ---------------------------------------------------------------------- extremes
@pytest.mark.parametrize("approx", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_far_apart_finite_value_and_gradient(dtype, approx):
    beta = 0.1
    x = torch.tensor([-1000.0, -300.0, -50.0, 50.0, 300.0, 1000.0], dtype=dtype) * beta
    x.requires_grad_(True)
    lo = torch.zeros_like(x)
    ls = gumbel_side_length(lo, x, beta, approx=approx, log=True)
    (g,) = torch.autograd.grad(ls.sum(), x)
    assert bool(torch.isfinite(ls).all()) and bool(torch.isfinite(g).all())
    assert bool((g > 0).all())                  # a larger separation, a larger side
    assert bool((ls.diff() > 0).all())          # monotone


def test_far_apart_float64_matches_asymptotics():
    beta = 0.1
    x = torch.tensor([-1000.0 * beta, 1000.0 * beta], dtype=torch.float64, requires_grad=True)
    ls = gumbel_side_length(torch.zeros_like(x), x, beta, log=True)
    (g,) = torch.autograd.grad(ls.sum(), x)
    # x = −1000β: z = 2e^{500}; log K0(z) = ½log(π/(2z)) − z − 1/(8z) + ...
    logz = math.log(2) + 500.0
    z = math.exp(logz)
    want_neg = math.log(2 * beta) + 0.5 * math.log(math.pi / 2) - 0.5 * logz - z
    assert ls[0].item() == pytest.approx(want_neg, rel=1e-14)
    # d/dx log side = (1/(2β)) z K1(z)/K0(z) ≈ (1/(2β)) (z + 1/2)
    assert g[0].item() == pytest.approx((z + 0.5) / (2 * beta), rel=1e-12)
    # x = +1000β: K0(z) = s − γ, s = x/(2β) = 500
    assert ls[1].item() == pytest.approx(math.log(2 * beta) + math.log(500 - EULER_GAMMA),
                                         rel=1e-14)
    assert g[1].item() == pytest.approx(1 / (2 * beta) / (500 - EULER_GAMMA), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_beyond_representable_range_is_tangent_continuation(dtype):
    # Past u_max the exact −z is outside the dtype's range; g continues along its tangent.
    um = _u_max(dtype)
    u = torch.tensor([um, um + 10.0, um + 100.0], dtype=dtype, requires_grad=True)
    val = _LogK0Exp.apply(u)
    (g,) = torch.autograd.grad(val.sum(), u)
    assert bool(torch.isfinite(val).all()) and bool(torch.isfinite(g).all())
    torch.testing.assert_close(g, g[:1].expand(3))
    torch.testing.assert_close(val[1:] - val[0], g[0] * (u[1:] - u[0]).detach())


# ---------------------------------------------------------------------- custom backward


def test_log_side_slope_matches_scipy_and_gradcheck():
    """log L'(x) (L = log expected Gumbel side) = log(z K1(z)/K0(z)) − log 2β, z = 2e^{−x/2β};
    its custom derivative h'(u) = z (K1/K0 − K0/K1) by gradcheck in every regime."""
    from perturb.boxes.volumes import _log_gumbel_side_slope, _LogNegGPrime
    beta = 0.3
    x = np.array([-20.0, -3.0, -0.5, 0.0, 0.4, 2.0, 10.0, 40.0])
    z = 2 * np.exp(-x / (2 * beta))
    want = np.log(z * sp.k1e(z) / sp.k0e(z)) - np.log(2 * beta)
    got = _log_gumbel_side_slope(torch.tensor(x, dtype=torch.float64), beta, False)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    # the approx form: d/dx log(β softplus(x/β − 2γ))
    y = x / beta - 2 * EULER_GAMMA
    want_a = np.log(sp.expit(y) / (beta * np.logaddexp(0, y)))
    got_a = _log_gumbel_side_slope(torch.tensor(x, dtype=torch.float64), beta, True)
    np.testing.assert_allclose(got_a.numpy(), want_a, rtol=1e-12)
    um = _u_max(torch.float64)
    u = torch.tensor([-60.0, -20.5, -19.5, -5.0, 0.0, 1.2, 4.0, 40.0, um + 3.0],
                     dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: _LogNegGPrime.apply(t)[0], (u,), eps=1e-6,
                                    atol=1e-8, rtol=1e-6)


def test_side_length_gradcheck_in_lower_upper_and_beta():
    lo = torch.tensor([0.1, -0.4, 2.0], dtype=torch.float64, requires_grad=True)
    hi = torch.tensor([0.3, -0.9, 9.0], dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(0.25, dtype=torch.float64, requires_grad=True)
    for approx in (False, True):
        for log in (False, True):
            assert torch.autograd.gradcheck(
                lambda a, b, c: gumbel_side_length(a, b, c, approx=approx, log=log),
                (lo, hi, beta))


def test_torch_func_grad_matches_autograd():
    x = torch.tensor([-2.0, 0.3, 5.0], dtype=torch.float64, requires_grad=True)

    def f(v):
        return gumbel_side_length(torch.zeros_like(v), v, 0.5, log=True).sum()

    (g,) = torch.autograd.grad(f(x), x)
    torch.testing.assert_close(torch.func.grad(f)(x.detach()), g)
    batched = torch.func.vmap(torch.func.grad(f))(x.detach().unsqueeze(-1))
    torch.testing.assert_close(batched.squeeze(-1), g)


# ---------------------------------------------------------------------- volume()
def _box(lo, hi, dtype=torch.float64):
    return Box(torch.tensor(lo, dtype=dtype), torch.tensor(hi, dtype=dtype))


def test_hard_volume_values_and_empty():
    b = _box([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]], [[1.0, 2.0], [1.0, 0.5], [0.0, 3.0]])
    torch.testing.assert_close(volume(b), torch.tensor([2.0, 0.0, 0.0], dtype=torch.float64))
    lv = volume(b, log=True)
    assert lv[0].item() == pytest.approx(math.log(2.0))
    assert lv[1].item() == -math.inf and lv[2].item() == -math.inf


def test_hard_volume_gradients_empty_zero_and_no_nan():
    lo = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    hi = torch.tensor([[1.0, 0.5], [1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    for log in (False, True):
        v = volume(Box(lo, hi), log=log)
        glo, ghi = torch.autograd.grad(v[0] + v[1] if not log else v[1] + 0 * v[0], (lo, hi))
        assert bool(torch.isfinite(glo).all()) and bool(torch.isfinite(ghi).all())
        assert glo[0].abs().sum().item() == 0 and ghi[0].abs().sum().item() == 0
    v = volume(Box(lo, hi))
    glo, ghi = torch.autograd.grad(v[1], (lo, hi))
    torch.testing.assert_close(ghi[1], torch.tensor([2.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(glo[1], -ghi[1])


@pytest.mark.parametrize("t", [0.1, 1.0])
def test_soft_volume_formula(t):
    b = _box([[0.0, 0.2], [-1.0, 0.0]], [[1.0, 0.1], [2.0, 0.5]])
    w = b.upper - b.lower
    want = (t * torch.nn.functional.softplus(w / t)).prod(-1)
    torch.testing.assert_close(volume(b, temperature=t), want)
    torch.testing.assert_close(volume(b, temperature=t, log=True), want.log())


def test_small_temperatures_recover_hard_volume():
    b = _box([[0.0, 0.0, 0.0], [0.5, -1.0, 2.0]], [[1.0, 2.0, 0.5], [1.5, 1.0, 2.25]])
    hard = volume(b)
    for kw in ({"temperature": 1e-4}, {"beta": 1e-4}, {"beta": 1e-4, "approx": True}):
        torch.testing.assert_close(volume(b, **kw), hard, rtol=5e-3, atol=0)
    # and an empty box goes to 0
    e = _box([[0.0, 0.0]], [[1.0, -0.1]])
    for kw in ({"temperature": 1e-3}, {"beta": 1e-3}, {"beta": 1e-3, "approx": True}):
        assert volume(e, **kw).item() < 1e-20


def test_gumbel_volume_is_product_of_sides_in_log_space():
    g = torch.Generator().manual_seed(0)
    lo = torch.rand(4, 3, 7, generator=g, dtype=torch.float64)
    hi = lo + torch.rand(4, 3, 7, generator=g, dtype=torch.float64) - 0.3
    b = Box(lo, hi)
    for approx in (False, True):
        sides = gumbel_side_length(lo, hi, 0.2, approx=approx)
        torch.testing.assert_close(volume(b, beta=0.2, approx=approx), sides.prod(-1))
        torch.testing.assert_close(volume(b, beta=0.2, approx=approx, log=True),
                                   sides.log().sum(-1))


def test_high_dimensional_log_volume_is_finite():
    d = 2000
    b = Box(torch.zeros(d), torch.full((d,), 0.01))
    for kw in ({}, {"beta": 0.001}, {"temperature": 0.001}):
        lv = volume(b, log=True, **kw)
        assert math.isfinite(lv.item()) and lv.item() < -9000
        assert volume(b, **kw).item() == 0.0   # underflows, which is why log=True exists


def test_batched_equals_looped_and_dtypes():
    g = torch.Generator().manual_seed(3)
    lo = torch.randn(5, 4, generator=g)
    hi = lo + torch.randn(5, 4, generator=g)
    b = Box(lo, hi)
    for kw in ({}, {"temperature": 0.3}, {"beta": 0.3}, {"beta": 0.3, "approx": True}):
        full = volume(b, log=True, **kw)
        assert full.dtype == torch.float32 and full.shape == (5,)
        for i in range(5):
            torch.testing.assert_close(full[i], volume(b[i], log=True, **kw))
    torch.testing.assert_close(volume(b.to(torch.float64), beta=0.3, log=True).float(),
                               volume(b, beta=0.3, log=True), rtol=1e-6, atol=1e-5)


def test_tensor_beta_broadcasts():
    b = _box([[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]])
    beta = torch.tensor([[0.1], [0.5]], dtype=torch.float64)
    v = volume(b, beta=beta)
    torch.testing.assert_close(v[0], volume(b[0], beta=0.1))
    torch.testing.assert_close(v[1], volume(b[1], beta=0.5))


@pytest.mark.parametrize("kw,match", [
    ({"beta": 0.0}, "beta"), ({"beta": -1.0}, "beta"), ({"beta": math.nan}, "beta"),
    ({"temperature": 0.0}, "temperature"),
    ({"beta": torch.tensor([0.1, -0.1])}, "beta"),
    ({"method": "cube"}, "method"),
    ({"method": "hard", "beta": 0.1}, "beta"),
    ({"method": "gumbel", "temperature": 0.1}, "temperature"),
    ({"beta": 0.1, "temperature": 0.1}, "not both"),
    ({"approx": True}, "approx"),
])
def test_bad_arguments(kw, match):
    b = Box(torch.zeros(2), torch.ones(2))
    with pytest.raises(ValueError, match=match):
        volume(b, **kw)


def test_bad_box_and_validation_toggle():
    with pytest.raises(ValueError, match="box"):
        volume(torch.zeros(2))
    with pytest.raises(ValueError, match="beta"):
        gumbel_side_length(torch.zeros(1), torch.ones(1), beta=0)
    with set_validation(False):  # structural checks still run
        with pytest.raises(ValueError, match="beta"):
            volume(Box(torch.zeros(2), torch.ones(2)), beta=-1.0)


# ---------------------------------------------------------------------- fused log volume
def test_fused_log_volume_gradcheck_and_helper():
    from perturb.boxes.volumes import _log_volume_backward, _LogVolume
    g = torch.Generator().manual_seed(2)
    lo = torch.randn(3, 5, generator=g, dtype=torch.float64)
    hi = lo + 2 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    # the softplus tail (y < −30 at s = 0.4) and the u < −20 regime; a whole output row is
    # extreme, since finite differences on a −1e9 output are too coarse for its other entries
    hi[0] = lo[0] - 15.0
    hi[1, 1] = lo[1, 1] + 25.0   # in another output row: FD on a −1e8 output is too coarse
    lo.requires_grad_()
    hi.requires_grad_()
    for scale, shift, exact in ((0.4, 0.0, False), (0.4, 2 * EULER_GAMMA, False),
                                (0.4, 0.0, True), (3.0, 0.0, True)):
        assert torch.autograd.gradcheck(
            lambda a, b: _LogVolume.apply(a, b, scale, shift, exact)[0], (lo, hi))
        if exact:   # without a backward expected the forward saves u, not the slope q
            assert torch.autograd.gradcheck(
                lambda a, b: _LogVolume.apply(a, b, scale, shift, exact, False)[0], (lo, hi))
        out, aux = _LogVolume.apply(lo, hi, scale, shift, exact)
        gout = torch.randn(3, generator=g, dtype=torch.float64)
        want_hi = torch.autograd.grad((out * gout).sum(), hi)[0]
        # the helper with the saved slope (exact) or y (softplus), and from u
        torch.testing.assert_close(_log_volume_backward(aux, gout, scale, exact, exact),
                                   want_hi)
        if exact:
            u = math.log(2.0) - (hi - lo).detach() / (2 * scale)
            torch.testing.assert_close(_log_volume_backward(u, gout, scale, True, False),
                                       want_hi)


def test_fused_and_elementwise_paths_agree():
    # float β takes the fused Function, tensor β the elementwise autograd path
    g = torch.Generator().manual_seed(4)
    lo = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    hi = (lo.detach() + torch.randn(6, 3, generator=g, dtype=torch.float64)).requires_grad_()
    b = Box(lo, hi)
    for kw, tkw in (({"beta": 0.3}, {"beta": torch.tensor(0.3, dtype=torch.float64)}),
                    ({"beta": 0.3, "approx": True},
                     {"beta": torch.tensor(0.3, dtype=torch.float64), "approx": True}),
                    ({"temperature": 0.3},
                     {"temperature": torch.tensor(0.3, dtype=torch.float64)})):
        v1, v2 = volume(b, log=True, **kw), volume(b, log=True, **tkw)
        torch.testing.assert_close(v1, v2)
        g1 = torch.autograd.grad(v1.sum(), (lo, hi))
        g2 = torch.autograd.grad(v2.sum(), (lo, hi))
        for x, y in zip(g1, g2):
            torch.testing.assert_close(x, y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_matches_cpu():
    g = torch.Generator().manual_seed(6)
    lo = torch.randn(64, 8, generator=g, dtype=torch.float64)
    hi = lo + 3 * torch.randn(64, 8, generator=g, dtype=torch.float64)
    hi[0] = lo[0] - 200.0   # extreme regimes on the device too
    hi[1] = lo[1] + 200.0
    for kw in ({}, {"temperature": 0.3}, {"beta": 0.3}, {"beta": 0.3, "approx": True}):
        outs = []
        for dev in ("cpu", "cuda"):
            a = lo.to(dev).requires_grad_()
            b = hi.to(dev).requires_grad_()
            v = volume(Box(a, b), log=True, **kw)
            v = torch.where(torch.isfinite(v), v, torch.zeros_like(v))
            outs.append((v, *torch.autograd.grad(v.sum(), (a, b))))
        for c, d in zip(*outs):
            assert d.device.type == "cuda"
            torch.testing.assert_close(d.cpu(), c)


def test_a_side_at_one_infinity_is_degenerate_and_a_nan_argument_never_indexes_the_table():
    # ∞ − ∞ is a side with both corners at the same infinity: width 0 (the limit of [R, R]),
    # so the volume equals that of a box with a zero-width side there, not NaN
    inf = math.inf
    lo = torch.tensor([[inf, 0.0], [-inf, 0.0]])
    hi = torch.tensor([[inf, 1.0], [-inf, 1.0]])
    point = Box(torch.zeros(2, 2), torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
    for kw in ({"beta": 0.1}, {"temperature": 0.5}, {}):
        torch.testing.assert_close(volume(Box(lo, hi), log=True, **kw),
                                   volume(point, log=True, **kw))
    # the table lookup itself propagates a NaN argument instead of indexing out of range
    from perturb.boxes.volumes import _log_k0_exp
    for dt in (torch.float32, torch.float64):
        g, q = _log_k0_exp(torch.tensor([math.nan, 0.0], dtype=dt))
        assert bool(torch.isnan(g[0])) and bool(torch.isnan(q[0]))
        assert bool(torch.isfinite(g[1])) and bool(torch.isfinite(q[1]))


# ----------------------------------------------------------------------------- log softplus

_LOG_SOFTPLUS_Y = [-1e4, -500.0, -100.0, -81.0, -79.0, -50.0, -30.5, -29.5, -20.0, -5.0, -1.0,
                   -1e-3, 0.0, 1e-3, 1.0, 5.0, 20.0, 30.0, 79.0, 81.0, 100.0, 1e4]


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-15), (torch.float32, 4e-7)])
def test_log_softplus_is_accurate_everywhere(dtype, rtol):
    """The branch-free log softplus against 50-digit mpmath, from −1e4 to 1e4, value and
    derivative σ(y)/softplus(y) (also at the kink-free y = 0)."""
    from perturb.boxes.volumes import _log_softplus
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 50
    y = torch.tensor(_LOG_SOFTPLUS_Y, dtype=dtype, requires_grad=True)
    got = _log_softplus(y)
    (grad,) = torch.autograd.grad(got.sum(), y)
    want = torch.tensor([float(mp.log(mp.log1p(mp.exp(v)))) for v in _LOG_SOFTPLUS_Y],
                        dtype=torch.float64)
    dwant = torch.tensor([float(1 / (1 + mp.exp(-v)) / mp.log1p(mp.exp(v)))
                          for v in _LOG_SOFTPLUS_Y], dtype=torch.float64)
    torch.testing.assert_close(got.detach().double(), want, rtol=rtol, atol=0)
    torch.testing.assert_close(grad.double(), dwant, rtol=rtol, atol=0)


def test_log_softplus_gradcheck():
    from perturb.boxes.volumes import _log_softplus
    y = torch.linspace(-100, 100, 41, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_log_softplus, (y,))


# ----------------------------------------------------------------- unbounded boxes (±inf corners)
_INF = math.inf
_METHODS = [{}, {"temperature": 0.5}, {"temperature": torch.tensor(0.5)},
            {"beta": 0.1}, {"beta": torch.tensor(0.1)}, {"beta": 0.1, "approx": True}]


@pytest.mark.parametrize("kw", _METHODS, ids=str)
def test_unbounded_volumes_are_infinite_empty_sides_win_and_nothing_is_nan(kw):
    """Half-lines and lines have infinite volume; a side empty at infinity makes the box empty
    (volume 0) whatever its other sides (0·∞ read as 0); the gradient of every finite volume
    is finite, also with respect to the infinite corners."""
    lo = torch.tensor([[-_INF, 0.0], [0.0, 0.0], [_INF, -_INF], [-_INF, -_INF], [0.0, 0.0]],
                      requires_grad=True)
    hi = torch.tensor([[1.0, 1.0], [_INF, 1.0], [1.0, _INF], [_INF, _INF], [1.0, 1.0]],
                      requires_grad=True)
    v = volume(Box(lo, hi), log=True, **kw)
    assert v[:2].tolist() == [_INF, _INF] and v[2].item() == -_INF and v[3].item() == _INF
    assert math.isfinite(v[4].item())
    g = torch.autograd.grad(v[4] + v[:4].clamp(-10, 10).sum(), (lo, hi))
    assert all(bool(torch.isfinite(x).all()) for x in g)


@pytest.mark.parametrize("approx", [False, True])
def test_gumbel_side_length_at_infinite_bounds(approx):
    """x = +∞: an infinite side; x = −∞: a zero side; both corners at one infinity: the side
    of x = 0 (a degenerate interval, the limit of [R, R]), never NaN."""
    lo = torch.tensor([-_INF, 0.0, _INF, 0.0, -_INF])
    hi = torch.tensor([1.0, _INF, _INF, -_INF, -_INF])
    side = gumbel_side_length(lo, hi, 0.1, approx=approx)
    at_zero = gumbel_side_length(torch.zeros(1), torch.zeros(1), 0.1, approx=approx).item()
    assert side.tolist() == pytest.approx([_INF, _INF, at_zero, 0.0, at_zero])


@pytest.mark.parametrize("method,new", [
    ("gumbel", {"beta": 1.0}), ("soft", {"temperature": 1.0}), ("hard", {}),
])
def test_method_strings_warn_and_mean_the_new_spelling(method, new):
    """method= is deprecated for one release: the FutureWarning says what to write, and the old
    call returns what the new spelling does (method="gumbel" alone is β = 1, "soft" T = 1)."""
    b = Box(torch.tensor([[0.0, 0.2], [0.1, -0.3]]), torch.tensor([[1.0, 0.5], [0.2, 0.4]]))
    with pytest.warns(FutureWarning, match=f"method='{method}'.*{next(iter(new), 'drop')}"):
        old = volume(b, method=method, log=True)
    torch.testing.assert_close(old, volume(b, log=True, **new))


def test_volume_regularizer_method_warns_under_its_own_name():
    from perturb.boxes import volume_regularizer
    b = Box(torch.zeros(3, 2), torch.ones(3, 2))
    with pytest.warns(FutureWarning, match="volume_regularizer"):
        old = volume_regularizer(b, 0.1, method="soft", temperature=0.5)
    torch.testing.assert_close(old, volume_regularizer(b, 0.1, temperature=0.5))
