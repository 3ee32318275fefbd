"""
Opponent shaping on the iterated prisoner's dilemma
===================================================

Two memory-1 agents play the iterated prisoner's dilemma with exact discounted
returns (:math:`\\gamma = 0.96`). Naive learners (``SimGD``) learn to defect, a
loss of 2 per round; LOLA (Foerster et al. 2018, `"Learning with
Opponent-Learning Awareness" <https://arxiv.org/abs/1709.04326>`_) and SOS
(Letcher et al. 2019, `"Stable Opponent Shaping in Differentiable Games"
<https://arxiv.org/abs/1811.08469>`_) differentiate through the opponent's
learning step and learn to cooperate, a loss near 1 per round. SOS scales LOLA's
shaping term by a weight :math:`p \\le 1` that is 1 away from fixed points; along this
run it stays (almost) 1, so the two curves coincide to within about :math:`10^{-4}`:
SOS is drawn dashed over LOLA's wider line.
"""

import matplotlib.pyplot as plt
import torch

import gameopt
from gameopt_players.ipd import IPDPolicy, discounted_losses, ipd_losses

GAMMA = 0.96
fig, ax = plt.subplots(figsize=(6.5, 4))
curves = {}
for name, make, style in [
    ("SimGD (naive)", lambda: gameopt.SimGD(1.0), dict(color="C0", ls="-", lw=1.5)),
    ("LOLA", lambda: gameopt.LOLA(1.0, alpha=1.0), dict(color="C1", ls="-", lw=4, alpha=0.5)),
    ("SOS (equal to LOLA here)", lambda: gameopt.SOS(1.0, alpha=1.0), dict(color="C2", ls="--", lw=1.5)),
]:
    g = torch.Generator().manual_seed(0)
    p1, p2 = IPDPolicy(torch.randn(5, generator=g)), IPDPolicy(torch.randn(5, generator=g))  # 5 logits each
    # the papers' units: the unnormalized discounted sum (gradients 1/(1 − γ) = 25 times larger)
    game = gameopt.Game([p1, p2], ipd_losses(p1, p2, GAMMA, normalized=False), algorithm=make())
    per_round = []
    for _ in range(100):
        game.step()
        with torch.no_grad():
            l1, l2 = discounted_losses(p1(), p2(), GAMMA)  # per round: 1 = cooperation, 2 = defection
        per_round.append(float(l1 + l2) / 2)
    ax.plot(per_round, label=name, **style)
    curves[name] = per_round
    print(f"{name:>14}: loss per round after 100 steps {per_round[-1]:.3f}")
gap = max(abs(a - b) for a, b in zip(curves["LOLA"], curves["SOS (equal to LOLA here)"]))
print(f"largest difference between the LOLA and SOS curves: {gap:.1e}")
ax.axhline(1.0, color="0.5", ls=":", lw=1)
ax.axhline(2.0, color="0.5", ls=":", lw=1)
ax.set_xlabel("step")
ax.set_ylabel("mean loss per round")
ax.set_title("iterated prisoner's dilemma, γ = 0.96")
ax.legend()
fig.tight_layout()
plt.show()
