"""Extreme inputs over every registered pair: scores of ±1e4 at τ = 1e-3, float32 and float64.

Hypothesis draws the scores (Gaussian ×1e4, or exact ties: ±1e4 and 0 only), the size (up to
1000 for permutations, 200 for trees, through explicit examples) and the dtype; for every
supported pair of :func:`perturb.registered_pairs` (a pair registered later is covered, and
fails until its structure has a spec in tests/_specs.py) the relaxed output and the gradient of
a linear loss must be finite and the output must satisfy its structure's linear constraints
(``constraints`` of its spec in tests/_specs.py: entries in [0, 1], the simplex and k-subset
sums, the Sinkhorn marginals to the tolerance the solver reports, the trees' degree sums, the
paths' flow conservation).

Constraint sums are taken in float64 over the returned values, so the rounding allowance is that
of the output: |Σ − target| ≤ 4 ε · (mass summed), ε the output dtype's epsilon, plus for the
tree marginals (a linear solve checked a posteriori, not a normalisation) their documented
accuracy of 1e-9 relative.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perturb import registered_pairs, regularized_argmax
from perturb import regularizers as regs
from perturb.structured import SinkhornConvergenceWarning

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
    SPECS[pair.structure].constraints(structure, w.detach(), TAU, y, warned)
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
