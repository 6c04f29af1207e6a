"""A structured latent variable: a k-subset of input features chosen by a stochastic top-k.

An amortised selector scores the n features of an input, draws a k-subset through
``relax(scores, KSubset(k), noise, tau, hard=True)`` (the forward value is an exact k-hot mask,
the gradient the relaxed one's) and a predictor sees only the selected features (L2X-style,
Chen et al. 2018). At evaluation time the mask is the exact top-k of the unperturbed scores.
"""
from __future__ import annotations

import torch
from torch import nn

from perturb._validation import check_int
from perturb.noise import Gumbel, Noise
from perturb.regularizers import Regularizer
from perturb.core import argmax, relax
from perturb.structured.subsets import KSubset

__all__ = ["SubsetSelector"]


class SubsetSelector(nn.Module):
    """Select k of n features, then classify from them.

    Args:
        n_features: n.
        k: number of features kept.
        n_classes: classes of the predictor.
        hidden: MLP width.
        noise, regularizer, tau: the k-subset relaxation (default Gumbel, the structure's
            default regularizer, τ = 0.5).
        per_example: scores depend on the input (amortised) or are one global parameter vector.

    Shape: ``x`` ``(B, n)`` -> (logits ``(B, n_classes)``, mask ``(B, n)`` with k ones).
    """

    def __init__(self, n_features: int, k: int, n_classes: int, hidden: int = 64,
                 noise: Noise | None = None, regularizer: Regularizer | None = None,
                 tau: float = 0.5, per_example: bool = False):
        super().__init__()
        self.n_features = check_int(n_features, "n_features", low=1)
        self.structure = KSubset(check_int(k, "k", low=1, high=n_features))
        self.noise = noise if noise is not None else Gumbel()
        self.regularizer, self.tau = regularizer, tau
        self.per_example = per_example
        if per_example:
            self.scorer: nn.Module = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(),
                                                   nn.Linear(hidden, n_features))
        else:
            self.scores = nn.Parameter(torch.zeros(n_features))
        self.predictor = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(),
                                       nn.Linear(hidden, n_classes))

    def feature_scores(self, x: torch.Tensor) -> torch.Tensor:
        """Selection scores θ, ``(B, n)``."""
        return self.scorer(x) if self.per_example else self.scores.expand(len(x), -1)

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        """k-hot mask: straight-through perturbed top-k in training, exact top-k in eval."""
        theta = self.feature_scores(x)
        if self.training:
            return relax(theta, self.structure, self.noise, self.regularizer, self.tau, hard=True)
        return argmax(theta, self.structure)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.mask(x)
        return self.predictor(x * m), m
