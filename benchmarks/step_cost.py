"""What one ``Game.step`` costs, per algorithm, in units of one evaluation of ξ.

Two GAN pairs (non-saturating losses, one fixed batch passed as ``game.step(x, z)``):

* **mlp-2d**: generator and discriminator with 4 hidden layers of 256 units,
  2-D data, latent 16, batch 256 (big matrix products; little Python);
* **deep-narrow**: each net 61 ``Linear`` layers of width 16 (244 parameter
  tensors in total), batch 256 (many tiny ops; Python overhead dominates).

Baseline (as the Game issue defines it): one plain-PyTorch ξ evaluation with
hand-fused buffers: each net's parameters and ``.grad`` made views into one flat
tensor by hand, then per evaluation the flat gradients zeroed, one forward, and
one pruned ``backward(loss_i, inputs=params_i)`` per player, so ξ ends up in the
flat gradient tensors. A reference row times the bare unfused evaluation
(``autograd.grad`` per player, no flat vector at all) against it.

Candidates, each timed interleaved with the baseline and reported as the median of
per-round ratios (step time / ξ time): gameopt SimGD, Optimistic, Extragradient,
AltGD, SimGD+Adam, Extragradient+Adam (Extra-Adam), Lookahead(SimGD); for
reference the bare unfused ξ, SimGD / Optimistic / Extragradient written the
obvious way on unfused modules (``autograd.grad``, then the update as a
per-parameter loop, with ``torch._foreach_*``, or on ``torch.cat`` copies made
every step), ``torch.optim.SGD`` per player (zero_grad + backward), and cooper's ``ExtraSGD``
/ ``ExtraAdam`` doing one extragradient step (zero_grad + backward per player,
``extrapolation()``, again, ``step()``). Then gameopt's Extragradient is timed
interleaved directly against cooper's ``ExtraSGD`` (and Extra-Adam against
``ExtraAdam``).

Small games: rock-paper-scissors (3x3 payoff matrix, float64, one thread), where a
step's fixed cost is all there is. gameopt's ``SimGD`` step, without and with the
players on the probability simplex (``constraints.Simplex()``, Euclidean projection),
each timed interleaved with a bare loop doing the same on its own copy of the
players: the same losses callable, one ``torch.autograd.grad`` per player, then
``w -= lr * g`` in place (``w = P(w - lr * g)`` on the simplex). Ratio = gameopt
step time / bare step time.

    python3 -m benchmarks.step_cost [--quick] [--small] [--breakdown] [--out DIR] [--profile NAME]

``--small`` times only the small games (``step_cost_small.csv``); the full run
includes them (group ``rps``).

``--breakdown --small`` builds a SimGD step on rock-paper-scissors up layer by layer
(engine, oracle, algorithm, the game's checks, all of ``Game.step``), each timed
against the bare loop (``step_cost_small_breakdown.csv``).

``--breakdown`` times the pieces of a gameopt SimGD step (vector_field, _refresh,
all_finite, descend, ...) each against the plain ξ instead.

``--profile NAME`` (e.g. ``SimGD``, ``Extragradient``) runs cProfile over steps of
that gameopt algorithm (on ``--profile-pair``, default deep-narrow) and prints the
hot spots instead.
"""

from __future__ import annotations

import copy
import cProfile
import functools
import io
import pstats
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import gameopt

from ._common import Result, bar_plot, base_parser, log_result, measure, print_table, save_csv, setup, spec

LR = 1e-4
ADAM_LR = 1e-5
BATCH = 256
LATENT = 16

MAX_S = 8.0  # seconds at most per comparison (reached only when other programs slow the machine down)


