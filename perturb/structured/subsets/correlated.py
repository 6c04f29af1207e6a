r"""Correlated k-subsets: k of d items with scores for choosing adjacent items together.

Z = {z ∈ {0,1}^{2d−1} : Σ_{i≤d} z_i = k, z_{d+j} = z_j z_{j+1} for j = 1..d−1}
(Paulus et al. 2020, §4 "correlated k-subsets"). The scores θ ∈ R^{2d−1} hold d unary scores
a = θ_{1..d} and d − 1 pairwise scores b = θ_{d+1..2d−1} of the adjacent pairs, so

    ⟨θ, z⟩ = Σ_i a_i z_i + Σ_j b_j z_j z_{j+1}.

With y = θ/τ the Gibbs distribution is q(z | y) = exp(⟨y, z⟩ − A(y)),
A(y) = log Σ_{z∈Z} e^{⟨y,z⟩}, and its marginals μ = ∇A(y) = E_q[z] are the regularized argmax with
f = A* (:class:`perturb.ExpFamilyEntropy`): μ_i = P(i chosen), μ_{d+j} = P(j and j+1 chosen).

**Block tables (a semiring matrix product in log depth).** A block of consecutive positions
l..r has a table T[s, t, c] = (⊕ over the block's configurations with z_{l−1} = s, z_r = t and
c items chosen in the block) of the block's score, including the pair term b_{l−1} z_{l−1} z_l
(z_0 = 0: nothing precedes the first item). A single position i is the leaf
T[s, 0, 0] = 0, T[s, 1, 1] = a_i + s·b_{i−1}, all else "−∞" (the empty sum). Two adjacent blocks
merge by

    T_{LR}[s, u, c] = ⊕_{t, j} T_L[s, t, j] ⊗ T_R[t, u, c − j],     c ≤ k,

i.e. the product of 2 × 2 matrices whose entries are count polynomials truncated at degree k.
Blocks merge pairwise, ⌈log₂ d⌉ levels (an odd block count gets the identity block appended),
each level one batched tensor op. ⊕/⊗ is (logsumexp, +) for A and (max, +) for the argmax;
A(y) = logsumexp_u T_root[0, u, k]. A table has min(k, block size) + 1 counts, so the work is
O(dk) (times the 8 state combinations) and the temporaries O(B·d·k).

**Top-down pass** (marginals, argmax, sampling). Given a node's (s, u, c), the split into
(t, j) (its left child gets (s, t, j), its right child (t, u, c − j)) has probability
exp(T_L[s,t,j] + T_R[t,u,c−j] − T[s,u,c]). Starting from the root (s = 0, c = k, u ~ its
softmax),

- the **marginals** propagate the probability of each node state down the tree, each split
  normalised by a softmax over (t, j): the mass, and with it Σ_{i≤d} μ_i = k, is conserved level
  by level up to rounding, whatever the magnitude of the scores (log-space tables of 1e10 are
  fine: only differences within a split matter);
- the **argmax** takes the best split of the (max, +) tables (ties: the first (t, j) in
  row-major order, deterministic);
- **sampling** draws the split by Gumbel-max: the product of the splits telescopes to q(z), so
  samples are exact (this is forward-filtering backward-sampling on the tree, in ⌈log₂ d⌉ steps
  for all samples at once).

**Backward modes** (of the marginals, as the solver registered for
(CorrelatedKSubset, ExpFamilyEntropy)):

- ``"analytic"`` (default): the Jacobian of μ is ∇²A(y) = Cov_q(z), symmetric, so the VJP is
  the directional derivative of μ along ḡ, computed by the tangents of the inside and top-down
  passes with the split weights the forward saved (one pass up, one down, the same kernels;
  :mod:`perturb.structured.subsets._blocks`). Differentiable once.
- ``"unroll"``: autograd through the inside and top-down passes (saves every table;
  differentiable to every order).
- ``"finite_difference"``: the generic wrapper of the core.

:func:`correlated_topk_log_partition`'s backward returns ḡ·μ with the analytic marginals (so A
is twice differentiable).

Numerics: "−∞" is a finite stand-in (−max/16 of the dtype, clamped after each merge) so that
gradients of impossible states are 0, never NaN; scores of ±1e4 at τ = 1e-3 give finite
marginals on the polytope and finite gradients. The analytic path's split weights of impossible
states are ≤ e¹⁰·tiny relative (the exponents are floored so that exp stays normal and fast:
:mod:`perturb.structured.subsets._blocks`), far below rounding. Half-precision inputs are
computed in float32.

References: Paulus, Choi, Tarlow, Krause & Maddison (2020), "Gradient estimation with stochastic
softmax tricks", arXiv:2006.08063, §4 and App. C (correlated top-k; BeerAdvocate experiments).
"""
from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F

