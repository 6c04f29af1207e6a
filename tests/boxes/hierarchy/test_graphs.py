"""Tests for perturb.boxes.hierarchy.graphs: closures, reductions, sub-hierarchies, synthetic
DAGs, pair tensors."""
from __future__ import annotations

import math

import networkx as nx
import pytest
import torch

from perturb.boxes.hierarchy import (
    balanced_tree,
    check_hierarchy,
    check_pairs,
    edge_index,
    random_dag,
    random_tree,
    sub_hierarchy,
    transitive_closure,
    transitive_reduction,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closure_matches_networkx(seed):
    g = random_dag(40, 0.1, seed=seed)
    ours = transitive_closure(g)
    ref = nx.transitive_closure_dag(g)
    assert set(ours.edges) == set(ref.edges)
    assert set(transitive_closure(g, reflexive=True).edges) == set(ref.edges) | {
        (u, u) for u in g}
    red = transitive_reduction(g)
    assert set(transitive_closure(red).edges) == set(ref.edges)
    assert red.number_of_edges() <= g.number_of_edges()


def test_sub_hierarchy_commutes_with_closure():
    g = random_dag(60, 0.08, seed=3)
    root = 5
    sub = sub_hierarchy(g, root)
    full = transitive_closure(g)
    restricted = {(u, v) for u, v in full.edges if u in sub and v in sub}
    assert set(transitive_closure(sub).edges) == restricted
    assert all(nx.has_path(g, u, root) for u in sub)
    with pytest.raises(ValueError, match="root"):
        sub_hierarchy(g, "missing")


def test_check_hierarchy_errors():
    with pytest.raises(ValueError, match="acyclic"):
        check_hierarchy(nx.DiGraph([(0, 1), (1, 2), (2, 0)]))
    with pytest.raises(ValueError, match="self-loop"):
        check_hierarchy(nx.DiGraph([(0, 0)]))
    with pytest.raises(ValueError, match="DiGraph"):
        check_hierarchy(nx.Graph([(0, 1)]))


def test_balanced_tree():
    g = balanced_tree(2, 9)
    assert g.number_of_nodes() == 1023 and g.number_of_edges() == 1022
    ref = nx.balanced_tree(2, 9)          # same breadth-first labels, undirected
    assert {frozenset(e) for e in g.edges} == {frozenset(e) for e in ref.edges}
    assert all(g.out_degree(u) == (0 if u == 0 else 1) for u in g)
    # closure of a complete binary tree: sum of depths = sum_k k 2^k = (h-1) 2^(h+1) + 2
    assert transitive_closure(g).number_of_edges() == 8 * 2 ** 10 + 2
    assert balanced_tree(3, 2).number_of_nodes() == 13 and balanced_tree(1, 4).number_of_nodes() == 5
    with pytest.raises(ValueError, match="branching"):
        balanced_tree(0, 3)


def test_random_tree_and_dag_reproducible():
    t1, t2 = random_tree(50, seed=7), random_tree(50, seed=7)
    assert set(t1.edges) == set(t2.edges) and set(t1.edges) != set(random_tree(50, seed=8).edges)
    assert nx.is_tree(t1.to_undirected()) and all(v < u for u, v in t1.edges)
    d1 = random_dag(50, 0.2, generator=torch.Generator().manual_seed(1))
    d2 = random_dag(50, 0.2, generator=torch.Generator().manual_seed(1))
    assert set(d1.edges) == set(d2.edges)
    check_hierarchy(d1)
    assert [u for u in d1 if d1.out_degree(u) == 0] == [0]
    with pytest.raises(ValueError, match="either generator or seed"):
        random_tree(5, seed=1, generator=torch.Generator())
    with pytest.raises(ValueError, match="extra_edge_prob"):
        random_dag(5, 1.5)


def test_random_dag_edge_count_matches_expectation():
    # extra edges: each pair j < i, besides the tree edge, independently with prob p
    n, p, reps = 40, 0.1, 20
    counts = torch.tensor([random_dag(n, p, seed=s).number_of_edges() - (n - 1)
                           for s in range(reps)], dtype=torch.float64)
    m = (n - 1) * (n - 2) / 2                  # pairs that are not the tree edge
    mean, sd = m * p, math.sqrt(m * p * (1 - p))
    assert abs(counts.mean().item() - mean) < 4 * sd / math.sqrt(reps)


def test_random_tree_parent_distribution():
    # the parent of node 3 is uniform on {0, 1, 2}: chi-square-free check with 5 sigma bounds
    reps = 600
    gen = torch.Generator().manual_seed(0)
    parents = torch.tensor([next(random_tree(4, generator=gen).successors(3)) for _ in range(reps)])
    freq = torch.bincount(parents, minlength=3).double() / reps
    sd = math.sqrt((1 / 3) * (2 / 3) / reps)
    assert torch.all((freq - 1 / 3).abs() < 5 * sd)


def test_edge_index_and_check_pairs():
    g = nx.DiGraph([("b", "a"), ("c", "a")])
    assert edge_index(g).tolist() == [[0, 1], [2, 1]]
    assert edge_index(g, [("c", "b")]).tolist() == [[2, 0]]
    with pytest.raises(ValueError, match="not a node"):
        edge_index(g, [("z", "a")])
    assert check_pairs(torch.tensor([[0, 1]], dtype=torch.int32), 3).dtype == torch.long
    with pytest.raises(ValueError, match=r"train_edges.*\(m, 2\)"):
        check_pairs(torch.zeros(3, dtype=torch.long), 3, "train_edges")
    with pytest.raises(ValueError, match="outside"):
        check_pairs(torch.tensor([[0, 3]]), 3)
    with pytest.raises(ValueError, match="integer"):
        check_pairs(torch.tensor([[0.0, 1.0]]), 3)
