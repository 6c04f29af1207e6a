"""Trees: perturb's arborescence marginals vs pytorch-struct's NonProjectiveDependencyCRF, and
the two exact tree samplers (Wilson's loop-erased walks vs sequential conditioning).

Both compute the edge marginals of arborescences by Tutte's directed matrix-tree theorem.
pytorch-struct's convention: N words, ``log_potentials[b, i, j]`` scores head i → modifier j and
the diagonal holds the root scores; ``multiroot=True`` is the plain rooted-arborescence model.
Ours with n = N + 1 nodes and root 0 is the same problem with ``w[:, 0, 1:] = diag(φ)`` and
``w[:, 1:, 1:] = φ`` off the diagonal. pytorch-struct adds 1e-5 to every edge weight (its
``eps``), so the two agree to about 1e-5, not to rounding; the rows report the difference.
Timed on one thread, ours and the peer interleaved (ABBA); the ratio is the median per-block
ratio. Marginal rows count the batch elements each algorithm handled (``paths``: LU fast path /
cycle reduction / full log-space elimination). Sampler rows compare ``method="wilson"`` with
``method="conditional"`` (the peer column) on the same graphs, interleaved.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from bench._timing import count_ops, device, gc_paused, row, time_interleaved, time_ms
from perturb.structured import arborescence_marginals, sample_spanning_tree
from perturb.structured.trees import _matrix_tree as _mt

try:  # the peer library
    from torch_struct import NonProjectiveDependencyCRF
except Exception as exc:  # pragma: no cover - depends on the environment
    NonProjectiveDependencyCRF = None
    _IMPORT_ERROR = repr(exc)


def _ours(w: torch.Tensor) -> torch.Tensor:
    return arborescence_marginals(w, root=0)


def _theirs(phi: torch.Tensor) -> torch.Tensor:
    return NonProjectiveDependencyCRF(phi, multiroot=True).marginals


def _to_ours(phi: torch.Tensor) -> torch.Tensor:
    B, N, _ = phi.shape
    w = torch.zeros(B, N + 1, N + 1, dtype=phi.dtype, device=phi.device)
    w[:, 1:, 1:] = phi
    w[:, 0, 1:] = torch.diagonal(phi, dim1=-2, dim2=-1)
    return w


def _from_ours(mu: torch.Tensor) -> torch.Tensor:
    out = mu[:, 1:, 1:].clone()
    idx = torch.arange(out.shape[-1], device=mu.device)
    out[:, idx, idx] = mu[:, 0, 1:]
    return out


def _fwd_bwd(fn, x, c):
    def go():
        y = x.detach().requires_grad_(True)
        (fn(y) * c).sum().backward()
        return y.grad
    return go


def _abba(fo, fp, clocks):
    """One ABBA block: ([ours wall, ours CPU], [peer wall, peer CPU]), two calls each."""
    t0 = [c() for c in clocks]
    fo()
    t1 = [c() for c in clocks]
    fp()
    t2 = [c() for c in clocks]
    fp()
    t3 = [c() for c in clocks]
    fo()
    t4 = [c() for c in clocks]
    return ([(t1[k] - t0[k]) + (t4[k] - t3[k]) for k in (0, 1)],
            [(t2[k] - t1[k]) + (t3[k] - t2[k]) for k in (0, 1)])


def _paired(fo, fp, repeat: int, warmup: int = 2) -> tuple[float, float, float, float]:
    """Interleaved timing of ours and the peer in ABBA blocks (ours, peer, peer, ours):
    (median ours ms, median peer ms, median of the per-block ratios of wall time, the same of
    thread CPU time). Alternating the two in one loop makes load from other processes on a
    shared machine hit both alike, and the mirrored order cancels the advantage of running
    first in a pair (measured at up to 1.4x here: the allocator and caches favour whichever
    call follows the timer); no garbage collection inside the loop. The CPU-time ratio
    (``time.thread_time``: both libraries run on this one thread) leaves out the time the
    thread waits for a core, which dominates wall time when the machine is oversubscribed;
    page faults and cache misses still count."""
    for _ in range(warmup):
        fo()
        fp()
    to, tp, ratios, cpu_ratios = [], [], [], []
    clocks = (time.perf_counter, time.thread_time)
    with gc_paused():
        blocks = [_abba(fo, fp, clocks) for _ in range(repeat)]
    for a, b in blocks:
        to.append(a[0] / 2 * 1e3)
        tp.append(b[0] / 2 * 1e3)
        ratios.append(a[0] / b[0])
        cpu_ratios.append(a[1] / b[1])
    return (statistics.median(to), statistics.median(tp), statistics.median(ratios),
            statistics.median(cpu_ratios))


def _paired_row(name, fo, fp, repeat, note):
    ours_ms, peer_ms, ratio, cpu_ratio = _paired(fo, fp, repeat)
    r = row(name, ours_ms, "torch-struct", peer_ms, note + "; ratio = median of "
            f"{repeat} interleaved ABBA blocks, {torch.get_num_threads()} thread (thread CPU "
            f"time ratio {cpu_ratio:.3g})")
    r["ratio"] = ratio
    return r


def run(quick: bool = False) -> list[dict]:
    # one thread for both libraries: on a small shared machine OpenMP threads of two
    # processes contend and multi-threaded timings swing by 10x; restored at the end
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(quick)
    finally:
        torch.set_num_threads(threads)


def _paths(w: torch.Tensor) -> str:
    """How many batch elements each algorithm handled: LU / cycle reduction / elimination."""
    n = w.shape[-1]
    valid = ~torch.eye(n, dtype=torch.bool, device=w.device)
    valid[:, 0] = False
    *_, path = _mt.solve(w.to(torch.float64), valid.expand(w.shape), None, 0)
    counts = torch.bincount(path.long().flatten(), minlength=3).tolist()
    return f"paths LU/reduced/elim = {counts[0]}/{counts[1]}/{counts[2]}"


def _marginal_rows(B, N, dtype, scale, repeat, g):
    dev = device()
    phi = scale * torch.randn(B, N, N, dtype=dtype, generator=g).to(dev)
    w = _to_ours(phi)
    c = torch.randn(B, N + 1, N + 1, dtype=dtype, generator=g).to(dev)
    name = (f"arborescence marginals fwd+bwd {B}x{N + 1}x{N + 1} "
            f"{str(dtype).replace('torch.float', 'f')}" + (f", scores x{scale}" if scale != 1
                                                           else ""))
    mu = _ours(w).double()
    e_o = (mu.sum((-1, -2)) - N).abs().max().item()
    fo = _fwd_bwd(_ours, w, c)
    ops = count_ops(fo)
    note = f"{_paths(w)}; |Σμ − (n−1)|: ours {e_o:.1e}"
    if NonProjectiveDependencyCRF is None:
        r = row(name, time_ms(fo, repeat=repeat), "torch-struct", None,
                note + f"; torch-struct not importable: {_IMPORT_ERROR}")
        r["ops"] = ops
        return r
    fp = _fwd_bwd(_theirs, phi, _from_ours(c))
    mp = _theirs(phi).double()
    e_p = (mp.sum((-1, -2)) - N).abs().max().item()
    diff = (_from_ours(mu) - mp).abs().max().item()
    r = _paired_row(name, fo, fp, repeat,
                    note + f", peer {e_p:.1e}; max|μ_ours − μ_peer| = {diff:.1e} (peer adds "
                    "eps=1e-5 to weights)")
    r["ops"] = ops
    return r


def _sampler_row(name, w, n_samples, repeat, g_seed=0):
    def wil():
        return sample_spanning_tree(w, n_samples=n_samples, method="wilson",
                                    generator=torch.Generator(w.device).manual_seed(g_seed))

    def cond():
        return sample_spanning_tree(w, n_samples=n_samples, method="conditional",
                                    generator=torch.Generator(w.device).manual_seed(g_seed))
    t = time_interleaved({"wilson": wil, "conditional": cond}, repeat=repeat, warmup=1)
    r = row(name, t["wilson"], "perturb conditional", t["conditional"],
            f"Wilson vs sequential conditioning, interleaved, {repeat} repeats; "
            f"ops: Wilson {count_ops(wil)}, conditional {count_ops(cond)}")
    return r


def _slope(sizes, times):
    xs = [math.log(n) for n in sizes]
    ys = [math.log(t) for t in times]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)


def _run(quick: bool) -> list[dict]:
    rows = []
    dev = device()
    g = torch.Generator().manual_seed(0)
    repeat = 5 if quick else 15
    for B, N, dtype in ((16, 63, torch.float64), (64, 127, torch.float32)):
        for scale in (1, 20):
            rows.append(_marginal_rows(B, N, dtype, scale, repeat if B == 16 else
                                       max(3, repeat // 3), g))
    # samplers: 64 graphs x 32 nodes x 16 samples; 64 samples of one 100-node dense graph
    w = torch.randn(64, 32, 32, dtype=torch.float64, generator=g).to(dev)
    rows.append(_sampler_row("sample_spanning_tree 64 graphs x 32 nodes x 16 samples f64", w,
                             16, 3 if quick else 5))
    w = torch.randn(100, 100, dtype=torch.float64, generator=g).to(dev)
    rows.append(_sampler_row("sample_spanning_tree 64 samples, one 100-node dense graph f64", w,
                             64, 2 if quick else 3))
    # sampler scaling: 16 samples of one graph of n nodes
    for method, sizes in (("wilson", [25, 50, 100, 200] if quick else [25, 50, 100, 200, 400]),
                          ("conditional", [25, 50, 100])):
        times = []
        for n in sizes:
            x = torch.randn(n, n, dtype=torch.float64, generator=g).to(dev)
            t = time_ms(lambda: sample_spanning_tree(
                x, n_samples=16, method=method, generator=torch.Generator(dev).manual_seed(0)),
                repeat=3, warmup=1)
            times.append(t)
            rows.append(row(f"sample_spanning_tree {method}, 16 samples, n={n} f64", t, "—",
                            None, ""))
        rows.append(row(f"log-log slope of sampler time vs n ({method})", None, "—", None,
                        f"slope {_slope(sizes, times):.2f} over n={sizes}"))
    # marginal cost growth with n (forward + backward, batch 1, unit scale)
    sizes = [64, 128, 256] if quick else [64, 128, 256, 512]
    times = []
    for n in sizes:
        x = torch.randn(1, n, n, dtype=torch.float64, generator=g).to(dev)
        cc = torch.randn(1, n, n, dtype=torch.float64, generator=g).to(dev)
        t = time_ms(_fwd_bwd(_ours, x, cc), repeat=3 if quick else 5, warmup=1)
        times.append(t)
        rows.append(row(f"arborescence marginals fwd+bwd n={n} f64", t, "—", None, ""))
    rows.append(row("log-log slope of time vs n (fwd+bwd)", None, "—", None,
                    f"slope {_slope(sizes, times):.2f} over n={sizes} (O(n³) ⇒ 3)"))
    return rows
