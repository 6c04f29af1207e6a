"""The engine of the one abstraction (private module of the core): the functions behind
:func:`perturb.perturb`, :func:`perturb.regularized_argmax` and :func:`perturb.relax` for
callers that checked their arguments, the solver dispatch, and the fused-relax registry.

Its names without an underscore are the core's internal API (ARCHITECTURE.md, rule 2):
:mod:`perturb.core` calls them after validating once at the public boundary, and the
simplex solvers (:mod:`perturb.categorical`) and the distributions
(:mod:`perturb.distributions.perturbed`) call them with arguments they checked themselves.
A solver may come with a fused implementation of the whole ``relax`` call
(:func:`register_fused_relax`; the simplex softmax has a compiled one for CUDA,
:mod:`perturb._fused`).
"""
from __future__ import annotations

from typing import Callable

import torch

from perturb._precision import full_precision
from perturb._validation import check_choice, check_generator, check_int, check_tau
from perturb.backward import BACKWARD_MODES, resolve_backward, solve_with_backward, straight_through
from perturb.noise import Discrete, Gumbel, Logistic, Noise, Normal, Uniform
from perturb.noise._args import draw
from perturb.regularizers import Regularizer
from perturb.structures import Simplex, SolverEntry, Structure, get_solver

__all__ = ["FINITE_NOISES", "register_fused_relax", "check_structure", "perturb_checked",
           "resolve", "solve", "regularized_argmax_checked", "relax_checked"]

# built-in noises whose samples are finite by construction: θ + ε needs no second value check
FINITE_NOISES = (Gumbel, Normal, Logistic, Uniform, Discrete)

# solver -> fused relax(theta, noise, tau, hard, generator), returning None where it does not apply
FUSED_RELAX: dict[Callable, Callable] = {}


def register_fused_relax(solver: Callable, fused: Callable) -> None:
    """Let ``relax`` call ``fused(theta, noise, tau, hard, generator)`` for ``solver``'s pairs.

    ``fused`` returns the sample, or None when it does not apply (then the composition runs).
    It must draw the noise as ``noise.sample`` does, so that the generator advances alike.
    Registering another solver for a pair drops the fused path with the old solver.
    """
    FUSED_RELAX[solver] = fused


def check_structure(structure: Structure) -> None:
    """ValueError unless ``structure`` is a :class:`~perturb.Structure`."""
    if not isinstance(structure, Structure):
        raise ValueError(f"structure must be a perturb Structure (e.g. Simplex()), "
                         f"got {structure!r}")


def perturb_checked(theta: torch.Tensor, noise: Noise | None, n_samples: int | None,
                    generator: torch.Generator | None) -> torch.Tensor:
    """:func:`perturb.perturb` without the pass over ``theta`` (for callers that validated it)."""
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


def resolve(structure: Structure, regularizer: Regularizer | None,
            backward: str) -> tuple[Regularizer, SolverEntry, str]:
    """The regularizer (default filled in), the registered solver and the backward mode to run.

    The mode is the solver's native one for ``"auto"``; ``"finite_difference"`` stays as asked
    when the solver has no native finite differences (:func:`solve` wraps it).
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
def solve(entry: SolverEntry, mode: str, w: torch.Tensor, structure: Structure,
          regularizer: Regularizer, tau: float | torch.Tensor) -> torch.Tensor:
    """Run a resolved solver on checked arguments: float16 / bfloat16 scores (and autocast
    regions) in float32, the result in the scores' dtype (:mod:`perturb._precision`)."""
    solver = entry.solver
    assert solver is not None  # resolve raised for the pairs registered as impossible
    return solve_with_backward(lambda v, m: solver(v, structure, regularizer, tau, m), w,
                               mode, entry.backward, structure.event_dim, {"tau": tau})


def regularized_argmax_checked(w: torch.Tensor, structure: Structure,
                               regularizer: Regularizer | None, tau: float | torch.Tensor,
                               backward: str) -> torch.Tensor:
    """:func:`perturb.regularized_argmax` for callers that validated ``w`` and ``structure`` under
    their own argument names (τ, the regularizer and the mode are checked here)."""
    check_tau(tau)
    regularizer, entry, mode = resolve(structure, regularizer, backward)
    return solve(entry, mode, w, structure, regularizer, tau)


def relax_checked(theta: torch.Tensor, structure: Structure, noise: Noise | None,
                  regularizer: Regularizer | None, tau: float | torch.Tensor, hard: bool,
                  n_samples: int | None, generator: torch.Generator | None,
                  backward: str) -> torch.Tensor:
    """:func:`perturb.relax` after the checks of ``theta``, ``tau`` and ``hard``."""
    noise = Gumbel() if noise is None else noise
    regularizer, entry, mode = resolve(structure, regularizer, backward)
    if n_samples is None and mode == entry.backward[0]:
        fused = FUSED_RELAX.get(entry.solver) if entry.solver is not None else None
        if fused is not None:
            y = fused(theta, noise, tau, hard, generator)
            if y is not None:
                return y
    u = perturb_checked(theta, noise, n_samples, generator)
    if type(noise) not in FINITE_NOISES:
        structure.validate(u, "theta + noise")
    soft = solve(entry, mode, u, structure, regularizer, tau)
    if not hard:
        return soft
    with torch.no_grad():
        # Simplex.argmax is plain torch: no detach needed under no_grad (other structures may
        # hand w to numpy, which refuses tensors that require grad)
        exact = structure.argmax(u if type(structure) is Simplex else u.detach())
    return straight_through(exact, soft)
