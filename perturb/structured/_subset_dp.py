r"""The exponential family over k-subsets: log-partition, marginals and exact sampling.

For scores y = w/τ the Gibbs distribution over Z = {z ∈ {0,1}^n : Σz = k} is

.. math::

    q(z \mid y) = \exp(\langle y, z\rangle - A(y)),\qquad
    A(y) = \log \sum_{z \in Z} e^{\langle y, z\rangle} = \log e_k(e^{y_1}, \dots, e^{y_n}),

with e_k the k-th elementary symmetric polynomial. Its marginals μ = ∇A(y) = E_q[z] are the
solution of the regularized argmax with f = A* (:class:`perturb.ExpFamilyEntropy`).

**Dynamic programme** (log space). The prefix table α[i, j] = log e_j(x_1..x_i) (x = e^y) obeys

    α[i, j] = logaddexp(α[i−1, j], α[i−1, j−1] + y_i),   α[0, 0] = 0, α[0, j>0] = −∞,

and the suffix table β[i, j] = log e_j(x_{i+1}..x_n) the same recursion from the right. One loop
over the n positions, vectorised over the batch and the k+1 counts: O(nk) time and memory.

**Marginals** in a form that stays inside [0, 1] even when rounding is large: splitting the
subsets on whether they contain i, Z = Z₁⁽ⁱ⁾ + Z₀⁽ⁱ⁾ with

    log Z₁⁽ⁱ⁾ = y_i + logsumexp_{j<k} (α[i−1, j] + β[i, k−1−j]),
    log Z₀⁽ⁱ⁾ =       logsumexp_{j≤k} (α[i−1, j] + β[i, k−j]),

so μ_i = σ(log Z₁⁽ⁱ⁾ − log Z₀⁽ⁱ⁾).

**Backward.** The Jacobian of μ is the covariance Cov_q(z) = ∇²A, which is symmetric, so the
vector–Jacobian product with ḡ equals the directional derivative of μ along ḡ. It is computed by
differentiating the recursions in forward mode (tangent tables α̇, β̇, again O(nk)):
α̇[i, j] = p α̇[i−1, j] + (1 − p)(α̇[i−1, j−1] + ḡ_i) with p = exp(α[i−1, j] − α[i, j]).

**Sampling** (sequential conditional Poisson sampling): walk i = 1..n with r items still to
choose and include i with probability x_i e_{r−1}(x_{i+1..n}) / e_r(x_{i..n})
= σ(y_i + β[i, r−1] − β[i, r]); this draws exactly from q.

Impossible entries (e_j of fewer than j items) hold a large finite negative number instead of −∞
so that the tangent recursion never forms ∞ − ∞; their weight exp(·) is exactly zero.

References: Paulus et al. (2020), "Gradient estimation with stochastic softmax tricks",
arXiv:2006.08063, §4 and App.; Chen, Dempster & Liu (1994), "Weighted finite population sampling
to maximize entropy" (conditional Poisson sampling).
"""
from __future__ import annotations

import math

import torch

from perturb._validation import check_int, check_scores, check_tau, scale_by_tau

__all__ = ["ksubset_log_partition", "ksubset_marginals", "sample_ksubset"]

#: Stand-in for log 0 in the DP tables (finite, so tangents never see ∞ − ∞).
_NEG = -1e30


# --------------------------------------------------------------------------------------------
# argument handling shared with subsets.py
# --------------------------------------------------------------------------------------------

def _check_k(k: int, n: int, name: str = "k") -> int:
    """1 <= k <= n, else ValueError naming k and n."""
    k = check_int(k, name)
    if not 1 <= k <= n:
        raise ValueError(f"{name} must satisfy 1 <= {name} <= n, got {name}={k} and n={n} "
                         f"(the size of the last dim of the scores)")
    return k


def _scaled_scores(w: torch.Tensor, k: int, tau: float | torch.Tensor, name: str = "w"):
    """Validate (w, k, τ) and return y = w/τ (differentiable in w and τ) and k."""
    check_scores(w, name, min_ndim=1)
    k = _check_k(k, w.shape[-1])
    check_tau(tau)
    return scale_by_tau(w, tau, 1), k


def _work_dtype(y: torch.Tensor) -> torch.Tensor:
    # half precision cannot hold the _NEG sentinel; compute those in float32
    return y.float() if y.dtype in (torch.float16, torch.bfloat16) else y


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------

def _shift(y: torch.Tensor, k: int) -> torch.Tensor:
    """c = the k-th largest entry per row ``(B, 1)``. A(y − c) = A(y) − kc and μ(y − c) = μ(y);
    working with y − c keeps the entries that matter near 0, where float32 resolves them."""
    return torch.topk(y.detach(), k, dim=-1).values[..., -1:]


