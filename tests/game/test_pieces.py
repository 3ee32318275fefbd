"""ξ read where autograd left it (gameopt.vec.Pieces): a plain-gradient SimGD or
extragradient step on players with large tensors checks and moves with autograd's
gradients, without copying them into the fused gradient buffer. It must give what
``torch.optim.SGD`` gives (``p.add_(grad, alpha=-lr)``, tensor by tensor), refuse what
the buffered step refuses, and fall back to the buffer wherever the step is formed
first. Equalities of one machine's kernels: each side runs the same ops."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import gameopt
import gameopt.autodiff.xi as first_order_xi
from gameopt.testing.traffic import count
from gameopt.vec import Pieces, Vec

BIG = first_order_xi.PIECES_MIN  # elements per tensor from which a player's ξ stays in pieces


@pytest.fixture(autouse=True)
def _as_users_run() -> object:
    """The path a user's step takes: the suite's debug checks (GAMEOPT_DEBUG) off (debug
    mode copies ξ whatever the path)."""
    with gameopt.debug.enabled_in(False):
        yield


def _players(seed: int = 0, dtype: torch.dtype = torch.float64, unused: bool = False):
    """Three players, large tensors: x (a matrix and a vector), y and z (vectors), a
    general-sum game that is not quadratic."""
    g = torch.Generator().manual_seed(seed)
    a = nn.Parameter(torch.randn(64, 64, generator=g, dtype=dtype) / 8)
    b = nn.Parameter(torch.randn(2 * BIG, generator=g, dtype=dtype) / 8)
    y = nn.Parameter(torch.randn(BIG + 7, generator=g, dtype=dtype) / 8)
    z = nn.Parameter(torch.randn(BIG, generator=g, dtype=dtype) / 8)
    c = torch.randn(64, generator=g, dtype=dtype)
    spare = nn.Parameter(torch.zeros(BIG, dtype=dtype)) if unused else None

    def losses():
        u = torch.tanh(a @ c).sum() * y[:BIG].dot(z) + (b**4).sum() / 4
        v = (y**2).sum() - u + torch.sin(b[: BIG + 7]).dot(y)
        w = (z * y[:BIG]).sum() + torch.cosh(z / 4).sum()
        return u, v, w

    first = [a, b] if spare is None else [a, b, spare]
    return [first, [y], [z]], losses


def _game(algorithm, verdict="host", unused=False, constraint=None, dtype=torch.float64):
    params, losses = _players(unused=unused, dtype=dtype)
    players = [
        gameopt.Player(params[0], name="x"),
        gameopt.Player(params[1], name="y", constraint=constraint),
        gameopt.Player(params[2], name="z"),
    ]
    return gameopt.Game(players, losses, algorithm=algorithm, verdict=verdict), params, losses


def _same(params, ref) -> bool:
    return all(torch.equal(p.detach(), r.detach()) for ps, rs in zip(params, ref) for p, r in zip(ps, rs))


LRS = [0.01, 0.03, 0.02]


def _game_xi(game, params):
    """ξ as the game evaluates it at its point (its gradient buffer, after
    ``vector_field``): the bare loop's ``autograd.grad`` on tensors of their own may
    round differently (a BLAS kernel's blocking follows the data's alignment)."""
    game.vector_field()
    return [[p.grad.clone() for p in ps] for ps in params]


def _added(params, xi, lrs):
    """Each parameter plus −lr times its gradient, ``torch.add(alpha=)`` (torch.optim.SGD's op)."""
    return [[torch.add(p.detach(), g, alpha=-lr) for p, g in zip(ps, gs)] for ps, gs, lr in zip(params, xi, lrs)]


def _set(params, values) -> None:
    with torch.no_grad():
        for ps, vs in zip(params, values):
            for p, v in zip(ps, vs):
                p.copy_(v)


@pytest.mark.parametrize("verdict", ["host", "device"])
@pytest.mark.parametrize("lrs", [0.02, LRS], ids=["one lr", "one per player"])
def test_simgd_is_torch_optims_sgd_bit_for_bit(verdict, lrs) -> None:
    game, params, _ = _game(gameopt.SimGD(lrs), verdict)
    lrs = [lrs] * 3 if isinstance(lrs, float) else lrs
    for _ in range(4):
        expected = _added(params, _game_xi(game, params), lrs)
        game.step()
        assert _same(params, expected)
    game.synchronize()


@pytest.mark.parametrize("verdict", ["host", "device"])
def test_extragradient_is_its_formula_with_torch_optims_adds(verdict) -> None:
    """w' = w − η'ξ(w), w⁺ = w − ηξ(w'), each add one ``add(alpha=)`` per tensor."""
    eta_x = [0.02, 0.01, 0.04]
    game, params, _ = _game(gameopt.Extragradient(LRS, extrapolation_lr=eta_x), verdict)
    for _ in range(3):
        w = [[p.detach().clone() for p in ps] for ps in params]
        _set(params, _added(params, _game_xi(game, params), eta_x))
        xi_x = _game_xi(game, params)
        _set(params, w)
        expected = _added(params, xi_x, LRS)
        game.step()
        assert _same(params, expected)
    game.synchronize()


@pytest.mark.parametrize("verdict", ["host", "device"])
@pytest.mark.parametrize("name", ["SimGD", "Extragradient"])
def test_players_of_two_groups_are_checked_and_moved_group_by_group(verdict, name) -> None:
    """z in float32, the others in float64: two joint groups, each with its own bound
    from its own pieces (and a non-finite piece of either refuses the step)."""
    make = {"SimGD": lambda: gameopt.SimGD(LRS), "Extragradient": lambda: gameopt.Extragradient(LRS)}[name]
    params, losses = _players()
    z = nn.Parameter(params[2][0].detach().float())

    def mixed():
        u, v, _ = losses()
        return u, v, (z * params[1][0][:BIG].float()).sum() + torch.cosh(z / 4).sum()

    players = [gameopt.Player(params[0]), gameopt.Player(params[1]), gameopt.Player([z])]
    game = gameopt.Game(players, mixed, algorithm=make(), verdict=verdict)
    assert len(game.layout.data) == 2
    both = [params[0], params[1], [z]]
    if name == "SimGD":
        expected = _added(both, _game_xi(game, both), LRS)
        game.step()
        assert _same(both, expected)
    seen = count(game.step, BIG).names  # (the losses' casts are copies of their own)
    assert seen.get("_foreach_copy_", 0) == (2 if name == "Extragradient" else 0), seen
    game.synchronize()
    before = [[p.detach().clone() for p in ps] for ps in both]
    with torch.no_grad():
        z[0] = float("inf")  # its loss, its ξ: not finite
    with pytest.raises(gameopt.NonFiniteError):
        game.step()
        game.synchronize()
    assert _same(both[:2], before[:2])


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["SimGD", "Extragradient"])
def test_a_half_precision_group_beside_a_float32_one_moves_as_with_the_buffer(half, name) -> None:
    """Under the device verdict one fused add per group: the CPU's fused kernel writes
    wrong half-precision values (``torch.where`` there), so a half group must not ride
    in a float32 group's call."""

    def build():
        g = torch.Generator().manual_seed(1)
        x = nn.Parameter(torch.randn(2 * BIG, generator=g) / 4)
        y = nn.Parameter((torch.randn(2 * BIG, generator=g) / 4).to(half))

        def losses():
            f = (x * y.float()).sum() + (x**2).sum() / 2
            return f, -f + (y.float() ** 2).sum() / 4

        algorithm = gameopt.SimGD(0.05) if name == "SimGD" else gameopt.Extragradient(0.05)
        players = [gameopt.Player([x]), gameopt.Player([y])]
        return gameopt.Game(players, losses, algorithm=algorithm, verdict="device"), [[x], [y]]

    (game, params), (other, other_params) = build(), build()
    for _ in range(2):
        game.step()
        with _buffered():
            other.step()
    game.synchronize()
    other.synchronize()
    assert not torch.equal(params[1][0], build()[1][1][0])  # (it moved)
    assert _same(params, other_params)


