"""Tests of perturb/structured/permutations/_sinkhorn_vjp.py: the implicit vector–Jacobian
product of the Sinkhorn plan (symmetry, fixed marginals, padding rows and columns)."""
import pytest
import torch

from perturb.structured import sinkhorn
from perturb.structured.permutations._sinkhorn_vjp import sinkhorn_vjp

from _draws import marginals as _marginals
from _draws import randn as _randn

F64 = torch.float64


def test_vjp_is_symmetric():
    """τ ∂P/∂W is the Hessian of a convex function: ⟨J G1, G2⟩ = ⟨G1, J G2⟩."""
    w = _randn(2, 5, 4, seed=15)
    a, b = _marginals(5, 4, (2,), seed=16)
    P = sinkhorn(w, tau=0.5, n_iters=3000, tol=1e-13, a=a, b=b)
    g1, g2 = _randn(2, 5, 4, seed=17), _randn(2, 5, 4, seed=18)
    j1 = sinkhorn_vjp(P, g1)[0]
    j2 = sinkhorn_vjp(P, g2)[0]
    torch.testing.assert_close((j1 * g2).sum((-2, -1)), (j2 * g1).sum((-2, -1)), atol=1e-12,
                               rtol=0)
    # the plan's marginals are fixed: J G has zero row and column sums
    torch.testing.assert_close(j1.sum(-1), torch.zeros(2, 5, dtype=F64), atol=1e-12, rtol=0)
    torch.testing.assert_close(j1.sum(-2), torch.zeros(2, 4, dtype=F64), atol=1e-12, rtol=0)


@pytest.mark.parametrize("extra", ["column", "row"])
def test_vjp_of_a_plan_with_an_empty_column_or_row(extra):
    """A row or column whose mass underflowed to 0 (a plan stopped short at extreme scales) is
    treated as padding: the vector–Jacobian product stays finite and equals that of the plan
    without it (it used to divide 0 by 0 on the larger side)."""
    a, b = _marginals(3, 4, seed=50)
    P = sinkhorn(_randn(3, 4, seed=51), tau=0.5, a=a, b=b, tol=1e-12)
    G = _randn(3, 4, seed=52)
    if extra == "column":                      # 3 x 5: the Schur complement on the rows
        P_ext = torch.cat([P, torch.zeros(3, 1, dtype=F64)], -1)
        G_ext = torch.cat([G, _randn(3, 1, seed=53)], -1)
        keep = (slice(None), slice(0, 4))
    else:                                      # 4 x 4 after a zero row: on the columns
        P_ext = torch.cat([P, torch.zeros(1, 4, dtype=F64)], -2)
        G_ext = torch.cat([G, _randn(1, 4, seed=53)], -2)
        keep = (slice(0, 3), slice(None))
    gw, x, y = sinkhorn_vjp(P_ext, G_ext)
    assert bool(torch.isfinite(gw).all() & torch.isfinite(x).all() & torch.isfinite(y).all())
    torch.testing.assert_close(gw[keep], sinkhorn_vjp(P, G)[0])
    assert bool((gw[..., 4:] == 0).all()) if extra == "column" else bool((gw[3:] == 0).all())
