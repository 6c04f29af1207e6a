"""One test specification per structure, read by the shared structure tests.

A new structure is picked up by the shared tests once it has an entry in :data:`SPECS` (keyed by
class name, the name :func:`perturb.registered_pairs` reports); they fail naming this file when it
has none:

- tests/test_contract.py, tests/test_reproducibility.py, tests/test_precision.py: ``example``,
  ``repro``, ``half``;
- tests/test_extremes.py: ``make``, ``event``, the sizes and ``constraints`` (the linear
  constraints of the marginal polytope that a relaxed output must satisfy);
- tests/test_default_gradients.py: ``gradients`` (how to draw the structure with default solver
  settings) and ``references`` (per regularizer, the independent reference of its gradient);
- tests/test_bad_input.py: the scores and temperature cases every structure owes (generated
  from ``example``, tests/_cases.py) plus ``bad_inputs``, the cases of its own arguments.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from hypothesis import strategies as st

from perturb.structured import (
    Arborescences,
    CorrelatedKSubset,
    DAGPaths,
    KSubset,
    Permutations,
    SpanningTrees,
    Transport,
)
from perturb.structured.permutations._sinkhorn import sinkhorn_iterate
from perturb.structures import Simplex, Structure

from _cases import F64, S, V, Case, int_cases

HERE = "tests/_specs.py"
#: the trees' marginals come from a linear solve checked a posteriori to 1e-9 relative
#: (docs/trees.md), not from a normalisation: that is their documented accuracy
TREE_ACCURACY = 1e-9

Constraints = Callable[[Structure, torch.Tensor, float, torch.Tensor, bool], None]


@dataclass(frozen=True)
class Gradients:
    """How tests/test_default_gradients.py draws the structure and checks its gradients.

    Attributes:
        draw: ``draw(data, n)``, the structure of size ``n`` with DEFAULT solver settings
            (``data`` is hypothesis' ``st.data()``).
        n_max: largest n (brute-force enumeration and n² finite differences stay cheap).
        tau_min: smallest τ drawn.
        references: regularizer class name -> (reference, tolerance), names the test file
            defines: references "brute_force" (enumeration), "softmax" (closed form),
            "finite_differences" (of ``converged``'s forward); tolerances "exact", "fd",
            "sinkhorn_default".
        converged: the tightly converged twin of a default structure, for finite differences.
        max_examples: hypothesis examples per pair.
        gibbs_scale: the factor on ⟨w, z⟩ in q(z) ∝ exp(gibbs_scale ⟨w, z⟩ / τ) (1/2 for
            undirected trees: each edge is counted twice in the symmetric 0/1 matrix z).
    """

    draw: Callable[[Any, int], Structure]
    n_max: int
    tau_min: float
    references: dict[str, tuple[str, str]]
    converged: Callable[[Structure], Structure] = lambda s: s
    max_examples: int = 60
    gibbs_scale: float = 1.0


@dataclass(frozen=True)
class StructureSpec:
    """How the shared tests build inputs for one structure.

    Attributes:
        example: small instance and event shape for the contract tests (solvers converged
            tightly so finite differences are meaningful); the bad-input cases of the scores
            are generated from it.
        make: instance of size ``n`` (extremes).
        event: event shape of the scores of ``make(n)``.
        n_hypothesis: largest ``n`` hypothesis draws in the extremes tests.
        n_large: ``n`` of the explicit large example in the extremes tests.
        repro: instance and event shape for the reproducibility tests.
        half: instance with default (float32) solver settings and event shape for the
            half-precision tests.
        constraints: ``constraints(structure, w, tau, y, warned)`` asserts that a relaxed output
            ``y`` of ``regularized_argmax(w, structure, ., tau)`` lies in the marginal polytope,
            up to the rounding of its dtype and the solver's documented accuracy (``warned``:
            the solver warned of non-convergence).
        gradients: the default-gradient case (:class:`Gradients`).
        bad_inputs: the bad-input cases of the structure's own arguments (constructor,
            ``enumerate``), beyond the generated scores cases.
    """

    example: Callable[[], tuple[Structure, tuple[int, ...]]]
    make: Callable[[int], Structure]
    event: Callable[[int], tuple[int, ...]]
    n_hypothesis: int
    n_large: int
    repro: Callable[[], tuple[Structure, tuple[int, ...]]]
    half: Callable[[], tuple[Structure, tuple[int, ...]]]
    constraints: Constraints
    gradients: Gradients
    bad_inputs: Callable[[], list[Case]] = field(default=lambda: [])


# --------------------------------------------------------------------------------------------
# the marginal polytopes: entries in [0, upper], linear constraints to the output's rounding
# --------------------------------------------------------------------------------------------

def _in_box(y64: torch.Tensor, upper: Any, slack: float) -> None:
    below, above = float((-y64).max()), float((y64 - upper).max())
    assert below <= slack and above <= slack, f"entries outside [0, 1] by {max(below, above):.3g}"


def _close(total: torch.Tensor, target: Any, mass: float, eps: float, extra: float = 0.0
           ) -> None:
    """|Σ − target| ≤ (4 ε + extra) · mass: the constraint sums are taken in float64 over the
    returned values, so the rounding allowance is that of the output dtype."""
    err = (total - target).abs().max()
    allowed = (4 * eps + extra) * mass
    assert err <= allowed, f"constraint off by {err:.3g} (allowed {allowed:.3g})"


def _simplex_constraints(structure, w, tau, y, warned):
    eps, y64 = torch.finfo(y.dtype).eps, y.detach().double()
    _in_box(y64, 1.0, 4 * eps)
    _close(y64.sum(-1), 1.0, 1.0, eps)


def _ksubset_constraints(structure, w, tau, y, warned):
    eps, y64, n = torch.finfo(y.dtype).eps, y.detach().double(), y.shape[-1]
    _in_box(y64, 1.0, 4 * eps)
    # the capped-simplex root (SquaredNorm, BinaryEntropy) stops at |Σx − k| ≤ 2 ε k log2 n in
    # float64 (2 ε k in float32, its residual summed in float64): its documented accuracy
    # (subsets/ksubsets.py, _capped_root), on top of the rounding of the sum
    rooted = 2 * eps * (max(1.0, math.log2(n)) if y.dtype == torch.float64 else 1.0)
    _close(y64.sum(-1), float(structure.k), float(structure.k), eps, rooted)


def _correlated_constraints(structure, w, tau, y, warned):
    eps, y64 = torch.finfo(y.dtype).eps, y.detach().double()
    d = (y.shape[-1] + 1) // 2
    _in_box(y64, 1.0, 4 * eps)
    _close(y64[..., :d].sum(-1), float(structure.k), float(structure.k), eps)
    # a pair is chosen only with both its items: μ_{d+j} ≤ min(μ_j, μ_{j+1})
    both = torch.minimum(y64[..., :d - 1], y64[..., 1:d])
    assert (y64[..., d:] <= both + 4 * eps).all(), "pair marginal above an item marginal"


def _sinkhorn_constraints(structure, w, tau, y, warned):
    """Permutations and Transport: one side exact (the last normalisation), the other within
    the tolerance the solver reports using (``SinkhornSolution.tol``: max(tol, its rounding
    floor)), or within the error it measured when it warned of non-convergence; entries in
    [0, min(a_i, b_j)]."""
    eps, y64 = torch.finfo(y.dtype).eps, y.detach().double()
    if isinstance(structure, Transport):
        a = structure.a.expand(*w.shape[:-1]).double()
        b = structure.b.expand(*w.shape[:-2], w.shape[-1]).double()
        upper = torch.minimum(a.unsqueeze(-1), b.unsqueeze(-2))
    else:
        a = b = torch.ones(w.shape[:-1], dtype=torch.float64)
        upper = torch.ones((), dtype=torch.float64)
    sol = sinkhorn_iterate(w.double() / tau, a, b, None, None, structure.n_iters, structure.tol)
    # the exponent of an entry is rounded at the scale of |W|/τ: the floor in sol.tol
    slack = float(sol.tol.max()) + 4 * eps * float(upper.max())
    measured = (sol.error if warned else sol.tol).double()
    # y's entries are rounded to its dtype: a row or column sum moves by up to ~eps times its
    # size, the marginal plus the error (an absolute 4·eps failed a float32 Transport case whose
    # unconverged column sum, b_j + 1.6, was 6·eps off the float64 reference's)
    size = torch.maximum(a.amax(-1), b.amax(-1)) + measured
    allowed = measured + 4 * eps * size
    if isinstance(structure, Transport):
        # y_ij ≤ min(row sum, column sum): the side that is not normalised last is within the
        # marginal tolerance (or the error the solver warned of)
        upper = upper + float(measured.max())
    _in_box(y64, upper, slack)
    rows = (y64.sum(-1) - a).abs().amax(-1)
    cols = (y64.sum(-2) - b).abs().amax(-1)
    assert (torch.minimum(rows, cols) <= slack).all(), "neither side normalised"
    assert (torch.maximum(rows, cols) <= allowed).all(), \
        f"marginals off by {torch.maximum(rows, cols).max():.3g} > {allowed.max():.3g}"


def _spanning_constraints(structure, w, tau, y, warned):
    eps, y64, n = torch.finfo(y.dtype).eps, y.detach().double(), y.shape[-1]
    _in_box(y64, 1.0, 4 * eps + TREE_ACCURACY)
    assert torch.equal(y64, y64.transpose(-1, -2)), "not symmetric"
    assert (y64.diagonal(dim1=-2, dim2=-1) == 0).all(), "non-zero diagonal"
    _close(y64.sum((-2, -1)), 2.0 * (n - 1), 2.0 * (n - 1), eps, TREE_ACCURACY)


def _arborescence_constraints(structure, w, tau, y, warned):
    eps, y64, n = torch.finfo(y.dtype).eps, y.detach().double(), y.shape[-1]
    _in_box(y64, 1.0, 4 * eps + TREE_ACCURACY)
    cols = y64.sum(-2)
    root = structure.root
    _close(cols[..., root], 0.0, 1.0, eps, TREE_ACCURACY)
    keep = torch.arange(n) != root
    _close(cols[..., keep], 1.0, 1.0, eps, TREE_ACCURACY)


def _dag_path_constraints(structure, w, tau, y, warned):
    """Zero on and below the diagonal, one unit of flow out of the source, in-flow equal to
    out-flow at the other nodes, and into the sink (whose error is the sum of the others'
    conservation errors, so its allowance scales with the expected path length Σμ)."""
    eps, y64, n = torch.finfo(y.dtype).eps, y.detach().double(), y.shape[-1]
    _in_box(y64, 1.0, 4 * eps)
    assert (y64.tril() == 0).all(), "output on or below the diagonal"
    into, out = y64.sum(-2), y64.sum(-1)
    _close(out[..., 0], 1.0, 1.0, eps)
    if n > 2:
        _close(into[..., 1:-1] - out[..., 1:-1], 0.0, 2.0, eps)     # in and out are each ≤ 1
    _close(into[..., -1], 1.0, float(y64.sum((-2, -1)).max()), eps)


# --------------------------------------------------------------------------------------------
# sizes and inputs
# --------------------------------------------------------------------------------------------

def _marginals(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row masses 1, 2, 3, 1, 2, ... and n + 1 equal column masses with the same total."""
    a = (torch.arange(n, dtype=torch.float64) % 3 + 1)
    b = torch.full((n + 1,), float(a.sum()) / (n + 1), dtype=torch.float64)
    return a, b


