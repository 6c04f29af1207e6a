"""Tests of perturb/_math.py: the floored exponential (value, zero below the floor,
gradient), log1mexp and logaddexp2 at extreme gaps."""
import math

import pytest
import torch

from perturb._math import exp_floor, exp_floored, log1mexp, logaddexp2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_floored_is_exp_above_the_floor_and_zero_below(dtype):
    floor = exp_floor(dtype)
    assert floor == pytest.approx(math.log(torch.finfo(dtype).tiny) + 1.0)
    x = torch.tensor([-1e4, floor - 1.0, floor - 1e-3, floor + 0.01, -30.0, -1.0, 0.0, 5.0],
                     dtype=dtype, requires_grad=True)
    got = exp_floored(x)
    above = x.detach() > floor
    torch.testing.assert_close(got[above], torch.exp(x.detach()[above]), rtol=0, atol=0)
    assert bool((got[~above] == 0).all())
    assert bool((got > 0).sum() == above.sum())
    assert bool((got[above] >= torch.finfo(dtype).tiny).all())         # never subnormal
    (grad,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(grad, got.detach(), rtol=0, atol=0)


def test_exp_floored_leaves_other_dtypes_alone():
    x = torch.tensor([-20.0, 0.0], dtype=torch.bfloat16)
    torch.testing.assert_close(exp_floored(x), torch.exp(x))
    assert exp_floor(torch.float16) == -math.inf


def test_log1mexp_and_logaddexp2_at_extreme_gaps():
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 60
    x = torch.tensor([-1e-8, -0.5, -5.0, -90.0, -700.0, -800.0, -1e4], dtype=torch.float64)
    want = torch.tensor([float(mp.log1p(-mp.exp(mp.mpf(v)))) for v in x.tolist()],
                        dtype=torch.float64)
    torch.testing.assert_close(log1mexp(x), want, rtol=1e-15, atol=0)
    a = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([-1.0, -200.0, -1e4], dtype=torch.float64, requires_grad=True)
    out = logaddexp2(a, b)
    torch.testing.assert_close(out, torch.logaddexp(a, b), rtol=1e-15, atol=0)
    ga, gb = torch.autograd.grad(out.sum(), (a, b))
    torch.testing.assert_close(gb, torch.sigmoid(b - a).detach(), rtol=1e-12, atol=1e-300)
    torch.testing.assert_close(ga + gb, torch.ones(3, dtype=torch.float64))
