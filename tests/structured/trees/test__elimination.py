"""perturb/structured/trees/_elimination.py: the log-space elimination and the cycle reduction."""
import torch


def test_reduced_vjp_finite_on_denormal_reduced_weights():
    """Peaked scores (×1e4) make some reduced weights W' denormal-small: the double backward of
    a plain log through them formed −ḡ/W'² = inf and returned NaN. The analytic VJP of the
    arborescence marginals must equal the unrolled one there."""
    from perturb.structured import arborescence_marginals

    torch.manual_seed(12)
    w = (1e4 * torch.randn(2, 6, 6))[1].double().requires_grad_()
    g = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    (analytic,) = torch.autograd.grad((arborescence_marginals(w, root=3) * g).sum(), w)
    (unrolled,) = torch.autograd.grad(
        (arborescence_marginals(w, root=3, backward="unroll") * g).sum(), w)
    assert torch.isfinite(analytic).all()
    torch.testing.assert_close(analytic, unrolled, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------
# the cycle reduction with explicit marginals and the analytic Hessian–vector product
# --------------------------------------------------------------------------------------------

import math  # noqa: E402

import pytest  # noqa: E402

import perturb.structured.trees._matrix_tree as mt  # noqa: E402
from perturb.structured.trees._graph_input import _prepare  # noqa: E402
from perturb.structured.trees.matrix_tree import (  # noqa: E402
    arborescence_marginals,
    spanning_tree_marginals,
)
import perturb.structured.trees._elimination as te  # noqa: E402
from perturb.structured.trees._inverse import BLOCK_MIN  # noqa: E402
from perturb.structured.trees.structures import enumerate_arborescences  # noqa: E402

D = torch.float64


def _valid(n, root=0, batch=()):
    v = ~torch.eye(n, dtype=torch.bool)
    v[:, root] = False
    return v.expand(*batch, n, n)


@pytest.mark.parametrize("m", [0, 1, 2, 3, 4, 5])
def test_tree_incidence_is_the_set_of_arborescences(m):
    """The reduced graph's tree list: (m + 1)^(m − 1) distinct rows, the same set as the brute
    force enumeration of :mod:`perturb.structured.trees.structures` (columns 1..m of its n × n trees)."""
    E = te._tree_incidence(m, D, torch.device("cpu"))
    assert E.shape == ((m + 1) ** (m - 1) if m else 1, (m + 1) * m)
    if m == 0:
        return
    ref = enumerate_arborescences(m + 1, 0, dtype=D)[:, :, 1:].flatten(1)
    assert {tuple(r) for r in E.tolist()} == {tuple(r) for r in ref.tolist()}
    assert len({tuple(r) for r in E.tolist()}) == len(E)


def _reference_cases(generator):
    """(s, valid, nodes, root): peaked random graphs of several sizes, a root other than 0,
    and absent nodes (padding)."""
    cases = []
    for n, scale, root in ((8, 30, 0), (24, 20, 5), (64, 20, 0), (64, 50, 17)):
        s = scale * torch.randn(6, n, n, dtype=D, generator=generator)
        cases.append((s, _valid(n, root, (6,)), None, root))
    # the inverse of the eliminated part by blocks (from BLOCK_MIN nodes on)
    n = BLOCK_MIN + 4
    s = 20 * torch.randn(3, n, n, dtype=D, generator=generator)
    cases.append((s, _valid(n, 3, (3,)), None, 3))
    n = 20
    s = 25 * torch.randn(5, n, n, dtype=D, generator=generator)
    nodes = torch.arange(n) < torch.tensor([20, 12, 3, 16, 7])[:, None]
    valid = _valid(n, 0, (5,)) & nodes[:, :, None] & nodes[:, None, :]
    cases.append((s, valid, nodes, 0))
    return cases


def test_reduced_solve_matches_autograd_reference(generator):
    """The explicit marginals and the analytic Hessian–vector product of the cycle reduction
    against autograd through :func:`reduced_log_partition` (first and double backward) and
    against the full log-space elimination; log Z and the error estimate too."""
    for s, valid, nodes, root in _reference_cases(generator):
        mu, logz, est, state = te.reduced_solve(s, valid, nodes, root)
        assert state is not None
        mu_r, logz_r, est_r = te.reduced_marginals(s, valid, nodes, root)
        mu_e, logz_e = te.elimination_marginals(s, valid, nodes, root)
        ok = est <= mt.ERROR_BUDGET
        assert ok.all() if nodes is not None else ok.any()
        # the reference pads the kept nodes with absent ones (log Z' = −inf there; those
        # elements went to the full elimination); this reduction pads with existing nodes
        ok_r = ok & torch.isfinite(logz_r)
        assert ok_r.any()
        torch.testing.assert_close(mu[ok_r], mu_r[ok_r], rtol=0, atol=1e-13)
        torch.testing.assert_close(est[ok_r], est_r[ok_r], rtol=1e-6, atol=1e-30)
        torch.testing.assert_close(mu[ok], mu_e[ok], rtol=0, atol=1e-12)
        torch.testing.assert_close(logz[ok], logz_e[ok], rtol=1e-13, atol=0)
        g = torch.randn(s.shape, dtype=D, generator=generator)
        vjp = te.reduced_vjp(state, g)
        torch.testing.assert_close(vjp[ok_r],
                                   te.reduced_marginals_vjp(s, valid, nodes, root, g)[ok_r],
                                   rtol=0, atol=1e-11)
        torch.testing.assert_close(vjp[ok], te.elimination_marginals_vjp(s, valid, nodes, root,
                                                                         g)[ok],
                                   rtol=0, atol=1e-10)
        # forbidden edges: no marginal, no gradient
        assert (mu[~valid] == 0).all() and (vjp[~valid] == 0).all()


def test_reduced_solve_reuses_the_fast_path_softmax(generator):
    """Given P (as the fast path passes it) the marginals are those computed from s."""
    s = 20 * torch.randn(4, 32, 32, dtype=D, generator=generator)
    v = _valid(32, 0, (4,))
    P, _ = te._column_softmax_differentiable(s, v)
    mu, _, est, _ = te.reduced_solve(s, v, None, 0, P=P, need_logz=False)
    mu2, _, est2, _ = te.reduced_solve(s, v, None, 0)
    torch.testing.assert_close(mu, mu2, rtol=0, atol=1e-15)
    torch.testing.assert_close(est, est2)


def test_gradcheck_reduced_path_random_peaked(generator):
    """gradcheck (float64) of arborescence and spanning-tree marginals on ×20 random graphs
    where the LU path fails and the analytic Hessian–vector product of the reduction runs
    (with absent nodes in the undirected case)."""
    n = 10
    for trial in range(40):
        w = 20 * torch.randn(2, n, n, dtype=D, generator=generator)
        *_, path, state = mt.solve_full(w, _valid(n, 0, (2,)), None, 0)
        if (path == mt.PATH_REDUCED).all():
            break
    assert (path == mt.PATH_REDUCED).all() and state is not None
    x = w.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: arborescence_marginals(t), (x,))
    lengths = torch.tensor([n, n - 3])
    assert torch.autograd.gradcheck(
        lambda t: spanning_tree_marginals(t, lengths=lengths), (x,))


