"""Renamed arguments: the old name keeps working for one release with a ``FutureWarning``.

The package uses one name per concept: ``scale`` for a noise scale (a property of the noise
object wherever a noise object is taken), ``tau`` for a temperature. Arguments that had other
names (``sigma``, ``temperature``) go through :func:`renamed`.
"""
from __future__ import annotations

import warnings
from typing import Any

REMOVED_IN = "0.3"


def warn_deprecated(fn: str, old: str, instead: str) -> None:
    """The ``FutureWarning`` for argument ``old`` of ``fn``, pointing at the user's call (``fn``
    calls a helper that calls this)."""
    warnings.warn(f"{fn}(): {old}= is deprecated and will be removed in perturb {REMOVED_IN}; "
                  f"{instead}", FutureWarning, stacklevel=4)


def renamed(fn: str, old: str, old_value: Any, new: str, new_value: Any, default: Any) -> Any:
    """The value of argument ``new``, accepting the deprecated spelling ``old``.

    ``old_value`` is None when the old name was not passed. Passing both (the new one away from
    its default) is a ``TypeError``, as passing one argument twice is in Python.
    """
    if old_value is None:
        return new_value
    if new_value is not default and new_value != default:
        raise TypeError(f"{fn}() got both {old}= (deprecated) and {new}=; pass only {new}=")
    warn_deprecated(fn, old, f"use {new}=... instead")
    return old_value
