"""Tests of perturb/nn.py: stochastic-softmax layers and temperature schedules."""
import math

import pytest
import torch

from perturb import Entropy, Gumbel, Normal, Simplex, SquaredNorm, relax
from perturb.categorical import gaussian_softmax, gumbel_softmax
from perturb.nn import (
    ConstantSchedule,
    ExponentialSchedule,
    GaussianSoftmax,
    GumbelSoftmax,
    LinearSchedule,
    Sparsemax,
    SparsemaxLoss,
    StochasticSoftmax,
)


def _theta(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------
# schedules
# --------------------------------------------------------------------------------------------

def test_schedules_values():
    assert ConstantSchedule(0.7)(0) == 0.7 == ConstantSchedule(0.7)(10_000)
    exp = ExponentialSchedule(tau0=2.0, tau_min=0.5, rate=0.1)
    assert exp(0) == 2.0
    assert math.isclose(exp(5), 2.0 * math.exp(-0.5))
    assert exp(1000) == 0.5  # floored
    lin = LinearSchedule(tau0=1.0, tau_min=0.2, n_steps=8)
    assert [lin(t) for t in (0, 4, 8, 100)] == pytest.approx([1.0, 0.6, 0.2, 0.2])
    # monotone non-increasing
    for sched in (exp, lin):
        values = [sched(t) for t in range(50)]
        assert all(a >= b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("make,match", [
    (lambda: ConstantSchedule(0.0), "tau"),
    (lambda: ExponentialSchedule(tau0=-1.0), "tau0"),
    (lambda: ExponentialSchedule(tau0=1.0, tau_min=2.0), "tau_min"),
    (lambda: ExponentialSchedule(rate=-0.1), "rate"),
    (lambda: LinearSchedule(n_steps=0), "n_steps"),
    (lambda: LinearSchedule(tau0=0.5, tau_min=0.0), "tau_min"),
    (lambda: ConstantSchedule(1.0)(-1), "step"),
])
def test_schedule_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_module_step_follows_schedule():
    sched = LinearSchedule(tau0=1.0, tau_min=0.5, n_steps=4)
    layer = GumbelSoftmax(schedule=sched)
    assert layer.tau == 1.0
    taus = [layer.step() for _ in range(6)]
    assert taus == pytest.approx([0.875, 0.75, 0.625, 0.5, 0.5, 0.5])
    assert layer.tau == 0.5 and layer.steps == 6
    with pytest.raises(ValueError, match="schedule"):
        GumbelSoftmax().step()
    layer.tau = 0.3  # set directly
    assert layer.tau == 0.3
    with pytest.raises(ValueError, match="tau"):
        layer.tau = 0.0


# --------------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------------

def test_train_mode_is_relax_with_generator():
    theta = _theta(4, 6)
    layer = StochasticSoftmax(noise=Normal(0.5), regularizer=SquaredNorm(), tau=0.7,
                              generator=torch.Generator().manual_seed(3))
    ref = relax(theta, Simplex(), Normal(0.5), SquaredNorm(), 0.7,
                generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(layer(theta), ref, rtol=0, atol=0)
    # the generator attribute advances: the next call gives a different sample
    assert not torch.equal(layer(theta), ref)
    layer.generator = torch.Generator().manual_seed(3)
    torch.testing.assert_close(layer(theta), ref, rtol=0, atol=0)


def test_eval_modes_are_deterministic():
    theta = _theta(3, 5)
    layer = StochasticSoftmax(tau=0.5).eval()
    torch.testing.assert_close(layer(theta), torch.softmax(theta / 0.5, -1))
    torch.testing.assert_close(layer(theta), layer(theta), rtol=0, atol=0)
    hard = StochasticSoftmax(tau=0.5, hard=True, eval_mode="argmax").eval()
    torch.testing.assert_close(hard(theta), Simplex().argmax(theta))
    with pytest.raises(ValueError, match="eval_mode"):
        StochasticSoftmax(eval_mode="sample")


def test_hard_and_n_samples():
    theta = _theta(3, 5).requires_grad_()
    layer = StochasticSoftmax(tau=0.5, hard=True, n_samples=4,
                              generator=torch.Generator().manual_seed(0))
    y = layer(theta)
    assert y.shape == (4, 3, 5) and bool(Simplex().check(y).all())
    y.sum().backward()  # straight-through gradient exists (and sums to ~0 over a row)
    torch.testing.assert_close(theta.grad.sum(-1), torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_gumbel_and_gaussian_modules_match_functions(dim):
    theta = _theta(3, 4, 5)
    g = GumbelSoftmax(tau=0.6, dim=dim, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(g(theta), gumbel_softmax(
        theta, 0.6, dim=dim, generator=torch.Generator().manual_seed(1)), rtol=0, atol=0)
    n = GaussianSoftmax(tau=0.6, scale=2.0, hard=True, dim=dim,
                        generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(n(theta), gaussian_softmax(
        theta, 0.6, 2.0, hard=True, dim=dim, generator=torch.Generator().manual_seed(1)),
        rtol=0, atol=0)
    # evaluation mode along dim
    torch.testing.assert_close(g.eval()(theta), torch.softmax(theta / 0.6, dim))
    one_hot = torch.nn.functional.one_hot(theta.argmax(dim), theta.shape[dim]).movedim(-1, dim)
    torch.testing.assert_close(GumbelSoftmax(dim=dim, eval_mode="argmax").eval()(theta),
                               one_hot.double())


def test_module_in_training_loop_learns():
    """A categorical policy learns to pick the best arm through a Gumbel-softmax layer."""
    reward = torch.tensor([0.1, 1.0, 0.3, 0.0])
    logits = torch.nn.Parameter(torch.zeros(4))
    layer = GumbelSoftmax(schedule=ExponentialSchedule(1.0, 0.3, 0.05),
                          generator=torch.Generator().manual_seed(0))
    opt = torch.optim.Adam([logits], lr=0.1)
    for _ in range(60):
        x = layer(logits.expand(16, 4))
        loss = -(x @ reward).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        layer.step()
    assert int(logits.argmax()) == 1
    assert float(torch.softmax(logits.detach(), -1)[1]) > 0.8
    assert layer.tau < 1.0


def test_repr_and_bad_arguments():
    assert "tau=0.5" in repr(GumbelSoftmax(tau=0.5))
    assert "scale=2.0" in repr(GaussianSoftmax(scale=2.0))
    with pytest.warns(FutureWarning, match="sigma= is deprecated"):
        old = GaussianSoftmax(sigma=2.0)
    assert old.scale == 2.0 and old.sigma == 2.0 and old.noise.scale == 2.0
    with pytest.raises(TypeError, match="both"):
        GaussianSoftmax(scale=3.0, sigma=2.0)
    r = repr(StochasticSoftmax(regularizer=Entropy()))
    assert "Simplex()" in r and "Entropy()" in r and "Gumbel" in r
    with pytest.raises(ValueError, match="tau"):
        StochasticSoftmax(tau=-1.0)
    with pytest.raises(ValueError, match="scale"):
        GaussianSoftmax(scale=0.0)
    with pytest.raises(ValueError, match="hard"):
        StochasticSoftmax(hard="yes")
    with pytest.raises(ValueError, match="structure"):
        StochasticSoftmax(structure="simplex")
    with pytest.raises(ValueError, match="schedule"):
        StochasticSoftmax(schedule=lambda t: 1.0)
    with pytest.raises(ValueError, match="dim"):
        GumbelSoftmax(dim=3)(torch.zeros(2, 3))
    assert isinstance(StochasticSoftmax().noise, Gumbel)


@pytest.mark.parametrize("make", [lambda: StochasticSoftmax(), lambda: GumbelSoftmax(),
                                  lambda: GaussianSoftmax(scale=0.5),
                                  lambda: StochasticSoftmax(regularizer=SquaredNorm())])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_tensor_tau_gets_its_gradient_in_both_modes(make, mode):
    """A tensor τ (a learnable temperature) is used as given, so the layer's output is
    differentiable in it, in training and in evaluation mode (float(τ) cut it from the graph:
    a zero gradient that gradcheck refuses)."""
    layer = make()
    getattr(layer, mode)()
    x = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def f(t):
        layer.tau = t
        layer.generator = torch.Generator().manual_seed(1)
        return layer(x)

    tau = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (tau,))


def test_a_parameter_tau_is_registered_trained_and_released():
    layer = GumbelSoftmax(tau=0.3, generator=torch.Generator().manual_seed(0))
    p = torch.nn.Parameter(torch.tensor(0.5))
    layer.tau = p
    assert layer.tau is p and dict(layer.named_parameters()) == {"tau_param": p}
    assert "tau_param" in layer.state_dict()
    (layer(torch.randn(4, 6)) * torch.arange(6.0)).sum().backward()
    assert p.grad is not None and float(p.grad) != 0.0
    layer.tau = 0.9                                    # back to a plain float temperature
    assert layer.tau == 0.9 and not list(layer.parameters())


# --------------------------------------------------------------------------------------------
# checkpoints: τ, the schedule's position and every hyper-parameter travel with the state_dict
# --------------------------------------------------------------------------------------------

LAYERS = {
    "StochasticSoftmax": lambda sched: StochasticSoftmax(
        tau=0.6, hard=True, eval_mode="argmax", schedule=sched),
    "GumbelSoftmax": lambda sched: GumbelSoftmax(tau=0.6, hard=True, dim=0, schedule=sched),
    "GaussianSoftmax": lambda sched: GaussianSoftmax(tau=0.6, scale=0.3, dim=0,
                                                     schedule=sched),
}
SCHEDULES = [lambda: None, lambda: ExponentialSchedule(tau0=1.0, tau_min=0.2, rate=0.05),
             lambda: LinearSchedule(tau0=2.0, tau_min=0.3, n_steps=40),
             lambda: ConstantSchedule(0.8)]


def test_every_nn_layer_has_a_checkpoint_case():
    import inspect

    import perturb.nn as pnn
    layers = {n for n in pnn.__all__ if inspect.isclass(getattr(pnn, n))
              and issubclass(getattr(pnn, n), torch.nn.Module)}
    assert layers == set(LAYERS) | set(DETERMINISTIC)


DETERMINISTIC = {
    "Sparsemax": (lambda: Sparsemax(dim=0, tau=0.5), lambda: Sparsemax(),
                  lambda m: m(_theta(4, 5))),
    "SparsemaxLoss": (lambda: SparsemaxLoss("sum", ignore_index=2, dim=0),
                      lambda: SparsemaxLoss(),
                      lambda m: m(_theta(4, 5), torch.tensor([0, 2, 1, 3, 3]))),
}


@pytest.mark.parametrize("name", sorted(DETERMINISTIC))
def test_deterministic_modules_round_trip(name, tmp_path):
    make, default, run = DETERMINISTIC[name]
    m = make()
    torch.save(m.state_dict(), tmp_path / "m.pt")
    other = default()
    other.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    assert other.get_extra_state() == m.get_extra_state()
    torch.testing.assert_close(run(other), run(m))


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("schedule", range(len(SCHEDULES)))
def test_checkpoint_round_trip_mid_schedule(name, schedule, tmp_path):
    """A layer saved after 17 steps and loaded (torch.save / torch.load(weights_only=True))
    into a layer built with other hyper-parameters has the same τ, steps, schedule and
    hyper-parameters, gives the same outputs, and continues the schedule where it stopped."""
    make = LAYERS[name]
    layer = make(SCHEDULES[schedule]())
    if layer.schedule is not None:
        for _ in range(17):
            layer.step()
    else:
        layer.tau = 0.37
    torch.save(layer.state_dict(), tmp_path / "layer.pt")
    other = make({0: lambda: None, 1: lambda: ExponentialSchedule(3.0, 1.0, 0.9),
                  2: lambda: LinearSchedule(5.0, 4.0, 3), 3: lambda: ConstantSchedule(4.0)}
                 [schedule]())
    other.hard, other.eval_mode = False, "regularized"
    if hasattr(other, "dim"):
        other.dim = -1
    if hasattr(other, "scale"):
        other.scale = 2.0
    other.load_state_dict(torch.load(tmp_path / "layer.pt", weights_only=True))
    assert other.tau == layer.tau and other.steps == layer.steps
    assert other.get_extra_state() == layer.get_extra_state()
    x = _theta(4, 5, seed=3)
    for mode in ("train", "eval"):
        getattr(layer, mode)()
        getattr(other, mode)()
        layer.generator = torch.Generator().manual_seed(0)
        other.generator = torch.Generator().manual_seed(0)
        torch.testing.assert_close(other(x), layer(x))
    if layer.schedule is not None:
        assert other.step() == layer.step()
    # a state_dict from before τ was saved (empty) still loads, keeping the current values
    fresh = make(SCHEDULES[schedule]())
    fresh.load_state_dict({})
    assert fresh.tau == make(SCHEDULES[schedule]()).tau
