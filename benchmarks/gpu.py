"""The step-cost table on a CUDA GPU, with realistic sizes (run by ``benchmarks/gpu.sh``).

* a DCGAN-size pair (64×64 images, latent 100, 64 base channels: about 3.6M
  generator and 2.8M discriminator parameters, batch 64): each algorithm's step
  time as a multiple of the hand-fused plain ξ (as in ``step_cost``; SimGD,
  extragradient and Extra-Adam also with ``Game(verdict="device")``), extragradient
  written the obvious way with ``torch._foreach_*``, cooper's ExtraSGD/ExtraAdam
  when installed, general-sum SGA in plain PyTorch (double-vjp and
  forward-over-reverse Jξ, ``second_order.bare_sga``), and the peak memory of a
  warm step above the memory before it (``torch.cuda.max_memory_allocated``; on
  the CPU the profiler's allocations) in parameter vectors;
* bare hand-written rows beside the gameopt ones (``benchmarks/bare.py``): SimGD
  with ``torch._foreach_add_``, Extra-Adam with ``torch.optim.Adam(foreach=True)``,
  consensus with one more reverse pass, and on CUDA the bare SimGD step captured
  whole in a CUDA graph (what a captured step is measured against);
* per-step counts of a step's kernel launches, device-to-device copies and host
  syncs, gameopt beside the bare step (on CUDA from the profiler and
  ``torch.cuda.set_sync_debug_mode``; on the CPU, ATen ops from
  ``gameopt.testing.traffic``);
* SimGD on the DCGAN pair with ξ left in pieces (``gameopt.vec.Pieces``,
  below the device's threshold of 2²¹ elements per tensor, an estimate that these rows
  measure) and with ξ copied into the gradient buffer, and Extra-Adam with ξ in
  pieces (Adam reading it there: ``gameopt.vec.RULE_PIECES_MIN``);
* bilinear games of 10^8 and 10^9 parameters per player (10^6 and 10^7 with
  ``--quick`` or on the CPU): a gameopt SimGD step against the bare one, and up to
  2²⁷ elements per player (where a step leaves ξ in pieces) with ξ copied into the buffer;
* the bandwidth test: 10^8 parameters in a Player, the fused axpy and a gameopt
  SimGD step's vector math against the single-tensor ``add_``, in GB/s.

Every call is followed by ``torch.cuda.synchronize()``; comparisons are interleaved.

    python3 -m benchmarks.gpu [--device cuda] [--quick] [--out DIR]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import gameopt
from gameopt.autodiff import xi as first_order_xi
from gameopt.testing.traffic import count

from . import bare as bare_steps
from ._common import Result, base_parser, calibrate, compare, print_table, save_csv
from .second_order import bare_sga, peak_vectors
from .step_cost import STYLES, hand_fuse


def dcgan(nz: int = 100, ch: int = 64, size: int = 64) -> tuple[nn.Module, nn.Module]:
    """The DCGAN generator and discriminator (Radford et al. 2016) for ``size``² RGB images."""
    n_up = {64: 4, 32: 3, 16: 2}[size]
    mult = 2 ** (n_up - 1)
    g: list[nn.Module] = [nn.ConvTranspose2d(nz, ch * mult, 4, 1, 0, bias=False), nn.BatchNorm2d(ch * mult), nn.ReLU()]
    for _ in range(n_up - 1):
        g += [nn.ConvTranspose2d(ch * mult, ch * mult // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ch * mult // 2)]
        g.append(nn.ReLU())
        mult //= 2
    g += [nn.ConvTranspose2d(ch, 3, 4, 2, 1, bias=False), nn.Tanh()]
    d: list[nn.Module] = [nn.Conv2d(3, ch, 4, 2, 1, bias=False), nn.LeakyReLU(0.2)]
    mult = 1
    for _ in range(n_up - 1):
        d += [nn.Conv2d(ch * mult, ch * mult * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ch * mult * 2)]
        d.append(nn.LeakyReLU(0.2))
        mult *= 2
    d += [nn.Conv2d(ch * mult, 1, 4, 1, 0, bias=False), nn.Flatten()]
    return nn.Sequential(*g), nn.Sequential(*d)


def losses_of(G: nn.Module, D: nn.Module) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    def losses(x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        fake = G(z)
        d_real, d_fake = D(x), D(fake)
        return F.softplus(-d_fake).mean(), F.softplus(-d_real).mean() + F.softplus(d_fake).mean()

    return losses


ALGORITHMS: dict[str, Callable[[], gameopt.Algorithm]] = {
    "SimGD": lambda: gameopt.SimGD(1e-4),
    "Optimistic": lambda: gameopt.Optimistic(1e-4),
    "Extragradient": lambda: gameopt.Extragradient(1e-4),
    "SimGD+Adam": lambda: gameopt.SimGD(1e-4, update=gameopt.Adam((0.5, 0.999))),
    "Extra-Adam": lambda: gameopt.Extragradient(1e-4, update=gameopt.Adam((0.5, 0.999))),
    "Consensus": lambda: gameopt.ConsensusOptimization(1e-4, gamma=0.1),
    "SGA": lambda: gameopt.SGA(1e-4),
    "SGA jvp='forward'": lambda: gameopt.SGA(1e-4, jvp="forward"),
}
#: timed again with the step's verdict kept on the device (``Game(verdict="device")``: no host sync)
DEVICE_VERDICT = ("SimGD", "Extragradient", "Extra-Adam")


@contextlib.contextmanager
def pieces_from(elements: int) -> Iterator[None]:
    """A plain step leaves ξ in pieces (``gameopt.vec.Pieces``, no copy into the gradient
    buffer) from ``elements`` per tensor on average, on the CPU and off it (the
    thresholds ``PIECES_MIN`` and ``DEVICE_PIECES_MIN``, whose device value is an
    estimate that these rows measure)."""
    saved = first_order_xi.PIECES_MIN, first_order_xi.DEVICE_PIECES_MIN, gameopt.vec.RULE_PIECES_MIN
    first_order_xi.PIECES_MIN = first_order_xi.DEVICE_PIECES_MIN = gameopt.vec.RULE_PIECES_MIN = elements
    try:
        yield
    finally:
        first_order_xi.PIECES_MIN, first_order_xi.DEVICE_PIECES_MIN, gameopt.vec.RULE_PIECES_MIN = saved


def with_pieces_from(elements: int, fn: Callable[[], object]) -> Callable[[], object]:
    def call() -> object:
        with pieces_from(elements):
            return fn()

    return call


def synced(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    if device.type != "cuda":
        return fn

    def call() -> object:
        out = fn()
        torch.cuda.synchronize(device)
        return out

    return call


def dcgan_table(device: torch.device, quick: bool, rounds: int, target: float) -> tuple[list[Result], list[str]]:
    torch.manual_seed(0)
    size = 32 if quick else 64
    G0, D0 = dcgan(size=size)
    batch = 16 if quick else 64
    x = torch.randn(batch, 3, size, size, device=device)
    z = torch.randn(batch, 100, 1, 1, device=device)
    n_params = sum(p.numel() for p in G0.parameters()) + sum(p.numel() for p in D0.parameters())
    desc = f"DCGAN {size}x{size} ({n_params / 1e6:.1f}M params, batch {batch})"

    def fresh() -> tuple[nn.Module, nn.Module]:
        G, D = dcgan(size=size)
        G.load_state_dict(G0.state_dict())
        D.load_state_dict(D0.state_dict())
        return G.to(device), D.to(device)

    G, D = fresh()
    (_, gg, gp), (_, dg, dp) = hand_fuse(G), hand_fuse(D)
    plain_losses = losses_of(G, D)

    def xi() -> None:
        gg.zero_()
        dg.zero_()
        lg, ld = plain_losses(x, z)
        torch.autograd.backward(lg, inputs=gp, retain_graph=True)
        torch.autograd.backward(ld, inputs=dp)

    cands: dict[str, Callable[[], object]] = {"A/A: plain xi vs itself": xi}
    games: dict[str, gameopt.Game] = {}
    for name, make in ALGORITHMS.items():
        Gi, Di = fresh()
        game = gameopt.Game([Gi, Di], losses_of(Gi, Di), algorithm=make())
        games[name] = game
        cands[f"gameopt {name}"] = lambda game=game: game.step(x, z)
    for name in DEVICE_VERDICT:
        Gi, Di = fresh()
        game = gameopt.Game([Gi, Di], losses_of(Gi, Di), algorithm=ALGORITHMS[name](), verdict="device")
        cands[f"gameopt {name}, device verdict"] = lambda game=game: game.step(x, z)
    # (the device's thresholds: estimates) Extra-Adam's rule reads ξ in pieces too
    pieces_rows = (("SimGD", "in pieces", 0), ("SimGD", "copied", 1 << 62), ("Extra-Adam", "in pieces", 0))
    for name, label, elements in pieces_rows:
        Gi, Di = fresh()
        game = gameopt.Game([Gi, Di], losses_of(Gi, Di), algorithm=ALGORITHMS[name]())
        cands[f"gameopt {name}, ξ {label}"] = with_pieces_from(elements, lambda game=game: game.step(x, z))
    Go, Do = fresh()
    params, gps, dps, obvious_losses = (
        list(Go.parameters()) + list(Do.parameters()),
        list(Go.parameters()),
        list(Do.parameters()),
        losses_of(Go, Do),
    )
    ops = STYLES["foreach"]

    def obvious_eg() -> None:
        def grads() -> list[Tensor]:
            lg, ld = obvious_losses(x, z)
            return list(torch.autograd.grad(lg, gps, retain_graph=True) + torch.autograd.grad(ld, dps))

        g1 = grads()
        with torch.no_grad():
            saved = ops.copy(params)
            ops.axpy_(params, -1e-4, g1)
        g2 = grads()
        with torch.no_grad():
            ops.load_(params, saved)
            ops.axpy_(params, -1e-4, g2)

    cands["ref: Extragradient, foreach"] = obvious_eg
    refs = {
        "ref: SimGD, foreach": bare_steps.simgd(*fresh(), losses_of, x, z, 1e-4),
        "ref: Extra-Adam, torch.optim.Adam foreach": bare_steps.extra_adam(
            *fresh(), losses_of, x, z, 1e-4, (0.5, 0.999)
        ),
        "ref: Consensus, bare": bare_steps.consensus(*fresh(), losses_of, x, z, 1e-4, 0.1),
    }
    cands |= refs
    if device.type == "cuda":  # the bare step captured whole: what a captured gameopt step must beat
        cands["ref: SimGD, foreach, captured"] = bare_steps.captured(bare_steps.simgd(*fresh(), losses_of, x, z, 1e-4))
    bare = {  # SGA in plain PyTorch (benchmarks.second_order.bare_sga)
        "ref: SGA bare, double-vjp": bare_sga(*fresh(), losses_of, x, z),
        "ref: SGA bare, forward-over-reverse": bare_sga(*fresh(), losses_of, x, z, forward=True),
    }
    cands |= bare
    try:
        import cooper

        for kind in ("ExtraSGD", "ExtraAdam"):
            Gc, Dc = fresh()
            gc, dc = list(Gc.parameters()), list(Dc.parameters())
            cls = getattr(cooper.optim, kind)
            opts = [cls(gc, lr=1e-4), cls(dc, lr=1e-4)]
            lc = losses_of(Gc, Dc)

            def cooper_step(opts=opts, gc=gc, dc=dc, lc=lc) -> None:
                for stage in ("extrapolation", "step"):
                    for o in opts:
                        o.zero_grad()
                    lg, ld = lc(x, z)
                    torch.autograd.backward(lg, inputs=gc, retain_graph=True)
                    torch.autograd.backward(ld, inputs=dc)
                    for o in opts:
                        getattr(o, stage)()

            cands[f"ref: cooper {kind}"] = cooper_step
    except ImportError:
        pass
    base = synced(xi, device)
    results = []
    for name, fn in cands.items():
        fn = synced(fn, device)
        b = calibrate(base, fn, target_s=target)
        r = compare(desc, name, "plain xi", base, fn, rounds=rounds, batch=b)
        print(f"  {name:34s} ratio {r.ratio:6.3f}  ({r.cand_us:9.1f} us vs {r.base_us:9.1f} us)", flush=True)
        results.append(r)
    notes = ["  per step: kernel launches, device-to-device copies, host syncs (gameopt / bare)"]
    pairs = {
        "SimGD": "ref: SimGD, foreach",
        "Extragradient": "ref: Extragradient, foreach",
        "Extra-Adam": "ref: Extra-Adam, torch.optim.Adam foreach",
    }
    for name, ref in pairs.items():
        theirs = step_counts(cands[ref], device)
        for label in (name, f"{name}, device verdict"):
            mine = step_counts(cands[f"gameopt {label}"], device)
            cells = ", ".join(f"{k} {mine[k]} / {theirs[k]}" for k in mine)
            notes.append(f"  {label:36s} {cells}")
    steps = {name: lambda game=game: game.step(x, z) for name, game in games.items()} | bare
    for name, step in steps.items():
        step()
        vectors = peak(step, device, n_params)
        notes.append(f"  {name:36s} peak of a warm step above the memory before it: {vectors:5.2f} vectors")
    return results, notes


def step_counts(step: Callable[[], object], device: torch.device) -> dict[str, int]:
    """One warm call of ``step``: its kernel launches, device-to-device copies and host
    syncs. On CUDA: the CUDA runtime's launch calls and the device's DtoD memcpys in
    the profiler's trace, and the warnings of ``torch.cuda.set_sync_debug_mode("warn")``
    (one per synchronizing call). On the CPU: the ATen ops, copies and syncs that
    :mod:`gameopt.testing.traffic` counts."""
    if device.type != "cuda":
        c = count(step, big=1, warmup=1)
        return {"launches": c.ops, "copies": c.copies, "syncs": c.syncs}
    import warnings

    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in seen)
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    names = [e.name for e in prof.events()]
    launches = sum(n.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch")) for n in names)
    copies = sum("DtoD" in n for n in names)
    return {"launches": launches, "copies": copies, "syncs": syncs}


def bilinear_table(device: torch.device, quick: bool, rounds: int, target: float) -> list[Result]:
    """f(x, y) = Σ xᵢyᵢ with n parameters per player: a gameopt SimGD step against the
    bare one (``autograd.grad`` per player, ``torch._foreach_add_``), where a step is
    all memory traffic. Each size's tensors are freed before the next is made."""
    sizes = [10**6, 10**7] if quick or device.type != "cuda" else [10**8, 10**9]
    results = []
    for n in sizes:
        results += bilinear_row(device, n, rounds, target)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def bilinear_row(device: torch.device, n: int, rounds: int, target: float) -> list[Result]:
    """gameopt's SimGD step, as it is and with ξ copied into the gradient buffer (a
    player of up to 2²⁷ elements leaves it in pieces), against the bare step."""
    torch.manual_seed(0)
    x, y = (nn.Parameter(torch.randn(n, device=device) * 0.01) for _ in range(2))
    xb, yb = (nn.Parameter(p.detach().clone()) for p in (x, y))

    def losses() -> tuple[Tensor, Tensor]:
        f = (x * y).sum()
        return f, -f

    game = gameopt.Game([gameopt.Player([x]), gameopt.Player([y])], losses, algorithm=gameopt.SimGD(1e-9))

    def bare_losses() -> tuple[Tensor, Tensor]:
        f = (xb * yb).sum()
        return f, -f

    base = synced(bare_steps.simgd_of(bare_losses, [xb], [yb], 1e-9), device)
    results = []
    rows = [("gameopt SimGD", synced(game.step, device))]
    if n <= first_order_xi.DEVICE_CAPTURE_MAX:  # (a larger player's ξ goes through .grad: copied)
        rows.append(("gameopt SimGD, ξ copied", synced(with_pieces_from(1 << 62, game.step), device)))
    for label, fn in rows:
        b = calibrate(base, fn, target_s=target)
        r = compare(f"bilinear, {n:.0e} params per player", label, "bare SimGD", base, fn, rounds=rounds, batch=b)
        print(
            f"  bilinear {n:.0e}: {label:24s} ratio {r.ratio:6.3f}  ({r.cand_us:9.1f} us vs {r.base_us:9.1f} us)",
            flush=True,
        )
        results.append(r)
    return results


