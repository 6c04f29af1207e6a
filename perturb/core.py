r"""The one abstraction: perturb, then take a (regularized) argmax.

.. math::

    U   &= \theta + \varepsilon                                  &&\text{(perturb: } \varepsilon \sim \text{noise)} \\
    X   &= \arg\max_{x \in Z} \langle U, x\rangle                &&\text{(stochastic argmax: exact, discrete)} \\
    X_\tau &= \arg\max_{x \in \mathrm{conv} Z} \langle U, x\rangle - \tau f(x)
                                                                  &&\text{(stochastic softmax: relaxed)}

Z is a finite set of structures (one-hots, k-subsets, permutation matrices, trees), f a strongly
convex regularizer and τ > 0 a temperature; X_τ → X as τ → 0 (Paulus et al. 2020, Prop. 1).
Gumbel-softmax is Z = one-hots, f = negative entropy, ε ~ Gumbel.

Two identities give the gradients used across the library:

- straight-through: ``hard=True`` returns X in the forward pass and ∂X_τ/∂θ in the backward pass
  (:func:`perturb.backward.straight_through`);
- perturbed optimizers (Berthet et al. 2020): ∇_θ E[argmax(θ + σZ)] = E[argmax(θ + σZ) ∇ν(Z)ᵀ]/σ
  with ν = −log density (:mod:`perturb.perturbed_optimizers`).

Functions here validate their arguments once at the boundary and dispatch the regularized
argmax to the solver registered for (structure, regularizer) (:mod:`perturb.structures`).
``relax(θ, ...)`` is exactly ``regularized_argmax(perturb(θ, ...), ...)``: the same generator
state gives the same noise in all of them.

The checked arguments go to the engine (:mod:`perturb._engine`). A solver may come with a fused
implementation of the whole ``relax`` call (:func:`perturb._engine.register_fused_relax`; the
simplex softmax has a compiled one for CUDA, :mod:`perturb._fused`). It draws the same noise
from the generator and is used only where it applies; it then agrees with the composition up
to float rounding instead of bitwise.
"""
from __future__ import annotations

import torch

from perturb._engine import (check_structure, perturb_checked, regularized_argmax_checked,
                             relax_checked)
from perturb._validation import check_scores, check_tau
from perturb.noise import Noise
from perturb.regularizers import Regularizer
from perturb.structures import Simplex, Structure

__all__ = ["perturb", "argmax", "regularized_argmax", "relax"]


def perturb(theta: torch.Tensor, noise: Noise | None = None, n_samples: int | None = None,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """Perturbed scores U = θ + ε with ε drawn i.i.d. from ``noise`` (default ``Gumbel()``).

    Args:
        theta: scores, any shape, floating dtype.
        noise: a :class:`perturb.noise.Noise` (anything with ``sample(shape, generator=,
            device=, dtype=)``).
        n_samples: if given, a leading dim of that size holds independent samples.
        generator: a ``torch.Generator`` for reproducible noise.

    Shape: ``theta``: ``(*batch, *event)``; output ``(*batch, *event)`` or
    ``(n_samples, *batch, *event)``. dtype and device follow ``theta``.
    """
    check_scores(theta, "theta", min_ndim=0, allow_neg_inf=True)
    return perturb_checked(theta, noise, n_samples, generator)


def argmax(w: torch.Tensor, structure: Structure | None = None) -> torch.Tensor:
    """The exact vertex argmax_{z ∈ Z} ⟨w, z⟩ (no gradient: it is piecewise constant).

    Shape: ``(*batch, *event)`` -> same; dtype and device follow ``w``.
    """
    structure = Simplex() if structure is None else structure
    check_structure(structure)
    structure.validate(w)
    with torch.no_grad():
        return structure.argmax(w.detach())


def regularized_argmax(w: torch.Tensor, structure: Structure | None = None,
                       regularizer: Regularizer | None = None, tau: float | torch.Tensor = 1.0,
                       backward: str = "auto") -> torch.Tensor:
    """argmax_{x ∈ conv Z} ⟨w, x⟩ − τ f(x), by the solver registered for (structure, f).

    Args:
        w: scores.
        structure: Z (default :class:`Simplex`).
        regularizer: f (default: ``structure.default_regularizer()``).
        tau: temperature τ > 0 (a float or a tensor broadcastable to the batch).
        backward: ``"auto"`` (the solver's preferred mode) or one of the modes the pair supports
            (see :func:`perturb.registered_pairs`); ``"finite_difference"`` works for every pair.

    Shape: ``(*batch, *event)`` -> same.

    Raises:
        ValueError: bad shapes, τ ≤ 0, NaN scores, an unsupported ``backward``.
        NotImplementedError: the (structure, regularizer) pair has no solver or is intractable.
    """
    structure = Simplex() if structure is None else structure
    check_structure(structure)
    if regularizer is not None and not isinstance(regularizer, Regularizer):
        raise ValueError(f"regularizer must be a perturb Regularizer, got {regularizer!r}")
    structure.validate(w)
    return regularized_argmax_checked(w, structure, regularizer, tau, backward)


def relax(theta: torch.Tensor, structure: Structure | None = None, noise: Noise | None = None,
          regularizer: Regularizer | None = None, tau: float | torch.Tensor = 1.0,
          hard: bool = False, n_samples: int | None = None,
          generator: torch.Generator | None = None, backward: str = "auto") -> torch.Tensor:
    """A stochastic softmax: ``regularized_argmax(perturb(θ, noise, n_samples, generator), ...)``.

    With ``hard=True`` the forward value is the exact ``argmax`` of the same perturbed scores and
    the gradient is the relaxed one's (straight-through).

    θ is validated once; the perturbed scores are checked again only for a user-defined noise
    (the built-in ones are finite). On CUDA the value checks do not synchronise
    (:mod:`perturb._validation`), and on the simplex with Gumbel or Gaussian noise and a float
    τ a compiled fused kernel may run instead of the composition (:mod:`perturb._fused`: the
    same noise, results equal up to float rounding).

    Args:
        theta: scores θ.
        structure, regularizer, tau, backward: as :func:`regularized_argmax`.
        noise: perturbation (default ``Gumbel()``).
        hard: straight-through estimator.
        n_samples: independent samples in a new leading dim.
        generator: for reproducible noise.

    Shape: ``(*batch, *event)`` -> same, or ``(n_samples, *batch, *event)``.

    Example::

        >>> from perturb.noise import Normal
        >>> theta = torch.randn(4, 10, requires_grad=True)
        >>> x = relax(theta, tau=0.5)                      # Gumbel-softmax
        >>> y = relax(theta, noise=Normal(), hard=True)    # straight-through Gaussian-argmax
    """
    structure = Simplex() if structure is None else structure
    check_structure(structure)
    if not isinstance(hard, bool):
        raise ValueError(f"hard must be a bool, got {hard!r}")
    structure.validate(theta, "theta")
    check_tau(tau)
    return relax_checked(theta, structure, noise, regularizer, tau, hard, n_samples, generator, backward)


