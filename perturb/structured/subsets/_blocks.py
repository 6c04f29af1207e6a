r"""Kernels of the correlated k-subsets: block tables, their merges and the top-down passes.

The math (block tables, the (logsumexp, +) merge, the top-down pass) is stated in
:mod:`perturb.structured.subsets.correlated`; this module holds its tensor implementation, plain
torch ops, no validation.

**Layout (count-major, as the k-subset tree of** :mod:`._tree` **).** Tables are
``(2(s), 2(u), m(c), nb, B)`` (state of the item before the block, state of the block's last
item, count, block, batch row): the block and batch dims trail, so every op of a level runs over
rows of nb·B (or B) contiguous entries. Split scores are ``(2(s), 2m(t, i), 2(u), m_out(c), P,
B)`` (:func:`_split_scores`): the split (t, i), with the left count j = m − 1 − i reversed, is a
middle dim, and its reductions (logsumexp, softmax, max) run over the long rows behind it. With
the batch leading (``(nb, B, s, u, c)``) the same ops ran over rows of 2m_out entries: 2–5x
slower per op.

**Weights.** The split weights exp(S − max S) are computed from S − max S clamped at
log(tiny) + 10 (:func:`_floor`): an exp that underflows costs 5–15x a normal one on CPU (the
vectorised exp's slow path), and the "−∞" entries of the tables would all underflow; the
weights, that exp over the split's sum, stay normal numbers too (denormal operands slow every
product of the top-down pass). The clamped entries get weight ≤ e¹⁰·tiny relative to the
split's largest (3·10⁻³⁴ in float32, 5·10⁻³⁰⁴ in float64), far below rounding.

**Analytic backward** (:func:`_marginals_jvp`). The Jacobian of μ is ∇²A = Cov_q(z), symmetric,
so the VJP with ḡ is the directional derivative of μ along ḡ. The forward keeps, per merge, the
split weights W = softmax_{(t,j)}(S) (:func:`_weighted_inside`) and, per level, the state
probabilities of the top-down pass (:func:`_down`). The tangents follow level by level with the
same kernels: inside, ṡ = Ṫ_L + Ṫ_R on the band (:func:`_split_scores` of the tangent tables)
and Ṫ = Σ W ṡ; top-down, ẇ = proḃ · W + prob · W (ṡ − Ṫ_parent) through the same linear map
to the children (:func:`_children`). One pass up and one down, no double backward.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from perturb._validation import traced


def _neg(dtype: torch.dtype) -> float:
    """The finite stand-in for log 0: two of them still add up without overflow."""
    return -torch.finfo(dtype).max / 16


def _floor(dtype: torch.dtype) -> float:
    """The lowest exponent given to exp: its result, divided by a split's sum (≤ 2m entries,
    each ≤ 1), stays normal for m < 10⁴ (module docstring)."""
    return math.log(torch.finfo(dtype).tiny) + 10.0


# --------------------------------------------------------------------------------------------
# block tables: leaves, merges, the inside pass
# --------------------------------------------------------------------------------------------

def _leaves(y: torch.Tensor, d: int) -> torch.Tensor:
    """Leaf tables ``(2(s), 2(t), 2(c), d, B)`` from scores ``(B, 2d − 1)`` (module docstring
    of :mod:`.correlated`): T[s, 0, 0] = 0, T[s, 1, 1] = a_i + s·b_{i−1}, else "−∞"."""
    a = y[:, :d].t()                                          # (d, B)
    e = F.pad(y[:, d:].t(), (0, 0, 1, 0))                     # b_{i−1}, 0 for the first item
    zero = torch.zeros_like(a)
    neg = torch.full_like(a, _neg(y.dtype))
    off = torch.stack([zero, neg])                            # t = 0: (c=0) 0, (c=1) −∞
    rows = [torch.stack([off, torch.stack([neg, a + e if s else a])]) for s in (0, 1)]
    return torch.stack(rows)


def _identity(like: torch.Tensor) -> torch.Tensor:
    """The empty block ``(2, 2, m, 1, B)``: state passes through, no item chosen."""
    m, B = like.shape[2], like.shape[4]
    out = torch.full((2, 2, m, 1, B), _neg(like.dtype), dtype=like.dtype, device=like.device)
    out[0, 0, 0] = 0.0
    out[1, 1, 0] = 0.0
    return out


def _pairs(x: torch.Tensor, tangent: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(left, right) children of the next level ``(2, 2, m, P, B)``; an odd count gets the
    identity appended (for a table of tangents: zeros, the identity being constant)."""
    if x.shape[3] % 2:
        x = torch.cat([x, torch.zeros_like(x[:, :, :, :1]) if tangent else _identity(x)], 3)
    return x[:, :, :, 0::2], x[:, :, :, 1::2]


