"""Second-order methods: step cost against the barest plain-PyTorch code for the
same step (zero-sum pairs), and as a multiple of one plain-PyTorch ξ (general-sum
pairs); ACGD against the authors' ``cgds`` at equal tolerance (iterates checked),
and the number of reverse passes of LA/LOLA/SOS against the number of players.

    python -m benchmarks.second_order [--quick]
    python -m benchmarks.second_order --methods HamiltonianGD,Consensus --paths zero_sum --pairs deep-narrow

Same protocol as ``benchmarks.step_cost`` (interleaved rounds, median of per-round
ratios) on the same two GAN pairs: zero-sum (losses (−f, f), f the discriminator's
loss) for the bare references, and the non-saturating (general-sum) losses.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

import gameopt
from benchmarks._common import Result, base_parser, calibrate, compare, print_table, save_csv, setup
from benchmarks.step_cost import Pair, gameopt_step, gan_losses, plain_xi

LR = 1e-4
LossesOf = Callable[[Callable, Callable], Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]
SECOND_ORDER: dict[str, Callable[[], gameopt.Algorithm]] = {
    "HamiltonianGD": lambda: gameopt.HamiltonianGD(LR),
    "Consensus": lambda: gameopt.ConsensusOptimization(LR, gamma=0.1),
    "SGA": lambda: gameopt.SGA(LR),
    "LA": lambda: gameopt.LA(LR, alpha=LR),
    "LOLA": lambda: gameopt.LOLA(LR, alpha=LR),
    "SOS": lambda: gameopt.SOS(LR, alpha=LR),
    "CGD (5 Krylov products)": lambda: gameopt.CGD(LR, tol=1e-30, maxiter=5),
    "Stackelberg (5 CG iterations)": lambda: gameopt.Stackelberg(LR, tol=1e-300, maxiter=5),
    "Stackelberg (1 CG iteration)": lambda: gameopt.Stackelberg(LR, tol=1e-300, maxiter=1),
}
#: zero-sum only (the pair's losses (−f, f)), timed against one plain ξ of the general-sum pair
ZERO_SUM_ONLY: dict[str, Callable[[], gameopt.Algorithm]] = {
    "FollowTheRidge (5 CG iterations)": lambda: gameopt.FollowTheRidge(LR, tol=1e-300, maxiter=5),
    "FollowTheRidge (1 CG iteration)": lambda: gameopt.FollowTheRidge(LR, tol=1e-300, maxiter=1),
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
    """The hand-rolled and bare references take the same step as gameopt's."""
    cases = [(m, functools.partial(by_hand, pair, m)) for m in ("Consensus", "SGA")]
    cases += [("SGA", functools.partial(bare_general_sga, pair, forward=f)) for f in (False, True)]
    for method, make in cases:
        ours = gameopt_step(pair, SECOND_ORDER[method])
        ours()
        theirs = make()
        theirs()
        game = ours.game  # type: ignore[attr-defined]
        a = torch.cat([p.detach().reshape(-1) for pl in game.players for p in pl.module.parameters()])
        b = torch.cat([p.detach().reshape(-1) for p in theirs.params])  # type: ignore[attr-defined]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=f"{method} by hand differs from gameopt")


