"""perturb/distributions/kl.py: the registered KL divergences against enumeration (Gibbs
families, float64, 1e-10), torch's categorical KL, and Monte Carlo of the densities
(Gaussian-softmax, 5 standard errors); cross entropies; gradients."""
from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Categorical, OneHotCategorical, kl_divergence

from perturb import Gumbel, Logistic, Normal, Simplex
from perturb.distributions import (ArborescenceDistribution, KSubsetDistribution,
                                   PerturbedStructure, RelaxedPerturbedStructure,
                                   SpanningTreeDistribution)

F64 = torch.float64


def _s(*shape, seed=0):
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


FAMILIES = {
    "ksubset": (lambda t: KSubsetDistribution(t, 3), (6,)),
    "spanning": (lambda t: SpanningTreeDistribution(t), (4, 4)),
    "arborescence": (lambda t: ArborescenceDistribution(t, root=1), (4, 4)),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gibbs_kl_and_cross_entropy_against_enumeration(family):
    make, event = FAMILIES[family]
    p, q = make(2.0 * _s(3, *event, seed=1)), make(2.0 * _s(3, *event, seed=2))
    z = p.enumerate_support()
    lp, lq = p.log_prob(z), q.log_prob(z)
    want = (lp.exp() * (lp - lq)).sum(0)
    torch.testing.assert_close(kl_divergence(p, q), want, rtol=0, atol=1e-10)
    torch.testing.assert_close(p.cross_entropy(q), -(lp.exp() * lq).sum(0), rtol=0, atol=1e-10)
    torch.testing.assert_close(kl_divergence(p, p), torch.zeros(3, dtype=F64), rtol=0,
                               atol=1e-10)
    # broadcasting batch shapes, and float32 scores computed in float64
    q1 = make(_s(*event, seed=3))
    assert kl_divergence(p, q1).shape == (3,)
    p32, q32 = make(p.logits.float()), make(q.logits.float())
    out = kl_divergence(p32, q32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gibbs_kl_gradcheck(family):
    make, event = FAMILIES[family]
    a = _s(2, *event, seed=4).requires_grad_()
    b = _s(2, *event, seed=5).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, y: kl_divergence(make(x), make(y)), (a, b))


def test_gibbs_kl_is_infinite_where_q_masks_what_p_uses():
    logits = _s(6, seed=6)
    masked = logits.clone()
    masked[0] = -math.inf
    p, q = KSubsetDistribution(logits, 2), KSubsetDistribution(masked, 2)
    assert kl_divergence(p, q).item() == math.inf
    assert math.isfinite(kl_divergence(q, p).item())      # p covers every subset q uses


@pytest.mark.parametrize("noise", [Gumbel(0.7), Normal(0.9)])
def test_categorical_case(noise):
    """PerturbedStructure on the simplex is Categorical(argmax probabilities): its KL is the
    categorical one, also against torch's OneHotCategorical, both ways."""
    ta, tb = _s(3, 5, seed=7), _s(3, 5, seed=8)
    p, q = PerturbedStructure(ta, Simplex(), noise), PerturbedStructure(tb, Simplex(), noise)
    cp, cq = Categorical(probs=p.marginals), Categorical(probs=q.marginals)
    torch.testing.assert_close(kl_divergence(p, q), kl_divergence(cp, cq))
    oq = OneHotCategorical(probs=q.marginals)
    torch.testing.assert_close(kl_divergence(p, oq), kl_divergence(cp, cq))
    torch.testing.assert_close(kl_divergence(oq, p), kl_divergence(cq, cp))
    torch.testing.assert_close(p.cross_entropy(q), kl_divergence(cp, cq) + cp.entropy())
    if isinstance(noise, Gumbel):
        ref = kl_divergence(Categorical(logits=ta / 0.7), Categorical(logits=tb / 0.7))
        torch.testing.assert_close(kl_divergence(p, q), ref)


def _mc_kl(p, q, n=200_000, seed=9):
    x = p.sample((n,), generator=torch.Generator().manual_seed(seed))
    d = p.log_prob(x) - q.log_prob(x)
    return d.mean(0), d.std(0) / math.sqrt(n)


@pytest.mark.parametrize("sa,ta,sb,tb", [(1.0, 0.5, 1.0, 0.5), (0.8, 0.5, 1.1, 0.7),
                                         (0.5, 1.0, 0.5, 0.3)])
def test_gaussian_softmax_kl_equals_monte_carlo_of_its_densities(sa, ta, sb, tb):
    """The closed form (Gaussians in the d − 1 log-ratio coordinates) against the Monte-Carlo
    mean of log p − log q of the Gaussian-softmax densities, 5 standard errors."""
    la, lb = _s(3, 5, seed=10), _s(3, 5, seed=11)
    p = RelaxedPerturbedStructure(la, Simplex(), Normal(sa), tau=ta)
    q = RelaxedPerturbedStructure(lb, Simplex(), Normal(sb), tau=tb)
    k = kl_divergence(p, q)
    mean, se = _mc_kl(p, q)
    assert bool(((k - mean).abs() <= 5 * se).all()), (k, mean, se)
    if (sa, ta) == (sb, tb):            # ‖P(θ_a − θ_b)‖²/(2σ²), whatever τ
        diff = la - lb
        want = (diff - diff.mean(-1, keepdim=True)).pow(2).sum(-1) / (2 * sa ** 2)
        torch.testing.assert_close(k, want)


def test_gaussian_softmax_kl_per_problem_tau_and_gradients():
    la = _s(2, 4, seed=12).requires_grad_()
    lb = _s(2, 4, seed=13).requires_grad_()
    tau = torch.tensor([0.4, 0.9], dtype=F64, requires_grad=True)

    def f(a, b, t):
        return kl_divergence(RelaxedPerturbedStructure(a, Simplex(), Normal(0.7), tau=t),
                             RelaxedPerturbedStructure(b, Simplex(), Normal(0.5), tau=0.6))

    assert torch.autograd.gradcheck(f, (la, lb, tau))
    for i in range(2):                   # a tensor τ is one temperature per problem
        one = kl_divergence(
            RelaxedPerturbedStructure(la[i], Simplex(), Normal(0.7), tau=float(tau[i].detach())),
            RelaxedPerturbedStructure(lb[i], Simplex(), Normal(0.5), tau=0.6))
        torch.testing.assert_close(f(la, lb, tau)[i], one)


def test_relaxed_kl_without_closed_form_says_how_to_estimate_it():
    a = RelaxedPerturbedStructure(_s(4), Simplex(), tau=0.5)
    for q in (RelaxedPerturbedStructure(_s(4, seed=1), Simplex(), tau=0.5),
              RelaxedPerturbedStructure(_s(4, seed=1), Simplex(), Logistic(), tau=0.5)):
        with pytest.raises(NotImplementedError, match="Monte Carlo|integral"):
            kl_divergence(a, q)
