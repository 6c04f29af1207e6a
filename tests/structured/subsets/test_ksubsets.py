"""k-subsets: top-k, the four capped-simplex relaxations, the exponential-family DP, sampling.

Oracles: brute-force enumeration of all C(n, k) subsets (n <= 8), KKT / variational-inequality
optimality over the vertices, float64 gradcheck, agreement between backward modes, Monte Carlo
with tolerances from the standard error.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import perturb
from perturb import BinaryEntropy, Entropy, ExpFamilyEntropy, SquaredNorm
from perturb.structured import KSubset, relaxed_topk, topk
from perturb.structured.subsets import dp
from perturb.structured.subsets import ksubset_log_partition, ksubset_marginals, sample_ksubset
from perturb.structured.subsets.ksubsets import _capped_forward, _capped_root, _capped_vjp, _link

REGS = [SquaredNorm(), Entropy(), BinaryEntropy(), ExpFamilyEntropy()]
NATIVE = {SquaredNorm: ("analytic", "implicit"), Entropy: ("analytic", "implicit"),
          BinaryEntropy: ("analytic", "implicit"), ExpFamilyEntropy: ("analytic", "unroll")}
KIND = {SquaredNorm: "euclidean", Entropy: "entropy", BinaryEntropy: "sigmoid"}
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


def _brute(w, k, tau=1.0):
    """log Z, marginals, covariance and subset probabilities by enumeration. w: (n,)."""
    n = w.shape[-1]
    Z = KSubset(k).enumerate(n, dtype=w.dtype)
    s = Z @ w / tau
    logz = torch.logsumexp(s, 0)
    p = torch.softmax(s, 0)
    mu = p @ Z
    cov = (Z * p[:, None]).T @ Z - torch.outer(mu, mu)
    return logz, mu, cov, p, Z


# --------------------------------------------------------------------------------------------
# the structure and top-k
# --------------------------------------------------------------------------------------------

def test_structure_contract():
    s = KSubset(3)
    assert repr(s) == "KSubset(k=3)"
    assert s == KSubset(3) and s != KSubset(2) and hash(s) == hash(KSubset(3))
    assert isinstance(s.default_regularizer(), ExpFamilyEntropy)
    Z = s.enumerate(6, dtype=torch.float64)
    assert Z.shape == (math.comb(6, 3), 6)
    assert bool(s.check(Z).all())
    assert len({tuple(z.tolist()) for z in Z}) == Z.shape[0]
    bad = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0]])
    assert s.check(bad).tolist() == [False, False, False]
    assert s.check(torch.tensor([0.0, 1.0, 1.0, 1.0])).item()


def test_argmax_matches_enumeration(seed):
    n, k = 7, 3
    w = torch.randn(20, n, dtype=torch.float64)
    Z = KSubset(k).enumerate(n, dtype=torch.float64)
    best = Z[(w @ Z.T).argmax(-1)]
    assert torch.equal(topk(w, k), best)
    assert torch.equal(perturb.argmax(w, KSubset(k)), best)


def test_topk_ties_go_to_lowest_index():
    w = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    assert topk(w, 2).tolist() == [[0, 1, 1, 0, 0], [1, 1, 0, 0, 0]]


def test_topk_batched_shape_dtype():
    w = torch.randn(2, 3, 9, dtype=torch.float32)
    y = topk(w, 4)
    assert y.shape == w.shape and y.dtype == w.dtype
    assert bool(KSubset(4).check(y).all())
    assert torch.equal(y, torch.stack([topk(v, 4) for v in w.reshape(-1, 9)]).reshape(w.shape))


@pytest.mark.parametrize("fn", [
    lambda w, k: topk(w, k),
    lambda w, k: relaxed_topk(w, k, regularizer=SquaredNorm()),
    lambda w, k: ksubset_marginals(w, k),
    lambda w, k: ksubset_log_partition(w, k),
    lambda w, k: sample_ksubset(w, k),
])
def test_bad_input(fn):
    w = torch.randn(2, 5)
    with pytest.raises(ValueError, match=r"k=6 and n=5"):
        fn(w, 6)
    with pytest.raises(ValueError, match="k"):
        fn(w, 0)
    with pytest.raises(ValueError, match="k must be an int"):
        fn(w, 2.0)
    with pytest.raises(ValueError, match="NaN"):
        fn(torch.tensor([1.0, float("nan"), 0.0]), 1)
    with pytest.raises(ValueError, match="floating"):
        fn(torch.arange(5), 2)


def test_bad_tau_and_backward():
    w = torch.randn(5)
    for reg in REGS:
        for tau in (0.0, -1.0, float("nan")):
            with pytest.raises(ValueError, match="tau"):
                relaxed_topk(w, 2, tau, reg)
        with pytest.raises(ValueError, match="supported"):
            relaxed_topk(w, 2, 1.0, reg, backward="unroll" if reg != ExpFamilyEntropy()
                         else "implicit")
    with pytest.raises(ValueError, match="tau"):
        ksubset_marginals(w, 2, tau=0.0)
    with pytest.raises(ValueError, match="n_samples"):
        sample_ksubset(w, 2, n_samples=0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        KSubset(0)


def test_registry_lists_the_four_pairs():
    pairs = {(p.structure, p.regularizer): p for p in perturb.registered_pairs()}
    for reg in REGS:
        entry = pairs[("KSubset", type(reg).__name__)]
        assert entry.supported
        assert entry.backward == NATIVE[type(reg)] + ("finite_difference",)


# --------------------------------------------------------------------------------------------
# exponential family: DP against enumeration
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,k", [(1, 1), (4, 1), (5, 2), (6, 3), (7, 6), (8, 4), (6, 6)])
def test_log_partition_and_marginals_match_enumeration(n, k, seed):
    w = 2 * torch.randn(3, n, dtype=torch.float64)
    tau = 0.7
    logz = ksubset_log_partition(w, k, tau)
    mu = ksubset_marginals(w, k, tau)
    for b in range(3):
        ref_logz, ref_mu, *_ = _brute(w[b], k, tau)
        torch.testing.assert_close(logz[b], ref_logz, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(mu[b], ref_mu, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(mu.sum(-1), torch.full((3,), float(k), dtype=torch.float64))
    assert torch.equal(relaxed_topk(w, k, tau), mu)  # the default regularizer


def test_marginals_are_gradient_of_log_partition(seed):
    w = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(ksubset_log_partition(w, 3, 0.5).sum(), w)
    torch.testing.assert_close(g, ksubset_marginals(w, 3, 0.5) / 0.5)


def test_marginal_jacobian_is_the_covariance(seed):
    """The tangent backward helper applies Cov_q(z); compared with enumeration."""
    n, k = 7, 3
    y = torch.randn(2, n, dtype=torch.float64)
    g = torch.randn(2, n, dtype=torch.float64)
    ys, _, nu = dp._prepare(y, k)
    mu, t0, *tables = dp._KSubsetMarginals.apply(ys, nu, k)
    out = dp._marginals_vjp(t0, tables, g, k)
    for b in range(2):
        cov = _brute(y[b], k)[2]
        torch.testing.assert_close(out[b], cov @ g[b], rtol=1e-10, atol=1e-12)


def test_double_backward_of_log_partition(seed):
    w = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda v: ksubset_log_partition(v, 2, 0.8), (w,))


def test_batched_equals_looped_and_tau_tensor(seed):
    w = torch.randn(4, 9, dtype=torch.float64)
    tau = torch.tensor([0.3, 1.0, 2.0, 5.0], dtype=torch.float64)
    for reg in REGS:
        out = relaxed_topk(w, 3, tau, reg)
        looped = torch.stack([relaxed_topk(w[b], 3, float(tau[b]), reg) for b in range(4)])
        torch.testing.assert_close(out, looped, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------
# exact sampling
# --------------------------------------------------------------------------------------------

def test_sampling_matches_subset_probabilities(generator):
    n, k, N = 5, 2, 40000
    w = torch.tensor([1.0, -0.5, 0.3, 2.0, 0.0], dtype=torch.float64)
    samples = sample_ksubset(w, k, tau=0.8, n_samples=N, generator=generator)
    assert samples.shape == (N, n) and bool(KSubset(k).check(samples).all())
    _, mu, _, p, Z = _brute(w, k, 0.8)
    freq = (samples[:, None, :] == Z[None]).all(-1).double().mean(0)
    se = (p * (1 - p) / N).sqrt()
    assert bool(((freq - p).abs() <= 5 * se).all()), (freq, p)
    se_mu = (mu * (1 - mu) / N).sqrt()
    assert bool(((samples.mean(0) - mu).abs() <= 5 * se_mu).all())


def test_sampling_batched_reproducible_and_extreme():
    w = torch.randn(3, 2, 8)
    a = sample_ksubset(w, 3, generator=torch.Generator().manual_seed(5))
    b = sample_ksubset(w, 3, generator=torch.Generator().manual_seed(5))
    assert a.shape == w.shape and torch.equal(a, b) and bool(KSubset(3).check(a).all())
    # extreme scores: the sample is the top-k with certainty
    w = torch.tensor([1e4, -1e4, 5e3, 0.0, -3.0])
    s = sample_ksubset(w, 2, tau=1e-3, n_samples=50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(s, topk(w, 2).expand(50, 5))


# --------------------------------------------------------------------------------------------
# every relaxation: membership, optimality, limits
# --------------------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 12), data=st.data(), scale=st.sampled_from([0.01, 1.0, 30.0]),
       tau=st.sampled_from([0.05, 1.0, 10.0]), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_relaxations_lie_in_capped_simplex(n, data, scale, tau, seed, dtype):
    k = data.draw(st.integers(1, n))
    w = scale * torch.randn(3, n, generator=torch.Generator().manual_seed(seed)).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    for reg in REGS:
        x = relaxed_topk(w, k, tau, reg)
        assert x.dtype == dtype and bool(torch.isfinite(x).all())
        assert bool((x >= 0).all() & (x <= 1).all())
        torch.testing.assert_close(x.sum(-1), torch.full((3,), float(k), dtype=dtype),
                                   rtol=0, atol=tol * k)


def _variational_gap(grad, x, k):
    """max_v ⟨grad, v − x⟩ over the vertices v: ≤ 0 iff x maximises the concave objective."""
    Z = KSubset(k).enumerate(x.shape[-1], dtype=x.dtype)
    return ((Z - x) @ grad).max()


@pytest.mark.parametrize("n,k", [(6, 1), (6, 2), (7, 3), (8, 5)])
@pytest.mark.parametrize("scale", [0.3, 3.0])
def test_kkt_and_optimality(n, k, scale, seed):
    tau = 0.5
    for _ in range(5):
        w = scale * torch.randn(n, dtype=torch.float64)
        y = w / tau
        # SquaredNorm: x = clip(y − ν, 0, 1), projection of y onto the capped simplex
        x = relaxed_topk(w, k, tau, SquaredNorm())
        free = (x > 0) & (x < 1)
        if free.any():
            nu = (y - x)[free]
            assert float(nu.max() - nu.min()) < 1e-10
            nu = nu.mean()
            assert bool((y[x == 0] <= nu + 1e-10).all() & (y[x == 1] >= nu + 1 - 1e-10).all())
        assert _variational_gap(y - x, x, k) <= 1e-10
        # Entropy: x = min(1, exp(y − ν − 1))
        x = relaxed_topk(w, k, tau, Entropy())
        free = x < 1
        nu = (y - torch.log(x) - 1)[free]
        assert float(nu.max() - nu.min()) < 1e-9
        assert bool((y[~free] - nu.mean() - 1 >= -1e-9).all())
        assert _variational_gap(y - torch.log(x) - 1, x, k) <= 1e-9
        # BinaryEntropy: x = σ(y − ν)
        x = relaxed_topk(w, k, tau, BinaryEntropy())
        nu = y - torch.logit(x)
        assert float(nu.max() - nu.min()) < 1e-8
        assert _variational_gap(y - torch.logit(x), x, k) <= 1e-8


def test_entropy_sort_solution_equals_root_finder(seed):
    y = 3 * torch.randn(50, 20, dtype=torch.float64)
    for k in (1, 4, 19):
        nu = _capped_root(y, k, "entropy")
        torch.testing.assert_close(_capped_forward(y, k, "entropy"), _link(y - nu, "entropy")[0],
                                   rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reg", REGS, ids=repr)
def test_small_tau_approaches_topk(reg, seed):
    # distinct scores with gaps ≥ 0.1 so that τ = 1e-3 is far in the hard regime
    w = torch.randperm(12).double().reshape(1, 12) * 0.1 + torch.zeros(3, 1, dtype=torch.float64)
    w[1] = -w[1]
    hard = topk(w, 4)
    errors = [float((relaxed_topk(w, 4, tau, reg) - hard).abs().max()) for tau in (1.0, 0.1, 1e-3)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-12


def test_k_equals_n_is_all_ones():
    w = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    for reg in REGS:
        x = relaxed_topk(w, 4, 0.5, reg)
        torch.testing.assert_close(x, torch.ones_like(w))
        (g,) = torch.autograd.grad((x * torch.randn_like(x)).sum(), w)
        torch.testing.assert_close(g, torch.zeros_like(w), atol=1e-12, rtol=0)


# --------------------------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reg", REGS, ids=repr)
def test_gradcheck_every_backward(reg, seed):
    w = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor([0.7, 1.3], dtype=torch.float64, requires_grad=True)
    for mode in NATIVE[type(reg)]:
        assert torch.autograd.gradcheck(lambda v, t: relaxed_topk(v, 2, t, reg, mode), (w, tau))


@pytest.mark.parametrize("reg", REGS, ids=repr)
def test_backward_modes_agree(reg, seed):
    w = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 7, dtype=torch.float64)
    grads = {}
    for mode in NATIVE[type(reg)] + ("finite_difference",):
        (grads[mode],) = torch.autograd.grad((relaxed_topk(w, 3, 0.6, reg, mode) * g).sum(), w)
    ref = grads.pop(NATIVE[type(reg)][0])
    assert ref.abs().max() > 1e-3
    for mode, val in grads.items():
        tol = 1e-5 if mode == "finite_difference" else 1e-10
        torch.testing.assert_close(val, ref, rtol=tol, atol=tol, msg=mode)


@pytest.mark.parametrize("kind", ["euclidean", "entropy", "sigmoid"])
def test_capped_vjp_is_symmetric_jacobian(kind, seed):
    """The closed form diag(a) − a aᵀ/Σa against a dense autograd-free finite difference."""
    y = torch.randn(8, dtype=torch.float64)
    z = _capped_forward(y, 3, kind)
    eye = torch.eye(8, dtype=torch.float64)
    J = torch.stack([_capped_vjp(z, e, kind) for e in eye])
    torch.testing.assert_close(J, J.T)
    h = 1e-6
    fd = torch.stack([(_capped_forward(y + h * e, 3, kind) - _capped_forward(y - h * e, 3, kind))
                      / (2 * h) for e in eye])
    torch.testing.assert_close(J, fd, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(J.sum(0), torch.zeros(8, dtype=torch.float64), atol=1e-12, rtol=0)


# --------------------------------------------------------------------------------------------
# stochastic relaxations through the core
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("noise", [perturb.Gumbel(), perturb.Normal()], ids=repr)
def test_relax_hard_is_straight_through_topk(noise):
    theta = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    for reg in REGS:
        y = perturb.relax(theta, KSubset(3), noise, reg, tau=0.5, hard=True,
                          generator=torch.Generator().manual_seed(3))
        u = perturb.perturb(theta, noise, generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(y, topk(u, 3))
        soft = perturb.relax(theta, KSubset(3), noise, reg, tau=0.5,
                             generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(soft, relaxed_topk(u, 3, 0.5, reg))
        g = torch.randn(4, 8, dtype=torch.float64)
        (gh,) = torch.autograd.grad((y * g).sum(), theta)
        (gs,) = torch.autograd.grad((soft * g).sum(), theta)
        torch.testing.assert_close(gh, gs)
        # a gradient flows unless every row is a vertex up to one free entry (which the sum
        # constraint pins): the Euclidean projection can land there at τ = 0.5
        free = ((soft > 0) & (soft < 1)).sum(-1)
        assert (gh.abs().amax(-1) > 0).tolist() == (free >= 2).tolist()


# --------------------------------------------------------------------------------------------
# numerics and size
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reg", REGS, ids=repr)
def test_extreme_scores_small_tau(reg, dtype, seed):
    w = (torch.rand(4, 40, dtype=dtype) * 2 - 1) * 1e4
    w[0] = 1e4                      # all tied: the answer is uniform k/n
    w[1, :5] = -1e4
    w.requires_grad_(True)
    for tau in (1e-3, 1.0):
        x = relaxed_topk(w, 5, tau, reg)
        (g,) = torch.autograd.grad((x * torch.randn_like(x)).sum(), w)
        assert bool(torch.isfinite(x).all() & torch.isfinite(g).all())
        assert bool((x >= 0).all() & (x <= 1).all())
        torch.testing.assert_close(x.sum(-1), torch.full((4,), 5.0, dtype=dtype),
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(x[0], torch.full((40,), 5 / 40, dtype=dtype))
    assert bool(torch.isfinite(ksubset_log_partition(w, 5, 1e-3)).all())


def test_large_n_capped_solvers():
    w = torch.randn(2, 10_000, generator=torch.Generator().manual_seed(0), requires_grad=True)
    for reg in REGS[:3]:
        x = relaxed_topk(w, 100, 0.1, reg)
        (g,) = torch.autograd.grad((x * torch.randn_like(x)).sum(), w)
        assert bool(torch.isfinite(x).all() & torch.isfinite(g).all())
        torch.testing.assert_close(x.sum(-1), torch.full((2,), 100.0), rtol=0, atol=1e-3)


def test_large_dp():
    w = torch.randn(1, 2000, generator=torch.Generator().manual_seed(0), requires_grad=True)
    x = relaxed_topk(w, 50, 0.5)
    (g,) = torch.autograd.grad((x * torch.randn_like(x)).sum(), w)
    assert bool(torch.isfinite(x).all() & torch.isfinite(g).all())
    torch.testing.assert_close(x.sum(-1), torch.full((1,), 50.0), rtol=0, atol=1e-3)


@cuda
def test_cuda_matches_cpu(seed):
    w = torch.randn(3, 30, dtype=torch.float64)
    for reg in REGS:
        cpu = relaxed_topk(w, 4, 0.5, reg)
        gpu = relaxed_topk(w.cuda(), 4, 0.5, reg)
        assert gpu.device.type == "cuda"
        torch.testing.assert_close(gpu.cpu(), cpu)
    s = sample_ksubset(w.cuda(), 4, n_samples=10, generator=torch.Generator("cuda").manual_seed(0))
    assert s.device.type == "cuda" and bool(KSubset(4).check(s).all())
    assert torch.equal(topk(w.cuda(), 4).cpu(), topk(w, 4))
