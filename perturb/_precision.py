"""The precision policy: float16 / bfloat16 in, float32 inside, the input dtype out.

Half-precision inputs are welcome everywhere (users train under ``torch.autocast``), but
iterative solvers, dynamic programmes, linear solves and special functions are not run in them:
Sinkhorn's scalings, the k-subset DP, the matrix-tree solves and the Bessel volume would lose
their accuracy (bfloat16 keeps 8 bits of mantissa) or have no half kernel at all (``cholesky``,
``scaled_modified_bessel_k0`` on CPU). Functions decorated with :func:`full_precision` therefore

- upcast float16 / bfloat16 tensor arguments to float32 (float32 / float64 stay as they are),
- run with autocast disabled, so that their own matmuls are not cast back down inside an
  autocast region,
- return floating outputs in the dtype of the first floating tensor argument; gradients flow
  back through the casts, so ``x.grad`` has ``x``'s dtype.

The simplex relaxations (softmax, sparsemax, Gumbel/Gaussian-softmax) run in the input dtype
with torch's own kernels, which accumulate half-precision reductions in float32; their noise is
drawn in the input dtype, as ``torch.nn.functional.gumbel_softmax`` does. See docs/core.md.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)

_F = TypeVar("_F", bound=Callable[..., Any])


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16 / bfloat16, the dtype itself otherwise."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def upcast(x: Any) -> Any:
    """``x`` in float32 when it is a float16 / bfloat16 tensor; anything else unchanged."""
    if isinstance(x, torch.Tensor) and x.dtype in LOW_PRECISION:
        return x.float()
    return x


def _downcast(out: Any, dtype: torch.dtype) -> Any:
    if isinstance(out, torch.Tensor):
        return out.to(dtype) if out.is_floating_point() else out
    if isinstance(out, tuple):
        return type(out)(_downcast(o, dtype) for o in out)
    return out


def _autocast_off(args: tuple, kwargs: dict) -> Any:
    """A context disabling autocast on the device of the first tensor argument (or none)."""
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            dev = x.device.type
            if torch.is_autocast_enabled(dev):
                return torch.autocast(dev, enabled=False)
            return None
    return None


def full_precision(fn: _F) -> _F:
    """Decorator applying the policy of this module to a public function (see above)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out_dtype = next((x.dtype for x in (*args, *kwargs.values())
                          if isinstance(x, torch.Tensor) and x.is_floating_point()), None)
        ctx = _autocast_off(args, kwargs)
        if out_dtype not in LOW_PRECISION and ctx is None:
            return fn(*args, **kwargs)  # the common case: no casts, no context
        args = tuple(upcast(a) for a in args)
        kwargs = {k: upcast(v) for k, v in kwargs.items()}
        if ctx is None:
            out = fn(*args, **kwargs)
        else:
            with ctx:
                out = fn(*args, **kwargs)
        return _downcast(out, out_dtype) if out_dtype in LOW_PRECISION else out

    return wrapper  # type: ignore[return-value]
