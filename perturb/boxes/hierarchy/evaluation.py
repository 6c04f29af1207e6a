"""Evaluation of hierarchy boxes: F1 of ``log P(child ⊆ parent) >= threshold``.

Two settings (Nickel & Kiela 2017; Ganea et al. 2018; Dasgupta et al. 2020):

- *reconstruction*: train on the closure, score all ordered pairs, F1 at the best threshold
  (:func:`all_pairs_f1`);
- *generalisation*: pick the threshold maximising F1 on labelled validation pairs and report
  F1 on the test pairs at that threshold (:func:`evaluate`, :func:`evaluate_split` for a
  :class:`~perturb.boxes.hierarchy.BenchmarkSplit`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from perturb.boxes.box import Box
from perturb.boxes.hierarchy.graphs import check_pairs
from perturb.boxes.hierarchy.model import BoxHierarchyModel, check_model
from perturb.boxes.hierarchy.splits import BenchmarkSplit

__all__ = ["EvalResult", "SplitEval", "best_f1_threshold", "evaluate", "evaluate_split",
           "score_pairs", "score_all_pairs", "all_pairs_f1"]


class EvalResult(NamedTuple):
    """Precision, recall and F1 of the pairs predicted positive (``score >= threshold``, on the
    log P(child ⊆ parent) scale), with the counts behind them."""

    precision: float
    recall: float
    f1: float
    threshold: float
    true_positives: int
    predicted_positives: int
    positives: int




class SplitEval(NamedTuple):
    """``val`` (best threshold on the validation pairs) and ``test`` (at that threshold)."""

    val: EvalResult
    test: EvalResult


def best_f1_threshold(scores: torch.Tensor, labels: torch.Tensor) -> EvalResult:
    """The threshold maximising F1 of ``scores >= threshold`` against binary ``labels``.

    Sorts once (O(m log m)) and evaluates F1 = 2·TP / (#predicted + #positives) at every
    distinct score (ties are predicted together).

    Shape:
        ``scores``, ``labels``: ``(m,)``.
    """
    if scores.shape != labels.shape or scores.ndim != 1:
        raise ValueError(f"scores and labels must be 1-D of the same shape, got "
                         f"{tuple(scores.shape)} and {tuple(labels.shape)}")
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN")
    lab = labels.to(torch.bool)
    positives = int(lab.sum())
    if scores.numel() == 0 or positives == 0:
        return EvalResult(0.0, 0.0, 0.0, math.inf, 0, 0, positives)
    order = torch.argsort(scores, descending=True, stable=True)
    s = scores[order]
    tp = torch.cumsum(lab[order].to(torch.float64), 0)
    k = torch.arange(1, s.numel() + 1, dtype=torch.float64, device=s.device)
    last = torch.ones_like(lab)
    last[:-1] = s[:-1] != s[1:]
    f1 = torch.where(last, 2.0 * tp / (k + positives), torch.full_like(tp, -1.0))
    i = int(torch.argmax(f1))
    tpi, ki = int(tp[i]), int(k[i])
    return EvalResult(tpi / ki, tpi / positives, float(f1[i]), float(s[i]), tpi, ki, positives)


def _prf(pred: torch.Tensor, lab: torch.Tensor, threshold: float) -> EvalResult:
    tp = int((pred & lab).sum())
    npred, npos = int(pred.sum()), int(lab.sum())
    p = tp / npred if npred else 0.0
    r = tp / npos if npos else 0.0
    f1 = 2 * tp / (npred + npos) if npred + npos else 0.0
    return EvalResult(p, r, f1, threshold, tp, npred, npos)


@torch.no_grad()
def score_pairs(model: BoxHierarchyModel, pairs: torch.Tensor, batch_size: int = 65536
                ) -> torch.Tensor:
    """log P(child ⊆ parent) of ``(m, 2)`` ``(child, parent)`` ids, in chunks of
    ``batch_size`` pairs, without gradients: ``(m,)`` on the model's device."""
    dev = model.embedding.param1.device
    out = [model.log_containment(chunk[:, 0].to(dev), chunk[:, 1].to(dev))
           for chunk in pairs.split(batch_size)]
    return torch.cat(out) if out else torch.empty(0, device=dev)


def evaluate(model: BoxHierarchyModel, pairs: torch.Tensor, labels: torch.Tensor,
             threshold: float | None = None, *, batch_size: int = 65536) -> EvalResult:
    """Precision, recall and F1 of ``log P(child ⊆ parent) >= threshold`` on labelled pairs.

    Args:
        model: trained boxes.
        pairs: ``(m, 2)`` ``(child, parent)`` node ids.
        labels: ``(m,)`` 1 for true pairs, 0 otherwise.
        threshold: on the log-probability scale; None picks the best-F1 threshold over these
            pairs (:func:`best_f1_threshold`) - use it on a validation split, or over all pairs
            in the reconstruction setting; then apply the returned ``threshold`` to test pairs.
        batch_size: pairs scored at once.

    Returns:
        :class:`EvalResult`.

    Raises:
        ValueError: misshaped pairs/labels, ids out of range.

    Example:
        >>> val = evaluate(model, val_pairs, val_labels)                    # doctest: +SKIP
        >>> test = evaluate(model, test_pairs, test_labels, val.threshold)   # doctest: +SKIP
    """
    check_model(model)
    pairs = check_pairs(pairs, model.num_nodes, "pairs")
    if not isinstance(labels, torch.Tensor) or labels.is_complex() \
            or labels.shape != pairs.shape[:1]:
        got = (f"shape {tuple(labels.shape)}" if isinstance(labels, torch.Tensor)
               else type(labels).__name__)
        raise ValueError(f"labels must be a tensor of shape ({pairs.shape[0]},) holding 1 for "
                         f"true pairs and 0 otherwise (e.g. torch.tensor(labels)), got {got}")
    scores = score_pairs(model, pairs, batch_size)
    lab = labels.to(device=scores.device, dtype=torch.bool)
    if threshold is None:
        return best_f1_threshold(scores, lab)
    return _prf(scores >= threshold, lab, float(threshold))


@torch.no_grad()
def score_all_pairs(model: BoxHierarchyModel, *, chunk_elements: int = 2 ** 22) -> torch.Tensor:
    """``(n, n)`` matrix of log P(child ⊆ parent), child = row, parent = column (diagonal
    included), computed in row chunks by broadcasting. Memory O(n²); for n up to ~10⁴."""
    boxes = model.embedding.all_boxes()
    n, d = model.num_nodes, model.dim
    rows = max(1, chunk_elements // max(1, n * d))
    out = []
    for start in range(0, n, rows):
        child = boxes[start:start + rows]
        child = Box(child.lower.unsqueeze(1), child.upper.unsqueeze(1))       # (r, 1, d)
        parent = Box(boxes.lower.unsqueeze(0), boxes.upper.unsqueeze(0))      # (1, n, d)
        out.append(model.log_containment_boxes(parent, child))
    return torch.cat(out)


def all_pairs_f1(model: BoxHierarchyModel, positives: torch.Tensor,
                 threshold: float | None = None) -> EvalResult:
    """F1 over all ordered pairs ``(u, v)``, ``u != v`` (the reconstruction setting): the
    positives are the given ``(child, parent)`` edges (normally the transitive closure), every
    other pair is negative; best threshold when ``threshold`` is None."""
    check_model(model)
    n = model.num_nodes
    positives = check_pairs(positives, n, "positives")
    scores = score_all_pairs(model)
    lab = torch.zeros(n, n, dtype=torch.bool, device=scores.device)
    lab[positives[:, 0].to(scores.device), positives[:, 1].to(scores.device)] = True
    off = ~torch.eye(n, dtype=torch.bool, device=scores.device)
    s, lab = scores[off], lab[off]
    if threshold is None:
        return best_f1_threshold(s, lab)
    return _prf(s >= threshold, lab, float(threshold))




def evaluate_split(model: BoxHierarchyModel, split: BenchmarkSplit, *,
                   batch_size: int = 65536) -> SplitEval:
    """The published protocol's numbers: the best-F1 threshold on ``split``'s validation pairs
    and test F1 at that threshold (:func:`~perturb.boxes.hierarchy.dasgupta_split`).

    Raises:
        ValueError: the model's nodes differ from the split's.
    """
    check_model(model)
    if model.num_nodes != len(split.nodes):
        raise ValueError(f"model has {model.num_nodes} boxes, the split {len(split.nodes)} "
                         f"nodes; train on split.graph")
    val = evaluate(model, split.val_pairs, split.val_labels, batch_size=batch_size)
    test = evaluate(model, split.test_pairs, split.test_labels, val.threshold,
                    batch_size=batch_size)
    return SplitEval(val, test)

