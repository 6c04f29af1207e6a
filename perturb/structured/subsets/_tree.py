r"""Kernels of the k-subset exponential family: the tilt ν and the tree over count distributions.

The math (tilting, inside/outside passes, the tangent backward, sampling) is stated in
:mod:`perturb.structured.subsets.dp`; this module holds its tensor implementation, plain torch
ops only (autograd can run through every function here), no validation.

**Layout.** Rows are ``B`` flattened batch elements; each row is padded to N = 4·2^L ≥ n
positions with p = 0 (a certain miss changes no count). Position l·Q + q (Q = N/4, l < 4) belongs
to the leaf block q, so a leaf block is the four positions {q, Q + q, 2Q + q, 3Q + q} and every
elementwise op on the leaves runs over contiguous rows of length Q. A tree level is a 2-D table
``(B·nb, m)`` (block index b·nb + q, count m − 1 at most); adjacent blocks 2q, 2q + 1 are merged
(any pairing is valid: the product is commutative), so ``level.view(B·nb/2, 2, m)`` holds the
pairs and no level needs a copy, a cat or an odd-count case.

**Leaf stage** (replaces the two lowest levels). For a leaf block the probabilities of its 16
subsets S, P_S = Π_{l∈S} p_l Π_{l∉S} (1 − p_l), are a product of four broadcasts; then
I_block = P @ C with C[S, j] = 1[|S| = j] (j ≤ min(k, 4)). At the leaves the outside vector O of
the block gives the subset weights w_S = P_S O[|S|] = P(S is the block's part of a k-subset,
times P_ν(N = k)), and μ_l = Σ_{S∋l} w_S / (Σ_{S∋l} w_S + Σ_{S∌l} w_S) ∈ [0, 1].

**Kernels.** Every merge and split of a level is a depthwise correlation
out[r, t] = Σ_i w[r, i] x[r, t + i] over all rows r at once (:func:`_dwcorr`): on CPU in float32
``F.conv1d(groups=R)`` (oneDNN's depthwise path); on CPU otherwise windows (``unfold``, a view)
times the weights by ``matmul``; on other devices (CUDA) the same windows by ``linalg.vecdot``
(plain multiply-adds: TF32 settings never apply).

- merge   I_{b∪b'} = I_b ∗ I_{b'} (truncated): x = I_b padded by m − 1 zeros, w = I_{b'} reversed;
- split   O_child[j] = Σ_i I_sibling[i] O_parent[j + i]: x = O_parent, w = each sibling;
- their tangents (product rule): two such correlations and an add.

Measured on CPU (oneDNN): one correlation per term over G rows is faster than one call over
stacked rows (2G rows with the parent duplicated, or 2 channels per group): the latter were
1.3–50× slower, so no call duplicates its input.

Backward leaves: μ is unchanged when a leaf [1 − p_i, p_i] is scaled, so along ḡ the leaf
[1 − p_i, p_i e^{ε ḡ_i}] (a rescaled [1 − p_i(ε), p_i(ε)], p_i(ε) = σ(y_i + εḡ_i − ν)) gives the
same μ̇: its tangent is [0, p_i ḡ_i], hence Ṗ_S = P_S ⟨1_S, ḡ⟩, one product.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

#: ν is searched at most this far below the k-th largest score: σ(40) = 1 in float32 and to
#: 4e-18 in float64, so the top k are certain there.
_CERTAIN = 40.0

#: positions per leaf block (16 subsets); the tree starts above it
_LEAF = 4


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


def _probs(x: torch.Tensor) -> torch.Tensor:
    """p = σ(x) for x = ys − ν ``(B, n)``, padded with p = 0 to N = 4·2^L ≥ n: ``(B, N)``."""
    n = x.shape[-1]
    N = _LEAF << max(0, math.ceil(math.log2(n / _LEAF))) if n > _LEAF else _LEAF
    return torch.sigmoid(F.pad(x, (0, N - n), value=-math.inf) if N > n else x)


# --------------------------------------------------------------------------------------------
# constants and the depthwise correlation
# --------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=128)
def _const(kind: str, k: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Cached 0/1 matrices over the 16 subsets S of a leaf block (S = Σ_l bit_l 2^(3−l)):
    "count" ``(16, min(k, 4)+1)`` C[S, j] = 1[|S| = j]; "member" ``(16, 4)`` 1[l ∈ S];
    "split" ``(8, 16)``, rows l: 1[l ∈ S], rows 4 + l: 1[l ∉ S]; "root" ``(1, k+1)`` 1[j = k];
    "size" ``(16,)`` |S| (long)."""
    s = torch.arange(16)
    member = (s[:, None] >> (_LEAF - 1 - torch.arange(_LEAF))) & 1              # (16, 4)
    size = member.sum(1)
    if kind == "count":
        out = size[:, None] == torch.arange(min(k, _LEAF) + 1)
    elif kind == "member":
        out = member
    elif kind == "split":
        out = torch.cat([member.T, 1 - member.T])
    elif kind == "root":
        out = torch.arange(k + 1)[None] == k
    else:
        return size.to(device)
    return out.to(device=device, dtype=dtype)


