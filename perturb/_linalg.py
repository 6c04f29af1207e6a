"""LU-based ``torch.linalg`` calls that stay correct where torch's batched CPU LU is not.

torch 2.13's CPU build (oneMKL 2024.2, OpenMP) factors a *batch* of matrices wrongly once
``torch.set_num_threads`` has been called with more than one thread (any value, even the
default) and the matrices have more than about 150 rows: ``lu_factor`` returns pivots of 0
("Parameter 6 was incorrect on entry to DLASWP"), ``inv``/``solve`` raise or return wrong
matrices, ``slogdet``/``det`` return log-determinants off by 1e-2 relative with no error, and
some sizes hang. One matrix at a time is correct at every size, and Cholesky, QR, SVD, ``eigh``,
``lstsq`` and triangular solves are correct batched (measured at 130–1000 rows, float32 and
float64). The wrappers below therefore factor one matrix at a time on the CPU when the batch
holds several matrices of more than :data:`LU_BATCH_MAX` rows and torch uses several threads;
everywhere else they are the ``torch.linalg`` call itself. The loop is over O(n³) factorisations
of n > 128, so its Python overhead (about 10 µs a matrix) is below 1 % of the work.

Autograd goes through each per-matrix call (their backwards are per matrix too).

Inside a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``) a vmapped batch is hidden from
the shapes these functions see, and torch's batching rule would call the defective batched LU
(measured: ``vmap`` of ``torch.linalg.solve_ex`` over four 200 × 200 matrices hangs on two
threads). There, in the same regime (CPU, more than :data:`LU_BATCH_MAX` rows, several
threads), the wrappers factor by Householder QR instead (``torch.linalg.qr``, correct batched):
X = R⁻¹QᵀB by a triangular solve, log|det A| = Σ log|R_ii| and the sign from the count of
reflectors (``torch.geqrf``) and the signs of R's diagonal. QR is backward stable like LU with
partial pivoting and costs about twice its flops; it is differentiable (``torch.func`` and
autograd) through ``qr`` and ``solve_triangular``. ``info`` there is 1 where R has a zero on its
diagonal; ``solve`` does not raise for a singular matrix (its result is then inf or NaN).
"""
from __future__ import annotations

from typing import Callable

import torch

from perturb._validation import unreadable

__all__ = ["LU_BATCH_MAX", "batched_lu_unsafe", "hidden_batch_unsafe", "inv_ex", "slogdet",
           "solve", "solve_ex"]

#: Largest matrix size at which a batched CPU LU is trusted with several threads (the defect
#: appears between 150 and 160 rows; the margin covers other builds).
LU_BATCH_MAX = 128


def _defect_regime(A: torch.Tensor) -> bool:
    """Whether a batched LU of matrices like ``A`` may be wrong: on the CPU, more than
    :data:`LU_BATCH_MAX` rows, several threads (see the module)."""
    return (A.device.type == "cpu" and A.shape[-1] > LU_BATCH_MAX
            and torch.get_num_threads() >= 2)


def batched_lu_unsafe(A: torch.Tensor, *rest: torch.Tensor) -> bool:
    """Whether torch's batched LU of ``A`` ``(*batch, n, n)`` may be wrong (see the module);
    ``rest``: right-hand sides, whose batch dimensions broadcast with ``A``'s."""
    return _defect_regime(A) and torch.broadcast_shapes(
        A.shape[:-2], *(r.shape[:-2] for r in rest)).numel() > 1


def _per_matrix(fn: Callable[..., tuple[torch.Tensor, ...]], A: torch.Tensor,
                *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``fn`` applied to each matrix of ``A`` (and the matching slices of ``rest``, whose
    batch dimensions broadcast with ``A``'s), the results stacked back to the batch shape."""
    batch = torch.broadcast_shapes(A.shape[:-2], *(r.shape[:-2] for r in rest))
    flat = [t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:]) for t in (A, *rest)]
    outs = [fn(*(t[i] for t in flat)) for i in range(flat[0].shape[0])]
    return tuple(torch.stack(parts).reshape(*batch, *parts[0].shape) for parts in zip(*outs))


def hidden_batch_unsafe(A: torch.Tensor, *rest: torch.Tensor) -> bool:
    """Whether ``A`` (or a right-hand side) lives inside a ``torch.func`` transform, where a
    vmapped batch that the shapes do not show would reach torch's batched LU, in the regime
    where that LU may be wrong (see the module)."""
    return _defect_regime(A) and any(unreadable(t) for t in (A, *rest))


def _lu_call(fn: Callable[..., tuple[torch.Tensor, ...]],
             by_qr: Callable[..., tuple[torch.Tensor, ...]], A: torch.Tensor,
             *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``fn(A, *rest)``: by QR (``by_qr``) inside a torch.func transform and one matrix at a
    time in a visible batch where torch's batched LU may be wrong; else torch's call."""
    if hidden_batch_unsafe(A, *rest):
        return by_qr(A, *rest)
    if batched_lu_unsafe(A, *rest):
        return _per_matrix(fn, A, *rest)
    return tuple(fn(A, *rest))


def _qr_solve_ex(A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(X, info) with A X = B by Householder QR: X = R⁻¹QᵀB; info 1 where R (and so A) is
    singular."""
    Q, R = torch.linalg.qr(A)
    X = torch.linalg.solve_triangular(R, Q.mT @ B, upper=True)
    info = (R.diagonal(dim1=-2, dim2=-1) == 0).any(-1).to(torch.int32)
    return X, info


def _qr_slogdet(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sign, log|det A|) by Householder QR: det A = det Q · Π R_ii, det Q = (−1)^k for k
    reflectors that are not the identity (τ ≠ 0; the sign needs no gradient)."""
    R = torch.linalg.qr(A).R        # mode="r" has no derivative
    d = R.diagonal(dim1=-2, dim2=-1)
    with torch.no_grad():
        _, tau = torch.geqrf(A.detach())
        flips = (tau != 0).sum(-1) % 2 == 1
        sign = torch.where(flips, -1.0, 1.0).to(A.dtype) * torch.sign(d.detach()).prod(-1)
    return sign, torch.log(d.abs()).sum(-1)


def _qr_inv_ex(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(A⁻¹, info) by :func:`_qr_solve_ex` against the identity."""
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    return _qr_solve_ex(A, eye.expand_as(A))


def inv_ex(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.inv_ex(A)``: (inverse, info), ``info != 0`` where ``A`` is singular."""
    inv, info = _lu_call(torch.linalg.inv_ex, _qr_inv_ex, A)
    return inv, info


def slogdet(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.slogdet(A)``: (sign, log|det A|)."""
    sign, logabsdet = _lu_call(torch.linalg.slogdet, _qr_slogdet, A)
    return sign, logabsdet


def solve(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.solve(A, B)`` for a matrix right-hand side ``B`` ``(*batch, n, k)``
    (raises where ``A`` is singular, as torch's; by QR inside a torch.func transform, where
    a singular ``A`` gives inf or NaN instead)."""
    return _lu_call(lambda a, b: (torch.linalg.solve(a, b),), _qr_solve_ex, A, B)[0]


def solve_ex(A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.solve_ex(A, B)`` for a matrix right-hand side: (solution, info)."""
    X, info = _lu_call(torch.linalg.solve_ex, _qr_solve_ex, A, B)
    return X, info