from perturb._autograd import once_differentiable
from perturb._deprecation import old_sampler_order
from perturb._precision import full_precision
from perturb._validation import check_int, check_scores, check_tau, scale_by_tau
from perturb.regularizers import ExpFamilyEntropy, Regularizer
from perturb.structures import Structure, register_solver
from perturb.structured.subsets._blocks import (
    _down,
    _extract,
    _marginals_from_levels,
    _marginals_jvp,
    _neg,
    _pairs,
    _prepare,
    _root_logits,
    _weighted_inside,
)

__all__ = ["CorrelatedKSubset", "correlated_topk_argmax", "correlated_topk_log_partition",
           "correlated_topk_marginals", "sample_correlated_topk"]


# --------------------------------------------------------------------------------------------
# argument handling
# --------------------------------------------------------------------------------------------

def _num_items(n: int, name: str = "w") -> int:
    """d from the event size n = 2d − 1 (ValueError when n is even)."""
    if n % 2 == 0:
        raise ValueError(f"{name} must have an odd last dim n = 2d − 1 (d unary scores, then "
                         f"d − 1 scores of the adjacent pairs), got n = {n}")
    return (n + 1) // 2


def _check_k(k: int, d: int) -> int:
    k = check_int(k, "k")
    if not 1 <= k <= d:
        raise ValueError(f"k must satisfy 1 <= k <= d, got k={k} and d={d} (the number of items: "
                         f"the last dim of the scores is 2d − 1)")
    return k


def _check(w: torch.Tensor, k: int, name: str = "w") -> tuple[int, int]:
    """Validate scores ``(*batch, 2d − 1)`` and k; returns (d, k)."""
    check_scores(w, name, min_ndim=1)
    d = _num_items(w.shape[-1], name)
    return d, _check_k(k, d)


