"""A step's launches and memory traffic, counted exactly (no timing).

    python -m benchmarks.traffic [--n 1048576]

Every ATen op that a step runs, backward included, passes through a
``TorchDispatchMode``; views (``func.is_view``) cost nothing and are not counted.
For each other op we count one launch, and the elements it reads and writes in
*parameter-sized* tensors (at least ``n`` elements: a player's flat vector or a
view of it), which is the step's memory traffic in units of N, the parameters of
one player. Copies (``copy_``, ``clone``, ``_foreach_copy_``, ``cat``) are counted apart, and so are host syncs
(``item``, ``_local_scalar_dense``, ``is_nonzero``, ``tolist``). The counter is
:mod:`gameopt.testing.traffic`; ``tests/game/test_step_traffic.py`` keeps these counts.

The game is bilinear, f(x, y) = Σ x·y elementwise, with N parameters per player,
so that ξ costs the same few passes everywhere and what differs is the step's
own bookkeeping. Each gameopt step is set beside the bare loop a user would write
(``torch.autograd.grad`` per player, ``torch._foreach_*`` updates,
``torch.optim``'s Adam, RMSprop and SGD with momentum, ``foreach=True``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import Tensor, nn

import gameopt
from gameopt.testing.traffic import Count, count

from .bare import Losses, simgd_of, xi

LR = 1e-3


# ------------------------------------------------------------------ the game
def bilinear(n: int, seed: int = 0) -> tuple[nn.Parameter, nn.Parameter, Callable[[], tuple[Tensor, Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    x = nn.Parameter(torch.randn(n, generator=g) * 0.1)
    y = nn.Parameter(torch.randn(n, generator=g) * 0.1)

    def losses() -> tuple[Tensor, Tensor]:
        f = (x * y).sum()
        return f, -f

    return x, y, losses


def gameopt_step(n: int, make: Callable[[], gameopt.Algorithm], verdict: str = "host") -> Callable[[], object]:
    x, y, losses = bilinear(n)
    game = gameopt.Game([gameopt.Player([x]), gameopt.Player([y])], losses, algorithm=make(), verdict=verdict)
    return game.step


def _bare_extragradient(losses: Losses, first: list[Tensor], second: list[Tensor]) -> Callable[[], object]:
    params = first + second

    def step() -> None:
        with torch.no_grad():
            start = torch._foreach_mul(params, 1.0)  # the point to come back to
        gs = xi(losses, first, second)
        with torch.no_grad():
            torch._foreach_add_(params, gs, alpha=-LR)
        gs = xi(losses, first, second)
        with torch.no_grad():
            torch._foreach_add_(start, gs, alpha=-LR)
            torch._foreach_copy_(params, start)

    return step


def bare_simgd(n: int) -> Callable[[], object]:
    x, y, losses = bilinear(n)
    return simgd_of(losses, [x], [y], LR)


def bare_extragradient(n: int) -> Callable[[], object]:
    x, y, losses = bilinear(n)
    return _bare_extragradient(losses, [x], [y])


def bare_adam(n: int) -> Callable[[], object]:
    return _bare_optim(n, lambda params: torch.optim.Adam(params, lr=LR, foreach=True))


def bare_rmsprop(n: int) -> Callable[[], object]:
    return _bare_optim(n, lambda params: torch.optim.RMSprop(params, lr=LR, foreach=True))


def bare_momentum(n: int) -> Callable[[], object]:
    return _bare_optim(n, lambda params: torch.optim.SGD(params, lr=LR, momentum=0.9, foreach=True))


def _bare_optim(n: int, make: Callable[[list[nn.Parameter]], torch.optim.Optimizer]) -> Callable[[], object]:
    """ξ into ``.grad`` (one ``autograd.grad`` per player), then ``torch.optim``'s step."""
    x, y, losses = bilinear(n)
    opt = make([x, y])

    def step() -> None:
        f, g = losses()
        x.grad, y.grad = torch.autograd.grad(f, [x], retain_graph=True)[0], torch.autograd.grad(g, [y])[0]
        opt.step()

    return step


ROWS: dict[str, tuple[Callable[[], gameopt.Algorithm], Callable[[int], Callable[[], object]]]] = {
    "SimGD": (lambda: gameopt.SimGD(LR), bare_simgd),
    "Extragradient": (lambda: gameopt.Extragradient(LR), bare_extragradient),
    "SimGD + Adam": (lambda: gameopt.SimGD(LR, update=gameopt.Adam()), bare_adam),
    "SimGD + RMSProp": (lambda: gameopt.SimGD(LR, update=gameopt.RMSProp()), bare_rmsprop),
    "SimGD + Momentum": (lambda: gameopt.SimGD(LR, update=gameopt.Momentum(0.9)), bare_momentum),
}


