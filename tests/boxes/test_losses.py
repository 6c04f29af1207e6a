"""Tests of perturb/boxes/losses.py: containment/overlap losses, volume regularizer, negatives."""
import math

import pytest
import torch

from perturb.boxes import (EULER_GAMMA, Box, containment_loss, containment_prob, log1mexp,
                           log_containment_prob, overlap, overlap_loss, sample_negatives, volume,
                           volume_regularizer)

F64 = torch.float64


def _pairs():
    parent = Box(torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=F64),
                 torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], dtype=F64))
    child = Box(torch.tensor([[0.2, 0.2], [0.8, 0.5], [3.0, 3.0]], dtype=F64),
                torch.tensor([[0.6, 0.5], [1.6, 0.9], [4.0, 4.0]], dtype=F64))
    return parent, child


def test_log1mexp_against_direct_formula_and_extremes():
    x = torch.tensor([-1e-20, -1e-8, -0.1, -0.69, -0.7, -5.0, -50.0, -1000.0], dtype=F64)
    got = log1mexp(x)
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 60
    want = torch.tensor([float(mp.log(1 - mp.exp(mp.mpf(v)))) for v in x.tolist()], dtype=F64)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
    assert log1mexp(torch.tensor(0.0)).item() == -math.inf
    xr = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(log1mexp(xr).sum(), xr)
    torch.testing.assert_close(g, -1 / torch.expm1(-x))


def test_containment_loss_positive_and_negative_values():
    parent, child = _pairs()
    p = containment_prob(parent, child, beta=0.1)
    pos = containment_loss(parent, child, beta=0.1, reduction="none")
    # the third child is far away: p underflows, the loss is −log p from log space
    torch.testing.assert_close(pos, -log_containment_prob(parent, child, beta=0.1))
    torch.testing.assert_close(pos[:2], -p[:2].log())
    assert pos[2].item() > 1e4
    target = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    nll = containment_loss(parent, child, beta=0.1, target=target, reduction="none")
    torch.testing.assert_close(nll, torch.stack([-p[0].log(), -(1 - p[1]).log(),
                                                 -(1 - p[2]).log()]))
    mar = containment_loss(parent, child, beta=0.1, target=target, negatives="margin",
                           margin=0.1, reduction="none")
    torch.testing.assert_close(mar, torch.stack([-p[0].log(), (p[1] - 0.1).clamp(min=0),
                                                 (p[2] - 0.1).clamp(min=0)]))
    # soft labels: binary cross-entropy
    soft = containment_loss(parent, child, beta=0.1, target=0.3, reduction="none")
    torch.testing.assert_close(soft, -0.3 * log_containment_prob(parent, child, beta=0.1)
                               - 0.7 * (1 - p).log())
    assert containment_loss(parent, child, beta=0.1).item() == pytest.approx(pos.mean().item())
    assert containment_loss(parent, child, beta=0.1, reduction="sum").item() == \
        pytest.approx(pos.sum().item())


def test_negative_loss_stable_when_p_near_one_or_zero():
    parent = Box(torch.zeros(2, 2), torch.ones(2, 2))
    child = Box(torch.tensor([[0.4, 0.4], [50.0, 50.0]]), torch.tensor([[0.6, 0.6], [51.0, 51.0]]))
    lo, hi = child.lower.clone().requires_grad_(), child.upper.clone().requires_grad_()
    loss = containment_loss(parent, Box(lo, hi), beta=1e-3, target=torch.zeros(2),
                            reduction="none")
    # deeply nested negative: P rounds to 1 in float32, yet the loss is the true −log(1 − P):
    # −log P = Σ_i δ_i·L'(w_i) with δ_i = 2β·e^{−0.4/β} per side pair and, for this wide side
    # (w = 0.2 = 200β, small-z regime of K0), L'(w) = 1/(w − 2βγ); far negative: loss 0
    assert bool(torch.isfinite(loss).all())
    beta, w = 1e-3, 0.2
    expected = -(math.log(2 * 2 * beta) - 0.4 / beta - math.log(w - 2 * beta * EULER_GAMMA))
    assert loss[0].item() == pytest.approx(expected, rel=1e-6)
    assert loss[1].item() < 1e-6
    g_lo, g_hi = torch.autograd.grad(loss.sum(), (lo, hi))
    assert bool(torch.isfinite(g_lo).all() and torch.isfinite(g_hi).all())
    # the gradient pushes the nested negative child out: lower corner down, upper corner up
    assert bool((g_lo[0] > 0).all() and (g_hi[0] < 0).all())
    # hard boxes: a disjoint positive has P = 0 and loss inf; a nested negative with P = 1 is
    # clamped to the finite −log(eps)
    hard = containment_loss(parent, child, target=torch.tensor([0.0, 1.0]), reduction="none")
    assert math.isfinite(hard[0].item()) and hard[1].item() == math.inf


