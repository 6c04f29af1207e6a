r"""Completeness, minimality and identifiability of Perturb-Softmax and Perturb-Argmax models.

Both models are gradients of convex potentials (Perturb-Softmax paper, §4-5):

.. math::

    \text{Perturb-Softmax:}\quad F(\theta) = \tau\,\mathbb E\big[\mathrm{lse}((\theta+\varepsilon)/\tau)\big],
    \qquad \nabla F(\theta) = \mathbb E\big[\mathrm{softmax}((\theta+\varepsilon)/\tau)\big]

    \text{Perturb-Argmax:}\quad F(\theta) = \mathbb E\big[\max_i(\theta_i+\varepsilon_i)\big],
    \qquad \nabla F(\theta)_i = P\big(\arg\max_j(\theta_j+\varepsilon_j) = i\big)

A parameter set Θ is **complete** when ∇F(Θ) covers the open simplex and **minimal** when ∇F is
one-to-one on Θ, which for a differentiable convex F holds exactly when F is strictly convex on
Θ. Translations θ ↦ θ + c·1 never change the distribution, so Θ = R^d ("free") is never
minimal; the slices {θ_d = 0} ("last_zero") and {Σθ = 0} ("sum_zero") can be. Perturb-Argmax with
continuous noise of positive differentiable density is minimal on those slices; bounded noise
(Uniform) has flat regions of F (many θ, one distribution); discrete noise makes ∂F
multi-valued and ∇F piecewise constant (not identifiable). ``docs/identifiability.md`` has the
derivations.

The checks are numerical, with exact quadrature where it is cheap and a reported standard error
where Monte Carlo is used (see :mod:`perturb._identify`). A negative verdict always carries a
witness a user can verify with ``noise.argmax_probs`` (or a Monte-Carlo estimate of the
Perturb-Softmax model).

References: "On the statistical representation properties of the Perturb-Softmax and the
Perturb-Argmax probability distributions" (Theorems 4.1, 4.3, 5.1, 5.3; Props. 5.4, 5.5);
Rockafellar, Convex Analysis, Thm 26.1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from perturb import _identify as _I
from perturb._identify import IdentifyResult
from perturb._validation import check_int, check_positive, check_real, check_tau
from perturb.noise import Noise

__all__ = [
    "check_completeness", "check_minimality", "identify",
    "CompletenessReport", "MinimalityReport", "CompletenessWitness", "MinimalityWitness",
    "IdentifyResult",
]

_DT = torch.float64


class MinimalityWitness(NamedTuple):
    """Two different parameter vectors of Θ with the same model distribution.

    Verify with ``noise.argmax_probs(theta)`` vs ``noise.argmax_probs(theta_prime)``
    (Perturb-Argmax) or a Monte-Carlo estimate of E[softmax((θ+ε)/τ)] (Perturb-Softmax).
    """

    theta: torch.Tensor
    theta_prime: torch.Tensor
    probs: torch.Tensor
    probs_prime: torch.Tensor
    reason: str


class CompletenessWitness(NamedTuple):
    """A distribution ``target`` that the model does not reach: the closest found is ``probs``."""

    target: torch.Tensor
    theta: torch.Tensor
    probs: torch.Tensor
    residual: float
    reason: str


def _fmt(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return "[" + ", ".join(f"{v:.4g}" for v in x.flatten().tolist()[:8]) + \
            (", ...]" if x.numel() > 8 else "]")
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


@dataclass
class _Report:
    noise: Any
    d: int
    kind: str
    param_space: str
    tau: float
    details: dict = field(default_factory=dict)

    def _body(self, title: str, verdict: bool, witness: Any) -> str:
        model = "Perturb-Softmax" if self.kind == "softmax" else "Perturb-Argmax"
        tau = f", tau={self.tau:g}" if self.kind == "softmax" else ""
        lines = [f"{title}: {'YES' if verdict else 'NO'} -- {model} with {self.noise!r}, "
                 f"d={self.d}, param_space={self.param_space!r}{tau}"]
        lines += [f"  {k}: {_fmt(v)}" for k, v in self.details.items() if k != "per_target"]
        if witness is not None:
            lines.append(f"  witness ({witness.reason}):")
            for name, value in witness._asdict().items():
                if name != "reason":
                    lines.append(f"    {name} = {_fmt(value)}")
        return "\n".join(lines)


@dataclass
class CompletenessReport(_Report):
    """Verdict of :func:`check_completeness`: ``.complete``, ``.details``, ``.witness``."""

    complete: bool = False
    witness: CompletenessWitness | None = None

    def __str__(self) -> str:
        return self._body("complete", self.complete, self.witness)


@dataclass
class MinimalityReport(_Report):
    """Verdict of :func:`check_minimality`: ``.minimal``, ``.details``, ``.witness``."""

    minimal: bool = False
    witness: MinimalityWitness | None = None

    def __str__(self) -> str:
        return self._body("minimal", self.minimal, self.witness)


def _common_checks(noise: Any, d: int, kind: str, param_space: str, tau: float
                   ) -> tuple[int, Noise]:
    """Validated ``d`` and the noise as a :class:`~perturb.noise.Noise` (declared capabilities)."""
    _I.check_kind(kind)
    _I.check_space(param_space)
    check_tau(tau)
    d = _I.check_d(d)
    model_noise = _I.as_noise(noise)
    _I.check_noise(model_noise, kind)
    return d, model_noise


def _gen(generator: torch.Generator | None) -> torch.Generator:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {generator!r}")
    return generator if generator is not None else torch.Generator().manual_seed(0)


# ------------------------------------------------------------------------------------ identify

def identify(p: torch.Tensor, noise: Any, kind: str = "softmax", tau: float = 1.0, *,
             tol: float = 1e-12, max_iter: int = 100, n_samples: int = 2 ** 12, n_reps: int = 16,
             init: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> IdentifyResult:
    r"""The parameters θ (with θ_d = 0) whose model distribution is ``p``.

    Solves ∇F(θ) = p, the optimality condition of the convex dual
    min_{θ: θ_d=0} F(θ) − ⟨p, θ⟩, by Newton steps in log coordinates with backtracking
    (:func:`perturb._identify.solve_inverse`). Perturb-Argmax (continuous noise): F, ∇F and the
    Hessian by quadrature, exact to ~1e-13. Perturb-Softmax: randomized quasi-Monte Carlo
    (scrambled Sobol points through ``noise.icdf``, or ``noise.sample``) with common random
    numbers for the whole solve; the residual is then re-measured on fresh points.

    Args:
        p: the target distribution, every entry > 0, summing to 1.
        noise: a noise object (``perturb.noise`` or duck-typed: ``sample``/``icdf`` for softmax;
            ``cdf`` + ``log_prob``, or ``argmax_probs``, for argmax).
        kind: ``"softmax"`` (E[softmax((θ+ε)/τ)]) or ``"argmax"`` (P(argmax(θ+ε) = i)).
        tau: temperature τ > 0 (softmax only).
        tol: tolerance on ``max_i |log ∇F(θ)_i − log p_i|``.
        max_iter: Newton iterations.
        n_samples, n_reps: points per QMC replicate and replicates (softmax).
        init: a starting θ (default: log(p/p_d) rescaled to the noise's spread).
        generator: seeds the QMC scrambling / samples.

    Shape: ``p``: ``(d,)`` -> ``theta``: ``(d,)`` (dtype/device of ``p`` when it is a float tensor).

    Returns:
        :class:`IdentifyResult` ``(theta, residual, converged, std_error)``: ``residual`` is
        ``max_i |∇F(θ)_i − p_i|``; for softmax, ``std_error`` is the standard error of that
        measurement (fit points and fresh points combined), so ``residual`` is within a few
        ``std_error`` of 0 when the model reaches ``p``.

    Raises:
        ValueError: ``p`` not a strictly positive distribution of length >= 2, τ <= 0, a noise
            lacking what the model needs, discrete noise with kind="argmax" (not identifiable),
            ``init`` not a finite float tensor of ``p``'s shape.

    Example::

        >>> from perturb import Gumbel
        >>> p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
        >>> identify(p, Gumbel(), kind="argmax").theta          # log(p / p_d)
        tensor([-0.9163, -0.5108,  0.0000], dtype=torch.float64)
    """
    _I.check_kind(kind)
    check_tau(tau)
    q = _I.check_distribution(p, "p")
    noise = _I.as_noise(noise)
    _I.check_noise(noise, kind)
    check_positive(tol, "tol")
    check_int(max_iter, "max_iter", low=1)
    if kind == "argmax" and _I.is_discrete(noise):
        raise ValueError(f"Perturb-Argmax with discrete noise {noise!r} is not identifiable: "
                         f"the distribution is piecewise constant in θ and ∂F is multi-valued at "
                         f"the jumps (see check_minimality)")
    g = _gen(generator)
    d = q.shape[0]
    if init is not None:
        if not isinstance(init, torch.Tensor) or not init.is_floating_point() \
                or init.shape != q.shape:
            got = (f"shape {tuple(init.shape)}, dtype {init.dtype}"
                   if isinstance(init, torch.Tensor) else type(init).__name__)
            raise ValueError(f"init must be a floating tensor of shape ({d},), like p, got {got}")
        if not bool(torch.isfinite(init).all()):
            raise ValueError("init must be finite")
    model = _I.Model(noise, d, kind, tau, n_samples=n_samples, n_reps=n_reps, generator=g)
    theta, converged, _, _ = _I.solve_inverse(q, model, init=init, tol=tol, max_iter=max_iter)
    residual, se = _measure(theta, q, model, noise, kind, tau, n_samples, n_reps, g)
    if isinstance(p, torch.Tensor) and p.is_floating_point():
        theta = theta.to(dtype=p.dtype, device=p.device)
    return IdentifyResult(theta, residual, converged, se)


def _measure(theta: torch.Tensor, q: torch.Tensor, model: _I.Model, noise: Noise, kind: str,
             tau: float, n_samples: int, n_reps: int, g: torch.Generator) -> tuple[float, float]:
    """(max |∇F(θ) − q|, its standard error); softmax on fresh QMC points."""
    if kind == "argmax":
        return float((_I.argmax_probs_exact(theta, noise) - q).abs().max()), 0.0
    fit_se = model.stats(theta, jacobian=False)["se"]
    fresh = _I.Model(noise, q.shape[0], kind, tau, n_samples=n_samples, n_reps=n_reps,
                     generator=g).stats(theta, jacobian=False)
    se = torch.sqrt(fit_se ** 2 + fresh["se"] ** 2)
    return float((fresh["p"] - q).abs().max()), float(se.max())


# -------------------------------------------------------------------------------- completeness

def _targets(d: int, n_interior: int, vertex_eps: tuple[float, ...], n_vertices: int,
             g: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    out = [("uniform", torch.full((d,), 1.0 / d, dtype=_DT))]
    if n_interior:
        gam = -torch.log(torch.rand(n_interior, d, generator=g, dtype=_DT).clamp_min(1e-300))
        for i, row in enumerate(gam):  # Dirichlet(1, ..., 1): normalised exponentials
            out.append((f"dirichlet[{i}]", row / row.sum()))
    vertices = list(range(n_vertices - 1)) + [d - 1] if n_vertices else []
    for k in vertices:
        for eta in vertex_eps:
            t = torch.full((d,), eta / (d - 1), dtype=_DT)
            t[k] = 1.0 - eta
            out.append((f"vertex{k}(1-{eta:g})", t))
    return out


def check_completeness(noise: Any, d: int, kind: str = "softmax", param_space: str = "last_zero",
                       tau: float = 1.0, *, n_interior: int = 4,
                       vertex_eps: tuple[float, ...] = (1e-2, 1e-4, 1e-6),
                       n_vertices: int = 2, tol: float = 1e-8, n_sigma: float = 5.0,
                       n_samples: int = 2 ** 12, n_reps: int = 16,
                       generator: torch.Generator | None = None) -> CompletenessReport:
    r"""Does ∇F(Θ) cover the open simplex? Solve the dual for targets spread over the simplex.

    For each target p (the uniform distribution, ``n_interior`` Dirichlet(1) draws and, for
    ``n_vertices`` vertices e_k, the points (1−η)e_k + η·(uniform on the others) for η in
    ``vertex_eps``) solve min_θ F(θ) − ⟨p, θ⟩ over Θ (:func:`identify`) and measure
    ‖∇F(θ*) − p‖_∞. Complete when the worst residual is <= ``tol`` (+ ``n_sigma`` standard
    errors for the Monte-Carlo softmax). Completeness does not depend on ``param_space``
    (translations do not move ∇F); the reported θ* are expressed in it.

    Perturb-Argmax with discrete noise: ∇F is piecewise constant, so ∇F(Θ) is a finite set;
    reported not complete, with the target farthest from the distributions reached (all cells
    enumerated for d = 2 when the noise exposes ``values``; sampled otherwise). Its
    sub-differentials still cover the simplex (Perturb-Softmax paper, Thm 5.1).

    Args:
        noise, d, kind, param_space, tau: the model (``param_space`` in "free", "last_zero",
            "sum_zero").
        n_interior, vertex_eps, n_vertices: the targets.
        tol, n_sigma: the acceptance threshold.
        n_samples, n_reps, generator: Monte-Carlo settings (softmax) and target draws.

    Returns:
        :class:`CompletenessReport` (``.complete``, ``.details`` with the worst residual, its
        standard error and per-target results, ``.witness`` None or a
        :class:`CompletenessWitness`).

    Raises:
        ValueError: d < 2, τ <= 0, unknown kind/param_space, noise lacking what is needed.

    Example::

        >>> from perturb import Normal
        >>> check_completeness(Normal(), 3, kind="argmax").complete
        True
    """
    d, model_noise = _common_checks(noise, d, kind, param_space, tau)
    check_int(n_interior, "n_interior", low=0)
    n_vertices = check_int(n_vertices, "n_vertices", low=0, high=d)
    for eta in vertex_eps:
        if not 0.0 < float(eta) < 1.0:
            raise ValueError(f"vertex_eps entries must be in (0, 1), got {eta!r}")
    g = _gen(generator)
    targets = _targets(d, n_interior, tuple(vertex_eps), n_vertices, g)
    report = CompletenessReport(noise, d, kind, param_space, float(tau))
    noise = model_noise
    if kind == "argmax" and _I.is_discrete(noise):
        return _discrete_completeness(report, noise, targets, g)
    per_target: list[dict[str, Any]] = []
    solved: list[tuple[float, str, torch.Tensor, torch.Tensor, IdentifyResult]] = []
    max_se = 0.0
    for name, p in targets:
        res = identify(p, noise, kind, tau, n_samples=n_samples, n_reps=n_reps, generator=g)
        theta = _I.to_space(res.theta.to(_DT), param_space)
        ok = res.residual <= tol + n_sigma * res.std_error
        per_target.append({"target": name, "residual": res.residual, "std_error": res.std_error,
                           "converged": res.converged, "theta_norm": float(theta.norm()),
                           "reached": ok})
        max_se = max(max_se, res.std_error)
        solved.append((res.residual - n_sigma * res.std_error, name, p, theta, res))
    # the worst target: the largest excess residual over n_sigma standard errors (the first of
    # equal ones)
    _, wname, wp, wtheta, wres = max(solved, key=lambda t: t[0])
    report.complete = all(t["reached"] for t in per_target)
    report.details = {
        "n_targets": len(targets), "worst_target": wname, "worst_residual": wres.residual,
        "worst_std_error": wres.std_error, "max_std_error": max_se, "tol": tol,
        "n_sigma": n_sigma, "method": "quadrature (exact)" if kind == "argmax"
        else f"randomized QMC, {n_reps} x {n_samples} points",
        "max_theta_norm": max(t["theta_norm"] for t in per_target), "per_target": per_target,
    }
    if not report.complete:
        probs = _I.Model(noise, d, kind, tau, n_samples=n_samples, n_reps=n_reps,
                         generator=g).probs(wtheta)[0]
        report.witness = CompletenessWitness(
            wp, wtheta, probs, wres.residual,
            f"the dual solve for target '{wname}' stops at residual {wres.residual:.3g} "
            f"(> {tol:g} + {n_sigma:g} x std_error {wres.std_error:.2g})")
    return report


def _discrete_completeness(report: CompletenessReport, noise: Noise, targets: list,
                           g: torch.Generator) -> CompletenessReport:
    d = report.d
    low, high = _I.support(noise)
    width = (high - low) if math.isfinite(high - low) and high > low else 2.0
    values = getattr(report.noise, "values", None)
    if d == 2 and values is not None:  # every cell of θ_1 − θ_2: the breakpoints and between
        v = torch.as_tensor(values, dtype=_DT).flatten()
        bps = torch.unique((v[:, None] - v[None, :]).flatten())
        mids = torch.cat([bps[:1] - 1.0, 0.5 * (bps[1:] + bps[:-1]), bps[-1:] + 1.0])
        grid = torch.cat([bps, mids])
        thetas = torch.stack([grid, torch.zeros_like(grid)], -1)
        how = f"all {thetas.shape[0]} cells of the arrangement (exhaustive, d = 2)"
        exhaustive = True
    else:
        n = 2000
        thetas = (torch.rand(n, d, generator=g, dtype=_DT) - 0.5) * 3.0 * width
        how = f"{n} random θ and θ = 0 (not exhaustive)"
        exhaustive = False
    if not exhaustive:  # θ = 0 lies on every tie hyperplane, where ties split the mass
        thetas = torch.cat([torch.zeros(1, d, dtype=_DT), thetas])
        # a Dirichlet-random target avoids the finite reachable set with probability one
        targets = [t for t in targets if t[0].startswith("dirichlet")] or targets
    thetas = _I.to_space(thetas, report.param_space)
    try:  # perturb.noise batches over leading dims; duck-typed noise may not
        probs = torch.as_tensor(noise.argmax_probs(thetas)).to(_DT)
        if probs.shape != thetas.shape:
            raise ValueError("not batched")
    except Exception:  # noqa: BLE001
        probs = torch.stack([_I.argmax_probs_exact(t, noise) for t in thetas])
    distinct = torch.unique(torch.round(probs * 1e12) / 1e12, dim=0)
    closest = []  # per target: (distance, name, target, the closest θ and its distribution)
    for name, p in targets:
        dist = (probs - p).abs().max(-1).values
        i = int(dist.argmin())
        closest.append((float(dist[i]), name, p, thetas[i], probs[i]))
    # the worst target: the farthest from every reached distribution (the first of equal ones)
    w_dist, w_name, w_target, w_theta, w_probs = max(closest, key=lambda c: c[0])
    report.complete = False
    report.details = {"method": how, "distinct_distributions_reached": int(distinct.shape[0]),
                      "worst_target": w_name, "worst_residual": w_dist,
                      "note": "∇F is piecewise constant for discrete noise: finitely many "
                              "distributions are reached (the sub-differentials still cover "
                              "the simplex)"}
    report.witness = CompletenessWitness(
        w_target, w_theta, w_probs, w_dist,
        f"no θ among {how} reaches target '{w_name}' closer than {w_dist:.3g}"
        + ("" if exhaustive else "; the reachable set is finite, so a Dirichlet-random target "
                                 "is unreachable with probability one"))
    return report


# ---------------------------------------------------------------------------------- minimality

def _same(model: _I.Model, noise: Noise, kind: str, a: torch.Tensor, b: torch.Tensor,
          rtol: float = 1e-9, atol: float = 1e-12) -> tuple[bool, torch.Tensor, torch.Tensor]:
    """Equal distributions at a and b: in log space (exact zeros must match), and for argmax
    also through the user-facing ``noise.argmax_probs``."""
    sa, sb = model.stats(a, jacobian=False), model.stats(b, jacobian=False)
    la, lb = sa["log_p"], sb["log_p"]
    both_zero = torch.isneginf(la) & torch.isneginf(lb)
    diff = torch.where(both_zero, torch.zeros_like(la), (la - lb).abs()).nan_to_num(nan=math.inf)
    ok = bool((diff <= rtol).all())
    pa, pb = sa["p"], sb["p"]
    if kind == "argmax":
        pa, pb = _I.argmax_probs_exact(a, noise), _I.argmax_probs_exact(b, noise)
        ok = ok and bool(((pa - pb).abs() <= atol).all())
    return ok, pa, pb


def _restricted_eigs(hess: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    h = basis.T @ (0.5 * (hess + hess.transpose(-1, -2))) @ basis
    return torch.linalg.eigvalsh(h)


def check_minimality(noise: Any, d: int, kind: str = "softmax", param_space: str = "last_zero",
                     tau: float = 1.0, *, n_points: int = 8, scale: float = 1.0,
                     eig_tol: float = 1e-10, n_sigma: float = 5.0, n_samples: int = 2 ** 12,
                     n_reps: int = 16,
                     generator: torch.Generator | None = None) -> MinimalityReport:
    r"""Is ∇F one-to-one on Θ? Strict convexity of F on Θ plus a search for witnesses.

    1. Hessian of F restricted to Θ's tangent space (Bᵀ∇²F B, B a basis of Θ's directions) at
       θ = 0 and ``n_points`` random θ ~ N(0, (scale·std ε)²) mapped into Θ: the smallest
       eigenvalue and its uncertainty (Perturb-Argmax: the change under a twice finer
       quadrature; Perturb-Softmax: the spread over QMC replicates).
    2. Witnesses θ ≠ θ' in Θ with the same distribution, each verified numerically (log-space
       agreement to 1e-9; for argmax also ``noise.argmax_probs`` to 1e-12):
       translations θ' = θ + c·1 (``"free"``); saturation for bounded noise (a coordinate
       pushed beyond the support width never wins, so pushing it further changes nothing);
       piecewise constancy for discrete noise (a small shift of a generic θ); a step along
       a flat Hessian direction otherwise.

    Minimal when no witness is found and the smallest eigenvalue exceeds
    ``eig_tol + n_sigma·uncertainty``. A strictly positive eigenvalue at finitely many points
    does not prove strict convexity everywhere: the theorems in ``docs/identifiability.md``
    are the proof; this is the numerical cross-check.

    Args:
        noise, d, kind, param_space, tau: the model.
        n_points, scale: where the Hessian is sampled.
        eig_tol, n_sigma: thresholds for "strictly convex".
        n_samples, n_reps, generator: Monte-Carlo settings (softmax) and random θ.

    Returns:
        :class:`MinimalityReport` (``.minimal``, ``.details``, ``.witness`` None or a
        :class:`MinimalityWitness`).

    Raises:
        ValueError: d < 2, τ <= 0, unknown kind/param_space, noise lacking what is needed.

    Example::

        >>> from perturb import Uniform
        >>> noise = Uniform()
        >>> r = check_minimality(noise, 3, kind="argmax")
        >>> r.minimal
        False
        >>> noise.argmax_probs(r.witness.theta) - noise.argmax_probs(r.witness.theta_prime)
        tensor([0., 0., 0.], dtype=torch.float64)
    """
    check_real(eig_tol, "eig_tol", low=0.0)
    d, model_noise = _common_checks(noise, d, kind, param_space, tau)
    check_int(n_points, "n_points", low=0)
    check_positive(scale, "scale")
    g = _gen(generator)
    report = MinimalityReport(noise, d, kind, param_space, float(tau))
    noise = model_noise
    model = _I.Model(noise, d, kind, tau, n_samples=n_samples, n_reps=n_reps, generator=g)
    basis = _I.tangent_basis(d, param_space)
    std = _I.noise_std(noise)
    tried: list[str] = []

    # 1. strict convexity on Θ
    pts = torch.cat([torch.zeros(1, d, dtype=_DT),
                     scale * std * torch.randn(n_points, d, generator=g, dtype=_DT)])
    pts = _I.to_space(pts, param_space)
    flattest = []  # per point: (smallest eigenvalue on Θ, the point, its eigenvector)
    for th in pts:
        hess = model.stats(th)["hess"]
        eigs, vecs = torch.linalg.eigh(basis.T @ (0.5 * (hess + hess.T)) @ basis)
        flattest.append((float(eigs[0]), th, basis @ vecs[:, 0]))
    lam, th_min, flat_dir = min(flattest, key=lambda f: f[0])  # the first of equal ones
    if kind == "softmax":
        rep = model.stats(th_min)["rep_hess"]
        lam_reps = _restricted_eigs(rep, basis)[:, 0]
        lam_se = float(lam_reps.std() / math.sqrt(lam_reps.shape[0]))
        how = "QMC replicate spread"
    elif not _I.is_discrete(noise) and noise.has_cdf:
        fine = _I.argmax_quadrature(th_min, noise, refine=2)[2]
        assert fine is not None  # jacobian=True (the default): the Hessian is returned
        lam_se = abs(float(_restricted_eigs(fine, basis)[0]) - lam)
        how = "change under a 2x finer quadrature"
    else:
        lam_se, how = 0.0, "finite differences of argmax_probs"
    strictly = lam > eig_tol + n_sigma * lam_se

    # 2. witnesses
    witness: MinimalityWitness | None = None

    def attempt(a: torch.Tensor, b: torch.Tensor, reason: str) -> bool:
        nonlocal witness
        a, b = _I.to_space(a, param_space), _I.to_space(b, param_space)
        if bool((a - b).abs().max() <= 1e-12):
            return False
        ok, pa, pb = _same(model, noise, kind, a, b)
        tried.append(f"{reason}: {'verified' if ok else 'rejected'}")
        if ok:
            witness = MinimalityWitness(a, b, pa, pb, reason)
        return ok

    base = pts[1] if pts.shape[0] > 1 else pts[0]
    if param_space == "free":
        attempt(base, base + 1.0, "translation θ' = θ + 1·1 (F is affine along 1)")
    if witness is None and kind == "argmax" and (_I.is_discrete(noise) or not strictly):
        gen_theta = _I.to_space(0.37 * std * torch.randn(d, generator=g, dtype=_DT), "free")
        for delta in (1e-3, 1e-5, 1e-7):
            shift = torch.zeros(d, dtype=_DT)
            shift[0] = delta
            if attempt(gen_theta, gen_theta + shift, f"piecewise-constant model: shift θ_1 by "
                                                     f"{delta:g} at a generic θ"):
                break
    if witness is None and _I.is_bounded(noise):
        low, high = _I.support(noise)
        width = high - low if math.isfinite(high - low) else 10.0 * std
        a = torch.zeros(d, dtype=_DT)
        b = a.clone()
        a[0], b[0] = -(width + 1.0), -(width + 2.0)
        attempt(a, b, f"saturation: θ_1 below the others by more than the support width "
                      f"{width:g} never wins")
    if witness is None and not strictly:
        for t in (0.5, 1.0, 2.0):
            if attempt(th_min, th_min + t * scale * std * flat_dir,
                       f"step {t:g} along the flattest Hessian direction"):
                break
    details: dict[str, Any] = {
        "min_eigenvalue": lam, "min_eigenvalue_uncertainty": lam_se,
        "uncertainty_from": how, "n_points": int(pts.shape[0]), "theta_at_min": th_min,
        "strictly_convex_at_points": strictly, "witness_search": "; ".join(tried) or "none",
    }
    if kind == "argmax" and _I.is_discrete(noise):
        tie = torch.zeros(d, dtype=_DT)
        e1 = torch.zeros(d, dtype=_DT)
        e1[0] = 1e-7
        jump = (_I.argmax_probs_exact(tie + e1, noise) - _I.argmax_probs_exact(tie - e1, noise))
        details["subgradient_jump_at_0"] = float(jump.abs().max())
    report.details = details
    report.witness = witness
    if witness is None and not strictly:  # flat direction without an exact witness
        p0 = model.probs(th_min)[0]
        report.witness = MinimalityWitness(
            th_min, th_min + flat_dir, p0, model.probs(th_min + flat_dir)[0],
            f"the Hessian on Θ is singular at theta (eigenvalue {lam:.3g}); theta_prime − theta "
            f"is the flat direction (no exact equality verified)")
    report.minimal = witness is None and strictly
    return report
