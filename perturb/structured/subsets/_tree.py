r"""Kernels of the k-subset exponential family: the tilt ν and the tree over count distributions.

The math (tilting, inside/outside passes, the tangent backward, sampling) is stated in
:mod:`perturb.structured.subsets.dp`; this module holds its tensor implementation, plain torch
ops only (autograd can run through every function here), no validation.

**Layout (count-major).** Each row of ``B`` flattened batch elements is padded to N = 2^L ≥ n
positions with p = 0 (a certain miss changes no count). A tree level is a table
``(m, nb, B)``: entry [j, q, b] is the probability of count j in block q of row b (m = min(k,
block size) + 1). The leaves are the positions, [1 − p, p] = [σ(−x), σ(x)] (the second form
keeps 1 − p exact to rounding when p ≈ 1). Block q is merged with block q + nb/2 (any pairing is
valid: the product is commutative), so the two halves ``t[:, :nb/2]`` and ``t[:, nb/2:]`` hold the
pairs and every op of a level runs over a count row of nb/2·B contiguous entries: large,
vectorised, and split over threads by element. The root is ``(k + 1, 1, B)``.

**Kernels.** A merge is the truncated convolution I(c) = Σ_i L[i] R[c − i], c < m_out
(:func:`_conv`); a split the correlation O(j) = Σ_i I[i] o[j + i], j < m (:func:`_corr`), for
both children at once (each child takes its sibling's I: the halves swapped). Their tangents are
two such products. Each is computed one of two ways (:func:`_kernel`):

- ``"shift"`` (CPU, large levels, outside autograd recording and ``torch.func``): a zero table
  accumulates one ``addcmul_`` per count i, out[i : i + e] += L[i] · R[:e]: m ops of streaming
  multiply-adds, no temporary;
- ``"window"`` (elsewhere: GPU, small levels, autograd, torch.func, torch.compile): the windows
  of the zero-padded operand (``unfold``, a view) times the other operand reversed, summed: two
  ops, a temporary of m_out·m entries per column.

Measured on CPU (256 × 1024 positions, k = 10, one thread): the shift kernel is 2.5–5× faster
than the windows at the widest levels, 2–3× faster than the depthwise ``conv1d`` of the former
row-major layout there, and the windows win on the smallest levels, where the per-op cost of m
ops dominates (with the threshold on entries per count row instead, large k ran the windows on
m_out·m-entry temporaries: 4.5× slower at k = 80). The crossover is machine-dependent: 2^15
entries per operand on the machine of the rewrite; on another (slower memory, costlier page
faults) 2^14 was 2–20 % faster than 2^15 from 16 × 4000 to 256 × 1000 at k = 10 and 40, on one
and two threads, level at k = 80 and within 3 % at 32 × 128 (in-process interleaved runs). The
first term of a product writes its output (no zero-fill pass).

Backward leaves: μ is unchanged when a leaf [1 − p_i, p_i] is scaled, so along ḡ the leaf
[1 − p_i, p_i e^{ε ḡ_i}] (a rescaled [1 − p_i(ε), p_i(ε)], p_i(ε) = σ(y_i + εḡ_i − ν)) gives the
same μ̇: its tangent is [0, p_i ḡ_i].
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from perturb._validation import traced

#: ν is searched at most this far below the k-th largest score: σ(40) = 1 in float32 and to
#: 4e-18 in float64, so the top k are certain there.
_CERTAIN = 40.0

#: operand entries from which the CPU uses the shift kernel (measured; module docstring)
_SHIFT_MIN = 1 << 14


# --------------------------------------------------------------------------------------------
# the tilt ν
# --------------------------------------------------------------------------------------------

def _tilt(y: torch.Tensor, k: int):
    """Shift and tilt. ``y``: ``(B, n)`` in the work dtype, entries finite or -inf.

    Returns ``(ys, c, nu)``: ys = y − c with c ``(B, 1)`` the k-th largest entry (detached; A(y) =
    A(ys) + kc and μ(y) = μ(ys)), and ν ``(B, 1)`` (detached) with E_ν[N] ≈ k for the scores ys.
    ``c`` is -inf on a row with fewer than k entries > -inf (the caller checks).
    """
    n = y.shape[-1]
    top = torch.topk(y.detach(), min(k + 1, n), dim=-1)
    c = top.values[:, k - 1:k]
    ys = y - c
    if k == n:                       # a single subset: any ν far below the scores will do
        return ys, c, torch.full_like(c, -_CERTAIN)
    yt = top.values[:, :k] - c                                      # the top k, ≥ 0
    yr = ys.detach().scatter(-1, top.indices[:, :k], -math.inf)     # the rest, top k masked
    lo = torch.clamp_min(top.values[:, k:] - c - math.log(k), -_CERTAIN)
    hi = math.log(n - k)
    # start: both sides in their exponential regime, e^ν Σ_top e^{−y} = e^{−ν} Σ_rest e^{y}
    nu = 0.5 * (torch.logsumexp(yr, -1, keepdim=True) - torch.logsumexp(-yt, -1, keepdim=True))
    nu = torch.clamp(nu, lo).clamp_max(hi)
    # one Newton step on f(ν) = log Σ_top σ(ν − y) − log Σ_rest σ(y − ν) (increasing, f' ≤ 2);
    # where a sum underflows the step is skipped (ν is then already in a safe place: the start
    # sits at `lo`, the top k certain, when the rest is that far below)
    qa, pr = torch.sigmoid(nu - yt), torch.sigmoid(yr - nu)
    a, b = qa.sum(-1, keepdim=True), pr.sum(-1, keepdim=True)
    slope = (qa - qa * qa).sum(-1, keepdim=True) / a + (pr - pr * pr).sum(-1, keepdim=True) / b
    step = torch.log(a / b) / slope
    nu = torch.clamp(nu - step.nan_to_num(0.0, 0.0, 0.0), lo).clamp_max(hi)
    return ys, c, nu


def _leaves(x: torch.Tensor) -> torch.Tensor:
    """The leaf table [σ(−x), σ(x)] of x = ys − ν ``(B, n)``, padded with p = 0 to N = 2^L ≥ n
    positions, count-major: ``(2, N, B)``."""
    n = x.shape[-1]
    N = 1 << max(0, math.ceil(math.log2(n)))
    # transposed once, contiguously: stacking the transposed view is ten times slower
    xt = (F.pad(x, (0, N - n), value=-math.inf) if N > n else x).T.contiguous()
    return torch.sigmoid(torch.stack([-xt, xt]))


# --------------------------------------------------------------------------------------------
# the two products and their kernels
# --------------------------------------------------------------------------------------------

def _kernel(t: torch.Tensor, entries: int) -> str:
    """``"shift"`` or ``"window"`` for a product whose operand has ``entries`` entries."""
    if t.device.type != "cpu" or entries < _SHIFT_MIN or traced(t):
        return "window"
    return "window" if torch.is_grad_enabled() and t.requires_grad else "shift"


def _rows(t: torch.Tensor, front: int, back: int) -> torch.Tensor:
    """``t`` with ``front`` and ``back`` zero rows added along dim 0."""
    if not (front or back):
        return t
    return F.pad(t, (0, 0) * (t.dim() - 1) + (front, back))


def _windows(t: torch.Tensor, m: int) -> tuple[torch.Tensor, ...]:
    """The views t[i : i + m] along dim 0, i ≤ len(t) − m, in three ops (not one slice each)."""
    if t.shape[0] <= m:
        return (t,) if t.shape[0] == m else ()
    return t.unfold(0, m, 1).movedim(-1, 1).unbind(0)


def _conv(L: torch.Tensor, R: torch.Tensor, m_out: int,
          acc: torch.Tensor | None = None) -> torch.Tensor:
    """out[c] = Σ_i L[i] R[c − i], c < m_out (the merge), plus ``acc`` if given (the shift
    kernel adds into it in place); ``L``, ``R`` ``(m, *cols)`` of one shape, m ≤ m_out; output
    ``(m_out, *cols)``."""
    m = L.shape[0]
    if _kernel(L, R.numel()) == "shift" and not R.requires_grad:
        out = L.new_empty((m_out,) + L.shape[1:]) if acc is None else acc
        full = _windows(out, m)                                 # out[i : i + m], i ≤ m_out − m
        for i, li in enumerate(L.unbind(0)):
            if i == 0 and acc is None:          # the first term writes: no zero-fill pass
                torch.mul(li, R, out=full[0])
                if m_out > m:
                    out[m:].zero_()
            elif i < len(full):
                full[i].addcmul_(li, R)
            else:
                out[i:].addcmul_(li, R[:m_out - i])
        return out
    # windows W[c, …, i'] = R[c + i' − (m − 1)] times L[m − 1 − i']
    windows = _rows(R, m - 1, m_out - m).unfold(0, m, 1)
    out = (windows * L.flip(0).movedim(0, -1)).sum(-1)
    return out if acc is None else acc + out


def _corr(o: torch.Tensor, I: torch.Tensor, acc: torch.Tensor | None = None) -> torch.Tensor:
    """out[j] = Σ_i I[i] o[j + i], j < m (the split), plus ``acc`` if given (added in place by
    the shift kernel); ``I`` ``(m, *cols)``, ``o`` ``(m_o, *cols_o)`` broadcastable to ``I``
    beyond dim 0, m_o ≤ 2m − 1; output ``(m, *cols)``."""
    m, m_o = I.shape[0], o.shape[0]
    if _kernel(I, I.numel()) == "shift" and not o.requires_grad:
        full = _windows(o, m)                                   # o[i : i + m], i ≤ m_o − m
        if acc is None:                         # the first term writes: no zero-fill pass
            out = I.new_empty(I.shape)
            if full:
                torch.mul(I[0], full[0], out=out)
            else:
                out.zero_()
        else:
            out = acc
        for i, ii in enumerate(I.unbind(0)[:m_o]):
            if i == 0 and acc is None and full:
                continue
            if i < len(full):
                out.addcmul_(ii, full[i])
            else:
                out[:m_o - i].addcmul_(ii, o[i:])
        return out
    windows = _rows(o, 0, 2 * m - 1 - m_o).unfold(0, m, 1)[:m]      # W[j, …, i] = o[j + i]
    out = (windows * I.movedim(0, -1)).sum(-1)
    return out if acc is None else acc + out


def _halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = t.shape[1] // 2
    return t[:, :h], t[:, h:]


def _swapped(t: torch.Tensor) -> torch.Tensor:
    """``(m, nb, B) -> (m, 2, nb/2, B)`` with the halves swapped: each block's sibling (a copy
    by ``cat``: ``flip`` is several times slower)."""
    m, nb, B = t.shape
    left, right = _halves(t)
    return torch.cat([right, left], 1).view(m, 2, nb // 2, B)


def _merge(t: torch.Tensor, k: int) -> torch.Tensor:
    """The parents' I of a level: ``(m, nb, B) -> (min(k + 1, 2m − 1), nb/2, B)``."""
    m = t.shape[0]
    return _conv(*_halves(t), min(k + 1, 2 * m - 1))


