"""A small convolutional GAN for 8x8 grey-scale images (scikit-learn's digits):
generator, discriminator, the non-saturating losses, and a digit classifier whose
predictions and features score generated images (classes covered, a Fréchet
distance).

Images are ``(n, 1, 8, 8)`` tensors in [-1, 1].
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class ConvGenerator(nn.Module):
    """z (latent) → 64×2×2 → 32×4×4 → 32×8×8 → 1×8×8, tanh output. With ``batchnorm``,
    each hidden layer is batch-normalized with the statistics of the current batch
    (no running averages: nothing but parameters to save and resume)."""

    def __init__(self, latent: int = 32, width: int = 32, batchnorm: bool = True) -> None:
        super().__init__()
        self.latent, self.width = latent, width
        self.fc = nn.Linear(latent, 2 * width * 2 * 2)
        self.up1 = nn.ConvTranspose2d(2 * width, width, kernel_size=4, stride=2, padding=1)  # 2 → 4
        self.up2 = nn.ConvTranspose2d(width, width, kernel_size=4, stride=2, padding=1)  # 4 → 8
        self.out = nn.Conv2d(width, 1, kernel_size=3, padding=1)
        norm = (lambda c: nn.BatchNorm2d(c, track_running_stats=False)) if batchnorm else (lambda c: nn.Identity())
        self.n0, self.n1, self.n2 = norm(2 * width), norm(width), norm(width)

    def forward(self, z: Tensor) -> Tensor:
        h = F.leaky_relu(self.n0(self.fc(z).view(-1, 2 * self.width, 2, 2)), 0.2)
        h = F.leaky_relu(self.n1(self.up1(h)), 0.2)
        h = F.leaky_relu(self.n2(self.up2(h)), 0.2)
        return torch.tanh(self.out(h))


class ConvDiscriminator(nn.Module):
    """1×8×8 → 32×4×4 → 64×2×2 → logit."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, kernel_size=4, stride=2, padding=1)  # 8 → 4
        self.conv2 = nn.Conv2d(width, 2 * width, kernel_size=4, stride=2, padding=1)  # 4 → 2
        self.fc = nn.Linear(2 * width * 2 * 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = F.leaky_relu(self.conv1(x), 0.2)
        h = F.leaky_relu(self.conv2(h), 0.2)
        return self.fc(h.flatten(1)).squeeze(-1)


def gan_losses(gen: nn.Module, disc: nn.Module, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    """Non-saturating GAN losses (generator, discriminator); one forward of each network."""
    real, fake = disc(x), disc(gen(z))
    d_loss = F.softplus(-real).mean() + F.softplus(fake).mean()
    g_loss = F.softplus(-fake).mean()
    return g_loss, d_loss


class DigitClassifier(nn.Module):
    """A small conv net for 8x8 digits; :meth:`features` is its penultimate layer."""

    def __init__(self, classes: int = 10, features: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1)  # 8 → 4
        self.fc = nn.Linear(32 * 4 * 4, features)
        self.head = nn.Linear(features, classes)

    def features(self, x: Tensor) -> Tensor:
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h))
        return F.relu(self.fc(h.flatten(1)))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def train_classifier(
    images: Tensor, labels: Tensor, *, seed: int = 0, epochs: int = 15, batch: int = 64
) -> DigitClassifier:
    """Train a :class:`DigitClassifier` deterministically (its own seed; the global
    RNG state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = DigitClassifier()
        opt = torch.optim.Adam(net.parameters(), lr=2e-3)
        g = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            perm = torch.randperm(len(images), generator=g)
            for i in range(0, len(images), batch):
                idx = perm[i : i + batch]
                loss = F.cross_entropy(net(images[idx]), labels[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def frechet_distance(a: Tensor, b: Tensor) -> float:
    """‖μₐ − μ_b‖² + Tr(Σₐ + Σ_b − 2(Σₐ^½ Σ_b Σₐ^½)^½) between two sets of feature
    rows, in float64 with symmetric eigendecompositions."""
    a, b = a.double(), b.double()
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = torch.cov(a.T), torch.cov(b.T)
    w, v = torch.linalg.eigh(cov_a)
    root_a = (v * w.clamp_min(0).sqrt()) @ v.T
    middle = root_a @ cov_b @ root_a
    cross = torch.linalg.eigvalsh((middle + middle.T) / 2).clamp_min(0).sqrt().sum()
    return float((mu_a - mu_b).square().sum() + cov_a.trace() + cov_b.trace() - 2 * cross)


def class_metrics(probs: Tensor, min_share: float = 0.25) -> tuple[int, float, float]:
    """From predicted class probabilities of generated images: the classes covered
    (a class counts when it receives at least ``min_share`` of its fair share of
    predictions), the entropy of the predicted-class histogram (nats; ln 10 ≈ 2.30
    is uniform) and the mean confidence (max probability)."""
    k = probs.shape[1]
    counts = torch.bincount(probs.argmax(1), minlength=k).double()
    covered = int((counts >= min_share * len(probs) / k).sum())
    freq = counts / counts.sum()
    entropy = float(-(freq[freq > 0] * freq[freq > 0].log()).sum()) + 0.0  # no -0.0
    return covered, entropy, float(probs.max(1).values.mean())
