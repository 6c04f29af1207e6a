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
    compiling_now,
    check_choice,
    check_dim,
    check_int,
    check_positive,
    check_tau,
)
from perturb.categorical import gaussian_softmax, gumbel_softmax, sparsemax, sparsemax_loss
from perturb.noise import Gumbel, Noise, Normal
from perturb.noise._args import check_noise
from perturb.regularizers import Entropy, Regularizer
from perturb.core import argmax, regularized_argmax, relax
from perturb.structures import Simplex, Structure

__all__ = ["StochasticSoftmax", "GumbelSoftmax", "GaussianSoftmax", "Sparsemax", "SparsemaxLoss",
           "TemperatureSchedule", "ConstantSchedule", "ExponentialSchedule", "LinearSchedule"]

EVAL_MODES = ("regularized", "argmax")

#: Version of the extra state the layers write into their state_dict.
_STATE_FORMAT = 1


# --------------------------------------------------------------------------------------------
# schedules
# --------------------------------------------------------------------------------------------

class TemperatureSchedule:
    """Base class: ``schedule(step) -> tau`` (a float > 0) for integer steps >= 0.

    A schedule is a pure function of the step: a layer's position in it is the layer's
    ``steps``, saved with the layer (``state_dict``), as are the schedule's parameters
    (:meth:`state`).
    """

    def __call__(self, step: int) -> float:
        check_int(step, "step", low=0)
        return float(self._tau(step))

    def state(self) -> dict[str, Any]:
        """The schedule's class name and parameters (plain values)."""
        return {"type": type(self).__name__, **vars(self)}

    def load_state(self, state: dict[str, Any]) -> None:
        """Adopt the parameters of :meth:`state` (ValueError for another kind of schedule)."""
        if state.get("type") != type(self).__name__:
            raise ValueError(f"a saved {state.get('type')} cannot be loaded into a "
                             f"{type(self).__name__}")
        vars(self).update({k: v for k, v in state.items() if k != "type"})

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
        """The temperature τ, a float or the tensor it was set to (e.g. a learnable ``nn.Parameter``, which
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
        return self._tau_tensor if compiling_now() else self._tau

    def step(self) -> float:
        """Advance the schedule by one step and set τ = schedule(steps); returns the new τ."""
        if self.schedule is None:
            raise ValueError("step() needs a schedule; pass schedule=... or set .tau directly")
        self.steps += 1
        self.tau = self.schedule(self.steps)
        return self.tau

    # -- checkpoints: every hyper-parameter and the schedule's position in the state_dict -----

    def _hyper(self) -> dict[str, Any]:
        """The layer's plain hyper-parameters (subclasses add theirs)."""
        return {"hard": self.hard, "eval_mode": self.eval_mode}

    def get_extra_state(self) -> dict[str, Any]:
        """What the state_dict records besides tensors: τ, the step count (the position in the
        schedule), the schedule's parameters and the other hyper-parameters, as plain values
        (``torch.load(weights_only=True)`` reads them)."""
        return {"format": _STATE_FORMAT, "tau": self._tau, "steps": self.steps,
                "schedule": None if self.schedule is None else self.schedule.state(),
                **self._hyper()}

    def set_extra_state(self, state: Any) -> None:
        """Restore τ, the step count, the schedule's parameters and the hyper-parameters: a
        layer loaded mid-schedule continues where it stopped."""
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise ValueError(f"not a {type(self).__name__} state (format {_STATE_FORMAT}): "
                             f"{state!r}")
        if state["schedule"] is not None and self.schedule is not None:
            self.schedule.load_state(state["schedule"])
        self.steps = int(state["steps"])
        for key, value in state.items():
            if key not in ("format", "tau", "steps", "schedule"):
                setattr(self, key, value)
        if self._tau_given() is None:        # a Parameter τ is loaded as a parameter
            self.tau = state["tau"]

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        # a state_dict saved before τ was recorded (it was empty): keep the current values
        state_dict.setdefault(prefix + "_extra_state", self.get_extra_state())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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

    def _hyper(self) -> dict[str, Any]:
        return {**super()._hyper(), "dim": self.dim}

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
        """Deprecated name of ``scale``."""
        return self.scale

    def _hyper(self) -> dict[str, Any]:
        return {**super()._hyper(), "scale": self.scale}

    def set_extra_state(self, state: Any) -> None:
        super().set_extra_state(state)
        self.noise = Normal(self.scale)

    def _sample(self, theta: torch.Tensor) -> torch.Tensor:
        return gaussian_softmax(theta, self._tau_arg(), self.scale, self.hard, self.dim,
                                self.generator)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, " + super().extra_repr()


class Sparsemax(torch.nn.Module):
    """:func:`perturb.sparsemax` as a deterministic layer along ``dim``, like ``torch.nn.Softmax``
    (entmax's ``Sparsemax``): the Euclidean projection of x/τ onto the simplex, with exact zeros.

    Args:
        dim: the dim holding the categories.
        tau: temperature τ > 0 (saved in the state_dict with ``dim``).

    Shape: any, categories along ``dim``; output the same.

    Example::

        >>> Sparsemax(dim=-1)(torch.tensor([1.0, 0.8, -1.0]))
        tensor([0.6000, 0.4000, 0.0000])
    """

    def __init__(self, dim: int = -1, tau: float = 1.0):
        super().__init__()
        check_int(dim, "dim")
        check_tau(tau)
        self.dim, self.tau = dim, float(tau)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sparsemax(x, self.dim, self.tau)

    def get_extra_state(self) -> dict[str, Any]:
        return {"format": _STATE_FORMAT, "dim": self.dim, "tau": self.tau}

    def set_extra_state(self, state: Any) -> None:
        self.dim, self.tau = int(state["dim"]), float(state["tau"])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, tau={self.tau}"


class SparsemaxLoss(torch.nn.Module):
    """:func:`perturb.sparsemax_loss` as a loss module, like ``torch.nn.CrossEntropyLoss``
    (entmax's ``SparsemaxLoss``): ``loss(x, target)`` with class indices or distributions.

    Args:
        reduction: ``"mean"`` (over the non-ignored rows), ``"sum"`` or ``"none"``.
        ignore_index: class index whose rows contribute nothing.
        dim: the dim holding the categories.

    Shape: ``x``: ``(*batch, n)``; ``target``: ``(*batch)`` indices or ``(*batch, n)``.
    """

    def __init__(self, reduction: str = "mean", ignore_index: int = -100, dim: int = -1):
        super().__init__()
        check_choice(reduction, ("mean", "sum", "none"), "reduction")
        check_int(ignore_index, "ignore_index")
        check_int(dim, "dim")
        self.reduction, self.ignore_index, self.dim = reduction, ignore_index, dim

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return sparsemax_loss(x, target, self.dim, self.reduction, self.ignore_index)

    def get_extra_state(self) -> dict[str, Any]:
        return {"format": _STATE_FORMAT, "reduction": self.reduction,
                "ignore_index": self.ignore_index, "dim": self.dim}

    def set_extra_state(self, state: Any) -> None:
        self.reduction, self.ignore_index = state["reduction"], int(state["ignore_index"])
        self.dim = int(state["dim"])

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, ignore_index={self.ignore_index}"
