"""Sinkhorn: perturb.structured.sinkhorn against POT.

The peer is POT's batched solver ``ot.batch.bregman_log_projection_batch`` (POT ≥ 0.9.6, log
domain, all problems at once; gradients by autograd through its iterations, ``grad="autodiff"``),
at equal tolerance: we stop on the max-abs marginal error of a doubly stochastic plan (marginals
1), POT on the change of its dual variables with marginals 1/n, so POT gets ``tol / n`` (mass
units). The achieved marginal errors of both are reported in the notes. POT's per-problem
``ot.sinkhorn(..., method="sinkhorn_log")`` loop is kept as a second row. Rows:

- forward, moderate case: 32 x 128 x 128, τ = 0.2, float32, tol 1e-4;
- forward, hard case: 16 x 64 x 64, τ = 0.05, float64, tol 1e-6 (plain Sinkhorn needs more than
  20,000 iterations here; ours with and without ε-scaling);
- forward + backward: 8 x 64 x 64, τ = 0.2, float64, tol 1e-6 (ours: implicit backward);
- one iteration of the absorbed-kernel engine (plain and over-relaxed) at 64 x 128 x 128 and
  16 x 512 x 512 float32, with kernel launches (CUDA) or aten ops (CPU) per iteration;
- memory held by the autograd graph, implicit vs unrolled, and one 1000 x 1000 problem.
"""
from __future__ import annotations

import warnings

import torch

from bench._timing import count_ops, count_syncs, device, row, time_interleaved, time_ms
from perturb.structured.permutations._sinkhorn import _scaling_block
from perturb.structured.permutations import SinkhornConvergenceWarning, sinkhorn

try:
    import ot
    import ot.batch as ot_batch
except ImportError:  # pragma: no cover
    ot = ot_batch = None


def _problem(batch, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, n, n, generator=g, dtype=dtype).to(device()),
            torch.randn(batch, n, n, generator=g, dtype=dtype).to(device()))


def _pot_batch(w, tau, tol, max_iter, grad="detach"):
    """POT's batched log-domain solver on K = W/τ, marginals 1/n, tol in mass units (tol/n);
    returns the plan rescaled to marginals 1."""
    n = w.shape[-1]
    u = torch.full(w.shape[:-1], 1.0 / n, dtype=w.dtype, device=w.device)
    out = ot_batch.bregman_log_projection_batch(w / tau, u, u, max_iter=max_iter, tol=tol / n,
                                                grad=grad)
    return out["T"] * n


def _marginal_error(P):
    return float((P.sum(-1) - 1).abs().max().maximum((P.sum(-2) - 1).abs().max()))


def _forward_rows(name, w, tau, tol, cap, repeat, extra_ours=()):
    rows = []
    fns = {"ours": lambda: sinkhorn(w, tau=tau, n_iters=cap, tol=tol)}
    for label, opts in extra_ours:
        fns[label] = (lambda o=opts: sinkhorn(w, tau=tau, n_iters=cap, tol=tol, **o))
    if ot_batch is not None:
        fns["pot"] = lambda: _pot_batch(w, tau, tol, cap)
    with torch.no_grad():
        times = time_interleaved(fns, repeat=repeat, warmup=1)
        errs = {k: _marginal_error(fn()) for k, fn in fns.items()}
        syncs = count_syncs(fns["ours"])
    shape = "x".join(map(str, w.shape))
    info = f"{w.dtype}, τ={tau}, tol {tol:g} (POT tol {tol / w.shape[-1]:.2g})"
    for k in ["ours", *[lab for lab, _ in extra_ours]]:
        label = "" if k == "ours" else f" [{k}]"
        note = f"{info}; marginal error ours {errs[k]:.1e}" + (
            f", POT {errs['pot']:.1e}" if "pot" in errs else "; POT not installed")
        rows.append(row(f"{name} forward {shape}{label}", times[k],
                        "POT ot.batch (log)", times.get("pot"), note,
                        syncs=syncs if k == "ours" else None))
    return rows


def _ours(w0, up, tau, n_iters, tol, backward="implicit"):
    def fn():
        w = w0.clone().requires_grad_()
        P = sinkhorn(w, tau=tau, n_iters=n_iters, tol=tol, backward=backward)
        (P * up).sum().backward()
        return w.grad
    return fn


def _pot(w0, up, tau, n_iters, tol):
    def fn():
        w = w0.clone().requires_grad_()
        n = w.shape[-1]
        ones = torch.ones(n, dtype=w.dtype, device=w.device)
        loss = 0
        for k in range(w.shape[0]):
            P = ot.sinkhorn(ones, ones, -w[k], tau, method="sinkhorn_log", stopThr=tol,
                            numItermax=n_iters)
            loss = loss + (P * up[k]).sum()
        loss.backward()
        return w.grad
    return fn


