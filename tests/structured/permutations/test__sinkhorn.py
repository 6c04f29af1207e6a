"""Tests of perturb/structured/permutations/_sinkhorn.py: the Sinkhorn engine (blocks, operation
counts, acceleration; the CUDA graphs in test__sinkhorn_graphs.py).
"""
import pytest
import torch

import perturb

from perturb.structured import sinkhorn

from _draws import marginals as _marginals
from _draws import randn as _randn

F64 = torch.float64


def test_hard_case_iterations():
    """τ = 0.05 on 16 x 64 x 64 (float64, tol 1e-6): plain Sinkhorn needs > 20,000 iterations;
    the default engine reaches tol within 2,000, ε-scaling within 1,000."""
    from perturb.structured.permutations._sinkhorn import sinkhorn_iterate
    w = _randn(16, 64, 64, seed=0)
    ones = torch.ones(16, 64, dtype=F64)
    for opts, cap in ((dict(), 2000), (dict(eps_scaling=True), 1000)):
        sol = sinkhorn_iterate(w / 0.05, ones, ones, None, None, cap, 1e-6, **opts)
        assert bool((sol.error <= 1e-6).all()), (opts, sol.n_iters, float(sol.error.max()))
        assert (sol.plan.sum(-1) - 1).abs().max() <= 1e-6
        assert (sol.plan.sum(-2) - 1).abs().max() <= 1e-6


def test_ops_per_iteration():
    """Dispatched aten ops per iteration (each one kernel on a GPU): 4 on the absorbed kernel
    (2 mat-vecs, 2 divisions), 6 in log space (2 × add, logsumexp, sub), 10 over-relaxed."""
    from perturb.structured.permutations._sinkhorn import _log_block, _scaling_block

    def ops(fn):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
        return sum(1 for e in prof.events() if e.name.startswith("aten::") and (
            e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))

    lk = _randn(2, 6, 6, seed=41)
    u, v = torch.zeros(2, 6, 1, dtype=F64), torch.zeros(2, 1, 6, dtype=F64)
    a = torch.ones(2, 6, dtype=F64)
    om = torch.full((2, 1, 1), 1.5, dtype=F64)
    per_iter = {}
    for name, fn in {
        "scaling": lambda k: _scaling_block(lk, u, v, a, a, k, None, None, 200.0),
        "relaxed": lambda k: _scaling_block(lk, u, v, a, a, k, om, None, 200.0),
        "log": lambda k: _log_block(lk, u, v, a.log().unsqueeze(-1), a.log().unsqueeze(-2),
                                    a.unsqueeze(-1), k, None, None),
    }.items():
        per_iter[name] = (ops(lambda: fn(20)) - ops(lambda: fn(10))) / 10
    assert per_iter == {"scaling": 4, "relaxed": 10, "log": 6}


def test_extreme_scores_use_the_log_fallback():
    """Scores ±1e4 at τ = 1e-3 overflow the absorbed kernel; the blocks are redone in log space
    and the converged plan matches plain log-domain Sinkhorn."""
    w = 1e4 * torch.sign(_randn(2, 6, 6, seed=42)) + _randn(2, 6, 6, seed=43)
    P = sinkhorn(w, tau=1e-3, n_iters=5000, tol=1e-9)
    ref = sinkhorn(w, tau=1e-3, n_iters=5000, tol=1e-9, accelerate=False)
    assert bool(torch.isfinite(P).all())
    # tol is raised to the rounding floor 4 ε max|W/τ| ≈ 4 · 2.2e-16 · 2e7 ≈ 2e-8 here
    floor = 4 * torch.finfo(F64).eps * float((w / 1e-3).abs().max() * 2)
    torch.testing.assert_close(P, ref, atol=2 * floor, rtol=0)
    assert (P.sum(-1) - 1).abs().max() <= floor and (P.sum(-2) - 1).abs().max() <= floor


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("opts", [dict(), dict(accelerate=False), dict(eps_scaling=True)])
def test_cuda_engine_matches_cpu(opts):
    w = _randn(4, 12, 12, seed=45)
    up = _randn(4, 12, 12, seed=46)
    tau = torch.tensor([0.2, 0.5, 1.0, 2.0], dtype=F64)
    out = {}
    for dev in ("cpu", "cuda"):
        x = w.to(dev).requires_grad_()
        P = sinkhorn(x, tau=tau.to(dev), n_iters=20000, tol=1e-12, **opts)
        (gw,) = torch.autograd.grad((P * up.to(dev)).sum(), x)
        out[dev] = (P.cpu(), gw.cpu())
    torch.testing.assert_close(out["cuda"][0], out["cpu"][0], atol=1e-10, rtol=0)
    torch.testing.assert_close(out["cuda"][1], out["cpu"][1], atol=1e-8, rtol=1e-7)


