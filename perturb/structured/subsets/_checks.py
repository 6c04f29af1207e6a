"""Argument checks of the k-subset family, shared by its solvers and its distributions
(private module: the names here are the family's internal API, see ARCHITECTURE.md)."""
from __future__ import annotations

import math

import torch

from perturb._validation import check_int, check_value, validation_enabled

__all__ = ["check_k", "check_feasible"]


def check_k(k: int, n: int, name: str = "k") -> int:
    """1 <= k <= n, else ValueError naming k and n; returns k as an int."""
    k = check_int(k, name)
    if not 1 <= k <= n:
        raise ValueError(f"{name} must satisfy 1 <= {name} <= n, got {name}={k} and n={n} "
                         f"(the size of the last dim of the scores)")
    return k


def check_feasible(kth: torch.Tensor, k: int, name: str = "w") -> None:
    """Each row needs ≥ k unmasked scores, i.e. a finite k-th largest entry ``kth``.

    A value check (runs while validation is on): a ValueError on CPU, a device-side assert on
    CUDA (see :mod:`perturb._validation`)."""
    if validation_enabled() and kth.numel():
        check_value((kth > -math.inf).all(),
                    f"{name} has a row with fewer than k={k} entries > -inf: no k-subset has "
                    f"positive probability")
