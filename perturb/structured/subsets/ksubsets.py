r"""k-subsets: the structure, exact top-k and its relaxations on the capped simplex.

Z = {z ∈ {0,1}^n : Σ z = k}; conv Z is the capped simplex C_k = {x ∈ [0,1]^n : Σ x = k}.
The exact argmax is top-k; the relaxations solve argmax_{x ∈ C_k} ⟨w, x⟩ − τ f(x) (see
:mod:`perturb.core`). With y = w/τ the KKT conditions give, for a scalar shift ν (the multiplier
of Σx = k),

=====================  =====================================  ===================================
regularizer f          solution                               solver
=====================  =====================================  ===================================
``SquaredNorm``        x = clip(y − ν, 0, 1)                  safeguarded Newton/bisection on ν
``Entropy``            x = min(1, exp(y − ν − 1))             exact, sort + cumulative logsumexp
``BinaryEntropy``      x = σ(y − ν)                           safeguarded Newton/bisection on ν
``ExpFamilyEntropy``   x = ∇ log e_k(e^y) (marginals)          DP, :mod:`.dp`         
=====================  =====================================  ===================================

In the first three ν solves Σ_i φ(y_i − ν) = k for an increasing link φ, and the Jacobian has
one common form: with weights a = 1[0<x<1] (SquaredNorm), a = x·1[x<1] (Entropy) and
a = x(1 − x) (BinaryEntropy),

    ∂x/∂y = diag(a) − a aᵀ / Σa,    so the vector–Jacobian product is a ⊙ (ḡ − ⟨a, ḡ⟩/Σa)

(differentiate φ(y_i − ν(y)) and Σφ = k; for the two smooth links φ' = a). The factor 1/τ comes
from y = w/τ through autograd, which also differentiates a tensor τ.

References: Paulus et al. (2020), "Gradient estimation with stochastic softmax tricks",
arXiv:2006.08063, §4 and App. C; Wang & Lu (2015), "Projection onto the capped simplex",
arXiv:1503.01002; Amos, Koltun & Kolter (2019), "The limited multi-label projection layer",
arXiv:1906.08707 (the binary-entropy form).
"""
from __future__ import annotations

import itertools
import math

import torch

from perturb._vmap import fold_vmap
from perturb._validation import check_int, scale_by_tau
from perturb.backward import implicit_root
from perturb.regularizers import (
    BinaryEntropy,
    Entropy,
    ExpFamilyEntropy,
    Regularizer,
    SquaredNorm,
)
from perturb.core import regularized_argmax
from perturb.structured.subsets._checks import check_k
from perturb.structured.subsets.dp import (
    MARGINAL_BACKWARDS,
    _marginals_scaled,
    _marginals_unrolled,
)
from perturb.structures import Structure, register_solver

__all__ = ["KSubset", "topk", "relaxed_topk"]

_KINDS = ("euclidean", "entropy", "sigmoid")


class KSubset(Structure):
    """k-subsets of n items as 0/1 vectors: Z = {z ∈ {0,1}^n : Σz = k}.

    conv Z is the capped simplex {x ∈ [0,1]^n : Σx = k}. The default regularizer is
    :class:`~perturb.ExpFamilyEntropy` (marginals of q(z) ∝ exp⟨w, z⟩).

    Args:
        k: subset size, ≥ 1 (checked against n = ``w.shape[-1]`` when scores arrive).

    Shape: scores ``(*batch, n)``; ``argmax`` returns a 0/1 ``(*batch, n)`` with k ones.

    Example::

        >>> KSubset(2).argmax(torch.tensor([0.1, 3.0, -1.0, 2.0]))
        tensor([0., 1., 0., 1.])
    """

    event_dim = 1

    def __init__(self, k: int):
        self.k = check_int(k, "k", low=1)

    def validate(self, w: torch.Tensor, name: str = "w") -> None:
        """Scores must be floating, finite, at least 1-D, and have n ≥ k entries."""
        super().validate(w, name)
        check_k(self.k, w.shape[-1])

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        """Top-k indicator; ties go to the lowest index (stable sort)."""
        return _topk_indicator(w, self.k)

    def check(self, y: torch.Tensor) -> torch.Tensor:
        binary = ((y == 0) | (y == 1)).all(dim=-1)
        return binary & (y.sum(dim=-1) == self.k)

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """All C(n, k) indicators, in lexicographic order of the index sets: ``(C(n,k), n)``."""
        n = check_int(n, "n", low=1)
        check_k(self.k, n)
        combos = list(itertools.combinations(range(n), self.k))
        out = torch.zeros(len(combos), n, dtype=dtype or torch.get_default_dtype(), device=device)
        index = torch.tensor(combos, dtype=torch.long, device=device)
        return out.scatter_(1, index, 1.0)

    def default_regularizer(self) -> Regularizer:
        return ExpFamilyEntropy()

    def __repr__(self) -> str:
        return f"KSubset(k={self.k})"


