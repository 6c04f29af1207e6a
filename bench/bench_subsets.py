"""Relaxed top-k side by side with peer soft top-k operators, and the cost of the k-subset DP.

- forward + backward of ``relaxed_topk`` (each of the four regularizers) on (256, 1000) float32
  scores, k = 10, against
  * ``torchsort.soft_rank`` turned into a soft top-k indicator clamp(r − (n − k), 0, 1)
    (Blondel et al. 2020; skipped with a note when torchsort is not installed/compiled);
  * ``diffsort`` (Petersen et al. 2021, differentiable sorting networks): the soft top-k is the
    sum of the last k columns of the relaxed permutation matrix. It materialises a
    (B, n, n) matrix per layer of a bitonic network (O(B n² log² n) memory traffic), so at
    (256, 1000) it is out of reach; it is compared at (32, 128) instead.
- the exponential-family DP (issue 13): the log-depth tree (``ksubset_marginals`` fwd+bwd) at
  256x1000, k = 10, against the closed-form Entropy relaxation of the same batch and against the
  former sequential DP (``_SequentialMarginals``, n steps) as a "before" row, with dispatched-op
  counts; its scaling in n (250 … 4000, k = 10) and in k (n = 1000); ``sample_ksubset``; the
  same DP/Entropy ratio on one and on two threads (issue 29: ≤ 2 on any thread count).
- correlated top-k (issue 29): one training step of ``examples/correlated_topk.py`` at its
  default size (d = 40, batches of 100, k = 5, τ = 0.5, Gumbel noise, CNN selector + MLP,
  Adam) with ``CorrelatedKSubset`` against the same step with the plain ExpFamilyEntropy top-k
  (target ratio ≤ 3), interleaved, with dispatched-op counts; and the relaxation alone
  (fwd+bwd of ``regularized_argmax`` on (100, 79) scores); both on the run's threads and on
  one thread.

Both sides run in the same process, interleaved, same inputs; times are medians.
"""
from __future__ import annotations

import contextlib
import math
import pathlib
import sys

import torch

from bench._timing import count_ops, device, row, time_interleaved, time_ms
from perturb import BinaryEntropy, Entropy, ExpFamilyEntropy, SquaredNorm
from perturb.structured.subsets import dp as _subset_dp
from perturb.structured.subsets import ksubset_marginals, relaxed_topk, sample_ksubset

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


def _dp_rows(quick: bool) -> list[dict]:
    """Issue 13: the log-depth DP vs the Entropy relaxation and vs the former sequential DP."""
    dev = device()
    B, n, k = (64, 1000, 10) if quick else (256, 1000, 10)
    repeat = 5 if quick else 9
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, n, generator=gen).to(dev).requires_grad_(True)
    g = torch.randn(B, n, generator=gen).to(dev)
    tree = _step(lambda v: ksubset_marginals(v, k, 0.5), x, g)
    ent = _step(lambda v: relaxed_topk(v, k, 0.5, Entropy()), x, g)
    seq = _step(lambda v: _subset_dp._SequentialMarginals.apply(v / 0.5, k)[0], x, g)
    t = time_interleaved({"tree": tree, "ent": ent, "seq": seq}, repeat=repeat, warmup=1)
    ops = {name: count_ops(f) for name, f in (("tree", tree), ("ent", ent), ("seq", seq))}
    size = f"{B}x{n} f32 k={k}, fwd+bwd"
    rows = [
        row(f"DP marginals, log-depth tree ({size})", t["tree"], "Entropy relaxation (closed form)",
            t["ent"], note=f"peer ops/call {ops['ent']}; target ratio ≤ 2",
            ops=ops["tree"]),
        row(f"DP marginals, former sequential DP ({size})", t["seq"],
            "Entropy relaxation (closed form)", t["ent"], note="before issue 13 (n steps)",
            ops=ops["seq"]),
        row(f"DP marginals, tree vs sequential ({size})", t["tree"], "former sequential DP",
            t["seq"], note="speed-up = 1/ratio"),
    ]
    # scaling in n (k = 10) and in k (n = 1000)
    Bd = 16 if quick else 64
    ns = [250, 500, 1000, 2000] if quick else [250, 500, 1000, 2000, 4000]
    ks = [4, 16, 64] if quick else [5, 10, 20, 40, 80]
    fns, sizes = {}, {}
    for nn in ns:
        v = torch.randn(Bd, nn, generator=gen).to(dev).requires_grad_(True)
        w = torch.randn(Bd, nn, generator=gen).to(dev)
        fns[f"n{nn}"] = _step(lambda a: ksubset_marginals(a, 10), v, w)
    for kk in ks:
        v = torch.randn(Bd, 1000, generator=gen).to(dev).requires_grad_(True)
        w = torch.randn(Bd, 1000, generator=gen).to(dev)
        fns[f"k{kk}"] = (lambda kk, v, w: _step(lambda a: ksubset_marginals(a, kk), v, w))(kk, v, w)
    t = time_interleaved(fns, repeat=3 if quick else 5, warmup=1)
    sn = _slope(ns, [t[f"n{nn}"] for nn in ns])
    sk = _slope(ks, [t[f"k{kk}"] for kk in ks])
    for nn in ns:
        rows.append(row(f"DP marginals fwd+bwd B={Bd} n={nn} k=10", t[f"n{nn}"], "—", None,
                        note=f"log-log slope in n: {sn:.2f}"))
    for kk in ks:
        rows.append(row(f"DP marginals fwd+bwd B={Bd} n=1000 k={kk}", t[f"k{kk}"], "—", None,
                        note=f"log-log slope in k: {sk:.2f}"))
    # exact sampling
    w = torch.randn(B, n, generator=gen).to(dev)
    S = 16
    ts = time_ms(lambda: sample_ksubset(w, k, n_samples=S, generator=None), repeat=repeat,
                 warmup=1)
    rows.append(row(f"sample_ksubset {B}x{n} k={k}, {S} samples", ts, "—", None,
                    note="exact, top-down through the tree (log n steps)",
                    ops=count_ops(lambda: sample_ksubset(w, k, n_samples=S))))
    return rows


