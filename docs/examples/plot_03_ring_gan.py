"""
GAN on a ring of Gaussians
==========================

A small GAN learns a mixture of 8 Gaussians on a circle of radius 2 (the demo's
data, fewer steps). Simultaneous Adam and Extra-Adam (extragradient with Adam's
update, Gidel et al. 2019, `"A Variational Inequality Perspective on Generative
Adversarial Networks" <https://arxiv.org/abs/1802.10551>`_) train the same networks
from the same start; the figure shows their samples and the number of modes they
cover over training.
"""

import matplotlib.pyplot as plt
import torch

import gameopt
from gameopt_players.gan2d import Discriminator, Generator, gan_losses, mode_metrics, ring_modes, sample_mixture

torch.set_num_threads(1)
STD, STEPS, BATCH, LATENT = 0.05, 1000, 128, 16
modes = ring_modes(8, radius=2.0)  # (8, 2): the mixture's centres

algorithms = {
    "Adam (simultaneous)": lambda: gameopt.SimGD(1e-3, update=gameopt.Adam((0.5, 0.9))),
    "Extra-Adam": lambda: gameopt.Extragradient(1e-3, update=gameopt.Adam((0.5, 0.9))),
}
fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
for name, make in algorithms.items():
    torch.manual_seed(0)
    gen = Generator(latent=LATENT, hidden=128, depth=3, act="tanh")  # 16-D noise -> 2-D sample
    disc = Discriminator(hidden=128, depth=3, act="tanh")  # 2-D sample -> one logit
    game = gameopt.Game([gen, disc], lambda x, z: gan_losses(gen, disc, x, z), algorithm=make())
    data = torch.Generator().manual_seed(1)
    covered = []
    for step in range(STEPS):
        x = sample_mixture(modes, BATCH, STD, generator=data)  # (128, 2) real samples
        z = torch.randn(BATCH, LATENT)  # (128, 16) noise
        game.step(x, z)
        if step % 50 == 49:
            with torch.no_grad():
                covered.append(mode_metrics(gen(torch.randn(1000, LATENT)), modes, STD)[0])
    with torch.no_grad():
        samples = gen(torch.randn(1000, LATENT))
    ax = axes[0] if name.startswith("Adam") else axes[1]
    ax.scatter(samples[:, 0], samples[:, 1], s=2, alpha=0.4)
    ax.scatter(modes[:, 0], modes[:, 1], c="red", marker="x")
    ax.set(xlim=(-3, 3), ylim=(-3, 3), aspect="equal", title=f"{name}: {covered[-1]}/8 modes")
    axes[2].plot(range(50, STEPS + 1, 50), covered, marker="o", label=name)
    print(f"{name}: {covered[-1]} of 8 modes after {STEPS} steps")
axes[2].set(xlabel="step", ylabel="modes covered (of 8)", ylim=(-0.3, 8.3), title="modes over training")
axes[2].legend()
fig.tight_layout()
plt.show()
