"""One rule for every algorithm: within a step, every evaluation of the losses sees
the same random numbers, module buffers move once (as under one plain evaluation
at the step's start), errors from the losses propagate with nothing changed, and
metrics returned beside the losses come back from ``step``."""

from __future__ import annotations

import copy

import pytest
import torch
from games import assert_same_state
from torch import nn

import gameopt

ALGORITHMS = {
    "SimGD": lambda: gameopt.SimGD(0.01),
    "AltGD": lambda: gameopt.AltGD(0.01),
    "Extragradient": lambda: gameopt.Extragradient(0.01, update=gameopt.Adam()),
    "Optimistic": lambda: gameopt.Optimistic(0.01),
    "HamiltonianGD": lambda: gameopt.HamiltonianGD(0.01),
    "Consensus": lambda: gameopt.ConsensusOptimization(0.01, gamma=0.5),
    "SGA": lambda: gameopt.SGA(0.01),
    "CGD": lambda: gameopt.CGD(0.01, maxiter=5),
    "ACGD": lambda: gameopt.ACGD(0.01, maxiter=5),
    "LA": lambda: gameopt.LA(0.01, alpha=0.3),
    "LOLA": lambda: gameopt.LOLA(0.01, alpha=0.3),
    "SOS": lambda: gameopt.SOS(0.01, alpha=0.3),
    "Lookahead-EG": lambda: gameopt.Lookahead(gameopt.Extragradient(0.01), k=1),
}


