"""Hierarchies as graphs: checks, transitive closure and reduction, sub-hierarchies, synthetic
DAGs, and node-id pair tensors.

Convention (the whole of :mod:`perturb.boxes.hierarchy` uses it): a hierarchy is a
:class:`networkx.DiGraph` whose edge ``child -> parent`` means "child IS-A parent", i.e. the
child's box should lie inside the parent's box. Roots have out-degree 0, leaves in-degree 0, and
the ancestors of ``u`` are ``networkx.descendants(graph, u)``. Node ``i`` of
``list(graph.nodes)`` owns box ``i``; pairs of nodes are ``(m, 2)`` LongTensors of
``(child, parent)`` positions (:func:`edge_index`).
"""
from __future__ import annotations

from typing import Any, Hashable

import networkx as nx
import torch

from perturb._validation import check_int
from perturb.boxes.hierarchy.rng import resolve_generator

__all__ = [
    "check_hierarchy",
    "transitive_closure",
    "transitive_reduction",
    "sub_hierarchy",
    "induced_subgraph",
    "balanced_tree",
    "random_tree",
    "random_dag",
    "edge_index",
    "check_pairs",
]


def check_hierarchy(graph: nx.DiGraph, name: str = "graph") -> None:
    """Raise ValueError unless ``graph`` is a networkx DiGraph without cycles or self-loops."""
    if not isinstance(graph, nx.DiGraph):
        raise ValueError(f"{name} must be a networkx.DiGraph with edges child -> parent, "
                         f"got {type(graph).__name__}")
    if nx.number_of_selfloops(graph):
        u = next(iter(nx.selfloop_edges(graph)))[0]
        raise ValueError(f"{name} has a self-loop at {u!r}; a hierarchy is a DAG without them")
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        raise ValueError(f"{name} must be acyclic (edges child -> parent); found the cycle {cycle}")


def transitive_closure(graph: nx.DiGraph, reflexive: bool = False) -> nx.DiGraph:
    """Transitive closure of a DAG: an edge ``u -> a`` for every ancestor ``a`` of ``u``.

    Computed in one pass in reverse topological order (ancestors(u) = ∪ over parents p of
    {p} ∪ ancestors(p)); O(closure size · average in-degree) time. Node attributes are kept;
    with ``reflexive=True`` self-loops ``u -> u`` are added too. Edges come in node order
    (by child, then ancestor), independent of the hash seed, so seeded splits and training
    runs reproduce across processes.
    """
    check_hierarchy(graph)
    ancestors: dict[Hashable, set] = {}
    position = {u: i for i, u in enumerate(graph.nodes)}
    out = nx.DiGraph()
    out.add_nodes_from(graph.nodes(data=True))
    for u in reversed(list(nx.topological_sort(graph))):   # parents before children
        anc: set = set()
        for p in graph.successors(u):
            anc.add(p)
            anc |= ancestors[p]
        ancestors[u] = anc
    for u in graph.nodes:       # edges in node order, not set (hash) order: reproducible
        out.add_edges_from((u, a) for a in sorted(ancestors[u], key=position.__getitem__))
    if reflexive:
        out.add_edges_from((u, u) for u in graph.nodes)
    return out


def transitive_reduction(graph: nx.DiGraph) -> nx.DiGraph:
    """The transitive reduction (networkx), keeping node attributes; edges in node order."""
    check_hierarchy(graph)
    red = nx.transitive_reduction(graph)
    position = {u: i for i, u in enumerate(graph.nodes)}
    out = nx.DiGraph()
    out.add_nodes_from(graph.nodes(data=True))
    # edges in node order (networkx builds them from sets, whose order depends on the hash seed)
    out.add_edges_from(sorted(red.edges, key=lambda e: (position[e[0]], position[e[1]])))
    return out


def sub_hierarchy(graph: nx.DiGraph, root: Hashable) -> nx.DiGraph:
    """The sub-hierarchy below ``root``: ``root`` and every node with a path to it (its
    hyponyms, direct or not), with all edges among them (a copy).

    Closure and restriction commute here: a path between two nodes of the sub-hierarchy only
    passes through nodes of the sub-hierarchy, so ``transitive_closure(sub_hierarchy(g, r))``
    equals the closure of ``g`` restricted to those nodes.
    """
    if root not in graph:
        raise ValueError(f"root={root!r} is not a node of the graph")
    keep = nx.ancestors(graph, root) | {root}
    return induced_subgraph(graph, keep)