def _kernel(t: torch.Tensor) -> str:
    if t.device.type != "cpu":
        return "vecdot"
    return "conv1d" if t.dtype == torch.float32 else "bmm"


def _dwcorr(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """out[r, t] = Σ_i w[r, 0, i] x[r, t + i]; ``x`` ``(R, W)``, ``w`` ``(R, 1, m)``;
    output ``(R, W − m + 1)``."""
    kind = _kernel(x)
    if kind == "conv1d":
        return F.conv1d(x, w, groups=x.shape[0])
    windows = x.unfold(-1, w.shape[-1], 1)                               # (R, W−m+1, m), a view
    if kind == "bmm":
        return (windows @ w.mT).squeeze(-1)
    return torch.linalg.vecdot(windows, w)


def _merge(pairs: torch.Tensor, m_out: int) -> torch.Tensor:
    """I_left ∗ I_right truncated to m_out entries: ``(G, 2, m) -> (G, m_out)``."""
    m = pairs.shape[-1]
    left, right = pairs.unbind(1)
    return _dwcorr(F.pad(left, (m - 1, m_out - m)), right.flip(-1).unsqueeze(1))


def _split(o: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Children's O from the parents' ``o`` ``(G, m_par)`` and the pairs' I ``(G, 2, m)``:
    O_child[j] = Σ_i I_sibling[i] o[j + i], j < m; ``(2G, m)`` (the children's level)."""
    G, _, m = pairs.shape
    x = F.pad(o, (0, 2 * m - 1 - o.shape[-1]))
    left, right = pairs.unsqueeze(2).unbind(1)                              # (G, 1, m) each
    return torch.stack([_dwcorr(x, right), _dwcorr(x, left)], 1).view(2 * G, m)


def _merge_tangent(dual: torch.Tensor, m_out: int) -> torch.Tensor:
    """İ_left ∗ I_right + I_left ∗ İ_right; ``dual`` ``(G, 2 pair, 2 (I, İ), m) -> (G, m_out)``.
    Backward only (adds in place)."""
    m = dual.shape[-1]
    (i_l, di_l), (i_r, di_r) = (half.unbind(1) for half in dual.unbind(1))
    pad = (m - 1, m_out - m)
    return _dwcorr(F.pad(di_l, pad), i_r.flip(-1).unsqueeze(1)).add_(
        _dwcorr(F.pad(i_l, pad), di_r.flip(-1).unsqueeze(1)))


def _split_tangent(o: torch.Tensor, do: torch.Tensor, dual: torch.Tensor) -> torch.Tensor:
    """Ȯ_child = corr(ȯ, I_sibling) + corr(o, İ_sibling); ``o``, ``do`` ``(G, m_par)``, ``dual``
    as in :func:`_merge_tangent`; ``(2G, m)``. Backward only (adds in place)."""
    return _split(do, dual[:, :, 0]).add_(_split(o, dual[:, :, 1]))


# --------------------------------------------------------------------------------------------
# the passes
# --------------------------------------------------------------------------------------------

def _slabs(t: torch.Tensor) -> torch.Tensor:
    """``(B, N) -> (4, B·Q)``: row l holds the positions l·Q + q of every batch row."""
    B, N = t.shape
    return t.view(B, _LEAF, -1).transpose(0, 1).reshape(_LEAF, -1)


def _subsets(p: torch.Tensor) -> torch.Tensor:
    """P_S for the 16 subsets of every leaf block: ``(B, N) -> (16, B·Q)`` (column b·Q + q)."""
    pv = p.view(p.shape[0], _LEAF, -1).transpose(0, 1)                     # (4, B, Q)
    a, b, c, d = torch.stack([1 - pv, pv], 1).view(_LEAF, 2, -1).unbind(0)   # (2, B·Q) each
    ab = (a[:, None] * b[None]).view(4, 1, -1)
    cd = (c[:, None] * d[None]).view(1, 4, -1)
    return (ab * cd).view(16, -1)


def _inside(p: torch.Tensor, k: int) -> list[torch.Tensor]:
    """``[P, I_0, …, I_L]``: the subset probabilities ``(16, B·Q)``, then I per level, the leaf
    blocks ``(B·Q, min(k, 4)+1)`` up to the root ``(B, k+1)``; ``p`` as from :func:`_probs`."""
    B = p.shape[0]
    P = _subsets(p)
    # (Cᵀ P)ᵀ copied: MKL's P.T @ C is 3x slower
    x = (_const("count", k, p.device, p.dtype).T @ P).T.contiguous()         # (B·Q, m_0)
    tables = [P, x]
    while x.shape[0] > B:
        m = x.shape[-1]
        x = _merge(x.view(-1, 2, m), min(k + 1, 2 * m - 1))
        tables.append(x)
    return tables


def _outside(ins: list[torch.Tensor], k: int) -> list[torch.Tensor]:
    """O per level for ``ins = [I_0, …, I_L]``, same shapes, O_root = 1[j = k]."""
    root = ins[-1]
    o = _const("root", k, root.device, root.dtype).expand(root.shape[0], -1)
    outs = [o]
    for x in reversed(ins[:-1]):
        o = _split(o, x.view(-1, 2, x.shape[-1]))
        outs.append(o)
    outs.reverse()
    return outs


def _leaf_marginals(P: torch.Tensor, o: torch.Tensor, k: int, B: int) -> torch.Tensor:
    """μ ``(B, N)`` from the subset probabilities ``(16, B·Q)`` and the leaf blocks' O
    ``(B·Q, m_0)``: w_S = P_S O[|S|], μ_l = take / (take + miss)."""
    w = (_const("count", k, P.device, P.dtype) @ o.T).mul_(P)     # in place: no autograd here
    take, miss = (_const("split", k, P.device, P.dtype) @ w).view(2, _LEAF, B, -1).unbind(0)
    return (take / (take + miss)).transpose(0, 1).reshape(B, -1)


def _marginals_jvp(P: torch.Tensor, ins: list[torch.Tensor], outs: list[torch.Tensor],
                   g: torch.Tensor, k: int) -> torch.Tensor:
    """μ̇ along g ``(B, N)`` (zero-padded): tangents of both passes, ν fixed. ``ins`` = [I_0, …,
    I_{L−1}] (the root is not needed), ``outs`` = [O_0, …, O_L] of the forward."""
    B = g.shape[0]
    dev, dt = P.device, P.dtype
    # in place throughout (a backward: nothing is recorded), to spare large fresh allocations
    dP = (_const("member", k, dev, dt) @ _slabs(g)).mul_(P)                 # Ṗ_S = P_S ⟨1_S, g⟩
    dx = (_const("count", k, dev, dt).T @ dP).T.contiguous()
    duals = []
    for x in ins:
        m = x.shape[-1]
        dual = torch.stack([x.view(-1, 2, m), dx.view(-1, 2, m)], 2)
        dx = _merge_tangent(dual, min(k + 1, 2 * m - 1))
        duals.append(dual)
    do = None
    for dual, o in zip(reversed(duals), reversed(outs[1:])):
        do = _split(o, dual[:, :, 1]) if do is None else _split_tangent(o, do, dual)
    count = _const("count", k, dev, dt)
    qo = count @ outs[0].T                                                  # O[|S|]
    # Ṗ O + P Ȯ; not in place: under torch.func only g (so Ṗ) may carry the vmapped dim
    dw = dP * qo if do is None else torch.addcmul((count @ do.T).mul_(P), dP, qo)
    w = qo.mul_(P)
    split = _const("split", k, dev, dt)
    tm = torch.cat([split @ w, split @ dw]).view(4, _LEAF, B, -1)
    take, miss, dtake, dmiss = tm.unbind(0)
    den = take + miss
    return ((dtake - take / den * (dtake + dmiss)) / den).transpose(0, 1).reshape(B, -1)


def _sample(tables: list[torch.Tensor], k: int, n_samples: int,
            generator: torch.Generator | None) -> torch.Tensor:
    """Top-down splits of the count k; ``(n_samples, B, N)`` long 0/1 at the positions."""
    P, ins = tables[0], tables[1:]
    B = ins[-1].shape[0]
    dev = P.device

    def gumbel_argmax(logits, dim):
        u = torch.rand(logits.shape, generator=generator, dtype=logits.dtype, device=dev)
        return torch.argmax(logits - torch.log(-torch.log(u)), dim)    # Gumbel-max: exact

    count = torch.full((n_samples, B), k, dtype=torch.long, device=dev)
    for x in reversed(ins[:-1]):
        m = x.shape[-1]
        left, right = x.view(-1, 2, m).log().unbind(1)                       # (G, m)
        right = F.pad(right, (0, 1), value=-math.inf)                         # index m: log 0
        rest = count[..., None] - torch.arange(m, device=dev)
        rest = torch.where((rest >= 0) & (rest < m), rest, m)
        logits = left + torch.gather(right.expand(n_samples, -1, -1), -1, rest)
        to_left = gumbel_argmax(logits, -1)
        count = torch.stack([to_left, count - to_left], -1).view(n_samples, -1)
    size = _const("size", k, dev, P.dtype)
    fits = size[:, None] == count.view(n_samples, 1, -1)                       # (S, 16, B·Q)
    subset = gumbel_argmax(torch.where(fits, P.log(), -math.inf), 1)            # (S, B·Q)
    member = _const("member", k, dev, P.dtype).long()
    return member[subset].view(n_samples, B, -1, _LEAF).transpose(2, 3).reshape(n_samples, B, -1)