@pytest.mark.parametrize("name", ["SimGD", "Extragradient"])
def test_a_point_the_algorithm_asks_for_is_the_one_the_move_makes(name) -> None:
    """``oracle.moved(delta)`` forms the point as the live move does (each parameter's
    ``add_(alpha=)``): Averaging's average is the point itself before it starts averaging,
    also with two learning rates in one group."""
    algorithm = gameopt.Averaging(getattr(gameopt, name)([0.1, 0.03, 0.02]), start=10)
    game, params, _ = _game(algorithm)
    for _ in range(2):
        game.step()
        average = algorithm.average()
        for i, ps in enumerate(params):
            assert torch.equal(average[i], torch.cat([p.detach().reshape(-1) for p in ps]))


def test_the_step_reads_xi_where_autograd_left_it_and_copies_nothing() -> None:
    """The pieces path is the one taken (no copy of ξ), and below the size where it pays
    the buffered one is (one copy into the buffer)."""
    game, _, _ = _game(gameopt.SimGD(0.01))
    seen = count(game.step, BIG)
    assert seen.copies == 0, seen.names
    small = [nn.Parameter(torch.randn(16, dtype=torch.float64)) for _ in range(2)]
    g = gameopt.Game(
        [gameopt.Player([small[0]]), gameopt.Player([small[1]])],
        lambda: ((small[0] * small[1]).sum(), -(small[0] * small[1]).sum()),
        algorithm=gameopt.SimGD(0.01),
    )
    assert count(g.step, 1).names.get("_foreach_copy_", 0) == 1


