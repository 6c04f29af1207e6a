"""Constraints for the distributions over structures, in the manner of
``torch.distributions.constraints``.

- :data:`log_potential`: a real number or ``-inf`` (``-inf`` masks an item or an edge); NaN and
  ``+inf`` are refused. It is the argument constraint of the Gibbs families.
- :class:`StructureSupport`: the vertices Z of a :class:`perturb.Structure` (k-subsets, trees,
  one-hots...), a discrete support whose ``check`` is the structure's membership test.

Both return a boolean tensor from ``check``: elementwise for :data:`log_potential`, one value per
structure (``(*batch)``) for :class:`StructureSupport`.
"""
from __future__ import annotations

import math

import torch
from torch.distributions import constraints

from perturb.structures import Structure

__all__ = ["log_potential", "StructureSupport"]


class _LogPotential(constraints.Constraint):
    """Real or ``-inf``: ``x == x`` (not NaN) and ``x < +inf``, elementwise."""

    def check(self, value: torch.Tensor) -> torch.Tensor:
        return (value == value) & (value < math.inf)

    def __repr__(self) -> str:
        return "LogPotential(real or -inf)"


#: Real numbers or ``-inf`` (a masked entry); NaN and ``+inf`` are out.
log_potential = _LogPotential()


class StructureSupport(constraints.Constraint):
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

    def __init__(self, structure: Structure):
        if not isinstance(structure, Structure):
            raise ValueError(f"structure must be a perturb Structure, got {structure!r}")
        self.structure = structure
        self.event_dim = structure.event_dim
        super().__init__()

    def check(self, value: torch.Tensor) -> torch.Tensor:
        return self.structure.check(value)

    def __repr__(self) -> str:
        return f"StructureSupport({self.structure!r})"