def test_overlap_loss_values():
    a = Box(torch.tensor([[0.0], [0.0]], dtype=F64), torch.tensor([[2.0], [1.0]], dtype=F64))
    b = Box(torch.tensor([[1.0], [5.0]], dtype=F64), torch.tensor([[3.0], [6.0]], dtype=F64))
    o = overlap(a, b, beta=0.1)
    got = overlap_loss(a, b, beta=0.1, target=torch.tensor([1.0, 0.0]), reduction="none")
    torch.testing.assert_close(got, torch.stack([-o[0].log(), -(1 - o[1]).log()]))


def test_volume_regularizer_values_and_gradient():
    lo = torch.zeros(3, 2, dtype=F64, requires_grad=True)
    hi = torch.tensor([[0.1, 0.1], [1.0, 0.5], [2.0, 1.0]], dtype=F64, requires_grad=True)
    box = Box(lo, hi)
    v = volume(box)
    reg = volume_regularizer(box, 0.3)
    torch.testing.assert_close(reg, v[1] + v[2])
    hinge = volume_regularizer(box, 0.3, mode="hinge", reduction="none")
    torch.testing.assert_close(hinge, (v - 0.3).clamp(min=0))
    (g,) = torch.autograd.grad(reg, hi)
    torch.testing.assert_close(g, torch.tensor([[0.0, 0.0], [0.5, 1.0], [1.0, 2.0]], dtype=F64))
    gum = volume_regularizer(box, 0.3, beta=0.1, reduction="none")
    vg = volume(box, beta=0.1)
    torch.testing.assert_close(gum, torch.where(vg > 0.3, vg, torch.zeros_like(vg)))
    with pytest.raises(ValueError, match="threshold"):
        volume_regularizer(box, -1.0)
    with pytest.raises(ValueError, match="mode"):
        volume_regularizer(box, 0.1, mode="square")


@pytest.mark.parametrize("kw,match", [
    ({"target": torch.tensor([2.0, 0.0, 1.0])}, "target"),
    ({"target": torch.tensor([1.0, 0.0])}, "broadcast"),
    ({"negatives": "hinge"}, "negatives"),
    ({"reduction": "max"}, "reduction"),
    ({"margin": -0.5, "negatives": "margin"}, "margin"),
    ({"beta": 0.0}, "beta"),
])
def test_loss_bad_arguments(kw, match):
    parent, child = _pairs()
    args = {"beta": 0.1, **kw}
    with pytest.raises(ValueError, match=match):
        containment_loss(parent, child, **args)


# ---------------------------------------------------------------------- negatives
def test_sample_negatives_shapes_and_reproducible():
    pairs = torch.tensor([[0, 1], [2, 3], [4, 5]])
    a = sample_negatives(pairs, 10, 4, generator=torch.Generator().manual_seed(0))
    b = sample_negatives(pairs, 10, 4, generator=torch.Generator().manual_seed(0))
    assert a.shape == (3, 4, 2) and a.dtype == torch.long
    assert torch.equal(a, b)
    # exactly one side differs from the positive pair or the draw repeated its entity
    same = (a == pairs.unsqueeze(1))
    assert bool(same.any(-1).all())
    nested = sample_negatives(pairs.reshape(3, 1, 2), 10, 2, generator=torch.Generator())
    assert nested.shape == (3, 1, 2, 2)


