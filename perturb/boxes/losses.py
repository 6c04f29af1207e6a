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

from perturb._validation import (check_choice, check_generator, check_int, check_value,
                                 validation_enabled)
from perturb.boxes.box import Box, _broadcast_boxes
from perturb.boxes.intersections import (log1m_containment_prob, _log1mexp, log1mexp,
                                        log_containment_prob, overlap)
from perturb.boxes.expected_volumes import _deprecated_method, volume
from perturb.noise import Noise

__all__ = ["containment_loss", "overlap_loss", "volume_regularizer", "sample_negatives",
           "log1mexp", "negative_nll", "PairSet"]

_REDUCTIONS = ("mean", "sum", "none")


def negative_nll(log1m_p: torch.Tensor) -> torch.Tensor:
    """−log(1 − p), the loss of a negative pair, from an accurate log(1 − p) (e.g.
    :func:`~perturb.boxes.log1m_containment_prob`): finite everywhere; p = 1 exactly
    (log(1 − p) = −inf, a hard or soft pair nested inside) gets the finite loss −log(eps) of the
    dtype, with zero gradient.

    Shape:
        any; elementwise.
    """
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
            neg = -_log1mexp(log_p.clamp(max=-torch.finfo(log_p.dtype).eps))
        else:
            neg = negative_nll(log1m_p())
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
    parent, child = _broadcast_boxes(parent, child, ("parent", "child"))
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
                       mode: str = "indicator", reduction: str = "sum",
                       noise: Noise | None = None) -> torch.Tensor:
    """Penalty on boxes larger than ``threshold``.

        mode="indicator":  Σ 1[Vol > τ_v]·Vol      (gradient Vol·∂log Vol above τ_v, 0 below)
        mode="hinge":      Σ max(0, Vol − τ_v)

    Both are 0 for boxes of volume at most τ_v. The volume is :func:`~perturb.boxes.volume`
    with the given ``beta``/``noise``/``temperature`` (hard when none is given). In high
    dimension volumes are tiny; pick τ_v on that scale (e.g. ∝ s^d for a target side s).

    Args:
        box: the boxes.
        threshold: τ_v ≥ 0.
        method, beta, temperature, approx, noise: the volume, as in
            :func:`~perturb.boxes.volume` (``method`` is deprecated there).
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
    beta, temperature = _deprecated_method("volume_regularizer", method, beta, temperature)
    vol = volume(box, beta=beta, temperature=temperature, approx=approx, noise=noise)
    if mode == "indicator":
        pen = torch.where(vol > threshold, vol, torch.zeros_like(vol))
    else:
        pen = torch.relu(vol - threshold)
    return _reduce(pen, reduction)


class PairSet:
    """A set of ``(head, tail)`` pairs of entities ``0 .. num_entities − 1``, stored on one device
    as the sorted codes ``head · num_entities + tail`` (int64), for membership tests by binary
    search (``torch.searchsorted``) without leaving the device.

    Build it once (e.g. the known positives of a training run, ``include_self=True`` to add
    every self pair ``(i, i)``) and pass it as ``known`` to :func:`sample_negatives`.

    Membership is tested through hash buckets built with the set: a ``(B, width)`` table
    whose row ``h(code) mod B`` holds the codes of that bucket (padded with −1; B the power of
    2 at or above the set's size, h a xor-shift of the code, ``width`` the largest bucket, a
    handful), so that a query reads one row, one scattered memory access, instead of the
    log₂|set| dependent reads of a binary search (the hierarchy trainer's sampler: about 2×
    faster on a CPU at 166k pairs, 19 MB of table). Exact: equal codes share their bucket. A
    set whose largest bucket exceeds :data:`_BUCKET_WIDTH_MAX` codes, or whose table would
    exceed :data:`_BUCKET_TABLE_MAX` entries, uses the binary search over the sorted codes.

    Args:
        pairs: integer tensor ``(m, 2)`` of ids in ``[0, num_entities)``.
        num_entities: number of entities (``num_entities² < 2⁶³``).
        include_self: also hold the self pairs ``(i, i)``.
        device: where the codes live (default: the device of ``pairs``).

    Raises:
        ValueError: misshaped or non-integer ``pairs``, ids out of range, ``num_entities < 1``
            or too large for int64 codes.

    Example:
        >>> known = PairSet(torch.tensor([[1, 0], [2, 0]]), 3, include_self=True)
        >>> known.contains(torch.tensor([[1, 0], [0, 1], [2, 2]]))
        tensor([ True, False,  True])
    """

    def __init__(self, pairs: torch.Tensor, num_entities: int, *, include_self: bool = False,
                 device: torch.device | str | None = None) -> None:
        self.num_entities = check_int(num_entities, "num_entities", low=1)
        if self.num_entities > 3_037_000_499:
            raise ValueError(f"num_entities={num_entities} is too large for int64 pair codes")
        pairs = _check_pair_tensor(pairs, self.num_entities, "pairs", batched=False)
        dev = pairs.device if device is None else torch.device(device)
        codes = pairs[:, 0].to(dev) * self.num_entities + pairs[:, 1].to(dev)
        if include_self:
            codes = torch.cat([codes, torch.arange(self.num_entities, device=dev)
                               * (self.num_entities + 1)])
        self.codes = torch.unique(codes)          # sorted
        self._build_buckets()

    def _build_buckets(self) -> None:
        """The hash table of :attr:`codes` (class docstring): ``_table`` ``(B, width)``,
        ``_mask`` = B − 1, ``_width`` (0: no table, use the binary search)."""
        m = self.codes.numel()
        self._mask = (1 << max(0, (m - 1).bit_length())) - 1
        self._width = 0
        if m == 0:
            return
        bucket = _bucket(self.codes, self._mask)
        order = torch.argsort(bucket, stable=True)
        counts = torch.bincount(bucket, minlength=self._mask + 1)
        width = int(counts.max())
        if width > _BUCKET_WIDTH_MAX or (self._mask + 1) * width > _BUCKET_TABLE_MAX:
            return
        sorted_bucket = bucket[order]
        starts = counts.cumsum(0).sub_(counts)
        rank = torch.arange(m, device=self.codes.device) - starts[sorted_bucket]
        self._table = torch.full((self._mask + 1, width), -1, dtype=torch.long,
                                 device=self.codes.device)
        self._table[sorted_bucket, rank] = self.codes[order]
        self._width = width

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def __len__(self) -> int:
        return self.codes.numel()

    def to(self, device: torch.device | str) -> "PairSet":
        """The same set with its codes on ``device``."""
        out = PairSet.__new__(PairSet)
        out.num_entities, out.codes = self.num_entities, self.codes.to(device)
        out._mask, out._width = self._mask, self._width
        if self._width:
            out._table = self._table.to(device)
        return out

    def contains_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Membership of pair codes ``head · num_entities + tail`` (any shape, int64)."""
        if self.codes.numel() == 0:
            return torch.zeros(codes.shape, dtype=torch.bool, device=codes.device)
        if not self._width:
            at = torch.searchsorted(self.codes, codes).clamp_(max=self.codes.numel() - 1)
            return self.codes[at] == codes
        # one row of the table per query; codes are >= 0, the padding -1
        flat = codes.reshape(-1)
        rows = self._table.index_select(0, _bucket(flat, self._mask))
        return rows.eq_(flat.unsqueeze(-1)).any(dim=-1).reshape(codes.shape)

    def contains(self, pairs: torch.Tensor) -> torch.Tensor:
        """Whether each pair is in the set: ``(*batch, 2)`` ids -> ``(*batch,)`` bool, on the
        device of the set. O(m log |set|), no host synchronisation."""
        pairs = pairs.to(self.device)
        return self.contains_codes(pairs[..., 0] * self.num_entities + pairs[..., 1])

    def __repr__(self) -> str:
        return (f"PairSet({len(self)} pairs, num_entities={self.num_entities}, "
                f"device={self.device})")