def _saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for backward while running fn() (the graph's memory)."""
    total = 0
    seen = set()

    def pack(t):
        nonlocal total
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def run(quick: bool = False) -> list[dict]:
    rows = []
    repeat = 3 if quick else 5
    warnings.simplefilter("ignore", SinkhornConvergenceWarning)
    if ot is not None:
        warnings.filterwarnings("ignore", message="Sinkhorn did not converge")
    cuda = device().type == "cuda"

    # 1. forward at equal tolerance against POT's batched solver
    w, _ = _problem(8 if quick else 32, 128, torch.float32)
    rows += _forward_rows("moderate", w, 0.2, 1e-4, 5000, repeat,
                          extra_ours=(("plain Sinkhorn", dict(accelerate=False)),))
    w, _ = _problem(4 if quick else 16, 64, torch.float64)
    rows += _forward_rows("hard", w, 0.05, 1e-6, 20000, 1 if quick else 3,
                          extra_ours=(("ε-scaling", dict(eps_scaling=True)),))

    # 2. forward + backward against POT ot.batch with autodiff
    w, up = _problem(8, 64, torch.float64)
    tau, tol, cap = 0.2, 1e-6, 20000
    fns = {"ours": _ours(w, up, tau, cap, tol)}
    if ot_batch is not None:
        def pot_fb():
            x = w.clone().requires_grad_()
            (_pot_batch(x, tau, tol, cap, grad="autodiff") * up).sum().backward()
            return x.grad
        fns["pot"] = pot_fb
    times = time_interleaved(fns, repeat=repeat, warmup=1)
    note = f"float64, τ={tau}, tol {tol:g}; implicit backward"
    if "pot" in fns:
        g1, g2 = fns["ours"](), fns["pot"]()
        note += f"; relative grad difference to POT {float((g1 - g2).abs().max() / g2.abs().max()):.1e}"
    rows.append(row("fwd+bwd 8x64x64", times["ours"], "POT ot.batch (log, autodiff)",
                    times.get("pot"), note, ops=None))
    if ot is not None and not quick:
        rows.append(row("fwd+bwd 8x64x64", times["ours"], "POT sinkhorn_log (per problem)",
                        time_ms(_pot(w, up, tau, cap, tol), repeat=repeat, warmup=1), note))

    # 3. one iteration of the engine (no convergence checks inside a block)
    for B, n in ((64, 128), (16, 512)):
        if quick and not cuda and n > 128:
            continue
        lk = torch.randn(B, n, n, device=device()) * 0.5
        u = torch.zeros(B, n, 1, device=device())
        v = torch.zeros(B, 1, n, device=device())
        a = torch.ones(B, n, device=device())
        om = torch.full((B, 1, 1), 1.5, device=device())
        k = 101  # 10 graph chunks + the final half-iteration on CUDA
        torch.set_grad_enabled(False)  # the graphed forward (CUDA) runs without autograd
        t_plain = time_ms(lambda: _scaling_block(lk, u, v, a, a, k, None, None, 30.0),
                          repeat=repeat)
        t_relax = time_ms(lambda: _scaling_block(lk, u, v, a, a, k, om, None, 30.0),
                          repeat=repeat)
        ops_plain = (count_ops(lambda: _scaling_block(lk, u, v, a, a, 20, None, None, 30.0))
                     - count_ops(lambda: _scaling_block(lk, u, v, a, a, 10, None, None, 30.0))
                     ) / 10
        ops_relax = (count_ops(lambda: _scaling_block(lk, u, v, a, a, 20, om, None, 30.0))
                     - count_ops(lambda: _scaling_block(lk, u, v, a, a, 10, om, None, 30.0))
                     ) / 10
        torch.set_grad_enabled(True)
        gb = 2 * B * n * n * 4 / 1e9  # two reads of K per iteration
        rows.append(row(f"one iteration {B}x{n}x{n} f32 (plain / over-relaxed)", t_plain / k,
                        "over-relaxed", t_relax / k,
                        f"per iteration, block of {k}; ops: eager per iteration (over-relaxed "
                        f"{ops_relax:g}); on CUDA blocks replay captured graphs",
                        ops=ops_plain, gbps=gb / (t_plain / k / 1e3)))

    # 4. memory of the backward graph, implicit vs unrolled
    w, up = _problem(8, 64, torch.float32, seed=1)
    for iters in (50, 500):
        mb = {}
        ms = {}
        for mode in ("implicit", "unroll"):
            fn = _ours(w, up, 0.1, iters, 0.0, backward=mode)

            def forward_only(mode=mode):
                x = w.clone().requires_grad_()
                return sinkhorn(x, tau=0.1, n_iters=iters, tol=0.0, backward=mode)
            mb[mode] = _saved_bytes(forward_only) / 2**20
            ms[mode] = time_ms(fn, repeat=repeat, warmup=1)
        rows.append(row(f"graph memory 8x64x64, {iters} iterations", ms["implicit"],
                        "perturb backward='unroll'", ms["unroll"],
                        f"saved for backward: implicit {mb['implicit']:.2f} MiB, unroll "
                        f"{mb['unroll']:.2f} MiB (float32); times are fwd+bwd"))

    # 5. one large problem
    n = 300 if quick else 1000
    w, up = _problem(1, n, torch.float32, seed=2)
    tau, cap, tol = 0.5, 200, 1e-4
    ours = time_ms(_ours(w, up, tau, cap, tol), repeat=2 if quick else 3, warmup=1)
    with torch.no_grad():
        P = sinkhorn(w, tau=tau, n_iters=cap, tol=tol)
    err = float((P.sum(-1) - 1).abs().max())
    note = f"float32, tau={tau}, tol {tol:g} (POT stopThr {tol:g}), cap {cap}; our error {err:.1e}"
    if ot is None:
        rows.append(row(f"fwd+bwd {n}x{n}", ours, "POT", None, note + "; POT not installed"))
    else:
        peer = time_ms(_pot(w, up, tau, cap, tol), repeat=2 if quick else 3, warmup=1)
        rows.append(row(f"fwd+bwd {n}x{n}", ours, "POT sinkhorn_log", peer, note))
    return rows
