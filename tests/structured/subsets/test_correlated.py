"""Correlated k-subsets against independent references.

Oracles: brute-force enumeration over Z for d ≤ 7 (argmax value, log Z, marginals, sampler
frequencies), a sequential position-by-position log-space DP written here (d = 30, odd block
counts), the plain k-subset family (zero pair scores), float64 gradcheck / gradgradcheck of every
backward mode, and hypothesis properties of the marginals.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import perturb
from perturb import ExpFamilyEntropy, regularized_argmax, relax
from perturb.structured import (
    CorrelatedKSubset,
    correlated_topk_argmax,
    correlated_topk_log_partition,
    correlated_topk_marginals,
    ksubset_log_partition,
    ksubset_marginals,
    sample_correlated_topk,
)

F64 = torch.float64


def _marginals_hvp(y: torch.Tensor, g: torch.Tensor, d: int, k: int) -> torch.Tensor:
    """Cov_q(z) ḡ = ∇_y ⟨∇A(y), ḡ⟩ by double backward through the plain-torch inside pass (the
    former backward): an independent reference for the tangent passes."""
    from perturb.structured.subsets import correlated as C
    leaf = y.detach().requires_grad_(True)
    (mu,) = torch.autograd.grad(C._log_partition_unrolled(leaf, d, k).sum(), leaf,
                                create_graph=True)
    (hv,) = torch.autograd.grad((mu * g).sum(), leaf)
    return hv
SIZES = [(d, k) for d in range(1, 8) for k in range(1, d + 1)]


def _brute(w: torch.Tensor, k: int):
    """(best score, log Z, marginals) by enumerating Z."""
    d = (w.shape[-1] + 1) // 2
    z = CorrelatedKSubset(k).enumerate(2 * d - 1, dtype=w.dtype)
    scores = w @ z.T
    return scores.amax(-1), torch.logsumexp(scores, -1), torch.softmax(scores, -1) @ z


def _sequential_log_partition(w: torch.Tensor, k: int) -> torch.Tensor:
    """Reference: α_i[c, s] = log-weight of positions ≤ i with c chosen and z_i = s, one
    position at a time (a loop over positions, float64). ``(B, 2d − 1) -> (B,)``."""
    d = (w.shape[-1] + 1) // 2
    a, b = w[:, :d], w[:, d:]
    B = w.shape[0]
    neg = torch.full((B,), -1e300, dtype=w.dtype)     # log 0 (finite: no NaN gradients)
    alpha = [[neg, neg] for _ in range(k + 1)]
    alpha[0][0] = torch.zeros(B, dtype=w.dtype)
    alpha[1][1] = a[:, 0]
    for i in range(1, d):
        new = [[neg, neg] for _ in range(k + 1)]
        for c in range(k + 1):
            new[c][0] = torch.logaddexp(alpha[c][0], alpha[c][1])
            if c:
                new[c][1] = torch.logaddexp(alpha[c - 1][0] + a[:, i],
                                            alpha[c - 1][1] + a[:, i] + b[:, i - 1])
        alpha = new
    return torch.logaddexp(alpha[k][0], alpha[k][1])


# --------------------------------------------------------------------------------------------
# brute force
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d,k", SIZES)
def test_against_enumeration(d, k, seed):
    w = 2 * torch.randn(4, 2 * d - 1, dtype=F64)
    best, logz, mu = _brute(w, k)
    z = correlated_topk_argmax(w, k)
    assert CorrelatedKSubset(k).check(z).all()
    torch.testing.assert_close((w * z).sum(-1), best, rtol=0, atol=1e-12)
    torch.testing.assert_close(correlated_topk_log_partition(w, k), logz, rtol=1e-13, atol=1e-12)
    torch.testing.assert_close(correlated_topk_marginals(w, k), mu, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("d,k", [(4, 2), (7, 3)])
def test_temperature_and_batch_dims(d, k, seed):
    """τ a float, a 0-dim tensor or one per problem: the same as scores divided by τ."""
    w = torch.randn(2, 3, 2 * d - 1, dtype=F64)
    tau = 0.3 + torch.rand(2, 3, dtype=F64)
    _, logz, mu = _brute(w / tau[..., None], k)
    torch.testing.assert_close(correlated_topk_marginals(w, k, tau), mu)
    torch.testing.assert_close(correlated_topk_log_partition(w, k, tau), logz)
    y = regularized_argmax(w, CorrelatedKSubset(k), ExpFamilyEntropy(), tau=0.5)
    torch.testing.assert_close(y, _brute(w / 0.5, k)[2])
    torch.testing.assert_close(correlated_topk_marginals(w, k, torch.tensor(0.5, dtype=F64)), y)


def test_sequential_reference_larger_d(seed):
    """d = 30 (odd block counts at several levels) against the loop-over-positions DP."""
    d, k = 30, 7
    w = torch.randn(3, 2 * d - 1, dtype=F64, requires_grad=True)
    ref = _sequential_log_partition(w, k)
    (ref_mu,) = torch.autograd.grad(ref.sum(), w)
    torch.testing.assert_close(correlated_topk_log_partition(w, k), ref, rtol=1e-13, atol=1e-12)
    torch.testing.assert_close(correlated_topk_marginals(w, k), ref_mu, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("d,k", [(1, 1), (5, 2), (9, 4), (13, 13)])
def test_zero_pair_scores_is_the_plain_k_subset_family(d, k, seed):
    a = torch.randn(3, d, dtype=F64)
    w = torch.cat([a, torch.zeros(3, d - 1, dtype=F64)], -1)
    torch.testing.assert_close(correlated_topk_log_partition(w, k), ksubset_log_partition(a, k))
    torch.testing.assert_close(correlated_topk_marginals(w, k)[:, :d], ksubset_marginals(a, k))


def test_argmax_prefers_contiguous_runs():
    s = CorrelatedKSubset(2)
    assert torch.equal(s.argmax(torch.tensor([1., 0., 1., 3., 0.])),
                       torch.tensor([1., 1., 0., 1., 0.]))
    assert torch.equal(perturb.argmax(torch.tensor([1., 0., 1., 0., 0.]), s),
                       torch.tensor([1., 0., 1., 0., 0.]))


def test_argmax_with_ties_is_a_vertex_and_deterministic():
    w = torch.zeros(5, 2 * 9 - 1)
    z = correlated_topk_argmax(w, 4)
    assert CorrelatedKSubset(4).check(z).all()
    assert torch.equal(z, correlated_topk_argmax(w, 4))


# --------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------

def test_sampler_frequencies_match_q(generator):
    """N = 40000 samples of d = 5, k = 2 (10 vertices), two score vectors: each vertex frequency
    within 5 standard errors sqrt(q(1 − q)/N) of q (a false alarm has probability < 1e-5 over
    the 20 checks)."""
    d, k, N = 5, 2, 40_000
    w = torch.randn(2, 2 * d - 1, dtype=F64, generator=torch.Generator().manual_seed(7))
    w[1, d:] += 2.0                                   # strongly correlated second problem
    z = CorrelatedKSubset(k).enumerate(2 * d - 1, dtype=F64)
    q = torch.softmax(w @ z.T, -1)                    # (2, V)
    x = sample_correlated_topk(w, k, tau=1.0, n_samples=N, generator=generator)
    assert x.shape == (N, 2, 2 * d - 1) and x.dtype == F64
    assert CorrelatedKSubset(k).check(x).all()
    hits = (x[:, :, None, :] == z).all(-1).to(F64).mean(0)         # (2, V)
    se = (q * (1 - q) / N).sqrt()
    assert ((hits - q).abs() <= 5 * se).all(), (hits - q).abs() / se


def test_sampler_shapes_and_generator():
    w = torch.randn(3, 4, 7)
    one = sample_correlated_topk(w, 2, generator=torch.Generator().manual_seed(0))
    assert one.shape == w.shape and CorrelatedKSubset(2).check(one).all()
    again = sample_correlated_topk(w, 2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(one, again)
    assert sample_correlated_topk(torch.zeros(0, 7), 2, n_samples=3).shape == (3, 0, 7)


# --------------------------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["analytic", "unroll", "finite_difference"])
@pytest.mark.parametrize("d,k", [(1, 1), (4, 2), (6, 3)])
def test_gradcheck_every_backward_mode(mode, d, k, seed):
    """With respect to w and a tensor τ. The core's generic finite-difference wrapper
    differentiates w only (its τ gradient is 0), so that mode is checked in w alone."""
    w = torch.randn(2, 2 * d - 1, dtype=F64, requires_grad=True)
    tau = torch.tensor(0.7, dtype=F64, requires_grad=mode != "finite_difference")

    def f(w, tau):
        return regularized_argmax(w, CorrelatedKSubset(k), ExpFamilyEntropy(), tau, backward=mode)

    assert torch.autograd.gradcheck(f, (w, tau))


def test_backward_modes_agree_with_brute_force(seed):
    d, k = 6, 3
    w = torch.randn(3, 2 * d - 1, dtype=F64, requires_grad=True)
    c = torch.randn(3, 2 * d - 1, dtype=F64)
    (ref,) = torch.autograd.grad((c * _brute(w / 0.6, k)[2]).sum(), w)
    for mode in ("analytic", "unroll"):
        y = regularized_argmax(w, CorrelatedKSubset(k), ExpFamilyEntropy(), 0.6, backward=mode)
        (g,) = torch.autograd.grad((c * y).sum(), w)
        torch.testing.assert_close(g, ref, rtol=1e-10, atol=1e-12)


def _brute_cov(w: torch.Tensor, k: int) -> torch.Tensor:
    """Cov_q(z) of one row by enumeration (float64)."""
    d = (w.shape[-1] + 1) // 2
    z = CorrelatedKSubset(k).enumerate(2 * d - 1, dtype=w.dtype)
    p = torch.softmax(w @ z.T, -1)
    mu = p @ z
    return (z * p[:, None]).T @ z - torch.outer(mu, mu)


@pytest.mark.parametrize("m,k", [(2, 1), (2, 5), (3, 4), (4, 3), (6, 5)])
def test_split_scores_and_children_match_their_definitions(m, k, seed):
    """The count-major kernels of _blocks against their definitions entry by entry:
    S[s, t·m + i, u, c] = T_L[s, t, j] + T_R[t, u, c − j] (j = m − 1 − i, "−∞" outside the right
    table's counts), the same in the out= (no autograd) and the autograd branch; and the
    children of the split probabilities w: left (s, t, j) = Σ_{u,c} w, right (t, u, c') =
    Σ_{s, c − j = c'} w, interleaved by block and cut to nb."""
    from perturb.structured.subsets import _blocks as K

    P, B = 3, 4
    left, right = torch.randn(2, 2, 2, m, P, B, dtype=F64).unbind(0)
    m_out = min(k, 2 * (m - 1)) + 1
    S = K._split_scores(left, right, k)
    S_grad = K._split_scores(left.clone().requires_grad_(), right, k)
    assert S.shape == (2, 2 * m, 2, m_out, P, B)
    assert torch.equal(S, S_grad.detach())
    neg = K._neg(F64)
    w = torch.randn(S.shape, dtype=F64)
    want_l = torch.zeros(2, 2, m, P, B, dtype=F64)
    want_r = torch.zeros(2, 2, m, P, B, dtype=F64)
    for s, t, i, u, c in itertools.product(range(2), range(2), range(m), range(2), range(m_out)):
        j = m - 1 - i
        r = right[t, u, c - j] if 0 <= c - j < m else torch.full((P, B), neg, dtype=F64)
        assert torch.equal(S[s, t * m + i, u, c], left[s, t, j] + r)
        want_l[s, t, j] += w[s, t * m + i, u, c]
        if 0 <= c - j < m:
            want_r[t, u, c - j] += w[s, t * m + i, u, c]
    for nb in (2 * P, 2 * P - 1):
        got = K._children(w, nb)
        assert got.shape == (2, 2, m, nb, B)
        torch.testing.assert_close(got[:, :, :, 0::2], want_l[:, :, :, :(nb + 1) // 2])
        torch.testing.assert_close(got[:, :, :, 1::2], want_r[:, :, :, :nb // 2])


def test_split_weights_keep_exp_normal():
    """The split weights come from exponents clamped at log(tiny) + 10 (an underflowing exp is
    several times slower on CPU, denormal products too): every weight is a normal number, and
    the weights of every split sum to 1."""
    from perturb.structured.subsets import _blocks as K

    for dtype in (torch.float32, F64):
        y = (30 * torch.randn(6, 2 * 13 - 1)).to(dtype)
        _, weights = K._weighted_inside(y, 13, 4)
        tiny = torch.finfo(dtype).tiny
        for W in weights:
            assert (W >= tiny).all()
            torch.testing.assert_close(W.sum(1), torch.ones_like(W.sum(1)))


@pytest.mark.parametrize("d,k", [(1, 1), (2, 1), (3, 2), (5, 2), (7, 4), (7, 7)])
def test_tangent_backward_is_the_covariance(d, k, seed):
    """The hand-written tangent passes (_blocks._marginals_jvp) apply Cov_q(z) exactly (odd
    block counts included), against enumeration and the former double-backward HVP."""
    from perturb.structured.subsets import correlated as C

    y = 2 * torch.randn(3, 2 * d - 1, dtype=F64)
    g = torch.randn(3, 2 * d - 1, dtype=F64)
    mu, *tables = C._Marginals.apply(y, d, k)
    x = y.clone().requires_grad_()
    (vjp,) = torch.autograd.grad((C._Marginals.apply(x, d, k)[0] * g).sum(), x)
    for b in range(3):
        torch.testing.assert_close(mu[b], _brute(y[b], k)[2], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(vjp[b], _brute_cov(y[b], k) @ g[b], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(vjp, _marginals_hvp(y, g, d, k), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=str)
def test_tangent_backward_matches_the_double_backward_at_d_40(dtype, seed):
    """The example's size (d = 40, k = 5; 6 levels, odd counts) with large and small scores:
    the tangent passes against the former Hessian–vector product by double backward."""
    from perturb.structured.subsets import correlated as C

    d, k = 40, 5
    for scale in (0.1, 3.0, 30.0):
        y = (scale * torch.randn(4, 2 * d - 1, dtype=F64)).to(dtype)
        g = torch.randn(4, 2 * d - 1, dtype=F64).to(dtype)
        x = y.clone().requires_grad_()
        (vjp,) = torch.autograd.grad((C._Marginals.apply(x, d, k)[0] * g).sum(), x)
        ref = _marginals_hvp(y.double(), g.double(), d, k)
        tol = 1e-10 if dtype == F64 else 2e-4
        torch.testing.assert_close(vjp.double(), ref, rtol=tol, atol=tol)


def test_tangent_backward_at_exact_ties_of_1e4_and_small_tau():
    """Scores ±1e4 with exact ties at τ = 1e-3 (|y| = 1e7), float64: the tangent passes give the
    unrolled (autograd) gradient."""
    g = torch.Generator().manual_seed(3)
    d, k = 12, 4
    w = 1e4 * torch.randint(-1, 2, (5, 2 * d - 1), generator=g).to(F64)
    c = torch.randn(5, 2 * d - 1, generator=g, dtype=F64)
    grads = []
    for mode in ("analytic", "unroll"):
        x = w.clone().requires_grad_()
        y = regularized_argmax(x, CorrelatedKSubset(k), tau=1e-3, backward=mode)
        (gx,) = torch.autograd.grad((c * y).sum(), x)
        assert torch.isfinite(gx).all()
        grads.append(gx)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-8, atol=1e-5)


def test_log_partition_gradients(seed):
    """∇A = μ, and A is twice differentiable (its Hessian is Cov_q(z)); the unrolled marginals
    are differentiable twice."""
    d, k = 5, 2
    w = torch.randn(2, 2 * d - 1, dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(correlated_topk_log_partition(w, k).sum(), w)
    torch.testing.assert_close(g, _brute(w.detach(), k)[2])
    assert torch.autograd.gradcheck(lambda w: correlated_topk_log_partition(w, k, 0.8), (w,))
    assert torch.autograd.gradgradcheck(lambda w: correlated_topk_log_partition(w, k, 0.8), (w,))
    unrolled = lambda w: regularized_argmax(w, CorrelatedKSubset(k), tau=0.8,  # noqa: E731
                                            backward="unroll")
    assert torch.autograd.gradgradcheck(unrolled, (w,))


def test_relax_hard_is_a_vertex_with_the_relaxed_gradient(generator):
    theta = torch.randn(4, 9, requires_grad=True)
    y = relax(theta, CorrelatedKSubset(2), tau=0.5, hard=True, generator=generator)
    assert CorrelatedKSubset(2).check(y.detach()).all()
    y.sum().backward()
    assert torch.isfinite(theta.grad).all()


# --------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(d=st.integers(1, 12), data=st.data())
def test_marginal_properties(d, data):
    """μ ∈ [0, 1]; Σ_{i≤d} μ_i = k; max(0, μ_j + μ_{j+1} − 1) ≤ μ_{d+j} ≤ min(μ_j, μ_{j+1})."""
    k = data.draw(st.integers(1, d), label="k")
    scale = data.draw(st.sampled_from([0.1, 1.0, 10.0, 100.0]), label="scale")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    dtype = data.draw(st.sampled_from([torch.float32, F64]), label="dtype")
    w = scale * torch.randn(3, 2 * d - 1, generator=torch.Generator().manual_seed(seed))
    mu = correlated_topk_marginals(w.to(dtype), k).double()
    eps = 4 * torch.finfo(dtype).eps
    assert (mu >= -eps).all() and (mu <= 1 + eps).all()
    assert ((mu[:, :d].sum(-1) - k).abs() <= eps * k).all()
    both = torch.minimum(mu[:, :d - 1], mu[:, 1:d])
    assert (mu[:, d:] <= both + eps).all()
    assert (mu[:, d:] >= mu[:, :d - 1] + mu[:, 1:d] - 1 - eps).all()


@settings(max_examples=40, deadline=None)
@given(d=st.integers(2, 7), data=st.data())
def test_small_tau_approaches_the_argmax(d, data):
    """With a score gap Δ between the best and second-best vertex, τ = Δ/40 puts all but
    |Z|·e^{−40} of the mass on the argmax."""
    k = data.draw(st.integers(1, d), label="k")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    w = torch.randn(2 * d - 1, dtype=F64, generator=torch.Generator().manual_seed(seed))
    z = CorrelatedKSubset(k).enumerate(2 * d - 1, dtype=F64)
    scores = (w @ z.T).sort(descending=True).values
    gap = float(scores[0] - scores[1]) if len(z) > 1 else 1.0
    assume(gap > 1e-3)
    mu = correlated_topk_marginals(w, k, tau=gap / 40)
    torch.testing.assert_close(mu, correlated_topk_argmax(w, k), rtol=0,
                               atol=len(z) * math.exp(-40))


# --------------------------------------------------------------------------------------------
# extremes, dtypes, validation
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=str)
@pytest.mark.parametrize("kind", ["gaussian", "ties"])
def test_scores_of_1e4_at_small_tau_are_finite(dtype, kind):
    g = torch.Generator().manual_seed(3)
    d, k = 40, 9
    if kind == "gaussian":
        w = 1e4 * torch.randn(3, 2 * d - 1, generator=g, dtype=F64)
    else:
        w = 1e4 * torch.randint(-1, 2, (3, 2 * d - 1), generator=g).to(F64)
    w = w.to(dtype).requires_grad_()
    logz = correlated_topk_log_partition(w, k, tau=1e-3)
    best = (w.detach().double() * correlated_topk_argmax(w, k).double()).sum(-1) / 1e-3
    assert torch.isfinite(logz).all()
    # log Z is within log |Z| of the best score over τ (up to the rounding of w/τ)
    gap = logz.double() - best
    assert (gap >= -1e-6 * best.abs() - 1).all()
    assert (gap <= math.log(math.comb(d, k)) + 1e-6 * best.abs() + 1).all()
    for mode in ("analytic", "unroll"):
        y = regularized_argmax(w, CorrelatedKSubset(k), tau=1e-3, backward=mode)
        assert torch.isfinite(y).all()
        (grad,) = torch.autograd.grad((torch.randn(y.shape, generator=g, dtype=dtype) * y).sum(),
                                      w)
        assert torch.isfinite(grad).all()
    (glogz,) = torch.autograd.grad(logz.sum(), w)
    assert torch.isfinite(glogz).all()
    x = sample_correlated_topk(w, k, tau=1e-3, n_samples=4, generator=g)
    assert CorrelatedKSubset(k).check(x).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_in_float32(dtype):
    w = torch.randn(3, 9)
    for fn in (correlated_topk_marginals, correlated_topk_log_partition):
        out = fn(w.to(dtype), 3)
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), fn(w.to(dtype).float(), 3).to(dtype).float())
    assert correlated_topk_argmax(w.to(dtype), 3).dtype == dtype


def test_empty_batch():
    w = torch.zeros(0, 7, requires_grad=True)
    assert correlated_topk_marginals(w, 2).shape == (0, 7)
    assert correlated_topk_log_partition(w, 2).shape == (0,)
    assert correlated_topk_argmax(w, 2).shape == (0, 7)


def test_structure_contract():
    s = CorrelatedKSubset(3)
    assert repr(s) == "CorrelatedKSubset(k=3)" and s == CorrelatedKSubset(3)
    assert s.default_regularizer() == ExpFamilyEntropy()
    z = s.enumerate(11)
    assert z.shape == (math.comb(6, 3), 11) and s.check(z).all()
    bad = z.clone()
    bad[:, 6:] = 1 - bad[:, 6:]                       # pair indicators inconsistent
    assert not s.check(bad).any()
    assert not s.check(torch.zeros(4)).any()          # even size: never a vertex


def test_bad_input():
    with pytest.raises(ValueError, match="odd"):
        correlated_topk_marginals(torch.randn(2, 6), 2)
    with pytest.raises(ValueError, match="k must satisfy"):
        correlated_topk_argmax(torch.randn(2, 5), 4)
    with pytest.raises(ValueError, match="k must be >= 1"):
        CorrelatedKSubset(0)
    with pytest.raises(ValueError, match="tau"):
        correlated_topk_log_partition(torch.randn(5), 1, tau=0.0)
    with pytest.raises(ValueError, match="NaN"):
        correlated_topk_marginals(torch.tensor([0.0, math.nan, 1.0]), 1)
    with pytest.raises(ValueError, match="supported"):
        regularized_argmax(torch.randn(5), CorrelatedKSubset(1), backward="implicit")
    with pytest.raises(NotImplementedError, match="CorrelatedKSubset"):
        regularized_argmax(torch.randn(5), CorrelatedKSubset(1), perturb.Entropy())


def test_registry_entry():
    pairs = {(p.structure, p.regularizer): p for p in perturb.registered_pairs()}
    entry = pairs[("CorrelatedKSubset", "ExpFamilyEntropy")]
    assert entry.supported and entry.backward == ("analytic", "unroll", "finite_difference")
