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

Autograd goes through each per-matrix call (their backwards are per matrix too). Under
``torch.func.vmap`` the batch is hidden from these functions, and torch's batched call is used.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["LU_BATCH_MAX", "batched_lu_unsafe", "inv_ex", "slogdet", "solve", "solve_ex"]

#: Largest matrix size at which a batched CPU LU is trusted with several threads (the defect
#: appears between 150 and 160 rows; the margin covers other builds).
LU_BATCH_MAX = 128


def batched_lu_unsafe(A: torch.Tensor, *rest: torch.Tensor) -> bool:
    """Whether torch's batched LU of ``A`` ``(*batch, n, n)`` may be wrong (see the module);
    ``rest``: right-hand sides, whose batch dimensions broadcast with ``A``'s."""
    if A.device.type != "cpu" or A.shape[-1] <= LU_BATCH_MAX or torch.get_num_threads() < 2:
        return False
    return torch.broadcast_shapes(A.shape[:-2], *(r.shape[:-2] for r in rest)).numel() > 1


def _per_matrix(fn: Callable[..., tuple[torch.Tensor, ...]], A: torch.Tensor,
                *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``fn`` applied to each matrix of ``A`` (and the matching slices of ``rest``, whose
    batch dimensions broadcast with ``A``'s), the results stacked back to the batch shape."""
    batch = torch.broadcast_shapes(A.shape[:-2], *(r.shape[:-2] for r in rest))
    flat = [t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:]) for t in (A, *rest)]
    outs = [fn(*(t[i] for t in flat)) for i in range(flat[0].shape[0])]
    return tuple(torch.stack(parts).reshape(*batch, *parts[0].shape) for parts in zip(*outs))


def _lu_call(fn: Callable[..., tuple[torch.Tensor, ...]], A: torch.Tensor,
             *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``fn(A, *rest)``, one matrix at a time where torch's batched LU may be wrong."""
    if batched_lu_unsafe(A, *rest):
        return _per_matrix(fn, A, *rest)
    return tuple(fn(A, *rest))


def inv_ex(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.inv_ex(A)``: (inverse, info), ``info != 0`` where ``A`` is singular."""
    inv, info = _lu_call(torch.linalg.inv_ex, A)
    return inv, info


def slogdet(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.slogdet(A)``: (sign, log|det A|)."""
    sign, logabsdet = _lu_call(torch.linalg.slogdet, A)
    return sign, logabsdet


def solve(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.solve(A, B)`` for a matrix right-hand side ``B`` ``(*batch, n, k)``
    (raises where ``A`` is singular, as torch's)."""
    return _lu_call(lambda a, b: (torch.linalg.solve(a, b),), A, B)[0]


def solve_ex(A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.solve_ex(A, B)`` for a matrix right-hand side: (solution, info)."""
    X, info = _lu_call(torch.linalg.solve_ex, A, B)
    return X, info
