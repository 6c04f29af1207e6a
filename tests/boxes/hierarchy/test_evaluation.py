"""Tests for perturb.boxes.hierarchy.evaluation and the model's scoring: F1 thresholds against
scikit-learn, scores against the core box functions, hand-built perfect embeddings."""
from __future__ import annotations

import math

import pytest
import torch

from perturb.boxes import log_containment_prob
from perturb.boxes.hierarchy import (
    BoxHierarchyModel,
    all_pairs_f1,
    balanced_tree,
    best_f1_threshold,
    edge_index,
    evaluate,
    score_all_pairs,
    transitive_closure,
)
from perturb.noise import Gumbel, Normal

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

@pytest.mark.parametrize("method", ["gumbel", "soft", "hard", "normal"])
def test_log_containment_matches_core(method):
    gen = torch.Generator().manual_seed(0)
    box_model = {"gumbel": dict(noise=Gumbel(0.2), volume_beta=0.3),
                 "soft": dict(noise=None, temperature=0.5), "hard": dict(noise=None),
                 "normal": dict(noise=Normal(0.2))}[method]
    model = BoxHierarchyModel(12, 3, **box_model, init=(0.2, 0.6), generator=gen,
                              dtype=torch.float64)
    for m in (5, 40):                        # per-pair and per-node child-volume branches
        child = torch.randint(12, (m,), generator=gen)
        parent = torch.randint(12, (m,), generator=gen)
        ours = model.log_containment(child, parent)
        kw = {"gumbel": dict(beta=0.2, volume_beta=0.3), "soft": dict(temperature=0.5),
              "hard": {}, "normal": dict(noise=Normal(0.2))}[method]
        ref = log_containment_prob(model(parent), model(child), **kw)
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    full = score_all_pairs(model, chunk_elements=50)      # several row chunks
    c, p = torch.meshgrid(torch.arange(12), torch.arange(12), indexing="ij")
    torch.testing.assert_close(full, model.log_containment(c.flatten(), p.flatten()).view(12, 12))


def _nested_tree_model():
    """Hard boxes built by hand for balanced_tree(2, 2): child boxes halve their parent."""
    model = BoxHierarchyModel(7, 1, None, parameterisation="min_delta", dtype=torch.float64)
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
