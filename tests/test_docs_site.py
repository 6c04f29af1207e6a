"""The built documentation site (``make docs`` → ``site/``), checked as a reader gets it
(``make docs-check``): every internal link and anchor resolves, every image is a real image file,
the search index lists the API, no reST role or math source is left raw, and, in headless
Chromium (Debian's ``chromium``), MathJax has typeset every formula offline. Skipped when the
site is not built; the browser part is skipped when chromium is not installed."""
from __future__ import annotations

import html.parser
import pathlib
import re
import shutil
import subprocess
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SITE = ROOT / "site"

pytestmark = pytest.mark.skipif(not (SITE / "index.html").exists(),
                                reason="site/ not built (make docs)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class _Page(html.parser.HTMLParser):
    """Links, image sources, element ids, and the text outside <script>, <style> and <pre>."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.images: list[str] = []
        self.ids: set[str] = set()
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "img" and a.get("src"):
            self.images.append(a["src"])
        if tag in ("script", "style", "pre"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style", "pre") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def _pages() -> dict[pathlib.Path, _Page]:
    pages = {}
    for path in sorted(SITE.rglob("*.html")):
        if "_sources" in path.parts or "_modules" in path.parts[len(SITE.parts):][:1]:
            continue
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path] = page
    return pages


@pytest.fixture(scope="module")
def pages():
    return _pages()


def _local(href: str) -> bool:
    scheme = urllib.parse.urlsplit(href).scheme
    return scheme in ("", "file") and not href.startswith("//")


def test_expected_pages_exist(pages):
    names = {p.relative_to(SITE).as_posix() for p in pages}
    for page in ("index.html", "search.html", "genindex.html", "core.html", "permutations.html",
                 "reference/index.html", "reference/perturb.html",
                 "reference/perturb.structured.permutations.html", "gallery/index.html",
                 "gallery/sinkhorn_sort.html"):
        assert page in names, page
    examples = sorted(p.stem for p in (ROOT / "examples").glob("*.py")
                      if not p.stem.startswith("_"))
    assert [n for n in examples if f"gallery/{n}.html" not in names] == []


def test_every_internal_link_and_anchor_resolves(pages):
    ids = {path: page.ids for path, page in pages.items()}
    broken = []
    for path, page in pages.items():
        for href in page.links:
            if not _local(href):
                continue
            target, _, fragment = href.partition("#")
            dest = (path.parent / urllib.parse.unquote(target)).resolve() if target else path
            if dest.is_dir():
                dest = dest / "index.html"
            if not dest.exists():
                broken.append(f"{path.relative_to(SITE)}: {href}")
            elif fragment and dest.suffix == ".html":
                known = ids.get(dest)
                if known is None:
                    parsed = _Page()
                    parsed.feed(dest.read_text(encoding="utf-8"))
                    known = ids[dest] = parsed.ids
                if urllib.parse.unquote(fragment) not in known:
                    broken.append(f"{path.relative_to(SITE)}: {href} (no such anchor)")
    assert broken == []


def test_every_image_is_a_local_image_file(pages):
    signatures = (b"\x89PNG", b"<svg", b"<?xml", b"GIF8", b"\xff\xd8")
    bad = []
    count = 0
    for path, page in pages.items():
        for src in page.images:
            count += 1
            if not _local(src) or src.startswith("data:"):
                bad.append(f"{path.relative_to(SITE)}: {src} (not local)")
                continue
            file = (path.parent / urllib.parse.unquote(src.partition("#")[0])).resolve()
            if not file.exists() or not file.read_bytes()[:5].lstrip().startswith(signatures):
                bad.append(f"{path.relative_to(SITE)}: {src}")
    assert bad == []
    assert count >= 13          # at least a thumbnail per example


def test_no_raw_roles_or_math_source_left(pages):
    raw = re.compile(r":(math|func|class|meth|attr|mod|data|ref|doc):`|\.\. math::|\$\$")
    left = [f"{p.relative_to(SITE)}: {m.group(0)}" for p, page in pages.items()
            for m in raw.finditer("".join(page.text))]
    assert left == []


def test_search_index_lists_the_api():
    index = SITE / "searchindex.js"
    assert index.exists() and (SITE / "search.html").exists()
    text = index.read_text(encoding="utf-8")
    for name in ("gumbel_softmax", "sinkhorn", "BoxEmbedding", "relax"):
        assert name in text


def test_math_is_served_locally(pages):
    """MathJax from site/_static (sphinx-mathjax-offline), never from a CDN."""
    with_math = [p for p in pages if 'class="math' in p.read_text(encoding="utf-8")]
    assert with_math, "no page has math"
    for path in with_math:
        scripts = re.findall(r'<script[^>]+src="([^"]*mathjax[^"]*)"', path.read_text("utf-8"))
        assert scripts and all(_local(s) for s in scripts), (path, scripts)
        assert all((path.parent / s.split("?")[0]).resolve().exists() for s in scripts)


def _dom(path: pathlib.Path) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--virtual-time-budget=20000", "--dump-dom", path.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True).stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_math_is_typeset_in_a_browser(pages):
    """Every page with math, loaded offline in headless Chromium: MathJax replaced every
    formula (no ``\\(`` / ``\\[`` source left in the text, one ``mjx-container`` per formula)."""
    with_math = [p for p in pages if 'class="math' in p.read_text(encoding="utf-8")]
    for path in with_math:
        dom = _dom(path)
        formulas = path.read_text(encoding="utf-8").count('class="math notranslate')
        text = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)
        assert dom.count("<mjx-container") >= formulas, path
        assert not re.search(r"\\\(|\\\[|\$\$|:math:`", text), path


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_pages_render_in_a_browser():
    for page in ("index.html", "gallery/index.html", "reference/perturb.structured.html"):
        dom = _dom(SITE / page)
        assert "<article" in dom and "perturb" in dom, page
