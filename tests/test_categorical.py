"""Tests of perturb/categorical.py: softmax, sparsemax, Gumbel- and Gaussian-softmax."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb import (
    Entropy,
    ExpFamilyEntropy,
    Gumbel,
    Normal,
    Simplex,
    SquaredNorm,
    argmax,
    perturb,
    registered_pairs,
    regularized_argmax,
    relax,
)
from perturb._validation import set_validation
from perturb.categorical import (
    _softmax_backward,
    _solve_softmax,
    _Sparsemax,
    _sparsemax_backward,
    _sparsemax_forward,
    gaussian_softmax,
    gumbel_softmax,
    softmax,
    sparsemax,
)

DTYPES = [torch.float32, torch.float64]


def _softmax_analytic(z):
    """The registered softmax solver in its "analytic" mode, without the public checks."""
    return _solve_softmax(z, Simplex(), Entropy(), 1.0, "analytic")


# --------------------------------------------------------------------------------------------
# independent references
# --------------------------------------------------------------------------------------------

def _sparsemax_bisection(z: torch.Tensor, iters: int = 200) -> torch.Tensor:
    """Projection onto the simplex by bisection on the threshold ν: Σ_i [z_i − ν]_+ = 1."""
    z = z.double()
    lo = z.min(-1, keepdim=True).values - 1.0  # sum >= n >= 1 here
    hi = z.max(-1, keepdim=True).values        # sum = 0 here
    for _ in range(iters):
        mid = (lo + hi) / 2
        over = (z - mid).clamp_min(0).sum(-1, keepdim=True) > 1
        lo = torch.where(over, mid, lo)
        hi = torch.where(over, hi, mid)
    return (z - (lo + hi) / 2).clamp_min(0)


def _dirichlet_points(n: int, m: int, generator: torch.Generator) -> torch.Tensor:
    e = torch.empty(m, n, dtype=torch.float64).exponential_(generator=generator)
    return e / e.sum(-1, keepdim=True)


# --------------------------------------------------------------------------------------------
# forward values
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tau", [0.3, 1.0, 4.0])
def test_softmax_closed_form_and_optimality(tau, generator):
    w = torch.randn(5, 6, dtype=torch.float64, generator=generator)
    y = softmax(w, tau=tau)
    torch.testing.assert_close(y, torch.exp(w / tau) / torch.exp(w / tau).sum(-1, keepdim=True))
    # it maximises <w, x> - tau * sum x log x over the simplex: better than any random point
    obj = lambda x: (w.unsqueeze(-2) * x).sum(-1) - tau * Entropy().value(x)  # noqa: E731
    others = _dirichlet_points(6, 500, generator)
    assert bool((obj(y.unsqueeze(-2)) >= obj(others.unsqueeze(0)) - 1e-12).all())


@pytest.mark.parametrize("tau", [0.2, 1.0, 3.0])
def test_sparsemax_matches_bisection_and_is_projection(tau, generator):
    w = torch.randn(20, 7, dtype=torch.float64, generator=generator) * 2
    p = sparsemax(w, tau=tau)
    torch.testing.assert_close(p, _sparsemax_bisection(w / tau), atol=1e-12, rtol=0)
    # Euclidean projection of w/tau: no point of the simplex is closer
    q = _dirichlet_points(7, 300, generator)
    d_p = ((p - w / tau) ** 2).sum(-1, keepdim=True)
    d_q = ((q.unsqueeze(0) - (w / tau).unsqueeze(1)) ** 2).sum(-1)
    assert bool((d_p <= d_q + 1e-12).all())


def test_sparsemax_known_values():
    torch.testing.assert_close(sparsemax(torch.tensor([1.0, 0.8, -1.0])),
                               torch.tensor([0.6, 0.4, 0.0]))
    # equal scores: uniform; one dominant score: one-hot
    torch.testing.assert_close(sparsemax(torch.zeros(4)), torch.full((4,), 0.25))
    torch.testing.assert_close(sparsemax(torch.tensor([5.0, 0.0, 0.0])),
                               torch.tensor([1.0, 0.0, 0.0]))


def test_expfamily_entropy_is_softmax(generator):
    w = torch.randn(3, 5, dtype=torch.float64, generator=generator)
    torch.testing.assert_close(regularized_argmax(w, Simplex(), ExpFamilyEntropy(), tau=0.7),
                               torch.softmax(w / 0.7, -1))


def test_simplex_pairs_registered():
    pairs = {(p.structure, p.regularizer): p for p in registered_pairs()}
    for reg in ("Entropy", "SquaredNorm", "ExpFamilyEntropy"):
        entry = pairs[("Simplex", reg)]
        assert entry.supported
        assert entry.backward == ("analytic", "unroll", "finite_difference")


@pytest.mark.parametrize("fn", [softmax, sparsemax])
def test_dim_argument(fn, generator):
    w = torch.randn(4, 5, 3, dtype=torch.float64, generator=generator)
    torch.testing.assert_close(fn(w, dim=1), fn(w.transpose(1, 2), dim=-1).transpose(1, 2))
    torch.testing.assert_close(fn(w, dim=0), fn(w.movedim(0, -1)).movedim(-1, 0))


@pytest.mark.parametrize("fn,reg", [(softmax, Entropy()), (sparsemax, SquaredNorm())])
def test_tensor_tau_per_batch_element(fn, reg, generator):
    w = torch.randn(3, 5, dtype=torch.float64, generator=generator)
    tau = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    y = fn(w, tau=tau)
    for i in range(3):
        torch.testing.assert_close(y[i], fn(w[i], tau=float(tau[i].detach())))
    # the temperature is differentiable: analytic and unrolled gradients agree
    c = torch.randn(3, 5, dtype=torch.float64, generator=generator)
    (g_a,) = torch.autograd.grad((fn(w, tau=tau) * c).sum(), tau)
    (g_u,) = torch.autograd.grad((fn(w, tau=tau, backward="unroll") * c).sum(), tau)
    torch.testing.assert_close(g_a, g_u)
    with pytest.raises(ValueError, match="tau"):
        fn(w, tau=torch.ones(4, dtype=torch.float64))


# --------------------------------------------------------------------------------------------
# backward passes
# --------------------------------------------------------------------------------------------

def test_gradcheck_analytic_functions(generator):
    z = torch.randn(3, 6, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(_softmax_analytic, (z,))
    # sparsemax: supports of 2-4 of 6 entries, every coordinate far (> 1e-2) from the threshold
    zs = torch.tensor([[1.0, 0.8, 0.45, -1.0, -2.0, 0.7],
                       [0.1, 0.3, -0.2, 0.25, 2.0, 1.5],
                       [0.0, -0.5, 0.4, 0.45, -1.0, 0.9]], dtype=torch.float64)
    p = _sparsemax_forward(zs)
    support = (p > 0).sum(-1)
    assert bool(((support > 1) & (support < 6)).all())
    nu = (zs - p).gather(-1, p.argmax(-1, keepdim=True))  # z - p = threshold on the support
    assert float((zs - nu).abs().min()) > 1e-2
    assert torch.autograd.gradcheck(_Sparsemax.apply, (zs.requires_grad_(),))


def test_backward_helpers_match_jacobians(generator):
    z = torch.randn(6, dtype=torch.float64, generator=generator)
    g = torch.randn(6, dtype=torch.float64, generator=generator)
    y = torch.softmax(z, -1)
    jac = torch.diag(y) - torch.outer(y, y)
    torch.testing.assert_close(_softmax_backward(y, g), jac @ g)
    # the "analytic" mode is torch.softmax, whose own backward is exactly this product
    zg = z.clone().requires_grad_()
    (g_torch,) = torch.autograd.grad(_softmax_analytic(zg), zg, g)
    torch.testing.assert_close(g_torch, _softmax_backward(y, g), rtol=0, atol=0)
    p = _sparsemax_forward(torch.tensor([1.0, 0.8, 0.45, -1.0, -2.0, 0.7], dtype=torch.float64))
    s = (p > 0).double()
    jac = torch.diag(s) - torch.outer(s, s) / s.sum()
    assert 1 < int(s.sum()) < 6
    torch.testing.assert_close(_sparsemax_backward(p, g), jac @ g)


@pytest.mark.parametrize("reg", [Entropy(), SquaredNorm(), ExpFamilyEntropy()])
@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_backward_modes_agree(reg, tau, generator):
    w = torch.randn(4, 6, dtype=torch.float64, generator=generator, requires_grad=True)
    c = torch.randn(4, 6, dtype=torch.float64, generator=generator)
    grads = {}
    for mode in ("analytic", "unroll", "finite_difference"):
        y = regularized_argmax(w, Simplex(), reg, tau, backward=mode)
        torch.testing.assert_close(y, regularized_argmax(w, Simplex(), reg, tau))
        (grads[mode],) = torch.autograd.grad((y * c).sum(), w)
    torch.testing.assert_close(grads["analytic"], grads["unroll"])
    # central differences with eps = 1e-3: O(eps^2) error (and sparsemax is piecewise linear)
    torch.testing.assert_close(grads["analytic"], grads["finite_difference"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("fn", [softmax, sparsemax])
def test_gradcheck_public(fn, generator):
    w = (torch.randn(2, 5, dtype=torch.float64, generator=generator) * 0.8).requires_grad_()
    assert torch.autograd.gradcheck(lambda v: fn(v, dim=0, tau=0.7), (w,))


# --------------------------------------------------------------------------------------------
# stochastic softmaxes
# --------------------------------------------------------------------------------------------

def test_gumbel_argmax_frequencies_are_softmax():
    theta = torch.tensor([1.0, 0.0, -1.0, 0.5], dtype=torch.float64)
    n = 40_000
    g = torch.Generator().manual_seed(7)
    counts = argmax(perturb(theta, Gumbel(), n_samples=n, generator=g)).sum(0)
    p = torch.softmax(theta, -1)
    se = (p * (1 - p) / n).sqrt()
    assert bool(((counts / n - p).abs() <= 5 * se).all()), (counts / n, p)
    # and the hard Gumbel-softmax sample has the same law
    g = torch.Generator().manual_seed(8)
    hard = gumbel_softmax(theta.expand(n, 4), tau=0.5, hard=True, generator=g)
    assert bool(((hard.mean(0) - p).abs() <= 5 * se).all())


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_gumbel_softmax_is_relax(hard, dim):
    logits = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    y = gumbel_softmax(logits, tau=0.7, hard=hard, dim=dim,
                       generator=torch.Generator().manual_seed(3))
    ref = relax(logits.movedim(dim, -1), Simplex(), Gumbel(), Entropy(), 0.7, hard=hard,
                generator=torch.Generator().manual_seed(3)).movedim(-1, dim)
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    if hard:
        assert bool(Simplex().check(y.movedim(dim, -1)).all())


def test_gaussian_softmax_is_relax():
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    y = gaussian_softmax(logits, tau=0.5, scale=2.0, generator=torch.Generator().manual_seed(4))
    u = perturb(logits, Normal(2.0), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(y, torch.softmax(u / 0.5, -1))
    ref = relax(logits, Simplex(), Normal(2.0), Entropy(), 0.5,
                generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(y, ref, rtol=0, atol=0)


@pytest.mark.parametrize("fn", [gumbel_softmax, gaussian_softmax])
def test_hard_forward_one_hot_and_soft_gradient(fn):
    logits = torch.randn(8, 6, dtype=torch.float64, requires_grad=True,
                         generator=torch.Generator().manual_seed(1))
    c = torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    hard = fn(logits, tau=0.5, hard=True, generator=torch.Generator().manual_seed(5))
    soft = fn(logits, tau=0.5, hard=False, generator=torch.Generator().manual_seed(5))
    assert bool(Simplex().check(hard).all())
    torch.testing.assert_close(hard, Simplex().argmax(soft))  # argmax of soft = argmax of u
    (g_hard,) = torch.autograd.grad((hard * c).sum(), logits)
    (g_soft,) = torch.autograd.grad((soft * c).sum(), logits)
    torch.testing.assert_close(g_hard, g_soft)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1e4, -1e4])
def test_stability_extreme_logits_and_small_tau(dtype, scale):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(4, 50, generator=gen, dtype=dtype) * scale).requires_grad_()
    c = torch.randn(4, 50, generator=gen, dtype=dtype)
    for fn in (lambda x: softmax(x, tau=1e-3), lambda x: sparsemax(x, tau=1e-3),
               lambda x: gumbel_softmax(x, tau=1e-3, generator=gen),
               lambda x: gaussian_softmax(x, tau=1e-3, generator=gen),
               lambda x: gumbel_softmax(x, tau=1e-3, hard=True, generator=gen)):
        y = fn(logits)
        (g,) = torch.autograd.grad((y * c).sum(), logits)
        assert bool(torch.isfinite(y).all()) and bool(torch.isfinite(g).all())
        torch.testing.assert_close(y.sum(-1), torch.ones(4, dtype=dtype))


@pytest.mark.parametrize("fn", [gumbel_softmax, gaussian_softmax])
def test_same_seed_same_sample(fn):
    x = torch.randn(4, 7)
    a = fn(x, generator=torch.Generator().manual_seed(11))
    b = fn(x, generator=torch.Generator().manual_seed(11))
    c = fn(x, generator=torch.Generator().manual_seed(12))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda x: gumbel_softmax(x, tau=0.0), "tau"),
    (lambda x: gumbel_softmax(x, tau=-1.0), "tau"),
    (lambda x: gaussian_softmax(x, scale=0.0), "scale"),
    (lambda x: gaussian_softmax(x, scale=-2.0), "scale"),
    (lambda x: gumbel_softmax(x, dim=2), "dim"),
    (lambda x: gaussian_softmax(x, dim=-3), "dim"),
    (lambda x: gumbel_softmax(x.long()), "logits"),
    (lambda x: gumbel_softmax(torch.where(x > 0, math.nan, x)), "logits"),
    (lambda x: gaussian_softmax(torch.where(x > 0, math.inf, x)), "logits"),
    (lambda x: gumbel_softmax(x, hard=1), "hard"),
    (lambda x: softmax(x, tau=0.0), "tau"),
    (lambda x: softmax(x.int()), "x"),
    (lambda x: sparsemax(x, dim=5), "dim"),
    (lambda x: sparsemax(torch.where(x > 0, math.nan, x)), "x"),
    (lambda x: sparsemax(x, tau=-0.1), "tau"),
    (lambda x: softmax(x, backward="implicit"), "backward"),
])
def test_bad_input(call, match):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=match):
        call(x)


def test_unsupported_backward_lists_supported():
    with pytest.raises(ValueError, match="analytic.*unroll.*finite_difference"):
        regularized_argmax(torch.randn(3), Simplex(), SquaredNorm(), backward="implicit")


# --------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------

_rows = st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=2, max_size=8)


@settings(max_examples=25, deadline=None)
@given(row=_rows, tau=st.floats(1e-3, 10.0), dtype=st.sampled_from(DTYPES))
def test_outputs_on_simplex(row, tau, dtype):
    w = torch.tensor(row, dtype=dtype)
    for y in (softmax(w, tau=tau), sparsemax(w, tau=tau),
              gumbel_softmax(w, tau=tau, generator=torch.Generator().manual_seed(0))):
        assert bool((y >= 0).all())
        torch.testing.assert_close(y.sum(), torch.tensor(1.0, dtype=dtype))


@settings(max_examples=25, deadline=None)
@given(row=st.lists(st.integers(-50, 50), min_size=2, max_size=8, unique=True))
def test_small_tau_approaches_argmax(row):
    w = torch.tensor(row, dtype=torch.float64) / 10  # distinct scores, gap >= 0.1
    one_hot = Simplex().argmax(w)
    # softmax: the error is <= (n - 1) exp(-gap/tau); sparsemax is exact once tau < gap
    torch.testing.assert_close(softmax(w, tau=1e-3), one_hot, atol=1e-12, rtol=0)
    torch.testing.assert_close(sparsemax(w, tau=0.05), one_hot, atol=0, rtol=0)


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 4), n=st.integers(2, 7), tau=st.floats(0.1, 5.0),
       seed=st.integers(0, 2**16))
def test_batching_equals_looping(batch, n, tau, seed):
    w = torch.randn(batch, 3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    for fn in (softmax, sparsemax):
        y = fn(w, tau=tau)
        for i in range(batch):
            for j in range(3):
                torch.testing.assert_close(y[i, j], fn(w[i, j], tau=tau))


@settings(max_examples=20, deadline=None)
@given(row=_rows, tau=st.floats(0.05, 5.0))
def test_float32_matches_float64(row, tau):
    w = torch.tensor(row, dtype=torch.float64)
    for fn in (softmax, sparsemax):
        torch.testing.assert_close(fn(w.float(), tau=tau), fn(w, tau=tau).float(),
                                   atol=2e-5, rtol=1e-4)


# --------------------------------------------------------------------------------------------
# masks and torch.func
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [
    lambda x: softmax(x), lambda x: sparsemax(x), lambda x: sparsemax(x, backward="unroll"),
    lambda x: gumbel_softmax(x, tau=0.3, generator=torch.Generator().manual_seed(0)),
    lambda x: gumbel_softmax(x, hard=True, generator=torch.Generator().manual_seed(0)),
    lambda x: gaussian_softmax(x, generator=torch.Generator().manual_seed(0)),
])
def test_neg_inf_masks_categories(fn):
    """-inf logits (masks, as in torch.softmax) get probability 0 and gradient 0, no NaN."""
    x = torch.tensor([[0.3, -math.inf, 1.0, 0.8], [1.0, 0.9, -math.inf, -math.inf]],
                     dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = fn(x)
    (g,) = torch.autograd.grad((y * c).sum(), x)
    mask = torch.isinf(x.detach())
    assert bool((y[mask] == 0).all()) and bool((g[mask] == 0).all())
    assert bool(torch.isfinite(y).all()) and bool(torch.isfinite(g).all())
    torch.testing.assert_close(y.sum(-1), torch.ones(2, dtype=torch.float64))


def test_sparsemax_unroll_matches_analytic_at_kink():
    """At a coordinate exactly on the threshold both modes treat it as outside the support."""
    z = torch.tensor([0.0, -5.0, 1.0, 2.0], dtype=torch.float64)  # z_3 - ν = 0 exactly
    jac_a = torch.autograd.functional.jacobian(lambda v: sparsemax(v), z)
    jac_u = torch.autograd.functional.jacobian(lambda v: sparsemax(v, backward="unroll"), z)
    torch.testing.assert_close(jac_a, jac_u)
    torch.testing.assert_close(jac_a, torch.zeros(4, 4, dtype=torch.float64))


@pytest.mark.parametrize("fn", [_softmax_analytic, _Sparsemax.apply])
def test_torch_func_transforms(fn, generator):
    z = torch.randn(3, 5, dtype=torch.float64, generator=generator)
    c = torch.arange(5, dtype=torch.float64)
    per_row = torch.func.vmap(torch.func.grad(lambda v: (fn(v) * c).sum()))(z)
    rows = [z[i].clone().requires_grad_() for i in range(3)]
    loop = torch.stack([torch.autograd.grad((fn(r) * c).sum(), r)[0] for r in rows])
    torch.testing.assert_close(per_row, loop)
    jac = torch.func.jacrev(fn)(z[0])
    torch.testing.assert_close(jac, torch.autograd.functional.jacobian(fn, z[0]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_matches_cpu():
    w = torch.randn(8, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    c = torch.randn(8, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for fn in (softmax, sparsemax):
        wc = w.cuda().requires_grad_()
        y = fn(wc, tau=0.5)
        (g,) = torch.autograd.grad((y * c.cuda()).sum(), wc)
        wcpu = w.clone().requires_grad_()
        (g_ref,) = torch.autograd.grad((fn(wcpu, tau=0.5) * c).sum(), wcpu)
        assert y.device.type == "cuda"
        torch.testing.assert_close(g.cpu(), g_ref)
    gen = torch.Generator(device="cuda").manual_seed(3)
    y = gumbel_softmax(w.cuda(), tau=0.5, hard=True, generator=gen)
    assert y.device.type == "cuda" and bool(Simplex().check(y).all())
    ref = relax(w.cuda(), Simplex(), Gumbel(), Entropy(), 0.5, hard=True,
                generator=torch.Generator(device="cuda").manual_seed(3))
    torch.testing.assert_close(y, ref, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# the fast path: dispatched ops, host reads, the compiled (fused) path and its fallback
# --------------------------------------------------------------------------------------------

def _ops_and_host_reads(fn, x, g):
    """(top-level aten ops, host synchronisations) of one forward + backward call on CPU."""
    def step():
        x.grad = None
        fn(x).backward(g)
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    events = prof.events()
    ops = sum(1 for e in events if e.name.startswith("aten::") and
              (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    syncs = sum(1 for e in events if e.name == "aten::_local_scalar_dense")
    return ops, syncs


def test_dispatched_ops_against_torch():
    """The CPU counts of bench/bench_categorical.py, as a regression guard.

    torch's F.gumbel_softmax dispatches 10 ops at τ = 0.5. Ours: the same 10 without
    validation (its exponential_ + log + neg become rand, clamp, −log U, log: torch's CPU
    exponential_ is a serial loop ~7× slower than rand, and the negation is folded into the
    subtraction), plus 3 for the value check (the max along the category dim, the sum of those
    maxima and one host read: NaN, +inf and a row that is all -inf in one pass), the only host
    sync.
    """
    import torch.nn.functional as F

    x = torch.randn(64, 100, requires_grad=True)
    g = torch.randn(64, 100)
    peer, peer_syncs = _ops_and_host_reads(lambda v: F.gumbel_softmax(v, tau=0.5), x, g)
    ours, syncs = _ops_and_host_reads(lambda v: gumbel_softmax(v, tau=0.5), x, g)
    assert (ours, syncs, peer_syncs) == (peer + 3, 1, 0)
    with set_validation(False):
        assert _ops_and_host_reads(lambda v: gumbel_softmax(v, tau=0.5), x, g) == (peer, 0)
    ours_tau1, _ = _ops_and_host_reads(lambda v: gumbel_softmax(v), x, g)  # the default τ = 1
    assert ours_tau1 == peer + 1          # no division by τ = 1: the check costs one op net
    hard, _ = _ops_and_host_reads(lambda v: gumbel_softmax(v, 0.5, hard=True), x, g)
    peer_hard, _ = _ops_and_host_reads(lambda v: F.gumbel_softmax(v, 0.5, hard=True), x, g)
    assert hard == peer_hard + 3
    # relax refuses -inf outright (Simplex scores are finite), so its check is one global max
    assert _ops_and_host_reads(lambda v: relax(v, tau=0.5), x, g) == (ours - 1, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_cuda_gumbel_noise_finite(dtype):
    """torch's CUDA exponential_ never returns 0 (so −log E < inf): checked on 10^7 draws."""
    e = Gumbel._exponential(torch.Size((10_000_000,)), torch.Generator("cuda").manual_seed(0),
                            torch.device("cuda"), dtype)
    assert bool((e > 0).all()) and bool(torch.isfinite(e).all())
    assert bool(torch.isfinite(Gumbel().sample((1000,), device="cuda", dtype=dtype)).all())


