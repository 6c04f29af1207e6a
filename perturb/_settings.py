"""The package's process-wide settings, in one place (toolkit layer: everything may read them).

Three switches, one object::

    perturb.settings(validate=False)                    # from here on
    with perturb.settings(validate=False, compiled=False):
        ...                                             # only inside the block
    perturb.settings.current()                          # {'validate': True, ...}

- ``validate``: the value checks of the arguments (finite scores, membership of a structure;
  :mod:`perturb._validation`). Structural checks (shapes, ``tau > 0``) always run.
- ``compiled``: the compiled, fused Gumbel-/Gaussian-softmax path on CUDA (:mod:`perturb._fused`;
  ``PERTURB_COMPILE=0`` in the environment sets the default to off).
- ``cuda_graphs``: Sinkhorn replays blocks of iterations from captured CUDA graphs (forward
  without autograd only; :mod:`perturb.structured.permutations._sinkhorn`).

The settings are process-wide, not per thread: autograd runs CUDA backward passes on its own
threads, which must see the setting of the thread that built the graph. A plain call switches at
once and stays switched; as a context manager it restores the previous values on exit (the
``torch.set_grad_enabled`` pattern). ``perturb.set_validation`` and
``perturb._fused.set_compiled`` are the one-switch spellings of the same flags.
"""
from __future__ import annotations

import os
from typing import Any


class Flag:
    """A process-wide boolean setting (see the module docstring)."""

    def __init__(self, default: bool) -> None:
        self.value = default


class Switch:
    """Sets its ``flag`` at once; as a context manager, restores the previous value on exit
    (the ``torch.set_grad_enabled`` pattern: a plain call is never silently undone)."""

    flag: Flag

    def __init__(self, enabled: bool) -> None:
        if not isinstance(enabled, bool):   # bool("false") is True: refuse strings and the like
            raise ValueError(f"enabled must be a bool, got {enabled!r}")
        self.previous = self.flag.value
        self.flag.value = enabled

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.flag.value = self.previous


VALIDATE = Flag(True)
COMPILED = Flag(os.environ.get("PERTURB_COMPILE", "1") != "0")
CUDA_GRAPHS = Flag(True)
_FLAGS = {"validate": VALIDATE, "compiled": COMPILED, "cuda_graphs": CUDA_GRAPHS}


class settings:
    """Set any of the package's switches: a plain call, or a context manager that restores
    them on exit. Arguments left out (None) keep their value.

    Args:
        validate: run the value checks of the arguments.
        compiled: allow the compiled CUDA softmax path.
        cuda_graphs: allow Sinkhorn's CUDA-graph replay.

    Raises:
        ValueError: a value that is not a bool (``"false"`` would be truthy).

    Example:
        >>> import perturb
        >>> with perturb.settings(validate=False):
        ...     perturb.settings.current()["validate"]
        False
        >>> perturb.settings.current()["validate"]
        True
    """

    def __init__(self, *, validate: bool | None = None, compiled: bool | None = None,
                 cuda_graphs: bool | None = None) -> None:
        asked = {"validate": validate, "compiled": compiled, "cuda_graphs": cuda_graphs}
        for name, value in asked.items():
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {value!r}")
        self.previous = {name: flag.value for name, flag in _FLAGS.items()}
        for name, value in asked.items():
            if value is not None:
                _FLAGS[name].value = value

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        for name, value in self.previous.items():
            _FLAGS[name].value = value

    @staticmethod
    def current() -> dict[str, Any]:
        """The current value of every setting."""
        return {name: flag.value for name, flag in _FLAGS.items()}
