"""What an iteration of opponent shaping on DiCE losses costs, in multiples of a
naive policy-gradient iteration (SimGD on the same losses), on the IPD of
``experiments.ipd_dice`` (150 rounds, batch 512 per agent, each agent's
objective from its own batch; sampling the episodes included, as in training).

Each method's ``game.step()`` is timed interleaved with the naive one, and the
median of the per-round ratios is reported.

    python3 -m benchmarks.dice_cost [--quick] [--rounds N] [--threads N]
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks._common import base_parser, log_result, measure, print_table, save_csv, setup, spec
from experiments.ipd_dice import BATCH, LR_OUTER, ROUNDS, algorithm_for, build


def step_of(name: str, batch: int, rounds: int, independent: bool):
    game, _, _ = build(algorithm_for(name, LR_OUTER, {}), 0, batch, rounds, independent)
    return game.step


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__)
    p.add_argument("--batches", choices=("independent", "shared"), default="independent")
    args = p.parse_args(argv)
    setup(args)
    batch, rounds = (64, 20) if args.quick else (BATCH, ROUNDS)
    n_rounds = args.rounds or (4 if args.quick else 15)
    independent = args.batches == "independent"
    torch.manual_seed(args.seed)
    specs = []
    for name in ("naive", "la", "lola", "sos"):
        specs.append(
            spec(
                "ipd-dice",
                name,
                "naive",
                step_of("naive", batch, rounds, independent),
                step_of(name, batch, rounds, independent),
                note=f"{args.batches} batches",
                desc=f"IPD {rounds} rounds, batch {batch}",
                rounds=n_rounds,
                target=0.05 if args.quick else 0.3,
                max_s=20 if args.quick else 120,
            )
        )
    results = measure(specs, retries=args.retries or 0, budget_s=args.retry_budget, log=log_result)
    print_table(results, "Time per iteration / naive policy-gradient iteration", ratio_label="x naive")
    if not args.quick:
        save_csv(results, Path(args.out) / "dice_cost.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
