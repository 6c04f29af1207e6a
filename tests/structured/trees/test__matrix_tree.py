"""The engine of the matrix-tree marginals (checked tensors): the LU fast path and its
a-posteriori check, the tiers (cycle reduction, log-space elimination), the analytic backward."""
import math

import pytest
import torch

from perturb.structured.trees import _matrix_tree as eng
from perturb.structured.trees._elimination import elimination_log_partition
from perturb.structured.trees._inverse import BLOCK_MIN
from perturb.structured.trees.matrix_tree import (
    arborescence_log_partition,
    arborescence_marginals,
    spanning_tree_marginals,
)

D = torch.float64


def test_backward_helper_is_the_vjp(generator):
    n = 6
    s = torch.randn(n, n, dtype=D, generator=generator, requires_grad=True)
    valid = ~torch.eye(n, dtype=torch.bool)
    valid[:, 0] = False
    mu, _, P, G, bad = eng.lu_solve(s.detach(), valid, None, 0)
    assert not bad
    g = torch.randn(n, n, dtype=D, generator=generator)
    ours = eng.marginals_backward(P, G, g)
    (mu_ad,) = torch.autograd.grad(elimination_log_partition(s, valid, None, 0), s,
                                   create_graph=True)
    (ref,) = torch.autograd.grad((mu_ad * g).sum(), s)
    torch.testing.assert_close(ours, ref)


def test_lu_solve_padding_and_saved_marginals(generator):
    """G is zero on the root's row and column; the backward helper gives the same result with
    the forward's μ passed in as when it recomputes μ from P and G."""
    n, root = 7, 3
    s = torch.randn(4, n, n, dtype=D, generator=generator)
    valid = ~torch.eye(n, dtype=torch.bool)
    valid[:, root] = False
    mu, logz, P, G, bad = eng.lu_solve(s, valid.expand(s.shape), None, root)
    assert not bad.any()
    assert (G[:, root, :] == 0).all() and (G[:, :, root] == 0).all()
    torch.testing.assert_close(logz, elimination_log_partition(s, valid.expand(s.shape), None,
                                                               root))
    g = torch.randn(4, n, n, dtype=D, generator=generator)
    torch.testing.assert_close(eng.marginals_backward(P, G, g, mu), eng.marginals_backward(P, G, g),
                               rtol=0, atol=1e-14)


def test_check_flags_non_finite_and_out_of_range():
    """NaN anywhere in a batch element's scores makes the a-posteriori check fail (NaN fails
    every comparison), so the element is recomputed instead of returning NaN silently."""
    n = 5
    s = torch.zeros(3, n, n, dtype=D)
    s[1, 2, 3] = math.nan
    valid = ~torch.eye(n, dtype=torch.bool)
    valid[:, 0] = False
    *_, bad = eng.lu_solve(s, valid.expand(s.shape), None, 0)
    assert bad.tolist() == [False, True, False]
    *_, bad = eng.lu_solve(s, valid.expand(s.shape), None, 0, need_logz=False)
    assert bad.tolist() == [False, True, False]


def _nested_cycles(a, b, generator):
    """Four strong 2-cycles that exit into each other with weight e^-a and to the root with
    e^-b: a near-closed class of near-closed classes."""
    n = 9
    w = -60.0 + torch.randn(n, n, dtype=D, generator=generator)
    for p in range(1, n, 2):
        w[p, p + 1] = w[p + 1, p] = 0
        q = p + 2 if p + 2 < n else 1
        w[p, q] = w[q + 1, p + 1] = -a
    w[0, 1:] = -b
    return w


def _peaked_cases(generator):
    cases = [s * torch.randn(16, n, n, dtype=D, generator=generator)
             for n in (8, 32, 64) for s in (5, 10, 20, 30, 50)]
    # from BLOCK_MIN nodes on, the inverse is formed by blocks
    cases += [s * torch.randn(6, n, n, dtype=D, generator=generator)
              for n in (BLOCK_MIN, 130) for s in (1, 10, 20)]
    cases.append(torch.stack([_nested_cycles(a, b, generator)
                              for a, b in ((5, 15), (3, 20), (8, 25), (10, 30))]))
    return cases


