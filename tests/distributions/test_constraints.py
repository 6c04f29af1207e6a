"""The constraints of perturb.distributions: log potentials and structure supports."""
from __future__ import annotations

import math

import pytest
import torch

from perturb import Simplex
from perturb.distributions.constraints import StructureSupport, log_potential
from perturb.structured import Arborescences, KSubset, SpanningTrees


def test_log_potential_allows_minus_inf_only():
    x = torch.tensor([0.0, -1e30, -math.inf, math.inf, math.nan])
    assert log_potential.check(x).tolist() == [True, True, True, False, False]


def test_structure_support_checks_membership():
    s = StructureSupport(KSubset(2))
    assert s.is_discrete and s.event_dim == 1
    y = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.5, 0.5, 1.0]])
    assert s.check(y).tolist() == [True, False, False]
    assert StructureSupport(Simplex()).check(torch.eye(3)).all()
    t = StructureSupport(SpanningTrees())
    assert t.event_dim == 2
    Z = SpanningTrees().enumerate(4)
    assert t.check(Z).all() and not t.check(torch.ones(4, 4)).item()
    a = StructureSupport(Arborescences(1))
    Z = Arborescences(1).enumerate(4)
    assert a.check(Z).all() and not a.check(Z.transpose(-1, -2)).any()
    assert repr(a) == "StructureSupport(Arborescences(root=1))"


def test_structure_support_needs_a_structure():
    with pytest.raises(ValueError, match="structure"):
        StructureSupport("simplex")