def _low(dtype: torch.dtype) -> float:
    """Smallest exponent whose exp is a normal number: clamping there avoids slow subnormals
    (the error, < e^low relative, is far below rounding)."""
    return math.log(torch.finfo(dtype).tiny) + 1.0


def _lse(s: torch.Tensor, dim: int) -> torch.Tensor:
    m = s.amax(dim, keepdim=True)
    return (s - m).clamp_min(_low(s.dtype)).exp().sum(dim).log() + m.squeeze(dim)


def _softmax(s: torch.Tensor, dim: int) -> torch.Tensor:
    e = (s - s.amax(dim, keepdim=True)).clamp_min(_low(s.dtype)).exp()
    return e / e.sum(dim, keepdim=True)


def _prefix_table(yt: torch.Tensor, k: int) -> torch.Tensor:
    """α with α[i, j, :] = log e_j(e^{y_1}, ..., e^{y_i}); shape ``(n+1, k+1, B)``.

    Layout: ``yt`` is position-major ``(n, B)`` and the batch is innermost, so that every step
    of the loop reads and writes contiguous blocks.
    """
    n, B = yt.shape
    # row 0 is padding (log 0) so that the shift j−1 is a slice
    t = torch.full((n + 1, k + 2, B), _NEG, dtype=yt.dtype, device=yt.device)
    t[:, 1] = 0.0
    for i in range(n):
        t[i + 1, 2:] = torch.logaddexp(t[i, 2:], t[i, 1:-1] + yt[i])
    return t[:, 1:]


def _suffix_table(yt: torch.Tensor, k: int) -> torch.Tensor:
    """β with β[i, j, :] = log e_j(e^{y_{i+1}}, ..., e^{y_n}); shape ``(n+1, k+1, B)``."""
    return _prefix_table(yt.flip(0), k).flip(0)


def _marginals_from_tables(yt, alpha, beta, k):
    """μ_i = σ(log Z₁⁽ⁱ⁾ − log Z₀⁽ⁱ⁾), position-major ``(n, B)``; also the two log-weight tensors."""
    a = alpha[:-1]                  # (n, k+1, B): prefix before i
    b = beta[1:].flip(1)            # (n, k+1, B): b[:, j] = β[i, k − j]
    s1 = a[:, :k] + b[:, 1:]        # α[i−1, j] + β[i, k−1−j], j < k
    s0 = a + b                      # α[i−1, j] + β[i, k−j],   j ≤ k
    l1 = yt + _lse(s1, 1)
    l0 = _lse(s0, 1)
    return torch.sigmoid(l1 - l0), s1, s0


def _tangent_prefix(yt, alpha, gt):
    """α̇ along direction g of the prefix recursion; shape of ``alpha`` ``(n+1, k+1, B)``."""
    low = _low(alpha.dtype)
    prev, new = alpha[:-1], alpha[1:]
    p_keep = (prev[:, 1:] - new[:, 1:]).clamp_min(low).exp()                     # (n, k, B)
    p_take = (prev[:, :-1] + yt[:, None] - new[:, 1:]).clamp_min(low).exp()      # (n, k, B)
    dt = torch.zeros_like(alpha)
    for i in range(alpha.shape[0] - 1):
        dt[i + 1, 1:] = torch.addcmul(p_keep[i] * dt[i, 1:], p_take[i], dt[i, :-1] + gt[i])
    return dt


def _marginals_jvp(yt: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
                   mu: torch.Tensor, gt: torch.Tensor, k: int) -> torch.Tensor:
    """Cov_q(z) g: the (symmetric) Jacobian of the marginals applied to g. Pure; tests call it.

    Shape (position-major): yt, mu, gt ``(n, B)``; alpha, beta ``(n+1, k+1, B)``; output ``(n, B)``.
    """
    B = yt.shape[1]
    # both directions in one loop: the suffix recursion is the prefix one on reversed items
    both = _tangent_prefix(torch.cat([yt, yt.flip(0)], 1), torch.cat([alpha, beta.flip(0)], -1),
                           torch.cat([gt, gt.flip(0)], 1))
    da, db = both[..., :B], both[..., B:].flip(0)
    _, s1, s0 = _marginals_from_tables(yt, alpha, beta, k)
    ta = da[:-1]
    tb = db[1:].flip(1)
    dl1 = gt + (_softmax(s1, 1) * (ta[:, :k] + tb[:, 1:])).sum(1)
    dl0 = (_softmax(s0, 1) * (ta + tb)).sum(1)
    return mu * (1 - mu) * (dl1 - dl0)


