r"""Compiled, fused Gumbel-/Gaussian-softmax for CUDA (``torch.compile``, Triton kernels).

The eager composition of :func:`perturb.relax` on the simplex runs one kernel per
operation and streams the whole tensor through memory each time (Gumbel: ``exponential_``,
``log``, ``sub``, ``div``, ``softmax``; backward ``_softmax_backward_data`` and ``div``). Here
the noise is drawn eagerly, with the caller's generator and exactly the draw that
:meth:`perturb.noise.Gumbel.sample` (``E ~ Exp(1)``) or :meth:`perturb.noise.Normal.sample`
(``ε = σZ``) makes, and everything after it is one compiled function each way:

.. math::

    u = \theta - \beta \log E \;\;\text{(Gumbel)} \quad\text{or}\quad u = \theta + \varepsilon
    \;\;\text{(Gaussian)}, \qquad y = \mathrm{softmax}(u/\tau), \qquad
    \bar\theta = y \odot (g - \langle g, y\rangle)/\tau ,

with ``hard=True`` returning ``y + (onehot(argmax u) − y)`` (straight-through) and the same
backward. Memory traffic per element in float32: 4 B to write the noise, 12 B forward (read θ
and the noise, write y), 12 B backward (read g and y, write θ̄), 28 B in all, against about
68 B for the eager ops (and for ``torch.nn.functional.gumbel_softmax``).

The same generator state gives the same noise as the eager path, so results agree with it up to
float rounding (the kernel evaluates the log, the division and the row reductions in its own
order; in float16/bfloat16 it also keeps float32 intermediates), not bitwise. It is used when
all of the following hold; otherwise :func:`relax_softmax` returns None and the caller runs the
eager composition:

- the scores are a plain CUDA tensor (or ``nn.Parameter``) of a floating dtype, not wrapped by a
  ``torch.func`` transform, and Triton is importable;
- the noise is exactly :class:`~perturb.noise.Gumbel` or :class:`~perturb.noise.Normal`, τ is
  a Python number (a tensor τ runs eagerly), there is no ``n_samples`` and the solver's own
  backward mode is asked for (``"auto"``/``"analytic"``);
- the call is not already being traced by ``torch.compile`` or ``torch.jit`` (there the outer
  compiler sees and fuses the eager operations);
- the switch is on: :func:`set_compiled` (``PERTURB_COMPILE=0`` in the environment turns it off
  at import).

The value check of the scores stays outside the kernels (:mod:`perturb._validation`: on CUDA a
device-side assertion, no host synchronisation). The first call of each variant (soft/hard ×
Gumbel/Gaussian, and the backward) compiles, in seconds. The number of categories n (the last
dim) is kept static, so that a row is reduced in one pass; the first change of the batch dims
or of τ recompiles that variant once with them symbolic (dynamo's automatic dynamic shapes and
unspecialised floats), later changes reuse it; a new n, rank or dtype compiles anew. Any exception
raised by the compiled functions switches the path off for the rest of the process with one
warning, and that call is recomputed eagerly from the same noise.
"""
from __future__ import annotations

import numbers
import warnings
from typing import Any, Callable

import torch

from perturb._settings import COMPILED, Switch
from perturb._validation import check_generator
from perturb.noise import Gumbel, Normal

__all__ = ["set_compiled", "compiled_enabled", "relax_softmax"]

_ENABLED = COMPILED
_FAILED = False  # set by the first failure of a compiled call: eager from then on
_DEVICES = ("cuda",)  # device types that take the compiled path (tests add "cpu")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_COMPILED: dict[str, Callable] = {}
_HAS_TRITON: bool | None = None


def compiled_enabled() -> bool:
    """Whether the compiled path may run (the switch is on and it has not failed)."""
    return _ENABLED.value and not _FAILED


