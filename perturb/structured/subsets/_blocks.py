r"""Kernels of the correlated k-subsets: block tables, their merges and the top-down passes.

The math (block tables, the (logsumexp, +) merge, the top-down pass) is stated in
:mod:`perturb.structured.subsets.correlated`; this module holds its tensor implementation, plain
torch ops, no validation. Tables are ``(nb, B, 2(s), 2(u), m(c))`` (block, batch row, state of
the item before the block, state of the block's last item, count). Split scores put the split
(t, j) first (:func:`_split_scores`) so that every reduction over it runs over long contiguous
rows.

**Analytic backward** (:func:`_marginals_jvp`). The Jacobian of μ is ∇²A = Cov_q(z), symmetric,
so the VJP with ḡ is the directional derivative of μ along ḡ. The forward keeps, per merge, the
split weights W = softmax_{(t,j)}(S) (:func:`_weighted_inside`) and, per level, the state
probabilities of the top-down pass (:func:`_down`). The tangents follow level by level with the
same kernels: inside, ṡ = Ṫ_L + Ṫ_R on the band (:func:`_split_scores` of the tangent tables)
and Ṫ = Σ W ṡ; top-down, ẇ = proḃ · W + prob · W (ṡ − Ṫ_parent) through the same linear map
to the children (:func:`_children`). One pass up and one down, no double backward.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

def _neg(dtype: torch.dtype) -> float:
    """The finite stand-in for log 0: two of them still add up without overflow."""
    return -torch.finfo(dtype).max / 16


# --------------------------------------------------------------------------------------------
# block tables: leaves, merges, the inside pass
# --------------------------------------------------------------------------------------------

def _leaves(y: torch.Tensor, d: int) -> torch.Tensor:
    """Leaf tables ``(d, B, 2(s), 2(t), 2(c))`` from scores ``(B, 2d − 1)`` (module docstring)."""
    a = y[:, :d].t()                                          # (d, B)
    e = F.pad(y[:, d:].t(), (0, 0, 1, 0))                     # b_{i−1}, 0 for the first item
    zero = torch.zeros_like(a)
    neg = torch.full_like(a, _neg(y.dtype))
    off = torch.stack([zero, neg], -1)                        # t = 0: (c=0) 0, (c=1) −∞
    rows = [torch.stack([off, torch.stack([neg, a + s * e], -1)], -2) for s in (0, 1)]
    return torch.stack(rows, -3)


def _identity(like: torch.Tensor) -> torch.Tensor:
    """The empty block ``(1, B, 2, 2, m)``: state passes through, no item chosen."""
    _, B, _, _, m = like.shape
    out = torch.full((1, B, 2, 2, m), _neg(like.dtype), dtype=like.dtype, device=like.device)
    out[..., 0, 0, 0] = 0.0
    out[..., 1, 1, 0] = 0.0
    return out


def _pairs(x: torch.Tensor, tangent: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(left, right) children of the next level; an odd count gets the identity appended (for a
    table of tangents: zeros, the identity being constant)."""
    if x.shape[0] % 2:
        x = torch.cat([x, torch.zeros_like(x[:1]) if tangent else _identity(x)], 0)
    return x[0::2], x[1::2]


def _band(m: int, m_out: int, device: torch.device) -> torch.Tensor:
    """idx[c, j] = c − j where 0 ≤ c − j < m, else m (a padded "−∞" slot): ``(m_out, m)``."""
    c = torch.arange(m_out, device=device)[:, None]
    j = torch.arange(m, device=device)[None, :]
    idx = c - j
    return torch.where((idx >= 0) & (idx < m), idx, m)