def test_gaussian_softmax_deprecated_sigma():
    x = torch.randn(3, 4)
    new = gaussian_softmax(x, 0.5, 2.0, generator=torch.Generator().manual_seed(0))
    with pytest.warns(FutureWarning, match="sigma= is deprecated"):
        old = gaussian_softmax(x, 0.5, sigma=2.0, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(old, new, rtol=0, atol=0)


@pytest.mark.parametrize("fn", [
    lambda z: sparsemax(z),
    lambda z: softmax(z, tau=0.7),
])
def test_forward_mode_matches_reverse_mode(fn):
    # jvp (forward mode) for torch.func.jacfwd and forward-mode AD: gradcheck checks the
    # forward-mode Jacobian against finite differences, and jacfwd must equal jacrev
    z = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert torch.autograd.gradcheck(fn, (z.clone().requires_grad_(),), check_forward_ad=True,
                                    check_backward_ad=True)
    fwd = torch.func.vmap(torch.func.jacfwd(fn))(z)
    rev = torch.func.vmap(torch.func.jacrev(fn))(z)
    torch.testing.assert_close(fwd, rev)
    assert float(fwd.abs().sum()) > 0  # a real Jacobian, not the zero of an unsupported mode


def test_gumbel_softmax_is_a_drop_in_for_torchs_including_eps():
    """Calls written for torch.nn.functional.gumbel_softmax run unchanged: ``eps=`` (deprecated
    in torch, without effect) is accepted and ignored, with torch's warning when it is not the
    default, also in torch's positional order (logits, tau, hard, eps, dim)."""
    import warnings

    import torch.nn.functional as F
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    calls = [(lambda f: f(logits, 0.5, True, 1e-10, -1), -1),
             (lambda f: f(logits, tau=0.5, eps=1e-10), -1),
             (lambda f: f(logits, 0.5, False, 1e-10, 0), 0),
             (lambda f: f(logits, 1.0, False, 1e-5), -1)]
    for call, dim in calls:
        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            y = call(gumbel_softmax)
        with warnings.catch_warnings(record=True) as theirs:
            warnings.simplefilter("always")
            ref = call(F.gumbel_softmax)
        assert y.shape == ref.shape
        for out in (y, ref):                                  # both normalised along dim
            torch.testing.assert_close(out.sum(dim), torch.ones(out.sum(dim).shape))
        assert len(ours) == len(theirs)                       # torch's warning, or none
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gumbel_softmax(logits, 0.5, eps=1e-10)                # the default: silent, as torch


def test_sparsemax_loss_against_its_threshold_form_and_gradients():
    """Martins & Astudillo's form −z_k + ½ Σ_{j∈S}(z_j² − ν²) + ½ (S the support, ν the
    threshold); the gradient p − e_k (float64 gradcheck); zero iff sparsemax(z) is the target;
    soft targets, ignore_index and reductions as torch's CrossEntropyLoss."""
    from perturb import sparsemax_loss
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 5, dtype=torch.float64, generator=g) * 2
    k = torch.tensor([0, 4, 2, 2, 1, 3])
    p = sparsemax(z)
    s = p > 0
    nu = ((z * s).sum(-1) - 1) / s.sum(-1)                    # Σ_S (z_j − ν) = 1
    want = -z.gather(-1, k[:, None])[:, 0] + 0.5 * ((z ** 2 - nu[:, None] ** 2) * s).sum(-1) + 0.5
    torch.testing.assert_close(sparsemax_loss(z, k, reduction="none"), want)
    x = z.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: sparsemax_loss(t, k, reduction="sum"), (x,))
    (grad,) = torch.autograd.grad(sparsemax_loss(x, k, reduction="sum"), x)
    torch.testing.assert_close(grad, p - torch.nn.functional.one_hot(k, 5).double())
    torch.testing.assert_close(sparsemax_loss(z, p, reduction="none"),
                               torch.zeros(6, dtype=torch.float64), atol=1e-12, rtol=0)
    assert bool((sparsemax_loss(z, torch.softmax(z, -1), reduction="none") >= 0).all())
    ignored = k.clone()
    ignored[:2] = -100
    torch.testing.assert_close(sparsemax_loss(z, ignored), want[2:].mean())
    torch.testing.assert_close(sparsemax_loss(z, k, reduction="sum"), want.sum())
    # categories along dim 0
    torch.testing.assert_close(sparsemax_loss(z.T, k, dim=0, reduction="none"), want)
