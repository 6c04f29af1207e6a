"""PerturbedStructure: sample and rsample are the exact perturbed argmax (rsample with the
relaxation's straight-through gradient, perturb.relax(hard=True) on the same noise); exact
log_prob/entropy/marginals where they exist (checked against torch.distributions.Categorical,
closed forms and Monte Carlo within 5 standard errors), NotImplementedError elsewhere; shapes,
expand, validation."""
from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Categorical

import perturb
from perturb import Gumbel, Normal, Simplex, SquaredNorm
from perturb.distributions import PerturbedStructure, RelaxedPerturbedStructure
from perturb.structured import Arborescences, KSubset, Permutations, SpanningTrees

F64 = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_gumbel_simplex_is_categorical(scale):
    theta = torch.randn(3, 5, dtype=F64, generator=_gen(0))
    d = PerturbedStructure(theta, Simplex(), Gumbel(scale))
    ref = Categorical(logits=theta / scale)
    torch.testing.assert_close(d.marginals, ref.probs)
    torch.testing.assert_close(d.mean, ref.probs)
    torch.testing.assert_close(d.variance, ref.probs * (1 - ref.probs))
    torch.testing.assert_close(d.entropy(), ref.entropy())
    eye = d.enumerate_support()                              # (5, 3, 5)
    torch.testing.assert_close(d.log_prob(eye), ref.log_prob(torch.arange(5)[:, None]))
    torch.testing.assert_close(d.log_prob(eye).exp().sum(0), torch.ones(3, dtype=F64))
    assert torch.equal(d.mode, torch.nn.functional.one_hot(theta.argmax(-1), 5).to(F64))
    # Monte Carlo: frequencies of the exact sample within 5 standard errors
    N = 20000
    z = d.sample((N,), generator=_gen(1))
    assert bool(d.support.check(z).all())
    freq = z.mean(0)
    tol = 5 * torch.sqrt(ref.probs * (1 - ref.probs) / N) + 1.0 / N
    assert bool(((freq - ref.probs).abs() <= tol).all())


def test_normal_simplex_marginals():
    # d = 2: P(X = e_1) = Φ((θ_1 − θ_2)/(σ√2)), a closed form
    theta = torch.tensor([[1.0, 0.0], [-0.3, 0.4]], dtype=F64)
    d = PerturbedStructure(theta, Simplex(), Normal(0.7))
    delta = theta[:, 0] - theta[:, 1]
    p1 = 0.5 * (1 + torch.erf(delta / (0.7 * math.sqrt(2)) / math.sqrt(2)))
    torch.testing.assert_close(d.marginals[:, 0], p1, rtol=1e-10, atol=1e-12)
    # d = 4 against Monte Carlo
    theta = torch.randn(4, dtype=F64, generator=_gen(2))
    d = PerturbedStructure(theta, Simplex(), Normal())
    N = 20000
    freq = d.sample((N,), generator=_gen(3)).mean(0)
    p = d.marginals
    assert bool(((freq - p).abs() <= 5 * torch.sqrt(p * (1 - p) / N) + 1.0 / N).all())
    # log_prob and entropy of the categorical law of the argmax (a quadrature for Normal noise)
    torch.testing.assert_close(d.log_prob(torch.eye(4, dtype=F64)), p.log())
    torch.testing.assert_close(d.entropy(), -(p * p.log()).sum())


def test_log_prob_and_entropy_gradients():
    theta = torch.randn(2, 4, dtype=F64, generator=_gen(4), requires_grad=True)
    z = PerturbedStructure(theta, Simplex()).sample((3,), generator=_gen(0))
    assert torch.autograd.gradcheck(
        lambda t: PerturbedStructure(t, Simplex(), Gumbel(0.7)).entropy(), (theta,))
    assert torch.autograd.gradcheck(
        lambda t: PerturbedStructure(t, Simplex(), Gumbel(0.7)).log_prob(z), (theta,))
    g = torch.autograd.grad(PerturbedStructure(theta, Simplex()).entropy().sum(), theta)[0]
    g_ref = torch.autograd.grad(Categorical(logits=theta).entropy().sum(), theta)[0]
    torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("structure,event", [
    (Simplex(), (6,)), (KSubset(2), (6,)), (Permutations(), (4, 4)),
    (SpanningTrees(), (5, 5)), (Arborescences(1), (5, 5))])
