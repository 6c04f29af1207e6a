r"""Perturbed optimizers: differentiate through ANY exact argmax solver, even a black box.

For an argmax solver y(θ) = argmax_{y ∈ C} ⟨y, θ⟩ (piecewise constant in θ) and noise Z with
density μ(z) ∝ exp(−ν(z)), the perturbed optimizer and its Jacobian are (Berthet et al. 2020,
Prop. 3.1)

.. math::

    y_\sigma(\theta) = \mathbb{E}\big[y(\theta + \sigma Z)\big], \qquad
    J_\theta y_\sigma(\theta) = \tfrac{1}{\sigma}\,
        \mathbb{E}\big[y(\theta + \sigma Z)\, \nabla\nu(Z)^\top\big]

(substitute u = θ + σz in the expectation and differentiate the density, not the solver). For
Gaussian noise ∇ν(z) = z; for standard Gumbel noise ∇ν(z) = 1 − e^{−z}; for any noise with a
``log_prob`` it is −∇ log μ, obtained here by autograd. Both are estimated by Monte Carlo with
``n_samples`` solver calls run without gradients, so the solver may be anything — networkx,
scipy, a C++ extension — returning numpy or torch.

The vector–Jacobian product is ḡ_θ = E[⟨g, y(θ + σZ)⟩ ∇ν(Z)]/σ. Since E[∇ν(Z)] = 0, subtracting
from ⟨g, y_s⟩ a baseline independent of Z_s keeps it unbiased; the default leave-one-out
baseline (the mean over the other samples) removes most of the variance.

The Fenchel–Young loss L(θ; y) = F_σ(θ) − ⟨θ, y⟩ + const, with F_σ(θ) = E[max_y ⟨y, θ + σZ⟩],
is convex in θ with gradient ∇_θ L = y_σ(θ) − y (Danskin), so it needs no Jacobian at all.

On the simplex with Gumbel noise y_σ(θ) = softmax(θ/σ) exactly (Gumbel-max trick): the tests use
this to check the estimator against the analytic softmax Jacobian.

The smoothing σ is the noise's own ``scale`` (``noise=Normal(scale=0.5)``), as everywhere in the
package; the default noise is ``Gumbel()``, as in :func:`perturb.relax`. The older ``sigma=``
argument (a multiplier of ``noise.scale``, with ``Normal()`` as the default noise) still works
for one release with a ``FutureWarning``.

References:
    Berthet, Blondel, Teboul, Cuturi, Vert & Bach, "Learning with Differentiable Perturbed
    Optimizers", NeurIPS 2020, arXiv:2002.08676.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np
import torch

from perturb._deprecation import warn_deprecated
from perturb._validation import (
    broadcasts_to,
    check_choice,
    check_finite,
    check_int,
    check_positive,
    check_scores,
    check_value,
    validation_enabled,
)
from perturb.noise import Gumbel, Noise, Normal
from perturb.noise._args import draw
from perturb.structures import Structure

__all__ = ["perturbed", "fenchel_young_loss", "PerturbedOptimizer", "perturbed_optimizer"]

ArgmaxFn = Callable[[torch.Tensor], Any]


# --------------------------------------------------------------------------------------------
# sampling and running the black box
# --------------------------------------------------------------------------------------------

def _grad_nu(noise: Noise, z: torch.Tensor) -> torch.Tensor:
    """∇ν(z) = −∇ log μ(z) elementwise, by autograd through ``noise.log_prob``."""
    log_prob = getattr(noise, "log_prob", None)
    if log_prob is None or getattr(noise, "continuous", True) is False:
        raise ValueError(f"noise must have a differentiable density (log_prob) for the perturbed "
                         f"gradient, got {noise!r}")
    if getattr(noise, "bounded", False):
        # the identity integrates by parts: it needs a density vanishing at the support's ends
        raise ValueError(f"the perturbed gradient needs a noise whose density vanishes at the "
                         f"ends of its support (Normal, Gumbel, Logistic), got bounded {noise!r}")
    with torch.enable_grad():
        x = z.detach().requires_grad_(True)
        try:
            lp = log_prob(x)
        except NotImplementedError as err:
            raise ValueError(f"noise must have a differentiable density (log_prob) for the "
                             f"perturbed gradient, got {noise!r}") from err
        (g,) = torch.autograd.grad(lp.sum(), x, allow_unused=True)
    if g is None:
        raise ValueError(f"the log-density of {noise!r} does not depend on its argument; "
                         f"the perturbed gradient needs a non-constant density")
    return -g


def _to_tensor(out: Any, like: torch.Tensor) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.detach().to(dtype=like.dtype, device=like.device)
    return torch.as_tensor(np.asarray(out), dtype=like.dtype, device=like.device)


def _run_argmax(argmax_fn: ArgmaxFn, u: torch.Tensor, event_dim: int,
                batched: bool) -> torch.Tensor:
    """Run the solver on perturbed scores ``(*lead, *event)`` without gradients.

    ``batched=True``: one call on the whole tensor; otherwise one call per problem (a Python
    loop over the leading dims, for solvers that take a single problem). The output keeps the
    leading dims and may add any number of its own, zero included: a scalar per problem (a
    loss, a sign) is a valid ``y``, as in jaxopt's ``make_perturbed_fun``.
    """
    lead = u.shape[:u.ndim - event_dim]
    with torch.no_grad():
        if batched:
            y = _to_tensor(argmax_fn(u), u)
        else:
            flat = u.reshape(-1, *u.shape[u.ndim - event_dim:])
            ys = [_to_tensor(argmax_fn(flat[i]), u) for i in range(flat.shape[0])]
            y = torch.stack(ys).reshape(*lead, *ys[0].shape)
    if y.shape[:len(lead)] != lead:
        raise ValueError(f"argmax_fn must return (*batch, *out): keep the leading dims "
                         f"{tuple(lead)} of its input (shape {tuple(u.shape)}) and add any "
                         f"dims of its own (none for a scalar per problem), got output shape "
                         f"{tuple(y.shape)}")
    if validation_enabled() and y.numel():
        check_value(torch.isfinite(y).all(),
                    f"argmax_fn returned NaN or infinite values on perturbed scores (output "
                    f"shape {tuple(y.shape)}): their mean and its gradient would be NaN; make "
                    f"the solver return finite values for every input")
    return y


def _solver(argmax_fn: ArgmaxFn | Structure, event_dim: int) -> tuple[ArgmaxFn, int]:
    """(the argmax callable, event_dim): a :class:`~perturb.Structure` brings its own exact
    ``argmax`` and event dims; anything else must be a callable."""
    if isinstance(argmax_fn, Structure):
        return argmax_fn.argmax, argmax_fn.event_dim
    if not callable(argmax_fn):
        raise ValueError(f"argmax_fn must be a Structure or a callable mapping scores to "
                         f"structures, got {argmax_fn!r}")
    return argmax_fn, check_int(event_dim, "event_dim", low=0)


def _noise_and_sigma(fn: str, noise: Any, sigma: float | None) -> tuple[Noise, float]:
    """(the noise, the multiplier σ of its samples): σ = 1 and ``Gumbel()`` by default; the
    deprecated ``sigma`` (also accepted as the old third positional argument, where ``noise``
    now stands) keeps its old meaning, a multiplier with ``Normal()`` as the default noise."""
    if isinstance(noise, numbers.Real) and not isinstance(noise, bool):
        if sigma is not None:
            raise TypeError(f"{fn}() got sigma twice (positionally and as sigma=)")
        sigma, noise = float(noise), None
    if sigma is None:
        return (Gumbel() if noise is None else noise), 1.0
    warn_deprecated(fn, "sigma", "the noise object carries the scale: pass "
                    "noise=Normal(scale=sigma) (sigma multiplied noise.scale, and the default "
                    "noise was Normal())")
    check_positive(sigma, "sigma")
    return (Normal() if noise is None else noise), float(sigma)


def _sample(argmax_fn: ArgmaxFn, theta: torch.Tensor, sigma: float,
            noise: Noise, n_samples: int, generator: torch.Generator | None,
            event_dim: int, batched: bool):
    """Validate, draw Z ``(n_samples, *theta.shape)``, return (noise, Z, y(θ + σZ)).
    ``argmax_fn`` and ``event_dim`` come resolved by :func:`_solver`."""
    check_scores(theta, "theta", min_ndim=event_dim)
    check_int(n_samples, "n_samples", low=1)
    z = draw(noise, (n_samples, *theta.shape), generator, theta.device, theta.dtype)
    ys = _run_argmax(argmax_fn, theta.detach() + sigma * z, event_dim, batched)
    return noise, z, ys


# --------------------------------------------------------------------------------------------
# the perturbed optimizer
# --------------------------------------------------------------------------------------------

def _sum_from(x: torch.Tensor, start: int) -> torch.Tensor:
    """``x`` summed over its dims from ``start`` on; ``x`` itself when there are none (a scalar
    output per problem: torch's ``sum(dim=())`` would sum everything)."""
    dims = tuple(range(start, x.ndim))
    return x.sum(dim=dims) if dims else x


def _perturbed_vjp(ys: torch.Tensor, dnu: torch.Tensor, grad: torch.Tensor, sigma: float,
                   n_batch: int, baseline: bool) -> torch.Tensor:
    """ḡ_θ = (1/M) Σ_s (⟨g, y_s⟩ − b_s) ∇ν(Z_s) / σ, with b_s the leave-one-out mean (or 0).

    Shapes: ``ys`` ``(M, *batch, *out)``, ``dnu`` ``(M, *batch, *event)``, ``grad``
    ``(*batch, *out)``; returns ``(*batch, *event)``. A pure function the tests call directly.
    """
    m = ys.shape[0]
    a = _sum_from(ys * grad, 1 + n_batch)  # (M, *batch)
    if baseline and m > 1:
        a = a - (a.sum(dim=0, keepdim=True) - a) / (m - 1)
    a = a.reshape(*a.shape, *([1] * (dnu.ndim - a.ndim)))
    return (a * dnu).mean(dim=0) / sigma


class _Perturbed(torch.autograd.Function):
    r"""Forward: the Monte-Carlo mean (1/M) Σ_s y(θ + σZ_s) (computed by the caller, without
    gradients); backward: the perturbed Jacobian estimator
    ḡ_θ = E[⟨g, y(θ + σZ)⟩ ∇ν(Z)]/σ (:func:`_perturbed_vjp`). ``theta`` is an input only to
    attach the result to its graph.
    """

    @staticmethod
    def forward(theta, ys, dnu, sigma, n_batch, baseline):
        return ys.mean(dim=0)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, ys, dnu, sigma, n_batch, baseline = inputs
        ctx.sigma, ctx.n_batch, ctx.baseline = sigma, n_batch, baseline
        ctx.save_for_backward(ys, dnu)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        ys, dnu = ctx.saved_tensors
        g = _perturbed_vjp(ys, dnu, grad, ctx.sigma, ctx.n_batch, ctx.baseline)
        return g, None, None, None, None, None


def perturbed(argmax_fn: ArgmaxFn | Structure, theta: torch.Tensor, noise: Noise | None = None,
              n_samples: int = 100, generator: torch.Generator | None = None, *,
              event_dim: int = 1, batched: bool = True, baseline: bool = True,
              sigma: float | None = None) -> torch.Tensor:
    r"""The perturbed optimizer y_σ(θ) = E[argmax_fn(θ + σZ)], differentiable in θ.

    .. math:: y_\sigma(\theta) \approx \frac{1}{M}\sum_{s=1}^M y(\theta + \sigma Z_s),\qquad
              \bar g_\theta \approx \frac{1}{M\sigma}\sum_{s=1}^M
              \big(\langle g, y(\theta + \sigma Z_s)\rangle - b_s\big)\,\nabla\nu(Z_s)

    (see the module docstring). ``argmax_fn`` is called without gradients and is never
    differentiated: it may be any exact solver, e.g. a networkx shortest path.

    Args:
        argmax_fn: the solver: a :class:`~perturb.Structure` (its exact ``argmax`` and
            ``event_dim``, e.g. ``KSubset(3)``), or a callable. With ``batched=True`` it maps a
            tensor ``(M, *batch, *event)`` to
            ``(M, *batch, *out)``; with ``batched=False`` it maps one problem ``(*event)`` to
            ``(*out)`` and is called ``M·|batch|`` times. It may return a tensor, a numpy array or a
            nested list; it receives a tensor on ``theta``'s device (call ``.cpu().numpy()``
            for numpy code).
        theta: scores θ.
        noise: σZ's distribution, its ``scale`` the smoothing σ (y_σ → y as σ → 0); default
            ``Gumbel()``. Needs ``sample`` and a differentiable ``log_prob`` for the backward
            pass (Normal, Gumbel, Logistic).
        n_samples: M, the Monte-Carlo sample size (the estimator's variance is O(1/M)).
        generator: a ``torch.Generator`` for reproducible noise.
        event_dim: the number of trailing dims of ``theta`` that form one problem.
        batched: whether ``argmax_fn`` takes a batch of problems (see above).
        baseline: subtract the leave-one-out mean of ⟨g, y_t⟩ (unbiased variance reduction).
        sigma: deprecated (``FutureWarning``): a multiplier of the noise's samples, with
            ``Normal()`` as the default noise; pass ``noise=Normal(scale=sigma)`` instead.

    Shape:
        theta: ``(*batch, *event)``; output ``(*batch, *out)`` (usually ``*out = *event``).

    Returns:
        The Monte-Carlo estimate of y_σ(θ); its backward is the perturbed Jacobian estimator.

    Raises:
        ValueError: n_samples < 1, NaN θ, a noise without density, an ``argmax_fn`` whose
            output does not keep the leading dims.

    Example::

        >>> def hard_argmax(u):                          # any exact solver, not differentiable
        ...     return torch.nn.functional.one_hot(u.argmax(-1), u.shape[-1])
        >>> theta = torch.randn(4, 5, requires_grad=True)
        >>> y = perturbed(hard_argmax, theta, Normal(scale=0.5), n_samples=1000)
        >>> torch.allclose(y.sum(-1), torch.ones(4))     # rows sum to 1: points of the simplex
        True

    References:
        Berthet et al., "Learning with Differentiable Perturbed Optimizers", NeurIPS 2020,
        arXiv:2002.08676.
    """
    noise, sigma = _noise_and_sigma("perturbed", noise, sigma)
    return _perturbed(argmax_fn, theta, noise, sigma, n_samples, generator, event_dim, batched,
                      baseline)


def _perturbed(argmax_fn: ArgmaxFn | Structure, theta: torch.Tensor, noise: Noise, sigma: float,
               n_samples: int, generator: torch.Generator | None, event_dim: int, batched: bool,
               baseline: bool) -> torch.Tensor:
    argmax_fn, event_dim = _solver(argmax_fn, event_dim)
    noise, z, ys = _sample(argmax_fn, theta, sigma, noise, n_samples, generator, event_dim,
                           batched)
    n_batch = theta.ndim - event_dim
    if not (theta.requires_grad and torch.is_grad_enabled()):
        return ys.mean(dim=0)
    dnu = _grad_nu(noise, z)
    return _Perturbed.apply(theta, ys, dnu, float(sigma), n_batch, bool(baseline))


def fenchel_young_loss(argmax_fn: ArgmaxFn | Structure, theta: torch.Tensor,
                       y_true: torch.Tensor, noise: Noise | None = None, n_samples: int = 100,
                       generator: torch.Generator | None = None, *, event_dim: int = 1,
                       batched: bool = True, reduction: str = "mean",
                       sigma: float | None = None) -> torch.Tensor:
    r"""The perturbed Fenchel–Young loss, whose gradient in θ is y_σ(θ) − y_true.

    .. math:: L(\theta; y) \approx \frac{1}{M}\sum_{s=1}^M
              \langle y(\theta + \sigma Z_s) - y,\ \theta + \sigma Z_s\rangle \;\ge 0

    This estimates F_σ(θ) − ⟨θ, y⟩ − σ⟨y, E Z⟩ with F_σ(θ) = E[max_{y'} ⟨y', θ + σZ⟩]: the
    Fenchel–Young loss up to a term that does not depend on θ. It is convex in θ, zero when y
    is the argmax for every sample, and (Danskin) its gradient is (1/M) Σ_s y(θ + σZ_s) − y, an
    unbiased estimate of y_σ(θ) − y. No Jacobian is needed, so it is cheaper and less noisy than
    a loss on :func:`perturbed`'s output.

    Args:
        argmax_fn, theta, noise, n_samples, generator, event_dim, batched, sigma: as
            :func:`perturbed`; here the solver output must live in θ's space (``*out = *event``).
        y_true: target structures (vertices), broadcastable to ``theta``.
        reduction: ``"mean"`` (over the batch), ``"sum"`` or ``"none"`` (shape ``(*batch)``).

    Shape: ``theta``: ``(*batch, *event)``; ``y_true``: broadcastable to it; output scalar or
    ``(*batch)``.

    Example::

        >>> theta = model(x)                          # (batch, n_edges) scores  # doctest: +SKIP
        >>> loss = fenchel_young_loss(shortest_path, theta, y_true, Normal(scale=0.5),
        ...                           batched=False)                           # doctest: +SKIP
        >>> loss.backward()                           # ∇θ = y_σ(θ) − y_true     # doctest: +SKIP

    References:
        Berthet et al. 2020 (arXiv:2002.08676), Sec. 4; Blondel, Martins & Niculae,
        "Learning with Fenchel-Young Losses", JMLR 2020, arXiv:1901.02324.
    """
    noise, sigma = _noise_and_sigma("fenchel_young_loss", noise, sigma)
    return _fenchel_young_loss(argmax_fn, theta, y_true, noise, sigma, n_samples, generator,
                               event_dim, batched, reduction)


def _fenchel_young_loss(argmax_fn: ArgmaxFn | Structure, theta: torch.Tensor,
                        y_true: torch.Tensor, noise: Noise, sigma: float, n_samples: int,
                        generator: torch.Generator | None, event_dim: int, batched: bool,
                        reduction: str) -> torch.Tensor:
    check_choice(reduction, ("mean", "sum", "none"), "reduction")
    argmax_fn, event_dim = _solver(argmax_fn, event_dim)
    _, z, ys = _sample(argmax_fn, theta, sigma, noise, n_samples, generator, event_dim, batched)
    if ys.shape[1:] != theta.shape:
        raise ValueError(f"the Fenchel-Young loss needs argmax_fn outputs in theta's space: "
                         f"expected {tuple(theta.shape)} per sample, got {tuple(ys.shape[1:])}")
    if not isinstance(y_true, torch.Tensor):
        y_true = torch.as_tensor(np.asarray(y_true), dtype=theta.dtype, device=theta.device)
    if not broadcasts_to(y_true.shape, theta.shape):
        raise ValueError(f"y_true of shape {tuple(y_true.shape)} does not broadcast to theta's "
                         f"shape {tuple(theta.shape)}")
    if validation_enabled():
        check_finite(y_true.to(theta.dtype), "y_true")
    if reduction == "mean" and theta.numel() == 0:
        raise ValueError(f"reduction='mean' over an empty batch is undefined (theta has shape "
                         f"{tuple(theta.shape)}); use reduction='sum' or 'none'")
    u = theta + sigma * z  # (M, *batch, *event), differentiable in theta
    per = _sum_from((ys - y_true) * u, u.ndim - event_dim).mean(dim=0)
    if reduction == "none":
        return per
    return per.mean() if reduction == "mean" else per.sum()


class PerturbedOptimizer(torch.nn.Module):
    """A black-box argmax solver turned into a differentiable layer (Berthet et al. 2020).

    ``forward(theta)`` is :func:`perturbed` with the stored options; :meth:`fenchel_young_loss`
    is the matching loss; :meth:`argmax` runs the unperturbed solver. Use it as a decorator::

        @PerturbedOptimizer
        def shortest_path(u): ...                       # exact solver, batched

        @perturbed_optimizer(noise=Normal(0.5), n_samples=200, batched=False)
        def one_path(u): ...                            # one problem per call

    Args:
        argmax_fn: the exact solver (see :func:`perturbed`).
        noise, n_samples, event_dim, batched, baseline, sigma: as :func:`perturbed`.
        generator: the ``torch.Generator`` used for the noise (an attribute: set it to reseed).

    Shape: ``(*batch, *event)`` -> ``(*batch, *out)``.
    """

    def __init__(self, argmax_fn: ArgmaxFn | Structure, noise: Noise | None = None,
                 n_samples: int = 100, *, event_dim: int = 1, batched: bool = True,
                 baseline: bool = True, generator: torch.Generator | None = None,
                 sigma: float | None = None):
        super().__init__()
        argmax_fn, event_dim = _solver(argmax_fn, event_dim)
        noise, self._sigma = _noise_and_sigma("PerturbedOptimizer", noise, sigma)
        check_int(n_samples, "n_samples", low=1)
        self.argmax_fn = argmax_fn
        self.noise, self.n_samples = noise, n_samples
        self.event_dim, self.batched, self.baseline = event_dim, batched, baseline
        self.generator = generator

    def get_extra_state(self) -> dict[str, Any]:
        """The hyper-parameters as plain values, saved with the state_dict (the solver itself is
        code and is not): n_samples, event_dim, batched, baseline, the noise's kind and
        parameters."""
        params = getattr(self.noise, "_params", lambda: None)()
        return {"format": 1, "n_samples": self.n_samples, "event_dim": self.event_dim,
                "batched": self.batched, "baseline": self.baseline, "sigma": self._sigma,
                "noise": {"type": type(self.noise).__name__,
                          **({k: v for k, v in params.items()
                              if isinstance(v, (int, float, bool))} if params else {})}}

    def set_extra_state(self, state: Any) -> None:
        """Restore the hyper-parameters; the noise is rebuilt from its parameters when it is of
        the same kind as this module's (a user noise keeps its own)."""
        if not isinstance(state, dict) or state.get("format") != 1:
            raise ValueError(f"not a PerturbedOptimizer state: {state!r}")
        self.n_samples, self.event_dim = int(state["n_samples"]), int(state["event_dim"])
        self.batched, self.baseline = bool(state["batched"]), bool(state["baseline"])
        self._sigma = float(state["sigma"])
        noise = dict(state["noise"])
        if noise.pop("type") == type(self.noise).__name__ and noise:
            self.noise = type(self.noise)(**noise)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        # a state_dict from before the hyper-parameters were saved (it was empty)
        state_dict.setdefault(prefix + "_extra_state", self.get_extra_state())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        return _perturbed(self.argmax_fn, theta, self.noise, self._sigma, self.n_samples,
                          self.generator, self.event_dim, self.batched, self.baseline)

    def argmax(self, theta: torch.Tensor) -> torch.Tensor:
        """The unperturbed solution y(θ) (no gradient), leading dims kept."""
        check_scores(theta, "theta", min_ndim=self.event_dim)
        return _run_argmax(self.argmax_fn, theta.detach(), self.event_dim, self.batched)

    def fenchel_young_loss(self, theta: torch.Tensor, y_true: torch.Tensor,
                           reduction: str = "mean") -> torch.Tensor:
        """:func:`fenchel_young_loss` with the stored options."""
        return _fenchel_young_loss(self.argmax_fn, theta, y_true, self.noise, self._sigma,
                                   self.n_samples, self.generator, self.event_dim, self.batched,
                                   reduction)

    def extra_repr(self) -> str:
        name = getattr(self.argmax_fn, "__name__", type(self.argmax_fn).__name__)
        sigma = f", sigma={self._sigma}" if self._sigma != 1.0 else ""
        return (f"argmax_fn={name}, noise={self.noise!r}{sigma}, "
                f"n_samples={self.n_samples}, batched={self.batched}")


def perturbed_optimizer(argmax_fn: ArgmaxFn | None = None, **options: Any):
    """Decorator form of :class:`PerturbedOptimizer`, with or without options.

    Example::

        @perturbed_optimizer(noise=Normal(scale=0.5), n_samples=500)
        def ranking(u):
            return u.argsort(-1).argsort(-1).to(u.dtype)
    """
    if argmax_fn is None:
        return lambda fn: PerturbedOptimizer(fn, **options)
    return PerturbedOptimizer(argmax_fn, **options)
