r"""Numerics behind :mod:`perturb.checks`: the model maps θ ↦ ∇F(θ), their Jacobians, and the
inverse map (``identify``).

Two convex potentials (see :mod:`perturb.checks` and ``docs/identifiability.md``):

.. math::

    F_{\mathrm{argmax}}(\theta)  = \mathbb E[\max_i(\theta_i + \varepsilon_i)],            \qquad
    \nabla F = P(\arg\max_i(\theta_i + \varepsilon_i) = \cdot)

    F_{\mathrm{softmax}}(\theta) = \tau\,\mathbb E[\mathrm{lse}((\theta + \varepsilon)/\tau)], \qquad
    \nabla F = \mathbb E[\mathrm{softmax}((\theta + \varepsilon)/\tau)]

How each is evaluated:

- Perturb-Argmax, continuous noise with ``cdf`` and ``log_prob``: one-dimensional composite
  Gauss-Legendre quadrature in x of
  ``p_i = ∫ f(x−θ_i) Π_{j≠i} F(x−θ_j) dx`` and
  ``∂p_i/∂θ_j = −∫ f(x−θ_i) f(x−θ_j) Π_{k≠i,j} F(x−θ_k) dx`` (i ≠ j; rows sum to zero),
  with panel edges at the kinks of bounded noise, so that both are exact to ~1e-13.
  This is not ``noise.argmax_probs``: it works in log space (``log p_i`` keeps its relative
  accuracy for ``p_i`` down to 1e-300, which the Newton solve in log coordinates needs, where
  the grid of :mod:`perturb.noise` covers the max only and is accurate in absolute terms), gives
  the Hessian in closed form, and takes duck-typed noise with only ``cdf``/``log_prob``. The
  Gauss-Legendre rule itself is shared (:mod:`perturb._noise_quadrature`).
  Noise with only ``argmax_probs`` gets a central finite-difference Jacobian.
- Perturb-Softmax: randomized quasi-Monte Carlo with common random numbers: one scrambled
  Sobol point set, ``n_reps`` independent uniform shifts modulo 1 (Cranley-Patterson
  rotations), pushed through ``noise.icdf`` (plain ``noise.sample`` when there is no ``icdf``),
  fixed for the whole solve. The spread of the replicate means gives the standard error. Hessian
  ``(1/τ)(diag E[s] − E[s sᵀ])`` with s = softmax((θ+ε)/τ), on the same points.

Everything runs in float64 on the CPU; these are diagnostics, not a hot path.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import torch

from perturb._noise_quadrature import _pieces
from perturb._validation import check_choice, check_int, check_tau

PARAM_SPACES = ("free", "last_zero", "sum_zero")
KINDS = ("softmax", "argmax")
_DT = torch.float64
_GL_NODES = 16


class IdentifyResult(NamedTuple):
    """Output of :func:`perturb.checks.identify`.

    Attributes:
        theta: parameters in the "last_zero" space (``theta[-1] == 0``), shape ``(d,)``.
        residual: ``max_i |∇F(theta)_i − p_i|`` (exact quadrature for Perturb-Argmax; for
            Perturb-Softmax measured on fresh quasi-Monte-Carlo points, independent of the solve).
        converged: the solver met its tolerance on the points it solved with.
        std_error: the Monte-Carlo standard error of ``residual`` (``0.0`` where exact).
    """

    theta: torch.Tensor
    residual: float
    converged: bool
    std_error: float


# ----------------------------------------------------------------------------------- validation

def check_kind(kind: str) -> None:
    check_choice(kind, KINDS, "kind")


def check_space(param_space: str) -> None:
    check_choice(param_space, PARAM_SPACES, "param_space")


def check_d(d: int) -> int:
    d = check_int(d, "d")
    if d < 2:
        raise ValueError(f"d must be >= 2 (a distribution over at least two outcomes), got {d}")
    return d


def check_distribution(p: Any, name: str = "p", *, strict: bool = True) -> torch.Tensor:
    """A probability vector as a float64 tensor; ValueError naming what is wrong."""
    if not isinstance(p, torch.Tensor):
        try:
            p = torch.as_tensor(p, dtype=_DT)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{name} must be a 1-D probability vector, got {p!r}") from exc
    if p.is_complex() or not (p.is_floating_point() or p.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"{name} must be a real tensor, got dtype {p.dtype}")
    if p.ndim != 1:
        raise ValueError(f"{name} must be a 1-D probability vector of shape (d,), got shape "
                         f"{tuple(p.shape)}")
    if p.shape[0] < 2:
        raise ValueError(f"{name} must have length d >= 2, got length {p.shape[0]}")
    q = p.detach().to(device="cpu", dtype=_DT)
    if not bool(torch.isfinite(q).all()):
        raise ValueError(f"{name} contains NaN or infinite entries: {q.tolist()}")
    if bool((q < 0).any()):
        raise ValueError(f"{name} must be non-negative, got the entry {q.min().item()!r}")
    total = q.sum().item()
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"{name} must sum to 1 (a distribution), got sum {total!r}")
    if strict and bool((q <= 0).any()):
        raise ValueError(f"{name} must lie in the open simplex (every entry > 0): a distribution "
                         f"with a zero entry is a limit of the model, reached by no finite θ; "
                         f"got {name}[{int(torch.argmin(q))}] = 0")
    return q / total


def has(noise: Any, name: str) -> bool:
    """``noise.name`` exists and is implemented (the :class:`perturb.noise.Noise` base class
    defines ``cdf``/``log_prob``/``icdf`` as methods raising NotImplementedError)."""
    fn = getattr(noise, name, None)
    if not callable(fn):
        return False
    probe = torch.tensor([0.5, 0.25], dtype=_DT)
    try:
        fn(probe)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 - implemented, just unhappy with the probe
        return True
    return True


def _works(noise: Any, name: str, *args: Any) -> bool:
    fn = getattr(noise, name, None)
    if not callable(fn):
        return False
    try:
        fn(*args)
    except (NotImplementedError, ValueError, TypeError):
        return False
    return True


def _can_sample(noise: Any) -> bool:
    fn = getattr(noise, "sample", None)
    if not callable(fn):
        return False
    try:
        fn((1, 2), generator=torch.Generator().manual_seed(0), device="cpu", dtype=_DT)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 - implemented; errors surface later with context
        return True
    return True


def check_noise(noise: Any, kind: str) -> None:
    """The noise must offer what the chosen model needs (duck-typed, like torch.distributions)."""
    if kind == "softmax":
        if not (has(noise, "icdf") or _can_sample(noise)):
            raise ValueError(f"kind='softmax' needs a noise with sample(shape, generator=, device=, "
                             f"dtype=) or icdf(u); {noise!r} has neither")
        return
    exact = has(noise, "cdf") and has(noise, "log_prob")
    if not (exact or _works(noise, "argmax_probs", torch.zeros(2, dtype=_DT))):
        raise ValueError(f"kind='argmax' needs a noise with cdf(x) and log_prob(x) (for quadrature) "
                         f"or argmax_probs(theta); {noise!r} has neither")


def is_discrete(noise: Any) -> bool:
    if getattr(noise, "continuous", None) is False:
        return True
    return not has(noise, "log_prob")


def _attr(noise: Any, name: str) -> Any:
    try:
        return getattr(noise, name, None)
    except Exception:  # noqa: BLE001 - properties of the Noise base class raise when undefined
        return None


def support(noise: Any) -> tuple[float, float]:
    """(low, high) of the noise support; ±inf when unbounded or unknown."""
    low, high = -math.inf, math.inf
    sup = _attr(noise, "support")
    if isinstance(sup, (tuple, list)) and len(sup) == 2:
        low, high = float(sup[0]), float(sup[1])
    elif has(noise, "icdf"):
        try:
            vals = noise.icdf(torch.tensor([0.0, 1.0], dtype=_DT))
            low, high = float(vals[0]), float(vals[1])
        except Exception:  # noqa: BLE001 - icdf(0)/icdf(1) may legitimately raise
            pass
    if not math.isfinite(low) and isinstance(_attr(noise, "low"), (int, float)):
        low = float(noise.low)
    if not math.isfinite(high) and isinstance(_attr(noise, "high"), (int, float)):
        high = float(noise.high)
    return (low if math.isfinite(low) else -math.inf, high if math.isfinite(high) else math.inf)


def is_bounded(noise: Any) -> bool:
    if _attr(noise, "bounded"):
        return True
    low, high = support(noise)
    return math.isfinite(low) and math.isfinite(high)


def noise_std(noise: Any) -> float:
    var = _attr(noise, "variance")
    try:
        v = float(var) if var is not None and not callable(var) else float("nan")
    except (TypeError, ValueError):
        v = float("nan")
    return math.sqrt(v) if math.isfinite(v) and v > 0 else 1.0


# --------------------------------------------------------------------------- parameter spaces

def to_space(theta: torch.Tensor, param_space: str) -> torch.Tensor:
    """The representative of θ + R·1 in the space (the distribution never changes)."""
    if param_space == "last_zero":
        return theta - theta[..., -1:]
    if param_space == "sum_zero":
        return theta - theta.mean(-1, keepdim=True)
    return theta


def tangent_basis(d: int, param_space: str) -> torch.Tensor:
    """Columns span the directions of Θ: ``(d, d)`` (free), ``(d, d-1)`` otherwise (orthonormal)."""
    if param_space == "free":
        return torch.eye(d, dtype=_DT)
    if param_space == "last_zero":
        return torch.eye(d, dtype=_DT)[:, : d - 1]
    centred = torch.eye(d, dtype=_DT)[:, : d - 1] - 1.0 / d
    q, _ = torch.linalg.qr(centred)
    return q


# ------------------------------------------------------------------------------ noise helpers

def _as(noise_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(noise_fn(x)).to(_DT)


def _log_cdf(noise: Any, x: torch.Tensor) -> torch.Tensor:
    fn = getattr(noise, "log_cdf", None)
    if has(noise, "log_cdf"):
        return _as(fn, x)
    return torch.log(_as(noise.cdf, x).clamp(0.0, 1.0))


def _log_prob(noise: Any, x: torch.Tensor) -> torch.Tensor:
    return _as(noise.log_prob, x).nan_to_num(nan=-math.inf)


def _quad_grid(theta: torch.Tensor, noise: Any, panel: float | None) -> tuple[torch.Tensor,
                                                                              torch.Tensor]:
    low, high = support(noise)
    icdf = noise.icdf if has(noise, "icdf") else None
    std = noise_std(noise)
    if not math.isfinite(low):
        low = float(icdf(torch.tensor([1e-16], dtype=_DT))[0]) if icdf else -12.0 * std
    if not math.isfinite(high):
        high = float(icdf(torch.tensor([1.0 - 2.0 ** -50], dtype=_DT))[0]) if icdf \
            else 40.0 * std
    lo, hi = float(theta.min()) + low, float(theta.max()) + high
    panel = 0.25 * std if panel is None else panel
    n = max(4, math.ceil((hi - lo) / panel))
    edges = torch.linspace(lo, hi, n + 1, dtype=_DT)
    if is_bounded(noise):  # kinks of bounded densities become panel edges: exact for polynomials
        kinks = torch.cat([theta + low, theta + high])
        edges = torch.unique(torch.cat([edges, kinks]))
    return _pieces(edges, _GL_NODES)   # the Gauss–Legendre rule of perturb.noise


def argmax_quadrature(theta: torch.Tensor, noise: Any, *, panel: float | None = None,
                      jacobian: bool = True) -> tuple[torch.Tensor, torch.Tensor,
                                                      torch.Tensor | None]:
    """(p, log p, H) of Perturb-Argmax at θ by quadrature; H = ∂p/∂θ (symmetric, rows sum to 0).

    Shape: θ ``(d,)`` -> ``(d,)``, ``(d,)``, ``(d, d)``.
    """
    x, w = _quad_grid(theta, noise, panel)
    u = x[:, None] - theta[None, :]                              # (n, d)
    log_f, log_F = _log_prob(noise, u), _log_cdf(noise, u)
    log_r = torch.where(torch.isneginf(log_f), torch.full_like(log_f, -math.inf), log_f - log_F)
    log_r = log_r.nan_to_num(nan=-math.inf, posinf=-math.inf)
    log_P = log_F.sum(-1)                                        # log Π_j F(x − θ_j)
    log_wP = torch.log(w) + log_P                                # (n,)
    log_p = torch.logsumexp(log_wP[:, None] + log_r, dim=0)
    p = log_p.exp()
    if not jacobian:
        return p, log_p, None
    g = torch.exp(0.5 * log_wP[:, None] + log_r).nan_to_num(0.0)  # sqrt(w P) f/F
    m = g.T @ g                                                  # ∫ f_i f_j Π_{k≠i,j} F_k, i≠j
    m.fill_diagonal_(0.0)
    hess = torch.diag(m.sum(-1)) - m
    return p, log_p, hess


def argmax_probs_exact(theta: torch.Tensor, noise: Any) -> torch.Tensor:
    """P(argmax = i): ``noise.argmax_probs`` when the noise has it, else quadrature."""
    fn = getattr(noise, "argmax_probs", None)
    if callable(fn):
        return torch.as_tensor(fn(theta.to(_DT))).to(_DT)
    return argmax_quadrature(theta, noise, jacobian=False)[0]


def argmax_stats(theta: torch.Tensor, noise: Any, *, jacobian: bool = True, fd_step: float = 1e-5
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(p, log p, H) by quadrature when possible, else argmax_probs + finite differences."""
    if has(noise, "cdf") and not is_discrete(noise):
        return argmax_quadrature(theta, noise, jacobian=jacobian)
    p = argmax_probs_exact(theta, noise)
    log_p = torch.log(p)
    if not jacobian:
        return p, log_p, None
    d = theta.shape[0]
    eye = torch.eye(d, dtype=_DT) * fd_step
    cols = [(argmax_probs_exact(theta + eye[j], noise) - argmax_probs_exact(theta - eye[j], noise))
            / (2 * fd_step) for j in range(d)]
    hess = torch.stack(cols, dim=-1)
    return p, log_p, 0.5 * (hess + hess.T)


