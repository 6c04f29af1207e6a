"""Every supported pair's DEFAULT gradient against an independent reference, driven by the registry.

For each supported pair of :func:`perturb.registered_pairs` (a pair registered later is picked up
automatically and fails until it has an entry in ``REFERENCES``), the gradient of a random linear
loss ⟨C, y⟩ with ``y = regularized_argmax(w, structure, regularizer, tau)`` — default settings:
``backward="auto"``, the structure built with its default solver arguments — is taken w.r.t. the
scores w and w.r.t. a tensor temperature τ (one shared τ or one per problem) and compared with

- ``brute_force``: E_q[z] with q(z) ∝ exp(⟨w, z⟩/τ) over ``structure.enumerate(n)``,
  differentiated by autograd (ExpFamilyEntropy: A* is the conjugate of the log-partition);
- ``softmax``: the closed form softmax(w/τ), differentiated by autograd;
- ``finite_differences``: central differences of a forward solved to machine precision (the
  capped-simplex solvers and sparsemax are exact; Sinkhorn is run to tol = 1e-13).

All in float64, over random shapes (batch dims, n, k, root) and temperatures drawn by hypothesis.
The claim for Sinkhorn (default tol = 1e-6) is "accurate whenever the forward reports
convergence": an example whose default forward raises a SinkhornConvergenceWarning is rejected
(rare for τ ≥ 0.3 and unit-scale scores, see CASES); any other SinkhornConvergenceWarning (the
converged reference's) is an error. This file exists because the default implicit Sinkhorn
gradient was once 66% off while the forward reported convergence.

Finally ``relax(θ, ...)`` is checked to give exactly the gradient of
``regularized_argmax(perturb(θ, noise, generator=...), ...)`` for the same generator seed.
"""
from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, assume, given, reject, settings
from hypothesis import strategies as st

import perturb
from perturb import regularized_argmax, registered_pairs
from perturb import regularizers as regs
from perturb.structured import (
    Arborescences,
    CorrelatedKSubset,
    DAGPaths,
    KSubset,
    Permutations,
    Transport,
    SinkhornConvergenceWarning,
    SpanningTrees,
)
from perturb.structures import Simplex

DTYPE = torch.float64
PAIRS = registered_pairs()
SUPPORTED = [p for p in PAIRS if p.supported]
HERE = "tests/test_default_gradients.py"


def _ids(pairs):
    return [f"{p.structure}-{p.regularizer}" for p in pairs]


# --------------------------------------------------------------------------------------------
# the cases: how to draw a structure (default solver arguments) and its problem sizes
# --------------------------------------------------------------------------------------------

#: per structure type: (largest n, smallest τ, draw(data, n) -> structure with DEFAULT settings).
#: n is capped where brute-force enumeration (trees: n^(n−2)) or the n² finite differences
#: (Permutations) stay cheap. Sinkhorn's default (tol = 1e-6, n_iters = 1000) does not always
#: converge for unit-scale scores at τ = 0.3 (about 5% of 2 x 2 problems, 0.5% of 6 x 6 ones,
#: fewer as τ grows): such an example warns, and is rejected, since the claim under test is
#: "the default gradient is accurate whenever the default forward reports convergence".
CASES = {
    "Simplex": (8, 0.2, lambda data, n: Simplex()),
    "KSubset": (8, 0.2, lambda data, n: KSubset(data.draw(st.integers(1, n), label="k"))),
    "Permutations": (6, 0.3, lambda data, n: Permutations()),
    # n x (n + 1) plans with drawn positive masses (see _transport)
    "Transport": (5, 0.3, lambda data, n: _transport(data, n)),
    "SpanningTrees": (6, 0.2, lambda data, n: SpanningTrees()),
    "Arborescences": (6, 0.2, lambda data, n: Arborescences(
        data.draw(st.integers(0, n - 1), label="root"))),
    # n is the number of items d here; the scores have 2d − 1 entries (see _event)
    "CorrelatedKSubset": (6, 0.2, lambda data, n: CorrelatedKSubset(
        data.draw(st.integers(1, n), label="k"))),
    "DAGPaths": (7, 0.2, lambda data, n: DAGPaths()),     # 2^(n−2) paths
}
TAU_MAX = 2.0
#: hypothesis examples per pair (default 60): the file runs in 10-15 s on 2 CPU cores.
MAX_EXAMPLES = {"Permutations": 30, "Transport": 30}

#: the tightly converged twin of a default structure, for finite differences of its forward.
CONVERGED = {
    "Permutations": lambda s: Permutations(n_iters=100_000, tol=1e-13),
    "Transport": lambda s: Transport(s.a, s.b, n_iters=100_000, tol=1e-13),
}