def peak(step: Callable[[], object], device: torch.device, n_params: int) -> float:
    """The peak memory of one call of ``step`` above the memory before it, in float32
    vectors of ``n_params`` (on the CPU, from the profiler's allocations)."""
    if device.type != "cuda":
        return peak_vectors(step, n_params)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / (4 * n_params)


def bandwidth(device: torch.device, quick: bool, rounds: int, target: float) -> list[Result]:
    n = 10**6 if quick else 10**8
    torch.manual_seed(0)
    m = nn.ParameterList([nn.Parameter(torch.randn(n // 4, device=device) * 0.01) for _ in range(4)])
    player = gameopt.Player(m)
    flat, grad = player.flat_param, player.grad
    grad.normal_()
    a, b = torch.randn(n, device=device), torch.randn(n, device=device)
    limit = synced(lambda: a.add_(b, alpha=1e-9), device)
    fused = synced(lambda: flat.add_(grad, alpha=1e-9), device)
    results = []
    for name, fn in (("fused axpy on a Player (4 tensors)", fused),):
        bt = calibrate(limit, fn, target_s=target)
        r = compare(f"bandwidth, {n:.0e} params", name, "single-tensor add_", limit, fn, rounds=rounds, batch=bt)
        gbs = 3 * 4 * n / (r.cand_us * 1e-6) / 1e9
        r.note = f"{gbs:.0f} GB/s (3 x 4 bytes per element)"
        print(f"  {name:34s} ratio {r.ratio:6.3f}  {r.note}", flush=True)
        results.append(r)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: benchmarks.gpu needs one (or --device cpu for a dry run)")
    torch.manual_seed(args.seed)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, device {name}, quick={args.quick}", flush=True)
    rounds = args.rounds or (4 if args.quick else 10)
    target = 0.01 if args.quick else 0.05
    results, notes = dcgan_table(device, args.quick, rounds, target)
    results += bilinear_table(device, args.quick, rounds, target)
    results += bandwidth(device, args.quick, rounds, target)
    print_table(results, f"step time / plain ξ on {name} (interleaved, median of per-round ratios)")
    for line in notes:
        print(line)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_csv(results, out / f"gpu{'_quick' if args.quick else ''}.csv")


if __name__ == "__main__":
    main()