class _KSubsetMarginals(torch.autograd.Function):
    r"""μ(y) = ∇ log e_k(e^y) by the forward–backward DP; backward μ̇ = Cov_q(z) ḡ (symmetric).

    Inputs: y ``(B, n)`` and k. Outputs: μ ``(B, n)`` and, non-differentiable, the shifted scores
    and the tables α, β (position-major), returned so that the backward need not recompute them.
    """

    @staticmethod
    def forward(y, k):
        yt = (y - _shift(y, k)).t().contiguous()
        B = yt.shape[1]
        both = _prefix_table(torch.cat([yt, yt.flip(0)], 1), k)     # prefix and suffix at once
        alpha, beta = both[..., :B], both[..., B:].flip(0)
        mu, _, _ = _marginals_from_tables(yt, alpha, beta, k)
        return mu.t(), yt, alpha, beta

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, k = inputs
        mu, yt, alpha, beta = output
        ctx.k = k
        ctx.mark_non_differentiable(yt, alpha, beta)
        ctx.save_for_backward(yt, alpha, beta, mu)

    @staticmethod
    def backward(ctx, g, *_):
        if not ctx.needs_input_grad[0]:
            return None, None
        yt, alpha, beta, mu = ctx.saved_tensors
        return _marginals_jvp(yt, alpha, beta, mu.t(), g.t(), ctx.k).t(), None


