"""Tests for perturb.boxes.hierarchy.splits: the general split and the published protocol
(synthetic DAGs in every run; the full WordNet noun hierarchy when its files are present)."""
from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest
import torch

from perturb.boxes.hierarchy import (
    dasgupta_split,
    random_dag,
    split_hierarchy,
    transitive_closure,
    transitive_reduction,
)

def test_split_hierarchy():
    g = random_dag(30, 0.1, seed=0)
    split = split_hierarchy(g, train_fraction=0.3, val_fraction=0.5, seed=0)
    index = {u: i for i, u in enumerate(split.nodes)}
    red = {(index[u], index[v]) for u, v in transitive_reduction(g).edges}
    clo = {(index[u], index[v]) for u, v in transitive_closure(g).edges}
    as_set = lambda t: {tuple(r) for r in t.tolist()}     # noqa: E731
    train, val, test = as_set(split.train), as_set(split.val), as_set(split.test)
    assert red <= train
    assert train | val | test == clo == as_set(split.closure)
    assert len(train) + len(val) + len(test) == len(clo)
    rest = len(clo) - len(red)
    assert len(train) - len(red) == round(0.3 * rest)
    assert len(val) == round(0.5 * (rest - round(0.3 * rest)))
    again = split_hierarchy(g, train_fraction=0.3, val_fraction=0.5, seed=0)
    assert torch.equal(again.val, split.val)



_SPLIT_DIGEST = """
import hashlib, sys
import networkx as nx
from perturb.boxes.datasets import (random_dag, split_hierarchy, sub_hierarchy,
                                    transitive_closure)
g = random_dag(60, 0.08, seed=1)
g = nx.relabel_nodes(g, {u: f"node{u}" for u in g.nodes})     # str labels: hash-seeded sets
sp = split_hierarchy(g, 0.25, 0.5, seed=3)
parts = [t.numpy().tobytes() for t in (sp.train, sp.val, sp.test)]
parts.append(repr(list(transitive_closure(g).edges)).encode())
sub = sub_hierarchy(g, "node0")                                  # node order: graph order
parts.append(repr((list(sub.nodes), list(sub.edges))).encode())
print(hashlib.md5(b"".join(parts)).hexdigest())
"""


