r"""Simplex solvers: softmax, sparsemax, and the stochastic softmaxes built on them.

On the probability simplex Δ = conv{e_1, ..., e_n} the regularized argmax of
:mod:`perturb.core` has closed forms:

.. math::

    \arg\max_{x \in \Delta} \langle w, x\rangle - \tau \sum_i x_i \log x_i
        &= \mathrm{softmax}(w / \tau)                       &&\text{(Entropy, ExpFamilyEntropy)} \\
    \arg\max_{x \in \Delta} \langle w, x\rangle - \tfrac{\tau}{2} \|x\|^2
        &= \mathrm{sparsemax}(w / \tau) = [w/\tau - \nu]_+  &&\text{(SquaredNorm)}

where ν is the threshold making the clipped vector sum to one (Martins & Astudillo 2016). On the
simplex, the exponential-family entropy A* (the conjugate of A(w) = log Σ_i e^{w_i}) is the
negative entropy itself, so that pair is softmax too.

Both solvers are registered with two backward modes: ``"analytic"`` (closed-form Jacobians,
below) and ``"unroll"`` (plain autograd through the torch operations, a reference).

- softmax: ∂y/∂z = diag(y) − y yᵀ, so the vector–Jacobian product is y ⊙ (g − ⟨g, y⟩)
  (ATen's own softmax backward computes exactly this, so ``"analytic"`` is ``torch.softmax``
  and ``"unroll"`` differentiates exp/sum/div instead);
- sparsemax: ∂p/∂z = diag(s) − s sᵀ/|S| with s the indicator of the support S = {i: p_i > 0},
  so the product is g_i − mean_{j∈S} g_j on S and 0 elsewhere.

The temperature is applied outside the Functions (z = w/τ), so gradients with respect to a tensor
τ flow through autograd.

:func:`gumbel_softmax` and :func:`gaussian_softmax` are :func:`perturb.relax` on the simplex
with Gumbel resp. Gaussian noise: the same generator state gives the same sample as ``relax``.

References:
    Martins & Astudillo, "From Softmax to Sparsemax", ICML 2016, arXiv:1602.02068.
    Jang, Gu & Poole, "Categorical Reparameterization with Gumbel-Softmax", ICLR 2017,
    arXiv:1611.01144. Maddison, Mnih & Teh, "The Concrete Distribution", ICLR 2017,
    arXiv:1611.00712. Paulus et al., "Gradient Estimation with Stochastic Softmax Tricks",
    NeurIPS 2020, arXiv:2006.08063.
"""
from __future__ import annotations

import warnings

import torch

from perturb import _fused, _validation
from perturb._fused import set_compiled
from perturb._deprecation import renamed
from perturb._validation import (
    check_choice,
    check_dim,
    check_positive,
    check_tau,
    check_value,
    scale_by_tau,
    validation_enabled,
)
from perturb.noise import Gumbel, Normal
from perturb.regularizers import Entropy, ExpFamilyEntropy, Regularizer, SquaredNorm
from perturb._engine import register_fused_relax, regularized_argmax_checked, relax_checked
from perturb.structures import Simplex, register_solver

__all__ = ["softmax", "sparsemax", "sparsemax_loss", "gumbel_softmax", "gaussian_softmax",
           "set_compiled"]

_SIMPLEX, _ENTROPY, _GUMBEL = Simplex(), Entropy(), Gumbel()  # immutable, shared


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def _check_logits(x: torch.Tensor, name: str, dim: int = -1) -> None:
    """Structural checks always; the values (one reduction along ``dim``) while validation is on.

    −inf is accepted: it masks a category (probability exactly 0, gradient 0), as in
    ``torch.softmax``; a slice along ``dim`` that is entirely −inf has no distribution and is
    refused (``torch.softmax`` returns NaN there).
    """
    _validation.check_score_shape(x, name, min_ndim=1)
    if _validation.validation_enabled():
        _validation.check_masked_scores(x, name, check_dim(x, dim, "dim"))


# --------------------------------------------------------------------------------------------
# softmax
# --------------------------------------------------------------------------------------------