@pytest.mark.parametrize("corrupt,kept", [("head", 1), ("tail", 0)])
def test_sample_negatives_corrupts_one_side_uniformly(corrupt, kept):
    pairs = torch.tensor([[3, 7]]).expand(4000, 2)
    neg = sample_negatives(pairs, 8, 1, corrupt=corrupt,
                           generator=torch.Generator().manual_seed(1)).squeeze(1)
    assert bool((neg[:, kept] == pairs[:, kept]).all())
    counts = torch.bincount(neg[:, 1 - kept], minlength=8).double()
    expected = 4000 / 8
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 24.3   # chi-square, 7 dof, p = 0.001


def test_sample_negatives_both_sides_half_half():
    pairs = torch.tensor([[0, 1]]).expand(4000, 2)
    neg = sample_negatives(pairs, 1000, 1, generator=torch.Generator().manual_seed(2))[:, 0]
    head_changed = (neg[:, 0] != 0).double().mean().item()
    # P(head changed) = 0.5 · (1 − 1/1000); standard error ~ 0.0079
    assert abs(head_changed - 0.4995) < 5 * math.sqrt(0.25 / 4000)


def test_sample_negatives_filters_known_pairs():
    # only (0, 5) and (5, 1) are left as corruptions of (0, 1)
    known = torch.tensor([[0, j] for j in range(5)] + [[i, 1] for i in range(5)])
    pairs = torch.tensor([[0, 1]]).expand(200, 2)
    neg = sample_negatives(pairs, 6, 3, known=known, generator=torch.Generator().manual_seed(3))
    codes = set((neg[..., 0] * 6 + neg[..., 1]).flatten().tolist())
    assert codes == {0 * 6 + 5, 5 * 6 + 1}
    # impossible to filter: every pair is known
    full = torch.cartesian_prod(torch.arange(3), torch.arange(3))
    with pytest.raises(RuntimeError, match="known"):
        sample_negatives(torch.tensor([[0, 1]]), 3, 1, known=full, max_tries=5)


@pytest.mark.parametrize("args,kw,match", [
    ((torch.tensor([[0.0, 1.0]]), 5), {}, "integer"),
    ((torch.tensor([[0, 1, 2]]), 5), {}, "shape"),
    ((torch.tensor([[0, 5]]), 5), {}, "outside"),
    ((torch.tensor([[0, 1]]), 0), {}, "num_entities"),
    ((torch.tensor([[0, 1]]), 5, 0), {}, "n_negatives"),
    ((torch.tensor([[0, 1]]), 5), {"corrupt": "middle"}, "corrupt"),
    ((torch.tensor([[0, 1]]), 5), {"known": torch.tensor([0, 1])}, "known"),
])
def test_sample_negatives_bad_arguments(args, kw, match):
    with pytest.raises(ValueError, match=match):
        sample_negatives(*args, **kw)


# ---------------------------------------------------------------------- one sampler, two modes
from perturb.boxes.losses import PairSet  # noqa: E402


def test_pair_set_membership_and_errors():
    known = PairSet(torch.tensor([[1, 0], [2, 0], [1, 0]]), 4, include_self=True)
    assert len(known) == 6                                   # 2 distinct pairs + 4 self pairs
    q = torch.tensor([[1, 0], [0, 1], [3, 3], [2, 0], [3, 2]])
    assert known.contains(q).tolist() == [True, False, True, True, False]
    assert known.contains(q.view(5, 1, 2)).shape == (5, 1)
    assert PairSet(torch.zeros(0, 2, dtype=torch.long), 3).contains(q[:2]).tolist() == [False] * 2
    with pytest.raises(ValueError, match="outside"):
        PairSet(torch.tensor([[0, 4]]), 4)
    with pytest.raises(ValueError, match=r"\(m, 2\)"):
        PairSet(torch.tensor([0, 1]), 4)
    with pytest.raises(ValueError, match="num_entities"):
        sample_negatives(torch.tensor([[0, 1]]), 5, known=known)