class set_compiled(Switch):
    """Switch the compiled CUDA path on or off: a plain call or a context manager, like
    :func:`perturb.set_validation`; the one-switch spelling of
    ``perturb.settings(compiled=...)``.

    Off, :func:`perturb.gumbel_softmax`, :func:`perturb.gaussian_softmax` and
    :func:`perturb.relax` run the eager composition everywhere. The environment variable
    ``PERTURB_COMPILE=0`` sets the default to off.
    """

    flag = _ENABLED


def _has_triton() -> bool:
    global _HAS_TRITON
    if _HAS_TRITON is None:
        try:
            from torch.utils._triton import has_triton
            _HAS_TRITON = bool(has_triton())
        except Exception:  # an old torch or a broken install: no compiled path
            _HAS_TRITON = False
    return _HAS_TRITON


def _being_traced() -> bool:
    compiling = getattr(torch.compiler, "is_compiling", None)
    return bool((compiling is not None and compiling()) or torch.jit.is_scripting()
                or torch.jit.is_tracing())


def _applies(theta: torch.Tensor, noise: object, tau: object) -> bool:
    """Whether the compiled path runs; on CPU it returns after one attribute read."""
    if theta.device.type not in _DEVICES or not _ENABLED.value or _FAILED:
        return False
    if type(noise) not in (Gumbel, Normal) or isinstance(tau, bool) \
            or not isinstance(tau, numbers.Real):
        return False
    if theta.dtype not in _DTYPES or type(theta) not in (torch.Tensor, torch.nn.Parameter) \
            or theta.ndim == 0 or theta.numel() == 0:
        return False
    if _being_traced() or torch._C._functorch.is_functorch_wrapped_tensor(theta):
        return False
    return theta.device.type != "cuda" or _has_triton()


# --------------------------------------------------------------------------------------------
# the two functions that are compiled (pure; run eagerly as the fallback)
# --------------------------------------------------------------------------------------------

def _static_categories(*tensors: torch.Tensor) -> None:
    """While compiling, specialise on n = size(-1): static row reductions (one pass over a row
    held in registers) whatever the batch dims do; no-op when run eagerly."""
    if _being_traced():
        for t in tensors:
            torch._dynamo.mark_static(t, t.ndim - 1)


