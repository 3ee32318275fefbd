"""The author's face of an algorithm: :class:`Algorithm` and :class:`Wrapper`, what a
new algorithm subclasses (through :mod:`gameopt.algorithms.api`), with the (step, new
state) contract, what it declares (:class:`Hyper`, ``Setting``) and every public
member an author reads or overrides. What the game drives privately lives in rooms
of its own: the param groups and binding (``_param_groups.py``), checkpoints and
carrying the state (``_checkpoint.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from ..settings import Setting
from ..state import clone_state, moved_like, retyped, tensors_in
from ..updates import Plain, State, UpdateRule, apply, rule_from
from ..vec import Pieces, Scaled
from ._checkpoint import S, _Checkpoints, _WrapperCheckpoints, plain
from ._param_groups import Hyper, _ParamGroups, _WrapperParamGroups, check_lr, hypers_of

if TYPE_CHECKING:
    from ..protocols import GameView, OracleInterface
    from ..vec import Step, Vec


__all__ = ["Algorithm", "Hyper", "Setting", "State", "Wrapper"]


class Algorithm(_ParamGroups, _Checkpoints[S]):
    """Base class of gameopt algorithms, generic in the type of their state ``S`` (a
    ``TypedDict`` such as :class:`~gameopt.algorithms.api.DescentState`; at run time
    the state is a plain dict, so checkpoints hold plain dicts).

    An algorithm holds its settings: one param group per player (a dict with that
    player's ``'lr'`` and the schedulable hyperparameters), its update rule and the
    rest of its constructor's arguments. It holds no run state: the game does
    (``game.algorithm_state``), and every method that reads or writes a state takes
    it as an argument (:meth:`init_state` makes one, :meth:`update` steps one,
    :meth:`state_dict` and :meth:`load_state_dict` write and read one). It is bound
    to a game by :class:`~gameopt.Game`. Each step it queries the game's oracle and
    returns ``(delta, new_state)``; the game applies ``w ← w + delta`` and commits
    ``new_state`` as ``game.algorithm_state`` only if both are finite.

    An algorithm is not a ``torch.optim.Optimizer``: the game's
    :class:`~gameopt.optim.GameOptimizer` (``game.optimizer``) is, and shares these
    param groups, so schedulers and Lightning drive the game through it.

    Subclasses implement :meth:`init_state` and :meth:`update` (and may override
    :meth:`bind`, called as the algorithm joins a game, and :meth:`identity`, what a
    checkpoint records of the run). The game drives the rest through private methods:
    binding and the param groups' checks (``gameopt/algorithms/_param_groups.py``),
    checkpoints and carrying the state (``gameopt/algorithms/_checkpoint.py``).

    Names: :class:`Hyper` declares a schedulable hyperparameter on the class;
    :meth:`schedulable_hypers` lists those; a ``Setting`` declares a fixed one
    (``k = Setting.integer(low=1)``); both check every assignment, in
    the constructor or after it (``ValueError``, nothing changed); :attr:`settings`
    holds every constructor setting by name.
    """

    #: Whether only ξ is used (no Jacobian products); such an algorithm has a
    #: projected or mirror version on feasible sets (see :mod:`gameopt.constraints`).
    first_order = True

    #: Whether :meth:`update` evaluates the losses once per step, at the current point
    #: (one ``oracle.xi()``): its steps then keep no copy of the random-number state
    #: for later evaluations to share (:mod:`gameopt.evaluation`), and a second
    #: evaluation in a step is refused (``RuntimeError``, nothing changed).
    evaluates_once = False

    #: The step counts of this algorithm's own state, each with the joint vector whose
    #: elements it counts (as ``Optimistic`` and ``ACGD`` declare theirs): a parameter
    #: that joins a running game starts its own count from 0, the count then one per
    #: element (``next_count`` and ``stepped`` take either form). The update rule's
    #: state (under ``"rule"``) is the rule's to carry and check.
    counts: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self, lr: float | Sequence[float], update: UpdateRule | Sequence[UpdateRule] | None = None, **settings: Any
    ) -> None:
        """``update``: one update rule, or one per player (see :class:`~gameopt.updates.PerPlayer`).
        ``settings``: the algorithm's other arguments; each becomes an attribute,
        checked by its descriptor (a :class:`Hyper` of the class goes to the param
        groups, a ``Setting`` checks it) or already checked."""
        self._lr: float | list[float] | None = check_lr(lr)
        self._setup(rule_from(update), settings)
        if isinstance(update, (list, tuple)):  # one rule per player: its length is checked when bound
            self._rules_given = list(update)

    def _setup(self, rule: UpdateRule, settings: dict[str, Any]) -> None:
        """What every constructor sets beside the learning rates (a :class:`Wrapper`
        has none of its own)."""
        self.rule = rule
        self._defaults: dict[str, float] = {}  # the Hyper values before binding
        self._settings = list(settings)
        for name, value in settings.items():
            setattr(self, name, value)
        self.game: GameView | None = None
        self.param_groups: list[dict[str, Any]] = []  # one per player, once bound
        self.defaults: dict[str, Any] = {}  # torch.optim's defaults: the first player's values
        # the rules, keys and values that _check_groups last found valid (when all immutable)
        self._checked: tuple[list[UpdateRule], list[list[str]], list[Any]] | None = None

    @property
    def settings(self) -> dict[str, Any]:
        """Every setting given to the constructor, by name (for display)."""
        return {k: getattr(self, k) for k in self._settings}

    @classmethod
    def schedulable_hypers(cls) -> dict[str, Hyper]:
        """The schedulable hyperparameters (the class's :class:`Hyper` descriptors), by name."""
        return hypers_of(cast(type, cls))

    @property
    def lrs(self) -> list[float]:
        """The current learning rate of each player."""
        return [float(g["lr"]) for g in self.param_groups]

    def per_player(self, name: str) -> list[float]:
        """A schedulable hyperparameter's value for each player (checked)."""
        hyper = self.schedulable_hypers()[name]
        groups = self.param_groups
        if not groups:
            return [self._defaults[name]]
        return [hyper.check(g[name], f"param_groups[{k}].{name}") for k, g in enumerate(groups)]

    def bind(self, game: GameView) -> None:
        """Called as the algorithm joins ``game``, before its param groups are made:
        override it to check a setting against the game or to set a :class:`Hyper`
        that depends on it, and call ``super().bind(game)``. Nothing by default."""

    # ------------------------------------------------------------ interface
    def init_state(self, game: GameView) -> S:
        """The state before the first step (by default a
        :class:`~gameopt.algorithms.api.DescentState`: the update rule's state)."""
        return cast(S, {"rule": self.rule.init(game.layout.data)})

    def update(self, oracle: OracleInterface, state: S) -> tuple[Step, S]:
        """One step: return ``delta`` (w ← w + delta) and the new state, a new dict
        with the keys of ``state``. ``delta`` is a joint vector, or a
        :class:`~gameopt.algorithms.api.Scaled` step (:meth:`~gameopt.Algorithm.scaled_descent`), which the game's
        move applies in its own pass.

        Must not modify ``state`` or the parameters in place.
        """
        raise NotImplementedError

    # --------------------------------------------------------------- helpers
    def descend(
        self,
        oracle: OracleInterface,
        d: Vec | Pieces,
        rule_state: dict[str, Any],
        scratch: bool = False,
        own_state: bool = False,
    ) -> tuple[Vec, dict[str, Any]]:
        """−η · rule(d), per player, and the rule's new state. ``scratch``: ``d`` may be
        overwritten (the gradient buffer or a temporary); the step is then written into
        it, taking no vector. ``own_state``: ``rule_state`` is a temporary of this step
        (not the committed state), updated in place (see :mod:`gameopt.updates`)."""
        step, new_rule_state = self.scaled_descent(oracle, d, rule_state, scratch=scratch, own_state=own_state)
        return oracle.layout.resolve(step, oracle.empty), new_rule_state

    @property
    def reads_xi_as_is(self) -> bool:
        """Whether the update rule is the plain gradient (:class:`~gameopt.Plain`): its
        direction is ξ itself, which :meth:`scaled_descent` may then take as
        :class:`~gameopt.vec.Pieces` (``oracle.xi(pieces=True)``: no copy of ξ)."""
        return type(self.rule) is Plain

    @property
    def reads_pieces(self) -> bool:
        """Whether :meth:`scaled_descent` takes ξ in pieces (``oracle.xi(pieces=True)``):
        the plain rule's step is ξ itself (:attr:`reads_xi_as_is`); a rule that declares
        ``reads_pieces`` (Momentum, Adam, RMSProp) reads each parameter's gradient where
        autograd left it, where the parameters tile their groups and their tensors are
        large (``Pieces.rules_read_here``); elsewhere ξ is filled into the gradient
        buffer first (one foreach copy of ξ as autograd returned it)."""
        return self.reads_xi_as_is or self.rule.reads_pieces

    def rule_input(self, d: Vec | Pieces) -> Vec | Pieces:
        """ξ as the update rule reads it: in pieces where it declares ``reads_pieces`` and
        they may be read per parameter here (``Pieces.rules_read_here``, no piece in
        the buffer), else the joint vector (``Pieces.filled()``, the copy)."""
        if not isinstance(d, Pieces) or (self.rule.reads_pieces and d.rules_read_here and not d.in_buffer):
            return d
        return d.filled()

    def scaled_descent(
        self,
        oracle: OracleInterface,
        d: Vec | Pieces,
        rule_state: dict[str, Any],
        scratch: bool = False,
        own_state: bool = False,
    ) -> tuple[Scaled, dict[str, Any]]:
        """:meth:`descend`'s step as the direction ``rule(d)`` and the factors ``−η``
        (a :class:`~gameopt.algorithms.api.Scaled` step), which the game's move applies in its own
        pass: return it from :meth:`update` as it is, one pass over memory fewer than
        scaling first. The direction may be ``d`` or the rule's state: it is read when
        the game moves, so nothing may write into either before ``update`` returns."""
        factors = [-float(g["lr"]) for g in self.param_groups]
        if isinstance(d, Pieces) and self.reads_xi_as_is:  # ξ where autograd left it: the step itself
            return Scaled(d, factors, into=d if scratch else None), rule_state
        d = self.rule_input(d)
        vec = cast("Vec", d)  # (Pieces only to a rule that declares reads_pieces)
        out, new_rule_state = apply(self.rule, vec, rule_state, oracle.empty, scratch=scratch, own_state=own_state)
        if isinstance(d, Pieces) and scratch:  # (the rule read it; the buffer is scratch)
            d = d.scratch()
        implied = [t for k in self.rule.implied for t in new_rule_state[k]] if self.rule.implied else ()
        bounds = self.rule.direction_bounds(new_rule_state, out)
        state_tensors = tensors_in(new_rule_state) if new_rule_state else []
        if state_tensors and not set(map(id, out)).isdisjoint(map(id, state_tensors)):
            # the rule keeps its result (momentum): resolved, the step goes into d (or a new vector)
            return Scaled(out, factors, into=d if scratch else None, implied=implied, bounds=bounds), new_rule_state
        into = None if out is d and not scratch else out  # resolved, ``d`` stays intact
        return Scaled(out, factors, into=into, implied=implied, bounds=bounds), new_rule_state

    # ---------------------------------------------------------- checkpoints
    def identity(self) -> dict[str, Any]:
        """What a checkpoint records to know the run that saved it, beside the state:
        the algorithm's type, its settings that are not scheduled (those live in the
        param groups), its update rule's :meth:`~gameopt.UpdateRule.identity` and, for a
        :class:`~gameopt.Wrapper`, its base's identity. A checkpoint whose
        identity differs is refused, naming the difference."""
        hypers = self.schedulable_hypers()
        settings = {k: plain(getattr(self, k)) for k in self._settings if k not in hypers and k != "base"}
        return {"type": type(self).__name__, "settings": settings, "rule": self.rule.identity()}

    def state_dict(self, state: S) -> dict[str, Any]:
        """A snapshot: the type's name, what identifies the run (:meth:`identity`), the
        param groups (without ``params``) and a copy of ``state`` (the state the game
        holds)."""
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        # a snapshot: the live state's tensors are reused by later steps
        return {
            "type": type(self).__name__,
            "identity": self.identity(),
            "param_groups": groups,
            "state": clone_state(state),
        }

    def load_state_dict(self, state_dict: dict[str, Any], state: S) -> S:
        """Restore a :meth:`state_dict`: its param groups into this algorithm's, and its
        state returned, shaped as ``state`` (the state the game holds, left unchanged)
        for the game to hold in its place. A state dict that does not fit raises
        ``ValueError`` and changes nothing."""
        like = self._loadable(state_dict, state, "algorithm")
        for mine, theirs in zip(self.param_groups, state_dict["param_groups"]):
            mine.update({k: v for k, v in theirs.items() if k != "params"})
        # each tensor to the device of the one it replaces, as torch.optim does
        return cast(S, retyped(like, moved_like(like, state_dict["state"])))

    def __repr__(self) -> str:
        lr = self.lrs if self.game is not None else self._lr
        extra = "".join(f", {k}={v!r}" for k, v in self.settings.items())
        rule = "" if isinstance(self.rule, Plain) else f", update={self.rule!r}"
        return f"{type(self).__name__}(lr={lr!r}{extra}{rule})"


class Wrapper(_WrapperParamGroups, _WrapperCheckpoints[S], Algorithm[S]):
    """An algorithm around a ``base`` algorithm that moves the iterates.

    It shares the base's param groups (so its learning rates and schedulers) and its
    first-order nature; subclasses add state around the base's (the base's own
    under the key ``"base"``, within the one state the game holds).

    It takes no learning rate of its own: ``__init__(base, **settings)``, the
    settings as :class:`Algorithm` takes them."""

    base: Algorithm[Any]

    def __init__(self, base: Algorithm, **settings: Any) -> None:
        if not isinstance(base, Algorithm):
            raise TypeError(f"base must be a gameopt Algorithm, got {type(base).__name__}")
        self._lr = None  # the base's learning rates are the ones in use
        self._setup(rule_from(None), settings)
        self.base = base

    @property
    def first_order(self) -> bool:  # type: ignore[override]
        """Whether only ξ is used (no Jacobian products), as for the base algorithm."""
        return self.base.first_order

    @property
    def evaluates_once(self) -> bool:  # type: ignore[override]
        """Whether ``update`` evaluates the losses once per step, as for the base algorithm."""
        return self.base.evaluates_once

    def identity(self) -> dict[str, Any]:
        """:meth:`Algorithm.identity`, with its base's under ``"base"``."""
        return {**super().identity(), "base": self.base.identity()}

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.settings.items())
        return f"{type(self).__name__}({self.base!r}{extra})"