def _topk_indicator(w: torch.Tensor, k: int) -> torch.Tensor:
    index = torch.sort(w, dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.zeros_like(w).scatter_(-1, index, 1.0)


def topk(w: torch.Tensor, k: int) -> torch.Tensor:
    """The exact top-k indicator argmax_{z ∈ Z} ⟨w, z⟩ (no gradient: piecewise constant).

    Ties are broken deterministically in favour of the lowest index (a stable descending sort),
    unlike ``torch.topk`` whose order among equal values is unspecified.

    Args:
        w: scores.
        k: number of ones, 1 ≤ k ≤ n.

    Shape: ``(*batch, n)`` -> ``(*batch, n)``, dtype and device of ``w``.

    Raises:
        ValueError: k outside [1, n], non-floating or non-finite ``w``.

    Example::

        >>> topk(torch.tensor([1.0, 5.0, 5.0, 0.0]), 1)
        tensor([0., 1., 0., 0.])

    See Also:
        - :func:`perturb.structured.relaxed_topk`: its relaxation
        - :func:`perturb.structured.sample_ksubset`: exact k-subset samples
    """
    structure = KSubset(k)
    structure.validate(w)
    with torch.no_grad():
        return _topk_indicator(w.detach(), k)


# --------------------------------------------------------------------------------------------
# capped-simplex solvers: x = φ(y − ν) with Σx = k
# --------------------------------------------------------------------------------------------

def _link(t: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """φ(t) and φ'(t) for the three links (clip, min(1, e^{t−1}), sigmoid)."""
    if kind == "euclidean":
        return t.clamp(0, 1), ((t > 0) & (t < 1)).to(t.dtype)
    if kind == "entropy":
        e = torch.exp(torch.clamp(t - 1, max=0))
        return e, e * (t < 1).to(t.dtype)
    s = torch.sigmoid(t)
    return s, s * (1 - s)


def _capped_root(y: torch.Tensor, k: int, kind: str, max_iter: int = 200) -> torch.Tensor:
    """ν with Σ φ(y − ν) = k, by Newton steps safeguarded by a bisection bracket.

    Brackets (y_(k) is the k-th largest entry): clip: [y_(k) − 1, y_(k)]; entropy:
    [y_(k) − 1, y_(k) + max(log(n−k+1) − 1, 0)]; sigmoid: [y_(k+1) − log k, y_(k) + log(n−k)].
    A Newton step is taken when it lands inside the bracket and the previous step at least
    halved the residual; otherwise the bracket is bisected. Stops when the residual is at
    rounding level, the Newton step or the bracket is below a few ulps of ν. On the
    piecewise-linear clip a Newton step in the right piece is exact. Requires k < n.
    Shape: ``(*batch, n) -> (*batch, 1)``.
    """
    n = y.shape[-1]
    top = torch.topk(y, k + 1, dim=-1).values
    yk = top[..., k - 1:k]
    if kind == "euclidean":
        lo, hi = yk - 1, yk.clone()
    elif kind == "entropy":
        lo, hi = yk - 1, yk + max(math.log(n - k + 1) - 1, 0.0)
    else:
        lo, hi = top[..., k:k + 1] - math.log(k), yk + math.log(n - k)
    eps = torch.finfo(y.dtype).eps
    # the residual Σφ − k is accumulated in float64: a float32 sum of n terms is only good to
    # ~log2(n) ε k, which would leave the returned x off its constraint by that much
    acc = torch.float64
    tol = 2 * eps * k * (max(1.0, math.log2(n)) if y.dtype == torch.float64 else 1.0)
    nu = yk - 0.5 if kind == "euclidean" else 0.5 * (lo + hi)
    h_prev = torch.full_like(nu, math.inf)
    for _ in range(max_iter):
        v, d = _link(y - nu, kind)
        h = (v.sum(-1, keepdim=True, dtype=acc) - k).to(y.dtype)
        slope = d.sum(-1, keepdim=True)
        lo = torch.where(h > 0, nu, lo)
        hi = torch.where(h < 0, nu, hi)
        step = h / torch.where(slope > 0, slope, torch.ones_like(slope))
        ulp = 4 * eps * torch.maximum(nu.abs(), torch.ones_like(nu))
        newton = nu + step
        ok = (slope > 0) & (newton >= lo) & (newton <= hi) & (h.abs() <= 0.5 * h_prev.abs())
        done = (h.abs() <= tol) | (hi - lo <= ulp) | (ok & (step.abs() <= ulp))
        if bool(done.all()):
            break
        nu = torch.where(done, nu, torch.where(ok, newton, 0.5 * (lo + hi)))
        h_prev = h
    return nu


def _entropy_capped(y: torch.Tensor, k: int) -> torch.Tensor:
    """Exact argmax_{x ∈ C_k} ⟨y, x⟩ − Σ x log x by sorting.

    If the m largest entries are clipped at 1, the rest is x_i = (k − m) e^{y_i − T_m} with
    T_m = logsumexp of all but the m largest; m is the smallest value in {0..k−1} for which the
    largest unclipped entry stays ≤ 1, i.e. s_m + log(k − m) ≤ T_m (s sorted descending).
    O(n log n); log space throughout. Shape: ``(*batch, n)`` -> same.
    """
    s = torch.sort(y, dim=-1, descending=True).values
    tail = torch.logcumsumexp(s.flip(-1), dim=-1).flip(-1)[..., :k]          # T_m, m < k
    m = torch.arange(k, device=y.device)
    c = torch.log((k - m).to(y.dtype))
    ok = s[..., :k] + c <= tail
    first = torch.argmax(ok.to(torch.int8), dim=-1, keepdim=True)            # smallest valid m
    t_m = torch.gather(tail, -1, first)
    c_m = torch.gather(c.expand_as(tail), -1, first)
    return torch.exp(torch.clamp(y - t_m + c_m, max=0))


def _capped_forward(y: torch.Tensor, k: int, kind: str) -> torch.Tensor:
    """The solution x for scores y (no autograd). The scores are first shifted by their k-th
    largest entry (x is invariant to a common shift), so that the entries near the threshold
    are small numbers that float32 resolves even when |y| ~ 1e7."""
    y = y - torch.topk(y, k, dim=-1).values[..., -1:]
    if kind == "entropy":
        # an entry ≥ log n above the k-th largest is clipped at 1 (otherwise the n − k + 1
        # entries from the k-th on would each hold < 1/n and the sum fall short of k), so
        # clamping there leaves x unchanged and keeps T_m − s_m resolvable in float32
        return _entropy_capped(y.clamp(max=math.log(y.shape[-1]) + 1.0), k)
    nu = _capped_root(y, k, kind)
    return _link(y - nu, kind)[0]


def _capped_weights(z: torch.Tensor, kind: str) -> torch.Tensor:
    """a with ∂x/∂y = diag(a) − a aᵀ/Σa (module docstring)."""
    if kind == "euclidean":
        return ((z > 0) & (z < 1)).to(z.dtype)
    if kind == "entropy":
        return z * (z < 1).to(z.dtype)
    return z * (1 - z)


def _capped_vjp(z: torch.Tensor, g: torch.Tensor, kind: str) -> torch.Tensor:
    """ḡ_y = a ⊙ (ḡ − ⟨a, ḡ⟩/Σa), zero where Σa = 0 (the solution is a vertex). Pure."""
    a = _capped_weights(z, kind)
    den = a.sum(-1, keepdim=True)
    num = (a * g).sum(-1, keepdim=True)
    mean = num / torch.where(den > 0, den, torch.ones_like(den))
    return a * (g - mean)


class _CappedSimplex(torch.autograd.Function):
    r"""x = φ(y − ν(y)) on the capped simplex; backward ḡ ↦ a ⊙ (ḡ − ⟨a,ḡ⟩/Σa) (symmetric J).

    Inputs: y ``(*batch, n)``, k, kind ∈ {"euclidean", "entropy", "sigmoid"}.
    """

    @staticmethod
    def forward(y, k, kind):
        return _capped_forward(y, k, kind)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, _, kind = inputs
        ctx.kind = kind
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        (z,) = ctx.saved_tensors
        return _capped_vjp(z, g, ctx.kind), None, None

    @staticmethod
    def vmap(info, in_dims, *args):
        # the forward iterates to convergence (host reads): the vmapped dim is folded into the
        # batch
        return fold_vmap(_CappedSimplex.apply, info, in_dims, args, expand=(0,))


def _capped_optimality(kind: str, k: int):
    """F(x, y) = 0 at the solution, for :func:`perturb.backward.implicit_root`.

    Free entries (a > 0): ψ(x_i) − y_i − mean_free(ψ(x) − y) + (Σx − k), with ψ = φ⁻¹
    (identity, log + 1, logit): equal shifts −ν and the sum constraint. Clipped entries:
    x_i − (its bound). The free set is read off the solution and held fixed.
    """
    def optimality(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x0 = x.detach()
        free = _capped_weights(x0, kind) > 0
        safe = torch.where(free, x, torch.full_like(x, 0.5))
        if kind == "euclidean":
            psi = safe
        elif kind == "entropy":
            psi = torch.log(safe) + 1
        else:
            psi = torch.logit(safe)
        r = torch.where(free, psi - y, torch.zeros_like(x))
        count = free.sum(-1, keepdim=True).clamp_min(1).to(x.dtype)
        shift = r.sum(-1, keepdim=True) / count
        bound = (x0 >= 0.5).to(x.dtype)
        return torch.where(free, r - shift + (x.sum(-1, keepdim=True) - k), x - bound)

    return optimality


def _solve_capped(w: torch.Tensor, k: int, tau, kind: str, backward: str) -> torch.Tensor:
    y = scale_by_tau(w, tau, 1)
    if k == y.shape[-1]:
        return y * 0 + 1                       # conv Z is the single point 1 (zero Jacobian)
    if backward == "implicit":
        with torch.no_grad():
            x = _capped_forward(y.detach(), k, kind)
        return implicit_root(_capped_optimality(kind, k), x, y, event_dim=1)
    return _CappedSimplex.apply(y, k, kind)


@register_solver(KSubset, SquaredNorm, backward=("analytic", "implicit"),
                 description="Euclidean projection onto the capped simplex (Newton/bisection)")
def _solve_squared_norm(w, structure, regularizer, tau, backward):
    return _solve_capped(w, structure.k, tau, "euclidean", backward)


@register_solver(KSubset, Entropy, backward=("analytic", "implicit"),
                 description="min(1, exp(w/τ − ν − 1)) (exact, sort + logcumsumexp)")
def _solve_entropy(w, structure, regularizer, tau, backward):
    return _solve_capped(w, structure.k, tau, "entropy", backward)


@register_solver(KSubset, BinaryEntropy, backward=("analytic", "implicit"),
                 description="σ(w/τ − ν) (Newton/bisection on ν)")
def _solve_binary_entropy(w, structure, regularizer, tau, backward):
    return _solve_capped(w, structure.k, tau, "sigmoid", backward)


@register_solver(KSubset, ExpFamilyEntropy, backward=MARGINAL_BACKWARDS,
                 description="k-subset marginals (log-space DP over elementary symmetric "
                             "polynomials)")
def _solve_exp_family(w, structure, regularizer, tau, backward):
    y = scale_by_tau(w, tau, 1)
    if backward == "unroll":
        return _marginals_unrolled(y, structure.k)
    return _marginals_scaled(y, structure.k)


def relaxed_topk(w: torch.Tensor, k: int, tau: float | torch.Tensor = 1.0,
                 regularizer: Regularizer | None = None, backward: str = "auto") -> torch.Tensor:
    r"""A relaxed top-k: argmax_{x ∈ C_k} ⟨w, x⟩ − τ f(x) on the capped simplex.

    ``regularized_argmax(w, KSubset(k), regularizer, tau, backward)``. For a stochastic version
    perturb first: ``relax(theta, KSubset(k), noise=Gumbel(), ...)`` (``hard=True`` gives the
    straight-through top-k).

    Args:
        w: scores.
        k: subset size, 1 ≤ k ≤ n.
        tau: temperature τ > 0 (float, or tensor broadcastable to ``(*batch)``); τ → 0 gives top-k.
        regularizer: ``ExpFamilyEntropy()`` (default; marginals of q(z) ∝ e^{⟨w,z⟩/τ}),
            ``Entropy()``, ``BinaryEntropy()`` or ``SquaredNorm()`` (module table).
        backward: ``"auto"``, ``"analytic"``, ``"implicit"`` (Entropy, BinaryEntropy,
            SquaredNorm: generic implicit differentiation, dense O(n³), a cross-check),
            ``"unroll"`` (ExpFamilyEntropy: autograd through the DP) or ``"finite_difference"``.

    Shape: ``(*batch, n)`` -> ``(*batch, n)``; entries in [0, 1] summing to k.

    Raises:
        ValueError: k outside [1, n], τ ≤ 0, NaN/inf or integer scores, unsupported ``backward``.

    Example::

        >>> w = torch.tensor([3.0, 1.0, 2.0, -1.0], requires_grad=True)
        >>> x = relaxed_topk(w, k=2, tau=0.1, regularizer=SquaredNorm())
        >>> x
        tensor([1., 0., 1., 0.], grad_fn=<_CappedSimplexBackward>)

    See Also:
        - :func:`perturb.structured.topk`: the exact argmax
        - :func:`perturb.structured.ksubset_marginals`: the k-subset marginals
        - :class:`perturb.structured.CorrelatedKSubset`: k-subsets with correlated blocks
    """
    return regularized_argmax(w, KSubset(k), regularizer, tau, backward)
