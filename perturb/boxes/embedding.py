"""``BoxEmbedding``: a learnable table of boxes, one per entity."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from perturb._math import log_expm1
from perturb._validation import (check_choice, check_device, check_int, check_tau, check_value,
                                 validation_enabled)
from perturb.boxes.box import Box
from perturb.boxes.expected_volumes import volume
from perturb.boxes.intersections import containment_prob, log_containment_prob, overlap
from perturb.boxes.noise_records import check_recordable, noise_from_record, noise_record
from perturb.noise import Gumbel, Noise

__all__ = ["BoxEmbedding"]

_PARAMETERISATIONS = ("center_offset", "min_delta", "sigmoid")
#: The names of the two parameters of each parameterisation (their state_dict keys).
_PARAMETER_NAMES = {"center_offset": ("center", "offset"), "min_delta": ("min", "delta"),
                   "sigmoid": ("min_logit", "delta_logit")}
#: Version of the extra state :meth:`BoxEmbedding.get_extra_state` writes (format 1, without
#: ``noise``, still loads).
_STATE_FORMAT = 2


class _DefaultBeta(float):
    """The default ``beta`` (0.1), told apart from a ``beta`` the caller gave."""


_DEFAULT_BETA = _DefaultBeta(0.1)


class BoxEmbedding(nn.Module):
    """A table of ``num_entities`` boxes in R^dim with unconstrained parameters.

    ``forward(ids)`` returns the :class:`Box` of each id. Three parameterisations (two
    ``(num_entities, dim)`` parameters each), all giving non-empty boxes for every value of the
    parameters:

    - ``"center_offset"``: ``[c − softplus(o), c + softplus(o)]`` (unbounded, the default);
    - ``"min_delta"``: ``[m, m + softplus(δ)]`` (:meth:`Box.from_min_delta`);
    - ``"sigmoid"``: ``lower = σ(m)``, ``upper = lower + σ(δ)(1 − lower)``: boxes that stay in
      the unit cube ``[0, 1]^d`` (:meth:`Box.from_sigmoid`).

    The parameters are named after the parameterisation (they are its state_dict keys):
    ``center``/``offset`` (half-width ``softplus(offset)``), ``min``/``delta`` (side
    ``softplus(delta)``) and ``min_logit``/``delta_logit``; ``param1``/``param2`` remain as
    aliases of the first and second. The state_dict also records, as ``_extra_state``, a dict
    ``{"format", "parameterisation", "num_entities", "dim", "beta", "noise", "init"}`` of plain
    values (``noise``: None, or ``{"family": "Normal", "scale": 0.1}``; Gumbel boxes are
    ``beta``). Loading checks the parameterisation, ``num_entities`` and ``dim`` (ValueError
    naming both values) and takes the noise and ``init`` from the state; an older state_dict
    (format 1 without ``noise``, or ``param1``/``param2`` keys and no extra state) still
    loads, as this module's parameterisation.

    At initialisation each box lies inside ``[0, 1]^d``: its side in each coordinate is drawn
    uniformly from ``init`` (a ``(min_side, max_side)`` pair, or one number) and its lower
    corner uniformly in ``[0, 1 − side]``. The boxes' corner noise is stored and used by the
    convenience methods :meth:`volume`, :meth:`containment_prob` and :meth:`overlap`: Gumbel
    boxes of scale ``beta`` (the default, β = 0.1), any other noise on the line with
    ``noise=`` (``Normal(0.1)``, ``Logistic(0.1)``: expected volumes by quadrature), or hard
    boxes with ``beta=None``. The attribute ``noise`` is the noise (``Gumbel(scale=β)``
    for ``beta=β``, None for hard boxes) and :attr:`beta` the Gumbel scale (None for other
    noises); setting ``beta`` sets Gumbel boxes of that scale (None: hard).

    Args:
        num_entities: number of boxes.
        dim: dimension d of the space.
        beta: Gumbel scale β > 0 used by the convenience methods, or None for hard boxes.
        noise: instead of ``beta``, a noise of :mod:`perturb.noise` perturbing the corners
            (keyword only; a continuous noise on the line with a CDF and density, of a class
            of :mod:`perturb.noise`, so that the state_dict can record it).
        parameterisation: "center_offset", "min_delta" or "sigmoid".
        init: side-length range at initialisation, within (0, 1).
        generator: torch.Generator for the initialisation.
        dtype, device: of the parameters.

    Shape:
        ``forward``: ids ``(*batch,)`` (integer) -> Box ``(*batch, dim)``.

    Raises:
        ValueError: ``num_entities``/``dim`` < 1, ``beta <= 0``, ``beta`` and ``noise`` both
            given, a ``noise`` the expected volumes cannot use or the state_dict cannot record,
            unknown parameterisation, ``init`` outside (0, 1); in ``forward``: non-integer ids or ids out of
            ``[0, num_entities)`` (the range check runs while validation is enabled).

    Example:
        >>> emb = BoxEmbedding(10, 4, beta=0.1, generator=torch.Generator().manual_seed(0))
        >>> emb(torch.tensor([1, 2])).shape
        torch.Size([2, 4])
        >>> emb.containment_prob(torch.tensor([0]), torch.tensor([3])).shape
        torch.Size([1])
        >>> from perturb.noise import Normal
        >>> BoxEmbedding(10, 4, noise=Normal(0.1)).noise
        Normal(scale=0.1)
    """

    def __init__(self, num_entities: int, dim: int, beta: float | None = _DEFAULT_BETA,
                 parameterisation: str = "center_offset",
                 init: float | Sequence[float] = (0.05, 0.2), *,
                 noise: Noise | None = None,
                 generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        device = None if device is None else check_device(device)
        self.num_entities = check_int(num_entities, "num_entities", low=1)
        self.dim = check_int(dim, "dim", low=1)
        self.noise: Noise | None = None
        if noise is None:
            self.beta = beta
        elif beta is not _DEFAULT_BETA:
            raise ValueError(f"give beta (Gumbel boxes) or noise, not both: got beta={beta!r} "
                             f"and noise={noise!r}")
        else:
            self.noise = check_recordable(noise)
        check_choice(parameterisation, _PARAMETERISATIONS, "parameterisation")
        self.parameterisation = parameterisation
        if isinstance(init, (int, float)):
            init = (float(init), float(init))
        init = tuple(float(v) for v in init)
        if len(init) != 2 or not (0.0 < init[0] <= init[1] < 1.0):
            raise ValueError(f"init must be a side length or a (min_side, max_side) pair with "
                             f"0 < min_side <= max_side < 1, got {init!r}")
        self.init = init
        dtype = dtype or torch.get_default_dtype()
        shape = (self.num_entities, self.dim)
        lo, hi = init
        side = lo + (hi - lo) * torch.rand(shape, generator=generator, dtype=dtype)
        lower = (1.0 - side) * torch.rand(shape, generator=generator, dtype=dtype)
        p1, p2 = self._to_params(lower, side)
        first, second = _PARAMETER_NAMES[parameterisation]
        self.register_parameter(first, nn.Parameter(p1.to(device)))
        self.register_parameter(second, nn.Parameter(p2.to(device)))

    @property
    def param1(self) -> nn.Parameter:
        """The first parameter (``center``, ``min`` or ``min_logit``)."""
        return getattr(self, _PARAMETER_NAMES[self.parameterisation][0])

    @property
    def param2(self) -> nn.Parameter:
        """The second parameter (``offset``, ``delta`` or ``delta_logit``)."""
        return getattr(self, _PARAMETER_NAMES[self.parameterisation][1])

    @property
    def beta(self) -> float | None:
        """The Gumbel scale β of Gumbel boxes; None for hard boxes and other noises. Setting
        it makes the boxes Gumbel boxes of that scale (None: hard)."""
        noise = self.noise
        return float(noise.scale) if type(noise) is Gumbel else None

    @beta.setter
    def beta(self, beta: float | None) -> None:
        if beta is not None:
            check_tau(beta, "beta")
        self.noise = None if beta is None else Gumbel(scale=float(beta))

    # --------------------------------------------------------------- state
    def get_extra_state(self) -> dict[str, Any]:
        """What the state_dict records besides the parameters (plain values, so that it loads
        with ``torch.load(weights_only=True)``)."""
        noise = self.noise
        record = None if noise is None or type(noise) is Gumbel else noise_record(noise)
        return {"format": _STATE_FORMAT, "parameterisation": self.parameterisation,
                "num_entities": self.num_entities, "dim": self.dim, "beta": self.beta,
                "noise": record, "init": tuple(self.init)}

    def set_extra_state(self, state: Any) -> None:
        """Adopt the noise (``beta`` or ``noise``) and ``init`` of a loaded state (its
        parameterisation and sizes were checked by :meth:`_load_from_state_dict`)."""
        _check_extra_state(state, self)
        record = state.get("noise")
        if record is None:
            self.beta = state["beta"]
        else:
            self.noise = noise_from_record(record)
        low, high = (float(v) for v in state["init"])
        self.init = (low, high)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        extra = prefix + "_extra_state"
        if extra in state_dict:
            _check_extra_state(state_dict[extra], self)
        elif prefix + "param1" in state_dict or prefix + "param2" in state_dict:
            # a state_dict from before the parameters were named (no record of its
            # parameterisation): read as this module's
            first, second = _PARAMETER_NAMES[self.parameterisation]
            for old, new in (("param1", first), ("param2", second)):
                if prefix + old in state_dict and prefix + new not in state_dict:
                    state_dict[prefix + new] = state_dict.pop(prefix + old)
            state_dict[extra] = self.get_extra_state()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _to_params(self, lower: torch.Tensor, side: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.parameterisation == "center_offset":
            return lower + 0.5 * side, log_expm1(0.5 * side)
        if self.parameterisation == "min_delta":
            return lower, log_expm1(side)
        frac = side / (1.0 - lower)
        return torch.logit(lower), torch.logit(frac)

    def _make_box(self, p1: torch.Tensor, p2: torch.Tensor, validate: bool = True) -> Box:
        """The boxes of parameter rows ``p1``, ``p2``; ``validate=False`` skips the NaN pass
        over them (a caller that checks its tensors itself, such as the hierarchy trainer)."""
        if self.parameterisation == "center_offset":
            make = Box.from_center_offset if validate else Box._center_offset
            return make(p1, F.softplus(p2))
        if self.parameterisation == "min_delta":
            return (Box.from_min_delta if validate else Box._min_delta)(p1, p2)
        return (Box.from_sigmoid if validate else Box._sigmoid)(p1, p2)

    def forward(self, ids: torch.Tensor) -> Box:
        """The boxes of ``ids`` (any shape ``(*batch,)``), as a Box ``(*batch, dim)``."""
        self._check_ids(ids)
        p1, p2 = self.param1, self.param2
        ids = ids.to(device=p1.device, dtype=torch.long)
        return self._make_box(F.embedding(ids, p1), F.embedding(ids, p2))

    def _check_ids(self, ids: torch.Tensor) -> None:
        """ValueError unless ``ids`` is an integer tensor of ids in range (the range only
        while perturb's validation is on)."""
        if not isinstance(ids, torch.Tensor):
            raise ValueError(f"ids must be a torch.Tensor of integer ids, got "
                             f"{type(ids).__name__}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"ids must be an integer tensor (torch.long), got {ids.dtype}")
        if validation_enabled() and ids.numel() > 0:
            lo, hi = torch.aminmax(ids)
            check_value((lo >= 0) & (hi < self.num_entities),
                        f"ids must lie in [0, {self.num_entities})",
                        lambda: str(int(lo) if int(lo) < 0 else int(hi)))

    def all_boxes(self) -> Box:
        """Every entity's box, shape ``(num_entities, dim)``."""
        return self._make_box(self.param1, self.param2)

    def _all_boxes(self, validate: bool) -> Box:
        """:meth:`all_boxes`, without the NaN pass over the parameters unless ``validate``."""
        return self._make_box(self.param1, self.param2, validate)

    @torch.no_grad()
    def set_boxes(self, box: Box) -> None:
        """Set the parameters so that ``all_boxes()`` returns ``box`` (up to rounding): the
        inverse of the parameterisation, in place (the Parameters, and so optimizers holding
        them, stay the same objects).

        Args:
            box: ``(num_entities, dim)`` boxes with positive sides (for ``"sigmoid"``, inside
                the open unit cube). Converted to the parameters' dtype and device.

        Raises:
            ValueError: a wrong shape, a non-positive side, a non-finite corner, or (sigmoid)
                a box outside ``(0, 1)^d``.
        """
        if not isinstance(box, Box) or tuple(box.shape) != (self.num_entities, self.dim):
            got = tuple(box.shape) if isinstance(box, Box) else type(box).__name__
            raise ValueError(f"box must be a Box of shape ({self.num_entities}, {self.dim}), "
                             f"got {got}")
        lower, upper = box.lower, box.upper
        side = upper - lower
        if not bool(torch.isfinite(lower).all() and torch.isfinite(upper).all()):
            raise ValueError("box corners must be finite")
        if not bool((side > 0).all()):
            raise ValueError("every box side must be > 0 (upper > lower)")
        if self.parameterisation == "sigmoid" and not bool((lower > 0).all() & (upper < 1).all()):
            raise ValueError("the sigmoid parameterisation holds boxes inside (0, 1)^d only")
        p1, p2 = self._to_params(lower.double(), side.double())
        self.param1.copy_(p1)
        self.param2.copy_(p2)

    # --------------------------------------------------------------- convenience
    def volume(self, ids: torch.Tensor, log: bool = False) -> torch.Tensor:
        """Volume of the boxes of ``ids``: expected under ``self.noise`` (hard if None)."""
        return volume(self(ids), noise=self.noise, log=log)

    def containment_prob(self, parent_ids: torch.Tensor, child_ids: torch.Tensor,
                         log: bool = False) -> torch.Tensor:
        """P(child ⊆ parent) under ``self.noise``; see
        :func:`perturb.boxes.containment_prob`."""
        return containment_prob(self(parent_ids), self(child_ids), noise=self.noise, log=log)

    def log_containment_prob(self, parent_ids: torch.Tensor, child_ids: torch.Tensor
                             ) -> torch.Tensor:
        """log P(child ⊆ parent) under ``self.noise``."""
        return log_containment_prob(self(parent_ids), self(child_ids), noise=self.noise)

    def overlap(self, ids_a: torch.Tensor, ids_b: torch.Tensor, log: bool = False
                ) -> torch.Tensor:
        """Jaccard-type overlap under ``self.noise``; see :func:`perturb.boxes.overlap`."""
        return overlap(self(ids_a), self(ids_b), noise=self.noise, log=log)

    def extra_repr(self) -> str:
        model = f"beta={self.beta}" if self.beta is not None or self.noise is None \
            else f"noise={self.noise!r}"
        return (f"num_entities={self.num_entities}, dim={self.dim}, {model}, "
                f"parameterisation={self.parameterisation!r}")


def _check_extra_state(state: Any, module: BoxEmbedding) -> None:
    """ValueError unless ``state`` is a BoxEmbedding extra state matching ``module``'s
    parameterisation, ``num_entities`` and ``dim``."""
    keys = ("format", "parameterisation", "num_entities", "dim", "beta", "init")
    if not isinstance(state, Mapping) or any(k not in state for k in keys):
        raise ValueError(f"not a BoxEmbedding state: its _extra_state must be a dict with "
                         f"keys {keys}, got {state!r}")
    if state["format"] not in (1, _STATE_FORMAT):
        raise ValueError(f"BoxEmbedding state format {state['format']!r} is not supported "
                         f"(this version reads formats 1 to {_STATE_FORMAT})")
    if state["parameterisation"] != module.parameterisation:
        raise ValueError(f"cannot load a BoxEmbedding state saved with parameterisation="
                         f"{state['parameterisation']!r} into one with parameterisation="
                         f"{module.parameterisation!r}: the parameters mean different things; "
                         f"build the module with parameterisation="
                         f"{state['parameterisation']!r}")
    for name in ("num_entities", "dim"):
        if state[name] != getattr(module, name):
            raise ValueError(f"cannot load a BoxEmbedding state with {name}={state[name]} into "
                             f"one with {name}={getattr(module, name)}")
