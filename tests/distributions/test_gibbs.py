"""GibbsDistribution over every family against brute-force enumeration for small n.

The oracle enumerates Z with ``structure.enumerate`` and scores each structure by the family's
definition written out here (k-subsets: ⟨θ, z⟩; spanning trees: Σ_{i<j} s_ij T_ij with
s = (w + wᵀ)/2; arborescences: Σ w_ij T_ij), then takes logsumexp / softmax / expectations.
Monte-Carlo tests compare sample frequencies with the enumerated probabilities within 5
standard errors per structure (N samples: |f̂ − p| ≤ 5 √(p(1 − p)/N) + 1/N).
"""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from perturb.distributions import (
    ArborescenceDistribution,
    GibbsDistribution,
    KSubsetDistribution,
    SpanningTreeDistribution,
)

F64 = torch.float64
BATCH = (2, 3)


def _ksubset(theta):
    return KSubsetDistribution(theta, 2)


def _root1(theta):
    return ArborescenceDistribution(theta, root=1)


#: family -> (constructor, event shape, oracle score(theta, Z) -> (|Z|, *batch))
def _score_ksubset(theta, Z):
    return (Z.reshape(Z.shape[0], *[1] * (theta.ndim - 1), -1) * theta).sum(-1)


def _score_spanning(theta, Z):
    s = 0.5 * (theta + theta.transpose(-1, -2))
    U = torch.triu(Z, diagonal=1).reshape(Z.shape[0], *[1] * (theta.ndim - 2), *Z.shape[1:])
    return (U * s).sum((-1, -2))


def _score_arborescence(theta, Z):
    return (Z.reshape(Z.shape[0], *[1] * (theta.ndim - 2), *Z.shape[1:]) * theta).sum((-1, -2))


FAMILIES = {
    "ksubset": (_ksubset, (5,), _score_ksubset),
    "spanning": (SpanningTreeDistribution, (4, 4), _score_spanning),
    "arborescence": (_root1, (4, 4), _score_arborescence),
}


def _theta(family, batch=BATCH, seed=0, scale=1.0):
    _, event, _ = FAMILIES[family]
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*batch, *event, generator=g, dtype=F64)


def _brute(family, theta):
    """(Z, log p over Z (|Z|, *batch), log Z (*batch)) by enumeration."""
    make, event, score = FAMILIES[family]
    Z = make(theta).structure.enumerate(event[-1], dtype=F64)
    s = score(theta, Z)
    logz = torch.logsumexp(s, 0)
    return Z, s - logz, logz


def _index_of(samples, Z, event_dim):
    """Index in Z of each sample, ``(*sample)``; -1 if none matches."""
    eq = samples.unsqueeze(-event_dim - 1) == Z
    match = eq.flatten(-event_dim).all(-1)
    idx = match.to(torch.int64).argmax(-1)
    return torch.where(match.any(-1), idx, torch.full_like(idx, -1))


