"""Axis-aligned boxes as a light pair of tensors.

A box in R^d is the product of intervals ``[lower_i, upper_i]``. :class:`Box` stores the two
corners as tensors of shape ``(*batch, d)`` (batch dims lead, the coordinate dim trails), so a
single ``Box`` holds a whole batch of boxes and every operation in :mod:`perturb.boxes` is
vectorised over the batch.

The same object describes hard boxes and Gumbel boxes. For a Gumbel box (Dasgupta et al. 2020)
``lower`` and ``upper`` are the *locations* μ_lo, μ_hi of random corners

    X_lo ~ MaxGumbel(μ_lo, β),     X_hi ~ MinGumbel(μ_hi, β),

and the scale β is an argument of the operations (:func:`~perturb.boxes.volume`,
:func:`~perturb.boxes.intersection`), not of the box. See ``docs/boxes.md`` for the math.

A box whose ``upper < lower`` in some coordinate is *empty* as a hard box (its hard volume is 0);
it is still a valid Gumbel box (its expected volume is small but positive), so no ordering of
the corners is enforced.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from perturb._math import nan_to_
from perturb._validation import check_floating_tensor, check_tau, check_value, validation_enabled

__all__ = ["Box", "join"]


def _check_corner(x: Any, name: str, min_ndim: int = 1) -> None:
    """A floating tensor of at least ``min_ndim`` dims without NaN (the value check while
    validation is on, through :func:`~perturb._validation.check_value`)."""
    check_floating_tensor(x, name)
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have shape (*batch, d) with at least one dim, "
                         f"got a 0-dim tensor")
    # amax propagates NaN: one read-only pass instead of isnan + any.
    if validation_enabled() and x.numel():
        check_value(~torch.isnan(x.detach().amax()), f"{name} contains NaN values")


def _width(lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """``upper − lower``, with ∞ − ∞ read as 0: a corner pair at the same infinity is the
    limit of [R, R] (a degenerate side), not NaN. Corners never hold NaN (:class:`Box` refuses
    it), so every NaN of the difference is such a pair; infinite widths stay infinite."""
    return nan_to_(upper - lower, 0.0)


class Box:
    """A batch of axis-aligned boxes ``[lower, upper]`` in R^d.

    Args:
        lower: lower corners (for Gumbel boxes: the MaxGumbel locations μ_lo).
        upper: upper corners (for Gumbel boxes: the MinGumbel locations μ_hi).
            ``lower`` and ``upper`` are broadcast against each other.

    Shape:
        ``lower``, ``upper``: ``(*batch, d)``; the box has ``batch_shape == (*batch,)`` and
        ``dim == d``.

    Raises:
        ValueError: a corner is not a floating tensor, is 0-dim, contains NaN (while validation
            is enabled), or the two shapes do not broadcast; the dtypes or devices differ.

    Example:
        >>> b = Box(torch.zeros(3, 2), torch.ones(3, 2))
        >>> b.batch_shape, b.dim
        (torch.Size([3]), 2)
        >>> b[0].upper
        tensor([1., 1.])

    ``±inf`` coordinates are accepted (a half-line or the whole line); NaN is not. A side with
    both corners at the same infinity is a degenerate side (width 0, the limit of [R, R]). The
    volumes of unbounded boxes are infinite; containment and overlap compare unbounded boxes
    as the limit of the boxes cut to the cube [−R, R]^d as R → ∞ (the half-line [0, ∞) then
    holds half of the line, and a box with an empty side is empty whatever its other sides).
    """

    __slots__ = ("lower", "upper")

    def __init__(self, lower: torch.Tensor, upper: torch.Tensor) -> None:
        _check_corner(lower, "lower")
        _check_corner(upper, "upper")
        self._set(lower, upper)

    def _set(self, lower: torch.Tensor, upper: torch.Tensor) -> None:
        if lower.dtype != upper.dtype:
            raise ValueError(f"lower and upper must have the same dtype, got {lower.dtype} "
                             f"and {upper.dtype}")
        if lower.device != upper.device:
            raise ValueError(f"lower and upper must be on the same device, got {lower.device} "
                             f"and {upper.device}")
        if lower.shape != upper.shape:
            try:
                lower, upper = torch.broadcast_tensors(lower, upper)
            except RuntimeError:
                raise ValueError(f"lower and upper must have broadcastable shapes (*batch, d), "
                                 f"got lower {tuple(lower.shape)} and upper "
                                 f"{tuple(upper.shape)}") from None
        self.lower = lower
        self.upper = upper

    @classmethod
    def _trusted(cls, lower: torch.Tensor, upper: torch.Tensor) -> "Box":
        """Internal constructor without checks, for corners computed from checked boxes."""
        box = object.__new__(cls)
        box.lower = lower
        box.upper = upper
        return box

    @classmethod
    def _from_checked(cls, lower: torch.Tensor, upper: torch.Tensor) -> "Box":
        """Internal constructor for corners computed from already checked tensors: the
        structural checks (dtype, device, broadcasting) run, the NaN pass does not."""
        box = object.__new__(cls)
        box._set(lower, upper)
        return box

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_center_offset(cls, center: torch.Tensor, offset: torch.Tensor) -> "Box":
        """The box ``[center - offset, center + offset]``.

        ``offset`` is the half-width and is used as given (a negative offset gives an empty hard
        box); pass ``softplus(raw)`` to keep it positive, as :class:`BoxEmbedding` does.

        Shape:
            ``center``, ``offset``: ``(*batch, d)`` (broadcastable).
        """
        _check_corner(center, "center")
        _check_corner(offset, "offset")
        return cls._center_offset(center, offset)

    @classmethod
    def _center_offset(cls, center: torch.Tensor, offset: torch.Tensor) -> "Box":
        """:meth:`from_center_offset` for checked tensors (structural checks only)."""
        return cls._from_checked(center - offset, center + offset)

    @classmethod
    def from_min_delta(cls, min: torch.Tensor, delta: torch.Tensor,
                       softplus_beta: float = 1.0) -> "Box":
        """The box ``[min, min + softplus(delta)]``: always non-empty, any real ``delta``.

        ``softplus(delta) = log(1 + exp(softplus_beta·delta)) / softplus_beta`` (torch's
        parameterisation), so ``delta`` is an unconstrained parameter of the width.

        Shape:
            ``min``, ``delta``: ``(*batch, d)`` (broadcastable).
        """
        _check_corner(min, "min")
        _check_corner(delta, "delta")
        check_tau(softplus_beta, "softplus_beta")
        return cls._min_delta(min, delta, softplus_beta)

    @classmethod
    def _min_delta(cls, min: torch.Tensor, delta: torch.Tensor,
                   softplus_beta: float = 1.0) -> "Box":
        """:meth:`from_min_delta` for checked tensors (structural checks only)."""
        return cls._from_checked(min, min + F.softplus(delta, beta=softplus_beta))

    @classmethod
    def from_sigmoid(cls, min_logit: torch.Tensor, delta_logit: torch.Tensor) -> "Box":
        """A box inside the unit cube ``[0, 1]^d`` from unconstrained logits.

            lower = σ(min_logit),    upper = lower + σ(delta_logit)·(1 − lower)

        so ``0 < lower < upper < 1`` for every real input (the parameterisation of
        box-embeddings' ``SigmoidBoxTensor``).

        Shape:
            ``min_logit``, ``delta_logit``: ``(*batch, d)`` (broadcastable).
        """
        _check_corner(min_logit, "min_logit")
        _check_corner(delta_logit, "delta_logit")
        return cls._sigmoid(min_logit, delta_logit)

    @classmethod
    def _sigmoid(cls, min_logit: torch.Tensor, delta_logit: torch.Tensor) -> "Box":
        """:meth:`from_sigmoid` for checked tensors (structural checks only)."""
        lower = torch.sigmoid(min_logit)
        return cls._from_checked(lower, lower + torch.sigmoid(delta_logit) * (1.0 - lower))

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> torch.Size:
        """The full corner shape ``(*batch, d)``."""
        return self.lower.shape

    @property
    def batch_shape(self) -> torch.Size:
        """``(*batch,)``: the shape of the batch of boxes."""
        return self.lower.shape[:-1]

    @property
    def dim(self) -> int:
        """``d``: the dimension of the space the boxes live in."""
        return self.lower.shape[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.lower.dtype

    @property
    def device(self) -> torch.device:
        return self.lower.device

    @property
    def center(self) -> torch.Tensor:
        """``(lower + upper) / 2``, shape ``(*batch, d)``."""
        return 0.5 * (self.lower + self.upper)

    @property
    def offset(self) -> torch.Tensor:
        """Half-width ``(upper − lower) / 2`` (negative where the hard box is empty)."""
        return 0.5 * self.width

    @property
    def width(self) -> torch.Tensor:
        """Side lengths ``upper − lower`` (negative where the hard box is empty; 0 for a
        side with both corners at the same infinity, ±inf for a half-line or the line)."""
        return _width(self.lower, self.upper)

    # ------------------------------------------------------------------ tensor-like
    def __getitem__(self, key: Any) -> "Box":
        """Index the batch dims (never the coordinate dim): ``box[0]``, ``box[:, mask]``."""
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            full = (*key, slice(None))
        else:
            full = (*key, Ellipsis, slice(None))
        try:
            return Box._trusted(self.lower[full], self.upper[full])
        except IndexError as e:
            raise IndexError(f"box index {key!r} is invalid for batch shape "
                             f"{tuple(self.batch_shape)} (only batch dims can be indexed): "
                             f"{e}") from None

    def __len__(self) -> int:
        if not self.batch_shape:
            raise TypeError("len() of a single box (empty batch shape)")
        return self.batch_shape[0]

    def to(self, *args: Any, **kwargs: Any) -> "Box":
        """``Box(lower.to(...), upper.to(...))``, with ``Tensor.to``'s arguments."""
        return Box._trusted(self.lower.to(*args, **kwargs), self.upper.to(*args, **kwargs))

    def detach(self) -> "Box":
        return Box._trusted(self.lower.detach(), self.upper.detach())

    def expand(self, *batch_shape: int) -> "Box":
        """Broadcast the batch dims to ``batch_shape`` (a view, like ``Tensor.expand``).

        Raises:
            ValueError: the batch shape cannot be expanded to ``batch_shape``.
        """
        shape = (*batch_shape, self.dim)
        try:
            return Box._trusted(self.lower.expand(shape), self.upper.expand(shape))
        except (RuntimeError, TypeError):
            raise ValueError(f"batch_shape {tuple(batch_shape)} is not an expansion of the "
                             f"box's batch shape {tuple(self.batch_shape)} (dims of size 1 "
                             f"can grow; new dims go in front)") from None

    def reshape(self, *batch_shape: int) -> "Box":
        """Reshape the batch dims (the coordinate dim is kept).

        Raises:
            ValueError: ``batch_shape`` does not hold as many boxes.
        """
        shape = (*batch_shape, self.dim)
        try:
            return Box._trusted(self.lower.reshape(shape), self.upper.reshape(shape))
        except (RuntimeError, TypeError):
            raise ValueError(f"batch_shape {tuple(batch_shape)} does not hold the "
                             f"{self.lower[..., 0].numel()} boxes of batch shape "
                             f"{tuple(self.batch_shape)}") from None

    def __repr__(self) -> str:
        return (f"Box(batch_shape={tuple(self.batch_shape)}, dim={self.dim}, "
                f"dtype={self.dtype}, device={self.device})")


def _broadcast_boxes(a: Box, b: Box, names: tuple[str, str] = ("a", "b")) -> tuple[Box, Box]:
    """Check two boxes share dim/dtype/device and broadcast their batch shapes."""
    a, b = _broadcast_all((a, b), names)
    return a, b


def _broadcast_all(boxes: tuple[Box, ...], names: Sequence[str]) -> tuple[Box, ...]:
    """Check that ``boxes`` (named ``names`` in the errors) share dim/dtype/device with the
    first one and broadcast their batch shapes."""
    for box, name in zip(boxes, names):
        if not isinstance(box, Box):
            raise ValueError(f"{name} must be a Box, got {type(box).__name__}")
    first, head = boxes[0], names[0]
    for box, name in zip(boxes[1:], names[1:]):
        if box.dim != first.dim:
            raise ValueError(f"{head} and {name} must live in the same dimension, got "
                             f"d={first.dim} and d={box.dim}")
        if box.dtype != first.dtype:
            raise ValueError(f"{head} and {name} must have the same dtype, got {first.dtype} "
                             f"and {box.dtype}")
        if box.device != first.device:
            raise ValueError(f"{head} and {name} must be on the same device, got "
                             f"{first.device} and {box.device}")
    shapes = [box.batch_shape for box in boxes]
    if any(shape != shapes[0] for shape in shapes):
        try:
            shape = torch.broadcast_shapes(*shapes)
        except RuntimeError:
            raise ValueError(f"{' and '.join(names)} must have broadcastable batch shapes, "
                             f"got {' and '.join(str(tuple(s)) for s in shapes)}") from None
        boxes = tuple(box.expand(*shape) for box in boxes)
    return boxes


def join(a: Box, b: Box) -> Box:
    """The smallest box enclosing both ``a`` and ``b`` (the lattice join, a hard operation).

        join(a, b) = [min(a.lower, b.lower), max(a.upper, b.upper)]

    It bounds the union ``a ∪ b`` from above (boxes are not closed under union). For Gumbel
    boxes the min of two MaxGumbel corners is not MaxGumbel, so there is no closed-form Gumbel
    join; this one acts on the locations.

    Shape:
        ``a``, ``b``: batch shapes broadcast, same ``d``; returns ``(*batch, d)``.

    Raises:
        ValueError: different ``d``, dtype or device, or batch shapes that do not broadcast.

    Example:
        >>> join(Box(torch.tensor([0.]), torch.tensor([1.])),
        ...      Box(torch.tensor([2.]), torch.tensor([3.]))).upper
        tensor([3.])
    """
    a, b = _broadcast_boxes(a, b)
    return Box._trusted(torch.minimum(a.lower, b.lower), torch.maximum(a.upper, b.upper))