#: Largest hash bucket of a :class:`PairSet` (codes compared per query) before it falls back
#: to the binary search; uniform codes give about log m / log log m (7–9 at 10⁵–10⁶ pairs).
_BUCKET_WIDTH_MAX = 32
#: Largest hash table of a :class:`PairSet` (entries, 8 bytes each: 64 MB).
_BUCKET_TABLE_MAX = 1 << 23


def _bucket(codes: torch.Tensor, mask: int) -> torch.Tensor:
    """The hash bucket of int64 pair codes: a xor-shift that folds the high bits (the head)
    onto the low ones (the tail), then the low bits (``mask`` = B − 1)."""
    h = codes ^ (codes >> 17)
    return (h ^ (h >> 31)).bitwise_and_(mask)


def _check_pair_tensor(t: object, num_entities: int, name: str, batched: bool) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.dtype == torch.bool \
            or t.is_complex():
        raise ValueError(f"{name} must be an integer tensor of (head, tail) pairs, got "
                         f"{type(t).__name__ if not isinstance(t, torch.Tensor) else t.dtype}")
    if t.ndim < 1 or t.shape[-1] != 2 or (not batched and t.ndim != 2):
        want = "(*batch, 2)" if batched else "(m, 2)"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if t.numel() and validation_enabled():
        lo, hi = torch.aminmax(t)
        check_value((lo >= 0) & (hi < num_entities), f"{name} holds ids outside [0, {num_entities})")
    return t.long()


