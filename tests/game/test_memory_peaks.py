"""Memory at the peers' level (issue 13): the joint vectors alive while an
extragradient step evaluates at the extrapolated point, counted by storage
(deterministic, no resident sets); and nothing lost when that evaluation fails.
The resident-set table with the peers beside is
``python -m benchmarks.scaling --only memory``."""

from __future__ import annotations

import pytest
import torch
from games import GAMES

import gameopt
import gameopt.updates
from gameopt.testing import held_storages

# method -> (algorithm, joint vectors alive during the second evaluation beyond parameters and gradients)
SECOND_EVALUATION = {
    "Extragradient": (lambda: gameopt.Extragradient(0.05), 1),  # the point's backup
    # the committed moments, the first ξ (the moments after the extrapolation are
    # recomputed from it afterwards: large vectors) and the point's backup; cooper
    # mutates its two moments in place and holds 3
    "Extra-Adam": (lambda: gameopt.Extragradient([0.05, 0.02], update=gameopt.Adam()), 4),
    # small vectors: the moments after the extrapolation are kept (no recomputation)
    "Extra-Adam, small vectors": (lambda: gameopt.Extragradient([0.05, 0.02], update=gameopt.Adam()), 5),
    "Extra-Momentum": (lambda: gameopt.Extragradient(0.05, update=gameopt.Momentum(0.5)), 3),
    "Extra-RMSProp": (lambda: gameopt.Extragradient(0.05, update=gameopt.RMSProp()), 3),  # its direction in ξ
}


_held = held_storages  # the state's joint vectors, the pool's and the point's backup


@pytest.mark.parametrize("name", list(SECOND_EVALUATION))
def test_vectors_alive_during_the_evaluation_at_the_extrapolated_point(monkeypatch, name) -> None:
    make, expected = SECOND_EVALUATION[name]
    monkeypatch.setattr(gameopt.updates, "_RECOMPUTE_FROM", 1 << 62 if "small" in name else 0)
    tg = GAMES["bilinear"]()
    counts: list[int] = []

    def losses(ws):
        counts.append(len(_held(game)))
        return tg_losses(ws)

    tg_losses, tg.losses_fn = tg.losses_fn, losses
    with gameopt.debug.enabled_in(False):  # debug mode keeps copies of every ξ
        game = tg.build(make())
        for _ in range(3):
            game.step()
    assert counts[3::2] == [expected] * 2  # the second evaluation of each warm step


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "small vectors"])
@pytest.mark.parametrize("failure", ["nan", "error"])
def test_extra_adam_failing_at_the_extrapolated_point_loses_nothing(monkeypatch, failure, recompute) -> None:
    monkeypatch.setattr(gameopt.updates, "_RECOMPUTE_FROM", 0 if recompute else 1 << 62)
    tg = GAMES["bilinear"]()
    armed = {"on": False, "calls": 0}

    def losses(ws):
        f = ws[0] @ ws[1]
        armed["calls"] += 1
        if armed["on"] and armed["calls"] == 2:
            if failure == "error":
                raise RuntimeError("the user's loss failed")
            f = f * float("nan")
        return [f, -f]

    tg.losses_fn = losses
    game = tg.build(gameopt.Extragradient([0.05, 0.02], update=gameopt.Adam((0.5, 0.9))))
    for _ in range(2):
        game.step()
    params = [p.clone() for p in tg.params()]
    state = {k: [t.clone() for t in v] if isinstance(v, list) else v for k, v in game.algorithm_state["rule"].items()}
    armed.update(on=True, calls=0)
    with pytest.raises(gameopt.NonFiniteError if failure == "nan" else RuntimeError):
        game.step()
    assert armed["calls"] == 2
    bits = lambda t: t.view(torch.int64)  # noqa: E731
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(tg.params(), params))
    rule = game.algorithm_state["rule"]
    assert rule["t"] == state["t"] == 4
    for k in ("m", "v"):
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(rule[k], state[k]))
