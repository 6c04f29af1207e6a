"""Run the ``--quick`` mode of every example into the gallery cache (``make docs-gallery``).

    python tools/run_gallery.py [--cache build/docs-gallery] [--force] [names ...]

Each example writes its table (``.md``), numbers (``.json``) and plots (``.png``) to
``<cache>/<name>/``; the docs build (``docs/_ext/perturb_gallery.py``) makes one page per example
from them. An example is rerun only when its script (or ``examples/_common.py``) is newer than
its ``<cache>/<name>/.done`` stamp, so a second ``make docs`` costs nothing here. Wall times go
to ``<cache>/<name>/.done`` (the gallery page shows them).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def examples() -> list[str]:
    """The example scripts, in the Makefile's DEMOS order when it lists them."""
    names = sorted(p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_"))
    make = (ROOT / "Makefile").read_text()
    start = make.find("DEMOS :=")
    if start >= 0:
        block = make[start:].split("\n\n")[0].replace("\\\n", " ")
        order = block.split(":=", 1)[1].split()
        names = [n for n in order if n in names] + [n for n in names if n not in order]
    return names


def _stale(name: str, stamp: pathlib.Path) -> bool:
    if not stamp.exists():
        return True
    t = stamp.stat().st_mtime
    return any(p.stat().st_mtime > t for p in (EXAMPLES / f"{name}.py", EXAMPLES / "_common.py"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default=str(ROOT / "build" / "docs-gallery"))
    p.add_argument("--force", action="store_true", help="rerun even when up to date")
    p.add_argument("names", nargs="*", help="examples to run (default: all)")
    args = p.parse_args(argv)
    cache = pathlib.Path(args.cache)
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    failed = []
    for name in args.names or examples():
        out = cache / name
        stamp = out / ".done"
        if not args.force and not _stale(name, stamp):
            continue
        out.mkdir(parents=True, exist_ok=True)
        stamp.unlink(missing_ok=True)
        print(f"=== examples/{name}.py --quick", flush=True)
        t0 = time.perf_counter()
        with open(out / "log.txt", "w") as log:
            rc = subprocess.call([sys.executable, str(EXAMPLES / f"{name}.py"), "--quick",
                                  "--no-progress", "--out", str(out)], stdout=log,
                                 stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        if rc:
            failed.append(name)
            print(f"examples/{name}.py --quick failed (exit {rc}); see {out / 'log.txt'}")
            continue
        stamp.write_text(f"{time.perf_counter() - t0:.1f}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
