"""Argument checks shared by every public entry point.

Two tiers, as in ``torch.distributions``: structural checks (ndim, square, ``tau > 0``,
``k <= n``) always run and are cheap; value checks that need a pass over the data (finite
scores, membership of a structure) run only while validation is enabled, which is the
default. Switch them off in hot loops with :func:`set_validation`::

    with perturb.set_validation(False):
        ...

Checks of tensor values never stall a CUDA device. On the CPU (and other non-CUDA devices) a
bad value raises ``ValueError`` at once, naming the argument. On CUDA the same condition is
reduced on the device and handed to ``torch._assert_async`` with a message naming the
argument: the call returns without waiting, and a bad value surfaces as a device-side
assertion (a ``RuntimeError`` "device-side assert triggered" at the next synchronisation, the
message printed on stderr). As after any device-side assert, the CUDA context is unusable
afterwards; to get a recoverable ``ValueError`` while debugging, run the call on CPU tensors.

Inside ``torch.compile`` a host read would break the graph, so value checks are traced as
``torch._assert_async`` there too (on any device): the compiled graph keeps the check without a
graph break, and a bad value raises a ``RuntimeError`` carrying the same message. Shape, dtype
and argument checks are plain Python and are guarded by the compiler as usual.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from typing import Any, Callable, Sequence

import torch

from perturb._settings import VALIDATE, Switch

_VALIDATION = VALIDATE
# devices whose value checks are device-side asserts instead of host reads (tests add "cpu")
_ASYNC_DEVICES = ("cuda",)


def validation_enabled() -> bool:
    """Whether the value checks (finiteness, membership) currently run."""
    return _VALIDATION.value


class set_validation(Switch):
    """Switch the value checks on or off (structural checks always run), process-wide; the
    one-switch spelling of ``perturb.settings(validate=...)``.

    Like ``torch.set_grad_enabled``: a plain call switches at once and stays switched; used as
    a context manager it restores the previous setting on exit::

        perturb.set_validation(False)          # from here on
        with perturb.set_validation(False):    # only inside the block
            ...
    """

    flag = _VALIDATION


def _assert_on_device(ok: torch.Tensor, message: str) -> None:
    """``torch._assert_async(ok, message)``: no host synchronisation (see the module docstring).

    The message is cut to the 255 characters a CUDA device assert can carry.
    """
    torch._assert_async(ok, message[:250])


def compiling_now() -> bool:
    """Whether ``torch.compile`` is tracing the caller (a host read there is a graph break)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return compiler.is_compiling()
    return torch._dynamo.is_compiling()  # torch < 2.3


def traced(t: torch.Tensor) -> bool:
    """Whether a host read of ``t`` is impossible here: it would break a ``torch.compile``
    graph, or fail inside a ``torch.func`` transform. Data-dependent shortcuts take their
    general path there, and value checks are traced or skipped."""
    return compiling_now() or unreadable(t)


def reads_stall(t: torch.Tensor) -> bool:
    """Whether reading a value of ``t`` on the host would stall its device (CUDA), break a
    ``torch.compile`` graph or fail inside a ``torch.func`` transform: there, value checks
    become device-side asserts (``torch._assert_async``; skipped inside ``torch.func``) and
    data-dependent shortcuts take their general path."""
    return t.device.type in _ASYNC_DEVICES or traced(t)


def unreadable(t: torch.Tensor) -> bool:
    """Inside a ``torch.func`` transform (vmap, grad, jacrev), or a meta tensor: values cannot
    be read, so value checks are skipped there (the structural checks still run)."""
    if t.device.type == "meta":     # shape and dtype only (a caller's structural-only check)
        return True
    if compiling_now():  # dynamo traces through functorch itself; no wrapped tensors reach here
        return False
    return torch._C._functorch.is_functorch_wrapped_tensor(t)


def check_value(ok: torch.Tensor, message: str,
                detail: Callable[[], str] | None = None) -> None:
    """ValueError(``message``) unless the boolean scalar tensor ``ok`` holds.

    The one way a value check reads its verdict: a host read on the CPU (and other non-CUDA
    devices); ``torch._assert_async`` on CUDA, so that the check never stalls the device (module
    docstring). Inside ``torch.func`` transforms (vmap, grad) the verdict cannot be read and the
    check is skipped. Callers test :func:`validation_enabled` first. ``detail()``, called only
    where the value can be read without a stall, adds the offending value to the message.
    """
    if unreadable(ok):
        return
    if reads_stall(ok):
        _assert_on_device(ok, "perturb: " + message)
        return
    if not bool(ok):
        raise ValueError(message + (f", got {detail()}" if detail is not None else ""))