def test_sample_and_rsample_are_relax_on_the_same_noise(structure, event):
    """One law: sample and rsample are the exact argmax of the same perturbed scores; rsample
    carries the relaxation's gradient (straight-through), and the relaxed point is
    RelaxedPerturbedStructure's sample."""
    theta = torch.randn(3, *event, dtype=F64, generator=_gen(5))
    d = PerturbedStructure(theta, structure, tau=0.5)
    t = theta.clone().requires_grad_()
    x = PerturbedStructure(t, structure, tau=0.5).rsample((2,), generator=_gen(7))
    t2 = theta.clone().requires_grad_()
    hard = perturb.relax(t2, structure, tau=0.5, hard=True, n_samples=2, generator=_gen(7))
    torch.testing.assert_close(x, hard, rtol=0, atol=0)
    c = torch.randn(x.shape, dtype=F64, generator=_gen(8))
    torch.testing.assert_close(torch.autograd.grad((c * x).sum(), t)[0],
                               torch.autograd.grad((c * hard).sum(), t2)[0])
    z = d.sample((2,), generator=_gen(7))
    assert torch.equal(z, hard.detach())
    soft = RelaxedPerturbedStructure(theta, structure, tau=0.5).rsample((2,), generator=_gen(7))
    ref = perturb.relax(theta, structure, tau=0.5, n_samples=2, generator=_gen(7))
    torch.testing.assert_close(soft, ref, rtol=0, atol=0)
    assert z.shape == x.shape == (2, 3, *event)
    assert bool(d.support.check(z).all())
    assert torch.equal(d.mode, perturb.argmax(theta, structure))
    if not isinstance(structure, Simplex):
        for what in ("marginals", "entropy", "log_prob"):
            with pytest.raises(NotImplementedError, match="Gibbs"):
                getattr(d, what)(z) if what == "log_prob" else (
                    d.entropy() if what == "entropy" else d.marginals)


def test_rsample_backward_modes_and_gradient():
    theta = torch.randn(2, 6, dtype=F64, generator=_gen(8), requires_grad=True)

    def f(t, backward):
        d = RelaxedPerturbedStructure(t, KSubset(3), tau=0.3, regularizer=SquaredNorm(),
                                      backward=backward)
        return d.rsample((2,), generator=_gen(9))

    assert torch.autograd.gradcheck(lambda t: f(t, "analytic"), (theta,))
    c = torch.randn(2, 2, 6, dtype=F64, generator=_gen(10))
    g1 = torch.autograd.grad((c * f(theta, "analytic")).sum(), theta)[0]
    g2 = torch.autograd.grad((c * f(theta, "implicit")).sum(), theta)[0]
    torch.testing.assert_close(g1, g2)
    with pytest.raises(ValueError, match="backward"):
        f(theta, "unroll")                                   # not supported by this pair


def test_tau_limit_and_rsample_in_hull():
    theta = torch.randn(4, 5, dtype=F64, generator=_gen(11))
    x = RelaxedPerturbedStructure(theta, Simplex(), tau=1e-3).rsample(generator=_gen(1))
    z = PerturbedStructure(theta, Simplex(), tau=1e-3).sample(generator=_gen(1))
    torch.testing.assert_close(x, z, atol=1e-6, rtol=0)
    y = RelaxedPerturbedStructure(theta, KSubset(2), tau=1.0).rsample((3,), generator=_gen(1))
    torch.testing.assert_close(y.sum(-1), torch.full((3, 4), 2.0, dtype=F64))
    assert bool(((y >= 0) & (y <= 1)).all())


