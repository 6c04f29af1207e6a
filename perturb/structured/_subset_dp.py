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
leaf is [1 − p_i, p_i]; two adjacent blocks merge by a truncated convolution,
I_{b∪b'}[c] = Σ_j I_b[j] I_{b'}[c − j], c ≤ k. Blocks are merged pairwise, ⌈log₂ n⌉ levels (an odd
block count gets the identity [1, 0, …] appended), each level one batched op over all pairs. A
node's vector has length min(k, block size) + 1, so the work is O(nk) and the temporaries
O(B·n·k) at most, never O(B·n·k²). log Z = log I_root[k] + Σ_i softplus(y_i − ν) + kν.

**Outside pass** (marginals). O_b[j] = P_ν(N_{not b} = k − j), so P_ν(N = k) = Σ_j I_b[j] O_b[j]
for every node b. Top-down: O_root = 1[j = k] and a child takes the correlation of its parent's
O with its sibling's I: O_b[j] = Σ_i I_{b'}[i] O_parent[j + i]. At a leaf,
μ_i = p_i O_i[1] / (p_i O_i[1] + (1 − p_i) O_i[0]) ∈ [0, 1].

**Backward.** The Jacobian of μ is ∇²A = Cov_q(z), symmetric, so the vector–Jacobian product
with ḡ is the directional derivative of μ along ḡ: both passes are bilinear in the leaves, so
their tangents (leaf tangent [−ṗ, ṗ], ṗ = p(1 − p)ḡ, ν held fixed: the identity above holds for
every ν) follow by the product rule, level by level, with the same kernels. The tables of the
forward are saved (O(B·n·log k)); nothing of size (k+1)² is kept. ``backward="unroll"`` instead
runs autograd through the same tree (differentiable to every order).

**Sampling**, top-down through the tree: a node holding c items sends j of them to its left
child with probability I_left[j] I_right[c − j] / I_node[c]; the product over the nodes telescopes
to q(z), so the samples are exact, and it takes ⌈log₂ n⌉ steps for all samples at once.

Kernels: on CPU in float32 the batched convolutions are one depthwise ``conv1d`` per level
(oneDNN); elsewhere (float64, CUDA) a gather of the (m_out, m) band and a ``linalg.vecdot``.
Half-precision inputs are computed in float32.

References: Paulus et al. (2020), "Gradient estimation with stochastic softmax tricks",
arXiv:2006.08063, §4 and App.; Chen, Dempster & Liu (1994), "Weighted finite population sampling
to maximize entropy" (conditional Poisson sampling and the tilted Bernoulli representation).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from perturb import _validation
from perturb._validation import check_int, check_scores, check_tau, scale_by_tau

__all__ = ["ksubset_log_partition", "ksubset_marginals", "sample_ksubset"]

#: ν is searched at most this far below the k-th largest score: σ(40) = 1 in float32 and to
#: 4e-18 in float64, so the top k are certain there.
_CERTAIN = 40.0


# --------------------------------------------------------------------------------------------
# argument handling shared with subsets.py
# --------------------------------------------------------------------------------------------

def _check_k(k: int, n: int, name: str = "k") -> int:
    """1 <= k <= n, else ValueError naming k and n."""
    k = check_int(k, name)
    if not 1 <= k <= n:
        raise ValueError(f"{name} must satisfy 1 <= {name} <= n, got {name}={k} and n={n} "
                         f"(the size of the last dim of the scores)")
    return k


def _scaled_scores(w: torch.Tensor, k: int, tau: float | torch.Tensor, name: str = "w"):
    """Validate (w, k, τ) and return y = w/τ (differentiable in w and τ) and k.

    ``-inf`` scores mask positions; NaN and ``+inf`` are rejected."""
    check_scores(w, name, min_ndim=1, allow_neg_inf=True)
    k = _check_k(k, w.shape[-1])
    check_tau(tau)
    return scale_by_tau(w, tau, 1), k


