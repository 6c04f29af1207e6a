"""Renamed arguments: the old name keeps working for one release with a ``FutureWarning``.

The package uses one name per concept: ``scale`` for a noise scale (a property of the noise
object wherever a noise object is taken), ``tau`` for a temperature. Arguments that had other
names (``sigma``, ``temperature``) go through :func:`renamed`.
"""
from __future__ import annotations

import os
import sys
import warnings
from types import FrameType
from typing import Any, Callable

REMOVED_IN = "0.3"

#: frames in files under this directory are the package's own (the warning skips them)
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_deprecated(fn: str, old: str, instead: str) -> None:
    """The ``FutureWarning`` for argument ``old`` of ``fn``, pointing at the user's call."""
    warn_future(fn, f"{old}=", instead)


def warn_future(fn: str, what: str, instead: str, stacklevel: int | None = None) -> None:
    """The ``FutureWarning`` "``fn``(): ``what`` is deprecated and will be removed ...", at the
    user's call: the first frame outside the package (decorators such as ``full_precision``
    add frames), unless ``stacklevel`` says where."""
    if stacklevel is None:
        stacklevel = 2                              # level 2: the caller of this function
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            stacklevel, frame = stacklevel + 1, frame.f_back
    warnings.warn(f"{fn}(): {what} is deprecated and will be removed in perturb {REMOVED_IN}; "
                  f"{instead}", FutureWarning, stacklevel=stacklevel)


def old_sampler_order(fn: str, n_samples: Any, generator: Any, legacy: tuple,
                      tau: Any) -> tuple[Any, Any, Any]:
    """``(n_samples, generator, tau)`` of a subset sampler called in the new order
    ``(w, k, n_samples, generator, *, tau)`` or in the old one ``(w, k, tau, n_samples,
    generator)``, recognised by a float or tensor where ``n_samples`` stands now (an int there
    is ``n_samples``: the new meaning). The old order warns; ``legacy`` holds a fifth
    positional argument (the old ``generator``)."""
    old = isinstance(n_samples, float) or (hasattr(n_samples, "is_floating_point")
                                           and n_samples.is_floating_point())
    if not old:
        if legacy:
            raise TypeError(f"{fn}() takes at most 4 positional arguments (w, k, n_samples, "
                            f"generator); pass tau= by keyword")
        return n_samples, generator, tau
    if len(legacy) > 1 or tau != 1.0:
        raise TypeError(f"{fn}() got tau twice (third positional argument, the old order, and "
                        f"tau=)" if tau != 1.0 else f"{fn}() got too many positional arguments")
    warn_future(fn, "the order (w, k, tau, n_samples, generator)", "the order is now (w, k, "
                "n_samples, generator, *, tau), as for every sampler: pass tau= by keyword")
    return generator, (legacy[0] if legacy else None), n_samples


def legacy_keywords(fn: str, legacy: tuple, given: dict[str, Any],
                    defaults: dict[str, Any]) -> dict[str, Any]:
    """``given`` (the keyword-only arguments of ``fn``) updated with ``legacy``, extra
    positional arguments of the old signature, where the keys of ``defaults`` followed in that
    order; warns when there are any."""
    if not legacy:
        return given
    names = tuple(defaults)
    if len(legacy) > len(names):
        raise TypeError(f"{fn}() got {len(legacy)} extra positional arguments; the arguments "
                        f"after generator are keyword-only: {', '.join(names)}")
    out = dict(given)
    for name, value in zip(names, legacy):
        if given[name] is not defaults[name] and given[name] != defaults[name]:
            raise TypeError(f"{fn}() got multiple values for argument {name!r}")
        out[name] = value
    passed = names[:len(legacy)]
    warn_future(fn, f"passing {', '.join(passed)} by position",
                f"pass {', '.join(n + '=' for n in passed)} by keyword (keyword-only after "
                f"generator, as for every sampler)")
    return out


def renamed(fn: str, old: str, old_value: Any, new: str, new_value: Any, default: Any,
            check: Callable[[Any, str], Any] | None = None) -> Any:
    """The value of argument ``new``, accepting the deprecated spelling ``old``.

    ``old_value`` is None when the old name was not passed. Passing both (the new one away from
    its default) is a ``TypeError``, as passing one argument twice is in Python. ``check(value,
    name)``, when given, validates a value passed under the old name with that name, so that an
    error names the argument the user wrote (the caller checks the new name itself).
    """
    if old_value is None:
        return new_value
    if new_value is not default and new_value != default:
        raise TypeError(f"{fn}() got both {old}= (deprecated) and {new}=; pass only {new}=")
    warn_deprecated(fn, old, f"use {new}=... instead")
    if check is not None:
        check(old_value, old)
    return old_value
