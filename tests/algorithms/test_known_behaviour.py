"""Known qualitative behaviour of the algorithms on games with known answers:

* bilinear min_x max_y xᵀAy: SimGD spirals out; consensus optimization, SGA and
  CGD converge; under strong coupling CGD converges where SimGD and EG blow up;
* the tandem game (Letcher et al. 2019): LOLA settles off the Nash line at the
  fixed point derived below, SOS and LA reach the Nash line x + y = 1;
* matching pennies with sigmoid policies: LA, LOLA and SOS converge to the mixed
  equilibrium, SimGD does not;
* the iterated prisoner's dilemma with exact discounted losses: LOLA and SOS
  learn to cooperate, naive learners (SimGD) defect;
* the general-sum n-player quadratic game reaches its Nash equilibrium −M⁻¹c.

All in float64; each assertion has a wide margin against the measured behaviour
(the IPD: means over five seeds), as rounding differs between CPUs' vector
kernels. The tests of runs are marked ``trajectory``: .ci/run runs them again
with PyTorch's portable kernels (ATEN_CPU_CAPABILITY=default).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

import gameopt
from gameopt_players.ipd import IPD_LOSSES, IPDPolicy, discounted_losses, ipd_losses, markov_chain
from gameopt_players.matrix_games import SigmoidPolicy, zero_sum_losses
from gameopt_players.quadratic import QuadraticPlayer, bilinear_losses, random_quadratic_game, tandem_losses

F64 = torch.float64


# ------------------------------------------------------------------ helpers
@dataclass
class Trajectory:
    """Iterates of a game run: ``params[t]`` the joint parameter vector after t
    steps (t = 0..steps), ``losses[t]`` the players' losses at the start of step t."""

    params: Tensor  # (steps + 1, d)
    losses: Tensor  # (steps, n_players)

    def dist(self, target: Tensor | None = None) -> Tensor:
        """‖w_t − target‖ for every t (target 0 by default)."""
        return (self.params if target is None else self.params - target).norm(dim=1)


def joint_params(game: gameopt.Game) -> Tensor:
    """The players' parameters as one detached flat vector."""
    return torch.cat([p.flat_param.detach().clone().reshape(-1) for p in game.players])


def run(game: gameopt.Game, steps: int) -> Trajectory:
    """Run ``game.step()`` ``steps`` times and record the trajectory."""
    params, losses = [joint_params(game)], []
    for _ in range(steps):
        losses.append(torch.stack(list(game.step())))
        params.append(joint_params(game))
    return Trajectory(torch.stack(params), torch.stack(losses))


# ------------------------------------------------------------------ bilinear
# A circulant 2I + C: normal, singular values 3, √3, √3 (well conditioned).
A_BILINEAR = torch.tensor([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 2.0]], dtype=F64)
X0 = torch.tensor([1.0, -0.5, 0.3], dtype=F64)
Y0 = torch.tensor([-0.4, 0.8, 0.6], dtype=F64)


def bilinear_run(A: Tensor, algorithm: gameopt.Algorithm, steps: int) -> Trajectory:
    x, y = QuadraticPlayer(X0), QuadraticPlayer(Y0)
    return run(gameopt.Game([x, y], bilinear_losses(x, y, A), algorithm=algorithm), steps)


BILINEAR_LR = 0.2
BILINEAR_CASES = {
    # each singular value σ of A: |1 − iησ| > 1 per step
    "SimGD": (lambda: gameopt.SimGD(BILINEAR_LR), "diverges"),
    # modulus² (1 − ηγσ²)² + η²σ² < 1 for η(γ²σ² + 1) < 2γ
    "Consensus": (lambda: gameopt.ConsensusOptimization(BILINEAR_LR, gamma=0.5), "converges"),
    # J antisymmetric: ⟨ξ, Jᵀξ⟩ = 0, so the aligned λ is +|λ| and SGA = consensus
    "SGA": (lambda: gameopt.SGA(BILINEAR_LR, lam=0.5), "converges"),
    # w ← (I + ηJ)⁻¹ w: modulus 1/√(1 + η²σ²) < 1 for every η
    "CGD": (lambda: gameopt.CGD(BILINEAR_LR), "converges"),
    "CGD-zero-sum": (lambda: gameopt.CGD(BILINEAR_LR, zero_sum=True), "converges"),
}


