"""Wrong numbers without an error (issue 33, items 13-16): complex parameters under
every update rule, second-order algorithms on compiled losses, feasible sets whose
results do not fit, and parameters that join a running game. float64 / complex128,
closed forms and exact references."""

from __future__ import annotations

import io

import pytest
import torch
from torch import Tensor, nn

import gameopt
from gameopt.evaluation import LossError

C128, F64 = torch.complex128, torch.float64


# --------------------------------------------------------- complex parameters (13)
def _complex_losses(z: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """A two-player game on complex vectors, real-valued and not quadratic."""
    m = torch.tensor([[0.3 - 0.2j, 1.1 + 0.4j], [-0.7 + 0.1j, 0.2 - 0.9j], [0.5 + 0.5j, -0.4 + 0.3j]], dtype=C128)
    c = (z.conj() @ (m @ u)).real
    return 0.1 * (z.abs() ** 4).sum() + c + (z.real * z.imag).sum(), -c + (u.abs() ** 2).sum() + 0.3 * (u.real**3).sum()


Z0 = torch.tensor([0.4 - 1.2j, -0.3 + 0.8j, 1.5 + 0.1j], dtype=C128)
U0 = torch.tensor([-0.6 + 0.2j, 0.9 - 0.7j], dtype=C128)
LRS = [0.05, 0.07]


def _complex_game(make, real: bool = False):
    """The game on complex parameters, or (``real``) on their pairs of reals, the
    parameters holding ``torch.view_as_real`` of the complex ones."""
    if real:
        x, y = (nn.Parameter(torch.view_as_real(w).clone()) for w in (Z0, U0))
        losses = lambda: _complex_losses(torch.view_as_complex(x), torch.view_as_complex(y))  # noqa: E731
    else:
        x, y = nn.Parameter(Z0.clone()), nn.Parameter(U0.clone())
        losses = lambda: _complex_losses(x, y)  # noqa: E731
    players = [gameopt.Player([x], name="a"), gameopt.Player([y], name="b")]
    return gameopt.Game(players, losses, algorithm=make()), x, y


TORCH_RULES = {
    "Plain": (gameopt.Plain, lambda w, lr: torch.optim.SGD([w], lr=lr)),
    "Momentum": (lambda: gameopt.Momentum(0.6), lambda w, lr: torch.optim.SGD([w], lr=lr, momentum=0.6)),
    "Nesterov": (
        lambda: gameopt.Momentum(0.6, nesterov=True),
        lambda w, lr: torch.optim.SGD([w], lr=lr, momentum=0.6, nesterov=True),
    ),
    # eps = 0: torch adds ε to the bias-corrected root, gameopt to the raw one
    "Adam": (lambda: gameopt.Adam((0.8, 0.95), eps=0.0), lambda w, lr: torch.optim.Adam([w], lr, (0.8, 0.95), 0.0)),
    "RMSProp": (
        lambda: gameopt.RMSProp(0.9, 1e-8),
        lambda w, lr: torch.optim.RMSprop([w], lr=lr, alpha=0.9, eps=1e-8),
    ),
}


@pytest.mark.parametrize("name", list(TORCH_RULES))
def test_complex_parameters_step_as_torch_optim_steps_them(name) -> None:
    """SimGD with each rule on complex parameters is torch.optim's optimizer on each
    player's own loss (torch.optim treats a complex number as a pair of reals)."""
    rule, make_opt = TORCH_RULES[name]
    game, z, u = _complex_game(lambda: gameopt.SimGD(LRS, update=rule()))
    ref = [nn.Parameter(Z0.clone()), nn.Parameter(U0.clone())]
    opts = [make_opt(w, lr) for w, lr in zip(ref, LRS)]
    for t in range(8):
        game.step()
        losses = _complex_losses(*ref)
        grads = [torch.autograd.grad(f, w, retain_graph=True)[0] for f, w in zip(losses, ref)]
        for w, g, opt in zip(ref, grads, opts):
            w.grad = g
            opt.step()
        for mine, theirs in zip((z, u), ref):
            torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=1e-12, atol=1e-13, msg=f"step {t}")


