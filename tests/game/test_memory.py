"""Memory (issue 13): between warm steps a game keeps only the state its method
needs, counted by storage (deterministic, no timing). The resident-set table with
the peers beside is ``python -m benchmarks.scaling --only memory``."""

from __future__ import annotations

import pytest
import torch
from games import GAMES

import gameopt
from gameopt.state import tensors_in
from gameopt.testing import held_storages

# method -> (algorithm, joint vectors it keeps between steps beyond parameters and gradients)
KEPT = {
    "SimGD": (lambda: gameopt.SimGD(0.05), 0),
    "SimGD+Momentum": (lambda: gameopt.SimGD(0.05, update=gameopt.Momentum(0.5)), 1),
    "SimGD+Nesterov": (lambda: gameopt.SimGD(0.05, update=gameopt.Momentum(0.5, nesterov=True)), 1),
    "SimGD+Adam": (lambda: gameopt.SimGD(0.05, update=gameopt.Adam()), 2),
    "SimGD+RMSProp": (lambda: gameopt.SimGD(0.05, update=gameopt.RMSProp()), 1),
    "AltGD": (lambda: gameopt.AltGD(0.05), 0),
    "Extragradient": (lambda: gameopt.Extragradient(0.05), 0),
    "Extra-Adam": (lambda: gameopt.Extragradient([0.05, 0.02, 0.03], update=gameopt.Adam()), 2),
    "Optimistic": (lambda: gameopt.Optimistic(0.05), 1),
    "Optimistic+Adam": (lambda: gameopt.Optimistic(0.05, update=gameopt.Adam()), 3),
    "Lookahead(SimGD+Adam)": (lambda: gameopt.Lookahead(gameopt.SimGD(0.05, update=gameopt.Adam()), k=2), 3),
    "Lookahead(Extragradient)": (lambda: gameopt.Lookahead(gameopt.Extragradient(0.05), k=2), 1),
}


#: storages of the joint vectors the game holds between steps, beyond parameters and
#: gradients: the algorithm state's (a wrapper's holds its base's), the pool's and the
#: evaluation backup
kept_storages = held_storages


@pytest.mark.parametrize("name", list(KEPT))
def test_a_warm_step_keeps_only_the_state_its_method_needs(name) -> None:
    make, expected = KEPT[name]
    game = GAMES["quadratic"]().build(make())
    for _ in range(5):  # Lookahead's synchronizations included
        game.step()
        assert len(kept_storages(game)) == expected
        state = {t.untyped_storage().data_ptr() for t in tensors_in(game.algorithm_state)}
        assert all(v[0].untyped_storage().data_ptr() in state for v in game.scratch_vectors)


def _clone(state: dict) -> dict:
    return {k: [t.clone() for t in v] if isinstance(v, list) else v for k, v in state.items()}


@pytest.mark.parametrize(
    "rule",
    [gameopt.Momentum(0.7), gameopt.Momentum(0.7, nesterov=True), gameopt.Adam((0.5, 0.9)), gameopt.RMSProp(0.8)],
    ids=repr,
)
@pytest.mark.parametrize("scratch, own_state", [(True, False), (False, True), (True, True)])
def test_scratch_and_own_state_give_the_same_numbers(rule, scratch, own_state) -> None:
    """Writing into ``d`` (``scratch``) or updating a temporary state in place
    (``own_state``) changes where the numbers go, never the numbers."""
    torch.manual_seed(0)
    d = [torch.randn(7, dtype=torch.float64), torch.randn(3, dtype=torch.float64)]
    _, state = rule.apply(d, rule.init(d))  # a state that is not zero
    ref_out, ref_state = rule.apply(d, _clone(state))
    out, new = rule.apply([t.clone() for t in d], _clone(state), scratch=scratch, own_state=own_state)
    assert all(torch.equal(a, b) for a, b in zip(out, ref_out))
    assert new.keys() == ref_state.keys()
    for k, v in ref_state.items():
        assert all(torch.equal(a, b) for a, b in zip(new[k], v)) if isinstance(v, list) else new[k] == v
