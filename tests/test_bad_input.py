"""The bad-input catalogue: every public callable, what it must say about bad arguments.

Structures take their cases from their spec in tests/_specs.py (the scores cases generated
from its example, tests/_cases.py, plus its ``bad_inputs``).

Driven by the public ``__all__`` lists of the packages in ``MODULES``: every public callable needs
an entry in ``CATALOGUE`` (a list of cases) or in ``NOTHING_TO_VALIDATE`` (a reason, e.g. a result
container or a base class), so new API cannot skip validation — a public name with neither fails
``test_every_public_name_has_an_entry``. Each case calls the function with one bad argument and
asserts the exception type and that the message names the argument (a regular expression).

Rule for empty inputs: an empty *batch* gives a correct empty result (tested in the files of the
functions); an empty *event* (n = 0 categories, nodes, items) is an error naming the scores.
"""
from __future__ import annotations

import importlib
import inspect
import math
import warnings
from typing import Any, Callable, NamedTuple

import networkx as nx
import pytest
import torch

import perturb
from perturb import boxes, checks, distributions, latent, nn, structured
from perturb.boxes import Box

from _cases import (F64, NAN_S, NAN_V, S, V, Case, int_cases, score_cases, structure_cases,
                    tau_cases)
from _specs import SPECS

MODULES = ["perturb", "perturb.structured", "perturb.boxes", "perturb.checks", "perturb.nn",
           "perturb.latent", "perturb.distributions"]
HERE = "tests/test_bad_input.py"


def _public_callables() -> dict[str, Any]:
    found = {}
    for m in MODULES:
        try:
            mod = importlib.import_module(m)
        except ModuleNotFoundError:
            continue
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if callable(obj) and not inspect.ismodule(obj):
                found.setdefault(name, obj)
    # public but outside __all__ (a star import must not rebind the package name `perturb`)
    found.setdefault("perturb", perturb.perturb)
    return found


# --------------------------------------------------------------------------------------------
# inputs and case generators
# --------------------------------------------------------------------------------------------

LOWER = torch.zeros(4, 3)
UPPER = torch.ones(4, 3)
BOX = Box(LOWER, UPPER)


class _HalfLine(perturb.Noise):
    """A continuous noise on [0, inf): box volumes integrate noise on the line or on a bounded
    interval (and NegativeExponential), not this."""

    continuous = True
    has_cdf = True
    has_log_prob = True

    @property
    def support(self) -> tuple[float, float]:
        return (0.0, math.inf)

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        return -torch.expm1(-x.clamp(min=0))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        return -x

def _all_masked_row(fn: Callable, name: str) -> list[Case]:
    """A row whose entries are all -inf (masks allowed, but nothing left to choose)."""
    x = V.clone()
    x[0] = -math.inf
    return [Case(f"{name} row all -inf", lambda: fn(x), name)]


def _box_cases(fn: Callable, name: str) -> list[Case]:
    return [Case(f"{name} not a Box", lambda: fn(LOWER), name)]


def _argmax(u):
    return torch.nn.functional.one_hot(u.argmax(-1), u.shape[-1]).to(u.dtype)


