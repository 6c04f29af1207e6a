"""Matrix-tree marginals and log-partitions: brute force, networkx, closed forms, gradients."""
import math

import networkx as nx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb.structured.trees.matrix_tree import (
    arborescence_log_partition,
    arborescence_marginals,
    spanning_tree_log_partition,
    spanning_tree_marginals,
)
from perturb.structured.trees._elimination import elimination_log_partition
from perturb.structured.trees.structures import (
    enumerate_arborescences,
    enumerate_spanning_trees,
    max_arborescence,
    max_spanning_tree,
)

D = torch.float64


def _brute(w, trees, undirected):
    """log Z and marginals by enumerating every tree: score = Σ over edges (each once)."""
    s = 0.5 * (w + w.mT) if undirected else w
    s = s.masked_fill(torch.eye(w.shape[-1], dtype=torch.bool), 0.0)
    scores = (trees * s.unsqueeze(-3)).sum((-1, -2))
    if undirected:
        scores = scores / 2  # symmetric adjacency counts each edge twice
    logz = torch.logsumexp(scores, -1)
    p = torch.softmax(scores, -1)
    return logz, (p[..., None, None] * trees).sum(-3)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_spanning_tree_vs_enumeration(n, generator):
    w = 2 * torch.randn(3, n, n, dtype=D, generator=generator)
    logz, mu = _brute(w, enumerate_spanning_trees(n, dtype=D), True)
    torch.testing.assert_close(spanning_tree_log_partition(w), logz)
    for backward in ("analytic", "unroll"):
        torch.testing.assert_close(spanning_tree_marginals(w, backward=backward), mu)


@pytest.mark.parametrize("n,root", [(2, 0), (3, 1), (4, 0), (4, 3), (5, 2)])
def test_arborescence_vs_enumeration(n, root, generator):
    w = 2 * torch.randn(3, n, n, dtype=D, generator=generator)
    logz, mu = _brute(w, enumerate_arborescences(n, root, dtype=D), False)
    torch.testing.assert_close(arborescence_log_partition(w, root=root), logz)
    for backward in ("analytic", "unroll"):
        torch.testing.assert_close(arborescence_marginals(w, root=root, backward=backward), mu)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 20])
def test_cayley(n):
    for w in (torch.zeros(n, n, dtype=D), torch.zeros(n, n)):
        ref = (n - 2) * math.log(n)
        assert abs(spanning_tree_log_partition(w).item() - ref) < 1e-9 * max(1, ref) + (
            1e-5 * ref if w.dtype == torch.float32 else 0)
        assert abs(arborescence_log_partition(w, root=n - 1).item() - ref) < 1e-4 * max(1, ref)
    mu = spanning_tree_marginals(torch.zeros(n, n, dtype=D))
    off = ~torch.eye(n, dtype=torch.bool)
    torch.testing.assert_close(mu[off], torch.full((n * (n - 1),), 2 / n, dtype=D))


def test_networkx_weighted_count(generator):
    n = 7
    w = torch.randn(n, n, dtype=D, generator=generator)
    s = 0.5 * (w + w.T)
    G = nx.Graph()
    G.add_weighted_edges_from((i, j, math.exp(s[i, j].item())) for i in range(n)
                              for j in range(i + 1, n))
    ref = nx.number_of_spanning_trees(G, weight="weight")
    assert spanning_tree_log_partition(w).item() == pytest.approx(math.log(ref), rel=1e-12)
    D_ = nx.DiGraph()
    D_.add_weighted_edges_from((i, j, math.exp(w[i, j].item())) for i in range(n)
                               for j in range(n) if i != j and j != 2)
    # networkx counts arborescences rooted at `root` via the in-degree Laplacian
    ref = nx.number_of_spanning_trees(D_, root=2, weight="weight")
    assert arborescence_log_partition(w, root=2).item() == pytest.approx(math.log(ref), rel=1e-12)


