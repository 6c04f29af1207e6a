r"""``torch.nn`` layers for stochastic softmaxes, and temperature schedules.

:class:`StochasticSoftmax` wraps :func:`perturb.relax` (perturb, then regularized argmax;
see that module for the math) as a Module: in training mode it samples
X_τ = argmax_{x ∈ conv Z} ⟨θ + ε, x⟩ − τ f(x); in evaluation mode it is deterministic: either the
regularized argmax of θ itself (``eval_mode="regularized"``) or the exact argmax of θ
(``eval_mode="argmax"``). :class:`GumbelSoftmax` and :class:`GaussianSoftmax` are the simplex
cases with a ``dim`` argument, like ``torch.nn.Softmax``.

Temperature schedules map a step count to τ. Attach one to a module (``schedule=``) and call
``module.step()`` once per optimisation step, or set ``module.tau`` yourself::

    layer = GumbelSoftmax(schedule=ExponentialSchedule(tau0=1.0, tau_min=0.5, rate=1e-4))
    for batch in data:
        loss = ...(layer(logits))
        ...
        layer.step()            # layer.tau = schedule(step)
"""
from __future__ import annotations

import math
from typing import Any

import torch

from perturb._deprecation import renamed
from perturb._validation import (
    _compiling,
    check_choice,
    check_dim,
    check_int,
    check_positive,
    check_tau,
)
from perturb.categorical import gaussian_softmax, gumbel_softmax
from perturb.noise import Gumbel, Noise, Normal
from perturb.noise._args import check_noise
from perturb.regularizers import Entropy, Regularizer
from perturb.core import argmax, regularized_argmax, relax
from perturb.structures import Simplex, Structure

__all__ = ["StochasticSoftmax", "GumbelSoftmax", "GaussianSoftmax", "TemperatureSchedule",
           "ConstantSchedule", "ExponentialSchedule", "LinearSchedule"]

EVAL_MODES = ("regularized", "argmax")


# --------------------------------------------------------------------------------------------
# schedules
# --------------------------------------------------------------------------------------------

class TemperatureSchedule:
    """Base class: ``schedule(step) -> tau`` (a float > 0) for integer steps >= 0."""

    def __call__(self, step: int) -> float:
        check_int(step, "step", low=0)
        return float(self._tau(step))

    def _tau(self, step: int) -> float:
        raise NotImplementedError


class ConstantSchedule(TemperatureSchedule):
    """τ(t) = τ₀ for every step."""

    def __init__(self, tau: float = 1.0):
        check_tau(tau)
        self.tau = float(tau)

    def _tau(self, step: int) -> float:
        return self.tau

    def __repr__(self) -> str:
        return f"ConstantSchedule(tau={self.tau})"


class ExponentialSchedule(TemperatureSchedule):
    """τ(t) = max(τ_min, τ₀ · exp(−r t)) (Jang et al. 2017 anneal with τ₀ = 1, τ_min = 0.5).

    Args:
        tau0: initial temperature τ₀ > 0.
        tau_min: floor τ_min, 0 < τ_min ≤ τ₀.
        rate: decay rate r ≥ 0 per step.
    """

    def __init__(self, tau0: float = 1.0, tau_min: float = 0.5, rate: float = 1e-4):
        check_tau(tau0, "tau0")
        check_tau(tau_min, "tau_min")
        if tau_min > tau0:
            raise ValueError(f"tau_min must be <= tau0, got tau_min={tau_min}, tau0={tau0}")
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate >= 0):
            raise ValueError(f"rate must be a finite number >= 0, got {rate!r}")
        self.tau0, self.tau_min, self.rate = float(tau0), float(tau_min), float(rate)

    def _tau(self, step: int) -> float:
        return max(self.tau_min, self.tau0 * math.exp(-self.rate * step))

    def __repr__(self) -> str:
        return f"ExponentialSchedule(tau0={self.tau0}, tau_min={self.tau_min}, rate={self.rate})"


class LinearSchedule(TemperatureSchedule):
    """τ(t) = τ₀ + (τ_min − τ₀) · min(t / n_steps, 1): linear from τ₀ to τ_min, then constant.

    Args:
        tau0: initial temperature τ₀ > 0.
        tau_min: final temperature, 0 < τ_min ≤ τ₀.
        n_steps: steps to reach τ_min (>= 1).
    """

    def __init__(self, tau0: float = 1.0, tau_min: float = 0.1, n_steps: int = 1000):
        check_tau(tau0, "tau0")
        check_tau(tau_min, "tau_min")
        if tau_min > tau0:
            raise ValueError(f"tau_min must be <= tau0, got tau_min={tau_min}, tau0={tau0}")
        self.tau0, self.tau_min = float(tau0), float(tau_min)
        self.n_steps = check_int(n_steps, "n_steps", low=1)

    def _tau(self, step: int) -> float:
        frac = min(step / self.n_steps, 1.0)
        return self.tau0 + (self.tau_min - self.tau0) * frac

    def __repr__(self) -> str:
        return (f"LinearSchedule(tau0={self.tau0}, tau_min={self.tau_min}, "
                f"n_steps={self.n_steps})")


