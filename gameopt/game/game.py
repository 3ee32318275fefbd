"""The :class:`Game`: players, their losses and an algorithm.

Here: building and checking a game, the step, the public derivatives
(:meth:`Game.vector_field`, :meth:`Game.jvp`, ...) and data parallelism. The rest
of the package holds what the game delegates to: :mod:`.oracle` (what an algorithm
may ask), :mod:`.moves` (feasible points), :mod:`.relayout` (following players that
change) and :mod:`.checkpoint` (``state_dict`` and its checks).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any, cast

import torch
from torch import Tensor, nn

from .. import _torch_compat as tc
from .. import autodiff
from ..algorithms import first_order_names
from ..algorithms.base import Algorithm
from ..copying import copy_callable
from ..distributed import DataParallel
from ..evaluation import BufferCopies, Evaluations, StepLosses, restore_buffers
from ..interrupts import defer, deferred_interrupts, resume
from ..layout import JointLayout, StepVectors
from ..loss_scale import DynamicLossScale
from ..optim import GameOptimizer
from ..player import Player
from ..protocols import Linearization
from ..sharded import ShardedBuffer, Shards
from ..state import tensors_in
from ..updates import zero_eps_advice
from ..vec import Pieces, Scaled, Step, Vec, all_finite, finite_bounds
from . import checkpoint, reentry, relayout
from .errors import NonFiniteError
from .moves import Moves
from .oracle import StepContext, StepOracle
from .rollback import Rollback
from .sharded_checkpoint import local_form, saved_form
from .verdict import Checks, Pending

log = logging.getLogger(__name__)

#: one flat tensor per player (a tuple of them for a player with several groups)
PlayerParts = tuple[Tensor | tuple[Tensor, ...], ...]


def _one_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` holding the game's lock (:attr:`Game.lock`): a call from another
    thread waits until the running step (or checkpoint call) has finished; the same
    thread may call in again (a closure, a scheduler, ``game.optimizer.step``)."""

    @functools.wraps(method)
    def wrapped(self: Game, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)

    return wrapped


