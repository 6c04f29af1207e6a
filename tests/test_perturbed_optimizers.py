"""Tests of perturb/perturbed.py: perturbed optimizers and the Fenchel-Young loss."""
import math

import networkx as nx
import numpy as np
import pytest
import torch

import perturb
from perturb import Gumbel, Logistic, Normal, Simplex
from perturb.perturbed_optimizers import (
    PerturbedOptimizer,
    _grad_nu,
    _perturbed_vjp,
    fenchel_young_loss,
    perturbed,
    perturbed_optimizer,
)


def _one_hot_argmax(u: torch.Tensor) -> torch.Tensor:
    return Simplex().argmax(u)


# --------------------------------------------------------------------------------------------
# a solver torch cannot differentiate: networkx path on a 3x3 grid DAG (edges right and down)
# --------------------------------------------------------------------------------------------

_GRID = nx.grid_2d_graph(3, 3)
_DAG = nx.DiGraph()
for (a, b) in _GRID.edges():
    _DAG.add_edge(min(a, b), max(a, b))  # orient right/down: acyclic
_EDGES = sorted(_DAG.edges())
_INDEX = {e: i for i, e in enumerate(_EDGES)}
_SOURCE, _TARGET = (0, 0), (2, 2)
_PATHS = torch.tensor([[1.0 if e in set(zip(p, p[1:])) else 0.0 for e in _EDGES]
                       for p in nx.all_simple_paths(_DAG, _SOURCE, _TARGET)], dtype=torch.float64)


def _nx_best_path(u: torch.Tensor) -> np.ndarray:
    """argmax over source-target paths of the summed edge scores u (one problem, numpy out).

    = shortest path with costs -u; Bellman-Ford since costs may be negative (the DAG has no
    cycles)."""
    scores = u.cpu().numpy()
    g = nx.DiGraph()
    for e, i in _INDEX.items():
        g.add_edge(*e, cost=-float(scores[i]))
    path = nx.bellman_ford_path(g, _SOURCE, _TARGET, weight="cost")
    y = np.zeros(len(_EDGES))
    for e in zip(path, path[1:]):
        y[_INDEX[e]] = 1.0
    return y


def _enum_best_path(u: torch.Tensor) -> torch.Tensor:
    """The same argmax, batched, by enumerating the 6 paths (independent of networkx' solver)."""
    paths = _PATHS.to(u.dtype)
    return paths[(u @ paths.T).argmax(-1)]


def test_grid_setup():
    assert len(_EDGES) == 12 and _PATHS.shape == (6, 12)  # C(4, 2) monotone paths
    assert bool((_PATHS.sum(-1) == 4).all())


