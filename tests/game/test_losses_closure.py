"""The losses-closure rule: the losses read the parameters through the module on
every call. A closure holding tensors from before the game was built is refused by
the algorithms that evaluate the losses on substitutes (second order), with an
error that says what happened, and nothing changes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gameopt
from gameopt.evaluation import LossError


def _stale_game(algorithm: gameopt.Algorithm) -> tuple[gameopt.Game, list[torch.Tensor]]:
    torch.manual_seed(0)
    x, y = nn.Linear(2, 1, bias=False).double(), nn.Linear(2, 1, bias=False).double()
    wx, wy = x.weight, y.weight  # captured before the game is built

    def losses():
        f = (wx * wy).sum() + 0.5 * wx.pow(2).sum() - 0.5 * wy.pow(2).sum()
        return f, -f

    return gameopt.Game([x, y], losses, algorithm=algorithm), [wx, wy]


@pytest.mark.parametrize(
    "make",
    [lambda: gameopt.Stackelberg(0.1), lambda: gameopt.LOLA(0.1, alpha=0.1), lambda: gameopt.CGD(0.1)],
    ids=["Stackelberg", "LOLA", "CGD"],
)
def test_captured_tensors_are_refused_with_a_message_that_says_so(make) -> None:
    game, params = _stale_game(make())
    before = [p.detach().clone() for p in params]
    with pytest.raises(LossError) as err:
        game.step()
    message = str(err.value)
    assert "does not depend on that player's parameters" in message
    assert "did not use the player's current parameters" in message
    assert "captured before the game was built" in message
    assert "through the module on every call" in message
    assert all(torch.equal(p.detach(), b) for p, b in zip(params, before))  # nothing changed


def test_the_same_losses_read_through_the_module_run_with_every_kind_of_algorithm() -> None:
    for make in (lambda: gameopt.SimGD(0.1), lambda: gameopt.Stackelberg(0.1), lambda: gameopt.CGD(0.1)):
        torch.manual_seed(0)
        x, y = nn.Linear(2, 1, bias=False).double(), nn.Linear(2, 1, bias=False).double()

        def losses():
            f = (x.weight * y.weight).sum() + 0.5 * x.weight.pow(2).sum() - 0.5 * y.weight.pow(2).sum()
            return f, -f

        game = gameopt.Game([x, y], losses, algorithm=make())
        start = x.weight.detach().clone()
        game.step()
        assert not torch.equal(x.weight.detach(), start)
