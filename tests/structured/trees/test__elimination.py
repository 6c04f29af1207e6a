"""perturb/structured/trees/_elimination.py: the log-space elimination and the cycle reduction."""
import torch


def test_reduced_vjp_finite_on_denormal_reduced_weights():
    """Peaked scores (×1e4) make some reduced weights W' denormal-small: the double backward of
    a plain log through them formed −ḡ/W'² = inf and returned NaN. The analytic VJP of the
    arborescence marginals must equal the unrolled one there."""
    from perturb.structured import arborescence_marginals

    torch.manual_seed(12)
    w = (1e4 * torch.randn(2, 6, 6))[1].double().requires_grad_()
    g = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    (analytic,) = torch.autograd.grad((arborescence_marginals(w, root=3) * g).sum(), w)
    (unrolled,) = torch.autograd.grad(
        (arborescence_marginals(w, root=3, backward="unroll") * g).sum(), w)
    assert torch.isfinite(analytic).all()
    torch.testing.assert_close(analytic, unrolled, rtol=0, atol=1e-12)