def bare_sga(
    G: nn.Module, D: nn.Module, losses_of: LossesOf, x: torch.Tensor, z: torch.Tensor, forward: bool = False
) -> Callable[[], object]:
    """General-sum SGA (the non-saturating losses) in plain PyTorch on unfused modules,
    the cheapest way we found to write it: ξ with ``create_graph``, then Jᵀξ as the
    value of one ``create_graph`` reverse pass of ⟨ξ, u⟩ at a leaf u holding ξ's
    values, and Jξ = ∂/∂u ⟨Jᵀu, ξ⟩ through the graph of that pass (the double-vjp
    trick, its first pass serving as Jᵀξ); λ's sign from ⟨ξ, Jᵀξ⟩⟨Aᵀξ, Jᵀξ⟩ on the
    device (no host sync), and a ``torch._foreach`` update. With ``forward``: Jᵀξ as
    the gradient of ½‖ξ‖² (ξ's graph then freed) and Jξ forward-over-reverse (the
    losses re-run with dual parameters through ``torch.func.functional_call``, their
    gradients' tangents). ``losses_of(G, D)`` gives the losses (loss_G, loss_D) of
    the batch (x, z); G and D may be any callables."""
    gp, dp = list(G.parameters()), list(D.parameters())
    params = gp + dp
    losses = losses_of(G, D)
    d = sum(p.numel() for p in params)
    names = [dict(G.named_parameters()), dict(D.named_parameters())]

    def dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([torch.dot(s.reshape(-1), t.reshape(-1)) for s, t in zip(a, b)]).sum()

    def dual_jvp(v: list[torch.Tensor]) -> list[torch.Tensor]:
        with fwAD.dual_level():
            tangents = iter(v)
            dual = lambda p: fwAD.make_dual(p.detach().requires_grad_(), next(tangents))  # noqa: E731
            duals = [{n: dual(p) for n, p in m.items()} for m in names]
            loss_g, loss_d = losses_of(
                lambda t: functional_call(G, duals[0], (t,)), lambda t: functional_call(D, duals[1], (t,))
            )(x, z)
            leaves = [list(duals[0].values()), list(duals[1].values())]
            grads = torch.autograd.grad(loss_g, leaves[0], retain_graph=True) + torch.autograd.grad(loss_d, leaves[1])
            return [fwAD.unpack_dual(g).tangent for g in grads]

    def step() -> None:
        loss_g, loss_d = losses(x, z)
        xi = torch.autograd.grad(loss_g, gp, create_graph=True) + torch.autograd.grad(loss_d, dp, create_graph=True)
        v = [t.detach() for t in xi]
        if forward:
            jt = torch.autograd.grad(xi, params, grad_outputs=v)
            del xi, loss_g, loss_d
            j = dual_jvp(v)
        else:
            u = [t.detach().requires_grad_() for t in xi]  # aliases of ξ: no copies
            jt_u = torch.autograd.grad(xi, params, grad_outputs=u, create_graph=True)
            j = torch.autograd.grad(jt_u, u, grad_outputs=v)
            jt = [t.detach() for t in jt_u]
        with torch.no_grad():  # Aᵀξ = ½(Jᵀξ − Jξ)
            a = torch._foreach_sub(jt, j)
            torch._foreach_mul_(a, 0.5)
            lam = torch.sign(dot(v, jt) * dot(a, jt) / d + 0.1)
            torch._foreach_mul_(a, lam)
            torch._foreach_add_(a, v)
            torch._foreach_add_(params, a, alpha=-LR)

    step.params = params  # type: ignore[attr-defined]
    return step


def bare_general_sga(pair: Pair, forward: bool = False) -> Callable[[], object]:
    """:func:`bare_sga` on the pair's modules, batch and non-saturating losses."""
    return bare_sga(*pair.fresh(), gan_losses, pair.x, pair.z, forward)