@contextlib.contextmanager
def _buffered() -> Iterator[None]:
    """No player large enough for pieces: ξ copied into the buffer."""
    saved = first_order_xi.PIECES_MIN
    first_order_xi.PIECES_MIN = 1 << 62
    try:
        yield
    finally:
        first_order_xi.PIECES_MIN = saved


@pytest.mark.parametrize("name", ["SimGD", "Extragradient"])
def test_the_pieces_and_the_buffered_step_agree(name) -> None:
    """The same iterates with ξ in pieces and with ξ copied into the buffer (one
    learning rate: both add with it, tensor by tensor or group by group)."""
    make = {"SimGD": lambda: gameopt.SimGD(0.02), "Extragradient": lambda: gameopt.Extragradient(0.02)}[name]
    (game, params, _), (other, other_params, _) = _game(make()), _game(make())
    for k in range(4):
        mine = count(game.step, BIG)
        with _buffered():
            theirs = count(other.step, BIG)
        assert _same(params, other_params), k
    assert mine.copies == (2 if name == "Extragradient" else 0), mine.names  # (EG: the point saved and put back)
    assert theirs.copies > mine.copies, theirs.names  # (ξ copied into the buffer: through .grad, here)


def test_a_parameter_no_gradient_reaches_stays_and_the_rest_moves() -> None:
    game, params, losses = _game(gameopt.SimGD(0.02), unused=True)
    spare = params[0][2].detach().clone()
    expected = _added(params, _game_xi(game, params), [0.02] * 3)
    game.step()
    assert torch.equal(params[0][2].detach(), spare)
    assert _same(params, expected)


@pytest.mark.parametrize("verdict", ["host", "device"])
@pytest.mark.parametrize("name", ["SimGD", "Extragradient"])
def test_a_non_finite_xi_in_pieces_is_refused_and_nothing_changes(verdict, name) -> None:
    algorithm = gameopt.SimGD(0.01) if name == "SimGD" else gameopt.Extragradient(0.01)
    game, params, losses = _game(algorithm, verdict)
    game.step()
    game.synchronize()
    before = [[p.detach().clone() for p in ps] for ps in params]
    bad = {"now": False}

    def poisoned():
        u, v, w = losses()
        return (u * float("nan"), v, w) if bad["now"] else (u, v, w)

    game.losses = poisoned
    bad["now"] = True
    with pytest.raises(gameopt.NonFiniteError, match="not finite"):
        game.step()
        game.synchronize()
    assert _same(params, before)
    bad["now"] = False
    game.step()  # and it goes on
    game.synchronize()
    assert not _same(params, before)


