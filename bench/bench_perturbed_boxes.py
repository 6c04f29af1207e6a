"""Boxes perturbed by any noise (perturb.boxes.expected_volume): the quadrature path against
the Gumbel closed form, time and accuracy.

Workload: P pairs of d = 10 boxes (float64, corners U[0, 1) with widths U[0.05, 0.5), so
sides range from nested to disjoint at β = 0.1), log E[vol(a ∩ b)] summed, forward and
backward to the corners. The reference is the Gumbel closed form (Bessel volume of the Gumbel
intersection) measured in the same run, interleaved. Rows: the quadrature with Gumbel noise
forced (a Gumbel subclass, so the accuracy against the closed form is measured on the same
law), Normal noise, Logistic noise (the two-box closed form of
perturb/boxes/_logistic_sides.py) and Logistic noise on the path before the closed form
(pairs by quadrature, ``_before``); and ``log1m_containment_prob`` (the negative-pair loss)
with Normal and Logistic noise (both paths) against the Gumbel one. The note gives the
largest relative error of the log volume against the closed form and the quadrature nodes per
side (panels × order, last pass).

Training step: 256 positive pairs (b a random sub-box of a, −log P(b ⊆ a)) and 2560 negative
pairs (random boxes, sides 0.1–0.5 in the unit cube, −log(1 − P)), d = 10, float32 corners
(the hierarchy trainer's dtype), forward and backward, Normal, Logistic, before-the-closed-form
Logistic, Uniform(−β, β) and NegativeExponential(β) noise against the Gumbel closed form (same
run, interleaved, one thread).
"""
from __future__ import annotations

import torch

from bench._timing import count_ops, device, row, time_interleaved
from perturb.boxes import Box, expected_volume, log1m_containment_prob, log_containment_prob
from perturb.boxes import expected_volumes as ev
from perturb.noise import Gumbel, Logistic, NegativeExponential, Normal, Uniform

BETA = 0.1


class _QuadratureGumbel(Gumbel):
    """Gumbel noise taking the generic quadrature (not the closed form)."""


def _before(step):
    """``step`` run on the path before the two-box closed form of
    perturb/boxes/_logistic_sides.py: one-box sides in closed form, Logistic pairs by
    quadrature (the switch ``expected_volumes._LOGISTIC_PAIRS_CLOSED`` off while it runs; a
    Logistic subclass would lose the one-box closed form and the Logistic quadrature rule
    too)."""
    def run():
        ev._LOGISTIC_PAIRS_CLOSED = False
        try:
            step()
        finally:
            ev._LOGISTIC_PAIRS_CLOSED = True
    return run


