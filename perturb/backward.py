"""Reusable backward passes for regularized-argmax solvers.

Solvers compute the primal answer and know nothing about autograd; gradients come from one of
these (see the module docstring of :mod:`perturb.core` for the abstraction):

- :func:`implicit_root` — implicit differentiation of optimality conditions F(x*, θ) = 0:
  ∂x*/∂θ = −(∂F/∂x)⁻¹ ∂F/∂θ, so the vector–Jacobian product is
  ḡ_θ = −(∂F/∂θ)ᵀ u with (∂F/∂x)ᵀ u = ḡ_x. Memory does not depend on how x* was found.
- :func:`finite_difference_solve` — the central finite difference of Paulus et al. (2020):
  ḡ_w ≈ [z(w + ε ḡ_z) − z(w − ε ḡ_z)] / (2ε). Exact up to O(ε²) because every regularized argmax
  is the gradient of a convex function (its Jacobian is symmetric), two extra solver calls.
- :func:`straight_through` — forward the hard value, backward the soft one's gradient.
- perturbed optimizers (Berthet et al. 2020) live in :mod:`perturb.perturbed_optimizers`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from perturb import _linalg
from perturb._validation import check_choice, check_positive

__all__ = ["implicit_root", "finite_difference_solve", "straight_through", "LINEAR_SOLVES",
           "BACKWARD_MODES"]

#: The one vocabulary of gradient modes, for the registry and every direct solver function:
#: "auto" (the solver's preferred mode), "analytic" (a closed-form vector–Jacobian product),
#: "implicit" (implicit differentiation at the solution), "unroll" (autograd through the
#: solver's iterations or elimination) and "finite_difference" (works for every solver).
BACKWARD_MODES = ("auto", "analytic", "implicit", "unroll", "finite_difference")

LINEAR_SOLVES = ("dense", "lstsq", "cg")


def straight_through(hard: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """``hard`` in the forward pass, the gradient of ``soft`` in the backward pass.

    Computed as ``soft + (hard − soft).detach()``, so the value equals ``hard`` up to one rounding.
    Shape: any, ``hard`` and ``soft`` broadcast together.

    Raises:
        ValueError: ``hard`` or ``soft`` not a tensor, or shapes that do not broadcast.
    """
    if not isinstance(hard, torch.Tensor) or not isinstance(soft, torch.Tensor):
        raise ValueError(f"hard and soft must be tensors, got {type(hard).__name__} and "
                         f"{type(soft).__name__}")
    try:
        torch.broadcast_shapes(hard.shape, soft.shape)
    except RuntimeError:
        raise ValueError(f"hard and soft must have broadcastable shapes, got "
                         f"{tuple(hard.shape)} and {tuple(soft.shape)}") from None
    return soft + (hard - soft).detach()


# --------------------------------------------------------------------------------------------
# implicit differentiation
# --------------------------------------------------------------------------------------------

def _flat_event(t: torch.Tensor, event_dim: int) -> torch.Tensor:
    return t.reshape(*t.shape[:t.ndim - event_dim], -1)


def _dense_jacobian(F: torch.Tensor, x: torch.Tensor, event_dim: int) -> torch.Tensor:
    """J[b, k, j] = ∂F_k/∂x_j per batch element, assuming batch elements are independent."""
    event_shape = x.shape[x.ndim - event_dim:]
    m = event_shape.numel()
    eye = torch.eye(m, dtype=F.dtype, device=F.device).reshape(m, *([1] * (F.ndim - event_dim)),
                                                               *event_shape)
    basis = eye.expand(m, *F.shape)
    (rows,) = torch.autograd.grad(F, x, basis, retain_graph=True, is_grads_batched=True)
    # rows: (m, *batch, *event) with rows[k] = e_kᵀ J  ->  (*batch, m, m) with [b, k, j]
    rows = rows.reshape(m, *x.shape[:x.ndim - event_dim], m)
    return rows.movedim(0, -2)


def _cg(matvec: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, event_dim: int,
        tol: float = 1e-10, max_iter: int = 1000) -> torch.Tensor:
    """Batched conjugate gradient for symmetric positive (semi-)definite systems."""
    dims = tuple(range(b.ndim - event_dim, b.ndim))
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rs = (r * r).sum(dims, keepdim=True)
    b_norm = rs.sqrt().clamp_min(torch.finfo(b.dtype).tiny)
    for _ in range(max_iter):
        Ap = matvec(p)
        denom = (p * Ap).sum(dims, keepdim=True)
        alpha = torch.where(denom.abs() > 0, rs / denom.where(denom != 0, torch.ones_like(denom)),
                            torch.zeros_like(denom))
        x = x + alpha * p
        r = r - alpha * Ap
        rs_new = (r * r).sum(dims, keepdim=True)
        if bool((rs_new.sqrt() <= tol * b_norm).all()):
            break
        p = r + (rs_new / rs.where(rs != 0, torch.ones_like(rs))) * p
        rs = rs_new
    return x


def _implicit_vjp(optimality_fn: Callable[..., torch.Tensor], x_star: torch.Tensor,
                  params: Sequence[torch.Tensor], grad_x: torch.Tensor, event_dim: int,
                  linear_solve: str | Callable, needs: Sequence[bool]) -> list[torch.Tensor | None]:
    """ḡ_θ = −(∂F/∂θ)ᵀ u with (∂F/∂x)ᵀ u = ḡ_x; a pure function that tests call directly."""
    with torch.enable_grad():
        x = x_star.detach().requires_grad_(True)
        ps = [p.detach().requires_grad_(bool(n)) for p, n in zip(params, needs)]
        F = optimality_fn(x, *ps)
        if F.shape != x.shape:
            raise ValueError(f"optimality_fn must return the shape of x* {tuple(x.shape)}, "
                             f"got {tuple(F.shape)}")
        if callable(linear_solve):
            def matvec_t(u):  # (∂F/∂x)ᵀ u
                return torch.autograd.grad(F, x, u, retain_graph=True)[0]
            u = linear_solve(matvec_t, grad_x)
        elif linear_solve == "cg":
            def matvec_t(u):
                return torch.autograd.grad(F, x, u, retain_graph=True)[0]
            u = _cg(matvec_t, grad_x, event_dim)
        else:
            J = _dense_jacobian(F, x, event_dim)
            rhs = _flat_event(grad_x, event_dim).unsqueeze(-1)
            Jt = J.transpose(-1, -2)
            if linear_solve == "dense":
                u = _linalg.solve(Jt, rhs)
            else:  # least squares: systems with a known null space (gauge freedom)
                u = torch.linalg.pinv(Jt) @ rhs
            u = u.squeeze(-1).reshape(grad_x.shape)
        wanted = [p for p, n in zip(ps, needs) if n]
        grads = torch.autograd.grad(F, wanted, -u, allow_unused=True) if wanted else ()
    out, it = [], iter(grads)
    for p, n in zip(ps, needs):
        g = next(it) if n else None
        out.append(torch.zeros_like(p) if (n and g is None) else g)
    return out


class _ImplicitRoot(torch.autograd.Function):
    """Identity on a solution x*; backward by the implicit function theorem (see module doc)."""

    @staticmethod
    def forward(x_star, optimality_fn, event_dim, linear_solve, *params):
        return x_star.detach().clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, optimality_fn, event_dim, linear_solve, *params = inputs
        ctx.optimality_fn, ctx.event_dim, ctx.linear_solve = optimality_fn, event_dim, linear_solve
        ctx.save_for_backward(output, *params)

    @staticmethod
    def backward(ctx, grad_x):
        x_star, *params = ctx.saved_tensors
        needs = ctx.needs_input_grad[4:]
        grads = _implicit_vjp(ctx.optimality_fn, x_star, params, grad_x, ctx.event_dim,
                              ctx.linear_solve, needs) if any(needs) else [None] * len(params)
        return (None, None, None, None, *grads)


def implicit_root(optimality_fn: Callable[..., torch.Tensor], x_star: torch.Tensor,
                  *params: torch.Tensor, event_dim: int = 1,
                  linear_solve: str | Callable = "dense") -> torch.Tensor:
    """Attach a solution x* to the graph of ``params`` by implicit differentiation.

    Given optimality conditions F(x*, θ) = 0 that determine x* locally (∂F/∂x invertible), the
    returned tensor equals x* and its gradient is

        ḡ_θ = −(∂F/∂θ)ᵀ u,   where (∂F/∂x)ᵀ u = ḡ_x.

    The solver that found x* is never differentiated, so memory does not depend on its number
    of iterations (jaxopt's ``custom_root`` idea).

    Args:
        optimality_fn: ``F(x, *params) -> Tensor`` of the same shape as x, differentiable by
            autograd; batch elements must be independent (F of one element uses only its own x).
        x_star: the solution, shape ``(*batch, *event)`` (detached inside).
        *params: the tensors to differentiate with respect to.
        event_dim: number of trailing dims of x that form one problem.
        linear_solve: ``"dense"`` (build ∂F/∂x per problem, LU solve: O(m³) for m event entries),
            ``"lstsq"`` (pseudo-inverse, for systems with a null space such as a gauge freedom),
            ``"cg"`` (matrix-free conjugate gradient; needs ∂F/∂x symmetric positive definite),
            or a callable ``solve(matvec_t, b) -> u`` solving ``matvec_t(u) = b``.

    Shape:
        x_star: ``(*batch, *event)``; output: the same.

    Returns:
        x* (a copy) whose backward is the implicit one. Double backward is not supported.

    Example::

        # x* = softmax(w) is the root of F(x, w) = log x − w − log Σ e^w ... or, with the
        # simplex constraint eliminated, any system that pins x*:
        x = implicit_root(lambda x, w: x - torch.softmax(w, -1), torch.softmax(w, -1), w)
    """
    if not callable(optimality_fn):
        raise ValueError(f"optimality_fn must be a callable F(x, *params), got {optimality_fn!r}")
    if not callable(linear_solve):
        check_choice(linear_solve, LINEAR_SOLVES, "linear_solve")
    return _ImplicitRoot.apply(x_star, optimality_fn, event_dim, linear_solve, *params)


# --------------------------------------------------------------------------------------------
# finite differences
# --------------------------------------------------------------------------------------------

def _fd_vjp(solve_fn: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor,
            grad_z: torch.Tensor, eps: float, event_dim: int) -> torch.Tensor:
    """J ḡ ≈ ‖ḡ‖ [z(w + εd) − z(w − εd)] / (2ε), d = ḡ/‖ḡ‖ per problem (J symmetric)."""
    dims = tuple(range(w.ndim - event_dim, w.ndim))
    grad_z = grad_z.expand_as(w)
    norm = grad_z.norm(dim=dims, keepdim=True)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))
    d = grad_z / safe
    with torch.no_grad():
        diff = solve_fn(w + eps * d) - solve_fn(w - eps * d)
    return torch.where(norm > 0, diff * (norm / (2 * eps)), torch.zeros_like(diff))


class _FiniteDifference(torch.autograd.Function):
    """z = solve(w) forward; central finite-difference vector–Jacobian product backward."""

    @staticmethod
    def forward(w, solve_fn, eps, event_dim):
        with torch.no_grad():
            return solve_fn(w)

    @staticmethod
    def setup_context(ctx, inputs, output):
        w, solve_fn, eps, event_dim = inputs
        ctx.solve_fn, ctx.eps, ctx.event_dim = solve_fn, eps, event_dim
        ctx.save_for_backward(w)

    @staticmethod
    def backward(ctx, grad_z):
        (w,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return _fd_vjp(ctx.solve_fn, w, grad_z, ctx.eps, ctx.event_dim), None, None, None


def finite_difference_solve(solve_fn: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor,
                            eps: float | None = None, event_dim: int = 1) -> torch.Tensor:
    """Run ``solve_fn(w)`` and differentiate it by central finite differences.

    ḡ_w ≈ ‖ḡ_z‖ · [z(w + ε d) − z(w − ε d)] / (2ε) with d = ḡ_z/‖ḡ_z‖ per problem (Paulus et al.
    2020, App.). This is the vector–Jacobian product because the Jacobian of a regularized
    argmax is symmetric (it is the Hessian of the convex conjugate of τf). Error O(ε²); two
    extra solver calls and no Jacobian in memory.

    Args:
        solve_fn: maps scores ``(*batch, *event)`` to a solution of the same shape.
        w: scores.
        eps: step; default ``1e-3`` in float64 and ``1e-2`` in float32 (rounding/truncation balance).
        event_dim: trailing dims forming one problem (the direction is normalised per problem).

    Shape: ``w``: ``(*batch, *event)``; output: the same.
    """
    if eps is None:
        eps = 1e-3 if w.dtype == torch.float64 else 1e-2
    if not callable(solve_fn):
        raise ValueError(f"solve_fn must be a callable w -> y, got {solve_fn!r}")
    check_positive(eps, "eps")
    return _FiniteDifference.apply(w, solve_fn, float(eps), event_dim)


def resolve_backward(backward: str, native: Sequence[str], what: str = "this solver") -> str:
    """The gradient mode to run for a requested ``backward`` (:data:`BACKWARD_MODES`):
    ``"auto"`` is the solver's first native mode; a native mode, or ``"finite_difference"``
    (wrapped by :func:`solve_with_backward` where it is not native), is kept.

    Raises:
        ValueError: an unknown mode, or one ``what`` does not support (listing those it does).
    """
    check_choice(backward, BACKWARD_MODES, "backward")
    if backward == "auto":
        return native[0]
    if backward in native or backward == "finite_difference":
        return backward
    supported = ("auto", *native) + tuple(m for m in ("finite_difference",) if m not in native)
    raise ValueError(f"backward={backward!r} is not supported for {what}; supported: "
                     f"{', '.join(map(repr, supported))}")


def solve_with_backward(solve: Callable[[torch.Tensor, str], torch.Tensor], w: torch.Tensor,
                        mode: str, native: Sequence[str], event_dim: int,
                        held: dict[str, object] | None = None) -> torch.Tensor:
    """``solve(w, mode)`` for a mode from :func:`resolve_backward`; ``"finite_difference"``
    where the solver has no native one runs its first native mode inside
    :func:`finite_difference_solve` (``event_dim`` trailing dims per problem).

    Finite differences differentiate ``w`` only: ``held`` names the other inputs of ``solve``
    (e.g. ``{"tau": tau}``), and one that requires a gradient is refused rather than silently
    left without one.
    """
    if mode == "finite_difference" and mode not in native:
        if torch.is_grad_enabled():
            for name, value in (held or {}).items():
                if isinstance(value, torch.Tensor) and value.requires_grad:
                    raise ValueError(
                        f"backward='finite_difference' differentiates the scores only, but "
                        f"{name} requires a gradient; use backward='auto' (or detach {name})")
        return finite_difference_solve(lambda v: solve(v, native[0]), w, event_dim=event_dim)
    return solve(w, mode)
