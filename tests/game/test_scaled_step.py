"""A step returned as a direction and per-player factors (gameopt.vec.Scaled) is
applied by the game's move in one pass, w + factor·d, as torch.optim's SGD does
(p.add_(grad, alpha=-lr)); where it cannot be (players of one group with different
factors, feasible sets, a wrapper's base step) it is formed first, as descend forms it.
Equalities of one machine's kernels: each side runs the same ops."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gameopt
from gameopt.testing import oracle
from gameopt.vec import Scaled, Vec


def _game(lrs, algorithm=None, dtype=torch.float32, constraint=None):
    g = torch.Generator().manual_seed(0)
    x = nn.Parameter(torch.randn(300, generator=g, dtype=dtype))
    y = nn.Parameter(torch.randn(200, generator=g, dtype=dtype))
    a = torch.randn(300, 200, generator=g, dtype=dtype) / 10

    def losses():
        f = x @ a @ y + (x**4).sum() / 4
        return f, -f + (y**2).sum()

    players = [gameopt.Player([x], name="x", constraint=constraint), gameopt.Player([y], name="y")]
    game = gameopt.Game(players, losses, algorithm=algorithm or gameopt.SimGD(lrs))
    return game, (x, y), losses


def _xi(losses, params):
    f, g = losses()
    return [torch.autograd.grad(f, params[0], retain_graph=True)[0], torch.autograd.grad(g, params[1])[0]]


def test_simgd_is_torch_optims_sgd_bit_for_bit() -> None:
    """One factor for the group: one add with alpha, torch.optim.SGD's own op."""
    game, params, _ = _game(0.01)
    ref = [nn.Parameter(p.detach().clone()) for p in params]
    sgd = torch.optim.SGD(ref, lr=0.01)
    for _ in range(5):
        game.step()
        for p, g in zip(ref, _ref_xi(ref)):
            p.grad = g
        sgd.step()
        assert all(torch.equal(p.detach(), r.detach()) for p, r in zip(params, ref))


def _ref_xi(ref):
    g = torch.Generator().manual_seed(0)
    torch.randn(300, generator=g), torch.randn(200, generator=g)
    a = torch.randn(300, 200, generator=g) / 10
    x, y = ref
    f = x @ a @ y + (x**4).sum() / 4
    return [torch.autograd.grad(f, x, retain_graph=True)[0], torch.autograd.grad(-f + (y**2).sum(), y)[0]]


def test_players_of_one_group_with_different_factors_take_the_step_formed_first() -> None:
    """Two learning rates in one (device, dtype) group: the step is formed (−η·ξ,
    one rounding) and then added, as descend forms it."""
    game, (x, y), losses = _game([0.01, 0.03])
    w = [x.detach().clone(), y.detach().clone()]
    xi = _xi(losses, (x, y))
    game.step()
    assert torch.equal(x.detach(), w[0] + (-0.01) * xi[0])
    assert torch.equal(y.detach(), w[1] + (-0.03) * xi[1])


def test_one_factor_per_group_moves_in_one_pass() -> None:
    game, (x, y), losses = _game(0.02)
    w = [x.detach().clone(), y.detach().clone()]
    xi = _xi(losses, (x, y))
    game.step()
    assert torch.equal(x.detach(), torch.add(w[0], xi[0], alpha=-0.02))
    assert torch.equal(y.detach(), torch.add(w[1], xi[1], alpha=-0.02))


def test_scaled_descent_resolved_is_descend_bit_for_bit() -> None:
    """descend is scaled_descent's step formed as a vector: the same bits, the same
    rule state, for a rule that keeps its result (Momentum) and one that does not."""
    for rule in (gameopt.Plain(), gameopt.Momentum(0.9), gameopt.Adam()):
        game, _, _ = _game([0.01, 0.03], algorithm=gameopt.SimGD([0.01, 0.03], update=rule))
        algo, state = game.algorithm, game.algorithm_state
        o = oracle(game)
        xi = o.xi()
        d1, s1 = algo.descend(o, o.empty().copy_(xi), state["rule"], scratch=True)
        step, s2 = algo.scaled_descent(o, o.empty().copy_(xi), state["rule"], scratch=True)
        assert isinstance(step, Scaled) and step.factors == [-0.01, -0.03]
        d2 = o.layout.resolve(step, o.empty)
        assert isinstance(d2, Vec) and all(torch.equal(a, b) for a, b in zip(d1, d2))
        assert all(torch.equal(a, b) for a, b in zip(gameopt.state.tensors_in(s1), gameopt.state.tensors_in(s2)))


