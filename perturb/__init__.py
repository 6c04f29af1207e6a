"""perturb: learnable discrete and geometric structure by "perturb, then regularized argmax".

    U   = θ + ε                                   perturb (ε ~ Gumbel, Normal, Logistic, ...)
    X   = argmax_{x ∈ Z}      ⟨U, x⟩              stochastic argmax: exact, discrete
    X_τ = argmax_{x ∈ conv Z} ⟨U, x⟩ − τ f(x)      stochastic softmax: relaxed, differentiable

Z is a set of structures (one-hots, k-subsets, permutations, spanning trees, arborescences), f a
strongly convex regularizer and τ > 0 a temperature: :func:`perturb`, :func:`argmax`,
:func:`regularized_argmax` and :func:`relax`, defined in :mod:`perturb.core`. Importing the
package registers every solver with the registry in :mod:`perturb.structures`; the subpackages
``structured``, ``boxes``, ``distributions``, ``checks``, ``nn`` and ``latent`` are attributes.

Module and function names never collide, so every module path gives the module (``import
perturb.boxes.volumes as V``): ``perturb.relax`` and ``perturb.perturbed`` are the functions;
their modules are :mod:`perturb.core` and :mod:`perturb.perturbed_optimizers`; the functions
``volume``, ``intersection``, ``sinkhorn`` and ``topk`` live in ``boxes/volumes.py``,
``boxes/intersections.py``, ``permutations/matrix_scaling.py`` and ``subsets/ksubsets.py``.
The old module paths ``perturb.relax`` / ``perturb.perturbed`` still work in ``from ...
import`` statements (aliases in ``sys.modules``) for one release. The function
:func:`perturb.perturb` is not in ``__all__``: ``from perturb import *`` keeps the name
``perturb`` bound to the package.
"""
import sys as _sys

from perturb import core, perturbed_optimizers

# old module paths, for `from perturb.relax import relax` written before the rename
_sys.modules.setdefault("perturb.relax", core)
_sys.modules.setdefault("perturb.perturbed", perturbed_optimizers)

from perturb._settings import settings  # noqa: E402
from perturb._validation import set_validation, validation_enabled  # noqa: E402
from perturb.backward import finite_difference_solve, implicit_root, straight_through
from perturb.categorical import (gaussian_softmax, gumbel_softmax, softmax, sparsemax,
                                 sparsemax_loss)
from perturb.noise import (Discrete, Gaussian, Gumbel, Logistic, NegativeExponential, Noise, Normal,
                           Uniform)
from perturb.regularizers import (
    BinaryEntropy,
    Entropy,
    ExpFamilyEntropy,
    Regularizer,
    SquaredNorm,
)
from perturb.perturbed_optimizers import (
    PerturbedOptimizer,
    fenchel_young_loss,
    perturbed,
    perturbed_optimizer,
)
from perturb.core import argmax, perturb, regularized_argmax, relax
from perturb.structures import (
    Simplex,
    Structure,
    register_solver,
    register_unsupported,
    registered_pairs,
    support_table,
)
from perturb import boxes, checks, nn, structured  # noqa: E402  (structured registers its solvers)
from perturb import distributions  # noqa: E402  (after structured, which it builds on)
from perturb import latent  # noqa: E402  (builds on all of the above)

__version__ = "0.1.0"

__all__ = [
    "argmax", "regularized_argmax", "relax",
    "gumbel_softmax", "gaussian_softmax", "sparsemax", "sparsemax_loss", "softmax",
    "perturbed", "fenchel_young_loss", "PerturbedOptimizer", "perturbed_optimizer",
    "register_solver", "register_unsupported", "registered_pairs", "support_table",
    "Structure", "Simplex",
    "Regularizer", "Entropy", "SquaredNorm", "BinaryEntropy", "ExpFamilyEntropy",
    "Noise", "Gumbel", "Normal", "Gaussian", "Logistic", "NegativeExponential", "Uniform",
    "Discrete",
    "implicit_root", "finite_difference_solve", "straight_through",
    "settings", "set_validation", "validation_enabled",
]
# The subpackages (structured, nn, checks, boxes, distributions, latent) are attributes, not in
# __all__: a star import must not rebind a user's `nn` (torch.nn). Nor is the function `perturb`
# (perturb.perturb): `from perturb import *` must leave the name `perturb` the package.
