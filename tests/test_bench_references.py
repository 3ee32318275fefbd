"""The bare reference steps the GPU table sets gameopt's beside (``benchmarks/bare.py``)
take the same steps as gameopt's algorithms, so that the table compares like with like
(on the CPU, float64)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gameopt
from benchmarks import bare
from benchmarks.gpu import step_counts

F64 = torch.float64


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).to(F64)
    D = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1)).to(F64)
    return G, D


def _losses_of(G: nn.Module, D: nn.Module):
    def losses(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d_fake, d_real = D(G(z)), D(x)
        sp = nn.functional.softplus
        return sp(-d_fake).mean(), sp(-d_real).mean() + sp(d_fake).mean()

    return losses


CASES = {
    "SimGD": (lambda: gameopt.SimGD(0.1), lambda G, D, x, z: bare.simgd(G, D, _losses_of, x, z, 0.1), 0.0),
    # torch.optim's Adam adds ε to the bias-corrected √v̂, gameopt's to √v: ε = 0 makes them one formula
    "Extra-Adam": (
        lambda: gameopt.Extragradient(0.01, update=gameopt.Adam((0.5, 0.9), eps=0.0)),
        lambda G, D, x, z: bare.extra_adam(G, D, _losses_of, x, z, 0.01, (0.5, 0.9), eps=0.0),
        1e-12,
    ),
    "Consensus": (
        lambda: gameopt.ConsensusOptimization(0.1, gamma=0.3),
        lambda G, D, x, z: bare.consensus(G, D, _losses_of, x, z, 0.1, 0.3),
        1e-12,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_bare_reference_takes_gameopts_steps(name: str) -> None:
    make, reference, tol = CASES[name]
    x, z = torch.randn(16, 2, dtype=F64), torch.randn(16, 3, dtype=F64)
    G, D = _pair()
    game = gameopt.Game([G, D], _losses_of(G, D), algorithm=make())
    Gb, Db = _pair()
    step = reference(Gb, Db, x, z)
    for _ in range(3):
        game.step(x, z)
        step()
    # the references moved, and to where gameopt's steps went
    mine = torch.cat([p.detach().reshape(-1) for p in [*G.parameters(), *D.parameters()]])
    theirs = torch.cat([p.detach().reshape(-1) for p in [*Gb.parameters(), *Db.parameters()]])
    assert not torch.equal(theirs, torch.cat([p.detach().reshape(-1) for m in _pair() for p in m.parameters()]))
    torch.testing.assert_close(mine, theirs, rtol=tol, atol=tol)


def test_step_counts_on_the_cpu_are_the_aten_ops_copies_and_syncs() -> None:
    G, D = _pair()
    x, z = torch.randn(16, 2, dtype=F64), torch.randn(16, 3, dtype=F64)
    game = gameopt.Game([G, D], _losses_of(G, D), algorithm=gameopt.SimGD(0.1))
    with gameopt.debug.enabled_in(False):
        mine = step_counts(lambda: game.step(x, z), torch.device("cpu"))
    theirs = step_counts(bare.simgd(*_pair(), _losses_of, x, z, 0.1), torch.device("cpu"))
    assert theirs["copies"] == theirs["syncs"] == 0 and theirs["launches"] > 10
    assert mine["syncs"] == 1 and mine["launches"] > theirs["launches"]
