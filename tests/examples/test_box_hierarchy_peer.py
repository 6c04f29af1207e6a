"""The box-embeddings peer of examples/box_hierarchy.py (``--peer box-embeddings``): its soft
box against ours, its filtered negatives, its start, and a short learning run."""
import pathlib
import sys

import pytest
import torch
from _examples import load_example

pytest.importorskip("box_embeddings")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _example():
    if str(ROOT) not in sys.path:                   # bench._box_peer, imported by the example
        sys.path.insert(0, str(ROOT))
    return load_example("box_hierarchy")


def _peer_loop():
    _example()
    from bench._box_peer import PeerLoop
    return PeerLoop


def test_soft_peer_scores_equal_our_soft_boxes():
    """Hard intersection and softplus volumes are the same closed form in both libraries:
    box-embeddings' log P(child ⊆ parent) equals our model's on the same parameters."""
    from perturb.boxes.hierarchy import BoxHierarchyModel
    PeerLoop = _peer_loop()
    g = torch.Generator().manual_seed(0)
    ours = BoxHierarchyModel(30, dim=4, noise=None, temperature=0.7, generator=g,
                             dtype=torch.float64)
    e = ours.embedding
    pairs = torch.randint(30, (200, 2), generator=g)
    peer = PeerLoop(e.param1, e.param2, pairs, beta=0.1, volume_beta=1.0, batch_size=8,
                    negatives=1, lr=0.1, box="soft", temperature=0.7)
    ref = ours.log_containment(pairs[:, 0], pairs[:, 1]).detach()
    torch.testing.assert_close(peer.score(pairs), ref, rtol=1e-10, atol=1e-10)


def test_peer_negatives_avoid_known_pairs():
    from perturb.boxes.losses import PairSet
    PeerLoop = _peer_loop()
    n = 12
    pos = torch.tensor([[i, j] for i in range(n) for j in range(n) if i != j and (i + j) % 3])
    known = PairSet(pos, n, include_self=True)
    peer = PeerLoop(torch.zeros(n, 2), torch.zeros(n, 2), pos, beta=0.1, volume_beta=1.0,
                    batch_size=16, negatives=5, lr=0.1, known=known)
    neg = peer.negatives(pos[:16])
    assert neg.shape == (80, 2)
    assert not known.contains(neg).any()
    # each negative keeps the child or the parent of its positive
    base = pos[:16].repeat_interleave(5, dim=0)
    assert ((neg[:, 0] == base[:, 0]) | (neg[:, 1] == base[:, 1])).all()


@pytest.mark.parametrize("method", ["gumbel", "soft"])
def test_train_peer_starts_from_our_boxes_and_learns(method):
    """train_peer starts from our initial model for the seed and, on a small tree with
    filtered negatives, learns the held-out ancestor pairs better than its start."""
    ex = _example()
    from perturb.boxes.hierarchy import (HierarchyConfig, balanced_tree, edge_index,
                                         initial_model, split_hierarchy, transitive_closure)
    from perturb.boxes.losses import PairSet
    graph = balanced_tree(2, 4)
    n = graph.number_of_nodes()
    args = ex.parse_args(["--lr", "0.05", "--decay-epochs", "2", "--batch-size", "32"])
    hp = dict(beta=0.03, volume_beta=1.0, temperature=1.0)
    split = split_hierarchy(graph, 0.25, 0.5, seed=0)
    known = edge_index(graph, transitive_closure(graph.edge_subgraph(
        [(split.nodes[c], split.nodes[p]) for c, p in split.train.tolist()])).edges)
    codes = PairSet(split.closure, n, include_self=True)
    val_pairs, val_labels = ex.eval_pairs(split.val, n, 5, codes, torch.Generator().manual_seed(1))
    loop, curve = ex.train_peer(graph, 4, method, args, 40, 5, 0, hp, split.train, known,
                                val_pairs, val_labels, 10)
    assert [e for e, _ in curve] == [10, 20, 30, 40, 42, 44]
    cfg = HierarchyConfig(**ex.box_model(method, hp, 0.1), dim=4)
    start = initial_model(n, list(graph.nodes), cfg, split.train, torch.Generator().manual_seed(0))
    from bench._box_peer import PeerLoop
    at_start = PeerLoop(start.embedding.param1, start.embedding.param2, split.train, beta=0.03,
                        volume_beta=1.0, batch_size=32, negatives=5, lr=0.05, box=method,
                        temperature=1.0)
    from perturb.boxes.hierarchy import best_f1_threshold
    f1_start = best_f1_threshold(at_start.score(val_pairs), val_labels).f1
    scores = loop.score(val_pairs)
    assert torch.isfinite(scores).all() and (scores <= 0).all()
    assert curve[-1][1] == best_f1_threshold(scores, val_labels).f1
    assert curve[-1][1] > f1_start + 0.2, (f1_start, curve)


@pytest.mark.slow
def test_main_with_peer_on_mammal(tmp_path):
    """--peer box-embeddings through main: our runs and the peer's on the same mammal split,
    each with a validation-F1 point per epoch."""
    ex = _example()
    from perturb.boxes.hierarchy import wordnet_dir
    if not (wordnet_dir() / "data.noun").is_file():
        pytest.skip("WordNet is not installed")
    threads = torch.get_num_threads()
    try:
        r = ex.main(["--no-tree", "--no-reconstruction", "--gen-known", "closure",
                     "--methods", "gumbel", "soft", "--peer", "box-embeddings", "--seeds", "1",
                     "--epochs", "2", "--decay-epochs", "1", "--threads", "1", "--no-progress",
                     "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    rows = {row["method"]: row for row in r["rows"]}
    assert set(rows) == {"gumbel", "soft", "gumbel (box-embeddings)", "soft (box-embeddings)"}
    for method, row in rows.items():
        assert [e for e, _ in row["f1_curve"]] == [1, 2, 3, 4], method
        assert 0.0 < row["f1"] <= 1.0 and 0.0 < row["val_f1"] <= 1.0, method
        assert row["setting"] == "generalisation/mammal (closure-filtered)"