# --------------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------------

class StochasticSoftmax(torch.nn.Module):
    r"""A stochastic softmax layer: ``relax(θ, structure, noise, regularizer, tau, hard)``.

    Training mode: a sample X_τ = argmax_{x ∈ conv Z} ⟨θ + ε, x⟩ − τ f(x) (with ``hard=True``
    the exact argmax of θ + ε forward and X_τ's gradient backward). Evaluation mode
    (``module.eval()``): deterministic, ``regularized_argmax(θ, ...)`` when
    ``eval_mode="regularized"`` or the exact ``argmax(θ)`` when ``eval_mode="argmax"``.

    Args:
        structure: Z (default :class:`~perturb.structures.Simplex`).
        noise: ε (default ``Gumbel()``).
        regularizer: f (default: the structure's).
        tau: temperature τ > 0: a float, or a tensor (a learnable ``nn.Parameter``, or one τ
            per problem broadcasting against the batch dims), used as given, gradients
            included; an attribute, set it directly or through ``schedule``.
        hard: straight-through in training mode.
        eval_mode: ``"regularized"`` or ``"argmax"``.
        backward: as :func:`perturb.regularized_argmax`.
        n_samples: if given, each call draws that many samples in a new leading dim.
        schedule: a :class:`TemperatureSchedule`; then τ = schedule(0) initially and
            :meth:`step` advances it.
        generator: a ``torch.Generator`` for reproducible samples (an attribute).

    Shape: ``(*batch, *event)`` -> the same (``(n_samples, *batch, *event)`` in training mode
    when ``n_samples`` is set).

    Example::

        >>> layer = StochasticSoftmax(tau=0.5, hard=True)
        >>> y = layer(torch.randn(8, 10, requires_grad=True))      # one-hot rows, soft gradient
    """

    def __init__(self, structure: Structure | None = None, noise: Noise | None = None,
                 regularizer: Regularizer | None = None, tau: float = 1.0, hard: bool = False,
                 eval_mode: str = "regularized", backward: str = "auto",
                 n_samples: int | None = None, schedule: TemperatureSchedule | None = None,
                 generator: torch.Generator | None = None):
        super().__init__()
        self.structure = Simplex() if structure is None else structure
        if not isinstance(self.structure, Structure):
            raise ValueError(f"structure must be a perturb Structure, got {self.structure!r}")
        self.noise = Gumbel() if noise is None else noise
        check_noise(self.noise)
        self.regularizer = regularizer
        if not isinstance(hard, bool):
            raise ValueError(f"hard must be a bool, got {hard!r}")
        check_choice(eval_mode, EVAL_MODES, "eval_mode")
        if n_samples is not None:
            check_int(n_samples, "n_samples", low=1)
        if schedule is not None and not isinstance(schedule, TemperatureSchedule):
            raise ValueError(f"schedule must be a TemperatureSchedule, got {schedule!r}")
        self.hard, self.eval_mode, self.backward, self.n_samples = hard, eval_mode, backward, \
            n_samples
        self.schedule = schedule
        self.generator = generator
        self.steps = 0
        # τ also lives in a 0-dim buffer, updated in place: a compiled forward reads the tensor,
        # so a temperature schedule does not recompile the graph at every step
        self._tau_tensor: torch.Tensor
        self.register_buffer("_tau_tensor", torch.ones((), dtype=torch.float64),
                             persistent=False)
        self.tau = schedule(0) if schedule is not None else tau

    @property
    def tau(self) -> float | torch.Tensor:
        """τ: a float, or the tensor it was set to (e.g. a learnable ``nn.Parameter``, which
        then gets gradients in training and evaluation mode)."""
        given = self._tau_given()
        return self._tau if given is None else given

    @tau.setter
    def tau(self, value: float | torch.Tensor) -> None:
        check_tau(value)
        # a tensor that requires grad or holds one τ per problem is kept as given (float()
        # would cut a learnable τ from the graph: a silent zero gradient); an nn.Parameter is
        # registered as the parameter ``tau_param`` (in parameters() and the state_dict)
        self.__dict__.pop("tau_param", None)
        self._parameters.pop("tau_param", None)
        if isinstance(value, torch.Tensor) and (value.requires_grad or value.ndim):
            if isinstance(value, torch.nn.Parameter):
                self.register_parameter("tau_param", value)
            else:
                self.__dict__["tau_param"] = value
            self._tau = float(value.detach().reshape(-1)[0])
            return
        self._tau = float(value)
        with torch.no_grad():
            self._tau_tensor.fill_(self._tau)

    def _tau_given(self) -> torch.Tensor | None:
        return self._parameters.get("tau_param", self.__dict__.get("tau_param"))

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "tau":   # through the property, also for an nn.Parameter
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def _tau_arg(self) -> float | torch.Tensor:
        """τ as the solvers get it: a tensor τ as given; else the float in eager mode (no value
        check of a tensor), the buffer under ``torch.compile`` (no recompilation when τ
        changes)."""
        given = self._tau_given()
        if given is not None:
            return given
        return self._tau_tensor if _compiling() else self._tau

    def step(self) -> float:
        """Advance the schedule by one step and set τ = schedule(steps); returns the new τ."""
        if self.schedule is None:
            raise ValueError("step() needs a schedule; pass schedule=... or set .tau directly")
        self.steps += 1
        self.tau = self.schedule(self.steps)
        return self.tau

    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        if self.training:
            return relax(theta, self.structure, self.noise, self.regularizer, self._tau_arg(),
                         hard=self.hard, n_samples=self.n_samples, generator=self.generator,
                         backward=self.backward)
        if self.eval_mode == "argmax":
            return argmax(theta, self.structure)
        return regularized_argmax(theta, self.structure, self.regularizer, self._tau_arg(),
                                  self.backward)

    def extra_repr(self) -> str:
        return (f"structure={self.structure!r}, noise={self.noise!r}, "
                f"regularizer={self.regularizer!r}, tau={self.tau}, hard={self.hard}, "
                f"eval_mode={self.eval_mode!r}")


