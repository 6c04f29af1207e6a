"""Shared scalar constants and log-space helpers (one definition each).

``log1mexp`` and ``logaddexp2`` here do not validate their inputs: they are the building
blocks behind public functions that do (e.g. :func:`perturb.boxes.log1mexp`).
"""
from __future__ import annotations

import math
from typing import overload

import torch
import torch.nn.functional as F

#: The Euler–Mascheroni constant γ: the mean of a standard Gumbel, the shift of Gumbel volumes.
EULER_GAMMA = 0.57721566490153286061

_LOG2 = math.log(2.0)


def exp_floor(dtype: torch.dtype) -> float:
    """1 + the log of the smallest normal float of ``dtype`` (float32: −86.3, float64: −707.4;
    −inf for other dtypes): above it eˣ is a normal float (with a margin for rounding)."""
    if dtype in (torch.float32, torch.float64):
        return math.log(torch.finfo(dtype).tiny) + 1.0
    return -math.inf


def denormals_flushed() -> bool:
    """Whether this thread flushes subnormal floats to zero now (``torch.set_flush_denormal``
    has no getter: 2e-39, subnormal in float32, reads back as 0 exactly when flushing)."""
    return torch.tensor([1e-39]).mul_(2).item() == 0.0


def _normal_cut(dtype: torch.dtype) -> float:
    """e·finfo.tiny (slightly above): the smallest value :func:`exp_floored` keeps."""
    return math.exp(exp_floor(dtype)) * (1.0 + 1e-5)


def exp_floored(x: torch.Tensor) -> torch.Tensor:
    """eˣ, with 0 where it is below e·``finfo.tiny`` (x below :func:`exp_floor`: 3.2e-38 in
    float32), as flush-to-zero arithmetic gives for subnormal results; gradient 0 there.

    Why: on x86 CPUs ``torch.exp`` of an input whose result underflows (or overflows) leaves
    the vectorised kernel and runs ~50× slower (measured: 51,200 float32 values, 7.5 µs in
    range, 260–870 µs at x = −90 … −1e4), and box losses are full of such exponents
    (far-apart corners, tiny δ, log P ≪ 0). The zeroing is a ``threshold``, not a
    ``torch.where``, which is not vectorised on the CPU (~80 µs for the same 51,200 values).
    """
    floor = exp_floor(x.dtype)
    if floor == -math.inf:
        return torch.exp(x)
    # values at the floor (x clamped) fall at or below the cut: 0
    return F.threshold(torch.exp(x.clamp(min=floor)), _normal_cut(x.dtype), 0.0)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − eˣ) for x ≤ 0, accurate on both sides of −log 2 (Mächler 2012): log(−expm1 x)
    near 0, log1p(−eˣ) below. Each branch sees only its own inputs, so the other branch's
    infinite gradient (at x = 0 or x = −inf) cannot turn into NaN."""
    near = x > -_LOG2
    safe = torch.full_like(x, -1.0)
    return torch.where(near, torch.log(-torch.expm1(torch.where(near, x, safe))),
                       torch.log1p(-exp_floored(torch.where(near, safe, x))))


def logaddexp2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(eᵃ + eᵇ) as max(a, b) + log1p(exp(−|a − b|)), twice differentiable without
    overflow: no exponential of a positive number is formed, so second derivatives stay finite
    at any gap (``torch.logaddexp``'s double backward overflows at gaps ~ 1e100)."""
    return torch.maximum(a, b) + torch.log1p(exp_floored(-(a - b).abs()))


def nan_to_(x: torch.Tensor, value: float) -> torch.Tensor:
    """``x`` with its NaNs replaced by ``value``, in place; ±inf kept (``nan_to_num_`` alone
    would turn them into ±finfo.max). For the NaNs of ∞ − ∞ in formulas that have a limit
    there."""
    return x.nan_to_num_(nan=value, posinf=math.inf, neginf=-math.inf)


@overload
def log_expm1(x: float) -> float: ...


@overload
def log_expm1(x: torch.Tensor) -> torch.Tensor: ...


def log_expm1(x: float | torch.Tensor) -> float | torch.Tensor:
    """log(eˣ − 1) for x > 0 (the inverse of softplus), as x + log(1 − e⁻ˣ): no overflow for
    large x (eˣ − 1 is inf beyond 709 in float64), and accurate near 0 (1 − e⁻ˣ by expm1).
    Numbers give numbers (``math``), tensors tensors; −inf at x = 0."""
    if isinstance(x, torch.Tensor):
        return x + torch.log(-torch.expm1(-x))
    return x + math.log(-math.expm1(-x)) if x > 0 else -math.inf
