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
from typing import Any, Callable, Mapping

import torch

from perturb._deprecation import warn_future
from perturb._validation import check_choice, check_int, check_tau
from perturb.boxes.noise_records import check_recordable, noise_from_record, noise_record
from perturb.noise import Gumbel, Logistic, Noise, Normal

__all__ = ["HierarchyConfig", "METHODS", "DEFAULT_NOISE", "PARAMETERISATIONS", "INITIALIZERS",
           "OPTIMIZERS", "box_model", "resolve_box_model"]

#: Names of the box models (:func:`box_model`): the noises of the corners, or the two models
#: without noise, "soft" (softplus-smoothed volumes) and "hard". As values of the deprecated
#: ``method=`` argument they still select the model, with a FutureWarning.
METHODS = ("gumbel", "soft", "hard", "normal", "logistic")
#: The noise each noise name of :data:`METHODS` stands for (its scale: the old ``beta``).
_METHOD_NOISES: dict[str, Callable[..., Noise]] = {"gumbel": Gumbel, "normal": Normal,
                                                  "logistic": Logistic}
_DEFAULT_SCALE = 0.01                         # Dasgupta et al.'s Gumbel β
_DEFAULT_TEMPERATURE = 0.1
#: The default box model: Gumbel boxes with β = 0.01 (Dasgupta et al. 2020).
DEFAULT_NOISE: Noise = Gumbel(scale=_DEFAULT_SCALE)
#: Initialisations of a run's boxes (:attr:`HierarchyConfig.initializer`).
INITIALIZERS = ("random", "nested")
#: Optimisers of a run (:attr:`HierarchyConfig.optimizer`): dense Adam, or lazy Adam on
#: sparse row gradients (``torch.optim.SparseAdam``'s update rule).
OPTIMIZERS = ("adam", "sparse_adam")
#: Box parameterisations of :class:`~perturb.boxes.BoxEmbedding`.
PARAMETERISATIONS = ("center_offset", "min_delta", "sigmoid")
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
           "float64": torch.float64}
# fields that may change between a checkpoint and the run that resumes from it
RESUMABLE_CHANGES = ("epochs", "checkpoint_every", "eval_every")


def box_model(noise: Noise | None, temperature: float | None) -> str:
    """The name of a box model: its noise's family in lower case ("gumbel", "normal",
    "logistic", …), or "soft" (no noise, softplus volumes of ``temperature``) or "hard"."""
    if noise is not None:
        return type(noise).__name__.lower()
    return "soft" if temperature is not None else "hard"


