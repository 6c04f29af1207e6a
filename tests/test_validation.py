"""Tests of perturb/_validation.py: the two-tier argument checks."""
import math

import pytest
import torch

from perturb._validation import (
    check_choice,
    check_device,
    check_dim,
    check_generator,
    check_int,
    check_positive,
    check_scores,
    set_validation,
    validation_enabled,
)


@pytest.mark.parametrize("tau", [0.0, -1.0, math.inf, math.nan, "1", None, True])
def test_check_positive_rejects(tau):
    with pytest.raises(ValueError, match="tau"):
        check_positive(tau, "tau")


def test_check_positive_tensor():
    check_positive(torch.tensor([0.5, 2.0]), "tau")
    with pytest.raises(ValueError, match="tau"):
        check_positive(torch.tensor([0.5, 0.0]), "tau")


def test_check_scores_messages():
    with pytest.raises(ValueError, match="floating dtype"):
        check_scores(torch.arange(3), "w")
    with pytest.raises(ValueError, match="at least 2 dims"):
        check_scores(torch.zeros(3), "w", min_ndim=2)
    with pytest.raises(ValueError, match="square"):
        check_scores(torch.zeros(2, 3), "w", min_ndim=2, square=True)
    with pytest.raises(ValueError, match="NaN"):
        check_scores(torch.tensor([0.0, math.nan]), "w")
    with pytest.raises(ValueError, match="infinite"):
        check_scores(torch.tensor([0.0, -math.inf]), "w")
    check_scores(torch.tensor([0.0, -math.inf]), "w", allow_neg_inf=True)
    with pytest.raises(ValueError, match="infinite"):
        check_scores(torch.tensor([0.0, math.inf]), "w", allow_neg_inf=True)
    with pytest.raises(ValueError, match="torch.Tensor"):
        check_scores([1.0, 2.0], "w")


def test_switching_validation_off_skips_value_checks_only():
    assert validation_enabled()
    with set_validation(False):
        assert not validation_enabled()
        check_scores(torch.tensor([math.nan]), "w")  # value check skipped
        with pytest.raises(ValueError):  # structural check still runs
            check_scores(torch.arange(3), "w")
    assert validation_enabled()


def test_check_dim_and_choice_and_int():
    x = torch.zeros(2, 3)
    assert check_dim(x, -1) == 1
    with pytest.raises(ValueError, match="out of range"):
        check_dim(x, 2)
    with pytest.raises(ValueError, match="accepted values: 'a', 'b'"):
        check_choice("c", ("a", "b"), "mode")
    assert check_int(3, "k", low=1, high=3) == 3
    for bad in (0, 4, 2.5, True):
        with pytest.raises(ValueError, match="k"):
            check_int(bad, "k", low=1, high=3)


def test_scale_by_tau_per_problem_and_shape_errors():
    from perturb._validation import scale_by_tau

    w = torch.ones(3, 4, 5)
    assert scale_by_tau(w, 1, 2) is w
    out = scale_by_tau(w, torch.tensor([1.0, 2.0, 4.0]), 2)
    assert torch.equal(out[:, 0, 0], torch.tensor([1.0, 0.5, 0.25]))
    assert torch.equal(scale_by_tau(w, torch.tensor(2.0), 2), w / 2)
    with pytest.raises(ValueError, match="must broadcast against the batch shape"):
        scale_by_tau(torch.ones(5), torch.ones(5), 1)  # would broadcast into (5, 5)
    with pytest.raises(ValueError, match="tau of shape"):
        scale_by_tau(w, torch.ones(4), 2)


def test_relaxed_topk_rejects_tau_shaped_like_the_event():
    from perturb.structured import relaxed_topk

    with pytest.raises(ValueError, match="tau of shape"):
        relaxed_topk(torch.randn(5), 2, tau=torch.full((5,), 0.5))


# --------------------------------------------------------------------------------------------
# value checks: one reduction on CPU, no host synchronisation on CUDA
# --------------------------------------------------------------------------------------------