def test_a_new_point_that_would_overflow_is_refused_with_xi_in_pieces() -> None:
    """A float32 step beyond the largest float32 (y₀ = 1.5e19, its gradient about 3e19, its
    learning rate 2e19), the losses finite: the bound max|w| + max|δ| passes the limit,
    the point is read, the new point formed (ξ filled into the buffer) and refused."""
    game, params, _ = _game(gameopt.SimGD([0.01, 2e19, 0.01]), dtype=torch.float32)
    with torch.no_grad():
        params[1][0][0] = 1.5e19
    before = [[p.detach().clone() for p in ps] for ps in params]
    with pytest.raises(gameopt.NonFiniteError, match="overflow"):
        game.step()
    assert _same(params, before)


def test_a_constrained_player_takes_xi_through_the_buffer_bit_for_bit() -> None:
    """A feasible set forms the point first: ξ is filled into the buffer (as without pieces)."""
    box = gameopt.constraints.Box(-0.05, 0.05)
    (game, params, _), (other, other_params, _) = (
        _game(gameopt.Extragradient(0.02), constraint=box),
        _game(gameopt.Extragradient(0.02), constraint=box),
    )
    for _ in range(3):
        game.step()
        with _buffered():
            other.step()
    assert _same(params, other_params)
    assert params[1][0].abs().max() <= 0.05


def test_a_wrapper_forms_its_bases_step_from_xi_in_pieces() -> None:
    game, params, _ = _game(gameopt.Lookahead(gameopt.SimGD(0.02), k=2, alpha=0.5))
    other, other_params, _ = _game(gameopt.Lookahead(gameopt.SimGD(0.02), k=2, alpha=0.5))
    for _ in range(4):
        game.step()
        with _buffered():
            other.step()
    assert _same(params, other_params)


@pytest.mark.parametrize("next_evaluation", ["xi", "xi in pieces", "xi along it", "linearize"])
def test_xi_in_pieces_is_released_by_the_next_evaluation(next_evaluation) -> None:
    """An algorithm that keeps pieces past the evaluation they were lent for is told so
    (along them: once the point is formed), and nothing moves."""

    class KeepsPieces(gameopt.Extragradient):
        def update(self, oracle, state):
            xi = oracle.xi(pieces=True)
            assert isinstance(xi, Pieces)
            if next_evaluation == "linearize":
                oracle.linearize()
            elif next_evaluation == "xi along it":
                oracle.xi(along=(xi, [-0.01] * oracle.num_players), pieces=True)
            else:
                oracle.xi(pieces=next_evaluation == "xi in pieces")
            return self.scaled_descent(oracle, xi, state["rule"])[0], state

    game, params, _ = _game(KeepsPieces(0.01))
    before = [[p.detach().clone() for p in ps] for ps in params]
    with pytest.raises(RuntimeError, match="borrowed until the next evaluation"):
        game.step()
    assert _same(params, before)


# ------------------------------------------------- update rules that read ξ in pieces
#: the rules that declare ``reads_pieces``, each setting that changes which ops they run
RULES = {
    "Momentum": lambda: gameopt.Momentum(0.9),
    "Momentum, nesterov": lambda: gameopt.Momentum(0.9, nesterov=True),
    "Adam": lambda: gameopt.Adam(),
    "RMSProp": lambda: gameopt.RMSProp(),
    "RMSProp, tf1": lambda: gameopt.RMSProp(convention="tf1"),
}
ALGORITHMS = {
    "SimGD": lambda rule: gameopt.SimGD(LRS, update=rule),
    "Extragradient": lambda rule: gameopt.Extragradient(LRS, update=rule),
}