def _decode(levels: list[torch.Tensor], d: int, k: int, n_samples: int,
            generator: torch.Generator | None, sample: bool) -> torch.Tensor:
    """Top-down choice of every split: argmax (``sample=False``) or Gumbel-max sampling.

    Returns 0/1 ``(n_samples, B, 2d − 1)`` in the dtype of the tables."""
    root = levels[-1]
    B, dev = root.shape[4], root.device
    S = n_samples

    def choose(logits: torch.Tensor) -> torch.Tensor:
        if sample:
            u = torch.rand(logits.shape, generator=generator, dtype=logits.dtype, device=dev)
            logits = logits - torch.log(-torch.log(u))
        return logits.argmax(-1)

    u_state = choose(_root_logits(levels, k).expand(S, B, 2))[:, None]    # (S, 1, B)
    s_state = torch.zeros_like(u_state)
    c_state = torch.full_like(u_state, k)
    for x in reversed(levels[:-1]):
        nb, m = x.shape[3], x.shape[2]
        # the children's tables with the batch leading (views): (P, B, 2, 2, m)
        left, right = (h.permute(3, 4, 0, 1, 2) for h in _pairs(x))
        P = left.shape[0]
        # T_L[s, :, :] for each sample's s, and T_R[:, u, c − j] for its (u, c)
        li = s_state[..., None, None, None].expand(S, P, B, 1, 2, m)
        ls = torch.gather(left.expand(S, *left.shape), 3, li).squeeze(3)  # (S, P, B, t, j)
        ri = u_state[..., None, None, None].expand(S, P, B, 2, 1, m)
        rs = torch.gather(right.expand(S, *right.shape), 4, ri).squeeze(4)  # (S, P, B, t, c')
        rs = F.pad(rs, (0, 1), value=_neg(x.dtype))
        j = torch.arange(m, device=dev)
        cj = c_state[..., None] - j                                       # (S, P, B, j)
        cj = torch.where((cj >= 0) & (cj < m), cj, m)
        rs = torch.gather(rs, -1, cj[..., None, :].expand(S, P, B, 2, m))  # (S, P, B, t, j)
        best = choose((ls + rs).reshape(S, P, B, 2 * m))
        t, jj = best // m, best % m
        s_state = torch.stack([s_state, t], 2).reshape(S, 2 * P, B)[:, :nb]
        u_state = torch.stack([t, u_state], 2).reshape(S, 2 * P, B)[:, :nb]
        c_state = torch.stack([jj, c_state - jj], 2).reshape(S, 2 * P, B)[:, :nb]
    z = u_state.transpose(1, 2)                                           # (S, B, d)
    pair = (s_state * u_state)[:, 1:].transpose(1, 2)                     # (S, B, d − 1)
    return torch.cat([z, pair], -1).to(root.dtype)


# --------------------------------------------------------------------------------------------
# autograd Functions
# --------------------------------------------------------------------------------------------

def _log_partition_unrolled(y: torch.Tensor, d: int, k: int) -> torch.Tensor:
    """A(y) by the log-space inside pass, plain torch ops: ``(B, 2d − 1) -> (B,)``."""
    return torch.logsumexp(_root_logits(_prepare(y, d, k), k), -1)


class _Marginals(torch.autograd.Function):
    r"""μ = ∇A(y) by the mass-conserving top-down pass; backward ḡ ↦ Cov_q(z) ḡ (symmetric).

    Inputs: y ``(B, 2d − 1)``, d, k. Outputs: μ and, non-differentiable, what the tangent passes
    of the backward need (:func:`._blocks._marginals_jvp`): the L + 1 tables, the L split
    weights and the L + 1 state probabilities of the top-down pass. Once differentiable;
    ``backward="unroll"`` differentiates to every order.
    """

    generate_vmap_rule = True  # the forward and backward are plain torch ops

    @staticmethod
    def forward(y, d, k):
        levels, weights = _weighted_inside(y, d, k)
        probs = _down(levels, weights, k)
        return (_extract(probs[-1]), *levels, *weights, *probs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, d, k = inputs
        ctx.d, ctx.k = d, k
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)        # no zero gradients for the tables
        ctx.save_for_backward(*output[1:])

    @staticmethod
    @once_differentiable
    def backward(ctx, g, *_):
        if g is None or not ctx.needs_input_grad[0]:
            return None, None, None
        saved = ctx.saved_tensors
        n = (len(saved) - 2) // 3                                         # merges
        levels, weights, probs = saved[:n + 1], saved[n + 1:2 * n + 1], saved[2 * n + 1:]
        return (_marginals_jvp(list(levels), list(weights), list(probs), g, ctx.d, ctx.k),
                None, None)


class _LogPartition(torch.autograd.Function):
    r"""A(y) by the inside pass; backward ḡ·μ(y) (μ differentiable once more)."""

    generate_vmap_rule = True  # the forward and backward are plain torch ops

    @staticmethod
    def forward(y, d, k):
        return _log_partition_unrolled(y, d, k)

    @staticmethod
    def setup_context(ctx, inputs, output):
        y, d, k = inputs
        ctx.d, ctx.k = d, k
        ctx.save_for_backward(y)

    @staticmethod
    def backward(ctx, g):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        (y,) = ctx.saved_tensors
        return g[:, None] * _Marginals.apply(y, ctx.d, ctx.k)[0], None, None


