"""CUDA-against-CPU parity of every public function and class of ``perturb``.

Each case builds its inputs on the CPU from a seeded generator, runs once with the inputs on the
reference device (``--ref``, default ``cpu``) and once on ``--device`` (default ``cuda``), and
compares every output tensor and the gradients of ``⟨cotangent, outputs⟩`` with respect to the
case's differentiable inputs, in float64 and in float32, within the tolerances below (a case may
state its own, with its reason). Random draws come from one CPU stream in both runs
(:class:`CpuRandom`, a ``TorchFunctionMode`` that redirects ``torch.rand``, ``randn``,
``randint``, ``randperm``, ``normal``, ``multinomial``, ``rand_like``/``randn_like`` and the
in-place ``uniform_``/``normal_``/``exponential_`` to a seeded CPU generator and moves the result
to the device), so stochastic functions are compared draw for draw.

Coverage: every name in ``perturb.__all__`` and in the ``__all__`` of its subpackages
(:data:`NAMESPACES`) is either covered by a case (``Case.covers``) or listed in
``EXCLUDED`` with the reason (both in ``tools/gpu_check_cases.py``); ``tests/test_gpu_check.py`` checks this on the CPU, so a new
public name cannot be forgotten.

With ``--device cpu`` (against ``cpu``) the harness proves that every case runs and is
deterministic; with ``--device cuda`` it is the parity check of ``make gpu-check``. Exit status
1 on any mismatch or error. Usage::

    python tools/gpu_check_parity.py --device cuda --out results/gpu-check/parity.md
    python tools/gpu_check_parity.py --device cpu --only sinkhorn topk
"""
from __future__ import annotations

import argparse
import importlib
import math
import pathlib
import sys
import time
import traceback
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

import perturb

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gpu_check_cases import EXCLUDED, F32, F64, Case, _cases, _flatten  # noqa: E402,F401

#: the namespaces whose ``__all__`` the harness covers
NAMESPACES = ("perturb", "perturb.noise", "perturb.structured", "perturb.structured.permutations",
              "perturb.structured.subsets", "perturb.structured.trees", "perturb.boxes",
              "perturb.boxes.hierarchy", "perturb.distributions", "perturb.latent", "perturb.nn",
              "perturb.checks")

#: default tolerances (atol, rtol) per dtype: float64 leaves room for reductions in another
#: order (cuBLAS, CUDA reductions) over iterative solvers; float32 for its rounding of ~1e-7
#: amplified by at most ~1e3 in the solvers' conditioning
TOL = {F64: (1e-9, 1e-7), F32: (2e-4, 2e-3)}


# --------------------------------------------------------------------------------------------
# one CPU random stream for both devices
# --------------------------------------------------------------------------------------------

class CpuRandom(TorchFunctionMode):
    """Every random draw made while active comes from one seeded CPU generator and is moved to
    the device asked for: the same numbers on every device. ``exponential_`` is drawn as
    −log U with U clamped to [tiny, 1 − eps/2], the CPU algorithm of the package's noises."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(seed)

    def _factory(self, func, args, kwargs):
        dev = kwargs.pop("device", None)
        kwargs["generator"] = self.gen
        kwargs.pop("pin_memory", None)
        out = func(*args, **kwargs)
        return out if dev is None else out.to(dev)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.rand, torch.randn, torch.randint, torch.randperm):
            return self._factory(func, args, kwargs)
        if func is torch.normal:
            if any(isinstance(a, torch.Tensor) for a in args):
                dev = next(a.device for a in args if isinstance(a, torch.Tensor))
                args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
                kwargs["generator"] = self.gen
                return func(*args, **kwargs).to(dev)
            return self._factory(func, args, kwargs)
        if func in (torch.rand_like, torch.randn_like):
            x = args[0]
            dtype = kwargs.get("dtype") or x.dtype
            base = torch.rand if func is torch.rand_like else torch.randn
            return base(x.shape, generator=self.gen, dtype=dtype).to(kwargs.get("device")
                                                                     or x.device)
        if func is torch.multinomial or func is torch.Tensor.multinomial:
            probs = args[0]
            kwargs["generator"] = self.gen
            return torch.multinomial(probs.detach().cpu(), *args[1:], **kwargs).to(probs.device)
        if func in (torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.exponential_):
            x = args[0]
            kwargs["generator"] = self.gen
            if func is torch.Tensor.exponential_:
                lambd = args[1] if len(args) > 1 else kwargs.pop("lambd", 1.0)
                kwargs.pop("lambd", None)
                fi = torch.finfo(x.dtype)
                u = torch.rand(x.shape, generator=self.gen, dtype=x.dtype).clamp_(
                    fi.tiny, 1.0 - fi.eps / 2)
                tmp = u.log_().neg_() / lambd
            else:
                tmp = func(torch.empty(x.shape, dtype=x.dtype), *args[1:], **kwargs)
            with torch.no_grad():
                x.copy_(tmp)
            return x
        return func(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# coverage
# --------------------------------------------------------------------------------------------

def public_names() -> dict[str, Any]:
    """Every ``namespace.name`` of :data:`NAMESPACES`' ``__all__`` and its object."""
    out = {}
    for ns in NAMESPACES:
        mod = importlib.import_module(ns)
        for name in mod.__all__:
            out[f"{ns}.{name}"] = getattr(mod, name)
    return out