_SAMPLER_MODES = ("auto", "adaptive", "fixed")


def sample_negatives(pairs: torch.Tensor, num_entities: int, n_negatives: int = 1, *,
                     corrupt: str = "both", known: torch.Tensor | PairSet | None = None,
                     generator: torch.Generator | None = None, max_tries: int = 100,
                     strict: bool = True, mode: str = "auto") -> torch.Tensor:
    """Negative pairs by uniform corruption of the head or the tail of positive pairs.

    For each pair (head, tail) and each of ``n_negatives`` draws, replace the head
    (``corrupt="head"``), the tail (``"tail"``) or one of the two chosen with probability 1/2
    (``"both"``) by an entity drawn uniformly from ``[0, num_entities)``. With ``known`` the
    draws that hit a known pair are redrawn (side included) up to ``max_tries`` times in all:
    rejection sampling, so an accepted negative is uniform over the allowed corruptions. The
    replaced entity may equal the kept one (a self pair) unless ``known`` holds self pairs
    (``PairSet(..., include_self=True)``).

    Two ways to run the rejection, with the same distribution (the first accepted of up to
    ``max_tries`` independent draws; the last draw when none is accepted):

    - ``mode="adaptive"``: draw once, then redraw only the rejected ones, round after round,
      until none is left. Each round reads one number back to the host: free on the CPU, a
      synchronisation on a GPU.
    - ``mode="fixed"``: draw ``max_tries`` candidates for every negative at once and keep the
      first accepted one: no host read at all (O(``max_tries``) work and memory per negative,
      which a GPU does in one pass).
    - ``mode="auto"`` (default): adaptive on the CPU, fixed elsewhere.

    Args:
        pairs: positive pairs ``(head, tail)``, integer tensor.
        num_entities: number of entities.
        n_negatives: negatives per positive pair.
        corrupt: "head", "tail" or "both".
        known: pairs that must not be returned: an integer tensor ``(m, 2)`` or a
            ``PairSet`` (built once, for repeated calls: nothing is sorted per call).
        generator: torch.Generator; the draws are made on its device (default: the device of
            ``pairs`` with its default generator) and moved to the device of ``pairs``.
        max_tries: draws per negative at most (>= 1).
        strict: raise when a negative still hits a known pair after ``max_tries`` draws (one
            host read); ``strict=False`` returns it as it is (no host read: a training loop
            counts such pairs on the device instead, e.g. with ``PairSet.contains``).
        mode: "auto", "adaptive" or "fixed" (above).

    Shape:
        ``pairs``: ``(*batch, 2)``; returns ``(*batch, n_negatives, 2)`` on the device of
        ``pairs``.

    Returns:
        The negative pairs (torch.long).

    Raises:
        ValueError: non-integer or misshaped ``pairs``/``known``, ids out of range (checked
            while validation is enabled), ``num_entities < 1``, ``n_negatives < 1``,
            ``max_tries < 1``, unknown ``corrupt`` or ``mode``, a ``known`` PairSet over a
            different number of entities.
        RuntimeError: ``strict=True`` and some draws still hit known pairs after ``max_tries``
            draws (the graph is too dense to filter).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> sample_negatives(torch.tensor([[0, 1], [2, 3]]), 5, 4, generator=g).shape
        torch.Size([2, 4, 2])
    """
    num_entities = check_int(num_entities, "num_entities", low=1)
    n_negatives = check_int(n_negatives, "n_negatives", low=1)
    max_tries = check_int(max_tries, "max_tries", low=1)
    check_choice(corrupt, ("head", "tail", "both"), "corrupt")
    check_choice(mode, _SAMPLER_MODES, "mode")
    check_generator(generator)
    pairs = _check_pair_tensor(pairs, num_entities, "pairs", batched=True)
    device = pairs.device
    if isinstance(known, PairSet):
        if known.num_entities != num_entities:
            raise ValueError(f"known is a PairSet over {known.num_entities} entities, expected "
                             f"num_entities={num_entities}")
        known = known.to(device) if known.device != device else known
    elif known is not None:
        known = PairSet(_check_pair_tensor(known, num_entities, "known", batched=False),
                        num_entities, device=device)
    return _sample_negatives(pairs, num_entities, n_negatives, corrupt, known, generator,
                             max_tries, strict, mode)


