"""Tests for perturb.boxes.hierarchy: scoring, F1 thresholds, negatives, training health."""
from __future__ import annotations

import math

import networkx as nx
import pytest
import torch

from perturb.boxes import Box, log_containment_prob
from perturb.boxes.datasets import balanced_tree, random_dag, split_hierarchy, transitive_closure
from perturb.boxes.hierarchy import (
    BoxHierarchyModel,
    _sample_negatives,
    all_pairs_f1,
    best_f1_threshold,
    edge_index,
    evaluate,
    score_all_pairs,
    train_hierarchy,
)

sklearn_metrics = pytest.importorskip("sklearn.metrics")


# ----------------------------------------------------------------------------- thresholds

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_f1_matches_sklearn(seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.rand(400, generator=g) < 0.3
    scores = torch.randint(0, 40, (400,), generator=g).double() + labels * 5.0   # ties
    res = best_f1_threshold(scores, labels)
    p, r, thr = sklearn_metrics.precision_recall_curve(labels.numpy(), scores.numpy())
    f1 = (2 * p * r / (p + r + 1e-300))[:-1]
    assert res.f1 == pytest.approx(float(f1.max()), abs=1e-12)
    pred = scores >= res.threshold
    assert res.f1 == pytest.approx(sklearn_metrics.f1_score(labels.numpy(), pred.numpy()),
                                   abs=1e-12)
    assert res.precision == pytest.approx(
        sklearn_metrics.precision_score(labels.numpy(), pred.numpy()), abs=1e-12)
    assert res.recall == pytest.approx(
        sklearn_metrics.recall_score(labels.numpy(), pred.numpy()), abs=1e-12)


def test_best_f1_edge_cases():
    assert best_f1_threshold(torch.tensor([0.1, 0.2]), torch.tensor([0, 0])).f1 == 0.0
    res = best_f1_threshold(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([1, 1, 0]))
    assert (res.f1, res.threshold) == (1.0, 2.0)
    with pytest.raises(ValueError, match="NaN"):
        best_f1_threshold(torch.tensor([math.nan]), torch.tensor([1]))
    with pytest.raises(ValueError, match="same shape"):
        best_f1_threshold(torch.zeros(3), torch.zeros(2))


# ----------------------------------------------------------------------------- scoring

@pytest.mark.parametrize("method", ["gumbel", "soft", "hard"])
def test_log_containment_matches_core(method):
    gen = torch.Generator().manual_seed(0)
    model = BoxHierarchyModel(12, 3, method, beta=0.2, volume_beta=0.3 if method == "gumbel"
                              else None, temperature=0.5, init=(0.2, 0.6), generator=gen,
                              dtype=torch.float64)
    for m in (5, 40):                        # per-pair and per-node child-volume branches
        child = torch.randint(12, (m,), generator=gen)
        parent = torch.randint(12, (m,), generator=gen)
        ours = model.log_containment(child, parent)
        kw = {"gumbel": dict(beta=0.2, volume_beta=0.3), "soft": dict(temperature=0.5),
              "hard": {}}[method]
        ref = log_containment_prob(model(parent), model(child), **kw)
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    full = score_all_pairs(model, chunk_elements=50)      # several row chunks
    c, p = torch.meshgrid(torch.arange(12), torch.arange(12), indexing="ij")
    torch.testing.assert_close(full, model.log_containment(c.flatten(), p.flatten()).view(12, 12))


def _nested_tree_model():
    """Hard boxes built by hand for balanced_tree(2, 2): child boxes halve their parent."""
    model = BoxHierarchyModel(7, 1, "hard", parameterisation="min_delta", dtype=torch.float64)
    lo = torch.tensor([0.0, 0.0, 4.0, 0.0, 2.0, 4.0, 6.0]) + 0.1
    width = torch.tensor([8.0, 4.0, 4.0, 2.0, 2.0, 2.0, 2.0]) - 0.2
    with torch.no_grad():
        model.embedding.param1.copy_(lo.unsqueeze(1))
        model.embedding.param2.copy_(torch.log(torch.expm1(width)).unsqueeze(1))
    return model


def test_all_pairs_f1_perfect_embedding():
    g = balanced_tree(2, 2)
    model = _nested_tree_model()
    clo = edge_index(g, transitive_closure(g).edges)
    res = all_pairs_f1(model, clo)
    assert (res.f1, res.precision, res.recall) == (1.0, 1.0, 1.0)
    assert res.positives == 10 and res.true_positives == 10
    # a threshold above log P = 0 predicts nothing
    assert all_pairs_f1(model, clo, threshold=0.5).predicted_positives == 0


def test_evaluate_with_and_without_threshold():
    g = balanced_tree(2, 2)
    model = _nested_tree_model()
    pairs = torch.tensor([[1, 0], [3, 1], [0, 1], [3, 4], [6, 2], [6, 0]])
    labels = torch.tensor([1, 1, 0, 0, 1, 1])
    best = evaluate(model, pairs, labels)
    assert best.f1 == 1.0
    res = evaluate(model, pairs, labels, threshold=math.log(0.99))
    assert (res.true_positives, res.predicted_positives, res.positives) == (4, 4, 4)
    with pytest.raises(ValueError, match="labels"):
        evaluate(model, pairs, labels[:3])
    with pytest.raises(ValueError, match=r"\(m, 2\)"):
        evaluate(model, pairs.float(), labels)
    with pytest.raises(ValueError, match="outside"):
        evaluate(model, pairs + 10, labels)
    assert g.number_of_nodes() == 7


# ----------------------------------------------------------------------------- negatives

def test_sample_negatives_filtered():
    n, k = 20, 16
    g = random_dag(n, 0.15, seed=1)
    pos = edge_index(g, transitive_closure(g).edges)
    codes = torch.unique(torch.cat([pos[:, 0] * n + pos[:, 1], torch.arange(n) * (n + 1)]))
    neg = _sample_negatives(pos, n, k, codes, torch.Generator().manual_seed(0))
    assert neg.shape == (pos.shape[0] * k, 2)
    assert not torch.isin(neg[:, 0] * n + neg[:, 1], codes).any()
    rep = pos.repeat_interleave(k, dim=0)
    kept_child = neg[:, 0] == rep[:, 0]
    assert bool((kept_child | (neg[:, 1] == rep[:, 1])).all())
    # corruption side: 1/2 each before filtering; filtering skews it, keep a wide band
    assert 0.25 < kept_child.double().mean().item() < 0.75


# ----------------------------------------------------------------------------- training

def test_training_reconstructs_small_tree():
    g = balanced_tree(2, 3)
    res = train_hierarchy(g, 2, "gumbel", epochs=40, lr=0.05, batch_size=16,
                          negatives_per_positive=8, seed=0, progress=False)
    clo = edge_index(g, transitive_closure(g).edges)
    f1 = all_pairs_f1(res.model, clo).f1
    h = res.history
    assert f1 >= 0.9, f1
    assert h.loss[-1] < 0.5 * h.loss[0]
    assert len(h.loss) == len(h.volume_quantiles) == len(h.containment_accuracy) == 40
    assert len(h.step_loss) == len(h.zero_grad_fraction) == 40 * 3    # 34 edges, 3 batches
    q = torch.tensor(h.volume_quantiles)
    assert bool((q[:, 1:] >= q[:, :-1]).all())                     # quantiles are ordered
    assert h.containment_accuracy[-1] > 0.9


def test_hard_boxes_have_zero_gradients_where_gumbel_does_not():
    """Local identifiability: tiny disjoint boxes give hard boxes exactly zero gradients."""
    g = random_dag(30, 0.05, seed=0)
    kw = dict(epochs=1, batch_size=1000, negatives_per_positive=0, seed=0, progress=False,
              init=(0.01, 0.02))
    hard = train_hierarchy(g, 4, "hard", **kw).history.zero_grad_fraction[0]
    gumbel = train_hierarchy(g, 4, "gumbel", beta=0.05, **kw).history.zero_grad_fraction[0]
    soft = train_hierarchy(g, 4, "soft", temperature=0.05, **kw).history.zero_grad_fraction[0]
    assert hard > 0.9
    assert gumbel == 0.0
    assert soft < hard


def test_stalled_pairs_hard_all_gumbel_none():
    """Violated pairs whose own loss has zero gradient: every disjoint hard positive, no
    Gumbel pair (the local identifiability of Dasgupta et al.)."""
    g = random_dag(30, 0.05, seed=0)
    kw = dict(epochs=1, batch_size=1000, negatives_per_positive=0, seed=0, progress=False,
              init=(0.01, 0.02))
    hard = train_hierarchy(g, 4, "hard", **kw).history
    gumbel = train_hierarchy(g, 4, "gumbel", beta=0.05, **kw).history
    assert hard.epoch_violated_fraction[0] > 0.9          # tiny random boxes: all disjoint
    assert hard.epoch_stalled_fraction[0] > 0.9
    assert gumbel.epoch_violated_fraction[0] > 0.9
    assert gumbel.epoch_stalled_fraction[0] == 0.0
    assert hard.stalled_fraction == hard.epoch_stalled_fraction


def test_stalled_pairs_counts_nested_hard_negative():
    """A negative pair nested by hard boxes (p = 1) is violated and stalled; the same pair as a
    positive is satisfied. Gumbel boxes give it a gradient."""
    from perturb.boxes.embedding import _inv_softplus
    from perturb.boxes.hierarchy import BoxHierarchyModel, _stalled_pairs
    for method, stalled in (("hard", 1), ("gumbel", 0)):
        m = BoxHierarchyModel(2, 2, method, init=(0.1, 0.5), generator=torch.Generator()
                              .manual_seed(0), dtype=torch.float64)
        with torch.no_grad():      # box 0 = [0.4, 0.5]^2 inside box 1 = [0, 1]^2
            m.embedding.param1.copy_(torch.tensor([[0.45, 0.45], [0.5, 0.5]]))
            m.embedding.param2.copy_(_inv_softplus(torch.tensor([[0.05, 0.05], [0.5, 0.5]])))
            box = m.embedding.all_boxes()
        torch.testing.assert_close(box.lower[0], torch.full((2,), 0.4, dtype=torch.float64))
        pairs = torch.tensor([[0, 1]])
        lp = m.log_containment(pairs[:, 0], pairs[:, 1])
        assert _stalled_pairs(m, pairs, lp, 0, 1e-12) == (stalled, 1)   # as a negative
        assert _stalled_pairs(m, pairs.repeat(9, 1), lp.repeat(9), 0, 1e-12, max_pairs=4) \
            == (9 * stalled, 9)                                       # sampled, scaled
        assert _stalled_pairs(m, pairs, lp, 1, 1e-12) == (0, 0)         # as a positive


def test_training_is_reproducible_and_accepts_edges():
    g = random_dag(15, 0.1, seed=4)
    kw = dict(epochs=3, batch_size=8, negatives_per_positive=3, progress=False)
    a = train_hierarchy(g, 3, seed=5, **kw).model.state_dict()
    b = train_hierarchy(g, 3, generator=torch.Generator().manual_seed(5), **kw).model.state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    c = train_hierarchy(g, 3, seed=5, train_edges=list(transitive_closure(g).edges), **kw)
    assert c.model.nodes == list(g.nodes)
    evals = train_hierarchy(g, 3, seed=5, eval_fn=lambda m: {"x": 1.0}, eval_every=2, **kw)
    assert [e["epoch"] for e in evals.history.eval] == [2, 3]


def test_generalisation_split_pipeline():
    g = balanced_tree(2, 3)
    split = split_hierarchy(g, train_fraction=0.5, val_fraction=0.5, seed=0)
    res = train_hierarchy(g, 2, epochs=5, seed=0, train_edges=split.train, progress=False,
                          negatives_per_positive=4)
    gen = torch.Generator().manual_seed(1)
    n = g.number_of_nodes()
    val_neg = torch.randint(n, (split.val.shape[0] * 4, 2), generator=gen)
    pairs = torch.cat([split.val, val_neg])
    labels = torch.cat([torch.ones(split.val.shape[0]), torch.zeros(val_neg.shape[0])])
    val = evaluate(res.model, pairs, labels)
    test = evaluate(res.model, split.test, torch.ones(split.test.shape[0]), val.threshold)
    assert 0.0 <= test.f1 <= 1.0 and test.threshold == val.threshold


def test_bad_arguments():
    g = balanced_tree(2, 2)
    with pytest.raises(ValueError, match="acyclic"):
        train_hierarchy(nx.DiGraph([(0, 1), (1, 0)]), 2, progress=False)
    with pytest.raises(ValueError, match="method"):
        train_hierarchy(g, 2, "fuzzy", epochs=1, progress=False)
    with pytest.raises(ValueError, match="not a node"):
        train_hierarchy(g, 2, train_edges=[(0, 99)], epochs=1, progress=False)
    with pytest.raises(ValueError, match="beta"):
        train_hierarchy(g, 2, beta=0.0, epochs=1, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        train_hierarchy(g, 2, batch_size=0, epochs=1, progress=False)
    with pytest.raises(ValueError, match="either generator or seed"):
        train_hierarchy(g, 2, seed=1, generator=torch.Generator(), epochs=1, progress=False)
