"""The iterated prisoner's dilemma with policy gradients: LOLA-DiCE and friends
(Foerster et al. 2018, "DiCE: The Infinitely Differentiable Monte-Carlo
Estimator", Section 5, https://arxiv.org/abs/1802.05098).

Each agent's loss is the negated DiCE objective (``gameopt.dice.objective``) of
sampled episodes, so gameopt's LA, LOLA and SOS shape their opponents from
sampled returns instead of the exact discounted losses of
``experiments.opponent_shaping``.

The setup, and where each value comes from (the paper's Section 5 and the
authors' code, alshedivat/lola: ``scripts/run_lola_dice.py``, ``lola_dice/rpg.py``,
``lola_dice/policy.py``, ``lola_dice/envs/prisoners_dilemma.py``):

* memory-one policies, 5 logits per agent (``SimplePolicy``: a linear map of the
  one-hot state to the cooperation logit, the defection logit fixed at 0, so
  P(C | s) = σ(θ_s)); states: the start and the previous joint move seen from the
  agent's own side (CC, CD, DC, DD), as ``players/ipd.IPDPolicy``;
* initial logits: sonnet 1's default ``Linear`` initializer, a normal of standard
  deviation 1/√5 truncated at two standard deviations;
* rewards (``payout_mat``): CC → (−1, −1), CD → (−3, 0), DC → (0, −3), DD → (−2, −2);
* episodes of 150 rounds (``IPD(max_steps=150)``), batch 512, γ = 0.96;
* plain gradient steps (``GradientDescentOptimizer``): outer learning rate 0.2,
  look-ahead (inner) learning rate 0.3 — here the LA/LOLA/SOS α;
* no value baseline (``use_baseline=False``): the discounted rewards are centred
  by their batch mean at each round, as the code does;
* each agent's objective from its own batch of episodes (the code rolls out
  separately for each agent), which also makes the products of the shaping terms
  unbiased (see ``docs/dice.md``); ``--batches shared`` uses one batch for both;
* 200 iterations (``epochs=200``), 5 runs (``runs=5``);
* the reported return: the batch mean of Σₜ γᵗ rₜ times (1 − γ), per agent
  (``rets_all`` in ``rpg.py``): −1 is mutual cooperation, −2 mutual defection.

What differs: the authors' LOLA-DiCE unrolls two look-ahead steps of the opponent,
each on freshly sampled inner episodes, and differentiates through them; gameopt's
LOLA is the first-order Taylor form of one look-ahead step (ξ − αH_oξ − αχ, as in
Foerster et al. 2018, "Learning with Opponent-Learning Awareness"), computed from
the same batch as the gradient. LA and SOS (a = 0.5, b = 0.1: Letcher et al. 2019)
are not in the DiCE paper; they run with the same η and α.

python -m experiments.ipd_dice --algorithm lola --seed 0
python -m experiments.ipd_dice --figures    # figures/ipd_dice.png and ipd_dice_results.md
"""

from __future__ import annotations

import math
import sys
import time

import torch
import torch.nn.functional as F

import gameopt
from experiments.common import (
    Run,
    UsageError,
    building_game,
    check_args,
    hyperparameters,
    lr_from_args,
    main_guard,
    make_algorithm,
    one_thread,
    run_config,
    run_pool,
    save_figure,
    write_results,
)
from experiments.common import parser as common_parser
from gameopt_players.ipd import IPDPolicy

ROUNDS, BATCH, GAMMA = 150, 512, 0.96
LR_OUTER, LR_INNER = 0.2, 0.3
ITERATIONS = 200
#: rewards of (agent 1, agent 2) by joint move, agent 1's first: CC, CD, DC, DD
REWARDS = torch.tensor([[-1.0, -1.0], [-3.0, 0.0], [0.0, -3.0], [-2.0, -2.0]])
ALGORITHMS = {"naive": "simgd", "lola": "lola", "sos": "sos", "la": "la"}
STATES = ("s0", "CC", "CD", "DC", "DD")


def initial_logits(generator: torch.Generator) -> torch.Tensor:
    """5 logits ~ N(0, 1/5) truncated at ±2 standard deviations (sonnet 1's Linear)."""
    std = 1 / math.sqrt(5)
    out = torch.randn(5, generator=generator)
    while (bad := out.abs() > 2).any():
        out[bad] = torch.randn(int(bad.sum()), generator=generator)
    return out * std


@torch.no_grad()
def sample_episodes(coop1: torch.Tensor, coop2: torch.Tensor, batch: int, rounds: int):
    """Play ``batch`` episodes at once (the global generator draws the moves).

    Args:
        coop1, coop2: each agent's P(cooperate | state), shape (5,), states in the
            agent's own order (start, CC, CD, DC, DD).

    Returns:
        (states1, states2, moves1, moves2): (rounds, batch) long tensors; a move is
        0 (cooperate) or 1 (defect), a state indexes the agent's 5 logits.
    """
    s1 = torch.zeros(batch, dtype=torch.long)
    s2 = torch.zeros(batch, dtype=torch.long)
    out = [[], [], [], []]
    for _ in range(rounds):
        u = torch.rand(2, batch)
        m1 = (u[0] >= coop1[s1]).long()
        m2 = (u[1] >= coop2[s2]).long()
        for lst, x in zip(out, (s1, s2, m1, m2)):
            lst.append(x)
        s1, s2 = 1 + 2 * m1 + m2, 1 + 2 * m2 + m1
    return tuple(torch.stack(x) for x in out)


