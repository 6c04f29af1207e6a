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
last fallback of the fast path in :mod:`perturb.structured.trees.matrix_tree` and the independent
``"unroll"`` reference. The first fallback, the cycle reduction (:func:`reduced_log_partition`
below), keeps only one node per cycle of the best-parent graph after eliminating all other
nodes by one (well-conditioned, subtraction-free) LU. :func:`reduced_solve` and
:func:`reduced_vjp` compute its marginals and their vector–Jacobian product in closed form
(the reduced graph's few arborescences summed in log space; no autograd, no double
backward); autograd through :func:`reduced_log_partition` is their reference in the tests.

References:
    Grassmann, Taksar & Heyman, "Regenerative analysis and steady state distributions for
    Markov chains", Operations Research 33(5), 1985.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from perturb import _linalg
from perturb._math import logaddexp2
from perturb.structured.trees._inverse import inverse

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
    2^k >= n; the representative of a cycle is its lowest index. Pointer doubling: k rounds of
    gathers with 2^k >= n (every tail and every cycle has fewer than n nodes, so parent^(2^k)
    lies on a cycle and ``low`` has seen a whole cycle), no host synchronisation.
    """
    n = P.shape[-1]
    # torch.max(dim) returns the first maximal index like argmax, and is ~4x faster on CPU
    # for the strided reduction over dim −2
    par = P.max(dim=-2).indices
    par[..., root] = root
    if nodes is not None:
        par = torch.where(nodes, par, torch.full_like(par, root))
    idx = torch.arange(n, device=P.device).expand_as(par)
    low, anc = idx, par
    for _ in range(max(1, (n - 1).bit_length())):
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
    Ainv, info = _linalg.inv_ex(A)
    sign, logdet = _linalg.slogdet(A)
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
    (detached). The autograd reference of :func:`reduced_solve` (tests)."""
    order, m = reduction_order(s, valid, nodes, root)
    with torch.enable_grad():
        x = s.detach().requires_grad_(True)
        logz, est = reduced_log_partition(x, valid, nodes, root, order, m, once=True)
        (mu,) = torch.autograd.grad(logz.sum(), x)
    return mu, logz.detach(), est


def reduced_marginals_vjp(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None,
                          root: int, grad: torch.Tensor) -> torch.Tensor:
    """Σ_ij ḡ_ij ∂μ_ij/∂s through :func:`reduced_log_partition` (double backward). The
    autograd reference of :func:`reduced_vjp` (tests; about 750 dispatched ops for m ≈ 3)."""
    order, m = reduction_order(s, valid, nodes, root)
    with torch.enable_grad():
        x = s.detach().requires_grad_(True)
        logz, _ = reduced_log_partition(x, valid, nodes, root, order, m)
        (mu,) = torch.autograd.grad(logz.sum(), x, create_graph=True)
        (out,) = torch.autograd.grad(mu, x, grad.to(mu.dtype))
    return out


# --------------------------------------------------------------------------------------------
# the cycle reduction with explicit marginals and an analytic Hessian–vector product
# --------------------------------------------------------------------------------------------

#: Largest number m of kept nodes for which the reduced graph is summed by enumerating its
#: (m + 1)^(m − 1) arborescences (16 807 at m = 6: four products of a (b, 42) or (b, 16 807)
#: matrix with the 5.6 MB float64 incidence, ~2.5 ms for b = 14 on one CPU thread, against
#: ~1 250 dispatched ops for the elimination's double backward); larger m sums it by the
#: log-space elimination (autograd on the m + 1 nodes only).
_ENUM_MAX = 6