def _check_feasible(kth: torch.Tensor, k: int, name: str = "w") -> None:
    """Each row needs ≥ k unmasked scores, i.e. a finite k-th largest entry ``kth``.

    A value check (runs while validation is on): a ValueError on CPU, a device-side assert on
    CUDA (see :mod:`perturb._validation`)."""
    if not _validation.validation_enabled() or not kth.numel():
        return
    ok = (kth > -math.inf).all()
    message = (f"{name} has a row with fewer than k={k} entries > -inf: no k-subset has "
               f"positive probability")
    if kth.device.type in _validation._ASYNC_DEVICES:
        _validation._assert_on_device(ok, "perturb: " + message)
    elif not bool(ok):
        raise ValueError(message)


def _work_dtype(y: torch.Tensor) -> torch.Tensor:
    # half precision: computed in float32 (the tilted tables are probabilities; float32 keeps
    # them exact to rounding, see the module docstring)
    return y.float() if y.dtype in (torch.float16, torch.bfloat16) else y


def _flat(y: torch.Tensor) -> torch.Tensor:
    return y.reshape(-1, y.shape[-1])


# --------------------------------------------------------------------------------------------
# the tilt ν
# --------------------------------------------------------------------------------------------

def _prepare(y: torch.Tensor, k: int, name: str = "w"):
    """Shift and tilt. ``y``: ``(B, n)`` in the work dtype, entries finite or -inf.

    Returns ``(ys, c, nu)``: ys = y − c with c ``(B, 1)`` the k-th largest entry (detached; A(y) =
    A(ys) + kc and μ(y) = μ(ys)), and ν ``(B, 1)`` (detached) with E_ν[N] ≈ k for the scores ys.
    """
    n = y.shape[-1]
    top = torch.topk(y.detach(), min(k + 1, n), dim=-1)
    c = top.values[:, k - 1:k]
    _check_feasible(c, k, name)
    ys = y - c
    if k == n:                       # a single subset: any ν far below the scores will do
        return ys, c, torch.full_like(c, -_CERTAIN)
    yt = top.values[:, :k] - c                                      # the top k, ≥ 0
    yr = ys.detach().scatter(-1, top.indices[:, :k], -math.inf)     # the rest, top k masked
    lo = torch.clamp_min(top.values[:, k:] - c - math.log(k), -_CERTAIN)
    hi = torch.full_like(lo, math.log(n - k))
    # start: both sides in their exponential regime, e^ν Σ_top e^{−y} = e^{−ν} Σ_rest e^{y}
    nu = 0.5 * (torch.logsumexp(yr, -1, keepdim=True) - torch.logsumexp(-yt, -1, keepdim=True))
    nu = torch.minimum(torch.maximum(nu, lo), hi)
    # one Newton step on f(ν) = log Σ_top σ(ν − y) − log Σ_rest σ(y − ν) (increasing, f' ≤ 2);
    # where a sum underflows the step is skipped (ν is then already in a safe place: the start
    # sits at `lo`, the top k certain, when the rest is that far below)
    qa, pr = torch.sigmoid(nu - yt), torch.sigmoid(yr - nu)
    a, b = qa.sum(-1, keepdim=True), pr.sum(-1, keepdim=True)
    slope = (qa - qa * qa).sum(-1, keepdim=True) / a + (pr - pr * pr).sum(-1, keepdim=True) / b
    step = torch.log(a / b) / slope
    nu = torch.minimum(torch.maximum(nu - step.nan_to_num(0.0, 0.0, 0.0), lo), hi)
    return ys, c, nu


# --------------------------------------------------------------------------------------------
# batched truncated polynomial products: the kernels
# --------------------------------------------------------------------------------------------
#
# conv: C[g, c] = Σ_i b[g, i] a[g, c − i], c < m_out        (merging two blocks)
# corr: C[g, j] = Σ_i s[g, i] o[g, j + i], j < m             (a child's outside from its parent's)
#
# Two-entry operands (the leaves): elementwise. CPU float32: one depthwise conv1d (oneDNN). CPU, other dtypes: the outer product times a fixed
# 0/1 matrix (one GEMM). Other devices: a gather of the band and a vecdot (plain multiply-adds,
# so TF32 settings never apply).

def _kernel(t: torch.Tensor, m: int) -> str:
    if m == 2:
        return "pair"
    if t.device.type != "cpu":
        return "band"
    return "conv1d" if t.dtype == torch.float32 else "gemm"


