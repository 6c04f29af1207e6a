"""Sinkhorn: perturb.structured.sinkhorn against POT.

Forward rows, three regimes, each against every batched method of POT 0.9.7
(``ot.batch.solve_batch(M, reg, method=...)``: ``"sinkhorn"`` iterates in the exp domain on
K = e^{−M/τ}, ``"log_sinkhorn"`` with log-sum-exps, ``"auto"``, which picks ``"log_sinkhorn"`` for
reg > 0) and against POT's per-problem ``ot.sinkhorn(..., method="sinkhorn")`` and
``method="sinkhorn_log"`` loops (timed on a few of the problems, the time scaled to the batch:
the note says so). Ours is the public ``sinkhorn(-M, tau)`` (the negation is timed; our scores
are W = −M). Equal tolerance: we stop on the max-abs marginal error of a doubly stochastic
plan (marginals 1), POT on the L2 norm of its marginal error with marginals 1/n, checked every
10 iterations, so POT gets ``tol / n`` (mass units; its criterion is the stricter one). The
achieved marginal errors of both are in the notes; a peer that does not reach the tolerance
within the iteration cap is timed at the cap.

- easy: 32 x 128 x 128, M ~ U[0, 1), τ = 0.2, float64, tol 1e-6 (|M|/τ ≤ 5: a few iterations);
- moderate: 32 x 128 x 128, M ~ N(0, 1), τ = 0.2, float32, tol 1e-4 (and ours without
  acceleration);
- hard: 16 x 64 x 64, M ~ N(0, 1), τ = 0.05, float64, tol 1e-6 (plain Sinkhorn needs more than
  20,000 iterations here; ours with and without forced ε-scaling);

then:

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


#: the three regimes of the forward rows: (cost, τ, dtype, tol, iteration cap)
REGIMES = {
    "easy": ("U[0, 1)", 0.2, torch.float64, 1e-6, 20000),
    "moderate": ("N(0, 1)", 0.2, torch.float32, 1e-4, 5000),
    "hard": ("N(0, 1)", 0.05, torch.float64, 1e-6, 20000),
}


def _cost(kind, batch, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "U[0, 1)":
        return torch.rand(batch, n, n, generator=g, dtype=dtype).to(device())
    return torch.randn(batch, n, n, generator=g, dtype=dtype).to(device())


def _timed(fns, repeat, slow_ms=2000.0):
    """Median times; a function whose first (warm-up) call takes longer than ``slow_ms`` is
    timed by that one call (the multi-second peers of the hard case), the others interleaved."""
    import time
    first = {}
    for k, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        first[k] = (time.perf_counter() - t0) * 1e3
    fast = {k: fn for k, fn in fns.items() if first[k] <= slow_ms}
    times = time_interleaved(fast, repeat=repeat, warmup=0)
    return {k: times.get(k, first[k]) for k in fns}, {k for k in fns if k not in fast}


def _regime_rows(name, quick):
    """Our public ``sinkhorn(-M, τ)`` against every batched method of POT 0.9
    (``ot.batch.solve_batch``: "sinkhorn" in the exp domain, "log_sinkhorn", "auto" which picks
    "log_sinkhorn" for reg > 0) and POT's per-problem ``ot.sinkhorn`` loops, at equal tolerance
    (module docstring), on the cost M (our scores are W = −M; the negation is timed)."""
    kind, tau, dtype, tol, cap = REGIMES[name]
    batch, n = {"easy": (32, 128), "moderate": (32, 128), "hard": (16, 64)}[name]
    if quick:
        batch = batch // 4
    M = _cost(kind, batch, n, dtype)
    fns = {"ours": lambda: sinkhorn(-M, tau=tau, n_iters=cap, tol=tol)}
    extra = {"moderate": ("plain Sinkhorn", dict(accelerate=False)),
             "hard": ("ε-scaling", dict(eps_scaling=True))}.get(name)
    if extra is not None:
        fns[extra[0]] = lambda: sinkhorn(-M, tau=tau, n_iters=cap, tol=tol, **extra[1])
    # per-problem loops on the first `sub` problems, their time scaled to the batch
    sub = min(batch, 2 if name == "hard" else 8)
    peers = {}
    if ot_batch is not None:
        for method in ("sinkhorn", "log_sinkhorn", "auto"):
            peers[f"POT solve_batch {method}"] = (lambda m=method: ot_batch.solve_batch(
                M, tau, max_iter=cap, tol=tol / n, method=m, grad="detach").plan * n)
        if not (quick and name == "hard"):
            mass = torch.full((n,), 1.0 / n, dtype=dtype, device=M.device)
            for method in ("sinkhorn", "sinkhorn_log"):
                peers[f"POT ot.sinkhorn {method} (per problem)"] = (
                    lambda m=method: torch.stack([ot.sinkhorn(
                        mass, mass, M[k], tau, method=m, stopThr=tol / n, numItermax=cap)
                        for k in range(sub)]) * n)
    with torch.no_grad():
        times, single = _timed({**fns, **peers}, repeat=3 if quick else 5)
        errs = {k: _marginal_error(fn()) for k, fn in {**fns, **peers}.items()}
        syncs = count_syncs(fns["ours"])
    info = (f"{name}: M ~ {kind}, τ={tau}, {str(dtype).replace('torch.', '')}, tol {tol:g} "
            f"(POT tol {tol / n:.2g} in mass units)")
    shape = f"{batch}x{n}x{n}"
    rows = []
    for peer, t_peer in ((k, times[k]) for k in peers):
        per_problem = "per problem" in peer
        if per_problem:
            t_peer = t_peer * batch / sub
        note = (f"{info}; marginal error ours {errs['ours']:.1e}, peer {errs[peer]:.1e}"
                + (f"; peer timed on {sub} of the {batch} problems, x{batch // sub}"
                   if per_problem and sub < batch else "")
                + ("; peer timed once (slow)" if peer in single else ""))
        rows.append(row(f"{name} forward {shape}", times["ours"], peer, t_peer, note,
                        syncs=syncs))
    if extra is not None and peers:
        best = min((k for k in peers if "per problem" not in k), key=lambda k: times[k])
        rows.append(row(f"{name} forward {shape} [{extra[0]}]", times[extra[0]], best,
                        times[best], f"{info}; marginal error ours {errs[extra[0]]:.1e}, peer "
                        f"{errs[best]:.1e}"))
    if not peers:
        rows.append(row(f"{name} forward {shape}", times["ours"], "POT", None,
                        f"{info}; POT not installed"))
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

    # 1. forward at equal tolerance against every batched and per-problem method of POT
    for name in REGIMES:
        rows += _regime_rows(name, quick)

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