# ------------------------------------------------------------------------ models
def mlp(sizes: list[int], act: Callable[[], nn.Module]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if k < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


class Pair:
    """A generator/discriminator pair and one fixed batch; :meth:`fresh` copies."""

    def __init__(self, kind: str, seed: int = 0) -> None:
        torch.manual_seed(seed)
        if kind == "mlp-2d":
            g_sizes = [LATENT] + [256] * 4 + [2]
            d_sizes = [2] + [256] * 4 + [1]
        elif kind == "deep-narrow":
            g_sizes = [LATENT] + [16] * 60 + [2]  # 61 Linear layers
            d_sizes = [2] + [16] * 60 + [1]  # 61 Linear layers
        else:
            raise ValueError(kind)
        self.kind = kind
        self.G = mlp(g_sizes, nn.ReLU)
        self.D = mlp(d_sizes, lambda: nn.LeakyReLU(0.2))
        # 2-D data: a ring of 8 Gaussians
        angle = torch.randint(0, 8, (BATCH,)).float() * (torch.pi / 4)
        self.x = torch.stack([angle.cos(), angle.sin()], 1) * 2 + 0.02 * torch.randn(BATCH, 2)
        self.z = torch.randn(BATCH, LATENT)

    def fresh(self) -> tuple[nn.Module, nn.Module]:
        return copy.deepcopy(self.G), copy.deepcopy(self.D)

    def describe(self) -> str:
        nt = len(list(self.G.parameters())) + len(list(self.D.parameters()))
        ne = sum(p.numel() for p in self.G.parameters()) + sum(p.numel() for p in self.D.parameters())
        return f"{self.kind} ({nt} tensors, {ne / 1e3:.0f}k params, batch {BATCH})"


def gan_losses(G: nn.Module, D: nn.Module) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """Non-saturating GAN losses from one forward pass: (loss_G, loss_D)."""

    def losses(x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        fake = G(z)
        d_real, d_fake = D(x), D(fake)
        loss_d = F.softplus(-d_real).mean() + F.softplus(d_fake).mean()
        loss_g = F.softplus(-d_fake).mean()
        return loss_g, loss_d

    return losses


# --------------------------------------------------------------- step functions
def hand_fuse(module: nn.Module) -> tuple[Tensor, Tensor, list[nn.Parameter]]:
    """Fuse a module by hand: its parameters and their ``.grad`` become views into
    one flat tensor each. Returns (flat params, flat grads, parameters)."""
    params = list(module.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset : offset + n].view_as(p)
        p.grad = grad[offset : offset + n].view_as(p)
        offset += n
    return flat, grad, params


def plain_xi(pair: Pair) -> Callable[[], object]:
    """The baseline: one hand-written evaluation of ξ into hand-fused flat buffers."""
    G, D = pair.fresh()
    (_, g_grad, gp), (_, d_grad, dp) = hand_fuse(G), hand_fuse(D)
    losses, x, z = gan_losses(G, D), pair.x, pair.z

    def xi() -> tuple[Tensor, Tensor]:
        g_grad.zero_()
        d_grad.zero_()
        loss_g, loss_d = losses(x, z)
        torch.autograd.backward(loss_g, inputs=gp, retain_graph=True)
        torch.autograd.backward(loss_d, inputs=dp)
        return g_grad, d_grad

    return xi


def unfused_xi(pair: Pair) -> Callable[[], object]:
    """ξ on unfused modules, one ``autograd.grad`` per player: no flat vector at all."""
    G, D = pair.fresh()
    gp, dp = list(G.parameters()), list(D.parameters())
    losses, x, z = gan_losses(G, D), pair.x, pair.z

    def xi() -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        loss_g, loss_d = losses(x, z)
        return (
            torch.autograd.grad(loss_g, gp, retain_graph=True),
            torch.autograd.grad(loss_d, dp),
        )

    return xi


GAMEOPT: dict[str, Callable[[], gameopt.Algorithm]] = {
    "gameopt SimGD": lambda: gameopt.SimGD(LR),
    "gameopt Optimistic": lambda: gameopt.Optimistic(LR),
    "gameopt Extragradient": lambda: gameopt.Extragradient(LR),
    "gameopt AltGD": lambda: gameopt.AltGD(LR),
    "gameopt SimGD+Adam": lambda: gameopt.SimGD(ADAM_LR, update=gameopt.Adam()),
    "gameopt Extragradient+Adam": lambda: gameopt.Extragradient(ADAM_LR, update=gameopt.Adam()),
    "gameopt Lookahead(SimGD)": lambda: gameopt.Lookahead(gameopt.SimGD(LR), k=5),
    "gameopt PastExtragradient": lambda: gameopt.PastExtragradient(LR),
    "gameopt AnchoredExtragradient": lambda: gameopt.AnchoredExtragradient(LR),
}


def gameopt_step(
    pair: Pair, make_algorithm: Callable[[], gameopt.Algorithm], restart_every: int | None = None
) -> Callable[[], object]:
    """One gameopt step on the pair's batch per call; with ``restart_every``, every
    that many calls the parameters go back to the start first (many steps on one
    batch may diverge: CGD on the deep narrow pair does)."""
    G, D = pair.fresh()
    game = gameopt.Game(
        [gameopt.Player(G, name="G"), gameopt.Player(D, name="D")],
        gan_losses(G, D),
        algorithm=make_algorithm(),
    )
    x, z = pair.x, pair.z
    start = [t.clone() for t in game.layout.data]
    calls = [0]

    def step() -> object:
        calls[0] += 1
        if restart_every and calls[0] % restart_every == 0:
            with torch.no_grad():
                torch._foreach_copy_(game.layout.data, start)
        return game.step(x, z)

    step.game = game  # type: ignore[attr-defined]
    return step


class _Loop:
    """Vector math the obvious way, one op per parameter tensor."""

    @staticmethod
    def axpy_(ys: list[Tensor], a: float, xs: list[Tensor]) -> None:
        for y, x in zip(ys, xs):
            y.add_(x, alpha=a)

    @staticmethod
    def copy(xs: list[Tensor]) -> list[Tensor]:
        return [x.clone() for x in xs]

    @staticmethod
    def load_(ys: list[Tensor], xs: list[Tensor]) -> None:
        for y, x in zip(ys, xs):
            y.copy_(x)


class _Foreach(_Loop):
    """The same with ``torch._foreach_*`` (one dispatch per list)."""

    @staticmethod
    def axpy_(ys: list[Tensor], a: float, xs: list[Tensor]) -> None:
        torch._foreach_add_(ys, xs, alpha=a)

    @staticmethod
    def copy(xs: list[Tensor]) -> list[Tensor]:
        return list(torch._foreach_mul(xs, 1.0))

    @staticmethod
    def load_(ys: list[Tensor], xs: list[Tensor]) -> None:
        torch._foreach_copy_(ys, xs)


class _Cat(_Loop):
    """The same on ``torch.cat`` copies made every step, written back per parameter."""

    @staticmethod
    def axpy_(ys: list[Tensor], a: float, xs: list[Tensor]) -> None:
        flat = torch.cat([y.reshape(-1) for y in ys]) + a * torch.cat([x.reshape(-1) for x in xs])
        _Cat.load_(ys, list(flat.split([y.numel() for y in ys])))

    @staticmethod
    def copy(xs: list[Tensor]) -> list[Tensor]:
        return list(torch.cat([x.reshape(-1) for x in xs]).split([x.numel() for x in xs]))

    @staticmethod
    def load_(ys: list[Tensor], xs: list[Tensor]) -> None:
        for y, x in zip(ys, xs):
            y.copy_(x.view_as(y))


STYLES = {"per-param loop": _Loop, "foreach": _Foreach, "torch.cat": _Cat}


def obvious(pair: Pair, algorithm: str, style: str) -> Callable[[], object]:
    """SimGD, Optimistic or Extragradient written the obvious way on unfused modules:
    ``autograd.grad`` per player, then the update in one of :data:`STYLES`."""
    ops = STYLES[style]
    G, D = pair.fresh()
    gp, dp = list(G.parameters()), list(D.parameters())
    params = gp + dp
    losses, x, z = gan_losses(G, D), pair.x, pair.z
    prev: list[list[Tensor]] = []

    def grads() -> list[Tensor]:
        loss_g, loss_d = losses(x, z)
        return list(torch.autograd.grad(loss_g, gp, retain_graph=True) + torch.autograd.grad(loss_d, dp))

    @torch.no_grad()
    def step() -> None:
        with torch.enable_grad():
            g = grads()
        if algorithm == "SimGD":
            ops.axpy_(params, -LR, g)
        elif algorithm == "Optimistic":  # w -= lr (2 g - prev)
            ops.axpy_(params, -2 * LR, g)
            ops.axpy_(params, LR, prev[0] if prev else g)
            prev[:] = [g]
        else:  # Extragradient
            saved = ops.copy(params)
            ops.axpy_(params, -LR, g)
            with torch.enable_grad():
                g2 = grads()
            ops.load_(params, saved)
            ops.axpy_(params, -LR, g2)

    step.params = params  # type: ignore[attr-defined]
    return step


def _backward_per_player(losses, x, z, gp, dp, opts) -> None:  # type: ignore[no-untyped-def]
    for opt in opts:
        opt.zero_grad()
    loss_g, loss_d = losses(x, z)
    torch.autograd.backward(loss_g, inputs=gp, retain_graph=True)
    torch.autograd.backward(loss_d, inputs=dp)


def torch_sgd(pair: Pair) -> Callable[[], object]:
    """SimGD with one torch.optim.SGD per player (zero_grad + backward(inputs=) + step)."""
    G, D = pair.fresh()
    gp, dp = list(G.parameters()), list(D.parameters())
    opts = [torch.optim.SGD(gp, lr=LR), torch.optim.SGD(dp, lr=LR)]
    losses, x, z = gan_losses(G, D), pair.x, pair.z

    def step() -> None:
        _backward_per_player(losses, x, z, gp, dp, opts)
        for opt in opts:
            opt.step()

    return step


def cooper_extra(pair: Pair, kind: str) -> Callable[[], object]:
    """One extragradient step with cooper's ExtraSGD / ExtraAdam, one optimizer per
    player, each player's gradient of its own loss only."""
    import cooper

    G, D = pair.fresh()
    gp, dp = list(G.parameters()), list(D.parameters())
    if kind == "ExtraSGD":
        opts = [cooper.optim.ExtraSGD(gp, lr=LR), cooper.optim.ExtraSGD(dp, lr=LR)]
    else:
        opts = [cooper.optim.ExtraAdam(gp, lr=ADAM_LR), cooper.optim.ExtraAdam(dp, lr=ADAM_LR)]
    losses, x, z = gan_losses(G, D), pair.x, pair.z

    def step() -> None:
        _backward_per_player(losses, x, z, gp, dp, opts)
        for opt in opts:
            opt.extrapolation()
        _backward_per_player(losses, x, z, gp, dp, opts)
        for opt in opts:
            opt.step()

    return step


def candidates(pair: Pair) -> dict[str, tuple[Callable[[], object], str]]:
    out: dict[str, tuple[Callable[[], object], str]] = {}
    for name, make in GAMEOPT.items():
        out[name] = (gameopt_step(pair, make), "")
    out["ref: unfused xi, no flat vector"] = (unfused_xi(pair), "autograd.grad per player")
    for algorithm in ("SimGD", "Optimistic", "Extragradient"):
        for style in STYLES:
            out[f"ref: {algorithm}, {style}"] = (obvious(pair, algorithm, style), "the obvious way, unfused")
    out["ref: torch.optim.SGD per player"] = (torch_sgd(pair), "zero_grad + backward(inputs=)")
    out["ref: cooper ExtraSGD"] = (cooper_extra(pair, "ExtraSGD"), "2 x zero_grad + backward")
    out["ref: cooper ExtraAdam"] = (cooper_extra(pair, "ExtraAdam"), "2 x zero_grad + backward")
    return out


def sanity_check(pair: Pair) -> None:
    """Every reference computes the same step as gameopt from the same starting
    point, and the baseline computes gameopt's ξ."""
    for algorithm in ("SimGD", "Optimistic", "Extragradient"):
        a = gameopt_step(pair, GAMEOPT[f"gameopt {algorithm}"])
        a()
        a()  # two steps: Optimistic's second one uses the previous gradient
        game = a.game  # type: ignore[attr-defined]
        mine = torch.cat([p.detach().reshape(-1) for player in game.players for p in player.module.parameters()])
        for style in STYLES:
            b = obvious(pair, algorithm, style)
            b()
            b()
            ref = torch.cat([p.detach().reshape(-1) for p in b.params])  # type: ignore[attr-defined]
            torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6, msg=f"{algorithm} ({style}) differs")
    g_grad, d_grad = plain_xi(pair)()  # type: ignore[misc]
    fresh = gameopt_step(pair, GAMEOPT["gameopt SimGD"]).game  # type: ignore[attr-defined]
    torch.testing.assert_close(
        torch.cat([g_grad, d_grad]), torch.cat(fresh.vector_field(pair.x, pair.z)), msg="the baseline ξ differs"
    )


# ------------------------------------------------------------------- small games
RPS_LR = 0.01


def rps_players() -> tuple[nn.Module, nn.Module, Tensor]:
    """Two mixed strategies away from the equilibrium, and the RPS payoff matrix."""
    from gameopt_players.matrix_games import ROCK_PAPER_SCISSORS, MixedStrategy

    x = MixedStrategy(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    y = MixedStrategy(torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64))
    return x, y, ROCK_PAPER_SCISSORS


def rps_gameopt(simplex: bool) -> Callable[[], object]:
    """One gameopt ``SimGD`` step on rock-paper-scissors per call."""
    from gameopt_players.matrix_games import matrix_game_losses

    x, y, payoff = rps_players()
    sets = {"constraint": gameopt.constraints.Simplex()} if simplex else {}
    game = gameopt.Game(
        [gameopt.Player(x, name="x", **sets), gameopt.Player(y, name="y", **sets)],
        matrix_game_losses(x, y, payoff),
        algorithm=gameopt.SimGD(RPS_LR),
    )

    def step() -> object:
        return game.step()

    step.point = lambda: torch.cat([x.p.detach(), y.p.detach()])  # type: ignore[attr-defined]
    return step


def rps_bare(simplex: bool) -> Callable[[], object]:
    """The same step written by hand: one ``autograd.grad`` per player, an in-place update."""
    from gameopt_players.matrix_games import matrix_game_losses

    x, y, payoff = rps_players()
    losses = matrix_game_losses(x, y, payoff)
    px, py = x.p, y.p
    project = gameopt.constraints.Simplex().project

    def step() -> None:
        loss_x, loss_y = losses()
        (gx,) = torch.autograd.grad(loss_x, px, retain_graph=True)
        (gy,) = torch.autograd.grad(loss_y, py)
        with torch.no_grad():
            if simplex:
                px.copy_(project(px - RPS_LR * gx))
                py.copy_(project(py - RPS_LR * gy))
            else:
                px.sub_(gx, alpha=RPS_LR)
                py.sub_(gy, alpha=RPS_LR)

    step.point = lambda: torch.cat([px.detach(), py.detach()])  # type: ignore[attr-defined]
    return step


def one_thread(run: Callable[[], Result]) -> Callable[[], Result]:
    """A comparison timed with ``torch.set_num_threads(1)`` (the threads restored after)."""

    def timed() -> Result:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return run()
        finally:
            torch.set_num_threads(threads)

    return timed


def small_games(rounds: int, target: float) -> list[Callable[[], Result]]:
    """RPS: gameopt SimGD (unconstrained, and on the simplex) against the bare loop,
    after checking that both follow the same iterates."""
    desc = "rock-paper-scissors (3x3, float64, 1 thread)"
    specs = []
    for simplex in (False, True):
        ours, bare = rps_gameopt(simplex), rps_bare(simplex)
        for _ in range(50):
            ours()
            bare()
        torch.testing.assert_close(ours.point(), bare.point(), msg=f"RPS (simplex={simplex}) iterates differ")  # type: ignore[attr-defined]
        ours, bare = rps_gameopt(simplex), rps_bare(simplex)
        kind = "SimGD+simplex" if simplex else "SimGD"
        if not simplex:
            specs.append(("A/A: bare loop vs itself", "noise floor", bare, bare))
        specs.append((f"gameopt {kind}", "" if not simplex else "Euclidean projection", bare, ours))
    return [
        one_thread(
            spec("rps", name, "bare loop", base, fn, note=note, desc=desc, rounds=rounds, target=target, max_s=MAX_S)
        )
        for name, note, base, fn in specs
    ]


# --------------------------------------------------------------------- profiling
def profile(name: str, steps: int, pair_kind: str = "deep-narrow") -> None:
    pair = Pair(pair_kind)
    key = name if name in GAMEOPT else f"gameopt {name}"
    if key not in GAMEOPT:
        raise SystemExit(f"unknown algorithm {name!r}; choose from {', '.join(GAMEOPT)}")
    step = gameopt_step(pair, GAMEOPT[key])
    for _ in range(5):
        step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs()
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)
    print(f"cProfile of {steps} steps of {key} on {pair.describe()}")
    print(buf.getvalue())


