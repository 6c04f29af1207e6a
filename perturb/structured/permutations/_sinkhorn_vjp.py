r"""The implicit backward of the Sinkhorn iterations of
:mod:`perturb.structured.permutations._sinkhorn` (private).

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

import torch

from perturb._autograd import once_differentiable
from perturb._vmap import fold_vmap
from perturb.structured.permutations._sinkhorn import (_masked_log_kernel, _solve_psd,
                                                       sinkhorn_iterate)


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
    # a row or column whose mass underflowed to 0 (a plan stopped short at extreme scales)
    # carries no mass: treated as padding, it would otherwise divide 0 by 0
    a_s = torch.where(a_s > 0, a_s, 1.0)
    b_s = torch.where(b_s > 0, b_s, 1.0)
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
    def forward(w, tau, a, b, mask, row_valid, col_valid, n_iters, tol, accelerate=True,
                eps_scaling=None):
        with torch.no_grad():
            log_k = _masked_log_kernel(w, tau, mask)
            sol = sinkhorn_iterate(log_k, a, b, row_valid, col_valid, n_iters, tol,
                                   accelerate=accelerate, eps_scaling=eps_scaling,
                                   overwrite=True)
        iters = sol.n_iters if isinstance(sol.n_iters, torch.Tensor) else torch.tensor(
            sol.n_iters)
        return sol.plan, sol.error, iters, sol.tol

    @staticmethod
    def setup_context(ctx, inputs, output):
        w, tau, a, b, mask, row_valid, col_valid = inputs[:7]
        plan, error, iters, tol = output
        ctx.mark_non_differentiable(error, iters, tol)
        ctx.has_rv, ctx.has_cv = row_valid is not None, col_valid is not None
        ctx.save_for_backward(plan, w, tau,
                              row_valid if row_valid is not None else None,
                              col_valid if col_valid is not None else None)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_plan, _grad_error, _grad_iters, _grad_tol):
        plan, w, tau, row_valid, col_valid = ctx.saved_tensors
        need_w, need_tau, need_a, need_b = ctx.needs_input_grad[:4]
        if not (need_w or need_tau or need_a or need_b):
            return (None,) * 11
        gw_tau, ga, gb = sinkhorn_vjp(plan, grad_plan, row_valid, col_valid)
        grad_w = gw_tau / tau
        grad_tau = None
        if need_tau:
            grad_tau = -(grad_w * w).sum((-2, -1), keepdim=True) / tau
            grad_tau = grad_tau.sum_to_size(tau.shape)
        return (grad_w if need_w else None, grad_tau, ga if need_a else None,
                gb if need_b else None, None, None, None, None, None, None, None)

    @staticmethod
    def vmap(info, in_dims, *args):
        # the forward iterates to convergence (host reads): the vmapped dim is folded into the
        # batch; the iteration count is the one output without batch dims
        # (w carries the batch; τ, a, b and the masks broadcast against it)
        return fold_vmap(_SinkhornImplicit.apply, info, in_dims, args, expand=(0,),
                         broadcast=range(1, 7), unbatched_outputs=(2,))