def test_masks_and_lengths_match_subgraphs(generator):
    n = 6
    w = torch.randn(2, n, n, dtype=D, generator=generator)
    lengths = torch.tensor([4, 6])
    mu = spanning_tree_marginals(w, lengths=lengths)
    torch.testing.assert_close(mu[0, :4, :4], spanning_tree_marginals(w[0, :4, :4]))
    assert mu[0, 4:].abs().sum() == 0 and mu[0, :, 4:].abs().sum() == 0
    torch.testing.assert_close(mu[1], spanning_tree_marginals(w[1]))
    ma = arborescence_marginals(w, root=1, lengths=lengths)
    torch.testing.assert_close(ma[0, :4, :4], arborescence_marginals(w[0, :4, :4], root=1))
    lz = spanning_tree_log_partition(w, lengths=lengths)
    torch.testing.assert_close(lz[0], spanning_tree_log_partition(w[0, :4, :4]))
    # a mask equals -inf scores; a path graph has exactly one tree
    mask = torch.zeros(n, n, dtype=torch.bool)
    idx = torch.arange(n - 1)
    mask[idx, idx + 1] = mask[idx + 1, idx] = True
    mu = spanning_tree_marginals(w[0], mask=mask)
    torch.testing.assert_close(mu, mask.to(D))
    w_inf = w[0].masked_fill(~mask, -math.inf)
    torch.testing.assert_close(spanning_tree_marginals(w_inf), mask.to(D))
    assert spanning_tree_log_partition(w_inf).item() == pytest.approx(
        (0.5 * (w[0] + w[0].T))[idx, idx + 1].sum().item())


def test_bad_input():
    with pytest.raises(ValueError, match="square"):
        spanning_tree_marginals(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="n >= 2|empty event"):
        spanning_tree_marginals(torch.zeros(1, 1))
    with pytest.raises(ValueError, match="NaN"):
        arborescence_marginals(torch.full((3, 3), math.nan))
    with pytest.raises(ValueError, match="floating"):
        spanning_tree_marginals(torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="tau"):
        spanning_tree_marginals(torch.zeros(3, 3), tau=0.0)
    with pytest.raises(ValueError, match="root"):
        arborescence_marginals(torch.zeros(3, 3), root=3)
    with pytest.raises(ValueError, match="backward"):
        arborescence_marginals(torch.zeros(3, 3), backward="implicit")
    with pytest.raises(ValueError, match="lengths"):
        spanning_tree_marginals(torch.zeros(2, 3, 3), lengths=torch.tensor([1, 3]))
    with pytest.raises(ValueError, match="mask"):
        spanning_tree_marginals(torch.zeros(3, 3), mask=torch.ones(3, 3))
    two_blocks = torch.full((4, 4), -math.inf)
    two_blocks[:2, :2] = two_blocks[2:, 2:] = 0.0
    with pytest.raises(ValueError, match="disconnected"):
        spanning_tree_marginals(two_blocks)
    with pytest.raises(ValueError, match="disconnected"):
        max_spanning_tree(two_blocks)
    one_way = torch.zeros(3, 3)
    one_way[:, 2] = -math.inf  # nothing enters node 2
    with pytest.raises(ValueError, match="no arborescence"):
        arborescence_marginals(one_way, root=0)
    with pytest.raises(ValueError, match="no arborescence"):
        max_arborescence(one_way, root=0)


