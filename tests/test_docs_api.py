"""The API reference of the documentation site is written from the modules' ``__all__`` when the
site is built (docs/_ext/perturb_api.py, configured in docs/conf.py): every public module is
listed in the configuration, and every public name gets an entry, so a new name appears without
editing the docs. Needs no Sphinx (the generator is plain Python)."""
import importlib
import importlib.util
import inspect
import pathlib
import pkgutil
import re

import pytest

import perturb

ROOT = pathlib.Path(__file__).resolve().parents[1]
# public plain modules (every non-private subpackage is public too); the other modules of the
# package implement names that a package re-exports
PUBLIC_PLAIN_MODULES = {"perturb.nn", "perturb.checks"}


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def conf():
    return _load("perturb_docs_conf", ROOT / "docs" / "conf.py")


@pytest.fixture(scope="module")
def generator():
    return _load("perturb_api", ROOT / "docs" / "_ext" / "perturb_api.py")


def _public_modules():
    found = {"perturb"} | PUBLIC_PLAIN_MODULES
    for info in pkgutil.walk_packages(perturb.__path__, "perturb."):
        if info.ispkg and not any(p.startswith("_") for p in info.name.split(".")):
            found.add(info.name)
    return found


def _configured(conf):
    return [m for _, ms in conf.perturb_api_sections for m in ms]


def test_configuration_lists_every_public_module_once(conf):
    listed = _configured(conf)
    assert len(listed) == len(set(listed))
    assert set(listed) == _public_modules()
    titles = [t for t, _ in conf.perturb_api_sections]
    for group in ("Core", "Noise", "Structured families", "Boxes", "Distributions", "Checks"):
        assert group in titles


def test_every_public_name_has_an_entry(conf, generator, tmp_path):
    generator.write(tmp_path, conf.perturb_api_sections, conf.perturb_api_extra)
    for module in _configured(conf):
        source = (tmp_path / f"{module}.rst").read_text()
        for name in generator.public_names(module, conf.perturb_api_extra):
            documented = re.search(rf"^\.\. auto(class|function|data):: {re.escape(module)}\."
                                   rf"{re.escape(name)}$", source, re.M)
            linked = re.search(rf"^\.\. py:(class|function):: {re.escape(name)}$", source, re.M)
            assert documented or linked, f"{module}.{name} has no entry"
    index = (tmp_path / "index.rst").read_text()
    assert all(f"   {m}\n" in index for m in _configured(conf))


def test_each_object_documented_once(conf, generator):
    """A name exported by several modules (perturb.Gumbel, perturb.noise.Gumbel) has one full
    entry, in the module it belongs to; the others link to it."""
    rows = generator.plan(_configured(conf), conf.perturb_api_extra)
    homes = {}
    for module, entries in rows.items():
        for name, kind, target in entries:
            if kind == "data" or target is not None:
                continue
            obj = getattr(importlib.import_module(module), name)
            assert id(obj) not in homes, (f"{module}.{name}", homes.get(id(obj)))
            homes[id(obj)] = f"{module}.{name}"
    assert homes[id(perturb.Gumbel)] == "perturb.noise.Gumbel"
    assert homes[id(perturb.perturb)] == "perturb.perturb"


def test_every_public_name_has_a_docstring(conf, generator):
    missing = []
    for module in _configured(conf):
        mod = importlib.import_module(module)
        for name in generator.public_names(module, conf.perturb_api_extra):
            obj = getattr(mod, name)
            if (inspect.isclass(obj) or callable(obj)) and not inspect.getdoc(obj):
                missing.append(f"{module}.{name}")
    assert missing == []


def test_makefile_builds_the_site_with_warnings_as_errors():
    make = (ROOT / "Makefile").read_text()
    rule = make[make.index("\ndocs:"):].split("\n\n")[0]
    assert "sphinx" in rule and " -W" in rule and " docs site" in rule
