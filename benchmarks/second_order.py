"""Second-order methods: step cost against the barest plain-PyTorch code for the
same step (zero-sum pairs), and as a multiple of one plain-PyTorch ξ (general-sum
pairs); ACGD against the authors' ``cgds`` at equal tolerance (iterates checked),
and the number of reverse passes of LA/LOLA/SOS against the number of players.

    python -m benchmarks.second_order [--quick]

Same protocol as ``benchmarks.step_cost`` (interleaved rounds, median of per-round
ratios) on the same two GAN pairs: zero-sum (losses (−f, f), f the discriminator's
loss) for the bare references, and the non-saturating (general-sum) losses.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import gameopt
from benchmarks._common import Result, base_parser, calibrate, compare, print_table, save_csv, setup
from benchmarks.step_cost import Pair, gameopt_step, gan_losses, plain_xi

LR = 1e-4
SECOND_ORDER: dict[str, Callable[[], gameopt.Algorithm]] = {
    "HamiltonianGD": lambda: gameopt.HamiltonianGD(LR),
    "Consensus": lambda: gameopt.ConsensusOptimization(LR, gamma=0.1),
    "SGA": lambda: gameopt.SGA(LR),
    "LA": lambda: gameopt.LA(LR, alpha=LR),
    "LOLA": lambda: gameopt.LOLA(LR, alpha=LR),
    "SOS": lambda: gameopt.SOS(LR, alpha=LR),
    "CGD (5 Krylov products)": lambda: gameopt.CGD(LR, tol=1e-30, maxiter=5),
}


def by_hand(pair: Pair, method: str) -> Callable[[], object]:
    """Consensus or SGA hand-rolled on unfused modules the usual way: ξ with
    ``create_graph``, Jᵀξ as the gradient of ½‖ξ‖², and (SGA) Jξ with the
    double-vjp trick, then a per-parameter update."""
    G, D = pair.fresh()
    gp, dp = list(G.parameters()), list(D.parameters())
    params = gp + dp
    losses, x, z = gan_losses(G, D), pair.x, pair.z

    def step() -> None:
        loss_g, loss_d = losses(x, z)
        xi = torch.autograd.grad(loss_g, gp, create_graph=True) + torch.autograd.grad(loss_d, dp, create_graph=True)
        values = [g.detach() for g in xi]
        jt_xi = torch.autograd.grad(xi, params, grad_outputs=values, retain_graph=method == "SGA")
        if method == "Consensus":
            direction = [g + 0.1 * h for g, h in zip(values, jt_xi)]
        else:
            us = [torch.zeros_like(g, requires_grad=True) for g in xi]
            jt_u = torch.autograd.grad(xi, params, grad_outputs=us, create_graph=True)
            j_xi = torch.autograd.grad(jt_u, us, grad_outputs=values)
            a_xi = [0.5 * (h - j) for h, j in zip(jt_xi, j_xi)]
            dot = lambda a, b: sum((s * t).sum() for s, t in zip(a, b))  # noqa: E731
            d = sum(v.numel() for v in values)
            sign = torch.sign(dot(values, jt_xi) * dot(a_xi, jt_xi) / d + 0.1)
            direction = [g + sign * a for g, a in zip(values, a_xi)]
        with torch.no_grad():
            for p, v in zip(params, direction):
                p.sub_(v, alpha=LR)

    step.params = params  # type: ignore[attr-defined]
    return step


def check_by_hand(pair: Pair) -> None:
    """The hand-rolled references take the same step as gameopt's."""
    for method in ("Consensus", "SGA"):
        ours = gameopt_step(pair, SECOND_ORDER[method])
        ours()
        theirs = by_hand(pair, method)
        theirs()
        game = ours.game  # type: ignore[attr-defined]
        a = torch.cat([p.detach().reshape(-1) for pl in game.players for p in pl.module.parameters()])
        b = torch.cat([p.detach().reshape(-1) for p in theirs.params])  # type: ignore[attr-defined]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=f"{method} by hand differs from gameopt")