@pytest.fixture
def rules_read_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules read these players' ξ in pieces (their tensors are smaller than
    ``RULE_PIECES_MIN``, from which it pays on the CPU)."""
    monkeypatch.setattr(gameopt.vec, "RULE_PIECES_MIN", BIG)


def _close(params, ref) -> None:
    """Equal up to the last bits: a rule's ops run per parameter on ξ in pieces and per
    group on the buffer, and a kernel's vectorized body and its tail may round an
    element differently (a fused multiply-add in one of them)."""
    for ps, rs in zip(params, ref):
        for p, r in zip(ps, rs):
            torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-12, atol=1e-15)


@pytest.mark.usefixtures("rules_read_pieces")
@pytest.mark.parametrize("verdict", ["host", "device"])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("rule", list(RULES))
def test_a_rule_reads_xi_in_pieces_as_it_reads_the_buffer(rule, algorithm, verdict) -> None:
    """Momentum, Adam and RMSProp read each parameter's gradient where autograd left it:
    no copy of ξ, the buffered step's iterates and state."""
    make = ALGORITHMS[algorithm]
    (game, params, _), (other, other_params, _) = _game(make(RULES[rule]()), verdict), _game(make(RULES[rule]()))
    for _ in range(3):
        mine = count(game.step, BIG)
        with _buffered():
            theirs = count(other.step, BIG)
    game.synchronize()
    _close(params, other_params)
    mine_state, their_state = game.state_dict()["algorithm"]["state"], other.state_dict()["algorithm"]["state"]
    for k, v in mine_state["rule"].items():
        if isinstance(v, list):
            for a, b in zip(v, their_state["rule"][k]):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
        else:
            assert v == their_state["rule"][k]
    # no copy of ξ (EG: of ξ(w) and ξ(w')): a copy per parameter and evaluation, a read
    # and a write of every element
    elements, evaluations = sum(p.numel() for ps in params for p in ps), {"SimGD": 1, "Extragradient": 2}[algorithm]
    assert theirs.copies - mine.copies == 4 * evaluations, (mine.names, theirs.names)
    assert theirs.touched - mine.touched == 2 * elements * evaluations


@pytest.mark.usefixtures("rules_read_pieces")
@pytest.mark.parametrize("verdict", ["host", "device"])
def test_extra_adams_extrapolation_that_keeps_xi_reads_it_in_pieces(verdict, monkeypatch) -> None:
    """On large vectors Adam's extrapolation keeps a copy of ξ(w) instead of the two
    moments (``Adam.extrapolate``): from the pieces, the buffer as its scratch."""
    monkeypatch.setattr(gameopt.updates, "_RECOMPUTE_FROM", BIG)
    make = ALGORITHMS["Extragradient"]
    (game, params, _), (other, other_params, _) = _game(make(gameopt.Adam()), verdict), _game(make(gameopt.Adam()))
    for _ in range(3):
        mine = count(game.step, BIG, warmup=0)
        with _buffered():
            theirs = count(other.step, BIG, warmup=0)
    game.synchronize()
    _close(params, other_params)
    # ξ(w) and ξ(w') not copied into the buffer (the copy the memo keeps is made in both)
    assert theirs.touched - mine.touched == 4 * sum(p.numel() for ps in params for p in ps)
    # the memo's copy from the pieces is one foreach copy, not a copy per parameter
    assert mine.copies == mine.names.get("_foreach_copy_") == 3, mine.names  # (with the point saved and put back)
    mine_state, their_state = game.state_dict()["algorithm"]["state"], other.state_dict()["algorithm"]["state"]
    for k in ("m", "v"):
        torch.testing.assert_close(mine_state["rule"][k], their_state["rule"][k], rtol=1e-12, atol=1e-15)
    assert mine_state["rule"]["t"] == their_state["rule"]["t"] == 6


@pytest.mark.usefixtures("rules_read_pieces")
@pytest.mark.parametrize("verdict", ["host", "device"])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_a_non_finite_xi_in_pieces_leaves_the_rules_state_as_it_was(algorithm, verdict) -> None:
    game, params, losses = _game(ALGORITHMS[algorithm](gameopt.Adam()), verdict)
    game.step()
    game.synchronize()
    before = [[p.detach().clone() for p in ps] for ps in params]
    state = game.state_dict()["algorithm"]["state"]

    def poisoned():
        u, v, w = losses()
        return u, v, w * float("nan")

    game.losses = poisoned
    with pytest.raises(gameopt.NonFiniteError, match="not finite"):
        game.step()
        game.synchronize()
    assert _same(params, before)
    after = game.state_dict()["algorithm"]["state"]
    assert after["rule"]["t"] == state["rule"]["t"] == {"SimGD": 1, "Extragradient": 2}[algorithm]
    assert all(torch.equal(a, b) for k in ("m", "v") for a, b in zip(after["rule"][k], state["rule"][k]))


