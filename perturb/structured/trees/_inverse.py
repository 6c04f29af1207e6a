r"""The inverse of a scaled Laplacian I − P̂ (a column diagonally dominant M-matrix), with its
log-determinant when asked: the one O(n³) step of the LU fast path (:mod:`._matrix_tree`) and
of the cycle reduction (:mod:`._elimination`).

Below :data:`BLOCK_MIN` nodes, and off the CPU, one LAPACK factorisation and solve. From it on,
on the CPU, recursively by 2 × 2 blocks, M = [[A, B], [C, D]] (halves), with X = −A⁻¹B,
Y = −CA⁻¹ and the Schur complement S = D + CX:

    M⁻¹ = [[A⁻¹ + X S⁻¹ Y, X S⁻¹], [S⁻¹ Y, S⁻¹]],     det M = det A · det S.

Why: LAPACK's triangular solves against the n columns of the identity run at about a third of
the speed of a matrix product on one CPU thread, and here three quarters of the same 2n³ flops
are matrix products (64 matrices of 128 nodes, MKL, one thread: 23 ms instead of 27 ms; no gain
at 64 nodes, hence the threshold; GPUs are not measured, so they keep the single call).

Accuracy: A and S are column diagonally dominant M-matrices too (a principal submatrix and a
Schur complement of one), and B, C <= 0. So A⁻¹, S⁻¹ >= 0 (LU without pivoting, subtraction-free
solves), X, Y >= 0, and every product and sum above has same-signed terms: the only
subtractions are on the diagonal of S, as in the pivots of LU. The error structure on which the
fast path's estimate rests (the inverse accurate entrywise up to O(eps) perturbations of the
pivots, entrywise nonnegative) is kept; the tests run both sizes against the log-space
elimination.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["BLOCK_MIN", "Inverse", "inverse", "lu_logdet"]

#: Matrices of this size or larger are inverted by 2 × 2 blocks on the CPU.
BLOCK_MIN = 96


class Inverse(NamedTuple):
    """``inv`` ``(*batch, n, n)``; ``singular`` ``(*batch)`` bool (a zero pivot somewhere);
    with ``det=True``, ``logabsdet`` log|det M| and ``negative`` (det M < 0) ``(*batch)``,
    else None."""
    inv: torch.Tensor
    singular: torch.Tensor
    logabsdet: torch.Tensor | None
    negative: torch.Tensor | None


def lu_logdet(LU: torch.Tensor, pivots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log|det|, det < 0) from ``torch.linalg.lu_factor_ex``'s factors: the sign is the parity
    of the row swaps times the signs of U's diagonal."""
    dU = torch.diagonal(LU, dim1=-2, dim2=-1)
    ar = torch.arange(1, LU.shape[-1] + 1, device=LU.device, dtype=pivots.dtype)
    negative = ((pivots != ar).sum(-1) + (dU < 0).sum(-1)) % 2 == 1
    return torch.log(dU.abs()).sum(-1), negative


def inverse(M: torch.Tensor, det: bool = False) -> Inverse:
    """M⁻¹ ``(*batch, n, n)`` of a scaled Laplacian (module docstring), with log|det M| and its
    sign when ``det``. O(n³); about 25 more dispatched ops per level of blocks."""
    n = M.shape[-1]
    if n < BLOCK_MIN or M.device.type != "cpu":
        if not det:
            G, info = torch.linalg.inv_ex(M)
            return Inverse(G, info != 0, None, None)
        LU, pivots, info = torch.linalg.lu_factor_ex(M)
        eye = torch.eye(n, dtype=M.dtype, device=M.device).expand_as(LU)
        return Inverse(torch.linalg.lu_solve(LU, pivots, eye), info != 0, *lu_logdet(LU, pivots))
    h = n // 2
    A, B, C, D = M[..., :h, :h], M[..., :h, h:], M[..., h:, :h], M[..., h:, h:]
    a = inverse(A, det)
    X = torch.matmul(a.inv, B).neg_()
    Y = torch.matmul(C, a.inv).neg_()
    s = inverse(torch.matmul(C, X).add_(D), det)
    G = torch.empty_like(M)
    G[..., :h, h:] = torch.matmul(X, s.inv)
    G[..., h:, :h] = torch.matmul(s.inv, Y)
    G[..., h:, h:] = s.inv
    G[..., :h, :h] = torch.matmul(G[..., :h, h:], Y).add_(a.inv)
    if a.logabsdet is None or s.logabsdet is None or a.negative is None or s.negative is None:
        return Inverse(G, a.singular | s.singular, None, None)
    return Inverse(G, a.singular | s.singular, a.logabsdet + s.logabsdet,
                   a.negative ^ s.negative)
