"""torch.distributions' contracts, checked on every distribution class of the package, the way
torch's own tests check theirs: sample/rsample shapes under sample_shape, batch_shape and
event_shape, expand, every sample in the support, log_prob normalised over enumerate_support,
entropy and mean against enumeration, and sample and rsample drawing from one law (a
two-sample test on the means, 5 standard errors)."""
from __future__ import annotations

import math

import pytest
import torch

from perturb import Gumbel, Normal, Simplex
from perturb.distributions import (ArborescenceDistribution, KSubsetDistribution,
                                   PerturbedStructure, RelaxedPerturbedStructure,
                                   SpanningTreeDistribution)
from perturb.structured import Arborescences, KSubset, Permutations, SpanningTrees

F64 = torch.float64


def _scores(*shape, seed=0):
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


# name -> (constructor from scores, event shape, exact log_prob/entropy/mean over the support)
CASES = {
    "perturbed simplex gumbel": (lambda t: PerturbedStructure(t, Simplex(), Gumbel(0.8)),
                                 (5,), True),
    "perturbed simplex normal": (lambda t: PerturbedStructure(t, Simplex(), Normal(0.8)),
                                 (5,), True),
    "perturbed ksubset": (lambda t: PerturbedStructure(t, KSubset(2), tau=0.5), (5,), False),
    "perturbed permutations": (lambda t: PerturbedStructure(t, Permutations(), tau=0.5),
                               (3, 3), False),
    "perturbed spanning trees": (lambda t: PerturbedStructure(t, SpanningTrees()), (4, 4),
                                 False),
    "perturbed arborescences": (lambda t: PerturbedStructure(t, Arborescences(1)), (4, 4),
                                False),
    "relaxed gumbel-softmax": (lambda t: RelaxedPerturbedStructure(t, Simplex(), tau=0.7),
                               (5,), False),
    "relaxed gaussian-softmax": (lambda t: RelaxedPerturbedStructure(
        t, Simplex(), Normal(0.6), tau=0.7), (5,), False),
    "relaxed ksubset": (lambda t: RelaxedPerturbedStructure(t, KSubset(2), tau=0.7), (5,),
                        False),
    "gibbs ksubset": (lambda t: KSubsetDistribution(t, 2), (5,), True),
    "gibbs spanning trees": (lambda t: SpanningTreeDistribution(t), (4, 4), True),
    "gibbs arborescences": (lambda t: ArborescenceDistribution(t, root=2), (4, 4), True),
}
NAMES = sorted(CASES)


def _make(name, batch=(3,), seed=0):
    make, event, _ = CASES[name]
    return make(_scores(*batch, *event, seed=seed))


def _draw(d, kind, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "rsample" and not d.has_rsample:
        pytest.skip("no rsample")
    return getattr(d, kind)(shape, generator=g)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["sample", "rsample"])
def test_shapes_and_support(name, kind):
    d = _make(name, batch=(2, 3))
    event = CASES[name][1]
    assert d.batch_shape == (2, 3) and d.event_shape == event
    for shape in ((), (4,), (2, 3)):
        x = _draw(d, kind, shape, seed=1)
        assert x.shape == torch.Size(shape) + d.batch_shape + d.event_shape
        assert x.dtype == F64
        assert bool(d.support.check(x).all()), (name, kind, shape)
    e = d.expand((5, 2, 3))
    x = _draw(e, kind, (4,), seed=2)
    assert x.shape == (4, 5, 2, 3, *event) and bool(e.support.check(x).all())
    assert e.batch_shape == (5, 2, 3)


@pytest.mark.parametrize("name", NAMES)
def test_has_enumerate_support_only_where_it_exists(name):
    d = _make(name)
    if not d.has_enumerate_support:
        with pytest.raises(NotImplementedError):
            d.enumerate_support()
        return
    z = d.enumerate_support()
    assert z.shape[1:] == d.batch_shape + d.event_shape
    assert bool(d.support.check(z).all())
    assert z.shape[0] == len({tuple(v.flatten().tolist()) for v in z[:, 0]})   # distinct


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n][2]])
def test_log_prob_entropy_and_mean_against_enumeration(name):
    d = _make(name)
    z = d.enumerate_support()
    lp = d.log_prob(z)                                            # (|Z|, *batch)
    torch.testing.assert_close(lp.exp().sum(0), torch.ones(d.batch_shape, dtype=F64))
    p = lp.exp()
    torch.testing.assert_close(d.entropy(), -(p * lp).sum(0))
    mean = (p.reshape(*p.shape, *([1] * len(d.event_shape))) * z).sum(0)
    torch.testing.assert_close(d.mean, mean)
    e = d.expand((4, 3))
    torch.testing.assert_close(e.log_prob(z[:, None].expand(-1, 4, *z.shape[1:])),
                               lp[:, None].expand(-1, 4, -1))


@pytest.mark.parametrize("name", NAMES)
def test_sample_and_rsample_follow_one_law(name):
    """The means of 4000 draws of sample() and of rsample(), from independent seeds, agree
    within 5 standard errors of their difference, coordinate by coordinate."""
    d = _make(name, batch=(2,))
    if not d.has_rsample:
        pytest.skip("no rsample")
    n = 4000
    a = _draw(d, "sample", (n,), seed=3).detach()
    b = _draw(d, "rsample", (n,), seed=4).detach()
    se = torch.sqrt(a.var(0) / n + b.var(0) / n)
    assert bool(((a.mean(0) - b.mean(0)).abs() <= 5 * se + 1e-12).all()), name


@pytest.mark.parametrize("name", NAMES)
def test_log_prob_validates_its_argument(name):
    """With validate_args (torch's switch), a value outside the support is a ValueError."""
    d = _make(name)
    d._validate_args = True
    try:
        d.log_prob(d.sample())
    except NotImplementedError:
        return
    bad = torch.full(d.batch_shape + d.event_shape, 0.37, dtype=F64)
    with pytest.raises(ValueError, match="support"):
        d.log_prob(bad)