def peak_vectors(fn: Callable[[], object], n_params: int) -> float:
    """The peak memory of one call of ``fn`` above the memory before it, in vectors of
    ``n_params`` float32 (the CPU allocator's allocations and frees, as the profiler
    records them)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    sizes: list[tuple[int, int]] = []
    todo = list(prof.profiler.kineto_results.experimental_event_tree())  # type: ignore[union-attr]
    while todo:
        event = todo.pop()
        if event.tag == _EventType.Allocation:
            sizes.append((event.start_time_ns, event.extra_fields.alloc_size))
        todo += event.children
    now = peak = 0
    for _, size in sorted(sizes):
        now += size
        peak = max(peak, now)
    return peak / (4 * n_params)


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


# ------------------------------------------------ general-sum pair: LA, LOLA, SOS
SHAPING: dict[str, Callable[[], gameopt.Algorithm]] = {
    "LA": lambda: gameopt.LA(LR, alpha=ALPHA),
    "LOLA": lambda: gameopt.LOLA(LR, alpha=ALPHA),
    "SOS": lambda: gameopt.SOS(LR, alpha=ALPHA),
}
ALPHA = 0.5


def bare_shaping(pair: Pair, method: str) -> Callable[[], object]:
    """LA, LOLA or SOS for two players in plain PyTorch on unfused modules (the
    non-saturating, general-sum losses): per player one ``create_graph`` backward
    of its loss against all parameters (its ξ_i and its cross gradient c_i =
    ∇_{w_j} f_i), then per player i one reverse pass toward w_i of
    ⟨c_i, ξ_j⟩ (H_o ξ, LA) plus ⟨ξ_j, c_i⟩ (χ, LOLA), both factors held constant;
    SOS takes the two terms in two passes and mixes them with its p."""
    G, D = pair.fresh()
    gp, dp = list(G.parameters()), list(D.parameters())
    params, n_g = gp + dp, len(gp)
    losses, x, z = gan_losses(G, D), pair.x, pair.z

    def dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([torch.dot(s.reshape(-1), t.reshape(-1)) for s, t in zip(a, b)]).sum()

    def step() -> None:
        loss_g, loss_d = losses(x, z)
        g_all = torch.autograd.grad(loss_g, params, create_graph=True)
        d_all = torch.autograd.grad(loss_d, params, create_graph=True)
        xi_g, c_g = g_all[:n_g], g_all[n_g:]  # ξ_G, ∇_D f_G
        xi_d, c_d = d_all[n_g:], d_all[:n_g]  # ξ_D, ∇_G f_D
        xi = [t.detach() for t in xi_g + xi_d]
        cbar = [t.detach() for t in c_g + c_d]
        own = ((gp, c_g, xi_d, xi[n_g:], cbar[: len(c_g)]), (dp, c_d, xi_g, xi[:n_g], cbar[len(c_g) :]))
        if method == "SOS":
            ho = [t for w, c, _, v, _ in own for t in torch.autograd.grad(c, w, grad_outputs=v, retain_graph=True)]
            chi = [t for w, _, o, _, cb in own for t in torch.autograd.grad(o, w, grad_outputs=cb, retain_graph=True)]
            xi0 = list(torch._foreach_add(xi, ho, alpha=-ALPHA))
            inner = -ALPHA * dot(chi, xi0)
            one = torch.ones_like(inner)
            p1 = torch.where(inner >= 0, one, torch.clamp(-0.5 * dot(xi0, xi0) / inner, max=1.0))
            xi_sq = dot(xi, xi)
            p = torch.minimum(p1, torch.where(xi_sq.sqrt() < 0.1, xi_sq, one))
            direction = list(torch._foreach_add(xi0, torch._foreach_mul(chi, p), alpha=-ALPHA))
        else:
            shaped = []
            for w, c, o, v, cb in own:
                outs, gouts = list(c), list(v)
                if method == "LOLA":
                    outs, gouts = outs + list(o), gouts + cb
                shaped += torch.autograd.grad(outs, w, grad_outputs=gouts, retain_graph=True)
            direction = list(torch._foreach_add(xi, shaped, alpha=-ALPHA))
        with torch.no_grad():
            torch._foreach_add_(params, direction, alpha=-LR)

    step.params = params  # type: ignore[attr-defined]
    return step


# ------------------------------------------------------------ zero-sum pair: CGD
def bare_cgd(pair: Pair, iterations: int) -> Callable[[], object]:
    """Zero-sum CGD in plain PyTorch on unfused modules, as the CGDs package
    computes it: one ``create_graph`` backward of f, then CG with exactly
    ``iterations`` iterations on the Schur complement of player a = D,
    (I + η² B Bᵀ) c = −√η (ξ_a − η B ξ_b), Δ_a = √η c, Δ_b = −η (ξ_b − Bᵀ Δ_a),
    warm-started from the last c; B u = ∇_D⟨∇_G f, u⟩ and Bᵀ x = ∇_G⟨∇_D f, x⟩
    are Hessian-vector products (two per CG iteration)."""
    G, D = pair.fresh()
    gp, dp = list(G.parameters()), list(D.parameters())
    params, n_g = gp + dp, len(gp)
    x, z = pair.x, pair.z
    warm = [torch.zeros_like(p) for p in dp]

    def dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return float(torch.stack([torch.dot(s.reshape(-1), t.reshape(-1)) for s, t in zip(a, b)]).sum())

    def step() -> None:
        grads = torch.autograd.grad(zero_sum_f(G, D, x, z), params, create_graph=True)
        grad_g, grad_d = grads[:n_g], grads[n_g:]
        xi_b = [-t.detach() for t in grad_g]  # the generator minimizes −f
        xi_a = [t.detach() for t in grad_d]

        def B(u: list[torch.Tensor]) -> list[torch.Tensor]:
            return list(torch.autograd.grad(grad_g, dp, grad_outputs=u, retain_graph=True))

        def Bt(v: list[torch.Tensor]) -> list[torch.Tensor]:
            return list(torch.autograd.grad(grad_d, gp, grad_outputs=v, retain_graph=True))

        def matvec(c: list[torch.Tensor]) -> list[torch.Tensor]:
            return list(torch._foreach_add(c, B(Bt(c)), alpha=LR**2))

        rhs = list(torch._foreach_mul(torch._foreach_add(xi_a, B(xi_b), alpha=-LR), -(LR**0.5)))
        c = warm
        r = list(torch._foreach_sub(rhs, matvec(c)))
        p, rr = [t.clone() for t in r], dot(r, r)
        for _ in range(iterations if rr > 0 else 0):
            ap = matvec(p)
            alpha = rr / dot(p, ap)
            c = list(torch._foreach_add(c, p, alpha=alpha))
            torch._foreach_add_(r, ap, alpha=-alpha)
            new_rr = dot(r, r)
            beta, rr = new_rr / rr, new_rr
            if rr == 0:  # solved exactly (gameopt's CG stops there too)
                break
            p = list(torch._foreach_add(r, torch._foreach_mul(p, beta)))
        warm[:] = c
        delta_a = list(torch._foreach_mul(c, LR**0.5))
        delta_b = list(torch._foreach_mul(torch._foreach_sub(xi_b, Bt(delta_a)), -LR))
        with torch.no_grad():
            torch._foreach_add_(dp, delta_a)
            torch._foreach_add_(gp, delta_b)

    step.params = params  # type: ignore[attr-defined]
    return step


def krylov_product(pair: Pair, ours: bool) -> Callable[[], object]:
    """One product of CGD's zero-sum Schur complement (two Hessian-vector products
    through a kept graph): gameopt's operator (per-coordinate η) or the bare one."""
    from gameopt.algorithms.cgd import schur_operator
    from gameopt.testing import oracle

    if ours:
        game = zero_sum_step(pair, lambda: gameopt.CGD(LR, zero_sum=True)).game  # type: ignore[attr-defined]
        lin = oracle(game, pair.x, pair.z).linearize()
        views = game.layout.player_views
        eta = gameopt.Vec(torch.full_like(t, LR) for t in lin.xi)
        matvec = schur_operator(lin, gameopt.Vec(views(eta, 1)), gameopt.Vec(views(eta, 0)))[2]
        c = gameopt.Vec(views(gameopt.Vec(torch.randn_like(t) for t in lin.xi), 1))
        fn: Callable[[], object] = lambda: matvec(c)  # noqa: E731
        fn.keep = lin  # type: ignore[attr-defined]
        return fn
    G, D = pair.fresh()
    gp, dp = list(G.parameters()), list(D.parameters())
    grads = torch.autograd.grad(zero_sum_f(G, D, pair.x, pair.z), gp + dp, create_graph=True)
    grad_g, grad_d = grads[: len(gp)], grads[len(gp) :]
    c = [torch.randn_like(p) for p in dp]

    def product() -> object:
        bt = torch.autograd.grad(grad_d, gp, grad_outputs=c, retain_graph=True)
        return torch._foreach_add(c, torch.autograd.grad(grad_g, dp, grad_outputs=bt, retain_graph=True), alpha=LR**2)

    return product


