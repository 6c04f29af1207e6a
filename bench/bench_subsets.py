"""Relaxed top-k side by side with peer soft top-k operators, and the cost of the k-subset DP.

- forward + backward of ``relaxed_topk`` (each of the four regularizers) on (256, 1000) float32
  scores, k = 10, against
  * ``torchsort.soft_rank`` turned into a soft top-k indicator clamp(r − (n − k), 0, 1)
    (Blondel et al. 2020; skipped with a note when torchsort is not installed/compiled);
  * ``diffsort`` (Petersen et al. 2021, differentiable sorting networks): the soft top-k is the
    sum of the last k columns of the relaxed permutation matrix. It materialises a
    (B, n, n) matrix per layer of a bitonic network (O(B n² log² n) memory traffic), so at
    (256, 1000) it is out of reach; it is compared at (32, 128) instead.
- the exponential-family DP (``ksubset_marginals``) as n and k grow, timed with one intra-op
  thread: rows report our time only and the fitted log-log slopes go in the note (expected ≈ 1
  in n and ≲ 1 in k: O(nk) work, but the per-position Python loop makes small k overhead-bound).

Both sides run in the same process, interleaved, same inputs; times are medians.
"""
from __future__ import annotations

import math

import torch

from bench._timing import row, time_ms
from perturb import BinaryEntropy, Entropy, ExpFamilyEntropy, SquaredNorm
from perturb.structured.subsets import ksubset_marginals, relaxed_topk

REGS = {"ExpFamilyEntropy (DP)": ExpFamilyEntropy(), "Entropy": Entropy(),
        "BinaryEntropy": BinaryEntropy(), "SquaredNorm": SquaredNorm()}


def _step(fn, x, g):
    def step():
        x.grad = None
        fn(x).backward(g)
    return step


def _pair(name, ours, peer_name, peer, x, g, repeat, note=""):
    o, p = [], []
    ours_step, peer_step = _step(ours, x, g), _step(peer, x, g)
    for _ in range(2):
        o.append(time_ms(ours_step, repeat=repeat, warmup=1))
        p.append(time_ms(peer_step, repeat=repeat, warmup=1))
    return row(name, min(o), peer_name, min(p), note)


def _torchsort_topk(k, strength=0.1):
    import torchsort

    def fn(v):
        rank = torchsort.soft_rank(v, regularization_strength=strength)   # 1 = smallest
        return (rank - (v.shape[-1] - k)).clamp(0, 1)
    return fn


def _diffsort_topk(n, k, steepness=10.0):
    from diffsort import DiffSortNet

    net = DiffSortNet("bitonic", n, steepness=steepness)

    def fn(v):
        _, perm = net(v)                                  # ascending: largest in the last columns
        return perm[..., -k:].sum(-1)
    return fn


def _slope(xs, ts):
    lx = [math.log(x) for x in xs]
    lt = [math.log(t) for t in ts]
    mx, mt = sum(lx) / len(lx), sum(lt) / len(lt)
    return (sum((a - mx) * (b - mt) for a, b in zip(lx, lt))
            / sum((a - mx) ** 2 for a in lx))


def run(quick: bool = False) -> list[dict]:
    torch.manual_seed(0)
    B, n, k = (64, 1000, 10) if quick else (256, 1000, 10)
    repeat = 3 if quick else 5
    x = torch.randn(B, n, requires_grad=True)
    g = torch.randn(B, n)
    size = f"{B}x{n} f32 k={k}, fwd+bwd"
    rows = []

    try:
        ts = _torchsort_topk(k)
        ts(x[:1].detach())
    except Exception as exc:  # not installed, or the C++ extension did not compile
        ts = None
        reason = f"torchsort unavailable ({type(exc).__name__}: {str(exc)[:60]})"
    for label, reg in REGS.items():
        ours = (lambda r: lambda v: relaxed_topk(v, k, tau=0.5, regularizer=r))(reg)
        if ts is None:
            rows.append(row(f"relaxed_topk {label} ({size})", time_ms(_step(ours, x, g),
                            repeat=repeat, warmup=1), "torchsort soft_rank top-k", None,
                            note=reason))
        else:
            rows.append(_pair(f"relaxed_topk {label} ({size})", ours,
                              "torchsort soft_rank top-k", ts, x, g, repeat,
                              note="peer: clamp(soft_rank − (n−k), 0, 1), strength 0.1"))

    rows.append(row(f"diffsort at {B}x{n}", None, "diffsort bitonic top-k", None,
                    note="not run: materialises (B, n, n) per layer (n padded to 1024), "
                         "O(B n² log² n); compared at 32x128 below"))
    ds_B, ds_n = (16, 64) if quick else (32, 128)
    xs = torch.randn(ds_B, ds_n, requires_grad=True)
    gs = torch.randn(ds_B, ds_n)
    try:
        ds = _diffsort_topk(ds_n, k)
        ds(xs[:1].detach())
    except Exception as exc:
        rows.append(row(f"relaxed_topk vs diffsort ({ds_B}x{ds_n})", None, "diffsort", None,
                        note=f"diffsort unavailable ({type(exc).__name__})"))
    else:
        for label in ("ExpFamilyEntropy (DP)", "Entropy"):
            reg = REGS[label]
            rows.append(_pair(f"relaxed_topk {label} ({ds_B}x{ds_n} f32 k={k}, fwd+bwd)",
                              lambda v, r=reg: relaxed_topk(v, k, 0.5, r),
                              "diffsort bitonic top-k", ds, xs, gs, repeat,
                              note="peer: last k columns of the relaxed permutation"))

    # DP scaling in n (k fixed) and in k (n fixed)
    Bd = 16 if quick else 64
    ns = [125, 250, 500, 1000] if quick else [250, 500, 1000, 2000]
    ks = [4, 8, 16, 32] if quick else [5, 10, 20, 40, 80]
    # one intra-op thread: each DP step is a handful of small ops, and on a shared machine the
    # wake-up of a second OpenMP thread per op (not the work) otherwise dominates and hides the
    # O(nk) scaling. Restored afterwards.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t_n, t_k = [], []
        for nn in ns:
            v = torch.randn(Bd, nn, requires_grad=True)
            t_n.append(time_ms(_step(lambda a: ksubset_marginals(a, 10), v, torch.randn(Bd, nn)),
                               repeat=repeat, warmup=1))
        for kk in ks:
            v = torch.randn(Bd, 1000, requires_grad=True)
            t_k.append(time_ms(_step(lambda a: ksubset_marginals(a, kk), v,
                                     torch.randn(Bd, 1000)), repeat=repeat, warmup=1))
    finally:
        torch.set_num_threads(threads)
    sn, sk = _slope(ns, t_n), _slope(ks, t_k)
    for nn, t in zip(ns, t_n):
        rows.append(row(f"DP marginals fwd+bwd B={Bd} n={nn} k=10 (1 thread)", t, "—", None,
                        note=f"log-log slope in n: {sn:.2f}"))
    for kk, t in zip(ks, t_k):
        rows.append(row(f"DP marginals fwd+bwd B={Bd} n=1000 k={kk} (1 thread)", t, "—", None,
                        note=f"log-log slope in k: {sk:.2f}"))
    return rows


if __name__ == "__main__":
    for r in run(quick=True):
        print(r)
