"""Perturbation distributions: what ε is in ``U = θ + ε``.

Every noise ``ε`` here is a distribution on the real line; a perturbation of scores ``θ`` of
shape ``(*batch, d)`` adds ``d`` independent draws per batch element. Two functionals of the
perturbed scores drive the rest of the library (see the module docstring of
:mod:`perturb.core` for the perturb-then-argmax abstraction):

.. math::

    \\operatorname{expected\\_max}(θ) = \\mathbb{E}[\\max_i (θ_i + ε_i)],
    \\qquad
    \\operatorname{argmax\\_probs}(θ)_i = P(\\operatorname{argmax}_j (θ_j + ε_j) = i)
        = \\int f(x - θ_i) \\prod_{j \\ne i} F(x - θ_j)\\, dx .

``argmax_probs`` is the gradient of ``expected_max`` (both are computed, never Monte-Carlo):

- Gumbel: closed forms ``scale·logsumexp(θ/scale) + scale·γ`` and ``softmax(θ/scale)``
  (max-stability of the Gumbel family).
- other continuous noise: one-dimensional Gauss–Legendre quadrature in float64
  (:mod:`perturb.noise._quadrature`, the one quadrature of the library, which also serves the
  identifiability checks), accurate to about 1e-13 for the built-in families, batched and
  differentiable by autograd.
- :class:`NegativeExponential`: closed forms from one sort (segment integrals of the CDF of
  the max).
- :class:`Discrete`: exact, by counting over the support (ties split uniformly).

Layout: :mod:`~perturb.noise.base` (the :class:`Noise` base class and its declared
capabilities), :mod:`~perturb.noise.scale_families` (:class:`Gumbel`, :class:`Normal` =
:data:`Gaussian`, :class:`Logistic`), :mod:`~perturb.noise.exponential`
(:class:`NegativeExponential`, closed forms), :mod:`~perturb.noise.uniform`,
:mod:`~perturb.noise.discrete`. User-defined noise subclasses :class:`Noise`; see there for how
capabilities are declared.
"""
from perturb._math import EULER_GAMMA
from perturb.noise.base import Noise, QuadratureLayout
from perturb.noise.discrete import Discrete
from perturb.noise.exponential import NegativeExponential
from perturb.noise.scale_families import Gaussian, Gumbel, Logistic, Normal
from perturb.noise.uniform import Uniform

__all__ = ["Noise", "Gumbel", "Normal", "Gaussian", "Logistic", "NegativeExponential", "Uniform",
           "Discrete", "EULER_GAMMA", "QuadratureLayout"]
