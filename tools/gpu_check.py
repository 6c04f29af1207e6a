"""``make gpu-check``: everything a lent GPU should run, in one command, results in one folder.

Three parts, each a subprocess with its own time limit (times on one H100 estimated from the
sizes, not yet measured), all three within ``TOTAL`` = 540 s, so the whole stays under 10 minutes:

1. ``tests``: the suite's CUDA tests, ``pytest -m gpu`` with :mod:`gpu_check_pytest` (which
   marks every test skipped without CUDA as ``gpu``); junit xml and log. Expected 1-3 min
   (the examples' ``--quick --device cuda`` runs dominate; ``pytest-xdist`` spreads them when
   installed); limit 200 s.
2. ``parity``: :mod:`gpu_check_parity`, every public function on ``--device`` against the CPU,
   values and gradients, float64 and float32; markdown table. 31 s CPU against CPU on a shared
   2-core machine; limit 120 s (the first calls of the compiled softmax compile).
3. ``bench``: ``python -m bench --device cuda --only <topic> --out <folder>/bench``, one
   process per topic (:data:`BENCH_ORDER`), so that a topic cut at the limit leaves the others'
   tables.
   Expected 2-4 min; limit: what is left of ``TOTAL`` (at least 220 s; ``--quick-bench``:
   smaller sizes).

``summary.md`` lists the machine, the optional packages that are missing (their tests fail to
collect and their bench rows are skipped: carry them as wheels, see the README's "GPU check"),
and each part's status and time. Exit status: 0 when every part passed, 1 otherwise, 2 when
the device is not available.

Usage::

    python tools/gpu_check.py                       # CUDA, into results/gpu-check
    python tools/gpu_check.py --parts parity --device cpu --out /tmp/check   # CPU dry run
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"

#: optional packages the tests, examples or bench peers import (missing: said in summary.md)
OPTIONAL = ("ot", "torch_struct", "box_embeddings", "mlxtend", "sklearn", "matplotlib", "tqdm",
            "hypothesis", "mpmath", "scipy", "networkx", "pytest_timeout", "xdist")

#: limit of each part and of the three together, seconds
LIMITS = {"tests": 200, "parity": 120, "bench": 540}  # bench: per topic, within what is left
TOTAL = 540


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(TOOLS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(name: str, cmd: list[str], log: pathlib.Path, limit: float) -> tuple[str, float]:
    """Run ``cmd`` with its output in ``log``; (status, seconds)."""
    t0 = time.perf_counter()
    print(f"== {name}: {' '.join(cmd)} (limit {limit:.0f} s, log {log})", flush=True)
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                                timeout=limit).returncode
            status = "passed" if rc == 0 else f"FAILED (exit {rc})"
        except subprocess.TimeoutExpired:
            status = f"FAILED (over its {limit:.0f} s limit)"
    dt = time.perf_counter() - t0
    print(f"   {name}: {status} in {dt:.0f} s", flush=True)
    return status, dt


#: bench topics in this order (the rows issue 29 asks for on CUDA first), then any others
BENCH_ORDER = ("sinkhorn", "categorical", "subsets", "trees", "boxes", "perturbed_boxes")


def bench_topics() -> list[str]:
    found = sorted(p.stem[len("bench_"):] for p in (ROOT / "bench").glob("bench_*.py"))
    return [t for t in BENCH_ORDER if t in found] + [t for t in found if t not in BENCH_ORDER]


def pytest_command(out: pathlib.Path, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "tests", "-p", "gpu_check_pytest", "-m", "gpu",
           "-p", "no:cacheprovider", "-q", "-rfEs", f"--junitxml={out / 'pytest.xml'}"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "8"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", "200"]
    return cmd + extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu-check"))
    parser.add_argument("--device", default="cuda", help="device of the parity and bench parts")
    parser.add_argument("--parts", nargs="*", default=list(LIMITS), choices=list(LIMITS))
    parser.add_argument("--quick-bench", action="store_true", help="python -m bench --quick")
    parser.add_argument("--pytest-args", default="",
                        help='extra pytest arguments, one string (e.g. "-k sinkhorn")')
    args = parser.parse_args(argv)

    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu-check: CUDA is not available on this machine (for a CPU dry run of the "
              "parity part: --parts parity --device cpu)", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    missing = [m for m in OPTIONAL if importlib.util.find_spec(m) is None]
    dev_name = (torch.cuda.get_device_name() if args.device.startswith("cuda")
                else platform.processor() or platform.machine())
    print(f"gpu-check: {dev_name}, torch {torch.__version__}, python {platform.python_version()}"
          f"; missing optional packages: {', '.join(missing) or 'none'}", flush=True)

    results: dict[str, tuple[str, float]] = {}
    start = time.perf_counter()
    for part in args.parts:
        limit = min(LIMITS[part], TOTAL - (time.perf_counter() - start))
        if part == "tests":
            results[part] = _run(part, pytest_command(out, shlex.split(args.pytest_args)),
                                 out / "pytest.log", limit)
        elif part == "parity":
            results[part] = _run(part, [sys.executable, str(TOOLS / "gpu_check_parity.py"),
                                        "--device", args.device, "--out",
                                        str(out / "parity.md")],
                                 out / "parity.log", limit)
        else:  # one process per topic, the targets first: a slow topic cut at the
            # limit leaves the tables of the others
            (out / "bench").mkdir(exist_ok=True)
            for topic in bench_topics():
                limit = min(LIMITS[part], TOTAL - (time.perf_counter() - start))
                if limit < 10:
                    results[f"bench {topic}"] = ("NOT RUN (no time left)", 0.0)
                    continue
                cmd = [sys.executable, "-m", "bench", "--device", args.device, "--only", topic,
                       "--out", str(out / "bench")] + (["--quick"] if args.quick_bench else [])
                results[f"bench {topic}"] = _run(f"bench {topic}", cmd,
                                                 out / "bench" / f"{topic}.log", limit)

    lines = ["# gpu-check", "",
             f"Machine: {dev_name}, torch {torch.__version__}, python "
             f"{platform.python_version()}, {os.cpu_count()} CPU cores.", "",
             f"Missing optional packages: {', '.join(missing) or 'none'} (a test module that "
             "imports one fails to collect; a bench peer that is missing has no row).", "",
             "| part | status | seconds | output |", "|---|---|---|---|"]
    files = {"tests": "pytest.log, pytest.xml", "parity": "parity.md, parity.log"}
    for part, (status, dt) in results.items():
        topic = part.split()[-1]
        output = files.get(part, f"bench/{topic}.*.md, bench/{topic}.log")
        lines.append(f"| {part} | {status} | {dt:.0f} | {output} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(s == "passed" for s, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
