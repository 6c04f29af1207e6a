r"""The exponential family over k-subsets: log-partition, marginals and exact sampling.

For scores y = w/τ the Gibbs distribution over Z = {z ∈ {0,1}^n : Σz = k} is

.. math::

    q(z \mid y) = \exp(\langle y, z\rangle - A(y)),\qquad
    A(y) = \log \sum_{z \in Z} e^{\langle y, z\rangle} = \log e_k(e^{y_1}, \dots, e^{y_n}),

with e_k the k-th elementary symmetric polynomial. Its marginals μ = ∇A(y) = E_q[z] are the
solution of the regularized argmax with f = A* (:class:`perturb.ExpFamilyEntropy`).

**Tilting** (what makes a probability-space computation exact and stable). For any ν,

    e_k(e^y) = e^{kν} · Π_i (1 + e^{y_i − ν}) · P_ν(N = k),

where N = Σ_i B_i counts independent Bernoulli(p_i) with p_i = σ(y_i − ν): conditioning the
independent model on N = k gives back q for every ν. We pick ν so that E_ν[N] ≈ k: then k is
(near) the mode of N and P_ν(N = k) is not small (≥ 1/(2(n+1)) once |E_ν N − k| ≤ 1/2; in
practice ≈ 1/√(2π Var N)). Every quantity below is then a probability, or a product of
probabilities, in [0, 1]: no overflow, and an entry too small to represent contributes less than
the smallest normal number to quantities that are ≥ P_ν(N = k)·(rounding), so it cannot matter.
ν is found on the scores shifted by their k-th largest entry (so that ties there are exact in
float32) from a closed-form start and one safeguarded Newton step on
log Σ_top σ(ν − y) = log Σ_rest σ(y − ν) (expected misses in the top k = expected hits outside).

**Tree** (log depth). For a block b of positions let I_b[j] = P_ν(N_b = j), j ≤ min(k, |b|). A
leaf is [1 − p_i, p_i]; two blocks merge by a truncated convolution,
I_{b∪b'}[c] = Σ_j I_b[j] I_{b'}[c − j], c ≤ k, pairwise, ⌈log₂ n⌉ levels, each level batched over
all pairs (layout and kernels: :mod:`perturb.structured.subsets._tree`). A node's vector has
length min(k, block size) + 1, so the tables hold O(B·n·log k) entries; a merge costs
O(min(k, block size)²) per pair, O(nk) per row in all. log Z = log I_root[k] + Σ_i
softplus(y_i − ν) + kν.

**Outside pass** (marginals). O_b[j] = P_ν(N_{not b} = k − j), so P_ν(N = k) = Σ_j I_b[j] O_b[j]
for every node b. Top-down: O_root = 1[j = k] and a child takes the correlation of its parent's
O with its sibling's I: O_b[j] = Σ_i I_{b'}[i] O_parent[j + i]. At a leaf,
μ_i = p_i O_i[1] / (p_i O_i[1] + (1 − p_i) O_i[0]) ∈ [0, 1].

**Backward.** The Jacobian of μ is ∇²A = Cov_q(z), symmetric, so the vector–Jacobian product
with ḡ is the directional derivative of μ along ḡ: both passes are bilinear in the leaves, so
their tangents (ν held fixed: the identity above holds for every ν; leaf tangent [0, p_i ḡ_i],
equivalent to [−ṗ, ṗ] because μ ignores a rescaled leaf) follow by the product rule, level by
level, with the same kernels. The tables of the
forward are saved (O(B·n·log k)); nothing of size (k+1)² per pair is kept. ``backward="unroll"`` instead
runs autograd through the same tree (differentiable to every order).

**Sampling**, top-down through the tree: a node holding c items sends j of them to its left
child with probability I_left[j] I_right[c − j] / I_node[c]; the product over the nodes telescopes
to q(z), so the samples are exact, and it takes ⌈log₂ n⌉ steps for all samples at once.

Kernels (each merge, split and tangent level: one in-place multiply-add per count on the large
CPU levels, windows times the reversed operand elsewhere) live in
:mod:`perturb.structured.subsets._tree`. Half-precision inputs are computed in float32.

References: Paulus et al. (2020), "Gradient estimation with stochastic softmax tricks",
arXiv:2006.08063, §4 and App.; Chen, Dempster & Liu (1994), "Weighted finite population sampling
to maximize entropy" (conditional Poisson sampling and the tilted Bernoulli representation).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from perturb._autograd import once_differentiable
from perturb._deprecation import old_sampler_order
from perturb._math import logaddexp2
from perturb.backward import resolve_backward, solve_with_backward
from perturb._validation import check_int, check_scores, check_tau, scale_by_tau
from perturb.structured.subsets import _tree as _tree
from perturb.structured.subsets._checks import check_feasible, check_k

__all__ = ["ksubset_log_partition", "ksubset_marginals", "sample_ksubset"]

# --------------------------------------------------------------------------------------------
# argument handling shared with ksubsets.py
# --------------------------------------------------------------------------------------------

def _scaled_scores(w: torch.Tensor, k: int, tau: float | torch.Tensor, name: str = "w"):
    """Validate (w, k, τ) and return y = w/τ (differentiable in w and τ) and k.

    ``-inf`` scores mask positions; NaN and ``+inf`` are rejected."""
    check_scores(w, name, min_ndim=1, allow_neg_inf=True)
    k = check_k(k, w.shape[-1])
    check_tau(tau)
    return scale_by_tau(w, tau, 1), k


def _work_dtype(y: torch.Tensor) -> torch.Tensor:
    # half precision: computed in float32 (the tilted tables are probabilities; float32 keeps
    # them exact to rounding, see the module docstring)
    return y.float() if y.dtype in (torch.float16, torch.bfloat16) else y


def _flat(y: torch.Tensor) -> torch.Tensor:
    return y.reshape(-1, y.shape[-1])


# --------------------------------------------------------------------------------------------
# the tilt and the autograd Functions (the tree itself: _tree.py)
# --------------------------------------------------------------------------------------------

def _prepare(y: torch.Tensor, k: int, name: str = "w"):
    """Shift, tilt and check feasibility; see :func:`perturb.structured.subsets._tree._tilt`."""
    ys, c, nu = _tree._tilt(y, k)
    check_feasible(c, k, name)
    return ys, c, nu


class _KSubsetMarginals(torch.autograd.Function):
    r"""μ(y) = ∇ log e_k(e^y) by the inside–outside tree; backward μ̇ = Cov_q(z) ḡ (symmetric).

    Inputs: shifted scores ys ``(B, n)``, the tilt ν ``(B, 1)`` (a constant) and k. Outputs: μ
    ``(B, n)`` and, non-differentiable, the tables the backward needs (count-major,
    :mod:`perturb.structured.subsets._tree`): the leaves [1 − p, p], the inside tables below
    the root with swapped halves [I_0, …, I_{L−1}], then the outside tables [O_0, …, O_L]. The
    backward is computed once (``once_differentiable``); for higher orders use
    ``backward="unroll"``.
    """

    generate_vmap_rule = True  # the forward and backward are plain torch ops

    @staticmethod
    def forward(ys, nu, k):
        ins = _tree._inside(_tree._leaves(ys - nu), k)
        outs, sws = _tree._outside(ins, k)
        mu = _tree._leaf_marginals(ins[0], outs[0])[:, :ys.shape[-1]]
        return (mu, ins[0], *sws, *outs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, _, k = inputs
        ctx.k = k
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)        # no zero gradients for the tables
        ctx.save_for_backward(*output)

    @staticmethod
    @once_differentiable
    def backward(ctx, g, *_):
        if g is None or not ctx.needs_input_grad[0]:
            return None, None, None
        _, t0, *tables = ctx.saved_tensors
        return _marginals_vjp(t0, tables, g, ctx.k), None, None


def _marginals_vjp(t0: torch.Tensor, tables: list[torch.Tensor], g: torch.Tensor,
                   k: int) -> torch.Tensor:
    """Cov_q(z) g: the symmetric Jacobian of the marginals applied to g. Pure; tests call it.

    Shapes: g ``(B, n)``; ``t0`` and ``tables`` the leaf table and the rest of the tables
    returned by :class:`_KSubsetMarginals` (count-major, :mod:`perturb.structured.subsets._tree`);
    output ``(B, n)``.
    """
    n, N, L = g.shape[-1], t0.shape[1], len(tables) // 2
    g = F.pad(g, (0, N - n)) if N > n else g
    return _tree._marginals_jvp(t0, tables[:L], tables[L:], g, k)[:, :n]


def _log_partition_tilted(ys: torch.Tensor, nu: torch.Tensor, k: int) -> torch.Tensor:
    """A(ys) = log P_ν(N = k) + Σ softplus(ys − ν) + kν, plain torch ops; ``(B, n) -> (B,)``."""
    x = ys - nu
    root = _tree._inside(_tree._leaves(x), k)[-1][:, 0]
    # softplus as max(x, 0) + log1p(e^{−|x|}): exact (F.softplus returns x itself above
    # x = 20, off by e^{-20}) and twice differentiable at any x (the double backward of
    # torch.logaddexp overflows for the gaps of scores 1e4 at τ = 1e-3: "unroll" needs it)
    return torch.log(root[k]) + logaddexp2(x, torch.zeros_like(x)).sum(-1) + k * nu[:, 0]


class _KSubsetLogPartition(torch.autograd.Function):
    r"""A(ys) by the inside pass; backward ḡ · μ(ys) (μ differentiable once more)."""

    generate_vmap_rule = True  # the forward and backward are plain torch ops

    @staticmethod
    def forward(ys, nu, k):
        return _log_partition_tilted(ys, nu, k)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ys, nu, k = inputs
        ctx.k = k
        ctx.save_for_backward(ys, nu)

    @staticmethod
    def backward(ctx, g):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        ys, nu = ctx.saved_tensors
        mu = _KSubsetMarginals.apply(ys, nu, ctx.k)[0]
        return g[:, None] * mu, None, None


def _marginals_scaled(y: torch.Tensor, k: int) -> torch.Tensor:
    """Marginals for already scaled and validated scores ``(*batch, n)`` (analytic backward)."""
    yw = _flat(_work_dtype(y))
    if not yw.shape[0]:
        return torch.zeros_like(y)
    ys, _, nu = _prepare(yw, k)
    mu = _KSubsetMarginals.apply(ys, nu, k)[0]
    return mu.reshape(y.shape).to(y.dtype)


def _marginals_unrolled(y: torch.Tensor, k: int) -> torch.Tensor:
    """μ = ∇A by autograd through the tree (``create_graph``: differentiable to every order)."""
    yw = _work_dtype(y)
    if not y.numel():
        return torch.zeros_like(y)
    with torch.enable_grad():
        leaf = yw if yw.requires_grad else yw.detach().requires_grad_(True)
        ys, _, nu = _prepare(_flat(leaf), k)
        logz = _log_partition_tilted(ys, nu, k)
        (mu,) = torch.autograd.grad(logz.sum(), leaf, create_graph=y.requires_grad)
    return mu.to(y.dtype)


# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------

def ksubset_log_partition(w: torch.Tensor, k: int, tau: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Log-partition ``A(w/τ) = log Σ_{|S| = k} exp(Σ_{i∈S} w_i / τ)`` of the k-subset family.

    A(y) = log e_k(e^y), computed as log P_ν(N = k) + Σ_i softplus(y_i − ν) + kν for a tilt ν
    by a pairwise tree of truncated convolutions (module docstring). Its gradient with respect
    to ``w/τ`` is :func:`ksubset_marginals`, returned by the backward pass, which is itself
    differentiable (double backward works).

    Args:
        w: scores; ``-inf`` masks a position (it is never chosen).
        k: subset size, 1 ≤ k ≤ n.
        tau: temperature τ > 0 (a float, or a tensor broadcastable to ``(*batch)``).

    Shape: ``w``: ``(*batch, n)``; output ``(*batch)``, dtype and device of ``w`` (half
    precision is computed in float32).

    Returns:
        A(w/τ) (not multiplied by τ).

    Raises:
        ValueError: k outside [1, n] or not an int, τ ≤ 0, non-floating ``w``, NaN or +inf in
            ``w``, a row with fewer than k entries > -inf (value checks while validation is on).

    Complexity: O(nk) time, O(B·n·k) temporary memory, ⌈log₂ n⌉ sequential levels.

    Example::

        >>> w = torch.zeros(5)
        >>> round(float(ksubset_log_partition(w, 2).exp()), 4)   # C(5, 2) subsets of weight 1
        10.0
    """
    y, k = _scaled_scores(w, k, tau)
    yw = _flat(_work_dtype(y))
    if not yw.shape[0]:
        return y.new_zeros(w.shape[:-1])
    ys, c, nu = _prepare(yw, k)
    out = _KSubsetLogPartition.apply(ys, nu, k) + k * c[:, 0]
    return out.reshape(w.shape[:-1]).to(y.dtype)


