"""Tests of perturb/structured/permutations/_sinkhorn_graphs.py: the scaling iterations replayed
from captured CUDA graphs. The graph body is a plain function of tensors, so its arithmetic is
checked on the CPU against the eager iterations; the CUDA tests check the replay itself.
"""
import pytest
import torch

import perturb
from perturb.structured.permutations import _sinkhorn as S
from perturb.structured.permutations import _sinkhorn_graphs as G

F64 = torch.float64
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


def _padded_problem(device="cpu", seed=60):
    """Three 9 x 7 problems padded from sizes (9, 7), (6, 7), (9, 4): masked kernel, marginals
    zero on padded rows/columns (equal sums), the padding mask."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(3, 9, 7, generator=g, dtype=F64)
    rows = torch.arange(9) < torch.tensor([9, 6, 9]).unsqueeze(-1)
    cols = torch.arange(7) < torch.tensor([7, 7, 4]).unsqueeze(-1)
    mask = rows.unsqueeze(-1) & cols.unsqueeze(-2)
    a = rows.to(F64)
    b = cols.to(F64) * a.sum(-1, keepdim=True) / cols.sum(-1, keepdim=True)
    lk = S._masked_log_kernel(w, torch.tensor(0.3, dtype=F64), mask)
    return [t.to(device) for t in (lk, a, b, ~mask)]


def test_relaxed_keeps_zero_scalings():
    """x (x_plain / x)^ω: the plain form makes 0/0 = NaN of a zero (padded) scaling; the padded
    form keeps it zero and equals the plain form elsewhere."""
    x = torch.tensor([0.5, 0.0, 2.0], dtype=F64)
    xp = torch.tensor([0.7, 0.0, 1.0], dtype=F64)
    om = torch.tensor(1.6, dtype=F64)
    plain = G.relaxed(x, xp, om, padded=False)
    guarded = G.relaxed(x, xp, om, padded=True)
    assert bool(torch.isnan(plain[1]))
    assert guarded[1] == 0
    torch.testing.assert_close(guarded[[0, 2]], x[[0, 2]] ** (1 - om) * xp[[0, 2]] ** om,
                               atol=1e-15, rtol=1e-14)


def _fake_graphed(K, a, b, eu, ev, omega, n_full, padded):
    """graphed_iterations without the capture: the same body, the same chunks, on any device."""
    done = n_full // G.GRAPH_CHUNK * G.GRAPH_CHUNK
    if done == 0:
        return eu, ev, 0
    x, y = G.chunk_iterations(K, a, b, eu, ev, omega, padded, done)
    return x, y, done


@pytest.mark.parametrize("omega", [None, 1.6])
def test_graph_body_equals_eager_on_a_padded_batch(monkeypatch, omega):
    """The graph body (column layout, as on CUDA) run in place of the replay inside the engine's
    block gives the eager iterates on a padded, over-relaxed batch: finite, zero scalings on the
    padded rows and columns, no block flagged for the log-domain fallback."""
    lk, a, b, pad = _padded_problem()
    u, v = torch.zeros(3, 9, 1, dtype=F64), torch.zeros(3, 1, 7, dtype=F64)
    om = None if omega is None else torch.full((3, 1, 1), omega, dtype=F64)
    monkeypatch.setattr(S, "_columns", lambda K: True)
    eager = S._scaling_block(lk, u, v, a, b, 31, om, pad, 200.0)
    monkeypatch.setattr(S, "_graphs_usable", lambda K: True)
    monkeypatch.setattr(S, "graphed_iterations", _fake_graphed)
    graphed = S._scaling_block(lk, u, v, a, b, 31, om, pad, 200.0)
    assert not bool(graphed.bad) and bool(torch.isfinite(graphed.error).all())
    for name in ("u", "v", "error"):
        torch.testing.assert_close(getattr(graphed, name), getattr(eager, name), atol=1e-12,
                                   rtol=0)
    assert bool((graphed.kern.eu[a.unsqueeze(-1) == 0] == 0).all())
    assert bool((graphed.kern.ev[b.unsqueeze(-1) == 0] == 0).all())


def test_unguarded_body_fails_on_padding():
    """The body with the guard off (the old graph body) turns the padded scalings into NaN:
    the reason the padding flag is part of the body and of the graph cache key."""
    lk, a, b, pad = _padded_problem()
    K = S._new_kernel(lk, None, None, a, b, pad, cold=True).K
    x, y = torch.ones(3, 9, 1, dtype=F64), torch.ones(3, 7, 1, dtype=F64)
    om = torch.full((3, 1, 1), 1.6, dtype=F64)
    xg, yg = G.chunk_iterations(K, a.unsqueeze(-1), b.unsqueeze(-1), x, y, om, True)
    assert bool(torch.isfinite(xg).all() and torch.isfinite(yg).all())
    xb, _ = G.chunk_iterations(K, a.unsqueeze(-1), b.unsqueeze(-1), x, y, om, False)
    assert bool(torch.isnan(xb).any())


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("omega", [None, 1.6])
@pytest.mark.parametrize("padded", [False, True])
def test_cuda_graphs_equal_eager(omega, padded):
    """The graph-replayed iterations compute exactly the eager ones, padded batches included."""
    if padded:
        lk, a, b, pad = _padded_problem("cuda")
    else:
        g = torch.Generator().manual_seed(47)
        lk = torch.randn(3, 9, 7, generator=g, dtype=F64).cuda()
        a = torch.ones(3, 9, dtype=F64).cuda()
        b = torch.full((3, 7), 9 / 7, dtype=F64).cuda()
        pad = None
    u, v = torch.zeros(3, 9, 1, dtype=F64).cuda(), torch.zeros(3, 1, 7, dtype=F64).cuda()
    om = None if omega is None else torch.full((3, 1, 1), omega, dtype=F64).cuda()
    out = {}
    for use in (True, False):
        with perturb.settings(cuda_graphs=use), torch.no_grad():
            out[use] = S._scaling_block(lk, u, v, a, b, 31, om, pad, 200.0)
    assert not bool(out[True].bad)
    torch.testing.assert_close(out[True].u, out[False].u, atol=1e-12, rtol=0)
    torch.testing.assert_close(out[True].v, out[False].v, atol=1e-12, rtol=0)
    torch.testing.assert_close(out[True].error, out[False].error, atol=1e-12, rtol=0)
