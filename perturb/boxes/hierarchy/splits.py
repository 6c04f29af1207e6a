"""Splits of a hierarchy for the generalisation setting, and the published protocol.

:func:`split_hierarchy` is the general split: the transitive reduction (the *basic* edges, from
which the closure follows) always goes to training, plus a fraction of the other (*non-basic*)
closure edges; the rest becomes validation and test positives.

:func:`dasgupta_split` is the protocol of Ganea et al. (2018) used by Dasgupta et al. (2020,
§5.3) on the WordNet noun hierarchy, with labelled validation and test pairs (10 negatives per
positive) ready for :func:`~perturb.boxes.hierarchy.evaluate_split`. What its numbers mean:
the published data omit the top synset ``entity.n.01`` (an ancestor of every other node),
leaving 82,114 nodes, a transitive reduction of 84,363 edges and a closure of 661,127 edges
(= 743,241 − the 82,114 edges into ``entity.n.01``). The non-basic edges number
661,127 − 84,363 = 576,764, and validation and test hold 5 % of them each: round(0.05 ·
576,764) = 28,838, the published size. ``dasgupta_split(wordnet_noun_hierarchy())`` reproduces
these counts exactly (``drop_root=True``, ``eval_fraction=0.05``).
"""
from __future__ import annotations

from typing import Hashable, NamedTuple

import networkx as nx
import torch

from perturb._validation import check_int
from perturb.boxes.hierarchy.graphs import (check_hierarchy, induced_subgraph,
                                            transitive_closure, transitive_reduction)
from perturb.boxes.hierarchy.rng import resolve_generator
from perturb.boxes.losses import PairSet, sample_negatives

__all__ = ["HierarchySplit", "split_hierarchy", "BenchmarkSplit", "dasgupta_split"]


class HierarchySplit(NamedTuple):
    """Node order and edge splits of a hierarchy, as ``(m, 2)`` LongTensors of
    ``(child, parent)`` node indices into ``nodes``.

    ``train`` holds the transitive reduction plus a fraction of the remaining closure edges;
    ``val``/``test`` the other closure edges (positives only: draw negatives with
    :func:`perturb.boxes.sample_negatives`, or use :func:`dasgupta_split`). ``closure`` is
    every closure edge.
    """

    nodes: list
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    closure: torch.Tensor


def _edge_tensor(edges, index: dict) -> torch.Tensor:
    t = torch.tensor([(index[u], index[v]) for u, v in edges], dtype=torch.long)
    return t.reshape(-1, 2)


def split_hierarchy(graph: nx.DiGraph, train_fraction: float = 0.0, val_fraction: float = 0.5,
                    *, generator: torch.Generator | None = None,
                    seed: int | None = None) -> HierarchySplit:
    """Split a hierarchy for the generalisation setting (Ganea et al. 2018; Dasgupta et al. 2020).

    The transitive reduction always goes to ``train`` (the minimal set from which the closure
    can be inferred); of the *non-basic* closure edges (closure minus reduction), a random
    ``train_fraction`` joins ``train``, and the rest is split into ``val`` (a ``val_fraction`` of
    it) and ``test``.
    """
    for name, v in (("train_fraction", train_fraction), ("val_fraction", val_fraction)):
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {v!r}")
    gen = resolve_generator(generator, seed)
    nodes = list(graph.nodes)
    index = {u: i for i, u in enumerate(nodes)}
    red = transitive_reduction(graph)
    clo = transitive_closure(graph)
    red_t = _edge_tensor(red.edges, index)
    red_set = set(red.edges)
    rest = _edge_tensor([e for e in clo.edges if e not in red_set], index)
    perm = torch.randperm(rest.shape[0], generator=gen)
    n_train = int(round(train_fraction * rest.shape[0]))
    n_val = int(round(val_fraction * (rest.shape[0] - n_train)))
    train = torch.cat([red_t, rest[perm[:n_train]]])
    val = rest[perm[n_train:n_train + n_val]]
    test = rest[perm[n_train + n_val:]]
    return HierarchySplit(nodes, train, val, test, _edge_tensor(clo.edges, index))


class BenchmarkSplit(NamedTuple):
    """A split with labelled evaluation pairs (:func:`dasgupta_split`).

    ``graph`` is the hierarchy the ids refer to (``nodes = list(graph.nodes)``; train on it);
    ``train``, ``val``, ``test`` are ``(m, 2)`` positive ``(child, parent)`` ids; ``val_pairs`` /
    ``val_labels`` (and ``test_*``) are the positives followed by their negatives, labels bool;
    ``closure`` is every closure edge of ``graph``: it is also the closure of ``train`` (which
    holds the transitive reduction), so passing it as ``known_edges`` to the trainer keeps
    every held-out positive out of the training negatives without using held-out data.
    ``n_basic`` is the size of the transitive reduction.
    """

    graph: nx.DiGraph
    nodes: list
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    val_pairs: torch.Tensor
    val_labels: torch.Tensor
    test_pairs: torch.Tensor
    test_labels: torch.Tensor
    closure: torch.Tensor
    n_basic: int