def _flat(y: torch.Tensor) -> torch.Tensor:
    return y.reshape(-1, y.shape[-1])


def _marginals_scaled(y: torch.Tensor, d: int, k: int, backward: str = "analytic"
                      ) -> torch.Tensor:
    """Marginals of already scaled, validated scores ``(*batch, 2d − 1)``."""
    yf = _flat(y)
    if not yf.shape[0]:
        return torch.zeros_like(y)
    if backward == "unroll":
        mu = _marginals_from_levels(_prepare(yf, d, k), d, k)
    else:
        mu = _Marginals.apply(yf, d, k)[0]
    return mu.reshape(y.shape)


# --------------------------------------------------------------------------------------------
# the structure
# --------------------------------------------------------------------------------------------

class CorrelatedKSubset(Structure):
    r"""k-subsets of d items with indicators of the chosen adjacent pairs.

    Z = {z ∈ {0,1}^{2d−1} : Σ_{i≤d} z_i = k, z_{d+j} = z_j z_{j+1}, j = 1..d−1}: the first d
    entries say which items are chosen, the last d − 1 which adjacent pairs are both chosen, so
    ⟨θ, z⟩ adds the pairwise score θ_{d+j} whenever items j and j+1 are chosen together
    (positive θ_{d+j} favours contiguous runs). The default regularizer is
    :class:`~perturb.ExpFamilyEntropy` (marginals of q(z) ∝ exp⟨θ, z⟩/τ), the only registered one.

    Args:
        k: number of chosen items, ≥ 1 (checked against d when scores arrive).

    Shape: scores ``(*batch, 2d − 1)``; ``argmax`` returns a 0/1 ``(*batch, 2d − 1)`` vertex.

    Example::

        >>> s = CorrelatedKSubset(2)
        >>> s.argmax(torch.tensor([1., 0., 1., 0., 0.]))        # unary ties, no pair bonus
        tensor([1., 0., 1., 0., 0.])
        >>> s.argmax(torch.tensor([1., 0., 1., 3., 0.]))        # pair (1, 2) worth 3
        tensor([1., 1., 0., 1., 0.])
    """

    event_dim = 1

    def __init__(self, k: int):
        self.k = check_int(k, "k", low=1)

    def validate(self, w: torch.Tensor, name: str = "w") -> None:
        """Scores must be floating, finite, at least 1-D, with an odd size 2d − 1 and d ≥ k."""
        super().validate(w, name)
        _check_k(self.k, _num_items(w.shape[-1], name))

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        """The exact maximiser (log-depth (max, +) tree and top-down decoding)."""
        return _argmax(w, self.k)

    def check(self, y: torch.Tensor) -> torch.Tensor:
        n = y.shape[-1]
        if n % 2 == 0:
            return torch.zeros(y.shape[:-1], dtype=torch.bool, device=y.device)
        d = (n + 1) // 2
        binary = ((y == 0) | (y == 1)).all(dim=-1)
        pairs = (y[..., d:] == y[..., :d - 1] * y[..., 1:d]).all(dim=-1)
        return binary & pairs & (y[..., :d].sum(dim=-1) == self.k)

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """All C(d, k) vertices for the event size n = 2d − 1, in lexicographic order of the
        chosen items: ``(C(d, k), 2d − 1)``."""
        n = check_int(n, "n", low=1)
        d = _num_items(n, "n")
        _check_k(self.k, d)
        combos = list(itertools.combinations(range(d), self.k))
        z = torch.zeros(len(combos), d, dtype=dtype or torch.get_default_dtype(), device=device)
        z.scatter_(1, torch.tensor(combos, dtype=torch.long, device=device), 1.0)
        return torch.cat([z, z[:, :-1] * z[:, 1:]], -1)

    def default_regularizer(self) -> Regularizer:
        return ExpFamilyEntropy()

    def __repr__(self) -> str:
        return f"CorrelatedKSubset(k={self.k})"


