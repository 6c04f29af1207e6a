"""Training losses for box embeddings and negative sampling.

Containment (hierarchies, entailment): for a pair (parent, child) with label t ∈ [0, 1]
(1: the child is contained in the parent, 0: it is not), with p = P(child ⊆ parent)
(:func:`~perturb.boxes.containment_prob`),

    negatives="nll":    ℓ = −t·log p − (1 − t)·log(1 − p)          (binary cross-entropy)
    negatives="margin": ℓ = −t·log p + (1 − t)·max(0, p − margin)

where log(1 − p) = log1mexp(log p) is computed from log p without cancellation. The overlap
loss is the same with the Jaccard-type :func:`~perturb.boxes.overlap` in place of p.
Volume regularisation keeps boxes from growing to contain everything (the "slackness" of the
containment loss): Σ 1[Vol > τ_v]·Vol.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from perturb._validation import check_choice, check_int
from perturb.boxes.box import Box
from perturb.boxes.intersection import (log1m_containment_prob, log1mexp,
                                        log_containment_prob, overlap)
from perturb.boxes.volume import volume

__all__ = ["containment_loss", "overlap_loss", "volume_regularizer", "sample_negatives",
           "log1mexp"]

_REDUCTIONS = ("mean", "sum", "none")


def _negative_nll(log1m_p: torch.Tensor) -> torch.Tensor:
    """−log(1 − p) from an accurate log(1 − p): finite everywhere, p = 1 exactly (−inf) gets
    the finite loss −log(eps) with zero gradient."""
    floor = math.log(torch.finfo(log1m_p.dtype).eps)
    return -torch.where(torch.isneginf(log1m_p), floor, log1m_p)


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    check_choice(reduction, _REDUCTIONS, "reduction")
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _target(target: torch.Tensor | float | None, like: torch.Tensor) -> torch.Tensor | None:
    if target is None:
        return None
    if not isinstance(target, torch.Tensor):
        target = torch.tensor(float(target))
    target = target.to(dtype=like.dtype, device=like.device)
    if bool(((target < 0) | (target > 1) | torch.isnan(target)).any()):
        raise ValueError("target must hold labels in [0, 1] (1: positive pair, 0: negative)")
    try:
        torch.broadcast_shapes(target.shape, like.shape)
    except RuntimeError:
        raise ValueError(f"target must broadcast to the batch shape {tuple(like.shape)}, got "
                         f"{tuple(target.shape)}") from None
    return target


def _check_margin(margin: float) -> None:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) \
            or not 0.0 <= margin <= 1.0:
        raise ValueError(f"margin must be a number in [0, 1], got {margin!r}")


def _binary_loss(log_p: torch.Tensor, target: torch.Tensor | float | None, negatives: str,
                 margin: float, reduction: str,
                 log1m_p: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
    """``log1m_p``: computes log(1 − p) when the default log1mexp(log p) is not accurate
    enough (containment of Gumbel boxes)."""
    check_choice(negatives, ("nll", "margin"), "negatives")
    t = _target(target, log_p)
    pos = -log_p
    if t is None:
        return _reduce(pos, reduction)
    if negatives == "nll":
        if log1m_p is None:
            # Clamp so that p == 1 in floating point gives a large finite loss, not inf.
            neg = -log1mexp(log_p.clamp(max=-torch.finfo(log_p.dtype).eps))
        else:
            neg = _negative_nll(log1m_p())
    else:
        neg = torch.relu(torch.exp(log_p) - margin)
    # Select rather than multiply, so a -inf log p on an unused side cannot give 0·inf = NaN.
    pos = torch.where(t > 0, pos, torch.zeros_like(pos))
    neg = torch.where(t < 1, neg, torch.zeros_like(neg))
    return _reduce(t * pos + (1.0 - t) * neg, reduction)


def containment_loss(parent: Box, child: Box, beta: float | torch.Tensor | None = None, *,
                     target: torch.Tensor | float | None = None,
                     volume_beta: float | torch.Tensor | None = None,
                     temperature: float | torch.Tensor | None = None, approx: bool = False,
                     negatives: str = "nll", margin: float = 0.0,
                     reduction: str = "mean") -> torch.Tensor:
    """Loss for containment pairs: −log P(child ⊆ parent) for positives, and for negatives
    −log(1 − P) (``negatives="nll"``) or max(0, P − margin) (``negatives="margin"``).

    Args:
        parent, child: the boxes (batch shapes broadcast).
        beta, volume_beta, temperature, approx: the box model, as in
            :func:`~perturb.boxes.containment_prob` (Gumbel when ``beta`` is given).
        target: labels in [0, 1] broadcastable to the batch shape (1 = contained). ``None``:
            every pair is positive. Fractional labels give the binary cross-entropy.
        negatives: "nll" or "margin", the loss of negative pairs.
        margin: for ``negatives="margin"``: negatives are free below P = margin.
        reduction: "mean", "sum" or "none".

    Shape:
        ``parent``, ``child``: ``(*batch, d)``; returns a scalar, or ``(*batch,)`` with
        ``reduction="none"``.

    Returns:
        The loss. With ``negatives="nll"``, log(1 − P) of Gumbel boxes comes from
        :func:`~perturb.boxes.log1m_containment_prob`, so a negative pair nested deep inside
        keeps its (large) loss and a gradient that pushes it out; for hard and soft boxes a
        pair with P = 1 in floating point gets the finite loss −log(eps).

    Raises:
        ValueError: bad box-model arguments (see :func:`containment_prob`), labels outside
            [0, 1], unknown ``negatives`` or ``reduction``.

    Example:
        >>> parent = Box(torch.zeros(1, 2), torch.ones(1, 2))
        >>> child = Box(torch.full((1, 2), 0.2), torch.full((1, 2), 0.4))
        >>> containment_loss(parent, child, beta=0.01) < 0.1
        tensor(True)
    """
    _check_margin(margin)
    log_p = log_containment_prob(parent, child, beta, volume_beta, temperature=temperature,
                                 approx=approx)

    def log1m_p() -> torch.Tensor:
        return log1m_containment_prob(parent, child, beta, volume_beta, approx=approx)

    # Gumbel boxes: log(1 − P) without rounding P to 1 for deeply nested negatives
    return _binary_loss(log_p, target, negatives, margin, reduction,
                        None if beta is None else log1m_p)


def overlap_loss(a: Box, b: Box, beta: float | torch.Tensor | None = None, *,
                 target: torch.Tensor | float | None = None,
                 volume_beta: float | torch.Tensor | None = None,
                 temperature: float | torch.Tensor | None = None, approx: bool = False,
                 negatives: str = "nll", margin: float = 0.0,
                 reduction: str = "mean") -> torch.Tensor:
    """:func:`containment_loss` with the Jaccard-type :func:`~perturb.boxes.overlap` ratio in
    place of P(child ⊆ parent): −log overlap for positives, −log(1 − overlap) or
    max(0, overlap − margin) for negatives.

    Shape:
        ``a``, ``b``: ``(*batch, d)``; returns a scalar or ``(*batch,)`` (``reduction="none"``).
    """
    _check_margin(margin)
    log_p = overlap(a, b, beta, volume_beta, temperature=temperature, approx=approx, log=True)
    return _binary_loss(log_p, target, negatives, margin, reduction)


def volume_regularizer(box: Box, threshold: float, *, method: str | None = None,
                       beta: float | torch.Tensor | None = None,
                       temperature: float | torch.Tensor | None = None, approx: bool = False,
                       mode: str = "indicator", reduction: str = "sum") -> torch.Tensor:
    """Penalty on boxes larger than ``threshold``.

        mode="indicator":  Σ 1[Vol > τ_v]·Vol      (gradient Vol·∂log Vol above τ_v, 0 below)
        mode="hinge":      Σ max(0, Vol − τ_v)

    Both are 0 for boxes of volume at most τ_v. The volume is :func:`~perturb.boxes.volume`
    with the given ``method``/``beta``/``temperature`` (Gumbel when ``beta`` is given). In high
    dimension volumes are tiny; pick τ_v on that scale (e.g. ∝ s^d for a target side s).

    Args:
        box: the boxes.
        threshold: τ_v ≥ 0.
        method, beta, temperature, approx: the volume, as in :func:`~perturb.boxes.volume`.
        mode: "indicator" or "hinge".
        reduction: "sum" (default), "mean" or "none".

    Shape:
        ``box``: ``(*batch, d)``; returns a scalar or ``(*batch,)``.

    Raises:
        ValueError: ``threshold < 0``, unknown mode/reduction, bad volume arguments.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or not math.isfinite(threshold) or threshold < 0:
        raise ValueError(f"threshold must be a finite number >= 0, got {threshold!r}")
    check_choice(mode, ("indicator", "hinge"), "mode")
    vol = volume(box, method=method, beta=beta, temperature=temperature, approx=approx)
    if mode == "indicator":
        pen = torch.where(vol > threshold, vol, torch.zeros_like(vol))
    else:
        pen = torch.relu(vol - threshold)
    return _reduce(pen, reduction)