@pytest.mark.parametrize("undirected", [True, False])
def test_gradcheck_and_backward_modes(undirected, generator):
    n = 5
    w = torch.randn(2, n, n, dtype=D, generator=generator, requires_grad=True)
    tau = torch.tensor([0.7, 1.3], dtype=D, requires_grad=True)

    def f(w, tau, backward="analytic"):
        if undirected:
            return spanning_tree_marginals(w, tau=tau, backward=backward)
        return arborescence_marginals(w, root=1, tau=tau, backward=backward)

    assert torch.autograd.gradcheck(f, (w, tau))
    # the analytic Function is once differentiable: a second derivative raises, never zeros
    (g1,) = torch.autograd.grad(f(w, 1.0).pow(2).sum(), w, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g1.sum(), w)
    assert torch.autograd.gradcheck(lambda w: f(w, tau.detach(), "unroll"), (w,))
    g = torch.randn(2, n, n, dtype=D, generator=generator)
    ga = torch.autograd.grad((f(w, tau) * g).sum(), (w, tau))
    gu = torch.autograd.grad((f(w, tau, "unroll") * g).sum(), (w, tau))
    for a, b in zip(ga, gu):
        torch.testing.assert_close(a, b)
    # log Z: gradient = marginals (halved per entry for the undirected symmetric part)
    lz = (spanning_tree_log_partition(w, tau=tau) if undirected
          else arborescence_log_partition(w, root=1, tau=tau))
    (gw,) = torch.autograd.grad(lz.sum(), w, create_graph=True)
    mu = f(w, tau).detach() / tau.detach()[:, None, None]
    torch.testing.assert_close(gw, mu / 2 if undirected else mu)
    def logz(w):
        return (spanning_tree_log_partition(w) if undirected
                else arborescence_log_partition(w, root=1))

    assert torch.autograd.gradcheck(logz, (w,))
    assert torch.autograd.gradgradcheck(logz, (w,))  # Hessian = Jacobian of the marginals


def test_finite_difference_agrees(generator):
    import perturb
    w = torch.randn(5, 5, dtype=D, generator=generator, requires_grad=True)
    g = torch.randn(5, 5, dtype=D, generator=generator)
    from perturb.structured import Arborescences
    grads = []
    for backward in ("analytic", "unroll", "finite_difference"):
        x = perturb.regularized_argmax(w, Arborescences(root=2), tau=0.8, backward=backward)
        grads.append(torch.autograd.grad((x * g).sum(), w)[0])
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[0], grads[2], atol=1e-5, rtol=1e-4)


def test_low_temperature_approaches_max_tree(generator):
    """|μ_e − T*_e| ≤ P(T ≠ T*) ≤ Σ_{T≠T*} exp(−(score(T*) − score(T))/τ), by enumeration."""
    n = 6
    w = torch.randn(3, n, n, dtype=D, generator=generator)
    cases = [(enumerate_spanning_trees(n, dtype=D), 0.5 * (w + w.mT), spanning_tree_marginals,
              max_spanning_tree(w), 0.5),
             (enumerate_arborescences(n, 3, dtype=D), w,
              lambda w, tau: arborescence_marginals(w, root=3, tau=tau),
              max_arborescence(w, root=3), 1.0)]
    for trees, s, marginals, best, half in cases:
        scores = half * (trees * s.masked_fill(torch.eye(n, dtype=torch.bool), 0).unsqueeze(-3)
                         ).sum((-1, -2))
        top = scores.max(-1).values
        torch.testing.assert_close(half * (best * s).sum((-1, -2)), top)
        gaps = (top.unsqueeze(-1) - scores).clamp_min(0)
        for tau in (1e-1, 1e-2, 1e-3):
            bound = torch.exp(-gaps / tau).sum(-1) - 1  # excludes T* itself (gap 0)
            err = (marginals(w, tau=tau) - best).abs().amax((-1, -2))
            assert (err <= bound + 1e-12).all(), (err, bound)
        assert (err < 1e-6).all() or (bound >= 1e-6).any()


def test_large_scores_n200_float64(generator):
    n = 200
    w = 50 * torch.randn(n, n, dtype=D, generator=generator)
    mu = spanning_tree_marginals(w)
    assert abs(mu.triu().sum().item() - (n - 1)) < 1e-9
    assert mu.min() >= -1e-12 and mu.max() <= 1 + 1e-12
    ma = arborescence_marginals(w)
    assert abs(ma.sum().item() - (n - 1)) < 1e-9
    assert math.isfinite(spanning_tree_log_partition(w).item())


