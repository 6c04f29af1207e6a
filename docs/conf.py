"""Sphinx configuration of the documentation site (``make docs`` builds it into ``site/``).

Offline by design: no intersphinx, MathJax served from the files of the ``sphinx-mathjax-offline``
package, the API pages written from the modules' ``__all__`` (``_ext/perturb_api.py``) and the
gallery from the ``--quick`` runs of the examples (``_ext/perturb_gallery.py``).
"""
from __future__ import annotations

import os
import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import perturb  # noqa: E402

project = "perturb"
author = "the perturb authors"
copyright = "the perturb authors"
release = version = perturb.__version__

# The public modules, grouped as the package is: the API reference has one page per module and
# documents every name of its __all__ (tests/test_docs_api.py checks that every public module of
# the package is listed here).
perturb_api_sections = [
    ("Core", ["perturb"]),
    ("Noise", ["perturb.noise"]),
    ("Structured families", ["perturb.structured", "perturb.structured.permutations",
                             "perturb.structured.subsets", "perturb.structured.trees"]),
    ("Boxes", ["perturb.boxes", "perturb.boxes.hierarchy"]),
    ("Distributions", ["perturb.distributions"]),
    ("Checks", ["perturb.checks"]),
    ("Latent-variable models", ["perturb.latent"]),
    ("Modules (torch.nn)", ["perturb.nn"]),
]

# public names a module keeps out of its __all__ on purpose (documented all the same):
# `from perturb import *` must leave the name `perturb` bound to the package
perturb_api_extra = {"perturb": ["perturb"]}

# where the gallery pages take their tables and plots from (make docs-gallery writes it)
perturb_gallery_cache = os.environ.get("PERTURB_GALLERY_CACHE",
                                       str(ROOT / "build" / "docs-gallery"))

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinx-mathjax-offline",   # MathJax 3 copied into _static: math renders without a network
    "perturb_api",
    "perturb_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "README.md"]
templates_path: list[str] = []

# MyST: $…$ / $$…$$ math, ```{directive} fences, header anchors for [text](#anchor) links
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# autodoc: the documented names only; no members inherited from torch (nn.Module.forward's
# "Define the computation performed at every call", Tensor methods)
autodoc_default_options = {"members": True, "inherited-members": False, "undoc-members": False,
                           "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_inherit_docstrings = False     # a forward() without its own docstring stays undocumented
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_preprocess_types = False
napoleon_use_ivar = True         # Attributes: as fields (autodoc documents the members)

# Broken references fail the build (-W), except names of other projects: intersphinx needs the
# network, so references to torch, numpy, scipy, networkx, POT and the standard library are left
# unlinked. This is the complete ignore list.
nitpicky = True
nitpick_ignore_regex = [
    # other projects and the standard library
    (r"py:.*", r"(torch|numpy|np|scipy|networkx|nx|ot|matplotlib|typing|collections|abc|os|"
               r"pathlib|argparse|enum|dataclasses|types|contextlib|warnings)(\..*)?"),
    (r"py:.*", r"(Tensor|Generator|Module|Parameter|Distribution|Optimizer|Constraint|dtype|"
               r"device|Size|Callable|Sequence|Iterable|Iterator|Mapping|Any|Literal|Optional|"
               r"Union|TypeVar|Self|Path|PathLike|Enum|Warning|UserWarning|RuntimeWarning)"),
    (r"py:.*", r"(int|float|bool|str|bytes|None|tuple|list|dict|set|frozenset|object|type|"
               r"callable|optional|ValueError|TypeError|RuntimeError|Exception|NotImplemented)"),
    # private names (base classes shown by show-inheritance, helpers a docstring points at):
    # never documented, rendered as code
    (r"py:.*", r"(.*\.)?_\w+(\..*)?"),
    # :mod: pointers to the modules that implement a public module (perturb.core,
    # perturb.noise.base, ...): the site documents names where they are exported, so these
    # render as code (with the source one click away through the [source] links)
    (r"py:mod", r".*"),
    # classes that appear in public signatures but are not exported (no public name to link to)
    (r"py:class", r"perturb\.(structures\.PairInfo|boxes\.losses\.PairSet|"
                  r"distributions\.constraints\.Structure(Support|Hull))"),
]

# README links to the published site become links between the pages of this build
_SITE = "https://torch-perturb.github.io/perturb/"


def _local_links(app, relative_path, parent_docname, content):
    import re
    content[0] = re.sub(re.escape(_SITE) + r"([\w/]+)\.html", r"\1.md", content[0])
    content[0] = content[0].replace("reference/index.md", "reference/index.rst")


def setup(app):
    app.connect("include-read", _local_links)


html_theme = "furo"
html_title = f"perturb {release}"
html_static_path = ["_static"]
html_css_files = ["gallery.css"]
html_show_sourcelink = False
html_copy_source = False

# docstring sections of the package beyond napoleon's own, rendered like "Args:"
napoleon_custom_sections = [("Model fields", "params_style"),
                            ("Optimisation fields", "params_style"),
                            ("Diagnostics fields", "params_style"),
                            ("Fields", "params_style")]