def cgd_step(pair: Pair, iterations: int) -> Callable[[], object]:
    return zero_sum_step(pair, lambda: gameopt.CGD(LR, tol=1e-300, maxiter=iterations, zero_sum=True))


def check_references(pair: Pair) -> None:
    """The bare LA/LOLA/SOS and CGD take the same steps as gameopt's."""
    cases = [(bare_shaping(pair, m), gameopt_step(pair, make), m) for m, make in SHAPING.items()]
    cases.append((bare_cgd(pair, 3), cgd_step(pair, 3), "CGD"))
    for theirs, ours, name in cases:
        for _ in range(2):
            theirs()
            ours()
        game = ours.game  # type: ignore[attr-defined]
        a = torch.cat([p.detach().reshape(-1) for pl in game.players for p in pl.module.parameters()])
        b = torch.cat([p.detach().reshape(-1) for p in theirs.params])  # type: ignore[attr-defined]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=f"{name} bare differs from gameopt")


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
    """Reverse passes (runs of autograd's engine) in one step on an n-player quadratic game."""
    from torch.autograd.variable import Variable

    from gameopt_players.quadratic import QuadraticPlayer, random_quadratic_game

    qg = random_quadratic_game(n_players, 3, seed=0)
    players = [QuadraticPlayer(torch.randn(3, dtype=torch.float64)) for _ in range(n_players)]
    game = gameopt.Game(players, qg.losses(players), algorithm=SECOND_ORDER[name]())
    engine = Variable._execution_engine

    class Counting:
        n = 0

        def run_backward(self, *a, **k):  # type: ignore[no-untyped-def]
            self.n += 1
            return engine.run_backward(*a, **k)

        def __getattr__(self, attr: str) -> object:
            return getattr(engine, attr)

    counting = Counting()
    Variable._execution_engine = counting
    try:
        game.step_context.problem.forward_mode.ok = True
        game.step()
    finally:
        Variable._execution_engine = engine
    return counting.n