def check_positive(value: float | torch.Tensor, name: str) -> None:
    """Raise ValueError unless ``value`` (a number or tensor) is finite and > 0 everywhere.

    A CUDA tensor is checked on the device, without a host synchronisation (module docstring).
    """
    if isinstance(value, torch.Tensor):
        if value.is_complex() or not (value.is_floating_point() or value.dtype in
                                      (torch.int32, torch.int64)):
            raise ValueError(f"{name} must be a real number, got a tensor of dtype {value.dtype}")
        with torch.no_grad():
            good = torch.isfinite(value) & (value > 0)
        check_value(good.all(), f"{name} must be finite and > 0",
                    lambda: repr(value[~good].flatten()[0].item()))
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a positive real number, got {value!r}")
    if not (math.isfinite(float(value)) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def check_real(value: float, name: str, *, low: float | None = None,
               high: float | None = None) -> float:
    """A finite real number (not a bool) in [low, high]; returns it as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"in [{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return value


def check_tau(tau: float | torch.Tensor, name: str = "tau") -> None:
    """Temperatures must be finite and strictly positive."""
    check_positive(tau, name)


def broadcasts_to(shape: torch.Size | tuple[int, ...], target: torch.Size | tuple[int, ...]
                  ) -> bool:
    """Whether ``shape`` broadcasts to exactly ``target`` (without enlarging it)."""
    try:
        return torch.broadcast_shapes(shape, target) == torch.Size(target)
    except RuntimeError:
        return False


def scale_by_tau(w: torch.Tensor, tau: float | torch.Tensor, event_dim: int) -> torch.Tensor:
    """w / τ, where a tensor τ holds one temperature per problem: it broadcasts against the
    batch dims ``(*batch)`` of ``w`` (shape ``(*batch, *event)`` with ``event_dim`` event dims).

    Returns ``w`` itself when τ is the number 1. Raises ValueError when a tensor τ does not
    broadcast to the batch shape (instead of silently broadcasting into the event dims).
    """
    if isinstance(tau, torch.Tensor):
        t = tau.to(dtype=w.dtype, device=w.device)
        if t.ndim == 0:
            return w / t
        t = t.reshape(*t.shape, *([1] * event_dim))
        if not broadcasts_to(t.shape, w.shape):
            raise ValueError(f"tau of shape {tuple(tau.shape)} must broadcast against the batch "
                             f"shape {tuple(w.shape[:w.ndim - event_dim])} of the scores "
                             f"(shape {tuple(w.shape)})")
        return w / t
    return w if tau == 1 else w / tau


def check_choice(value: str, choices: Sequence[str], name: str) -> None:
    """Raise ValueError listing the accepted values when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported here; accepted values: "
                         + ", ".join(repr(c) for c in choices))


def check_dim(x: torch.Tensor, dim: int, name: str = "dim") -> int:
    """Normalise ``dim`` against ``x.ndim``; ValueError when it is out of range."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ValueError(f"{name} must be an int, got {dim!r}")
    if x.ndim == 0 or not -x.ndim <= dim < x.ndim:
        raise ValueError(f"{name}={dim} is out of range for a tensor with {x.ndim} dims "
                         f"(shape {tuple(x.shape)})")
    return dim % x.ndim


def check_floating_tensor(x: Any, name: str) -> None:
    """ValueError naming ``name`` unless ``x`` is a tensor of a floating dtype."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype (float32/float64), got {x.dtype}; "
                         f"convert with {name}.float()")


def check_score_shape(w: torch.Tensor, name: str = "w", *, min_ndim: int = 1,
                      square: bool = False) -> None:
    """The structural half of :func:`check_scores` (type, dtype, ndim, square, a non-empty event:
    the last ``min_ndim`` dims); always runs."""
    check_floating_tensor(w, name)
    if w.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dims, got shape {tuple(w.shape)}")
    if square and w.shape[-1] != w.shape[-2]:
        raise ValueError(f"{name} must be square in its last two dims (*batch, n, n), "
                         f"got shape {tuple(w.shape)}")
    if min_ndim and 0 in w.shape[w.ndim - min_ndim:]:
        raise ValueError(f"{name} has an empty event: its last {min_ndim} dim(s) must be "
                         f"non-empty (n >= 1), got shape {tuple(w.shape)}; an empty batch "
                         f"(size 0 in a leading dim) is allowed and gives an empty result")