#: The native gradient modes of the marginals (the registry's and :func:`ksubset_marginals`').
MARGINAL_BACKWARDS = ("analytic", "unroll")


def ksubset_marginals(w: torch.Tensor, k: int, tau: float | torch.Tensor = 1.0,
                      backward: str = "auto") -> torch.Tensor:
    r"""Marginals μ_i = P_q(i ∈ S) of q(S) ∝ exp(Σ_{i∈S} w_i/τ) over k-subsets: μ = ∇A(w/τ).

    This is the regularized argmax over conv Z with the exponential-family entropy A*
    (``relaxed_topk(w, k, tau, regularizer=ExpFamilyEntropy())``). Inside–outside passes over a
    pairwise tree in log depth (module docstring); μ_i = p_i O_i[1] / (p_i O_i[1] + (1 − p_i)
    O_i[0]), so every entry lies in [0, 1], and Σμ = k. The backward applies Cov_q(z) by the
    tangents of both passes (once differentiable; ``backward="unroll"`` differentiates the
    tree by autograd, to every order).

    Args:
        w: scores; ``-inf`` masks a position (its marginal is 0).
        k: subset size, 1 ≤ k ≤ n.
        tau: temperature τ > 0 (a float, or a tensor broadcastable to ``(*batch)``).
        backward: ``"auto"`` = ``"analytic"`` (the tangent passes), ``"unroll"`` or
            ``"finite_difference"`` (w.r.t. ``w`` only), as for
            :func:`perturb.regularized_argmax`.

    Shape: ``w``: ``(*batch, n)``; output ``(*batch, n)``, dtype and device of ``w``.

    Raises:
        ValueError: k outside [1, n] or not an int, τ ≤ 0, non-floating ``w``, NaN or +inf in
            ``w``, a row with fewer than k entries > -inf.

    Complexity: O(nk) time, O(B·n·k) temporaries, O(B·n·log k) saved for the backward,
    ⌈log₂ n⌉ sequential levels per pass.

    Example::

        >>> ksubset_marginals(torch.tensor([0., 0., 10.]), k=2)
        tensor([0.5000, 0.5000, 1.0000])

    References: Paulus et al. (2020), arXiv:2006.08063.

    See Also:
        - :func:`perturb.structured.ksubset_log_partition`: its log-partition
        - :func:`perturb.structured.sample_ksubset`: exact samples
        - :func:`perturb.structured.relaxed_topk`: the relaxed top-k that uses these marginals
    """
    mode = resolve_backward(backward, MARGINAL_BACKWARDS, "ksubset_marginals")
    if mode == "finite_difference":
        return solve_with_backward(lambda v, m: ksubset_marginals(v, k, tau, m), w, mode,
                                   MARGINAL_BACKWARDS, event_dim=1, held={"tau": tau})
    y, k = _scaled_scores(w, k, tau)
    return _marginals_unrolled(y, k) if mode == "unroll" else _marginals_scaled(y, k)


