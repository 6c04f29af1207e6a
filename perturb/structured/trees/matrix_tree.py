r"""Matrix-tree theorems: log-partition functions and edge marginals of spanning trees and
arborescences, with an analytic backward for the marginals.

Directed (Tutte; Koo et al. 2007). Let s_ij be the log-potential of the edge i → j and
A_ij = exp(s_ij) (zero for forbidden edges, the diagonal and the edges into the root r). The
in-degree Laplacian is L = diag(1ᵀA) − A, and L̂ is L without the row and column of r. Then

    Z = Σ_{arborescences T rooted at r} Π_{(i→j)∈T} A_ij = det L̂,
    μ_ij = ∂ log Z / ∂ s_ij = A_ij (G_jj − G_ji),

where G is L̂⁻¹ padded with a zero row and column at r (so μ_rj = A_rj G_jj).

Stable scaling. Every arborescence has exactly one edge into each non-root node, so dividing
column j of A by e^{c_j}, c_j = logsumexp_i s_ij, changes Z by the exact factor e^{−Σ c_j}.
With P_ij = exp(s_ij − c_j) (a column-stochastic matrix: the softmax over the parents of j)

    log Z = Σ_{j≠r} c_j + log det(I − P̂),        μ_ij = P_ij (G_jj − G_ji),   G = (I − P̂)⁻¹,

where P̂ is P without row and column r. All entries of P lie in [0, 1]: nothing overflows for
any score scale, and I − P̂ is a column diagonally dominant M-matrix (the fundamental matrix of
the "walk to your parent" Markov chain absorbed at the root).

Undirected (Kirchhoff). A spanning tree corresponds to exactly one arborescence rooted at node 0
of the bidirected graph with symmetric potentials, so log Z_undirected(s) = log Z_directed(s)
and μ_{{i,j}} = μ_{i→j} + μ_{j→i}.

Analytic backward. For ℓ = Σ_ij ḡ_ij μ_ij, with K = ḡ ⊙ P, M = diag(1ᵀK) − Kᵀ and
N = Gᵀ M Gᵀ (from dG = −G dL̂ G),

    ∂ℓ/∂s_ij = P_ij [ ḡ_ij (G_jj − G_ji) − N_jj + N_ij ] = ḡ_ij μ_ij + P_ij (N_ij − N_jj),

with Nᵀ = G (diag(1ᵀK) − K) G: two O(n³) matrix products (μ is saved by the forward) and no
second factorisation (derivation in docs/trees.md). The formulas hold in the scaled variables
because the column scaling is an exact invariance.

Precision. float16/bfloat16/float32 inputs are computed in float64 internally and cast back:
det(I − P̂) is the product of the pivots and the marginals are differences G_jj − G_ji, both of
which lose every digit in float32 once the scores spread over a few units. Even in float64 the
LU path cancels when the best-scoring edges form cycles with much weaker exits (score gaps of a
few tens of units, or small τ): the rounding of the pivots perturbs the exit probabilities of
those near-closed cycles, and μ is accurate to about eps·‖G‖₁ only. Each result is therefore
checked a posteriori (finite, μ in [0, 1], every non-root column of μ summing to 1 within
1e-9/n, positive determinant, and the error estimate 4·max(n, 8)·eps·‖G‖₁ below 1e-8; a few
O(n²) reductions, no host synchronisation) and the failing batch elements are recomputed by
the cycle reduction of :mod:`perturb.structured.trees._elimination` (an LU of every node but one
per cycle of best parents, which is well conditioned and subtraction-free, then a log-space
sum over the arborescences of the few kept nodes; marginals and backward written out, no
autograd), and where that fails its own check too (scores so extreme that the column softmax
underflows where it matters) by the full log-space elimination, exact for any scale but
10–50× slower. Both fallbacks are batched over the failing elements.

Backward modes: ``"analytic"`` (the formula above; once differentiable) and ``"unroll"``
(autograd through the log-space elimination: an independent algorithm, twice differentiable).

References:
    Koo, Globerson, Carreras & Collins, "Structured Prediction Models via the Matrix-Tree
    Theorem", EMNLP 2007. Tutte, "Graph Theory", 1984 (directed matrix-tree theorem).
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from perturb._validation import traced
from perturb.backward import resolve_backward, solve_with_backward
from perturb.structured.trees import _ops
from perturb.structured.trees._graph_input import _prepare
from perturb.structured.trees._elimination import (
    ReducedState,
    elimination_marginals,
    elimination_marginals_vjp,
    reduced_solve,
    reduced_vjp,
)

__all__ = [
    "spanning_tree_log_partition", "spanning_tree_marginals",
    "arborescence_log_partition", "arborescence_marginals",
]

MARGINAL_BACKWARDS = ("analytic", "unroll")


# --------------------------------------------------------------------------------------------
# core (directed; undirected reuses it on symmetric scores with root 0)
# --------------------------------------------------------------------------------------------

def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype in (torch.float16, torch.bfloat16, torch.float32) else dtype


def _column_softmax(s: torch.Tensor, valid: torch.Tensor):
    """c_j = logsumexp_i s_ij over allowed edges (0 for columns without any) and
    P_ij = exp(s_ij − c_j) (0 on forbidden edges); ``has`` ``(*batch, n)`` marks the columns
    with an allowed edge. Six passes over the scores: fill, column max m, subtract, exp (both
    in place), column sum z, scale by 1/z; then c = m + log z."""
    P = s.masked_fill(~valid, -torch.inf)
    m = P.amax(dim=-2)
    has = m > -torch.inf
    m = torch.where(has, m, torch.zeros_like(m))
    P.sub_(m.unsqueeze(-2)).exp_()
    z = P.sum(dim=-2)
    z = torch.where(has, z, torch.ones_like(z))
    P.mul_(z.reciprocal().unsqueeze(-2))
    return P, m + torch.log(z), has


def _reduced_matrix(P: torch.Tensor, root: int, inner: torch.Tensor) -> torch.Tensor:
    """The scaled Laplacian I − P with the root's row removed from P, and identity rows and
    columns at the root and absent nodes: block-diagonal(I, I − P̂) up to permutation.

    The diagonal of diag(1ᵀP) − P is the column sum of the column-stochastic P, 1 up to
    rounding (a backward error of a few eps, the order of the factorisation's own), and exactly
    1 at the root and absent nodes; P's own diagonal is 0 (no loops). Forward only (no autograd
    through it).
    """
    Lf = torch.neg(P)
    Lf[..., root, :] = 0
    Lf.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    return Lf


def _inner_nodes(shape: torch.Size, nodes: torch.Tensor | None, root: int,
                 device: torch.device) -> torch.Tensor:
    """Boolean ``(*batch, n)``: existing nodes other than the root (the rows of L̂)."""
    inner = torch.ones(shape[:-1], dtype=torch.bool, device=device)
    if nodes is not None:
        inner = inner & nodes
    inner[..., root] = False
    return inner


#: Largest tolerated error estimate of the marginals (see _lu_solve and
#: _elimination.reduced_log_partition).
_ERROR_BUDGET = 1e-8

#: Which algorithm produced a batch element (the ``path`` tensor of :func:`_solve`).
PATH_LU, PATH_REDUCED, PATH_ELIMINATION = 0, 1, 2


def _check_tolerance(n: int) -> float:
    """Per-column tolerance of the a-posteriori check: the n − 1 column sums then add up to
    n − 1 within 1e-9."""
    return 1e-9 / n


def _error_estimate(G: torch.Tensor, n: int) -> torch.Tensor:
    """4·max(n, 8)·eps·‖G‖₁ ``(*batch)``: the error estimate of the LU marginals.

    I − P̂ is a column diagonally dominant M-matrix, so partial pivoting does not pivot, the
    off-diagonal entries of every Schur complement are sums of same-signed terms and the
    triangular solves against e_j are subtraction-free: G is accurate entrywise up to the
    rounding of the pivots, each an absolute O(eps) perturbation of a diagonal entry of
    I − P̂ (a relative perturbation eps/δ of an exit probability δ of a near-closed cycle).
    Its effect on μ_ij = P_ij (G_jj − G_ji) is of order eps·‖G‖₁ (‖G‖₁ ≈ the longest
    expected absorption time, ~1/δ); measured on random scores up to scale 50, n ≤ 64, and
    on nested near-closed cycles, the error stays below 14·eps·‖G‖₁. The first-order bound
    eps·‖G‖₁² of a normwise backward error is far too pessimistic here (it ignores that the
    large part of G cancels in G_jj − G_ji) and sent most peaked inputs to the fallback.
    """
    eps = torch.finfo(G.dtype).eps
    return (4 * max(n, 8) * eps) * G.abs().sum(dim=-2).amax(dim=-1)


def _result_bad(mu: torch.Tensor, inner: torch.Tensor, n: int) -> torch.Tensor:
    """``(*batch)``: μ fails the identities of exact marginals (every non-root column sums to
    1 within 1e-9/n, entries in [0, 1]); written as ``~(x <= bound)`` so NaN fails too."""
    tol = _check_tolerance(n)
    col_err = torch.where(inner, (mu.sum(dim=-2) - 1).abs(), 0.0).amax(dim=-1)
    # amin and amax propagate NaN; on CPU the two are ~10x faster than one aminmax
    lo, hi = mu.amin(dim=(-2, -1)), mu.amax(dim=(-2, -1))
    return ~(col_err <= tol) | ~(lo >= -tol) | ~(hi <= 1 + tol)


@torch.no_grad()
def _lu_solve(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None, root: int,
              need_logz: bool = True):
    """Fast path: (μ, log Z, P, G, bad) in the compute dtype from one LU factorisation.

    G = (I − P̂)⁻¹ padded with zeros at the root and absent nodes; ``bad`` ``(*batch)`` marks
    the elements whose result fails the a-posteriori check (log Z is only formed, from the LU
    factors, when ``need_logz``; otherwise one ``inv_ex`` call and log Z = 0): a singular
    factorisation, a non-finite value, a marginal outside [0, 1], a column of μ not summing to
    1 (an identity of the exact inverse: Σ_i P_ij (G_jj − G_ji) = (G(I − P̂))_jj), a
    non-positive determinant, or an error estimate 4·max(n, 8)·eps·‖G‖₁ above
    ``_ERROR_BUDGET`` (:func:`_error_estimate`; the column-sum identity alone can hold for a
    wrong inverse of a nearly singular matrix).

    Cost: the inverse plus about a dozen passes over n² entries (no extra O(n³) work); the
    checks are three reductions written as ``~(x <= bound)`` so that NaN fails them too (which
    makes a separate finiteness pass over μ unnecessary: ±inf and NaN in μ fail the range or
    column-sum test). No host synchronisation.
    """
    n = s.shape[-1]
    x = s.to(_compute_dtype(s.dtype))
    P, c, _ = _column_softmax(x, valid)
    inner = _inner_nodes(P.shape, nodes, root, P.device)
    Lf = _reduced_matrix(P, root, inner)
    if need_logz:
        LU, pivots, info = torch.linalg.lu_factor_ex(Lf)
        eye = torch.eye(n, dtype=P.dtype, device=P.device).expand_as(LU)
        G = torch.linalg.lu_solve(LU, pivots, eye)
    else:
        G, info = torch.linalg.inv_ex(Lf)
    innerf = inner.to(P.dtype)
    if nodes is None:
        # Lf is block-diagonal (the root's row and column are e_r), so the LU and the inverse
        # keep exact zeros there; only G_rr = 1 needs clearing (the whole row and column are
        # cleared to stay exact when a non-finite value reached them).
        G[..., root, :] = 0
        G[..., :, root] = 0
    else:
        G = G * innerf.unsqueeze(-1) * innerf.unsqueeze(-2)
    dG = torch.diagonal(G, dim1=-2, dim2=-1)
    mu = torch.sub(dG.unsqueeze(-2), G.transpose(-1, -2)).mul_(P)
    if need_logz:
        # sign of det = parity of the row swaps times the signs of U's diagonal
        dU = torch.diagonal(LU, dim1=-2, dim2=-1)
        ar = torch.arange(1, n + 1, device=P.device, dtype=pivots.dtype)
        negative = ((pivots != ar).sum(-1) + (dU < 0).sum(-1)) % 2 == 1
        logz = torch.log(dU.abs()).sum(-1) + (c * innerf).sum(-1)
        bad = negative | ~torch.isfinite(logz)
    else:
        logz = torch.zeros(mu.shape[:-2], dtype=mu.dtype, device=mu.device)
        bad = torch.zeros(mu.shape[:-2], dtype=torch.bool, device=mu.device)
    bad = bad | (info != 0) | ~(_error_estimate(G, n) <= _ERROR_BUDGET) \
        | _result_bad(mu, inner, n)
    return mu, logz, P, G, bad


def _solve(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None, root: int,
           need_logz: bool = True):
    """(μ, log Z, P, G, path): the fast path, with the elements that fail its check recomputed
    by the cycle reduction of :mod:`._elimination` (exact: one LU of the well-conditioned
    part, the reduced graph on one node per cycle of best parents summed in log space) and,
    where that fails its own check too, by the full log-space elimination (exact at any
    scale, slower).

    ``path`` ``(*batch)`` int8: ``PATH_LU``, ``PATH_REDUCED`` or ``PATH_ELIMINATION``. All
    fallbacks are batched over the failing elements; host reads: one per tier that runs, and
    one in the reduction (its size m).
    """
    return _solve_full(s, valid, nodes, root, need_logz)[:5]


def _solve_full(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None, root: int,
                need_logz: bool = True):
    """:func:`_solve` plus the cycle reduction's state for :func:`_backward_with_fallback`
    (a :class:`ReducedState` for the elements with ``path != PATH_LU``, in batch order; None
    when no element failed)."""
    mu, logz, P, G, bad = _lu_solve(s, valid, nodes, root, need_logz)
    path = bad.to(torch.int8)
    state = None
    if bool(bad.any()):
        n = s.shape[-1]
        x = s.detach().to(mu.dtype)[bad]
        v = valid.expand(s.shape)[bad]
        sub_nodes = None if nodes is None else nodes.expand(s.shape[:-1])[bad]
        mu_b, logz_b, est, state = reduced_solve(x, v, sub_nodes, root, P[bad], need_logz)
        inner = _inner_nodes(mu_b.shape, sub_nodes, root, mu_b.device)
        fail = ~(est <= _ERROR_BUDGET) | ~torch.isfinite(logz_b) | _result_bad(mu_b, inner, n)
        if bool(fail.any()):
            mu_e, logz_e = elimination_marginals(
                x[fail], v[fail], None if sub_nodes is None else sub_nodes[fail], root)
            mu_b[fail] = mu_e
            logz_b[fail] = logz_e
        mu[bad] = mu_b          # mu and logz are fresh tensors of _lu_solve
        logz[bad] = logz_b
        path[bad] = (fail.to(torch.int8) + PATH_REDUCED)
    return mu, logz, P, G, path, state


def _marginals_backward(P: torch.Tensor, G: torch.Tensor, grad: torch.Tensor,
                        mu: torch.Tensor | None = None) -> torch.Tensor:
    """Vector–Jacobian product of μ_ij = P_ij (G_jj − G_ji) with respect to the log-potentials.

    ∂ℓ/∂s_ij = ḡ_ij μ_ij + P_ij (N_ij − N_jj),  Nᵀ = G (diag(1ᵀK) − K) G,  K = ḡ ⊙ P.
    A pure function of the saved tensors (tests call it directly); ``mu`` (the forward's
    P ⊙ (G_jj − G_ji), in P's dtype) saves recomputing it. Two matrix products and about six
    passes over n² entries.
    """
    grad = grad.to(P.dtype)
    if mu is None:
        dG = torch.diagonal(G, dim1=-2, dim2=-1)
        mu = torch.sub(dG.unsqueeze(-2), G.transpose(-1, -2)).mul_(P)
    K = grad * P
    k = K.sum(dim=-2)
    A = K.neg_()
    A.diagonal(dim1=-2, dim2=-1).add_(k)          # diag(1ᵀK) − K (K's diagonal is 0)
    Nt = G @ A @ G                                # Nᵀ
    dN = torch.diagonal(Nt, dim1=-2, dim2=-1)
    out = Nt.transpose(-1, -2) - dN.unsqueeze(-2)
    return out.mul_(P).addcmul_(grad, mu)


def _backward_with_fallback(s, valid, nodes, root, P, G, path, grad, mu=None,
                            state: ReducedState | None = None):
    """The vector–Jacobian product of :func:`_solve_full`'s μ: :func:`_marginals_backward` for
    the LU elements, the analytic Hessian–vector product :func:`reduced_vjp` of the cycle
    reduction (from its saved ``state``; no second differentiation) for the others, and for
    the last tier the double backward through the log-space elimination. One host read when
    some element left the LU path."""
    out = _marginals_backward(P, G, grad, mu)
    if state is None:   # every element took the LU path
        return out
    bad = path != PATH_LU
    out[bad] = reduced_vjp(state, grad.expand(s.shape)[bad]).to(out.dtype)
    sel = path == PATH_ELIMINATION
    if bool(sel.any()):
        sub_nodes = None if nodes is None else nodes.expand(s.shape[:-1])[sel]
        out[sel] = elimination_marginals_vjp(s.to(out.dtype)[sel], valid.expand(s.shape)[sel],
                                             sub_nodes, root, grad.expand(s.shape)[sel])
    return out


class _TreeMarginals(torch.autograd.Function):
    r"""μ = ∇_s log Z(s) for arborescences rooted at ``root`` (module docstring).

    forward: μ_ij = P_ij (G_jj − G_ji), G = (I − P̂)⁻¹, P the column softmax of s; the elements
    failing the a-posteriori check are recomputed by the cycle reduction (or the log-space
    elimination).
    backward: ∂ℓ/∂s_ij = P_ij [ḡ_ij (G_jj − G_ji) − N_jj + N_ij], N = Gᵀ(diag(1ᵀK) − Kᵀ)Gᵀ,
    K = ḡ ⊙ P (:func:`_marginals_backward`); for the recomputed elements the analytic
    Hessian–vector product of the cycle reduction (:func:`reduced_vjp`, from the state the
    forward kept) or a double backward through the elimination. Once differentiable (use
    ``backward="unroll"`` for higher derivatives of the marginals; log Z is twice
    differentiable through this Function).
    """

    @staticmethod
    def forward(s, valid, nodes, root):
        mu, _, P, G, path, state = _solve_full(s, valid, nodes, root, need_logz=False)
        return mu.to(s.dtype), P, G, path, state

    @staticmethod
    def setup_context(ctx, inputs, output):
        s, valid, nodes, root = inputs
        mu, P, G, path, state = output
        ctx.mark_non_differentiable(P, G, path)
        # the cycle reduction's intermediate results (no autograd history; not outputs of
        # the graph) for its analytic Hessian–vector product
        ctx.reduced_state = state
        ctx.root = root
        ctx.has_nodes = nodes is not None
        # μ in the compute dtype is reused by the backward (bad elements are recomputed there)
        ctx.mu_is_exact = mu.dtype == P.dtype
        ctx.save_for_backward(s, valid, nodes if nodes is not None else s.new_empty(0), P, G,
                              path, mu if ctx.mu_is_exact else s.new_empty(0))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_mu, _gP, _gG, _gpath, _gstate=None):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        s, valid, nodes, P, G, path, mu = ctx.saved_tensors
        nodes = nodes if ctx.has_nodes else None
        mu = mu if ctx.mu_is_exact else None
        out = _backward_with_fallback(s, valid, nodes, ctx.root, P, G, path, grad_mu, mu,
                                      ctx.reduced_state)
        return out.to(s.dtype), None, None, None


class _TreeLogPartition(torch.autograd.Function):
    r"""log Z(s) for arborescences rooted at ``root``; backward ḡ·μ (μ = ∇ log Z).

    forward: log Z = Σ_j c_j + log det(I − P̂) from the LU factors, or by log-space elimination
    for the elements failing the check. backward: ḡ μ with the μ of the same forward; when a
    graph is being built (double backward) μ is recomputed by :class:`_TreeMarginals` so that
    it is differentiable.
    """

    @staticmethod
    def forward(s, valid, nodes, root):
        mu, logz, _, _, _ = _solve(s, valid, nodes, root)
        return logz.to(s.dtype), mu.to(s.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        s, valid, nodes, root = inputs
        _, mu = output
        ctx.mark_non_differentiable(mu)
        ctx.root = root
        ctx.has_nodes = nodes is not None
        ctx.save_for_backward(s, valid, nodes if nodes is not None else s.new_empty(0), mu)

    @staticmethod
    def backward(ctx, grad_logz, _gmu):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        s, valid, nodes, mu = ctx.saved_tensors
        if torch.is_grad_enabled():
            nodes = nodes if ctx.has_nodes else None
            mu = _TreeMarginals.apply(s, valid, nodes, ctx.root)[0]
        return grad_logz[..., None, None] * mu, None, None, None


def _log_partition(s, valid, nodes, root):
    return _TreeLogPartition.apply(s, valid, nodes, root)[0]


def _analytic_marginals(s, valid, nodes, root):
    return _TreeMarginals.apply(s, valid, nodes, root)[0]


def _marginals(s, valid, nodes, root, backward):
    if backward == "analytic":
        if _ops.AVAILABLE and traced(s):
            # torch.compile / torch.func: one opaque operator (no graph break, vmap folded
            # into the batch); eager calls use the Function directly
            return _ops.TracedMarginals.apply(s, valid, nodes, root)
        return _analytic_marginals(s, valid, nodes, root)
    # "unroll": autograd through the log-space elimination (an independent algorithm),
    # differentiable again when s requires grad.
    x = s.to(_compute_dtype(s.dtype))
    mu, _ = elimination_marginals(x, valid, nodes, root, create_graph=s.requires_grad)
    return mu.to(s.dtype)


# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------

def spanning_tree_log_partition(w: torch.Tensor, tau: float | torch.Tensor = 1.0,
                                mask: torch.Tensor | None = None,
                                lengths: torch.Tensor | None = None) -> torch.Tensor:
    r"""log Z = log Σ_T exp(Σ_{{i,j}∈T} s_ij / τ) over the spanning trees T, s = (w + wᵀ)/2.

    Kirchhoff's matrix-tree theorem: Z = det L̂, the Laplacian of the weights exp(s/τ) without
    one row and column; computed stably as in the module docstring (float32 inputs in float64
    internally). Differentiable by autograd: ∂ log Z/∂w_ij = μ_ij / (2τ) for i ≠ j, with μ the
    edge marginals (each undirected edge appears in two entries of ``w``).

    Args:
        w: log-potentials; only the symmetric part (w + wᵀ)/2 is used, the diagonal is ignored.
            ``-inf`` forbids an edge (in either direction forbids it).
        tau: temperature τ > 0 (float or tensor broadcastable to ``(*batch)``).
        mask: optional boolean adjacency, broadcastable to ``w``; False forbids an edge.
        lengths: optional ``(*batch)`` integer sizes: nodes ``>= lengths`` are absent (padding).

    Shape: ``w``: ``(*batch, n, n)`` -> ``(*batch)``.

    Raises:
        ValueError: non-square or n < 2, NaN/+inf, bad τ/mask/lengths, disconnected graph.

    Example::

        >>> n = 5
        >>> spanning_tree_log_partition(torch.zeros(n, n))   # Cayley: (n−2) log n
        tensor(4.8283)
    """
    s, valid, nodes, root = _prepare(w, tau, mask, lengths, None, True)
    return _log_partition(s, valid, nodes, 0)


def spanning_tree_marginals(w: torch.Tensor, tau: float | torch.Tensor = 1.0,
                            mask: torch.Tensor | None = None,
                            lengths: torch.Tensor | None = None,
                            backward: str = "auto") -> torch.Tensor:
    r"""Edge marginals μ_ij = P({i,j} ∈ T) of p(T) ∝ exp(Σ_{{i,j}∈T} s_ij / τ), s = (w + wᵀ)/2.

    μ is the regularized argmax argmax_{x ∈ conv Z} ⟨s, x⟩_△ − τ A*(x) over the spanning-tree
    polytope with the exponential-family entropy, where ⟨s, x⟩_△ = Σ_{i<j} s_ij x_ij counts each
    edge once. Computed by Kirchhoff's theorem through the directed one (module docstring):
    μ_{{i,j}} = μ_{i→j} + μ_{j→i} for arborescences rooted at node 0. O(n³); memory O(n²).

    Args:
        w, tau, mask, lengths: as :func:`spanning_tree_log_partition`.
        backward: ``"auto"`` = ``"analytic"`` (closed-form vector–Jacobian product through
            G = L̂⁻¹), ``"unroll"`` (autograd of autograd through ``slogdet``; a reference) or
            ``"finite_difference"`` (w.r.t. ``w`` only), as for
            :func:`perturb.regularized_argmax`.

    Shape: ``w``: ``(*batch, n, n)`` -> ``(*batch, n, n)``, symmetric with a zero diagonal; the
    upper triangle sums to n − 1 (to lengths − 1 with ``lengths``).

    Raises:
        ValueError: as :func:`spanning_tree_log_partition`, or an unknown ``backward``.

    Example::

        >>> mu = spanning_tree_marginals(torch.zeros(4, 4))
        >>> mu[0, 1]                     # every edge of K4 is in 8 of its 16 trees
        tensor(0.5000)
    """
    mode = resolve_backward(backward, MARGINAL_BACKWARDS, "spanning_tree_marginals")
    if mode == "finite_difference":
        return solve_with_backward(
            lambda v, m: spanning_tree_marginals(v, tau, mask, lengths, m), w, mode,
            MARGINAL_BACKWARDS, event_dim=2, held={"tau": tau})
    s, valid, nodes, root = _prepare(w, tau, mask, lengths, None, True)
    mu = _marginals(s, valid, nodes, 0, mode)
    return mu + mu.transpose(-1, -2)


def arborescence_log_partition(w: torch.Tensor, root: int = 0, tau: float | torch.Tensor = 1.0,
                               mask: torch.Tensor | None = None,
                               lengths: torch.Tensor | None = None) -> torch.Tensor:
    r"""log Z = log Σ_T exp(Σ_{(i→j)∈T} w_ij / τ) over the arborescences T rooted at ``root``.

    Tutte's directed matrix-tree theorem (module docstring); float32 inputs are computed in
    float64 internally. Differentiable by autograd; ∂ log Z/∂w = μ/τ.

    Args:
        w: log-potentials, ``w[..., i, j]`` scores the edge i → j; the diagonal and the column
            of the root are ignored; ``-inf`` forbids an edge.
        root: the root node, an int in [0, n − 1] (negative values and None are rejected).
        tau, mask, lengths: as :func:`spanning_tree_log_partition`.

    Shape: ``w``: ``(*batch, n, n)`` -> ``(*batch)``.

    Raises:
        ValueError: non-square or n < 2, NaN/+inf, bad root/τ/mask/lengths, or some node cannot
            be reached from the root.

    Example::

        >>> n = 4   # n^(n−2) arborescences per root on the complete digraph
        >>> arborescence_log_partition(torch.zeros(n, n)).exp()
        tensor(16.)
    """
    s, valid, nodes, root = _prepare(w, tau, mask, lengths, root, False)
    return _log_partition(s, valid, nodes, root)


def arborescence_marginals(w: torch.Tensor, root: int = 0, tau: float | torch.Tensor = 1.0,
                           mask: torch.Tensor | None = None,
                           lengths: torch.Tensor | None = None,
                           backward: str = "auto") -> torch.Tensor:
    r"""Edge marginals μ_ij = P(i → j ∈ T) of p(T) ∝ exp(Σ_{(i→j)∈T} w_ij / τ), T rooted at
    ``root``: μ = ∇_w log Z(w/τ)·τ, the regularized argmax with the exponential-family entropy.

    Computed by μ_ij = P_ij (G_jj − G_ji) (Koo et al. 2007, in the column-softmax scaling of the
    module docstring). O(n³); memory O(n²).

    Args:
        w, root, tau, mask, lengths: as :func:`arborescence_log_partition`.
        backward: ``"auto"`` = ``"analytic"``, ``"unroll"`` (autograd of autograd through
            ``slogdet``) or ``"finite_difference"`` (w.r.t. ``w`` only).

    Shape: ``w``: ``(*batch, n, n)`` -> ``(*batch, n, n)``; zero diagonal and root column, every
    other column sums to 1, the total is n − 1.

    Raises:
        ValueError: as :func:`arborescence_log_partition`, or an unknown ``backward``.

    Example::

        >>> mu = arborescence_marginals(torch.randn(5, 5), root=0)
        >>> round(float(mu.sum()), 4)
        4.0
    """
    mode = resolve_backward(backward, MARGINAL_BACKWARDS, "arborescence_marginals")
    if mode == "finite_difference":
        return solve_with_backward(
            lambda v, m: arborescence_marginals(v, root, tau, mask, lengths, m), w, mode,
            MARGINAL_BACKWARDS, event_dim=2, held={"tau": tau})
    s, valid, nodes, root = _prepare(w, tau, mask, lengths, root, False)
    return _marginals(s, valid, nodes, root, mode)