def _split_scores(left: torch.Tensor, right: torch.Tensor, k: int,
                  fill: float | None = None) -> torch.Tensor:
    """S[s, t·m + i, u, c, p, b] = T_L[s, t, j] + T_R[t, u, c − j] with j = m − 1 − i (the
    left count reversed), c < m_out = min(k, 2(m−1)) + 1: ``(2, 2m, 2, m_out, P, B)``.

    T_R[c − j] for every (c, i) is a view, the windows of T_R padded with m − 1 "−∞" counts in
    front (``unfold``: window c holds T_R[c − (m − 1) + i]), hence the reversed left count; the
    sum is the one pass over the output. ``fill``: the value of T_R outside its counts (default
    "−∞"; 0 for tables of tangents)."""
    _, _, m, P, B = left.shape
    m_out = min(k, 2 * (m - 1)) + 1
    value = _neg(right.dtype) if fill is None else fill
    rp = F.pad(right, (0, 0, 0, 0, m - 1, m_out - m), value=value)      # (t, u, m_out+m−1, P, B)
    rg = rp.unfold(2, m, 1).permute(0, 5, 1, 2, 3, 4)[None]             # (1, t, i, u, c, P, B)
    lt = left.flip(2)[:, :, :, None, None]                              # (s, t, i, 1, 1, P, B)
    if traced(left) or (torch.is_grad_enabled() and (left.requires_grad or right.requires_grad)):
        out = (lt + rg).contiguous()             # autograd, torch.func, compile: no out=
    else:
        out = left.new_empty((2, 2, m, 2, m_out, P, B))
        torch.add(lt, rg, out=out)
    return out.view(2, 2 * m, 2, m_out, P, B)


def _reduce(s: torch.Tensor, op: str) -> torch.Tensor:
    """⊕ over the split (t, i), dim 1 of :func:`_split_scores`."""
    return torch.logsumexp(s, 1) if op == "lse" else s.amax(1)


def _inside(leaves: torch.Tensor, k: int, op: str = "lse") -> list[torch.Tensor]:
    """Tables of every level, leaves first, root (one block) last. op: "lse" or "max"."""
    levels = [leaves]
    neg = _neg(leaves.dtype)
    while levels[-1].shape[3] > 1:
        s = _split_scores(*_pairs(levels[-1]), k)
        levels.append(_reduce(s, op).clamp_min(neg))                     # (s, u, c, P, B)
    return levels


def _prepare(y: torch.Tensor, d: int, k: int, op: str = "lse") -> list[torch.Tensor]:
    return _inside(_leaves(y, d), k, op)


def _root_logits(levels: list[torch.Tensor], k: int) -> torch.Tensor:
    """log-weights ``(B, 2)`` of the last item's state u at the root (s = 0, c = k)."""
    return levels[-1][0, :, k, 0].t()


# --------------------------------------------------------------------------------------------
# the top-down passes
# --------------------------------------------------------------------------------------------

def _children(w: torch.Tensor, nb: int) -> torch.Tensor:
    """The children's state probabilities ``(2, 2, m, nb, B)`` from the joint probabilities of
    (parent state, split) ``w`` ``(2(s), 2m(t, i), 2(u), m_out(c), P, B)`` (the order of
    :func:`_split_scores`): the left child is in (s, t, j), the right one in (t, u, c − j),
    j = m − 1 − i. Linear in ``w``."""
    _, m2, _, m_out, P, B = w.shape
    m = m2 // 2
    w = w.view(2, 2, m, 2, m_out, P, B)
    p_left = w.sum(dim=(3, 4)).flip(2)                                  # (s, t, j, P, B)
    ws = w.sum(0)                                                       # (t, i, u, c, P, B)
    # right count c' = c − j: one slice add per left count j (i = m − 1 − j)
    p_right = ws[:, m - 1, :, :m].clone()                               # j = 0
    for j in range(1, min(m, m_out)):
        n = min(m_out - j, m)
        p_right[:, :, :n] += ws[:, m - 1 - j, :, j:j + n]
    out = torch.stack([p_left, p_right], 4)                             # (2, 2, m, P, 2, B)
    return out.view(2, 2, m, 2 * P, B)[:, :, :, :nb]


def _root_state(levels: list[torch.Tensor], k: int) -> torch.Tensor:
    """The root's state probabilities ``(2, 2, m, 1, B)``: s = 0, c = k, u by its softmax."""
    q = torch.softmax(_root_logits(levels, k), -1)                       # (B, u)
    return _at_root(q, levels[-1].shape[2], k)