@pytest.mark.trajectory
@pytest.mark.parametrize("name", list(BILINEAR_CASES))
def test_bilinear_game(name: str) -> None:
    make, expected = BILINEAR_CASES[name]
    traj = bilinear_run(A_BILINEAR, make(), 200)
    d = traj.dist()
    ratio = float(d[-1] / d[0])
    if expected == "diverges":
        assert ratio > 1e3, f"{name}: ‖w‖ grew only by {ratio:.3g}"
        assert bool((d[1:] > d[:-1]).all()), f"{name}: the distance to the equilibrium did not grow every step"
    else:
        assert ratio < 1e-3, f"{name}: ‖w‖ shrank only by {ratio:.3g}"


@pytest.mark.trajectory
def test_cgd_converges_under_strong_coupling_where_simgd_and_eg_blow_up() -> None:
    """A = 10·I, η = 0.5 (ησ = 5): per step ‖w‖ is multiplied exactly by
    √(1 + 25) for SimGD, √((1 − 25)² + 25) for EG, 1/√(1 + 25) for CGD."""
    A = 10.0 * torch.eye(3, dtype=F64)
    lr, steps = 0.5, 20
    q = (lr * 10.0) ** 2
    factors = {"SimGD": math.sqrt(1 + q), "EG": math.sqrt((1 - q) ** 2 + q), "CGD": 1 / math.sqrt(1 + q)}
    algos = {"SimGD": gameopt.SimGD(lr), "EG": gameopt.Extragradient(lr), "CGD": gameopt.CGD(lr)}
    ratios = {}
    for name, algo in algos.items():
        d = bilinear_run(A, algo, steps).dist()
        ratios[name] = float(d[-1] / d[0])
        assert ratios[name] == pytest.approx(factors[name] ** steps, rel=1e-6), name
    assert ratios["SimGD"] > 1e12 and ratios["EG"] > 1e25
    assert ratios["CGD"] < 1e-12


# -------------------------------------------------------------------- tandem
# L1 = (x+y)² − 2x, L2 = (x+y)² − 2y; s = x + y. ξ_1 = ξ_2 = 2s − 2, H_o = [[0,2],[2,0]],
# χ_1 = (∂ξ_2/∂x)(∂L1/∂y) = 4s = χ_2. Both players get the same direction d(s), so
# x − y is constant and s ← s − 2η d(s).
#   LA:                  d = (1 − 2α)(2s − 2)             → s = 1
#   LOLA (ξ₀ − αχ):      d = (1 − 2α)(2s − 2) − 4αs       → s = (1 − 2α)/(1 − 4α)  (stable: α < 1/4)
#   LOLA (ξ − αχ):       d = (2s − 2) − 4αs                → s = 1/(1 − 2α)        (stable: α < 1/2)
#   SOS: p → 0 as ξ → 0 (p₂ = ‖ξ‖²), so the shaping vanishes at s = 1 → s = 1
TANDEM_ALPHA, TANDEM_LR = 0.1, 0.2
TANDEM_CASES = {
    "LOLA": (lambda: gameopt.LOLA(TANDEM_LR, alpha=TANDEM_ALPHA), (1 - 2 * TANDEM_ALPHA) / (1 - 4 * TANDEM_ALPHA)),
    "LOLA-shaping-only": (
        lambda: gameopt.LOLA(TANDEM_LR, alpha=TANDEM_ALPHA, shaping_only=True),
        1 / (1 - 2 * TANDEM_ALPHA),
    ),
    "SOS": (lambda: gameopt.SOS(TANDEM_LR, alpha=TANDEM_ALPHA), 1.0),
    "LA": (lambda: gameopt.LA(TANDEM_LR, alpha=TANDEM_ALPHA), 1.0),
    "SimGD": (lambda: gameopt.SimGD(TANDEM_LR), 1.0),
}