def _sample_negatives(pairs: torch.Tensor, num_entities: int, n_negatives: int, corrupt: str,
                      known: PairSet | None, generator: torch.Generator | None,
                      max_tries: int, strict: bool, mode: str) -> torch.Tensor:
    """:func:`sample_negatives` for checked arguments: ``pairs`` a long tensor of ids in range,
    ``known`` None or a PairSet over ``num_entities`` on the device of ``pairs``."""
    device = pairs.device
    out_shape = (*pairs.shape[:-1], n_negatives, 2)
    base = pairs.unsqueeze(-2).expand(out_shape).reshape(-1, 2)
    draw_device = generator.device if generator is not None else device
    if mode == "auto":
        mode = "adaptive" if device.type == "cpu" else "fixed"
    if known is None or len(known) == 0:
        neg = _corrupt(base, *_draw(base.shape[0], 1, num_entities, corrupt, generator,
                                    draw_device, device))[:, 0]
    elif mode == "fixed":
        neg = _sample_fixed(base, num_entities, known, corrupt, generator, max_tries,
                            draw_device)
    else:
        neg = _sample_adaptive(base, num_entities, known, corrupt, generator, max_tries,
                               draw_device)
    if strict and known is not None and neg.numel():
        bad = known.contains(neg)
        if bool(bad.any()):
            raise RuntimeError(f"{int(bad.sum())} negatives still hit known pairs after "
                               f"{max_tries} draws; the graph is too dense to filter")
    return neg.reshape(out_shape)


def _draw(count: int, tries: int, num_entities: int, corrupt: str,
          generator: torch.Generator | None, draw_device: torch.device, device: torch.device
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(entity, side)`` of ``count × tries`` corruptions, on ``device``."""
    ent = torch.randint(num_entities, (count, tries), generator=generator, device=draw_device)
    if corrupt == "both":
        side = torch.randint(2, (count, tries), generator=generator, device=draw_device)
    else:
        side = torch.full((count, tries), 0 if corrupt == "head" else 1, dtype=torch.long,
                          device=draw_device)
    return ent.to(device), side.to(device)


def _corrupt(base: torch.Tensor, ent: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
    """Candidates ``(count, tries, 2)``: ``base`` with the ``side`` entry replaced by ``ent``."""
    head = torch.where(side == 0, ent, base[:, :1])
    tail = torch.where(side == 1, ent, base[:, 1:])
    return torch.stack([head, tail], dim=-1)


def _sample_fixed(base: torch.Tensor, n: int, known: PairSet, corrupt: str,
                  generator: torch.Generator | None, tries: int, draw_device: torch.device
                  ) -> torch.Tensor:
    """All ``tries`` candidates at once; the first accepted (else the last). No host read."""
    cand = _corrupt(base, *_draw(base.shape[0], tries, n, corrupt, generator, draw_device,
                                 base.device))
    ok = ~known.contains(cand)                                      # (count, tries)
    first = torch.where(ok.any(dim=1), ok.to(torch.uint8).argmax(dim=1),
                        torch.full_like(ok[:, 0], tries - 1, dtype=torch.long))
    return cand.gather(1, first.view(-1, 1, 1).expand(-1, 1, 2)).squeeze(1)


def _sample_adaptive(base: torch.Tensor, n: int, known: PairSet, corrupt: str,
                     generator: torch.Generator | None, tries: int, draw_device: torch.device
                     ) -> torch.Tensor:
    """Redraw only the rejected draws, round after round (one host read per round)."""
    neg = _corrupt(base, *_draw(base.shape[0], 1, n, corrupt, generator, draw_device,
                                base.device))[:, 0]
    todo = known.contains(neg).nonzero().squeeze(-1)
    for _ in range(tries - 1):
        if todo.numel() == 0:
            break
        rows = _corrupt(base[todo], *_draw(todo.numel(), 1, n, corrupt, generator, draw_device,
                                           base.device))[:, 0]
        neg[todo] = rows
        todo = todo[known.contains(rows)]
    return neg