@pytest.mark.usefixtures("rules_read_pieces")
def test_a_rule_on_two_groups_and_an_unreached_parameter_reads_xi_as_the_buffered_step() -> None:
    """z in float32 (two joint groups) and a parameter no gradient reaches, whose zeros
    the evaluation writes into the buffer: ξ is then filled (Pieces.in_buffer) and
    Adam reads it there, as the buffered step does."""

    def build():
        params, losses = _players(unused=True)
        z = nn.Parameter(params[2][0].detach().float())

        def mixed():
            u, v, _ = losses()
            return u, v, (z * params[1][0][:BIG].float()).sum() + torch.cosh(z / 4).sum()

        players = [gameopt.Player(params[0]), gameopt.Player(params[1]), gameopt.Player([z])]
        algorithm = gameopt.SimGD(LRS, update=gameopt.Adam())
        return gameopt.Game(players, mixed, algorithm=algorithm), [params[0], params[1], [z]]

    (game, params), (other, other_params) = build(), build()
    assert len(game.layout.data) == 2
    for _ in range(3):
        seen = count(game.step, BIG, warmup=0).names
        with _buffered():
            other.step()
    assert seen.get("_foreach_copy_", 0) >= 1, seen  # (filled)
    _close(params, other_params)
    assert torch.equal(params[0][2], torch.zeros(BIG, dtype=torch.float64))


@pytest.mark.usefixtures("rules_read_pieces")
@pytest.mark.parametrize("rule", ["Adam", "RMSProp"])
def test_a_complex_player_reads_xi_in_pieces_as_the_buffered_step(rule) -> None:
    """Their real views of each gradient: autograd returns a lazy conjugate where a
    parameter reaches its loss through ``conj()`` (x here), resolved first."""

    def build():
        g = torch.Generator().manual_seed(2)
        x = nn.Parameter(torch.randn(2 * BIG, generator=g, dtype=torch.complex128) / 4)
        y = nn.Parameter(torch.randn(2 * BIG, generator=g, dtype=torch.complex128) / 4)

        def losses():  # (x's gradient: through conj() alone)
            f = (x.conj() * y).real.sum()
            return f, -f + (y.abs() ** 2).sum() / 4

        algorithm = gameopt.SimGD(0.05, update=RULES[rule]())
        return gameopt.Game([gameopt.Player([x]), gameopt.Player([y])], losses, algorithm=algorithm), [[x], [y]]

    (game, params), (other, other_params) = build(), build()
    for _ in range(3):
        mine = count(game.step, BIG, warmup=0)
        with _buffered():
            theirs = count(other.step, BIG, warmup=0)
        # y's ξ not copied (x's lazy conjugate is resolved into a tensor of its own, as
        # the buffered step's copy resolves it)
        assert mine.touched < theirs.touched and mine.copies == theirs.copies - 1, (mine.names, theirs.names)
    _close(params, other_params)


