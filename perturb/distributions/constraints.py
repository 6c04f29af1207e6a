"""Constraints for the distributions over structures, in the manner of
``torch.distributions.constraints``.

- :data:`log_potential`: a real number or ``-inf`` (``-inf`` masks an item or an edge); NaN and
  ``+inf`` are refused. It is the argument constraint of the Gibbs families.
- :class:`StructureSupport`: the vertices Z of a :class:`perturb.Structure` (k-subsets, trees,
  one-hots...), a discrete support whose ``check`` is the structure's membership test.
- :class:`StructureHull`: its convex hull conv Z, where relaxed samples live (a necessary test:
  non-negative entries with the vertices' total).

Both return a boolean tensor from ``check``: elementwise for :data:`log_potential`, one value per
structure (``(*batch)``) for :class:`StructureSupport`.
"""
from __future__ import annotations

import math

import torch
from torch.distributions import constraints

from perturb.structures import Structure

__all__ = ["log_potential", "StructureSupport", "StructureHull"]


class _LogPotential(constraints.Constraint):
    """Real or ``-inf``: ``x == x`` (not NaN) and ``x < +inf``, elementwise."""

    def check(self, value: torch.Tensor) -> torch.Tensor:
        return (value == value) & (value < math.inf)

    def __repr__(self) -> str:
        return "LogPotential(real or -inf)"


#: Real numbers or ``-inf`` (a masked entry); NaN and ``+inf`` are out.
log_potential = _LogPotential()


class _OfStructure(constraints.Constraint):
    """A constraint defined by a structure, with the structure's event dims."""

    def __init__(self, structure: Structure):
        if not isinstance(structure, Structure):
            raise ValueError(f"structure must be a perturb Structure, got {structure!r}")
        self.structure = structure
        self.event_dim = structure.event_dim
        super().__init__()


class StructureSupport(_OfStructure):
    """The set Z of a structure as a discrete constraint: ``check(y)`` is ``structure.check(y)``.

    Args:
        structure: a :class:`perturb.Structure`; its ``event_dim`` is the constraint's.

    Shape: ``check``: ``(*batch, *event)`` -> ``(*batch)`` booleans (True where ``y`` is a
    vertex: 0/1 entries forming one structure).

    Example::

        >>> from perturb.structured import KSubset
        >>> StructureSupport(KSubset(2)).check(torch.tensor([[1., 0., 1.], [1., 1., 1.]]))
        tensor([ True, False])
    """

    is_discrete = True

    def check(self, value: torch.Tensor) -> torch.Tensor:
        return self.structure.check(value)

    def __repr__(self) -> str:
        return f"StructureSupport({self.structure!r})"


class StructureHull(_OfStructure):
    """conv Z of a structure, the support of its relaxed samples, as a continuous constraint.

    ``check`` is a necessary condition, exact for the simplex: every entry ≥ 0 and the entries
    of one event summing to the vertices' common total (1 for one-hots, k for k-subsets, n for
    permutation matrices, 2(n − 1) for symmetric spanning trees...), to a relative 1e-4 (float
    rounding of the solvers). Membership of a point of the tree polytopes is not tested beyond
    that.

    Shape: ``check``: ``(*batch, *event)`` -> ``(*batch)`` booleans.
    """

    is_discrete = False

    def check(self, value: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(-self.event_dim, 0))
        with torch.no_grad():
            vertex = self.structure.argmax(torch.zeros_like(value))
            total = vertex.sum(dims)
            ok = (value >= 0).all(dim=dims[0]) if self.event_dim == 1 else \
                (value >= 0).flatten(-self.event_dim).all(-1)
            return ok & ((value.sum(dims) - total).abs() <= 1e-4 * total.abs().clamp_min(1.0))

    def __repr__(self) -> str:
        return f"StructureHull({self.structure!r})"
