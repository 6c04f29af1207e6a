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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_gumbel_scores_match_the_general_path(dtype, monkeypatch):
    """score_pairs of Gumbel boxes (one fused autograd node, perturb.boxes._gumbel_pairs)
    against the composition it replaces: values and parameter gradients, with negatives nested
    deep inside their parents (the first-order log(1 − P)) among random ones."""
    import perturb.boxes.hierarchy.model as model_module
    from perturb.boxes import Box
    gen = torch.Generator().manual_seed(2)
    n, d = 300, 4
    m = BoxHierarchyModel(n, d, Gumbel(scale=0.01), volume_beta=0.1, dtype=dtype)
    lo = torch.rand(n, d, dtype=dtype, generator=gen)
    w = torch.rand(n, d, dtype=dtype, generator=gen) * 0.5 + 0.05
    lo[30:60] = lo[:30] + 0.3 * w[:30]                       # 30..59 deep inside 0..29
    w[30:60] = w[:30] * 0.3 * torch.rand(30, d, dtype=dtype, generator=gen)
    m.embedding.set_boxes(Box(lo, lo + w))
    child = torch.cat([torch.arange(30, 60), torch.randint(n, (150,), generator=gen),
                       torch.arange(30, 60)])
    parent = torch.cat([torch.arange(30), torch.randint(n, (150,), generator=gen),
                        torch.arange(30)])
    out = {}
    for path, dtypes in (("fused", model_module._FUSED_DTYPES), ("general", ())):
        monkeypatch.setattr(model_module, "_FUSED_DTYPES", dtypes)
        m.zero_grad()
        log_p, log1m = m.score_pairs(child, parent, 30, validate=False)
        wts = torch.linspace(-1, 1, log1m.shape[0], dtype=dtype)
        (log_p.sum() + (log1m * wts).sum()).backward()
        out[path] = (log_p, log1m, m.embedding.param1.grad, m.embedding.param2.grad)
    assert (out["general"][1][-30:] < -3).sum() >= 20        # the nested negatives
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-5,
                                                                            atol=2e-5)
    for a, b in zip(out["fused"], out["general"]):
        scale = b.abs().amax().clamp(min=1.0)
        torch.testing.assert_close(a / scale, b / scale, **tol)


@pytest.mark.parametrize("method", ["gumbel", "soft", "normal"])
@pytest.mark.parametrize("n_pairs", [5, 40])  # fused Gumbel / per-pair; per-node child volumes
def test_sparse_grad_gives_the_dense_gradients(method, n_pairs):
    """With ``sparse_grad`` the scores are the same and the parameters' gradients are sparse
    COO tensors equal to the dense ones (fused Gumbel pair score, per-node volumes, volume of
    given ids)."""
    box_model = {"gumbel": dict(noise=Gumbel(0.2), volume_beta=0.3),
                 "soft": dict(noise=None, temperature=0.5), "normal": dict(noise=Normal(0.2))}
    gen = torch.Generator().manual_seed(3)
    m = BoxHierarchyModel(12, 3, **box_model[method], init=(0.2, 0.6), generator=gen,
                          dtype=torch.float64)
    child, parent = torch.randint(0, 12, (2, n_pairs), generator=gen)
    w = torch.randn(2 * n_pairs - 2, generator=gen, dtype=torch.float64)
    grads = []
    for sparse in (False, True):
        m.sparse_grad = sparse
        m.zero_grad(set_to_none=True)
        s = m.score_pairs(child, parent, 2)
        loss = (torch.cat([s.log_p, s.log1m_p]) * w).sum() + m.log_volume(child[:3]).sum()
        loss.backward()
        grads.append([p.grad for p in m.parameters()])
    for dense, sparse in zip(*grads):
        assert not dense.is_sparse and sparse.is_sparse
        torch.testing.assert_close(sparse.to_dense(), dense, rtol=1e-12, atol=1e-14)
    with torch.no_grad():                      # no gradient: the plain all-boxes path
        assert torch.equal(m.log_volume(), m.log_volume(torch.arange(12)))


def test_sparse_grad_forward_equals_embedding():
    m = BoxHierarchyModel(10, 2, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 9], [3, 1]])
    dense = m(ids)
    m.sparse_grad = True
    box = m(ids)
    assert torch.equal(box.lower, dense.lower) and torch.equal(box.upper, dense.upper)
    box.lower.sum().backward()
    assert m.embedding.param1.grad.is_sparse
    with pytest.raises(ValueError, match="ids"):
        m(torch.tensor([10]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_score_corners_fused_matches_score_boxes(dtype):
    """The stalled-pair diagnostic scores detached corners with the fused Gumbel pair score:
    the values and the corner gradients of :meth:`score_boxes` (the composition) to rounding,
    nested negatives included."""
    gen = torch.Generator().manual_seed(3)
    m = BoxHierarchyModel(30, 4, Gumbel(0.01), volume_beta=0.1, init=(0.05, 0.4),
                          generator=gen, dtype=dtype)
    child = torch.randint(30, (60,), generator=gen)
    parent = torch.randint(30, (60,), generator=gen)
    with torch.no_grad():            # some negatives nested deep inside their parents
        lo, w = m.embedding.param1, m.embedding.param2
        lo[:5] = lo[5:10]
        w[:5] = w[5:10] - 3.0
    child[10:15], parent[10:15] = torch.arange(5), torch.arange(5, 10)
    box = m.gather(torch.cat([child, parent]))
    out = {}
    for fused in (True, False):
        corners = [t.detach().clone().requires_grad_() for t in (box.lower, box.upper)]
        if fused:
            s = m._score_corners(corners[0], corners[1], 8)
        else:
            from perturb.boxes.box import Box
            s = m.score_boxes(Box(corners[0][60:], corners[1][60:]),
                              Box(corners[0][:60], corners[1][:60]), 8)
        w8 = torch.linspace(0.5, 1.5, 52, dtype=dtype)
        g = torch.autograd.grad(s.log_p.sum() + (s.log1m_p * w8).sum(), corners)
        out[fused] = (s.log_p, s.log1m_p, *g)
    assert (out[False][1] < -3).sum() >= 3                  # nested negatives are present
    tol = dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=2e-4, atol=2e-4)
    for a, b in zip(out[True], out[False]):
        torch.testing.assert_close(a, b, **tol)