@pytest.mark.parametrize("family", FAMILIES)
def test_partition_log_prob_entropy_marginals_mode_match_enumeration(family):
    theta = _theta(family)
    d = FAMILIES[family][0](theta)
    Z, logp, logz = _brute(family, theta)
    ed = d.structure.event_dim
    p = logp.exp()
    torch.testing.assert_close(d.partition, logz, rtol=1e-10, atol=1e-10)
    # log_prob over the whole support: equal to the enumeration, summing to 1
    support = d.enumerate_support()
    assert support.shape == (Z.shape[0], *BATCH, *d.event_shape)
    torch.testing.assert_close(d.log_prob(support), logp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(d.log_prob(support).exp().sum(0), torch.ones(BATCH, dtype=F64))
    torch.testing.assert_close(d.entropy(), -(p * logp).sum(0), rtol=1e-10, atol=1e-10)
    shape = (Z.shape[0], *[1] * len(BATCH), *Z.shape[1:])
    torch.testing.assert_close(d.marginals, (p.reshape(*p.shape, *[1] * ed) *
                                             Z.reshape(shape)).sum(0), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(d.mean, d.marginals)
    torch.testing.assert_close(d.variance, d.marginals * (1 - d.marginals))
    best = Z[logp.argmax(0)]
    assert torch.equal(d.mode, best)
    assert torch.equal(d.argmax, best)
    assert bool(d.support.check(d.mode).all())


@pytest.mark.parametrize("family", FAMILIES)
def test_sample_frequencies_match_enumeration(family):
    theta = _theta(family, batch=(2,), seed=1)
    d = FAMILIES[family][0](theta)
    Z, logp, _ = _brute(family, theta)
    N = 20000
    z = d.sample((N,), generator=torch.Generator().manual_seed(5))
    assert z.shape == (N, 2, *d.event_shape) and z.dtype == F64
    assert bool(d.support.check(z).all())
    idx = _index_of(z, Z, d.structure.event_dim)                         # (N, 2)
    assert bool((idx >= 0).all())
    freq = torch.stack([torch.bincount(idx[:, b], minlength=Z.shape[0]) for b in range(2)],
                       -1).to(F64) / N                                  # (|Z|, 2)
    p = logp.exp()
    tol = 5 * torch.sqrt(p * (1 - p) / N) + 1.0 / N
    assert bool(((freq - p).abs() <= tol).all()), (freq - p).abs().max()


@pytest.mark.parametrize("family", FAMILIES)
def test_entropy_and_log_prob_gradients(family):
    theta = _theta(family, batch=(2,), seed=2).requires_grad_()
    make = FAMILIES[family][0]
    d = make(theta)
    z = d.sample((3,), generator=torch.Generator().manual_seed(0))
    assert torch.autograd.gradcheck(lambda t: make(t).entropy(), (theta,))
    assert torch.autograd.gradcheck(lambda t: make(t).log_prob(z), (theta,))
    assert torch.autograd.gradcheck(lambda t: make(t).partition, (theta,))
    # values, not shapes: the gradient of the entropy equals that of the enumerated entropy
    g = torch.autograd.grad(make(theta).entropy().sum(), theta)[0]
    _, logp, _ = _brute(family, theta)
    g_ref = torch.autograd.grad(-(logp.exp() * logp).sum(), theta)[0]
    torch.testing.assert_close(g, g_ref, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_shapes_batch_and_expand(family):
    make = FAMILIES[family][0]
    theta = _theta(family, batch=(3,))
    d = make(theta)
    assert d.batch_shape == (3,) and d.event_shape == FAMILIES[family][1]
    assert d.sample().shape == (3, *d.event_shape)
    assert d.sample((2, 4)).shape == (2, 4, 3, *d.event_shape)
    assert d.sample((0,)).shape == (0, 3, *d.event_shape)
    assert d.partition.shape == d.entropy().shape == (3,)
    _ = d.marginals                                      # cached: expand carries it as a view
    e = d.expand((2, 3))
    assert type(e) is type(d) and e.batch_shape == (2, 3) and e.event_shape == d.event_shape
    assert e._validate_args == d._validate_args
    torch.testing.assert_close(e.partition, d.partition.expand(2, 3))
    torch.testing.assert_close(e.entropy(), d.entropy().expand(2, 3))
    torch.testing.assert_close(e.marginals, d.marginals.expand(2, 3, *d.event_shape))
    z = d.sample((5,), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(e.log_prob(z[:, None]), d.log_prob(z)[:, None].expand(5, 2, 3))
    assert e.sample((4,)).shape == (4, 2, 3, *d.event_shape)
    assert e.enumerate_support(expand=False).shape[1:] == (1, 1, *d.event_shape)
    # an unbatched distribution
    u = make(theta[0])
    assert u.batch_shape == () and u.sample((7,)).shape == (7, *d.event_shape)
    assert u.log_prob(u.mode).shape == ()


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_equals_looped(family):
    make = FAMILIES[family][0]
    theta = _theta(family, batch=(3,), seed=3)
    d = make(theta)
    for b in range(3):
        db = make(theta[b])
        torch.testing.assert_close(d.partition[b], db.partition)
        torch.testing.assert_close(d.marginals[b], db.marginals)
        assert torch.equal(d.mode[b], db.mode)


@pytest.mark.parametrize("family", FAMILIES)
def test_same_generator_same_samples(family):
    d = FAMILIES[family][0](_theta(family, batch=(2,)))
    a = d.sample((6,), generator=torch.Generator().manual_seed(3))
    b = d.sample((6,), generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


@pytest.mark.parametrize("family", FAMILIES)
def test_validate_args(family):
    make = FAMILIES[family][0]
    theta = _theta(family, batch=(2,))
    name = "logits"
    bad = theta.clone()
    bad.view(-1)[1] = math.nan
    with pytest.raises(ValueError, match=name):
        make(bad)
    d = make(theta)
    outside = torch.ones_like(d.mode)                        # not a structure
    with pytest.raises(ValueError, match="support"):
        d.log_prob(outside)
    with pytest.raises(ValueError, match="event_shape|broadcastable"):
        d.log_prob(d.mode[..., :2] if family == "ksubset" else d.mode[..., :3, :3])
    # validate_args=False: no support check (the score formula is simply evaluated)
    kw = {"validate_args": False}
    if family == "ksubset":
        e = KSubsetDistribution(theta, 2, **kw)
    elif family == "spanning":
        e = SpanningTreeDistribution(theta, **kw)
    else:
        e = ArborescenceDistribution(theta, root=1, **kw)
    assert not e._validate_args
    assert e.log_prob(outside).shape == (2,)
    with pytest.raises(ValueError, match="validate_args"):
        type(d)(*([theta, 2] if family == "ksubset" else [theta]), validate_args="yes")


@pytest.mark.parametrize("family", FAMILIES)
def test_no_rsample(family):
    d = FAMILIES[family][0](_theta(family, batch=(2,)))
    assert not d.has_rsample and d.has_enumerate_support
    with pytest.raises(NotImplementedError, match="PerturbedStructure"):
        d.rsample()


def test_base_class_hooks_are_abstract():
    from perturb.structured import KSubset
    d = GibbsDistribution(torch.zeros(4, dtype=F64), KSubset(2), validate_args=False)
    with pytest.raises(NotImplementedError):
        d.partition
    with pytest.raises(NotImplementedError):
        d.sample()


def test_bad_sample_shape():
    d = KSubsetDistribution(torch.zeros(4, dtype=F64), 2)
    with pytest.raises(ValueError, match="sample_shape"):
        d.sample((-1,))
    with pytest.raises(ValueError, match="sample_shape"):
        d.sample("3")


def test_repr():
    assert repr(KSubsetDistribution(torch.zeros(2, 4), 3)) == \
        "KSubsetDistribution(logits: (2, 4), k=3)"
    assert repr(ArborescenceDistribution(torch.zeros(4, 4), root=2)) == \
        "ArborescenceDistribution(logits: (4, 4), root=2)"


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_filled_without_grad_does_not_break_gradients(family):
    make = FAMILIES[family][0]
    theta = _theta(family, batch=(2,), seed=4).requires_grad_()
    d = make(theta)
    with torch.no_grad():
        _ = d.partition, d.marginals                      # cached as constants
    z = d.sample(generator=torch.Generator().manual_seed(0))
    g = torch.autograd.grad((d.entropy() + d.log_prob(z)).sum(), theta)[0]
    fresh = make(theta)
    g_ref = torch.autograd.grad((fresh.entropy() + fresh.log_prob(z)).sum(), theta)[0]
    torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_in_float32_out(family):
    theta = _theta(family, batch=(2,)).float()
    d = FAMILIES[family][0](theta)
    z = d.sample((3,))
    for t in (d.partition, d.marginals, d.entropy(), d.log_prob(z), d.mode, z):
        assert t.dtype == torch.float32
    _, logp, _ = _brute(family, theta.double())
    torch.testing.assert_close(d.entropy().double(), -(logp.exp() * logp).sum(0),
                               rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 6), st.data(), st.floats(0.01, 30.0), st.integers(0, 2**31 - 1))
def test_ksubset_property_normalised_entropy_bounds(n, data, scale, seed):
    k = data.draw(st.integers(1, n))
    theta = scale * torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    d = KSubsetDistribution(theta, k)
    lp = d.log_prob(d.enumerate_support())
    torch.testing.assert_close(torch.logsumexp(lp, 0), torch.tensor(0.0, dtype=F64),
                               atol=1e-9, rtol=0)
    h = d.entropy()
    assert -1e-9 <= float(h) <= math.log(math.comb(n, k)) + 1e-9
    torch.testing.assert_close(h, -(lp.exp() * lp.clamp_min(-1e300)).sum(), atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(d.marginals.sum(), torch.tensor(float(k), dtype=F64))


@settings(max_examples=15, deadline=None)
@given(st.integers(3, 5), st.booleans(), st.floats(0.01, 30.0), st.integers(0, 2**31 - 1))
def test_tree_property_normalised_entropy_bounds(n, directed, scale, seed):
    w = scale * torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    d = ArborescenceDistribution(w, root=n - 1) if directed else SpanningTreeDistribution(w)
    lp = d.log_prob(d.enumerate_support())
    torch.testing.assert_close(torch.logsumexp(lp, 0), torch.tensor(0.0, dtype=F64),
                               atol=1e-9, rtol=0)
    h = d.entropy()
    assert -1e-8 <= float(h) <= (n - 2) * math.log(n) + 1e-8
    torch.testing.assert_close(h, -(lp.exp() * lp).sum(), atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_topk_is_the_k_most_probable_structures(family):
    """topk(k) against enumeration: distinct members of the support, best first, and their
    log-probabilities the k largest (pytorch-struct's topk); batched; masked entries never
    used; past |Z| the last structure repeats."""
    d = FAMILIES[family][0](_theta(family, batch=(3,)))
    z = d.enumerate_support()
    lp = d.log_prob(z)
    k = min(8, z.shape[0])
    top = d.topk(k)
    assert top.shape == (k, 3, *d.event_shape)
    assert bool(d.support.check(top).all())
    got = d.log_prob(top)
    torch.testing.assert_close(got, lp.sort(0, descending=True).values[:k])
    for b in range(3):
        assert len({tuple(t.flatten().tolist()) for t in top[:, b]}) == k
    more = d.topk(z.shape[0] + 2)
    assert torch.equal(more[-1], more[z.shape[0] - 1])
