r"""Numerics behind :mod:`perturb.checks`: the model maps θ ↦ ∇F(θ), their Jacobians, and the
inverse map (``identify``).

Two convex potentials (see :mod:`perturb.checks` and ``docs/identifiability.md``):

.. math::

    F_{\mathrm{argmax}}(\theta)  = \mathbb E[\max_i(\theta_i + \varepsilon_i)],            \qquad
    \nabla F = P(\arg\max_i(\theta_i + \varepsilon_i) = \cdot)

    F_{\mathrm{softmax}}(\theta) = \tau\,\mathbb E[\mathrm{lse}((\theta + \varepsilon)/\tau)], \qquad
    \nabla F = \mathbb E[\mathrm{softmax}((\theta + \varepsilon)/\tau)]

How each is evaluated:

- Perturb-Argmax, continuous noise with ``cdf`` and ``log_prob``: the quadrature of
  :mod:`perturb.noise` (``perturb.noise._quadrature.log_argmax_probs``: one rule for
  ``argmax_probs``, ``expected_max`` and this) in its log-space form, which covers every
  coordinate's range so that ``log p_i`` keeps its relative accuracy for ``p_i`` down to 1e-300
  (the Newton solve in log coordinates needs it), with the Hessian
  ``∂p_i/∂θ_j = −∫ f(x−θ_i) f(x−θ_j) Π_{k≠i,j} F(x−θ_k) dx`` (i ≠ j; rows sum to zero) on the
  same nodes. Noise with only ``argmax_probs`` gets a central finite-difference Jacobian.
- Perturb-Softmax: randomized quasi-Monte Carlo with common random numbers: one scrambled
  Sobol point set, ``n_reps`` independent uniform shifts modulo 1 (Cranley-Patterson
  rotations), pushed through ``noise.icdf`` (plain ``noise.sample`` when there is no ``icdf``),
  fixed for the whole solve. The spread of the replicate means gives the standard error. Hessian
  ``(1/τ)(diag E[s] − E[s sᵀ])`` with s = softmax((θ+ε)/τ), on the same points.
- What a noise can do is read from its declared capabilities (``has_cdf``, ``has_log_prob``,
  ``has_icdf``, ``has_sample``, ``has_argmax_probs``, ... of :class:`perturb.noise.Noise`);
  a duck-typed object that is not a ``Noise`` is wrapped by :func:`as_noise`, which declares
  them from the methods and attributes the object defines.

Everything runs in float64 on the CPU; these are diagnostics, not a hot path.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from perturb._validation import check_choice, check_int, check_tau
from perturb.noise import Noise, _quadrature

PARAM_SPACES = ("free", "last_zero", "sum_zero")
KINDS = ("softmax", "argmax")
_DT = torch.float64


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


def _attr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - a property of a user object may raise
        return None


class _DuckNoise(Noise):
    """A :class:`~perturb.noise.Noise` view of a duck-typed noise object (not a subclass).

    Its capabilities are declared from what the object *defines* (callable ``sample``,
    ``icdf``, ``cdf``, ``log_cdf``, ``log_prob``, ``argmax_probs``; the attributes ``variance``,
    ``bounded``, ``support`` or ``low``/``high``, ``continuous``, ``breakpoints``), never by
    calling it; the methods forward to it, with results as float tensors.
    """

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        fns = {name: getattr(obj, name, None) for name in
               ("sample", "icdf", "cdf", "log_cdf", "log_prob", "argmax_probs")}
        self._fns = {k: f for k, f in fns.items() if callable(f)}
        self.has_sample = "sample" in self._fns or "icdf" in self._fns
        self.has_icdf = "icdf" in self._fns
        self.has_cdf = "cdf" in self._fns
        self.has_log_prob = "log_prob" in self._fns
        self.has_closed_form = "argmax_probs" in self._fns
        continuous = _attr(obj, "continuous")
        self.continuous = continuous if isinstance(continuous, bool) else True
        self.has_argmax_probs = self.has_closed_form or (
            self.continuous and self.has_cdf and self.has_log_prob)
        var = _attr(obj, "variance")
        try:
            self._variance = None if var is None or callable(var) else float(var)
        except (TypeError, ValueError, RuntimeError):
            self._variance = None
        self.has_variance = self._variance is not None
        low, high = -math.inf, math.inf
        sup = _attr(obj, "support")
        if isinstance(sup, (tuple, list)) and len(sup) == 2:
            low, high = float(sup[0]), float(sup[1])
        if not math.isfinite(low) and isinstance(_attr(obj, "low"), (int, float)):
            low = float(obj.low)
        if not math.isfinite(high) and isinstance(_attr(obj, "high"), (int, float)):
            high = float(obj.high)
        self._support = (low, high)
        self.bounded = bool(_attr(obj, "bounded")) or (math.isfinite(low) and math.isfinite(high))
        self.breakpoints = tuple(_attr(obj, "breakpoints") or ())

    def _call(self, name: str, x: torch.Tensor) -> torch.Tensor:
        fn = self._fns.get(name)
        if fn is None:
            return getattr(super(), name)(x)
        return torch.as_tensor(fn(x)).to(dtype=x.dtype, device=x.device)

    def sample(self, shape: Any, *, generator: torch.Generator | None = None,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        if "sample" in self._fns:
            return torch.as_tensor(self._fns["sample"](shape, generator=generator, device=device,
                                                       dtype=dtype))
        return super().sample(shape, generator=generator, device=device, dtype=dtype)

    def icdf(self, u: torch.Tensor) -> torch.Tensor:
        return self._call("icdf", u)

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        return self._call("cdf", x)

    def log_cdf(self, x: torch.Tensor) -> torch.Tensor:
        if "log_cdf" in self._fns:
            return self._call("log_cdf", x)
        return torch.log(self.cdf(x).clamp(0.0, 1.0))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        return self._call("log_prob", x)

    def _argmax_probs(self, theta: torch.Tensor) -> torch.Tensor:
        if self.has_closed_form:
            return torch.as_tensor(self._fns["argmax_probs"](theta)).to(theta.dtype)
        return super()._argmax_probs(theta)

    @property
    def variance(self) -> float:
        if self._variance is None:
            return super().variance
        return self._variance

    @property
    def support(self) -> tuple[float, float]:
        return self._support

    def __repr__(self) -> str:
        return repr(self.obj)


def as_noise(noise: Any) -> Noise:
    """``noise`` itself when it is a :class:`~perturb.noise.Noise`, else a :class:`_DuckNoise`."""
    return noise if isinstance(noise, Noise) else _DuckNoise(noise)


def check_noise(noise: Noise, kind: str) -> None:
    """The noise must declare what the chosen model needs (``noise`` from :func:`as_noise`)."""
    if kind == "softmax":
        if not noise.has_sample:
            raise ValueError(f"kind='softmax' needs a noise with sample(shape, generator=, device=, "
                             f"dtype=) or icdf(u); {noise!r} has neither")
        return
    if not noise.has_argmax_probs:
        raise ValueError(f"kind='argmax' needs a noise with cdf(x) and log_prob(x) (for quadrature) "
                         f"or argmax_probs(theta); {noise!r} has neither")


def is_discrete(noise: Noise) -> bool:
    """No density: ∇F of Perturb-Argmax is piecewise constant (or only ``argmax_probs`` known)."""
    return not (noise.continuous and noise.has_log_prob)


def support(noise: Noise) -> tuple[float, float]:
    """(low, high) of the noise support; ±inf when unbounded."""
    low, high = (float(s) for s in noise.support)
    return (low if math.isfinite(low) else -math.inf, high if math.isfinite(high) else math.inf)


def is_bounded(noise: Noise) -> bool:
    if noise.bounded:
        return True
    low, high = support(noise)
    return math.isfinite(low) and math.isfinite(high)


def noise_std(noise: Noise) -> float:
    """The standard deviation of ε when declared (``has_variance``) and positive, else 1."""
    v = float(noise.variance) if noise.has_variance else math.nan
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


# --------------------------------------------------------------------------- Perturb-Argmax

def argmax_quadrature(theta: torch.Tensor, noise: Noise, *, refine: int = 1,
                      jacobian: bool = True) -> tuple[torch.Tensor, torch.Tensor,
                                                      torch.Tensor | None]:
    """(p, log p, H) of Perturb-Argmax at θ by the quadrature of :mod:`perturb.noise`;
    H = ∂p/∂θ (symmetric, rows sum to 0). Shape: θ ``(d,)`` -> ``(d,)``, ``(d,)``, ``(d, d)``."""
    return _quadrature.log_argmax_probs(noise, theta.to(_DT), hessian=jacobian, refine=refine)


def argmax_probs_exact(theta: torch.Tensor, noise: Noise) -> torch.Tensor:
    """P(argmax = i) through the user-facing ``noise.argmax_probs``."""
    return torch.as_tensor(noise.argmax_probs(theta.to(_DT))).to(_DT)


def argmax_stats(theta: torch.Tensor, noise: Noise, *, jacobian: bool = True,
                 fd_step: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(p, log p, H) by quadrature when the noise declares a density and a CDF, else
    ``argmax_probs`` and a central finite-difference Jacobian."""
    if noise.has_cdf and not is_discrete(noise):
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

    def __init__(self, noise: Noise, d: int, tau: float, *, n_samples: int = 2 ** 12,
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


def draw_noise(noise: Noise, shape: tuple[int, int, int], generator: torch.Generator | None
               ) -> torch.Tensor:
    """ε of ``shape`` = (replicates, points, d): scrambled Sobol + icdf, else ``noise.sample``."""
    reps, n, d = shape
    if noise.has_icdf and d <= 21201:
        seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator))
        base = torch.quasirandom.SobolEngine(d, scramble=True, seed=seed).draw(n, dtype=_DT)
        shift = torch.rand(reps, 1, d, generator=generator, dtype=_DT)  # Cranley-Patterson
        tiny = 2.0 ** -53
        u = torch.remainder(base[None] + shift, 1.0).clamp(tiny, 1.0 - tiny)
        eps = torch.as_tensor(noise.icdf(u)).to(_DT)
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

    def __init__(self, noise: Noise, d: int, kind: str, tau: float, *, n_samples: int = 2 ** 12,
                 n_reps: int = 8, generator: torch.Generator | None = None) -> None:
        self.noise, self.d, self.kind, self.tau = noise, d, kind, float(tau)
        self.exact = kind == "argmax"
        self._est = None if self.exact else SoftmaxEstimator(
            noise, d, tau, n_samples=n_samples, n_reps=n_reps, generator=generator)

    def stats(self, theta: torch.Tensor, jacobian: bool = True) -> dict[str, torch.Tensor]:
        theta = theta.to(_DT)
        if self._est is None:  # Perturb-Argmax (self.exact): no estimator, the exact stats
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

def initial_theta(p: torch.Tensor, noise: Noise) -> torch.Tensor:
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
