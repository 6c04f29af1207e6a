r"""Sinkhorn's algorithm: the entropic projection onto the Birkhoff or a transport polytope.

With the negative entropy f(P) = Σ P log P the regularized argmax (:mod:`perturb.core`) over
the Birkhoff polytope (doubly stochastic matrices) or the transport polytope
U(a, b) = {P ≥ 0 : P1 = a, Pᵀ1 = b} is entropic optimal transport, solved by Sinkhorn's
iterations:

.. math::

    P^\star = \arg\max_{P \ge 0,\ P1 = a,\ P^\top 1 = b} \langle W, P\rangle + \tau H(P),
    \qquad P^\star_{ij} = \exp\big((W_{ij} + f_i + g_j)/\tau\big),

with H(P) = −Σ P log P and a = b = 1 (doubly stochastic) unless marginals are given. This is
POT's ``ot.sinkhorn(a, b, M=-W, reg=tau)``. The iterations and their implicit backward live in
the private engine :mod:`perturb.structured.permutations._sinkhorn`.

Gradients: ``backward="implicit"`` (default) differentiates the fixed point (memory independent of
the iteration count; derivation in :mod:`perturb.structured.permutations._sinkhorn` and
docs/permutations.md), ``backward="unroll"`` runs autograd through the iterations.

References: Cuturi, "Sinkhorn distances", NeurIPS 2013 (arXiv:1306.0895); Mena et al., "Learning
latent permutations with Gumbel-Sinkhorn networks", ICLR 2018 (arXiv:1802.08665); Peyré & Cuturi,
"Computational optimal transport" (arXiv:1803.00567), §4.4 (log-domain), Eisenberger et al.,
"A unified framework for implicit Sinkhorn differentiation", CVPR 2022 (arXiv:2205.06688).
"""
from __future__ import annotations

import math
import numbers
import warnings

import torch

from perturb._precision import full_precision
from perturb._validation import (
    broadcasts_to,
    check_int,
    check_scores,
    check_tau,
    traced,
    validation_enabled,
)
from perturb.backward import resolve_backward, solve_with_backward
from perturb.noise import Gumbel, Noise
from perturb.core import perturb
from perturb.structured.permutations._sinkhorn import _masked_log_kernel, sinkhorn_iterate
from perturb.structured.permutations._sinkhorn_vjp import _SinkhornImplicit

__all__ = ["sinkhorn", "gumbel_sinkhorn", "SinkhornConvergenceWarning"]

#: The native gradient modes of :func:`sinkhorn` (and of the registered solvers that call it).
SINKHORN_BACKWARD = ("implicit", "unroll")


class SinkhornConvergenceWarning(UserWarning):
    """Sinkhorn stopped at ``n_iters`` with a marginal error above ``tol``."""


def _check_tol(tol: float) -> float:
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not (
            math.isfinite(float(tol)) and tol >= 0):
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    return float(tol)


def _check_marginal(x: torch.Tensor, name: str, size: int, batch: torch.Size,
                    like: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a floating torch.Tensor of shape (*batch, {size}), "
                         f"got {type(x).__name__ if not isinstance(x, torch.Tensor) else x.dtype}")
    if x.ndim == 0 or x.shape[-1] != size:
        raise ValueError(f"{name} must have shape (*batch, {size}) matching log_alpha, "
                         f"got {tuple(x.shape)}")
    try:
        x = x.to(like.dtype).expand(*batch, size)
    except RuntimeError:
        raise ValueError(f"{name} of shape {tuple(x.shape)} does not broadcast to the batch "
                         f"shape {tuple(batch)} of log_alpha") from None
    return x