@pytest.mark.trajectory
@pytest.mark.parametrize("name", list(TANDEM_CASES))
def test_tandem_game(name: str) -> None:
    make, s_expected = TANDEM_CASES[name]
    x, y = QuadraticPlayer([0.5]), QuadraticPlayer([-1.5])
    traj = run(gameopt.Game([x, y], tandem_losses(x, y), algorithm=make()), 100)
    s = traj.params[:, 0] + traj.params[:, 1]
    diff = traj.params[:, 0] - traj.params[:, 1]
    assert float(s[-1]) == pytest.approx(s_expected, abs=1e-6), f"{name}: x + y = {float(s[-1])}"
    assert float(diff[-1]) == pytest.approx(float(diff[0]), abs=1e-9)
    if name.startswith("LOLA"):
        assert abs(float(s[-1]) - 1.0) > 0.2, "LOLA should settle off the Nash line x + y = 1"


# ---------------------------------------------------------- matching pennies
PENNIES_STARTS = [(1.0, -0.5), (-1.0, 1.0), (0.5, 1.5), (-1.5, -1.0)]
PENNIES_CASES = {
    "LA": lambda: gameopt.LA(1.0, alpha=1.0),
    "LOLA": lambda: gameopt.LOLA(1.0, alpha=1.0),
    "SOS": lambda: gameopt.SOS(1.0, alpha=1.0),
    "SimGD": lambda: gameopt.SimGD(1.0),
}


@pytest.mark.trajectory
@pytest.mark.parametrize("name", list(PENNIES_CASES))
def test_matching_pennies(name: str) -> None:
    for start in PENNIES_STARTS:
        p1, p2 = SigmoidPolicy(start[0]), SigmoidPolicy(start[1])
        traj = run(gameopt.Game([p1, p2], zero_sum_losses(p1, p2), algorithm=PENNIES_CASES[name]()), 200)
        d = traj.dist()
        gap = float((torch.sigmoid(traj.params[-1]) - 0.5).abs().max())
        if name == "SimGD":
            assert float(d[-1]) > 1.5 * float(d[0]), f"start {start}: ‖θ‖ {float(d[0]):.3f} → {float(d[-1]):.3f}"
            assert gap > 0.3, f"start {start}: probabilities within {gap:.3g} of 1/2"
        else:
            assert gap < 1e-2, f"{name}, start {start}: probabilities {gap:.3g} away from 1/2"
            assert float(d[-1]) < 0.05 * float(d[0])


# ----------------------------------------------- iterated prisoner's dilemma
GAMMA = 0.96


def _policies(code: str) -> Tensor:
    """Cooperation probabilities of a deterministic memory-1 policy (start, CC, CD,
    DC, DD from its own side), e.g. tit-for-tat = "CCDCD"."""
    return torch.tensor([1.0 if c == "C" else 0.0 for c in code], dtype=F64)


def test_ipd_exact_losses() -> None:
    allc, alld, tft = _policies("CCCCC"), _policies("DDDDD"), _policies("CCDCD")
    assert [float(v) for v in discounted_losses(allc, allc, GAMMA)] == pytest.approx([1.0, 1.0])
    assert [float(v) for v in discounted_losses(alld, alld, GAMMA)] == pytest.approx([2.0, 2.0])
    assert [float(v) for v in discounted_losses(allc, alld, GAMMA)] == pytest.approx([3.0, 0.0])
    # tit-for-tat is exploited once, then both defect: 3(1 − γ) + 2γ, from either seat
    # (agent 2 reads the joint outcome from its own side)
    v = 3 * (1 - GAMMA) + 2 * GAMMA
    assert [float(x) for x in discounted_losses(tft, alld, GAMMA)] == pytest.approx([v, 2 * GAMMA])
    assert [float(x) for x in discounted_losses(alld, tft, GAMMA)] == pytest.approx([2 * GAMMA, v])
    # random policies: the truncated series (1 − γ) Σ_t γᵗ p0ᵀ Pᵗ r
    g = torch.Generator().manual_seed(0)
    c1, c2 = torch.rand(5, generator=g, dtype=F64), torch.rand(5, generator=g, dtype=F64)
    p0, P = markov_chain(c1, c2)
    dist, series = p0.clone(), torch.zeros(2, dtype=F64)
    for t in range(2000):
        series += (1 - GAMMA) * GAMMA**t * (dist @ IPD_LOSSES)
        dist = dist @ P
    torch.testing.assert_close(torch.stack(discounted_losses(c1, c2, GAMMA)), series, rtol=1e-12, atol=1e-12)