def log_probs(policy: IPDPolicy, states: torch.Tensor, moves: torch.Tensor) -> torch.Tensor:
    """log π(move | state), (rounds, batch), with its graph to the logits."""
    return F.logsigmoid(policy.theta[states] * (1 - 2 * moves).to(policy.theta.dtype))


def dice_losses(p1: IPDPolicy, p2: IPDPolicy, batch: int, rounds: int, independent: bool):
    """The losses callable: each agent's negated DiCE objective, on its own batch of
    episodes (``independent``) or on one shared batch; the metrics are each agent's
    average discounted return per round, (1 − γ) mean Σₜ γᵗ rₜ."""
    weights = GAMMA ** torch.arange(rounds, dtype=torch.float64).unsqueeze(1)

    def losses():
        coop = (p1().detach(), p2().detach())
        batches = [sample_episodes(*coop, batch, rounds)]
        batches.append(sample_episodes(*coop, batch, rounds) if independent else batches[0])
        out, metrics = [], {}
        for i, (s1, s2, m1, m2) in enumerate(batches):
            rewards = REWARDS[2 * m1 + m2, i].to(p1.theta.dtype)  # (rounds, batch)
            logps = [log_probs(p1, s1, m1), log_probs(p2, s2, m2)]
            centred = rewards - rewards.mean(1, keepdim=True)  # the code's baseline-free estimator
            out.append(-gameopt.dice.objective(logps, centred, GAMMA))
            metrics[f"return{i + 1}"] = float((1 - GAMMA) * (weights * rewards.double()).sum(0).mean())
        return out[0], out[1], metrics

    return losses


def build(algorithm: gameopt.Algorithm, seed: int, batch: int, rounds: int, independent: bool):
    g = torch.Generator().manual_seed(seed)
    p1, p2 = IPDPolicy(initial_logits(g), dtype=torch.float32), IPDPolicy(initial_logits(g), dtype=torch.float32)
    torch.manual_seed(seed)  # the episodes' moves (the global generator: checkpointed with the run)
    game = gameopt.Game(
        [gameopt.Player(p1, name="agent1"), gameopt.Player(p2, name="agent2")],
        dice_losses(p1, p2, batch, rounds, independent),
        algorithm=algorithm,
    )
    return game, p1, p2


def policy_metrics(p1: IPDPolicy, p2: IPDPolicy) -> dict[str, float]:
    with torch.no_grad():
        return {f"pC{w}_{s}": float(v) for w, p in (("1", p1), ("2", p2)) for s, v in zip(STATES, p())}


def algorithm_for(name: str, lr, hyper: dict) -> gameopt.Algorithm:
    if name not in ALGORITHMS:
        raise UsageError(f"--algorithm must be one of {', '.join(ALGORITHMS)}, got {name!r}")
    defaults = {} if name == "naive" else {"alpha": LR_INNER}
    return make_algorithm(ALGORITHMS[name], lr, {**defaults, **hyper})


def parser():
    p = common_parser(__doc__, algorithm="lola", lr=LR_OUTER, steps=ITERATIONS, out="runs/ipd_dice")
    p.add_argument("--batch", type=int, default=BATCH, help=f"episodes per batch (default {BATCH})")
    p.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds per episode (default {ROUNDS})")
    p.add_argument(
        "--batches",
        choices=("independent", "shared"),
        default="independent",
        help="each agent's objective from its own batch (default, as the authors' code) or one shared batch",
    )
    p.add_argument("--figures", action="store_true", help="regenerate figures/ipd_dice.png and its results")
    return p


@main_guard
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.figures:
        make_figures(args.no_progress)
        return 0
    with one_thread():
        check_args(args)
        if args.batch < 1 or args.rounds < 1:
            raise UsageError("--batch and --rounds must be at least 1")
        hyper = hyperparameters(args)
        algorithm = algorithm_for(args.algorithm, lr_from_args(args), hyper)
        with building_game():
            game, p1, p2 = build(algorithm, args.seed, args.batch, args.rounds, args.batches == "independent")
        config = {
            **run_config(args, batch=args.batch, rounds=args.rounds, batches=args.batches),
            "hp": hyper,
            "gamma": GAMMA,
        }
        run = Run("ipd_dice", args, config)
        extra: dict = {}
        start = run.resume(game, extra)
        for step in run.steps(start):
            metrics = game.step().metrics
            run.log(step, {**metrics, **policy_metrics(p1, p2)})
            run.maybe_checkpoint(step, game, extra)
        final = run.rows[-1] if run.rows else {}
        run.finish({"final": final})
        mean = (final.get("return1", math.nan) + final.get("return2", math.nan)) / 2
        print(f"ipd_dice, {args.algorithm}: return per round {mean:.3f} at the last of {args.steps} iterations")
        return 0