@pytest.mark.usefixtures("rules_read_pieces")
def test_a_rule_that_defines_its_own_formula_reads_the_buffer() -> None:
    """``reads_pieces`` is declared with a formula: a subclass with its own ``apply`` or
    ``extrapolate`` (or Adam's ``_moments``), or a mixin's ``apply``, does not inherit
    it, and gets the joint vector."""

    class Clipped(gameopt.Momentum):
        def apply(self, d, state, empty=None, scratch=False, own_state=False):
            assert not isinstance(d, Pieces)
            return super().apply(Vec(t.clamp(-1.0, 1.0) for t in d), state, empty)

    class Moments(gameopt.Adam):
        def _moments(self, x, m0, v0, m1, v1):
            super()._moments(x, m0, v0, m1, v1)

    class Extrapolates(gameopt.RMSProp):
        def extrapolate(self, d, state, empty=None):
            return super().extrapolate(d, state, empty)

    class Direction(gameopt.Adam):  # (its direction reads the moments, not ξ)
        def _direction(self, m1, v1, t, den, out):
            super()._direction(m1, v1, t, den, out)

    class Clip:  # a mixin's apply, ahead of Adam's in the method resolution order
        def apply(self, d, state, empty=None):
            assert not isinstance(d, Pieces)
            return gameopt.Adam.apply(self, Vec(t.clamp(-1.0, 1.0) for t in d), state, empty)

    class ClippedAdam(Clip, gameopt.Adam):
        pass

    assert gameopt.Adam.reads_pieces and gameopt.RMSProp.reads_pieces and gameopt.Momentum.reads_pieces
    assert Direction.reads_pieces and not gameopt.Plain.reads_pieces
    assert not Clipped.reads_pieces and not Moments.reads_pieces and not Extrapolates.reads_pieces
    assert not ClippedAdam.reads_pieces and not ClippedAdam.memory_flags and not ClippedAdam.implied
    game, _, _ = _game(gameopt.Extragradient(0.01, update=ClippedAdam()))
    game.step()
    game, params, _ = _game(gameopt.SimGD(0.01, update=Clipped()))
    assert count(game.step, BIG).copies == 4  # (ξ into the buffer, one copy per parameter)


def test_a_buffer_taken_as_scratch_is_not_filled_over() -> None:
    class Scratches(gameopt.SimGD):
        def update(self, oracle, state):
            xi = oracle.xi(pieces=True)
            assert isinstance(xi, Pieces) and not xi.in_buffer
            assert xi.scratch() is xi.like()
            with pytest.raises(RuntimeError, match="taken as scratch"):
                xi.filled()
            raise KeyError("stop")

    game, params, _ = _game(Scratches(0.01))
    before = [[p.detach().clone() for p in ps] for ps in params]
    with pytest.raises(KeyError, match="stop"):
        game.step()
    assert _same(params, before)


def test_a_rule_reads_the_buffer_below_the_size_where_pieces_pay() -> None:
    """Below ``RULE_PIECES_MIN`` elements per tensor Adam reads ξ filled into the buffer
    (one copy), where the plain rule reads it in pieces (none)."""
    assert BIG * 2 < gameopt.vec.RULE_PIECES_MIN
    game, _, _ = _game(gameopt.SimGD(0.01, update=gameopt.Adam()))
    assert count(game.step, BIG).names.get("_foreach_copy_", 0) == 1
    game, _, _ = _game(gameopt.SimGD(0.01))
    assert count(game.step, BIG).copies == 0


@pytest.mark.usefixtures("rules_read_pieces")
@pytest.mark.parametrize("rule", ["Momentum", "Adam", "RMSProp"])
def test_a_rule_on_a_player_with_padding_reads_the_buffer_and_keeps_the_padding_zero(rule) -> None:
    """``Player(align=)`` pads its buffers: no parameter's view covers the padding, so a
    rule whose new state were written through the views would leave it as fresh memory
    holds it (a NaN there refused steps). ξ is filled instead; the padding of the state
    and of the point stays 0."""
    g = torch.Generator().manual_seed(3)
    a, b, y = (nn.Parameter(torch.randn(BIG + k, generator=g, dtype=torch.float64) / 4) for k in (3, 5, 0))

    def losses():
        f = (a[:BIG] * y).sum() + (b[:BIG] * y).sum() + (a**2).sum() / 2 + (b**4).sum() / 4
        return f, -f + (y**2).sum() / 4

    x = gameopt.Player([a, b], align=64)
    game = gameopt.Game([x, gameopt.Player([y])], losses, algorithm=gameopt.SimGD(0.01, update=RULES[rule]()))
    for _ in range(3):
        assert count(game.step, BIG, warmup=0).names.get("_foreach_copy_", 0) == 1  # (filled)
    flat = x.flat_param.detach()
    pad = slice(a.numel(), (b.data_ptr() - flat.data_ptr()) // flat.element_size())  # between a and b
    assert pad.stop > pad.start
    key = {"Momentum": "buf", "Adam": "m", "RMSProp": "v"}[rule]
    state = game.state_dict()["algorithm"]["state"]["rule"][key][0]
    assert not bool(flat[pad].any()) and not bool(state[pad].any())
