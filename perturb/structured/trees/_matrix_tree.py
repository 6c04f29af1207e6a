r"""The engine of :mod:`perturb.structured.trees.matrix_tree`: arborescence log-partition
functions and marginals of checked tensors (the math, the stable scaling and the precision
argument are in that module's docstring).

Every function here takes what :func:`._graph_input._prepare` returns: scores ``s = w/τ``
``(*batch, n, n)`` with forbidden entries zero-filled, the allowed edges ``valid`` (no loops,
nothing into the root), the node mask ``nodes`` ``(*batch, n)`` or None, and the root. Nothing
is validated again. The public functions of :mod:`.matrix_tree` and the solvers registered in
:mod:`.structures` call :func:`log_partition` and :func:`marginals`; the samplers use
:func:`column_softmax` and :func:`solve`.

Layout: the column softmax and the LU fast path with its a-posteriori check
(:func:`lu_solve`); the tiers (:func:`solve`, :func:`solve_full`: LU, then the cycle reduction,
then the full log-space elimination of :mod:`._elimination`); the analytic backward
(:func:`marginals_backward`, :func:`backward_with_fallback`); the autograd Functions and the
two entry points.
"""
from __future__ import annotations

import torch

from perturb._autograd import once_differentiable
from perturb._validation import traced
from perturb._vmap import fold_vmap
from perturb.structured.trees import _ops
from perturb.structured.trees._elimination import (
    ReducedState,
    elimination_marginals,
    elimination_marginals_vjp,
    reduced_solve,
    reduced_vjp,
)
from perturb.structured.trees._inverse import inverse

__all__: list[str] = []

#: The backward modes of the marginals (``"finite_difference"`` is added by the callers).
MARGINAL_BACKWARDS = ("analytic", "unroll")



# --------------------------------------------------------------------------------------------
# core (directed; undirected reuses it on symmetric scores with root 0)
# --------------------------------------------------------------------------------------------

def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype in (torch.float16, torch.bfloat16, torch.float32) else dtype


def column_softmax(s: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype | None = None):
    """c_j = logsumexp_i s_ij over allowed edges (0 for columns without any) and
    P_ij = exp(s_ij − c_j) (0 on forbidden edges), in ``dtype`` (default: that of ``s``);
    ``has`` ``(*batch, n)`` marks the columns with an allowed edge. Six passes over the scores
    into one new buffer: fill (fused with the conversion to ``dtype``), column max m,
    subtract, exp (both in place), column sum z, scale by 1/z; then c = m + log z."""
    if dtype is None or dtype == s.dtype:
        P = s.masked_fill(~valid, -torch.inf)
    else:   # the converted copy is ours: fill it in place
        P = s.to(dtype).masked_fill_(~valid, -torch.inf)
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


#: Largest tolerated error estimate of the marginals (see lu_solve and
#: _elimination.reduced_log_partition).
ERROR_BUDGET = 1e-8

#: Which algorithm produced a batch element (the ``path`` tensor of :func:`solve`).
PATH_LU, PATH_REDUCED, PATH_ELIMINATION = 0, 1, 2


def _check_tolerance(n: int) -> float:
    """Per-column tolerance of the a-posteriori check: the n − 1 column sums then add up to
    n − 1 within 1e-9."""
    return 1e-9 / n


def _error_estimate(G: torch.Tensor, n: int) -> torch.Tensor:
    """4·max(n, 8)·eps·‖G‖₁ ``(*batch)``: the error estimate of the LU marginals, inf where G
    has a negative entry.

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

    For the same reason (no pivoting, subtraction-free solves, positive pivots) the computed G
    is entrywise nonnegative, so ‖G‖₁ is its largest column sum: two reductions and no
    temporary |G| (a fresh n² buffer costs more than the passes for large batches). A negative
    entry (a pivot that rounded to a negative value) makes the estimate inf, so the element
    is recomputed; NaN propagates through both reductions and fails the check too.

    Tightness (issue 29; random scores ×10–×50, n = 64 and 128, against the log-space
    elimination): the rejected elements have actual errors of 0.2–2·eps·‖G‖₁, so the estimate
    is loose by its constant only, and about 9 in 10 of them also fail the column-sum
    identity of :func:`_result_bad` (errors 1e-11–1e-6, above 1e-9/n). A sharper estimate
    would return at most the remaining tenth to this path (3 of 34 rejected at n = 64, ×20;
    2 of 18 at n = 128), and the cycle reduction would still run for the others.
    """
    eps = torch.finfo(G.dtype).eps
    est = (4 * max(n, 8) * eps) * G.sum(dim=-2).amax(dim=-1)
    return torch.where(G.amin(dim=(-2, -1)) < 0, torch.inf, est)


