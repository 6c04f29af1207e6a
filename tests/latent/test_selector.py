"""Tests of perturb/latent/selector.py."""
import torch

from perturb.latent.selector import SubsetSelector
from perturb.noise import Normal


def test_selector_masks_are_k_hot_and_differentiable(seed):
    for per_example in (False, True):
        model = SubsetSelector(12, 3, 4, hidden=8, noise=Normal(), per_example=per_example)
        x = torch.randn(6, 12)
        logits, mask = model(x)
        assert logits.shape == (6, 4)
        assert torch.equal(mask.sum(-1), torch.full((6,), 3.0))
        assert set(mask.detach().unique().tolist()) <= {0.0, 1.0}
        torch.nn.functional.cross_entropy(logits, torch.zeros(6, dtype=torch.long)).backward()
        score_params = model.scorer.parameters() if per_example else [model.scores]
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in score_params)


def test_selector_learns_the_informative_features(seed):
    # the label is the sign of feature 2 + feature 7: a global selector with k=2 must find them
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 10, generator=g)
    y = ((x[:, 2] + x[:, 7]) > 0).long()
    model = SubsetSelector(10, 2, 2, hidden=16, tau=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(80):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x)[0], y).backward()
        opt.step()
    model.eval()
    assert set(model.mask(x[:1])[0].nonzero().flatten().tolist()) == {2, 7}