class GumbelSoftmax(StochasticSoftmax):
    """:func:`perturb.gumbel_softmax` as a layer, along ``dim``; see :class:`StochasticSoftmax`.

    Evaluation mode gives softmax(θ/τ) (``eval_mode="regularized"``) or the one-hot argmax.

    Args:
        tau, hard, eval_mode, schedule, generator: as :class:`StochasticSoftmax`.
        dim: the dim holding the categories.

    Shape: any, categories along ``dim``; output the same.
    """

    def __init__(self, tau: float = 1.0, hard: bool = False, dim: int = -1,
                 eval_mode: str = "regularized", schedule: TemperatureSchedule | None = None,
                 generator: torch.Generator | None = None):
        super().__init__(Simplex(), Gumbel(), Entropy(), tau, hard, eval_mode,
                         schedule=schedule, generator=generator)
        self.dim = dim

    def _sample(self, theta: torch.Tensor) -> torch.Tensor:
        return gumbel_softmax(theta, self._tau_arg(), self.hard, self.dim, self.generator)

    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self._sample(theta)
        d = check_dim(theta, self.dim, "dim")
        x = theta.movedim(d, -1)
        return super().forward(x).movedim(-1, d)

    def extra_repr(self) -> str:
        return (f"tau={self.tau}, hard={self.hard}, dim={self.dim}, "
                f"eval_mode={self.eval_mode!r}")


class GaussianSoftmax(GumbelSoftmax):
    """:func:`perturb.gaussian_softmax` as a layer: softmax((θ + σZ)/τ), Z ~ N(0, I).

    Args:
        tau, hard, dim, eval_mode, schedule, generator: as :class:`GumbelSoftmax`.
        scale: noise scale σ > 0 (the ``scale`` of :class:`~perturb.noise.Normal`).
        sigma: deprecated name of ``scale`` (``FutureWarning``; removed in 0.3).

    Shape: any, categories along ``dim``; output the same.
    """

    def __init__(self, tau: float = 1.0, scale: float = 1.0, hard: bool = False, dim: int = -1,
                 eval_mode: str = "regularized", schedule: TemperatureSchedule | None = None,
                 generator: torch.Generator | None = None, *, sigma: float | None = None):
        scale = renamed("GaussianSoftmax", "sigma", sigma, "scale", scale, 1.0,
                        check_positive)
        check_positive(scale, "scale")
        super().__init__(tau, hard, dim, eval_mode, schedule, generator)
        self.scale = float(scale)
        self.noise = Normal(self.scale)

    @property
    def sigma(self) -> float:
        """Deprecated name of :attr:`scale`."""
        return self.scale

    def _sample(self, theta: torch.Tensor) -> torch.Tensor:
        return gaussian_softmax(theta, self._tau_arg(), self.scale, self.hard, self.dim,
                                self.generator)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, " + super().extra_repr()
