"""Tests of tools/gpu_check.py, tools/gpu_check_parity.py (with its cases, gpu_check_cases.py)
and tools/gpu_check_pytest.py (``make gpu-check``), on the CPU: every public name has a parity
case or a stated exclusion, a subset of the cases runs CPU against CPU and is deterministic,
mismatches are caught, and the pytest plugin selects the CUDA tests.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import pathlib
import sys

import pytest
import torch

TOOLS = pathlib.Path(__file__).resolve().parent.parent / "tools"


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def parity():
    return _load("gpu_check_parity")


def test_every_public_name_has_a_case_or_a_reason(parity):
    """A new name in any ``__all__`` of :data:`NAMESPACES` must get a parity case or an entry
    in ``EXCLUDED`` saying why not; an entry for a name that is no longer public is stale."""
    how, missing, stale = parity.coverage()
    assert not missing, f"public names without a parity case or exclusion: {missing}"
    assert not stale, f"parity entries naming no public name: {stale}"
    assert all(why.strip() for why in parity.EXCLUDED.values())


def test_namespaces_are_every_public_subpackage(parity):
    """The harness reads every public package and module of perturb that has ``__all__``
    (a new subpackage is covered without editing the list)."""
    import pkgutil

    import perturb
    public = {"perturb"}
    for info in pkgutil.walk_packages(perturb.__path__, "perturb."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        if info.ispkg or info.name in ("perturb.nn", "perturb.checks"):
            public.add(info.name)
    with_all = {n for n in public if hasattr(importlib.import_module(n), "__all__")}
    assert with_all <= set(parity.NAMESPACES)


QUICK = ["softmax", "gumbel_softmax", "sinkhorn_padded", "ksubset_dp", "sample_trees",
         "box_volumes", "noise_NegativeExponential"]


def test_quick_subset_runs_cpu_against_cpu(parity):
    """Cases covering each family run on the CPU against the CPU, float64 and float32, and are
    deterministic (error exactly 0: the same random stream, the same arithmetic)."""
    rows = parity.run_cases("cpu", "cpu", only=QUICK, log=lambda s: None)
    assert {r["case"] for r in rows} == set(QUICK)
    bad = [r for r in rows if not r["ok"] or r["err"] != 0]
    assert not bad, bad
    text = parity.markdown(rows, "cpu", "cpu")
    assert "| sinkhorn_padded | float64 | ok |" in text and "**missing**" not in text


def test_comparison_catches_a_difference(parity):
    ref = {"out": torch.tensor([1.0, 2.0], dtype=torch.float64), "grad[w]": torch.zeros(2)}
    same = {k: v.clone() for k, v in ref.items()}
    assert parity._compare(ref, same, 1e-9, 1e-7)[0]
    off = {**same, "grad[w]": torch.tensor([0.0, 1e-6])}
    ok, err, where = parity._compare(ref, off, 1e-9, 1e-7)
    assert not ok and where == "grad[w]" and err > 1
    nan = {**same, "out": torch.tensor([1.0, math.nan], dtype=torch.float64)}
    assert not parity._compare(ref, nan, 1e-9, 1e-7)[0]
    assert not parity._compare(ref, {"out": ref["out"]}, 1e-9, 1e-7)[0]


def test_a_failing_case_fails_the_run(parity, monkeypatch):
    """A case whose output depends on the device run, or that raises, is a failed row."""
    calls = []

    def fn(x):
        calls.append(1)
        return x["w"] * (1 + 1e-2 * len(calls))      # differs between the two runs
    case = parity.Case("drift", (), lambda g, dt: {"w": torch.ones(3, dtype=dt)}, fn, ("w",))
    boom = parity.Case("boom", (), lambda g, dt: {"w": torch.ones(3, dtype=dt)},
                       lambda x: 1 / 0)
    monkeypatch.setattr(parity, "_cases", lambda: [case, boom])
    rows = parity.run_cases("cpu", "cpu", log=lambda s: None)
    assert [r["ok"] for r in rows] == [False] * 4
    assert "ZeroDivisionError" in rows[-1]["where"]


def test_cpu_random_stream_matches_the_cuda_draw(parity):
    """Under :class:`CpuRandom` the CUDA algorithm of the noises (``exponential_``) gives the
    numbers of the CPU one (−log of a clamped uniform), and generators on any device draw the
    same stream."""
    with parity.CpuRandom(3):
        e = torch.empty(6, dtype=torch.float64).exponential_()
    with parity.CpuRandom(3):
        fi = torch.finfo(torch.float64)
        u = torch.rand(6, dtype=torch.float64).clamp(fi.tiny, 1 - fi.eps / 2)
    torch.testing.assert_close(e, -u.log(), atol=0, rtol=0)
    with parity.CpuRandom(4):
        a = torch.randn(5, generator=torch.Generator().manual_seed(99))
    with parity.CpuRandom(4):
        b = torch.randn(5)
    assert torch.equal(a, b)


def test_pytest_plugin_marks_cuda_tests():
    plugin = _load("gpu_check_pytest")

    class Item:
        def __init__(self, *marks):
            self.marks = list(marks)

        def get_closest_marker(self, name):
            return next((m for m in self.marks if m.name == name), None)

        def iter_markers(self, name):
            return (m for m in self.marks if m.name == name)

        def add_marker(self, mark):
            self.marks.append(mark.mark)

    cuda = pytest.mark.skipif(True, reason="CUDA is not available").mark
    needs = pytest.mark.skipif(True, reason="needs CUDA").mark
    cpu_only = pytest.mark.skipif(False, reason="checks the message of a CPU-only machine").mark
    other = pytest.mark.skipif(True, reason="scipy missing").mark
    items = [Item(cuda), Item(needs), Item(cpu_only), Item(other), Item(pytest.mark.gpu.mark)]
    plugin.pytest_collection_modifyitems(None, items)
    assert [i.get_closest_marker("gpu") is not None for i in items] == [
        True, True, False, False, True]


def test_gpu_check_refuses_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    gc = _load("gpu_check")
    assert gc.main(["--out", "/nonexistent/never-written"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