def measure(n: int, verdict: str = "host") -> list[tuple[str, Count, Count]]:
    return [(name, count(gameopt_step(n, make, verdict), n), count(bare(n), n)) for name, (make, bare) in ROWS.items()]


# ------------------------------------------------- a small BatchNorm GAN (launches)
def bn_gan(seed: int = 0) -> tuple[nn.Module, nn.Module, Callable[[], tuple[Tensor, Tensor]]]:
    """A generator and a discriminator with BatchNorm (running statistics: module
    buffers that every forward moves), on fixed synthetic batches."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    gen = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    disc = nn.Sequential(nn.Linear(2, 16), nn.BatchNorm1d(16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    z, real = torch.randn(32, 4, generator=g), torch.randn(32, 2, generator=g)

    def losses() -> tuple[Tensor, Tensor]:
        fake = gen(z)
        d_fake, d_real = disc(fake), disc(real)
        loss_d = nn.functional.softplus(-d_real).mean() + nn.functional.softplus(d_fake).mean()
        return nn.functional.softplus(-d_fake).mean(), loss_d

    return gen, disc, losses


def gameopt_gan_step(make: Callable[[], gameopt.Algorithm], verdict: str = "host") -> Callable[[], object]:
    gen, disc, losses = bn_gan()
    return gameopt.Game([gen, disc], losses, algorithm=make(), verdict=verdict).step


def bare_gan_simgd() -> Callable[[], object]:
    gen, disc, losses = bn_gan()
    return simgd_of(losses, list(gen.parameters()), list(disc.parameters()), LR)


def bare_gan_extragradient() -> Callable[[], object]:
    gen, disc, losses = bn_gan()
    return _bare_extragradient(losses, list(gen.parameters()), list(disc.parameters()))


GAN_ROWS: dict[str, tuple[Callable[[], gameopt.Algorithm], Callable[[], Callable[[], object]]]] = {
    "SimGD": (lambda: gameopt.SimGD(LR), bare_gan_simgd),
    "Extragradient": (lambda: gameopt.Extragradient(LR), bare_gan_extragradient),
}


def measure_gan(verdict: str = "host") -> list[tuple[str, Count, Count]]:
    """Launches of one step on the BatchNorm GAN: every tensor is small, so what counts
    is ops, copies and syncs (``big`` is 1: every tensor is counted)."""
    return [
        (name, count(gameopt_gan_step(make, verdict), 1), count(bare(), 1)) for name, (make, bare) in GAN_ROWS.items()
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2**20, help="parameters per player (default: %(default)s)")
    p.add_argument("--ops", action="store_true", help="also list each step's ops by name")
    p.add_argument(
        "--verdict",
        choices=["host", "device"],
        default="host",
        help="the games' step verdict (Game(verdict=...)): device: no host read inside a step",
    )
    args = p.parse_args()
    print(f"bilinear game, N = {args.n} parameters per player, verdict={args.verdict!r}, torch {torch.__version__}")
    print("| step | touched (gameopt) | touched (bare) | ratio | ops | bare ops | copies | bare copies | syncs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, mine, bare in measure(args.n, args.verdict):
        print(
            f"| {name} | {mine.touched / args.n:.0f}N | {bare.touched / args.n:.0f}N | "
            f"{mine.touched / bare.touched:.2f} | {mine.ops} | {bare.ops} | {mine.copies} | {bare.copies} | "
            f"{mine.syncs} / {bare.syncs} |"
        )
        _names(args.ops, mine, bare)
    print()
    print("BatchNorm GAN (4-16-2 generator, 2-16-1 discriminator, batch 32): launches of one step")
    print("| step | ops (gameopt) | ops (bare) | ratio | copies | bare copies | syncs |")
    print("|---|---|---|---|---|---|---|")
    for name, mine, bare in measure_gan(args.verdict):
        print(
            f"| {name} | {mine.ops} | {bare.ops} | {mine.ops / bare.ops:.2f} | {mine.copies} | {bare.copies} | "
            f"{mine.syncs} / {bare.syncs} |"
        )
        _names(args.ops, mine, bare)


def _names(show: bool, mine: Count, bare: Count) -> None:
    if show:
        print(f"|   gameopt ops: {dict(sorted(mine.names.items()))}")
        print(f"|   bare ops: {dict(sorted(bare.names.items()))}")


if __name__ == "__main__":
    main()
