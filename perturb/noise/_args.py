"""Argument handling shared by the noise classes (private).

Conversions and checks at the boundary of :mod:`perturb.noise`: real parameters, the
arguments of ``sample``, uniforms for inversion, and the zero-gradient helper of piecewise
constant functionals.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from .._validation import (compiling_now, unreadable, check_device, check_generator, check_value,
                           validation_enabled)


def _real(value: object, name: str) -> float:
    """A finite real number (Python number or 0-dim tensor) as float; ValueError otherwise."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a real number, got a tensor of shape "
                             f"{tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _as_tensor(x: object, name: str) -> torch.Tensor:
    """Floating tensor view of ``x`` (numbers and integer tensors become the default dtype)."""
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x, dtype=torch.get_default_dtype())
    if not x.is_floating_point():
        if x.is_complex():
            raise ValueError(f"{name} must be real, got dtype {x.dtype}")
        x = x.to(torch.get_default_dtype())
    return x


def _check_unit(u: object) -> torch.Tensor:
    """``u`` as a floating tensor; ValueError (while validation is on) unless 0 <= u <= 1."""
    u = _as_tensor(u, "u")
    if validation_enabled() and u.numel():
        ok = (u >= 0) & (u <= 1)
        check_value(ok.all(), "u must lie in [0, 1] (and not be NaN)",
                    lambda: repr(u[~ok].flatten()[0].item()))
    return u


def _sample_args(shape: object, generator: torch.Generator | None,
                 device: torch.device | str | None,
                 dtype: torch.dtype | None) -> tuple[torch.Size, torch.device | str | None,
                                                      torch.dtype]:
    """Normalise the arguments of ``sample``; the device defaults to the generator's."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        # ``shape`` is checked here at run time: anything not iterable is the ValueError below
        dims: tuple[Any, ...] = tuple(shape)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"shape must be a tuple of ints or a torch.Size, got {shape!r}") from None
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0 for s in dims):
        raise ValueError(f"shape must contain non-negative ints, got {shape!r}")
    if dtype is None:
        dtype = torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    check_generator(generator)
    if device is None and generator is not None:
        device = generator.device
    elif device is not None:
        device = check_device(device)
    return torch.Size(int(s) for s in dims), device, dtype


def _default_device() -> torch.device:
    """Where a factory function without ``device=`` allocates."""
    get = getattr(torch, "get_default_device", None)  # torch >= 2.3
    return get() if get is not None else torch.device("cpu")




def _draw_open(shape: torch.Size, generator: torch.Generator | None,
               device: torch.device | str | None, dtype: torch.dtype) -> torch.Tensor:
    u = torch.rand(shape, generator=generator, device=device, dtype=dtype)
    fi = torch.finfo(dtype)  # no cache: a cache filled on first use recompiles compiled callers
    if unreadable(u):                       # vmap: clamp_ has no batch rule
        return u.clamp(fi.tiny, 1.0 - fi.eps / 2)
    return u.clamp_(fi.tiny, 1.0 - fi.eps / 2)


#: the same draw, run eagerly under ``torch.compile`` (a generator cannot enter the graph)
_draw_open_eager = torch.compiler.disable(_draw_open)


def _open_uniform(shape: torch.Size, generator: torch.Generator | None,
                  device: torch.device | str | None, dtype: torch.dtype) -> torch.Tensor:
    """U(0, 1) draws clamped into the open interval [tiny, 1 − eps/2] so no transform gives inf.

    Under ``torch.compile`` a ``torch.Generator`` cannot enter the graph (dynamo has no proxy
    for it): the draw with a generator then runs eagerly, one graph break at this call (see
    docs/core.md, "torch.compile and torch.func")."""
    if generator is not None and compiling_now():
        return _draw_open_eager(shape, generator, device, dtype)
    return _draw_open(shape, generator, device, dtype)


def _zero_grad_like(value: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``value`` (same shape as ``theta``) as a function of ``theta`` with zero derivative.

    Used where the true derivative is zero almost everywhere (a piecewise-constant function of
    θ), so that Jacobian code sees a zero and not a detached output.
    """
    if not theta.requires_grad:
        return value
    return torch.where(torch.ones_like(value, dtype=torch.bool), value, theta)


def check_noise(noise: object, name: str = "noise") -> None:
    """ValueError unless ``noise`` can be drawn from: a noise *instance* (anything with
    ``sample(shape, generator=, device=, dtype=)``). A noise class, e.g. ``Gumbel`` for
    ``Gumbel()``, gets a message saying what to pass."""
    if isinstance(noise, type):
        hint = f"{noise.__name__}()" if callable(getattr(noise, "sample", None)) else "Gumbel()"
        raise ValueError(f"{name} must be a noise instance, got the class {noise.__name__}; "
                         f"pass {name}={hint}")
    if not callable(getattr(noise, "sample", None)):
        raise ValueError(f"{name} must be a perturb Noise (e.g. Gumbel(), Normal(scale=0.5)) or "
                         f"an object with sample(shape, generator=, device=, dtype=), "
                         f"got {noise!r}")


def draw(noise: Any, shape: torch.Size | tuple[int, ...], generator: torch.Generator | None,
         device: torch.device | str | None, dtype: torch.dtype,
         name: str = "noise") -> torch.Tensor:
    """``noise.sample(shape, ...)``, checked: ``noise`` a noise instance (:func:`check_noise`),
    the result a tensor of exactly ``shape`` (a user noise that ignores the requested shape
    would otherwise broadcast silently against the scores)."""
    check_noise(noise, name)
    eps = noise.sample(shape, generator=generator, device=device, dtype=dtype)
    if not isinstance(eps, torch.Tensor) or eps.shape != torch.Size(shape):
        got = tuple(eps.shape) if isinstance(eps, torch.Tensor) else type(eps).__name__
        raise ValueError(f"{name}.sample(shape) must return a tensor of the requested shape "
                         f"{tuple(shape)}, got {got} from {noise!r}")
    return eps
