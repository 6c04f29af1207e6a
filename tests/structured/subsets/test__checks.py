"""Tests for perturb.structured.subsets._checks: the k-subset family's shared argument checks."""
from __future__ import annotations

import math

import pytest
import torch

import perturb
from perturb.structured.subsets._checks import check_feasible, check_k


def test_check_k_bounds_and_names():
    assert check_k(1, 5) == 1 and check_k(5, 5) == 5
    for bad in (0, 6, -1):
        with pytest.raises(ValueError, match=r"1 <= k <= n, got k=.* and n=5"):
            check_k(bad, 5)
    with pytest.raises(ValueError, match="size"):
        check_k(3, 2, name="size")
    with pytest.raises(ValueError, match="k"):
        check_k(2.5, 5)


def test_check_feasible_is_a_value_check():
    ok = torch.tensor([1.0, 0.0])
    check_feasible(ok, 2)
    bad = torch.tensor([1.0, -math.inf])
    with pytest.raises(ValueError, match="logits has a row with fewer than k=3"):
        check_feasible(bad, 3, "logits")
    with perturb.settings(validate=False):
        check_feasible(bad, 3)                 # skipped while validation is off
    check_feasible(torch.empty(0), 3)          # nothing to check