@functools.lru_cache(maxsize=256)
def _index(kind: str, m: int, m_out: int, device: torch.device, dtype: torch.dtype):
    """Cached constants: the reversal of m entries, the band gathers, the GEMM 0/1 matrices."""
    if kind == "rev":
        return torch.arange(m - 1, -1, -1, device=device)
    corr = kind.endswith("corr")
    if kind.startswith("gemm"):
        # conv: rows (a index t, b index i), column t + i; corr: rows (o index t, s index i),
        # column t − i
        t, i = torch.arange(m_out if corr else m)[:, None], torch.arange(m)[None, :]
        col = (t - i) if corr else (t + i)
        cols = m if corr else m_out
        e = (col[..., None] == torch.arange(cols)).to(dtype)
        return e.reshape(-1, cols).to(device)
    rows = torch.arange(m if corr else m_out)[:, None]
    cols = torch.arange(m)[None, :]
    idx = rows + cols if corr else rows - cols
    limit = m_out if corr else m
    return torch.where((idx >= 0) & (idx < limit), idx, limit).to(device)


def _conv(a: torch.Tensor, b: torch.Tensor, m_out: int) -> torch.Tensor:
    """C[g, c] = Σ_i b[g, i] a[g, c − i], c < m_out. ``a``, ``b``: ``(G, m)``, m ≤ m_out."""
    G, m = a.shape
    kind = _kernel(a, m)
    if kind == "pair":                  # the leaf level: [a0 b0, a0 b1 + a1 b0, a1 b1][:m_out]
        shifted = F.pad(a[:, :m_out - 1], (1, 0))
        return b[:, :1] * F.pad(a, (0, m_out - 2)) + b[:, 1:] * shifted
    if kind == "conv1d":
        x = F.pad(a, (m - 1, m_out - m)).view(1, G, -1)
        w = b.index_select(1, _index("rev", m, 0, a.device, a.dtype)).view(G, 1, m)
        return F.conv1d(x, w, groups=G).view(G, m_out)
    if kind == "gemm":
        return (a[:, :, None] * b[:, None, :]).view(G, m * m) @ _index(
            "gemm", m, m_out, a.device, a.dtype)
    band = F.pad(a, (0, 1))[:, _index("band", m, m_out, a.device, a.dtype)]
    return torch.linalg.vecdot(band, b[:, None, :])