def check_finite(w: torch.Tensor, name: str = "w", *, allow_neg_inf: bool = False) -> None:
    """The value half of :func:`check_scores`: no NaN, no ±inf (``-inf`` allowed on request).

    Runs whatever the validation switch says (callers test :func:`validation_enabled`). One
    reduction over ``w`` and no temporaries: with ``allow_neg_inf`` the maximum (NaN-propagating,
    so it is < +inf exactly when there is neither NaN nor +inf), otherwise the sum (a finite sum
    implies finite entries; the elementwise check runs only when the sum is not finite, to tell
    overflow from bad values and NaN from inf in the message).

    CPU and other non-CUDA devices: one host read of that scalar, ValueError naming ``name``.
    CUDA and inside ``torch.compile``: no host read; ``torch._assert_async`` (see the module
    docstring), on the maximum with ``allow_neg_inf``, else on ``isfinite(w).all()`` (a sum
    could overflow, and a device assert cannot be taken back).
    """
    if not w.numel() or unreadable(w):
        return
    if reads_stall(w):
        # the assert runs outside no_grad: a compiled graph that fails inside a grad-mode
        # region does not restore the mode (seen with torch 2.13)
        with torch.no_grad():
            ok = (w.amax() < math.inf) if allow_neg_inf else torch.isfinite(w).all()
        _assert_on_device(ok, f"perturb: {name} contains NaN or "
                          + ("+inf values (-inf masks are allowed)" if allow_neg_inf
                             else "infinite values; scores must be finite"))
        return
    with torch.no_grad() if w.requires_grad else contextlib.nullcontext():  # no autograd node
        if allow_neg_inf:
            if float(w.amax()) < math.inf:
                return
            bad = torch.isnan(w) | (w == math.inf)
        else:
            if math.isfinite(float(w.sum())):
                return
            bad = ~torch.isfinite(w)
        if bool(bad.any()):
            kind = "NaN" if bool(torch.isnan(w).any()) else "infinite"
            raise ValueError(f"{name} contains {kind} values; scores must be finite"
                             + (" (-inf is allowed to mask entries)" if allow_neg_inf else ""))


def check_masked_scores(w: torch.Tensor, name: str = "w", dim: int = -1) -> None:
    """The value check of scores where ``-inf`` masks entries and one entry per slice along
    ``dim`` must be chosen (a simplex): no NaN or ``+inf``, and no slice that is all ``-inf``
    (it has no distribution: softmax would return NaN). The maximum along ``dim`` (NaN-
    propagating) is finite exactly when its slice is fine; on the CPU the sum of those maxima
    is read (finite sum ⇒ all fine; the precise check runs only when it is not, to tell an
    overflowing sum from a bad slice): 3 dispatched ops and one host read. On CUDA a
    device-side assert on ``isfinite(max).all()``."""
    if not w.numel() or unreadable(w):
        return
    with torch.no_grad():
        top = w.amax(dim)
    if reads_stall(top):  # the assert outside no_grad: see check_finite
        _assert_on_device(torch.isfinite(top).all(),
                          f"perturb: {name} contains NaN or +inf, or a slice along dim "
                          f"{dim} whose entries are all -inf")
        return
    with torch.no_grad():
        if math.isfinite(float(top.sum())) or bool(torch.isfinite(top).all()):
            return
    check_finite(w, name, allow_neg_inf=True)               # NaN or +inf: says which
    raise ValueError(f"{name} has a slice along dim {dim} whose entries are all -inf: nothing "
                     f"can be chosen there (its softmax is undefined); mask fewer entries")


def check_scores(w: torch.Tensor, name: str = "w", *, min_ndim: int = 1,
                 square: bool = False, allow_neg_inf: bool = False) -> None:
    """Check a score tensor: a floating tensor of at least ``min_ndim`` dims, finite values.

    :func:`check_score_shape` always, then :func:`check_finite` while validation is enabled.

    Args:
        w: the scores.
        name: the argument name used in messages.
        min_ndim: the number of trailing event dims the structure needs.
        square: require the last two dims to be equal (``(*batch, n, n)``).
        allow_neg_inf: ``-inf`` marks a forbidden entry (masks) and is accepted; NaN and ``+inf``
            never are.

    Raises:
        ValueError: not a tensor, integer/complex dtype, too few dims, not square, NaN/inf values
            (the value checks only while validation is enabled; on CUDA they are raised
            asynchronously as a device-side assertion, see the module docstring).
    """
    check_score_shape(w, name, min_ndim=min_ndim, square=square)
    if _VALIDATION.value:
        check_finite(w, name, allow_neg_inf=allow_neg_inf)


def check_int(value: int, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """An integer within ``[low, high]``; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return int(value)


def check_device(device: object, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device``; ValueError naming the argument for anything else,
    and for a CUDA device on a machine without CUDA (torch's own error there is an
    AssertionError from deep inside the first allocation)."""
    if isinstance(device, bool) or not isinstance(device, (torch.device, str, int)):
        raise ValueError(f"{name} must be a torch.device, a string such as 'cpu' or 'cuda:0', "
                         f"or a CUDA index, got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:  # torch's message lists every device type
        raise ValueError(f"{name}={device!r} is not a device: use 'cpu', 'cuda', 'cuda:0', "
                         f"... or a torch.device") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}={device!r}: CUDA is not available on this machine "
                         f"(torch.cuda.is_available() is False); use device='cpu'")
    return dev


def check_generator(generator: object, name: str = "generator") -> None:
    """ValueError unless ``generator`` is None or a ``torch.Generator``."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"{name} must be a torch.Generator (or None), got "
                         f"{type(generator).__name__}")