def _data(n: int, d: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        lo = torch.rand(n, d, generator=g, dtype=torch.float64)
        out += [lo, lo + 0.05 + 0.45 * torch.rand(n, d, generator=g, dtype=torch.float64)]
    return [t.to(device()).requires_grad_() for t in out]


def _step(noise, tensors, fn=None):
    def step():
        for t in tensors:
            t.grad = None
        a, b = Box(tensors[0], tensors[1]), Box(tensors[2], tensors[3])
        out = (fn(a, b, noise=noise) if fn is not None
               else expected_volume(a, b, noise=noise, log=True))
        out.sum().backward()
    return step


def _training_data(n_pos: int, negatives: int, d: int, seed: int = 0) -> list[torch.Tensor]:
    """Corners of positive pairs (b inside a, each side of b cut by up to 30 % of a's on each
    end) and of random negative pairs, float32."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    lo_a = rand(n_pos, d)
    up_a = lo_a + 0.1 + 0.4 * rand(n_pos, d)
    lo_b = lo_a + 0.3 * (up_a - lo_a) * rand(n_pos, d)
    up_b = up_a - 0.3 * (up_a - lo_a) * rand(n_pos, d)
    n = n_pos * negatives
    lo_c, lo_e = rand(n, d), rand(n, d)
    out = [lo_a, up_a, lo_b, up_b, lo_c, lo_c + 0.1 + 0.4 * rand(n, d),
           lo_e, lo_e + 0.1 + 0.4 * rand(n, d)]
    return [t.float().to(device()).requires_grad_() for t in out]


def _training_step(noise, tensors):
    def step():
        for t in tensors:
            t.grad = None
        pos = log_containment_prob(Box(tensors[0], tensors[1]), Box(tensors[2], tensors[3]),
                                   noise=noise)
        neg = log1m_containment_prob(Box(tensors[4], tensors[5]),
                                     Box(tensors[6], tensors[7]), noise=noise)
        (-(pos.sum() + neg.sum())).backward()
    return step


def _training_rows(quick: bool) -> list[dict]:
    """The training step of the module docstring, one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n_pos = 64 if quick else 256
        tensors = _training_data(n_pos, 10, 10)
        noises = {"gumbel": Gumbel(BETA), "normal": Normal(BETA), "logistic": Logistic(BETA),
                  "logistic (quadrature)": Logistic(BETA), "uniform": Uniform(-BETA, BETA),
                  "negative exponential": NegativeExponential(BETA)}
        steps = {k: _training_step(v, tensors) for k, v in noises.items()}
        steps["logistic (quadrature)"] = _before(steps["logistic (quadrature)"])
        times = time_interleaved(steps,
                                 repeat=3 if quick else 5, warmup=1)
    finally:
        torch.set_num_threads(threads)
    size = f"{n_pos} positives + {10 * n_pos} negatives, d=10, float32, scale {BETA}, 1 thread"
    notes = {"normal": "one-box sides in closed form, intersections by quadrature with the "
                       "hazard backward",
             "logistic": "every side and the loss of nested negatives in closed form "
                         "(perturb/boxes/_logistic_sides.py)",
             "logistic (quadrature)": "the path before the two-box closed form: intersections "
                                      "and the loss of nested negatives by quadrature",
             "uniform": "Uniform(−β, β): Gauss–Legendre on the pieces between the kinks "
                        "(exact; perturb/boxes/_bounded_sides.py)",
             "negative exponential": "closed form of the piecewise-exponential integrand "
                                     "(perturb/boxes/_negexp_sides.py)"}
    return [row(f"training step fwd+bwd, {name} noise ({size})", times[name],
                "Gumbel closed form (same run)", times["gumbel"],
                note="−log P on positives, −log(1 − P) on negatives; " + notes[name])
            for name in notes]


def run(quick: bool = False) -> list[dict]:
    rows = _training_rows(quick)
    repeat = 3 if quick else 5
    for n in ((64, 512) if quick else (256, 2048)):
        d = 10
        tensors = _data(n, d)
        size = f"{n} pairs, d={d}, float64, scale {BETA}"
        noises = {"gumbel (closed form)": Gumbel(BETA),
                  "gumbel (quadrature)": _QuadratureGumbel(BETA),
                  "normal": Normal(BETA), "logistic": Logistic(BETA),
                  "logistic (quadrature)": Logistic(BETA)}
        steps = {k: _step(v, tensors) for k, v in noises.items()}
        steps["logistic (quadrature)"] = _before(steps["logistic (quadrature)"])
        times = time_interleaved(steps, repeat=repeat)
        with torch.no_grad():
            a, b = Box(tensors[0], tensors[1]), Box(tensors[2], tensors[3])
            closed = expected_volume(a, b, noise=Gumbel(BETA), log=True)
            quad = expected_volume(a, b, noise=_QuadratureGumbel(BETA), log=True)
            err = float(((quad - closed).abs() / closed.abs().clamp_min(1.0)).max())
        ref = times["gumbel (closed form)"]
        for name in ("gumbel (quadrature)", "normal", "logistic", "logistic (quadrature)"):
            ops = count_ops(steps[name]) if n == (64 if quick else 256) else None
            note = (f"largest relative error of the log volume against the closed form "
                    f"{err:.1e}" if name == "gumbel (quadrature)" else
                    "closed form of the two-box side (perturb/boxes/_logistic_sides.py)"
                    if name == "logistic" else
                    "quadrature: a locating pass (4 panels × order 8) on the inverted sides "
                    "only + 1 pass of ≥1 panel (3.75 noise widths) × order 24 per side, log F "
                    "from erfc, in cache-sized blocks" if name == "normal" else
                    "quadrature: 1–2 locating passes (4 panels × order 8) + 1 pass of ≥4 "
                    "panels (twice the noise's width) × order 16 per side")
            rows.append(row(f"log E[vol(a ∩ b)] fwd+bwd, {name} noise ({size})", times[name],
                            "Gumbel closed form (same run)", ref, ops=ops, note=note))
        loss = time_interleaved({
            "normal": _step(Normal(BETA), tensors, log1m_containment_prob),
            "logistic": _step(Logistic(BETA), tensors, log1m_containment_prob),
            "logistic (quadrature)": _before(_step(Logistic(BETA), tensors,
                                                   log1m_containment_prob)),
            "gumbel": _step(Gumbel(BETA), tensors, log1m_containment_prob)}, repeat=repeat)
        rows.append(row(f"log(1 − P(b ⊆ a)) fwd+bwd, normal noise ({size})", loss["normal"],
                        "Gumbel noise, closed form (same run)", loss["gumbel"],
                        note="the negative-pair loss: direct log-space integral of what b "
                             "loses, on each half of b, plus both volumes"))
        rows.append(row(f"log(1 − P(b ⊆ a)) fwd+bwd, logistic noise ({size})",
                        loss["logistic"], "Gumbel noise, closed form (same run)",
                        loss["gumbel"],
                        note="the negative-pair loss: closed forms of both volumes and of what "
                             "b loses (T_1 + T_2 − T_3, perturb/boxes/_logistic_sides.py)"))
        rows.append(row(f"log(1 − P(b ⊆ a)) fwd+bwd, logistic (quadrature) noise ({size})",
                        loss["logistic (quadrature)"], "Gumbel noise, closed form (same run)",
                        loss["gumbel"], note="the path before the closed form: intersections "
                                             "and the loss of nested pairs by quadrature"))
    return rows


if __name__ == "__main__":
    for r in run(quick=True):
        print(r)