def _transport(data, n):
    """Transport(a, b) with default solver settings: masses in [0.2, 1.2), b rescaled to Σa."""
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32 - 1), label="masses"))
    a = 0.2 + torch.rand(n, dtype=DTYPE, generator=gen)
    b = 0.2 + torch.rand(n + 1, dtype=DTYPE, generator=gen)
    return Transport(a, b * a.sum() / b.sum())


def _case(name):
    if name not in CASES:
        pytest.fail(f"no default-gradient case for structure {name!r}: add one to CASES in {HERE}")
    return CASES[name]


def _event(structure, n):
    if isinstance(structure, CorrelatedKSubset):
        return (2 * n - 1,)                           # d = n unary and n − 1 pairwise scores
    if isinstance(structure, Transport):
        return structure.sizes                        # (n, n + 1)
    return (n,) if structure.event_dim == 1 else (n, n)


def _draw_problem(data, name):
    """(structure, w, C, τ) with τ a tensor: 0-dim (shared) or one per problem."""
    n_max, tau_min, make = _case(name)
    n = data.draw(st.integers(2, n_max), label="n")
    structure = make(data, n)
    batch = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2), label="batch"))
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    gen = torch.Generator().manual_seed(seed)
    event = _event(structure, n)
    w = torch.randn(*batch, *event, dtype=DTYPE, generator=gen)
    c = torch.randn(*batch, *event, dtype=DTYPE, generator=gen)
    if batch and data.draw(st.booleans(), label="tau per problem"):
        tau = tau_min + (TAU_MAX - tau_min) * torch.rand(batch, dtype=DTYPE, generator=gen)
    else:
        tau = torch.tensor(data.draw(st.floats(tau_min, TAU_MAX), label="tau"), dtype=DTYPE)
    return structure, w, c, tau


# --------------------------------------------------------------------------------------------
# the references: each returns (∂L/∂w, ∂L/∂τ) for L = Σ C ⊙ y, τ of the shape it was given
# --------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _vertices(structure, n):
    return structure.enumerate(n, dtype=DTYPE)


def _brute_force(structure, regularizer, w, c, tau):
    """E_q[z], q(z) ∝ exp(⟨w, z⟩/τ) by enumeration; autograd. SpanningTrees pair each
    undirected edge once with the symmetric part (w + wᵀ)/2, i.e. ⟨w, z⟩/2 for the symmetric
    0/1 matrix z (documented in spanning_tree_marginals)."""
    n = w.shape[-1]
    z = _vertices(structure, n)                                    # (V, *event)
    ed = structure.event_dim
    w = w.detach().requires_grad_()
    tau = tau.detach().requires_grad_()
    t = tau.reshape(*tau.shape, *([1] * ed))
    scores = ((w / t).unsqueeze(-ed - 1) * z).flatten(-ed).sum(-1)  # (*batch, V)
    if isinstance(structure, SpanningTrees):
        scores = scores / 2
    q = torch.softmax(scores, dim=-1)
    mu = (q.reshape(*q.shape, *([1] * ed)) * z).sum(-ed - 1)
    return torch.autograd.grad((c * mu).sum(), (w, tau))


def _softmax(structure, regularizer, w, c, tau):
    """Entropy on the simplex: y = softmax(w/τ) in closed form; autograd."""
    w = w.detach().requires_grad_()
    tau = tau.detach().requires_grad_()
    y = torch.softmax(w / tau.unsqueeze(-1), dim=-1)
    return torch.autograd.grad((c * y).sum(), (w, tau))


#: relative FD step: h = δ·τ on w and on τ (the solution depends on w/τ). Truncation O(δ²) =
#: 1e-10, rounding O(ε_forward/δ) ≈ 1e-11 for the exact forwards, ≤ 1e-13/1e-5 = 1e-8 for
#: Sinkhorn at tol 1e-13 (on typical cases the error is ~1e-10 against the analytic gradients;
#: δ = 1e-4 gives 3e-8 on ∂/∂τ by truncation, δ = 1e-6 2e-9 by rounding).
FD_STEP = 1e-5