def _prepare_tau(tau: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """τ as a ``(*batch, 1, 1)`` tensor on the scores' device and dtype. A tensor τ holds one
    temperature per problem and must broadcast to the batch shape without enlarging it (the rule
    of :func:`perturb._validation.scale_by_tau`)."""
    check_tau(tau)
    batch = like.shape[:-2]
    if isinstance(tau, torch.Tensor):
        if not broadcasts_to(tau.shape, batch):
            raise ValueError(f"tau of shape {tuple(tau.shape)} must broadcast against the batch "
                             f"shape {tuple(batch)} of the scores (shape {tuple(like.shape)})")
        t = tau.to(dtype=like.dtype, device=like.device)
        return t.reshape(*t.shape, 1, 1)
    return torch.tensor(float(tau), dtype=like.dtype, device=like.device)


@full_precision
def sinkhorn(log_alpha: torch.Tensor, tau: float | torch.Tensor = 1.0, n_iters: int = 1000,
             tol: float = 1e-6, backward: str = "auto", a: torch.Tensor | None = None,
             b: torch.Tensor | None = None, mask: torch.Tensor | None = None, *,
             accelerate: bool = True, eps_scaling: bool | None = None) -> torch.Tensor:
    r"""Entropic projection onto the Birkhoff polytope (or a transport polytope), in log space.

    Solves

    .. math::

        P = \arg\max_{P \ge 0,\ P1 = a,\ P^\top 1 = b} \langle W, P\rangle + \tau H(P),
        \qquad H(P) = -\textstyle\sum_{ij} P_{ij}\log P_{ij},

    with W = ``log_alpha``, so P = exp((W + f1ᵀ + 1gᵀ)/τ) for the dual potentials f, g. Without
    ``a``/``b`` the plan is doubly stochastic (a = b = 1). With them it is POT's entropic
    transport plan ``ot.sinkhorn(a, b, M=-W, reg=tau, method="sinkhorn_log")``. Iterations
    alternate exact column and row normalisations on the absorbed kernel K = exp(W/τ + u + v)
    with two batched matrix–vector products per iteration (4 dispatched ops, 2 reads of K),
    starting on K = exp(W/τ) itself when the centred W/τ spans a moderate range (≤ 60 in
    float32, ≤ 400 in float64) and otherwise in log space (log-sum-exp); the scalings are
    absorbed into the log potentials only when they leave a safe range (stabilised Sinkhorn),
    and a block that would leave the floating range is redone in log space, so scores of ±1e4
    and τ = 1e-3 stay finite. At checks between blocks (the only host syncs; their spacing adapts to the observed
    rate) the row error ``max_i |(P1)_i − a_i|`` is read off the row update at no extra cost; the
    loop stops when it is ≤ ``tol`` in every problem (the columns are then exact). If ``n_iters`` runs out first a :class:`SinkhornConvergenceWarning`
    is issued (the iterations needed grow roughly like 1/τ). A ``tol`` below the rounding
    floor 4 ε max|W/τ| (ε the dtype's epsilon, W centred by rows and columns; about 2e-5 in
    float32 at ``|W|/τ ≈ 40``) is raised to it: no float32 plan is more accurate.

    Padded batches (``mask``): ``mask[..., i, j] = False`` gives entry (i, j) zero mass. A row
    (column) whose entries are all masked is padding: it gets zero mass and its ``a_i`` (``b_j``)
    is ignored. The usual layout for variable sizes is the outer product of per-row and
    per-column validity, e.g. ``mask = (arange(n) < n_k)[:, None] & (arange(m) < m_k)[None, :]``
    per problem; the result then equals the unpadded problem solved alone, zero-padded. Without
    ``a``/``b`` the valid rows and columns must be equally many.

    Args:
        log_alpha: scores W.
        tau: temperature τ > 0: a number or a tensor broadcastable to the batch shape.
        n_iters: maximum number of iterations (each one column and one row update).
        tol: tolerance on the max-abs marginal error.
        backward: ``"auto"`` = ``"implicit"`` (implicit function theorem at the fixed point:
            one batched (min(n, m))-dim Cholesky solve, memory independent of ``n_iters``;
            gives the gradient of the plan w.r.t. W, τ, a, b), ``"unroll"`` (autograd through
            the iterations; memory grows with the iterations used) or ``"finite_difference"``
            (two more solves; the gradient w.r.t. W only), as for
            :func:`perturb.regularized_argmax`.
        a: row marginals, positive. Required for rectangular plans (with ``b``).
        b: column marginals, positive, Σb = Σa.
        mask: boolean, True for entries that may carry mass.
        accelerate: over-relax the updates with ω estimated from the observed rate and polish a
            slow linear tail with Sinkhorn–Newton steps (default). The fixed point is unchanged;
            ``False`` runs plain Sinkhorn (same result to ``tol``).
        eps_scaling: solve at temperatures 2^s τ first (s from the spread of W/τ down to 0),
            warm-starting each stage: fewer iterations at small τ (e.g. 747 instead of 1,427 at
            τ = 0.05, 16 x 64 x 64), more at moderate τ. ``None`` (default) decides from the
            spread of the centred W/τ: on above 64 (e.g. unit-scale scores at τ ≲ 0.1, and
            always at extreme scales such as ±1e4 scores at τ = 1e-3, which plain iterations
            cannot solve), off below; ``True``/``False`` force it.

    Shape:
        log_alpha: ``(*batch, n, m)`` (m = n without marginals); a: ``(*batch, n)``;
        b: ``(*batch, m)`` (leading dims broadcast); mask: broadcastable to ``(*batch, n, m)``.
        Output: ``(*batch, n, m)``.

    Returns:
        The plan P, same dtype and device as ``log_alpha``. float16 / bfloat16 scores (and
        autocast regions) are solved in float32 and the plan is returned in their dtype
        (:mod:`perturb._precision`).

    Raises:
        ValueError: non-square ``log_alpha`` without marginals, τ ≤ 0, NaN/inf scores,
            ``a``/``b`` not positive, of the wrong shape or with different sums, a bad ``mask``,
            ``n_iters`` < 1, ``tol`` < 0, an unknown ``backward``.

    Gradients w.r.t. ``a``/``b`` are defined up to adding t to ∂a and −t to ∂b (only Σa = Σb is
    feasible); the implicit mode returns the representative with Σ∂a = Σ∂b.

    Complexity: O(n m) per iteration and problem; implicit backward O(n m min(n, m)).

    Example::

        >>> W = torch.randn(8, 5, 5, requires_grad=True)
        >>> P = sinkhorn(W, tau=1.0)
        >>> torch.allclose(P.sum(-1), torch.ones(8, 5), atol=1e-5)
        True
        >>> (P * torch.randn(8, 5, 5)).sum().backward()

    References: Cuturi (2013), arXiv:1306.0895; Mena et al. (2018), arXiv:1802.08665.
    """
    if not isinstance(log_alpha, torch.Tensor):
        raise ValueError(f"log_alpha must be a torch.Tensor, got {type(log_alpha).__name__}")
    if (a is None) != (b is None):
        raise ValueError("a and b must be given together (row and column marginals); got "
                         + ("only a" if b is None else "only b"))
    if a is None and log_alpha.ndim >= 2 and log_alpha.shape[-1] != log_alpha.shape[-2]:
        raise ValueError(f"log_alpha must be square (*batch, n, n) for a doubly stochastic plan, "
                         f"got shape {tuple(log_alpha.shape)}; pass marginals a and b for a "
                         f"rectangular transport plan")
    check_scores(log_alpha, "log_alpha", min_ndim=2)
    n_iters = check_int(n_iters, "n_iters", low=1)
    tol = _check_tol(tol)
    mode = resolve_backward(backward, SINKHORN_BACKWARD, "sinkhorn")
    if mode == "finite_difference":
        return solve_with_backward(
            lambda v, m: sinkhorn(v, tau, n_iters, tol, m, a, b, mask, accelerate=accelerate,
                                  eps_scaling=eps_scaling),
            log_alpha, mode, SINKHORN_BACKWARD, event_dim=2, held={"tau": tau, "a": a, "b": b})
    w = log_alpha
    tau_t = _prepare_tau(tau, w)
    batch = torch.broadcast_shapes(w.shape[:-2], tau_t.shape[:-2])
    n, m = w.shape[-2:]

    row_valid = col_valid = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a boolean tensor of shape (*batch, {n}, {m}), got "
                             f"{mask.dtype if isinstance(mask, torch.Tensor) else type(mask)}")
        try:
            batch = torch.broadcast_shapes(batch, mask.shape[:-2] if mask.ndim >= 2 else ())
            mask = mask.to(w.device).expand(*batch, n, m)
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to "
                             f"(*batch, n, m) = {tuple(batch) + (n, m)}") from None
        row_valid = mask.any(-1)
        col_valid = mask.any(-2)
        if not bool(row_valid.any(-1).all()):
            raise ValueError("mask leaves a problem with no valid entry")
    w = w.expand(*batch, n, m)

    # row_valid and col_valid are both set (from mask) or both None; so are a and b (checked
    # above)
    if a is None or b is None:
        a_t = torch.ones(*batch, n, dtype=w.dtype, device=w.device)
        b_t = torch.ones(*batch, m, dtype=w.dtype, device=w.device)
        if row_valid is not None and col_valid is not None:
            if validation_enabled() and not bool((row_valid.sum(-1) == col_valid.sum(-1)).all()):
                raise ValueError("mask: a doubly stochastic plan needs as many valid rows as valid "
                                 "columns in every problem; pass marginals a and b otherwise")
            a_t = a_t * row_valid
            b_t = b_t * col_valid
    else:
        a_t = _check_marginal(a, "a", n, batch, w)
        b_t = _check_marginal(b, "b", m, batch, w)
        if validation_enabled():
            for x, name, valid in ((a_t, "a", row_valid), (b_t, "b", col_valid)):
                xv = x if valid is None else torch.where(valid, x, 1.0)
                if not bool((torch.isfinite(xv) & (xv > 0)).all()):
                    raise ValueError(f"{name} must be finite and > 0 (use mask to give rows or "
                                     f"columns zero mass)")
        if row_valid is not None and col_valid is not None:
            a_t = a_t * row_valid
            b_t = b_t * col_valid
        if validation_enabled():
            sa, sb = a_t.sum(-1), b_t.sum(-1)
            rtol = 1e-4 if w.dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-8
            if not bool(((sa - sb).abs() <= rtol * torch.maximum(sa, sb)).all()):
                k = int(((sa - sb).abs() > rtol * torch.maximum(sa, sb)).flatten().nonzero()[0])
                raise ValueError(f"a and b must have equal sums (total mass), got sum(a) = "
                                 f"{sa.flatten()[k].item():.6g} and sum(b) = "
                                 f"{sb.flatten()[k].item():.6g}")

    if mode == "implicit":
        plan, error, _, tol_used = _SinkhornImplicit.apply(
            w, tau_t, a_t, b_t, mask, row_valid, col_valid, n_iters, tol, accelerate,
            eps_scaling)
    else:
        sol = sinkhorn_iterate(_masked_log_kernel(w, tau_t, mask), a_t, b_t, row_valid,
                               col_valid, n_iters, tol, accelerate=accelerate,
                               eps_scaling=eps_scaling)
        plan, error, tol_used = sol.plan, sol.error, sol.tol
    _warn_if_inaccurate(error, tol_used, tol, n_iters, tau_t, a_t, w.dtype)
    return plan


