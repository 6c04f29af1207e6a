"""Boxes nested along a hierarchy's edges: an initialisation that starts from the structure.

Training boxes from random positions must move 82,115 WordNet boxes into a nesting 18 levels
deep, and from random starts Adam finds an arrangement that satisfies the training edges
softly (P(child ⊆ parent) near 1 with the child sticking out a little) without the strict
nesting that transitivity needs: on the reduction-only WordNet split such models reach test F1
~0.3, while the boxes of :func:`nested_boxes`, built from the same training edges with no
training at all, reach ~0.92 (``docs/box_hierarchy.md``). Hard containment is transitive, so
boxes nested along the transitive reduction contain every descendant in every ancestor.
"""
from __future__ import annotations

from typing import Sequence

import torch

from perturb._validation import check_int
from perturb.boxes.box import Box
from perturb.boxes.hierarchy.graphs import check_pairs
from perturb.boxes.hierarchy.rng import resolve_generator

__all__ = ["nested_boxes", "hierarchy_levels"]


def hierarchy_levels(num_nodes: int, edges: torch.Tensor) -> torch.Tensor:
    """The level of every node: the length of the longest path from it up to a root along the
    edges ``child -> parent`` (roots, nodes without parents, are level 0; a node's level is
    1 + the largest level of its parents).

    Args:
        num_nodes: n.
        edges: ``(m, 2)`` integer ``(child, parent)`` pairs in ``[0, n)``.

    Returns:
        ``(n,)`` LongTensor on the device of ``edges``.

    Raises:
        ValueError: bad edges, or a cycle (a self loop included).
    """
    edges = check_pairs(edges, num_nodes, "edges")
    child, parent = edges[:, 0], edges[:, 1]
    if bool((child == parent).any()):
        raise ValueError("edges contain a self loop; a hierarchy must be acyclic")
    level = torch.zeros(num_nodes, dtype=torch.long, device=edges.device)
    for _ in range(num_nodes):        # one relaxation per level: ~20 on WordNet
        new = level.scatter_reduce(0, child, level[parent] + 1, "amax")
        if torch.equal(new, level):
            return level
        level = new
    raise ValueError("edges contain a cycle; a hierarchy must be acyclic")