def test_split_and_closure_reproduce_across_hash_seeds():
    """Seeded splits and sub-hierarchies of string-labelled graphs are the same in every
    process (node and edge order must not follow set iteration order, which depends on
    PYTHONHASHSEED)."""
    import os
    import subprocess
    import sys
    root = str(Path(__file__).resolve().parents[3])
    digests = set()
    for hash_seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": root}
        out = subprocess.run([sys.executable, "-c", _SPLIT_DIGEST], env=env, check=True,
                             capture_output=True, text=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


# ----------------------------------------------------------------------------- the protocol

def _as_set(t: torch.Tensor) -> set:
    return {tuple(r) for r in t.tolist()}


@pytest.fixture(scope="module")
def dag():
    return random_dag(300, 0.02, seed=5)


@pytest.mark.parametrize("train_fraction", [0.0, 0.25, 0.5])
def test_dasgupta_split_sizes_and_disjointness(dag, train_fraction):
    sp = dasgupta_split(dag, train_fraction, seed=0)
    assert 0 not in sp.nodes and sp.nodes == list(sp.graph.nodes)        # the root is dropped
    assert len(sp.nodes) == dag.number_of_nodes() - 1
    index = {u: i for i, u in enumerate(sp.nodes)}
    red = {(index[u], index[v]) for u, v in transitive_reduction(sp.graph).edges}
    clo = {(index[u], index[v]) for u, v in transitive_closure(sp.graph).edges}
    assert _as_set(sp.closure) == clo and sp.n_basic == len(red)
    rest = len(clo) - len(red)
    train, val, test = _as_set(sp.train), _as_set(sp.val), _as_set(sp.test)
    assert len(val) == len(test) == round(0.05 * rest) == sp.val.shape[0] == sp.test.shape[0]
    assert len(train) == sp.train.shape[0] == len(red) + round(train_fraction * rest)
    assert red <= train and train | val | test <= clo
    assert not (train & val) and not (train & test) and not (val & test)
    assert not (val & red) and not (test & red)
    # the closure of the training edges is the full closure: filtering training negatives
    # against it uses only training data, and it holds every held-out positive
    train_graph = nx.DiGraph(list(train))
    assert {e for e in transitive_closure(train_graph).edges} == clo


def test_dasgupta_negatives_outside_the_closure(dag):
    sp = dasgupta_split(dag, 0.1, negatives=10, seed=1)
    clo = _as_set(sp.closure)
    for pairs, labels, pos in ((sp.val_pairs, sp.val_labels, sp.val),
                               (sp.test_pairs, sp.test_labels, sp.test)):
        m = pos.shape[0]
        assert pairs.shape == (11 * m, 2) and labels.dtype == torch.bool
        assert labels[:m].all() and not labels[m:].any()
        assert torch.equal(pairs[:m], pos)
        neg = pairs[m:]
        assert not (_as_set(neg) & clo)
        assert bool((neg[:, 0] != neg[:, 1]).all())                 # no self pair
        base = pos.repeat_interleave(10, dim=0)                     # one side kept
        assert bool(((neg[:, 0] == base[:, 0]) | (neg[:, 1] == base[:, 1])).all())
    again = dasgupta_split(dag, 0.1, negatives=10, seed=1)
    assert torch.equal(again.test_pairs, sp.test_pairs)


def test_training_negatives_never_held_out_positives(dag):
    from perturb.boxes.hierarchy import evaluate_split, train_hierarchy
    from perturb.boxes.losses import PairSet, sample_negatives
    sp = dasgupta_split(dag, 0.0, seed=2)
    n = len(sp.nodes)
    held_out = _as_set(sp.val) | _as_set(sp.test)
    known = PairSet(sp.closure, n, include_self=True)
    for mode in ("adaptive", "fixed"):
        neg = sample_negatives(sp.train.repeat(20, 1), n, 10, known=known, mode=mode,
                               generator=torch.Generator().manual_seed(0))
        assert not (_as_set(neg.reshape(-1, 2)) & held_out)
    res = train_hierarchy(sp.graph, 4, epochs=2, batch_size=64, train_edges=sp.train,
                          known_edges=sp.closure, diagnostics_every=1, seed=0, progress=False)
    assert res.history.known_negatives == [0, 0]
    ev = evaluate_split(res.model, sp)
    assert ev.test.threshold == ev.val.threshold and 0.0 <= ev.test.f1 <= 1.0
    assert ev.test.positives == sp.test.shape[0]


def test_dasgupta_split_options_and_errors(dag):
    keep = dasgupta_split(dag, drop_root=False, seed=0)
    assert 0 in keep.nodes and len(keep.nodes) == dag.number_of_nodes()
    two_roots = nx.DiGraph([(1, 0), (2, 3)])
    assert len(dasgupta_split(nx.DiGraph([(1, 0), (2, 0), (3, 1), (4, 1), (5, 3), (6, 3)]),
                              eval_fraction=0.3, seed=0).nodes) == 6
    with pytest.raises(ValueError, match="leaves no validation pair"):
        dasgupta_split(two_roots, seed=0)
    with pytest.raises(ValueError, match="non-basic edges"):
        dasgupta_split(dag, 0.95, seed=0)
    with pytest.raises(ValueError, match="train_fraction"):
        dasgupta_split(dag, -0.1)
    with pytest.raises(ValueError, match="eval_fraction"):
        dasgupta_split(dag, eval_fraction=0.0)
    with pytest.raises(ValueError, match="negatives"):
        dasgupta_split(dag, negatives=0)
    with pytest.raises(ValueError, match="acyclic"):
        dasgupta_split(nx.DiGraph([(0, 1), (1, 0)]))


def _have_wordnet() -> bool:
    from perturb.boxes.hierarchy import wordnet_dir
    return (wordnet_dir() / "data.noun").is_file() and (wordnet_dir() / "index.noun").is_file()


@pytest.mark.skipif(not _have_wordnet(), reason="WordNet 3.0 database not found "
                    "(apt-get install wordnet-base, or set $WORDNET_DIR)")
@pytest.mark.slow
def test_dasgupta_split_on_wordnet_nouns():
    """The published sizes: 82,114 nodes, 84,363 basic edges, 28,838 validation and test
    positives (5 % of the 576,764 non-basic edges) each."""
    from perturb.boxes.hierarchy import wordnet_noun_hierarchy
    sp = dasgupta_split(wordnet_noun_hierarchy(), 0.1, seed=0)
    assert "entity.n.01" not in sp.nodes and len(sp.nodes) == 82114
    assert sp.n_basic == 84363 and sp.closure.shape[0] == 661127
    assert sp.val.shape[0] == sp.test.shape[0] == 28838
    assert sp.train.shape[0] == 84363 + round(0.1 * 576764)
    assert not (_as_set(sp.val) & _as_set(sp.test))
    assert not (_as_set(sp.test_pairs[sp.test.shape[0]:]) & _as_set(sp.closure))
