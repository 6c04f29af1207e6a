"""Every ```python block of docs/*.md and README.md runs as written.

The blocks of one page run in order, in one namespace (as a reader pastes them into one
session), in a fresh interpreter in a temporary folder (files a page writes stay there; the
registry and the process-wide settings a page changes do not leak into the other tests). The
script keeps the blocks under a ``__main__`` guard of its own, so that the processes a page
spawns (the distributed trainer) import it without running them again. A block whose info
string says ``wordnet`` (```` ```python wordnet ````) needs the WordNet database and is left out
where it is not installed; no other tag exists.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from perturb.boxes.hierarchy import wordnet_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
TAGS = {"", "wordnet"}
_BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)
_HAVE_WORDNET = (wordnet_dir() / "data.noun").is_file() and (wordnet_dir() / "index.noun").is_file()


def blocks(page: pathlib.Path) -> list[tuple[str, str, int]]:
    """``(tag, code, line)`` of every python block of ``page``."""
    text = page.read_text()
    return [(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in _BLOCK.finditer(text)]


def _script(page: pathlib.Path) -> str:
    runnable = [(f"{page.name}:{line}", code) for tag, code, line in blocks(page)
                if tag == "" or (tag == "wordnet" and _HAVE_WORDNET)]
    return (f"BLOCKS = {runnable!r}\n\n"
            "def main():\n"
            "    import torch\n"
            "    torch.manual_seed(0)\n"
            "    ns = {'__name__': '__main__'}\n"
            "    for label, code in BLOCKS:\n"
            "        print('---', label, flush=True)\n"
            "        exec(compile(code, label, 'exec'), ns)\n\n"
            "if __name__ == '__main__':\n"
            "    main()\n")


def test_every_block_has_a_known_tag():
    bad = [(p.name, line, tag) for p in PAGES for tag, _, line in blocks(p) if tag not in TAGS]
    assert not bad, f"unknown tags (known: {TAGS}): {bad}"


def test_pages_have_blocks():
    assert sum(len(blocks(p)) for p in PAGES) >= 30


@pytest.mark.parametrize("page", [pytest.param(p, id=p.name) for p in PAGES if blocks(p)])
def test_page_runs_as_written(page, tmp_path):
    script = tmp_path / "page.py"
    script.write_text(_script(page))
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (f"{page.name}: a block failed\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}")