@functools.lru_cache(maxsize=None)
def _tree_incidence(m: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``(T, (m + 1)·m)`` 0/1: the T = (m + 1)^(m − 1) arborescences of the complete digraph on
    nodes 0..m rooted at 0; entry ``[t, r·m + q]`` is 1 iff node r is the parent of node q + 1
    in tree t. Built once per (m, dtype, device) by filtering all parent maps (pointer
    following m times reaches the root from every node iff there is no cycle)."""
    if m == 0:
        return torch.ones(1, 0, dtype=dtype, device=device)
    choices = torch.arange(m + 1)
    par = torch.cartesian_prod(*([choices] * m)).reshape(-1, m)   # par[:, q]: parent of q + 1
    par = par[(par != torch.arange(1, m + 1)).all(-1)]
    full = torch.cat([torch.zeros(len(par), 1, dtype=par.dtype), par], dim=1)
    anc = full
    for _ in range(m):
        anc = full.gather(1, anc)
    par = par[(anc == 0).all(-1)]
    E = torch.zeros(len(par), m + 1, m).scatter_(1, par.unsqueeze(1), 1.0)
    return E.flatten(1).to(dtype=dtype, device=device)


def _small_square(omega: torch.Tensor, vr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reduced graph's ``(b, m + 1, m)`` log-weights (columns: the kept nodes) as the
    square ``(b, m + 1, m + 1)`` input of :func:`elimination_log_partition` (root column 0)."""
    return (torch.cat([torch.full_like(omega[..., :1], _NEG), omega], dim=-1),
            torch.cat([torch.zeros_like(vr[..., :1]), vr], dim=-1))


def _small_marginals(omega: torch.Tensor, vr: torch.Tensor, E: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log Z', ν, p) of the reduced graph with log-weights ``omega`` ``(b, m + 1, m)``
    (``_NEG`` off ``vr``): with the tree incidence E, a log-sum-exp over the trees (p their
    probabilities, ν = pᵀE); without, autograd through the log-space elimination (p None).
    log Z' is −inf (or below ``_NEG``/2) when the reduced graph has no arborescence."""
    if E is not None:
        scores = omega.flatten(-2) @ E.mT
        lz = torch.logsumexp(scores, dim=-1)
        p = torch.exp(scores - lz.unsqueeze(-1))
        return lz, (p @ E).view_as(omega), p
    with torch.enable_grad():
        x = omega.detach().requires_grad_(True)
        sq, vsq = _small_square(x, vr)
        lz = elimination_log_partition(sq, vsq, None, 0, once=True)
        (nu,) = torch.autograd.grad(lz.sum(), x)
    return lz.detach(), nu, None


def _small_hvp(omega: torch.Tensor, vr: torch.Tensor, E: torch.Tensor | None,
               p: torch.Tensor | None, nu: torch.Tensor, od: torch.Tensor) -> torch.Tensor:
    """ν̇ = ∇²log Z'(ω) ω̇ of the reduced graph: the covariance of the tree indicators,
    Σ_T p_T 1_T (⟨1_T, ω̇⟩ − ⟨ν, ω̇⟩), with the tree incidence E; otherwise a double backward
    through the log-space elimination of its m + 1 nodes."""
    if E is not None:
        assert p is not None  # _small_marginals returns the tree probabilities with E
        t = od.flatten(-2) @ E.mT
        a = (nu * od).sum((-1, -2)).unsqueeze(-1)
        return ((p * (t - a)) @ E).view_as(nu)
    with torch.enable_grad():
        x = omega.detach().requires_grad_(True)
        sq, vsq = _small_square(x, vr)
        lz = elimination_log_partition(sq, vsq, None, 0)
        (g,) = torch.autograd.grad(lz.sum(), x, create_graph=True)
        (out,) = torch.autograd.grad(g, x, od)
    return out


class ReducedState(NamedTuple):
    """What :func:`reduced_vjp` needs from :func:`reduced_solve` (one entry per graph; n the
    nodes, m the kept ones, T the arborescences of the reduced graph).

    P ``(b, n, n)`` column softmax; Ainv = (I − P ⊙ kkᵀ)⁻¹ (identity outside K); kf ``(b, n)``
    the indicator of K; valid; jidx ``(b, m)`` the kept nodes J and ridx ``(b, m + 1)`` the
    rows R = (root, J); Vc ``(b, m, n)`` = Yᵀ + the indicator rows of J, Y = Ainv P_·J (rows
    in K); Wr ``(b, m + 1, m)`` the reduced weights, pos their usable entries, omega their logs
    (``_NEG`` off vr), E the tree incidence ``(T, (m + 1)·m)`` and p ``(b, T)`` the tree
    probabilities of the reduced graph (None when m > ``_ENUM_MAX``), nu ``(b, m + 1, m)`` its
    edge marginals; Lam ``(b, n, m)`` = ∂ log Z'/∂W' on the rows R;
    Urow ``(b, n, m)`` = Lam + Q, Q = Ainvᵀ P_K·ᵀ Lam (rows in K); Gbar ``(b, n, n)`` = ∂ log Z/∂P
    (up to the column constant); H = 1 + Gbar − 1ᵀ(P ⊙ Gbar), so that μ = P ⊙ H."""
    P: torch.Tensor
    Ainv: torch.Tensor
    kf: torch.Tensor
    valid: torch.Tensor
    jidx: torch.Tensor
    ridx: torch.Tensor
    Vc: torch.Tensor
    Wr: torch.Tensor
    pos: torch.Tensor
    omega: torch.Tensor
    vr: torch.Tensor
    E: torch.Tensor | None
    p: torch.Tensor | None
    nu: torch.Tensor
    Lam: torch.Tensor
    Urow: torch.Tensor
    Gbar: torch.Tensor
    H: torch.Tensor


def _kept_nodes(P: torch.Tensor, nodes: torch.Tensor | None, root: int
                ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(jidx ``(b, m)``, inner ``(b, n)``, m): the cycle representatives of every graph, padded
    to the batch maximum m with other existing non-root nodes (absent nodes only when a graph
    has fewer than m). One host read (m)."""
    n = P.shape[-1]
    reps = cycle_representatives(P, nodes, root)
    m = int(reps.sum(-1).max()) if reps.numel() else 0
    inner = torch.ones(P.shape[:-1], dtype=torch.bool, device=P.device)
    if nodes is not None:
        inner = inner & nodes
    inner[..., root] = False
    key = reps.to(torch.long) * (2 * n) + inner.to(torch.long) * n \
        + torch.arange(n, device=P.device)
    return key.topk(m, dim=-1).indices, inner, m


def _scatter_rows(x: torch.Tensor, ridx: torch.Tensor, n: int) -> torch.Tensor:
    """``(b, m + 1, m)`` -> ``(b, n, m)`` with row r of x at row ridx[r], zeros elsewhere."""
    out = x.new_zeros(*x.shape[:-2], n, x.shape[-1])
    return out.scatter_(-2, ridx.unsqueeze(-1).expand_as(x), x)


def _colsum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=-2, keepdim=True)


@torch.no_grad()
def reduced_solve(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None, root: int,
                  P: torch.Tensor | None = None, need_logz: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, ReducedState]:
    r"""(μ, log Z, error estimate, state) of the cycle reduction of
    :func:`reduced_log_partition` with the marginals written out (no autograd).

    With the column softmax P, K the eliminated nodes (one LU), J the m kept ones (one per
    cycle of best parents), R = J ∪ {root}, A = I − P_KK, Y = A⁻¹ P_KJ, X = P_RK A⁻¹ and the
    reduced weights W' = P_RJ + P_RK Y:

        log Z = Σ_j c_j + log det A + log Z'(log W'),
        ∂ log Z/∂P = Gbar:  Gbar_RJ = Λ,  Gbar_RK = Λ Yᵀ,  Gbar_KJ = Xᵀ Λ,
                            Gbar_KK = Xᵀ Λ Yᵀ − A⁻ᵀ,      Λ = ν / W',
        μ_ij = P_ij (1 + Gbar_ij − Σ_k P_kj Gbar_kj)      (the column softmax's chain rule),

    where Z' sums the (m + 1)^(m − 1) arborescences of the reduced graph (rooted at the root;
    its self-loops W'_jj dropped) and ν = ∂ log Z'/∂ log W' are their edge marginals:
    enumeration in log space (a log-sum-exp over the trees; exact and subtraction-free at any
    scale) for m ≤ ``_ENUM_MAX``, else autograd through the log-space elimination of the
    m + 1 nodes (the only autograd left, on a tiny graph). In the padded n × n form used
    here, Gbar = Urow Vc − A⁻ᵀ with Urow = Λ + Xᵀ Λ (on the rows R and K) and Vc = [Yᵀ, I]
    (on the columns K and J): five products with an n × m factor and one n × n inverse. The arithmetic is that of autograd through
    :func:`reduced_log_partition` (same sums, same error estimate).

    ``P`` (the column softmax of ``s``, e.g. from the fast path) is reused when given and
    log Z is not needed. log Z is 0 when ``need_logz`` is False. A reduced graph without an
    arborescence (its exits underflowed), a singular or indefinite A, or P underflow that
    may matter (below) show as an infinite or large estimate.

    Shapes: ``s``, ``valid``: ``(b, n, n)``; ``nodes``: ``(b, n)`` or None. Host reads: one (m).
    """
    n = s.shape[-1]
    if need_logz or P is None:
        P, c = _column_softmax_differentiable(s, valid)
    jidx, inner, m = _kept_nodes(P, nodes, root)
    dt, dev = P.dtype, P.device
    kf = (inner & torch.ones_like(inner).scatter_(-1, jidx, False)).to(dt)
    kfi = kf.unsqueeze(-1)
    # I − P ⊙ kkᵀ (P's diagonal is 0) with one n² buffer
    A = P.mul(kfi).mul_(kf.unsqueeze(-2)).neg_()
    A.diagonal(dim1=-2, dim2=-1).add_(1.0)
    inv = inverse(A, det=True)
    Ainv = inv.inv
    # A is a column diagonally dominant M-matrix like the fast path's I − P̂: its computed
    # inverse is nonnegative, ‖A⁻¹‖₁ its largest column sum (no |A⁻¹| temporary); a negative
    # entry makes the estimate inf
    est = 4 * max(n, 8) * torch.finfo(dt).eps * Ainv.sum(-2).amax(-1)
    est = torch.where(Ainv.amin(dim=(-2, -1)) < 0, torch.inf, est)
    ridx = torch.cat([jidx.new_full((*jidx.shape[:-1], 1), root), jidx], dim=-1)
    PJ = P.gather(-1, jidx.unsqueeze(-2).expand(*jidx.shape[:-1], n, m))
    Y = Ainv @ (PJ * kfi)
    Vc = Y.mT.scatter(-1, jidx.unsqueeze(-1), 1.0)    # Y is 0 on the columns J
    W = P @ Vc.mT                                     # P_·J + P_·K Y
    Wr = W.gather(-2, ridx.unsqueeze(-1).expand(*jidx.shape[:-1], m + 1, m))
    loops = torch.eye(m + 1, dtype=torch.bool, device=dev)[:, 1:]  # (q + 1, q): self-loops
    pos = (Wr > 0) & ~loops
    # an absent node padding J gets an edge from the root of weight 1: it contributes log 1
    # and no gradient (an existing node whose reduced in-weights all underflow makes
    # log Z' = −inf instead, and fails the check)
    dummy = torch.zeros_like(pos)
    dummy[..., 0, :] = ~inner.gather(-1, jidx)
    omega = torch.where(pos, torch.log(torch.where(pos, Wr, 1.0)),
                        torch.full_like(Wr, _NEG).masked_fill_(dummy, 0.0))
    vr = pos | dummy
    E = _tree_incidence(m, dt, dev) if m <= _ENUM_MAX else None
    lz_small, nu, p = _small_marginals(omega, vr, E)
    Lam = _scatter_rows(torch.where(pos, nu / torch.where(pos, Wr, 1.0), 0.0), ridx, n)
    Urow = Lam + Ainv.mT @ ((P.mT @ Lam) * kfi)
    Gbar = torch.matmul(Urow, Vc).sub_(Ainv.mT)
    H = (Gbar - _colsum(P * Gbar)).add_(1.0)
    mu = P * H
    # log det(I − P̂) = log det A + log Z'
    assert inv.logabsdet is not None and inv.negative is not None   # det=True
    logdet = inv.logabsdet + lz_small
    # Underflow of P: every tree using an edge with P_e below the smallest normal number
    # (flushed to 0 or denormal, so wrong or dropped) weighs at most P_e (the other columns'
    # P sum to 1), so the relative error of Z and of every μ is at most n²·tiny/det(I − P̂).
    # It matters when the surviving trees weigh even less (nested near-closed cycles whose
    # only real exit lies below the underflow threshold, ±1e4 at τ = 1e-3): the element then
    # fails and goes to the full log-space elimination.
    est = est + torch.exp(math.log(n * n * torch.finfo(dt).tiny) - logdet)
    bad = inv.singular | inv.negative | ~(lz_small > 0.5 * _NEG) | ~torch.isfinite(logdet)
    if need_logz:
        logz = (c * inner.to(dt)).sum(-1) + logdet
    else:
        logz = torch.zeros_like(lz_small)
    est = torch.where(bad, torch.full_like(est, torch.inf), est)
    state = ReducedState(P, Ainv, kf, valid, jidx, ridx, Vc, Wr, pos, omega, vr, E, p, nu,
                         Lam, Urow, Gbar, H)
    return mu, logz, est, state


@torch.no_grad()
def reduced_vjp(state: ReducedState, grad: torch.Tensor) -> torch.Tensor:
    r"""Σ_ij ḡ_ij ∂μ_ij/∂s for the μ of :func:`reduced_solve`, without autograd.

    μ = ∇ log Z, so this vector–Jacobian product is the Hessian–vector product H ḡ, which (H
    symmetric) is the directional derivative of μ along ṡ = ḡ on the allowed edges. It is
    formed by differentiating each line of :func:`reduced_solve` once, forward:

        Ṗ = P ⊙ (ṡ − 1ᵀ(P ⊙ ṡ)),   Ẏ = A⁻¹ [(Ṗ Vcᵀ) on K],   Ẇ' = Ṗ Vcᵀ + P Ẏ,
        ω̇ = Ẇ'/W',   ν̇ = Σ_T p_T 1_T (⟨1_T, ω̇⟩ − ⟨ν, ω̇⟩)   (the reduced graph's covariance),
        Λ̇ = (ν̇ − ν ⊙ ω̇)/W',   U̇ = Λ̇ + A⁻ᵀ [(Ṗᵀ Urow + Pᵀ Λ̇) on K],
        Ġbar = U̇ Vc + Urow Ẏᵀ − A⁻ᵀ (Ṗ_KK)ᵀ A⁻ᵀ,
        μ̇ = Ṗ ⊙ H + P ⊙ (Ġbar − 1ᵀ(Ṗ ⊙ Gbar + P ⊙ Ġbar)).

    Two n × n products (the last term of Ġbar, as in the fast path's backward), eight with an
    n × m factor, two with the tree incidence, and about twenty passes over n² entries: ~70
    dispatched ops for the whole batch of reduced graphs (the autograd double backward of
    :func:`reduced_marginals_vjp`: ~750).
    ``grad`` ``(b, n, n)`` in any float dtype; returns the state's dtype.
    """
    P, Ainv, kf, valid, jidx, ridx, Vc, Wr, pos, omega, vr, E, p, nu, Lam, Urow, Gbar, H = state
    n, m = P.shape[-1], jidx.shape[-1]
    kfi = kf.unsqueeze(-1)
    sd = torch.where(valid, grad.to(P.dtype), 0.0)
    Pd = sd.sub_(_colsum(P * sd)).mul_(P)         # sd is a fresh buffer
    R1 = Pd @ Vc.mT
    Yd = Ainv @ (R1 * kfi)
    Wd = (R1 + P @ Yd).gather(-2, ridx.unsqueeze(-1).expand(*jidx.shape[:-1], m + 1, m))
    Ws = torch.where(pos, Wr, 1.0)
    od = torch.where(pos, Wd / Ws, 0.0)
    nud = _small_hvp(omega, vr, E, p, nu, od)
    Lamd = _scatter_rows(torch.where(pos, (nud - nu * od) / Ws, 0.0), ridx, n)
    Ud = Lamd + Ainv.mT @ ((Pd.mT @ Urow + P.mT @ Lamd) * kfi)
    Pdk = Pd.mul(kfi).mul_(kf.unsqueeze(-2))
    # Ġbar accumulated in one buffer (two n² temporaries instead of six)
    Gd = torch.matmul(Ud, Vc).baddbmm_(Urow, Yd.mT)
    Gd.baddbmm_(Ainv.mT, Pdk.mT @ Ainv.mT, alpha=-1)
    cs = _colsum(torch.mul(Pd, Gbar).addcmul_(P, Gd))
    out = Pd * H
    return out.add_(Gd.sub_(cs).mul_(P))
