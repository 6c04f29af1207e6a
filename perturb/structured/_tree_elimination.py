r"""Log-space elimination for the matrix-tree theorem: a log-partition that never cancels.

The determinant of the reduced Laplacian is the product of the pivots of Gaussian elimination.
Eliminating a non-root node k from a directed Laplacian (rows: every node including the root;
columns: the non-root nodes) leaves again a Laplacian (columns sum to zero) whose edge weights
are

    W'_ij = W_ij + W_ik W_kj / d_k,     d_k = Σ_{i≠k} W_ik   (the pivot: k's in-weight),

(Grassmann, Taksar & Heyman 1985 for Markov chains; Kron reduction for graphs). The pivot is a
sum of positive terms instead of the difference L_kk − Σ L_ik L_kj / L_kk that plain LU forms,
so every quantity is a sum of positive numbers and can be carried in log space:

    log W'_ij = logaddexp(log W_ij, log W_ik + log W_kj − log d_k),   log Z = Σ_k log d_k.

This gives log Z to full relative accuracy for any score scale (±1e4, τ = 1e-3), and autograd
through it gives the marginals μ = ∇ log Z, whose backward passes are the softmax-like weights
of the log-sum-exps. The price: O(n³) transcendental functions in a Python loop over n steps
(about 10–50× slower than an LU factorisation), and O(n³) memory when differentiated. It is the
fallback of the fast path in :mod:`perturb.structured._matrix_tree` for the batch elements whose
LU-based marginals fail their a-posteriori check, and the independent ``"unroll"`` reference.

References:
    Grassmann, Taksar & Heyman, "Regenerative analysis and steady state distributions for
    Markov chains", Operations Research 33(5), 1985.
"""
from __future__ import annotations

import torch

__all__: list[str] = []


#: Stands in for log 0. A finite value keeps torch.logaddexp and its first and second
#: derivatives free of NaN (−inf − (−inf)); it is far below any score divided by any τ.
_NEG = -1e100


def _logaddexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """max(a, b) + log1p(exp(−|a − b|)): no exponential ever overflows, so the first and second
    derivatives stay finite (``torch.logaddexp``'s double backward overflows at gaps ~ 1e100)."""
    return torch.maximum(a, b) + torch.log1p(torch.exp(-(a - b).abs()))


def elimination_log_partition(s: torch.Tensor, valid: torch.Tensor,
                              nodes: torch.Tensor | None, root: int,
                              once: bool = False) -> torch.Tensor:
    """log Z of the arborescences rooted at ``root`` by log-space elimination (module docstring).

    Args:
        s: log-potentials ``(*batch, n, n)`` (``s[..., i, j]`` scores i → j), float64
            recommended; differentiable (twice) by autograd.
        valid: allowed edges ``(*batch, n, n)`` (no loops, nothing into the root).
        nodes: existing nodes ``(*batch, n)`` or None; absent nodes contribute nothing.
        root: the root.
        once: the result will be differentiated at most once: use the fused
            ``torch.logaddexp`` (one kernel forward and backward instead of six; its first
            derivative is exact at any gap, only its second overflows).

    Returns:
        ``(*batch)``; −inf where some existing node cannot be reached from the root.
    """
    n = s.shape[-1]
    perm = torch.tensor([root] + [i for i in range(n) if i != root], device=s.device)
    X = torch.where(valid, s, torch.full_like(s, _NEG))
    X = X.index_select(-2, perm).index_select(-1, perm)
    exists = None if nodes is None else nodes.index_select(-1, perm)
    logz = torch.zeros(s.shape[:-2], dtype=s.dtype, device=s.device)
    for k in range(n - 1, 0, -1):
        logd = torch.logsumexp(X[..., :, k], dim=-1)   # the pivot: k's in-weight
        if exists is not None:
            logd = torch.where(exists[..., k], logd, torch.zeros_like(logd))
        logz = logz + logd
        update = (X[..., :k, k:k + 1] - logd[..., None, None]) + X[..., k:k + 1, :k]
        X = (torch.logaddexp if once else _logaddexp)(X[..., :k, :k], update)
        X.diagonal(dim1=-2, dim2=-1).fill_(_NEG)  # no self-loops
    return torch.where(logz < 0.5 * _NEG, torch.full_like(logz, -torch.inf), logz)


def elimination_marginals(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None,
                          root: int, create_graph: bool = False
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ, log Z) with μ = ∇_s log Z by autograd through :func:`elimination_log_partition`.

    With ``create_graph=True`` and ``s.requires_grad`` μ is differentiable in ``s`` (double
    backward through the elimination); otherwise both are detached.
    """
    with torch.enable_grad():
        x = s if (create_graph and s.requires_grad) else s.detach().requires_grad_(True)
        logz = elimination_log_partition(x, valid, nodes, root, once=not create_graph)
        (mu,) = torch.autograd.grad(logz.sum(), x, create_graph=create_graph)
    return mu, (logz if create_graph else logz.detach())


def elimination_marginals_vjp(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None,
                              root: int, grad: torch.Tensor) -> torch.Tensor:
    """Σ_ij ḡ_ij ∂μ_ij/∂s (a Hessian–vector product of log Z) through the elimination."""
    with torch.enable_grad():
        x = s.detach().requires_grad_(True)
        logz = elimination_log_partition(x, valid, nodes, root)
        (mu,) = torch.autograd.grad(logz.sum(), x, create_graph=True)
        (out,) = torch.autograd.grad(mu, x, grad.to(mu.dtype))
    return out
