r"""Wilson's algorithm: exact tree samples by loop-erased random walks, batched as tensors.

The walk to a random parent — from node j to i with probability P_ij = exp(s_ij − c_j), the
column softmax of the scores (:mod:`perturb.structured.trees.matrix_tree`) — is a Markov chain
absorbed at the root. Wilson's RandomTreeWithRoot builds the tree from it: take the first node
not yet in the tree, walk from it until the walk hits the tree, and add the loop-erased path.
Recording for every node only the step by which the walk *last* left it (its "next" pointer)
erases the loops without ever finding them; retracing the pointers from the start adds the
path. For any chain the result is the arborescence T (edges pointing to the root) with

    P(T) ∝ Π_{j ≠ root} P_{parent(j), j} = exp(Σ_{(i→j)∈T} s_ij) / exp(Σ_j c_j),

exactly p(T) ∝ exp(score(T)) (Wilson 1996, Theorem 1), for directed chains as well. A
spanning tree is the arborescence rooted at node 0 of the symmetric graph.

Batching. All walks — one per (sample, graph) — advance together, one step per iteration:
a walking walk draws its next node by inverse-CDF sampling on the cumulative column of P
(a gather of n entries and ``searchsorted``), a retracing walk marks one node. Whether every
walk has finished is read on the host every ``_CHECK_EVERY`` steps only.

Cost. The expected number of walk steps of one sample is tr G, G = (I − P̂)⁻¹ (the expected
visits of every node before absorption; Wilson 1996, Theorem 3): about n to a few n for
spread-out scores, so O(n²) work per sample; but it grows like the expected time the chain
spends in near-closed cycles of strong edges, e^{gap}, for peaked scores. The sequential-
conditioning sampler of :mod:`perturb.structured.trees.sampling` costs O(n⁴) per sample
whatever the scores; ``method="auto"`` chooses between them from tr G.

References:
    D. B. Wilson, "Generating random spanning trees more quickly than the cover time",
    STOC 1996. J. G. Propp, D. B. Wilson, "How to get a perfectly random sample from a
    generic Markov chain and generate a random spanning tree of a directed graph",
    J. Algorithms 27, 1998.
"""
from __future__ import annotations

import torch

from perturb import _linalg

__all__: list[str] = []

#: Steps between two host reads of "every walk has finished".
_CHECK_EVERY = 16


def wilson_step_limit(n: int) -> int:
    """The default cap on walk steps: far above the expected O(n) for spread-out scores."""
    return 2000 + 400 * n


@torch.no_grad()
def expected_steps(P: torch.Tensor, root: int) -> torch.Tensor:
    """tr (I − P̂)⁻¹ per graph ``(*batch)``: the expected number of walk steps of one sample
    (inf where the inverse fails). One batched inverse, O(n³)."""
    n = P.shape[-1]
    L = torch.eye(n, dtype=P.dtype, device=P.device) - P
    L[..., root, :] = 0
    L[..., :, root] = 0
    L[..., root, root] = 1
    G, info = _linalg.inv_ex(L)
    tr = torch.diagonal(G, dim1=-2, dim2=-1).sum(-1) - 1
    bad = (info != 0) | ~torch.isfinite(tr) | (G.amin((-1, -2)) < -1e-6)
    return torch.where(bad, torch.full_like(tr, torch.inf), tr)


@torch.no_grad()
def wilson_sample(P: torch.Tensor, exists: torch.Tensor, root: int,
                  generator: torch.Generator | None, max_steps: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Parents of W independent arborescences, ``(W, n)`` long, and ``done`` ``(W,)``.

    Args:
        P: ``(W, n, n)`` column-stochastic transition weights (column j: the law of j's parent;
            zero on forbidden edges), one graph per walk (expanded views are fine).
        exists: ``(W, n)`` nodes that must join the tree (the root and absent nodes: False).
        root: the root.
        generator: for the uniforms.
        max_steps: stop after this many steps; walks not finished then have ``done`` False.

    The parent of the root and of absent nodes is reported as the root.
    """
    W, n = exists.shape
    dev = P.device
    # cumulative law of the parent of u, one row per (walk, u): cdf[w, u, :]
    cdf = P.transpose(-1, -2).cumsum(dim=-1)
    cdf = cdf.reshape(-1, n) if cdf.is_contiguous() else cdf.contiguous().reshape(-1, n)
    total = cdf[:, -1].contiguous()
    base = (torch.arange(W, device=dev) * n)
    walks = torch.arange(W, device=dev)
    in_tree = ~exists.clone()
    in_tree[:, root] = True
    nxt = torch.full((W, n), root, dtype=torch.long, device=dev)
    todo = ~in_tree
    has_work = todo.any(-1)
    start = todo.to(torch.int8).argmax(-1)
    u = start.clone()
    retrace = torch.zeros(W, dtype=torch.bool, device=dev)
    done = ~has_work
    steps = 0
    while steps < max_steps:
        steps += 1
        walking = ~retrace & ~done
        # a walking walk draws its next node: inverse CDF on the cumulative column of u
        row = base + u
        r = torch.rand(W, 1, dtype=cdf.dtype, device=dev, generator=generator)
        v = torch.searchsorted(cdf[row], r * total[row].unsqueeze(-1), right=True)
        v = v.squeeze(-1).clamp_(max=n - 1)
        nxt[walks, u] = torch.where(walking, v, nxt[walks, u])   # last exit from u
        # a retracing walk adds u to the tree and follows the pointer
        marking = retrace & ~done
        in_tree[walks, u] |= marking
        u = torch.where(walking, v, torch.where(marking, nxt[walks, u], u))
        hit = in_tree[walks, u]
        # walking walks that hit the tree go back to their start to retrace
        to_retrace = walking & hit
        u = torch.where(to_retrace, start, u)
        # retracing walks that reached the tree take the next start (or finish)
        finished = marking & hit
        todo = ~in_tree
        more = todo.any(-1)
        nstart = todo.to(torch.int8).argmax(-1)
        start = torch.where(finished, nstart, start)
        u = torch.where(finished, nstart, u)
        done = done | (finished & ~more)
        retrace = (retrace | to_retrace) & ~finished
        if steps % _CHECK_EVERY == 0 and bool(done.all()):
            break
    nxt[:, root] = root
    nxt = torch.where(exists, nxt, torch.full_like(nxt, root))
    return nxt, done
