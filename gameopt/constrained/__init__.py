"""Lagrangian constrained learning: a constrained problem as a two-player game.

The problem

.. math::
    \\min_w f(w) \\quad \\text{subject to} \\quad g(w) \\le 0, \\; h(w) = 0
    \\qquad (g: ℝ^d → ℝ^m, \\; h: ℝ^d → ℝ^p)

becomes the min-max game of its Lagrangian

.. math::
    L(w, λ, μ) = f(w) + λ^⊤ g(w) + μ^⊤ h(w), \\qquad λ ≥ 0,

between the primal player (the model, ``w``), which minimizes ``L``, and the
multiplier player (``λ`` on the non-negative orthant, :class:`~gameopt.constraints.NonNegative`;
``μ`` free), which maximizes it (its loss is ``−(λᵀg + μᵀh)``). Its
vector field is ξ = (∇_w L, −g(w), −h(w)), so every first-order algorithm of
:class:`~gameopt.Game` applies: SimGD is projected gradient descent-ascent,
``λ ← [λ + η g(w)]₊``; Extragradient and Optimistic are their projected
versions (the extrapolated multipliers are projected too). A saddle point with
λ ≥ 0 is a KKT point of the problem, and the game's fixed points are its KKT
points (Bertsekas 1982, "Constrained Optimization and Lagrange Multiplier
Methods").

One file per job:

* ``observations.py``: what a step observes of the constraints (``(f, g, h)``
  checked; :class:`Proxy` surrogates, :class:`Sampled` subsets);
* ``formulations.py``: how the losses compose them, one small class per
  formulation: the Lagrangian; the augmented Lagrangian (``penalty = c > 0``,
  Hestenes, Powell and Rockafellar; cooper's ``AugmentedLagrangian``); the quadratic
  penalty (no multipliers; cooper's ``QuadraticPenalty``). Each class's docstring
  gives its equation;
* ``penalties.py``: the penalty coefficients, one per constraint, grown by a
  :class:`MultiplicativePenalty` (Nocedal & Wright 2006, Framework 17.1; cooper's
  ``MultiplicativePenaltyCoefficientUpdater``), and carried in checkpoints;
* ``multipliers.py``: the multiplier player's module, a multiplier per constraint
  or a model of the constraints' features (``multipliers=module``: cooper's
  ``ImplicitMultiplier``, Narasimhan et al. 2020, "Approximate Heavily-Constrained
  Learning with Lagrange Multiplier Models"; for inequalities its outputs must be
  non-negative: end it with a softplus or a ReLU);
* ``nupi.py``: :class:`NuPI`, an update rule for the multipliers (Sohrabi et al. 2024);
* ``game.py``: :class:`LagrangianGame`, which puts them together as a
  :class:`~gameopt.Game`.
"""

from .game import LagrangianGame
from .nupi import NuPI
from .observations import Proxy, Sampled
from .penalties import MultiplicativePenalty

__all__ = ["LagrangianGame", "MultiplicativePenalty", "NuPI", "Proxy", "Sampled"]