def test_lu_accepted_only_where_accurate(generator):
    """Wherever the LU path passes its check (error estimate 4·max(n,8)·eps·‖G‖₁ <= 1e-8),
    its marginals and log Z agree with the log-space elimination to 1e-9, on random scores
    up to scale 50 and on nested near-closed cycles; and the estimate is not vacuous (most
    scale-20 graphs of 64 nodes still fail it, so the reduction below is exercised)."""
    from perturb.structured.trees._elimination import elimination_marginals
    for s in _peaked_cases(generator):
        n = s.shape[-1]
        valid = (~torch.eye(n, dtype=torch.bool)).clone()
        valid[:, 0] = False
        v = valid.expand(s.shape)
        mu, logz, _, _, bad = eng.lu_solve(s, v, None, 0)
        mu_e, logz_e = elimination_marginals(s, v, None, 0)
        ok = ~bad
        assert ((mu - mu_e).abs().amax((-1, -2))[ok] <= 1e-9).all()
        assert ((logz - logz_e).abs()[ok] <= 1e-9 * logz_e.abs().clamp_min(1)[ok]).all()
        # the marginals' path (the inverse without log-determinant) passes the same check
        mu, _, _, _, bad = eng.lu_solve(s, v, None, 0, need_logz=False)
        ok = ~bad
        assert ((mu - mu_e).abs().amax((-1, -2))[ok] <= 1e-9).all()
        if s.shape[-1] >= BLOCK_MIN and float(s.abs().max()) < 10:
            assert ok.all()     # unit-scale scores: no element left the fast path


@pytest.mark.parametrize("n,scale", [(8, 30), (64, 20), (64, 50), (130, 20)])
def test_cycle_reduction_matches_elimination(n, scale, generator):
    """The cycle reduction (LU of all nodes but one per cycle of best parents, log-space
    elimination of those) against the full log-space elimination: μ, log Z and the
    Hessian–vector product of the backward."""
    from perturb.structured.trees._elimination import (
        cycle_representatives,
        elimination_marginals,
        elimination_marginals_vjp,
        reduced_marginals,
        reduced_marginals_vjp,
    )
    s = scale * torch.randn(4, n, n, dtype=D, generator=generator)
    valid = (~torch.eye(n, dtype=torch.bool)).clone()
    valid[:, 0] = False
    v = valid.expand(s.shape)
    mu, logz, est = reduced_marginals(s, v, None, 0)
    mu_e, logz_e = elimination_marginals(s, v, None, 0)
    assert (est <= eng.ERROR_BUDGET).all()
    torch.testing.assert_close(mu, mu_e, rtol=0, atol=1e-12)
    torch.testing.assert_close(logz, logz_e, rtol=1e-13, atol=0)
    if n <= 64:
        g = torch.randn_like(s)
        torch.testing.assert_close(reduced_marginals_vjp(s, v, None, 0, g),
                                   elimination_marginals_vjp(s, v, None, 0, g),
                                   rtol=0, atol=1e-10)
    # one representative per cycle of the best-parent graph: a cycle of length 3
    P = torch.zeros(1, 5, 5, dtype=D)
    P[0, 2, 1] = P[0, 3, 2] = P[0, 1, 3] = P[0, 0, 4] = 1   # 1→2→3→1, 4 → root
    assert cycle_representatives(P, None, 0).tolist() == [[False, True, False, False, False]]


def test_peaked_batch_paths_and_sums(generator):
    """16×64×64 scores ×20 (as a trained parser produces): most elements leave the LU path,
    the cycle reduction takes them (no full elimination), Σμ = n − 1 to 1e-9, and the
    gradient matches the elimination's."""
    from perturb.structured.trees._elimination import elimination_marginals_vjp
    n = 64
    w = 20 * torch.randn(16, n, n, dtype=D, generator=generator)
    valid = (~torch.eye(n, dtype=torch.bool)).clone()
    valid[:, 0] = False
    *_, path = eng.solve(w, valid.expand(w.shape), None, 0)
    assert (path == eng.PATH_REDUCED).any() and not (path == eng.PATH_ELIMINATION).any()
    x = w.clone().requires_grad_(True)
    mu = arborescence_marginals(x)
    assert ((mu.sum((-1, -2)) - (n - 1)).abs() <= 1e-9).all()
    g = torch.randn_like(w)
    (gr,) = torch.autograd.grad((mu * g).sum(), x)
    sel = path == eng.PATH_REDUCED
    ref = elimination_marginals_vjp(w[sel], valid.expand(w.shape)[sel], None, 0, g[sel])
    torch.testing.assert_close(gr[sel], ref, rtol=0, atol=1e-10)
    mu_s = spanning_tree_marginals(w)
    assert ((mu_s.triu().sum((-1, -2)) - (n - 1)).abs() <= 1e-9).all()