# --------------------------------------------------------------------- breakdown
def breakdown(kind: str, rounds: int, target: float) -> list[Callable[[], Result]]:
    """Where a gameopt SimGD step spends its time beyond ξ: each piece of
    ``Game.step`` timed alone, interleaved with the plain ξ (ratio = fraction of ξ).

    Uses gameopt internals (``autodiff.vector_field``, ``vec.all_finite``,
    ``Game._refresh``'s check ``Watch.intact``, ``Oracle``, ``Algorithm.descend``),
    reached through ``game.step_context``; a piece whose internals changed is
    reported as unavailable.
    """
    import dataclasses

    from gameopt import autodiff
    from gameopt.game import StepOracle
    from gameopt.game.relayout import Watch
    from gameopt.vec import all_finite

    pair = Pair(kind)
    xi = plain_xi(pair)
    step = gameopt_step(pair, GAMEOPT["gameopt SimGD"])
    game = step.game  # type: ignore[attr-defined]
    closure = functools.partial(game.losses, pair.x, pair.z)
    context = game.step_context
    oracle = StepOracle(context, closure)
    # outside a step nothing returns the pool's vectors: this oracle's are fresh ones, freed when dropped
    fresh = StepOracle(dataclasses.replace(context, take=game.layout.empty), closure)
    watch = Watch(game.players)  # what Game._refresh checks
    alg = game.algorithm
    grads = game.layout.grad
    delta, _ = alg.descend(oracle, grads, game.algorithm_state["rule"])
    zero = [torch.zeros_like(t) for t in delta]
    pieces: dict[str, Callable[[], object]] = {
        "Game.step (SimGD), all of it": step,
        "autodiff.vector_field (xi into flat grad)": lambda: autodiff.vector_field(context.problem, [0, 1], closure),
        "Game._refresh (Watch.intact)": watch.intact,
        "all_finite(xi)  [Oracle.xi]": lambda: all_finite(grads),
        "all_finite(delta)  [Game.step]": lambda: all_finite(list(delta)),
        "Algorithm.descend, out of place": lambda: alg.descend(fresh, grads, game.algorithm_state["rule"]),
        "_foreach_add_(params, delta)": lambda: torch._foreach_add_(game.layout.data, zero),
        "StepOracle(...) construction": lambda: StepOracle(context, closure),
    }
    return available(f"{kind} breakdown", "plain xi", xi, pieces, pair.describe(), rounds, target)