def _same(a: Any, b: Any) -> bool:
    return a is b or (isinstance(a, (int, float, str, tuple)) and type(a) is type(b) and a == b)


def coverage(cases: list[Case] | None = None) -> tuple[dict[str, str], list[str], list[str]]:
    """(how each public name is covered: a case name or ``excluded: reason``; the uncovered
    names; the stale entries: a covers/EXCLUDED name that is not public). A name re-exported
    under several namespaces is covered by any entry naming the same object."""
    cases = _cases() if cases is None else cases
    names = public_names()
    entries: list[tuple[str, str]] = [(n, c.name) for c in cases for n in c.covers]
    entries += [(n, "excluded: " + why) for n, why in EXCLUDED.items()]
    stale = sorted({n for n, _ in entries if n not in names})
    how: dict[str, str] = {}
    for name, obj in names.items():
        for n, label in entries:
            if n in names and _same(names[n], obj):
                how[name] = label
                break
    missing = sorted(n for n in names if n not in how)
    return how, missing, stale


# --------------------------------------------------------------------------------------------
# running and comparing
# --------------------------------------------------------------------------------------------

def _run(case: Case, device: str, dtype: torch.dtype, seed: int) -> dict[str, Any]:
    """Outputs and gradients of one case on one device, as CPU tensors (and numbers)."""
    g = torch.Generator().manual_seed(seed)
    raw = case.inputs(g, dtype)
    x = {k: (v.to(device=device, dtype=dtype) if isinstance(v, torch.Tensor)
             and v.is_floating_point() else v.to(device) if isinstance(v, torch.Tensor) else v)
         for k, v in raw.items()}
    for k in case.grad:
        x[k] = x[k].detach().requires_grad_()
    with CpuRandom(seed):
        out = case.fn(x)
    flat = _flatten(out)
    res: dict[str, Any] = {}
    for p, v in flat:
        res[p] = v.detach().cpu() if isinstance(v, torch.Tensor) else v
    if case.grad:
        cot = torch.Generator().manual_seed(seed + 1)
        terms = []
        for p, v in flat:
            if isinstance(v, torch.Tensor) and v.requires_grad and v.is_floating_point():
                c = torch.randn(v.shape, generator=cot, dtype=F64).to(device=v.device,
                                                                      dtype=v.dtype)
                terms.append((v * c).sum())
        if terms:
            grads = torch.autograd.grad(sum(terms), [x[k] for k in case.grad], allow_unused=True)
            for k, gr in zip(case.grad, grads):
                res[f"grad[{k}]"] = None if gr is None else gr.detach().cpu()
    return res


def _compare(ref: dict[str, Any], dev: dict[str, Any], atol: float, rtol: float
             ) -> tuple[bool, float, str]:
    """(all within atol + rtol |ref|, the largest |dev − ref| / (atol + rtol |ref|), where)."""
    if ref.keys() != dev.keys():
        return False, math.inf, f"outputs differ: {sorted(ref.keys() ^ dev.keys())}"
    worst, where = 0.0, ""
    for k, r in ref.items():
        d = dev[k]
        if r is None or d is None:
            if (r is None) != (d is None):
                return False, math.inf, f"{k}: gradient on one device only"
            continue
        if isinstance(r, torch.Tensor):
            if r.shape != d.shape or r.dtype != d.dtype:
                return False, math.inf, f"{k}: {tuple(r.shape)} {r.dtype} vs {tuple(d.shape)} {d.dtype}"
            r64, d64 = r.double(), d.double()
            fin = torch.isfinite(r64)
            if not torch.equal(fin, torch.isfinite(d64)) or not torch.equal(r64[~fin], d64[~fin]):
                return False, math.inf, f"{k}: non-finite entries differ"
            if r64.numel() == 0 or not bool(fin.any()):
                continue
            err = float(((d64 - r64).abs()[fin] / (atol + rtol * r64.abs()[fin])).max())
        else:
            err = abs(float(d) - float(r)) / (atol + rtol * abs(float(r)))
        if err > worst:
            worst, where = err, k
    return worst <= 1.0, worst, where


