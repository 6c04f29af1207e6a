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

A solver may come with a fused implementation of the whole ``relax`` call (registered with
:func:`_register_fused_relax`; the simplex softmax has a compiled one for CUDA,
:mod:`perturb._fused`). It draws the same noise from the generator and is used only where it
applies; it then agrees with the composition up to float rounding instead of bitwise.
"""
from __future__ import annotations

from typing import Callable

import torch

from perturb._precision import full_precision
from perturb._validation import check_choice, check_generator, check_int, check_scores, check_tau
from perturb.backward import BACKWARD_MODES, resolve_backward, solve_with_backward, straight_through
from perturb.noise import Discrete, Gumbel, Logistic, Noise, Normal, Uniform
from perturb.noise._args import draw
from perturb.regularizers import Regularizer
from perturb.structures import Simplex, SolverEntry, Structure, get_solver

__all__ = ["perturb", "argmax", "regularized_argmax", "relax"]

# built-in noises whose samples are finite by construction: θ + ε needs no second value check
_FINITE_NOISES = (Gumbel, Normal, Logistic, Uniform, Discrete)

# solver -> fused relax(theta, noise, tau, hard, generator), returning None where it does not apply
_FUSED_RELAX: dict[Callable, Callable] = {}


def _register_fused_relax(solver: Callable, fused: Callable) -> None:
    """Let ``relax`` call ``fused(theta, noise, tau, hard, generator)`` for ``solver``'s pairs.

    ``fused`` returns the sample, or None when it does not apply (then the composition runs).
    It must draw the noise as ``noise.sample`` does, so that the generator advances alike.
    Registering another solver for a pair drops the fused path with the old solver.
    """
    _FUSED_RELAX[solver] = fused


def _check_structure(structure: Structure) -> None:
    if not isinstance(structure, Structure):
        raise ValueError(f"structure must be a perturb Structure (e.g. Simplex()), "
                         f"got {structure!r}")


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
    return _perturb(theta, noise, n_samples, generator)


def _perturb(theta: torch.Tensor, noise: Noise | None, n_samples: int | None,
             generator: torch.Generator | None) -> torch.Tensor:
    """:func:`perturb` without the pass over ``theta`` (for callers that validated it)."""
    noise = Gumbel() if noise is None else noise
    shape = theta.shape
    if n_samples is not None:
        check_int(n_samples, "n_samples", low=1)
        shape = torch.Size((n_samples, *shape))
    if type(noise) is Gumbel:
        # θ − β·log E is bitwise θ + Gumbel.sample(...) (same draws), without the negation pass
        check_generator(generator)
        return theta - noise._log_exponential(shape, generator, theta.device, theta.dtype)
    return theta + draw(noise, shape, generator, theta.device, theta.dtype)


def argmax(w: torch.Tensor, structure: Structure | None = None) -> torch.Tensor:
    """The exact vertex argmax_{z ∈ Z} ⟨w, z⟩ (no gradient: it is piecewise constant).

    Shape: ``(*batch, *event)`` -> same; dtype and device follow ``w``.
    """
    structure = Simplex() if structure is None else structure
    _check_structure(structure)
    structure.validate(w)
    with torch.no_grad():
        return structure.argmax(w.detach())


def _resolve(structure: Structure, regularizer: Regularizer | None,
             backward: str) -> tuple[Regularizer, SolverEntry, str]:
    """The regularizer (default filled in), the registered solver and the backward mode to run.

    The mode is the solver's native one for ``"auto"``; ``"finite_difference"`` stays as asked
    when the solver has no native finite differences (:func:`_solve` wraps it).
    """
    regularizer = structure.default_regularizer() if regularizer is None else regularizer
    if not isinstance(regularizer, Regularizer):
        raise ValueError(f"regularizer must be a perturb Regularizer, got {regularizer!r}")
    if backward != "auto":
        check_choice(backward, BACKWARD_MODES, "backward")   # before looking the pair up
    entry = get_solver(structure, regularizer)
    mode = resolve_backward(backward, entry.backward, f"({structure!r}, {regularizer!r})")
    return regularizer, entry, mode


@full_precision
def _solve(entry: SolverEntry, mode: str, w: torch.Tensor, structure: Structure,
           regularizer: Regularizer, tau: float | torch.Tensor) -> torch.Tensor:
    """Run a resolved solver on checked arguments: float16 / bfloat16 scores (and autocast
    regions) in float32, the result in the scores' dtype (:mod:`perturb._precision`)."""
    solver = entry.solver
    assert solver is not None  # _resolve raised for the pairs registered as impossible
    return solve_with_backward(lambda v, m: solver(v, structure, regularizer, tau, m), w,
                               mode, entry.backward, structure.event_dim, {"tau": tau})


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
    _check_structure(structure)
    if regularizer is not None and not isinstance(regularizer, Regularizer):
        raise ValueError(f"regularizer must be a perturb Regularizer, got {regularizer!r}")
    structure.validate(w)
    return _regularized_argmax(w, structure, regularizer, tau, backward)


def _regularized_argmax(w: torch.Tensor, structure: Structure,
                        regularizer: Regularizer | None, tau: float | torch.Tensor,
                        backward: str) -> torch.Tensor:
    """:func:`regularized_argmax` for callers that validated ``w`` and ``structure`` under
    their own argument names (τ, the regularizer and the mode are checked here)."""
    check_tau(tau)
    regularizer, entry, mode = _resolve(structure, regularizer, backward)
    return _solve(entry, mode, w, structure, regularizer, tau)


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

        >>> theta = torch.randn(4, 10, requires_grad=True)
        >>> x = relax(theta, tau=0.5)                      # Gumbel-softmax
        >>> y = relax(theta, noise=Normal(), hard=True)    # straight-through Gaussian-argmax
    """
    structure = Simplex() if structure is None else structure
    _check_structure(structure)
    if not isinstance(hard, bool):
        raise ValueError(f"hard must be a bool, got {hard!r}")
    structure.validate(theta, "theta")
    check_tau(tau)
    return _relax(theta, structure, noise, regularizer, tau, hard, n_samples, generator, backward)


def _relax(theta: torch.Tensor, structure: Structure, noise: Noise | None,
           regularizer: Regularizer | None, tau: float | torch.Tensor, hard: bool,
           n_samples: int | None, generator: torch.Generator | None,
           backward: str) -> torch.Tensor:
    """:func:`relax` after the checks of ``theta``, ``tau`` and ``hard``."""
    noise = Gumbel() if noise is None else noise
    regularizer, entry, mode = _resolve(structure, regularizer, backward)
    if n_samples is None and mode == entry.backward[0]:
        fused = _FUSED_RELAX.get(entry.solver) if entry.solver is not None else None
        if fused is not None:
            y = fused(theta, noise, tau, hard, generator)
            if y is not None:
                return y
    u = _perturb(theta, noise, n_samples, generator)
    if type(noise) not in _FINITE_NOISES:
        structure.validate(u, "theta + noise")
    soft = _solve(entry, mode, u, structure, regularizer, tau)
    if not hard:
        return soft
    with torch.no_grad():
        # Simplex.argmax is plain torch: no detach needed under no_grad (other structures may
        # hand w to numpy, which refuses tensors that require grad)
        exact = structure.argmax(u if type(structure) is Simplex else u.detach())
    return straight_through(exact, soft)