def test_gradcheck_reduced_path(generator):
    """gradcheck (float64) of the marginals and log Z where the LU path fails its check and
    the cycle reduction runs (strong 2-cycles with weak exits)."""
    w = _nested_cycles(6, 18, generator)[None].clone()
    valid = (~torch.eye(9, dtype=torch.bool)).clone()
    valid[:, 0] = False
    *_, path = eng.solve(w, valid.expand(w.shape), None, 0)
    assert path.tolist() == [eng.PATH_REDUCED]
    x = w.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: arborescence_marginals(t), (x,))
    assert torch.autograd.gradcheck(lambda t: arborescence_log_partition(t), (x,))


def test_mixed_batch_backward_matches_per_element(generator):
    """A (2, 3) batch whose elements take all three paths (LU, cycle reduction, log-space
    elimination): the backward splits the batch by path (the LU product runs on the LU
    elements only) and puts every gradient back in its place, so μ and the gradient equal
    those of each element solved alone."""
    n = 9
    lu = torch.randn(n, n, dtype=D, generator=generator)
    reduced = _nested_cycles(6, 18, generator)
    elim = torch.full((n, n), -math.inf, dtype=D)   # the underflowed exit of test__elimination
    elim[1, 2] = elim[2, 1] = elim[3, 4] = elim[4, 3] = 0.0
    elim[0, 1], elim[2, 3], elim[0, 3], elim[4, 1] = -750.0, -10.0, -700.0, -100.0
    elim[0, 5:] = 0.0
    w = torch.stack([lu, reduced, elim, reduced, lu * 2, elim]).view(2, 3, n, n)
    valid = (w > -math.inf) & ~torch.eye(n, dtype=torch.bool)
    valid[..., 0] = False
    *_, path = eng.solve(w.masked_fill(~valid, 0), valid, None, 0)
    assert path.flatten().tolist() == [eng.PATH_LU, eng.PATH_REDUCED, eng.PATH_ELIMINATION,
                                       eng.PATH_REDUCED, eng.PATH_LU, eng.PATH_ELIMINATION]
    g = torch.randn(2, 3, n, n, dtype=D, generator=generator)
    x = w.clone().requires_grad_(True)
    mu = arborescence_marginals(x)
    (gr,) = torch.autograd.grad((mu * g).sum(), x)
    for i in range(2):
        for j in range(3):
            xi = w[i, j].clone().requires_grad_(True)
            mi = arborescence_marginals(xi)
            (gi,) = torch.autograd.grad((mi * g[i, j]).sum(), xi)
            torch.testing.assert_close(mu[i, j], mi, rtol=0, atol=1e-14)
            torch.testing.assert_close(gr[i, j], gi, rtol=1e-10, atol=1e-12)


def test_error_estimate_rejects_negative_inverse_entries():
    """‖G‖₁ is read as the largest column sum of the (nonnegative) computed inverse; an entry
    below zero makes the estimate inf, and NaN stays NaN, so both fail the check."""
    G = torch.tensor([[[2.0, 1.0], [0.5, 3.0]], [[2.0, -1e-300], [0.5, 3.0]],
                      [[math.nan, 1.0], [0.5, 3.0]]], dtype=D)
    est = eng._error_estimate(G, 2)
    assert est[0] == 4 * 8 * torch.finfo(D).eps * 4.0
    assert est[1] == math.inf and math.isnan(est[2])
    assert not (est[1:] <= eng.ERROR_BUDGET).any()