REAL_PAIRS = {
    "Extragradient": lambda: gameopt.Extragradient(LRS),
    "ExtraAdam": lambda: gameopt.Extragradient(LRS, update=gameopt.Adam((0.5, 0.9))),
    "OptimisticAdam": lambda: gameopt.Optimistic(LRS, update=gameopt.Adam()),
    "AltGD-RMSProp-tf1": lambda: gameopt.AltGD(LRS, update=gameopt.RMSProp(convention="tf1")),
    "NuPI": lambda: gameopt.SimGD(LRS, update=gameopt.NuPI(kp=0.5, ki=1.0, ema=0.3)),
    "PerPlayer": lambda: gameopt.SimGD(LRS, update=[gameopt.Adam(), gameopt.RMSProp()]),
}


@pytest.mark.parametrize("name", list(REAL_PAIRS))
def test_complex_parameters_step_as_their_pairs_of_reals(name) -> None:
    """Every first-order algorithm and rule on complex parameters takes the steps of the
    same game on real parameters holding their real and imaginary parts."""
    game, z, u = _complex_game(REAL_PAIRS[name])
    pairs, x, y = _complex_game(REAL_PAIRS[name], real=True)
    for t in range(6):
        game.step()
        pairs.step()
        for mine, theirs in zip((z, u), (x, y)):
            torch.testing.assert_close(
                torch.view_as_real(mine.detach()), theirs.detach(), rtol=1e-13, atol=1e-15, msg=f"step {t}"
            )


@pytest.mark.parametrize("rule", [gameopt.Adam, gameopt.RMSProp], ids=["Adam", "RMSProp"])
def test_complex_checkpoint_loads_and_resumes_bit_for_bit(rule) -> None:
    """A complex game's own checkpoint loads (its second moments checked as pairs of
    reals), and a fresh game that loads it steps as the run that saved it."""
    game, z, u = _complex_game(lambda: gameopt.SimGD(LRS, update=rule()))
    for _ in range(3):
        game.step()
    buf = io.BytesIO()
    torch.save(game.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    other, z2, u2 = _complex_game(lambda: gameopt.SimGD(LRS, update=rule()))
    other.load_state_dict(saved)
    game.load_state_dict(game.state_dict())
    for _ in range(3):
        game.step()
        other.step()
    assert torch.equal(z, z2) and torch.equal(u, u2)
    saved["algorithm"]["state"]["rule"]["v"][0][0] = complex(0.5, -1.0)
    with pytest.raises(ValueError, match=r"rule\.v\[0\]: second moments must be >= 0"):
        other.load_state_dict(saved)


SECOND_ORDER = {
    "LOLA": lambda: gameopt.LOLA(0.1, alpha=0.3),
    "SOS": lambda: gameopt.SOS(0.1, alpha=0.3),
    "LA": lambda: gameopt.LA(0.1, alpha=0.3),
    "Consensus": lambda: gameopt.ConsensusOptimization(0.1, 0.5),
    "CGD": lambda: gameopt.CGD(0.1),
    "ACGD": lambda: gameopt.ACGD(0.1),
    "HamiltonianGD": lambda: gameopt.HamiltonianGD(0.1),
    "SGA": lambda: gameopt.SGA(0.1),
    "Stackelberg": lambda: gameopt.Stackelberg(0.1),
    "FollowTheRidge": lambda: gameopt.FollowTheRidge(0.1),
}


@pytest.mark.parametrize("name", list(SECOND_ORDER))
def test_second_order_algorithms_refuse_complex_players(name) -> None:
    """Their inner products and solves treat vectors as real (SGA, SOS, CGD and
    Stackelberg stepped wrongly): refused when the game is built, naming the player
    and the parameter, and when assigned to a game later."""
    with pytest.raises(ValueError, match=r"complex parameters: player 'a', parameter 0 \(shape \(3,\).*view_as_real"):
        _complex_game(SECOND_ORDER[name])
    game, z, _ = _complex_game(lambda: gameopt.SimGD(0.1))
    with pytest.raises(ValueError, match="does not support complex parameters"):
        game.algorithm = SECOND_ORDER[name]()
    assert isinstance(game.algorithm, gameopt.SimGD)


# ------------------------------------------------------- compiled losses (14)
class _Vec(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, dtype=F64, generator=torch.Generator().manual_seed(seed)))


