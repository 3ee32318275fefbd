"""The Lagrangian game: a constrained problem as a game between the model and its
Lagrange multipliers (or the model alone, under a quadratic penalty)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from ..algorithms.base import Algorithm
from ..checks import check_number
from ..constraints import NonNegative
from ..evaluation import StepLosses
from ..game import Game
from ..player import Player
from .formulations import formulation as chosen_formulation
from .multipliers import Multipliers, multiplier_models
from .observations import Observed, observe, violation
from .penalties import MultiplicativePenalty, Penalties, check_update

ObjectiveAndConstraints = Callable[..., Sequence[Any]]


class LagrangianGame:
    """Minimize ``f(w)`` subject to ``g(w) ≤ 0`` and ``h(w) = 0``, as a game between the model and its
    Lagrange multipliers, or by a quadratic penalty (see the ``gameopt.constrained``
    package docstring for the equations).

    Args:
        model: the primal player: an ``nn.Module`` or a :class:`Player` (which may
            carry a feasible set of its own).
        objective_and_constraints: ``(*args, **kwargs) -> (f, g, h)``: the scalar
            objective, the inequality values ``g`` of shape ``(num_ineq,)`` and the
            equality values ``h`` of shape ``(num_eq,)``. A group with no
            constraint may be ``None`` (or empty); a single constraint may be a
            0-d tensor; ``g`` or ``h`` may be a :class:`Proxy` or a :class:`Sampled`.
            Checked at every evaluation.
        num_ineq, num_eq: the numbers of constraints (not both 0).
        algorithm: a first-order gameopt algorithm (default ``SimGD(1e-3)``); its
            per-player learning rates are ``[model, multipliers]`` (only the model's
            with the quadratic penalty).
        penalty: ``c ≥ 0``, the penalty coefficient (0: the plain Lagrangian; > 0: the
            augmented Lagrangian, or the quadratic penalty's starting coefficient).
        formulation: ``"lagrangian"``, ``"augmented_lagrangian"`` or
            ``"quadratic_penalty"`` (default: the Lagrangian, augmented when
            ``penalty > 0``).
        penalty_update: a :class:`MultiplicativePenalty` that grows each constraint's
            coefficient after each step (the coefficients are then one per constraint,
            in :attr:`penalties` and in checkpoints).
        multipliers: a multiplier model (an ``nn.Module`` mapping the observed
            constraints' features, shape (k, ...), to their k multipliers) for the one
            kind of constraint the game has, or ``{"ineq": model, "eq": model}``. With a
            model, that kind must be returned as ``Sampled(values, features)``.

    ``step(*args, **kwargs)`` runs one step of the game and returns its losses at the
    start of the step (the primal loss and the multipliers' ``−(λᵀg + μᵀh)``)
    with the metrics ``objective`` (f) and ``violation`` (max(0, gᵢ) and ``|hⱼ|`` at
    their largest). ``game`` is the :class:`~gameopt.Game`, whose players are
    ``[model, multipliers]`` (``[model]`` with the quadratic penalty).

    Raises:
        ValueError: no constraints (``num_ineq`` and ``num_eq`` both 0), a negative
            or non-finite ``penalty``, a formulation that does not fit it, a
            ``penalty_update`` without a penalty, with a multiplier model or with a
            ``max_coefficient`` below ``penalty``, or ``multipliers`` that do not fit
            the constraints.
        TypeError: ``objective_and_constraints`` is not callable, or ``multipliers``
            or ``penalty_update`` of the wrong type.
    """

    def __init__(
        self,
        model: nn.Module | Player,
        objective_and_constraints: ObjectiveAndConstraints,
        *,
        num_ineq: int = 0,
        num_eq: int = 0,
        algorithm: Algorithm | None = None,
        penalty: float = 0.0,
        formulation: str | None = None,
        penalty_update: MultiplicativePenalty | None = None,
        multipliers: nn.Module | Mapping[str, nn.Module] | None = None,
    ) -> None:
        self.num_ineq = check_number("num_ineq", num_ineq, low=0, integer=True)
        self.num_eq = check_number("num_eq", num_eq, low=0, integer=True)
        if num_ineq == 0 and num_eq == 0:
            raise ValueError("a LagrangianGame needs constraints: num_ineq and num_eq are both 0")
        if not callable(objective_and_constraints):
            raise TypeError("objective_and_constraints must be a callable returning (f, g, h)")
        self.penalty = check_number("penalty", penalty, low=0.0)
        self.formulation = chosen_formulation(formulation, self.penalty)
        models = multiplier_models(multipliers, num_ineq, num_eq)
        self.formulation.check_models(models)
        check_update(penalty_update, self.penalty, penalized=self.formulation.penalized, modeled=bool(models))
        self.penalty_update = penalty_update
        self.objective_and_constraints = objective_and_constraints
        primal = model if isinstance(model, Player) else Player(model)
        first = primal.parameters[0]
        self._counts = {"ineq": num_ineq, "eq": num_eq}
        self._modeled = frozenset(models)  # the kinds whose multipliers are a model
        self._penalties = Penalties(self.penalty, penalty_update, self._counts, first.dtype, first.device)
        self._seen: tuple[Observed, Observed] | None = None  # the constraints at the start of a step
        if not self.formulation.has_multipliers:
            self.multiplier_module = None
            self.game = Game([primal], self._losses, algorithm=algorithm)
            return
        self.multiplier_module = Multipliers(num_ineq, num_eq, first.dtype, first.device, models)
        dense_ineq = num_ineq and "ineq" not in models
        dual = Player(
            self.multiplier_module, name="multipliers", constraint={"ineq": NonNegative()} if dense_ineq else None
        )
        self.game = Game([primal, dual], self._losses, algorithm=algorithm)

    # ------------------------------------------------------------ evaluation
    def evaluate(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor]:
        """(f, g, h) at the current point as the model's Lagrangian sees them, checked:
        f 0-d, g of shape (num_ineq,), h of shape (num_eq,) (with the graph: detach for
        logging). A :class:`Proxy` gives its surrogate; a :class:`Sampled` its observed
        values only (shape (k,))."""
        f, g, h = self._observe(*args, **kwargs)
        return f, g.primal, h.primal

    def _observe(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Observed, Observed]:
        """f and the observed constraints: what the model's Lagrangian and the
        multipliers' ascent each use, and which constraints were observed."""
        return observe(self.objective_and_constraints(*args, **kwargs), self._counts, self._modeled)

    def _losses(self, *args: Any, **kwargs: Any) -> tuple[Tensor | dict[str, Tensor], ...]:
        f, g, h = self._observe(*args, **kwargs)
        if self._seen is None:
            self._seen = (g, h)
        metrics = {"objective": f.detach(), "violation": violation(g.dual, h.dual)}
        cg, ch = self._penalties.of("ineq", g), self._penalties.of("eq", h)
        return (*self.formulation.losses(f, g, h, self.multiplier_module, cg, ch), metrics)

    # ------------------------------------------------------------------ API
    def step(self, *args: Any, **kwargs: Any) -> StepLosses:
        """One step of the game; the arguments go to ``objective_and_constraints``.
        With a ``penalty_update``, the observed constraints' coefficients then grow by
        their violations at the start of the step (not after a skipped step). Under
        ``game.verdict = "device"`` they grow once the step's verdict is read as taken:
        such a step ends with ``game.synchronize()`` (a refused step raises there, and
        nothing grows)."""
        self._seen = None
        skipped = self.game.skipped_steps
        out = self.game.step(*args, **kwargs)
        if self.game.skipped_steps == skipped and self._seen is not None:
            if self._penalties.update is not None and self.game.verdict == "device":
                self.game.synchronize()  # the growth follows the verdict: read it first
            self._penalties.grow(self._seen)
        self._seen = None
        return out

    @property
    def multipliers(self) -> tuple[Tensor | None, Tensor | None]:
        """The current multipliers (λ, μ) as copies, of shapes (num_ineq,) and
        (num_eq,); None for a kind held by a model (call the model on features).

        Raises:
            AttributeError: a quadratic-penalty game, which has no multipliers.
        """
        if self.multiplier_module is None:
            raise AttributeError("a quadratic-penalty LagrangianGame has no multipliers")
        return tuple(None if m is None else m.detach().clone() for m in self.multiplier_module.values())  # type: ignore[return-value]

    @property
    def penalties(self) -> tuple[Tensor, Tensor]:
        """The penalty coefficients (one per inequality, one per equality) as copies."""
        return self._penalties.copies()

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The game's state (model, multipliers, algorithm: see :meth:`Game.state_dict`),
        with the penalty coefficients under ``"penalties"`` when a ``penalty_update``
        moves them."""
        state = self.game.state_dict()
        if self.penalty_update is not None:
            state["penalties"] = self._penalties.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; one that does not fit raises ``ValueError`` and
        changes nothing."""
        penalties = None
        if self.penalty_update is not None:
            saved = state_dict.get("penalties") if isinstance(state_dict, dict) else None
            penalties = self._penalties.checked(saved)
        game_state = (
            {k: v for k, v in state_dict.items() if k != "penalties"} if isinstance(state_dict, dict) else state_dict
        )
        self.game.load_state_dict(game_state)
        if penalties is not None:
            self._penalties.load(penalties)