def _evaluating(method: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`_one_at_a_time`, with autograd on, also when called under
    ``torch.no_grad()`` or ``torch.inference_mode()``: an evaluation of the game
    (a step, ξ, a linearization) needs gradients whatever the caller's mode."""

    @functools.wraps(method)
    def wrapped(self: Game, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
                return method(self, *args, **kwargs)  # already so: no context to enter
            with torch.inference_mode(False), torch.enable_grad():
                return method(self, *args, **kwargs)

    return wrapped


class Game:
    """A differentiable game: player i minimizes ``losses(...)[i]`` over its own
    parameters.

    Args:
        players: :class:`Player` objects; a plain ``nn.Module`` or ``nn.Parameter`` is
            wrapped in one (``Player(module)``).
        losses: callable returning one scalar loss per player; it draws its own
            data, or receives the arguments given to :meth:`step`. ``None``: use
            each player's own ``loss=``.
        algorithm: an :class:`~gameopt.Algorithm`; default ``SimGD(lr=1e-3)``.
            The game binds it (``game.algorithm``) and wraps it in a
            ``torch.optim.Optimizer``, ``game.optimizer`` (a
            :class:`~gameopt.optim.GameOptimizer`), for schedulers and Lightning.
            The algorithm holds settings; the game holds the run's state
            (``game.algorithm_state``), commits each step's and carries it across
            re-layouts and checkpoints.
        on_nonfinite: ``"raise"`` (default) refuses a step whose vector field or
            update is not finite with :class:`NonFiniteError`; ``"skip"`` skips it
            (counted in ``game.skipped_steps``). Either way nothing changes.
        process_group: a ``torch.distributed`` process group: the game becomes
            data-parallel. Each rank evaluates its losses on its shard of the data;
            every vector field and Jacobian product is averaged across ranks (one
            collective per joint tensor), so all ranks apply the same update.
            Parameters and module buffers are broadcast from rank 0 here, and the
            buffers (BatchNorm statistics) again after every step taken, as DDP's
            ``broadcast_buffers`` (docs/data-parallel.md). A rank whose losses fail
            or are not finite makes every rank refuse the step together.
            Players sharded with FSDP2 (``fully_shard``) need none: FSDP averages
            their gradients, and the game agrees on each step's verdict across the
            ranks (docs/sharded.md).
        check_replicas_every: in a data-parallel game, check every this many steps
            that the ranks' parameters and persistent buffers are still identical
            (0: never).
        loss_scale: a :class:`~gameopt.DynamicLossScale` for float16 players: steps
            that overflow are skipped (nothing changed) and the scale backs off.
        verdict: where a step's verdict (finite, and its new point within its dtype)
            is formed. ``"host"`` (default): read in one host sync before anything is
            written; a refused step raises :class:`NonFiniteError` at once. ``"device"``:
            kept on the device, no host sync (:mod:`gameopt.game.verdict`): the
            parameters move only where the verdict takes the step, decided on the
            device, and a refused step is undone and its :class:`NonFiniteError`
            raised by the end of the next step (refused with it) or by
            :meth:`synchronize`; a call that reads or replaces the game's state
            reads the verdict first (a load, a new algorithm or state raise a refusal read
            there before they change anything). Points to evaluate at are checked with
            the rest, not before: an extrapolation that is not finite is evaluated,
            and the step refused. For games of real players on one device, without
            feasible sets, data parallelism, sharding, a loss scale or
            ``on_nonfinite="skip"``.

    A game refuses a starting point that is not finite and parameters on the
    ``meta`` device (``ValueError``); a refused game changes nothing it was given
    (the players' names, parameters, gradients and storage, the algorithm's binding).
    An algorithm belongs to one game: another game refuses it (bind
    ``copy.deepcopy(algorithm)``). ``copy.deepcopy(game)`` is an independent game
    that steps as this one does; pickling is refused (save :meth:`state_dict`).
    One call at a time: a step, ``state_dict``, ``load_state_dict`` and the products
    hold ``game.lock`` (a re-entrant lock), so a call from another thread waits for
    the running one (docs/misuse.md). From
    inside a running step (its losses), a call that changes the game (a step,
    ``load_state_dict``, a new ``algorithm``, ``optimizer.load_state_dict``) is
    refused with ``RuntimeError``, nothing changed; a read-only one (ξ, the products,
    ``linearize``, ``state_dict``) runs at the point the step is evaluating and leaves
    the step as it was. A step, a load and a change of algorithm are whole under
    Ctrl-C: its ``KeyboardInterrupt`` waits for them (``gameopt.interrupts``).

    Raises:
        ValueError: no players, a parameter owned by two players, neither ``losses``
            nor every player's ``loss=``, a setting out of range, a
            starting point that is not finite, or a parameter on the ``meta`` device.
        TypeError: an algorithm whose settings are incomplete (nothing is bound).
    """

    _algorithm: Algorithm
    _algorithm_state: Any

    def __init__(
        self,
        players: Sequence[Player | nn.Module | Tensor],
        losses: Callable[..., Sequence[Tensor | Mapping[str, Any]] | Tensor] | None = None,
        *,
        algorithm: Algorithm | None = None,
        on_nonfinite: str = "raise",
        process_group: Any = None,
        check_replicas_every: int = 0,
        loss_scale: DynamicLossScale | None = None,
        verdict: str = "host",
    ) -> None:
        from ..algorithms import SimGD

        # one step (or state_dict/load_state_dict) at a time; re-entrant for the thread holding it
        self.lock = threading.RLock()
        # while a step runs (see stepping): set, with the module buffers it started from
        self._step_buffers: list[tuple[Tensor, Tensor]] | None = None
        self._buffer_copies = BufferCopies()  # the module buffers a step starts from
        self._evaluation_copies = BufferCopies()  # and those an evaluation elsewhere puts back
        # the device verdict: the step whose verdict is not read yet, the copies of the module
        # buffers the step after it saves into, and a refusal read outside a step (raised by
        # the next step or synchronize)
        self._pending: Pending | None = None
        self._spare_copies = BufferCopies()
        self._refusal: NonFiniteError | None = None
        if isinstance(players, (Player, nn.Module)) or len(players) == 0:
            raise ValueError("Game needs a list of players")
        algorithm = algorithm if algorithm is not None else SimGD(lr=1e-3)
        rollback = Rollback(players, algorithm)  # a refused game changes nothing it was given
        try:
            self.players = [rollback.player(p) for p in players]
            _unique_names(self.players)
            self._check_ownership()
            if losses is None:
                missing = [p.name for p in self.players if p.loss is None]
                if missing:
                    raise ValueError(f"no losses given and players {missing} have no loss=")
                losses = self._own_losses
            elif not callable(losses):
                raise TypeError("losses must be a callable returning one scalar loss per player")
            self.losses = losses
            if on_nonfinite not in ("raise", "skip"):
                raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}")
            self.on_nonfinite = on_nonfinite
            if loss_scale is not None and not isinstance(loss_scale, DynamicLossScale):
                raise TypeError(f"loss_scale must be a gameopt.DynamicLossScale, got {type(loss_scale).__name__}")
            self.loss_scale = loss_scale
            self.skipped_steps = 0
            self._forward_mode = autodiff.ForwardMode()  # kept across re-layouts
            _check_algorithm(algorithm)
            self._parallel = DataParallel(process_group) if process_group is not None else None
            self.check_replicas_every = int(check_replicas_every)
            self._steps = 0
            self._shards = self._sharding(process_group)
            if verdict not in ("host", "device"):
                raise ValueError(f"verdict must be 'host' or 'device', got {verdict!r}")
            self._verdict = verdict
            self._build_layout()
            self._check_verdict()
            self._check_fits(algorithm)
            self._check_values()
            self._start(algorithm)
        except BaseException:
            rollback.undo()
            raise

    @property
    def algorithm_state(self) -> Any:
        """The algorithm's state, the run's memory (a plain dict typed by the
        algorithm's ``TypedDict``): the game passes it to ``algorithm.update``, commits
        the new one after the step's checks, carries it across re-layouts and
        checkpoints it. Read it; replacing it changes what the next step starts from.
        Under the device verdict, reading it outside a step reads the last step's
        verdict first (:meth:`synchronize` raises a refusal read here), and replacing
        it calls :meth:`synchronize` first, as a load does."""
        if self._pending is None and self._verdict == "host":
            return self._algorithm_state
        with self.lock:  # (a read on another thread waits for a running step: it may commit a state unread)
            self._settle()
            return self._algorithm_state

    @algorithm_state.setter
    def algorithm_state(self, state: Any) -> None:
        if self._pending is None and self._refusal is None:
            self._algorithm_state = state
            return
        with self.lock:  # as a load: a refusal of the state it replaces is raised first
            if not self.stepping:  # (from the losses, as under the host verdict: the step commits its own)
                self.synchronize()
            self._algorithm_state = state

    @property
    def verdict(self) -> str:
        """Where a step's verdict is formed, ``"host"`` or ``"device"`` (see the class).
        Assigning another reads the last step's verdict first (a refusal read there is
        raised by the next step or :meth:`synchronize`), and is refused (``ValueError``,
        nothing changed) for what the device verdict does not cover."""
        return self._verdict

    @verdict.setter
    @_one_at_a_time
    def verdict(self, verdict: str) -> None:
        self._refuse_in_step("game.verdict = ...")
        if verdict not in ("host", "device"):
            raise ValueError(f"verdict must be 'host' or 'device', got {verdict!r}")
        self._settle()
        old, self._verdict = self._verdict, verdict
        try:
            self._check_verdict()
        except ValueError:
            self._verdict = old
            raise
        if verdict != old:
            self._moves.forget_bounds()  # each verdict's bound on the point is its own

    def _check_verdict(self) -> None:
        """Refuse (``ValueError``) what the device verdict does not cover: checked when
        the game is built, when ``verdict`` is assigned, and before each step (a setting
        changed since, or players that changed into a layout it does not cover)."""
        if self._verdict != "device":
            return
        refused = [
            ("on_nonfinite='skip'", self.on_nonfinite == "skip"),
            ("a loss scale", self.loss_scale is not None),
            ("a process group", self._parallel is not None),
            ("sharded players", self._shards is not None),
            (self._layout_gap, self._layout_gap is not None),
        ]
        for what, present in refused:
            if present:
                raise ValueError(
                    f"verdict='device' does not cover {what} yet: the step's verdict is read on the host there "
                    "(verdict='host')"
                )

    def _layout_gap_now(self) -> str | None:
        """What of the layout the device verdict does not cover (``None``: nothing)."""
        devices = {key[0] for key in self.layout.keys}
        if self._moves.constrained:
            return "feasible sets (constraints)"
        if len(devices) > 1:
            return f"players on {len(devices)} devices"
        if any(key[1].is_complex for key in self.layout.keys):
            return "complex players"
        return None

    def _start(self, algorithm: Algorithm) -> None:
        """Bind ``algorithm`` (``self.optimizer``, its state), then make the starting
        point: rank 0's in a data-parallel game, checked finite, projected onto the
        feasible sets. Every refusal of the algorithm comes before a value changes."""
        if self._parallel is None:
            self._check_start()
        self.algorithm = algorithm  # binds it and builds ``self.optimizer``
        if self._parallel is not None:  # rank 0's parameters and buffers, as DDP does
            with torch.no_grad():
                self._parallel.broadcast_(self.layout.data)
                self._parallel.broadcast_coalesced_(self._replicated_buffers())
            self._check_start()
        moved = self.project_(self.layout.data)
        for what in moved:
            log.info("the starting point was outside its feasible set: projected %s", what)
        if moved or self._parallel is not None:  # the state of the point the game starts from
            self.algorithm_state = algorithm.init_state(self)

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm, bound to this game. Assigning another one checks that it fits
        the players, binds it, makes its fresh state (``game.algorithm_state``) and
        builds a new ``optimizer`` (the ``torch.optim.Optimizer`` for schedulers and
        Lightning); the previous optimizer then refuses to step."""
        return self._algorithm

    @algorithm.setter
    @_one_at_a_time
    def algorithm(self, algorithm: Algorithm) -> None:
        self._refuse_in_step("game.algorithm = ...")
        self.synchronize()  # a refused step of the run this replaces: said before anything changes
        _check_algorithm(algorithm)
        self._check_fits(algorithm)
        with deferred_interrupts():  # the algorithm, its state and the optimizer change together
            algorithm._bind(self)
            state = algorithm.init_state(self)
            self._algorithm = algorithm
            self.algorithm_state = state
            self.optimizer = GameOptimizer(self, algorithm)

    def _refuse_in_step(self, call: str) -> None:
        """Refuse ``call``, which changes the game, inside a running step (the caller
        holds the lock: only the step's own thread gets here while it runs)."""
        if self.stepping:
            raise reentry.refused(call)

    @property
    def stepping(self) -> bool:
        """Whether the caller runs inside a step of this game, on the step's own thread
        (in its losses, say). Read holding ``game.lock``, as every call of the game does,
        it says whether any step of this game is running."""
        return self._step_buffers is not None and self._step_below(inspect.currentframe())

    def _step_below(self, frame: FrameType | None) -> bool:
        """Whether a step of this game runs below ``frame`` on this thread's stack (the
        mark ``_step_buffers`` may be another thread's step, or one that an interrupt cut
        short left behind: the next step clears it)."""
        while frame is not None:
            if frame.f_code is _STEP_CODE and frame.f_locals.get("self") is self:
                return True
            frame = frame.f_back
        return False

    def _sharding(self, process_group: Any) -> Shards | None:
        """The agreement across ranks of a game of FSDP-sharded players (every player
        sharded, over one mesh of all ranks), or None for a game of whole players."""
        sharded = [p.name for p in self.players if any(isinstance(b, ShardedBuffer) for b in p.buffers)]
        if not sharded:
            return None
        whole = [p.name for p in self.players if p.name not in sharded]
        if whole:
            raise ValueError(
                f"players {sharded} are sharded (fully_shard) and {whole} are not: a player replicated on every rank "
                "would step on its rank's gradient alone; fully_shard every player of a sharded game"
            )
        if process_group is not None:
            raise ValueError(
                "process_group= averages replicated players; sharded players are averaged by FSDP itself. To "
                "replicate shards across nodes, give fully_shard a 2-D mesh (HSDP) instead"
            )
        # equal meshes hash alike
        meshes = {b.mesh() for p in self.players for b in p.buffers if isinstance(b, ShardedBuffer)}
        if len(meshes) != 1:
            raise ValueError("the players are sharded over different device meshes: shard them over one mesh")
        return Shards(next(iter(meshes)))

    @property
    def sharded(self) -> bool:
        """Whether the players are sharded with FSDP2 (``fully_shard``; docs/sharded.md)."""
        return self._shards is not None

    def _check_fits(self, algorithm: Algorithm) -> None:
        """Second-order algorithms have no projected version. (They need double backward:
        whether a ``torch.compile``'d module or loss gives it depends on its backend, so
        each step's graph tells, before it is differentiated: ``refuse_compiled``.)"""
        if algorithm.first_order:
            return
        if self._shards is not None:
            raise ValueError(
                f"{type(algorithm).__name__} uses Jacobian products: {_NO_PRODUCTS}; sharded players need a "
                f"first-order algorithm ({first_order_names()})"
            )
        self._problem.refuse_complex(type(algorithm).__name__, first_order_names())
        if self._moves.constrained:
            raise ValueError(
                f"{type(algorithm).__name__} uses Jacobian products and has no projected or mirror version: "
                f"constrained players need a first-order algorithm ({first_order_names()})"
            )

    # ---------------------------------------------------------- data parallel
    def _mean_(self, vec: Vec) -> Vec:
        """Average a joint vector across ranks in place (identity without a process
        group, and for sharded players, whose gradients FSDP averages)."""
        if self._parallel is not None:
            self._parallel.mean_(vec)
        return vec

    @contextlib.contextmanager
    def _together(self) -> Any:
        """A local evaluation that every rank finishes together: a rank whose losses
        fail joins the vector field's collective with NaN (so the other ranks refuse
        the step too, without deadlock), then raises its own error."""
        try:
            yield
        except Exception:
            if self._parallel is not None:
                self._mean_(Vec(torch.full_like(t, float("nan")) for t in self.layout.grad))
            raise

    def _replicated_buffers(self, persistent: bool = False) -> list[Tensor]:
        """The players' module buffers (each once; with ``persistent``, only those in
        the modules' ``state_dict``), which a data-parallel game keeps equal on every rank."""
        seen: dict[int, Tensor] = {}
        for m, registry in zip(self._submodules, self._buffer_registries):
            keep = tc.persistent_buffer_names(m) if persistent else None
            for name, b in registry.items():
                if b is not None and (keep is None or name in keep):
                    seen.setdefault(id(b), b)
        return list(seen.values())

    def check_replicas(self) -> None:
        """Raise ``RuntimeError`` if the ranks' parameters or persistent module
        buffers differ (data-parallel games)."""
        if self._parallel is not None:
            self._parallel.check_replicas([*self.layout.data, *self._replicated_buffers(persistent=True)])

    # ---------------------------------------------------------------- setup
    def _check_values(self) -> None:
        """Refuse parameters without values (on the ``meta`` device)."""
        for p in self.players:
            for k, q in enumerate(p.parameters):
                if q.is_meta:
                    raise ValueError(
                        f"player {p.name!r}: parameter {k} (shape {tuple(q.shape)}) is on the meta device and holds "
                        "no values: materialize the module first (module.to_empty(device=...), then initialize it)"
                    )

    def _check_start(self) -> None:
        """Refuse a starting point that is not finite (before any projection, which
        could hide an infinity), naming the parameters."""
        finite = all_finite(self.layout.data)
        if self._shards is not None:  # every rank refuses, or none
            finite = not self._shards.agree(not finite)
        if finite:
            return
        bad = [
            f"parameter {k} of player {p.name!r}"
            for p in self.players
            for k, q in enumerate(p.parameters)
            if not torch.isfinite(tc.local_shard(q) if self._shards is not None else q.detach()).all()
        ] or ["on another rank"]
        raise ValueError(f"the starting point is not finite ({', '.join(bad)}): a game starts from finite parameters")

    def _own_losses(self, *args: Any, **kwargs: Any) -> list[Tensor]:
        return [p.loss(*args, **kwargs) for p in self.players]  # type: ignore[misc]

    def _check_ownership(self) -> None:
        owner: dict[int, str] = {}
        for player in self.players:
            for p in player.parameters:
                if id(p) in owner:
                    raise ValueError(f"a parameter is owned by two players: {owner[id(p)]!r} and {player.name!r}")
                owner[id(p)] = player.name

    def _build_layout(self) -> None:
        """The joint storage of the players as they are now, and everything built on it."""
        self.layout = JointLayout(self.players)
        self._submodules = [m for p in self.players for m in p.submodules]
        self._buffer_registries = [tc.buffer_registry(m) for m in self._submodules]  # read every step
        cuda_devices = sorted({key[0] for key in self.layout.keys if key[0].type == "cuda"}, key=str)
        # what autodiff sees of this game (it never sees the Game)
        self._problem = autodiff.Problem(
            names=[p.name for p in self.players],
            params=[p.parameters for p in self.players],
            grad_views=[player.grad_views() for player in self.players],
            places=[p.places for p in self.players],
            sparse=[p.has_sparse_grad for p in self.players],
            sizes=[p.numel for p in self.players],
            modules=self._modules(),
            recurrent=any(isinstance(m, nn.RNNBase) for m in self._submodules),
            layout=self.layout,
            mean_=self._mean_,
            parallel=self._parallel is not None,
            forward_mode=self._forward_mode,
            sharded=[tuple(b for b in p.buffers if isinstance(b, ShardedBuffer)) for p in self.players],
        )
        self._vectors = StepVectors(self.layout)
        self._watch = relayout.Watch(self.players)
        self._moves = Moves(self.layout, self.players, agree=None if self._shards is None else self._shards.agree)
        self._layout_gap = self._layout_gap_now()  # (see _check_verdict)
        # a move is one write (Moves.move: one add into the one group), so that a commit that
        # changes nothing else cannot be torn by an interrupt
        self._one_write = len(self.layout.data) == 1 and not self._moves.constrained and self._parallel is None
        # what the oracle sees of this game (it never sees the Game)
        self._step_context = StepContext(
            layout=self.layout,
            problem=self._problem,
            moves=self._moves,
            players=self.players,
            parallel=self._parallel is not None,
            mean_=self._mean_,
            together=self._together,
            evaluations=functools.partial(
                Evaluations, self._buffer_registries, cuda_devices, copies=self._evaluation_copies
            ),
            take=self._vectors.take,
            scale=self._loss_scale_now,
        )

    def _modules(self) -> list[nn.Module]:
        return [p.module for p in self.players if p.module is not None]

    def _refresh(self) -> None:
        """Follow the players: when one changed (its module converted or edited, its
        storage left the joint one), refresh the players and rebuild the layout,
        keeping parameter values and the algorithm state (by parameter). Nothing to do
        while the watch is intact, the cheap check of every step. Under the device
        verdict, the last step's verdict is read first (outside a step), so that a
        refused step is undone in the layout it ran in; a new layout that the device
        verdict does not cover is refused (``ValueError``) at the next step."""
        if self._pending is not None:
            self._settle()
        if self._watch.intact():
            return
        with deferred_interrupts():  # players, layout and state follow together
            if not relayout.refresh(self.players, self.layout, self._watch):
                return
            parts = relayout.take_apart(self._algorithm_state, self.layout)
            self._build_layout()
            fresh = self.algorithm.init_state(self)
            self._algorithm_state = self.algorithm._carry_state(parts, fresh, relayout.ParameterCarry(self.layout))
            self.algorithm._refresh_params(self)
        log.info("game storage rebuilt after a player changed; algorithm state follows each parameter")

    @contextlib.contextmanager
    def _read_only(self) -> Iterator[tuple[autodiff.Problem, Vec]]:
        """The problem a read-only evaluation (ξ, a linearization) runs on, and the
        gradient storage its ξ goes to. Between steps: the game's own, once the players
        are followed (:meth:`_refresh`). Inside a running step (from its losses): at the
        point the step is evaluating, with the parameters registered in their modules
        and storage of its own, leaving the step as it was (:mod:`.reentry`)."""
        if not self.stepping:
            self._refresh()
            yield self._problem, self.layout.grad
            return
        problem, grad = reentry.apart(self._problem)
        with reentry.registered(self._problem):
            yield problem, grad

    # -------------------------------------------------------- feasible sets
    def project_(self, vec: Vec, nonconvex_only: bool = False) -> list[str]:
        """In place: project each constrained parameter's part of ``vec`` onto its set
        (with ``nonconvex_only``, only where the set is not convex); returns what moved."""
        return self._moves.project_(vec, nonconvex_only)

    # ---------------------------------------------------------- derivatives
    @_evaluating
    def vector_field(self, *args: Any, **kwargs: Any) -> PlayerParts:
        """ξ(w) = (∇_{w_1} f_1, …, ∇_{w_n} f_n): one detached flat tensor per player
        (a tuple of tensors for a player with several dtype/device groups).

        Like every product below, it leaves module buffers (BatchNorm running
        statistics) and the global random generators as they were: only
        :meth:`step` moves them, once per step.

        Called from the losses during a step, it evaluates ξ at the point the step is
        evaluating (to log ‖ξ‖, say), and leaves the step as it was."""
        closure = functools.partial(self.losses, *args, **kwargs)
        with self._read_only() as (problem, grad), self._together(), self._evaluations()(plain=False):
            autodiff.vector_field(problem, range(len(self.players)), closure)
        return self.layout.per_player([t.clone() for t in self._mean_(grad)])

    def _evaluations(self) -> Evaluations:
        """What the evaluations of one step (or one product) share."""
        return self._step_context.evaluations(False)

    def _loss_scale_now(self) -> float:
        return self.loss_scale.scale if self.loss_scale is not None else 1.0

    @_evaluating
    def linearize(self, *args: Any, **kwargs: Any) -> Linearization:
        """ξ at the current point with its graph; ``.jvp(v)`` and ``.vjp(v)`` on joint vectors.
        Made inside a running step (from the losses), its products all go through its
        kept graph (J v by double backward): none runs the losses again."""
        if self._shards is not None:
            raise RuntimeError(_NO_PRODUCTS)
        evaluations = self._evaluations()
        closure = functools.partial(self.losses, *args, **kwargs)
        with self._read_only() as (problem, _), evaluations(plain=False):
            return autodiff.linearize(problem, closure, evaluations)

    def jacobian_operator(self, *args: Any, **kwargs: Any) -> Any:
        """J at the current point as a ``scipy.sparse.linalg.LinearOperator`` (see
        :mod:`gameopt.diagnostics`)."""
        from ..diagnostics import jacobian_operator

        return jacobian_operator(self, *args, **kwargs)

    def jvp(self, v: Sequence[Tensor], *args: Any, **kwargs: Any) -> PlayerParts:
        """J v, with J = ∂ξ/∂w the game Jacobian and ``v`` one flat tensor per player."""
        return self._product("jvp", v, *args, **kwargs)

    def vjp(self, v: Sequence[Tensor], *args: Any, **kwargs: Any) -> PlayerParts:
        """Jᵀ v, with J = ∂ξ/∂w the game Jacobian and ``v`` one flat tensor per player."""
        return self._product("vjp", v, *args, **kwargs)

    @_evaluating
    def _product(self, which: str, v: Sequence[Tensor], *args: Any, **kwargs: Any) -> PlayerParts:
        """``linearize(*args, **kwargs).jvp`` or ``.vjp`` of ``v`` (one flat tensor per player)."""
        if not self.stepping:
            self._refresh()  # the layout ``v`` is read into
        vec = self.layout.from_per_player(v)
        return self.layout.per_player(getattr(self.linearize(*args, **kwargs), which)(vec))

    # ------------------------------------------------------------------ step
    def step(self, *args: Any, **kwargs: Any) -> StepLosses:
        """One step of the algorithm. Arguments are passed on to ``losses`` (or to
        each player's own ``loss=``), in every evaluation of the step.

        Returns the players' losses at the step's first evaluation (a tuple of
        detached 0-d tensors), with the metrics the losses returned beside them in
        ``.metrics`` (see :mod:`gameopt.evaluation`). That is the start of the step
        for every algorithm but :class:`~gameopt.PastExtragradient`, whose one
        evaluation is at its extrapolated point w'_t = P(w_t − η u_{t−1}). The players' gradient buffers
        (``.grad``) serve as scratch space during a step; read ξ with
        :meth:`vector_field`.
        Raises :class:`NonFiniteError` (nothing changed) when a vector field or the
        update is not finite, unless ``on_nonfinite="skip"``; under
        ``verdict="device"``, by the end of the next step or at :meth:`synchronize`
        (see the class). Any error leaves the parameters, the algorithm state and the
        module buffers as they were.

        The step itself is :meth:`step_closure`, with the losses bound to these
        arguments. It runs through ``game.optimizer.step(closure)`` (its hooks, the
        learning-rate schedulers' step count) whenever a hook, a scheduler or a
        profiler is there to see it, and directly otherwise.
        """
        closure = functools.partial(self.losses, *args, **kwargs) if args or kwargs else self.losses
        optimizer = self.optimizer
        if tc.optimizer_step_unobserved(optimizer):
            return self.step_closure(closure)  # what optimizer.step(closure) runs, less its wrapper
        return optimizer.step(closure)

    @_evaluating
    def step_closure(self, closure: Callable[[], Any]) -> StepLosses:
        """The step itself, with the losses evaluated by ``closure()`` (no arguments);
        what ``game.optimizer.step(closure)`` runs. Prefer :meth:`step`.

        A step follows the players if one changed (a module converted or edited:
        the layout is rebuilt, the algorithm state carried by parameter), asks the
        algorithm for ``(delta, new_state)`` through a :class:`~gameopt.game.StepOracle`,
        checks both (finite; no borrowed vector kept), moves the parameters by
        ``delta`` through their feasible sets (``Moves.move``) and commits the new
        state. On any error the parameters, the algorithm state and the module
        buffers stay as they were; a non-finite step raises :class:`NonFiniteError`,
        or is skipped (``on_nonfinite="skip"``, or an overflow under a loss scale).

        The commit is whole: a Ctrl-C (SIGINT) that arrives while it runs raises its
        ``KeyboardInterrupt`` once the step is committed (``gameopt.interrupts``).
        Called from inside a running step (from its losses), a step is refused
        (``RuntimeError``); ξ, the products and ``state_dict`` may be called there."""
        if self._step_buffers is not None and self._step_below(cast(FrameType, inspect.currentframe()).f_back):
            # a step other than this one
            raise reentry.refused("a step (game.step(), game.optimizer.step())")
        if not self._watch.intact():
            self._refresh()  # (the verdict of the step before read first: see _refresh)
        self._raise_refusal()  # read before this step (by state_dict, say): raised here, nothing run
        self._check_verdict()
        algorithm = self._algorithm
        oracle = StepOracle(self._step_context, closure, algorithm.evaluates_once)
        old = kept = self._algorithm_state
        buffers = self._buffer_copies.save(self._buffer_registries)  # put back if the step fails
        checks = self._moves.checks = Checks(self.layout.data[0].device) if self._verdict == "device" else None
        keys = self._buffer_keys() if checks is not None else []  # the names of ``buffers``, as saved
        committed = False
        try:
            self._step_buffers = buffers  # a step runs (see stepping); what a call from the losses sees
            algorithm._check_groups()  # lr and every scheduled value, whoever set it
            algorithm._sync_rule()  # scheduled betas, momentum, decay
            delta, new_state = algorithm.update(oracle, old)
            name = type(algorithm).__name__
            if checks is None:
                new_tensors = self._checked_update(name, oracle, delta, new_state, old)
            else:
                new_tensors = _check_update(name, oracle, delta, new_state, old, self._moves, checks, self._advice)
                last = self._pending.chain()[-1] if self._pending is not None else None
                found_inf, passed = checks.verdict(last.found_inf if last is not None else None)
            # a Ctrl-C waits for the commit, unless all it changes is one write (no tear possible)
            one = (
                self._one_write
                and not buffers
                and not new_tensors
                and self.loss_scale is None
                and new_state == old
                and not (isinstance(delta, Scaled) and isinstance(delta.direction, Pieces))  # (a write per tensor)
            )
            held = None if one and checks is None else defer()
            try:
                if checks is None:
                    self._moves.move(self.layout.data, delta, out=self.layout.data, empty=oracle.empty)
                else:  # moved where the verdict takes it; what the step started from kept till it is read
                    self._moves.move_unless(self.layout.data, delta, found_inf, empty=oracle.empty)
                    self._moves.settle_bounds(found_inf)
                    pending = Pending(found_inf, [passed], checks.whys, old, buffers, self._steps, keys)
                self._algorithm_state = kept = new_state
                committed = True
                try:
                    self._after_step()
                finally:  # (whatever _after_step raises, the step's verdict is recorded)
                    if checks is not None:
                        self._hand_over(pending)  # reads the verdict of the step before
            finally:
                if held is not None:
                    resume(held)
            self._raise_refusal()  # the step before refused (this one with it): undone, and said
        except BaseException as err:
            if committed:  # after the commit: a deferred Ctrl-C, or a failed replica check
                raise
            with deferred_interrupts():  # put back whole
                self._put_back(buffers, oracle)
                if isinstance(err, NonFiniteError) and (self.loss_scale is not None or self.on_nonfinite == "skip"):
                    return self._skip(oracle)
            if self._shards is not None and not isinstance(err, NonFiniteError):  # (refused together)
                self._shards.failed(err, self._steps)  # the other ranks are told, or named
            raise
        finally:
            self._step_buffers = None
            self._moves.checks = None
            # keep only what the committed state holds (and, under the device verdict, the
            # state a step whose verdict is not read started from): the step's other
            # vectors live within the step only
            if self._vectors.lent:
                if checks is not None:
                    pending_states = [p.state for p in self._pending.chain()] if self._pending is not None else []
                    held_state = [self._algorithm_state, *pending_states]
                    self._vectors.keep_only(tensors_in(held_state))
                else:
                    self._vectors.keep_only(new_tensors if kept is not old else tensors_in(old))
        return StepLosses(oracle.losses or (), oracle.evaluations.metrics)

    # -------------------------------------------------------- device verdict
    @_one_at_a_time
    def synchronize(self) -> None:
        """Wait for the verdict of the last step (``Game(verdict="device")``): if it
        was refused, it is undone (the state and module buffers it started from put
        back; its point never moved) and :class:`NonFiniteError` raised here. A
        refusal read by another call (``state_dict``, ξ: they read the verdict first,
        so that they see the game as it is) is raised here too, or by the next step; a
        load (the game's or its optimizer's), a new algorithm and a new ``algorithm_state``
        call this first. Nothing to do under the host verdict,
        whose steps raise at once."""
        if self.stepping:
            raise reentry.refused("game.synchronize()")
        self._settle()
        self._raise_refusal()

    def _raise_refusal(self) -> None:
        """Raise (once) a refusal read before: by ``state_dict``, ξ, a re-layout."""
        if self._refusal is not None:
            refusal, self._refusal = self._refusal, None
            raise refusal

    def _buffer_keys(self) -> list[tuple[dict[str, Any], str]]:
        """(registry, name) of each module buffer, in the order ``BufferCopies.save``
        saves them: where to put a saved copy back, whatever tensor holds the name by
        then (a module converted since holds new ones)."""
        return [
            (registry, name) for registry in self._buffer_registries for name, b in registry.items() if b is not None
        ]

    def _hand_over(self, pending: Pending) -> None:
        """A step just committed under the device verdict: it becomes the pending one
        (the next step saves the module buffers into the other copies), and the steps
        before it, pending till now, have their verdicts read: if one was refused,
        everything since it began is undone (this step was refused with it) and its
        error kept, to be raised once the commit ends. Should a read fail (a device
        error), the unread steps stay pending, in order, this one behind them, and the
        next step saves into copies of its own."""
        if self._pending is None:
            self._pending = pending
        else:
            self._pending.chain()[-1].later = pending
        try:
            refused = self._read_before(pending)
        except BaseException:
            self._buffer_copies = BufferCopies()  # (every record still pending keeps its copies)
            raise
        self._buffer_copies, self._spare_copies = self._spare_copies, self._buffer_copies
        if refused is not None:
            self._refusal = self._undo(*refused)  # raised once interrupts resume: a Ctrl-C keeps it

    def _read_before(self, stop: Pending | None) -> tuple[Pending, str] | None:
        """Read the pending steps' verdicts in order, up to ``stop`` (not read), each
        taken one forgotten; returns the first refused one and why. A read that raises
        (a Ctrl-C while it waits, a device error) leaves it and the later ones pending."""
        while self._pending is not None and self._pending is not stop:
            pending = self._pending
            why = pending.read()
            if why is not None:
                return pending, why
            self._pending = pending.later
            keep = [self._algorithm_state, *(p.state for p in (self._pending.chain() if self._pending else ()))]
            self._vectors.let_go(tensors_in(pending.state), keep=tensors_in(keep))
        return None

    def _settle(self) -> None:
        """Read the pending verdicts, outside a step: see :meth:`_settle_now`."""
        if self._pending is not None and not self.stepping:
            self._settle_now()

    def _settle_now(self) -> None:
        """Read the pending steps' verdicts (waiting for them): taken, they are
        forgotten; refused, the first refused one is undone with every step after it
        (:meth:`_undo`) and its error kept for the next step or :meth:`synchronize`."""
        refused = self._read_before(None)
        if refused is not None:
            with deferred_interrupts():
                stale = self._algorithm_state  # the refused steps' state, no longer held
                self._refusal = self._undo(*refused)
                self._vectors.let_go(tensors_in(stale), keep=tensors_in(self._algorithm_state))

    def _undo(self, pending: Pending, why: str) -> NonFiniteError:
        """Put the game back where the refused step ``pending`` began: its algorithm
        state, its module buffers, its step count (its point never moved, nor did any
        later step's: a refusal is sticky until read); returns its error."""
        with deferred_interrupts():
            self._pending = None
            self._algorithm_state = pending.state
            for record in reversed(pending.chain()):  # (a buffer that a later step began with too)
                restore_buffers(record.buffers_now())
            later = self._steps - pending.step - 1
            self._steps = pending.step
            self._moves.forget_bounds()
        after = {0: "", 1: "; the step after it was refused with it"}.get(
            later, f"; the {later} steps after it were refused with it"
        )
        return NonFiniteError(f"step {pending.step + 1} (its verdict read now, kept on the device): {why}{after}")

    def _advice(self) -> str:
        """For a refused step's message: each player's update rule with a setting that
        the player's dtype loses (``gameopt.updates.zero_eps_advice``), or ``""``."""
        said = []
        for i, player in enumerate(self.players):
            dtypes = {self.layout.data[e.group].dtype for e in self.layout.by_player[i]}
            for rule in (r.for_player(i) for r in self._algorithm._rules()):
                advice = (zero_eps_advice(rule, dt) for dt in sorted(dtypes, key=str))
                said += [f"player {player.name!r}: {a}" for a in advice if a]
        return "; ".join(dict.fromkeys(said))

    def _checked_update(self, name: str, oracle: StepOracle, delta: Step, new_state: Any, old: Any) -> list[Tensor]:
        """:func:`_check_update`; with sharded players, agreed by every rank: a step
        that one rank refuses, every rank refuses."""
        if self._shards is None:
            return _check_update(name, oracle, delta, new_state, old, self._moves, advice=self._advice)
        try:
            new_tensors = _check_update(name, oracle, delta, new_state, old, self._moves, advice=self._advice)
        except NonFiniteError:
            self._shards.agree(True)
            raise
        if self._shards.agree(False):
            raise NonFiniteError(
                "another rank refused this step (its shard of the update was not finite, or would overflow); "
                "nothing changed"
            )
        return new_tensors

    def _put_back(self, buffers: list[tuple[Tensor, Tensor]], oracle: StepOracle) -> None:
        """After a failed step: the module buffers it started from (``buffers``); and
        what an interrupt may have cut short the putting back of: gradients on (as
        :func:`_evaluating` runs a step; a ``no_grad`` block's exit), the point (an
        evaluation away from it: ``oracle.away``) and the modules' parameters (a
        linearization's substitutes)."""
        torch.set_grad_enabled(True)
        restore_buffers(buffers)
        if oracle.away is not None:
            tc.foreach_copy_(self.layout.data, oracle.away)
            self._moves.backup = None
        if not self._watch.intact():  # a substitute (an alias, a dual tensor) may be registered still
            for sub, name, p in self._problem.registrations:
                registry = tc.parameter_registry(sub)
                if not isinstance(registry[name], nn.Parameter):
                    registry[name] = p

    def _skip(self, oracle: StepOracle) -> StepLosses:
        """A non-finite step, skipped (nothing changed): counted; with a loss scale,
        an overflow, and the scale backs off."""
        if self.loss_scale is not None:
            self.loss_scale.update(finite=False)
            self.skipped_steps += 1
            log.info("overflow at loss scale %g: step skipped, scale now %g", oracle.scale, self.loss_scale.scale)
        else:
            self.skipped_steps += 1
            log.warning("non-finite step skipped (%d so far)", self.skipped_steps)
        return StepLosses(oracle.losses or (), oracle.evaluations.metrics)

    def _after_step(self) -> None:
        """After a step is committed: rank 0's module buffers on every rank (as DDP's
        ``broadcast_buffers``), the loss scale's count, the periodic replica check."""
        if self._parallel is not None:
            with torch.no_grad():
                self._parallel.broadcast_coalesced_(self._replicated_buffers())
        if self.loss_scale is not None:
            self.loss_scale.update(finite=True)
        self._steps += 1
        if self.check_replicas_every and self._steps % self.check_replicas_every == 0:
            self.check_replicas()

    # ----------------------------------------------------------- checkpoints
    @_one_at_a_time
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit for bit: each player's parameters and its
        module's persistent buffers (BatchNorm running statistics), the algorithm's
        state and learning rates. Loads with ``torch.load(weights_only=True)``.

        Taken inside a running step (from its losses), it is the game as the step
        found it: the point and module buffers it started from, with the state
        it started from.

        With FSDP-sharded players, each rank's parameters and each joint vector of the
        algorithm's state are DTensors, one per parameter (its global shape, sharded
        like it, this rank's shard: ``gameopt.game.sharded_checkpoint.saved_form``); the rest
        (numbers, learning rates, module buffers) is the same on every rank. Save it
        with ``torch.distributed.checkpoint`` from every rank,
        ``dcp.save({"game": game.state_dict()}, checkpoint_id=path)``, and load it into
        a game built the same way, on any number of ranks (DCP reshards)::

            sd = {"game": game.state_dict()}
            dcp.load(sd, checkpoint_id=path)
            game.load_state_dict(sd["game"])

        ``torch.save(game.state_dict(), f)`` writes this rank's shards only (as
        DTensors, never as whole tensors): save one file per rank and load each on the
        rank that wrote it, in a world of the same size (another world size is
        refused; a file of another rank of the same world cannot be told apart, and
        loads that rank's values). The module buffers are saved as DCP saves an FSDP
        module's: as replicated, rank 0's."""
        start = None
        state = None
        if not self.stepping:
            self._refresh()  # (the verdict of the last step read first: see _refresh)
            state = self._algorithm_state
        else:
            assert self._step_buffers is not None  # held while a step runs
            buffers, state = self._step_buffers, self._algorithm_state
            # the steps before this one, their verdicts unread: read here (the first refused: as it began)
            for pending in self._pending.chain() if self._pending is not None else ():
                if pending.read() is not None:
                    buffers, state = pending.buffers, pending.state
                    break
            start = reentry.step_start(self.layout, self._moves.backup, buffers)
        out = checkpoint.state_dict(self.players, self.algorithm, state, self.skipped_steps, self.loss_scale, start)
        if self._shards is not None:
            out = saved_form(out, self.players, self.layout, state)
        return out

    @_one_at_a_time
    def check_state_dict(self, state_dict: Any) -> None:
        """Raise ``ValueError`` naming what is wrong unless ``state_dict`` fits this
        game (players, shapes, dtypes, the algorithm and its state). Changes nothing.
        With sharded players every rank calls it: every rank gives the same verdict."""
        self._loadable(state_dict)

    def _loadable(self, state_dict: Any) -> Any:
        """:meth:`check_state_dict`, returning ``state_dict`` in the form
        :func:`.checkpoint.load_state_dict` writes (the local form of a sharded game's:
        ``gameopt.game.sharded_checkpoint.local_form``). With sharded players, the verdict is agreed
        by every rank: one rank's shard that does not fit refuses the load on all."""
        if not self.stepping:
            self._refresh()  # (the verdict of the last step read first: see _refresh)
        if self._shards is None:
            checkpoint.check_state_dict(state_dict, self.players, self.algorithm, self.algorithm_state, self.loss_scale)
            return state_dict
        failure: Exception | None = None
        try:
            local = local_form(state_dict, self.players, self.layout, self.algorithm_state)
            checkpoint.check_state_dict(local, self.players, self.algorithm, self.algorithm_state, self.loss_scale)
        except Exception as err:  # agreed first: a rank that raised alone would leave the others waiting
            failure = err
        if self._shards.agree(failure is not None):
            if failure is not None:
                raise failure
            raise ValueError("another rank refused this state_dict (its shards do not fit); nothing changed")
        return local

    @_one_at_a_time
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`. Everything is checked before anything is
        written: a state that does not fit raises ``ValueError`` and changes nothing
        (with sharded players, on every rank: each rank calls it, and the ranks agree
        on the verdict). The load is whole: a Ctrl-C that arrives while it writes
        raises its ``KeyboardInterrupt`` once it is done. Refused (``RuntimeError``,
        nothing changed) from inside a running step."""
        self._refuse_in_step("game.load_state_dict()")
        self.synchronize()  # a refused step of the run this load replaces: said before anything changes
        local = self._loadable(state_dict)
        with deferred_interrupts():
            self.skipped_steps, self.algorithm_state = checkpoint.load_state_dict(
                local, self.players, self.algorithm, self.algorithm_state, self.loss_scale
            )

    # ------------------------------------------- read only: for tests and tools
    @property
    def step_context(self) -> StepContext:
        """All that an :class:`~gameopt.game.StepOracle` sees of this game, for its current
        layout: ``StepOracle(game.step_context, closure)`` is the oracle a step hands its
        algorithm (``gameopt.testing.oracle(game)`` builds one), and its ``problem``
        is what :mod:`gameopt.autodiff` sees of the game. For tests of an algorithm's
        pieces and of autodiff, and for tools that time them; a re-layout (a player
        changed) replaces it."""
        return self._step_context

    @property
    def scratch_vectors(self) -> list[Vec]:
        """The joint vectors the game holds for its algorithm's steps besides the
        parameters and gradients: those its algorithm took from the game
        (``oracle.empty()`` and the oracle's other new vectors; between steps, only
        those ``algorithm_state`` holds, and under the device verdict those of the
        state a step whose verdict is unread began with), and while a step evaluates away from its
        point, the copy of that point. For memory checks (``gameopt.testing.held_storages``)."""
        backup = self._moves.backup
        return [*self._vectors.taken, *([backup] if backup is not None else [])]

    def __repr__(self) -> str:
        names = ", ".join(p.name for p in self.players)
        return f"Game([{names}], algorithm={self.algorithm!r})"

    # ---------------------------------------------------------------- copies
    def __deepcopy__(self, memo: dict[int, Any]) -> Game:
        """An independent game that steps as this one does: deep copies of the players
        (fused into storage of their own), of the losses (a closure over the players'
        modules evaluates the copies, see :func:`gameopt.copying.copy_callable`), of
        the algorithm (bound to the copy, with these param groups' values) and of its
        state; a lock of its own. A data-parallel copy shares the process group."""
        if self._shards is not None:
            raise TypeError(
                "a game of sharded players cannot be copied (FSDP modules do not support copy.deepcopy): save it "
                "with torch.distributed.checkpoint and load it into a game built alike (docs/sharded.md)"
            )
        with self.lock:
            self._refuse_in_step("copy.deepcopy(game)")  # the point is mid-step there
            self._settle()  # the copy starts from a game whose steps were all read
            self._refresh()  # the copy's layout is the one the state was made for
            new = type(self).__new__(type(self))
            memo[id(self)] = new
            if self._parallel is not None:  # a process group is not copied: the copy averages over the same
                memo.setdefault(id(self._parallel), self._parallel)
            for key, value in vars(self).items():
                if key in _REBUILT:
                    continue
                fresh = _FRESH_LOCKS.get(type(value))  # a lock of its own, never held
                setattr(new, key, fresh() if fresh is not None else copy.deepcopy(value, memo))
            new._pending, new._refusal = None, None  # a refusal read here is this game's to raise
            new.losses = copy_callable(self.losses, memo)  # after the players: a closure over them takes the copies
            new._build_layout()
            new.algorithm = copy.deepcopy(self._algorithm, memo)  # an unbound copy, bound here
            _carry_binding(self, new, memo)
            return new

    def __reduce__(self) -> Any:
        raise TypeError(
            "a gameopt.Game cannot be pickled (or copied with copy.copy): it holds a lock, its players' fused storage "
            "and your losses callable. Save game.state_dict() (torch.save) and load it into a game built the same "
            "way (game.load_state_dict); for a copy in memory, use copy.deepcopy(game)"
        )


#: what a copy of a game builds for itself rather than copying (see :meth:`Game.__deepcopy__`)
_REBUILT = frozenset(
    {
        "losses",
        "layout",
        "_submodules",
        "_buffer_registries",
        "_problem",
        "_vectors",
        "_watch",
        "_moves",
        "_step_context",
        "_algorithm",
        "_algorithm_state",
        "_pending",
        "optimizer",
    }
)


#: the types of ``threading.Lock()`` and ``threading.RLock()``, and how to make a fresh one
_FRESH_LOCKS: dict[type, Callable[[], Any]] = {
    type(threading.Lock()): threading.Lock,
    type(threading.RLock()): threading.RLock,
}


def _carry_binding(game: Game, new: Game, memo: dict[int, Any]) -> None:
    """Give ``new`` (a copy of ``game``, its copied algorithm bound) the values of
    ``game``'s param groups (scheduled learning rates and settings) and a copy of its
    algorithm state, and the hooks of its optimizer. What this deep copy meets later
    of ``game``'s optimizer, param groups and flat parameters (a scheduler's
    reference) becomes ``new``'s."""
    old_algorithm, algorithm = game.algorithm, new.algorithm
    for mine, theirs in zip(algorithm.param_groups, old_algorithm.param_groups):
        mine.update(copy.deepcopy({k: v for k, v in theirs.items() if k != "params"}, memo))
        memo[id(theirs)] = mine
    memo[id(old_algorithm.param_groups)] = algorithm.param_groups
    memo[id(old_algorithm.defaults)] = algorithm.defaults
    memo[id(game.optimizer)] = new.optimizer
    for key, value in vars(game.optimizer).items():  # hooks, and a scheduler's wrapper of step
        if key not in ("_game", "algorithm", "param_groups", "defaults", "state"):
            setattr(new.optimizer, key, copy_callable(value, memo))
    for old_buffers, buffers in zip((p.buffers for p in game.players), (p.buffers for p in new.players)):
        memo.update((id(a.data), b.data) for a, b in zip(old_buffers, buffers))
    new.algorithm_state = copy.deepcopy(game.algorithm_state, memo)


#: the step's own code (under its decorators): :attr:`Game.stepping` looks for it on the stack
_STEP_CODE = inspect.unwrap(Game.step_closure).__code__


def _unique_names(players: list[Player]) -> None:
    """Players in one game have unique names, so that a checkpoint maps players by
    name, never by a guess: players whose default names (their module's class, or
    ``params``) coincide are named ``<name>_<index in the game>``; two given names that
    coincide are refused."""
    counts = Counter(p.name for p in players)
    given = sorted({p.name for p in players if p.name_given and counts[p.name] > 1})
    if given:
        raise ValueError(f"two players are named {given[0]!r}: give each player of a game its own name (name=...)")
    for k, p in enumerate(players):
        if counts[p.name] > 1:
            p.name = f"{p.name}_{k}"


def _check_algorithm(algorithm: Any) -> None:
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"algorithm must be a gameopt Algorithm, got {type(algorithm).__name__}")


def _check_update(
    name: str,
    oracle: StepOracle,
    delta: Step,
    new_state: Any,
    old_state: Any,
    moves: Moves,
    checks: Checks | None = None,
    advice: Callable[[], str] | None = None,
) -> list[Tensor]:
    """Refuse what the algorithm ``name`` returned unless the game may commit it: a
    state that keeps a borrowed vector (``RuntimeError``), in debug mode a joint vector
    kept as a plain list (``TypeError``), a step or new state that is not finite, or a
    step whose new point would overflow its dtype (:class:`NonFiniteError`, see
    :meth:`Moves.check_step`, before ``moves`` commits the step). With ``checks`` (the
    device verdict), the last two are added to them, nothing read (see
    :meth:`Moves.check_step_on_device`). Returns the new state's tensors."""
    new_tensors = tensors_in(new_state)
    if new_tensors:
        _check_not_borrowed(new_tensors, oracle.borrowed, name)
    if oracle.debug and (untyped := relayout.untyped_vectors(new_state, moves.layout)):
        raise TypeError(
            f"{name}: joint vectors in the state must be gameopt.Vec (so that a "
            f"re-fuse carries them by parameter), got plain lists at {', '.join(untyped)}"
        )
    direction, implied, known = (
        (delta.direction, delta.implied, delta.bounds) if isinstance(delta, Scaled) else (delta, (), None)
    )
    pieces = direction if isinstance(direction, Pieces) else None  # (read where autograd left ξ)
    vec = pieces.tensors() if pieces is not None else cast(Vec, direction)
    unread = vec if known is None else [d for d, b in zip(vec, known) if b is None]
    tensors = _unchecked(vec, unread, new_tensors, old_state, implied)
    if checks is None:
        read: Sequence[Any] | None = finite_bounds(tensors)  # the step's first host read
        if read is None:
            raise NonFiniteError(oracle.not_finite_message("the vector field ξ or the update", advice))
    else:
        read = checks.finite(tensors, oracle.message_later("the vector field ξ or the update", advice))
    if pieces is not None:  # per tensor: each group's largest (its bounds never known: a plain rule's)
        read = pieces.group_bounds(read[: len(vec)])
    bounds: Sequence[Any] = read if known is None else _merged(known, read)
    # max|factor · d| <= max|factor| · max|d|, up to one rounding
    factors = moves.layout.factor_bounds(delta.factors) if isinstance(delta, Scaled) else [1.0] * len(bounds)
    if checks is not None:  # (on the device, the product is formed in the sum's launch)
        moves.check_step_on_device(delta, bounds, [f * _PRODUCT_MARGIN for f in factors], checks)
    else:
        if isinstance(delta, Scaled):
            bounds = [b * f * _PRODUCT_MARGIN for b, f in zip(bounds, factors)]
        moves.check_step(delta, bounds)  # the new point: w + delta
    return new_tensors


def _check_not_borrowed(state_tensors: Sequence[Tensor], borrowed: Sequence[Vec], name: str) -> None:
    """Refuse a state (given by its tensors) that holds a vector that :meth:`StepOracle.xi`
    lent (the gradient buffer, which the next evaluation overwrites)."""
    lent = {t.untyped_storage().data_ptr() for vec in borrowed for t in vec}
    if lent and any(t.untyped_storage().data_ptr() in lent for t in state_tensors):
        raise RuntimeError(
            f"{name}.update returned a state that holds the result of oracle.xi(), which is borrowed "
            "(the next evaluation overwrites it): keep a copy (oracle.empty().copy_(xi)) instead"
        )


#: why a game of sharded players forms no Jacobian product
_NO_PRODUCTS = (
    "gameopt does not form Jacobian products through FSDP-sharded players (FSDP reduce-scatters gradients "
    "outside autograd, so ξ has no graph to differentiate)"
)

_PRODUCT_MARGIN = 1 + 2.0**-40  # a float64 product's rounding, with room


def _merged(known: Sequence[float | None], read: Sequence[Any]) -> list[Any]:
    """Each group's bound on ``max|direction|``: the known one, else the next one read
    (a float, or under the device verdict a 0-d tensor)."""
    unread = iter(read)
    return [next(unread) if b is None else b for b in known]


def _unchecked(
    delta: Sequence[Tensor],
    unread: Sequence[Tensor],
    new_tensors: Sequence[Tensor],
    old_state: Any,
    implied: Sequence[Tensor] = (),
) -> Sequence[Tensor]:
    """The tensors of a step to check for finiteness, each once: the delta's groups
    whose bounds are not known (``unread``: their bounds are read too) first, then the
    new state's tensors, less what the delta or the old state already held (checked
    when committed) and what is finite whenever the rest is (``implied``: see
    :class:`~gameopt.vec.Scaled`)."""
    if not new_tensors:
        return unread
    seen = set(map(id, tensors_in(old_state)))
    seen.update(map(id, delta))
    seen.update(map(id, implied))
    out = list(unread)
    for t in new_tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out