def _corr(o: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """C[g, j] = Σ_i s[g, i] o[g, j + i], j < m. ``o``: ``(G, m_out)``, ``s``: ``(G, m)``."""
    G, m = s.shape
    m_out = o.shape[-1]
    kind = _kernel(o, m)
    if kind == "pair":                  # the leaf level: [s0 o0 + s1 o1, s0 o1 + s1 o2]
        o = F.pad(o, (0, 3 - m_out))
        return s[:, :1] * o[:, :2] + s[:, 1:] * o[:, 1:]
    if kind == "conv1d":
        x = F.pad(o, (0, 2 * m - 1 - m_out)).view(1, G, -1)
        return F.conv1d(x, s.reshape(G, 1, m), groups=G).view(G, m)
    if kind == "gemm":
        return (o[:, :, None] * s[:, None, :]).view(G, m_out * m) @ _index(
            "gemmcorr", m, m_out, o.device, o.dtype)
    band = F.pad(o, (0, 1))[:, _index("bandcorr", m, m_out, o.device, o.dtype)]
    return torch.linalg.vecdot(band, s[:, None, :])


def _pairs(x: torch.Tensor, one: float):
    """Split a level ``(nb, B, m)`` into the blocks to merge: block q with block q + ⌈nb/2⌉ (any
    pairing is valid, the product is commutative; this one makes both halves contiguous). An odd
    count first gets the block [one, 0, …] appended. Returns (left, right), each ``(P·B, m)``."""
    nb, B, m = x.shape
    if nb % 2:
        x = torch.cat([x, F.pad(x.new_full((1, B, 1), one), (0, m - 1))])
    half = x.shape[0] // 2
    return x[:half].view(-1, m), x[half:].view(-1, m)


def _children(left: torch.Tensor, right: torch.Tensor, B: int, nb: int) -> torch.Tensor:
    """Per-child results ``(P·B, m)`` back to a level ``(nb, B, m)`` (dropping a pad block)."""
    return torch.cat([left, right]).view(-1, B, left.shape[-1])[:nb]


# --------------------------------------------------------------------------------------------
# the passes (plain torch ops: autograd can run through them). Layout: a level is
# (blocks, batch, count), position-major, so that the halves paired above are contiguous.
# --------------------------------------------------------------------------------------------

def _leaves(pt: torch.Tensor) -> torch.Tensor:
    """The leaf level ``(n, B, 2)`` = [1 − p, p] from position-major p ``(n, B)``."""
    return torch.stack([1 - pt, pt], -1)


def _inside(x: torch.Tensor, k: int) -> list[torch.Tensor]:
    """I per level, from the leaves ``(n, B, 2)`` to the root ``(1, B, k+1)``."""
    B = x.shape[1]
    levels = [x]
    while x.shape[0] > 1:
        left, right = _pairs(x, 1.0)
        m_out = min(k + 1, 2 * x.shape[-1] - 1)
        x = _conv(left, right, m_out).view(-1, B, m_out)
        levels.append(x)
    return levels


def _outside(levels: list[torch.Tensor], k: int) -> list[torch.Tensor]:
    """O per level (same shapes as ``levels``), O_root = 1[j = k]."""
    root = levels[-1]
    o = F.pad(root.new_ones(1, root.shape[1], 1), (k, 0))
    outs = [o]
    for x in reversed(levels[:-1]):
        nb, B, _ = x.shape
        left, right = _pairs(x, 1.0)
        parent = o.reshape(-1, o.shape[-1])
        o = _children(_corr(parent, right), _corr(parent, left), B, nb)
        outs.append(o)
    outs.reverse()
    return outs


def _leaf_marginals(pt: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """μ = p O[1] / (p O[1] + (1 − p) O[0]), position-major ``(n, B)``; ``o``: ``(n, B, 2)``."""
    take = pt * o[..., 1]
    return take / (take + (1 - pt) * o[..., 0])


def _tangent_inside(levels, dx, k):
    """İ per level along the leaf tangent ``dx`` ``(n, B, 2)``: İ = İ_L ∗ I_R + I_L ∗ İ_R."""
    B = dx.shape[1]
    dlev = [dx]
    for x, x_next in zip(levels[:-1], levels[1:]):
        left, right = _pairs(x, 1.0)
        dleft, dright = _pairs(dx, 0.0)
        m_out = x_next.shape[-1]
        dx = (_conv(dleft, right, m_out) + _conv(left, dright, m_out)).view(-1, B, m_out)
        dlev.append(dx)
    return dlev


def _tangent_outside(levels, outs, dlev):
    """Ȯ per level: Ȯ_b = corr(Ȯ_parent, I_sibling) + corr(O_parent, İ_sibling), Ȯ_root = 0."""
    do = torch.zeros_like(outs[-1])
    douts = [do]
    for i in range(len(levels) - 2, -1, -1):
        nb, B, _ = levels[i].shape
        left, right = _pairs(levels[i], 1.0)
        dleft, dright = _pairs(dlev[i], 0.0)
        o, dpar = outs[i + 1].reshape(-1, do.shape[-1]), do.reshape(-1, do.shape[-1])
        do = _children(_corr(dpar, right) + _corr(o, dright),
                       _corr(dpar, left) + _corr(o, dleft), B, nb)
        douts.append(do)
    douts.reverse()
    return douts


def _marginals_vjp(p: torch.Tensor, levels: list[torch.Tensor], outs: list[torch.Tensor],
                   mu: torch.Tensor, g: torch.Tensor, k: int) -> torch.Tensor:
    """Cov_q(z) g: the symmetric Jacobian of the marginals applied to g. Pure; tests call it.

    Shapes: p = σ(ys − ν), mu, g ``(B, n)``; ``levels``/``outs`` as returned by :func:`_inside`
    and :func:`_outside` for the leaves ``_leaves(p.t())``; output ``(B, n)``.
    """
    pt, mut = p.t(), mu.t()
    dp = pt * (1 - pt) * g.t()
    dlev = _tangent_inside(levels, torch.stack([-dp, dp], -1), k)
    do = _tangent_outside(levels, outs, dlev)[0]
    o = outs[0]
    den = pt * o[..., 1] + (1 - pt) * o[..., 0]
    dtake = dp * o[..., 1] + pt * do[..., 1]
    dden = dtake - dp * o[..., 0] + (1 - pt) * do[..., 0]
    return ((dtake - mut * dden) / den).t()


# --------------------------------------------------------------------------------------------
# autograd Functions
# --------------------------------------------------------------------------------------------

class _KSubsetMarginals(torch.autograd.Function):
    r"""μ(y) = ∇ log e_k(e^y) by the inside–outside tree; backward μ̇ = Cov_q(z) ḡ (symmetric).

    Inputs: shifted scores ys ``(B, n)``, the tilt ν ``(B, 1)`` (a constant) and k. Outputs: μ
    ``(B, n)`` and, non-differentiable, p = σ(ys − ν) and the inside and outside tables of every
    level, returned so that the backward need not recompute them. The backward is computed once
    (``once_differentiable``); for higher orders use ``backward="unroll"``.
    """

    @staticmethod
    def forward(ys, nu, k):
        p = torch.sigmoid(ys - nu)
        levels = _inside(_leaves(p.t()), k)
        outs = _outside(levels, k)
        return (_leaf_marginals(p.t(), outs[0]).t(), p, *levels, *outs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, _, k = inputs
        ctx.k = k
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(*output)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g, *_):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        mu, p, *tables = ctx.saved_tensors
        half = len(tables) // 2
        return _marginals_vjp(p, tables[:half], tables[half:], mu, g, ctx.k), None, None


def _log_partition_tilted(ys: torch.Tensor, nu: torch.Tensor, k: int) -> torch.Tensor:
    """A(ys) = log P_ν(N = k) + Σ softplus(ys − ν) + kν, plain torch ops; ``(B, n) -> (B,)``."""
    root = _inside(_leaves(torch.sigmoid(ys - nu).t()), k)[-1]
    # softplus as logaddexp(x, 0): F.softplus returns x itself above x = 20, off by e^{-20}
    x = ys - nu
    return torch.log(root[0, :, k]) + torch.logaddexp(x, x.new_zeros(())).sum(-1) + k * nu[:, 0]


class _KSubsetLogPartition(torch.autograd.Function):
    r"""A(ys) by the inside pass; backward ḡ · μ(ys) (μ differentiable once more)."""

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
    r"""Log-partition A(w/τ) = log Σ_{|S| = k} exp(Σ_{i∈S} w_i / τ) of the k-subset family.

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
        >>> round(float(ksubset_log_partition(w, 2).exp()), 6)   # C(5, 2) subsets of weight 1
        10.0
    """
    y, k = _scaled_scores(w, k, tau)
    yw = _flat(_work_dtype(y))
    if not yw.shape[0]:
        return y.new_zeros(w.shape[:-1])
    ys, c, nu = _prepare(yw, k)
    out = _KSubsetLogPartition.apply(ys, nu, k) + k * c[:, 0]
    return out.reshape(w.shape[:-1]).to(y.dtype)


def ksubset_marginals(w: torch.Tensor, k: int, tau: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Marginals μ_i = P_q(i ∈ S) of q(S) ∝ exp(Σ_{i∈S} w_i/τ) over k-subsets: μ = ∇A(w/τ).

    This is the regularized argmax over conv Z with the exponential-family entropy A*
    (``relaxed_topk(w, k, tau, regularizer=ExpFamilyEntropy())``). Inside–outside passes over a
    pairwise tree in log depth (module docstring); μ_i = p_i O_i[1] / (p_i O_i[1] + (1 − p_i)
    O_i[0]), so every entry lies in [0, 1], and Σμ = k. The backward applies Cov_q(z) by the
    tangents of both passes (once differentiable; ``relaxed_topk(..., backward="unroll")``
    differentiates the tree by autograd, to every order).

    Args:
        w: scores; ``-inf`` masks a position (its marginal is 0).
        k: subset size, 1 ≤ k ≤ n.
        tau: temperature τ > 0 (a float, or a tensor broadcastable to ``(*batch)``).

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
    """
    y, k = _scaled_scores(w, k, tau)
    return _marginals_scaled(y, k)


def _sample_tree(levels: list[torch.Tensor], k: int, n_samples: int,
                 generator: torch.Generator | None) -> torch.Tensor:
    """Top-down splits of the count k; ``(n_samples, B, n)`` long 0/1 counts at the leaves."""
    B = levels[0].shape[1]
    count = torch.full((n_samples, 1, B), k, dtype=torch.long, device=levels[0].device)
    for x in reversed(levels[:-1]):
        nb, _, m = x.shape
        left, right = (t.view(-1, B, m).log() for t in _pairs(x, 1.0))
        right = F.pad(right, (0, 1), value=-math.inf)                     # index m: log 0
        j = torch.arange(m, device=x.device)
        rest = torch.where(count[..., None] >= j, (count[..., None] - j).clamp_max(m), m)
        logits = left + torch.gather(right.expand(n_samples, -1, -1, -1), -1, rest)
        u = torch.rand(logits.shape, generator=generator, dtype=logits.dtype, device=x.device)
        to_left = torch.argmax(logits - torch.log(-torch.log(u)), -1)      # Gumbel-max: exact
        count = torch.cat([to_left, count - to_left], 1)[:, :nb]
    return count.transpose(1, 2)


def sample_ksubset(w: torch.Tensor, k: int, tau: float | torch.Tensor = 1.0,
                   n_samples: int | None = None,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Exact samples S ~ q(S) ∝ exp(Σ_{i∈S} w_i/τ) over k-subsets, as 0/1 indicators.

    Top-down through the tree of the inside pass: a node holding c items sends j to its left
    child with probability I_left[j] I_right[c − j] / I_node[c] (drawn by Gumbel-max); the product
    telescopes to q(S). Unlike Gumbel top-k (which samples without replacement, a different
    distribution), the samples follow q exactly, so E[z] = :func:`ksubset_marginals`
    (unbiased score-function baselines).

    Args:
        w: scores; ``-inf`` masks a position (never sampled).
        k: subset size, 1 ≤ k ≤ n.
        tau: temperature τ > 0.
        n_samples: if given, a leading dim of that many independent samples.
        generator: a ``torch.Generator`` for reproducibility (on the device of ``w``).

    Shape: ``w``: ``(*batch, n)``; output ``(*batch, n)`` or ``(n_samples, *batch, n)``, dtype of
    ``w``; no gradient.

    Raises:
        ValueError: k outside [1, n], τ ≤ 0, bad ``n_samples``, NaN/+inf in ``w``, a row with
            fewer than k entries > -inf.

    Complexity: O(nk) for the tables, then ⌈log₂ n⌉ steps for all samples at once, memory
    O(n_samples·B·n·min(k, ·)) per level.
    """
    if n_samples is not None:
        check_int(n_samples, "n_samples", low=1)
    with torch.no_grad():
        y, k = _scaled_scores(w.detach() if isinstance(w, torch.Tensor) else w, k, tau)
        yw = _flat(_work_dtype(y))
        S = 1 if n_samples is None else n_samples
        if yw.shape[0]:
            ys, _, nu = _prepare(yw, k)
            levels = _inside(_leaves(torch.sigmoid(ys - nu).t()), k)
            out = _sample_tree(levels, k, S, generator).to(w.dtype)
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
    @torch.autograd.function.once_differentiable
    def backward(ctx, g, *_):
        mu, yt, alpha, beta = ctx.saved_tensors
        return _sequential_jvp(yt, alpha, beta, mu.t(), g.t(), ctx.k).t(), None


def _sequential_log_partition(y: torch.Tensor, k: int) -> torch.Tensor:
    """The former log-partition: α[n, k] + k·(k-th largest); ``(B, n) -> (B,)``, no backward."""
    c = torch.topk(y.detach(), k, dim=-1).values[..., -1]
    return _sequential_tables(y, k)[1][-1, k] + k * c