def test_float32_n100_finite_and_extreme_logits(generator):
    n = 100
    w = 50 * torch.randn(n, n, generator=generator)
    for mu in (spanning_tree_marginals(w), arborescence_marginals(w)):
        assert mu.dtype == torch.float32 and torch.isfinite(mu).all()
        assert abs(mu.sum().item() - (2 if mu.allclose(mu.T) else 1) * (n - 1)) < 1e-3
    w = 1e4 * torch.randn(2, 12, 12, dtype=D, generator=generator)
    for tau in (1.0, 1e-3):
        w.requires_grad_(True)
        mu = spanning_tree_marginals(w, tau=tau)
        (g,) = torch.autograd.grad((mu * torch.randn_like(mu)).sum(), w)
        assert torch.isfinite(mu).all() and torch.isfinite(g).all()
        torch.testing.assert_close(mu, max_spanning_tree(w.detach()), atol=1e-9, rtol=0)
        assert torch.isfinite(arborescence_log_partition(w, tau=tau)).all()


def test_batched_equals_looped(generator):
    w = torch.randn(2, 3, 5, 5, dtype=D, generator=generator)
    mu = arborescence_marginals(w, root=4)
    for a in range(2):
        for b in range(3):
            torch.testing.assert_close(mu[a, b], arborescence_marginals(w[a, b], root=4))


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 9), scale=st.sampled_from([0.1, 1.0, 10.0]), seed=st.integers(0, 2**16))
def test_marginal_invariants(n, scale, seed):
    w = scale * torch.randn(n, n, dtype=D, generator=torch.Generator().manual_seed(seed))
    mu = spanning_tree_marginals(w)
    torch.testing.assert_close(mu, mu.T)
    assert (mu.diagonal() == 0).all() and mu.min() >= -1e-12 and mu.max() <= 1 + 1e-12
    assert abs(mu.triu().sum().item() - (n - 1)) < 1e-9
    ma = arborescence_marginals(w, root=n // 2)
    cols = ma.sum(0)
    assert cols[n // 2] == 0
    torch.testing.assert_close(cols[torch.arange(n) != n // 2], torch.ones(n - 1, dtype=D))
    # shifting every score by a constant changes nothing (undirected: ⟨s, T⟩ shifts uniformly)
    torch.testing.assert_close(spanning_tree_marginals(w + 3.0), mu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_matches_cpu(generator):
    w = torch.randn(3, 7, 7, dtype=D, generator=generator)
    for fn in (spanning_tree_marginals, arborescence_marginals, max_spanning_tree):
        torch.testing.assert_close(fn(w.cuda()).cpu(), fn(w))


@pytest.mark.parametrize("undirected", [True, False])
def test_fast_path_matches_general_path(undirected, generator):
    """A complete graph with finite scores skips the edge-mask construction; an all-True mask
    and lengths = n take the general path and must give the same values and gradients."""
    n = 6
    w = torch.randn(2, n, n, dtype=D, generator=generator, requires_grad=True)
    g = torch.randn(2, n, n, dtype=D, generator=generator)
    full = torch.ones(n, n, dtype=torch.bool)
    lengths = torch.tensor([n, n])
    if undirected:
        def marg(**kw):
            return spanning_tree_marginals(w, tau=0.7, **kw)

        def logz(**kw):
            return spanning_tree_log_partition(w, tau=0.7, **kw)
    else:
        def marg(**kw):
            return arborescence_marginals(w, root=2, tau=0.7, **kw)

        def logz(**kw):
            return arborescence_log_partition(w, root=2, tau=0.7, **kw)
    ref_mu = marg()
    ref_g = torch.autograd.grad((ref_mu * g).sum(), w)[0]
    ref_lz = logz()
    ref_lg = torch.autograd.grad(ref_lz.sum(), w)[0]
    for kw in (dict(mask=full), dict(lengths=lengths)):
        mu = marg(**kw)
        torch.testing.assert_close(mu, ref_mu, rtol=0, atol=1e-13)
        torch.testing.assert_close(torch.autograd.grad((mu * g).sum(), w)[0], ref_g,
                                   rtol=0, atol=1e-12)
        lz = logz(**kw)
        torch.testing.assert_close(lz, ref_lz, rtol=1e-14, atol=0)
        torch.testing.assert_close(torch.autograd.grad(lz.sum(), w)[0], ref_lg,
                                   rtol=0, atol=1e-13)
    # the forbidden entries (diagonal, root column) get exactly zero gradient
    forbidden = torch.eye(n, dtype=torch.bool)
    if not undirected:
        forbidden[:, 2] = True
    assert (ref_g[:, forbidden] == 0).all() and (ref_lg[:, forbidden] == 0).all()


def test_elimination_fused_logaddexp_matches(generator):
    """The once-differentiable elimination (fused torch.logaddexp) gives the same log Z and
    marginals as the twice-differentiable one, also at extreme scores."""
    from perturb.structured.trees._elimination import elimination_marginals
    n = 7
    valid = ~torch.eye(n, dtype=torch.bool)
    valid[:, 0] = False
    for scale in (1.0, 1e4):
        s = scale * torch.randn(3, n, n, dtype=D, generator=generator)
        v = valid.expand(s.shape)
        torch.testing.assert_close(elimination_log_partition(s, v, None, 0, once=True),
                                   elimination_log_partition(s, v, None, 0))
        mu1, lz1 = elimination_marginals(s, v, None, 0)
        s2 = s.clone().requires_grad_(True)
        mu2, lz2 = elimination_marginals(s2, v, None, 0, create_graph=True)
        assert torch.isfinite(mu1).all()
        torch.testing.assert_close(mu1, mu2.detach())
        torch.testing.assert_close(lz1, lz2.detach())


# --------------------------------------------------------------------------------------------
# peaked scores: the error estimate of the LU path, the cycle reduction, the path taken
# --------------------------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(n=st.integers(3, 24), scale=st.sampled_from([20.0, 50.0, 200.0]),
       seed=st.integers(0, 2**16))
def test_peaked_marginals_sum(n, scale, seed):
    """Peaked scores, whichever path runs: Σμ = n − 1 to 1e-9, μ in [0, 1] to the 1e-9/n of
    the a-posteriori check (twice that for an undirected μ_ij + μ_ji)."""
    w = scale * torch.randn(n, n, dtype=D, generator=torch.Generator().manual_seed(seed))
    for mu, total in ((spanning_tree_marginals(w).triu(), n - 1),
                      (arborescence_marginals(w, root=n - 1), n - 1)):
        assert abs(mu.sum().item() - total) <= 1e-9
        assert mu.min() >= -2e-9 / n and mu.max() <= 1 + 2e-9 / n


def test_root_must_be_a_node_index():
    """No Python-style wrap-around and no None for roots, in every tree function taking one."""
    from perturb.structured import Arborescences, max_arborescence, sample_arborescence
    w = torch.zeros(4, 4)
    for fn in (arborescence_marginals, arborescence_log_partition, max_arborescence,
               sample_arborescence):
        for root in (-1, -4, None, 4, 1.0):
            with pytest.raises(ValueError, match="root"):
                fn(w, root=root)
    for root in (-1, None):
        with pytest.raises(ValueError, match="root"):
            Arborescences(root)


def test_bad_input_samplers_and_exact_solvers():
    from perturb.structured import (
        max_arborescence,
        sample_arborescence,
        sample_spanning_tree,
    )
    bad = {"torch.Tensor": [[0.0, 1.0], [1.0, 0.0]], "floating": torch.zeros(3, 3, dtype=torch.long),
           "at least 2 dims": torch.zeros(3), "square": torch.zeros(3, 4),
           "NaN": torch.full((3, 3), math.nan), "n >= 2|empty event": torch.zeros(0, 0)}
    for fn in (max_spanning_tree, max_arborescence, sample_spanning_tree, sample_arborescence,
               spanning_tree_marginals, arborescence_log_partition):
        for message, w in bad.items():
            with pytest.raises(ValueError, match=message):
                fn(w)