def _warn_if_inaccurate(error: torch.Tensor, tol_used: torch.Tensor, tol: float, n_iters: int,
                        tau: torch.Tensor, a: torch.Tensor, dtype: torch.dtype) -> None:
    if traced(error):  # no host read inside torch.func / torch.compile
        return
    if not bool((error <= tol_used).all()):
        warnings.warn(
            f"sinkhorn did not converge: marginal error {float(error.max()):.3g} > tol={tol:g} "
            f"after n_iters={n_iters} iterations (tau={float(tau.detach().min()):g}); increase "
            f"n_iters (the iterations needed grow like 1/tau), use a larger tau, or loosen tol. "
            f"The 'implicit' backward differentiates the returned plan as the solution for its "
            f"own row sums, which are off by that error: for deliberately short runs use "
            f"backward='unroll'",
            SinkhornConvergenceWarning, stacklevel=3)
    elif bool(((tol_used > tol) & (tol_used > 1e-4 * a.amax(-1))).any()):
        # the rounding floor (it scales with the mass, like the error) raised tol, and it is
        # coarse relative to the mass: say so; a floor below tol is no news
        advice = ("a larger tau" if dtype == torch.float64 else "float64 or a larger tau")
        warnings.warn(
            f"sinkhorn: log_alpha/tau spans too many orders of magnitude for {dtype}: the "
            f"marginals are only accurate to about {float(tol_used.max()):.3g} (rounding of the "
            f"exponent), not tol={tol:g}; use {advice}",
            SinkhornConvergenceWarning, stacklevel=3)


