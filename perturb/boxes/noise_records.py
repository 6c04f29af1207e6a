"""Plain-value records of the noises of boxes, for state_dicts, checkpoints and JSON.

A box model's noise is saved as ``{"family": "Normal", "scale": 0.1}`` (its class name in
:mod:`perturb.noise` and its parameters), so that files load with
``torch.load(weights_only=True)`` and configs serialise to JSON. :class:`~perturb.boxes.BoxEmbedding`
and the hierarchy application (:class:`~perturb.boxes.hierarchy.HierarchyConfig`, its model and
checkpoints) share these three functions.
"""
from __future__ import annotations

from typing import Any, Mapping

import perturb.noise as _noises
from perturb.boxes.expected_volumes import check_box_noise
from perturb.noise import Noise

__all__ = ["check_recordable", "noise_record", "noise_from_record"]


def check_recordable(noise: Noise, name: str = "noise") -> Noise:
    """``noise`` if the expected volumes can use it (:func:`check_box_noise`) and its record
    rebuilds it (a class of :mod:`perturb.noise`); else a ValueError saying what to do."""
    check_box_noise(noise, name)
    if getattr(_noises, type(noise).__name__, None) is not type(noise):
        raise ValueError(f"{name}={noise!r} is not a noise of perturb.noise, so a state_dict or "
                         f"checkpoint cannot record it: use one of perturb.noise (Gumbel, "
                         f"Normal, Logistic), or call perturb.boxes.expected_volume(..., "
                         f"noise=...) on the boxes yourself")
    return noise


def noise_record(noise: Noise | None) -> dict[str, Any] | None:
    """The plain-value record of ``noise`` (None for None)."""
    if noise is None:
        return None
    params: dict[str, Any] = noise._params() or {}
    return {"family": type(noise).__name__, **{k: float(v) for k, v in params.items()}}


def noise_from_record(record: Any) -> Noise | None:
    """The noise a :func:`noise_record` describes (None and a Noise pass through), checked by
    :func:`check_recordable`; ValueError for anything else."""
    if record is None:
        return None
    if not isinstance(record, Mapping):          # check_box_noise names what is wrong
        return check_recordable(record)
    family = record.get("family")
    cls = getattr(_noises, family, None) if isinstance(family, str) else None
    if not (isinstance(cls, type) and issubclass(cls, Noise)):
        raise ValueError(f"noise must be a perturb.noise.Noise, None or a record "
                         f"{{'family': 'Normal', 'scale': 0.1}}, got {record!r}")
    return check_recordable(cls(**{k: v for k, v in record.items() if k != "family"}))