def _softmax_backward(y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Vector–Jacobian product of y = softmax(z) over the last dim: y ⊙ (g − ⟨g, y⟩).

    The Jacobian diag(y) − y yᵀ is the Hessian of log Σ_i e^{z_i}. Evaluated by ATen's fused
    kernel for exactly this product, which is what ``torch.softmax``'s own backward runs: the
    ``"analytic"`` mode therefore uses ``torch.softmax`` directly (no Python in the backward).
    """
    return torch.ops.aten._softmax_backward_data(grad.contiguous(), y, -1, y.dtype)


def _softmax_unrolled(z: torch.Tensor) -> torch.Tensor:
    """softmax(z) over the last dim from elementary ops (the ``"unroll"`` reference)."""
    e = torch.exp(z - z.amax(dim=-1, keepdim=True).detach())  # the shift cancels exactly
    return e / e.sum(dim=-1, keepdim=True)


@register_solver(Simplex, Entropy, backward=("analytic", "unroll"),
                 description="softmax(w/τ)")
def _solve_softmax(w: torch.Tensor, structure: Simplex, regularizer: Regularizer,
                   tau: float | torch.Tensor, backward: str) -> torch.Tensor:
    z = scale_by_tau(w, tau, 1)
    if backward == "unroll":
        return _softmax_unrolled(z)
    return torch.softmax(z, dim=-1)  # backward: _softmax_backward, in ATen


register_solver(Simplex, ExpFamilyEntropy, backward=("analytic", "unroll"),
                description="softmax(w/τ) (A* of log Σ e^w is the negative entropy)")(
    _solve_softmax)
# relax on the simplex with Gumbel/Normal noise: one compiled kernel each way on CUDA
register_fused_relax(_solve_softmax, _fused.relax_softmax)


# --------------------------------------------------------------------------------------------
# sparsemax
# --------------------------------------------------------------------------------------------

def _sparsemax_forward(z: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of z onto the simplex along the last dim, by sorting (exact).

    With z sorted decreasingly, the support size is k* = max{k : 1 + k z_(k) > Σ_{j≤k} z_(j)} and
    the threshold ν = (Σ_{j≤k*} z_(j) − 1)/k*; p = [z − ν]_+. O(n log n) per row. Written with
    differentiable torch operations, so autograd through it is the ``"unroll"`` backward.
    """
    n = z.shape[-1]
    # shifting by the max changes nothing but keeps cumulative sums small (precision at 1e7)
    z = z - z.amax(dim=-1, keepdim=True).detach()
    zs = torch.sort(z, dim=-1, descending=True).values
    cs = zs.cumsum(dim=-1) - 1
    k = torch.arange(1, n + 1, dtype=z.dtype, device=z.device)
    support = k * zs > cs  # a prefix of True (k = 1 always qualifies)
    k_star = support.sum(dim=-1, keepdim=True).clamp_min(1)
    nu = cs.gather(-1, k_star - 1) / k_star.to(z.dtype)
    return torch.relu(z - nu)  # relu: zero gradient at the kink, like the analytic support p > 0


def _sparsemax_backward(p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Vector–Jacobian product of p = sparsemax(z): g_i − mean_{j∈S} g_j on S = {p > 0}, else 0."""
    s = (p > 0).to(grad.dtype)
    mean = (grad * s).sum(dim=-1, keepdim=True) / s.sum(dim=-1, keepdim=True)
    return s * (grad - mean)


class _Sparsemax(torch.autograd.Function):
    r"""p = sparsemax(z) = [z − ν]_+ over the last dim; backward :func:`_sparsemax_backward`.

    The Jacobian is ``diag(s) − s sᵀ/|S|`` with s the indicator of the support (Martins & Astudillo
    2016, Prop. 2), defined wherever no coordinate sits exactly on the threshold. It is
    symmetric, so the forward-mode product (``jvp``, for ``torch.func.jacfwd``) is the same
    formula applied to the tangent.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(z):
        return _sparsemax_forward(z)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def jvp(ctx, z_dot):
        (p,) = ctx.saved_tensors
        return _sparsemax_backward(p, z_dot)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None
        (p,) = ctx.saved_tensors
        return _sparsemax_backward(p, grad)


@register_solver(Simplex, SquaredNorm, backward=("analytic", "unroll"),
                 description="sparsemax(w/τ) (sort-based Euclidean projection)")
def _solve_sparsemax(w: torch.Tensor, structure: Simplex, regularizer: Regularizer,
                     tau: float | torch.Tensor, backward: str) -> torch.Tensor:
    z = scale_by_tau(w, tau, 1)
    if backward == "unroll":
        return _sparsemax_forward(z)
    return _Sparsemax.apply(z)


# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------

def _along_dim(fn, x: torch.Tensor, dim: int, name: str):
    """Apply ``fn`` (which works on the last dim) along ``dim``."""
    d = check_dim(x, dim, "dim")
    if d == x.ndim - 1:
        return fn(x)
    return fn(x.movedim(d, -1)).movedim(-1, d)


def softmax(x: torch.Tensor, dim: int = -1, tau: float | torch.Tensor = 1.0,
            backward: str = "auto") -> torch.Tensor:
    r"""softmax(x/τ) along ``dim``: ``regularized_argmax(x, Simplex(), Entropy(), tau)``.

    .. math:: \mathrm{softmax}(x/\tau)_i = e^{x_i/\tau} / \textstyle\sum_j e^{x_j/\tau}
              = \arg\max_{p \in \Delta} \langle x, p\rangle - \tau \sum_j p_j \log p_j

    Args:
        x: scores (floating dtype).
        dim: the dim holding the categories.
        tau: temperature τ > 0 (a float, or a tensor broadcastable to the other dims).
        backward: ``"auto"``/``"analytic"``, ``"unroll"`` or ``"finite_difference"``.

    Shape: any, ``x.shape[dim] = n``; output the same.

    Raises:
        ValueError: integer dtype, ``dim`` out of range, τ ≤ 0, NaN/inf scores.

    Example::

        >>> softmax(torch.tensor([1.0, 2.0, 3.0]), tau=0.5)
        tensor([0.0159, 0.1173, 0.8668])
    """
    _check_logits(x, "x", dim)  # checked once, under the public argument name
    return _along_dim(lambda v: regularized_argmax_checked(v, Simplex(), Entropy(), tau, backward),
                      x, dim, "x")


def sparsemax(x: torch.Tensor, dim: int = -1, tau: float | torch.Tensor = 1.0,
              backward: str = "auto") -> torch.Tensor:
    r"""sparsemax(x/τ) along ``dim``: the Euclidean projection of x/τ onto the simplex.

    .. math:: \mathrm{sparsemax}(z) = \arg\min_{p \in \Delta} \|p - z\|^2 = [z - \nu]_+ ,
              \qquad \textstyle\sum_i [z_i - \nu]_+ = 1

    i.e. ``regularized_argmax(x, Simplex(), SquaredNorm(), tau)``. Exact, by sorting:
    O(n log n) per row. Unlike softmax its output has exact zeros.

    Args:
        x: scores (floating dtype).
        dim: the dim holding the categories.
        tau: temperature τ > 0 (a float, or a tensor broadcastable to the other dims).
        backward: ``"auto"``/``"analytic"`` (Jacobian ``diag(s) − s sᵀ/|S|``), ``"unroll"`` or
            ``"finite_difference"``.

    Shape: any, ``x.shape[dim] = n``; output the same.

    Raises:
        ValueError: integer dtype, ``dim`` out of range, τ ≤ 0, NaN/inf scores.

    Example::

        >>> sparsemax(torch.tensor([1.0, 0.8, -1.0]))
        tensor([0.6000, 0.4000, 0.0000])

    References:
        Martins & Astudillo, "From Softmax to Sparsemax", ICML 2016, arXiv:1602.02068.
    """
    _check_logits(x, "x", dim)  # checked once, under the public argument name
    return _along_dim(
        lambda v: regularized_argmax_checked(v, Simplex(), SquaredNorm(), tau, backward),
        x, dim, "x")


def sparsemax_loss(x: torch.Tensor, target: torch.Tensor, dim: int = -1,
                   reduction: str = "mean", ignore_index: int = -100) -> torch.Tensor:
    r"""The sparsemax loss (Martins & Astudillo 2016): the Fenchel–Young loss of sparsemax.

    .. math:: L(z; y) = \langle z, p\rangle - \tfrac12\lVert p\rVert^2 - \langle z, y\rangle
              + \tfrac12\lVert y\rVert^2 \;\ge 0,\qquad p = \mathrm{sparsemax}(z),
              \qquad \nabla_z L = p - y

    zero exactly when p = y. For a class index k (y = e_k) it is
    −z_k + ⟨z, p⟩ − ½‖p‖² + ½, entmax's ``sparsemax_loss``. The gradient p − y is exact (no
    backward through the sort).

    Args:
        x: scores z.
        target: class indices (an integer tensor of ``x``'s shape without ``dim``), or target
            distributions of ``x``'s shape (a floating tensor: soft labels).
        dim: the dim holding the categories.
        reduction: ``"mean"`` (over the non-ignored rows), ``"sum"`` or ``"none"``.
        ignore_index: rows whose class index equals it contribute 0 (and do not count in the
            mean), as in ``torch.nn.CrossEntropyLoss``.

    Shape: ``x``: ``(*batch, n)`` (categories along ``dim``); ``target``: ``(*batch)`` integer
    or ``(*batch, n)`` floating; output scalar, or ``(*batch)`` with ``reduction="none"``.

    Raises:
        ValueError: bad ``x`` (as :func:`sparsemax`), a target of the wrong shape or dtype, a
            class index out of range, an unknown ``reduction``.

    Example::

        >>> sparsemax_loss(torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([0]))
        tensor(0.)

    References:
        Martins & Astudillo, ICML 2016 (arXiv:1602.02068); Blondel, Martins & Niculae,
        "Learning with Fenchel-Young Losses", JMLR 2020 (arXiv:1901.02324).
    """
    _check_logits(x, "x", dim)
    check_choice(reduction, ("mean", "sum", "none"), "reduction")
    d = check_dim(x, dim)
    z = x.movedim(d, -1)
    n = z.shape[-1]
    keep = None
    if not isinstance(target, torch.Tensor):
        raise ValueError(f"target must be a tensor of class indices or of distributions, got "
                         f"{type(target).__name__}")
    if target.is_floating_point():
        y = target.movedim(d, -1) if target.ndim == x.ndim else target
        if y.shape != z.shape:
            raise ValueError(f"target distributions must have x's shape {tuple(x.shape)}, got "
                             f"{tuple(target.shape)}")
        y = y.to(z.dtype)
    else:
        if target.is_complex() or target.dtype == torch.bool or target.shape != z.shape[:-1]:
            raise ValueError(f"target must hold class indices of shape {tuple(z.shape[:-1])} "
                             f"(x's shape without dim {dim}), got {tuple(target.shape)}, "
                             f"dtype {target.dtype}")
        keep = target != ignore_index
        idx = torch.where(keep, target, torch.zeros((), dtype=target.dtype,
                                                    device=target.device))
        if validation_enabled() and idx.numel():
            check_value(((idx >= 0) & (idx < n)).all(), f"target holds class indices outside "
                        f"[0, {n}) (other than ignore_index={ignore_index})")
        y = torch.nn.functional.one_hot(idx.long(), n).to(z.dtype)
    with torch.no_grad():
        p = sparsemax(z.detach())
    per = (z * (p - y)).sum(-1) - 0.5 * p.pow(2).sum(-1) + 0.5 * y.pow(2).sum(-1)
    if keep is not None:
        per = torch.where(keep, per, torch.zeros((), dtype=per.dtype, device=per.device))
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    count = per.numel() if keep is None else keep.sum()
    return per.sum() / count


def _stochastic_softmax(logits: torch.Tensor, noise, tau, hard: bool, dim: int,
                        generator: torch.Generator | None) -> torch.Tensor:
    """relax(θ, Simplex(), noise, Entropy(), τ, hard) along ``dim``, with the checks run once.

    One value check of the logits (CPU: one reduction and a host read; CUDA: on the device,
    asynchronous); the perturbed scores need none, the built-in noises being finite.
    """
    _check_logits(logits, "logits", dim)
    check_tau(tau)
    if not isinstance(hard, bool):
        raise ValueError(f"hard must be a bool, got {hard!r}")
    d = check_dim(logits, dim, "dim")
    last = d == logits.ndim - 1
    y = relax_checked(logits if last else logits.movedim(d, -1), _SIMPLEX, noise, _ENTROPY, tau,
                      hard, None, generator, "auto")
    return y if last else y.movedim(-1, d)


#: torch.nn.functional.gumbel_softmax's default eps (deprecated in torch, ignored here).
_TORCH_EPS = 1e-10


def gumbel_softmax(logits: torch.Tensor, tau: float | torch.Tensor = 1.0, hard: bool = False,
                   dim: int = -1, generator: torch.Generator | None = None, *,
                   eps: float = _TORCH_EPS) -> torch.Tensor:
    r"""A Gumbel-softmax (Concrete) sample: softmax((logits + G)/τ), G i.i.d. standard Gumbel.

    .. math:: X_\tau = \mathrm{softmax}((\theta + G)/\tau), \qquad
              \lim_{\tau \to 0} X_\tau = \mathrm{onehot}(\arg\max_i \theta_i + G_i)
              \sim \mathrm{Categorical}(\mathrm{softmax}(\theta))

    It is ``relax(logits, Simplex(), Gumbel(), Entropy(), tau, hard, generator=generator)`` along
    ``dim``: the same generator state gives the same sample. A drop-in for
    ``torch.nn.functional.gumbel_softmax`` with a ``generator``: torch's ``eps`` (deprecated
    there, with no effect) is accepted and ignored with the same warning, also in torch's
    positional order ``gumbel_softmax(logits, tau, hard, eps, dim)`` (a float in the fourth
    place is read as ``eps``).

    Args:
        logits: unnormalised log-probabilities θ.
        tau: temperature τ > 0.
        hard: straight-through: the forward value is the one-hot argmax of θ + G, the gradient
            that of the soft sample.
        dim: the dim holding the categories.
        generator: a ``torch.Generator`` for reproducible samples.
        eps: ignored (torch's deprecated argument; a ``UserWarning`` when it is not 1e-10, as
            torch warns). The Gumbel draws here are finite by construction.

    Shape: any, ``logits.shape[dim] = n``; output the same.

    On CUDA there is no host synchronisation: a bad value in the logits raises asynchronously
    (a device-side assertion naming ``logits``, :mod:`perturb._validation`), and with a float τ
    the sample is one compiled kernel forward and one backward (:mod:`perturb._fused`; the same
    noise as the eager ops, equal up to float rounding; see ``perturb._fused.set_compiled``).

    Raises:
        ValueError: integer dtype, ``dim`` out of range, τ ≤ 0, NaN/+inf logits (−inf masks).

    Example::

        >>> g = torch.Generator().manual_seed(0)
        >>> x = gumbel_softmax(torch.zeros(2, 5), tau=0.5, generator=g)   # rows on the simplex

    References:
        Jang et al. 2017 (arXiv:1611.01144); Maddison et al. 2017 (arXiv:1611.00712).

    See Also:
        - :func:`perturb.gaussian_softmax`: the same relaxation under Gaussian noise
        - :func:`perturb.relax`: any structure, regularizer and noise
        - :func:`perturb.softmax`: the relaxation without noise
    """
    if isinstance(dim, float) and 0 < dim < 1 and (generator is None or isinstance(generator, int)):
        # torch's positional order (logits, tau, hard, eps, dim): dim holds eps
        eps, dim = dim, (-1 if generator is None else generator)
        generator = None
    if eps != _TORCH_EPS:
        warnings.warn("gumbel_softmax(): eps has no effect (torch deprecated it too; the Gumbel "
                      "draws here are finite by construction): drop it", UserWarning,
                      stacklevel=2)
    return _stochastic_softmax(logits, _GUMBEL, tau, hard, dim, generator)


def gaussian_softmax(logits: torch.Tensor, tau: float | torch.Tensor = 1.0, scale: float = 1.0,
                     hard: bool = False, dim: int = -1,
                     generator: torch.Generator | None = None, *,
                     sigma: float | None = None) -> torch.Tensor:
    r"""A Gaussian-softmax sample: softmax((logits + σ Z)/τ), Z i.i.d. standard normal.

    ``relax(logits, Simplex(), Normal(scale), Entropy(), tau, hard, generator=generator)`` along
    ``dim``. As τ → 0 the sample becomes the one-hot of argmax_i θ_i + σ Z_i (a multinomial-probit
    model, whose class probabilities are not softmax(θ); see
    :meth:`perturb.noise.Noise.argmax_probs`).

    Args:
        logits: scores θ.
        tau: temperature τ > 0.
        scale: noise scale σ > 0 (the ``scale`` of :class:`~perturb.noise.Normal`).
        hard: straight-through (see :func:`gumbel_softmax`).
        dim: the dim holding the categories.
        generator: a ``torch.Generator`` for reproducible samples.
        sigma: deprecated name of ``scale`` (``FutureWarning``; removed in 0.3).

    Shape: any, ``logits.shape[dim] = n``; output the same.

    On CUDA: no host synchronisation and the compiled path, as :func:`gumbel_softmax`.

    Raises:
        ValueError: integer dtype, ``dim`` out of range, τ ≤ 0, scale ≤ 0, NaN/+inf logits.

    Example::

        >>> x = gaussian_softmax(torch.zeros(3, 4), tau=0.5, scale=2.0)

    References:
        Paulus et al., "Gradient Estimation with Stochastic Softmax Tricks", NeurIPS 2020,
        arXiv:2006.08063.

    See Also:
        - :func:`perturb.gumbel_softmax`: the same relaxation under Gumbel noise
        - :func:`perturb.relax`: any structure, regularizer and noise
    """
    scale = renamed("gaussian_softmax", "sigma", sigma, "scale", scale, 1.0,
                    check_positive)
    check_positive(scale, "scale")
    return _stochastic_softmax(logits, Normal(scale), tau, hard, dim, generator)