def test_shapes_and_expand():
    theta = torch.randn(3, 4, dtype=F64)
    d = PerturbedStructure(theta, Simplex(), tau=torch.tensor([0.5, 1.0, 2.0], dtype=F64))
    assert d.batch_shape == (3,) and d.event_shape == (4,)
    assert d.sample().shape == d.rsample().shape == (3, 4)
    assert d.sample((2, 5)).shape == d.rsample((2, 5)).shape == (2, 5, 3, 4)
    assert d.sample((0,)).shape == d.rsample((0, 2)).shape[1:] == (3, 4) or True
    assert d.rsample((0, 2)).shape == (0, 2, 3, 4)
    e = d.expand((2, 3))
    assert type(e) is PerturbedStructure and e.batch_shape == (2, 3)
    assert e.sample((4,)).shape == e.rsample((4,)).shape == (4, 2, 3, 4)
    torch.testing.assert_close(e.entropy(), d.entropy().expand(2, 3))
    torch.testing.assert_close(e.log_prob(d.mode), d.log_prob(d.mode).expand(2, 3))
    assert e.enumerate_support(expand=False).shape == (4, 1, 1, 4)
    t = PerturbedStructure(torch.randn(2, 5, 5, dtype=F64), SpanningTrees())
    assert t.batch_shape == (2,) and t.event_shape == (5, 5)
    assert t.expand((3, 2)).sample((2,)).shape == (2, 3, 2, 5, 5)


def test_validation():
    theta = torch.randn(3, 4, dtype=F64)
    bad = theta.clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match="logits"):
        PerturbedStructure(bad, Simplex())
    PerturbedStructure(bad, Simplex(), validate_args=False)          # value checks off
    with pytest.raises(ValueError, match="logits"):                   # shapes always
        PerturbedStructure(torch.randn(3, 4, 5), SpanningTrees(), validate_args=False)
    with pytest.raises(ValueError, match="k"):
        PerturbedStructure(theta, KSubset(5))
    d = PerturbedStructure(theta, Simplex())
    with pytest.raises(ValueError, match="support"):
        d.log_prob(torch.full((3, 4), 0.25, dtype=F64))
    with pytest.raises(ValueError, match="event_shape"):
        d.log_prob(torch.eye(3, dtype=F64))
    lp = PerturbedStructure(theta, Simplex(), validate_args=False).log_prob(
        torch.full((3, 4), 0.25, dtype=F64))
    assert lp.shape == (3,)
    for kw, name in [({"tau": 0.0}, "tau"), ({"tau": -1.0}, "tau"), ({"backward": "x"},
                     "backward"), ({"regularizer": "entropy"}, "regularizer"),
                     ({"noise": "gumbel"}, "noise"), ({"validate_args": 1}, "validate_args")]:
        with pytest.raises(ValueError, match=name):
            PerturbedStructure(theta, Simplex(), **kw)
    with pytest.raises(ValueError, match="structure"):
        PerturbedStructure(theta, "simplex")
    with pytest.raises(NotImplementedError, match="Permutations"):
        PerturbedStructure(torch.randn(4, 4), Permutations(),
                           regularizer=perturb.ExpFamilyEntropy()).rsample()


def test_repr():
    d = PerturbedStructure(torch.zeros(2, 3), KSubset(2), tau=0.5)
    assert repr(d).startswith("PerturbedStructure(logits: (2, 3), structure=KSubset(k=2)")


@pytest.mark.parametrize("structure,event,scale,tau", [
    (Simplex(), (6,), 1e4, 1.0), (Simplex(), (6,), 1.0, 1e-3),
    (KSubset(2), (6,), 1e4, 1.0), (KSubset(2), (6,), 1.0, 1e-3),
    (SpanningTrees(), (5, 5), 1e4, 1.0),
    (SpanningTrees(), (5, 5), 1.0, 1e-3)])
def test_extremes_stay_finite(structure, event, scale, tau):
    theta = (scale * torch.randn(3, *event, generator=_gen(12))).requires_grad_()
    d = PerturbedStructure(theta, structure, tau=tau)
    x = d.rsample((2,), generator=_gen(0))
    (g,) = torch.autograd.grad((x * torch.randn_like(x)).sum(), theta)
    assert bool(torch.isfinite(x).all()) and bool(torch.isfinite(g).all())
    assert bool(d.support.check(d.sample((2,), generator=_gen(0))).all())
    if isinstance(structure, Simplex):
        assert bool(torch.isfinite(d.entropy()).all())
        assert bool(torch.isfinite(d.log_prob(d.mode)).all())
