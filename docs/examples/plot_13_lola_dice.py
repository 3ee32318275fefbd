"""
LOLA-DiCE: opponent shaping from sampled episodes
=================================================

On the iterated prisoner's dilemma, naive policy-gradient learners defect, while
LOLA agents (Foerster et al. 2018), which differentiate through their opponent's
learning step, learn to reciprocate. LOLA needs second derivatives of each agent's
expected return; from *sampled* episodes these come from the DiCE objective
(:func:`gameopt.dice.objective`, Foerster et al. 2018, "DiCE: The Infinitely
Differentiable Monte-Carlo Estimator"):

.. math:: \\sum_t \\gamma^t r_t\\, ⊡\\Big(\\sum_{t' \\le t} \\sum_{\\text{agents}} \\log \\pi(a_{t'})\\Big),
          \\qquad ⊡(x) = e^{x - \\bot(x)},

whose value is the mean discounted return and whose derivatives of every order are
unbiased estimates. Each agent's loss is its negated DiCE objective, computed on its
own batch of episodes, and the game is an ordinary :class:`gameopt.Game`:
:class:`gameopt.LOLA` and :class:`gameopt.SimGD` run on it unchanged. The setup is
the DiCE paper's (memory-one policies with 5 logits, rewards −1/−3/0/−2, γ = 0.96,
step 0.2, look-ahead 0.3) with shorter episodes and batches, so that it runs in
seconds; the return per round is −1 for mutual cooperation and −2 for mutual defection.
"""

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import gameopt
from gameopt.dice import objective
from gameopt_players.ipd import IPDPolicy

ROUNDS, BATCH, GAMMA, ITERATIONS = 50, 128, 0.96, 150
#: (agent 1's, agent 2's) reward by joint move: CC, CD, DC, DD (0 = cooperate, 1 = defect)
REWARDS = torch.tensor([[-1.0, -1.0], [-3.0, 0.0], [0.0, -3.0], [-2.0, -2.0]])


@torch.no_grad()
def sample_episodes(coop1, coop2):
    """BATCH episodes of ROUNDS rounds; each agent's state is 0 at the start, then
    1 + 2·(own last move) + (opponent's last move). Returns (ROUNDS, BATCH) tensors."""
    s1 = torch.zeros(BATCH, dtype=torch.long)
    s2 = torch.zeros(BATCH, dtype=torch.long)
    states1, states2, moves1, moves2 = [], [], [], []
    for _ in range(ROUNDS):
        m1 = (torch.rand(BATCH) >= coop1[s1]).long()
        m2 = (torch.rand(BATCH) >= coop2[s2]).long()
        states1.append(s1), states2.append(s2), moves1.append(m1), moves2.append(m2)
        s1, s2 = 1 + 2 * m1 + m2, 1 + 2 * m2 + m1
    return [torch.stack(t) for t in (states1, states2, moves1, moves2)]


def log_prob(policy, states, moves):
    """log π(move | state), (ROUNDS, BATCH), with its graph to the policy's logits."""
    return F.logsigmoid(policy.theta[states] * (1 - 2 * moves).float())


def dice_losses(p1, p2):
    def losses():
        out = []
        for i in range(2):  # each agent's objective on its own batch of episodes
            s1, s2, m1, m2 = sample_episodes(p1().detach(), p2().detach())
            rewards = REWARDS[2 * m1 + m2, i]  # (ROUNDS, BATCH): agent i's rewards
            centred = rewards - rewards.mean(1, keepdim=True)  # a baseline: the batch mean per round
            out.append(-objective([log_prob(p1, s1, m1), log_prob(p2, s2, m2)], centred, discount=GAMMA))
        return out

    return losses


def return_per_round(p1, p2):
    """Mean of both agents' discounted return Σₜ γᵗ rₜ on a fresh batch, divided by
    Σₜ γᵗ: a weighted mean reward per round (−1: cooperate, −2: defect)."""
    s1, s2, m1, m2 = sample_episodes(p1(), p2())
    weights = GAMMA ** torch.arange(ROUNDS, dtype=torch.float32).unsqueeze(1)
    return float((weights * REWARDS[2 * m1 + m2].mean(-1)).sum(0).mean() / weights.sum())


fig, ax = plt.subplots(figsize=(6.5, 4))
for name, algorithm, style in [
    ("naive learners (SimGD)", gameopt.SimGD(0.2), dict(color="C1", ls="--")),
    ("LOLA-DiCE", gameopt.LOLA(0.2, alpha=0.3), dict(color="C2", ls="-")),
]:
    torch.manual_seed(0)  # the same initial logits and episodes' random numbers for both
    p1 = IPDPolicy(0.4 * torch.randn(5), dtype=torch.float32)  # 5 cooperation logits each
    p2 = IPDPolicy(0.4 * torch.randn(5), dtype=torch.float32)
    game = gameopt.Game([gameopt.Player(p1), gameopt.Player(p2)], dice_losses(p1, p2), algorithm=algorithm)
    returns = []
    for _ in range(ITERATIONS):
        returns.append(return_per_round(p1, p2))
        game.step()
    ax.plot(returns, label=name, **style)
    with torch.no_grad():
        print(
            f"{name:>22}: return per round {returns[-1]:.2f}, P(cooperate | start, CC, CD, DC, DD) of agent 1:",
            p1().numpy().round(2),
        )
ax.axhline(-1.0, color="0.5", ls=":", lw=1)
ax.axhline(-2.0, color="0.5", ls=":", lw=1)
ax.set_xlabel("iteration")
ax.set_ylabel("return per round (discounted mean)")
ax.set_title(f"iterated prisoner's dilemma, {ROUNDS} rounds, {BATCH} episodes per agent")
ax.legend()
fig.tight_layout()
plt.show()