def induced_subgraph(graph: nx.DiGraph, keep: set) -> nx.DiGraph:
    """A copy of ``graph`` restricted to ``keep``, nodes and edges in ``graph``'s order
    (``graph.subgraph(keep)`` iterates the set, whose order follows the hash seed for string
    labels, and node order fixes which box each node gets)."""
    out = nx.DiGraph(**graph.graph)
    out.add_nodes_from((u, d) for u, d in graph.nodes(data=True) if u in keep)
    out.add_edges_from((u, v, d) for u, v, d in graph.edges(data=True) if u in keep and v in keep)
    return out


# ----------------------------------------------------------------------------- synthetic

def balanced_tree(branching: int, height: int) -> nx.DiGraph:
    """Complete ``branching``-ary tree of the given height, edges ``child -> parent``.

    Nodes are ``0 .. n-1`` in breadth-first order (root 0, parent of ``i`` is
    ``(i - 1) // branching``), n = (b^(h+1) − 1)/(b − 1); ``balanced_tree(2, 9)`` has 1,023 nodes.
    """
    check_int(branching, "branching", low=1)
    check_int(height, "height", low=0)
    n = height + 1 if branching == 1 else (branching ** (height + 1) - 1) // (branching - 1)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from((i, (i - 1) // branching) for i in range(1, n))
    return g


def random_tree(n: int, *, generator: torch.Generator | None = None,
                seed: int | None = None) -> nx.DiGraph:
    """Random recursive tree on ``0, …, n-1`` rooted at 0, edges ``child -> parent``: the parent
    of node ``i >= 1`` is uniform on ``{0, ..., i-1}`` (expected depth ~ log n)."""
    check_int(n, "n", low=1)
    gen = resolve_generator(generator, seed)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    if n > 1:
        i = torch.arange(1, n, dtype=torch.float64)
        parents = (torch.rand(n - 1, generator=gen, dtype=torch.float64) * i).long()
        g.add_edges_from(zip(range(1, n), parents.tolist()))
    return g


def random_dag(n: int, extra_edge_prob: float = 0.05, *, generator: torch.Generator | None = None,
               seed: int | None = None) -> nx.DiGraph:
    """Random hierarchy DAG on ``0, …, n-1`` with the single root 0, edges ``child -> parent``.

    Node ``i >= 1`` gets one parent uniform on ``{0..i-1}`` (so the DAG is connected and every
    node reaches 0) and, independently with probability ``extra_edge_prob``, each other
    ``j < i`` as an extra parent. Edges implied by others are kept (call
    :func:`transitive_reduction` to drop them).
    """
    check_int(n, "n", low=1)
    if not 0.0 <= float(extra_edge_prob) <= 1.0:
        raise ValueError(f"extra_edge_prob must be in [0, 1], got {extra_edge_prob!r}")
    gen = resolve_generator(generator, seed)
    g = random_tree(n, generator=gen)
    if n > 2 and extra_edge_prob > 0:
        u = torch.rand(n, n, generator=gen, dtype=torch.float64)
        child, parent = torch.nonzero(torch.tril(u < extra_edge_prob, diagonal=-1), as_tuple=True)
        g.add_edges_from(zip(child.tolist(), parent.tolist()))
    return g


# ----------------------------------------------------------------------------- pair tensors

def edge_index(graph: nx.DiGraph, edges: Any = None) -> torch.Tensor:
    """``(m, 2)`` LongTensor of ``(child, parent)`` positions in ``list(graph.nodes)``, for the
    given edges (node labels) or, when None, for ``graph.edges``.

    Raises:
        ValueError: an endpoint that is not a node of ``graph``.
    """
    index = {u: i for i, u in enumerate(graph.nodes)}
    edges = graph.edges if edges is None else edges
    try:
        rows = [(index[u], index[v]) for u, v in edges]
    except KeyError as exc:
        raise ValueError(f"edge endpoint {exc.args[0]!r} is not a node of the graph") from None
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 2)


def check_pairs(pairs: Any, num_nodes: int, name: str = "pairs") -> torch.Tensor:
    """``pairs`` as a LongTensor of shape ``(m, 2)`` of ``(child, parent)`` ids in
    ``[0, num_nodes)``; ValueError naming ``name`` otherwise (one host read for the range)."""
    if not isinstance(pairs, torch.Tensor) or pairs.is_floating_point() or pairs.is_complex() \
            or pairs.dtype == torch.bool or pairs.ndim != 2 or pairs.shape[-1] != 2:
        got = (f"shape {tuple(pairs.shape)}, dtype {pairs.dtype}"
               if isinstance(pairs, torch.Tensor) else type(pairs).__name__)
        raise ValueError(f"{name} must be an integer tensor of shape (m, 2) holding "
                         f"(child, parent) ids, got {got}")
    if pairs.numel():
        lo, hi = torch.aminmax(pairs)
        if int(lo) < 0 or int(hi) >= num_nodes:
            raise ValueError(f"{name} holds ids outside [0, {num_nodes})")
    return pairs.long()
