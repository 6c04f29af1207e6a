"""The library's hot paths timed at two git revisions, interleaved: does a change regress speed?

    python -m bench.compare_revisions BEFORE [AFTER] [--repeat 15] [--threads 1] [--cases FILE]

Each revision is checked out into a temporary git worktree and imported by its own worker
process (two versions of ``perturb`` cannot share one interpreter). The driver asks the two
workers in turn (A, B, B, A, ...) to time one call of each case, so that load on the machine falls
on both alike, and prints the medians and their ratio AFTER / BEFORE as a Markdown table.
``AFTER`` defaults to the working tree. The cases come from a Python file that each worker runs
against its own revision (``--cases FILE``; default ``bench/hot_cases.py``, the hot paths through
public functions whose signatures have not changed since each family's first release, with
fixed seeds). It defines ``CASES`` and may define ``PAIRS``, ``[ours, peer, target]`` triples
whose two cases are then timed back to back, so that each revision's ratio to the peer comes
from one process and one run (``bench/regime_cases.py``: issue 29's regimes and their peers).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The worker: runs a case file against its revision, then times one call per request ("name"
# on stdin -> milliseconds on stdout).
_WORKER = r'''
import gc, json, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
torch.set_flush_denormal(True)
exec(compile(open(sys.argv[2]).read(), sys.argv[2], 'exec'))    # defines CASES (and PAIRS)
for fn in CASES.values():          # warm-up (allocator, lazy imports, first-call paths)
    fn(); fn()
print(json.dumps({"cases": list(CASES), "pairs": globals().get("PAIRS", [])}), flush=True)
for line in sys.stdin:
    fn = CASES[line.strip()]
    # as timeit: no cyclic garbage collection inside a timed call (a full collection costs
    # tens of ms after a case that leaves many objects, e.g. a 20,000-iteration peer loop,
    # and would land in whichever call comes next)
    gc.collect()
    gc.disable()
    t0 = time.perf_counter()
    fn()
    t = (time.perf_counter() - t0) * 1e3
    gc.enable()
    print(t, flush=True)
'''


def _worktree(rev: str, tmp: pathlib.Path) -> pathlib.Path:
    path = tmp / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(path), rev],
                   check=True)
    return path


def _start(path: pathlib.Path, threads: int, case_file: str
           ) -> tuple[subprocess.Popen, dict]:
    """A worker importing ``perturb`` from ``path`` and running ``case_file``; returns it and
    its ``{"cases": [...], "pairs": [[ours, peer, target], ...]}``."""
    cmd = [sys.executable, "-c", _WORKER, str(threads), str(pathlib.Path(case_file).resolve())]
    proc = subprocess.Popen(cmd, cwd=path,
                            env={"PYTHONPATH": str(path), "OMP_NUM_THREADS": str(threads),
                                 "PATH": "/usr/bin:/bin"},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def _time(proc: subprocess.Popen, case: str) -> float:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(case + "\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def _units(cases: list[str], pairs: list[list[str]]) -> list[tuple[str, ...]]:
    """The timing units: each (ours, peer) pair timed back to back, the other cases alone
    (``pairs`` name cases of ``cases`` only)."""
    paired = {c for pr in pairs for c in pr[:2]}
    return [tuple(pr[:2]) for pr in pairs] + [(c,) for c in cases if c not in paired]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", help="git revision of the baseline")
    p.add_argument("after", nargs="?", default=None, help="git revision (default: working tree)")
    p.add_argument("--repeat", type=int, default=15, help="timed calls per case and revision")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cases", default=str(ROOT / "bench" / "hot_cases.py"), metavar="FILE",
                   help="a Python file defining CASES (name -> callable) and optionally PAIRS "
                        "([ours, peer, target], ...), run by each worker against its revision "
                        "(default: bench/hot_cases.py); e.g. bench/regime_cases.py")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [_worktree(args.before, pathlib.Path(tmp))]
        paths.append(ROOT if args.after is None else _worktree(args.after, pathlib.Path(tmp)))
        try:
            workers = [_start(path, args.threads, args.cases) for path in paths]
            cases = [c for c in workers[0][1]["cases"] if c in workers[1][1]["cases"]]
            pairs = [pr for pr in workers[1][1]["pairs"] if pr[0] in cases and pr[1] in cases]
            units = _units(cases, pairs)
            times: dict[str, list[list[float]]] = {c: [[], []] for c in cases}
            for r in range(args.repeat):
                for unit in units:
                    order = (0, 1) if r % 2 == 0 else (1, 0)     # ABBA: neither goes first
                    for i in order:
                        for case in (unit if r % 2 == 0 else unit[::-1]):
                            times[case][i].append(_time(workers[i][0], case))
            for proc, _ in workers:
                proc.kill()
        finally:
            for path in paths:
                if path != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(path)], check=False)
    after = args.after or "working tree"
    print(f"{args.threads} thread(s), denormals flushed, medians of {args.repeat} interleaved "
          f"calls\n")
    print(f"| case | {args.before} (ms) | {after} (ms) | ratio |")
    print("|---|---|---|---|")
    for case, (a, b) in times.items():
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {case} | {ma:.3g} | {mb:.3g} | {mb / ma:.2f} |")
    if pairs:
        # each revision's ratio to the peer timed next to it in the same worker
        print(f"\n| ours | peer | ours/peer at {args.before} | ours/peer at {after} | target |")
        print("|---|---|---|---|---|")
        for ours, peer, target in pairs:
            rb, ra = (statistics.median(o / q for o, q in zip(times[ours][i], times[peer][i]))
                      for i in (0, 1))
            print(f"| {ours} | {peer} | {rb:.3g} | {ra:.3g} | {target} |")


if __name__ == "__main__":
    main()
