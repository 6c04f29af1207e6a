"""The library's hot paths, one case per family: the default case file of
:mod:`bench.compare_revisions` (each worker runs it against its own revision). The cases call
only public functions whose signatures have not changed since the library's first release of
each family, with fixed seeds; forward and backward where the case trains through the result.
"""
import torch

import perturb
from perturb import structured as st
from perturb.boxes import Box, log_containment_prob


def g(seed):
    return torch.Generator().manual_seed(seed)


def fwd_bwd(make, x):
    def run():
        x.grad = None
        y = make(x)
        y.backward(torch.ones_like(y))
    return run


w1 = torch.randn(256, 1000, generator=g(0)).requires_grad_()
perm = torch.randn(32, 128, 128, generator=g(1))
perm64 = torch.randn(8, 64, 64, generator=g(2), dtype=torch.float64).requires_grad_()
arb = torch.randn(16, 64, 64, generator=g(3), dtype=torch.float64).requires_grad_()
span = torch.randn(16, 64, 64, generator=g(4), dtype=torch.float64)
span = (span + span.transpose(-1, -2)).requires_grad_()
lo = torch.rand(2816, 10, generator=g(5))
side = 0.1 + 0.4 * torch.rand(2816, 10, generator=g(6))
corners = torch.cat([lo, lo + side], -1).requires_grad_()
ent = perturb.ExpFamilyEntropy()


def boxes(x):
    a = Box(x[:1408, :10], x[:1408, 10:])
    b = Box(x[1408:, :10], x[1408:, 10:])
    return log_containment_prob(a, b, beta=0.1).sum()


CASES = {
    "relax Simplex Gumbel 256x1000 f32 fwd+bwd":
        fwd_bwd(lambda x: perturb.relax(x, perturb.Simplex(), perturb.Gumbel(), tau=0.5,
                                        generator=g(7)), w1),
    "relaxed_topk Entropy 256x1000 k=10 f32 fwd+bwd":
        fwd_bwd(lambda x: st.relaxed_topk(x, 10), w1),
    "relaxed_topk ExpFamilyEntropy 256x1000 k=10 f32 fwd+bwd":
        fwd_bwd(lambda x: st.relaxed_topk(x, 10, regularizer=ent), w1),
    "sinkhorn 32x128x128 f32 tau=0.2 fwd": lambda: st.sinkhorn(perm, tau=0.2),
    "sinkhorn 8x64x64 f64 tau=0.2 fwd+bwd":
        fwd_bwd(lambda x: st.sinkhorn(x, tau=0.2), perm64),
    "arborescence_marginals 16x64x64 f64 fwd+bwd":
        fwd_bwd(lambda x: st.arborescence_marginals(x), arb),
    "spanning_tree_marginals 16x64x64 f64 fwd+bwd":
        fwd_bwd(lambda x: st.spanning_tree_marginals(x), span),
    "Gumbel box log P(b in a) 1408 pairs d=10 f32 fwd+bwd": fwd_bwd(boxes, corners),
}
