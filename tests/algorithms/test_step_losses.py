"""What ``game.step()`` returns, for every algorithm: the losses of the step's first
evaluation. That is at the step's starting point w_t for every algorithm but past
extragradient, whose one evaluation is at the extrapolated point
w'_t = w_t − η u_{t−1} (w_t itself at the first step, where u_{−1} = 0)."""

from __future__ import annotations

import pytest
import torch

from gameopt.testing import GENERIC, TWO_PLAYERS, AlgoInfo, learning_rates
from gameopt.testing.games import nonquadratic, regularized_bilinear

ROWS = [*GENERIC, *TWO_PLAYERS]


def _evaluated_at(info: AlgoInfo, game, ws: list[torch.Tensor]) -> list[torch.Tensor]:
    """Where the step's first evaluation is, by the documented rule."""
    if not info.name.startswith("PastExtra"):
        return ws
    prev = game.layout.per_player(game.algorithm_state["prev"])  # u_{t−1}, one flat tensor per player
    return [w - lr * u for w, lr, u in zip(ws, game.algorithm.lrs, prev)]


@pytest.mark.parametrize("info", ROWS, ids=[info.name for info in ROWS])
def test_step_returns_the_losses_of_its_first_evaluation(info: AlgoInfo) -> None:
    tg = regularized_bilinear() if info.players == 2 else nonquadratic()
    game = tg.build(info.make(learning_rates(len(tg.init))))
    moved_away = False
    for t in range(4):
        start = tg.params()
        at = _evaluated_at(info, game, start)
        moved_away |= any(not torch.equal(a, w) for a, w in zip(at, start))
        want = tg.losses_fn(at)
        got = game.step()
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(g, w.detach(), rtol=1e-12, atol=1e-12, msg=f"step {t}, player {i}")
    if info.name.startswith("PastExtra"):
        assert moved_away  # the rule's exception is exercised, not vacuous