# ------------------------------------------------------------------ figures
SEEDS = range(5)
COLORS = {"naive": "C0", "la": "C1", "lola": "C2", "sos": "C3"}


def trajectory(task: tuple[str, int]) -> dict:
    """One run of ``ITERATIONS`` steps: the returns per iteration and the final policies."""
    name, seed = task
    with one_thread():
        t0, c0 = time.perf_counter(), time.process_time()
        game, p1, p2 = build(algorithm_for(name, LR_OUTER, {}), seed, BATCH, ROUNDS, True)
        returns = []
        for _ in range(ITERATIONS):
            m = game.step().metrics
            returns.append((m["return1"] + m["return2"]) / 2)
        return {
            "name": name,
            "seed": seed,
            "returns": returns,
            "policy": policy_metrics(p1, p2),
            "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0,
        }


def make_figures(quiet: bool = False) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    t0 = time.perf_counter()
    tasks = [(name, seed) for name in ALGORITHMS for seed in SEEDS]
    describe = None if quiet else (lambda r: f"ipd_dice {r['name']:<6} seed {r['seed']}: {r['returns'][-1]:.3f}")
    results = run_pool(trajectory, tasks, describe)
    by = {name: sorted((r for r in results if r["name"] == name), key=lambda r: r["seed"]) for name in ALGORITHMS}

    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1, 1.2]})
    for name, runs in by.items():
        arr = np.array([r["returns"] for r in runs])
        x = np.arange(1, arr.shape[1] + 1)
        for row in arr:
            axes[0].plot(x, row, color=COLORS[name], lw=0.5, alpha=0.35)
        axes[0].plot(x, arr.mean(0), color=COLORS[name], lw=2, label=f"{name} (mean of {len(runs)} seeds)")
    for y in (-1.0, -2.0):
        axes[0].axhline(y, color="0.5", lw=0.8, ls=":")
    axes[0].set_xlabel("iteration")
    axes[0].set_ylabel("average discounted return per round")
    axes[0].set_title("IPD with DiCE policy gradients: return per round (both agents)")
    axes[0].legend(fontsize=8)
    width = 0.8 / len(by)
    for k, (name, runs) in enumerate(by.items()):
        finals = np.array([[r["policy"][f"pC{w}_{s}"] for s in STATES] for r in runs for w in ("1", "2")])
        xs = np.arange(5) + (k - (len(by) - 1) / 2) * width
        mean, std = finals.mean(0), finals.std(0)
        yerr = [mean - np.maximum(mean - std, 0), np.minimum(mean + std, 1) - mean]
        axes[1].bar(xs, mean, width, yerr=yerr, color=COLORS[name], label=name, capsize=2)
    axes[1].set_xticks(range(5), ["start", "CC", "CD", "DC", "DD"])
    axes[1].set_xlabel("state (previous joint move, own move first)")
    axes[1].set_ylabel("P(cooperate | state)")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title(f"final policies after {ITERATIONS} iterations (both agents, all seeds, ± std)")
    axes[1].legend(fontsize=8)
    fig.suptitle(
        f"IPD, {ROUNDS} rounds, batch {BATCH} per agent, γ={GAMMA}, η={LR_OUTER}, α={LR_INNER} "
        "(DiCE paper's setup; gameopt's one-step Taylor LOLA)"
    )
    paths = [save_figure(fig, "ipd_dice.png")]

    lines = [
        "# IPD with DiCE policy gradients: per-seed outcomes",
        "",
        "Regenerate with `python -m experiments.ipd_dice --figures` (setup in the module docstring).",
        "Return per round at the last iteration, mean of both agents (−1: mutual cooperation, −2: mutual "
        "defection); P(C|·) of agent 1 after the last iteration.",
        "",
        "| method | seed | return (last) | return (mean of last 20) | P(C|start, CC, CD, DC, DD), agent 1 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, runs in by.items():
        for r in runs:
            pc = ", ".join(f"{r['policy'][f'pC1_{s}']:.2f}" for s in STATES)
            lines.append(
                f"| {name} | {r['seed']} | {r['returns'][-1]:.3f} | {np.mean(r['returns'][-20:]):.3f} | {pc} |"
            )
    payload = {
        "setup": {"rounds": ROUNDS, "batch": BATCH, "gamma": GAMMA, "lr": LR_OUTER, "alpha": LR_INNER},
        "runs": [{k: v for k, v in r.items()} for r in results],
    }
    cpu = sum(r["cpu_s"] for r in results)
    paths += write_results("ipd_dice_results", lines, payload, t0, cpu, quiet)
    return paths


if __name__ == "__main__":
    sys.exit(main())
