"""``HierarchyConfig``: every hyper-parameter of a hierarchy run, in one validated object.

The single-process trainer (:func:`~perturb.boxes.hierarchy.train_hierarchy`), the distributed
one (:func:`~perturb.boxes.hierarchy.train_hierarchy_distributed`), checkpoints and saved models
all take or store this one object, so a setting is named, documented and checked once. The
trainers also accept its fields as keyword arguments (``train_hierarchy(g, dim=10, lr=0.01)``),
which replace the fields of ``config``.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Mapping

import torch

from perturb._validation import check_choice, check_int, check_tau

__all__ = ["HierarchyConfig", "METHODS", "PARAMETERISATIONS", "INITIALIZERS"]

#: Box models of :class:`~perturb.boxes.hierarchy.BoxHierarchyModel`.
METHODS = ("gumbel", "soft", "hard", "normal", "logistic")
#: Initialisations of a run's boxes (:attr:`HierarchyConfig.initializer`).
INITIALIZERS = ("random", "nested")
#: Box parameterisations of :class:`~perturb.boxes.BoxEmbedding`.
PARAMETERISATIONS = ("center_offset", "min_delta", "sigmoid")
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
           "float64": torch.float64}
# fields that may change between a checkpoint and the run that resumes from it
RESUMABLE_CHANGES = ("epochs", "checkpoint_every", "eval_every")


@dataclasses.dataclass(frozen=True)
class HierarchyConfig:
    """Hyper-parameters of a box-hierarchy run (model, optimisation, negatives, diagnostics).

    Model:
        dim: box dimension d (>= 1).
        method: "gumbel", "soft", "hard", or "normal" / "logistic" (corners perturbed by that
            noise with scale ``beta``; see :class:`BoxHierarchyModel`).
        beta, volume_beta: Gumbel intersection / volume scales (> 0; ``volume_beta=None``: use
            ``beta``). The defaults (0.01, 0.1) follow Dasgupta et al. 2020. For "normal" and
            "logistic", ``beta`` is the noise scale and ``volume_beta`` is not used.
        temperature: softplus temperature of soft volumes (> 0).
        parameterisation: "center_offset", "min_delta" or "sigmoid" (BoxEmbedding).
        init: side-length range ``(min_side, max_side)`` of the random initialisation, in
            (0, 1).
        initializer: "random" (boxes of ``init`` sides at uniform positions in the unit cube)
            or "nested" (boxes nested along the training edges,
            :func:`~perturb.boxes.hierarchy.nested_boxes`: every training edge, and so every
            pair of their closure, starts as a strict containment; not with the "sigmoid"
            parameterisation, whose boxes stay in the unit cube).
        dtype: parameter dtype, "float32" (default), "float64", "bfloat16" or "float16" (a
            ``torch.dtype`` is accepted and stored by name).

    Optimisation (Adam, one step per batch of positives):
        epochs: passes over the positive edges (>= 0).
        lr: learning rate (> 0).
        batch_size: positive edges per step (>= 1), each with its negatives.
        negatives_per_positive: k corrupted pairs per positive, redrawn every step (>= 0).
        negative_weight: w >= 0, weight of the mean negative loss.
        negative_max_tries: draws per negative before a known pair is kept (>= 1; see
            :func:`~perturb.boxes.sample_negatives`).
        sampler: how rejected negatives are redrawn: "auto" (adaptive on the CPU, fixed on
            other devices), "adaptive" (only the rejected ones, round after round, one host read
            per round) or "fixed" (``negative_max_tries`` candidates at once, no host read).
            Same distribution; different random streams.
        volume_reg, volume_threshold: λ >= 0 and τ_v >= 0 of the volume regulariser
            λ · Σ_{touched boxes} 1[Vol > τ_v]·Vol (off when λ = 0).
        closure: train on the transitive closure of the graph (True) or its edges, when the
            trainer is given no ``train_edges``.
        seed: seed of initialisation, shuffling and negatives (None: non-deterministic, unless
            the trainer gets a ``generator``).

    Diagnostics and bookkeeping:
        diagnostics_every: the stalled-pair and zero-gradient diagnostics run on the first step
            of every epoch and then every ``diagnostics_every`` steps (0: never). They cost
            about one extra backward pass each, so the default 50 keeps them at ~2 % of the
            training time; 1 runs them every step.
        grad_tol: a gradient entry counts as zero when ``|g| <= grad_tol`` (>= 0).
        accuracy_threshold: P level in (0, 1] of the per-epoch containment accuracy.
        eval_every: call the trainer's ``eval_fn`` every this many epochs and after the last
            (0: never).
        checkpoint_every: write the trainer's checkpoint every this many epochs and after the
            last (>= 1; only when a checkpoint path is given).

    Raises:
        ValueError: any field out of range, NaN or of the wrong type, naming the field.

    Example:
        >>> cfg = HierarchyConfig(dim=10, epochs=20)
        >>> cfg.replace(lr=0.01).lr
        0.01
    """

    dim: int = 10
    method: str = "gumbel"
    beta: float = 0.01
    volume_beta: float | None = 0.1
    temperature: float = 0.1
    parameterisation: str = "center_offset"
    init: tuple[float, float] = (0.1, 0.5)
    initializer: str = "random"
    dtype: str = "float32"
    epochs: int = 100
    lr: float = 0.05
    batch_size: int = 512
    negatives_per_positive: int = 10
    negative_weight: float = 1.0
    negative_max_tries: int = 100
    sampler: str = "auto"
    volume_reg: float = 0.0
    volume_threshold: float = 0.5
    closure: bool = True
    seed: int | None = None
    diagnostics_every: int = 50
    grad_tol: float = 1e-12
    accuracy_threshold: float = 0.5
    eval_every: int = 0
    checkpoint_every: int = 1

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)      # noqa: E731 (frozen)
        set_("dim", check_int(self.dim, "dim", low=1))
        check_choice(self.method, METHODS, "method")
        check_choice(self.parameterisation, PARAMETERISATIONS, "parameterisation")
        check_choice(self.sampler, ("auto", "adaptive", "fixed"), "sampler")
        check_choice(self.initializer, INITIALIZERS, "initializer")
        if self.initializer == "nested" and self.parameterisation == "sigmoid":
            raise ValueError("initializer='nested' builds boxes of side up to 10, which the "
                             "'sigmoid' parameterisation (boxes inside the unit cube) cannot "
                             "hold; use 'center_offset' or 'min_delta'")
        for name in ("beta", "temperature", "lr"):
            check_tau(getattr(self, name), name)
            set_(name, float(getattr(self, name)))
        if self.volume_beta is not None:
            check_tau(self.volume_beta, "volume_beta")
            set_("volume_beta", float(self.volume_beta))
        raw: Any = self.init
        if isinstance(raw, numbers.Real) and not isinstance(raw, bool):
            raw = (raw, raw)
        init: tuple[float, ...] | None
        try:
            init = tuple(float(v) for v in raw)
        except (TypeError, ValueError):
            init = None
        if init is None or len(init) != 2 or not (0.0 < init[0] <= init[1] < 1.0):
            raise ValueError(f"init must be a side length or a (min_side, max_side) pair with "
                             f"0 < min_side <= max_side < 1, got {self.init!r}")
        set_("init", init)
        dtype = self.dtype
        if isinstance(dtype, torch.dtype):
            dtype = next((k for k, v in _DTYPES.items() if v == dtype), str(dtype))
        check_choice(dtype, tuple(_DTYPES), "dtype")
        set_("dtype", dtype)
        for name, low in (("epochs", 0), ("batch_size", 1), ("negatives_per_positive", 0),
                          ("negative_max_tries", 1), ("diagnostics_every", 0),
                          ("eval_every", 0), ("checkpoint_every", 1)):
            set_(name, check_int(getattr(self, name), name, low=low))
        for name in ("negative_weight", "volume_reg", "volume_threshold", "grad_tol"):
            set_(name, _nonnegative(getattr(self, name), name))
        a = self.accuracy_threshold
        if isinstance(a, bool) or not isinstance(a, numbers.Real) or not 0.0 < a <= 1.0:
            raise ValueError(f"accuracy_threshold must be a probability in (0, 1], got {a!r}")
        set_("accuracy_threshold", float(a))
        if not isinstance(self.closure, bool):
            raise ValueError(f"closure must be a bool, got {self.closure!r}")
        if self.seed is not None:
            set_("seed", check_int(self.seed, "seed", low=0))

    # ------------------------------------------------------------------ helpers
    @property
    def torch_dtype(self) -> torch.dtype:
        """``dtype`` as a ``torch.dtype``."""
        return _DTYPES[self.dtype]

    def replace(self, **changes: Any) -> "HierarchyConfig":
        """A copy with ``changes`` applied (validated); TypeError for an unknown field."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown HierarchyConfig field(s) {unknown}; the fields are "
                            f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only (safe for ``torch.load(weights_only=True)`` and JSON)."""
        d = dataclasses.asdict(self)
        d["init"] = list(self.init)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HierarchyConfig":
        """Inverse of :meth:`to_dict` (unknown keys: TypeError)."""
        return cls().replace(**{k: tuple(v) if k == "init" else v for k, v in data.items()})

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`BoxHierarchyModel` (besides ``num_nodes``)."""
        return dict(dim=self.dim, method=self.method, beta=self.beta,
                    volume_beta=self.volume_beta, temperature=self.temperature,
                    parameterisation=self.parameterisation, init=self.init,
                    dtype=self.torch_dtype)

    def differences(self, other: "HierarchyConfig", ignore: tuple[str, ...] = ()
                    ) -> dict[str, tuple[Any, Any]]:
        """``{field: (self value, other value)}`` for the fields that differ."""
        a, b = self.to_dict(), other.to_dict()
        return {k: (a[k], b[k]) for k in a if k not in ignore and a[k] != b[k]}


def _nonnegative(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(float(value)) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)