def resolve_box_model(fn: str, noise: Any, temperature: Any, method: str | None = None,
                      beta: float | None = None, *, warn: bool = True
                      ) -> tuple[Noise | None, float | None]:
    """``(noise, temperature)`` of a box model given the new spelling (``noise`` a
    :class:`~perturb.noise.Noise` or None, ``temperature`` the softplus smoothing of noiseless
    boxes) or the deprecated one of ``fn`` (``method`` a name of :data:`METHODS`, also
    accepted in place of ``noise``; ``beta`` the noise scale), which warns unless ``warn`` is
    False (files written before the change). Validated; ValueError naming the argument."""
    if not isinstance(noise, str):
        noise = noise_from_record(noise)     # a Noise, None, or a record of a saved file
    else:
        if noise not in METHODS:
            raise ValueError(f"noise must be a perturb.noise.Noise (e.g. Gumbel(scale=0.01), "
                             f"Normal(0.05)) or None, got {noise!r}")
        if method is not None:
            raise ValueError(f"{fn}: got the box model twice, noise={noise!r} and "
                             f"method={method!r}")
        noise, method = None, noise
    if method is not None:
        check_choice(method, METHODS, "method")
        if noise is not None and noise != DEFAULT_NOISE:
            raise ValueError(f"{fn}: give noise={noise!r} or the deprecated method={method!r}, "
                             f"not both")
        kind = _METHOD_NOISES.get(method)
        scale = _DEFAULT_SCALE if beta is None else beta
        check_tau(scale, "beta")
        if method == "soft" and temperature is not None:
            check_tau(temperature, "temperature")
        if kind is not None:
            instead = f"noise={getattr(kind, '__name__', method)}(scale={scale})"
        elif method == "soft":
            instead = (f"noise=None, temperature={temperature or _DEFAULT_TEMPERATURE} (soft "
                       f"boxes: a smoothing of the hard volume, not a noise)")
        else:
            instead = "noise=None (hard boxes: the zero-noise limit)"
        if warn:
            warn_future(fn, f"method={method!r}", f"give {instead}")
        if kind is not None:
            return kind(scale=float(scale)), None
        if method == "soft":
            t = _DEFAULT_TEMPERATURE if temperature is None else temperature
            check_tau(t, "temperature")
            return None, float(t)
        return None, None
    if beta is not None:
        check_tau(beta, "beta")
        if warn:
            warn_future(fn, "beta=", "give the scale in the noise: noise=Gumbel(scale=β)")
        if noise is None:
            raise ValueError(f"{fn}: beta={beta!r} is a noise scale, but noise=None")
        noise = check_recordable(type(noise)(scale=float(beta)))
    if noise is not None:
        if temperature is not None:
            raise ValueError(f"temperature={temperature!r} is the softplus smoothing of boxes "
                             f"without noise (noise=None); drop it or noise={noise!r}")
        return noise, None
    if temperature is not None:
        check_tau(temperature, "temperature")
        temperature = float(temperature)
    return None, temperature


