"""perturb/structured/trees/structures.py: the exact tree solvers against networkx and
enumeration, membership checks, and SpanningTrees / Arborescences through the core (registry,
relax, straight-through)."""
import math

import networkx as nx
import pytest
import torch

import perturb
from perturb import ExpFamilyEntropy, Gumbel, Normal
from perturb.structured.trees.matrix_tree import arborescence_marginals, spanning_tree_marginals
from perturb.structured.trees.structures import (
    Arborescences,
    SpanningTrees,
    _chu_liu_edmonds,
    enumerate_arborescences,
    enumerate_spanning_trees,
    is_arborescence,
    is_spanning_tree,
    max_arborescence,
    max_spanning_tree,
)

D = torch.float64


@pytest.mark.parametrize("n", [2, 3, 7, 15, 40])
def test_max_spanning_tree_vs_networkx(n, generator):
    w = torch.randn(4, n, n, dtype=D, generator=generator)
    T = max_spanning_tree(w)
    assert is_spanning_tree(T).all()
    s = 0.5 * (w + w.mT)
    for b in range(4):
        G = nx.Graph()
        G.add_weighted_edges_from((i, j, s[b, i, j].item()) for i in range(n)
                                  for j in range(i + 1, n))
        ref = nx.maximum_spanning_tree(G)
        A = torch.zeros(n, n, dtype=D)
        for i, j in ref.edges():
            A[i, j] = A[j, i] = 1
        torch.testing.assert_close(T[b], A)  # continuous scores: the maximum is unique


@pytest.mark.parametrize("n", [2, 3, 6, 12, 30])
def test_max_arborescence_vs_networkx(n, generator):
    w = torch.randn(4, n, n, dtype=D, generator=generator)
    root = n // 3
    T = max_arborescence(w, root=root)
    assert is_arborescence(T, root).all()
    for b in range(4):
        G = nx.DiGraph()
        G.add_weighted_edges_from((i, j, w[b, i, j].item()) for i in range(n)
                                  for j in range(n) if i != j and j != root)
        ref = nx.maximum_spanning_arborescence(G)
        A = torch.zeros(n, n, dtype=D)
        for i, j in ref.edges():
            A[i, j] = 1
        torch.testing.assert_close(T[b], A)


@pytest.mark.parametrize("n", [3, 4, 5])
def test_max_trees_vs_enumeration_with_cycles(n, generator):
    # heavy 2-cycles make the greedy parents cyclic: exercises contraction and expansion
    w = torch.randn(6, n, n, dtype=D, generator=generator)
    w = w + 5 * (torch.rand(6, n, n, dtype=D, generator=generator) > 0.6)
    for root in range(n):
        trees = enumerate_arborescences(n, root, dtype=D)
        best = (trees * w.unsqueeze(-3)).sum((-1, -2)).max(-1).values
        T = max_arborescence(w, root=root)
        torch.testing.assert_close((T * w).sum((-1, -2)), best)
    trees = enumerate_spanning_trees(n, dtype=D)
    s = 0.5 * (w + w.mT)
    best = (trees * s.unsqueeze(-3)).sum((-1, -2)).max(-1).values
    torch.testing.assert_close((max_spanning_tree(w) * s).sum((-1, -2)), best)


def test_masks_lengths_and_errors(generator):
    n = 6
    w = torch.randn(2, n, n, dtype=D, generator=generator)
    lengths = torch.tensor([4, 6])
    T = max_spanning_tree(w, lengths=lengths)
    torch.testing.assert_close(T[0, :4, :4], max_spanning_tree(w[0, :4, :4]))
    assert T[0, 4:].sum() == 0 and T[0, :, 4:].sum() == 0
    A = max_arborescence(w, root=2, lengths=lengths)
    torch.testing.assert_close(A[0, :4, :4], max_arborescence(w[0, :4, :4], root=2))
    mask = torch.rand(n, n, generator=generator) > 0.3
    mask = mask | mask.T
    idx = torch.arange(n - 1)
    mask[idx, idx + 1] = mask[idx + 1, idx] = True  # keep it connected
    T = max_spanning_tree(w, mask=mask)
    assert (T[:, ~mask] == 0).all()
    A = max_arborescence(w, mask=mask)
    assert (A[:, ~mask] == 0).all() and is_arborescence(A, 0).all()
    with pytest.raises(ValueError, match="root"):
        max_arborescence(w, root=6)
    with pytest.raises(ValueError, match="n >= 2"):
        max_spanning_tree(torch.zeros(1, 1))


def test_chu_liu_edmonds_nested_cycles():
    # 1 <-> 2 and 3 <-> 4 heavy cycles, then the contracted nodes form a cycle themselves
    import numpy as np
    S = np.full((5, 5), -np.inf)
    S[0, 1] = S[0, 3] = 0.0
    S[1, 2] = S[2, 1] = S[3, 4] = S[4, 3] = 10.0
    S[2, 3] = S[4, 1] = 5.0
    parent = _chu_liu_edmonds(S, 0)
    total = sum(S[parent[j], j] for j in range(1, 5))
    G = nx.DiGraph()
    G.add_weighted_edges_from((i, j, S[i, j]) for i in range(5) for j in range(5)
                              if math.isfinite(S[i, j]))
    ref = nx.maximum_spanning_arborescence(G)
    assert total == pytest.approx(sum(d["weight"] for *_, d in ref.edges(data=True)))