class _KSubsetLogPartition(torch.autograd.Function):
    r"""A(y) = log e_k(e^y) = α[n, k] + kc (shift c); backward ḡ · μ(y) (μ differentiable again)."""

    @staticmethod
    def forward(y, k):
        c = _shift(y, k)
        return _prefix_table((y - c).t().contiguous(), k)[-1, k] + k * c.squeeze(-1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        y, k = inputs
        ctx.k = k
        ctx.save_for_backward(y)

    @staticmethod
    def backward(ctx, g):
        if not ctx.needs_input_grad[0]:
            return None, None
        (y,) = ctx.saved_tensors
        mu = _KSubsetMarginals.apply(y, ctx.k)[0]
        return g[:, None] * mu, None


def _flat(y: torch.Tensor) -> torch.Tensor:
    return y.reshape(-1, y.shape[-1])


def _marginals_scaled(y: torch.Tensor, k: int) -> torch.Tensor:
    """Marginals for already scaled and validated scores ``(*batch, n)`` (analytic backward)."""
    yw = _work_dtype(y)
    mu = _KSubsetMarginals.apply(_flat(yw), k)[0]
    return mu.reshape(y.shape).to(y.dtype)


def _logaddexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(e^a + e^b) with a detached shift: its autograd is exact to every order (torch's
    ``logaddexp`` double backward is NaN when both inputs are the _NEG sentinel)."""
    m = torch.maximum(a, b).detach()
    return m + torch.log(torch.exp(a - m) + torch.exp(b - m))


def _log_partition_unrolled(y: torch.Tensor, k: int) -> torch.Tensor:
    """The same DP in plain differentiable torch ops (autograd unrolls it); ``(B, n) -> (B,)``."""
    B, n = y.shape
    c = _shift(y, k)
    ys = y - c
    pad = torch.full((B, 1), _NEG, dtype=y.dtype, device=y.device)
    row = torch.cat([torch.zeros_like(pad), pad.expand(B, k)], -1)
    for i in range(n):
        row = torch.cat([row[:, :1], _logaddexp(row[:, 1:], row[:, :-1] + ys[:, i, None])], -1)
    return row[:, k] + k * c.squeeze(-1)


def _marginals_unrolled(y: torch.Tensor, k: int) -> torch.Tensor:
    """μ = ∇A by autograd of the unrolled DP (``create_graph``: differentiable again)."""
    yw = _work_dtype(y)
    with torch.enable_grad():
        leaf = yw if yw.requires_grad else yw.detach().requires_grad_(True)
        logz = _log_partition_unrolled(_flat(leaf), k)
        (mu,) = torch.autograd.grad(logz.sum(), leaf, create_graph=y.requires_grad)
    return mu.to(y.dtype)


# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------

def ksubset_log_partition(w: torch.Tensor, k: int, tau: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Log-partition A(w/τ) = log Σ_{|S| = k} exp(Σ_{i∈S} w_i / τ) of the k-subset family.

    Computed as the log of the elementary symmetric polynomial e_k(e^{w/τ}) by a log-space
    dynamic programme over (position, count). Its gradient with respect to ``w/τ`` is
    :func:`ksubset_marginals` (returned by the backward pass, which is itself differentiable).

    Args:
        w: scores.
        k: subset size, 1 ≤ k ≤ n.
        tau: temperature τ > 0 (a float, or a tensor broadcastable to ``(*batch)``).

    Shape: ``w``: ``(*batch, n)``; output ``(*batch)``.

    Returns:
        A(w/τ) (not multiplied by τ).

    Raises:
        ValueError: k outside [1, n], τ ≤ 0, non-floating or non-finite ``w``.

    Complexity: O(nk) time and memory; a Python loop over the n positions, each step
    vectorised over the batch and the k + 1 counts.

    Example::

        >>> w = torch.zeros(5)
        >>> ksubset_log_partition(w, 2).exp()   # C(5, 2) subsets of weight 1
        tensor(10.)
    """
    y, k = _scaled_scores(w, k, tau)
    yw = _work_dtype(y)
    out = _KSubsetLogPartition.apply(_flat(yw), k)
    return out.reshape(w.shape[:-1]).to(y.dtype)


def ksubset_marginals(w: torch.Tensor, k: int, tau: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Marginals μ_i = P_q(i ∈ S) of q(S) ∝ exp(Σ_{i∈S} w_i/τ) over k-subsets: μ = ∇A(w/τ).

    This is the regularized argmax over conv Z with the exponential-family entropy A*
    (``relaxed_topk(w, k, tau, regularizer=ExpFamilyEntropy())``). Forward–backward DP in log
    space; μ_i = σ(log Z₁⁽ⁱ⁾ − log Z₀⁽ⁱ⁾) so every entry lies in [0, 1] and Σμ = k.
    The backward applies Cov_q(z) by forward-mode differentiation of the DP (O(nk) memory).

    Args:
        w: scores.
        k: subset size, 1 ≤ k ≤ n.
        tau: temperature τ > 0 (a float, or a tensor broadcastable to ``(*batch)``).

    Shape: ``w``: ``(*batch, n)``; output ``(*batch, n)``.

    Raises:
        ValueError: k outside [1, n], τ ≤ 0, non-floating or non-finite ``w``.

    Example::

        >>> ksubset_marginals(torch.tensor([0., 0., 10.]), k=2)
        tensor([0.5000, 0.5000, 1.0000])

    References: Paulus et al. (2020), arXiv:2006.08063.
    """
    y, k = _scaled_scores(w, k, tau)
    return _marginals_scaled(y, k)


def sample_ksubset(w: torch.Tensor, k: int, tau: float | torch.Tensor = 1.0,
                   n_samples: int | None = None,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Exact samples S ~ q(S) ∝ exp(Σ_{i∈S} w_i/τ) over k-subsets, as 0/1 indicators.

    Sequential (conditional Poisson) sampling with the suffix DP table: with r items left to
    choose, i is taken with probability σ(y_i + β[i, r−1] − β[i, r]) (module docstring). Unlike
    Gumbel top-k (which samples without replacement, a different distribution), the samples
    follow q exactly, so E[z] = :func:`ksubset_marginals` (unbiased score-function baselines).

    Args:
        w: scores.
        k: subset size, 1 ≤ k ≤ n.
        tau: temperature τ > 0.
        n_samples: if given, a leading dim of that many independent samples.
        generator: a ``torch.Generator`` for reproducibility (on the device of ``w``).

    Shape: ``w``: ``(*batch, n)``; output ``(*batch, n)`` or ``(n_samples, *batch, n)``, dtype of
    ``w``; no gradient.

    Raises:
        ValueError: k outside [1, n], τ ≤ 0, bad ``n_samples``, non-finite ``w``.

    Complexity: O(nk) for the table, then O(n) sequential steps over all samples at once.
    """
    if n_samples is not None:
        check_int(n_samples, "n_samples", low=1)
    with torch.no_grad():
        y, k = _scaled_scores(w.detach() if isinstance(w, torch.Tensor) else w, k, tau)
        yw = _flat(_work_dtype(y))
        B, n = yw.shape
        S = 1 if n_samples is None else n_samples
        yt = (yw - _shift(yw, k)).t().contiguous()
        beta = _suffix_table(yt, k).transpose(1, 2)                    # (n+1, B, k+1)
        beta = torch.cat([torch.full_like(beta[..., :1], _NEG), beta], -1)  # index r−1 = −1 ok
        u = torch.rand((S, B, n), generator=generator, dtype=yw.dtype, device=yw.device)
        r = torch.full((S, B), k, dtype=torch.long, device=yw.device)
        out = torch.zeros((S, B, n), dtype=yw.dtype, device=yw.device)
        for i in range(n):
            table = beta[i + 1].expand(S, B, k + 2)                   # β[i, ·] after item i
            take_l = torch.gather(table, -1, r[..., None]).squeeze(-1)       # β[i, r−1]
            skip_l = torch.gather(table, -1, (r + 1)[..., None]).squeeze(-1)  # β[i, r]
            p = torch.sigmoid(yt[i] + take_l - skip_l)
            take = (u[..., i] < p) & (r > 0)
            out[..., i] = take.to(out.dtype)
            r = r - take.long()
        out = out.to(w.dtype).reshape(S, *w.shape)
    return out[0] if n_samples is None else out


