r"""Sinkhorn iterations (log domain and absorbed scaling, accelerated)
(private; the public function is :func:`perturb.structured.permutations.matrix_scaling.sinkhorn`).

The problem (entropic optimal transport with cost −W and regularization τ)::

    P* = argmax_{P ≥ 0, P 1 = a, Pᵀ 1 = b}  ⟨W, P⟩ − τ Σ_ij P_ij log P_ij

has the solution P = exp(W/τ + u 1ᵀ + 1 vᵀ) with dual potentials u ∈ R^n, v ∈ R^m (f = τu, g = τv
in the usual notation), found by alternating the exact block updates ("Sinkhorn" in log space)::

    v ← log b − LSE_i(W_ij/τ + u_i),      u ← log a − LSE_j(W_ij/τ + v_j).

The same updates in the exp domain on an absorbed kernel K = exp(W/τ + u0 1ᵀ + 1 v0ᵀ) are
multiplicative, ev ← b / Kᵀ eu, eu ← a / K ev (u = u0 + log eu): two batched matrix–vector
products per iteration instead of two log-sum-exps over the whole matrix. They run whenever the
scalings stay in a safe range, the kernel being re-absorbed (u0 ← u) only when they leave a
smaller one (stabilised Sinkhorn, Schmitzer 2019, arXiv:1610.06519), and in log space otherwise.

The implicit backward of these iterations (and which fixed point it differentiates) is
:mod:`perturb.structured.permutations._sinkhorn_vjp`; on CUDA the scaling iterations are
replayed from captured graphs (:mod:`perturb.structured.permutations._sinkhorn_graphs`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from perturb import _linalg
from perturb._settings import CUDA_GRAPHS
from perturb._validation import compiling_now, traced
from perturb.structured.permutations._sinkhorn_graphs import (GRAPH_CHUNK, graphed_iterations,
                                                               relaxed)


class SinkhornSolution(NamedTuple):
    """Diagnostics of one batched Sinkhorn run."""

    plan: torch.Tensor      # (*batch, n, m)
    u: torch.Tensor         # (*batch, n)  row potentials divided by tau
    v: torch.Tensor         # (*batch, m)  column potentials divided by tau
    error: torch.Tensor     # (*batch,)    max_i |P 1 − a|_i of the returned plan
    n_iters: int | torch.Tensor  # iterations run (a 0-dim tensor under torch.compile)
    tol: torch.Tensor       # (*batch,)    tolerance used: max(tol, rounding floor)


def _masked_log_kernel(w: torch.Tensor, tau: torch.Tensor,
                       mask: torch.Tensor | None) -> torch.Tensor:
    """W/τ with masked entries at a huge finite negative value (exp → 0, no NaN in autograd)."""
    log_k = w / tau
    if mask is not None:
        neg = torch.finfo(w.dtype).min / 8
        log_k = torch.where(mask, log_k, torch.full((), neg, dtype=w.dtype, device=w.device))
    return log_k


class _Kernel(NamedTuple):
    """The absorbed kernel of a scaling block and its scalings, carried to the next block while
    the scalings stay moderate (absorbing them costs an exp over the whole kernel)."""

    K: torch.Tensor         # (*batch, n, m) exp(log K + u0 + v0); 1 on padded entries
    u0: torch.Tensor        # (*batch, n, 1) potentials absorbed into K
    v0: torch.Tensor        # (*batch, 1, m)
    eu: torch.Tensor        # row scalings: (*batch, n, 1) on CUDA, (prod(batch), 1, n) elsewhere
    ev: torch.Tensor        # column scalings: (*batch, m, 1) on CUDA, (prod(batch), 1, m) else
    rs: torch.Tensor | None = None  # K ev, row sums before the row update the block stopped at


class _State(NamedTuple):
    u: torch.Tensor         # (*batch, n, 1) row potentials / tau
    v: torch.Tensor         # (*batch, 1, m) column potentials / tau
    error: torch.Tensor     # (*batch,) row error of the plan (u, v) (its columns are exact)
    bad: torch.Tensor       # () bool: the block left the safe range (redo it in log space)
    kern: _Kernel | None = None  # a scaling block's kernel and scalings
    keep: torch.Tensor | None = None  # () bool: the scalings are moderate, carry kern on


def _log_block(log_k, u, v, log_a, log_b, a, n_iters, rv, cv) -> _State:
    """``n_iters`` plain log-domain iterations (3 ops per half: add, logsumexp, sub); ``a`` is
    the row marginal as a column ``(*batch, n, 1)``.

    Returns the potentials after the last column update (exact columns) and the row error of that
    plan, read off the row update: P1 = a ⊙ exp(u_old − u_new).
    """
    for i in range(n_iters):
        v = log_b - torch.logsumexp(log_k + u, dim=-2, keepdim=True)
        if cv is not None:
            v = torch.where(cv, v, 0.0)
        u_new = log_a - torch.logsumexp(log_k + v, dim=-1, keepdim=True)
        if rv is not None:
            u_new = torch.where(rv, u_new, 0.0)
        if i == n_iters - 1:
            with torch.no_grad():
                err = (a * torch.expm1(u - u_new)).abs().amax((-2, -1))
            return _State(u, v, err, torch.zeros((), dtype=torch.bool, device=u.device))
        u = u_new
    raise AssertionError("n_iters >= 1")


#: eps_scaling=None (auto) uses ε-scaling when spread(W/τ) exceeds this (sinkhorn_iterate)
EPS_SCALING_SPREAD = 64.0
_EPS_BASE = 2.0   # ratio of successive ε-scaling temperatures (4 and 8 measured: slower at τ ≳ 0.02)
#: a float32 problem whose rounding floor 4 ε (1 + spread) exceeds this is solved in float64
F32_FLOOR_LIMIT = 1e-4
_F32_EPS = torch.finfo(torch.float32).eps

#: Deprecated spelling of ``perturb.settings(cuda_graphs=False)``, still honoured: graphs are
#: replayed only while both are true.
USE_CUDA_GRAPHS = True


def _graphs_usable(K: torch.Tensor) -> bool:
    """Replay captured graphs (:mod:`._sinkhorn_graphs`): CUDA, no autograd, not capturing."""
    return (USE_CUDA_GRAPHS and CUDA_GRAPHS.value and K.is_cuda and not torch.is_grad_enabled()
            and not torch.cuda.is_current_stream_capturing())


def _columns(K: torch.Tensor) -> bool:
    """Layout of the scalings: columns ``(*batch, n, 1)`` on CUDA (cuBLAS mat-vecs, the captured
    graphs of :mod:`._sinkhorn_graphs`), rows ``(*batch, 1, n)`` elsewhere: on the CPU a
    row-vector product ``x @ K`` is 4-8x faster than ``K @ x`` (measured, torch 2.13 / MKL, 32 x
    128 x 128 float64: 0.10 vs 0.52 ms on one thread; and ``K @ x`` with several threads on a
    loaded machine stalled at 12 ms)."""
    return K.is_cuda


def _new_kernel(log_k, u, v, a, b, pad, cold: bool = False) -> _Kernel:
    """Absorb the potentials: K = exp(log K + u + v) (``cold``: u = v = 0, K = exp(log K)),
    scalings 1."""
    K = torch.exp(log_k if cold else log_k + u + v)
    if pad is not None:  # padded rows/columns: K = 1 there and a = b = 0 give zero scalings
        K = K.masked_fill(pad, 1.0)
    *batch, n, m = K.shape
    if _columns(K):
        return _Kernel(K, u, v, K.new_ones(*batch, n, 1), K.new_ones(*batch, m, 1))
    return _Kernel(K, u, v, K.new_ones(math.prod(batch), 1, n), K.new_ones(math.prod(batch), 1, m))


def _scaling_block(log_k, u, v, a, b, n_iters, omega, pad, safe, kern: _Kernel | None = None,
                   absorb: float | None = None) -> _State:
    """``n_iters`` iterations on the absorbed kernel K = exp(log K + u + v) (stabilised scaling).

    With the potentials absorbed, K is the current plan (entries ≤ max(a, b)); the iterations
    update multiplicative scalings ``eu``, ``ev`` (start 1) with two batched matrix–vector
    products and two divisions: ``ev ← b / Kᵀeu``, ``eu ← a / K ev`` (4 ops per iteration, memory
    traffic 2 reads of K). ``omega`` (``(*batch, 1, 1)`` or None) over-relaxes both updates,
    x ← x^{1−ω} x_plain^{ω} (ω = 1 is plain Sinkhorn); the last column update is always plain so
    that the returned plan has exact columns. ``bad`` is set when a scaling leaves
    [e^{−safe}, e^{safe}] or is not finite: then the caller redoes the block in log space.

    ``kern`` (from the previous block's state) continues on that kernel and its scalings instead
    of absorbing (u, v): the returned state carries its kernel on (``kern``) while every scaling
    stays within [e^{−absorb}, e^{absorb}] (``absorb`` None: never), otherwise the next block
    absorbs them. The returned potentials are always the totals u0 + log eu, v0 + log ev.
    """
    if kern is None:
        kern = _new_kernel(log_k, u, v, a, b, pad)
    K, u0, v0, eu, ev, rs = kern
    Kt = K.mT
    cols = _columns(K)
    if cols:
        a_s, b_s = a.unsqueeze(-1), b.unsqueeze(-1)

        def col_sums(x):
            return Kt @ x

        def row_sums(y):
            return K @ y
    else:  # batch dims flattened: torch.bmm directly (matmul's reshaping costs ~40 µs a call)
        *batch, n, m = K.shape
        # a, b may broadcast against K's batch (vmap folds the vmapped dim into it)
        a_s, b_s = a.expand(*batch, n).reshape(-1, 1, n), b.expand(*batch, m).reshape(-1, 1, m)
        K3, Kt3 = K.reshape(-1, n, m), Kt.reshape(-1, m, n)
        if omega is not None:
            omega = omega.reshape(-1, 1, 1)

        def col_sums(x):
            return torch.bmm(x, K3)

        def row_sums(y):
            return torch.bmm(y, Kt3)
    padded = pad is not None

    def relax(x, x_plain):  # x^{1−ω} x_plain^ω; zero (padded) scalings stay zero
        return relaxed(x, x_plain, omega, padded)

    if rs is not None:  # a carried kernel: first the row update the last block stopped before
        eu_plain = a_s / rs
        eu = eu_plain if omega is None else relax(eu, eu_plain)
    start = 0
    if cols and _graphs_usable(K):  # CUDA: full iterations replayed from captured graphs
        eu, ev, start = graphed_iterations(K, a_s, b_s, eu, ev, omega, n_iters - 1, padded)
    for i in range(start, n_iters):
        ev_plain = b_s / col_sums(eu)
        last = i == n_iters - 1
        ev = ev_plain if omega is None or last else relax(ev, ev_plain)
        rs = row_sums(ev)
        if last:
            break
        eu_plain = a_s / rs
        eu = eu_plain if omega is None else relax(eu, eu_plain)
    assert rs is not None  # n_iters ≥ 1
    with torch.no_grad():
        err = (eu * rs - a_s).abs().amax((-2, -1)).reshape(K.shape[:-2])
        lu, lv = eu.log(), ev.log()
        if pad is not None:
            lu = lu.nan_to_num(0.0, 0.0, 0.0)
            lv = lv.nan_to_num(0.0, 0.0, 0.0)
        big = torch.maximum(lu.abs().amax(), lv.abs().amax())
        bad = ~(big <= safe) | ~torch.isfinite(err).all()
        # the scalings' range is read with the convergence check (one host read)
        keep = (big <= absorb) & ~bad if absorb is not None else torch.zeros_like(bad)
    if pad is None:
        lu, lv = eu.log(), ev.log()
    else:  # zero scalings of padded rows/columns: potentials stay 0 there (no NaN in autograd)
        tiny = torch.finfo(eu.dtype).tiny
        lu = torch.where(a_s > 0, eu.clamp_min(tiny).log(), 0.0)
        lv = torch.where(b_s > 0, ev.clamp_min(tiny).log(), 0.0)
    # both layouts hold the entries in the potentials' order
    *batch, n, m = K.shape
    return _State(u0 + lu.reshape(*batch, n, 1), v0 + lv.reshape(*batch, 1, m), err, bad,
                  _Kernel(K, u0, v0, eu, ev, rs), keep)


def _newton_step(log_k, u, v, log_a, log_b, a_col, rv, cv) -> _State:
    """One Newton step on the dual (Sinkhorn–Newton, Brauer et al. 2017), then a column update.

    The dual gradient is the marginal residual (a − P1, b − Pᵀ1) and its Hessian is
    −[[diag(P1), P], [Pᵀ, diag(Pᵀ1)]]: the matrix of the implicit backward, solved the same way
    (Schur complement on the columns, batched Cholesky). Quadratic convergence near the fixed
    point removes the slow modes that make plain Sinkhorn crawl at small τ. The caller accepts
    the step only where it lowers the error.
    """
    P = torch.exp(log_k + u + v)
    r = P.sum(-1, keepdim=True)                 # (*batch, n, 1)
    c = P.sum(-2, keepdim=True).mT              # (*batch, m, 1)
    r_s = torch.where(r > 0, r, 1.0)
    ra = a_col - r
    rb = log_b.exp().mT * (cv.mT if cv is not None else 1) - c
    c_s = torch.where(c > 0, c, 1.0)
    pa = P / r_s
    S = torch.diag_embed(c_s.squeeze(-1)) - P.mT @ pa
    rhs = rb - pa.mT @ ra
    dv = _solve_psd(S, rhs.squeeze(-1)).unsqueeze(-1)
    du = (ra - P @ dv) / r_s
    u = u + du
    v = v + dv.mT
    if rv is not None:
        u = torch.where(rv, u, 0.0)
    if cv is not None:
        v = torch.where(cv, v, 0.0)
    return _log_block(log_k, u, v, log_a, log_b, a_col, 1, rv, cv)


def _next_block(err, prev_err, k, tol, omega, accelerate, waited=0):
    """Over-relaxation factor and the iterations predicted to reach ``tol`` (device tensors).

    The observed linear rate over the last block is r = (err / prev_err)^(1/k). Locally the
    Sinkhorn map is a block Gauss–Seidel step, for which Young's SOR theory relates the rate r
    of the ω-relaxed iteration to the rate λ of plain Sinkhorn: (r + ω − 1)² = λ r ω². Each
    block re-estimates λ this way (λ = r when ω = 1) and sets ω = 2 / (1 + sqrt(1 − λ)), the
    optimum, whose rate is ω − 1 (Thibault et al. 2017; Lehmann et al. 2021). Safeguards:
    where the error grew over the block, ω − 1 is halved; and a plain block whose error fell by
    less than 1% does not set ω (unless ``waited`` ≥ 2 rate measurements were made in the
    stage: a stall at the rounding level needs ω): after a slow start (no progress over the
    first iterations, r ≈ 1) ω ≈ 2 would follow, whose rate ω − 1 ≈ 1 then hides the true λ
    for good (in the over-relaxed regime the observed rate is ω − 1 whatever λ is).
    """
    if prev_err is None:
        return omega, torch.tensor(float(k), dtype=err.dtype, device=err.device)
    with torch.no_grad():
        ratio = err / prev_err.clamp_min(torch.finfo(err.dtype).tiny)
        r = ratio.clamp(1e-12, 1.0) ** (1.0 / k)
        rate = r
        if accelerate:
            w = torch.ones_like(r) if omega is None else omega.reshape(r.shape)
            lam = ((r + w - 1).square() / (r * w.square())).clamp(0.0, 1.0 - 1e-8)
            w_opt = 2.0 / (1.0 + torch.sqrt(1.0 - lam))
            plain = w == 1
            # a block that barely moved (< 1% progress: a slow start, or a stall at the
            # rounding level) says little about λ: stay plain, unless that happened twice
            settled = (ratio <= 0.99) | torch.full_like(plain, waited >= 2)
            w_opt = torch.where(plain & ~settled, torch.ones_like(w_opt), w_opt)
            w_new = torch.where(ratio > 1.5, 1.0 + (w - 1) / 2, w_opt)
            omega = w_new.reshape(*r.shape, 1, 1)
            r = torch.where(ratio > 1.5, r, (w_new - 1).clamp_min(r.square()))
            r = torch.where(w_new == 1, rate, r)
        need = torch.log(tol / err.clamp_min(1e-300)) / torch.log(r.clamp(max=1 - 1e-6))
        need = torch.where(err <= tol, 0.0, need).amax().ceil()
    return omega, need


def _check_block(st: _State, prev_err: torch.Tensor | None, k: int, tol: torch.Tensor,
                 omega: torch.Tensor | None, accelerate: bool,
                 waited: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor | None, float, float, float, float]:
    """The block's row error (NaN read as inf) and, in one host read, whether it left the safe
    range, whether every problem converged, the iterations predicted for the next block and
    whether its kernel may be carried on: ``(error, next ω, bad, done, need, keep)`` (ω from
    :func:`_next_block`)."""
    err = torch.where(torch.isnan(st.error), float("inf"), st.error)
    new_omega, need = _next_block(err, prev_err, k, tol, omega, accelerate, waited)
    keep = st.keep if st.keep is not None else st.bad.new_zeros(())
    bad, done, n_need, keep_f = torch.stack([
        st.bad.to(need.dtype), (err <= tol).all().to(need.dtype), need,
        keep.to(need.dtype)]).tolist()
    return err, new_omega, bad, done, n_need, keep_f


def sinkhorn_iterate(log_k: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     row_valid: torch.Tensor | None, col_valid: torch.Tensor | None,
                     n_iters: int, tol: float, check_every: int | None = None,
                     accelerate: bool = True, eps_scaling: bool | None = None, newton: bool = True,
                     newton_after: int = 100, overwrite: bool = False) -> SinkhornSolution:
    """Run the iterations (differentiable by autograd when the inputs require grad).

    Engine. Iterations run in blocks between convergence checks (the only host syncs). A block
    runs on the absorbed kernel (:func:`_scaling_block`: two batched mat-vecs and two divisions
    per iteration) when the previous block's potentials were reasonable, otherwise in log space
    (:func:`_log_block`: log-sum-exps); a scaling block that leaves the safe range is redone in
    log space, so scores of ±1e4 at τ = 1e-3 stay exact. Both compute the same fixed point.
    Stabilised scaling: the first block already runs on the kernel exp(log K) when the range of
    log K is moderate (≤ 60 in float32, ≤ 400 in float64, per ε-scaling stage), and a scaling
    block's kernel and scalings carry on to the next block (no new exp(log K + u + v)) until a
    scaling leaves [e^-absorb, e^absorb] (absorb = 15 / 100): then they are absorbed into the
    potentials u, v. A converged run that ended on the kernel returns diag(eu) K diag(ev), the
    plan whose row error was measured.

    Stopping rule: at each check the row error of the current plan (its columns are exact) is
    compared with ``tol``; when ``max |P 1 − a| ≤ tol`` in every problem the loop stops. ``tol``
    is raised to the rounding floor 4 ε max|log K| max(a) per problem (ε the dtype's machine
    epsilon, log K centred): in float32 with |W|/τ ≈ 40 no plan is more accurate than about
    1e-6. A float32 problem whose floor exceeds ``F32_FLOOR_LIMIT`` (1e-4: |W|/τ ≳ 200, e.g.
    scores of ±1e4 at τ = 1e-3) is solved in float64 and the solution rounded to float32.
    Check schedule: the first block has 10 iterations (5 on the CPU when it runs on the kernel;
    or ``check_every``); later ones are sized from the observed linear rate r (errors of the last two checks) to reach ``tol`` in one
    block, clamped to [5, 200]; a fixed ``check_every`` disables the adaptation.

    Acceleration (``accelerate``): once two plain blocks have measured the linear rate ρ of plain
    Sinkhorn, both updates are over-relaxed with ω = 2 / (1 + sqrt(1 − ρ)) per problem (Thibault
    et al. 2017; Lehmann et al. 2021): about sqrt(1/(1 − ρ)) iterations instead of 1/(1 − ρ).
    Safeguard: a problem whose error grew over a block goes back to ω = 1. ε-scaling
    (``eps_scaling``): the kernel is first solved at larger temperatures τ_s = τ·2^s (log K/2^s),
    from the largest s with spread(log K)/2^s ≤ 8 down to s = 0, each stage warm-started from
    the previous potentials and stopped at a loose error (1e-2 max a); helps at small τ.
    ``None`` (auto) turns it on when spread(log K) > ``EPS_SCALING_SPREAD`` in some problem:
    plain iterations grow like the spread, and beyond it the stages pay for themselves (measured
    on 16 x 64 x 64 and 16 x 128 x 128: slower below a spread of about 50, faster above 70; at
    the extreme of |W|/τ ≈ 1e7 plain Sinkhorn cannot converge in any practical number of
    iterations while the stages take a few hundred).

    Args:
        log_k: W/τ (masked entries very negative), ``(*batch, n, m)``.
        a, b: marginals ``(*batch, n)``, ``(*batch, m)``; zero on padded rows/columns.
        row_valid, col_valid: boolean ``(*batch, n)``, ``(*batch, m)`` or None (all valid).
        overwrite: ``log_k`` is scratch: without autograd a float64 one is centred in place
            (on the CPU a fresh (n, m) buffer costs several times the pass that fills it; a
            float32 one may be needed again for the float64 fallback).
    """
    dtype = log_k.dtype
    # Center the kernel (P is invariant to row/column shifts, absorbed in u, v): keeps the
    # potentials small, which is what limits the attainable accuracy in float32. Every row and
    # column of the centred kernel has maximum 0.
    with torch.no_grad():
        shift_r = log_k.amax(-1, keepdim=True)
        if row_valid is not None:
            shift_r = torch.where(row_valid.unsqueeze(-1), shift_r, 0.0)
    grad = torch.is_grad_enabled() and (log_k.requires_grad or a.requires_grad
                                        or b.requires_grad)
    # in place without autograd (a fresh buffer costs more than the pass that fills it)
    centred = (log_k.sub_(shift_r) if overwrite and not grad and dtype == torch.float64
               else log_k - shift_r)
    with torch.no_grad():
        shift_c = centred.detach().amax(-2, keepdim=True)
        if col_valid is not None:
            shift_c = torch.where(col_valid.unsqueeze(-2), shift_c, 0.0)
    centred = centred - shift_c if grad else centred.sub_(shift_c)
    with torch.no_grad():
        pad = None
        if row_valid is None and col_valid is None:
            spread = -centred.detach().amin((-2, -1))  # centred ≤ 0 entrywise
        else:
            valid = _valid_entries(row_valid, col_valid, log_k)
            spread = torch.where(valid, centred.detach(), 0.0)
            pad = ~valid
            # entries masked out by _masked_log_kernel (finfo.min / 8) carry no mass
            spread = torch.where(log_k > torch.finfo(dtype).min / 16, spread, 0.0)
            spread = spread.abs().amax((-2, -1))
        # accuracy floor: rounding of the exponent, eps * max|log K| (per problem)
        floor = 4 * torch.finfo(dtype).eps * (1 + spread) * a.amax(-1)
        tol_t = torch.clamp(floor, min=tol)
    if compiling_now():  # torch.compile: no host reads, the loop a traced while_loop
        return _iterate_traced(centred, a, b, row_valid, col_valid, pad, n_iters, tol_t)
    top = float(spread.max())          # one host read: float32 range, ε-scaling stages
    if dtype == torch.float32 and 4 * _F32_EPS * (1 + top) > F32_FLOOR_LIMIT:
        # no float32 plan is accurate here (potentials of ~1e7 keep no fractional digits):
        # solve the same kernel in float64 and round the result
        sol = sinkhorn_iterate(log_k.double(), a.double(), b.double(), row_valid, col_valid,
                               n_iters, tol, check_every, accelerate, eps_scaling, newton,
                               newton_after)
        return SinkhornSolution(sol.plan.float(), sol.u.float(), sol.v.float(),
                                sol.error.float(), sol.n_iters, sol.tol.float())
    log_k = centred
    rv, cv, log_a, log_b = _log_marginals(a, b, row_valid, col_valid)
    u = torch.zeros_like(log_a)
    v = torch.zeros_like(log_b)
    # scalings beyond e^safe could overflow K·ev products over a block: redo it in log space;
    # beyond e^absorb they are absorbed into the potentials (a new kernel) before the next block
    safe = 30.0 if dtype in (torch.float32, torch.float16, torch.bfloat16) else 200.0
    absorb = safe / 2
    a_max = a.amax(-1)
    a_col = a.unsqueeze(-1)

    # ε-scaling stages: λ = τ/τ_s = 2^-s
    stages = [1.0]
    if eps_scaling or (eps_scaling is None and top > EPS_SCALING_SPREAD):
        s = max(math.ceil(math.log(max(top, 1.0) / 8.0, _EPS_BASE)), 0)
        stages = [_EPS_BASE ** -k for k in range(s, 0, -1)] + [1.0]

    it = 0
    # cold start on the kernel exp(log K) itself (exp-domain Sinkhorn) when the range of the
    # first stage's log K is at most 2·safe: its entries are then far from underflow (≥ e^-60
    # in float32) and the scalings of the fixed point stay within about that range (a block
    # that leaves the safe range is redone in log space as always); otherwise in log space
    use_log = not stages[0] * top <= 2 * safe
    cold = not use_log
    kern = None              # the kernel carried to the next block
    last_kern = None         # the kernel of the last block, when it was a scaling block
    omega = None
    # first check after 10 iterations; on the CPU, when starting on the kernel (a moderate
    # range, so possibly few iterations: 5 reach 4e-7 on the easy bench case), after 5: there a
    # check costs less than an iteration of a 32 x 128 x 128 batch and needs no new kernel
    block = check_every or (5 if not use_log and not log_k.is_cuda else 10)
    error = torch.full_like(a_max, float("inf"))
    for lam in stages:
        final = lam == 1.0
        lk = log_k if final else log_k * lam
        stage_tol = tol_t if final else torch.clamp(1e-2 * a_max, min=tol_t)
        prev_err = None
        waited = 0           # rate measurements in this stage (Newton jumps included)
        while it < n_iters:
            k = min(block, n_iters - it)
            if use_log:
                st = _log_block(lk, u, v, log_a, log_b, a_col, k, rv, cv)
            else:
                if cold:  # u = v = 0: K = exp(log K), no additions
                    kern, cold = _new_kernel(lk, u, v, a, b, pad, cold=True), False
                st = _scaling_block(lk, u, v, a, b, k, omega, pad, safe, kern, absorb)
            err, new_omega, bad, done, need, keep = _check_block(
                st, prev_err, k, stage_tol, omega, accelerate, waited)
            if bad and not use_log:  # left the safe range: redo the block in log space
                st = _log_block(lk, u, v, log_a, log_b, a_col, k, rv, cv)
                err, new_omega, bad, done, need, keep = _check_block(
                    st, prev_err, k, stage_tol, omega, accelerate, waited)
            use_log = bool(bad)
            kern = st.kern if keep else None
            last_kern = st.kern
            waited += prev_err is not None
            it += k
            u, v, error = st.u, st.v, err
            if done:
                break
            omega = new_omega
            if newton and final and it < n_iters and need > newton_after and bool(
                    (err <= 1e-2 * a_max).all()):
                # slow linear tail: try Newton steps, kept where they lower the error
                nt = _newton_step(lk, u, v, log_a, log_b, a_col, rv, cv)
                it += 1
                n_err = torch.where(torch.isnan(nt.error), float("inf"), nt.error)
                better = n_err < err
                u = torch.where(better.reshape(*better.shape, 1, 1), nt.u, u)
                v = torch.where(better.reshape(*better.shape, 1, 1), nt.v, v)
                kern = last_kern = None  # new potentials: the next block absorbs them
                err = torch.minimum(err, n_err)
                error = err
                if bool((err <= stage_tol).all()):
                    break
                prev_err = None  # the rate estimate restarts after a jump
                continue
            if check_every is None:
                block = int(min(max(need, 5), 200))
                if log_k.is_cuda:  # whole graph chunks (see _sinkhorn_graphs)
                    block = GRAPH_CHUNK * -(-(block - 1) // GRAPH_CHUNK) + 1
            prev_err = err
        if not final:  # warm start of the next stage: f = τ_s u is the dual variable
            u, v = u * _EPS_BASE, v * _EPS_BASE
            omega = None
            kern = last_kern = None
            error = torch.full_like(a_max, float("inf"))
    converged = bool((error <= tol_t).all())
    if not converged:  # end on a row update (exact rows), as plain Sinkhorn does
        u = log_a - torch.logsumexp(log_k + v, dim=-1, keepdim=True)
        if rv is not None:
            u = torch.where(rv, u, 0.0)
        plan = torch.exp(log_k + u + v)
    elif last_kern is not None:  # the plan of the last scaling block: diag(eu) K diag(ev)
        K, _, _, eu, ev, _ = last_kern
        *batch, n, m = K.shape
        eu, ev = eu.reshape(*batch, n, 1), ev.reshape(*batch, 1, m)
        plan = K * eu * ev if grad else K.mul_(eu).mul_(ev)  # K is not used again
    else:
        plan = torch.exp(log_k + u + v)
    if pad is not None:
        plan = torch.where(pad, 0.0, plan)
    if not converged:
        # not converged: measure the returned plan itself
        with torch.no_grad():
            error = (plan.sum(-1) - a).abs().amax(-1).maximum((plan.sum(-2) - b).abs().amax(-1))
    return SinkhornSolution(plan, u.squeeze(-1), v.squeeze(-2), error, it, tol_t)


def _iterate_traced(log_k: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    row_valid: torch.Tensor | None, col_valid: torch.Tensor | None,
                    pad: torch.Tensor | None, n_iters: int, tol_t: torch.Tensor
                    ) -> SinkhornSolution:
    """The iterations under ``torch.compile``: plain log-domain blocks of 10 (:func:`_log_block`)
    in a ``while_loop`` that stops when every problem meets its tolerance or after ``n_iters``
    (rounded up to a multiple of 10), with the error read on the device: no host read, so no
    graph break. No acceleration, ε-scaling or float64 fallback (they are decided on the host);
    ``log_k`` comes centred."""
    from torch._higher_order_ops.while_loop import while_loop

    rv, cv, log_a, log_b = _log_marginals(a, b, row_valid, col_valid)
    a_col = a.unsqueeze(-1)

    def running(it, u, v, error):
        return (it < n_iters) & ~(error <= tol_t).all()

    def block(it, u, v, error):
        st = _log_block(log_k, u, v, log_a, log_b, a_col, 10, rv, cv)
        return it + 10, st.u, st.v, st.error

    start = (torch.zeros((), dtype=torch.int64, device=log_k.device), torch.zeros_like(log_a),
             torch.zeros_like(log_b), torch.full_like(a.amax(-1), math.inf))
    it, u, v, error = while_loop(running, block, start)
    plan = torch.exp(log_k + u + v)
    if pad is not None:
        plan = torch.where(pad, 0.0, plan)
    return SinkhornSolution(plan, u.squeeze(-1), v.squeeze(-2), error, it, tol_t)


def _log_marginals(a: torch.Tensor, b: torch.Tensor, row_valid: torch.Tensor | None,
                   col_valid: torch.Tensor | None):
    """(row mask ``(*batch, n, 1)``, column mask ``(*batch, 1, m)``, log a as a column, log b as
    a row); padded rows and columns get log 1 = 0 (the masks are None when all are valid)."""
    rv = None if row_valid is None else row_valid.unsqueeze(-1)
    cv = None if col_valid is None else col_valid.unsqueeze(-2)
    log_a = torch.log(a if row_valid is None else torch.where(row_valid, a, 1.0)).unsqueeze(-1)
    log_b = torch.log(b if col_valid is None else torch.where(col_valid, b, 1.0)).unsqueeze(-2)
    return rv, cv, log_a, log_b


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
    if traced(info):
        # no host read possible (torch.compile, torch.func): both solves, chosen per problem;
        # LU instead of lstsq, whose output shapes are data-dependent for the compiler
        chol = torch.cholesky_solve(rhs.unsqueeze(-1), L).squeeze(-1)
        lu = _linalg.solve_ex(S, rhs.unsqueeze(-1))[0].squeeze(-1)
        return torch.where((info == 0).unsqueeze(-1), chol, lu)
    if bool((info == 0).all()):
        return torch.cholesky_solve(rhs.unsqueeze(-1), L).squeeze(-1)
    return torch.linalg.lstsq(S, rhs.unsqueeze(-1)).solution.squeeze(-1)
