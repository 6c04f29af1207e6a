"""Tests for perturb.boxes.hierarchy.model: the batched scoring path against the core box
functions, and the parameter gather against BoxEmbedding."""
from __future__ import annotations

import pytest
import torch

from perturb.boxes import log1m_containment_prob, log_containment_prob
from perturb.boxes.hierarchy import BoxHierarchyModel
from perturb.noise import Gumbel, Logistic, Normal


@pytest.mark.parametrize("parameterisation", ["center_offset", "min_delta", "sigmoid"])
def test_gather_equals_embedding(parameterisation):
    m = BoxHierarchyModel(20, 3, parameterisation=parameterisation, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([3, 0, 19, 3])
    a, b = m.gather(ids), m(ids)
    assert torch.equal(a.lower, b.lower) and torch.equal(a.upper, b.upper)


@pytest.mark.parametrize("method", ["gumbel", "soft", "hard", "normal", "logistic"])
@pytest.mark.parametrize("n_pairs", [5, 40])          # per-pair and per-node child volumes
def test_score_pairs_matches_core(method, n_pairs):
    gen = torch.Generator().manual_seed(1)
    box_model = {"gumbel": dict(noise=Gumbel(0.2), volume_beta=0.3),
                 "soft": dict(noise=None, temperature=0.5), "hard": dict(noise=None),
                 "normal": dict(noise=Normal(0.2)), "logistic": dict(noise=Logistic(0.2))}
    m = BoxHierarchyModel(12, 3, **box_model[method], init=(0.2, 0.6), generator=gen,
                          dtype=torch.float64)
    assert m.method == method
    child = torch.randint(12, (n_pairs,), generator=gen)
    parent = torch.randint(12, (n_pairs,), generator=gen)
    kw = {"gumbel": dict(beta=0.2, volume_beta=0.3), "soft": dict(temperature=0.5),
          "hard": {}, "normal": dict(noise=Normal(0.2)),
          "logistic": dict(noise=Logistic(0.2))}[method]
    log_p, log1m = m.score_pairs(child, parent, n_pos=2)
    pb, cb = m(parent), m(child)
    torch.testing.assert_close(log_p, log_containment_prob(pb, cb, **kw), rtol=1e-12,
                               atol=1e-12)
    torch.testing.assert_close(log1m, log1m_containment_prob(pb[2:], cb[2:], **kw),
                               rtol=1e-12, atol=1e-12)
    lp2, l1m2 = m.log_containment_pair(child.view(-1, 1), parent.view(-1, 1))
    assert lp2.shape == (n_pairs, 1)
    torch.testing.assert_close(lp2.flatten(), log_p)


def test_method_strings_warn_and_build_the_same_model():
    with pytest.warns(FutureWarning, match="BoxHierarchyModel.*method='soft'.*temperature"):
        old = BoxHierarchyModel(4, 2, "soft", temperature=0.5)
    assert (old.noise, old.temperature, old.method) == (None, 0.5, "soft")
    with pytest.warns(FutureWarning, match="method='normal'.*Normal\\(scale=0.2\\)"):
        old = BoxHierarchyModel(4, 2, method="normal", beta=0.2)
    assert old.noise == Normal(0.2) and old.beta == 0.2
    assert BoxHierarchyModel(4, 2).noise == Gumbel(0.01)
    assert "noise=Normal(scale=0.2)" in repr(BoxHierarchyModel(4, 2, Normal(0.2)))