def _finite_differences(structure, regularizer, w, c, tau):
    """Central differences of L_b = Σ_event C ⊙ y(w, τ) per problem b, with the forward of the
    tightly converged twin of ``structure``. Problems are independent, so one entry of the event
    (resp. τ) is stepped in every problem at once: 2·(|event| + 1) batched solves. The capped
    solvers are piecewise smooth (entries clipped at 0 or 1): an example whose clipped set
    changes within the stencil is rejected (the derivative there is one-sided)."""
    converged = CONVERGED.get(type(structure).__name__, lambda s: s)(structure)
    ed = structure.event_dim
    nb = w.ndim - ed
    batch = w.shape[:nb]
    tau_b = tau.expand(batch)
    h_tau = FD_STEP * tau_b
    h_w = h_tau.reshape(*batch, *([1] * ed))
    base = None

    def loss(w_, t_):
        nonlocal base
        y = regularized_argmax(w_, converged, regularizer, t_)
        clipped = (y <= 1e-12) | (y >= 1 - 1e-12)   # rounding of a clipped entry: not a kink
        if base is None:
            base = clipped
        assume(torch.equal(clipped, base))        # reject stencils that straddle a kink
        return (c * y).flatten(nb).sum(-1)           # (*batch)

    with torch.no_grad():
        loss(w, tau_b)
        g_w = torch.zeros_like(w)
        for flat in range(math.prod(w.shape[nb:])):
            idx = (...,) + tuple(int(i) for i in torch.unravel_index(torch.tensor(flat),
                                                                      w.shape[nb:]))
            e = torch.zeros_like(w)
            e[idx] = 1.0
            g_w[idx] = (loss(w + h_w * e, tau_b) - loss(w - h_w * e, tau_b)) / (2 * h_tau)
        g_tau = (loss(w, tau_b + h_tau) - loss(w, tau_b - h_tau)) / (2 * h_tau)
    return g_w, g_tau.sum_to_size(tau.shape)


#: A tolerance (rtol, atol) means max|g − g_ref| ≤ rtol · max|g_ref| + atol · S, with S the
#: natural scale of the gradient: max|C|/τ for ∂L/∂w (y depends on w/τ and is 1/τ-Lipschitz)
#: and max|C|·max|w|/τ² for ∂L/∂τ (smallest τ). The atol term covers errors that are absolute
#: in those units (rounding divided by an FD step, Sinkhorn's tol) where the reference itself is
#: small: near a vertex, or ∂L/∂τ = −⟨∂L/∂w, w⟩/τ when the sum cancels.
#: Measured: the largest error / tolerance over 500 hypothesis examples per pair.
EXACT = (1e-8, 1e-11)   # both sides exact up to float64 rounding (used ≤ 0.003)
FD = (1e-6, 1e-9)       # 100x the FD errors: truncation δ² = 1e-10 relative, rounding
                        # ~n·ε/δ ≈ 1e-10·S (FD_STEP) (used ≤ 0.009)
#: Sinkhorn's default stops at marginal error ≤ tol = 1e-6; its implicit gradient is exact for
#: the plan it returns, which is O(tol) from the converged one (times 1/λ₂ of the Schur
#: complement): atol = 10·tol, and rtol 2e-4 (relative errors measured ≤ 1.4e-6 on ∂L/∂w here,
#: ≤ 5e-5 in the Sinkhorn tests; 5 = 500% with the implicit backward built on the target
#: marginals instead of the plan's, the bug this file was written for) (used ≤ 0.007).
SINKHORN_DEFAULT = (2e-4, 1e-5)

#: (structure, regularizer) -> (reference, (rtol, atol)). Every supported pair needs one.
REFERENCES = {
    ("Simplex", "Entropy"): (_softmax, EXACT),
    ("Simplex", "ExpFamilyEntropy"): (_brute_force, EXACT),
    ("Simplex", "SquaredNorm"): (_finite_differences, FD),
    ("KSubset", "Entropy"): (_finite_differences, FD),
    ("KSubset", "SquaredNorm"): (_finite_differences, FD),
    ("KSubset", "BinaryEntropy"): (_finite_differences, FD),
    ("KSubset", "ExpFamilyEntropy"): (_brute_force, EXACT),
    ("Permutations", "Entropy"): (_finite_differences, SINKHORN_DEFAULT),
    ("Transport", "Entropy"): (_finite_differences, SINKHORN_DEFAULT),
    ("SpanningTrees", "ExpFamilyEntropy"): (_brute_force, EXACT),
    ("Arborescences", "ExpFamilyEntropy"): (_brute_force, EXACT),
    ("CorrelatedKSubset", "ExpFamilyEntropy"): (_brute_force, EXACT),
    ("DAGPaths", "ExpFamilyEntropy"): (_brute_force, EXACT),
}