def _result_bad(mu: torch.Tensor, inner: torch.Tensor, n: int) -> torch.Tensor:
    """``(*batch)``: μ fails the identities of exact marginals (every non-root column sums to
    1 within 1e-9/n, entries in [0, 1]); written as ``~(x <= bound)`` so NaN fails too."""
    tol = _check_tolerance(n)
    col_err = torch.where(inner, (mu.sum(dim=-2) - 1).abs(), 0.0).amax(dim=-1)
    # amin and amax propagate NaN; on CPU the two are ~10x faster than one aminmax
    lo, hi = mu.amin(dim=(-2, -1)), mu.amax(dim=(-2, -1))
    return ~(col_err <= tol) | ~(lo >= -tol) | ~(hi <= 1 + tol)


@torch.no_grad()
def lu_solve(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None, root: int,
              need_logz: bool = True):
    """Fast path: (μ, log Z, P, G, bad) in the compute dtype from one LU factorisation.

    G = (I − P̂)⁻¹ padded with zeros at the root and absent nodes; ``bad`` ``(*batch)`` marks
    the elements whose result fails the a-posteriori check (log Z is only formed, with the
    inverse's log-determinant (:func:`._inverse.inverse`), when ``need_logz``; otherwise
    log Z = 0): a singular factorisation, a non-finite value, a marginal outside [0, 1], a
    column of μ not summing to 1 (an identity of the exact inverse:
    Σ_i P_ij (G_jj − G_ji) = (G(I − P̂))_jj), a non-positive determinant, or an error
    estimate 4·max(n, 8)·eps·‖G‖₁ above
    ``ERROR_BUDGET`` (:func:`_error_estimate`; the column-sum identity alone can hold for a
    wrong inverse of a nearly singular matrix).

    Cost: the inverse plus about a dozen passes over n² entries (no extra O(n³) work); the
    checks are three reductions written as ``~(x <= bound)`` so that NaN fails them too (which
    makes a separate finiteness pass over μ unnecessary: ±inf and NaN in μ fail the range or
    column-sum test). No host synchronisation.
    """
    n = s.shape[-1]
    P, c, _ = column_softmax(s, valid, compute_dtype(s.dtype))
    inner = _inner_nodes(P.shape, nodes, root, P.device)
    Lf = _reduced_matrix(P, root, inner)
    inv = inverse(Lf, det=need_logz)
    G = inv.inv
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
    # Lf is not needed after the factorisation: μ takes its buffer
    mu = torch.sub(dG.unsqueeze(-2), G.transpose(-1, -2), out=Lf).mul_(P)
    if inv.logabsdet is not None and inv.negative is not None:     # need_logz
        logz = inv.logabsdet + (c * innerf).sum(-1)
        bad = inv.negative | ~torch.isfinite(logz)
    else:
        logz = torch.zeros(mu.shape[:-2], dtype=mu.dtype, device=mu.device)
        bad = torch.zeros(mu.shape[:-2], dtype=torch.bool, device=mu.device)
    bad = bad | inv.singular | ~(_error_estimate(G, n) <= ERROR_BUDGET) \
        | _result_bad(mu, inner, n)
    return mu, logz, P, G, bad