@contextlib.contextmanager
def _threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _dp_thread_rows(quick: bool) -> list[dict]:
    """The DP/Entropy ratio of :func:`_dp_rows` on one and on two threads (issue 29: ≤ 2 on
    any thread count), interleaved medians."""
    dev = device()
    B, n, k = (64, 1000, 10) if quick else (256, 1000, 10)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, n, generator=gen).to(dev).requires_grad_(True)
    g = torch.randn(B, n, generator=gen).to(dev)
    tree = _step(lambda v: relaxed_topk(v, k, 0.5, ExpFamilyEntropy()), x, g)
    ent = _step(lambda v: relaxed_topk(v, k, 0.5, Entropy()), x, g)
    rows = []
    for threads in (1, 2):
        with _threads(threads):
            t = time_interleaved({"tree": tree, "ent": ent}, repeat=5 if quick else 15,
                                 warmup=2)
        unit = "thread" if threads == 1 else "threads"
        rows.append(row(f"relaxed_topk ExpFamilyEntropy, {threads} {unit} ({B}x{n} f32 k={k}, "
                        f"fwd+bwd)", t["tree"], f"Entropy relaxation, {threads} {unit}",
                        t["ent"], note=f"issue 29: target ratio ≤ 2; peer ops/call "
                        f"{count_ops(ent)}", ops=count_ops(tree)))
    return rows


def _correlated_rows(quick: bool, threads: int | None = None) -> list[dict]:
    """Issue 29: a training step of examples/correlated_topk.py, CorrelatedKSubset vs the plain
    ExpFamilyEntropy top-k, same size, same process, interleaved; on ``threads`` threads if
    given (named in the rows), else on the run's."""
    if threads is not None:
        with _threads(threads):
            rows = _correlated_rows(quick)
        unit = "thread" if threads == 1 else "threads"
        return [{**r, "name": f"{r['name']}, {threads} {unit}"} for r in rows]
    import perturb
    from perturb.structured import CorrelatedKSubset, KSubset

    examples = pathlib.Path(__file__).resolve().parents[1] / "examples"
    sys.path.insert(0, str(examples))
    try:
        import correlated_topk as ex
    finally:
        sys.path.remove(str(examples))
    args = ex.parse_args(["--quick"] if quick else [])
    d, k, bs, dev = args.d, args.k, args.batch_size, device()
    gen = torch.Generator().manual_seed(0)
    x, t, _ = ex.make_data(40 * bs, d, k, args.sigma, gen)
    x, t = x.to(dev), t.to(dev)
    methods = list(ex.METHODS)
    names = {"corr": methods[0], "efe": "top-k ExpFamilyEntropy"}

    def trainer(method):
        torch.manual_seed(0)
        sel, reg = ex.Selector(args.hidden).to(dev), ex.regressor(d, args.hidden).to(dev)
        opt = torch.optim.Adam([*sel.parameters(), *reg.parameters()], lr=args.lr)
        noise_gen = torch.Generator(device=dev).manual_seed(1)
        i = [0]

        def step():
            j = i[0] % 40
            i[0] += 1
            xb, tb = x[j * bs:(j + 1) * bs], t[j * bs:(j + 1) * bs]
            mask = ex.select(method, sel, xb, k, args.tau, noise_gen, exact=False)
            loss = ((reg(xb * mask).squeeze(-1) - tb) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return step

    steps = {key: trainer(m) for key, m in names.items()}
    repeat = 9 if quick else 21
    ts = time_interleaved(steps, repeat=repeat, warmup=2)
    ops = {key: count_ops(f) for key, f in steps.items()}
    size = f"d={d}, batch {bs}, k={k}"
    rows = [row(f"correlated_topk.py training step, CorrelatedKSubset ({size})", ts["corr"],
                "same step, top-k ExpFamilyEntropy", ts["efe"],
                note=f"issue 29: target ratio ≤ 3; peer ops/step {ops['efe']}", ops=ops["corr"])]
    # the relaxation alone (Gumbel noise drawn outside), fwd+bwd
    th = torch.randn(bs, 2 * d - 1, generator=gen).to(dev).requires_grad_(True)
    gt = torch.randn(bs, 2 * d - 1, generator=gen).to(dev)
    u = torch.randn(bs, d, generator=gen).to(dev).requires_grad_(True)
    gu = torch.randn(bs, d, generator=gen).to(dev)
    fam = perturb.ExpFamilyEntropy()
    corr = _step(lambda v: perturb.regularized_argmax(v, CorrelatedKSubset(k), fam, args.tau),
                 th, gt)
    plain = _step(lambda v: perturb.regularized_argmax(v, KSubset(k), fam, args.tau), u, gu)
    tr = time_interleaved({"corr": corr, "plain": plain}, repeat=repeat, warmup=2)
    rows.append(row(f"CorrelatedKSubset marginals fwd+bwd ({bs}x{2 * d - 1}, k={k})", tr["corr"],
                    f"KSubset ExpFamilyEntropy fwd+bwd ({bs}x{d})", tr["plain"],
                    note="analytic backward: tangent passes", ops=count_ops(corr)))
    return rows


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

    rows += _dp_rows(quick)
    rows += _dp_thread_rows(quick)
    rows += _correlated_rows(quick)
    rows += _correlated_rows(quick, threads=1)
    return rows


if __name__ == "__main__":
    for r in run(quick=True):
        print(r)
