"""DiCE objectives (gameopt.dice) against exact expectations.

A small stochastic game: two agents, T simultaneous rounds, each agent a memoryless
softmax policy over two actions, payoffs from fixed matrices. Every action sequence
can be enumerated, so the exact expected return J_i(θ) = Σ_s p_θ(s) R_i(s) and the
exact expectation of any estimator built from one sampled episode are computed
deterministically: an estimator that is linear in the episode's objective has the
expectation of an "all sequences" batch whose rewards are weighted by B·p(s)
(detached); a product of two estimates is enumerated over pairs of episodes.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import gameopt
from gameopt.dice import magic_box, objective

F64 = torch.float64
GAMMA = 0.9
PAYOFFS = torch.tensor([[[3.0, 0.0], [5.0, 1.0]], [[3.0, 5.0], [0.0, 1.0]]], dtype=F64)  # PAYOFFS[i][a1, a2]


class Softmax(nn.Module):
    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(logits, dtype=F64))

    def log_probs(self) -> torch.Tensor:
        return torch.log_softmax(self.theta, 0)


def make_agents() -> list[Softmax]:
    return [Softmax([0.3, -0.4]), Softmax([-0.2, 0.5])]


def sequences(T: int) -> torch.Tensor:
    """Every joint action sequence: (S, T, 2) actions (agent 1's, agent 2's)."""
    joint = list(itertools.product(range(2), repeat=2))
    return torch.tensor([list(seq) for seq in itertools.product(joint, repeat=T)])


def episodes(agents, actions: torch.Tensor):
    """logps (one (T, B) per agent) and rewards (one (T, B) per agent) of episodes
    with the given (B, T, 2) actions."""
    logps = [a.log_probs()[actions[:, :, k]].T for k, a in enumerate(agents)]
    rewards = [PAYOFFS[i][actions[:, :, 0], actions[:, :, 1]].T for i in range(2)]
    return logps, rewards


def exact_returns(agents, T: int) -> list[torch.Tensor]:
    """J_i = Σ_s p(s) Σ_t γᵗ r_i,t(s), differentiable in θ."""
    logps, rewards = episodes(agents, sequences(T))
    p = torch.exp(sum(lp.sum(0) for lp in logps))  # (S,)
    disc = GAMMA ** torch.arange(T, dtype=F64).unsqueeze(1)
    return [(p * (disc * r).sum(0)).sum() for r in rewards]


def expected_dice(agents, T: int, baseline: bool = False) -> list[torch.Tensor]:
    """E[objective of one sampled episode], as a function of θ: the all-sequences batch
    with rewards (and baseline) weighted by B·p(s), p detached."""
    actions = sequences(T)
    logps, rewards = episodes(agents, actions)
    weight = len(actions) * torch.exp(sum(lp.sum(0) for lp in logps)).detach()  # (S,)
    b = None
    if baseline:  # b_t may depend on the history before t, not on the actions at t
        past = torch.cumsum(actions.sum(2), 1) - actions.sum(2)  # (S, T): actions taken before t
        b = (1.5 + 0.5 * torch.arange(T, dtype=F64) - 0.7 * past).T
    return [objective(logps, r * weight, GAMMA, None if b is None else b * weight) for r in rewards]


def flat_theta(agents) -> list[torch.Tensor]:
    return [a.theta for a in agents]


def hessian(fn, agents) -> torch.Tensor:
    """The 4x4 Hessian of fn(agents) (a scalar) in (θ₁, θ₂)."""
    thetas = flat_theta(agents)
    g = torch.cat(torch.autograd.grad(fn(), thetas, create_graph=True))
    return torch.stack([torch.cat(torch.autograd.grad(gk, thetas, retain_graph=True)) for gk in g])


# ------------------------------------------------------------------ the operator
def test_magic_box_is_one_and_carries_every_derivative():
    x = torch.tensor([0.7, -1.2], dtype=F64, requires_grad=True)
    y = magic_box(2 * x)
    assert torch.equal(y.detach(), torch.ones(2, dtype=F64))
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    assert torch.equal(g.detach(), torch.full((2,), 2.0, dtype=F64))  # ⊡ ∇(2x)
    (h,) = torch.autograd.grad(g.sum(), x)
    assert torch.equal(h, torch.full((2,), 4.0, dtype=F64))  # ⊡ (∇(2x))²


# ------------------------------------------------------------------ unbiased derivatives
@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("baseline", [False, True])
def test_expectation_of_value_gradient_and_hessian_is_exact(T, baseline):
    agents = make_agents()
    for i in range(2):
        exact, estimated = exact_returns(agents, T)[i], expected_dice(agents, T, baseline)[i]
        torch.testing.assert_close(estimated, exact, rtol=1e-12, atol=1e-12)
        g_exact = torch.autograd.grad(exact_returns(agents, T)[i], flat_theta(agents))
        g_est = torch.autograd.grad(expected_dice(agents, T, baseline)[i], flat_theta(agents))
        for a, b in zip(g_est, g_exact):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        h_exact = hessian(lambda i=i: exact_returns(agents, T)[i], agents)
        h_est = hessian(lambda i=i: expected_dice(agents, T, baseline)[i], agents)
        torch.testing.assert_close(h_est, h_exact, rtol=1e-11, atol=1e-12)  # cross blocks included


def test_a_plain_score_function_surrogate_gets_the_cross_derivative_wrong():
    """The check above can fail: Σ γᵗ r_t Σ_{t′≤t} log π (no magic box) has the right
    gradient and the wrong second derivatives."""
    agents = make_agents()
    T = 2

    def surrogate():
        actions = sequences(T)
        logps, rewards = episodes(agents, actions)
        weight = torch.exp(sum(lp.sum(0) for lp in logps)).detach()
        cum = torch.cumsum(sum(logps), 0)
        disc = GAMMA ** torch.arange(T, dtype=F64).unsqueeze(1)
        return (weight * (disc * rewards[0] * cum).sum(0)).sum()

    g = torch.autograd.grad(surrogate(), flat_theta(agents))
    g_exact = torch.autograd.grad(exact_returns(agents, T)[0], flat_theta(agents))
    for a, b in zip(g, g_exact):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    cross = (hessian(surrogate, agents) - hessian(lambda: exact_returns(agents, T)[0], agents))[:2, 2:]
    assert cross.abs().max() > 1e-2


def test_sampled_value_gradient_and_cross_derivative_fall_within_sampling_error():
    """One batch of B sampled one-round episodes: each estimate within 5 standard
    errors of the exact value, the per-episode variance computed by enumeration."""
    agents = make_agents()
    S = sequences(1)

    def estimates(actions):  # value, gradient (4,), cross block (2x2) of agent 1's objective
        logps, rewards = episodes(agents, actions)
        fn = lambda: objective(logps_fn(actions), rewards[0], GAMMA)  # noqa: E731
        value = fn().detach()
        grad = torch.cat(torch.autograd.grad(fn(), flat_theta(agents)))
        cross = hessian(fn, agents)[:2, 2:].reshape(-1)
        return torch.cat([value.reshape(1), grad, cross])

    def logps_fn(actions):
        return episodes(agents, actions)[0]

    per_seq = torch.stack([estimates(S[s : s + 1]) for s in range(len(S))])  # (S, 9)
    with torch.no_grad():
        p = torch.exp(sum(lp.sum(0) for lp in episodes(agents, S)[0]))
    mean = (p.unsqueeze(1) * per_seq).sum(0)
    std = ((p.unsqueeze(1) * (per_seq - mean) ** 2).sum(0)).sqrt()
    exact_fn = lambda: exact_returns(agents, 1)[0]  # noqa: E731
    exact = torch.cat(
        [
            exact_fn().detach().reshape(1),
            torch.cat(torch.autograd.grad(exact_fn(), flat_theta(agents))),
            hessian(exact_fn, agents)[:2, 2:].reshape(-1),
        ]
    )
    torch.testing.assert_close(mean, exact, rtol=1e-12, atol=1e-12)  # the enumeration is right
    B = 20_000
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        probs = [torch.softmax(a.theta, 0) for a in agents]
    actions = torch.stack([torch.multinomial(pr, B, replacement=True, generator=g) for pr in probs], -1)
    sampled = estimates(actions.unsqueeze(1))
    assert ((sampled - exact).abs() <= 5 * std / B**0.5 + 1e-12).all()


# ------------------------------------------------------------------ through a game
def dice_game(agents, algorithm, losses_of):
    players = [gameopt.Player(a, name=f"agent{k}") for k, a in enumerate(agents)]
    return gameopt.Game(players, lambda: [-x for x in losses_of()], algorithm=algorithm)


def products(game, v):
    """ξ, Jv, Jᵀv, H_o v and χ, one flat tensor per player each."""
    layout = game.layout
    lin = game.linearize()
    vec = layout.from_per_player(v)
    out = {"xi": [t.clone() for t in layout.per_player(lin.xi)]}
    for name, fn in (("jv", lin.jvp), ("jtv", lin.vjp), ("hov", lin.offdiag_jvp)):
        out[name] = [t.clone() for t in layout.per_player(fn(vec))]
    out["chi"] = [t.clone() for t in layout.per_player(lin.chi())]
    return out


V = [torch.tensor([0.4, -1.1], dtype=F64), torch.tensor([0.9, 0.2], dtype=F64)]


@pytest.mark.parametrize("T", [1, 2])
def test_xi_and_jacobian_products_of_a_dice_game_are_unbiased(T):
    agents = make_agents()
    exact = products(dice_game(agents, gameopt.SimGD(0.1), lambda: exact_returns(agents, T)), V)
    agents2 = make_agents()
    expected = products(dice_game(agents2, gameopt.SimGD(0.1), lambda: expected_dice(agents2, T)), V)
    for name in exact:
        for a, b in zip(expected[name], exact[name]):
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12, msg=name)


def _step(algorithm_fn, losses_of_agents):
    """The step of a fresh game (θ₁, θ₂ after − before)."""
    agents = make_agents()
    game = dice_game(agents, algorithm_fn(), lambda: losses_of_agents(agents))
    before = [a.theta.detach().clone() for a in agents]
    game.step()
    return torch.cat([a.theta.detach() - b for a, b in zip(agents, before)])


def _one_episode(agents, seq_1, seq_2):
    """Agent 1's objective from episode seq_1, agent 2's from episode seq_2 (one
    episode each: B = 1)."""
    out = []
    for i, seq in enumerate((seq_1, seq_2)):
        logps, rewards = episodes(agents, seq.unsqueeze(0))
        out.append(objective(logps, rewards[i], GAMMA))
    return out


@pytest.mark.parametrize("name", ["LOLA", "LA", "SOS"])
def test_shaping_steps_are_unbiased_with_independent_batches_and_biased_with_one(name):
    """LOLA's ξ − αH_oξ − αχ and LA's ξ − αH_oξ pair each agent's derivatives with
    the other agent's: with each agent's objective from its own episode, their
    expected step is the exact step; from one shared episode it is not. SOS scales
    LOLA's shaping term by p ∈ [0, 1], a nonlinear function of the estimates: its
    step is unbiased where p = 1 on every pair of episodes, as here with α = 0.1
    (checked: each of its steps equals LOLA's)."""
    T = 1
    make = {
        "LOLA": lambda: gameopt.LOLA(0.5, alpha=0.7),
        "LA": lambda: gameopt.LA(0.5, alpha=0.7),
        "SOS": lambda: gameopt.SOS(0.5, alpha=0.1, a=0.5, b=0.1),
    }[name]
    exact = _step(make, lambda ag: exact_returns(ag, T))
    S = sequences(T)
    with torch.no_grad():
        p = torch.exp(sum(lp.sum(0) for lp in episodes(make_agents(), S)[0]))
    independent = sum(
        p[s] * p[r] * _step(make, lambda ag, s=s, r=r: _one_episode(ag, S[s], S[r]))
        for s in range(len(S))
        for r in range(len(S))
    )
    shared = sum(p[s] * _step(make, lambda ag, s=s: _one_episode(ag, S[s], S[s])) for s in range(len(S)))
    torch.testing.assert_close(independent, exact, rtol=1e-10, atol=1e-12)
    assert (shared - exact).abs().max() > 1e-3
    if name == "SOS":
        lola = lambda: gameopt.LOLA(0.5, alpha=0.1)  # noqa: E731
        for s in range(len(S)):
            for r in range(len(S)):
                sos_step = _step(make, lambda ag, s=s, r=r: _one_episode(ag, S[s], S[r]))
                lola_step = _step(lola, lambda ag, s=s, r=r: _one_episode(ag, S[s], S[r]))
                torch.testing.assert_close(sos_step, lola_step, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("algorithm", ["SimGD", "SGA", "ConsensusOptimization"])
def test_first_order_and_gradient_adjustment_steps_run_on_dice_losses(algorithm):
    """SimGD's step is linear in ξ: unbiased from one shared batch. SGA and consensus
    run unchanged; their Jᵀξ pairs an agent's Hessian with its own gradient, which no
    batch split makes independent (biased: documented)."""
    make = {
        "SimGD": lambda: gameopt.SimGD(0.5),
        "SGA": lambda: gameopt.SGA(0.5, lam=1.0),
        "ConsensusOptimization": lambda: gameopt.ConsensusOptimization(0.5, gamma=0.3),
    }[algorithm]
    S = sequences(1)
    with torch.no_grad():
        p = torch.exp(sum(lp.sum(0) for lp in episodes(make_agents(), S)[0]))
    expected = sum(p[s] * _step(make, lambda ag, s=s: _one_episode(ag, S[s], S[s])) for s in range(len(S)))
    exact = _step(make, lambda ag: exact_returns(ag, 1))
    assert torch.isfinite(expected).all()
    if algorithm == "SimGD":
        torch.testing.assert_close(expected, exact, rtol=1e-12, atol=1e-13)
    else:
        assert (expected - exact).abs().max() > 1e-4


# ------------------------------------------------------------------ input checks
def test_objective_refuses_bad_input_with_clear_messages():
    lp = torch.zeros(3, 4, dtype=F64)
    r = torch.ones(3, 4, dtype=F64)
    with pytest.raises(ValueError, match="one .T, B. tensor per agent"):
        objective([], r, 0.9)
    with pytest.raises(ValueError, match=r"logps\[1\] has shape \(3, 5\)"):
        objective([lp, torch.zeros(3, 5, dtype=F64)], r, 0.9)
    with pytest.raises(ValueError, match=r"rewards must have shape \(T, B\)"):
        objective([lp], torch.ones(12, dtype=F64), 0.9)
    with pytest.raises(TypeError, match="floating-point"):
        objective([lp], torch.ones(3, 4, dtype=torch.long), 0.9)
    with pytest.raises(ValueError, match="discount must be in"):
        objective([lp], r, 1.5)
    with pytest.raises(ValueError, match="baseline has shape"):
        objective([lp], r, 0.9, baseline=torch.zeros(4, 3, dtype=F64))
    torch.testing.assert_close(objective([lp], r, 0.5), torch.tensor(1.75, dtype=F64))  # 1 + 0.5 + 0.25
