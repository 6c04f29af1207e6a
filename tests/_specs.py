"""One test specification per structure, read by the shared structure tests.

A new structure is picked up by tests/test_contract.py, tests/test_extremes.py and
tests/test_reproducibility.py once it has an entry in :data:`SPECS` (keyed by class name, the
name :func:`perturb.registered_pairs` reports); tests fail naming this file when it has none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from perturb.structured import (
    Arborescences,
    CorrelatedKSubset,
    DAGPaths,
    KSubset,
    Permutations,
    SpanningTrees,
    Transport,
)
from perturb.structures import Simplex, Structure

HERE = "tests/_specs.py"


@dataclass(frozen=True)
class StructureSpec:
    """How the shared tests build inputs for one structure.

    Attributes:
        example: small instance and event shape for the contract tests (solvers converged
            tightly so finite differences are meaningful).
        make: instance of size ``n`` (extremes).
        event: event shape of the scores of ``make(n)``.
        n_hypothesis: largest ``n`` hypothesis draws in the extremes tests.
        n_large: ``n`` of the explicit large example in the extremes tests.
        repro: instance and event shape for the reproducibility tests.
        half: instance with default (float32) solver settings and event shape for the
            half-precision tests.
    """

    example: Callable[[], tuple[Structure, tuple[int, ...]]]
    make: Callable[[int], Structure]
    event: Callable[[int], tuple[int, ...]]
    n_hypothesis: int
    n_large: int
    repro: Callable[[], tuple[Structure, tuple[int, ...]]]
    half: Callable[[], tuple[Structure, tuple[int, ...]]]


def _marginals(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row masses 1, 2, 3, 1, 2, ... and n + 1 equal column masses with the same total."""
    a = (torch.arange(n, dtype=torch.float64) % 3 + 1)
    b = torch.full((n + 1,), float(a.sum()) / (n + 1), dtype=torch.float64)
    return a, b


def _vec(n: int) -> tuple[int, ...]:
    return (n,)


def _mat(n: int) -> tuple[int, ...]:
    return (n, n)


SPECS: dict[str, StructureSpec] = {
    "Simplex": StructureSpec(
        example=lambda: (Simplex(), (5,)), make=lambda n: Simplex(), event=_vec,
        n_hypothesis=20, n_large=1000, repro=lambda: (Simplex(), (6,)),
        half=lambda: (Simplex(), (10,))),
    "KSubset": StructureSpec(
        example=lambda: (KSubset(2), (5,)), make=lambda n: KSubset(max(1, n // 3)), event=_vec,
        n_hypothesis=20, n_large=1000, repro=lambda: (KSubset(2), (6,)),
        half=lambda: (KSubset(3), (10,))),
    "Permutations": StructureSpec(
        example=lambda: (Permutations(n_iters=1000, tol=1e-12), (4, 4)),
        make=lambda n: Permutations(), event=_mat, n_hypothesis=12, n_large=1000,
        repro=lambda: (Permutations(), (5, 5)),
        half=lambda: (Permutations(), (6, 6))),
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
                                torch.tensor([0.4, 0.3, 0.2, 0.1])), (5, 4))),
    "SpanningTrees": StructureSpec(
        example=lambda: (SpanningTrees(), (4, 4)), make=lambda n: SpanningTrees(), event=_mat,
        n_hypothesis=12, n_large=200, repro=lambda: (SpanningTrees(), (5, 5)),
        half=lambda: (SpanningTrees(), (6, 6))),
    "Arborescences": StructureSpec(
        example=lambda: (Arborescences(), (4, 4)), make=lambda n: Arborescences(n // 2),
        event=_mat, n_hypothesis=12, n_large=200, repro=lambda: (Arborescences(0), (5, 5)),
        half=lambda: (Arborescences(0), (6, 6))),
    # n is the number of items d: scores of size 2d − 1; the example has d = 4 items, 3 pairs
    "CorrelatedKSubset": StructureSpec(
        example=lambda: (CorrelatedKSubset(2), (7,)),
        make=lambda n: CorrelatedKSubset(max(1, n // 3)), event=lambda n: (2 * n - 1,),
        n_hypothesis=20, n_large=1000, repro=lambda: (CorrelatedKSubset(2), (7,)),
        half=lambda: (CorrelatedKSubset(2), (9,))),        # event 2d − 1 = 9: d = 5 items
    # source-to-sink paths of the complete DAG on n nodes: 2^(n−2) of them
    "DAGPaths": StructureSpec(
        example=lambda: (DAGPaths(), (5, 5)), make=lambda n: DAGPaths(), event=_mat,
        n_hypothesis=12, n_large=200, repro=lambda: (DAGPaths(), (5, 5)),
        half=lambda: (DAGPaths(), (6, 6))),
}


def spec(name: str) -> StructureSpec:
    """The spec of structure ``name``; a clear failure when a new structure has none."""
    if name not in SPECS:
        raise LookupError(f"no test spec for structure {name!r}: add one to SPECS in {HERE}")
    return SPECS[name]