@dataclasses.dataclass(frozen=True)
class HierarchyConfig:
    """Hyper-parameters of a box-hierarchy run (model, optimisation, negatives, diagnostics).

    The model fields configure :class:`BoxHierarchyModel`; the optimiser is Adam (``optimizer``),
    one step per batch of positives.

    Model fields:
        dim: box dimension d (>= 1).
        noise: the noise perturbing every corner (a :class:`~perturb.noise.Noise` on the whole
            line: ``Gumbel(scale=β)``, the default with β = 0.01 after Dasgupta et al. 2020,
            ``Normal(σ)``, ``Logistic(s)``), or None for boxes without noise: hard boxes, or
            soft ones with ``temperature``.
        volume_beta: Gumbel noise only: the scale of the expected volumes (> 0; default 0.1
            after Dasgupta et al.; None: the noise's scale). Not used by other noises.
        temperature: ``noise=None`` only: the softplus temperature (> 0) of soft boxes (Li et
            al. 2019: a smoothing of the hard volume, not a noise); None: hard boxes.
        method, beta: deprecated (FutureWarning; removed in 0.3), not fields: ``method`` is
            "gumbel", "normal", "logistic" (``noise=`` that family with scale ``beta``),
            "soft" or "hard"; ``beta`` alone sets the noise's scale. A checkpoint or saved
            config of the old format loads without a warning.
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

    Optimisation fields:
        epochs: passes over the positive edges (>= 0).
        lr: learning rate (> 0).
        optimizer: "adam" (default: dense Adam, the fused kernel where available) or
            "sparse_adam": lazy Adam, the update rule of ``torch.optim.SparseAdam``. The
            model's row gathers then give sparse COO gradients of the ``(n, d)`` corner tables
            (no dense gradient is built) and only the boxes of the step's pairs are updated:
            m_R ← β₁m_R + (1 − β₁)g_R, v_R ← β₂v_R + (1 − β₂)g_R², θ_R ← θ_R − lr·√(1 − β₂ᵗ)
            /(1 − β₁ᵗ)·m_R/(√v_R + ε) for the touched rows R, t the optimizer's step count.
            It is a *different algorithm*, not a faster dense Adam: the moments of the boxes a
            step does not touch do not decay and those boxes do not move (dense Adam keeps
            moving them by their decaying first moment), the bias correction counts all
            steps, not a box's own updates, and ε is added to √v, not to the bias-corrected
            √v̂. Results differ from "adam" beyond rounding. Not with the distributed trainer
            (DDP does not reduce these sparse gradients: ValueError naming ``optimizer``).
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

    Diagnostics fields:
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
        >>> from perturb.noise import Normal
        >>> cfg.replace(noise=Normal(0.05)).box_model
        'normal'
    """

    dim: int = 10
    noise: Noise | None = DEFAULT_NOISE
    # keyword-only from here: the third positional field was ``beta`` before noise objects,
    # and HierarchyConfig(10, "gumbel", 0.05) must not silently become volume_beta=0.05
    _: dataclasses.KW_ONLY
    volume_beta: float | None = 0.1
    temperature: float | None = None
    parameterisation: str = "center_offset"
    init: tuple[float, float] = (0.1, 0.5)
    initializer: str = "random"
    dtype: str = "float32"
    epochs: int = 100
    lr: float = 0.05
    optimizer: str = "adam"
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
    method: dataclasses.InitVar[str | None] = None
    beta: dataclasses.InitVar[float | None] = None

    def __post_init__(self, method: str | None, beta: float | None) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)      # noqa: E731 (frozen)
        set_("dim", check_int(self.dim, "dim", low=1))
        noise, temperature = resolve_box_model("HierarchyConfig", self.noise,
                                               self.temperature, method, beta)
        set_("noise", noise)
        set_("temperature", temperature)
        check_choice(self.parameterisation, PARAMETERISATIONS, "parameterisation")
        check_choice(self.sampler, ("auto", "adaptive", "fixed"), "sampler")
        check_choice(self.optimizer, OPTIMIZERS, "optimizer")
        check_choice(self.initializer, INITIALIZERS, "initializer")
        if self.initializer == "nested" and self.parameterisation == "sigmoid":
            raise ValueError("initializer='nested' builds boxes of side up to 10, which the "
                             "'sigmoid' parameterisation (boxes inside the unit cube) cannot "
                             "hold; use 'center_offset' or 'min_delta'")
        check_tau(self.lr, "lr")
        set_("lr", float(self.lr))
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

    @property
    def box_model(self) -> str:
        """The box model's name, one of "gumbel", "normal", "logistic", …, "soft" or "hard"."""
        return box_model(self.noise, self.temperature)

    def replace(self, **changes: Any) -> "HierarchyConfig":
        """A copy with ``changes`` applied (validated); TypeError for an unknown field.

        A new ``noise`` or ``temperature`` replaces the box model: ``replace(noise=None)``
        gives hard boxes, ``replace(noise=None, temperature=0.1)`` soft ones."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names - {"method", "beta"})
        if unknown:
            raise TypeError(f"unknown HierarchyConfig field(s) {unknown}; the fields are "
                            f"{[f.name for f in dataclasses.fields(self)]}")
        if "noise" in changes and changes["noise"] is not None and "temperature" not in changes:
            changes["temperature"] = None
        if changes.get("method") is not None:
            changes.setdefault("noise", None)           # the method names the whole model
            changes.setdefault("temperature", None)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only (safe for ``torch.load(weights_only=True)`` and JSON);
        the noise as ``{"family": "Gumbel", "scale": 0.01}``."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["noise"] = noise_record(self.noise)
        d["init"] = list(self.init)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HierarchyConfig":
        """Inverse of :meth:`to_dict` (unknown keys: TypeError). Also reads the format before
        noise objects (``method``/``beta`` keys), without a warning."""
        data = {k: tuple(v) if k == "init" else v for k, v in data.items()}
        if "method" in data:
            noise, temperature = resolve_box_model(
                "HierarchyConfig.from_dict", None, data.get("temperature"), data.pop("method"),
                data.pop("beta", None), warn=False)
            data.update(noise=noise, temperature=temperature)
        return cls(**data)

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`BoxHierarchyModel` (besides ``num_nodes``)."""
        return dict(dim=self.dim, noise=self.noise, volume_beta=self.volume_beta,
                    temperature=self.temperature, parameterisation=self.parameterisation,
                    init=self.init, dtype=self.torch_dtype)

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