class Generator(nn.Module):
    """The PyTorch examples' DCGAN generator, shrunk to 8x8 images."""

    def __init__(self, nz: int = 4) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, 8, 4, 1, 0, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(True),
            nn.ConvTranspose2d(8, 1, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    """The PyTorch examples' DCGAN discriminator, shrunk to 8x8 images, with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, 4, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2),
            nn.Dropout(0.3),
            nn.Conv2d(4, 8, 2, 2, 0, bias=False),
            nn.BatchNorm2d(8),
            nn.LeakyReLU(0.2),
            nn.Conv2d(8, 1, 2, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x).view(-1)


def _losses_for(gen, disc, real, draws):
    bce = nn.BCELoss()

    def losses():
        z = torch.randn(6, 4, 1, 1, dtype=torch.float64)  # noise drawn inside the losses
        draws.append(z)
        d_real, d_fake = disc(real), disc(gen(z))
        f = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
        return -f, f, {"D(x)": d_real.mean(), "D(G(z))": d_fake.mean()}  # zero-sum, with metrics

    return losses


def _dcgan(seed: int = 0):
    torch.manual_seed(seed)
    gen, disc = Generator().double(), Discriminator().double()
    real = torch.rand(6, 1, 8, 8, dtype=torch.float64) * 2 - 1
    draws: list[torch.Tensor] = []
    return gen, disc, _losses_for(gen, disc, real, draws), draws, real


def _buffers(*modules):
    return [b.clone() for m in modules for b in m.buffers()]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_buffers_move_once_per_step_and_every_evaluation_sees_the_same_noise(name) -> None:
    gen, disc, losses, draws, real = _dcgan()
    game = gameopt.Game([gen, disc], losses, algorithm=ALGORITHMS[name]())
    for _ in range(2):
        # the reference: one plain evaluation of copies at the step's starting point
        ref_gen, ref_disc = copy.deepcopy(gen), copy.deepcopy(disc)
        rng = torch.get_rng_state()
        ref_losses = _losses_for(ref_gen, ref_disc, real, [])()
        after_one = torch.rand(3, dtype=torch.float64)  # where the generator stands after one evaluation
        torch.set_rng_state(rng)
        draws.clear()
        out = game.step()
        assert len(draws) >= 1
        assert all(torch.equal(z, draws[0]) for z in draws), "evaluations of one step drew different noise"
        for a, b in zip(_buffers(gen, disc), _buffers(ref_gen, ref_disc)):
            assert torch.equal(a, b)
        assert torch.equal(torch.rand(3, dtype=torch.float64), after_one)
        assert torch.equal(out[1], ref_losses[1].detach())
        assert set(out.metrics) == {"D(x)", "D(G(z))"}
        assert torch.equal(out.metrics["D(G(z))"], ref_losses[2]["D(G(z))"].detach())


def test_sga_forward_mode_product_sees_the_same_dropout_mask_as_xi() -> None:
    """Forward-over-reverse Jv re-evaluates the losses; with the same random numbers
    it equals the double-backward product on the one kept graph."""
    steps = {}
    for forward_mode in (True, False):
        gen, disc, losses, _, _ = _dcgan(seed=1)
        game = gameopt.Game([gen, disc], losses, algorithm=gameopt.SGA(0.05))
        game.step_context.problem.forward_mode.ok = forward_mode
        game.step()
        steps[forward_mode] = [t.clone() for t in game.layout.data]
    for a, b in zip(steps[True], steps[False]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _exported_algorithms_that_evaluate_once() -> list[gameopt.Algorithm]:
    """An instance of every exported algorithm that declares ``evaluates_once``, and
    each of them inside each exported wrapper."""
    classes = [getattr(gameopt, n) for n in gameopt.__all__]
    algorithms = [c for c in classes if isinstance(c, type) and issubclass(c, gameopt.Algorithm)]
    once = [c(0.01) for c in algorithms if not issubclass(c, gameopt.Wrapper) and c.evaluates_once]
    assert {type(a).__name__ for a in once} == {"SimGD", "Optimistic"}
    wrappers = [c for c in algorithms if issubclass(c, gameopt.Wrapper) and c is not gameopt.Wrapper]
    return once + [w(type(a)(0.01)) for w in wrappers for a in once]


@pytest.mark.parametrize("algorithm", _exported_algorithms_that_evaluate_once(), ids=repr)
def test_an_algorithm_declared_to_evaluate_once_evaluates_once_and_keeps_the_rules(algorithm) -> None:
    """``evaluates_once``: one evaluation per step (counted), and the rules of the
    module docstring hold as under any algorithm (buffers, noise, metrics)."""
    gen, disc, losses, draws, real = _dcgan()
    calls = []
    game = gameopt.Game([gen, disc], lambda: calls.append(1) or losses(), algorithm=algorithm)
    for _ in range(3):
        ref_gen, ref_disc = copy.deepcopy(gen), copy.deepcopy(disc)
        rng = torch.get_rng_state()
        ref_losses = _losses_for(ref_gen, ref_disc, real, [])()
        after_one = torch.rand(3, dtype=torch.float64)
        torch.set_rng_state(rng)
        calls.clear()
        out = game.step()
        assert len(calls) == 1
        assert torch.equal(torch.rand(3, dtype=torch.float64), after_one)
        for a, b in zip(_buffers(gen, disc), _buffers(ref_gen, ref_disc)):
            assert torch.equal(a, b)
        assert torch.equal(out.metrics["D(G(z))"], ref_losses[2]["D(G(z))"].detach())


@pytest.mark.parametrize("again", ["xi", "xi at another point", "linearize"])
def test_a_second_evaluation_by_an_algorithm_declared_to_evaluate_once_is_refused_and_changes_nothing(again) -> None:
    class Twice(gameopt.SimGD):
        def update(self, oracle, state):
            xi = oracle.xi()
            if again == "xi":
                oracle.xi()
            elif again == "linearize":
                oracle.linearize()
            else:
                oracle.xi(at=oracle.moved(oracle.scaled(xi, [-0.1, -0.1])))
            return super().update(oracle, state)

    gen, disc, losses, _, _ = _dcgan()
    game = gameopt.Game([gen, disc], losses, algorithm=Twice(0.01))
    before, buffers, rng = game.state_dict(), _buffers(gen, disc), torch.get_rng_state()
    with pytest.raises(RuntimeError, match="evaluates_once"):
        game.step()
    assert_same_state(game.state_dict(), before)
    assert all(torch.equal(a, b) for a, b in zip(_buffers(gen, disc), buffers))
    game.algorithm = gameopt.SimGD(0.01)  # the same game steps on
    torch.set_rng_state(rng)
    game.step()


class Boom(Exception):
    pass


@pytest.mark.parametrize("name", ["Extragradient", "AltGD", "SGA", "Lookahead-EG", "Optimistic", "CGD"])
@pytest.mark.parametrize("call", [1, 2])
def test_an_error_in_any_evaluation_propagates_and_changes_nothing(name, call) -> None:
    gen, disc, losses, _, _ = _dcgan()
    calls = {"n": 0, "armed": False}

    def failing():
        calls["n"] += 1
        if calls["armed"] and calls["n"] == call:
            raise Boom("the user's losses failed")
        return losses()

    game = gameopt.Game([gen, disc], failing, algorithm=ALGORITHMS[name]())
    game.step()
    before = game.state_dict()
    rng = torch.get_rng_state()
    calls.update(n=0, armed=True)
    try:
        game.step()
    except Boom:
        pass
    else:
        assert calls["n"] < call, "the failing evaluation ran but its error did not surface"
        return
    after = game.state_dict()
    assert torch.equal(torch.get_rng_state(), rng) or call == 2
    assert_same_state(after, before)
    assert game.step_context.problem.forward_mode.ok


def test_players_own_losses_receive_the_step_arguments() -> None:
    torch.manual_seed(0)
    a, b = nn.Linear(2, 1).double(), nn.Linear(2, 1).double()
    seen = []

    def loss_a(x, scale=1.0):
        seen.append((x, scale))
        return scale * (a(x) * b(x).detach()).mean()

    game = gameopt.Game(
        [gameopt.Player(a, loss=loss_a), gameopt.Player(b, loss=lambda x, scale=1.0: -(a(x).detach() * b(x)).mean())]
    )
    x = torch.randn(5, 2, dtype=torch.float64)
    out = game.step(x, scale=2.0)
    assert seen[0][0] is x and seen[0][1] == 2.0
    assert out.metrics == {} and len(out) == 2


def test_losses_with_a_wrong_number_of_values_say_the_convention() -> None:
    gen, disc, losses, _, _ = _dcgan()
    game = gameopt.Game([gen, disc], lambda: (*losses()[:2], 1.0, 2.0))
    with pytest.raises(ValueError, match="optionally followed by a dict of metrics"):
        game.step()


@pytest.mark.parametrize(
    "make", [lambda: gameopt.SimGD(1e-3), lambda: gameopt.SGA(1e-3), lambda: gameopt.Extragradient(1e-3)]
)
def test_float16_dynamic_loss_scale_skips_overflows_backs_off_and_then_matches_unscaled_steps(make) -> None:
    def build(loss_scale):
        torch.manual_seed(0)
        x = nn.Parameter(torch.randn(8).half())
        y = nn.Parameter(torch.randn(8).half())
        game = gameopt.Game(
            [gameopt.Player([x]), gameopt.Player([y])],
            lambda: (10 * (x * y).sum() + (x * x).sum(), -10 * (x * y).sum() + (y * y).sum()),
            algorithm=make(),
            loss_scale=loss_scale,
        )
        return x, y, game

    x, y, game = build(gameopt.DynamicLossScale(init_scale=2.0**14, growth_interval=3))
    x0, y0 = x.detach().clone(), y.detach().clone()
    scales = []
    while game.loss_scale.scale > 2.0**4:  # 10·|x|·2^k overflows float16 (65504) for large k
        scales.append(game.loss_scale.scale)
        game.step()
        if game.skipped_steps == len(scales):  # skipped: nothing changed
            assert torch.equal(x, x0) and torch.equal(y, y0)
        else:
            break
    assert game.skipped_steps >= 1 and scales[0] == 2.0**14
    assert game.loss_scale.scale == 2.0**14 * 0.5**game.skipped_steps
    ref_x, ref_y, ref = build(None)
    ref.step()
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)  # power-of-two scaling is exact
    for _ in range(2):
        game.step()
        ref.step()
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)
    assert game.loss_scale.scale == 2.0**14 * 0.5**game.skipped_steps * 2  # grew after 3 good steps
    sd = game.state_dict()
    settings = {"growth": 2.0, "backoff": 0.5, "growth_interval": 3}  # part of the checked identity (issue #33)
    assert sd["loss_scale"] == {"scale": game.loss_scale.scale, "good_steps": 0, "settings": settings}


def test_loss_scale_arguments_are_checked() -> None:
    for kwargs in ({"init_scale": 0.0}, {"growth": 1.0}, {"backoff": 1.0}, {"growth_interval": 0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            gameopt.DynamicLossScale(**kwargs)


def test_step_losses_metrics_are_a_copy_or_an_empty_read_only_mapping() -> None:
    from gameopt.evaluation import StepLosses

    a, b = torch.tensor(1.0), torch.tensor(2.0)
    given = {"D(x)": 0.5}
    out = StepLosses((a, b), given)
    given["D(x)"] = 0.0
    assert tuple(out) == (a, b) and out.metrics == {"D(x)": 0.5} and type(out.metrics) is dict
    none = StepLosses((a, b))
    assert none.metrics == {} and len(none.metrics) == 0
    with pytest.raises(TypeError):
        none.metrics["x"] = 1  # type: ignore[index]
    assert StepLosses((a, b), {}).metrics == {}


def _batch_norm_gan() -> tuple[nn.Module, nn.Module, object]:
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2)).double()
    disc = nn.Sequential(nn.Linear(2, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 1)).double()
    z, real = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 2, dtype=torch.float64)

    def losses(scale: float = 1.0):
        d_fake = disc(gen(z))
        return -d_fake.mean() * scale, d_fake.mean() - disc(real).mean()

    return gen, disc, losses


def test_a_step_saves_the_module_buffers_in_one_copy_into_copies_kept_between_steps() -> None:
    """No clone per BatchNorm statistic: one foreach copy into copies made once, and
    still a failed step puts every buffer back bit for bit."""
    from gameopt.testing.traffic import Count, Counting

    gen, disc, losses = _batch_norm_gan()
    game = gameopt.Game([gen, disc], losses, algorithm=gameopt.SimGD(0.05))
    game.step()
    ops = Count(big=1)
    with gameopt.debug.enabled_in(False), Counting(ops):  # the path a user's step takes
        game.step()
    assert "clone" not in ops.names and "empty_like" not in ops.names  # the copies are kept
    before = {k: b.clone() for m in (gen, disc) for k, b in m.named_buffers()}
    params = [p.detach().clone() for m in (gen, disc) for p in m.parameters()]
    with pytest.raises(gameopt.NonFiniteError):
        game.step(float("inf"))  # the buffers moved in its forward
    after = {k: b for m in (gen, disc) for k, b in m.named_buffers()}
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(a, p) for a, p in zip(params, (p for m in (gen, disc) for p in m.parameters())))


def test_buffer_copies_follow_buffers_that_change_shape_or_dtype() -> None:
    from gameopt import _torch_compat as tc
    from gameopt.evaluation import BufferCopies, restore_buffers

    bn = nn.BatchNorm1d(4)
    registries = [tc.buffer_registry(bn)]
    copies = BufferCopies()
    for change in (None, lambda: bn.register_buffer("running_mean", torch.arange(6.0)), lambda: bn.double()):
        if change is not None:
            change()
        want = {k: b.clone() for k, b in bn.named_buffers()}
        saved = copies.save(registries)
        with torch.no_grad():
            for b in bn.buffers():
                b.add_(3)
        restore_buffers(saved)
        for k, b in bn.named_buffers():
            assert b.dtype == want[k].dtype and torch.equal(b, want[k]), k


def test_an_evaluation_inside_another_puts_the_buffers_back_as_the_outer_one_found_them() -> None:
    """Extragradient's second evaluation (away from the step's start) saves the
    BatchNorm statistics in the game's kept copies; losses that ask for ξ from inside
    it (an evaluation within that evaluation) must not overwrite those copies."""
    runs = []
    for nested in (False, True):
        gen, disc, losses = _batch_norm_gan()
        games: list[gameopt.Game] = []

        inside: list[bool] = []

        def observed(scale: float = 1.0, losses=losses, games=games, nested=nested, inside=inside):
            out = losses(scale)  # the forward moved the statistics
            if nested and games and not inside:
                inside.append(True)
                try:
                    games[0].vector_field()  # runs the losses again, inside this evaluation
                finally:
                    inside.clear()
            return out

        games.append(gameopt.Game([gen, disc], observed, algorithm=gameopt.Extragradient(0.05)))
        for _ in range(3):
            games[0].step()
        runs.append([t.detach().clone() for m in (gen, disc) for t in (*m.parameters(), *m.buffers())])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