# ------------------------------------------------------------------------------- QMC softmax

class SoftmaxEstimator:
    """E[softmax((θ+ε)/τ)] and its Jacobian on fixed (common) randomized QMC points.

    ``n_reps`` independent replicates of ``n_samples`` points each; statistics are pooled means
    and standard errors are the replicate spread / sqrt(n_reps).
    """

    def __init__(self, noise: Any, d: int, tau: float, *, n_samples: int = 2 ** 12,
                 n_reps: int = 8, generator: torch.Generator | None = None) -> None:
        check_tau(tau)
        self.tau, self.d = float(tau), d
        self.n_reps = check_int(n_reps, "n_reps", low=2)
        n_samples = check_int(n_samples, "n_samples", low=2)
        self.eps = draw_noise(noise, (self.n_reps, n_samples, d), generator)

    def stats(self, theta: torch.Tensor, jacobian: bool = True) -> dict[str, torch.Tensor]:
        z = (theta.to(_DT) + self.eps) / self.tau                   # (R, n, d)
        log_s = torch.log_softmax(z, dim=-1)
        n = z.shape[1]
        top = log_s.amax(dim=1, keepdim=True)                      # (R, 1, d)
        log_rep = torch.log(torch.exp(log_s - top).mean(1)) + top[:, 0]  # (R, d) log-means
        rep = log_rep.exp()
        log_p = torch.logsumexp(log_rep, dim=0) - math.log(self.n_reps)
        out = {"p": log_p.exp(), "log_p": log_p, "se": rep.std(0) / math.sqrt(self.n_reps),
               "rep_p": rep}
        if jacobian:
            s = log_s.exp()
            second = torch.einsum("rni,rnj->rij", s, s) / n          # (R, d, d)
            rep_h = (torch.diag_embed(rep) - second) / self.tau
            out["rep_hess"] = rep_h
            out["hess"] = rep_h.mean(0)
        return out


