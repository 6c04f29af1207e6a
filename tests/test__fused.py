"""Tests of perturb/_fused.py: the compiled, fused Gumbel-/Gaussian-softmax path (on the CPU
through the plain functions standing in for the compiled ones; on CUDA when available)."""
import os

import pytest
import torch

from perturb import Gumbel, Logistic, Simplex, perturb, regularized_argmax, relax
from perturb.categorical import gaussian_softmax, gumbel_softmax

DTYPES = [torch.float32, torch.float64]


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """Route CPU tensors through perturb._fused, with the plain functions as 'compiled' ones."""
    from perturb import _fused

    monkeypatch.setattr(_fused, "_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(_fused, "_FAILED", False)
    monkeypatch.setattr(_fused._ENABLED, "value", True)
    plain = list(_fused._FORWARDS.values()) + [_fused._backward]
    monkeypatch.setattr(_fused, "_COMPILED", {f.__name__: f for f in plain})
    return _fused


def _fused_and_eager(fn, x, c, **kw):
    """(value, grad) of fn through the fused path and with it switched off, same seed."""
    from perturb.categorical import set_compiled

    out = []
    for enabled in (True, False):
        with set_compiled(enabled):
            xi = x.clone().requires_grad_()
            y = fn(xi, generator=torch.Generator().manual_seed(5), **kw)
            (g,) = torch.autograd.grad((y * c).sum(), xi)
        out.append((y.detach(), g))
    return out


@pytest.mark.parametrize("fn", [gumbel_softmax, gaussian_softmax])
@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_matches_eager_same_noise(fused_on_cpu, fn, hard, dtype):
    x = torch.randn(6, 9, dtype=dtype, generator=torch.Generator().manual_seed(0))
    c = torch.randn(6, 9, dtype=dtype, generator=torch.Generator().manual_seed(1))
    kw = {"scale": 1.5} if fn is gaussian_softmax else {}
    (y_f, g_f), (y_e, g_e) = _fused_and_eager(fn, x, c, tau=0.4, hard=hard, **kw)
    torch.testing.assert_close(y_f, y_e)  # float tolerance: the same draws, other rounding
    torch.testing.assert_close(g_f, g_e)
    if hard:
        assert bool(Simplex().check(y_f).all())


def test_fused_double_backward(fused_on_cpu):
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    for hard in (False, True):
        def fn(v):
            return gumbel_softmax(v, 0.7, hard=hard, generator=torch.Generator().manual_seed(0))
        assert torch.autograd.gradgradcheck(fn, (x,))


def test_fused_used_only_where_it_applies(fused_on_cpu):
    from perturb._fused import relax_softmax

    x = torch.randn(3, 4)
    g = torch.Generator().manual_seed(0)
    assert relax_softmax(x, Gumbel(), 0.5, False, g) is not None
    state = g.get_state()
    for noise, tau in ((Gumbel(), torch.tensor(0.5)), (Logistic(), 0.5), (Gumbel(), True)):
        assert relax_softmax(x, noise, tau, False, g) is None
    assert torch.equal(g.get_state(), state)  # nothing drawn when it does not apply
    assert relax_softmax(torch.empty(0, 4), Gumbel(), 0.5, False, g) is None
    with fused_on_cpu.set_compiled(False):
        assert relax_softmax(x, Gumbel(), 0.5, False, g) is None
    seen = []
    torch.func.vmap(lambda v: seen.append(relax_softmax(v, Gumbel(), 0.5, False, None)) or v)(x)
    assert seen == [None]  # not under torch.func transforms


def test_fused_relax_agrees_with_the_composition(fused_on_cpu):
    """relax(θ, Simplex(), Gumbel()) goes through the fused path; unroll/n_samples do not."""
    theta = torch.randn(5, 7, generator=torch.Generator().manual_seed(2))
    y = relax(theta, tau=0.3, generator=torch.Generator().manual_seed(8))
    u = perturb(theta, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(y, regularized_argmax(u, tau=0.3))
    y = relax(theta, tau=0.3, generator=torch.Generator().manual_seed(8), backward="unroll")
    torch.testing.assert_close(y, regularized_argmax(u, tau=0.3, backward="unroll"), rtol=0,
                               atol=0)  # the composition itself, bitwise


def test_fused_failure_warns_once_and_falls_back(monkeypatch, fused_on_cpu):
    def broken(fn, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(fused_on_cpu, "_COMPILED", {})
    monkeypatch.setattr(torch, "compile", broken)
    x = torch.randn(4, 6, dtype=torch.float64)
    c = torch.randn(4, 6, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="compiled softmax path failed.*no compiler here"):
        (y_f, g_f), (y_e, g_e) = _fused_and_eager(gumbel_softmax, x, c, tau=0.5)
    assert fused_on_cpu._FAILED and not fused_on_cpu.compiled_enabled()
    torch.testing.assert_close(y_f, y_e)
    torch.testing.assert_close(g_f, g_e)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning: the path is off now
        gumbel_softmax(x, tau=0.5)


@pytest.mark.skipif(os.environ.get("PERTURB_TEST_COMPILE") != "1",
                    reason="torch.compile on CPU takes ~20 s cold on 2 cores; "
                           "set PERTURB_TEST_COMPILE=1 to run it")
def test_fused_compiled_on_cpu(monkeypatch):
    """The real torch.compile (inductor's C++ backend) on CPU tensors."""
    from perturb import _fused

    monkeypatch.setattr(_fused, "_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(_fused, "_FAILED", False)
    monkeypatch.setattr(_fused, "_COMPILED", {})
    x = torch.randn(16, 10)
    c = torch.randn(16, 10)
    for fn, hard in ((gumbel_softmax, False), (gumbel_softmax, True), (gaussian_softmax, True)):
        (y_f, g_f), (y_e, g_e) = _fused_and_eager(fn, x, c, tau=0.5, hard=hard)
        assert not _fused._FAILED
        torch.testing.assert_close(y_f, y_e)
        torch.testing.assert_close(g_f, g_e)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("fn", [gumbel_softmax, gaussian_softmax])
@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cuda_compiled_matches_eager(fn, hard, dtype):
    from perturb import _fused

    if hard and dtype == torch.bfloat16:
        pytest.skip("bf16 rounding of u (eager) vs float32 u (kernel) can move the argmax")
    x = torch.randn(64, 33, device="cuda").to(dtype)
    c = torch.randn(64, 33, device="cuda").to(dtype)
    out = []
    for enabled in (True, False):
        with _fused.set_compiled(enabled):
            xi = x.clone().requires_grad_()
            y = fn(xi, tau=0.5, hard=hard, generator=torch.Generator("cuda").manual_seed(5))
            (g,) = torch.autograd.grad((y * c).sum(), xi)
        out.append((y.detach().float(), g.float()))
    assert not _fused._FAILED, "the compiled path failed (see the warning)"
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(out[0][0], out[1][0], **tol)
    torch.testing.assert_close(out[0][1], out[1][1], **tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("compiled", [True, False])
def test_cuda_no_host_sync(compiled):
    from perturb import _fused

    x = torch.randn(128, 50, device="cuda", requires_grad=True)
    tau = torch.full((128,), 0.5, device="cuda")
    with _fused.set_compiled(compiled):
        for call in (lambda: gumbel_softmax(x, tau=0.5), lambda: gaussian_softmax(x, 0.5),
                     lambda: gumbel_softmax(x, tau=0.5, hard=True),
                     lambda: gumbel_softmax(x, tau=tau), lambda: relax(x, tau=0.5)):
            call().sum().backward()  # warm up (compiles)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
                call().sum().backward()
            names = [e.name for e in p.events()]
            assert not any(n in ("aten::_local_scalar_dense", "cudaStreamSynchronize",
                                 "cudaDeviceSynchronize") for n in names)
    torch.cuda.synchronize()
