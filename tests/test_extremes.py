"""Extreme inputs over every registered pair: scores of ±1e4 at τ = 1e-3, float32 and float64.

Hypothesis draws the scores (Gaussian ×1e4, or exact ties: ±1e4 and 0 only), the size (up to
1000 for permutations, 200 for trees, through explicit examples) and the dtype; for every
supported pair of :func:`perturb.registered_pairs` (a pair registered later is covered, and
fails until its structure has a spec in tests/_specs.py) the relaxed output and the gradient of
a linear loss must be finite and the output must satisfy its structure's linear constraints:

- Simplex: entries in [0, 1], rows sum to 1;
- KSubset(k): entries in [0, 1], rows sum to k;
- CorrelatedKSubset(k) (n = d items, scores of size 2d − 1): entries in [0, 1], the d item
  marginals sum to k, each pair marginal ≤ both of its items';
- Permutations: rows or columns sum to 1 (the last normalisation), the other side within the
  tolerance the solver reports using (``SinkhornSolution.tol``: max(tol, its rounding floor)), or
  within the error it measured when it warned of non-convergence;
- Transport(a, b) (n x (n + 1) plans, unequal masses): as Permutations with row sums a and column
  sums b, entries in [0, min(a_i, b_j)];
- SpanningTrees: symmetric, zero diagonal, Σμ = 2(n − 1) (each edge counted twice);
- Arborescences(root): every non-root column sums to 1, the root's column to 0.
- DAGPaths: zero on and below the diagonal, one unit of flow out of the source, in-flow equal
  to out-flow at the other nodes, and into the sink (whose error is the sum of the others'
  conservation errors, so its allowance scales with the expected path length Σμ).

Constraint sums are taken in float64 over the returned values, so the rounding allowance is that
of the output: |Σ − target| ≤ 4 ε · (mass summed), ε the output dtype's epsilon, plus for the
tree marginals (a linear solve checked a posteriori, not a normalisation) their documented
accuracy of 1e-9 relative.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from perturb import registered_pairs, regularized_argmax
from perturb import regularizers as regs
from perturb.structured import (
    Arborescences,
    CorrelatedKSubset,
    DAGPaths,
    KSubset,
    Permutations,
    SinkhornConvergenceWarning,
    SpanningTrees,
    Transport,
)
from perturb.structured.permutations._sinkhorn import sinkhorn_iterate
from perturb.structures import Simplex

from _specs import SPECS

SUPPORTED = [p for p in registered_pairs() if p.supported]
HERE = "tests/test_extremes.py"
SCALE, TAU = 1e4, 1e-3

#: structure -> (hypothesis' largest n, the large n of the explicit example, make(n)),
#: read from the one spec per structure in tests/_specs.py
CASES = {name: (sp.n_hypothesis, sp.n_large, sp.make) for name, sp in SPECS.items()}


def _event(structure, n):
    return SPECS[type(structure).__name__].event(n)


def _ids(pairs):
    return [f"{p.structure}-{p.regularizer}" for p in pairs]


def _scores(event, dtype, kind, seed, batch):
    g = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        w = torch.randn(batch, *event, generator=g, dtype=torch.float64) * SCALE
    else:                                               # exact ties at ±1e4 and 0
        w = (torch.randint(-1, 2, (batch, *event), generator=g) * SCALE).double()
    return w.to(dtype)


def _check_constraints(structure, w, y, warned):
    eps = torch.finfo(y.dtype).eps
    y64 = y.detach().double()
    n = y.shape[-1]
    slack = 4 * eps
    upper = torch.ones((), dtype=torch.float64)
    if isinstance(structure, (Permutations, Transport)):
        if isinstance(structure, Transport):
            a = structure.a.expand(*w.shape[:-1]).double()
            b = structure.b.expand(*w.shape[:-2], w.shape[-1]).double()
            upper = torch.minimum(a.unsqueeze(-1), b.unsqueeze(-2))
        else:
            a = b = torch.ones(w.shape[:-1], dtype=torch.float64)
        sol = sinkhorn_iterate(w.double() / TAU, a, b, None, None, structure.n_iters,
                               structure.tol)
        # the exponent of an entry is rounded at the scale of |W|/τ: the floor in sol.tol
        slack = float(sol.tol.max()) + 4 * eps * float(upper.max())
    if isinstance(structure, (SpanningTrees, Arborescences)):
        slack += 1e-9                      # their documented accuracy (below)
    if isinstance(structure, Transport):
        # y_ij <= min(row sum, column sum): the side that is not normalised last is within the
        # marginal tolerance (or the error the solver warned of)
        upper = upper + float((sol.error if warned else sol.tol).max())
    below, above = float((-y64).max()), float((y64 - upper).max())
    assert below <= slack and above <= slack, f"entries outside [0, 1] by {max(below, above):.3g}"

    # the tree marginals come from a linear solve checked a posteriori to 1e-9 relative
    # (docs/trees.md), not from a normalisation: that is their documented accuracy
    solved = 1e-9 if isinstance(structure, (SpanningTrees, Arborescences)) else 0.0

    def close(total, target, mass, extra=0.0):
        err = (total - target).abs().max()
        allowed = (4 * eps + solved + extra) * mass
        assert err <= allowed, f"constraint off by {err:.3g} (allowed {allowed:.3g})"

    if isinstance(structure, Simplex):
        close(y64.sum(-1), 1.0, 1.0)
    elif isinstance(structure, KSubset):
        # the capped-simplex root (SquaredNorm, BinaryEntropy) stops at |Σx − k| ≤ 2 ε k log2 n
        # in float64 (2 ε k in float32, its residual summed in float64): its documented
        # accuracy (subsets/ksubsets.py, _capped_root), on top of the rounding of the sum
        rooted = 2 * eps * (max(1.0, math.log2(n)) if y.dtype == torch.float64 else 1.0)
        close(y64.sum(-1), float(structure.k), float(structure.k), rooted)
    elif isinstance(structure, CorrelatedKSubset):
        d = (n + 1) // 2
        close(y64[..., :d].sum(-1), float(structure.k), float(structure.k))
        # a pair is chosen only with both its items: μ_{d+j} ≤ min(μ_j, μ_{j+1})
        both = torch.minimum(y64[..., :d - 1], y64[..., 1:d])
        assert (y64[..., d:] <= both + slack).all(), "pair marginal above an item marginal"
    elif isinstance(structure, (Permutations, Transport)):
        rows = (y64.sum(-1) - a).abs().amax(-1)
        cols = (y64.sum(-2) - b).abs().amax(-1)
        # one side is exact (the last normalisation), the other within the tolerance used, or
        # within the error the solver measured and warned about
        allowed = (sol.error if warned else sol.tol).double() + 4 * eps
        assert (torch.minimum(rows, cols) <= slack).all(), "neither side normalised"
        assert (torch.maximum(rows, cols) <= allowed).all(), \
            f"marginals off by {torch.maximum(rows, cols).max():.3g} > {allowed.max():.3g}"
    elif isinstance(structure, SpanningTrees):
        assert torch.equal(y64, y64.transpose(-1, -2))
        assert (y64.diagonal(dim1=-2, dim2=-1) == 0).all()
        close(y64.sum((-2, -1)), 2.0 * (n - 1), 2.0 * (n - 1))
    elif isinstance(structure, Arborescences):
        cols = y64.sum(-2)
        root = structure.root
        close(cols[..., root], 0.0, 1.0)
        keep = torch.arange(n) != root
        close(cols[..., keep], 1.0, 1.0)
    elif isinstance(structure, DAGPaths):
        assert (y64.tril() == 0).all(), "output on or below the diagonal"
        into, out = y64.sum(-2), y64.sum(-1)
        close(out[..., 0], 1.0, 1.0)
        if n > 2:
            close(into[..., 1:-1] - out[..., 1:-1], 0.0, 2.0)     # in and out are each ≤ 1
        close(into[..., -1], 1.0, float(y64.sum((-2, -1)).max()))
    else:
        pytest.fail(f"no constraint check for {type(structure).__name__} in {HERE}")


def _run(pair, n, dtype, kind, seed, batch=2):
    if pair.structure not in CASES:
        pytest.fail(f"no extreme-input case for structure {pair.structure!r}: add one to SPECS "
                    f"in tests/_specs.py")
    structure = CASES[pair.structure][2](n)
    event = _event(structure, n)
    w = _scores(event, dtype, kind, seed, batch).requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SinkhornConvergenceWarning)
        y = regularized_argmax(w, structure, getattr(regs, pair.regularizer)(), TAU)
    warned = any(issubclass(c.category, SinkhornConvergenceWarning) for c in caught)
    assert y.dtype == dtype and torch.isfinite(y).all(), "non-finite output"
    _check_constraints(structure, w.detach(), y, warned)
    c = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=dtype)
    (grad,) = torch.autograd.grad((c * y).sum(), w)
    assert torch.isfinite(grad).all(), "non-finite gradient"


@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_extreme_scores_small_tau(pair, data):
    n_max = CASES[pair.structure][0] if pair.structure in CASES else 4
    n = data.draw(st.integers(2, n_max), label="n")
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]), label="dtype")
    kind = data.draw(st.sampled_from(["gaussian", "ties"]), label="scores")
    _run(pair, n, dtype, kind, data.draw(st.integers(0, 2**31 - 1), label="seed"))


@pytest.mark.parametrize("kind", ["gaussian", "ties"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
def test_extreme_scores_large_n(pair, dtype, kind):
    """The large sizes: n = 1000 (simplex, k-subsets, permutations), 200 (trees)."""
    n = CASES[pair.structure][1] if pair.structure in CASES else 4
    _run(pair, n, dtype, kind, seed=0, batch=1)
