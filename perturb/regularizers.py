"""Strongly convex regularizers f: what "soft" means in ``argmax_{x ∈ conv Z} ⟨w, x⟩ − τ f(x)``.

Each regularizer is a small value object; solvers are looked up by the pair
(structure type, regularizer type) in :mod:`perturb.structures`. ``value(x)`` evaluates f where a
closed form exists (tests use it to check optimality).

=====================  =========================================  ==============================
regularizer            f(x)                                       on the simplex gives
=====================  =========================================  ==============================
``Entropy()``          Σ x log x  (negative Shannon entropy)       softmax
``SquaredNorm()``      ½ ‖x‖²                                     sparsemax (Euclidean projection)
``BinaryEntropy()``    Σ x log x + (1 − x) log(1 − x)             (k-subsets: shifted sigmoid)
``ExpFamilyEntropy()`` A*(x), conjugate of A(w)=log Σ_z e^{⟨w,z⟩}  ∇A(w) = E_{q(z|w)}[z]
=====================  =========================================  ==============================
"""
from __future__ import annotations

import torch

__all__ = ["Regularizer", "Entropy", "SquaredNorm", "BinaryEntropy", "ExpFamilyEntropy"]


class Regularizer:
    """Base class of the strongly convex regularizers f."""

    def value(self, x: torch.Tensor, event_dim: int = 1) -> torch.Tensor:
        """f(x) summed over the last ``event_dim`` dims. Shape: ``(*batch, *event) -> (*batch)``."""
        raise NotImplementedError(f"{self!r} has no closed-form value")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))


def _sum_event(v: torch.Tensor, event_dim: int) -> torch.Tensor:
    return v.sum(dim=tuple(range(-event_dim, 0))) if event_dim else v


class Entropy(Regularizer):
    """Negative Shannon entropy f(x) = Σ_i x_i log x_i (with 0 log 0 = 0)."""

    def value(self, x: torch.Tensor, event_dim: int = 1) -> torch.Tensor:
        return _sum_event(torch.special.xlogy(x, x), event_dim)


class SquaredNorm(Regularizer):
    """f(x) = ½ ‖x‖²: the regularized argmax is a Euclidean projection onto conv Z."""

    def value(self, x: torch.Tensor, event_dim: int = 1) -> torch.Tensor:
        return _sum_event(0.5 * x * x, event_dim)


class BinaryEntropy(Regularizer):
    """f(x) = Σ_i x_i log x_i + (1 − x_i) log(1 − x_i), for structures inside [0, 1]^n."""

    def value(self, x: torch.Tensor, event_dim: int = 1) -> torch.Tensor:
        return _sum_event(torch.special.xlogy(x, x) + torch.special.xlogy(1 - x, 1 - x), event_dim)


class ExpFamilyEntropy(Regularizer):
    """f = A*, the convex conjugate of the log-partition A(w) = log Σ_{z∈Z} exp⟨w, z⟩.

    Then argmax_x ⟨w, x⟩ − A*(x) = ∇A(w) = E_{q(z|w)}[z]: the marginals of the Gibbs
    distribution over the structures. With temperature τ the solution is ∇A(w/τ).
    """