# ----------------------------------------------------------- zero-sum pairs
def zero_sum_f(G: nn.Module, D: nn.Module, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """f: the discriminator's loss; the generator minimizes −f."""
    return F.softplus(-D(x)).mean() + F.softplus(D(G(z))).mean()


ZERO_SUM: dict[str, Callable[[bool], gameopt.Algorithm]] = {
    "HamiltonianGD": lambda zs: gameopt.HamiltonianGD(LR, zero_sum=zs),
    "Consensus": lambda zs: gameopt.ConsensusOptimization(LR, gamma=0.1, zero_sum=zs),
    "SGA": lambda zs: gameopt.SGA(LR, zero_sum=zs),
}


def zero_sum_step(pair: Pair, make: Callable[[], gameopt.Algorithm]) -> Callable[[], object]:
    G, D = pair.fresh()

    def losses(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = zero_sum_f(G, D, x, z)
        return -f, f

    game = gameopt.Game([gameopt.Player(G, name="G"), gameopt.Player(D, name="D")], losses, algorithm=make())
    x, z = pair.x, pair.z

    def step() -> object:
        return game.step(x, z)

    step.game = game  # type: ignore[attr-defined]
    return step


def bare(pair: Pair, method: str, batched: bool = False) -> Callable[[], object]:
    """The barest plain-PyTorch step on the zero-sum pair (unfused modules): one
    forward, one ``create_graph`` backward of f against all parameters, then
    Hessian-vector products (Jᵀξ = H∇f, Jξ = S·Hξ; SGA's two in sequence, or
    ``batched`` in one double backward) and a ``torch._foreach`` update."""
    G, D = pair.fresh()
    gp, dp = list(G.parameters()), list(D.parameters())
    params, n_g = gp + dp, len(gp)
    x, z = pair.x, pair.z
    d = sum(p.numel() for p in params)

    def dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([torch.dot(s.reshape(-1), t.reshape(-1)) for s, t in zip(a, b)]).sum()

    def step() -> None:
        g = torch.autograd.grad(zero_sum_f(G, D, x, z), params, create_graph=True)
        grad_f = [t.detach() for t in g]
        if method != "SGA":
            h = torch.autograd.grad(g, params, grad_outputs=grad_f)  # Jᵀξ = H∇f
            with torch.no_grad():
                if method == "Consensus":  # ξ = (−∇_G f, ∇_D f)
                    torch._foreach_add_(gp, grad_f[:n_g], alpha=LR)
                    torch._foreach_add_(dp, grad_f[n_g:], alpha=-LR)
                torch._foreach_add_(params, h, alpha=-LR * (0.1 if method == "Consensus" else 1.0))
            return
        xi = [-t for t in grad_f[:n_g]] + grad_f[n_g:]
        if batched:
            both = [torch.stack([a, b]) for a, b in zip(grad_f, xi)]
            h = torch.autograd.grad(g, params, grad_outputs=both, is_grads_batched=True)
            jt, hx = [t[0] for t in h], [t[1] for t in h]
        else:
            jt = torch.autograd.grad(g, params, grad_outputs=grad_f, retain_graph=True)
            hx = torch.autograd.grad(g, params, grad_outputs=xi)
        with torch.no_grad():  # Aᵀξ = ½(Jᵀξ − SHξ)
            a = list(torch._foreach_add(jt[:n_g], hx[:n_g])) + list(torch._foreach_sub(jt[n_g:], hx[n_g:]))
            torch._foreach_mul_(a, 0.5)
            lam = torch.sign(dot(xi, jt) * dot(a, jt) / d + 0.1)
            torch._foreach_mul_(a, lam)
            torch._foreach_add_(a, xi)
            torch._foreach_add_(params, a, alpha=-LR)

    step.params = params  # type: ignore[attr-defined]
    return step


def check_bare(pair: Pair) -> None:
    """The bare references and both gameopt paths take the same step."""
    for method, make in ZERO_SUM.items():
        theirs = bare(pair, method)
        theirs()
        b = torch.cat([p.detach().reshape(-1) for p in theirs.params])  # type: ignore[attr-defined]
        for zs in (True, False):
            ours = zero_sum_step(pair, lambda make=make, zs=zs: make(zs))
            ours()
            game = ours.game  # type: ignore[attr-defined]
            a = torch.cat([p.detach().reshape(-1) for pl in game.players for p in pl.module.parameters()])
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=f"{method} bare differs from gameopt")


def _wgan(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    gen = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    disc = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    return gen, disc


def _f(gen: nn.Module, disc: nn.Module, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return disc(x).mean() - disc(gen(z)).mean() + 0.1 * (disc(x) ** 2).mean()


def acgd_pair(rounds: int, target: float) -> tuple[Result, float]:
    """gameopt ACGD vs cgds ACGD, same start, same batches, the authors' tolerances."""
    import CGDs

    gen, disc = _wgan()
    ref_gen, ref_disc = copy.deepcopy(gen), copy.deepcopy(disc)
    game = gameopt.Game(
        [gen, disc], lambda x, z: (lambda f: (f, -f))(_f(gen, disc, x, z)), algorithm=gameopt.ACGD([1e-3, 1e-3])
    )
    ref = CGDs.ACGD(max_params=ref_disc.parameters(), min_params=ref_gen.parameters(), lr_max=1e-3, lr_min=1e-3)
    g = torch.Generator().manual_seed(1)
    x, z = torch.randn(256, 2, generator=g) + 1, torch.randn(256, 8, generator=g)

    def ours() -> None:
        game.step(x, z)

    def theirs() -> None:
        ref.zero_grad()
        ref.step(_f(ref_gen, ref_disc, x, z))

    batch = calibrate(ours, theirs, target_s=target)
    res = compare("ACGD", "gameopt ACGD / cgds ACGD", "cgds ACGD", theirs, ours, rounds=rounds, batch=batch)
    # both took the same number of steps from the same start: compare the iterates
    mine = torch.cat([p.detach().reshape(-1) for p in list(gen.parameters()) + list(disc.parameters())])
    other = torch.cat([p.detach().reshape(-1) for p in list(ref_gen.parameters()) + list(ref_disc.parameters())])
    return res, float((mine - other).abs().max() / other.abs().max())


def backward_passes(name: str, n_players: int) -> int:
    """Reverse passes (autograd.grad calls) in one step on an n-player quadratic game."""
    from players.quadratic import QuadraticPlayer, random_quadratic_game

    qg = random_quadratic_game(n_players, 3, seed=0)
    players = [QuadraticPlayer(torch.randn(3, dtype=torch.float64)) for _ in range(n_players)]
    game = gameopt.Game(players, qg.losses(players), algorithm=SECOND_ORDER[name]())
    real = torch.autograd.grad
    calls = {"n": 0}

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return real(*a, **k)

    torch.autograd.grad = counting
    try:
        game._forward_mode_ok = True
        game.step()
    finally:
        torch.autograd.grad = real
    return calls["n"]


def main(argv: list[str] | None = None) -> list[Result]:
    parser = base_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    setup(args)
    rounds = args.rounds or (5 if args.quick else 15)
    target = 0.02 if args.quick else 0.06
    results: list[Result] = []
    for kind in ("mlp-2d", "deep-narrow"):
        pair = Pair(kind)
        check_bare(pair)
        group = f"{kind} zero-sum"
        for name, make in ZERO_SUM.items():
            ref = bare(pair, name)
            for zs, label in ((True, "zero_sum=True"), (False, "general path")):
                step = zero_sum_step(pair, lambda make=make, zs=zs: make(zs))
                batch = calibrate(ref, step, target_s=target)
                r = compare(group, f"gameopt {name} {label}", f"bare {name}", ref, step, rounds=rounds, batch=batch)
                results.append(r)
                print(f"{group:<22} {name + ' ' + label:<34} {r.ratio:6.3f}x bare", flush=True)
        seq, bat = bare(pair, "SGA"), bare(pair, "SGA", batched=True)
        batch = calibrate(seq, bat, target_s=target)
        r = compare(group, "bare SGA, batched products", "bare SGA", seq, bat, rounds=rounds, batch=batch)
        r.note = "is_grads_batched=True double backward / two sequential HVPs"
        results.append(r)
        print(f"{group:<22} {'bare SGA batched / sequential':<34} {r.ratio:6.3f}x", flush=True)
    for kind in ("mlp-2d", "deep-narrow"):
        pair = Pair(kind)
        check_by_hand(pair)
        xi = plain_xi(pair)
        for name, make in SECOND_ORDER.items():
            step = gameopt_step(pair, make)
            batch = calibrate(xi, step, target_s=target)
            r = compare(kind, f"gameopt {name}", "plain xi", xi, step, rounds=rounds, batch=batch)
            results.append(r)
            print(f"{kind:<12} {name:<26} {r.ratio:6.2f}x xi", flush=True)
        for method in ("Consensus", "SGA"):
            fn = by_hand(pair, method)
            batch = calibrate(xi, fn, target_s=target)
            r = compare(kind, f"ref: {method} by hand", "plain xi", xi, fn, rounds=rounds, batch=batch)
            r.note = "unfused; create_graph ξ, grad of ½‖ξ‖²" + (", double-vjp Jξ" if method == "SGA" else "")
            results.append(r)
            print(f"{kind:<12} {'ref: ' + method + ' by hand':<26} {r.ratio:6.2f}x xi", flush=True)
    res, diff = acgd_pair(rounds, target)
    res.note = f"max relative iterate difference after the run: {diff:.1e}"
    results.append(res)
    print_table(results, "Second-order step cost (ratio to one plain xi; ACGD: gameopt / cgds)")
    print(f"ACGD: gameopt is {1 / res.ratio:.2f}x faster per step than cgds; iterates agree to {diff:.1e} (relative)")
    print("\nreverse passes (autograd.grad calls) per step on an n-player quadratic game:")
    print(f"{'n players':<12}" + "".join(f"{n:>8}" for n in (2, 4, 8, 16)))
    for name in ("LA", "LOLA", "SOS"):
        counts = [backward_passes(name, n) for n in (2, 4, 8, 16)]
        print(f"{name:<12}" + "".join(f"{c:>8}" for c in counts))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_csv(results, out / ("second_order_quick.csv" if args.quick else "second_order.csv"))
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