def test_pair_set_hash_table_agrees_with_binary_search(generator, monkeypatch):
    import perturb.boxes.losses as losses
    n = 3000
    pairs = torch.randint(0, n, (20000, 2), generator=generator)
    pairs[:500, 1] = 7                                        # a popular tail: clustered codes
    known = PairSet(pairs, n, include_self=True)
    assert known._width > 0                                   # the table is in use
    q = torch.cat([pairs[::7], torch.randint(0, n, (20000, 2), generator=generator),
                   torch.arange(n).repeat(2, 1).T])
    want = torch.isin(q[:, 0] * n + q[:, 1], known.codes)
    assert want.sum() > 3000
    assert torch.equal(known.contains(q), want)
    assert torch.equal(known.to("cpu").contains(q.view(-1, 1, 2)), want.view(-1, 1))
    # the binary search (a set whose buckets are too wide) gives the same answers
    monkeypatch.setattr(losses, "_BUCKET_WIDTH_MAX", 0)
    search = PairSet(pairs, n, include_self=True)
    assert search._width == 0 and torch.equal(search.contains(q), want)
    single = PairSet(torch.tensor([[2, 1]]), 3)
    assert single.contains(torch.tensor([[2, 1], [1, 2], [0, 0]])).tolist() == [True, False,
                                                                                 False]


def _allowed(pair, n, known):
    """The corruptions of ``pair`` outside ``known``: the support of the filtered sampler."""
    c, p = pair
    cands = {(e, p) for e in range(n)} | {(c, e) for e in range(n)}
    return sorted(x for x in cands if x not in known)


@pytest.mark.parametrize("mode", ["adaptive", "fixed"])
def test_sampler_modes_uniform_over_allowed_corruptions(mode):
    """Rejection sampling with re-drawn sides: an accepted negative is uniform over the allowed
    corruptions (each corrupted pair arises from exactly one (side, entity) draw). Chi-square
    against that exact distribution, for both ways of running the rejection."""
    n = 7
    edges = [(1, 0), (2, 0), (3, 1), (4, 1), (5, 2), (6, 2), (3, 0), (4, 0), (5, 0), (6, 0)]
    known_t = torch.tensor(edges)
    known = PairSet(known_t, n, include_self=True)
    known_py = set(edges) | {(i, i) for i in range(n)}
    pos = torch.tensor([[3, 1]]).expand(6000, 2)
    neg = sample_negatives(pos, n, 1, known=known, mode=mode,
                           generator=torch.Generator().manual_seed(4))[:, 0]
    support = _allowed((3, 1), n, known_py)
    codes = (neg[:, 0] * n + neg[:, 1]).tolist()
    assert set(codes) <= {c * n + p for c, p in support}
    counts = torch.tensor([codes.count(c * n + p) for c, p in support], dtype=torch.float64)
    expected = 6000 / len(support)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    from scipy.stats import chi2 as chi2_dist
    assert len(support) == 8 and chi2 < chi2_dist.ppf(1 - 1e-4, len(support) - 1)


def test_sampler_tries_and_strictness():
    full = torch.cartesian_prod(torch.arange(3), torch.arange(3))
    for mode in ("adaptive", "fixed"):
        with pytest.raises(RuntimeError, match="known"):
            sample_negatives(torch.tensor([[0, 1]]), 3, 2, known=full, max_tries=5, mode=mode)
        out = sample_negatives(torch.tensor([[0, 1]]), 3, 2, known=full, max_tries=5,
                               mode=mode, strict=False)
        assert out.shape == (1, 2, 2)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="max_tries"):
            sample_negatives(torch.tensor([[0, 1]]), 3, max_tries=bad)
    with pytest.raises(ValueError, match="mode"):
        sample_negatives(torch.tensor([[0, 1]]), 3, mode="lazy")


def test_fixed_mode_reads_nothing_back():
    from perturb._validation import set_validation
    known = PairSet(torch.tensor([[0, 1], [2, 1]]), 50, include_self=True)
    pairs = torch.randint(50, (200, 2), generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    with set_validation(False):
        with torch.profiler.profile() as prof:
            sample_negatives(pairs, 50, 4, known=known, generator=gen, mode="fixed",
                             strict=False, max_tries=16)
    names = [e.name for e in prof.events()]
    assert "aten::_local_scalar_dense" not in names and "aten::nonzero" not in names
