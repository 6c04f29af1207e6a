r"""Permutations and transport plans: the Birkhoff and transport polytopes.

Z is the set of n x n permutation matrices (:class:`Permutations`; conv Z is the Birkhoff
polytope of doubly stochastic matrices) or the vertices of the transport polytope
U(a, b) = {P ≥ 0 : P1 = a, Pᵀ1 = b} (:class:`Transport`). With the negative entropy the
regularized argmax (:mod:`perturb.core`) is entropic optimal transport, solved by Sinkhorn's
iterations (:func:`sinkhorn`, POT's ``ot.sinkhorn(a, b, M=-W, reg=tau)``); the exact argmax
(τ → 0) is the maximum-weight matching (:func:`matching`, Hungarian) or the optimal transport
plan (POT's network simplex ``ot.emd``).

Layout (one per structure family, see :mod:`perturb.structured`):

- :mod:`.birkhoff`: :class:`Permutations`, :func:`matching` and the registered solvers;
- :mod:`.transport`: :class:`Transport` and its registered solvers;
- :mod:`.sinkhorn`: :func:`sinkhorn`, :func:`gumbel_sinkhorn`, :class:`SinkhornConvergenceWarning`;
- ``_sinkhorn``: the private engine (iterations), with ``_sinkhorn_vjp`` (implicit backward)
  and ``_sinkhorn_graphs`` (the iterations replayed from captured CUDA graphs).
"""
from perturb.structured.permutations._sinkhorn import SinkhornSolution  # noqa: F401 (old path)
from perturb.structured.permutations.birkhoff import Permutations, matching
from perturb.structured.permutations.matrix_scaling import (
    SinkhornConvergenceWarning,
    gumbel_sinkhorn,
    sinkhorn,
)
from perturb.structured.permutations.transport import Transport

__all__ = ["Permutations", "Transport", "sinkhorn", "gumbel_sinkhorn", "matching",
           "SinkhornConvergenceWarning"]