def _split(o: torch.Tensor, sw: torch.Tensor, acc: torch.Tensor | None = None) -> torch.Tensor:
    """The children's O from the parents' ``o`` ``(m_o, nb/2, B)`` and the children's I with
    the halves swapped, ``sw`` ``(m, 2, nb/2, B)`` (:func:`_swapped`): O_child[j] = Σ_i
    I_sibling[i] o[j + i], plus ``acc`` ``(m, 2, nb/2, B)`` if given (see :func:`_corr`);
    ``(m, 2, nb/2, B)``."""
    return _corr(o.unsqueeze(1), sw, acc)


# --------------------------------------------------------------------------------------------
# the passes
# --------------------------------------------------------------------------------------------

def _inside(t0: torch.Tensor, k: int) -> list[torch.Tensor]:
    """``[I_0, …, I_L]``: the leaf table ``(2, N, B)`` as from :func:`_leaves`, then I per
    level, up to the root ``(k + 1, 1, B)``."""
    tables = [t0]
    while tables[-1].shape[1] > 1:
        tables.append(_merge(tables[-1], k))
    return tables


def _outside(ins: list[torch.Tensor], k: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """O per level for ``ins = [I_0, …, I_L]``, same shapes, O_root = 1[j = k]; and the tables
    below the root with their halves swapped (:func:`_swapped`), which the backward reuses."""
    root = ins[-1]
    o = (torch.arange(k + 1, device=root.device) == k).to(root.dtype)[:, None, None]
    outs, sws = [o.expand(root.shape)], []
    for t in reversed(ins[:-1]):
        sws.append(_swapped(t))
        outs.append(_split(outs[-1], sws[-1]).reshape(t.shape))
    outs.reverse()
    sws.reverse()
    return outs, sws


def _leaf_marginals(t0: torch.Tensor, o0: torch.Tensor) -> torch.Tensor:
    """μ ``(B, N)`` from the leaf table and its O ``(2, N, B)``: μ = p O[1] / (p O[1] + (1 − p)
    O[0]) ∈ [0, 1]."""
    w = t0 * o0
    return (w[1] / (w[0] + w[1])).T


def _marginals_jvp(t0: torch.Tensor, sws: list[torch.Tensor], outs: list[torch.Tensor],
                   g: torch.Tensor, k: int) -> torch.Tensor:
    """μ̇ along g ``(B, N)`` (zero-padded): tangents of both passes, ν fixed. ``t0`` the leaf
    table, ``outs`` = [O_0, …, O_L] and ``sws`` = [I_0, …, I_{L−1}] with swapped halves, as
    :func:`_outside` returns them."""
    dp = t0[1] * g.T.contiguous()                                      # leaf tangent [0, p g]
    dins = [torch.stack([torch.zeros_like(dp), dp])]
    for sw in sws[:-1]:
        (b, a), (da, db) = sw.unbind(1), _halves(dins[-1])
        m_out = min(k + 1, 2 * sw.shape[0] - 1)
        dins.append(_conv(a, db, m_out, _conv(da, b, m_out)))          # product rule
    # each tangent term is its own product: stacking the duals into one product over a pair dim
    # was measured 1.4x slower (the stacking copies and the sum over that dim)
    do = None
    for sw, dt, o in zip(reversed(sws), reversed(dins), reversed(outs[1:])):
        acc = None if do is None else _split(do, sw)
        do = _split(o, _swapped(dt), acc).reshape(dt.shape)
    w = t0 * outs[0]
    den = w[0] + w[1]
    dtake = dp * outs[0][1] if do is None else dp * outs[0][1] + t0[1] * do[1]
    dmiss = None if do is None else t0[0] * do[0]
    num = dtake * w[0] if dmiss is None else dtake * w[0] - w[1] * dmiss
    return (num / (den * den)).T


def _sample(ins: list[torch.Tensor], k: int, n_samples: int,
            generator: torch.Generator | None) -> torch.Tensor:
    """Top-down splits of the count k through ``ins`` = [I_0, …, I_L]; ``(n_samples, B, N)``
    long 0/1 at the positions."""
    B, dev = ins[-1].shape[-1], ins[-1].device
    count = torch.full((n_samples, 1, B), k, dtype=torch.long, device=dev)
    for t in reversed(ins[:-1]):
        m = t.shape[0]
        left, right = (h.log().movedim(0, -1) for h in _halves(t))         # (nb/2, B, m)
        right = F.pad(right, (0, 1), value=-math.inf)                       # index m: log 0
        rest = count[..., None] - torch.arange(m, device=dev)
        rest = torch.where((rest >= 0) & (rest < m), rest, m)
        logits = left + torch.gather(right.expand(n_samples, -1, -1, -1), -1, rest)
        u = torch.rand(logits.shape, generator=generator, dtype=logits.dtype, device=dev)
        to_left = torch.argmax(logits - torch.log(-torch.log(u)), -1)   # Gumbel-max: exact
        count = torch.cat([to_left, count - to_left], 1)
    return count.transpose(1, 2)
