"""Sinkhorn: perturb.structured.sinkhorn against POT's ``ot.sinkhorn(..., method="sinkhorn_log")``.

POT is called per problem with torch tensors (its torch backend), its gradient is autograd
through its iterations. Both solve the same problem (M = −W, reg = τ, a = b = 1) to the same
stopping threshold (POT: L2 norm of the marginal error, checked every 10 iterations; ours:
max-abs, checked every 10 iterations). Rows:

- forward + backward of 8 x 64 x 64 at τ = 0.5 and τ = 0.1, tol 1e-6, float64 (float32 cannot
  reach 1e-6 at these scales, so both would run to the cap);
- memory held by the autograd graph after the forward (the tensors saved for backward, measured
  with ``torch.autograd.graph.saved_tensors_hooks``) at 50 and 500 iterations (tol = 0),
  implicit vs unrolled: the implicit one does not grow with the iterations;
- one 1000 x 1000 problem forward + backward.
"""
from __future__ import annotations

import warnings

import torch

from bench._timing import row, time_ms
from perturb.structured.permutations import SinkhornConvergenceWarning, sinkhorn

try:
    import ot
except ImportError:  # pragma: no cover
    ot = None


def _problem(batch, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, n, n, generator=g, dtype=dtype),
            torch.randn(batch, n, n, generator=g, dtype=dtype))


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
        ones = torch.ones(n, dtype=w.dtype)
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

    # 1. batched forward + backward, 8 x 64 x 64
    w, up = _problem(8, 64, torch.float64)
    for tau, cap in ((0.5, 1000), (0.1, 300 if quick else 1000)):
        reps = repeat if tau >= 0.5 else 3
        ours = time_ms(_ours(w, up, tau, cap, 1e-6), repeat=reps, warmup=1)
        with torch.no_grad():
            P = sinkhorn(w, tau=tau, n_iters=cap, tol=1e-6)
        err = float((P.sum(-2) - 1).abs().max().maximum((P.sum(-1) - 1).abs().max()))
        note = f"float64, tol 1e-6, cap {cap} iterations; our max marginal error {err:.1e}"
        if ot is None:
            rows.append(row(f"fwd+bwd 8x64x64 tau={tau}", ours, "POT", None,
                            note + "; POT not installed"))
            continue
        peer = time_ms(_pot(w, up, tau, cap, 1e-6), repeat=reps, warmup=1)
        gw_ours, gw_pot = _ours(w, up, tau, cap, 1e-6)(), _pot(w, up, tau, cap, 1e-6)()
        diff = float((gw_ours - gw_pot).abs().max() / gw_pot.abs().max())
        rows.append(row(f"fwd+bwd 8x64x64 tau={tau}", ours, "POT sinkhorn_log (per problem)",
                        peer, note + f"; relative grad difference to POT {diff:.1e}"))

    # 2. memory of the backward graph, implicit vs unrolled
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

    # 3. one large problem
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