def _split_scores(left: torch.Tensor, right: torch.Tensor, k: int,
                  fill: float | None = None) -> torch.Tensor:
    """S[t·m + j, p, b, s, u, c] = T_L[s, t, j] + T_R[t, u, c − j], c < min(k, 2(m−1)) + 1.

    The split (t, j) is the first dim, so that its reductions (logsumexp, softmax, max) run over
    the long contiguous rest at once: over a last dim of 2m ≤ 2(k + 1) entries they were up to
    20x slower (per-row kernels). ``fill``: the value of T_R outside its counts (default "−∞";
    0 for tables of tangents)."""
    P, B, _, _, m = left.shape
    m_out = min(k, 2 * (m - 1)) + 1
    idx = _band(m, m_out, left.device)
    rp = F.pad(right, (0, 1), value=_neg(right.dtype) if fill is None else fill)  # slot m
    # both operands in the output's dim order, so that the sum is laid out in it
    rg = rp[..., idx].permute(2, 5, 0, 1, 3, 4).contiguous()              # (t, j, P, B, u, c)
    lt = left.permute(3, 4, 0, 1, 2).contiguous()                         # (t, j, P, B, s)
    out = lt[..., None, None] + rg[:, :, :, :, None]                      # (t, j, P, B, s, u, c)
    return out.view(2 * m, P, B, 2, 2, m_out)


def _reduce(s: torch.Tensor, op: str) -> torch.Tensor:
    """⊕ over the split (t, j), the first dim of :func:`_split_scores`."""
    return torch.logsumexp(s, 0) if op == "lse" else s.amax(0)


def _inside(leaves: torch.Tensor, k: int, op: str = "lse") -> list[torch.Tensor]:
    """Tables of every level, leaves first, root (one block) last. op: "lse" or "max"."""
    levels = [leaves]
    neg = _neg(leaves.dtype)
    while levels[-1].shape[0] > 1:
        s = _split_scores(*_pairs(levels[-1]), k)
        levels.append(_reduce(s, op).clamp_min(neg))                     # (P, B, s, u, c)
    return levels


def _prepare(y: torch.Tensor, d: int, k: int, op: str = "lse") -> list[torch.Tensor]:
    return _inside(_leaves(y, d), k, op)


def _root_logits(levels: list[torch.Tensor], k: int) -> torch.Tensor:
    """log-weights ``(B, 2)`` of the last item's state u at the root (s = 0, c = k)."""
    return levels[-1][0, :, 0, :, k]


# --------------------------------------------------------------------------------------------
# the top-down passes
# --------------------------------------------------------------------------------------------

def _children(w: torch.Tensor, nb: int) -> torch.Tensor:
    """The children's state probabilities ``(nb, B, 2, 2, m)`` from the joint probabilities of
    (parent state, split) ``w`` ``(2, m, P, B, s, u, c)``: the left child is in (s, t, j), the
    right one in (t, u, c − j). Linear in ``w``."""
    _, m, P, B, _, _, m_out = w.shape
    p_left = w.sum(dim=(5, 6)).permute(2, 3, 4, 0, 1)                     # (P, B, s, t, j)
    wr = w.sum(4).permute(2, 3, 0, 4, 5, 1).reshape(P * B * 4, m_out * m)  # (P·B·t·u, c·j)
    p_right = (wr @ _fold(m, m_out, w.device, w.dtype)).view(P, B, 2, 2, m)
    return torch.stack([p_left, p_right], 1).reshape(2 * P, B, 2, 2, m)[:nb]