def sample_negatives(pairs: torch.Tensor, num_entities: int, n_negatives: int = 1, *,
                     corrupt: str = "both", known: torch.Tensor | None = None,
                     generator: torch.Generator | None = None,
                     max_tries: int = 100) -> torch.Tensor:
    """Negative pairs by uniform corruption of the head or the tail of positive pairs.

    For each pair (head, tail) and each of ``n_negatives`` draws, replace the head
    (``corrupt="head"``), the tail (``"tail"``) or one of the two chosen with probability 1/2
    (``"both"``) by an entity drawn uniformly from ``[0, num_entities)``. With ``known`` (the
    list of true pairs) the draws that hit a known pair are redrawn, vectorised, until none is
    left (filtered negatives); the replaced entity may equal the kept one (a self pair).

    Args:
        pairs: positive pairs ``(head, tail)``, integer tensor.
        num_entities: number of entities.
        n_negatives: negatives per positive pair.
        corrupt: "head", "tail" or "both".
        known: integer tensor ``(m, 2)`` of pairs that must not be returned, or None.
        generator: torch.Generator for reproducibility.
        max_tries: rounds of redrawing for the filtered case.

    Shape:
        ``pairs``: ``(*batch, 2)``; returns ``(*batch, n_negatives, 2)`` on the device of
        ``pairs``.

    Returns:
        The negative pairs (torch.long).

    Raises:
        ValueError: non-integer or misshaped ``pairs``/``known``, ids out of range,
            ``num_entities < 1``, ``n_negatives < 1``, unknown ``corrupt``.
        RuntimeError: some draws still hit known pairs after ``max_tries`` rounds (the graph
            is too dense to filter).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> sample_negatives(torch.tensor([[0, 1], [2, 3]]), 5, 4, generator=g).shape
        torch.Size([2, 4, 2])
    """
    num_entities = check_int(num_entities, "num_entities", low=1)
    n_negatives = check_int(n_negatives, "n_negatives", low=1)
    check_choice(corrupt, ("head", "tail", "both"), "corrupt")
    for t, name in ((pairs, "pairs"), (known, "known")):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.dtype == torch.bool \
                or t.is_complex():
            raise ValueError(f"{name} must be an integer tensor of (head, tail) pairs, got "
                             f"{type(t).__name__ if not isinstance(t, torch.Tensor) else t.dtype}")
        if t.ndim < 1 or t.shape[-1] != 2 or (name == "known" and t.ndim != 2):
            want = "(m, 2)" if name == "known" else "(*batch, 2)"
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_entities):
            raise ValueError(f"{name} holds ids outside [0, {num_entities})")
    device = pairs.device
    pairs = pairs.long()
    out_shape = (*pairs.shape[:-1], n_negatives, 2)
    neg = pairs.unsqueeze(-2).expand(out_shape).clone()
    n = neg.numel() // 2

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        ent = torch.randint(num_entities, (count,), generator=generator)
        if corrupt == "both":
            side = torch.randint(2, (count,), generator=generator)
        else:
            side = torch.full((count,), 0 if corrupt == "head" else 1, dtype=torch.long)
        return ent.to(device), side.to(device)

    flat = neg.view(n, 2)
    base = pairs.unsqueeze(-2).expand(out_shape).reshape(n, 2)
    ent, side = draw(n)
    flat[torch.arange(n, device=device), side] = ent
    if known is not None and known.numel():
        codes = torch.unique(known.to(device).long()[:, 0] * num_entities
                             + known.to(device).long()[:, 1])
        for _ in range(max_tries):
            bad = _is_member(flat[:, 0] * num_entities + flat[:, 1], codes).nonzero().squeeze(-1)
            if bad.numel() == 0:
                break
            flat[bad] = base[bad]
            ent, side = draw(bad.numel())
            flat[bad, side] = ent
        else:
            bad = _is_member(flat[:, 0] * num_entities + flat[:, 1], codes)
            if bool(bad.any()):
                raise RuntimeError(f"{int(bad.sum())} negatives still hit known pairs after "
                                   f"{max_tries} rounds; the graph is too dense to filter")
    return neg


def _is_member(x: torch.Tensor, sorted_codes: torch.Tensor) -> torch.Tensor:
    """Whether each entry of ``x`` is in ``sorted_codes`` (sorted, non-empty): binary search.

    O(m log |codes|); ``torch.isin`` fell back to a brute-force O(m·|codes|) path on CPU here.
    """
    at = torch.searchsorted(sorted_codes, x).clamp(max=sorted_codes.numel() - 1)
    return sorted_codes[at] == x
