"""Data for latent-variable experiments: generated, or shipped inside a package (no downloads)."""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

from perturb._deprecation import renamed
from perturb._validation import check_int, check_positive, check_real, check_scores
from perturb.noise import Logistic, Noise
from perturb.noise._args import draw

__all__ = ["NonlinearICAData", "make_nonlinear_ica", "perturbed_binary", "binarized_digits"]


class NonlinearICAData(NamedTuple):
    """``x``: observations ``(N, d)``, ``s``: sources ``(N, n)``, ``u``: segment ids ``(N,)``,
    ``mixing``: the mixing function (callable ``s -> f(s)``, without observation noise)."""

    x: torch.Tensor
    s: torch.Tensor
    u: torch.Tensor
    mixing: torch.nn.Module


def _leaky_mlp(n_in: int, d_out: int, n_layers: int, slope: float,
               generator: torch.Generator) -> torch.nn.Module:
    """An injective mixing: an embedding into R^d, then square well-conditioned leaky-ReLU layers."""
    layers: list[torch.nn.Module] = []
    dims = [n_in] + [d_out] * n_layers
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        lin = torch.nn.Linear(a, b, bias=False)
        w = torch.randn(b, a, generator=generator, dtype=torch.float64)
        # orthonormal columns keep every layer injective and well conditioned
        q, _ = torch.linalg.qr(w)
        lin.weight.data = q.to(torch.get_default_dtype())
        layers.append(lin)
        if i < n_layers - 1:
            layers.append(torch.nn.LeakyReLU(slope))
    net = torch.nn.Sequential(*layers)
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def make_nonlinear_ica(n_sources: int = 5, n_segments: int = 40, n_per_segment: int = 250,
                       d_obs: int = 25, n_layers: int = 3, slope: float = 0.2,
                       obs_noise: float = 0.0, generator: torch.Generator | None = None
                       ) -> NonlinearICAData:
    """Synthetic nonlinear ICA (Khemakhem et al. 2020): s | u ~ N(μ_u, diag(σ²_u)), x = f(s) + e.

    Per segment u the sources are independent Gaussians with random means μ_u ~ U(−3, 3) and
    standard deviations σ_u ~ U(0.5, 3); the mixing f first embeds R^n into R^d by a matrix with
    orthonormal columns, then applies ``n_layers − 1`` leaky-ReLU layers with orthogonal square
    weights: injective, so the sources are identifiable up to permutation and scaling from
    (x, u) (iVAE theory), and not from x alone.

    Shape: returns ``x`` ``(N, d_obs)``, ``s`` ``(N, n_sources)``, ``u`` ``(N,)`` with
    ``N = n_segments · n_per_segment``.
    """
    check_int(n_sources, "n_sources", low=1)
    check_int(n_segments, "n_segments", low=1)
    check_int(n_per_segment, "n_per_segment", low=1)
    check_int(d_obs, "d_obs", low=n_sources)
    check_int(n_layers, "n_layers", low=1)
    check_positive(slope, "slope")
    check_real(obs_noise, "obs_noise", low=0.0)
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    mu = torch.rand(n_segments, n_sources, generator=g) * 6 - 3
    sd = torch.rand(n_segments, n_sources, generator=g) * 2.5 + 0.5
    u = torch.arange(n_segments).repeat_interleave(n_per_segment)
    s = mu[u] + sd[u] * torch.randn(len(u), n_sources, generator=g)
    f = _leaky_mlp(n_sources, d_obs, n_layers, slope, g)
    with torch.no_grad():
        x = f(s)
        if obs_noise > 0:
            x = x + obs_noise * torch.randn(x.shape, generator=g)
    return NonlinearICAData(x, s, u, f)


def _check_binary_tau(tau: Any, name: str) -> None:
    """τ = 0 (the hard limit) or a finite τ > 0."""
    if isinstance(tau, bool) or tau != 0:
        check_positive(tau, name)


def perturbed_binary(logits: torch.Tensor, tau: float | None = None, noise: Noise | None = None,
                     generator: torch.Generator | None = None, *,
                     temperature: float | None = None) -> torch.Tensor:
    """Observations x = σ((f + ε)/τ), ε ~ noise (default Logistic(0, 1): the binary Concrete).

    As τ → 0 they become the binary x = 1[f + ε > 0], with P(x = 1) = 1 − F(−f) (= σ(f) for
    logistic noise, Φ(f) for standard normal noise). ``tau=0`` returns that limit.
    ``temperature`` is the deprecated name of ``tau`` (``FutureWarning``; removed in 0.3).

    Shape: ``logits`` ``(*batch)`` -> same.
    """
    tau = renamed("perturbed_binary", "temperature", temperature, "tau", tau, None,
                  _check_binary_tau)
    if tau is None:
        raise TypeError("perturbed_binary() missing the temperature argument 'tau'")
    check_scores(logits, "logits", min_ndim=0)
    noise = Logistic() if noise is None else noise
    _check_binary_tau(tau, "tau")
    eps = draw(noise, logits.shape, generator, logits.device, logits.dtype)
    if tau == 0:
        return (logits + eps > 0).to(logits.dtype)
    return torch.sigmoid((logits + eps) / tau)


def binarized_digits(threshold: float = 0.5, generator: torch.Generator | None = None,
                     test_fraction: float = 0.2) -> tuple[torch.Tensor, torch.Tensor,
                                                          torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled 8×8 digits (1,797 images, no download), scaled to [0, 1] and binarised.

    Returns ``(x_train, y_train, x_test, y_test)`` with ``x`` of shape ``(N, 64)`` in {0, 1}.
    Needs scikit-learn (the ``examples`` extra).
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("binarized_digits needs scikit-learn: pip install "
                          "'torch-perturb[examples]' (the distribution's name; 'perturb' on the "
                          "index is an unrelated project), or scikit-learn itself") from err
    check_real(threshold, "threshold", low=0.0, high=1.0)
    check_real(test_fraction, "test_fraction", low=0.0, high=1.0)
    data = load_digits()
    x = torch.as_tensor(data.data, dtype=torch.get_default_dtype()) / 16.0
    x = (x > threshold).to(x.dtype)
    y = torch.as_tensor(data.target)
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    n_test = int(round(test_fraction * len(x)))
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]