def _compiled_game(make, compiled: bool = True):
    """A zero-sum game whose compiled graph saves only intermediates (tanh, sigmoid):
    its create_graph gradient has a graph that reaches no parameter, so every
    second-order product came back zero (aot_eager: the inductor backend shares
    aot_autograd's backward)."""
    import torch._dynamo

    torch._dynamo.reset()
    mx, my = _Vec(1), _Vec(2)

    def losses():
        f = (torch.tanh(mx.w) * torch.sigmoid(my.w)).sum()
        return f, -f

    fn = torch.compile(losses, backend="aot_eager") if compiled else losses
    return gameopt.Game([mx, my], fn, algorithm=make()), mx, my


@pytest.mark.parametrize("name", list(SECOND_ORDER))
def test_second_order_algorithms_refuse_compiled_losses(name) -> None:
    """Refused at the first step with gameopt's own error, nothing changed (before:
    SimGD's step, no step, torch's NotImplementedError or a ZeroDivisionError)."""
    game, mx, my = _compiled_game(SECOND_ORDER[name])
    before = [mx.w.detach().clone(), my.w.detach().clone()]
    state = game.state_dict()["algorithm"]["state"]
    with pytest.raises(
        LossError, match="comes from a torch.compile'd graph built by aot_autograd.*needs double backward"
    ):
        game.step()
    assert torch.equal(mx.w, before[0]) and torch.equal(my.w, before[1])
    after = game.state_dict()["algorithm"]["state"]
    assert str(after) == str(state)


#: every first-order algorithm, and the update rules with the two that take every kind of step
FIRST_ORDER = {
    "SimGD": lambda: gameopt.SimGD(0.1),
    "AltGD": lambda: gameopt.AltGD(0.1),
    "Extragradient": lambda: gameopt.Extragradient(0.1),
    "Optimistic": lambda: gameopt.Optimistic(0.1),
    "PastExtragradient": lambda: gameopt.PastExtragradient(0.1),
    "AnchoredExtragradient": lambda: gameopt.AnchoredExtragradient(0.1),
    "SimGD + Adam": lambda: gameopt.SimGD(0.1, update=gameopt.Adam()),
    "SimGD + RMSProp": lambda: gameopt.SimGD(0.1, update=gameopt.RMSProp()),
    "SimGD + Momentum": lambda: gameopt.SimGD(0.1, update=gameopt.Momentum(0.9)),
    "Extra-Adam": lambda: gameopt.Extragradient(0.1, update=gameopt.Adam()),
}


