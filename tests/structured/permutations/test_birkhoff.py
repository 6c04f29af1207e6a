"""Tests of perturb/structured/permutations/birkhoff.py: matching and the Permutations structure.

Oracles: scipy's linear_sum_assignment, POT's exact EMD, brute force over the n! permutation
matrices, the entropy bound of the τ → 0 limit.
"""
import math

import ot
import pytest
import torch
from scipy.optimize import linear_sum_assignment

import perturb
from perturb.structured import Permutations, matching, sinkhorn

from _draws import randn as _randn

F64 = torch.float64


def test_matching_equals_scipy_emd_and_brute_force():
    w = _randn(3, 2, 5, 5, seed=6)
    M = matching(w)
    assert M.shape == w.shape and M.dtype == w.dtype
    assert bool(Permutations().check(M).all())
    verts = Permutations().enumerate(5, dtype=F64)
    flat_w, flat_m = w.reshape(-1, 5, 5), M.reshape(-1, 5, 5)
    uniform = torch.full((5,), 1 / 5, dtype=F64)
    for wk, mk in zip(flat_w, flat_m):
        r, c = linear_sum_assignment(wk.numpy(), maximize=True)
        ref = torch.zeros(5, 5, dtype=F64)
        ref[r, c] = 1
        torch.testing.assert_close(mk, ref)
        torch.testing.assert_close(mk, 5 * ot.emd(uniform, uniform, -wk))
        torch.testing.assert_close(mk, verts[(verts * wk).sum((-2, -1)).argmax()])


def test_matching_rectangular_and_float32():
    w = _randn(4, 3, 5, seed=7, dtype=torch.float32)
    M = matching(w)
    assert M.dtype == torch.float32
    assert bool((M.sum(-1) == 1).all()) and bool((M.sum(-2) <= 1).all())
    for wk, mk in zip(w, M):
        r, c = linear_sum_assignment(wk.numpy(), maximize=True)
        assert float(mk[r, c].sum()) == 3


def test_small_tau_approaches_matching():
    """⟨W, M⟩ − ⟨W, P_τ⟩ ≤ τ (H(P_τ) − H(M)) ≤ τ n log n, and, writing P_τ as a mixture of
    permutations with weight λ on M, max|P_τ − M| ≤ 1 − λ ≤ (⟨W, M⟩ − ⟨W, P_τ⟩)/Δ with Δ the
    gap between the best and second-best permutation (brute force)."""
    n = 6
    w = 3 * _randn(n, n, seed=8)
    M = matching(w)
    values = (Permutations().enumerate(n, dtype=F64) * w).sum((-2, -1)).sort(descending=True)[0]
    delta = float(values[0] - values[1])
    dists = []
    for tau in (1.0, 0.1, 0.03):
        P = sinkhorn(w, tau=tau, n_iters=3000, tol=1e-10)
        value_gap = float(((M - P) * w).sum())
        assert -1e-9 <= value_gap <= tau * n * math.log(n) + 1e-9
        dist = float((P - M).abs().max())
        assert dist <= value_gap / delta + 1e-9
        dists.append(dist)
    assert dists == sorted(dists, reverse=True)
    assert dists[-1] <= 0.03 * n * math.log(n) / delta


def test_matching_bad_input():
    with pytest.raises(ValueError, match="w"):
        matching(torch.tensor([[float("nan"), 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="w"):
        matching(torch.zeros(3))


def test_structure_contract():
    s = Permutations()
    verts = s.enumerate(4)
    assert verts.shape == (24, 4, 4)
    assert len({tuple(v.flatten().tolist()) for v in verts}) == 24
    assert bool(s.check(verts).all())
    assert not bool(s.check(torch.full((4, 4), 0.25)))
    assert not bool(s.check(torch.eye(4)[[0, 0, 1, 2]]))
    assert repr(s) == "Permutations()"
    assert repr(Permutations(n_iters=50)) == "Permutations(n_iters=50)"
    w = _randn(2, 4, 4, seed=29)
    torch.testing.assert_close(perturb.argmax(w, s), matching(w))


def test_registry_solver_and_unsupported_pair():
    w = _randn(2, 4, 4, seed=30)
    P = perturb.regularized_argmax(w, Permutations(n_iters=2000, tol=1e-12), tau=0.5)
    torch.testing.assert_close(P, sinkhorn(w, tau=0.5, n_iters=2000, tol=1e-12))
    pairs = {(p.structure, p.regularizer): p for p in perturb.registered_pairs()}
    assert pairs[("Permutations", "Entropy")].backward[:2] == ("implicit", "unroll")
    assert not pairs[("Permutations", "ExpFamilyEntropy")].supported
    with pytest.raises(NotImplementedError, match="permanent"):
        perturb.regularized_argmax(w, Permutations(), perturb.ExpFamilyEntropy())


def test_relax_hard_is_straight_through_permutation():
    theta = _randn(3, 5, 5, seed=31).requires_grad_()
    g = torch.Generator().manual_seed(0)
    P = perturb.relax(theta, structure=Permutations(n_iters=2000), tau=0.5, hard=True,
                      generator=g)
    assert bool(Permutations().check(P).all())
    (P * _randn(3, 5, 5, seed=32)).sum().backward()
    assert bool(torch.isfinite(theta.grad).all()) and theta.grad.abs().max() > 0