def draw_noise(noise: Any, shape: tuple[int, int, int], generator: torch.Generator | None
               ) -> torch.Tensor:
    """ε of ``shape`` = (replicates, points, d): scrambled Sobol + icdf, else ``noise.sample``."""
    icdf = getattr(noise, "icdf", None)
    reps, n, d = shape
    if has(noise, "icdf") and d <= 21201:
        seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator))
        base = torch.quasirandom.SobolEngine(d, scramble=True, seed=seed).draw(n, dtype=_DT)
        shift = torch.rand(reps, 1, d, generator=generator, dtype=_DT)  # Cranley-Patterson
        tiny = 2.0 ** -53
        u = torch.remainder(base[None] + shift, 1.0).clamp(tiny, 1.0 - tiny)
        eps = torch.as_tensor(icdf(u)).to(_DT)
    else:
        eps = torch.as_tensor(noise.sample(shape, generator=generator, device="cpu", dtype=_DT))
        eps = eps.to(_DT)
    if eps.shape != torch.Size(shape) or not bool(torch.isfinite(eps).all()):
        raise ValueError(f"noise {noise!r} returned samples of shape {tuple(eps.shape)} (expected "
                         f"{shape}) or non-finite values")
    return eps


# --------------------------------------------------------------------------------- the model