@pytest.mark.parametrize("name", list(FIRST_ORDER))
def test_first_order_algorithms_run_on_compiled_losses(name) -> None:
    """Issue #35, item 3: a first-order step on a torch.compile'd loss takes the eager
    loss's steps (to the compiled kernels' rounding)."""
    compiled, cx, cy = _compiled_game(FIRST_ORDER[name])
    eager, ex, ey = _compiled_game(FIRST_ORDER[name], compiled=False)
    for _ in range(3):
        compiled.step()
        eager.step()
    torch.testing.assert_close(cx.w, ex.w, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(cy.w, ey.w, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("name", ["HamiltonianGD", "LOLA", "CGD", "Consensus"])
def test_a_zero_jacobian_block_is_not_refused(name) -> None:
    """A player whose loss is linear in its own parameters has a constant ξ (no graph
    at all): a true zero block, stepped as such. HamiltonianGD's closed form:
    ξ = (c, 2(y − 1)), J = diag(0, 2I): Jᵀξ = (0, 4(y − 1))."""
    c = torch.tensor([0.5, -1.0], dtype=F64)
    x = nn.Parameter(torch.tensor([0.2, 0.3], dtype=F64))
    y = nn.Parameter(torch.tensor([2.0, -1.0], dtype=F64))
    players = [gameopt.Player([x], name="x"), gameopt.Player([y], name="y")]
    game = gameopt.Game(players, lambda: ((c * x).sum(), ((y - 1) ** 2).sum()), algorithm=SECOND_ORDER[name]())
    y0 = y.detach().clone()
    game.step()
    if name == "HamiltonianGD":
        torch.testing.assert_close(x.detach(), torch.tensor([0.2, 0.3], dtype=F64), rtol=0, atol=0)
        torch.testing.assert_close(y.detach(), y0 - 0.1 * 4 * (y0 - 1), rtol=1e-15, atol=1e-15)
    assert bool(torch.isfinite(x).all() and torch.isfinite(y).all())


# ------------------------------------------------ feasible sets that do not fit (15)
class _Mean:
    """Every weight becomes the mean: a (…, 1) result, broadcast before."""

    def project(self, w: Tensor) -> Tensor:
        return w.mean(-1, keepdim=True)


class _Float32:
    def project(self, w: Tensor) -> Tensor:
        return w.clamp_min(0).float()


class _InPlace:
    """Projects in place and returns None."""

    def project(self, w: Tensor) -> None:
        w.clamp_(min=0)


class _Meta:
    def project(self, w: Tensor) -> Tensor:
        return torch.empty_like(w, device="meta")


class _BadStep(gameopt.constraints.Constraint):
    """A right projection, a mirror step of the wrong shape."""

    def project(self, w: Tensor) -> Tensor:
        return w.clamp_min(0)

    def step(self, w: Tensor, delta: Tensor) -> Tensor:
        return (w + delta).clamp_min(0).sum(-1, keepdim=True)


class _BadDeltaTo(gameopt.constraints.Constraint):
    def project(self, w: Tensor) -> Tensor:
        return w.clamp_min(0)

    def delta_to(self, w: Tensor, target: Tensor) -> Tensor:
        return (target - w).float()


def _constrained_game(constraint, algorithm=None):
    w = nn.Parameter(torch.tensor([0.5, 0.2, 0.3], dtype=F64))
    y = nn.Parameter(torch.tensor([1.0, -1.0], dtype=F64))
    a = torch.tensor([1.0, 2.0, 3.0], dtype=F64)
    players = [gameopt.Player([w], name="w", constraint=constraint), gameopt.Player([y], name="y")]
    losses = lambda: ((w * a).sum() + (w * y.sum()).sum(), ((y - w.sum()) ** 2).sum())  # noqa: E731
    return gameopt.Game(players, losses, algorithm=algorithm or gameopt.SimGD(0.1)), w, y


@pytest.mark.parametrize(
    "bad, got",
    [
        (_Mean, r"returned a \(1,\) torch.float64 tensor on cpu"),
        (_Float32, r"returned a \(3,\) torch.float32 tensor on cpu"),
        (_InPlace, "returned None"),
        (_Meta, r"returned a \(3,\) torch.float64 tensor on meta"),
    ],
)
def test_a_set_whose_projection_does_not_fit_is_refused(bad, got) -> None:
    """The starting point's projection already shows it: refused when the game is
    built, naming the set, the parameter and what came back."""
    with pytest.raises(
        ValueError, match=rf"feasible set .*{bad.__name__}.* of parameter 0 of player 'w': its project {got}"
    ):
        _constrained_game(bad())


@pytest.mark.parametrize(
    "bad, algorithm",
    [
        (_BadStep, gameopt.SimGD(0.1)),  # the move
        (_BadStep, gameopt.Extragradient(0.1)),  # the extrapolated point to evaluate at
        (_BadDeltaTo, gameopt.AnchoredExtragradient(0.1)),  # the step to a target
    ],
    ids=["SimGD-step", "Extragradient-step", "Anchored-delta_to"],
)
def test_a_set_whose_step_does_not_fit_refuses_the_step(bad, algorithm) -> None:
    game, w, y = _constrained_game(bad(), algorithm)
    before, state = (w.detach().clone(), y.detach().clone()), str(game.state_dict()["algorithm"])
    method = "step" if bad is _BadStep else "delta_to"
    with pytest.raises(
        ValueError, match=rf"feasible set .*{bad.__name__}.* of parameter 0 of player 'w': its {method}"
    ):
        game.step()
    assert torch.equal(w, before[0]) and torch.equal(y, before[1])
    assert str(game.state_dict()["algorithm"]) == state


# ------------------------------------------- parameters that join a running game (16)
class _Growing(nn.Module):
    def __init__(self, w1: bool = True) -> None:
        super().__init__()
        if w1:
            self.w1 = nn.Parameter(torch.tensor([1.0, -2.0], dtype=F64))

    def add_w2(self) -> None:
        self.w2 = nn.Parameter(torch.tensor([0.2, 0.0, -0.4], dtype=F64))

    def loss(self) -> Tensor:
        out = ((self.w1 - 0.3) ** 2).sum() if hasattr(self, "w1") else torch.zeros((), dtype=F64)
        if hasattr(self, "w2"):
            out = out + 2 * ((self.w2 + 0.7) ** 2).sum() + 0.1 * (self.w2**3).sum()
        return out


def _growing(make, w1: bool = True, w2: bool = False):
    a, b = _Growing(w1), _Growing(w1)
    for m in (a, b) if w2 else ():
        m.add_w2()
    players = [gameopt.Player(a, name="a"), gameopt.Player(b, name="b")]
    return gameopt.Game(players, lambda: (a.loss(), b.loss()), algorithm=make()), a, b


JOINING = {
    "Optimistic": lambda: gameopt.Optimistic(0.1),
    "OptimisticAdam": lambda: gameopt.Optimistic(0.1, update=gameopt.Adam()),
    "NuPI": lambda: gameopt.SimGD(0.1, update=gameopt.NuPI(kp=0.5, ki=1.0, ema=0.3)),
    "Averaging-Optimistic": lambda: gameopt.Averaging(gameopt.Optimistic(0.1), kind="ema", decay=0.5),
    "Lookahead-Optimistic": lambda: gameopt.Lookahead(gameopt.Optimistic(0.1), k=2, alpha=0.5),
}


@pytest.mark.parametrize("name", list(JOINING))
def test_a_parameter_that_joins_takes_a_fresh_starts_steps(name) -> None:
    """A parameter registered after 3 steps steps as in a game that starts with it (its
    loss is its own: separable), not with a doubled first step (its carried previous
    direction was 0 while the step count said it had one)."""
    game, a, b = _growing(JOINING[name])
    for _ in range(4):
        game.step()
    a.add_w2()
    b.add_w2()
    fresh, c, d = _growing(JOINING[name], w1=False, w2=True)
    for t in range(5):
        game.step()
        fresh.step()
        assert torch.equal(a.w2, c.w2) and torch.equal(b.w2, d.w2), f"step {t}"


def test_a_joined_optimistic_checkpoint_loads_into_a_game_built_with_every_parameter() -> None:
    game, a, b = _growing(JOINING["Optimistic"])
    for step in range(6):
        if step == 3:
            a.add_w2()
            b.add_w2()
        game.step()
    sd = game.state_dict()
    assert isinstance(sd["algorithm"]["state"]["t"], list)  # one count per element
    other, c, d = _growing(JOINING["Optimistic"], w2=True)
    other.load_state_dict(sd)
    for _ in range(3):
        game.step()
        other.step()
    assert torch.equal(a.w2, c.w2) and torch.equal(b.w1, d.w1)


def test_a_parameter_that_joins_under_acgd_has_its_own_bias_correction() -> None:
    """ACGD's second moment of a new parameter starts at 0 with its own count. The new
    parameter is decoupled from the other player: its step is −η ξ with
    η = lr √(1 − βᵗ) / (√v + ε), t its own count."""
    a, b = _Growing(), _Growing()

    def losses():
        f = (a.w1 * b.w1).sum() + 0.1 * (a.w1**2).sum() - 0.1 * (b.w1**2).sum()
        if hasattr(a, "w2"):
            f = f + 2 * ((a.w2 + 0.7) ** 2).sum()
        return f, -f

    beta, eps, lr = 0.9, 1e-5, 0.1
    game = gameopt.Game([a, b], losses, algorithm=gameopt.ACGD(lr, beta=beta, eps=eps, tol=1e-30, atol=0.0))
    for _ in range(3):
        game.step()
    a.add_w2()
    w, v = a.w2.detach().clone(), torch.zeros(3, dtype=F64)
    for t in range(1, 4):
        game.step()
        xi = 4 * (w + 0.7)
        v = beta * v + (1 - beta) * xi**2
        w = w - lr * (1 - beta**t) ** 0.5 / (v.sqrt() + eps) * xi
        torch.testing.assert_close(a.w2.detach(), w, rtol=1e-12, atol=1e-14, msg=f"step {t}")