def available(
    group: str,
    baseline_name: str,
    base: Callable[[], object],
    rows: dict[str, Callable[[], object]],
    desc: str,
    rounds: int,
    target: float,
    wrap: Callable[[Callable[[], Result]], Callable[[], Result]] = lambda run: run,
) -> list[Callable[[], Result]]:
    """A comparison per row against ``base``, for the rows that run: a row built on
    gameopt internals that changed is reported as unavailable and left out."""
    specs = []
    for name, fn in rows.items():
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - internals may have changed
            print(f"  {name}: unavailable ({type(err).__name__}: {err})")
            continue
        run = spec(group, name, baseline_name, base, fn, note="", desc=desc, rounds=rounds, target=target, max_s=MAX_S)
        specs.append(wrap(run))
    return specs


def small_breakdown(rounds: int, target: float) -> list[Callable[[], Result]]:
    """What a gameopt SimGD step on rock-paper-scissors costs beyond the bare loop,
    layer by layer: each row is a step built by hand with one more layer of
    ``Game.step`` than the row before, timed interleaved with the bare loop (ratio =
    step time / bare step time). Timed alone, a piece misleads here: after a backward
    each costs several times what it costs warm. Uses gameopt internals; a row whose
    internals changed is reported as unavailable.

    1. the floor: the losses, autograd's engine per player, ξ copied into the flat
       gradient, scaled, checked finite, added to the parameters;
    2. + the oracle (``StepOracle(...)``, ``oracle.xi()``: ``autodiff.vector_field``
       with its checks of the losses and of each player's gradients);
    3. + the algorithm (the param groups' check, ``SimGD.update``: ``descend``);
    4. + the game's checks (``Watch.intact``, ``_check_update``, ``Moves.move``);
    5. ``Game.step``, all of it (the lock, autograd mode, hooks' check, module
       buffers saved, ``StepLosses``).
    """

    from gameopt import _torch_compat as tc
    from gameopt.evaluation import StepLosses
    from gameopt.game import StepOracle
    from gameopt.game import game as game_module
    from gameopt.game.relayout import Watch
    from gameopt.vec import all_finite
    from gameopt_players.matrix_games import matrix_game_losses

    x, y, payoff = rps_players()
    losses = matrix_game_losses(x, y, payoff)
    players = [gameopt.Player(x, name="x"), gameopt.Player(y, name="y")]
    game = gameopt.Game(players, losses, algorithm=gameopt.SimGD(0.0))
    context, alg, layout = game.step_context, game.algorithm, game.layout
    watch = Watch(game.players)  # what the step checks first
    views = [v for vs in context.problem.grad_views for v in vs]
    flat_grad, flat = layout.grad[0], layout.data[0]

    def floor() -> object:
        run = tc.engine_on_caller() or tc.engine_run_backward
        lx, ly = losses()
        gx = run((lx,), (torch.ones_like(lx),), True, False, (x.p,), True, False)
        gy = run((ly,), (torch.ones_like(ly),), False, False, (y.p,), True, False)
        tc.foreach_copy_(views, [*gx, *gy])
        flat_grad.mul_(-0.0)
        if not all_finite([flat_grad]):
            raise RuntimeError("not finite")
        flat.add_(flat_grad)
        return StepLosses((lx.data, ly.data))

    def with_oracle() -> object:
        oracle = StepOracle(context, losses, True)
        xi = oracle.xi()
        xi[0].mul_(-0.0)
        if not all_finite(xi):
            raise RuntimeError("not finite")
        flat.add_(xi[0])
        return StepLosses(oracle.losses)

    def with_algorithm() -> object:
        oracle = StepOracle(context, losses, True)
        alg._check_groups()
        alg._sync_rule()
        delta, _ = alg.update(oracle, game.algorithm_state)
        if not all_finite(delta):
            raise RuntimeError("not finite")
        flat.add_(delta[0])
        return StepLosses(oracle.losses)

    def with_checks() -> object:
        if not watch.intact():
            raise RuntimeError("stale")
        oracle = StepOracle(context, losses, True)
        alg._check_groups()
        alg._sync_rule()
        old = game.algorithm_state
        delta, new = alg.update(oracle, old)
        game_module._check_update("SimGD", oracle, delta, new, old, layout)
        context.moves.move(layout.data, delta, out=layout.data)
        return StepLosses(oracle.losses)

    rows = {
        "1 floor: engine, copy, scale, check, add": floor,
        "2 + oracle (vector_field and its checks)": with_oracle,
        "3 + algorithm (param groups, descend)": with_algorithm,
        "4 + game checks (watch, update, move)": with_checks,
        "5 Game.step, all of it": game.step,
    }
    desc = "rock-paper-scissors (3x3, float64, 1 thread), learning rate 0 (the point stays)"
    return available("rps breakdown", "bare loop", rps_bare(False), rows, desc, rounds, target, wrap=one_thread)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> list[Result]:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--profile", default=None, help="profile this gameopt algorithm instead of timing")
    parser.add_argument("--profile-steps", type=int, default=200)
    parser.add_argument("--profile-pair", default="deep-narrow", choices=["mlp-2d", "deep-narrow"])
    parser.add_argument(
        "--breakdown", action="store_true", help="time the pieces of a gameopt SimGD step instead (both pairs)"
    )
    parser.add_argument("--small", action="store_true", help="time only the small games (rock-paper-scissors)")
    args = parser.parse_args(argv)
    setup(args)
    if args.profile:
        profile(args.profile, args.profile_steps, args.profile_pair)
        return []
    rounds = args.rounds or (6 if args.quick else 25)
    target = 0.010 if args.quick else 0.030  # seconds per timed batch (the slower side)
    out = Path(args.out)
    suffix = "_quick" if args.quick else ""
    retries = args.retries if args.retries is not None else (0 if args.quick else 2)

    if args.breakdown and args.small:
        results = measure(small_breakdown(rounds, target), retries=retries, budget_s=args.retry_budget, log=log_result)
        print_table(results, "a SimGD step built up layer by layer, as a multiple of the bare loop's step", "x bare")
        save_csv(results, out / f"step_cost_small_breakdown{suffix}.csv")
        return results

    if args.breakdown:
        specs = breakdown("mlp-2d", rounds, target) + breakdown("deep-narrow", rounds, target)
        results = measure(specs, retries=retries, budget_s=args.retry_budget, log=log_result)
        print_table(results, "time of each piece of a SimGD step, as a fraction of one plain xi", "x xi")
        save_csv(results, out / f"step_cost_breakdown{suffix}.csv")
        return results

    if args.small:
        results = measure(small_games(rounds, target), retries=retries, budget_s=args.retry_budget, log=log_result)
        print_table(results, "ratio = median over rounds of (gameopt step time / bare loop step time)", "x bare")
        for line in ["goals:", *small_goals(results)]:
            print(line)
        save_csv(results, out / f"step_cost_small{suffix}.csv")
        return results

    timed = functools.partial(spec, rounds=rounds, target=target, max_s=MAX_S)
    specs: list[Callable[[], Result]] = []
    for kind in ("mlp-2d", "deep-narrow"):
        pair = Pair(kind)
        sanity_check(pair)
        desc = pair.describe()
        xi = plain_xi(pair)
        cands = candidates(pair)
        # A/A control: the baseline against itself shows the noise floor
        specs.append(timed(kind, "A/A: plain xi vs itself", "plain xi", xi, xi, note="noise floor", desc=desc))
        for name, (fn, note) in cands.items():
            # a multiple of 5 so that each batch holds one Lookahead synchronization
            multiple = 5 if "Lookahead" in name else 1
            specs.append(timed(kind, name, "plain xi", xi, fn, note=note, desc=desc, multiple=multiple))
        for ours, theirs in (
            ("gameopt Extragradient", "ref: cooper ExtraSGD"),
            ("gameopt Extragradient+Adam", "ref: cooper ExtraAdam"),
        ):
            label = theirs.removeprefix("ref: ")
            base_fn, fn = cands[theirs][0], cands[ours][0]
            specs.append(timed(f"{kind} vs cooper", f"{ours} / {label}", label, base_fn, fn, note="", desc=desc))
    specs += small_games(rounds, target)

    results = measure(specs, retries=retries, budget_s=args.retry_budget, log=log_result)
    for r in results:
        if "vs cooper" in r.group:
            r.note = f"gameopt {1 / r.ratio:.2f}x faster" if r.ratio < 1 else f"gameopt {r.ratio:.2f}x slower"

    print_table(
        results,
        "ratio = median over rounds of (step time / plain xi time); 'vs cooper' rows: gameopt time / cooper time; "
        "'rps' rows: gameopt step time / bare loop step time",
        "ratio",
    )
    for line in goals(results):
        print(line)

    save_csv(results, out / f"step_cost{suffix}.csv")
    panels: dict[str, list[Result]] = {}
    for r in results:
        panels.setdefault(f"{r.group}: {r.extra['model']}", []).append(r)
    goal_lines = {
        k: [(0.8, "1.25x faster")]
        if "cooper" in k
        else [(1.2, "1.2")]
        if k.startswith("rps")
        else [(1.05, "1.05"), (2.1, "2.1")]
        for k in panels
    }
    bar_plot(
        panels,
        out / f"step_cost{suffix}.png",
        f"Cost of one step in evaluations of ξ ({torch.get_num_threads()} threads)",
        "time ratio (median of per-round ratios)",
        goals=goal_lines,
    )
    return results


