r"""Log-domain Sinkhorn iterations and their implicit backward (private; see ``permutations.py``).

The problem (entropic optimal transport with cost −W and regularization τ)::

    P* = argmax_{P ≥ 0, P 1 = a, Pᵀ 1 = b}  ⟨W, P⟩ − τ Σ_ij P_ij log P_ij

has the solution P = exp(W/τ + u 1ᵀ + 1 vᵀ) with dual potentials u ∈ R^n, v ∈ R^m (f = τu, g = τv
in the usual notation), found by alternating the exact block updates ("Sinkhorn" in log space)::

    v ← log b − LSE_i(W_ij/τ + u_i),      u ← log a − LSE_j(W_ij/τ + v_j).

Implicit backward. Differentiate the two marginal conditions at the fixed point. With
dP = P ⊙ (dW/τ + du 1ᵀ + 1 dvᵀ)::

    H [du; dv] = [da; db] − [r; c],   H = [[diag(a), P], [Pᵀ, diag(b)]],
    r = (P ⊙ dW/τ) 1,  c = (P ⊙ dW/τ)ᵀ 1.

For an upstream gradient G = ∂L/∂P let α = (G ⊙ P) 1, β = (G ⊙ P)ᵀ 1. H is symmetric, so with
[x; y] any solution of H [x; y] = [α; β],

    ∂L/∂W = P ⊙ (G − x 1ᵀ − 1 yᵀ) / τ,   ∂L/∂a = x,   ∂L/∂b = y,   ∂L/∂τ = −⟨∂L/∂W, W⟩ / τ.

H has the null vector (1, −1) (the gauge u + t, v − t leaves P unchanged); [α; β] is orthogonal to
it (Σα = Σβ = ⟨G, P⟩), so the system is consistent and the gauge does not change ∂L/∂W. Eliminating
x = (α − P y)/a leaves the Schur complement (on the smaller side)::

    S y = β − Pᵀ (α / a),    S = diag(b) − Pᵀ diag(1/a) P,   S 1 = 0,

symmetric positive semi-definite, solved by a batched Cholesky with a tiny ridge δ I
(δ = 10 m ε max_j S_jj):
the right-hand side is orthogonal to the null space, so the ridge only removes it (and the extra
near-null directions of a plan that is almost a permutation, whose contribution to ∂L/∂W is
multiplied by the vanishing entries of P). The gauge of (∂L/∂a, ∂L/∂b) is fixed by Σx = Σy: the
projection onto the tangent space {Σ da = Σ db} of the feasible marginals. Cost O(n m min(n, m))
per problem, memory O(n m), independent of the number of iterations.

Which fixed point. The iterations stop with exact columns and rows within ``tol``: the returned
P = exp(W/τ + u1ᵀ + 1vᵀ) is then the *exact* entropic plan for the marginals (a', b) with
a' = P1, not for (a, b). The backward therefore builds H (and S) from a' = P1 and b' = Pᵀ1, the
marginals of the iterate itself, and returns the exact derivative of the returned plan along
the family of problems it solves (a' − a is O(tol), so the gradient differs from the one at the
unreachable exact fixed point by O(tol / λ₂(S))). Building H from the target a instead is
inconsistent: then S1 = −Pᵀ((a' − a)/a) ≠ 0, the gauge direction is no longer a null vector, the
right-hand side is no longer orthogonal to it, and the solve divides an O(tol) component by an
O(tol) eigenvalue: gradients 66% off (and dL/dτ of the wrong sign) at tol = 1e-6 in float64
with no warning. Tests compare default-setting gradients with converged ones.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class SinkhornSolution(NamedTuple):
    """Diagnostics of one batched Sinkhorn run."""

    plan: torch.Tensor      # (*batch, n, m)
    u: torch.Tensor         # (*batch, n)  row potentials divided by tau
    v: torch.Tensor         # (*batch, m)  column potentials divided by tau
    error: torch.Tensor     # (*batch,)    max_i |P 1 − a|_i of the returned plan
    n_iters: int            # iterations run
    tol: torch.Tensor       # (*batch,)    tolerance used: max(tol, rounding floor)


def _masked_log_kernel(w: torch.Tensor, tau: torch.Tensor,
                       mask: torch.Tensor | None) -> torch.Tensor:
    """W/τ with masked entries at a huge finite negative value (exp → 0, no NaN in autograd)."""
    log_k = w / tau
    if mask is not None:
        neg = torch.finfo(w.dtype).min / 8
        log_k = torch.where(mask, log_k, torch.full((), neg, dtype=w.dtype, device=w.device))
    return log_k


def sinkhorn_iterate(log_k: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     row_valid: torch.Tensor | None, col_valid: torch.Tensor | None,
                     n_iters: int, tol: float, check_every: int = 10) -> SinkhornSolution:
    """Run the log-domain iterations (differentiable by autograd when the inputs require grad).

    Stopping rule: every ``check_every`` iterations (and at the last), the row update also gives
    the row sums of the current plan for free, ``P 1 = a ⊙ exp(u_old − u_new)`` (the columns are
    exact after the column update); when ``max |P 1 − a| ≤ tol`` in every problem of the batch
    the plan with exact columns and rows within ``tol`` is returned. ``tol`` is raised to the
    rounding floor 4 ε max|log K| max(a) per problem (ε the dtype's machine epsilon, log K
    centred): in float32 with |W|/τ ≈ 40 no plan is more accurate than about 1e-6.

    Args:
        log_k: W/τ (masked entries very negative), ``(*batch, n, m)``.
        a, b: marginals ``(*batch, n)``, ``(*batch, m)``; zero on padded rows/columns.
        row_valid, col_valid: boolean ``(*batch, n)``, ``(*batch, m)`` or None (all valid).
    """
    # Center the kernel (P is invariant to row/column shifts, absorbed in u, v): keeps the
    # potentials small, which is what limits the attainable accuracy in float32.
    with torch.no_grad():
        shift_r = log_k.amax(-1, keepdim=True)
        if row_valid is not None:
            shift_r = torch.where(row_valid.unsqueeze(-1), shift_r, 0.0)
        shift_c = (log_k - shift_r).amax(-2, keepdim=True)
        if col_valid is not None:
            shift_c = torch.where(col_valid.unsqueeze(-2), shift_c, 0.0)
        # accuracy floor: rounding of the exponent, eps * max|log K| (per problem)
        spread = (log_k - shift_r - shift_c)
        if row_valid is not None or col_valid is not None:
            spread = torch.where(_valid_entries(row_valid, col_valid, spread), spread, 0.0)
        floor = 4 * torch.finfo(log_k.dtype).eps * (1 + spread.abs().amax((-2, -1))) \
            * a.amax(-1)
        tol = torch.clamp(floor, min=tol)
    log_k = log_k - shift_r - shift_c
    log_a = torch.log(a) if row_valid is None else torch.log(torch.where(row_valid, a, 1.0))
    log_b = torch.log(b) if col_valid is None else torch.log(torch.where(col_valid, b, 1.0))
    u = torch.zeros_like(log_a)
    v = torch.zeros_like(log_b)
    error = torch.full(log_a.shape[:-1], float("inf"), dtype=a.dtype, device=a.device)
    it = 0
    for it in range(1, n_iters + 1):
        v = log_b - torch.logsumexp(log_k + u.unsqueeze(-1), dim=-2)
        if col_valid is not None:
            v = torch.where(col_valid, v, 0.0)
        u_new = log_a - torch.logsumexp(log_k + v.unsqueeze(-2), dim=-1)
        if row_valid is not None:
            u_new = torch.where(row_valid, u_new, 0.0)
        if it % check_every == 0 or it == n_iters:
            with torch.no_grad():
                error = (a * torch.expm1(u - u_new)).abs().amax(dim=-1)
                error = torch.where(torch.isnan(error), float("inf"), error)
            if bool((error <= tol).all()):
                break  # (u, v): exact columns, rows within tol
        u = u_new
    plan = torch.exp(log_k + u.unsqueeze(-1) + v.unsqueeze(-2))
    if row_valid is not None or col_valid is not None:
        valid = _valid_entries(row_valid, col_valid, plan)
        plan = torch.where(valid, plan, 0.0)
    if it == n_iters and not bool((error <= tol).all()):
        # the last row update was taken: measure the returned plan itself
        with torch.no_grad():
            error = (plan.sum(-1) - a).abs().amax(-1).maximum((plan.sum(-2) - b).abs().amax(-1))
    return SinkhornSolution(plan, u, v, error, it, tol)


def _valid_entries(row_valid: torch.Tensor | None, col_valid: torch.Tensor | None,
                   like: torch.Tensor) -> torch.Tensor:
    ones_r = torch.ones(like.shape[:-1], dtype=torch.bool, device=like.device)
    ones_c = torch.ones(like.shape[:-2] + like.shape[-1:], dtype=torch.bool, device=like.device)
    r = ones_r if row_valid is None else row_valid
    c = ones_c if col_valid is None else col_valid
    return r.unsqueeze(-1) & c.unsqueeze(-2)


def _solve_psd(S: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """Solve S y = rhs for batched symmetric PSD S with a tiny ridge (Cholesky, LU fallback)."""
    m = S.shape[-1]
    eps = torch.finfo(S.dtype).eps
    scale = S.diagonal(dim1=-2, dim2=-1).abs().amax(-1, keepdim=True).clamp_min(
        torch.finfo(S.dtype).tiny)
    ridge = (10 * m * eps) * scale
    S = S + torch.diag_embed(ridge.expand(*S.shape[:-1]))
    L, info = torch.linalg.cholesky_ex(S)
    if bool((info == 0).all()):
        return torch.cholesky_solve(rhs.unsqueeze(-1), L).squeeze(-1)
    return torch.linalg.lstsq(S, rhs.unsqueeze(-1)).solution.squeeze(-1)


def sinkhorn_vjp(plan: torch.Tensor, grad_plan: torch.Tensor,
                 row_valid: torch.Tensor | None = None,
                 col_valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                 torch.Tensor]:
    """The implicit vector–Jacobian product at a Sinkhorn fixed point (see the module docstring).

    Returns ``(τ ∂L/∂W, ∂L/∂a, ∂L/∂b)`` for upstream ``grad_plan`` = ∂L/∂P: the first is
    ``P ⊙ (G − x 1ᵀ − 1 yᵀ)``, to be divided by τ by the caller. The marginals are those of
    ``plan`` itself (P1, Pᵀ1; see "Which fixed point" in the module docstring), so no target
    marginals are passed. Pure function (tests call it).

    Shape: ``plan``/``grad_plan`` ``(*batch, n, m)``; validity masks ``(*batch, n)``,
    ``(*batch, m)``.
    """
    n, m = plan.shape[-2:]
    gp = grad_plan * plan
    alpha = gp.sum(-1)
    beta = gp.sum(-2)
    # The system is built on the plan's own marginals, not on the targets a, b: the returned
    # iterate is the exact solution for (P1, Pᵀ1), so H keeps its exact null vector (1, −1) and
    # the right-hand side stays orthogonal to it. With the targets, S1 = −Pᵀ((P1 − a)/a) is
    # O(tol) instead of 0 and the solve divides by that: 66% gradient errors at tol 1e-6.
    a_s = plan.sum(-1)
    b_s = plan.sum(-2)
    if row_valid is not None:
        a_s = torch.where(row_valid, a_s, 1.0)
    if col_valid is not None:
        b_s = torch.where(col_valid, b_s, 1.0)
    if m <= n:  # Schur complement on the columns
        pa = plan / a_s.unsqueeze(-1)
        S = torch.diag_embed(b_s) - plan.transpose(-1, -2) @ pa
        rhs = beta - (pa.transpose(-1, -2) @ alpha.unsqueeze(-1)).squeeze(-1)
        y = _solve_psd(S, rhs)
        x = (alpha - (plan @ y.unsqueeze(-1)).squeeze(-1)) / a_s
    else:  # on the rows
        pb = plan / b_s.unsqueeze(-2)
        S = torch.diag_embed(a_s) - pb @ plan.transpose(-1, -2)
        rhs = alpha - (pb @ beta.unsqueeze(-1)).squeeze(-1)
        x = _solve_psd(S, rhs)
        y = (beta - (plan.transpose(-1, -2) @ x.unsqueeze(-1)).squeeze(-1)) / b_s
    if row_valid is not None:
        x = torch.where(row_valid, x, 0.0)
    if col_valid is not None:
        y = torch.where(col_valid, y, 0.0)
    grad_w = plan * (grad_plan - x.unsqueeze(-1) - y.unsqueeze(-2))
    # gauge: Σx = Σy (projection onto the tangent space Σda = Σdb)
    n_r = n if row_valid is None else row_valid.sum(-1)
    n_c = m if col_valid is None else col_valid.sum(-1)
    t = ((y.sum(-1) - x.sum(-1)) / (n_r + n_c)).unsqueeze(-1)
    x = x + t if row_valid is None else torch.where(row_valid, x + t, 0.0)
    y = y - t if col_valid is None else torch.where(col_valid, y - t, 0.0)
    return grad_w, x, y


class _SinkhornImplicit(torch.autograd.Function):
    r"""P = sinkhorn(W, τ, a, b) forward; implicit-function-theorem backward.

    Math (module docstring): ∂L/∂W = P ⊙ (G − x1ᵀ − 1yᵀ)/τ with [[diag a, P], [Pᵀ, diag b]] [x; y]
    = [(G⊙P)1; (G⊙P)ᵀ1]; ∂L/∂a = x, ∂L/∂b = y (gauge Σx = Σy); ∂L/∂τ = −⟨∂L/∂W, W⟩/τ.
    Outputs: the plan, then (non-differentiable) the per-problem marginal error, the iteration
    count and the tolerance used.
    """

    @staticmethod
    def forward(w, tau, a, b, mask, row_valid, col_valid, n_iters, tol):
        with torch.no_grad():
            log_k = _masked_log_kernel(w, tau, mask)
            sol = sinkhorn_iterate(log_k, a, b, row_valid, col_valid, n_iters, tol)
        return sol.plan, sol.error, torch.tensor(sol.n_iters), sol.tol

    @staticmethod
    def setup_context(ctx, inputs, output):
        w, tau, a, b, mask, row_valid, col_valid, _, _ = inputs
        plan, error, iters, tol = output
        ctx.mark_non_differentiable(error, iters, tol)
        ctx.has_rv, ctx.has_cv = row_valid is not None, col_valid is not None
        ctx.save_for_backward(plan, w, tau,
                              row_valid if row_valid is not None else None,
                              col_valid if col_valid is not None else None)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_plan, _grad_error, _grad_iters, _grad_tol):
        plan, w, tau, row_valid, col_valid = ctx.saved_tensors
        need_w, need_tau, need_a, need_b = ctx.needs_input_grad[:4]
        if not (need_w or need_tau or need_a or need_b):
            return (None,) * 9
        gw_tau, ga, gb = sinkhorn_vjp(plan, grad_plan, row_valid, col_valid)
        grad_w = gw_tau / tau
        grad_tau = None
        if need_tau:
            grad_tau = -(grad_w * w).sum((-2, -1), keepdim=True) / tau
            grad_tau = grad_tau.sum_to_size(tau.shape)
        return (grad_w if need_w else None, grad_tau, ga if need_a else None,
                gb if need_b else None, None, None, None, None, None)
