"""Nothing lost (issue 11): every malformed state dict is a ValueError that changes nothing,
and a game checkpoint with its module buffers alone resumes a run."""

from __future__ import annotations

import copy

import pytest
import torch
from games import GAMES, assert_same_state
from torch import nn

import gameopt


# ---------------------------------------------------------- nothing lost (issue 11)
def _adam_game():
    tg = GAMES["quadratic"]()
    game = tg.build(gameopt.Extragradient(0.1, update=gameopt.Adam()))
    for _ in range(2):
        game.step()
    return tg, game


def _malformed(sd):
    """(description, a malformed copy of ``sd``) for every way a state can be wrong."""
    cases = []

    def case(name, edit):
        bad = copy.deepcopy(sd)
        edit(bad)
        cases.append((name, bad))

    case("skipped_steps None", lambda s: s.__setitem__("skipped_steps", None))
    case("skipped_steps negative", lambda s: s.__setitem__("skipped_steps", -1))
    case("skipped_steps missing", lambda s: s.pop("skipped_steps"))
    case("players entry not a dict", lambda s: s["players"].__setitem__(1, "oops"))
    case("players not a list", lambda s: s.__setitem__("players", {"a": 1}))
    case("algorithm not a dict", lambda s: s.__setitem__("algorithm", [1, 2]))
    case("algorithm missing", lambda s: s.pop("algorithm"))
    case("params missing", lambda s: s["players"][0].pop("params"))
    case("params not a list", lambda s: s["players"][0].__setitem__("params", None))
    case("lr a string", lambda s: s["algorithm"]["param_groups"][0].__setitem__("lr", "0.1"))
    case("lr nan", lambda s: s["algorithm"]["param_groups"][1].__setitem__("lr", float("nan")))
    case("param_groups short", lambda s: s["algorithm"]["param_groups"].pop())
    case("adam step None", lambda s: s["algorithm"]["state"]["rule"].__setitem__("t", None))
    case("adam step a float", lambda s: s["algorithm"]["state"]["rule"].__setitem__("t", 2.5))
    case("adam moment wrong shape", lambda s: s["algorithm"]["state"]["rule"]["m"].__setitem__(0, torch.zeros(2)))
    case("state not a dict", lambda s: s["algorithm"].__setitem__("state", 3))
    case("not a dict at all", lambda s: s.clear())
    cases.append(("a list", [sd]))
    return cases


def test_every_malformed_state_dict_is_a_value_error_that_changes_nothing() -> None:
    tg, game = _adam_game()
    good = game.state_dict()
    game.step()  # the game now differs from ``good``
    now = copy.deepcopy(game.state_dict())
    for name, bad in _malformed(good):
        try:
            game.load_state_dict(bad)
        except ValueError:
            pass
        else:
            pytest.fail(f"accepted a state_dict with {name}")
        assert_same_state(game.state_dict(), now)
    game.load_state_dict(good)  # a good one still loads
    assert_same_state(game.state_dict(), good)


def test_state_dict_carries_module_buffers_and_a_game_checkpoint_alone_resumes(tmp_path) -> None:
    def make(seed):
        torch.manual_seed(seed)
        gen = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).double()
        disc = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)).double()
        data = torch.Generator().manual_seed(1)
        batches = [(torch.randn(16, 2, generator=data, dtype=torch.float64),) * 2 for _ in range(6)]

        def losses(x, z):
            real, fake = disc(x), disc(gen(z))
            return fake.mean(), real.mean() - fake.mean()

        return gen, disc, gameopt.Game([gen, disc], losses, algorithm=gameopt.SimGD(0.05)), batches

    gen, disc, game, batches = make(0)
    for x, z in batches[:3]:
        game.step(x, z)
    sd = game.state_dict()
    assert set(sd["players"][0]["buffers"]) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    torch.save(sd, tmp_path / "game.pt")
    for x, z in batches[3:]:
        game.step(x, z)
    gen2, disc2, resumed, _ = make(1)  # other initial values everywhere
    resumed.load_state_dict(torch.load(tmp_path / "game.pt", weights_only=True))
    for x, z in batches[3:]:
        resumed.step(x, z)
    for m, m2 in ((gen, gen2), (disc, disc2)):
        for (k, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
            assert torch.equal(a, b), k