def _vec(n: int) -> tuple[int, ...]:
    return (n,)


def _mat(n: int) -> tuple[int, ...]:
    return (n, n)


TA = torch.tensor([0.5, 0.5], dtype=F64)          # transport marginals (Σ = 1)
TB = torch.tensor([0.2, 0.3, 0.5], dtype=F64)


def _transport_draw(data: Any, n: int) -> Transport:
    """Transport(a, b) with default solver settings: masses in [0.2, 1.2), b rescaled to Σa."""
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32 - 1), label="masses"))
    a = 0.2 + torch.rand(n, dtype=F64, generator=gen)
    b = 0.2 + torch.rand(n + 1, dtype=F64, generator=gen)
    return Transport(a, b * a.sum() / b.sum())


def _transport_bad_inputs() -> list[Case]:
    return [
        Case("a negative", lambda: Transport(torch.tensor([-0.5, 1.5], dtype=F64), TB), "a"),
        Case("b negative", lambda: Transport(TA, torch.tensor([1.5, -0.5, 0.0], dtype=F64)),
             "b"),
        Case("a NaN", lambda: Transport(torch.tensor([math.nan, 1.0], dtype=F64), TB), "a"),
        Case("b zero total", lambda: Transport(TA, torch.zeros(3, dtype=F64)), "b"),
        Case("sums differ", lambda: Transport(TA, 2 * TB), "sums"),
        Case("a not a tensor", lambda: Transport([0.5, 0.5], TB), "a"),
        Case("a int dtype", lambda: Transport(torch.tensor([1, 1]), TB), "a"),
        Case("b 0-dim", lambda: Transport(TA, torch.tensor(1.0, dtype=F64)), "b"),
        Case("batches do not broadcast", lambda: Transport(
            TA.expand(2, 2), TB.expand(3, 3)), "batch"),
        Case("n_iters 0", lambda: Transport(TA, TB, n_iters=0), "n_iters"),
        Case("tol < 0", lambda: Transport(TA, TB, tol=-1.0), "tol"),
        Case("scores of the wrong shape", lambda: Transport(TA, TB).argmax(S), "w"),
        Case("scores transposed", lambda: __import__("perturb").relax(
            torch.randn(3, 2, dtype=F64), Transport(TA, TB)), "shape"),
        Case("marginal batch larger than the scores'", lambda: Transport(
            TA.expand(4, 2), TB).argmax(torch.randn(2, 3, dtype=F64)), "broadcast"),
        Case("enumerate n not m", lambda: Transport(TA, TB).enumerate(2), "n"),
    ]