def _host_reads(fn) -> int:
    """Host synchronisations of one call (``.item()``/``bool(t)`` and explicit syncs)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name in (
        "aten::_local_scalar_dense", "cudaDeviceSynchronize", "cudaStreamSynchronize"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_check_finite_cpu_names_the_argument(dtype):
    from perturb._validation import check_finite

    x = torch.randn(50, 40, generator=torch.Generator().manual_seed(0)).to(dtype)
    x[17, 3] = 0.0          # the entry made bad below is not masked by the -inf of x > 1
    check_finite(x, "logits")
    check_finite(torch.where(x > 1, -math.inf, x), "logits", allow_neg_inf=True)  # masks
    for value, kind in ((math.nan, "NaN"), (math.inf, "infinite")):
        bad = x.clone()
        bad[17, 3] = value
        with pytest.raises(ValueError, match=f"logits contains {kind}"):
            check_finite(bad, "logits")
        with pytest.raises(ValueError, match=f"logits contains {kind}.*-inf is allowed"):
            check_finite(torch.where(x > 1, -math.inf, bad), "logits", allow_neg_inf=True)
    with pytest.raises(ValueError, match="logits contains infinite"):
        check_finite(torch.where(x > 1, -math.inf, x), "logits")
    check_finite(torch.empty(0, 3, dtype=dtype), "logits")


def test_check_finite_sum_overflow_is_not_an_error():
    from perturb._validation import check_finite

    big = torch.full((4,), 3e38)  # finite entries whose float32 sum overflows
    check_finite(big, "w")
    check_finite(-big, "w")


def test_value_checks_read_the_host_once_on_cpu():
    from perturb._validation import check_finite

    x = torch.randn(64, 100)
    assert _host_reads(lambda: check_finite(x, "w")) == 1
    assert _host_reads(lambda: check_finite(x, "w", allow_neg_inf=True)) == 1
    with set_validation(False):
        assert _host_reads(lambda: check_scores(x, "w")) == 0


def test_check_score_shape_is_structural_only():
    from perturb._validation import check_score_shape

    check_score_shape(torch.tensor([math.nan, 1.0]), "w")  # values are not looked at
    with pytest.raises(ValueError, match="w must have a floating dtype"):
        check_score_shape(torch.arange(3), "w")
    with pytest.raises(ValueError, match="at least 2 dims"):
        check_score_shape(torch.zeros(3), "w", min_ndim=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_value_checks_do_not_synchronise_on_cuda():
    from perturb._validation import check_finite

    x = torch.randn(64, 100, device="cuda")
    tau = torch.full((64,), 0.5, device="cuda")
    torch.cuda.synchronize()
    for fn in (lambda: check_finite(x, "w"), lambda: check_finite(x, "w", allow_neg_inf=True),
               lambda: check_scores(x, "w"), lambda: check_positive(tau, "tau")):
        fn()  # warm up
        assert _host_reads(fn) == 0
    torch.cuda.synchronize()  # and the good inputs passed the device-side asserts


_ASYNC_FAILURE = """
import math, torch
from perturb import gumbel_softmax
x = torch.randn(8, 5, device="cuda")
x[3, 2] = math.nan
y = gumbel_softmax(x, tau=0.5)   # returns: the check runs on the device
torch.cuda.synchronize()          # the device-side assert surfaces here
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_nan_on_cuda_fails_asynchronously_with_the_argument_name():
    """A device-side assert poisons the CUDA context, so it runs in a child process."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PERTURB_COMPILE="0")  # the eager path: no compile time
    out = subprocess.run([sys.executable, "-c", _ASYNC_FAILURE], capture_output=True, text=True,
                         cwd=root, timeout=300, env=env)
    assert out.returncode != 0
    assert "device-side assert" in out.stderr or "logits contains NaN" in out.stderr, out.stderr


def test_device_side_branch_conditions_and_messages(monkeypatch):
    """The CUDA branch run on CPU tensors, where torch._assert_async raises at once."""
    from perturb import _validation
    from perturb._validation import check_finite

    monkeypatch.setattr(_validation, "_ASYNC_DEVICES", ("cuda", "cpu"))
    x = torch.randn(30, 20)
    check_finite(x, "logits")
    check_finite(torch.where(x > 1, -math.inf, x), "logits", allow_neg_inf=True)
    check_positive(torch.tensor([0.5, 2.0]), "tau")
    for value in (math.nan, math.inf):
        bad = x.clone()
        bad[4, 4] = value
        with pytest.raises(RuntimeError, match="perturb: logits contains NaN or infinite"):
            check_finite(bad, "logits")
        with pytest.raises(RuntimeError, match=r"logits contains NaN or \+inf values \(-inf"):
            check_finite(bad, "logits", allow_neg_inf=True)
    with pytest.raises(RuntimeError, match="logits contains NaN or infinite"):
        check_finite(torch.where(x > 1, -math.inf, x), "logits")
    for tau in (torch.tensor([0.5, 0.0]), torch.tensor([math.nan]), torch.tensor([math.inf])):
        with pytest.raises(RuntimeError, match="perturb: tau must be finite and > 0"):
            check_positive(tau, "tau")


def test_check_value_reads_on_cpu_and_asserts_on_device(monkeypatch):
    """check_value: ValueError with the detail on the CPU; on an 'async' device the verdict goes
    to torch._assert_async (which raises at once on CPU tensors) and detail() is never called."""
    from perturb import _validation
    from perturb._validation import check_value

    check_value(torch.tensor(True), "fine")
    with pytest.raises(ValueError, match=r"^ids out of range, got 7$"):
        check_value(torch.tensor(False), "ids out of range", lambda: 7)
    # under vmap the verdict is not readable: skipped, not an error
    torch.func.vmap(lambda x: check_value(x > 0, "x must be positive") or x)(torch.ones(3))

    def boom() -> str:
        raise AssertionError("detail() must not run where it would stall the device")

    monkeypatch.setattr(_validation, "_ASYNC_DEVICES", ("cuda", "cpu"))
    check_value(torch.tensor(True), "fine", boom)
    with pytest.raises(RuntimeError, match="perturb: ids out of range"):
        check_value(torch.tensor(False), "ids out of range", boom)


def test_box_value_checks_do_not_read_the_device(monkeypatch):
    """The box boundary's value checks (NaN corners, ids in range, log1mexp's domain) go through
    check_value: with the CPU treated as an async device, a whole Gumbel containment call with
    validation on performs no host read of a tensor value."""
    from perturb import _validation, boxes

    monkeypatch.setattr(_validation, "_ASYNC_DEVICES", ("cuda", "cpu"))
    reads = []
    for name in ("__bool__", "__float__", "__int__", "item", "tolist"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda t, *a, _real=real: reads.append(1) or _real(t, *a))
    emb = boxes.BoxEmbedding(10, 3, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([0, 3, 7])
    p = boxes.containment_prob(emb(ids), emb(ids.flip(0)), beta=0.1)
    p.sum().backward()
    boxes.log1mexp(torch.log(p.detach()).clamp(max=-1e-6))
    n_reads = len(reads)
    assert n_reads == 0, f"{n_reads} host reads of tensor values"
    assert torch.isfinite(p).all() and torch.isfinite(emb.param1.grad).all()


def test_set_validation_as_a_call_and_as_a_context_manager():
    """Like torch.set_grad_enabled: a plain call switches and stays; a with-block restores."""
    assert validation_enabled()
    try:
        set_validation(False)
        assert not validation_enabled()
        with set_validation(True):
            assert validation_enabled()
        assert not validation_enabled()
    finally:
        set_validation(True)
    assert validation_enabled()
    with pytest.raises(ValueError, match="enabled must be a bool"):
        set_validation("false")
    assert validation_enabled()



def test_value_checks_are_skipped_inside_torch_func_transforms():
    """vmap / grad cannot read values: the value checks step aside there (they run on the
    unbatched call), so the simplex solvers vmap with validation on and match a loop."""
    import perturb

    x = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(0))
    assert validation_enabled()
    for f in (perturb.softmax, perturb.sparsemax, perturb.regularized_argmax,
              lambda v: perturb.regularized_argmax(v, perturb.Simplex(), perturb.SquaredNorm(),
                                                   tau=torch.tensor(0.5))):
        torch.testing.assert_close(torch.func.vmap(f)(x), torch.stack([f(v) for v in x]))
    g = torch.func.grad(lambda v: (perturb.softmax(v) * torch.arange(6.0)).sum())(x[0, 0])
    assert torch.isfinite(g).all()
    bad = x.clone()
    bad[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        perturb.softmax(bad)


def test_check_generator_and_device():
    check_generator(None)
    check_generator(torch.Generator())
    for bad in (0, "x", torch.zeros(1)):
        with pytest.raises(ValueError, match="generator must be a torch.Generator"):
            check_generator(bad)
    assert check_device("cpu") == torch.device("cpu")
    assert check_device(torch.device("cpu")) == torch.device("cpu")
    for bad, says in (("bogus", "device='bogus' is not a device"), (1.5, "device must be"),
                      (True, "device must be")):
        with pytest.raises(ValueError, match=says):
            check_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            check_device("cuda")


def test_check_floating_tensor_names_the_argument():
    from perturb._validation import check_floating_tensor
    check_floating_tensor(torch.zeros(2), "x")                  # float32: accepted
    check_floating_tensor(torch.zeros(2, dtype=torch.float16), "x")
    with pytest.raises(ValueError, match=r"lower must be a torch.Tensor, got list"):
        check_floating_tensor([0.0], "lower")
    with pytest.raises(ValueError, match=r"lower must have a floating dtype .*lower.float\(\)"):
        check_floating_tensor(torch.zeros(2, dtype=torch.int64), "lower")
