"""Tests for perturb.boxes.hierarchy.init: levels (against networkx longest paths) and boxes
nested along a hierarchy (hard containment of every edge and closure pair, reproducibility,
errors), and the nested start of a run (config, trainer, generalisation on a synthetic DAG)."""
from __future__ import annotations

import networkx as nx
import pytest
import torch
from hypothesis import given, settings, strategies as st

from perturb.boxes.hierarchy import (
    BoxHierarchyModel,
    HierarchyConfig,
    balanced_tree,
    dasgupta_split,
    edge_index,
    evaluate_split,
    hierarchy_levels,
    nested_boxes,
    random_dag,
    random_tree,
    train_hierarchy,
    transitive_closure,
)


def _inside(box, pairs, strict=True):
    """Per pair: child's box inside the parent's box in every coordinate."""
    c, p = pairs[:, 0], pairs[:, 1]
    lo_ok = box.lower[c] > box.lower[p] if strict else box.lower[c] >= box.lower[p]
    hi_ok = box.upper[c] < box.upper[p] if strict else box.upper[c] <= box.upper[p]
    return (lo_ok & hi_ok).all(dim=1)


def _longest_path_levels(g: nx.DiGraph) -> list[int]:
    """Reference: level = longest path up to a root, by dynamic programming over networkx's
    topological order (parents first on the reversed graph)."""
    level = {}
    for u in reversed(list(nx.topological_sort(g))):
        level[u] = 1 + max((level[p] for p in g.successors(u)), default=-1)
    return [level[u] for u in g.nodes]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 60), p=st.floats(0.0, 0.2), seed=st.integers(0, 10 ** 6))
def test_levels_match_longest_paths(n, p, seed):
    g = random_dag(n, p, seed=seed)
    got = hierarchy_levels(n, edge_index(g))
    assert got.tolist() == _longest_path_levels(g)


def test_levels_reject_cycles_and_self_loops():
    with pytest.raises(ValueError, match="cycle"):
        hierarchy_levels(3, torch.tensor([[0, 1], [1, 2], [2, 0]]))
    with pytest.raises(ValueError, match="self loop"):
        hierarchy_levels(3, torch.tensor([[1, 1]]))
    with pytest.raises(ValueError, match="edges"):
        hierarchy_levels(3, torch.tensor([[0, 5]]))
    assert hierarchy_levels(4, torch.zeros(0, 2, dtype=torch.long)).tolist() == [0] * 4


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 80), d=st.integers(1, 6), seed=st.integers(0, 10 ** 6))
def test_tree_boxes_nest_every_closure_pair(n, d, seed):
    g = random_tree(n, seed=seed)
    box = nested_boxes(n, edge_index(g), d, shrink_dims=min(2, d), seed=seed)
    assert box.shape == (n, d) and box.dtype == torch.float64
    assert bool((box.upper > box.lower).all())
    clo = edge_index(g, transitive_closure(g).edges)
    assert bool(_inside(box, clo).all())                    # strict: the margin is kept


def test_dag_children_lie_in_every_parent_whose_rooms_meet():
    """A child lies inside all its parents when their margin-shrunk boxes meet, and inside its
    first parent (first in the edge list) otherwise (checked node by node)."""
    g = random_dag(300, 0.02, seed=3)
    edges = edge_index(g)
    margin = 0.02
    box = nested_boxes(300, edges, 8, margin=margin, seed=0)
    lo, hi = box.lower, box.upper
    parents: dict[int, list[int]] = {}
    for c, p in edges.tolist():
        parents.setdefault(c, []).append(p)
    n_multi = n_met = 0
    for c, ps in parents.items():
        gap = margin * (hi[ps] - lo[ps])
        meet = bool(((hi[ps] - gap).amin(0) > (lo[ps] + gap).amax(0)).all())
        inside = [bool((lo[c] > lo[p]).all() and (hi[c] < hi[p]).all()) for p in ps]
        assert all(inside) if meet else inside[0], (c, ps)
        n_multi += len(ps) > 1
        n_met += len(ps) > 1 and meet
    assert n_multi > 10 and 0 < n_met < n_multi        # both cases occur