class Model:
    """∇F and its Jacobian for one (noise, kind, τ); softmax uses fixed QMC points."""

    def __init__(self, noise: Any, d: int, kind: str, tau: float, *, n_samples: int = 2 ** 12,
                 n_reps: int = 8, generator: torch.Generator | None = None) -> None:
        self.noise, self.d, self.kind, self.tau = noise, d, kind, float(tau)
        self.exact = kind == "argmax"
        self._est = None if self.exact else SoftmaxEstimator(
            noise, d, tau, n_samples=n_samples, n_reps=n_reps, generator=generator)

    def stats(self, theta: torch.Tensor, jacobian: bool = True) -> dict[str, torch.Tensor]:
        theta = theta.to(_DT)
        if self.exact:
            p, log_p, h = argmax_stats(theta, self.noise, jacobian=jacobian)
            out = {"p": p, "log_p": log_p, "se": torch.zeros_like(p)}
            if h is not None:
                out["hess"] = h
            return out
        return self._est.stats(theta, jacobian=jacobian)

    def probs(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(p, standard error); the exact ``argmax_probs`` for Perturb-Argmax."""
        if self.exact:
            p = argmax_probs_exact(theta.to(_DT), self.noise)
            return p, torch.zeros_like(p)
        s = self.stats(theta, jacobian=False)
        return s["p"], s["se"]


# ------------------------------------------------------------------------------ the inverse

def initial_theta(p: torch.Tensor, noise: Any) -> torch.Tensor:
    """Gumbel-argmax inverse log(p/p_d), rescaled to the noise's spread (and its support)."""
    theta = torch.log(p) - torch.log(p[-1])
    theta = theta * (noise_std(noise) / (math.pi / math.sqrt(6.0)))
    if is_bounded(noise):
        low, high = support(noise)
        spread = float(theta.max() - theta.min())
        limit = 0.9 * (high - low)
        if spread > limit:
            theta = theta * (limit / spread)
    return theta - theta[-1]


def solve_inverse(p: torch.Tensor, model: Model, *, init: torch.Tensor | None = None,
                  tol: float = 1e-12, max_iter: int = 100) -> tuple[torch.Tensor, bool, int, float]:
    """Solve ∇F(θ) = p over θ_d = 0: the optimality condition of the dual min F(θ) − ⟨p, θ⟩.

    Newton on the dual would step Δ = −H⁻¹(∇F − p). We take the same step in log coordinates,
    Δ = argmin ‖J Δ + r‖ with r = log ∇F(θ) − log p and J = diag(1/∇F) H restricted to θ_d = 0
    (the Gauss-Newton step of a zero-residual problem, equal to the dual Newton step at the
    solution), globalised by Armijo backtracking on ½‖r‖². Working in log coordinates keeps the
    quadratic convergence for probabilities down to 1e-300, where the plain dual Newton crawls.

    Returns (θ, converged, iterations, final max |r|).
    """
    d = p.shape[0]
    log_target = torch.log(p)
    basis = tangent_basis(d, "last_zero")
    theta = initial_theta(p, model.noise) if init is None else to_space(init.to(_DT), "last_zero")

    def residual(th: torch.Tensor, jac: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        s = model.stats(th, jacobian=jac)
        return s["log_p"] - log_target, s

    r, s = residual(theta, True)
    merit = 0.5 * float(r.pow(2).sum()) if bool(torch.isfinite(r).all()) else math.inf
    for it in range(1, max_iter + 1):
        if merit < math.inf and float(r.abs().max()) <= tol:
            return theta, True, it - 1, float(r.abs().max())
        jac = (s["hess"] / s["p"].clamp_min(1e-300)[:, None]) @ basis     # (d, d-1)
        rr = torch.where(torch.isfinite(r), r, torch.zeros_like(r))
        step = torch.linalg.lstsq(jac, -rr[:, None], driver="gelsd").solution[:, 0]
        if not bool(torch.isfinite(step).all()):
            break
        step_full = basis @ step
        t, accepted = 1.0, False
        slope = -2.0 * merit if merit < math.inf else -1.0
        for _ in range(40):
            cand = theta + t * step_full
            r_new, s_new = residual(cand, False)
            m_new = 0.5 * float(r_new.pow(2).sum()) if bool(torch.isfinite(r_new).all()) \
                else math.inf
            if m_new <= merit + 1e-4 * t * slope or (merit == math.inf and m_new < math.inf):
                accepted = True
                break
            t *= 0.5
        if not accepted:
            break
        theta = cand
        r, s = residual(theta, True)
        merit = 0.5 * float(r.pow(2).sum()) if bool(torch.isfinite(r).all()) else math.inf
    final = float(r.abs().max()) if merit < math.inf else math.inf
    return theta, final <= tol, max_iter, final