def peak_table(pair: Pair) -> dict[str, float]:
    """Peak memory of a warm step of general-sum SGA and consensus, gameopt's and the references'."""
    n = sum(p.numel() for m in pair.fresh() for p in m.parameters())
    steps = {
        "gameopt SGA": gameopt_step(pair, SECOND_ORDER["SGA"]),
        "bare SGA (double-vjp)": bare_general_sga(pair),
        "gameopt SGA, jvp='forward'": gameopt_step(pair, lambda: gameopt.SGA(LR, jvp="forward")),
        "bare SGA (forward-over-reverse)": bare_general_sga(pair, forward=True),
        "gameopt Consensus": gameopt_step(pair, SECOND_ORDER["Consensus"]),
        "Consensus by hand": by_hand(pair, "Consensus"),
    }
    for fn in steps.values():
        fn()
        fn()
    return {name: peak_vectors(fn, n) for name, fn in steps.items()}


def main(argv: list[str] | None = None) -> list[Result]:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="mlp-2d,deep-narrow", help="comma-separated pairs (default: %(default)s)")
    parser.add_argument("--methods", default=None, help="comma-separated methods, e.g. HamiltonianGD,Consensus")
    parser.add_argument(
        "--paths", default="zero_sum,general", help="zero-sum pairs: gameopt paths to time (default: %(default)s)"
    )
    parser.add_argument(
        "--target", type=float, default=None, help="seconds per timed sample (default: 0.06; 0.02 with --quick)"
    )
    args = parser.parse_args(argv)
    setup(args)
    rounds = args.rounds or (5 if args.quick else 15)
    target = args.target or (0.02 if args.quick else 0.06)
    kinds = [k for k in ("mlp-2d", "deep-narrow") if k in args.pairs.split(",")]
    chosen = None if args.methods is None else set(args.methods.split(","))
    wanted = lambda name: chosen is None or name in chosen  # noqa: E731
    every_path = ((True, "zero_sum=True", "zero_sum"), (False, "general path", "general"))
    paths = [(zs, label) for zs, label, key in every_path if key in args.paths.split(",")]
    results: list[Result] = []
    for kind in kinds:
        pair = Pair(kind)
        check_bare(pair)
        group = f"{kind} zero-sum"
        for name, make in ZERO_SUM.items():
            if not wanted(name):
                continue
            ref = bare(pair, name)
            for zs, label in paths:
                step = zero_sum_step(pair, lambda make=make, zs=zs: make(zs))
                batch = calibrate(ref, step, target_s=target)
                r = compare(group, f"gameopt {name} {label}", f"bare {name}", ref, step, rounds=rounds, batch=batch)
                results.append(r)
                print(f"{group:<22} {name + ' ' + label:<34} {r.ratio:6.3f}x bare", flush=True)
        if not wanted("SGA"):
            continue
        seq, bat = bare(pair, "SGA"), bare(pair, "SGA", batched=True)
        batch = calibrate(seq, bat, target_s=target)
        r = compare(group, "bare SGA, batched products", "bare SGA", seq, bat, rounds=rounds, batch=batch)
        r.note = "is_grads_batched=True double backward / two sequential HVPs"
        results.append(r)
        print(f"{group:<22} {'bare SGA batched / sequential':<34} {r.ratio:6.3f}x", flush=True)

    def measure(group: str, name: str, base: str, ref: Callable[[], object], step: Callable[[], object], note: str):
        batch = calibrate(ref, step, target_s=target)
        r = compare(group, name, base, ref, step, rounds=rounds, batch=batch, note=note)
        results.append(r)
        print(f"{group:<22} {name:<40} {r.ratio:6.3f}x {base}", flush=True)

    for kind in kinds if any(map(wanted, (*SHAPING, "CGD"))) else ():
        pair = Pair(kind)
        check_references(pair)
        for name, make in SHAPING.items():
            if not wanted(name):
                continue
            note = "general-sum losses; the same reverse passes (2 per player, SOS 3)"
            measure(kind, f"gameopt {name}", f"bare {name}", bare_shaping(pair, name), gameopt_step(pair, make), note)
        if not wanted("CGD"):
            continue
        group = f"{kind} zero-sum"
        note = "c + η² B Bᵀ c on a kept graph: two Hessian-vector products"
        ours, ref = krylov_product(pair, ours=True), krylov_product(pair, ours=False)
        measure(group, "gameopt CGD Krylov product", "bare Krylov product", ref, ours, note)
        note = "warm-started CG, at most 5 iterations (fewer where r = 0)"
        measure(group, "gameopt CGD zero_sum (5 CG iterations)", "bare CGD", bare_cgd(pair, 5), cgd_step(pair, 5), note)
    peaks: list[tuple[Pair, dict[str, float]]] = []
    for kind in kinds if any(wanted(name.split()[0]) for name in (*SECOND_ORDER, *ZERO_SUM_ONLY)) else ():
        pair = Pair(kind)
        check_by_hand(pair)
        xi = plain_xi(pair)
        for name, make in SECOND_ORDER.items():
            if not wanted(name.split()[0]):
                continue
            step = gameopt_step(pair, make, restart_every=16)  # CGD diverges on the deep narrow pair
            batch = calibrate(xi, step, target_s=target)
            r = compare(kind, f"gameopt {name}", "plain xi", xi, step, rounds=rounds, batch=batch)
            results.append(r)
            print(f"{kind:<12} {name:<26} {r.ratio:6.2f}x xi", flush=True)
        for name, make in ZERO_SUM_ONLY.items():
            if not wanted(name.split()[0]):
                continue
            step = zero_sum_step(pair, make)
            batch = calibrate(xi, step, target_s=target)
            r = compare(kind, f"gameopt {name}", "plain xi", xi, step, rounds=rounds, batch=batch)
            r.note = "zero-sum pair (−f, f)"
            results.append(r)
            print(f"{kind:<12} {name:<26} {r.ratio:6.2f}x xi", flush=True)
        for method in filter(wanted, ("Consensus", "SGA")):
            fn = by_hand(pair, method)
            batch = calibrate(xi, fn, target_s=target)
            r = compare(kind, f"ref: {method} by hand", "plain xi", xi, fn, rounds=rounds, batch=batch)
            r.note = "unfused; create_graph ξ, grad of ½‖ξ‖²" + (", double-vjp Jξ" if method == "SGA" else "")
            results.append(r)
            print(f"{kind:<12} {'ref: ' + method + ' by hand':<26} {r.ratio:6.2f}x xi", flush=True)
        if wanted("SGA"):
            ref = bare_general_sga(pair)
            note = "unfused; Jᵀξ the value of the create_graph pass of ⟨ξ, u⟩, Jξ = ∂/∂u ⟨Jᵀu, ξ⟩"
            measure(kind, "ref: bare SGA", "plain xi", xi, ref, note)
            ours = gameopt_step(pair, SECOND_ORDER["SGA"])
            measure(kind, "gameopt SGA / bare SGA", "bare SGA", ref, ours, "general-sum losses, both double-vjp")
            note = "Jᵀξ = grad of ½‖ξ‖², Jξ forward-over-reverse (losses re-run with dual parameters)"
            fwd = bare_general_sga(pair, True)
            measure(kind, "bare SGA, forward-over-reverse Jξ / bare", "bare SGA", ref, fwd, note)
            ours = gameopt_step(pair, lambda: gameopt.SGA(LR, jvp="forward"))
            note = "both forward-over-reverse, ξ's graph freed first"
            measure(kind, "gameopt SGA jvp='forward' / bare fwd", "bare SGA, forward-over-reverse", fwd, ours, note)
            peaks.append((pair, peak_table(pair)))
    if wanted("ACGD"):
        res, diff = acgd_pair(rounds, target)
        res.note = f"max relative iterate difference after the run: {diff:.1e}"
        results.append(res)
    print_table(results, "Second-order step cost (ratio to one plain xi; ACGD: gameopt / cgds)")
    if wanted("ACGD"):
        print(f"ACGD: gameopt is {1 / res.ratio:.2f}x faster per step than cgds; iterates agree to {diff:.1e} (rel.)")
    for pair, peak in peaks:
        print(f"peak memory of a warm step above the memory before it, {pair.describe()}, in parameter vectors:")
        print("".join(f"  {name}: {value:.1f}\n" for name, value in peak.items()), end="")
    if any(map(wanted, SHAPING)):
        print("\nreverse passes (runs of autograd's engine) per step on an n-player quadratic game:")
        print(f"{'n players':<12}" + "".join(f"{n:>8}" for n in (2, 4, 8, 16)))
        for name in filter(wanted, SHAPING):
            counts = [backward_passes(name, n) for n in (2, 4, 8, 16)]
            print(f"{name:<12}" + "".join(f"{c:>8}" for c in counts))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "second_order_quick" if args.quick else "second_order"
    partial = chosen is not None or len(kinds) < 2 or len(paths) < 2
    save_csv(results, out / f"{stem}{'_selected' if partial else ''}.csv")
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