# The losses are normalized by (1 − γ); the papers (Foerster et al. 2018, Letcher et
# al. 2019: lr = α = 1, a = 0.5, b = 0.1) use the unnormalized sum. Scaling the losses
# by c scales ξ by c, H_o by c and χ by c², so the same steps need η = α = 1/c and
# a gradient threshold b·c.
IPD_LR = IPD_ALPHA = 1 / (1 - GAMMA)
IPD_CASES = {
    "SimGD": lambda: gameopt.SimGD(IPD_LR),
    "LOLA": lambda: gameopt.LOLA(IPD_LR, alpha=IPD_ALPHA),
    "SOS": lambda: gameopt.SOS(IPD_LR, alpha=IPD_ALPHA, a=0.5, b=0.1 * (1 - GAMMA)),
}
IPD_SEEDS, IPD_STEPS = range(5), 100


def ipd_final_losses(make: Callable[[], gameopt.Algorithm], seed: int) -> float:
    """Mean loss per round of both agents after IPD_STEPS steps from θ ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    p1 = IPDPolicy(torch.randn(5, generator=g, dtype=F64))
    p2 = IPDPolicy(torch.randn(5, generator=g, dtype=F64))
    run(gameopt.Game([p1, p2], ipd_losses(p1, p2, GAMMA), algorithm=make()), IPD_STEPS)
    with torch.no_grad():
        return float(sum(discounted_losses(p1(), p2(), GAMMA)) / 2)


@pytest.mark.trajectory
@pytest.mark.parametrize("name", list(IPD_CASES))
def test_iterated_prisoners_dilemma(name: str) -> None:
    finals = [ipd_final_losses(IPD_CASES[name], seed) for seed in IPD_SEEDS]
    mean = sum(finals) / len(finals)
    per_seed = ", ".join(f"{v:.3f}" for v in finals)
    if name == "SimGD":
        assert mean > 1.7, f"naive learners should defect; losses per round {per_seed}"
    else:
        assert mean < 1.3, f"{name} should cooperate; losses per round {per_seed}"


# ------------------------------------------------- n-player quadratic game
@pytest.mark.trajectory
@pytest.mark.parametrize(
    "make",
    [lambda: gameopt.SimGD(0.1), lambda: gameopt.CGD(0.1), lambda: gameopt.SOS(0.1, alpha=0.1)],
    ids=["SimGD", "CGD", "SOS"],
)
def test_quadratic_game_reaches_nash(make: Callable[[], gameopt.Algorithm]) -> None:
    q = random_quadratic_game(n_players=3, dim=2, coupling=1.0, seed=0)
    w_star = torch.cat(q.nash_equilibrium())
    at_star = [QuadraticPlayer(w) for w in q.nash_equilibrium()]
    xi = gameopt.Game(at_star, q.losses(at_star)).vector_field()
    assert float(torch.cat(xi).norm()) < 1e-12  # ξ(w*) = 0 and each L_i is convex in w_i
    players = [QuadraticPlayer(torch.zeros(2, dtype=F64)) for _ in range(3)]
    traj = run(gameopt.Game(players, q.losses(players), algorithm=make()), 200)
    d = traj.dist(w_star)
    assert float(d[-1]) < 1e-6 * float(d[0])
