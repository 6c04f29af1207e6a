"""Shared scalar constants and log-space helpers (one definition each).

``log1mexp`` and ``logaddexp2`` here do not validate their inputs: they are the building
blocks behind public functions that do (e.g. :func:`perturb.boxes.log1mexp`).
"""
from __future__ import annotations

import math

import torch

#: The Euler–Mascheroni constant γ: the mean of a standard Gumbel, the shift of Gumbel volumes.
EULER_GAMMA = 0.57721566490153286061

_LOG2 = math.log(2.0)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − eˣ) for x ≤ 0, accurate on both sides of −log 2 (Mächler 2012): log(−expm1 x)
    near 0, log1p(−eˣ) below. Each branch sees only its own inputs, so the other branch's
    infinite gradient (at x = 0 or x = −inf) cannot turn into NaN."""
    near = x > -_LOG2
    safe = torch.full_like(x, -1.0)
    return torch.where(near, torch.log(-torch.expm1(torch.where(near, x, safe))),
                       torch.log1p(-torch.exp(torch.where(near, safe, x))))


def logaddexp2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(eᵃ + eᵇ) as max(a, b) + log1p(exp(−|a − b|)), twice differentiable without
    overflow: no exponential of a positive number is formed, so second derivatives stay finite
    at any gap (``torch.logaddexp``'s double backward overflows at gaps ~ 1e100)."""
    return torch.maximum(a, b) + torch.log1p(torch.exp(-(a - b).abs()))
