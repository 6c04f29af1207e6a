"""Structures Z (the vertices of a polytope) and the registry of regularized-argmax solvers.

A :class:`Structure` is a small contract, like a ``torch.distributions`` constraint: it knows
its event dims, validates score tensors, solves the exact ``argmax_{z ∈ Z} ⟨w, z⟩``, checks
membership of a candidate and enumerates its vertices for tiny n (tests and brute force use it).

Solvers of the regularized problem ``argmax_{x ∈ conv Z} ⟨w, x⟩ − τ f(x)`` are registered per
(structure type, regularizer type) pair with :func:`register_solver`, the way
``torch.distributions.kl.register_kl`` works: lookup goes to the most specific registered pair
along both class hierarchies. Pairs that are impossible by design (e.g. permutations with the
exponential-family entropy, which needs the #P-hard permanent) are registered with
:func:`register_unsupported`, so "unsupported" differs from "missing".
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from perturb._validation import check_device, check_scores
from perturb.backward import BACKWARD_MODES
from perturb.regularizers import Entropy, Regularizer

__all__ = [
    "Structure", "Simplex", "register_solver", "register_unsupported", "registered_pairs",
    "get_solver", "SolverEntry", "BACKWARD_MODES", "support_table",
]

#: Every backward mode the library knows. A solver registers the subset it implements natively;
#: "finite_difference" is available for every solver through the generic wrapper in
#: :mod:`perturb.backward`.

Solver = Callable[..., torch.Tensor]


class Structure:
    """Base class of a finite set Z of structures embedded as 0/1 tensors.

    Subclasses set ``event_dim`` (1 for vectors ``(n,)``, 2 for matrices ``(n, n)``) and implement
    :meth:`argmax`, :meth:`check` and :meth:`enumerate`.
    """

    event_dim: int = 1
    square: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check ``enumerate``'s ``device`` once for every subclass (ValueError naming it, not
        torch's RuntimeError from deep inside the tensor factory)."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("enumerate")
        if own is not None and not getattr(own, "_checks_device", False):
            @functools.wraps(own)
            def enumerate(self: Structure, n: int, *args: Any, device: Any = None,
                          **kw: Any) -> torch.Tensor:
                if device is not None:
                    device = check_device(device)
                return own(self, n, *args, device=device, **kw)

            enumerate._checks_device = True  # type: ignore[attr-defined]
            cls.enumerate = enumerate  # type: ignore[method-assign]

    def validate(self, w: torch.Tensor, name: str = "w") -> None:
        """Raise ValueError when ``w`` cannot be a score tensor for this structure."""
        check_scores(w, name, min_ndim=self.event_dim, square=self.square)

    def event_shape(self, w: torch.Tensor) -> torch.Size:
        """The trailing dims of ``w`` that hold one structure."""
        return w.shape[w.ndim - self.event_dim:]

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        """The exact maximiser argmax_{z ∈ Z} ⟨w, z⟩, same shape/dtype/device as ``w``."""
        raise NotImplementedError

    def check(self, y: torch.Tensor) -> torch.Tensor:
        """Boolean tensor of shape ``(*batch)``: whether each ``y`` is a vertex of Z."""
        raise NotImplementedError

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """All vertices for size n, stacked: ``(|Z|, *event_shape)``. Only for tiny n."""
        raise NotImplementedError

    def default_regularizer(self) -> Regularizer:
        """The regularizer used when ``regularizer=None``."""
        return Entropy()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))


class Simplex(Structure):
    """One-hot vectors: Z = {e_1, ..., e_n}, conv Z the probability simplex.

    Shape: scores ``(*batch, n)``; argmax returns a one-hot ``(*batch, n)`` (ties go to the
    lowest index, as ``torch.argmax``).
    """

    event_dim = 1

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        index = w.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(w).scatter_(-1, index, 1.0)

    def check(self, y: torch.Tensor) -> torch.Tensor:
        binary = ((y == 0) | (y == 1)).all(dim=-1)
        return binary & (y.sum(dim=-1) == 1)

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        return torch.eye(n, dtype=dtype, device=device)


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SolverEntry:
    """A registered pair: the solver and its native backward modes, or the reason it cannot be."""

    structure: type
    regularizer: type
    solver: Solver | None
    backward: tuple[str, ...]
    description: str
    reason: str | None = None  # set for pairs that are impossible by design

    @property
    def supported(self) -> bool:
        return self.solver is not None


class PairInfo(NamedTuple):
    structure: str
    regularizer: str
    supported: bool
    backward: tuple[str, ...]
    description: str


_REGISTRY: dict[tuple[type, type], SolverEntry] = {}


def _check_types(structure_type: type, regularizer_type: type) -> None:
    if not (isinstance(structure_type, type) and issubclass(structure_type, Structure)):
        raise TypeError(f"expected a Structure subclass, got {structure_type!r}")
    if not (isinstance(regularizer_type, type) and issubclass(regularizer_type, Regularizer)):
        raise TypeError(f"expected a Regularizer subclass, got {regularizer_type!r}")


def register_solver(structure_type: type, regularizer_type: type, *,
                    backward: tuple[str, ...] = ("analytic",), description: str = ""):
    """Decorator registering ``solve(w, structure, regularizer, tau, backward)`` for a pair.

    Args:
        structure_type: a :class:`Structure` subclass.
        regularizer_type: a :class:`~perturb.regularizers.Regularizer` subclass.
        backward: the backward modes the solver implements natively; the first is the one
            ``backward="auto"`` picks. ``"finite_difference"`` is added for every solver.
        description: one line for listings (e.g. ``"Sinkhorn (log domain)"``).

    Example::

        @register_solver(MyStructure, Entropy, backward=("implicit", "unroll"))
        def _solve(w, structure, regularizer, tau, backward):
            ...
    """
    _check_types(structure_type, regularizer_type)
    for mode in backward:
        if mode not in BACKWARD_MODES or mode == "auto":
            raise ValueError(f"unknown backward mode {mode!r}; known: {BACKWARD_MODES[1:]}")

    def decorator(fn: Solver) -> Solver:
        _REGISTRY[(structure_type, regularizer_type)] = SolverEntry(
            structure_type, regularizer_type, fn, tuple(backward), description or fn.__name__)
        return fn

    return decorator


def register_unsupported(structure_type: type, regularizer_type: type, reason: str) -> None:
    """Record that a pair is impossible by design; asking for it raises NotImplementedError(reason)."""
    _check_types(structure_type, regularizer_type)
    _REGISTRY[(structure_type, regularizer_type)] = SolverEntry(
        structure_type, regularizer_type, None, (), "not tractable", reason)


def _lookup(structure_type: type, regularizer_type: type) -> SolverEntry | None:
    """Most specific registered pair, ranking by distance along each MRO (as register_kl)."""
    best, best_rank = None, None
    s_mro, r_mro = structure_type.__mro__, regularizer_type.__mro__
    for (s, r), entry in _REGISTRY.items():
        if s in s_mro and r in r_mro:
            rank = (s_mro.index(s), r_mro.index(r))
            if best_rank is None or rank < best_rank:
                best, best_rank = entry, rank
    return best


def get_solver(structure: Structure, regularizer: Regularizer) -> SolverEntry:
    """The registered entry for this pair.

    Raises:
        NotImplementedError: the pair is missing (the message lists the registered pairs) or
            impossible by design (the message says why).
    """
    entry = _lookup(type(structure), type(regularizer))
    if entry is None:
        pairs = ", ".join(f"({p.structure}, {p.regularizer})" for p in registered_pairs()
                          if p.supported)
        raise NotImplementedError(
            f"no solver registered for ({type(structure).__name__}, {type(regularizer).__name__}); "
            f"registered pairs: {pairs}")
    if not entry.supported:
        raise NotImplementedError(
            f"({type(structure).__name__}, {type(regularizer).__name__}) is not supported: "
            f"{entry.reason}")
    return entry


def registered_pairs() -> list[PairInfo]:
    """Every registered (structure, regularizer) pair with its backward modes, sorted by name.

    The README's support table and the contract tests over every pair are generated from it.
    """
    out = []
    for (s, r), e in _REGISTRY.items():
        modes = e.backward + ("finite_difference",) if e.supported else ()
        out.append(PairInfo(s.__name__, r.__name__, e.supported, modes,
                            e.description if e.supported else f"unsupported: {e.reason}"))
    return sorted(out, key=lambda p: (p.structure, p.regularizer))



def support_table() -> str:
    """A markdown table of the registered pairs and their backward modes (used by the README)."""
    lines = ["| structure | regularizer | solver | backward modes |", "|---|---|---|---|"]
    for p in registered_pairs():
        modes = ", ".join(f"`{m}`" for m in p.backward) if p.supported else "—"
        lines.append(f"| {p.structure} | {p.regularizer} | {p.description} | {modes} |")
    return "\n".join(lines)