def run_cases(device: str = "cuda", ref: str = "cpu", only: list[str] | None = None,
              dtypes: tuple[torch.dtype, ...] | None = None, seed: int = 0,
              log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run every case (or those named in ``only``) on ``ref`` and ``device``; one row each per
    dtype: ``case, dtype, ok, err (worst |diff| / (atol + rtol |ref|)), where, atol, rtol,
    seconds, note``."""
    rows = []
    for case in _cases():
        if only and case.name not in only:
            continue
        for dtype in case.dtypes:
            if dtypes and dtype not in dtypes:
                continue
            atol, rtol = (case.tol or TOL).get(dtype, TOL[dtype])
            t0 = time.perf_counter()
            try:
                a = _run(case, ref, dtype, seed)
                b = _run(case, device, dtype, seed)
                ok, err, where = _compare(a, b, atol, rtol)
                n_out = sum(not k.startswith("grad[") for k in a)
                n_grad = sum(k.startswith("grad[") and a[k] is not None for k in a)
            except Exception as exc:  # a case that fails to run is a failure, with its reason
                ok, err, n_out, n_grad = False, math.inf, 0, 0
                where = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
                log(traceback.format_exc())
            row = dict(case=case.name, dtype=str(dtype).replace("torch.", ""), ok=ok, err=err,
                       outputs=n_out, grads=n_grad, where=where, atol=atol, rtol=rtol, seconds=time.perf_counter() - t0,
                       note=case.note)
            rows.append(row)
            log(f"{'ok ' if ok else 'FAIL'} {case.name:24s} {row['dtype']:8s} err {err:.2g} "
                f"{where} ({row['seconds']:.1f} s)")
    return rows


def markdown(rows: list[dict[str, Any]], device: str, ref: str) -> str:
    """The parity table, then the coverage table."""
    how, missing, stale = coverage()
    dev = (torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available()
           else device)
    lines = [f"# Parity: {device} ({dev}) against {ref}", "",
             f"torch {torch.__version__}; err = max |{device} − {ref}| / (atol + rtol |{ref}|) "
             "over every output and gradient (≤ 1 passes); random draws from one CPU stream.", "",
             "| case | dtype | result | err | outputs | gradients | worst | atol | rtol | s "
             "| note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['dtype']} | {'ok' if r['ok'] else '**FAIL**'} | "
                     f"{r['err']:.2g} | {r['outputs']} | {r['grads']} | {r['where']} | "
                     f"{r['atol']:g} | {r['rtol']:g} | "
                     f"{r['seconds']:.1f} | {r['note']} |")
    n_bad = sum(not r["ok"] for r in rows)
    lines += ["", f"{len(rows) - n_bad} of {len(rows)} passed.", "",
              "## Coverage of the public names", "", "| name | covered by |", "|---|---|"]
    lines += [f"| {n} | {how.get(n, '**missing**')} |" for n in sorted(how.keys() | set(missing))]
    if stale:
        lines += ["", "Stale entries (not public): " + ", ".join(stale)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="device compared (default cuda)")
    parser.add_argument("--ref", default="cpu", help="reference device (default cpu)")
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    parser.add_argument("--out", default=None, help="markdown file for the tables")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available", file=sys.stderr)
        return 2
    how, missing, stale = coverage()
    rows = run_cases(args.device, args.ref, args.only)
    text = markdown(rows, args.device, args.ref)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    bad = [r for r in rows if not r["ok"]]
    if missing or stale:
        print(f"coverage: missing {missing}, stale {stale}", file=sys.stderr)
    print(f"parity: {len(rows) - len(bad)} of {len(rows)} passed")
    return 1 if bad or missing or stale else 0


if __name__ == "__main__":
    sys.exit(main())
