"""A GAN on a ring of Gaussians whose players are sharded with FSDP2: each rank holds
a shard of every parameter, its gradient and the algorithm's state, and a half (a
1/N-th) of each batch.

torchrun --nproc-per-node 2 -m experiments.sharded_gan                        # 2 ranks, gloo on CPU
torchrun --nproc-per-node 2 -m experiments.sharded_gan --checkpoint-every 100
torchrun --nproc-per-node 2 -m experiments.sharded_gan --checkpoint-every 100 --resume
python -m experiments.sharded_gan                                             # one process (a group of one)

The generator and the discriminator are experiments.mixture_gan's networks and data
(a ring of 8 Gaussians), each sharded with ``fully_shard``: every linear layer, then
the network's MLP (the root). The game steps them with a first-order algorithm (default Extra-Adam);
every rank draws the same batch and keeps its rank-strided share, so the ranks
together take the whole batch's step. Rank 0 logs the modes covered, the share of
high-quality samples and the losses (averaged over the ranks) to metrics.csv in
--out.

Checkpoints are written with torch.distributed.checkpoint (DCP), each rank its
shards, every --checkpoint-every steps (0: none) to --out/checkpoint-<step>/;
--out/latest names the newest complete one, and --resume continues from it.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import gameopt
from experiments.common import UsageError, atomic_write, building_game, main_guard
from experiments.mixture_gan import Spec, gan_algorithm
from gameopt_players.gan2d import Discriminator, Generator, gan_losses, mode_metrics, sample_mixture

EVAL_SAMPLES = 2500


def shard(module: nn.Module) -> nn.Module:
    """``fully_shard`` every linear layer of ``module``, then ``module`` itself."""
    from torch.distributed.fsdp import fully_shard

    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(module)
    return module


def init(timeout: float) -> tuple[int, int]:
    """Join the ranks that torchrun started, or make a gloo group of one process."""
    if not dist.is_initialized():
        timeout_ = timedelta(seconds=timeout)
        if "RANK" in os.environ:
            dist.init_process_group("gloo", timeout=timeout_)
        else:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=timeout_
            )
    return dist.get_rank(), dist.get_world_size()


class Setup:
    """The sharded networks, the game, the data stream and the evaluation noise."""

    def __init__(self, spec: Spec, algorithm: gameopt.Algorithm, seed: int, rank: int, world: int) -> None:
        self.spec, self.rank, self.world = spec, rank, world
        self.modes = spec.modes()
        torch.manual_seed(seed)  # the same initial networks on every rank, before sharding
        net = {"hidden": spec.hidden, "depth": spec.depth, "act": spec.activation, "init": spec.init}
        self.gen, self.disc = Generator(latent=spec.latent, **net), Discriminator(**net)
        # the MLPs inside: the discriminator's squeeze(-1) after its MLP is a view, which FSDP warns of on a root
        shard(self.gen.net)
        shard(self.disc.net)
        gen, disc = self.gen, self.disc
        self.game = gameopt.Game(
            [gameopt.Player(gen, name="generator"), gameopt.Player(disc, name="discriminator")],
            lambda x, z: gan_losses(gen, disc, x, z),
            algorithm=algorithm,
        )
        self.data = torch.Generator().manual_seed(seed)  # the same draws on every rank
        self.z_eval = torch.randn(EVAL_SAMPLES, spec.latent, generator=torch.Generator().manual_seed(10_007 + seed))

    def step(self) -> tuple[float, float]:
        """One step on this rank's share of the batch; the losses averaged over the ranks."""
        x = sample_mixture(self.modes, self.spec.batch, self.spec.std, self.data)
        z = torch.randn(self.spec.batch, self.spec.latent, generator=self.data)
        x, z = x[self.rank :: self.world], z[self.rank :: self.world]
        losses = torch.stack([loss.detach() for loss in self.game.step(x, z)])
        dist.all_reduce(losses)  # (gloo has no AVG)
        g_loss, d_loss = (losses / self.world).tolist()
        return g_loss, d_loss

    def evaluate(self) -> dict[str, float]:
        """Modes covered and high-quality samples of the generator (every rank runs
        its forward: FSDP all-gathers its parameters)."""
        with torch.no_grad():
            samples = self.gen(self.z_eval)
        covered, quality = mode_metrics(samples, self.modes, self.spec.std)
        return {"modes": covered, "high_quality": quality}

    def checkpoint_state(self, step: int) -> dict[str, Any]:
        """What a checkpoint holds (and what ``dcp.load`` fills in place)."""
        return {"game": self.game.state_dict(), "data": self.data.get_state(), "step": step}