def gumbel_sinkhorn(log_alpha: torch.Tensor, tau: float | torch.Tensor = 1.0,
                    noise: Noise | None = None,
                    n_samples: int | None = None, generator: torch.Generator | None = None,
                    **kw) -> torch.Tensor:
    r"""Gumbel-Sinkhorn: ``sinkhorn(perturb(log_alpha, noise, n_samples, generator), tau, **kw)``.

    The stochastic softmax of :mod:`perturb.core` for permutations (Mena et al. 2018): the
    scores are perturbed, P = Sinkhorn((W + ε)/τ), and as τ → 0 the sample tends to the exact
    matching of W + ε (for Gumbel noise, a sample of the perturb-and-MAP distribution over
    permutations). Any noise of :mod:`perturb.noise` may be used.

    Args:
        log_alpha: scores W.
        tau: temperature (as :func:`sinkhorn`).
        noise: a :class:`perturb.noise.Noise`; default ``Gumbel()``.
        n_samples: independent samples in a new leading dim.
        generator: ``torch.Generator`` for reproducible noise.
        **kw: passed to :func:`sinkhorn` (``n_iters``, ``tol``, ``backward``, ``a``, ``b``,
            ``mask``).

    Shape: ``(*batch, n, n)`` -> ``(*batch, n, n)``, or ``(n_samples, *batch, n, n)``.

    Returns:
        Soft permutation matrices (doubly stochastic, or plans with marginals a, b).

    Raises:
        ValueError: as :func:`sinkhorn` and :func:`perturb.perturb`.

    Example::

        >>> g = torch.Generator().manual_seed(0)
        >>> P = gumbel_sinkhorn(torch.randn(4, 6, 6), tau=0.3, n_samples=10, generator=g)
        >>> P.shape
        torch.Size([10, 4, 6, 6])

    References: Mena et al. (2018), arXiv:1802.08665.

    See Also:
        - :func:`perturb.structured.sinkhorn`: the scaling without noise
        - :func:`perturb.structured.matching`: the exact assignment (the τ → 0 limit)
    """
    check_scores(log_alpha, "log_alpha", min_ndim=2)
    noise = Gumbel() if noise is None else noise
    return sinkhorn(perturb(log_alpha, noise, n_samples, generator), tau, **kw)