def test_shrink_and_margin_control_the_child():
    g = balanced_tree(2, 1)                                 # root 0, children 1 and 2
    box = nested_boxes(3, edge_index(g), 4, shrink_dims=0, margin=0.1, scale=1.0, seed=0)
    root = box.upper[0] - box.lower[0]
    torch.testing.assert_close(box.upper[1] - box.lower[1], 0.8 * root)
    box = nested_boxes(3, edge_index(g), 4, shrink_dims=4, shrink=(0.5, 0.5), margin=0.0,
                       scale=2.0, seed=0)
    torch.testing.assert_close(box.upper[0] - box.lower[0], torch.full((4,), 2.0,
                                                                       dtype=torch.float64))
    torch.testing.assert_close(box.upper[2] - box.lower[2], torch.full((4,), 1.0,
                                                                       dtype=torch.float64))


def test_nested_boxes_are_reproducible():
    edges = edge_index(random_tree(50, seed=0))
    a = nested_boxes(50, edges, 5, seed=1)
    b = nested_boxes(50, edges, 5, generator=torch.Generator().manual_seed(1))
    c = nested_boxes(50, edges, 5, seed=2)
    torch.testing.assert_close(a.lower, b.lower, rtol=0, atol=0)
    assert not torch.equal(a.lower, c.lower)


@pytest.mark.parametrize("kw,match", [
    (dict(shrink_dims=5), "shrink_dims"),
    (dict(shrink=(0.0, 0.5)), "shrink"),
    (dict(shrink=(0.6, 0.5)), "shrink"),
    (dict(margin=0.5), "margin"),
    (dict(scale=0.0), "scale"),
    (dict(dim=0), "dim"),
])
def test_bad_arguments(kw, match):
    args = dict(dim=4)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        nested_boxes(3, torch.tensor([[1, 0], [2, 0]]), **args)


# ----------------------------------------------------------------------------- a run's start

def test_config_initializer():
    assert HierarchyConfig().initializer == "random"
    with pytest.raises(ValueError, match="initializer"):
        HierarchyConfig(initializer="tree")
    with pytest.raises(ValueError, match="sigmoid"):
        HierarchyConfig(initializer="nested", parameterisation="sigmoid")


@pytest.mark.parametrize("param", ["center_offset", "min_delta"])
def test_trainer_starts_from_nested_boxes(param):
    g = random_tree(40, seed=0)
    res = train_hierarchy(g, 3, epochs=0, seed=4, initializer="nested", parameterisation=param,
                          closure=False, progress=False)
    box = res.model.embedding.all_boxes()
    assert bool(_inside(box, edge_index(g)).all())
    again = train_hierarchy(g, 3, epochs=0, seed=4, initializer="nested",
                            parameterisation=param, closure=False, progress=False)
    torch.testing.assert_close(again.model.embedding.all_boxes().lower, box.lower, rtol=0,
                               atol=0)


@pytest.mark.parametrize("extra_edge_prob,floor", [(0.0, 0.9), (0.0002, 0.8)])
def test_nested_start_generalises_from_the_reduction_alone(extra_edge_prob, floor):
    """The published protocol on synthetic hierarchies (reduction-only training): a random tree
    of 1,000 nodes, and the same with extra parents (83 nodes with two or more, 8 %; WordNet
    has 2.6 %). Nested boxes predict held-out closure pairs (test F1 0.94 and 0.86 measured),
    the same training from random boxes does not (0.17, the level of predicting every pair
    true). A child whose parents' boxes do not meet starts inside one parent only, which is
    what the extra parents cost."""
    g = random_dag(1000, extra_edge_prob, seed=1)
    split = dasgupta_split(g, 0.0, seed=0)
    kw = dict(epochs=3, lr=0.002, batch_size=64, negatives_per_positive=10, seed=0,
              train_edges=split.train, known_edges=split.closure, progress=False)
    nested = train_hierarchy(split.graph, 6, initializer="nested", **kw)
    f1_nested = evaluate_split(nested.model, split).test.f1
    random_ = train_hierarchy(split.graph, 6, **kw)
    f1_random = evaluate_split(random_.model, split).test.f1
    assert f1_nested >= floor, f1_nested
    assert f1_nested > f1_random + 0.5, (f1_nested, f1_random)