def test_acceleration_survives_a_slow_start():
    """A transport problem whose first 20 plain iterations barely move the error (0.34484 →
    0.34481): a rate measured there gave ω ≈ 2, whose rate ω − 1 ≈ 1 hid the true one, and
    the solve stalled at 1e-5 after 1000 iterations (hypothesis found it). Now ω waits for a
    block with real progress, and the accelerated solve needs fewer iterations than plain."""
    from perturb.structured.permutations._sinkhorn import sinkhorn_iterate
    g = torch.Generator().manual_seed(4)
    a = torch.rand(1, 3, generator=g, dtype=torch.float64) + 0.2
    b = torch.rand(1, 4, generator=g, dtype=torch.float64) + 0.2
    b = b * a.sum(-1, keepdim=True) / b.sum(-1, keepdim=True)
    w = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    runs = {acc: sinkhorn_iterate(w / 0.0625, a, b, None, None, 1000, 1e-10, accelerate=acc)
            for acc in (True, False)}
    for sol in runs.values():
        assert float(sol.error.max()) <= 1e-10
    assert runs[True].n_iters < runs[False].n_iters


def _log_domain_reference(log_k, a, b, iters):
    """Plain log-domain Sinkhorn (independent of the engine): the plan after ``iters``
    iterations."""
    u = torch.zeros_like(a)
    v = torch.zeros_like(b)
    for _ in range(iters):
        v = b.log() - torch.logsumexp(log_k + u.unsqueeze(-1), dim=-2)
        u = a.log() - torch.logsumexp(log_k + v.unsqueeze(-2), dim=-1)
    return torch.exp(log_k + u.unsqueeze(-1) + v.unsqueeze(-2))


@pytest.mark.parametrize("transport", [False, True])
def test_easy_case_runs_on_the_kernel(monkeypatch, transport):
    """Costs U[0, 1) at τ = 0.2 (the easy regime): the solve starts on the kernel exp(W/τ) and
    never needs a log-domain block; the plan matches a log-domain reference and POT."""
    import ot
    from perturb.structured.permutations import _sinkhorn as S
    g = torch.Generator().manual_seed(50)
    cost = torch.rand(4, 9, 7 if transport else 9, generator=g, dtype=F64)
    n, m = cost.shape[-2:]
    a, b = _marginals(n, m, (4,), seed=51) if transport else (torch.ones(4, n, dtype=F64),) * 2

    def no_log_block(*args, **kw):
        raise AssertionError("a log-domain block ran")
    monkeypatch.setattr(S, "_log_block", no_log_block)
    sol = S.sinkhorn_iterate(-cost / 0.2, a, b, None, None, 1000, 1e-13)
    monkeypatch.undo()
    assert float(sol.error.max()) <= 1e-13
    ref = _log_domain_reference(-cost / 0.2, a, b, 500)
    torch.testing.assert_close(sol.plan, ref, atol=1e-12, rtol=0)
    for k in range(4):
        pot = ot.sinkhorn(a[k], b[k], cost[k], 0.2, method="sinkhorn_log", stopThr=1e-14,
                          numItermax=10000)
        torch.testing.assert_close(sol.plan[k], pot, atol=1e-11, rtol=0)


def test_carried_kernel_continues_the_iterations():
    """Two blocks of 7 on a carried kernel compute the iterates of one block of 14 (the row
    update the first block stopped before is done at the start of the second)."""
    from perturb.structured.permutations import _sinkhorn as S
    lk = _randn(3, 8, 6, seed=52)
    a, b = _marginals(8, 6, (3,), seed=53)
    u, v = torch.zeros(3, 8, 1, dtype=F64), torch.zeros(3, 1, 6, dtype=F64)
    one = S._scaling_block(lk, u, v, a, b, 14, None, None, 200.0)
    first = S._scaling_block(lk, u, v, a, b, 7, None, None, 200.0, absorb=100.0)
    assert bool(first.keep)
    two = S._scaling_block(lk, first.u, first.v, a, b, 7, None, None, 200.0, first.kern, 100.0)
    torch.testing.assert_close(two.u, one.u, atol=1e-13, rtol=0)
    torch.testing.assert_close(two.v, one.v, atol=1e-13, rtol=0)
    torch.testing.assert_close(two.error, one.error, atol=1e-15, rtol=0)


