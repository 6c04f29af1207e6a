"""Tests for perturb.boxes._bessel: g(u) = log K0(e^u) and its slope from the
piecewise-polynomial table (against scipy, torch.special and mpmath; gradcheck; continuity
across the regimes and the table's pieces)."""
import numpy as np
import pytest
import scipy.special as sp
import torch

from perturb.boxes._bessel import (_log_k0_exp, _log_k0_exp_backward, _log_neg_g_prime,
                                   _LogK0Exp, _u_max)


def test_log_k0_exp_gradcheck_all_regimes():
    um = _u_max(torch.float64)
    u = torch.tensor([-60.0, -20.5, -19.5, -5.0, -0.3, 0.0, 1.2, 4.0, 40.0, 300.0, um + 3.0],
                     dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_LogK0Exp.apply, (u,), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_log_k0_exp_backward_helper_matches_scipy():
    u = np.array([-30.0, -19.0, -3.0, 0.0, 2.0, 50.0])
    z = np.exp(u)
    want = -z * sp.k1e(z) / sp.k0e(z)
    ut = torch.tensor(u, dtype=torch.float64)
    got = _log_k0_exp_backward(ut, torch.ones_like(ut))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    # the value as well
    np.testing.assert_allclose(_LogK0Exp.apply(ut).numpy(), np.log(sp.k0e(z)) - z, rtol=1e-13)


def test_log_k0_exp_continuous_across_regimes():
    for edge in (-20.0, _u_max(torch.float64)):
        u = torch.tensor([edge - 1e-9, edge + 1e-9], dtype=torch.float64)
        v = _LogK0Exp.apply(u)
        g = _log_k0_exp_backward(u, torch.ones_like(u))
        assert abs(v[1] - v[0]).item() < 1e-8 * max(1.0, abs(v[0].item()))
        assert abs(g[1] - g[0]).item() < 1e-7 * max(1.0, abs(g[0].item()))


def _torch_special_g_q(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """g = log K0(e^u), q = z K1/K0 straight from torch.special (the previous evaluation)."""
    z = torch.exp(u)
    k0e = torch.special.scaled_modified_bessel_k0(z)
    return torch.log(k0e) - z, z * torch.special.scaled_modified_bessel_k1(z) / k0e


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(((got.double() - want).abs() / want.abs().clamp(min=1.0)).max())


def test_table_matches_torch_special_on_a_dense_grid():
    """The stated bounds of the piecewise-polynomial evaluation of g = log K0(e^u) and
    q = −g' over the whole table range (400,001 points, about 50 per interval): float64
    within 4e-15 (absolute on g for |g| <= 1, relative beyond; relative on q); float32 within
    2 eps of the float64 values at the same (float32) arguments."""
    u = torch.linspace(-20.0, 36.0, 400_001, dtype=torch.float64)
    g, q = _log_k0_exp(u)
    g_ref, q_ref = _torch_special_g_q(u)
    assert _rel(g, g_ref) < 4e-15
    assert float(((q - q_ref) / q_ref).abs().max()) < 4e-15
    u32 = u.float()
    g32, q32 = _log_k0_exp(u32)
    g_ref, q_ref = _torch_special_g_q(u32.double())
    eps = torch.finfo(torch.float32).eps
    assert _rel(g32, g_ref) < 2 * eps
    assert float(((q32.double() - q_ref) / q_ref).abs().max()) < 2 * eps


def test_table_matches_mpmath():
    mpmath = pytest.importorskip("mpmath")
    us = torch.linspace(-25.0, 45.0, 281, dtype=torch.float64)
    g_want, q_want, b_want = [], [], []
    with mpmath.workdps(40):
        for x in us.tolist():
            z = mpmath.exp(mpmath.mpf(x))
            k0, k1 = mpmath.besselk(0, z), mpmath.besselk(1, z)
            g_want.append(float(mpmath.log(k0)))
            q_want.append(float(z * k1 / k0))
            b_want.append(float(z * (k1 / k0 - 1)))      # q − z, where the direct form cancels
    g_want, q_want, b_want = (torch.tensor(v, dtype=torch.float64)
                              for v in (g_want, q_want, b_want))
    g, q = _log_k0_exp(us)
    assert _rel(g, g_want) < 4e-15
    assert float(((q - q_want) / q_want).abs().max()) < 4e-15
    # h' = B (q + z)/q uses the table's B directly: accurate where q − z would cancel
    z = torch.exp(us)
    slope_want = b_want * (q_want + z) / q_want
    slope_want = torch.where(us < -20, q_want, slope_want)
    _, slope = _log_neg_g_prime(us)
    assert float(((slope - slope_want) / slope_want).abs().max()) < 2e-14


def test_table_pieces_join_and_chunks_agree(monkeypatch):
    import importlib
    vol = importlib.import_module("perturb.boxes._bessel")
    # both sides of the interval ends u = (k + 1/2)/8: the pieces interpolate at the ends
    # (Chebyshev–Lobatto nodes), so each jump is the reference's own change over 2e-9
    ends = -20.0 + 0.125 * (torch.arange(448, dtype=torch.float64) + 0.5)
    (gl, ql), (gr, qr) = (vol._log_k0_exp(ends + d) for d in (-1e-9, 1e-9))
    (gl_ref, ql_ref), (gr_ref, qr_ref) = (_torch_special_g_q(ends + d) for d in (-1e-9, 1e-9))
    scale = gl_ref.abs().clamp(min=1.0)
    assert float((((gr - gl) - (gr_ref - gl_ref)) / scale).abs().max()) < 1e-14
    assert float((((qr - ql) - (qr_ref - ql_ref)) / qr_ref).abs().max()) < 1e-14
    u = torch.linspace(-30.0, 80.0, 10_001)
    whole = vol._log_k0_exp(u)
    monkeypatch.setattr(vol, "_CHUNK", 4096)        # 512 elements per chunk
    chunked = vol._log_k0_exp(u)
    for a, b in zip(whole, chunked):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(37,), (6, 7), (2, 5, 4), (2, 400, 10)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_small_regime_rows_match_the_branch_free_path(shape, dtype, monkeypatch):
    """Below u = −20 the CPU path fixes only the rows that hold such a u (gathered and
    written back); the branch-free path (CUDA, compile, torch.func) selects with ``where``
    over every element. Same values to the bit, for value, slope and both, any rank, and the
    same sums of g along the last dim (its layout, which sets their order, is the same: the
    (2, 400, 10) case, as a trainer step's widths, tells the interleaved layout of the table's
    output from a contiguous one)."""
    from perturb.boxes import _bessel
    g = torch.Generator().manual_seed(0)
    u = (torch.rand(shape, generator=g, dtype=torch.float64) * 40 - 15).to(dtype)
    flat = u.view(-1)
    flat[::5] = -20.0 - torch.rand(flat[::5].shape, generator=g, dtype=torch.float64).to(dtype) * 50
    if len(shape) < 3:
        flat[1] = 40.0                                     # the regime above the table too
    got = [_log_k0_exp(u, value=v, slope=s) for v, s in ((True, True), (True, False),
                                                         (False, True))]
    monkeypatch.setattr(_bessel, "reads_stall", lambda t: True)
    want = [_log_k0_exp(u, value=v, slope=s) for v, s in ((True, True), (True, False),
                                                          (False, True))]
    for pair_got, pair_want in zip(got, want):
        for i, (a, b) in enumerate(zip(pair_got, pair_want)):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a, b)
                if i == 0:                                 # g: a log volume, same order
                    assert torch.equal(a.sum(dim=-1), b.sum(dim=-1))
