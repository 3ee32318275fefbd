"""DiCE objectives: policy-gradient surrogates whose derivatives of every order are
unbiased, so second-order game dynamics (LA, LOLA, SOS, SGA, consensus) run on
sampled returns.

A policy-gradient surrogate ``Σ log π · R`` has the right first derivative but
wrong higher ones. DiCE (Foerster, Farquhar, Al-Shedivat, Rocktäschel, Xing &
Whiteson 2018, "DiCE: The Infinitely Differentiable Monte-Carlo Estimator",
https://arxiv.org/abs/1802.05098) weights each reward by the *magic box* of the
log-probabilities of the actions it depends on:

    ⊡(x) = exp(x − ⊥(x)),   value 1,   ∇⊡(x) = ⊡(x) ∇x,

so that the objective's value is the sampled return and each of its derivatives,
of any order, is an unbiased estimate of the same derivative of the expected
return. A game whose losses are ``-objective(...)`` (one per agent) runs through
every gameopt algorithm unchanged: ξ, Jv, Jᵀv and the off-diagonal product H_o v
of a fixed v are unbiased. Products of two estimates (LOLA's χ, LA's H_o ξ, Jᵀξ)
are unbiased only when the two factors come from independent samples; see
``docs/dice.md`` for which terms are which and how to sample each agent's loss
from its own batch.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor

from . import debug

__all__ = ["magic_box", "objective"]


def magic_box(x: Tensor) -> Tensor:
    """⊡(x) = exp(x − x.detach()): evaluates to 1, and ∇⊡(x) = ⊡(x) ∇x.

    Args:
        x: any tensor, typically a sum of log-probabilities of sampled actions.

    Returns:
        A tensor of ones shaped like ``x`` that carries ``x``'s derivatives.
    """
    return torch.exp(x - x.detach())


def _check(name: str, t: Tensor, shape: torch.Size | None) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must have shape (T, B) (steps, episodes), got {tuple(t.shape)}")
    if shape is not None and t.shape != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, the rewards {tuple(shape)}")
    if shape is None and 0 in t.shape:
        what = "no steps (T = 0)" if t.shape[0] == 0 else "no episodes (B = 0)"
        raise ValueError(f"{name} has shape {tuple(t.shape)}: {what}; the objective needs at least one of each")


def _discount(value: object) -> float:
    """γ as a float in [0, 1]: a real number (a 0-d tensor too), not a string or a bool."""
    ok = isinstance(value, numbers.Real) or (isinstance(value, Tensor) and value.numel() == 1)
    if not ok or isinstance(value, bool) or (isinstance(value, Tensor) and not value.is_floating_point()):
        raise ValueError(f"discount must be a number in [0, 1], got {value!r} ({type(value).__name__})")
    discount = float(cast(float, value))  # a real number or a one-element tensor, checked above
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    return discount


def _check_finite(value: Tensor, inputs: dict[str, Tensor]) -> None:
    """Refuse a non-finite objective, naming the first input that is not finite."""
    value = value.detach()
    if bool(torch.isfinite(value)):
        return
    for name, t in inputs.items():
        bad = int((~torch.isfinite(t.detach())).sum())
        if bad:
            raise ValueError(
                f"{name} holds {bad} non-finite value(s) (NaN or ±inf), so the DiCE objective is {float(value)}: "
                "log-probabilities, rewards and baselines must be finite (a sampled action of probability 0 "
                "has log π = -inf)"
            )
    raise ValueError(f"the DiCE objective overflowed to {float(value)} from finite inputs: scale the rewards down")


def objective(logps: Sequence[Tensor], rewards: Tensor, discount: float, baseline: Tensor | None = None) -> Tensor:
    """The DiCE objective of one agent, averaged over a batch of episodes.

    The objective is

        L = 1/B Σ_b Σ_t γᵗ r_{t,b} ⊡(Σ_{t′≤t} Σ_agents log π(a_{t′,b}))

    whose value is the mean discounted return and whose derivatives of every order
    are unbiased estimates of those of the expected discounted return (Foerster et
    al. 2018, https://arxiv.org/abs/1802.05098). Maximize it (a gameopt loss is its
    negation).

    With ``baseline`` (b_{t,b}, for example a value estimate of the state at t;
    treated as a constant), the variance-reduction term of Mao et al. 2019 ("A
    Baseline for Any Order Gradient Estimation in Stochastic Computation Graphs",
    https://arxiv.org/abs/1809.07040), in the form of the LOLA-DiCE code, is added:

        + 1/B Σ_b Σ_t γᵗ (1 − ⊡(Σ_agents log π(a_{t,b}))) b_{t,b}

    Its value is 0 and the expectation of each of its derivatives is 0, so it changes
    no value and no expectation.

    Args:
        logps: one (T, B) tensor per agent: log π(a_t) of the actions sampled at
            step t of episode b, with their graphs to the policies' parameters.
        rewards: this agent's (T, B) rewards; usually data without a graph (a
            reward that depends on the parameters differentiably is differentiated
            through as well).
        discount: γ in [0, 1].
        baseline: optional (T, B) baseline (detached inside).

    Returns:
        The scalar objective.

    Raises:
        TypeError, ValueError: for inputs of the wrong type or shape, an empty
            ``logps``, no steps or no episodes (T = 0 or B = 0), a discount that is
            not a number in [0, 1].
        ValueError: a non-finite objective (a NaN or infinite log-probability,
            reward or baseline, named). Checked on the CPU, where reading the value
            costs nothing; on other devices only in debug mode
            (:mod:`gameopt.debug`), as the read is a host synchronisation (a game
            still refuses the non-finite step: :class:`~gameopt.NonFiniteError`).
    """
    logps = list(logps)
    if not logps:
        raise ValueError("logps must hold one (T, B) tensor per agent, got none")
    _check("rewards", rewards, None)
    for k, lp in enumerate(logps):
        _check(f"logps[{k}]", lp, rewards.shape)
    if baseline is not None:
        _check("baseline", baseline, rewards.shape)
    discount = _discount(discount)
    steps = torch.arange(rewards.shape[0], device=rewards.device, dtype=rewards.dtype)
    weights = (discount**steps).unsqueeze(1)  # γᵗ, (T, 1)
    joint = torch.stack(logps).sum(0)  # Σ_agents log π(a_t), (T, B)
    value = (weights * rewards * magic_box(torch.cumsum(joint, 0))).sum(0).mean()
    if baseline is not None:
        value = value + (weights * (1 - magic_box(joint)) * baseline.detach()).sum(0).mean()
    if value.device.type == "cpu" or debug.enabled():  # elsewhere the read is a host sync: debug mode only
        inputs = {**{f"logps[{k}]": lp for k, lp in enumerate(logps)}, "rewards": rewards}
        _check_finite(value, inputs if baseline is None else {**inputs, "baseline": baseline})
    return value