def test_enumeration_counts_and_membership():
    for n in range(2, 7):
        trees = enumerate_spanning_trees(n)
        assert trees.shape == (n ** (n - 2), n, n) and is_spanning_tree(trees).all()
        assert len({tuple(t.flatten().tolist()) for t in trees}) == len(trees)
    for n in range(2, 6):
        arbs = enumerate_arborescences(n, root=n - 1)
        assert arbs.shape == (n ** (n - 2), n, n) and is_arborescence(arbs, n - 1).all()
    with pytest.raises(ValueError, match="enumeration"):
        enumerate_spanning_trees(9)
    y = enumerate_spanning_trees(4)[0].clone()
    y[0, 0] = 1
    assert not is_spanning_tree(y)
    cyc = torch.zeros(4, 4)
    cyc[0, 1] = cyc[2, 3] = cyc[3, 2] = 1  # 0→1 plus a 2-cycle: right column sums, unreachable
    assert not is_arborescence(cyc, 0)


# --------------------------------------------------------------------------------------------
# the structures through the core
# --------------------------------------------------------------------------------------------

def test_structure_contract():
    assert repr(Arborescences(root=2)) == "Arborescences(root=2)"
    assert repr(SpanningTrees()) == "SpanningTrees()"
    assert Arborescences(1) == Arborescences(root=1) and Arborescences(1) != Arborescences(2)
    for structure in (SpanningTrees(), Arborescences(root=1)):
        assert structure.event_dim == 2
        assert isinstance(structure.default_regularizer(), ExpFamilyEntropy)
        verts = structure.enumerate(5, dtype=D)
        assert verts.shape == (125, 5, 5) and structure.check(verts).all()
        assert not structure.check(torch.zeros(5, 5)).any()
    pairs = {(p.structure, p.regularizer): p for p in perturb.registered_pairs()}
    for name in ("SpanningTrees", "Arborescences"):
        assert pairs[(name, "ExpFamilyEntropy")].backward == (
            "analytic", "unroll", "finite_difference")
    with pytest.raises(NotImplementedError, match="SpanningTrees"):
        perturb.regularized_argmax(torch.zeros(4, 4), SpanningTrees(), perturb.Entropy())
    with pytest.raises(ValueError, match="root"):
        perturb.argmax(torch.zeros(3, 3), Arborescences(root=5))


def test_argmax_and_regularized_argmax(generator):
    w = torch.randn(3, 6, 6, dtype=D, generator=generator)
    torch.testing.assert_close(perturb.argmax(w, SpanningTrees()), max_spanning_tree(w))
    torch.testing.assert_close(perturb.argmax(w, Arborescences(2)), max_arborescence(w, 2))
    torch.testing.assert_close(perturb.regularized_argmax(w, SpanningTrees(), tau=0.5),
                               spanning_tree_marginals(w, tau=0.5))
    torch.testing.assert_close(perturb.regularized_argmax(w, Arborescences(2), tau=2.0),
                               arborescence_marginals(w, root=2, tau=2.0))


@pytest.mark.parametrize("noise", [Gumbel(), Normal()])
def test_relax_and_straight_through(noise, generator):
    theta = torch.randn(4, 6, 6, dtype=D, generator=generator, requires_grad=True)
    for structure in (SpanningTrees(), Arborescences(root=0)):
        g1 = torch.Generator().manual_seed(7)
        soft = perturb.relax(theta, structure, noise, tau=0.5, n_samples=3, generator=g1)
        assert soft.shape == (3, 4, 6, 6)
        u = perturb.perturb(theta, noise, n_samples=3, generator=torch.Generator().manual_seed(7))
        torch.testing.assert_close(
            soft, perturb.regularized_argmax(u, structure, tau=0.5))
        hard = perturb.relax(theta, structure, noise, tau=0.5, hard=True, n_samples=3,
                             generator=torch.Generator().manual_seed(7))
        assert structure.check(hard.detach()).all()
        torch.testing.assert_close(hard.detach(), structure.argmax(u.detach()))
        c = torch.randn(6, 6, dtype=D, generator=generator)
        gh = torch.autograd.grad((hard * c).sum(), theta)[0]
        gs = torch.autograd.grad((soft * c).sum(), theta)[0]
        torch.testing.assert_close(gh, gs)  # straight-through: the relaxed gradient
        assert gs.abs().sum() > 0


def test_float32_through_core(generator):
    theta = torch.randn(2, 8, 8, generator=generator, requires_grad=True)
    x = perturb.relax(theta, Arborescences(root=3), tau=0.3, generator=generator)
    assert x.dtype == torch.float32
    torch.testing.assert_close(x.sum((-1, -2)), torch.full((2,), 7.0))
    x.sum().backward()
    assert torch.isfinite(theta.grad).all()


@pytest.mark.parametrize("structure", [SpanningTrees(), Arborescences(root=1)])
def test_registered_solvers_validate_once(structure, monkeypatch, generator):
    """The registered solvers call the engine: the scores are checked once (by the core
    through ``structure.validate``), not again by the public marginal functions; the result
    is the public function's."""
    import perturb
    from perturb import _validation
    calls = []
    original = _validation.check_finite
    monkeypatch.setattr(_validation, "check_finite",
                        lambda *a, **k: (calls.append(a[1] if len(a) > 1 else ""),
                                         original(*a, **k))[1])
    w = torch.randn(3, 6, 6, dtype=torch.float64, generator=generator)
    mu = perturb.regularized_argmax(w, structure, tau=0.5)
    assert len(calls) == 1
    ref = (arborescence_marginals(w, root=1, tau=0.5) if isinstance(structure, Arborescences)
           else spanning_tree_marginals(w, tau=0.5))
    torch.testing.assert_close(mu, ref, rtol=0, atol=0)