def test_nested_batch_dims_equal_the_flat_batch():
    """The CPU layout flattens the batch dims (and the per-problem over-relaxation ω) inside a
    block: a (2, 3) batch gives the plans of the same six problems solved as a (6,) batch."""
    from perturb.structured.permutations._sinkhorn import sinkhorn_iterate
    w = _randn(2, 3, 7, 7, seed=54)
    a = torch.ones(2, 3, 7, dtype=F64)
    nested = sinkhorn_iterate(w / 0.1, a, a, None, None, 5000, 1e-12)
    flat = sinkhorn_iterate(w.reshape(6, 7, 7) / 0.1, a.reshape(6, 7), a.reshape(6, 7), None,
                            None, 5000, 1e-12)
    assert nested.plan.shape == (2, 3, 7, 7) and nested.error.shape == (2, 3)
    torch.testing.assert_close(nested.plan.reshape(6, 7, 7), flat.plan, atol=1e-11, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e4, 1e-4])
def test_extreme_scales_stay_finite(dtype, scale):
    """Scores ±1e4 and ±1e-4 at τ = 1e-3 (log-domain or ε-scaling start, and a kernel start with
    |W|/τ = 0.1): finite plans with the marginals to the tolerance used, no warning."""
    import warnings
    w = scale * torch.sign(_randn(3, 6, 6, seed=55, dtype=dtype)) + scale * 1e-3 * _randn(
        3, 6, 6, seed=56, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        P = sinkhorn(w, tau=1e-3, n_iters=5000, tol=1e-6 if dtype == torch.float32 else 1e-9)
    assert P.dtype == dtype and bool(torch.isfinite(P).all())
    tol = 4e-6 if dtype == torch.float32 else 1e-9
    floor = 4 * torch.finfo(dtype).eps * float((w / 1e-3).abs().max() * 2 + 1)
    assert float((P.sum(-1) - 1).abs().max()) <= max(tol, floor)
    assert float((P.sum(-2) - 1).abs().max()) <= max(tol, floor)


@pytest.mark.parametrize("opts", [dict(), dict(eps_scaling=True), dict(accelerate=False)])
def test_column_layout_equals_row_layout(monkeypatch, opts):
    """The scalings are columns on CUDA and rows on the CPU (faster mat-vecs there): forcing the
    CUDA layout on the CPU gives the same plans, with marginals and masks, and a (2, 2) batch."""
    from perturb.structured.permutations import _sinkhorn as S
    w = _randn(2, 2, 6, 5, seed=57)
    a, b = _marginals(6, 5, (2, 2), seed=58)
    mask = torch.ones(2, 2, 6, 5, dtype=torch.bool)
    mask[0, 1, 5, :] = False  # a padded row
    mask[1, 0, :, 4] = False  # a padded column
    am, bm = a * mask.any(-1), b * mask.any(-2)  # padding carries no mass: equal sums again
    bm = bm * am.sum(-1, keepdim=True) / bm.sum(-1, keepdim=True)
    kw = dict(tau=0.15, n_iters=20000, tol=1e-12, **opts)

    def solve():
        return [sinkhorn(w, a=a, b=b, **kw), sinkhorn(w, a=am, b=bm, mask=mask, **kw)]
    rows = solve()
    monkeypatch.setattr(S, "_columns", lambda K: True)
    cols = solve()
    for r, c in zip(rows, cols):
        torch.testing.assert_close(c, r, atol=1e-11, rtol=0)


def test_padded_batch_stays_on_the_kernel_when_over_relaxed(monkeypatch):
    """Padded rows and columns have zero scalings; the over-relaxed update x (x_plain / x)^ω
    once made them 0/0 = NaN, and every over-relaxed block of a padded batch was redone in log
    space. Now they stay zero: no log-domain block, and the plan equals the unpadded solves."""
    from perturb.structured.permutations import _sinkhorn as S
    sizes, n = [25, 30, 28, 20], 30
    w = _randn(4, n, n, seed=59)
    valid = torch.arange(n) < torch.tensor(sizes).unsqueeze(-1)
    mask = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    a = valid.to(F64)

    def no_log_block(*args, **kw):
        raise AssertionError("a log-domain block ran")
    monkeypatch.setattr(S, "_log_block", no_log_block)
    sol = S.sinkhorn_iterate(S._masked_log_kernel(w, torch.tensor(0.2, dtype=F64), mask), a, a,
                             valid, valid, 5000, 1e-11, newton=False)
    monkeypatch.undo()
    assert float(sol.error.max()) <= 1e-11 and bool((sol.plan[~mask] == 0).all())
    for k, s in enumerate(sizes):
        ref = sinkhorn(w[k, :s, :s], tau=0.2, n_iters=5000, tol=1e-12)
        torch.testing.assert_close(sol.plan[k, :s, :s], ref, atol=1e-10, rtol=0)