@full_precision
def _argmax(w: torch.Tensor, k: int) -> torch.Tensor:
    d = (w.shape[-1] + 1) // 2
    with torch.no_grad():
        wf = _flat(w.detach())
        if not wf.shape[0]:
            return torch.zeros_like(w)
        z = _decode(_prepare(wf, d, k, "max"), d, k, 1, None, sample=False)[0]
    return z.reshape(w.shape)


@register_solver(CorrelatedKSubset, ExpFamilyEntropy, backward=("analytic", "unroll"),
                 description="correlated k-subset marginals (log-depth DP over "
                             "(count, previous chosen))")
def _solve_exp_family(w, structure, regularizer, tau, backward):
    d = (w.shape[-1] + 1) // 2
    return _marginals_scaled(scale_by_tau(w, tau, 1), d, structure.k, backward)


# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------

def correlated_topk_argmax(w: torch.Tensor, k: int) -> torch.Tensor:
    r"""The exact argmax_{z ∈ Z} ⟨w, z⟩ over correlated k-subsets (no gradient).

    Maximises Σ_i a_i z_i + Σ_j b_j z_j z_{j+1} over Σ z_i = k by the (max, +) block tables
    (module docstring), ⌈log₂ d⌉ merge levels up and as many decoding steps down. Ties are broken
    deterministically (the first split in row-major order), not necessarily towards low indices.

    Args:
        w: scores ``(a, b)``: d unary, then d − 1 pairwise scores of the adjacent pairs.
        k: number of items, 1 ≤ k ≤ d.

    Shape: ``(*batch, 2d − 1)`` -> ``(*batch, 2d − 1)``, dtype and device of ``w``: the item
    indicators, then the pair indicators z_j z_{j+1}.

    Raises:
        ValueError: an even last dim, k outside [1, d], non-floating or non-finite ``w``.

    Complexity: O(dk) time, O(B·d·k) memory, ⌈log₂ d⌉ sequential levels.

    Example::

        >>> correlated_topk_argmax(torch.tensor([1., 0., 1., 3., 0.]), 2)
        tensor([1., 1., 0., 1., 0.])
    """
    structure = CorrelatedKSubset(k)
    structure.validate(w)
    return _argmax(w, k)


