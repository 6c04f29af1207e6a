r"""The last quadrature pass of a perturbed side, with its backward as a quadrature on the
same nodes (private engine of :mod:`perturb.boxes.expected_volumes`).

For the boxes ``j = 1..m`` with corners ``l_j, u_j`` and nodes ``x_k`` with log weights
``log w_k`` (placed on detached corners: the integral does not depend on where they sit),

.. math::

    \log s = \log \sum_k w_k\, g(x_k), \qquad
    g(x) = \prod_j F(x − l_j) \prod_j F(u_j − x),

    \frac{∂ \log s}{∂ l_j} = −\sum_k p_k\, \frac{f}{F}(x_k − l_j), \qquad
    \frac{∂ \log s}{∂ u_j} = \sum_k p_k\, \frac{f}{F}(u_j − x_k), \qquad
    p_k = \frac{w_k\, g(x_k)}{s},

(differentiation under the integral sign, each a quadrature of its own integrand on the same
nodes, so exact to the same tolerance). The backward keeps the ``log F`` of the forward and
evaluates the density once per factor: no autograd graph of the ``m·K`` node terms. Once
differentiable (a second derivative raises).
"""
from __future__ import annotations

from typing import Any

import torch

from perturb._autograd import once_differentiable
from perturb.noise import Noise

# Node terms (m·K per side) per block of the CPU's last pass (:func:`log_side`): a block's
# temporaries, about 0.6 MB each, fit the 1 MB per-core L2 of the bench machine; blocks of
# 256 to 2048 sides (two boxes, 72 nodes) measured alike.
_BLOCK = 1 << 16


def _differences(lo: torch.Tensor, up: torch.Tensor, x: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x − l_j`` and ``u_j − x`` ``(m, *batch, d, K)`` for corners ``(m, *batch, d)`` and
    nodes ``(*batch, d, K)``."""
    return x.unsqueeze(0) - lo.unsqueeze(-1), up.unsqueeze(-1) - x.unsqueeze(0)


def _log_side_backward(grad: torch.Tensor, log_p: torch.Tensor, z_lo: torch.Tensor,
                       z_up: torch.Tensor, log_cdf_lo: torch.Tensor, log_cdf_up: torch.Tensor,
                       noise: Noise) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the corners ``(m, *batch, d)`` from the log side's ``grad``
    ``(*batch, d)`` and the normalised log node weights ``log_p`` ``(*batch, d, K)`` (the
    formulas of the module docstring)."""
    return (-_hazard_sum(noise, z_lo, log_cdf_lo, log_p) * grad,
            _hazard_sum(noise, z_up, log_cdf_up, log_p) * grad)


def _hazard_sum(noise: Noise, z: torch.Tensor, log_cdf: torch.Tensor, log_p: torch.Tensor
                ) -> torch.Tensor:
    """``Σ_k p_k f(z_k)/F(z_k)`` over the last dim, given ``log F(z)`` and ``log p``, as one
    exponential per term, in place on the fresh ``z`` (the noise's
    :meth:`~perturb.noise.Noise._log_hazard_`)."""
    return noise._log_hazard_(z, log_cdf).add_(log_p).exp_().sum(-1)


def _log_cdf(noise: Noise, z: torch.Tensor) -> torch.Tensor:
    """``log F(z)`` of the fresh node differences ``z``, which the noise may overwrite
    (:meth:`~perturb.noise.Noise._log_cdf_`: Normal and Logistic standardise in place, Normal
    through ``erfc``, to the absolute accuracy a sum of log terms needs)."""
    return noise._log_cdf_(z)


class _LogSide(torch.autograd.Function):
    """``log Σ_k w_k g(x_k)`` of the module docstring; ``noise`` a Noise with ``log_cdf`` and
    ``log_prob``, differentiable in the corners ``lo``, ``up`` ``(m, *batch, d)`` (float64)
    only: the nodes ``x`` and log weights ``log_w`` ``(*batch, d, K)`` are constants."""

    @staticmethod
    def forward(lo: torch.Tensor, up: torch.Tensor, x: torch.Tensor, log_w: torch.Tensor,
                noise: Noise) -> tuple[torch.Tensor, ...]:
        z_lo, z_up = _differences(lo, up, x)
        log_cdf_lo, log_cdf_up = _log_cdf(noise, z_lo), _log_cdf(noise, z_up)
        terms = log_w + log_cdf_lo[0]
        for factor in (*log_cdf_lo[1:], *log_cdf_up):      # in place: no sums' temporaries
            terms.add_(factor)
        out = torch.logsumexp(terms, -1)
        # the node terms go out as outputs (not differentiable) so that the backward reuses
        # them: the normalised weights and the log F of every factor
        return out, terms.sub_(out.unsqueeze(-1)), log_cdf_lo, log_cdf_up

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        lo, up, x, _, noise = inputs
        _, log_p, log_cdf_lo, log_cdf_up = output
        ctx.noise = noise
        ctx.mark_non_differentiable(log_p, log_cdf_lo, log_cdf_up)
        ctx.save_for_backward(lo, up, x, log_p, log_cdf_lo, log_cdf_up)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple:
        if not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            return None, None, None, None, None
        lo, up, x, log_p, log_cdf_lo, log_cdf_up = ctx.saved_tensors
        z_lo, z_up = _differences(lo, up, x)
        g_lo, g_up = _log_side_backward(grad, log_p, z_lo, z_up, log_cdf_lo, log_cdf_up,
                                        ctx.noise)
        return g_lo, g_up, None, None, None


def log_side(lo: torch.Tensor, up: torch.Tensor, x: torch.Tensor, log_w: torch.Tensor,
             noise: Noise) -> torch.Tensor:
    """``log Σ_k w_k Π_j F(x_k − l_j) Π_j F(u_j − x_k)`` ``(*batch, d)`` for corners
    ``(m, *batch, d)`` and nodes, log weights ``(*batch, d, K)`` (float64; module docstring).

    On the CPU the sides go through in blocks of about ``_BLOCK`` node terms, so that each
    block's temporaries (the ``m·K`` differences, their ``log F``, the hazards of the backward)
    stay in the core's cache: a fifth to a third of the Normal training step
    (bench/RESULTS.md, section perturbed_boxes). One block elsewhere (and for small batches)."""
    batch, (m, k) = x.shape[:-1], (lo.shape[0], x.shape[-1])
    rows = x[..., 0].numel()
    step = max(1, _BLOCK // (m * k)) if x.device.type == "cpu" else rows
    if step >= rows:
        return _LogSide.apply(lo, up, x.detach(), log_w.detach(), noise)[0]
    lo, up = lo.reshape(m, rows), up.reshape(m, rows)
    x, log_w = x.detach().reshape(rows, k), log_w.detach().reshape(rows, k)
    return torch.cat([_LogSide.apply(lo[:, i:i + step], up[:, i:i + step], x[i:i + step],
                                     log_w[i:i + step], noise)[0]
                      for i in range(0, rows, step)]).view(batch)
