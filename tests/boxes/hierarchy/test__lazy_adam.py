"""Tests for perturb.boxes.hierarchy._lazy_adam: the lazy Adam update against a hand-computed
step, against torch.optim.SparseAdam (an independent implementation of the same rule) over
many steps, untouched rows and moments, state_dict round trip, bad input."""
import copy
import math

import pytest
import torch

from perturb.boxes.hierarchy._lazy_adam import LazyAdam, _touched_rows


def _sparse(rows, values, shape):
    return torch.sparse_coo_tensor(torch.tensor([rows]), torch.tensor(values, dtype=torch.float64),
                                   shape, check_invariants=True)


def test_two_steps_by_hand():
    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
    start = torch.arange(8, dtype=torch.float64).reshape(4, 2)
    p = torch.nn.Parameter(start.clone())
    opt = LazyAdam([p], lr=lr, betas=(b1, b2), eps=eps)
    # step 1: rows 1 and 3; row 1 twice (summed: g = [0.5, -1.0])
    p.grad = _sparse([1, 3, 1], [[0.25, -2.0], [3.0, 0.0], [0.25, 1.0]], (4, 2))
    opt.step()
    g1 = {1: [0.5, -1.0], 3: [3.0, 0.0]}
    m = {r: [(1 - b1) * x for x in g] for r, g in g1.items()}
    v = {r: [(1 - b2) * x * x for x in g] for r, g in g1.items()}
    size = lr * math.sqrt(1 - b2) / (1 - b1)
    want = start.clone()
    for r in g1:
        for j in range(2):
            want[r, j] -= size * m[r][j] / (math.sqrt(v[r][j]) + eps)
    torch.testing.assert_close(p.detach(), want, rtol=1e-14, atol=0)
    assert torch.equal(p.detach()[[0, 2]], start[[0, 2]])          # untouched rows
    # step 2: row 3 only; row 1 keeps its moments (no decay) and its value
    p.grad = _sparse([3], [[-1.0, 2.0]], (4, 2))
    before = p.detach().clone()
    opt.step()
    m3 = [b1 * m[3][j] + (1 - b1) * g for j, g in enumerate([-1.0, 2.0])]
    v3 = [b2 * v[3][j] + (1 - b2) * g * g for j, g in enumerate([-1.0, 2.0])]
    size = lr * math.sqrt(1 - b2 ** 2) / (1 - b1 ** 2)
    want = before.clone()
    for j in range(2):
        want[3, j] -= size * m3[j] / (math.sqrt(v3[j]) + eps)
    torch.testing.assert_close(p.detach(), want, rtol=1e-14, atol=0)
    st = opt.state[p]
    assert st["step"] == 2
    torch.testing.assert_close(st["exp_avg"][1], torch.tensor(m[1], dtype=torch.float64))
    torch.testing.assert_close(st["exp_avg_sq"][1], torch.tensor(v[1], dtype=torch.float64))
    assert not st["exp_avg"][[0, 2]].any() and not st["exp_avg_sq"][[0, 2]].any()


def test_matches_torch_sparse_adam(generator):
    """30 steps, three tables (two sharing their indices, as the trainer's corner tables),
    repeated rows, float64: SparseAdam's values to rounding."""
    n, d = 50, 3
    start = [torch.randn(n, d, dtype=torch.float64, generator=generator) for _ in range(3)]
    ours = [torch.nn.Parameter(s.clone()) for s in start]
    ref = [torch.nn.Parameter(s.clone()) for s in start]
    a = LazyAdam(ours, lr=0.03, betas=(0.8, 0.99), eps=1e-6)
    b = torch.optim.SparseAdam(ref, lr=0.03, betas=(0.8, 0.99), eps=1e-6)
    for _ in range(30):
        shared = torch.randint(0, n, (20,), generator=generator)
        other = torch.randint(0, n, (7,), generator=generator)
        for k, (p, q) in enumerate(zip(ours, ref)):
            idx = other if k == 2 else shared.clone()        # equal, not the same tensor
            val = torch.randn(idx.shape[0], d, dtype=torch.float64, generator=generator)
            p.grad = torch.sparse_coo_tensor(idx.unsqueeze(0), val, (n, d), check_invariants=True)
            q.grad = p.grad.clone()
        a.step()
        b.step()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a.state[p]["exp_avg_sq"], b.state[q]["exp_avg_sq"],
                                   rtol=1e-12, atol=1e-15)


def test_state_dict_round_trip_is_bit_exact(generator):
    n, d = 20, 2
    grads = [(torch.randint(0, n, (6,), generator=generator),
              torch.randn(6, d, generator=generator)) for _ in range(6)]
    p = torch.nn.Parameter(torch.randn(n, d, generator=generator))
    opt = LazyAdam([p], lr=0.05)

    def go(param, o, steps):
        for idx, val in steps:
            param.grad = torch.sparse_coo_tensor(idx.unsqueeze(0), val, (n, d),
                                                 check_invariants=True)
            o.step()
    go(p, opt, grads[:3])
    q = torch.nn.Parameter(p.detach().clone())
    resumed = LazyAdam([q], lr=0.05)
    # a copy, as a checkpoint file gives (load_state_dict keeps the tensors it is given)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    go(p, opt, grads[3:])
    go(q, resumed, grads[3:])
    assert torch.equal(p, q)
    assert resumed.state[q]["step"] == 6


def test_touched_rows():
    idx = torch.tensor([7, 2, 7, 0, 2])
    rows, inv = _touched_rows(idx, 9)
    assert rows.tolist() == [0, 2, 7] and torch.equal(rows[inv], idx)


def test_bad_input():
    p = torch.nn.Parameter(torch.zeros(3, 2))
    for kw, name in ((dict(lr=0.0), "lr"), (dict(betas=(0.9, 1.0)), "betas"),
                     (dict(eps=-1.0), "eps"), (dict(lr=math.nan), "lr")):
        with pytest.raises(ValueError, match=name):
            LazyAdam([p], **kw)
    p.grad = torch.ones(3, 2)
    with pytest.raises(ValueError, match="sparse"):
        LazyAdam([p], lr=0.1).step()
