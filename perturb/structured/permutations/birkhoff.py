r"""Permutations and the Birkhoff polytope: the structure, exact matching, registered solvers.

Z is the set of n x n permutation matrices; conv Z is the Birkhoff polytope of doubly stochastic
matrices. The exact argmax is the maximum-weight perfect matching, solved by the Hungarian
algorithm (:func:`matching`); the Entropy relaxation is Sinkhorn
(:func:`perturb.structured.permutations.matrix_scaling.sinkhorn`), its τ → 0 limit the matching.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from perturb._validation import check_int, check_scores
from perturb.regularizers import Entropy, ExpFamilyEntropy, Regularizer
from perturb.structured.permutations.matrix_scaling import SINKHORN_BACKWARD, _check_tol, sinkhorn
from perturb.structures import Structure, register_solver, register_unsupported

__all__ = ["Permutations", "matching"]


# --------------------------------------------------------------------------------------------
# exact matching
# --------------------------------------------------------------------------------------------

def matching(w: torch.Tensor) -> torch.Tensor:
    r"""Exact maximum-weight matching: the permutation matrix maximising Σ_i w[i, π(i)].

    Solved by scipy's ``linear_sum_assignment`` (Jonker–Volgenant / Hungarian, O(n³)) on the CPU,
    one problem at a time: a Python loop over the batch is used because this is an exact
    combinatorial solver with no batched torch equivalent. The result is moved back to ``w``'s
    device and dtype. Not differentiable (piecewise constant); use :func:`sinkhorn` or
    ``relax(..., structure=Permutations(), hard=True)`` for gradients.

    Args:
        w: scores (log-potentials) ``w[..., i, j]`` of assigning row i to column j. Rectangular
            inputs are allowed: every row of the smaller side is matched.

    Shape:
        ``(*batch, n, m)`` -> ``(*batch, n, m)`` with min(n, m) ones, at most one per row and
        column.

    Returns:
        A 0/1 tensor; for square inputs a permutation matrix P with P[i, π(i)] = 1.

    Raises:
        ValueError: not a floating tensor, fewer than 2 dims, NaN or infinite scores.

    Example::

        >>> matching(torch.tensor([[0., 1.], [1., 0.]]))
        tensor([[0., 1.],
                [1., 0.]])
    """
    from scipy.optimize import linear_sum_assignment  # imported on first use: ~0.25 s

    check_scores(w, "w", min_ndim=2)
    n, m = w.shape[-2:]
    flat = w.detach().reshape(-1, n, m).to("cpu", torch.float64).numpy()
    cols = np.empty((flat.shape[0], min(n, m)), dtype=np.int64)
    rows = np.empty_like(cols)
    for k, cost in enumerate(flat):
        r, c = linear_sum_assignment(cost, maximize=True)
        rows[k], cols[k] = r, c
    out = torch.zeros(flat.shape[0], n, m, dtype=w.dtype)
    batch_idx = torch.arange(flat.shape[0]).unsqueeze(-1).expand(-1, rows.shape[1])
    out[batch_idx, torch.from_numpy(rows), torch.from_numpy(cols)] = 1.0
    return out.reshape(w.shape).to(w.device)


# --------------------------------------------------------------------------------------------
# the structure
# --------------------------------------------------------------------------------------------

class Permutations(Structure):
    r"""n x n permutation matrices; conv Z is the Birkhoff polytope (doubly stochastic matrices).

    ``argmax`` is the exact maximum-weight matching (:func:`matching`); the registered solvers
    are Sinkhorn for :class:`~perturb.Entropy` (backward ``"implicit"`` or ``"unroll"``);
    :class:`~perturb.ExpFamilyEntropy` is registered as unsupported (its marginals need the
    permanent, #P-hard).

    Args:
        n_iters: iteration cap for the registered Sinkhorn solver (used by
            ``regularized_argmax``/``relax``; :func:`sinkhorn` takes its own).
        tol: marginal-error tolerance for the registered solver.

    Shape: scores ``(*batch, n, n)``; vertices ``(*batch, n, n)``.

    Example::

        >>> from perturb import relax
        >>> theta = torch.randn(3, 5, 5, requires_grad=True)
        >>> P = relax(theta, structure=Permutations(), tau=0.1, hard=True)
        >>> bool(Permutations().check(P).all())
        True
    """

    event_dim = 2
    square = True

    def __init__(self, n_iters: int = 1000, tol: float = 1e-6):
        self.n_iters = check_int(n_iters, "n_iters", low=1)
        self.tol = _check_tol(tol)

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        return matching(w)

    def check(self, y: torch.Tensor) -> torch.Tensor:
        if y.ndim < 2 or y.shape[-1] != y.shape[-2]:
            return torch.zeros(y.shape[:-2] if y.ndim >= 2 else (), dtype=torch.bool,
                               device=y.device)
        binary = ((y == 0) | (y == 1)).all(-1).all(-1)
        return binary & (y.sum(-1) == 1).all(-1) & (y.sum(-2) == 1).all(-1)

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """All n! permutation matrices ``(n!, n, n)``, in lexicographic order of π."""
        n = check_int(n, "n", low=1, high=9)
        eye = torch.eye(n, dtype=dtype, device=device)
        perms = torch.tensor(list(itertools.permutations(range(n))), device=device)
        return eye[perms]

    def default_regularizer(self) -> Regularizer:
        return Entropy()

    def __repr__(self) -> str:
        args = []
        if self.n_iters != 1000:
            args.append(f"n_iters={self.n_iters}")
        if self.tol != 1e-6:
            args.append(f"tol={self.tol}")
        return f"Permutations({', '.join(args)})"


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

@register_solver(Permutations, Entropy, backward=SINKHORN_BACKWARD,
                 description="Sinkhorn (log domain), temperature tau")
def _solve_permutations_entropy(w, structure, regularizer, tau, backward):
    return sinkhorn(w, tau=tau, n_iters=structure.n_iters, tol=structure.tol, backward=backward)


register_unsupported(
    Permutations, ExpFamilyEntropy,
    reason="the marginals E_{q(P|w)}[P] of the Gibbs distribution over permutations are ratios of "
           "matrix permanents, which are #P-hard to compute; use Entropy() (Sinkhorn, the "
           "entropic relaxation of the Birkhoff polytope) instead")