def test_networkx_black_box_equals_enumeration():
    theta = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(0),
                        requires_grad=True)
    c = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y_nx = perturbed(_nx_best_path, theta, noise=Normal(0.5), n_samples=50, batched=False,
                     generator=torch.Generator().manual_seed(2))
    y_en = perturbed(_enum_best_path, theta, noise=Normal(0.5), n_samples=50,
                     generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(y_nx, y_en, rtol=0, atol=0)
    (g_nx,) = torch.autograd.grad((y_nx * c).sum(), theta)
    (g_en,) = torch.autograd.grad((y_en * c).sum(), theta)
    torch.testing.assert_close(g_nx, g_en)


def test_path_gradient_matches_finite_difference_of_expectation():
    """⟨v, ∇_θ⟨c, y_σ(θ)⟩⟩ by the perturbed estimator vs a central difference of the expectation
    with common random numbers; both Monte Carlo, tolerance 5 joint standard errors."""
    gen = torch.Generator().manual_seed(3)
    theta = torch.randn(12, dtype=torch.float64, generator=gen) * 0.5
    c = torch.randn(12, dtype=torch.float64, generator=gen)
    v = torch.randn(12, dtype=torch.float64, generator=gen)
    sigma, m = 0.7, 200_000

    th = theta.clone().requires_grad_()
    y = perturbed(_enum_best_path, th, noise=Normal(sigma), n_samples=m,
                  generator=torch.Generator().manual_seed(4))
    (grad,) = torch.autograd.grad((y * c).sum(), th)
    estimate = float(grad @ v)
    # per-sample terms of the same estimator (same noise), for its standard error
    z = Normal().sample((m, 12), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    a = _enum_best_path(theta + sigma * z) @ c
    terms = (a - a.mean()) * (z @ v) / sigma
    torch.testing.assert_close(estimate, float(terms.mean()), rtol=1e-3, atol=1e-4)
    se_pert = float(terms.std() / math.sqrt(m))

    h = 0.05
    z2 = Normal().sample((m, 12), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    diff = (_enum_best_path(theta + h * v + sigma * z2)
            - _enum_best_path(theta - h * v + sigma * z2)) @ c / (2 * h)
    fd, se_fd = float(diff.mean()), float(diff.std() / math.sqrt(m))
    assert se_pert < 0.05 and se_fd < 0.1  # the test has power
    assert abs(estimate - fd) <= 5 * math.hypot(se_pert, se_fd), (estimate, fd, se_pert, se_fd)


def test_fenchel_young_learning_with_networkx():
    """Fit edge scores so that the (perturbed) best path is a target path: FY loss decreases."""
    y_true = _PATHS[2]
    theta = torch.zeros(12, dtype=torch.float64, requires_grad=True)
    layer = PerturbedOptimizer(_nx_best_path, noise=Normal(0.5), n_samples=8, batched=False,
                               generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD([theta], lr=0.5)
    losses = []
    for _ in range(30):
        loss = layer.fenchel_young_loss(theta, y_true)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(v >= 0 for v in losses)
    assert np.mean(losses[-5:]) < 0.2 * np.mean(losses[:5])
    torch.testing.assert_close(layer.argmax(theta), y_true)


def test_fenchel_young_gradient_is_mean_minus_target():
    theta = torch.randn(3, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1),
                        requires_grad=True)
    y_true = _PATHS[[0, 3, 5]]
    loss = fenchel_young_loss(_enum_best_path, theta, y_true, noise=Normal(0.3), n_samples=64,
                              generator=torch.Generator().manual_seed(9), reduction="sum")
    (grad,) = torch.autograd.grad(loss, theta)
    y_mean = perturbed(_enum_best_path, theta.detach(), noise=Normal(0.3), n_samples=64,
                       generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(grad, y_mean - y_true)
    per = fenchel_young_loss(_enum_best_path, theta, y_true, noise=Normal(0.3), n_samples=64,
                             generator=torch.Generator().manual_seed(9), reduction="none")
    assert per.shape == (3,) and bool((per >= 0).all())
    torch.testing.assert_close(per.sum(), loss)
    # zero loss when y_true wins by a margin no noise sample overcomes
    strong = 100.0 * (2 * y_true - 1)
    zero = fenchel_young_loss(_enum_best_path, strong, y_true, noise=Normal(0.3), n_samples=16,
                              reduction="none")
    torch.testing.assert_close(zero, torch.zeros(3, dtype=torch.float64))


# --------------------------------------------------------------------------------------------
# the simplex: E[argmax(θ + σG)] = softmax(θ/σ) exactly for Gumbel noise
# --------------------------------------------------------------------------------------------

def test_simplex_gumbel_value_and_jacobian_match_softmax():
    theta = torch.tensor([0.5, -0.3, 0.2, 1.0], dtype=torch.float64)
    c = torch.tensor([1.0, -2.0, 0.5, 0.3], dtype=torch.float64)
    sigma, m = 0.8, 100_000
    th = theta.clone().requires_grad_()
    y = perturbed(_one_hot_argmax, th, noise=Gumbel(sigma), n_samples=m,
                  generator=torch.Generator().manual_seed(0))
    p = torch.softmax(theta / sigma, -1)
    se = (p * (1 - p) / m).sqrt()
    assert bool(((y.detach() - p).abs() <= 5 * se).all())
    (grad,) = torch.autograd.grad((y * c).sum(), th)
    exact = (torch.diag(p) - torch.outer(p, p)) @ c / sigma  # symmetric Jacobian of softmax(θ/σ)
    # per-sample terms of the same estimator for the standard error
    z = Gumbel().sample((m, 4), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = _one_hot_argmax(theta + sigma * z) @ c
    terms = (a - a.mean()).unsqueeze(-1) * (1 - torch.exp(-z)) / sigma
    torch.testing.assert_close(grad, terms.mean(0), rtol=1e-3, atol=1e-4)
    se_g = terms.std(0) / math.sqrt(m)
    assert bool(((grad - exact).abs() <= 5 * se_g).all()), (grad, exact, se_g)


def test_baseline_does_not_bias_and_reduces_variance():
    theta = torch.tensor([0.2, 0.0, -0.4], dtype=torch.float64)
    c = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)  # large common offset: baseline helps
    sigma = 1.0
    p = torch.softmax(theta / sigma, -1)
    exact = (torch.diag(p) - torch.outer(p, p)) @ c / sigma
    est = {}
    for baseline in (True, False):
        gs = []
        for seed in range(40):
            th = theta.clone().requires_grad_()
            y = perturbed(_one_hot_argmax, th, Gumbel(sigma), n_samples=500,
                          generator=torch.Generator().manual_seed(seed), baseline=baseline)
            gs.append(torch.autograd.grad((y * c).sum(), th)[0])
        est[baseline] = torch.stack(gs)
    for baseline, g in est.items():
        se = g.std(0) / math.sqrt(len(g))
        assert bool(((g.mean(0) - exact).abs() <= 5 * se).all()), baseline
    assert float(est[True].var(0).sum()) < 0.5 * float(est[False].var(0).sum())


# --------------------------------------------------------------------------------------------
# pieces
# --------------------------------------------------------------------------------------------

def test_grad_nu_closed_forms():
    z = torch.linspace(-3, 3, 13, dtype=torch.float64)
    torch.testing.assert_close(_grad_nu(Normal(), z), z)
    torch.testing.assert_close(_grad_nu(Normal(2.0), z), z / 4)
    torch.testing.assert_close(_grad_nu(Gumbel(), z), 1 - torch.exp(-z))
    torch.testing.assert_close(_grad_nu(Logistic(), z), torch.tanh(z / 2))


def test_vjp_helper_matches_formula():
    gen = torch.Generator().manual_seed(0)
    ys = torch.randn(5, 2, 3, dtype=torch.float64, generator=gen)
    dnu = torch.randn(5, 2, 3, dtype=torch.float64, generator=gen)
    g = torch.randn(2, 3, dtype=torch.float64, generator=gen)
    a = (ys * g).sum(-1)  # (5, 2)
    plain = (a.unsqueeze(-1) * dnu).mean(0) / 0.5
    torch.testing.assert_close(_perturbed_vjp(ys, dnu, g, 0.5, 1, False), plain)
    loo = a - (a.sum(0) - a) / 4
    torch.testing.assert_close(_perturbed_vjp(ys, dnu, g, 0.5, 1, True),
                               (loo.unsqueeze(-1) * dnu).mean(0) / 0.5)


def test_batched_equals_looped_and_numpy_outputs():
    theta = torch.randn(2, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0),
                        requires_grad=True)

    def one(u):  # one problem, numpy out
        return np.eye(5)[int(u.argmax())]

    ys = []
    for fn, batched in ((_one_hot_argmax, True), (one, False)):
        y = perturbed(fn, theta, Normal(0.5), n_samples=7, batched=batched,
                      generator=torch.Generator().manual_seed(1))
        g = torch.autograd.grad(y.pow(2).sum(), theta)[0]
        ys.append((y, g))
    torch.testing.assert_close(ys[0][0], ys[1][0])
    torch.testing.assert_close(ys[0][1], ys[1][1])
    assert ys[0][0].shape == (2, 3, 5)


def test_event_dim_two():
    """Matrices as problems: argmax over 2x2 permutation matrices (a 2-way choice)."""
    perms = torch.stack([torch.eye(2), torch.eye(2).flip(0)]).double()

    def best_perm(u):
        return perms[(u.unsqueeze(-3) * perms).sum((-1, -2)).argmax(-1)]

    theta = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64, requires_grad=True)
    m = 20_000
    y = perturbed(best_perm, theta, Gumbel(), n_samples=m, event_dim=2,
                  generator=torch.Generator().manual_seed(0))
    assert y.shape == (1, 2, 2)
    torch.testing.assert_close(y.sum(-1), torch.ones(1, 2, dtype=torch.float64))
    # identity wins iff 2 + (G11 − G12) + (G22 − G21) > 0, a sum of two standard logistics:
    # P = ∫ f(l) F(2 + l) dl with the logistic density f and CDF F (quadrature reference)
    grid = torch.linspace(-40, 40, 200_001, dtype=torch.float64)
    p_id = float(torch.trapezoid(torch.sigmoid(grid) * torch.sigmoid(-grid)
                                 * torch.sigmoid(2 + grid), grid))
    assert abs(float(y[0, 0, 0].detach()) - p_id) <= 5 * math.sqrt(p_id * (1 - p_id) / m)
    (g,) = torch.autograd.grad(y[0, 0, 0], theta)
    assert float(g[0, 0, 0]) > 0 and float(g[0, 0, 1]) < 0


def test_module_and_decorator():
    @perturbed_optimizer(noise=Normal(0.5), n_samples=10)
    def layer(u):
        return Simplex().argmax(u)

    assert isinstance(layer, PerturbedOptimizer) and repr(Normal(0.5)) in repr(layer)
    plain = PerturbedOptimizer(_one_hot_argmax)
    assert isinstance(plain.noise, Gumbel) and plain.noise.scale == 1.0  # as relax's default
    theta = torch.randn(4, 6)
    layer.generator = torch.Generator().manual_seed(0)
    a = layer(theta)
    layer.generator = torch.Generator().manual_seed(0)
    torch.testing.assert_close(a, layer(theta), rtol=0, atol=0)
    torch.testing.assert_close(layer.argmax(theta), Simplex().argmax(theta))
    # no gradient requested: plain Monte-Carlo mean, no graph
    assert not a.requires_grad


def test_float32_and_no_grad_path():
    theta = torch.randn(3, 4, requires_grad=True)
    y = perturbed(_one_hot_argmax, theta, n_samples=5, generator=torch.Generator().manual_seed(0))
    assert y.dtype == torch.float32 and y.requires_grad
    y.sum().backward()
    assert theta.grad is not None and bool(torch.isfinite(theta.grad).all())


@pytest.mark.parametrize("call,match", [
    (lambda t: perturbed(_one_hot_argmax, t, Normal(0.0)), "scale"),
    (lambda t: perturbed(_one_hot_argmax, t, n_samples=0), "n_samples"),
    (lambda t: perturbed(_one_hot_argmax, torch.full_like(t, math.nan)), "theta"),
    (lambda t: perturbed(_one_hot_argmax, t.long()), "theta"),
    (lambda t: perturbed(lambda u: u.sum(), t), "leading dims"),
    (lambda t: perturbed(lambda u: u.sum(0), t), "leading dims"),
    (lambda t: fenchel_young_loss(_one_hot_argmax, t, torch.zeros(3, 2)), "y_true"),
    (lambda t: fenchel_young_loss(_one_hot_argmax, t, torch.zeros(4), reduction="avg"),
     "reduction"),
    (lambda t: fenchel_young_loss(lambda u: u[..., :2], t, torch.zeros(4)), "theta's space"),
    (lambda t: PerturbedOptimizer(3), "argmax_fn"),
])
def test_bad_input(call, match):
    theta = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(ValueError, match=match):
        call(theta)


def test_noise_without_usable_density_rejected():
    from perturb import Discrete, Uniform
    theta = torch.randn(3, 4, requires_grad=True)
    for noise in (Uniform(), Discrete(torch.tensor([-1.0, 1.0]), torch.tensor([0.5, 0.5]))):
        with pytest.raises(ValueError, match="density"):
            perturbed(_one_hot_argmax, theta, noise=noise, n_samples=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_black_box_with_numpy_output():
    theta = torch.randn(12, dtype=torch.float64, device="cuda", requires_grad=True)
    y = perturbed(_nx_best_path, theta, noise=Normal(0.5), n_samples=10, batched=False,
                  generator=torch.Generator(device="cuda").manual_seed(0))
    assert y.device.type == "cuda"
    y.sum().backward()
    assert theta.grad.device.type == "cuda" and bool(torch.isfinite(theta.grad).all())


def test_a_structure_is_an_argmax_fn():
    """perturbed / fenchel_young_loss / PerturbedOptimizer take a Structure: its exact argmax
    and its event dims, the same numbers as the equivalent callable."""
    from perturb.structured import KSubset, Permutations, topk

    theta = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    kw = dict(noise=Normal(0.5), n_samples=50)
    a = perturb.perturbed(KSubset(2), theta, generator=torch.Generator().manual_seed(0), **kw)
    b = perturb.perturbed(lambda u: topk(u, 2), theta, generator=torch.Generator().manual_seed(0),
                          **kw)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a.sum(-1), torch.full((4,), 2.0, dtype=torch.float64))
    y = topk(torch.randn(4, 6, dtype=torch.float64), 2)
    loss = perturb.fenchel_young_loss(KSubset(2), theta, y, **kw)
    (g,) = torch.autograd.grad(loss, theta)
    assert torch.isfinite(g).all()
    # a structure with two event dims: event_dim comes from the structure
    w = torch.randn(3, 4, 4, dtype=torch.float64)
    p = perturb.PerturbedOptimizer(Permutations(), noise=Normal(0.5), n_samples=20)(w)
    torch.testing.assert_close(p.sum(-1), torch.ones(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="Structure or a callable"):
        perturb.perturbed("topk", theta)


@pytest.mark.parametrize("fn", ["perturbed", "fenchel_young_loss", "PerturbedOptimizer"])
def test_deprecated_sigma_keeps_its_old_meaning(fn):
    # sigma multiplied the noise's samples and the default noise was Normal(): the old calls
    # give the same numbers as the new spelling noise=Normal(scale=sigma), with a FutureWarning
    theta = torch.randn(3, 5)
    y_true = _one_hot_argmax(torch.randn(3, 5))

    def call(**kw):
        g = torch.Generator().manual_seed(0)
        if fn == "perturbed":
            return perturbed(_one_hot_argmax, theta, n_samples=20, generator=g, **kw)
        if fn == "fenchel_young_loss":
            return fenchel_young_loss(_one_hot_argmax, theta, y_true, n_samples=20, generator=g,
                                      **kw)
        return PerturbedOptimizer(_one_hot_argmax, n_samples=20, generator=g, **kw)(theta)

    new = call(noise=Normal(0.5))
    with pytest.warns(FutureWarning, match="sigma= is deprecated"):
        old = call(sigma=0.5)
    torch.testing.assert_close(old, new, rtol=0, atol=0)
    with pytest.warns(FutureWarning):  # Gumbel(2) scaled by 0.5 is Gumbel(1)
        torch.testing.assert_close(call(sigma=0.5, noise=Gumbel(2.0)), call(noise=Gumbel(1.0)))
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="sigma"):
        call(sigma=0.0)


def test_old_positional_sigma_still_works():
    theta = torch.randn(2, 4)
    with pytest.warns(FutureWarning):
        old = perturbed(_one_hot_argmax, theta, 0.5, n_samples=10,
                        generator=torch.Generator().manual_seed(1))
    new = perturbed(_one_hot_argmax, theta, Normal(0.5), n_samples=10,
                    generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(old, new, rtol=0, atol=0)


def test_structure_with_two_event_dims_gets_its_own_event_dim():
    # a Structure brings event_dim = 2: the VJP must sum over both event dims, not one
    from perturb.structured import Permutations
    w = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 4, 4, dtype=torch.float64)
    def kw():
        return dict(n_samples=64, generator=torch.Generator().manual_seed(0))
    (perturbed(Permutations(), w, Normal(0.5), **kw()) * g).sum().backward()
    grad_structure = w.grad.clone()
    w.grad = None
    (perturbed(Permutations().argmax, w, Normal(0.5), event_dim=2, **kw()) * g).sum().backward()
    torch.testing.assert_close(grad_structure, w.grad)


# --------------------------------------------------------------------------------------------
# scalar-valued functions (jaxopt's make_perturbed_fun smooths any f: θ ↦ y, y a scalar too)
# --------------------------------------------------------------------------------------------

def _max_value(u: torch.Tensor) -> torch.Tensor:
    """max_i u_i: a scalar per problem, shape (*batch)."""
    return u.amax(-1)


@pytest.mark.parametrize("baseline", [True, False])
def test_scalar_output_expected_max_value_and_gradient(baseline):
    """E[max_i(θ_i + σG_i)] = σ·logsumexp(θ/σ) + σγ, whose gradient is softmax(θ/σ)."""
    theta = torch.tensor([[0.5, -0.3, 0.2, 1.0], [0.0, 0.0, -1.0, 2.0]], dtype=torch.float64)
    sigma, m = 0.7, 40_000
    th = theta.clone().requires_grad_()
    gen = torch.Generator().manual_seed(3)
    y = perturbed(_max_value, th, Gumbel(sigma), n_samples=m, generator=gen, baseline=baseline)
    assert y.shape == (2,)
    exact = sigma * torch.logsumexp(theta / sigma, -1) + sigma * 0.5772156649015329
    # Var max(θ + σG) = σ²π²/6 (max-stability: a Gumbel of scale σ)
    se = sigma * math.pi / math.sqrt(6 * m)
    assert bool(((y.detach() - exact).abs() <= 5 * se).all()), (y, exact)
    (g,) = torch.autograd.grad(y.sum(), th)
    z = Gumbel().sample((m, *theta.shape), generator=torch.Generator().manual_seed(3),
                        dtype=torch.float64)
    a = _max_value(theta + sigma * z)                         # (M, 2)
    if baseline:
        a = a - (a.sum(0) - a) / (m - 1)
    terms = a.unsqueeze(-1) * (1 - torch.exp(-z)) / sigma      # per-sample estimator terms
    torch.testing.assert_close(g, terms.mean(0))              # the estimator, term by term
    se_g = terms.std(0) / math.sqrt(m)
    p = torch.softmax(theta / sigma, -1)
    assert bool(((g - p).abs() <= 5 * se_g).all()), (g, p, se_g)


def test_scalar_output_baseline_reduces_variance():
    theta = torch.tensor([0.2, 0.0, -0.4], dtype=torch.float64)
    grads = {}
    for baseline in (True, False):
        gs = []
        for seed in range(30):
            th = theta.clone().requires_grad_()
            y = perturbed(lambda u: u.amax(-1) + 10.0, th, Normal(1.0), n_samples=200,
                          generator=torch.Generator().manual_seed(seed), baseline=baseline)
            gs.append(torch.autograd.grad(y, th)[0])
        grads[baseline] = torch.stack(gs)
    assert float(grads[True].var(0).sum()) < 0.2 * float(grads[False].var(0).sum())


@pytest.mark.parametrize("batched", [True, False])
def test_scalar_problems_event_dim_zero(batched):
    """f = sign on scalars (event_dim=0): E[sign(t + σZ)] = erf(t/(σ√2)), derivative
    2φ(t/σ)/σ; with batched=False the solver returns a Python float per problem."""
    t = torch.tensor([-1.0, -0.2, 0.0, 0.4, 1.5], dtype=torch.float64, requires_grad=True)
    sigma, m = 0.8, 40_000
    fn = torch.sign if batched else (lambda u: float(torch.sign(u)))
    y = perturbed(fn, t, Normal(sigma), n_samples=m, event_dim=0, batched=batched,
                  generator=torch.Generator().manual_seed(0))
    assert y.shape == t.shape
    exact = torch.erf(t.detach() / (sigma * math.sqrt(2)))
    se = ((1 - exact ** 2) / m).sqrt()
    assert bool(((y.detach() - exact).abs() <= 5 * se + 1e-12).all())
    (g,) = torch.autograd.grad(y.sum(), t)
    dens = 2 * torch.exp(-0.5 * (t.detach() / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    assert bool(((g - dens).abs() <= 0.05).all()), (g, dens)


def test_fenchel_young_loss_on_scalar_problems():
    """event_dim=0, y(θ) = sign θ = argmax_{y ∈ {±1}} yθ: ∇L = E[sign(θ + σZ)] − y."""
    t = torch.tensor([-1.0, 0.3, 2.0], dtype=torch.float64, requires_grad=True)
    y_true = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    sigma, m = 1.0, 40_000
    loss = fenchel_young_loss(torch.sign, t, y_true, Normal(sigma), n_samples=m, event_dim=0,
                              reduction="sum", generator=torch.Generator().manual_seed(0))
    assert float(loss.detach()) >= 0
    (g,) = torch.autograd.grad(loss, t)
    exact = torch.erf(t.detach() / (sigma * math.sqrt(2))) - y_true
    assert bool(((g - exact).abs() <= 5 * math.sqrt(1 / m)).all()), (g, exact)
    per = fenchel_young_loss(torch.sign, t, y_true, Normal(sigma), n_samples=10, event_dim=0,
                             reduction="none", generator=torch.Generator().manual_seed(0))
    assert per.shape == t.shape


def test_vjp_helper_with_scalar_outputs():
    """No output dims: ⟨g, y_s⟩ is the product per problem, not a sum over the batch."""
    gen = torch.Generator().manual_seed(0)
    ys = torch.randn(5, 2, dtype=torch.float64, generator=gen)        # (M, batch)
    dnu = torch.randn(5, 2, 3, dtype=torch.float64, generator=gen)
    g = torch.randn(2, dtype=torch.float64, generator=gen)
    plain = ((ys * g).unsqueeze(-1) * dnu).mean(0) / 0.5
    torch.testing.assert_close(_perturbed_vjp(ys, dnu, g, 0.5, 1, False), plain)


def test_solver_returning_nan_or_a_noise_ignoring_the_shape_is_refused():
    theta = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(ValueError, match="argmax_fn returned NaN"):
        perturbed(lambda u: torch.full_like(u, math.nan), theta)
    with pytest.raises(ValueError, match="argmax_fn returned NaN"):
        perturbed(lambda u: torch.full(u.shape[:-1], math.inf), theta)

    class OneShape(perturb.noise.Noise):
        def sample(self, shape, *, generator=None, device=None, dtype=None):
            return torch.randn(4, dtype=dtype)       # ignores the requested shape

    with pytest.raises(ValueError, match="requested shape"):
        perturbed(_one_hot_argmax, theta, OneShape(), n_samples=3)
    with pytest.raises(ValueError, match="Gumbel\\(\\)"):
        perturbed(_one_hot_argmax, theta, Gumbel)
    with perturb.set_validation(False):   # the value check is a validation check
        y = perturbed(lambda u: torch.full_like(u, math.nan), theta.detach())
    assert bool(torch.isnan(y).all())


def test_module_state_dict_holds_the_hyper_parameters(tmp_path):
    layer = PerturbedOptimizer(_one_hot_argmax, Normal(0.3), n_samples=17, baseline=False)
    torch.save(layer.state_dict(), tmp_path / "p.pt")
    other = PerturbedOptimizer(_one_hot_argmax, Normal(2.0), n_samples=5)
    other.load_state_dict(torch.load(tmp_path / "p.pt", weights_only=True))
    assert (other.n_samples, other.baseline, other.noise) == (17, False, Normal(0.3))
    theta = torch.randn(3, 4)
    layer.generator = torch.Generator().manual_seed(0)
    other.generator = torch.Generator().manual_seed(0)
    torch.testing.assert_close(other(theta), layer(theta))
    fresh = PerturbedOptimizer(_one_hot_argmax)
    fresh.load_state_dict({})                     # an old, empty state_dict still loads
    assert fresh.n_samples == 100