def _at_root(q: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """``(2, 2, m, 1, B)`` zeros but ``q.t()`` ``(u, B)`` at [s = 0, :, c = k, 0]; built out of
    place, so that a vmapped ``q`` (a tangent under torch.func) makes a vmapped result."""
    col = F.pad(q.t().unsqueeze(1), (0, 0, k, m - k - 1))               # (u, m, B)
    return torch.stack([col, torch.zeros_like(col)]).unsqueeze(3)


def _extract(prob: torch.Tensor) -> torch.Tensor:
    """μ ``(B, 2d − 1)`` from the leaves' state probabilities ``(s, t, c, d, B)``."""
    unary = prob[:, 1, 1].sum(0)                                          # (d, B)
    pair = prob[1, 1, 1, 1:]                                              # (d − 1, B)
    return torch.cat([unary, pair], 0).t()


def _marginals_from_levels(levels: list[torch.Tensor], d: int, k: int) -> torch.Tensor:
    """Mass-conserving top-down pass: μ ``(B, 2d − 1)`` from the (logsumexp, +) tables (plain
    autograd ops; the analytic path is :func:`_weighted_inside` and :func:`_down`)."""
    prob = _root_state(levels, k)
    for x in reversed(levels[:-1]):
        s = _split_scores(*_pairs(x), k)                                  # (s, t·i, u, c, P, B)
        # P(split | node state): a softmax over (t, i), normalised here rather than by the
        # parent's table (whose rounding is relative to its magnitude, up to ~1e10), so each
        # conditional sums to 1 to rounding and the mass is conserved
        prob = _children(prob.unsqueeze(1) * torch.softmax(s, 1), x.shape[3])
    return _extract(prob)


# --------------------------------------------------------------------------------------------
# the analytic path: saved split weights, and the tangent passes
# --------------------------------------------------------------------------------------------

def _weighted_inside(y: torch.Tensor, d: int, k: int
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The (logsumexp, +) tables and, per merge, the split weights W = softmax over (t, i) of
    :func:`_split_scores` ``(2, 2m, 2, m_out, P, B)`` (one exp per split score, reused by the
    top-down pass and the tangents). No autograd (in place)."""
    levels = [_leaves(y, d)]
    weights = []
    neg, floor = _neg(y.dtype), _floor(y.dtype)
    while levels[-1].shape[3] > 1:
        s = _split_scores(*_pairs(levels[-1]), k)
        top = s.amax(1, keepdim=True)
        e = s.sub_(top).clamp_min_(floor).exp_()
        z = e.sum(1, keepdim=True)
        levels.append(z.log().add_(top).clamp_min_(neg).squeeze(1))
        weights.append(e.div_(z))
    return levels, weights


def _down(levels: list[torch.Tensor], weights: list[torch.Tensor], k: int) -> list[torch.Tensor]:
    """State probabilities per level, root first, leaves last (:func:`_marginals_from_levels`
    with the saved weights)."""
    probs = [_root_state(levels, k)]
    for x, W in zip(reversed(levels[:-1]), reversed(weights)):
        probs.append(_children(probs[-1].unsqueeze(1) * W, x.shape[3]))
    return probs


def _leaf_tangent(g: torch.Tensor, d: int) -> torch.Tensor:
    """Tangents of the leaf tables along ḡ ``(B, 2d − 1)``: Ṫ[s, 1, 1] = ḡ_i + s·ḡ_{d+i−1}."""
    ga = g[:, :d].t()
    gb = F.pad(g[:, d:].t(), (0, 0, 1, 0))
    out = g.new_zeros(2, 2, 2, d, g.shape[0])
    out[0, 1, 1] = ga
    out[1, 1, 1] = ga + gb
    return out


def _marginals_jvp(levels: list[torch.Tensor], weights: list[torch.Tensor],
                   probs: list[torch.Tensor], g: torch.Tensor, d: int, k: int) -> torch.Tensor:
    """μ̇ = Cov_q(z) ḡ (= the VJP: the Jacobian ∇²A is symmetric) by the tangents of both passes.

    Inside: ṡ = Ṫ_L[s,t,j] + Ṫ_R[t,u,c−j] and Ṫ = Σ_split W ṡ (the derivative of logsumexp).
    Top-down: the child probabilities are linear in w = prob · W, with Ẇ = W (ṡ − Ṫ_parent), so
    ẇ = proḃ W + prob Ẇ; at the root q̇ = q (ṙ − ⟨q, ṙ⟩). Shapes: ``g`` ``(B, 2d − 1)``, the
    lists as from :func:`_weighted_inside` and :func:`_down`; output ``(B, 2d − 1)``. Pure."""
    dlevels = [_leaf_tangent(g, d)]
    dscores = []
    for W in weights:
        ds = _split_scores(*_pairs(dlevels[-1], tangent=True), k, fill=0.0)
        dscores.append(ds)
        dlevels.append((W * ds).sum(1))
    q = torch.softmax(_root_logits(levels, k), -1)                       # (B, u)
    dr = _root_logits(dlevels, k)
    dq = q * (dr - (q * dr).sum(-1, keepdim=True))
    dprob = _at_root(dq, probs[0].shape[2], k)
    for x, W, ds, dt, prob in zip(reversed(levels[:-1]), reversed(weights), reversed(dscores),
                                  reversed(dlevels[1:]), probs[:-1]):
        # ẇ = W (proḃ + prob (ṡ − Ṫ_parent)), in place in ṡ (a temporary of this function)
        dw = ds.sub_(dt.unsqueeze(1)).mul_(prob.unsqueeze(1)).add_(dprob.unsqueeze(1)).mul_(W)
        dprob = _children(dw, x.shape[3])
    return _extract(dprob)