@functools.lru_cache(maxsize=64)
def _fold(m: int, m_out: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """F[c·m + j, c'] = 1[c − j = c'] ``(m_out·m, m)``: sums a right child's count c − j."""
    idx = _band(m, m_out, torch.device("cpu"))
    return F.one_hot(idx, m + 1)[..., :m].reshape(m_out * m, m).to(device=device, dtype=dtype)


def _root_state(levels: list[torch.Tensor], k: int) -> torch.Tensor:
    """The root's state probabilities ``(1, B, 2, 2, m)``: s = 0, c = k, u by its softmax."""
    root = levels[-1]
    q = torch.softmax(_root_logits(levels, k), -1)                       # (B, u)
    sel = torch.zeros(2, root.shape[-1], dtype=q.dtype, device=q.device)
    sel[0, k] = 1.0                                                       # s = 0, c = k
    return (q[:, None, :, None] * sel[None, :, None, :])[None]


def _extract(prob: torch.Tensor) -> torch.Tensor:
    """μ ``(B, 2d − 1)`` from the leaves' state probabilities ``(d, B, s, t, c)``."""
    unary = prob[:, :, :, 1, 1].sum(-1).t()                               # (B, d)
    pair = prob[1:, :, 1, 1, 1].t()                                       # (B, d − 1)
    return torch.cat([unary, pair], -1)


def _marginals_from_levels(levels: list[torch.Tensor], d: int, k: int) -> torch.Tensor:
    """Mass-conserving top-down pass: μ ``(B, 2d − 1)`` from the (logsumexp, +) tables (plain
    autograd ops; the analytic path is :func:`_weighted_inside` and :func:`_down`)."""
    prob = _root_state(levels, k)
    for x in reversed(levels[:-1]):
        mc = x.shape[-1]
        s = _split_scores(*_pairs(x), k)                                  # (t·j, P, B, s, u, c)
        # P(split | node state): a softmax over (t, j), normalised here rather than by the
        # parent's table (whose rounding is relative to its magnitude, up to ~1e10), so each
        # conditional sums to 1 to rounding and the mass is conserved
        w = prob * torch.softmax(s, 0)
        prob = _children(w.view(2, mc, *w.shape[1:]), x.shape[0])
    return _extract(prob)


# --------------------------------------------------------------------------------------------
# the analytic path: saved split weights, and the tangent passes
# --------------------------------------------------------------------------------------------

def _weighted_inside(y: torch.Tensor, d: int, k: int
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The (logsumexp, +) tables and, per merge, the split weights W = softmax over (t, j) of
    :func:`_split_scores` ``(2m, P, B, s, u, c)`` (one exp per split score, reused by the
    top-down pass and the tangents). No autograd (in place)."""
    levels = [_leaves(y, d)]
    weights = []
    neg = _neg(y.dtype)
    while levels[-1].shape[0] > 1:
        s = _split_scores(*_pairs(levels[-1]), k)
        top = s.amax(0)
        e = s.sub_(top).exp_()
        z = e.sum(0)
        levels.append(z.log().add_(top).clamp_min_(neg))
        weights.append(e.div_(z))
    return levels, weights


def _down(levels: list[torch.Tensor], weights: list[torch.Tensor], k: int) -> list[torch.Tensor]:
    """State probabilities per level, root first, leaves last (:func:`_marginals_from_levels`
    with the saved weights)."""
    probs = [_root_state(levels, k)]
    for x, W in zip(reversed(levels[:-1]), reversed(weights)):
        w = probs[-1] * W
        probs.append(_children(w.view(2, x.shape[-1], *w.shape[1:]), x.shape[0]))
    return probs


def _leaf_tangent(g: torch.Tensor, d: int) -> torch.Tensor:
    """Tangents of the leaf tables along ḡ ``(B, 2d − 1)``: Ṫ[s, 1, 1] = ḡ_i + s·ḡ_{d+i−1}."""
    ga = g[:, :d].t()
    gb = F.pad(g[:, d:].t(), (0, 0, 1, 0))
    out = g.new_zeros(d, g.shape[0], 2, 2, 2)
    out[:, :, 0, 1, 1] = ga
    out[:, :, 1, 1, 1] = ga + gb
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
        dlevels.append((W * ds).sum(0))
    q = torch.softmax(_root_logits(levels, k), -1)                       # (B, u)
    dr = _root_logits(dlevels, k)
    dq = q * (dr - (q * dr).sum(-1, keepdim=True))
    dprob = probs[0] * 0
    dprob[0, :, 0, :, k] = dq
    for x, W, ds, dt, prob in zip(reversed(levels[:-1]), reversed(weights), reversed(dscores),
                                  reversed(dlevels[1:]), probs[:-1]):
        dw = torch.addcmul(dprob * W, prob, W * (ds - dt))
        dprob = _children(dw.view(2, x.shape[-1], *dw.shape[1:]), x.shape[0])
    return _extract(dprob)