def save(setup: Setup, out: Path, step: int) -> None:
    """A DCP checkpoint of the game (each rank its shards) after ``step`` steps; then
    rank 0 names it in ``latest``."""
    import torch.distributed.checkpoint as dcp

    name = f"checkpoint-{step}"
    dcp.save(setup.checkpoint_state(step), checkpoint_id=str(out / name))
    dist.barrier()  # every rank's shards are written
    if setup.rank == 0:
        atomic_write(out / "latest", name.encode())


def resume(setup: Setup, out: Path) -> int:
    """Load the checkpoint ``latest`` names; the steps it was taken after."""
    import torch.distributed.checkpoint as dcp

    latest = out / "latest"
    if not latest.is_file():
        raise UsageError(f"--resume: no checkpoint in {str(out)!r} (no file 'latest')")
    state = setup.checkpoint_state(0)
    dcp.load(state, checkpoint_id=str(out / latest.read_text().strip()))
    setup.game.load_state_dict(state["game"])
    setup.data.set_state(state["data"])
    return int(state["step"])


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithm", default="extraadam", help="a first-order algorithm (default extraadam)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    p.add_argument("--steps", type=int, default=1000, help="total steps (default 1000)")
    p.add_argument("--batch", type=int, default=128, help="the whole batch, split across the ranks (default 128)")
    p.add_argument("--hidden", type=int, default=128, help="hidden width of both networks (default 128)")
    p.add_argument("--depth", type=int, default=3, help="hidden layers of both networks (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=100, help="steps between evaluations (default 100)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between DCP checkpoints (default 0: none)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint that --out/latest names")
    p.add_argument("--out", type=Path, default=Path("runs/sharded_gan"), help="folder for metrics and checkpoints")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a rank waits in a collective (default 600)")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "hidden", "depth", "log_every", "timeout"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.checkpoint_every < 0:
        raise UsageError(f"--checkpoint-every must be non-negative, got {args.checkpoint_every}")
    torch.set_num_threads(1)
    rank, world = init(args.timeout)
    try:
        if args.batch % world:
            raise UsageError(f"--batch {args.batch} does not split evenly across {world} ranks")
        spec = Spec("ring", batch=args.batch, hidden=args.hidden, depth=args.depth)
        with building_game():
            setup = Setup(spec, gan_algorithm(args.algorithm, args.lr), args.seed, rank, world)
        args.out.mkdir(parents=True, exist_ok=True)
        start = resume(setup, args.out) if args.resume else 0
        metrics = args.out / "metrics.csv"
        if rank == 0:  # the rows up to the checkpoint resumed from (a fresh file otherwise)
            rows = metrics.read_text().splitlines()[1:] if args.resume and metrics.is_file() else []
            kept = [row for row in rows if int(row.split(",")[0]) <= start]
            metrics.write_text("\n".join(["step,modes,high_quality,g_loss,d_loss,seconds", *kept]) + "\n")
        t0 = time.perf_counter()
        for step in range(start + 1, args.steps + 1):
            g_loss, d_loss = setup.step()
            if step % args.log_every == 0 or step == args.steps:
                m = setup.evaluate()
                if rank == 0:
                    line = f"{step},{m['modes']},{m['high_quality']:.2f},{g_loss:.5f},{d_loss:.5f}"
                    with metrics.open("a") as f:
                        f.write(f"{line},{time.perf_counter() - t0:.2f}\n")
                    print(
                        f"step {step:>6}  modes {m['modes']}/{len(setup.modes)}  high quality "
                        f"{m['high_quality']:5.1f}%  g_loss {g_loss:.4f}  d_loss {d_loss:.4f}",
                        flush=True,
                    )
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save(setup, args.out, step)
        if rank == 0:
            print(f"{args.algorithm} on {world} rank(s), {args.steps} steps: {time.perf_counter() - t0:.1f} s")
        # the networks, the game and FSDP's state hold the process group's objects: let them
        # go while the interpreter is whole, not in its finalization (where gloo's threads
        # may be torn down unjoined: "terminate called without an active exception")
        del setup
        gc.collect()
        dist.barrier()  # every rank done before any closes its connections (gloo may abort a rank otherwise)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