def test_large_m_sums_the_reduced_graph_by_elimination(generator, monkeypatch):
    """More kept nodes than the enumeration handles: the reduced graph is summed by the
    log-space elimination (autograd on its m + 1 nodes only), with the same marginals and
    Hessian–vector product as the enumeration."""
    n = 64
    w = 20 * torch.randn(8, n, n, dtype=D, generator=generator, requires_grad=True)
    g = torch.randn(8, n, n, dtype=D, generator=generator)
    *_, path, state = mt.solve_full(w.detach(), _valid(n, 0, (8,)), None, 0)
    assert (path == mt.PATH_REDUCED).any() and state.E is not None and state.nu.shape[-1] > 1
    mu = arborescence_marginals(w)
    (ref,) = torch.autograd.grad((mu * g).sum(), w)
    monkeypatch.setattr(te, "_ENUM_MAX", 1)
    *_, path, state = mt.solve_full(w.detach(), _valid(n, 0, (8,)), None, 0)
    assert (path == mt.PATH_REDUCED).any() and state.E is None
    mu1 = arborescence_marginals(w)
    (out,) = torch.autograd.grad((mu1 * g).sum(), w)
    torch.testing.assert_close(mu1, mu, rtol=0, atol=1e-13)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)


def test_underflowed_exit_is_detected():
    """Two near-closed 2-cycles A = {1, 2}, B = {3, 4}: the heaviest tree enters A from the
    root by an edge of weight e^−750 (its column softmax underflows to 0) and B from A (e^−10);
    the only other trees enter B from the root (e^−700) and A from B (e^−100), e^40 lighter.
    Without the edge that underflowed, the reduction would return a valid-looking but wrong
    distribution (all mass on the lighter trees); the bound n²·tiny/det(I − P̂) flags it, and
    the full log-space elimination gives the right answer."""
    n = 5
    w = torch.full((n, n), -math.inf, dtype=D)
    w[1, 2] = w[2, 1] = w[3, 4] = w[4, 3] = 0.0
    w[0, 1], w[2, 3] = -750.0, -10.0
    w[0, 3], w[4, 1] = -700.0, -100.0
    s, valid, nodes, root = _prepare(w[None], 1.0, None, None, 0, False)
    _, _, est, _ = te.reduced_solve(s, valid, nodes, root)
    assert not (est <= mt.ERROR_BUDGET).any()
    *_, path = mt.solve(s, valid, nodes, root)
    assert path.tolist() == [mt.PATH_ELIMINATION]
    best = torch.zeros(n, n, dtype=D)
    best[0, 1] = best[1, 2] = best[2, 3] = best[3, 4] = 1.0
    torch.testing.assert_close(arborescence_marginals(w), best, rtol=0, atol=1e-15)