def goals(results: list[Result]) -> list[str]:
    by = {(r.group, r.name): r.ratio for r in results}
    lines = ["goals:"]
    for kind in ("mlp-2d", "deep-narrow"):
        for name, limit in (
            ("gameopt SimGD", 1.05),
            ("gameopt Optimistic", 1.05),
            ("gameopt Extragradient", 2.1),
        ):
            r = by[(kind, name)]
            lines.append(f"  {'PASS' if r <= limit else 'MISS'}  {kind}: {name} <= {limit} x xi ({r:.3f})")
        r = by[(f"{kind} vs cooper", "gameopt Extragradient / cooper ExtraSGD")]
        ok = "PASS" if r <= 0.8 else "MISS"
        if kind != "deep-narrow":
            ok = "info"
        lines.append(f"  {ok}  {kind}: gameopt EG at least 1.25x faster than cooper ExtraSGD ({1 / r:.2f}x)")
    lines += small_goals(results)
    return lines


def small_goals(results: list[Result]) -> list[str]:
    """The small games' goal: a gameopt step at most 1.2 x the bare loop's."""
    by = {(r.group, r.name): r.ratio for r in results}
    lines = []
    for name in ("gameopt SimGD", "gameopt SimGD+simplex"):
        r = by.get(("rps", name))
        if r is not None:
            lines.append(f"  {'PASS' if r <= 1.2 else 'MISS'}  rps: {name} <= 1.2 x bare loop ({r:.3f})")
    return lines


if __name__ == "__main__":
    main()