def _quiet(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` with the package's FutureWarnings ignored (a deprecated spelling on purpose)."""
    def call() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return fn()
    return call


class _OneShapeNoise(perturb.Noise):
    """A user noise whose ``sample`` ignores the requested shape."""

    def sample(self, shape, *, generator=None, device=None, dtype=None):
        return torch.zeros(5, dtype=dtype)


def _graph():
    return nx.DiGraph([(1, 0), (2, 0), (3, 1)])


# --------------------------------------------------------------------------------------------
# the catalogue
# --------------------------------------------------------------------------------------------

St = structured
CATALOGUE: dict[str, list[Case]] = {
    # the core ----------------------------------------------------------------------------
    # perturb adds noise to a tensor of any shape (scalars, empty): only dtype and values
    "perturb": score_cases(lambda x: perturb.perturb(x, perturb.Gumbel()), "theta")[:4] + [
        Case("noise not a Noise", lambda: perturb.perturb(V, "gumbel"), "noise"),
        Case("n_samples 0", lambda: perturb.perturb(V, n_samples=0), "n_samples"),
        Case("generator not a Generator", lambda: perturb.perturb(V, generator=0),
             "generator"),
        Case("noise a class", lambda: perturb.perturb(V, perturb.Gumbel), "Gumbel\\(\\)"),
        Case("noise ignoring the requested shape", lambda: perturb.perturb(
            V, _OneShapeNoise()), "noise"),
    ],
    "argmax": score_cases(perturb.argmax, "w") + [
        Case("structure not a Structure", lambda: perturb.argmax(V, "simplex"), "structure"),
    ],
    "regularized_argmax": score_cases(perturb.regularized_argmax, "w")
    + tau_cases(lambda t: perturb.regularized_argmax(V, tau=t)) + [
        Case("unknown backward", lambda: perturb.regularized_argmax(V, backward="magic"),
             "backward"),
        Case("regularizer not a Regularizer",
             lambda: perturb.regularized_argmax(V, regularizer="entropy"), "regularizer"),
        Case("unsupported pair", lambda: perturb.regularized_argmax(
            S, St.Permutations(), perturb.ExpFamilyEntropy()), "permanent",
            NotImplementedError),
        Case("tau enlarging the batch", lambda: perturb.regularized_argmax(
            V, tau=torch.ones(3, 1, dtype=F64)), "tau"),
    ],
    "relax": score_cases(perturb.relax, "theta") + tau_cases(lambda t: perturb.relax(V, tau=t))
    + [Case("hard not a bool", lambda: perturb.relax(V, hard=1), "hard"),
       Case("unknown backward", lambda: perturb.relax(V, backward="x"), "backward")],
    "gumbel_softmax": score_cases(perturb.gumbel_softmax, "logits") + _all_masked_row(perturb.gumbel_softmax, "logits")
    + tau_cases(lambda t: perturb.gumbel_softmax(V, t)) + [
        Case("dim out of range", lambda: perturb.gumbel_softmax(V, dim=2), "dim"),
        Case("hard not a bool", lambda: perturb.gumbel_softmax(V, hard="yes"), "hard"),
    ],
    "gaussian_softmax": score_cases(perturb.gaussian_softmax, "logits") + _all_masked_row(perturb.gaussian_softmax, "logits")
    + tau_cases(lambda t: perturb.gaussian_softmax(V, t))
    + tau_cases(lambda s: perturb.gaussian_softmax(V, scale=s), "scale") + [
        Case("deprecated sigma < 0 names sigma", _quiet(
            lambda: perturb.gaussian_softmax(V, sigma=-1.0)), "sigma"),
    ],
    "sparsemax": score_cases(perturb.sparsemax, "x") + _all_masked_row(perturb.sparsemax, "x") + [
        Case("dim out of range", lambda: perturb.sparsemax(V, dim=-3), "dim")],
    "sparsemax_loss": score_cases(lambda x: perturb.sparsemax_loss(x, torch.zeros(
        x.shape[:-1], dtype=torch.long) if isinstance(x, torch.Tensor) and x.ndim else
        torch.zeros((), dtype=torch.long)), "x") + [
        Case("target of the wrong shape", lambda: perturb.sparsemax_loss(
            V, torch.zeros(2, dtype=torch.long)), "target"),
        Case("target index out of range", lambda: perturb.sparsemax_loss(
            V, torch.full((3,), 7)), "target"),
        Case("target a list", lambda: perturb.sparsemax_loss(V, [0, 1, 2]), "target"),
        Case("target distributions of another shape", lambda: perturb.sparsemax_loss(
            V, V[:, :2]), "target"),
        Case("unknown reduction", lambda: perturb.sparsemax_loss(
            V, torch.zeros(3, dtype=torch.long), reduction="avg"), "reduction"),
    ],
    "softmax": score_cases(perturb.softmax, "x") + _all_masked_row(perturb.softmax, "x")
    + tau_cases(lambda t: perturb.softmax(V, tau=t)),
    "perturbed": score_cases(lambda x: perturb.perturbed(_argmax, x), "theta") + [
        Case("argmax_fn not callable", lambda: perturb.perturbed(None, V), "argmax_fn"),
        Case("argmax_fn dropping a leading dim", lambda: perturb.perturbed(
            lambda u: u.sum(0), V), "argmax_fn"),
        Case("argmax_fn returning NaN", lambda: perturb.perturbed(
            lambda u: u * math.nan, V), "argmax_fn"),
        Case("noise ignoring the requested shape", lambda: perturb.perturbed(
            _argmax, V, _OneShapeNoise()), "noise"),
        Case("noise a class", lambda: perturb.perturbed(_argmax, V, perturb.Normal),
             "Normal\\(\\)"),
        Case("n_samples 0", lambda: perturb.perturbed(_argmax, V, n_samples=0), "n_samples"),
        Case("noise not a Noise", lambda: perturb.perturbed(_argmax, V, "gauss"), "noise"),
    ] + tau_cases(lambda s: perturb.perturbed(_argmax, V, perturb.Normal(s)), "scale") + [
        Case("deprecated sigma < 0 names sigma", _quiet(
            lambda: perturb.perturbed(_argmax, V, sigma=-1.0)), "sigma"),
    ],
    "fenchel_young_loss": [
        Case("y_true wrong shape", lambda: perturb.fenchel_young_loss(_argmax, V, V[:, :2]),
             "y_true"),
        Case("y_true enlarging the batch", lambda: perturb.fenchel_young_loss(
            _argmax, V, V[None]), "y_true"),
        Case("y_true NaN", lambda: perturb.fenchel_young_loss(_argmax, V, NAN_V), "y_true"),
        Case("unknown reduction", lambda: perturb.fenchel_young_loss(
            _argmax, V, _argmax(V), reduction="avg"), "reduction"),
        Case("empty batch", lambda: perturb.fenchel_young_loss(
            _argmax, V[:0], V[:0]), "theta"),
    ],
    "PerturbedOptimizer": [
        Case("argmax_fn not callable", lambda: perturb.PerturbedOptimizer(3), "argmax_fn"),
        Case("n_samples 0", lambda: perturb.PerturbedOptimizer(_argmax, n_samples=0),
             "n_samples"),
    ] + tau_cases(lambda s: perturb.PerturbedOptimizer(_argmax, perturb.Normal(s)), "scale"),
    "perturbed_optimizer": [
        Case("unknown option", lambda: perturb.perturbed_optimizer(_argmax, bogus=1), "bogus",
             TypeError),
    ],
    "register_solver": [
        Case("structure type not a Structure subclass",
             lambda: perturb.register_solver(int, perturb.Entropy), "Structure subclass",
             TypeError),
        Case("unknown backward mode", lambda: perturb.register_solver(
            perturb.Simplex, perturb.Entropy, backward=("magic",)), "backward"),
    ],
    "register_unsupported": [
        Case("regularizer type not a Regularizer subclass",
             lambda: perturb.register_unsupported(perturb.Simplex, int, "no"),
             "Regularizer subclass", TypeError),
    ],
    "Entropy": [Case("arguments", lambda: perturb.Entropy(1.0), "argument", TypeError)],
    "SquaredNorm": [Case("arguments", lambda: perturb.SquaredNorm(1.0), "argument", TypeError)],
    "BinaryEntropy": [Case("arguments", lambda: perturb.BinaryEntropy(1.0), "argument",
                           TypeError)],
    "ExpFamilyEntropy": [Case("arguments", lambda: perturb.ExpFamilyEntropy(1.0), "argument",
                              TypeError)],
    "Gumbel": tau_cases(perturb.Gumbel, "scale") + [
        Case("a location too (torch.distributions habit)", lambda: perturb.Gumbel(0.0, 1.0),
             "Gumbel\\(scale=", TypeError),
        Case("sample on a device that does not exist", lambda: perturb.Gumbel().sample(
            (2,), device="bogus"), "device"),
    ],
    "Normal": tau_cases(perturb.Normal, "scale") + [
        Case("a location too (torch.distributions habit)", lambda: perturb.Normal(0.0, 1.0),
             "Normal\\(scale=", TypeError),
        Case("a non-zero loc", lambda: perturb.Normal(loc=1.0), "loc"),
    ],
    "Gaussian": tau_cases(perturb.Gaussian, "scale"),
    "Logistic": tau_cases(perturb.Logistic, "scale") + [
        Case("a location too", lambda: perturb.Logistic(0.0, 1.0), "Logistic\\(scale=",
             TypeError),
    ],
    "NegativeExponential": tau_cases(perturb.NegativeExponential, "scale") + [
        Case("a location too", lambda: perturb.NegativeExponential(0.0, 1.0),
             "NegativeExponential\\(scale=", TypeError),
    ],
    "Uniform": [Case("low >= high", lambda: perturb.Uniform(1.0, -1.0), "low"),
                Case("NaN bound", lambda: perturb.Uniform(math.nan, 1.0), "low")],
    "Discrete": [
        Case("repeated values", lambda: perturb.Discrete([0.0, 0.0]), "values"),
        Case("probs not summing to 1", lambda: perturb.Discrete([0.0, 1.0], [0.2, 0.2]),
             "probs"),
        Case("negative probs", lambda: perturb.Discrete([0.0, 1.0], [-0.5, 1.5]), "probs"),
        Case("length mismatch", lambda: perturb.Discrete([0.0, 1.0], [1.0]), "probs"),
    ],
    "implicit_root": [
        Case("optimality_fn not callable", lambda: perturb.implicit_root(None, V), "optimality"),
        Case("unknown linear_solve", lambda: perturb.implicit_root(
            lambda x: x, V, linear_solve="magic"), "linear_solve"),
    ],
    "finite_difference_solve": [
        Case("eps <= 0", lambda: perturb.finite_difference_solve(lambda w: w, V, eps=-1.0),
             "eps"),
        Case("solve_fn not callable", lambda: perturb.finite_difference_solve(None, V),
             "solve_fn"),
    ],
    "straight_through": [
        Case("shapes that do not broadcast", lambda: perturb.straight_through(V, V[:, :2]),
             "hard and soft"),
    ],
    "set_validation": [
        Case("string", lambda: perturb.set_validation("false"), "enabled"),
    ],
    "settings": [
        Case("validate a string", lambda: perturb.settings(validate="false"), "validate"),
        Case("compiled an int", lambda: perturb.settings(compiled=1), "compiled"),
        Case("cuda_graphs a string", lambda: perturb.settings(cuda_graphs="no"), "cuda_graphs"),
    ],
    # structured --------------------------------------------------------------------------
    "sinkhorn": score_cases(St.sinkhorn, "log_alpha", matrix=True)
    + tau_cases(lambda t: St.sinkhorn(S, tau=t)) + [
        Case("unknown backward", lambda: St.sinkhorn(S, backward="auto2"), "backward"),
        Case("negative marginal", lambda: St.sinkhorn(S, a=-torch.ones(2, 4, dtype=F64),
                                                      b=torch.ones(2, 4, dtype=F64)), "a"),
        Case("marginal sums differ", lambda: St.sinkhorn(
            S, a=torch.ones(2, 4, dtype=F64), b=2 * torch.ones(2, 4, dtype=F64)), "sum"),
        Case("mask not bool", lambda: St.sinkhorn(S, mask=torch.ones(4, 4)), "mask"),
        Case("tau enlarging the batch", lambda: St.sinkhorn(
            S, tau=torch.ones(3, 1, dtype=F64)), "tau"),
        Case("n_iters 0", lambda: St.sinkhorn(S, n_iters=0), "n_iters"),
    ],
    "gumbel_sinkhorn": score_cases(St.gumbel_sinkhorn, "log_alpha", matrix=True),
    "matching": score_cases(St.matching, "w", matrix=True)[:-2],
    "topk": score_cases(lambda w: St.topk(w, 2), "w")
    + int_cases(lambda k: St.topk(V, k), "k", 0, 6),
    "relaxed_topk": score_cases(lambda w: St.relaxed_topk(w, 2), "w")
    + int_cases(lambda k: St.relaxed_topk(V, k), "k", 0, 6)
    + tau_cases(lambda t: St.relaxed_topk(V, 2, tau=t)),
    "ksubset_log_partition": score_cases(lambda w: St.ksubset_log_partition(w, 2), "w")
    + int_cases(lambda k: St.ksubset_log_partition(V, k), "k", -1, 6)
    + tau_cases(lambda t: St.ksubset_log_partition(V, 2, tau=t)),
    "ksubset_marginals": score_cases(lambda w: St.ksubset_marginals(w, 2), "w")
    + int_cases(lambda k: St.ksubset_marginals(V, k), "k", 0, 6)
    + tau_cases(lambda t: St.ksubset_marginals(V, 2, tau=t)),
    "sample_ksubset": score_cases(lambda w: St.sample_ksubset(w, 2), "w")
    + int_cases(lambda k: St.sample_ksubset(V, k), "k", 0, 6)
    + [Case("n_samples 0", lambda: St.sample_ksubset(V, 2, n_samples=0), "n_samples")],
    "correlated_topk_argmax": score_cases(lambda w: St.correlated_topk_argmax(w, 2), "w")
    + int_cases(lambda k: St.correlated_topk_argmax(V, k), "k", 0, 4),
    "correlated_topk_log_partition": score_cases(
        lambda w: St.correlated_topk_log_partition(w, 2), "w")
    + int_cases(lambda k: St.correlated_topk_log_partition(V, k), "k", 0, 4)
    + tau_cases(lambda t: St.correlated_topk_log_partition(V, 2, tau=t)),
    "correlated_topk_marginals": score_cases(lambda w: St.correlated_topk_marginals(w, 2), "w")
    + int_cases(lambda k: St.correlated_topk_marginals(V, k), "k", 0, 4)
    + tau_cases(lambda t: St.correlated_topk_marginals(V, 2, tau=t))
    + [Case("even n", lambda: St.correlated_topk_marginals(torch.randn(3, 4, dtype=F64), 1),
            "odd")],
    "sample_correlated_topk": score_cases(lambda w: St.sample_correlated_topk(w, 2), "w")
    + int_cases(lambda k: St.sample_correlated_topk(V, k), "k", 0, 4)
    + tau_cases(lambda t: St.sample_correlated_topk(V, 2, tau=t))
    + [Case("n_samples 0", lambda: St.sample_correlated_topk(V, 2, n_samples=0), "n_samples")],
    "spanning_tree_marginals": score_cases(St.spanning_tree_marginals, "w", matrix=True)
    + tau_cases(lambda t: St.spanning_tree_marginals(S, tau=t)),
    "spanning_tree_log_partition": score_cases(St.spanning_tree_log_partition, "w",
                                                matrix=True),
    "max_spanning_tree": score_cases(St.max_spanning_tree, "w", matrix=True),
    "arborescence_marginals": score_cases(St.arborescence_marginals, "w", matrix=True)
    + int_cases(lambda r: St.arborescence_marginals(S, root=r), "root", -1, 4)
    + [Case("root None", lambda: St.arborescence_marginals(S, root=None), "root")],
    "arborescence_log_partition": score_cases(St.arborescence_log_partition, "w", matrix=True)
    + int_cases(lambda r: St.arborescence_log_partition(S, root=r), "root", -1, 4),
    "max_arborescence": score_cases(St.max_arborescence, "w", matrix=True)
    + int_cases(lambda r: St.max_arborescence(S, root=r), "root", -1, 4),
    "sample_spanning_tree": score_cases(St.sample_spanning_tree, "w", matrix=True) + [
        Case("unknown method", lambda: St.sample_spanning_tree(S, method="kruskal"), "method")],
    "sample_arborescence": score_cases(St.sample_arborescence, "w", matrix=True)
    + int_cases(lambda r: St.sample_arborescence(S, root=r), "root", -1, 4),
    "dag_path_log_partition": score_cases(St.dag_path_log_partition, "w", matrix=True)
    + tau_cases(lambda t: St.dag_path_log_partition(S, tau=t)),
    # distributions -----------------------------------------------------------------------
    "PerturbedStructure": score_cases(
        lambda x: distributions.PerturbedStructure(x, perturb.Simplex()), "logits")
    + tau_cases(lambda t: distributions.PerturbedStructure(V, perturb.Simplex(), tau=t)) + [
        Case("structure not a Structure", lambda: distributions.PerturbedStructure(
            V, "simplex"), "structure"),
        Case("noise not a Noise", lambda: distributions.PerturbedStructure(
            V, perturb.Simplex(), noise="gumbel"), "noise"),
        Case("regularizer not a Regularizer", lambda: distributions.PerturbedStructure(
            V, perturb.Simplex(), regularizer="entropy"), "regularizer"),
        Case("unknown backward", lambda: distributions.PerturbedStructure(
            V, perturb.Simplex(), backward="magic"), "backward"),
        Case("validate_args not a bool", lambda: distributions.PerturbedStructure(
            V, perturb.Simplex(), validate_args="yes"), "validate_args"),
        Case("log_prob outside the support", lambda: distributions.PerturbedStructure(
            V, perturb.Simplex()).log_prob(torch.ones(3, 5, dtype=F64)), "support"),
        Case("log_prob with k-subsets", lambda: distributions.PerturbedStructure(
            V, St.KSubset(2)).log_prob(St.topk(V, 2)), "Gibbs", NotImplementedError),
        Case("sample_shape negative", lambda: distributions.PerturbedStructure(
            V, perturb.Simplex()).sample((-1,)), "sample_shape"),
        Case("both logits and the former theta", _quiet(lambda: distributions.PerturbedStructure(
            V, perturb.Simplex(), theta=V)), "theta", TypeError),
        Case("cross_entropy with another kind", lambda: distributions.PerturbedStructure(
            V, perturb.Simplex()).cross_entropy(distributions.KSubsetDistribution(V, 2)),
            "other"),
    ],
    "RelaxedPerturbedStructure": score_cases(
        lambda x: distributions.RelaxedPerturbedStructure(x, perturb.Simplex()), "logits")
    + tau_cases(lambda t: distributions.RelaxedPerturbedStructure(V, perturb.Simplex(), tau=t))
    + [
        Case("noise a class", lambda: distributions.RelaxedPerturbedStructure(
            V, perturb.Simplex(), perturb.Normal), "Normal\\(\\)"),
        Case("log_prob off the simplex", lambda: distributions.RelaxedPerturbedStructure(
            V, perturb.Simplex(), validate_args=True).log_prob(torch.full((3, 5), 0.5,
                                                                          dtype=F64)),
             "support"),
        Case("log_prob of a relaxed k-subset", lambda: distributions.RelaxedPerturbedStructure(
            V, St.KSubset(2)).log_prob(torch.full((3, 5), 0.4, dtype=F64)), "closed-form",
            NotImplementedError),
        Case("log_prob with Logistic noise", lambda: distributions.RelaxedPerturbedStructure(
            V, perturb.Simplex(), perturb.Logistic()).log_prob(torch.full((3, 5), 0.2,
                                                                          dtype=F64)),
             "integral", NotImplementedError),
        Case("log_prob with sparsemax", lambda: distributions.RelaxedPerturbedStructure(
            V, perturb.Simplex(), regularizer=perturb.SquaredNorm()).log_prob(
                torch.full((3, 5), 0.2, dtype=F64)), "faces", NotImplementedError),
        Case("KL of two Gumbel-softmax distributions", lambda: torch.distributions.kl_divergence(
            distributions.RelaxedPerturbedStructure(V, perturb.Simplex()),
            distributions.RelaxedPerturbedStructure(V, perturb.Simplex())), "Monte Carlo",
            NotImplementedError),
        Case("mean", lambda: distributions.RelaxedPerturbedStructure(
            V, perturb.Simplex()).mean, "closed form", NotImplementedError),
    ],
    "KSubsetDistribution": score_cases(lambda x: distributions.KSubsetDistribution(x, 2),
                                        "logits")
    + int_cases(lambda k: distributions.KSubsetDistribution(V, k), "k", 0, 6) + [
        Case("fewer than k unmasked", lambda: distributions.KSubsetDistribution(
            torch.tensor([0.0, -math.inf, -math.inf], dtype=F64), 2), "logits"),
        Case("log_prob outside the support", lambda: distributions.KSubsetDistribution(
            V, 2).log_prob(St.topk(V, 3)), "support"),
        Case("rsample", lambda: distributions.KSubsetDistribution(V, 2).rsample(),
             "PerturbedStructure", NotImplementedError),
        Case("KL against another k", lambda: torch.distributions.kl_divergence(
            distributions.KSubsetDistribution(V, 2), distributions.KSubsetDistribution(V, 3)),
            "same structure"),
        Case("cross_entropy against a tree family", lambda: distributions.KSubsetDistribution(
            V, 2).cross_entropy(distributions.SpanningTreeDistribution(S)), "other"),
    ],
    "SpanningTreeDistribution": score_cases(distributions.SpanningTreeDistribution,
                                             "logits", matrix=True) + [
        Case("log_prob outside the support", lambda: distributions.SpanningTreeDistribution(
            S).log_prob(torch.ones(4, 4, dtype=F64)), "support"),
        Case("disconnected graph", lambda: distributions.SpanningTreeDistribution(
            torch.full((3, 3), -math.inf, dtype=F64)).partition, "disconnected"),
    ],
    "ArborescenceDistribution": score_cases(distributions.ArborescenceDistribution,
                                             "logits", matrix=True)
    + int_cases(lambda r: distributions.ArborescenceDistribution(S, root=r), "root", -1, 4) + [
        Case("log_prob outside the support", lambda: distributions.ArborescenceDistribution(
            S).log_prob(torch.eye(4, dtype=F64)), "support")],
    # boxes -------------------------------------------------------------------------------
    "Box": [
        Case("shape mismatch", lambda: Box(LOWER, UPPER[:, :2]), "shape"),
        Case("int corners", lambda: Box(LOWER.long(), UPPER.long()), "lower"),
        Case("NaN corner", lambda: Box(LOWER + math.nan, UPPER), "lower"),
        Case("from_min_delta softplus_beta <= 0",
             lambda: Box.from_min_delta(LOWER, UPPER, softplus_beta=0.0), "softplus_beta"),
    ] + [
        Case("expand to an incompatible batch", lambda: BOX.expand(5, 3), "batch_shape"),
        Case("reshape to another count", lambda: BOX.reshape(5), "batch_shape"),
    ],
    "join": _box_cases(lambda a: boxes.join(a, BOX), "a"),
    "volume": _box_cases(boxes.volume, "box") + tau_cases(
        lambda b: boxes.volume(BOX, beta=b), "beta") + [
        Case("unknown method", lambda: boxes.volume(BOX, method="fuzzy"), "method"),
        Case("tau enlarging the batch", lambda: boxes.volume(BOX, beta=torch.ones(3, 1)),
             "beta")],
    "gumbel_side_length": tau_cases(lambda b: boxes.gumbel_side_length(LOWER, UPPER, b),
                                     "beta") + [
        Case("int corners", lambda: boxes.gumbel_side_length(LOWER.long(), UPPER.long()),
             "lower"),
        Case("NaN corner", lambda: boxes.gumbel_side_length(LOWER, UPPER + math.nan), "upper")],
    "log_gumbel_side_length": tau_cases(
        lambda b: boxes.log_gumbel_side_length(LOWER, UPPER, b), "beta"),
    "intersection": _box_cases(lambda a: boxes.intersection(a, BOX), "a")
    + tau_cases(lambda b: boxes.intersection(BOX, BOX, beta=b), "beta") + [
        Case("beta tensor that does not broadcast", lambda: boxes.intersection(
            BOX, BOX, beta=torch.ones(5)), "beta"),
    ],
    "expected_volume": [
        Case("no box", lambda: boxes.expected_volume(noise=perturb.Normal(0.1)), "at least one"),
        Case("a box not a Box", lambda: boxes.expected_volume(BOX, LOWER), "boxes\\[1\\]"),
        Case("Discrete noise", lambda: boxes.expected_volume(
            BOX, noise=perturb.Discrete([0.0, 1.0], [0.5, 0.5])), "noise.*continuous"),
        Case("noise bounded on one side", lambda: boxes.expected_volume(BOX, noise=_HalfLine()),
             "noise.*bounded on one side only"),
        Case("a noise name", lambda: boxes.expected_volume(BOX, noise="gumbel"),
             "noise must be a perturb.noise.Noise"),
        Case("boxes of different d", lambda: boxes.expected_volume(
            BOX, boxes.Box(torch.zeros(5, dtype=F64), torch.ones(5, dtype=F64))), "dim"),
    ],
    "containment_prob": _box_cases(lambda a: boxes.containment_prob(a, BOX), "a")
    + tau_cases(lambda b: boxes.containment_prob(BOX, BOX, beta=b), "beta") + [
        Case("beta tensor that does not broadcast", lambda: boxes.containment_prob(
            BOX, BOX, beta=torch.ones(5)), "beta"),
        Case("noise with beta", lambda: boxes.containment_prob(
            BOX, BOX, beta=0.1, noise=perturb.Normal(0.1)), "drop beta"),
        Case("volume_beta tensor that does not broadcast", lambda: boxes.containment_prob(
            BOX, BOX, beta=0.1, volume_beta=torch.ones(5)), "volume_beta"),
    ],
    "log_containment_prob": _box_cases(lambda a: boxes.log_containment_prob(a, BOX), "a") + [
        Case("beta tensor that does not broadcast", lambda: boxes.log_containment_prob(
            BOX, BOX, beta=torch.ones(5)), "beta"),
    ],
    "log1m_containment_prob": _box_cases(lambda a: boxes.log1m_containment_prob(a, BOX), "a") + [
        Case("beta tensor that does not broadcast", lambda: boxes.log1m_containment_prob(
            BOX, BOX, beta=torch.ones(5)), "beta"),
    ],
    "overlap": _box_cases(lambda a: boxes.overlap(a, BOX), "a") + [
        Case("beta tensor that does not broadcast", lambda: boxes.overlap(
            BOX, BOX, beta=torch.ones(5)), "beta"),
    ],
    "BoxEmbedding": int_cases(lambda n: boxes.BoxEmbedding(n, 3), "num_entities", 0)
    + int_cases(lambda d: boxes.BoxEmbedding(5, d), "dim", 0) + [
        Case("unknown parameterisation", lambda: boxes.BoxEmbedding(
            5, 3, parameterisation="corners"), "parameterisation")] + [
        Case("a device that does not exist", lambda: boxes.BoxEmbedding(5, 3, device="bogus"),
             "device"),
    ],
    "containment_loss": _box_cases(lambda p: boxes.containment_loss(p, BOX), "parent") + [
        Case("unknown reduction", lambda: boxes.containment_loss(BOX, BOX, reduction="avg"),
             "reduction")],
    "overlap_loss": _box_cases(lambda a: boxes.overlap_loss(a, BOX), "a"),
    "volume_regularizer": _box_cases(lambda b: boxes.volume_regularizer(b, 0.5), "box") + [
        Case("unknown mode", lambda: boxes.volume_regularizer(BOX, 0.5, mode="x"), "mode")],
    "sample_negatives": [
        Case("pairs wrong shape", lambda: boxes.sample_negatives(torch.zeros(3, 3).long(), 5),
             "pairs"),
        Case("max_tries < 0", lambda: boxes.sample_negatives(
            torch.tensor([[0, 1]]), 5, max_tries=-1), "max_tries"),
        Case("unknown corrupt", lambda: boxes.sample_negatives(
            torch.tensor([[0, 1]]), 5, corrupt="middle"), "corrupt"),
    ] + [
        Case("generator not a Generator", lambda: boxes.sample_negatives(
            torch.tensor([[0, 1]]), 5, generator="x"), "generator"),
    ],
    "log1mexp": [Case("x > 0", lambda: boxes.log1mexp(torch.tensor([0.5])), "x")],
    "BoxHierarchyModel": int_cases(lambda n: boxes.BoxHierarchyModel(n, 3), "num_nodes", 0)
    + [Case("unknown method", lambda: boxes.BoxHierarchyModel(4, 3, method="soft2"), "method"),
       Case("a noise name", lambda: boxes.BoxHierarchyModel(4, 3, "gaussian"), "noise must be"),
       Case("a noise bounded on one side", lambda: boxes.BoxHierarchyModel(4, 3, _HalfLine()),
            "bounded on one side only"),
       Case("temperature with a noise", lambda: boxes.BoxHierarchyModel(
           4, 3, perturb.Normal(0.1), temperature=0.5), "temperature")],
    "train_hierarchy": [
        Case("not a DiGraph", lambda: boxes.train_hierarchy([(1, 0)], 2), "graph"),
        Case("accuracy_threshold > 1", lambda: boxes.train_hierarchy(
            _graph(), 2, accuracy_threshold=2.0, progress=False), "accuracy_threshold"),
        Case("grad_tol < 0", lambda: boxes.train_hierarchy(
            _graph(), 2, grad_tol=-1.0, progress=False), "grad_tol"),
        Case("volume_reg NaN", lambda: boxes.train_hierarchy(
            _graph(), 2, volume_reg=math.nan, progress=False), "volume_reg"),
        Case("negative_weight NaN", lambda: boxes.train_hierarchy(
            _graph(), 2, negative_weight=math.nan, progress=False), "negative_weight"),
    ],
    "evaluate": [
        Case("model not a BoxHierarchyModel", lambda: boxes.evaluate(
            None, torch.tensor([[0, 1]]), torch.tensor([1.0])), "model")] + [
        Case("labels a list", lambda: boxes.evaluate(
            boxes.BoxHierarchyModel(4, 3), torch.tensor([[0, 1], [1, 2]]), [1.0, 0.0]),
            "labels"),
    ],
    "all_pairs_f1": [
        Case("model not a BoxHierarchyModel", lambda: boxes.all_pairs_f1(
            None, torch.tensor([[0, 1]])), "model")],
    # checks ------------------------------------------------------------------------------
    "check_completeness": [
        Case("noise not a distribution", lambda: checks.check_completeness("gumbel", 3),
             "noise"),
        Case("d < 2", lambda: checks.check_completeness(perturb.Gumbel(), 1), "d"),
        Case("unknown kind", lambda: checks.check_completeness(perturb.Gumbel(), 3,
                                                               kind="max"), "kind"),
    ],
    "check_minimality": [
        Case("noise not a distribution", lambda: checks.check_minimality(3.0, 3), "noise"),
        Case("eig_tol < 0", lambda: checks.check_minimality(perturb.Gumbel(), 3, eig_tol=-1.0),
             "eig_tol"),
    ],
    "identify": [
        Case("p not a distribution", lambda: checks.identify(
            torch.tensor([0.5, 0.6], dtype=F64), perturb.Gumbel()), "p"),
        Case("noise not a distribution", lambda: checks.identify(
            torch.tensor([0.5, 0.5], dtype=F64), None), "noise"),
    ] + [
        Case("init of the wrong length", lambda: checks.identify(
            torch.tensor([0.5, 0.5], dtype=F64), perturb.Gumbel(), init=torch.zeros(5)),
            "init"),
        Case("init a list", lambda: checks.identify(
            torch.tensor([0.5, 0.5], dtype=F64), perturb.Gumbel(), init=[0.0]), "init"),
    ],
    # nn ----------------------------------------------------------------------------------
    "StochasticSoftmax": tau_cases(lambda t: nn.StochasticSoftmax(tau=t)) + [
        Case("unknown eval_mode", lambda: nn.StochasticSoftmax(eval_mode="x"), "eval_mode")],
    "GumbelSoftmax": tau_cases(lambda t: nn.GumbelSoftmax(tau=t)),
    "Sparsemax": tau_cases(lambda t: nn.Sparsemax(tau=t)) + [
        Case("dim not an int", lambda: nn.Sparsemax(dim=1.5), "dim")],
    "SparsemaxLoss": [
        Case("unknown reduction", lambda: nn.SparsemaxLoss(reduction="avg"), "reduction"),
        Case("ignore_index not an int", lambda: nn.SparsemaxLoss(ignore_index=0.5),
             "ignore_index")],
    "GaussianSoftmax": tau_cases(lambda t: nn.GaussianSoftmax(tau=t)) + [
        Case("deprecated sigma 0 names sigma", _quiet(lambda: nn.GaussianSoftmax(sigma=0.0)),
             "sigma"),
    ],
    "ConstantSchedule": tau_cases(lambda t: nn.ConstantSchedule(t)),
    "ExponentialSchedule": tau_cases(lambda t: nn.ExponentialSchedule(tau0=t), "tau0"),
    "LinearSchedule": tau_cases(lambda t: nn.LinearSchedule(tau0=t), "tau0")
    + int_cases(lambda n: nn.LinearSchedule(n_steps=n), "n_steps", 0),
    # latent ------------------------------------------------------------------------------
    "CategoricalVAE": int_cases(lambda n: latent.CategoricalVAE(n_latents=n), "n_latents", 0),
    "IVAE": [
        Case("obs_scale 0", lambda: latent.IVAE(4, 2, 3, obs_scale=0.0), "obs_scale"),
        Case("obs_scale < 0", lambda: latent.IVAE(4, 2, 3, obs_scale=-1.0), "obs_scale"),
        Case("tau NaN", lambda: latent.IVAE(4, 2, 3, tau=math.nan), "tau"),
        Case("unknown likelihood", lambda: latent.IVAE(4, 2, 3, likelihood="poisson"),
             "likelihood"),
    ] + [
        Case("deprecated temperature < 0 names temperature", _quiet(
            lambda: latent.IVAE(4, 2, 3, temperature=-1.0)), "temperature"),
    ],
    "SubsetSelector": int_cases(lambda k: latent.SubsetSelector(5, k, 2), "k", 0, 6),
    "make_nonlinear_ica": [
        Case("obs_noise < 0", lambda: latent.make_nonlinear_ica(obs_noise=-1.0), "obs_noise"),
        Case("slope NaN", lambda: latent.make_nonlinear_ica(slope=math.nan), "slope"),
    ],
    "perturbed_binary": score_cases(lambda x: latent.perturbed_binary(x, 0.5), "logits")[:4]
    + [Case("tau < 0", lambda: latent.perturbed_binary(V, -1.0), "tau")] + [
        Case("deprecated temperature < 0 names temperature", _quiet(
            lambda: latent.perturbed_binary(V, temperature=-1.0)), "temperature"),
    ],
    "binarized_digits": [
        Case("test_fraction > 1", lambda: latent.binarized_digits(test_fraction=1.5),
             "test_fraction")],
    "correlation_matrix": [
        Case("shape mismatch", lambda: latent.correlation_matrix(V, V[:2]), "rows"),
        Case("unknown method", lambda: latent.correlation_matrix(V, V, method="kendall"),
             "method"),
        Case("1-d input", lambda: latent.correlation_matrix(V[0], V[0]), "a"),
    ],
    "mean_corr_coef": [
        Case("unknown method", lambda: latent.mean_corr_coef(V, V, method="kendall"),
             "method")],
    "GraphLayoutVAE": int_cases(lambda n: latent.GraphLayoutVAE(n), "n_nodes", 2)
    + int_cases(lambda t: latent.GraphLayoutVAE(5, n_steps=t), "n_steps", 0)
    + tau_cases(lambda t: latent.GraphLayoutVAE(5, tau=t))
    + [Case("unknown latent", lambda: latent.GraphLayoutVAE(5, latent="dag"), "latent"),
       Case("obs_scale 0", lambda: latent.GraphLayoutVAE(5, obs_scale=0.0), "obs_scale"),
       Case("hard not bool", lambda: latent.GraphLayoutVAE(5, hard=1), "hard"),
       Case("traj wrong shape", lambda: latent.GraphLayoutVAE(5, n_steps=2).elbo(
           torch.zeros(3, 4, 5, 2)), "traj"),
       Case("theta wrong size", lambda: latent.GraphLayoutVAE(5).sample_graph(
           torch.zeros(3, 9)), "theta")],
    "random_trees": int_cases(lambda n: latent.random_trees(3, n), "n_nodes", 1)
    + [Case("n_trees < 0", lambda: latent.random_trees(-1), "n_trees")],
    "make_graph_layout": int_cases(lambda t: latent.make_graph_layout(2, 4, t), "n_steps", 0)
    + int_cases(lambda n: latent.make_graph_layout(2, n), "n_nodes", 1),
    "force_directed_layout": score_cases(
        lambda p: latent.force_directed_layout(torch.zeros(3, 5, 5), p, 2), "pos")[:4]
    + int_cases(lambda t: latent.force_directed_layout(torch.zeros(3, 5, 5),
                                                        torch.zeros(3, 5, 2), t), "n_steps", 0)
    + [Case("adjacency of the wrong size", lambda: latent.force_directed_layout(
           torch.zeros(3, 4, 4), torch.zeros(3, 5, 2), 2), "adjacency"),
       Case("adjacency NaN", lambda: latent.force_directed_layout(
           NAN_S, torch.zeros(2, 4, 2), 2), "adjacency"),
       Case("k <= 0", lambda: latent.force_directed_layout(
           torch.zeros(3, 5, 5), torch.zeros(3, 5, 2), 2, k=0.0), "k")],
    "gumbel_kl": score_cases(latent.gumbel_kl, "theta"),
    "edge_precision_recall": score_cases(lambda e: latent.edge_precision_recall(e, S),
                                          "estimate", matrix=True)
    + [Case("truth of another shape", lambda: latent.edge_precision_recall(S, S[0]), "truth")],
    "make_listops": int_cases(lambda n: latent.make_listops(n), "n_examples", 0)
    + int_cases(lambda d: latent.make_listops(2, max_depth=d), "max_depth", 0)
    + int_cases(lambda a: latent.make_listops(2, max_args=a), "max_args", 1)
    + int_cases(lambda m: latent.make_listops(2, max_length=m), "max_length", 3)
    + [Case("leaf_prob > 1", lambda: latent.make_listops(2, leaf_prob=1.5), "leaf_prob"),
       Case("leaf_prob NaN", lambda: latent.make_listops(2, leaf_prob=math.nan), "leaf_prob")],
    "LatentListOpsModel": [
        Case("unknown graph", lambda: latent.LatentListOpsModel("spanning"), "graph"),
        Case("odd dim", lambda: latent.LatentListOpsModel(dim=7), "dim"),
        Case("tau 0", lambda: latent.LatentListOpsModel(tau=0.0), "tau"),
        Case("gold without heads", lambda: latent.LatentListOpsModel("gold")(
            torch.zeros(1, 4, dtype=torch.long), torch.tensor([4])), "gold heads"),
    ] + int_cases(lambda r: latent.LatentListOpsModel(n_rounds=r), "n_rounds", 0),
    "gold_arborescence": [
        Case("float heads", lambda: latent.gold_arborescence(V), "heads"),
        Case("head out of range", lambda: latent.gold_arborescence(torch.tensor([[-1, 2]])),
             "heads"),
        Case("head < -1", lambda: latent.gold_arborescence(torch.tensor([[-2, 0]])), "heads"),
    ],
    "arc_precision_recall": [
        Case("shape mismatch", lambda: latent.arc_precision_recall(S, S[0], torch.tensor([4])),
             "pred and gold"),
        Case("lengths shape", lambda: latent.arc_precision_recall(S, S, torch.tensor([4])),
             "lengths"),
    ],
}

#: public callables with no argument to validate, with the reason
NOTHING_TO_VALIDATE = {
    "registered_pairs": "no arguments",
    "support_table": "no arguments",
    "validation_enabled": "no arguments",
    "Structure": "abstract base class (subclasses are catalogued)",
    "Regularizer": "abstract base class",
    "Noise": "abstract base class",
    "SinkhornConvergenceWarning": "a warning class",
    "WilsonStepLimit": "an exception class",
    "CompletenessReport": "result container",
    "MinimalityReport": "result container",
    "CompletenessWitness": "result container",
    "MinimalityWitness": "result container",
    "IdentifyResult": "result container",
    "NonlinearICAData": "result container",
    "GraphLayoutData": "result container",
    "GraphELBO": "result container",
    "ListOpsBatch": "result container",
    "TemperatureSchedule": "abstract base class",
    "GibbsDistribution": "abstract base class (its families are catalogued)",
}



def _structure_cases(name: str) -> list[Case]:
    """A structure's cases come from its spec (tests/_specs.py): the generated scores and τ
    cases of ``example`` and the cases of its own arguments."""
    structure, event = SPECS[name].example()
    return structure_cases(structure, event) + SPECS[name].bad_inputs()


for _name in SPECS:
    assert _name not in CATALOGUE, f"{_name}: its cases belong in its spec in tests/_specs.py"
    CATALOGUE[_name] = _structure_cases(_name)

PUBLIC = _public_callables()
ALL_CASES = [(name, case) for name, cases in CATALOGUE.items() for case in cases]


def test_every_public_name_has_an_entry():
    missing = sorted(n for n in PUBLIC if n not in CATALOGUE and n not in NOTHING_TO_VALIDATE)
    assert not missing, (f"public callables without bad-input cases: {missing}; add cases to "
                         f"CATALOGUE (or a reason to NOTHING_TO_VALIDATE) in {HERE}")
    stale = sorted(n for n in (*CATALOGUE, *NOTHING_TO_VALIDATE) if n not in PUBLIC)
    assert not stale, f"entries for names that are not public (renamed?): {stale}"
    assert all(CATALOGUE[n] for n in CATALOGUE), "an entry without cases"


@pytest.mark.parametrize("name,case", ALL_CASES,
                         ids=[f"{n}: {c.label}" for n, c in ALL_CASES])
def test_bad_input_is_refused_with_a_clear_message(name, case):
    with pytest.raises(case.exc, match=case.match):
        case.call()


# --------------------------------------------------------------------------------------------
# the silent cases: accepted inputs whose results were NaN, wrong or a raw error
# --------------------------------------------------------------------------------------------

class Silent(NamedTuple):
    label: str
    call: Callable[[], Any]                 # returns the tensors to check
    check: Callable[[Any], bool]            # the behaviour (beyond "no NaN")


INF = math.inf


def _grad(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_()
    return torch.autograd.grad(fn(x).sum(), x)[0]


def _box(lo: list, hi: list) -> Box:
    return Box(torch.tensor(lo, dtype=F64), torch.tensor(hi, dtype=F64))


def _no_warning(fn: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


def _tau_grad(eval_mode: bool) -> torch.Tensor:
    layer = nn.StochasticSoftmax(generator=torch.Generator().manual_seed(0))
    layer.train(not eval_mode)
    tau = torch.tensor(0.7, dtype=F64, requires_grad=True)
    layer.tau = tau
    return torch.autograd.grad((layer(V) * torch.arange(5.0, dtype=F64)).sum(), tau)[0]


SILENT = [
    Silent("volume of a half-line box is +inf", lambda: boxes.volume(
        _box([[-INF, 0.0]], [[1.0, 1.0]]), beta=0.1, log=True), lambda v: v.item() == INF),
    Silent("hard volume of a point box at +inf is 0", lambda: boxes.volume(
        _box([[INF, INF]], [[INF, INF]])), lambda v: v.item() == 0.0),
    Silent("gumbel_side_length at ±inf bounds", lambda: boxes.gumbel_side_length(
        torch.tensor([-INF, 0.0]), torch.tensor([1.0, -INF]), 0.1),
        lambda v: v.tolist() == [INF, 0.0]),
    Silent("containment of unbounded boxes", lambda: boxes.containment_prob(
        _box([[-INF]], [[INF]]), _box([[0.0]], [[INF]])), lambda v: v.item() == 1.0),
    Silent("overlap of unbounded boxes", lambda: boxes.overlap(
        _box([[0.0]], [[INF]]), _box([[-INF]], [[INF]])),
        lambda v: abs(v.item() - 0.5) < 1e-12),
    Silent("log1m containment at β = 1e-5, β_vol = 1 (was OverflowError)",
           lambda: boxes.log1m_containment_prob(_box([[0.0]], [[1.0]]), _box([[0.2]], [[0.5]]),
                                                1e-5, 1.0), lambda v: v.item() < -1e4),
    Silent("Gumbel intersection inside the hard one", lambda: boxes.intersection(
        _box([[0.1]], [[0.7]]), _box([[0.1 + 1e-17]], [[0.7 - 1e-17]]), 0.3).lower,
        lambda v: v.item() >= 0.1),
    Silent("relaxed_topk ExpFamilyEntropy unroll at ±1e4, τ = 1e-3", lambda: _grad(
        lambda w: St.relaxed_topk(w, 2, tau=1e-3, regularizer=perturb.ExpFamilyEntropy(),
                                  backward="unroll") * torch.arange(5.0, dtype=F64),
        (2 * torch.rand(3, 5, generator=torch.Generator().manual_seed(0), dtype=F64) - 1) * 1e4),
        lambda g: bool(torch.isfinite(g).all())),
    Silent("StochasticSoftmax gradient in a tensor τ, eval mode", lambda: _tau_grad(True),
           lambda g: g.item() != 0.0),
    Silent("StochasticSoftmax gradient in a tensor τ, train mode", lambda: _tau_grad(False),
           lambda g: g.item() != 0.0),
    Silent("correlation_matrix of scores 1e30 in float32", lambda: latent.correlation_matrix(
        V.float() * 1e30, V.float() * 1e30), lambda c: bool((c.diagonal() > 0.999).all())),
    Silent("sinkhorn in float64, marginals 1/16: converged, no precision warning",
           lambda: _no_warning(lambda: St.sinkhorn(
               -torch.rand(4, 16, 16, generator=torch.Generator().manual_seed(0), dtype=F64),
               tau=0.1, a=torch.full((4, 16), 1 / 16, dtype=F64),
               b=torch.full((4, 16), 1 / 16, dtype=F64), n_iters=10000, tol=1e-5)),
           lambda p: float((p.sum(-1) - 1 / 16).abs().max()) <= 1e-5),
    Silent("perturbed with a scalar-valued function", lambda: perturb.perturbed(
        lambda u: u.amax(-1), V, n_samples=4), lambda y: y.shape == V.shape[:1]),
]


@pytest.mark.parametrize("case", SILENT, ids=[c.label for c in SILENT])
def test_silent_cases_give_the_right_answer(case):
    out = case.call()
    assert not bool(torch.isnan(out).any()), "NaN"
    assert case.check(out)