def sample_ksubset(w: torch.Tensor, k: int, n_samples: int | None = None,
                   generator: torch.Generator | None = None, *legacy: Any,
                   tau: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Exact samples S ~ q(S) ∝ exp(Σ_{i∈S} w_i/τ) over k-subsets, as 0/1 indicators.

    Top-down through the tree of the inside pass: a node holding c items sends j to its left
    child with probability I_left[j] I_right[c − j] / I_node[c] (drawn by Gumbel-max); the product
    telescopes to q(S). Unlike Gumbel top-k (which samples without replacement, a different
    distribution), the samples follow q exactly, so E[z] = :func:`ksubset_marginals`
    (unbiased score-function baselines).

    Args:
        w: scores; ``-inf`` masks a position (never sampled).
        k: subset size, 1 ≤ k ≤ n.
        n_samples: if given, a leading dim of that many independent samples.
        generator: a ``torch.Generator`` for reproducibility (on the device of ``w``).
        tau: temperature τ > 0 (keyword-only, as for every sampler; the old order
            ``(w, k, tau, n_samples, generator)``, recognised by a float third argument, works
            for one release with a ``FutureWarning``).

    Shape: ``w``: ``(*batch, n)``; output ``(*batch, n)`` or ``(n_samples, *batch, n)``, dtype of
    ``w``; no gradient.

    Raises:
        ValueError: k outside [1, n], τ ≤ 0, bad ``n_samples``, NaN/+inf in ``w``, a row with
            fewer than k entries > -inf.

    Complexity: O(nk) for the tables, then ⌈log₂ n⌉ steps for all samples at once, memory
    O(n_samples·B·n·min(k, ·)) per level.

    See Also:
        - :func:`perturb.structured.ksubset_marginals`: the marginals of the same law
        - :func:`perturb.structured.topk`: its mode
    """
    n_samples, generator, tau = old_sampler_order("sample_ksubset", n_samples, generator,
                                                  legacy, tau)
    if n_samples is not None:
        check_int(n_samples, "n_samples", low=1)
    with torch.no_grad():
        y, k = _scaled_scores(w.detach() if isinstance(w, torch.Tensor) else w, k, tau)
        yw = _flat(_work_dtype(y))
        S = 1 if n_samples is None else n_samples
        if yw.shape[0]:
            ys, _, nu = _prepare(yw, k)
            tables = _tree._inside(_tree._leaves(ys - nu), k)
            out = _tree._sample(tables, k, S, generator)[..., :yw.shape[-1]].to(w.dtype)
        else:
            out = yw.new_zeros((S,) + yw.shape).to(w.dtype)
        out = out.reshape(S, *w.shape)
    return out[0] if n_samples is None else out


# --------------------------------------------------------------------------------------------
# reference: the sequential DP this module used before (n steps; tests and bench/ compare)
# --------------------------------------------------------------------------------------------

#: Stand-in for log 0 in the sequential tables (finite, so tangents never see ∞ − ∞).
_NEG = -1e30


def _low(dtype: torch.dtype) -> float:
    return math.log(torch.finfo(dtype).tiny) + 1.0


def _lse(s: torch.Tensor, dim: int) -> torch.Tensor:
    m = s.amax(dim, keepdim=True)
    return (s - m).clamp_min(_low(s.dtype)).exp().sum(dim).log() + m.squeeze(dim)


def _softmax(s: torch.Tensor, dim: int) -> torch.Tensor:
    e = (s - s.amax(dim, keepdim=True)).clamp_min(_low(s.dtype)).exp()
    return e / e.sum(dim, keepdim=True)


def _prefix_table(yt: torch.Tensor, k: int) -> torch.Tensor:
    """α[i, j, :] = log e_j(e^{y_1}, …, e^{y_i}) by α[i, j] = logaddexp(α[i−1, j], α[i−1, j−1] +
    y_i); ``yt`` position-major ``(n, B)``, output ``(n+1, k+1, B)``. One step per position."""
    n, B = yt.shape
    t = torch.full((n + 1, k + 2, B), _NEG, dtype=yt.dtype, device=yt.device)
    t[:, 1] = 0.0
    for i in range(n):
        t[i + 1, 2:] = torch.logaddexp(t[i, 2:], t[i, 1:-1] + yt[i])
    return t[:, 1:]


def _sequential_tables(y: torch.Tensor, k: int):
    """Shifted position-major scores and the prefix/suffix tables α, β of ``(B, n)`` scores."""
    yt = (y - torch.topk(y.detach(), k, dim=-1).values[..., -1:]).t().contiguous()
    B = yt.shape[1]
    both = _prefix_table(torch.cat([yt, yt.flip(0)], 1), k)
    return yt, both[..., :B], both[..., B:].flip(0)


def _sequential_from_tables(yt, alpha, beta, k):
    a, b = alpha[:-1], beta[1:].flip(1)
    s1, s0 = a[:, :k] + b[:, 1:], a + b
    return torch.sigmoid(yt + _lse(s1, 1) - _lse(s0, 1)), s1, s0


def _sequential_jvp(yt, alpha, beta, mu, gt, k):
    """Cov_q(z) g by forward-mode tangents of the two tables (position-major ``(n, B)``)."""
    B = yt.shape[1]
    y2, t2, g2 = (torch.cat([yt, yt.flip(0)], 1), torch.cat([alpha, beta.flip(0)], -1),
                  torch.cat([gt, gt.flip(0)], 1))
    low = _low(t2.dtype)
    prev, new = t2[:-1], t2[1:]
    keep = (prev[:, 1:] - new[:, 1:]).clamp_min(low).exp()
    take = (prev[:, :-1] + y2[:, None] - new[:, 1:]).clamp_min(low).exp()
    dt = torch.zeros_like(t2)
    for i in range(t2.shape[0] - 1):
        dt[i + 1, 1:] = torch.addcmul(keep[i] * dt[i, 1:], take[i], dt[i, :-1] + g2[i])
    da, db = dt[..., :B], dt[..., B:].flip(0)
    _, s1, s0 = _sequential_from_tables(yt, alpha, beta, k)
    ta, tb = da[:-1], db[1:].flip(1)
    dl1 = gt + (_softmax(s1, 1) * (ta[:, :k] + tb[:, 1:])).sum(1)
    dl0 = (_softmax(s0, 1) * (ta + tb)).sum(1)
    return mu * (1 - mu) * (dl1 - dl0)


class _SequentialMarginals(torch.autograd.Function):
    """The former implementation of the marginals: O(n) sequential steps forward and backward.
    Inputs: scores ``(B, n)`` (float32/64), k. Output: μ ``(B, n)``."""

    @staticmethod
    def forward(y, k):
        yt, alpha, beta = _sequential_tables(y, k)
        return _sequential_from_tables(yt, alpha, beta, k)[0].t(), yt, alpha, beta

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.k = inputs[1]
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(*output)

    @staticmethod
    @once_differentiable
    def backward(ctx, g, *_):
        mu, yt, alpha, beta = ctx.saved_tensors
        return _sequential_jvp(yt, alpha, beta, mu.t(), g.t(), ctx.k).t(), None


def _sequential_log_partition(y: torch.Tensor, k: int) -> torch.Tensor:
    """The former log-partition: α[n, k] + k·(k-th largest); ``(B, n) -> (B,)``, no backward."""
    c = torch.topk(y.detach(), k, dim=-1).values[..., -1]
    return _sequential_tables(y, k)[1][-1, k] + k * c