def _universal_root(graph: nx.DiGraph) -> Hashable | None:
    """The single node with no parent, when every other node lies below it; else None."""
    roots = [u for u in graph if graph.out_degree(u) == 0]
    if len(roots) != 1 or graph.number_of_nodes() < 2:
        return None
    root = roots[0]
    return root if len(nx.ancestors(graph, root)) == graph.number_of_nodes() - 1 else None


def dasgupta_split(graph: nx.DiGraph, train_fraction: float = 0.0, *,
                   eval_fraction: float = 0.05, negatives: int = 10, drop_root: bool = True,
                   max_tries: int = 100, generator: torch.Generator | None = None,
                   seed: int | None = None) -> BenchmarkSplit:
    """The WordNet generalisation protocol of Ganea et al. (2018) and Dasgupta et al. (2020).

    1. With ``drop_root`` the top node is removed when it lies above every other node
       (``entity.n.01``: every pair with it is trivially true).
    2. Training gets the transitive reduction (the basic edges) plus ``train_fraction`` of the
       non-basic closure edges (closure minus reduction): 0, 0.1, 0.25 or 0.5 in the papers'
       tables; the fraction is of *all* non-basic edges.
    3. Validation and test get ``eval_fraction`` (5 %) of the non-basic edges each, disjoint from
       each other and from training.
    4. Each validation and test positive gets ``negatives`` (10) negatives: the child or the
       parent (probability 1/2 each) replaced by a uniform random node, redrawn until the pair
       is outside the full closure and not a self pair (:func:`~perturb.boxes.sample_negatives`).

    Train with ``known_edges=split.closure`` (the closure of the training edges, see
    :class:`BenchmarkSplit`), so that no held-out positive is ever a training negative, and
    report :func:`~perturb.boxes.hierarchy.evaluate_split` (test F1 at the threshold that
    maximises validation F1).

    Args:
        graph: the hierarchy (edges ``child -> parent``, acyclic).
        train_fraction: fraction in [0, 1 − 2·eval_fraction] of the non-basic edges added to
            training.
        eval_fraction: fraction in (0, 0.5] of the non-basic edges in validation, and again in
            test.
        negatives: negatives per validation/test positive (>= 1).
        drop_root: remove a universal root first (above).
        max_tries: rejection rounds of the negative sampler.
        generator, seed: randomness of the split and of the negatives (one of them).

    Returns:
        :class:`BenchmarkSplit`.

    Raises:
        ValueError: a cyclic graph, fractions out of range, no non-basic edges to hold out.
        RuntimeError: the graph is too dense to draw negatives outside its closure.

    Example:
        >>> from perturb.boxes.hierarchy import random_dag
        >>> sp = dasgupta_split(random_dag(200, 0.02, seed=0), seed=0)
        >>> sp.val_pairs.shape[0] == 11 * sp.val.shape[0]
        True
    """
    check_hierarchy(graph)
    for name, v, hi in (("train_fraction", train_fraction, 1.0),
                        ("eval_fraction", eval_fraction, 0.5)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= hi:
            raise ValueError(f"{name} must be a number in [0, {hi}], got {v!r}")
    if eval_fraction == 0:
        raise ValueError("eval_fraction must be > 0")
    negatives = check_int(negatives, "negatives", low=1)
    gen = resolve_generator(generator, seed)
    if drop_root:
        root = _universal_root(graph)
        if root is not None:
            graph = induced_subgraph(graph, set(graph.nodes) - {root})
    nodes = list(graph.nodes)
    n = len(nodes)
    index = {u: i for i, u in enumerate(nodes)}
    red = transitive_reduction(graph)
    clo = transitive_closure(graph)
    red_set = set(red.edges)
    basic = _edge_tensor(red.edges, index)
    rest = _edge_tensor([e for e in clo.edges if e not in red_set], index)
    n_eval = int(round(eval_fraction * rest.shape[0]))
    n_train = int(round(train_fraction * rest.shape[0]))
    if n_eval == 0:
        raise ValueError(f"eval_fraction={eval_fraction} of the {rest.shape[0]} non-basic edges "
                         f"leaves no validation pair")
    if 2 * n_eval + n_train > rest.shape[0]:
        raise ValueError(f"train_fraction={train_fraction} and eval_fraction={eval_fraction} "
                         f"need {2 * n_eval + n_train} of the {rest.shape[0]} non-basic edges")
    perm = torch.randperm(rest.shape[0], generator=gen)
    val, test = rest[perm[:n_eval]], rest[perm[n_eval:2 * n_eval]]
    train = torch.cat([basic, rest[perm[2 * n_eval:2 * n_eval + n_train]]])
    closure = _edge_tensor(clo.edges, index)
    known = PairSet(closure, n, include_self=True)

    def labelled(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        neg = sample_negatives(pos, n, negatives, known=known, generator=gen,
                               max_tries=max_tries, mode="adaptive").reshape(-1, 2)
        labels = torch.cat([torch.ones(pos.shape[0], dtype=torch.bool),
                            torch.zeros(neg.shape[0], dtype=torch.bool)])
        return torch.cat([pos, neg]), labels

    val_pairs, val_labels = labelled(val)
    test_pairs, test_labels = labelled(test)
    return BenchmarkSplit(graph, nodes, train, val, test, val_pairs, val_labels, test_pairs,
                          test_labels, closure, basic.shape[0])