def solve(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None, root: int,
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
    return solve_full(s, valid, nodes, root, need_logz)[:5]


def solve_full(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None, root: int,
                need_logz: bool = True):
    """:func:`solve` plus the cycle reduction's state for :func:`backward_with_fallback`
    (a :class:`ReducedState` for the elements with ``path != PATH_LU``, in batch order; None
    when no element failed)."""
    mu, logz, P, G, bad = lu_solve(s, valid, nodes, root, need_logz)
    path = bad.to(torch.int8)
    state = None
    if bool(bad.any()):
        n = s.shape[-1]
        x = s.detach()[bad].to(mu.dtype)      # convert the failing elements only
        v = valid.expand(s.shape)[bad]
        sub_nodes = None if nodes is None else nodes.expand(s.shape[:-1])[bad]
        mu_b, logz_b, est, state = reduced_solve(x, v, sub_nodes, root, P[bad], need_logz)
        inner = _inner_nodes(mu_b.shape, sub_nodes, root, mu_b.device)
        fail = ~(est <= ERROR_BUDGET) | ~torch.isfinite(logz_b) | _result_bad(mu_b, inner, n)
        if bool(fail.any()):
            mu_e, logz_e = elimination_marginals(
                x[fail], v[fail], None if sub_nodes is None else sub_nodes[fail], root)
            mu_b[fail] = mu_e
            logz_b[fail] = logz_e
        mu[bad] = mu_b          # mu and logz are fresh tensors of lu_solve
        logz[bad] = logz_b
        path[bad] = (fail.to(torch.int8) + PATH_REDUCED)
    return mu, logz, P, G, path, state


def marginals_backward(P: torch.Tensor, G: torch.Tensor, grad: torch.Tensor,
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
    # A is not needed after the first product: the result takes its buffer
    out = torch.sub(Nt.transpose(-1, -2), dN.unsqueeze(-2), out=A)
    return out.mul_(P).addcmul_(grad, mu)


def backward_with_fallback(s, valid, nodes, root, P, G, path, grad, mu=None,
                            state: ReducedState | None = None):
    """The vector–Jacobian product of :func:`solve_full`'s μ: :func:`marginals_backward` for
    the LU elements, the analytic Hessian–vector product :func:`reduced_vjp` of the cycle
    reduction (from its saved ``state``; no second differentiation) for the others, and for
    the last tier the double backward through the log-space elimination.

    When some element left the LU path, the LU product runs on the LU elements only (its two
    O(n³) products are not spent on elements whose result is replaced): the batch is split by
    one stable sort of the path flags, the number of recomputed elements being known from
    ``state`` (no host read); one host read when the last tier may have run."""
    if state is None:   # every element took the LU path
        return marginals_backward(P, G, grad, mu)
    n = P.shape[-1]
    flat = P.shape[:-2].numel()
    bad = (path != PATH_LU).reshape(flat)
    order = torch.argsort(bad.to(torch.uint8), stable=True)
    n_lu = flat - state.P.shape[0]
    lu, rest = order[:n_lu], order[n_lu:]       # rest: the recomputed elements in batch order
    g = grad.expand(s.shape).reshape(flat, n, n)
    out = torch.empty((flat, n, n), dtype=P.dtype, device=P.device)
    if n_lu:
        def pick(x):
            return x.reshape(flat, n, n).index_select(0, lu)
        out.index_copy_(0, lu, marginals_backward(pick(P), pick(G), pick(g),
                                                  None if mu is None else pick(mu)))
    out.index_copy_(0, rest, reduced_vjp(state, g.index_select(0, rest)).to(out.dtype))
    out = out.view(P.shape)
    sel = path == PATH_ELIMINATION
    if bool(sel.any()):
        sub_nodes = None if nodes is None else nodes.expand(s.shape[:-1])[sel]
        out[sel] = elimination_marginals_vjp(s[sel].to(out.dtype), valid.expand(s.shape)[sel],
                                             sub_nodes, root, grad.expand(s.shape)[sel])
    return out


class _TreeMarginals(torch.autograd.Function):
    r"""μ = ∇_s log Z(s) for arborescences rooted at ``root`` (module docstring).

    forward: μ_ij = P_ij (G_jj − G_ji), G = (I − P̂)⁻¹, P the column softmax of s; the elements
    failing the a-posteriori check are recomputed by the cycle reduction (or the log-space
    elimination).
    backward: ∂ℓ/∂s_ij = P_ij [ḡ_ij (G_jj − G_ji) − N_jj + N_ij], N = Gᵀ(diag(1ᵀK) − Kᵀ)Gᵀ,
    K = ḡ ⊙ P (:func:`marginals_backward`); for the recomputed elements the analytic
    Hessian–vector product of the cycle reduction (:func:`reduced_vjp`, from the state the
    forward kept) or a double backward through the elimination. Once differentiable (use
    ``backward="unroll"`` for higher derivatives of the marginals; log Z is twice
    differentiable through this Function).
    """

    @staticmethod
    def forward(s, valid, nodes, root):
        mu, _, P, G, path, state = solve_full(s, valid, nodes, root, need_logz=False)
        return mu.to(s.dtype), P, G, path, state

    @staticmethod
    def setup_context(ctx, inputs, output):
        s, valid, nodes, root = inputs
        mu, P, G, path, state = output
        ctx.mark_non_differentiable(P, G, path)
        # no zero-filled n² gradients for P and G (two fresh buffers per backward)
        ctx.set_materialize_grads(False)
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
        if grad_mu is None or not ctx.needs_input_grad[0]:
            return None, None, None, None
        s, valid, nodes, P, G, path, mu = ctx.saved_tensors
        nodes = nodes if ctx.has_nodes else None
        mu = mu if ctx.mu_is_exact else None
        out = backward_with_fallback(s, valid, nodes, ctx.root, P, G, path, grad_mu, mu,
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
        mu, logz, _, _, _ = solve(s, valid, nodes, root)
        return logz.to(s.dtype), mu.to(s.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        s, valid, nodes, root = inputs
        _, mu = output
        ctx.mark_non_differentiable(mu)
        ctx.set_materialize_grads(False)        # no zero-filled n² gradient for μ
        ctx.root = root
        ctx.has_nodes = nodes is not None
        ctx.save_for_backward(s, valid, nodes if nodes is not None else s.new_empty(0), mu)

    @staticmethod
    def backward(ctx, grad_logz, _gmu):
        if grad_logz is None or not ctx.needs_input_grad[0]:
            return None, None, None, None
        s, valid, nodes, mu = ctx.saved_tensors
        if torch.is_grad_enabled():
            # differentiable μ; under torch.func the opaque operator (vmap folded)
            mu = marginals(s, valid, nodes if ctx.has_nodes else None, ctx.root, "analytic")
        return grad_logz[..., None, None] * mu, None, None, None

    @staticmethod
    def vmap(info, in_dims, s, valid, nodes, root):
        # the vmapped dim folds into the batch (the scores carry it; the masks broadcast)
        return fold_vmap(_TreeLogPartition.apply, info, in_dims, (s, valid, nodes, root),
                         expand=(0,), broadcast=(1, 2))


def log_partition(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None,
                  root: int) -> torch.Tensor:
    """log Z ``(*batch)`` of the arborescences rooted at ``root`` (checked tensors, see the
    module docstring), in the dtype of ``s``; twice differentiable."""
    return _TreeLogPartition.apply(s, valid, nodes, root)[0]


def analytic_marginals(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None,
                       root: int) -> torch.Tensor:
    """μ = ∇ log Z ``(*batch, n, n)`` by :class:`_TreeMarginals` (eager; once differentiable)."""
    return _TreeMarginals.apply(s, valid, nodes, root)[0]


def marginals(s: torch.Tensor, valid: torch.Tensor, nodes: torch.Tensor | None, root: int,
              backward: str) -> torch.Tensor:
    """μ = ∇ log Z ``(*batch, n, n)`` of the arborescences rooted at ``root`` for checked
    tensors; ``backward`` is ``"analytic"`` (:class:`_TreeMarginals`, or the opaque operator of
    :mod:`._ops` under torch.compile / torch.func) or ``"unroll"`` (autograd through the
    log-space elimination, differentiable again)."""
    if backward == "analytic":
        if _ops.AVAILABLE and traced(s):
            # torch.compile / torch.func: one opaque operator (no graph break, vmap folded
            # into the batch); eager calls use the Function directly
            return _ops.TracedMarginals.apply(s, valid, nodes, root)
        return analytic_marginals(s, valid, nodes, root)
    # "unroll": autograd through the log-space elimination (an independent algorithm),
    # differentiable again when s requires grad.
    x = s.to(compute_dtype(s.dtype))
    mu, _ = elimination_marginals(x, valid, nodes, root, create_graph=s.requires_grad)
    return mu.to(s.dtype)
