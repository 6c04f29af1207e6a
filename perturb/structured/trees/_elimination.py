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
last fallback of the fast path in :mod:`perturb.structured._matrix_tree` and the independent
``"unroll"`` reference. The first fallback, :func:`reduced_log_partition` below, applies it
only to one node per cycle of the best-parent graph after eliminating all other nodes by one
(well-conditioned, subtraction-free) LU.

References:
    Grassmann, Taksar & Heyman, "Regenerative analysis and steady state distributions for
    Markov chains", Operations Research 33(5), 1985.
"""
from __future__ import annotations

import torch

from perturb._math import logaddexp2

__all__: list[str] = []


#: Stands in for log 0. A finite value keeps torch.logaddexp and its first and second
#: derivatives free of NaN (−inf − (−inf)); it is far below any score divided by any τ.
_NEG = -1e100


class _LogOfPositive(torch.autograd.Function):
    """log w for w > 0 whose backward is ḡ·exp(−log w), itself differentiable through the saved
    output. Plain ``torch.log`` forms −ḡ/w² in its double backward, which overflows (inf·0 =
    NaN) for the denormal-small reduced weights that peaked scores produce, although every
    product along the chain is finite."""

    @staticmethod
    def forward(w: torch.Tensor) -> torch.Tensor:
        return torch.log(w)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return g * torch.exp(-out)


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
        X = (torch.logaddexp if once else logaddexp2)(X[..., :k, :k], update)
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


# --------------------------------------------------------------------------------------------
# the reduction to the cycles of the best-parent graph
# --------------------------------------------------------------------------------------------

def cycle_representatives(P: torch.Tensor, nodes: torch.Tensor | None, root: int
                          ) -> torch.Tensor:
    """One node per cycle of the best-parent graph, ``(*batch, n)`` boolean.

    The best parent of j is argmax_i P_ij (ties: the lowest index); the root and absent nodes
    point to the root. A node lies on a cycle iff it is in the image of parent^(2^k) for
    2^k >= n; the representative of a cycle is its lowest index. Pointer doubling: ⌈log₂ n⌉ + 1
    rounds of gathers, no host synchronisation.
    """
    n = P.shape[-1]
    par = P.argmax(dim=-2)
    par[..., root] = root
    if nodes is not None:
        par = torch.where(nodes, par, torch.full_like(par, root))
    idx = torch.arange(n, device=P.device).expand_as(par)
    low, anc = idx, par
    for _ in range(max(1, (n - 1).bit_length()) + 1):
        low = torch.minimum(low, low.gather(-1, anc))
        anc = anc.gather(-1, anc)
    on_cycle = torch.zeros_like(par, dtype=torch.bool).scatter_(-1, anc, True)
    on_cycle[..., root] = False
    return on_cycle & (low == idx)


def _column_softmax_differentiable(s: torch.Tensor, valid: torch.Tensor):
    """(P, c): P_ij = exp(s_ij − c_j) on allowed edges (0 elsewhere), c_j = logsumexp_i s_ij
    (0 for columns without allowed edges); differentiable, NaN-free gradients (``s`` finite)."""
    has = valid.any(dim=-2, keepdim=True)
    x = torch.where(valid | ~has, s, torch.full_like(s, -torch.inf))
    c = torch.logsumexp(x, dim=-2, keepdim=True)
    P = torch.where(valid, torch.exp(s - c), torch.zeros_like(s))
    return P, torch.where(has, c, torch.zeros_like(c)).squeeze(-2)


def reduction_order(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None,
                    root: int) -> tuple[torch.Tensor, int]:
    """(order, m): a node permutation per graph with the root first, then the nodes to be
    eliminated by LU (every node but the cycle representatives), then the m kept ones (the
    representatives; graphs with fewer than m get ordinary nodes added). One host read (m)."""
    n = s.shape[-1]
    with torch.no_grad():
        P, _ = _column_softmax_differentiable(s.detach(), valid)
        reps = cycle_representatives(P, nodes, root)
        m = int(reps.sum(-1).max()) if reps.numel() else 0
        key = reps.to(torch.long) * n + torch.arange(n, device=s.device)
        key[..., root] = -1
        order = key.argsort(dim=-1)
    return order, m


def reduced_log_partition(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None,
                          root: int, order: torch.Tensor, m: int, once: bool = False
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""(log Z, error estimate) by eliminating every node but the cycle representatives
    exactly (one LU), then the representatives by log-space elimination.

    With the column softmax P (log Z = Σ_j c_j + log det(I − P̂)) and the nodes split into K
    (eliminated) and J (the m kept, one per cycle of the best-parent graph),

        det(I − P̂) = det(I − P_KK) · det L'_JJ,
        W'_RJ = P_RJ + P_RK (I − P_KK)⁻¹ P_KJ,      R = J ∪ {root},

    where W' are the edge weights of the Kron-reduced graph on R (L' its Laplacian, the
    diagonal recomputed from the weights by the log-space elimination). Every cycle of
    best parents has a node in J, so from any node of K the walk to its parents leaves K
    after a few steps: I − P_KK is a well-conditioned M-matrix, column diagonally dominant
    (partial pivoting does not pivot), its LU factors and the solve with the nonnegative
    P_KJ are subtraction-free, and W' (a sum of nonnegative terms) is accurate entrywise,
    including its tiny exits from near-closed cycles. The error estimate is
    4·max(n, 8)·eps·‖(I − P_KK)⁻¹‖₁ (relative error of the reduced weights).

    Differentiable (twice, with ``once=False``) by autograd. O(n³) + O(m) sequential steps.
    """
    n = s.shape[-1]
    P, c = _column_softmax_differentiable(s, valid)
    inner = torch.ones(s.shape[:-1], dtype=torch.bool, device=s.device)
    if nodes is not None:
        inner = inner & nodes
    inner[..., root] = False
    logz = (c * inner.to(c.dtype)).sum(-1)
    rows = order.unsqueeze(-1).expand(*order.shape, n)
    Pp = P.gather(-2, rows).gather(-1, order.unsqueeze(-2).expand(*order.shape[:-1], n, n))
    nk = n - 1 - m
    K = slice(1, 1 + nk)
    J = slice(1 + nk, n)
    eye = torch.eye(nk, dtype=s.dtype, device=s.device)
    A = eye - Pp[..., K, K]
    Ainv, info = torch.linalg.inv_ex(A)
    sign, logdet = torch.linalg.slogdet(A)
    logz = logz + logdet
    est = 4 * max(n, 8) * torch.finfo(s.dtype).eps * Ainv.detach().abs().sum(-2).amax(-1)
    est = torch.where((sign > 0) & (info == 0), est, torch.full_like(est, torch.inf))
    if m > 0:
        R = torch.cat([Pp[..., :1, :], Pp[..., J, :]], dim=-2)    # rows: root, then J
        W = R[..., :, J] + R[..., :, K] @ (Ainv @ Pp[..., K, J])
        Wr = torch.cat([torch.zeros_like(W[..., :1]), W], dim=-1)  # column 0: the root
        vr = (Wr > 0) & ~torch.eye(m + 1, dtype=torch.bool, device=s.device)
        sr = _LogOfPositive.apply(torch.where(vr, Wr, torch.ones_like(Wr)))
        logz = logz + elimination_log_partition(sr, vr, None, 0, once=once)
    return logz, est


def reduced_marginals(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None,
                      root: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(μ, log Z, error estimate) by autograd through :func:`reduced_log_partition`
    (detached)."""
    order, m = reduction_order(s, valid, nodes, root)
    with torch.enable_grad():
        x = s.detach().requires_grad_(True)
        logz, est = reduced_log_partition(x, valid, nodes, root, order, m, once=True)
        (mu,) = torch.autograd.grad(logz.sum(), x)
    return mu, logz.detach(), est


def reduced_marginals_vjp(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None,
                          root: int, grad: torch.Tensor) -> torch.Tensor:
    """Σ_ij ḡ_ij ∂μ_ij/∂s through :func:`reduced_log_partition` (double backward)."""
    order, m = reduction_order(s, valid, nodes, root)
    with torch.enable_grad():
        x = s.detach().requires_grad_(True)
        logz, _ = reduced_log_partition(x, valid, nodes, root, order, m)
        (mu,) = torch.autograd.grad(logz.sum(), x, create_graph=True)
        (out,) = torch.autograd.grad(mu, x, grad.to(mu.dtype))
    return out