def _reference(pair):
    key = (pair.structure, pair.regularizer)
    if key not in REFERENCES:
        pytest.fail(f"no reference for the default gradient of the supported pair {key}: add "
                    f"one to REFERENCES in {HERE} (brute force over structure.enumerate, a "
                    f"closed form, or finite differences of a converged forward)")
    return REFERENCES[key]


def _tolerance_used(got, want, tol, natural_scale):
    """max|g − g_ref| / (rtol · max|g_ref| + atol · S): ≤ 1 passes."""
    rtol, atol = tol
    return float((got - want).abs().max()) / (rtol * float(want.abs().max()) + atol * natural_scale)


def _assert_close(got, want, tol, natural_scale, what):
    used = _tolerance_used(got, want, tol, natural_scale)
    assert used <= 1, (
        f"{what}: max error {float((got - want).abs().max()):.3g} is {used:.3g} x the tolerance "
        f"rtol={tol[0]:g} x max|reference| {float(want.abs().max()):.3g} + atol={tol[1]:g} x "
        f"natural scale {natural_scale:.3g}\ngot\n{got}\nreference\n{want}")


@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
def test_every_supported_pair_has_a_reference(pair):
    _case(pair.structure)
    _reference(pair)


@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
def test_default_gradient_matches_reference(pair):
    reference, tol = _reference(pair)
    regularizer = getattr(regs, pair.regularizer)()

    @settings(max_examples=MAX_EXAMPLES.get(pair.structure, 60), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(data=st.data())
    def check(data):
        structure, w, c, tau = _draw_problem(data, pair.structure)
        w.requires_grad_()
        tau.requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error", SinkhornConvergenceWarning)
            try:
                y = regularized_argmax(w, structure, regularizer, tau)   # backward="auto"
            except SinkhornConvergenceWarning:
                reject()   # the default forward says it is inaccurate: outside the claim
            g_w, g_tau = torch.autograd.grad((c * y).sum(), (w, tau))
            r_w, r_tau = reference(structure, regularizer, w.detach(), c, tau.detach())
        what = f"{structure!r}, {regularizer!r}, w {tuple(w.shape)}, tau {tau.tolist()}"
        s_w = float(c.abs().max() / tau.detach().min())
        s_tau = s_w * float(w.detach().abs().max() / tau.detach().min())
        _assert_close(g_w, r_w, tol, s_w, f"dL/dw ({what})")
        _assert_close(g_tau, r_tau, tol, s_tau, f"dL/dtau ({what})")

    check()


# --------------------------------------------------------------------------------------------
# relax(θ) is regularized_argmax(perturb(θ)) with the same noise: same value, same gradients
# --------------------------------------------------------------------------------------------

STRUCTURES = sorted({p.structure for p in SUPPORTED})
NOISES = [perturb.Gumbel(), perturb.Normal(), perturb.Logistic()]


@pytest.mark.parametrize("name", STRUCTURES)
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_relax_gradient_is_perturb_then_regularized_argmax(name, data):
    """One pair per structure: its default regularizer, default solver settings. Both paths run
    the same computation, converged or not: Sinkhorn's convergence warnings are beside the point."""
    structure, theta, c, tau = _draw_problem(data, name)
    noise = data.draw(st.sampled_from(NOISES), label="noise")
    hard = data.draw(st.booleans(), label="hard")
    n_samples = data.draw(st.sampled_from([None, 2]), label="n_samples")
    seed = data.draw(st.integers(0, 2**32 - 1), label="noise seed")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SinkhornConvergenceWarning)
        for path in ("relax", "composed"):
            th = theta.clone().requires_grad_()
            t = tau.clone().requires_grad_()
            gen = torch.Generator().manual_seed(seed)
            if path == "relax":
                y = perturb.relax(th, structure, noise, tau=t, hard=hard, n_samples=n_samples,
                                  generator=gen)
                value = y.detach()
            else:
                u = perturb.perturb(th, noise, n_samples=n_samples, generator=gen)
                y = regularized_argmax(u, structure, None, t)
                value = perturb.argmax(u, structure) if hard else y.detach()
            out[path] = (value, *torch.autograd.grad((c * y).sum(), (th, t)))
    # Equal up to rounding, not bit for bit: the batched Cholesky solves of Sinkhorn's Newton
    # polish and implicit backward (MKL) can differ in the last ulp between two calls on
    # identical inputs (measured ≤ 5e-15 relative). Different noise would differ by O(1).
    for got, want, what in zip(out["relax"], out["composed"], ("value", "dL/dtheta", "dL/dtau")):
        err = float((got - want).abs().max())
        assert err <= 1e-10 * float(want.abs().max()), f"{what}: max difference {err:.3g}"