@full_precision
def correlated_topk_log_partition(w: torch.Tensor, k: int,
                                  tau: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""A(w/τ) = log Σ_{z ∈ Z} exp(⟨w, z⟩/τ) over correlated k-subsets.

    The (logsumexp, +) block tables in log depth (module docstring); stable for scores of ±1e4
    at τ = 1e-3. Its gradient with respect to w/τ is :func:`correlated_topk_marginals` (the
    backward returns it; differentiable once more, so A is twice differentiable).

    Args:
        w: scores ``(a, b)``: d unary, then d − 1 pairwise.
        k: number of items, 1 ≤ k ≤ d.
        tau: temperature τ > 0 (a float, or a tensor broadcastable to ``(*batch)``).

    Shape: ``(*batch, 2d − 1)`` -> ``(*batch)``, dtype and device of ``w`` (half precision is
    computed in float32).

    Raises:
        ValueError: an even last dim, k outside [1, d], τ ≤ 0, non-floating or non-finite ``w``.

    Complexity: O(dk) time, O(B·d·k) memory, ⌈log₂ d⌉ levels.

    Example::

        >>> correlated_topk_log_partition(torch.zeros(5), 2).exp()   # C(3, 2) subsets
        tensor(3.)
    """
    d, k = _check(w, k)
    check_tau(tau)
    y = scale_by_tau(w, tau, 1)
    yf = _flat(y)
    if not yf.shape[0]:
        return y.new_zeros(y.shape[:-1])
    return _LogPartition.apply(yf, d, k).reshape(y.shape[:-1])


@full_precision
def correlated_topk_marginals(w: torch.Tensor, k: int,
                              tau: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Marginals μ = ∇A(w/τ) = E_q[z] of q(z) ∝ exp(⟨w, z⟩/τ) over correlated k-subsets.

    μ_i = P(item i chosen) for i ≤ d, μ_{d+j} = P(items j and j+1 chosen). This is
    ``regularized_argmax(w, CorrelatedKSubset(k), ExpFamilyEntropy(), tau)``. The top-down pass
    conserves probability mass level by level, so μ ∈ [0, 1], Σ_{i≤d} μ_i = k and
    μ_{d+j} ≤ min(μ_j, μ_{j+1}) up to rounding. Backward: Cov_q(z) ḡ by the tangents of both
    passes (once differentiable; for every order use
    ``regularized_argmax(..., backward="unroll")``).

    Args:
        w: scores ``(a, b)``: d unary, then d − 1 pairwise.
        k: number of items, 1 ≤ k ≤ d.
        tau: temperature τ > 0 (a float, or a tensor broadcastable to ``(*batch)``).

    Shape: ``(*batch, 2d − 1)`` -> ``(*batch, 2d − 1)``, dtype and device of ``w``.

    Raises:
        ValueError: an even last dim, k outside [1, d], τ ≤ 0, non-floating or non-finite ``w``.

    Complexity: O(dk) time, O(B·d·k) temporaries, 2⌈log₂ d⌉ levels.

    Example::

        >>> correlated_topk_marginals(torch.zeros(5), 2)   # {1,2}, {1,3}, {2,3} equally likely
        tensor([0.6667, 0.6667, 0.6667, 0.3333, 0.3333])
    """
    d, k = _check(w, k)
    check_tau(tau)
    return _marginals_scaled(scale_by_tau(w, tau, 1), d, k)


@full_precision
def sample_correlated_topk(w: torch.Tensor, k: int, n_samples: int | None = None,
                           generator: torch.Generator | None = None, *legacy: Any,
                           tau: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Exact samples z ~ q(z) ∝ exp(⟨w, z⟩/τ) over correlated k-subsets.

    Inside pass up the tree, then every node's split (t, j) drawn top-down by Gumbel-max from
    exp(T_L[s,t,j] + T_R[t,u,c−j] − T[s,u,c]) (forward filtering, backward sampling in log depth;
    module docstring). E[z] = :func:`correlated_topk_marginals`.

    Args:
        w: scores ``(a, b)``: d unary, then d − 1 pairwise.
        k: number of items, 1 ≤ k ≤ d.
        n_samples: if given, a leading dim of that many independent samples.
        generator: a ``torch.Generator`` (on the device of ``w``) for reproducibility.
        tau: temperature τ > 0 (keyword-only; the old order ``(w, k, tau, n_samples,
            generator)`` works for one release with a ``FutureWarning``).

    Shape: ``(*batch, 2d − 1)`` -> ``(*batch, 2d − 1)`` or ``(n_samples, *batch, 2d − 1)``,
    dtype of ``w``; no gradient.

    Raises:
        ValueError: an even last dim, k outside [1, d], τ ≤ 0, bad ``n_samples``, non-floating
            or non-finite ``w``.

    Complexity: O(dk) for the tables, then ⌈log₂ d⌉ steps for all samples at once, memory
    O(n_samples·B·d·k) per level.
    """
    n_samples, generator, tau = old_sampler_order("sample_correlated_topk", n_samples,
                                                  generator, legacy, tau)
    if n_samples is not None:
        check_int(n_samples, "n_samples", low=1)
    S = 1 if n_samples is None else n_samples
    with torch.no_grad():
        w = w.detach() if isinstance(w, torch.Tensor) else w
        d, k = _check(w, k)
        check_tau(tau)
        yf = _flat(scale_by_tau(w, tau, 1))
        if yf.shape[0]:
            out = _decode(_prepare(yf, d, k), d, k, S, generator, sample=True)
        else:
            out = yf.new_zeros((S,) + yf.shape)
        out = out.reshape(S, *w.shape)
    return out[0] if n_samples is None else out
