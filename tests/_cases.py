"""Bad-input cases shared by tests/test_bad_input.py and the structure specs (tests/_specs.py).

A :class:`Case` calls a public function with one bad argument; the test asserts the exception
type and that the message names the argument (a regular expression). The generators below build
the usual cases for a scores tensor, a temperature and an integer argument.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import torch

import perturb

F64 = torch.float64
V = torch.randn(3, 5, dtype=F64)                 # vectors (batch 3, n 5)
S = torch.randn(2, 4, 4, dtype=F64)              # square matrices
NAN_V = V.clone()
NAN_V[0, 1] = math.nan
NAN_S = S.clone()
NAN_S[0, 1, 2] = math.nan


class Case(NamedTuple):
    label: str
    call: Callable[[], Any]
    match: str                          # regular expression the message must contain
    exc: type = ValueError


def _nan_at_one(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[1] = math.nan
    return x


def score_cases(fn: Callable, name: str, matrix: bool = False,
                good: torch.Tensor | None = None) -> list[Case]:
    """Wrong dtype, NaN, too few dims, empty event (and non-square for ``matrix``), for a
    scores argument of ``fn(x)``; ``good`` is a valid scores tensor (default: V or S)."""
    if good is None:
        good = S if matrix else V
    bad_nan = _nan_at_one(good)
    cases = [
        Case(f"{name} int dtype", lambda: fn(good.long()), name),
        Case(f"{name} bool dtype", lambda: fn(good > 0), name),
        Case(f"{name} complex dtype", lambda: fn(good.to(torch.complex128)), name),
        Case(f"{name} NaN", lambda: fn(bad_nan), name),
        Case(f"{name} 0-dim", lambda: fn(torch.tensor(1.0, dtype=F64)), name),
        Case(f"{name} not a tensor", lambda: fn(good.tolist()), name),
    ]
    event_dim = 2 if matrix else 1
    empty = torch.randn(*good.shape[:good.ndim - event_dim], *[0] * event_dim, dtype=F64)
    if matrix:
        n = good.shape[-2]
        cases.append(Case(f"{name} non-square", lambda: fn(
            torch.randn(*good.shape[:-2], n, n + 1, dtype=F64)), name))
    cases.append(Case(f"{name} empty n = 0", lambda: fn(empty), name))
    return cases


def tau_cases(fn: Callable, name: str = "tau") -> list[Case]:
    """τ ≤ 0, NaN, inf, a string, for ``fn(tau)``."""
    return [
        Case(f"{name} = 0", lambda: fn(0.0), name),
        Case(f"{name} < 0", lambda: fn(-1.0), name),
        Case(f"{name} NaN", lambda: fn(math.nan), name),
        Case(f"{name} inf", lambda: fn(math.inf), name),
        Case(f"{name} string", lambda: fn("1"), name),
    ]


def int_cases(fn: Callable, name: str, low_bad: int, high_bad: int | None = None) -> list[Case]:
    """Too small, a float, a bool (and too large when ``high_bad`` is given), for ``fn(i)``."""
    cases = [Case(f"{name} too small", lambda: fn(low_bad), name),
             Case(f"{name} float", lambda: fn(1.5), name),
             Case(f"{name} bool", lambda: fn(True), name)]
    if high_bad is not None:
        cases.append(Case(f"{name} too large", lambda: fn(high_bad), name))
    return cases


def structure_cases(structure: perturb.Structure, event: tuple[int, ...]) -> list[Case]:
    """The scores cases of a structure at the public boundary (``perturb.argmax`` and
    ``perturb.regularized_argmax``), from one valid event shape: what every structure owes."""
    good = torch.randn(2, *event, dtype=F64)
    square = bool(getattr(structure, "square", False))
    cases = []
    for fn_name in ("argmax", "regularized_argmax"):
        fn = getattr(perturb, fn_name)
        cases += [c._replace(label=f"{fn_name}: {c.label}")
                  for c in score_cases(lambda w, fn=fn: fn(w, structure), "w", square, good)]
    cases.append(Case("validate int scores", lambda: structure.validate(good.long()), "w"))
    if square:
        n = event[-1]
        cases.append(Case("validate non-square", lambda: structure.validate(
            torch.randn(2, n, n + 1, dtype=F64)), "w"))
    return cases + tau_cases(lambda t: perturb.regularized_argmax(good, structure, tau=t))