def _forward(theta: torch.Tensor, noise: torch.Tensor, gumbel: bool, scale: float, tau: float,
             hard: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, soft sample): u = θ − β log E or θ + ε, y = softmax(u/τ) over the last dim.

    ``noise`` is E ~ Exp(1) (Gumbel, scale β) or the Gaussian draw ε itself. The value is y,
    or with ``hard`` the straight-through value y + (onehot(argmax u) − y).
    """
    _static_categories(theta, noise)
    u = theta - torch.log(noise) * scale if gumbel else theta + noise
    y = torch.softmax(u / tau, dim=-1)
    if not hard:
        return y, y
    index = u.argmax(dim=-1, keepdim=True)  # the first maximum on ties, as torch.argmax
    onehot = (torch.arange(u.shape[-1], device=u.device) == index).to(y.dtype)
    return y + (onehot - y), y  # the value of straight_through(onehot, y)


# one function (code object) per variant, so that each has its own dynamo cache: a shape, rank
# or dtype change recompiles one variant, and the variants do not share the recompile limit
def _soft_gumbel(theta, noise, scale, tau):
    return _forward(theta, noise, True, scale, tau, False)


def _soft_gaussian(theta, noise, scale, tau):
    return _forward(theta, noise, False, scale, tau, False)


def _hard_gumbel(theta, noise, scale, tau):
    return _forward(theta, noise, True, scale, tau, True)


def _hard_gaussian(theta, noise, scale, tau):
    return _forward(theta, noise, False, scale, tau, True)


_FORWARDS = {(False, True): _soft_gumbel, (False, False): _soft_gaussian,
             (True, True): _hard_gumbel, (True, False): _hard_gaussian}


def _backward(y: torch.Tensor, grad: torch.Tensor, tau: float) -> torch.Tensor:
    """θ̄ = y ⊙ (g − ⟨g, y⟩)/τ: the softmax vector–Jacobian product, then ∂(u/τ)/∂u."""
    _static_categories(y, grad)
    return y * (grad - (grad * y).sum(dim=-1, keepdim=True)) / tau


def _run(fn: Callable, *args):
    """``torch.compile(fn)(*args)``; on any exception warn once and stay eager from then on.

    With grad mode on (a backward with ``create_graph=True``) ``fn`` runs eagerly, so that the
    result is differentiable again (double backward).
    """
    global _FAILED
    if not _FAILED and not torch.is_grad_enabled():
        try:
            compiled = _COMPILED.get(fn.__name__)
            if compiled is None:
                compiled = _COMPILED[fn.__name__] = torch.compile(fn, fullgraph=True)
            return compiled(*args)
        except Exception as exc:  # no compiler, an inductor or Triton error: fall back
            _FAILED = True
            warnings.warn(f"perturb: the compiled softmax path failed ({type(exc).__name__}: "
                          f"{str(exc)[:300]}); using the eager path from now on",
                          RuntimeWarning, stacklevel=3)
    return fn(*args)


# --------------------------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------------------------

class _FusedSoftmax(torch.autograd.Function):
    """y = softmax((θ + ε)/τ) in one compiled kernel; backward :func:`_backward` in another."""

    @staticmethod
    def forward(theta, noise, gumbel, scale, tau):
        return _run(_FORWARDS[False, gumbel], theta, noise, scale, tau)[0]

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.tau = inputs[4]
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        (y,) = ctx.saved_tensors
        return _run(_backward, y, grad, ctx.tau), None, None, None, None


class _FusedHardSoftmax(torch.autograd.Function):
    """Straight-through: value onehot(argmax u), gradient that of y (:class:`_FusedSoftmax`).

    Returns (value, y), both with y's Jacobian; only the value reaches the user, y is saved for
    the backward (and keeps its graph, for double backward).
    """

    @staticmethod
    def forward(theta, noise, gumbel, scale, tau):
        return _run(_FORWARDS[True, gumbel], theta, noise, scale, tau)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.tau = inputs[4]
        ctx.set_materialize_grads(False)  # y's incoming gradient is None except in double backward
        ctx.save_for_backward(output[1])

    @staticmethod
    def backward(ctx, grad, grad_soft):
        if not ctx.needs_input_grad[0] or (grad is None and grad_soft is None):
            return None, None, None, None, None
        grad = grad_soft if grad is None else grad if grad_soft is None else grad + grad_soft
        (y,) = ctx.saved_tensors
        return _run(_backward, y, grad, ctx.tau), None, None, None, None


def relax_softmax(theta: torch.Tensor, noise: Any, tau: float | torch.Tensor, hard: bool,
                  generator: torch.Generator | None) -> torch.Tensor | None:
    """``relax(θ, Simplex(), noise, Entropy(), τ, hard, generator=generator)`` fused, or None.

    None (nothing drawn, the generator untouched) when the compiled path does not apply (see
    the module docstring); the caller then runs the eager composition. ``theta`` and ``tau``
    are assumed checked.

    Shape: ``(*batch, n)`` -> same.
    """
    if not _applies(theta, noise, tau):
        return None
    check_generator(generator)
    gumbel = type(noise) is Gumbel
    if gumbel:
        eps = Gumbel._exponential(theta.shape, generator, theta.device, theta.dtype)
    else:
        eps = noise.sample(theta.shape, generator=generator, device=theta.device,
                           dtype=theta.dtype)
    args = (theta, eps, gumbel, float(noise.scale) if gumbel else 1.0, float(tau))
    if hard:
        return _FusedHardSoftmax.apply(*args)[0]
    return _FusedSoftmax.apply(*args)