def nested_boxes(num_nodes: int, edges: torch.Tensor, dim: int, *, shrink_dims: int = 2,
                 shrink: Sequence[float] = (0.3, 0.6), margin: float = 0.02,
                 scale: float = 10.0, generator: torch.Generator | None = None,
                 seed: int | None = None, dtype: torch.dtype = torch.float64) -> Box:
    """Random boxes nested along a hierarchy: every child inside its parents.

    Nodes are placed level by level (:func:`hierarchy_levels`), parents first:

    - a root gets the cube ``[o, o + scale]^d`` with ``o`` uniform in ``[0, scale]^d``;
    - a child's *room* is the intersection of its parents' boxes, each shrunk by ``margin``
      times its side at both ends (the first parent's shrunk box alone when that intersection
      is empty, e.g. for parents placed apart); the child takes the room's full extent in all
      but ``shrink_dims`` coordinates, drawn at random, where its side is the room's times a
      factor uniform in ``shrink``, at a uniform position inside the room.

    So every edge, and by transitivity every pair of the closure, is a strict hard containment
    (for nodes with one parent, or parents whose shrunk boxes meet), and siblings differ in a
    few coordinates, which keeps unrelated pairs mostly apart. Shrinking only a few coordinates
    per level keeps deep boxes large: on WordNet's reduction (levels 0–18, d = 10) the median
    side is ~2.5 and the 1 % quantile ~0.1 at the default ``scale``, well above the Gumbel
    β = 0.01.

    Args:
        num_nodes: n.
        edges: ``(m, 2)`` ``(child, parent)`` pairs, acyclic (for the generalisation protocol:
            the training edges, which hold the transitive reduction).
        dim: d.
        shrink_dims: coordinates shrunk per level, in ``[0, d]``.
        shrink: ``(low, high)`` range of the shrink factor, ``0 < low <= high <= 1``.
        margin: gap between a child and its parent's walls, as a fraction of the parent's side,
            in ``[0, 0.5)``.
        scale: side of the root cubes (> 0).
        generator, seed: randomness (one of them).
        dtype: of the corners (float64 default: deep boxes keep their digits).

    Returns:
        :class:`~perturb.boxes.Box` of shape ``(n, d)`` on the device of ``edges`` (set it with
        :meth:`~perturb.boxes.BoxEmbedding.set_boxes`).

    Raises:
        ValueError: bad sizes or ranges, bad edges, a cycle.

    Example:
        >>> from perturb.boxes.hierarchy import balanced_tree, edge_index
        >>> g = balanced_tree(2, 3)
        >>> box = nested_boxes(g.number_of_nodes(), edge_index(g), 4, seed=0)
        >>> bool((box.lower[1] >= box.lower[0]).all() and (box.upper[1] <= box.upper[0]).all())
        True
    """
    n = check_int(num_nodes, "num_nodes", low=1)
    d = check_int(dim, "dim", low=1)
    k = check_int(shrink_dims, "shrink_dims", low=0)
    if k > d:
        raise ValueError(f"shrink_dims must be in [0, dim={d}], got {k}")
    lo_f, hi_f = (float(v) for v in shrink)
    if not 0.0 < lo_f <= hi_f <= 1.0:
        raise ValueError(f"shrink must be a (low, high) range with 0 < low <= high <= 1, "
                         f"got {tuple(shrink)!r}")
    if not 0.0 <= float(margin) < 0.5:
        raise ValueError(f"margin must be in [0, 0.5), got {margin!r}")
    if not float(scale) > 0.0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    level = hierarchy_levels(n, edges)
    edges = edges.to(device=level.device, dtype=torch.long)
    dev = level.device
    gen = resolve_generator(generator, seed)
    # all randomness drawn up front on the CPU generator: reproducible on every device
    start = torch.rand(n, d, generator=gen, dtype=dtype).to(dev)
    factor = lo_f + (hi_f - lo_f) * torch.rand(n, d, generator=gen, dtype=dtype)
    chosen = torch.rand(n, d, generator=gen).argsort(dim=1)[:, :k]
    side_factor = torch.ones(n, d, dtype=dtype).scatter_(1, chosen, factor.gather(1, chosen))
    side_factor = side_factor.to(dev)

    lower = torch.empty(n, d, dtype=dtype, device=dev)
    upper = torch.empty(n, d, dtype=dtype, device=dev)
    roots = level == 0
    lower[roots] = scale * start[roots]
    upper[roots] = lower[roots] + scale
    child, parent = edges[:, 0], edges[:, 1]
    # the first edge of every child names its fallback parent
    first = torch.full((n,), edges.shape[0], dtype=torch.long, device=dev)
    first.scatter_reduce_(0, child, torch.arange(edges.shape[0], device=dev), "amin")
    for lv in range(1, int(level.max()) + 1):
        at = level[child] == lv                      # edges into this level's nodes
        c, p = child[at], parent[at]
        gap = margin * (upper[p] - lower[p])
        room_lo = torch.full((n, d), -torch.inf, dtype=dtype, device=dev)
        room_hi = torch.full((n, d), torch.inf, dtype=dtype, device=dev)
        idx = c.unsqueeze(1).expand(-1, d)
        room_lo.scatter_reduce_(0, idx, lower[p] + gap, "amax")
        room_hi.scatter_reduce_(0, idx, upper[p] - gap, "amin")
        nodes = (level == lv).nonzero().squeeze(1)
        rlo, rhi = room_lo[nodes], room_hi[nodes]
        fp = parent[first[nodes]]
        fgap = margin * (upper[fp] - lower[fp])
        empty = (rhi <= rlo).any(dim=1, keepdim=True)
        rlo = torch.where(empty, lower[fp] + fgap, rlo)
        rhi = torch.where(empty, upper[fp] - fgap, rhi)
        room = rhi - rlo
        side = room * side_factor[nodes]
        lower[nodes] = rlo + (room - side) * start[nodes]
        upper[nodes] = lower[nodes] + side
    return Box(lower, upper)