SINKHORN_CONVERGED = dict(n_iters=100_000, tol=1e-13)

SPECS: dict[str, StructureSpec] = {
    "Simplex": StructureSpec(
        example=lambda: (Simplex(), (5,)), make=lambda n: Simplex(), event=_vec,
        n_hypothesis=20, n_large=1000, repro=lambda: (Simplex(), (6,)),
        half=lambda: (Simplex(), (10,)), constraints=_simplex_constraints,
        gradients=Gradients(lambda data, n: Simplex(), n_max=8, tau_min=0.2, references={
            "Entropy": ("softmax", "exact"), "ExpFamilyEntropy": ("brute_force", "exact"),
            "SquaredNorm": ("finite_differences", "fd")})),
    "KSubset": StructureSpec(
        example=lambda: (KSubset(2), (5,)), make=lambda n: KSubset(max(1, n // 3)), event=_vec,
        n_hypothesis=20, n_large=1000, repro=lambda: (KSubset(2), (6,)),
        half=lambda: (KSubset(3), (10,)), constraints=_ksubset_constraints,
        gradients=Gradients(
            lambda data, n: KSubset(data.draw(st.integers(1, n), label="k")), n_max=8,
            tau_min=0.2, references={
                "Entropy": ("finite_differences", "fd"),
                "SquaredNorm": ("finite_differences", "fd"),
                "BinaryEntropy": ("finite_differences", "fd"),
                "ExpFamilyEntropy": ("brute_force", "exact")}),
        bad_inputs=lambda: int_cases(KSubset, "k", 0) + [
            Case("enumerate on a device that does not exist",
                 lambda: KSubset(2).enumerate(3, device="bogus"), "device")]),
    # Sinkhorn's default (tol = 1e-6, n_iters = 1000) does not always converge for unit-scale
    # scores at τ = 0.3 (about 5% of 2 x 2 problems, 0.5% of 6 x 6 ones, fewer as τ grows):
    # such an example warns, and the default-gradient test rejects it
    "Permutations": StructureSpec(
        example=lambda: (Permutations(n_iters=1000, tol=1e-12), (4, 4)),
        make=lambda n: Permutations(), event=_mat, n_hypothesis=12, n_large=1000,
        repro=lambda: (Permutations(), (5, 5)),
        half=lambda: (Permutations(), (6, 6)), constraints=_sinkhorn_constraints,
        gradients=Gradients(
            lambda data, n: Permutations(), n_max=6, tau_min=0.3,
            references={"Entropy": ("finite_differences", "sinkhorn_default")},
            converged=lambda s: Permutations(**SINKHORN_CONVERGED), max_examples=30),
        bad_inputs=lambda: int_cases(lambda n: Permutations(n_iters=n), "n_iters", 0)
        + [Case("tol < 0", lambda: Permutations(tol=-1.0), "tol")]),
    # n x (n + 1) plans with unequal masses (see _marginals)
    "Transport": StructureSpec(
        example=lambda: (Transport(torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64),
                                   torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64),
                                   n_iters=1000, tol=1e-12), (3, 4)),
        make=lambda n: Transport(*_marginals(n)), event=lambda n: (n, n + 1),
        n_hypothesis=12, n_large=300,
        repro=lambda: (Transport(torch.full((5,), 0.2, dtype=torch.float64),
                                 torch.full((6,), 1 / 6, dtype=torch.float64)), (5, 6)),
        half=lambda: (Transport(torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2]),
                                torch.tensor([0.4, 0.3, 0.2, 0.1])), (5, 4)),
        constraints=_sinkhorn_constraints,
        gradients=Gradients(
            _transport_draw, n_max=5, tau_min=0.3,
            references={"Entropy": ("finite_differences", "sinkhorn_default")},
            converged=lambda s: Transport(s.a, s.b, **SINKHORN_CONVERGED), max_examples=30),
        bad_inputs=_transport_bad_inputs),
    "SpanningTrees": StructureSpec(
        example=lambda: (SpanningTrees(), (4, 4)), make=lambda n: SpanningTrees(), event=_mat,
        n_hypothesis=12, n_large=200, repro=lambda: (SpanningTrees(), (5, 5)),
        half=lambda: (SpanningTrees(), (6, 6)), constraints=_spanning_constraints,
        gradients=Gradients(
            lambda data, n: SpanningTrees(), n_max=6, tau_min=0.2,
            references={"ExpFamilyEntropy": ("brute_force", "exact")}, gibbs_scale=0.5)),
    "Arborescences": StructureSpec(
        example=lambda: (Arborescences(), (4, 4)), make=lambda n: Arborescences(n // 2),
        event=_mat, n_hypothesis=12, n_large=200, repro=lambda: (Arborescences(0), (5, 5)),
        half=lambda: (Arborescences(0), (6, 6)), constraints=_arborescence_constraints,
        gradients=Gradients(
            lambda data, n: Arborescences(data.draw(st.integers(0, n - 1), label="root")),
            n_max=6, tau_min=0.2, references={"ExpFamilyEntropy": ("brute_force", "exact")}),
        bad_inputs=lambda: int_cases(lambda r: Arborescences(r), "root", -1)),
    # n is the number of items d: scores of size 2d − 1; the example has d = 4 items, 3 pairs
    "CorrelatedKSubset": StructureSpec(
        example=lambda: (CorrelatedKSubset(2), (7,)),
        make=lambda n: CorrelatedKSubset(max(1, n // 3)), event=lambda n: (2 * n - 1,),
        n_hypothesis=20, n_large=1000, repro=lambda: (CorrelatedKSubset(2), (7,)),
        half=lambda: (CorrelatedKSubset(2), (9,)),        # event 2d − 1 = 9: d = 5 items
        constraints=_correlated_constraints,
        gradients=Gradients(
            lambda data, n: CorrelatedKSubset(data.draw(st.integers(1, n), label="k")),
            n_max=6, tau_min=0.2, references={"ExpFamilyEntropy": ("brute_force", "exact")}),
        bad_inputs=lambda: int_cases(CorrelatedKSubset, "k", 0) + [
            Case("validate even n", lambda: CorrelatedKSubset(1).validate(
                torch.randn(2, 4, dtype=F64)), "w"),
            Case("validate k > d", lambda: CorrelatedKSubset(4).validate(V), "k")]),
    # source-to-sink paths of the complete DAG on n nodes: 2^(n−2) of them
    "DAGPaths": StructureSpec(
        example=lambda: (DAGPaths(), (5, 5)), make=lambda n: DAGPaths(), event=_mat,
        n_hypothesis=12, n_large=200, repro=lambda: (DAGPaths(), (5, 5)),
        half=lambda: (DAGPaths(), (6, 6)), constraints=_dag_path_constraints,
        gradients=Gradients(lambda data, n: DAGPaths(), n_max=7, tau_min=0.2,
                            references={"ExpFamilyEntropy": ("brute_force", "exact")}),
        bad_inputs=lambda: [
            Case("validate n = 1", lambda: DAGPaths().validate(torch.zeros(2, 1, 1, dtype=F64)),
                 "w"),
            Case("enumerate n = 1", lambda: DAGPaths().enumerate(1), "n")]),
}


def spec(name: str) -> StructureSpec:
    """The spec of structure ``name``; a clear failure when a new structure has none."""
    if name not in SPECS:
        raise LookupError(f"no test spec for structure {name!r}: add one to SPECS in {HERE}")
    return SPECS[name]