def test_a_scaled_step_is_not_a_vector() -> None:
    step = Scaled(Vec([torch.ones(2)]), [0.5])
    with pytest.raises(TypeError):
        iter(step)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        step + step  # type: ignore[operator]


def test_a_scaled_step_through_a_feasible_set_is_projected() -> None:
    """A constrained player: the step is formed, then moved through the set."""
    box = gameopt.constraints.Box(-0.5, 0.5)  # x starts partly outside: the move projects it
    game, (x, y), losses = _game(0.05, constraint=box)
    w = x.detach().clone()
    xi = _xi(losses, (x, y))
    game.step()
    assert torch.equal(x.detach(), (w + (-0.05) * xi[0]).clamp(-0.5, 0.5))


def test_wrappers_move_from_their_bases_scaled_step() -> None:
    """Lookahead and averaging pass their base's step on, and form the point it
    reaches as the move does: averaging's iterates are SimGD's bit for bit, and with
    k=1, α=1 Lookahead's are too (up to its slow weights' rounding)."""
    plain, (x0, y0), _ = _game(0.01)
    wrapped, (x1, y1), _ = _game(0.01, algorithm=gameopt.Lookahead(gameopt.SimGD(0.01), k=1, alpha=1.0))
    averaged, (x2, y2), _ = _game(0.01, algorithm=gameopt.Averaging(gameopt.SimGD(0.01)))
    for _ in range(4):
        for game in (plain, wrapped, averaged):
            game.step()
    torch.testing.assert_close(x1.detach(), x0.detach(), rtol=0, atol=1e-6)
    assert torch.equal(x2.detach(), x0.detach()) and torch.equal(y2.detach(), y0.detach())


def test_adams_first_moment_is_implied_by_its_direction_and_not_read_again() -> None:
    """Adam declares m implied (a finite direction and v leave m finite): the step's
    check reads the direction and v, not m; a subclass with its own formula does not
    inherit the claim."""
    game, _, _ = _game(0.01, algorithm=gameopt.SimGD(0.01, update=gameopt.Adam()))
    step, state = game.algorithm.update(oracle(game), game.algorithm_state)
    assert isinstance(step, Scaled)
    assert [id(t) for t in step.implied] == [id(t) for t in state["rule"]["m"]]
    assert gameopt.Adam.implied == ("m",) and gameopt.RMSProp.implied == gameopt.Momentum.implied == ()

    class OwnFormula(gameopt.Adam):
        def apply(self, d, state, empty=None, scratch=False, own_state=False):
            return super().apply(d, state, empty, scratch=scratch, own_state=own_state)

    assert OwnFormula.implied == ()


@pytest.mark.parametrize("where", ["v overflows", "d is not finite"])
def test_adam_steps_whose_second_moment_or_gradient_is_not_finite_are_refused(where: str) -> None:
    """m is not read by the check; what makes it non-finite is still refused: a
    non-finite gradient (through the direction), and a gradient whose square
    overflows v while the direction stays finite (m/√v = 0)."""
    x = nn.Parameter(torch.ones(4))
    y = nn.Parameter(torch.ones(4))
    big = 1e30 if where == "v overflows" else float("inf")  # 1e30² overflows float32

    def losses():
        return big * x.sum() + (x * y).sum(), -(x * y).sum()

    game = gameopt.Game(
        [gameopt.Player([x]), gameopt.Player([y])], losses, algorithm=gameopt.SimGD(0.1, update=gameopt.Adam())
    )
    if where == "v overflows":  # the direction alone would pass: m/√v is 0 where v is inf
        step, _ = game.algorithm.update(oracle(game), game.algorithm_state)
        assert torch.isfinite(step.direction[0]).all()
    with pytest.raises(gameopt.NonFiniteError):
        game.step()
    assert torch.equal(x.detach(), torch.ones(4)) and torch.equal(y.detach(), torch.ones(4))
    assert game.algorithm_state["rule"]["t"] == 0
