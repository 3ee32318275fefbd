"""A game: players, their losses, the joint vector field and an algorithm."""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from . import _torch_compat as tc
from . import autodiff, debug
from .algorithms import first_order_names
from .algorithms.base import Algorithm
from .buffer import links_intact
from .checks import check_number
from .distributed import DataParallel
from .evaluation import DynamicLossScale, Evaluations, StepLosses, own_buffers
from .layout import JointLayout, VecPool
from .optim import GameOptimizer
from .player import Player
from .protocols import Along, Linearization
from .state import check_like, clone_state, tensors_in
from .vec import Vec, all_finite

log = logging.getLogger(__name__)

PerPlayer = tuple[Tensor | tuple[Tensor, ...], ...]


def _autograd_on(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` with autograd on, also when called under ``torch.no_grad()`` or
    ``torch.inference_mode()``: a game step needs gradients whatever the caller's mode."""

    @functools.wraps(method)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            return method(*args, **kwargs)  # already so: no context to enter
        with torch.inference_mode(False), torch.enable_grad():
            return method(*args, **kwargs)

    return wrapped


def _one_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` holding the game's lock (:attr:`Game.lock`): a call from another
    thread waits until the running step (or checkpoint call) has finished; the same
    thread may call in again (a closure, a scheduler, ``game.optimizer.step``)."""

    @functools.wraps(method)
    def wrapped(self: Game, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)

    return wrapped


class NonFiniteError(FloatingPointError):
    """A step met a non-finite vector field or update; nothing was changed."""


class Oracle:
    """What an algorithm may ask of the game during one step.

    Vectors are joint vectors (``Vec``: one flat tensor per (device, dtype)
    group). :meth:`xi` does not check finiteness (the step's check of the update
    and the new state covers it); :meth:`linearize` does unless told otherwise;
    every point is checked before anything is evaluated there.

    Ownership: what :meth:`xi` returns is *borrowed* (the game's gradient buffer,
    valid until the next :meth:`xi`; the algorithm may overwrite it, return it as
    its step, or pass it to the next :meth:`xi` as ``along``, but never keep it in
    its state). Everything else is the caller's: the linearization and its vectors,
    and the vectors of ``empty``, :meth:`moved`, :meth:`delta_to` and
    :meth:`scaled` (taken from the game's pool: kept after the step only if the
    returned state holds them). :mod:`gameopt.debug` makes misuse fail loudly.
    """

    def __init__(self, game: Game, closure: Callable[[], Any]) -> None:
        self.game, self.closure = game, closure  # closure(): the losses at the current point
        self.layout = game.layout
        self.evaluations = game._evaluations()  # same random numbers; buffers move once
        self.scale = game.loss_scale.scale if game.loss_scale is not None else 1.0
        self.losses: tuple[Tensor, ...] | None = None  # at the start of the step
        self._all_losses: list[Sequence[Tensor]] = []
        self.empty = game._pool.take  # a pool vector (contents undefined); see VecPool
        self.borrowed: list[Vec] = []  # what xi() returned (debug mode: copies, poisoned when stale)

    @property
    def params(self) -> Vec:
        """The current point, read only (return a delta instead of writing here)."""
        return self.layout.data

    @property
    def num_players(self) -> int:
        return self.layout.num_players

    def xi(self, at: Vec | None = None, players: Sequence[int] | None = None, along: Along | None = None) -> Vec:
        """ξ at the current point, at ``at``, or ``along=(d, factors)`` at
        w + factorᵢ·dᵢ (each player's part with its factor; ``d`` is left as it is).
        With ``players``, only those players' parts are computed (the rest of the
        returned vector is meaningless). The result is borrowed (see the class): the
        game's gradient buffer, valid until the next call.

        ξ is not checked here: :meth:`~gameopt.Game.step` checks the update and the new state,
        which every ξ flows into. A point is checked before anything runs there."""
        which = range(self.num_players) if players is None else players
        game = self.game
        evaluate = functools.partial(autodiff.vector_field, game._problem, list(which), self.closure, self.scale)
        if at is None and along is None and game._parallel is None:  # no point to form, no rank to wait for
            if debug.enabled():  # earlier results are stale now
                debug.poison_(t for vec in self.borrowed for t in vec)
            (losses, metrics), own = self.evaluations.run(True, evaluate)
        else:
            with (
                game._at(at, along, lambda: self.not_finite_message("a point to evaluate at")),
                game._together(),
                self.evaluations(plain=at is None and along is None) as own,
            ):
                if debug.enabled():  # the point is formed (``along`` read): earlier results are stale now
                    debug.poison_(t for vec in self.borrowed for t in vec)
                losses, metrics = evaluate()
        self._seen(losses, metrics if own else None)
        xi = self.game._mean_(self.layout.grad)
        if debug.enabled():
            xi = self.empty().copy_(xi)
            if players is not None:  # the other players' parts are meaningless
                others = [i for i in range(self.num_players) if i not in which]
                debug.poison_(t for i in others for t in self.layout.player_views(xi, i))
            self.borrowed.append(xi)
        else:
            self.borrowed = [xi]
        return xi

    def _seen(self, losses: Sequence[Tensor], metrics: dict[str, Any] | None) -> None:
        if self.losses is None:
            self.losses = tuple(losses)
        if metrics is not None:
            self.evaluations.keep_metrics(metrics)
        self._all_losses.append(losses)

    def linearize(
        self,
        at: Vec | None = None,
        check: bool = True,
        zero_sum: bool = False,
        batched: bool = False,
        cross: bool = False,
    ) -> Linearization:
        """ξ at the current point (or ``at``) with its graph, for Jv and Jᵀv.

        ``check``: refuse a non-finite ξ right away (before an iterative solve, say).
        An algorithm whose update is non-finite whenever ξ is may skip it: the
        check of the update in :meth:`~gameopt.Game.step` covers ξ then. A data-parallel
        game always checks: a rank that failed takes part in no later collective,
        so every rank must stop here together.

        ``zero_sum``: the game is two players with losses (f, −f) (checked on the
        values): every product is a Hessian-vector product of f through one kept
        graph (:class:`~gameopt.autodiff.ZeroSumLinearization`); ``batched``: its
        paired products (``vjp_jvp``) in one double backward. ``cross``: keep the
        cross gradients ∇_{w_j} f_i with their graphs, so that H_o v and χ cost one
        reverse pass per player (:meth:`~gameopt.autodiff.GeneralLinearization.shaping`)."""
        with self.game._at(at), self.game._together(), self.evaluations(plain=at is None) as own:
            lin = autodiff.linearize(
                self.game._problem,
                self.closure,
                self.evaluations,
                self.scale,
                zero_sum=zero_sum,
                batched=batched,
                cross=cross,
            )
        self._seen([l.detach() for l in lin.losses], lin.metrics if own else None)
        if zero_sum and self.game._parallel is None and not all_finite(self._all_losses[-1]):
            # whether they are (f, −f) cannot be checked (a data-parallel game: ξ's check below)
            raise NonFiniteError(self.not_finite_message("a loss of the zero-sum game"))
        if (check or self.game._parallel is not None) and not all_finite(lin.xi):
            raise NonFiniteError(self.not_finite_message("the vector field ξ"))
        return lin

    def not_finite_message(self, what: str) -> str:
        """An error message: ``what`` is not finite, with the players whose losses were not."""
        bad = [
            p.name
            for i, p in enumerate(self.game.players)
            if any(not torch.isfinite(losses[i]).all() for losses in self._all_losses if i < len(losses))
        ]
        hint = f" (non-finite losses: {', '.join(bad)})" if bad else ""
        if not bad and self.game._parallel is not None:
            hint = " (on another rank: its losses failed or were not finite)"
        return f"{what} is not finite{hint}; the step was refused and nothing changed"

    def moved(self, delta: Vec, at: Vec | None = None) -> Vec:
        """A new (pool) vector: the point reached from the current point (or ``at``)
        by the step ``delta``, within the players' feasible sets (see :meth:`~gameopt.Game.move`)."""
        return self.game.move(self.params if at is None else at, delta, out=self.empty())

    def project_nonconvex_(self, vec: Vec) -> Vec:
        """In place: project the parts of ``vec`` whose feasible set is not convex."""
        self.game.project_(vec, nonconvex_only=True)
        return vec

    def delta_to(self, target: Vec) -> Vec:
        """A new (pool) vector: the step whose move from the current point lands on
        the feasible point ``target`` (see :meth:`~gameopt.Game.delta_to`)."""
        return self.game.delta_to(self.params, target, out=self.empty())

    def scaled(self, vec: Vec, factors: Sequence[float]) -> Vec:
        """A new (pool) vector: each player's part of ``vec`` times its factor."""
        return self.layout.scale_(vec, factors, out=self.empty())

    def scale_(self, vec: Vec, factors: Sequence[float]) -> Vec:
        """In place: each player's part of ``vec`` times its factor."""
        return self.layout.scale_(vec, factors)

    def dot(self, a: Vec, b: Vec) -> Tensor:
        return self.layout.dot(a, b)


class Game:
    """A differentiable game: player i minimizes ``losses(...)[i]`` over its own
    parameters.

    Args:
        players: :class:`Player` objects (plain ``nn.Module`` are wrapped).
        losses: callable returning one scalar loss per player; it draws its own
            data, or receives the arguments given to :meth:`step`. ``None``: use
            each player's own ``loss=``.
        algorithm: an :class:`~gameopt.Algorithm`; default ``SimGD(lr=1e-3)``.
            The game binds it (``game.algorithm``) and wraps it in a
            ``torch.optim.Optimizer``, ``game.optimizer`` (a
            :class:`~gameopt.optim.GameOptimizer`), for schedulers and Lightning.
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
        check_replicas_every: in a data-parallel game, check every this many steps
            that the ranks' parameters and persistent buffers are still identical
            (0: never).
        loss_scale: a :class:`~gameopt.DynamicLossScale` for float16 players: steps
            that overflow are skipped (nothing changed) and the scale backs off.

    A game refuses a starting point that is not finite and parameters on the
    ``meta`` device (``ValueError``). One call at a time: a step, ``state_dict``,
    ``load_state_dict`` and the products hold ``game.lock`` (a re-entrant lock), so
    a call from another thread waits for the running one (docs/misuse.md).

    Raises:
        ValueError: no players, a parameter owned by two players, neither ``losses``
            nor every player's ``loss=``, a setting out of range, a
            starting point that is not finite, or a parameter on the ``meta`` device.
        TypeError: an algorithm whose settings are incomplete (nothing is bound).
    """

    def __init__(
        self,
        players: Sequence[Player | nn.Module],
        losses: Callable[..., Sequence[Tensor]] | None = None,
        *,
        algorithm: Algorithm | None = None,
        on_nonfinite: str = "raise",
        process_group: Any = None,
        check_replicas_every: int = 0,
        loss_scale: DynamicLossScale | None = None,
    ) -> None:
        from .algorithms import SimGD

        # one step (or state_dict/load_state_dict) at a time; re-entrant for the thread holding it
        self.lock = threading.RLock()
        if isinstance(players, (Player, nn.Module)) or len(players) == 0:
            raise ValueError("Game needs a list of players")
        self.players = [p if isinstance(p, Player) else Player(p) for p in players]
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
        algorithm = algorithm if algorithm is not None else SimGD(lr=1e-3)
        _check_algorithm(algorithm)
        self._parallel = DataParallel(process_group) if process_group is not None else None
        self.check_replicas_every = int(check_replicas_every)
        self._steps = 0
        self._build_layout()
        self._check_fits(algorithm)
        self._check_values()
        if self._parallel is not None:  # rank 0's parameters and buffers, as DDP does
            with torch.no_grad():
                self._parallel.broadcast_(self.layout.data)
                self._parallel.broadcast_coalesced_(self._replicated_buffers())
        self._check_start()
        for what in self.project_(self.layout.data):
            log.info("the starting point was outside its feasible set: projected %s", what)
        self.algorithm = algorithm  # binds it and builds ``self.optimizer``

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm, bound to this game. Assigning another one checks that it fits
        the players, binds it (fresh state) and builds a new ``optimizer`` (the
        ``torch.optim.Optimizer`` for schedulers and Lightning); the previous
        optimizer then refuses to step."""
        return self._algorithm

    @algorithm.setter
    @_one_at_a_time
    def algorithm(self, algorithm: Algorithm) -> None:
        _check_algorithm(algorithm)
        self._check_fits(algorithm)
        algorithm.bind(self)
        self._algorithm = algorithm
        self.optimizer = GameOptimizer(self, algorithm)

    def _check_fits(self, algorithm: Algorithm) -> None:
        """Second-order algorithms need double backward and have no projected version."""
        if algorithm.first_order:
            return
        if self._constrained:
            raise ValueError(
                f"{type(algorithm).__name__} uses Jacobian products and has no projected or mirror version: "
                f"constrained players need a first-order algorithm ({first_order_names()})"
            )
        compiled = [
            p.name for p in self.players if p.module is not None and tc.compiled_original(p.module) is not p.module
        ]
        if compiled:
            raise ValueError(
                f"{type(algorithm).__name__} needs double backward (Jacobian products), which torch.compile'd "
                f"modules do not support (players {compiled}): give the game the uncompiled modules, or use a "
                f"first-order algorithm ({first_order_names()})"
            )

    # ---------------------------------------------------------- data parallel
    def _mean_(self, vec: Vec) -> Vec:
        """Average a joint vector across ranks in place (identity without a process group)."""
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
                self._mean_([torch.full_like(t, float("nan")) for t in self.layout.grad])
            raise

    def _replicated_buffers(self, persistent: bool = False) -> list[Tensor]:
        """The players' module buffers (each once; with ``persistent``, only those in
        the modules' ``state_dict``), which a data-parallel game keeps equal on every rank."""
        seen: dict[int, Tensor] = {}
        for m in self._submodules:
            keep = tc.persistent_buffer_names(m) if persistent else None
            for name, b in m._buffers.items():
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
        if all_finite(self.layout.data):
            return
        bad = [
            f"parameter {k} of player {p.name!r}"
            for p in self.players
            for k, q in enumerate(p.parameters)
            if not torch.isfinite(q.detach()).all()
        ]
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
        self.layout = JointLayout(self.players)
        self._grad_views = [player.grad_views() for player in self.players]
        self._submodules = [m for p in self.players for m in p.submodules]  # checked every step (_unchanged)
        self._cuda_devices = [key[0] for key in self.layout.keys if key[0].type == "cuda"]  # their generators
        # what autodiff sees of this game (it never sees the Game)
        self._problem = autodiff.Problem(
            names=[p.name for p in self.players],
            params=[p.parameters for p in self.players],
            grad_views=self._grad_views,
            places=[p.places for p in self.players],
            sparse=[p.has_sparse_grad for p in self.players],
            sizes=[p.numel for p in self.players],
            modules=self._modules(),
            recurrent=any(isinstance(m, nn.RNNBase) for m in self._submodules),
            layout=self.layout,
            mean_=self._mean_,
            parallel=self._parallel is not None,
            forward_mode=self._forward_mode,
        )
        self._backup: Vec | None = None
        self._pool = VecPool(self.layout)
        self._watch = _Watch(self.players, self._problem.registrations)
        # (entry, parameter index in its buffer, constraint) for every constrained parameter
        self._constrained = [
            (e, k, c)
            for e in self.layout.entries
            for k, p in enumerate(e.buffer.params)
            if (c := self.players[e.player].constraints.get(id(p))) is not None
        ]
        # per joint group: the constrained parameters fill it (a move forms all of it through sets)
        filled = [0] * len(self.layout.data)
        for e, k, _ in self._constrained:
            filled[e.group] += e.buffer.segments[k].numel
        self._covered = [n == t.numel() for n, t in zip(filled, self.layout.data)]
        self._made_views: list[tuple[Vec, list[Tensor]]] = []
        self._made_views = [(vec, self._views(vec)) for vec in (self.layout.data, self.layout.grad)]

    def _unchanged(self) -> bool:
        """Nothing moved since the layout was built (C-level passes over all players at once)."""
        return self._watch.intact()

    def _modules(self) -> list[nn.Module]:
        return [p.module for p in self.players if p.module is not None]

    def _sync(self) -> None:
        """Notice players that re-fused (module converted) or left the joint storage,
        and rebuild the layout keeping parameter values and algorithm state."""
        if self._unchanged():
            return
        changed = [p.refresh() for p in self.players]
        moved = any(
            e.buffer not in self.players[e.player].buffers
            or e.buffer.data.data_ptr() != self.layout.entry_view(self.layout.data, e).data_ptr()
            for e in self.layout.entries
        )
        re_fused = not all(map(operator.is_, map(_BUFFERS, self.players), self._watch.buffers))
        if not any(changed) and not moved and not re_fused:
            return
        old = self.layout
        vectors = _map_vectors(self.algorithm.state, old, lambda v: _unflatten(old, v))
        self._build_layout()
        self.algorithm.state = _carry(vectors, self.algorithm.init_state(self), self.layout)
        self.algorithm.refresh_params(self)
        log.info("game storage rebuilt after a player changed; algorithm state follows each parameter")

    # ------------------------------------------------------------ evaluation
    @contextlib.contextmanager
    def _at(self, at: Vec | None, along: Along | None = None, why: Callable[[], str] | None = None) -> Iterator[None]:
        """Evaluate at ``at``, or at w + factorᵢ·dᵢ for ``along=(d, factors)``, and put
        the current point back afterwards (also on error). Refuses a non-finite point."""
        if at is None and along is None:
            yield
            return
        data = self.layout.data
        self._backup = self.layout.empty()  # the current point, only while away from it
        tc.foreach_copy_(self._backup, data)
        try:
            with torch.no_grad():
                if at is not None:
                    tc.foreach_copy_(data, at)
                else:
                    self.layout.add_scaled_(data, *along)  # type: ignore[misc]
                    d, factors = along  # type: ignore[misc]
                    points = [
                        c.step(w, step)
                        for (_, _, c), w, step in zip(
                            self._constrained, self._views(self._backup), self._views(d, scale=factors)
                        )
                    ]
                    if not all_finite(points):
                        raise NonFiniteError(self._not_finite_through_sets(points))
                    for (e, k, _), point in zip(self._constrained, points):
                        self._param_view(data, e, k).copy_(point)
            if not all_finite(data):
                raise NonFiniteError(why() if why else "a point to evaluate at is not finite; nothing changed")
            yield
        finally:
            tc.foreach_copy_(data, self._backup)
            self._backup = None  # not held through the rest of the step (its peak)

    # -------------------------------------------------------- feasible sets
    def _param_view(self, vec: Vec, e: Any, k: int) -> Tensor:
        return e.buffer.views(self.layout.entry_view(vec, e))[k]

    def _views(self, vec: Vec, scale: Sequence[float] | None = None) -> list[Tensor]:
        """The constrained parameters' views of ``vec`` (times their player's factor);
        those of the joint parameters and gradients are made once per layout."""
        for tensors, made in self._made_views:
            if len(vec) == len(tensors) and all(map(operator.is_, vec, tensors)):
                views = made
                break
        else:
            views = [self._param_view(vec, e, k) for e, k, _ in self._constrained]
        if scale is None:
            return views
        return [v * scale[e.player] for v, (e, _, _) in zip(views, self._constrained)]

    def move(self, w: Vec, delta: Vec, out: Vec) -> Vec:
        """The point reached from ``w`` by the step ``delta``: ``w + delta``, and for
        a constrained parameter its set's step (the projection ``P(w + delta)``, or
        a mirror step such as ``w · exp(delta)`` normalized). ``out`` may be ``w``.
        The one place where a game forms a new point (see :mod:`gameopt.constraints`).
        Raises :class:`NonFiniteError`, with nothing written, if a set returns a
        point that is not finite."""
        with torch.no_grad():
            if not self._constrained:
                for o, x, d in zip(out, w, delta):  # one tensor per (device, dtype) group
                    o.add_(d) if o is x else torch.add(x, d, out=o)
                return out
            moved = [c.step(wv, dv) for (_, _, c), wv, dv in zip(self._constrained, self._views(w), self._views(delta))]
            if not all_finite(moved):
                raise NonFiniteError(self._not_finite_through_sets(moved))
            for o, x, d, covered in zip(out, w, delta, self._covered):
                if not covered:  # a group that the sets' points do not fill
                    o.add_(d) if o is x else torch.add(x, d, out=o)
            tc.foreach_copy_(self._views(out), moved)
        return out

    def _not_finite_through_sets(self, points: Sequence[Tensor]) -> str:
        """A message naming the constrained parameters whose new point is not finite."""
        bad = [
            f"parameter {k} of player {self.players[e.player].name!r} ({c!r})"
            for (e, k, c), x in zip(self._constrained, points)
            if not all_finite([x])
        ]
        return f"the point formed through a feasible set is not finite for {', '.join(bad)}; nothing changed"

    def delta_to(self, w: Vec, target: Vec, out: Vec) -> Vec:
        """The step whose :meth:`move` from ``w`` lands on ``target`` (feasible):
        ``target − w``, or the constraint's own (``log target − log w`` for the
        entropic simplex)."""
        with torch.no_grad():
            steps = [
                c.delta_to(wv, tv) for (_, _, c), wv, tv in zip(self._constrained, self._views(w), self._views(target))
            ]
            for o, t, x in zip(out, target, w):
                torch.sub(t, x, out=o)
            for (e, k, _), step in zip(self._constrained, steps):
                self._param_view(out, e, k).copy_(step)
        return out

    def project_(self, vec: Vec, nonconvex_only: bool = False) -> list[str]:
        """In place: project each constrained parameter's part of ``vec`` onto its set
        (with ``nonconvex_only``, only where the set is not convex); returns what moved."""
        moved = []
        with torch.no_grad():
            for (e, k, c), w in zip(self._constrained, self._views(vec)):
                if nonconvex_only and c.convex:
                    continue
                p = c.project(w)
                if not torch.equal(p, w):
                    moved.append(f"parameter {k} of player {self.players[e.player].name!r} onto {c!r}")
                    w.copy_(p)
        return moved

    @_autograd_on
    @_one_at_a_time
    def vector_field(self, *args: Any, **kwargs: Any) -> PerPlayer:
        """ξ(w) = (∇_{w_1} f_1, …, ∇_{w_n} f_n): one detached flat tensor per player
        (a tuple of tensors for a player with several dtype/device groups).

        Like every product below, it leaves module buffers (BatchNorm running
        statistics) and the global random generators as they were: only
        :meth:`step` moves them, once per step."""
        self._sync()
        with self._together(), self._evaluations()(plain=False):
            autodiff.vector_field(
                self._problem, range(len(self.players)), functools.partial(self.losses, *args, **kwargs)
            )
        return self.layout.per_player([t.clone() for t in self._mean_(self.layout.grad)])

    def _evaluations(self) -> Evaluations:
        return Evaluations(self._submodules, self._cuda_devices)

    @_autograd_on
    @_one_at_a_time
    def linearize(self, *args: Any, **kwargs: Any) -> Linearization:
        """ξ at the current point with its graph; ``.jvp(v)`` and ``.vjp(v)`` on joint vectors."""
        self._sync()
        evaluations = self._evaluations()
        with evaluations(plain=False):
            return autodiff.linearize(self._problem, functools.partial(self.losses, *args, **kwargs), evaluations)

    def jacobian_operator(self, *args: Any, **kwargs: Any) -> Any:
        """J at the current point as a ``scipy.sparse.linalg.LinearOperator`` (see
        :mod:`gameopt.diagnostics`)."""
        from .diagnostics import jacobian_operator

        return jacobian_operator(self, *args, **kwargs)

    @_autograd_on
    @_one_at_a_time
    def jvp(self, v: Sequence[Tensor], *args: Any, **kwargs: Any) -> PerPlayer:
        """J v, with J = ∂ξ/∂w the game Jacobian and ``v`` one flat tensor per player."""
        self._sync()
        vec = self.layout.from_per_player(v)
        return self.layout.per_player(self.linearize(*args, **kwargs).jvp(vec))

    @_autograd_on
    @_one_at_a_time
    def vjp(self, v: Sequence[Tensor], *args: Any, **kwargs: Any) -> PerPlayer:
        """Jᵀ v, with J = ∂ξ/∂w the game Jacobian and ``v`` one flat tensor per player."""
        self._sync()
        vec = self.layout.from_per_player(v)
        return self.layout.per_player(self.linearize(*args, **kwargs).vjp(vec))

    # ------------------------------------------------------------------ step
    def step(self, *args: Any, **kwargs: Any) -> StepLosses:
        """One step of the algorithm. Arguments are passed on to ``losses`` (or to
        each player's own ``loss=``), in every evaluation of the step.

        Returns the players' losses at the start of the step (a tuple of detached
        0-d tensors), with the metrics the losses returned beside them in
        ``.metrics`` (see :mod:`gameopt.evaluation`). The players' gradient buffers
        (``.grad``) serve as scratch space during a step; read ξ with
        :meth:`vector_field`.
        Raises :class:`NonFiniteError` (nothing changed) when a vector field or the
        update is not finite, unless ``on_nonfinite="skip"``. Any error leaves the
        parameters, the algorithm state and the module buffers as they were.

        Same as ``game.optimizer.step(closure)`` with the losses bound to these
        arguments: a step goes through ``torch.optim.Optimizer.step`` (its hooks,
        and the learning-rate schedulers' step count) whenever a hook, a scheduler
        or a profiler is there to see it.
        """
        closure = functools.partial(self.losses, *args, **kwargs)
        optimizer = self.optimizer
        if tc.optimizer_step_unobserved(optimizer):
            return optimizer.step_unobserved(closure)
        return optimizer.step(closure)

    @_autograd_on
    @_one_at_a_time
    def step_closure(self, closure: Callable[[], Any]) -> StepLosses:
        """The step itself, with the losses evaluated by ``closure()`` (no arguments);
        what ``game.optimizer.step(closure)`` runs. Prefer :meth:`step`."""
        self._sync()
        oracle = Oracle(self, closure)
        algorithm = self._algorithm
        old = algorithm.state
        kept = old
        buffers = [(b, b.clone()) for b in own_buffers(self._submodules)]
        try:
            algorithm.check_groups()  # lr and every scheduled value, whoever set it
            algorithm.sync_rule()  # scheduled betas, momentum, decay
            delta, new_state = algorithm.update(oracle, old)
            new_tensors = tensors_in(new_state)
            if new_tensors:
                _check_not_borrowed(new_tensors, oracle.borrowed, type(algorithm).__name__)
            if debug.enabled() and (untyped := _untyped_vectors(new_state, self.layout)):
                raise TypeError(
                    f"{type(algorithm).__name__}: joint vectors in the state must be gameopt.Vec (so that a "
                    f"re-fuse carries them by parameter), got plain lists at {', '.join(untyped)}"
                )
            if not all_finite(_unchecked(delta, new_tensors, old)):
                raise NonFiniteError(oracle.not_finite_message("the vector field ξ or the update"))
            self.move(self.layout.data, delta, out=self.layout.data)
            algorithm.state = kept = new_state
        except BaseException as err:
            with torch.no_grad():
                for b, copy in buffers:
                    b.data.copy_(copy)
            if not isinstance(err, NonFiniteError):
                raise
            if self.loss_scale is not None:
                self.loss_scale.update(finite=False)
                self.skipped_steps += 1
                log.info("overflow at loss scale %g: step skipped, scale now %g", oracle.scale, self.loss_scale.scale)
                return StepLosses(oracle.losses or (), oracle.evaluations.metrics)
            if self.on_nonfinite == "raise":
                raise
            self.skipped_steps += 1
            log.warning("non-finite step skipped (%d so far)", self.skipped_steps)
            return StepLosses(oracle.losses or (), oracle.evaluations.metrics)
        finally:
            # keep only what the committed state holds: the pool's other vectors live
            # within the step only
            if self._pool.lent:
                self._pool.recycle(tensors_in(kept))
        if self._parallel is not None:  # BatchNorm statistics: rank 0's, as DDP's broadcast_buffers
            with torch.no_grad():
                self._parallel.broadcast_coalesced_(self._replicated_buffers())
        if self.loss_scale is not None:
            self.loss_scale.update(finite=True)
        self._steps += 1
        if self.check_replicas_every and self._steps % self.check_replicas_every == 0:
            self.check_replicas()
        return StepLosses(oracle.losses or (), oracle.evaluations.metrics)

    # ----------------------------------------------------------- checkpoints
    @_one_at_a_time
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit for bit: each player's parameters and its
        module's persistent buffers (BatchNorm running statistics), the algorithm's
        state and learning rates. Loads with ``torch.load(weights_only=True)``."""
        self._sync()
        return {
            "players": clone_state(self._players_state()),
            "algorithm": self.algorithm.state_dict(),
            "skipped_steps": self.skipped_steps,
            "loss_scale": None if self.loss_scale is None else self.loss_scale.state_dict(),
        }

    def _players_state(self) -> list[dict[str, Any]]:
        """The players' part of :meth:`state_dict`, live tensors (not copies)."""
        return [
            {"name": p.name, "params": [b.data for b in p.buffers], "buffers": _module_buffers(p)} for p in self.players
        ]

    @_one_at_a_time
    def check_state_dict(self, state_dict: Any) -> None:
        """Raise ``ValueError`` naming what is wrong unless ``state_dict`` fits this
        game (players, shapes, dtypes, the algorithm and its state). Changes nothing."""
        self._sync()
        if not isinstance(state_dict, dict):
            raise ValueError(f"a game state_dict must be a dict, got {type(state_dict).__name__}")
        missing = {"players", "algorithm", "skipped_steps", "loss_scale"} - set(state_dict)
        if missing:
            raise ValueError(f"the state_dict lacks {sorted(missing)}")
        players = state_dict["players"]
        if not isinstance(players, list) or len(players) != len(self.players):
            got = f"{len(players)} players" if isinstance(players, list) else type(players).__name__
            raise ValueError(f"players: expected {len(self.players)} players, got {got}")
        # written before players had unique names and checkpoints their identity: a player
        # whose default name was made unique matches its old name, by position as then
        algorithm = state_dict["algorithm"]
        legacy = isinstance(algorithm, dict) and "identity" not in algorithm
        for k, (p, mine, saved) in enumerate(zip(self.players, self._players_state(), players)):
            if not isinstance(saved, dict):
                raise ValueError(f"players[{k}]: expected a dict, got {type(saved).__name__}")
            if saved.get("name") != p.name and not (legacy and saved.get("name") == _base_name(p)):
                raise ValueError(f"checkpoint player {saved.get('name')!r} does not match player {p.name!r}")
            check_like(mine, saved, f"players[{k}]")
        self.algorithm.check_state_dict(state_dict["algorithm"])
        check_number("skipped_steps", state_dict["skipped_steps"], low=0, integer=True)
        mine_scale = None if self.loss_scale is None else self.loss_scale.state_dict()
        if (mine_scale is None) != (state_dict["loss_scale"] is None):
            raise ValueError("loss_scale: the checkpoint and the game differ in using a DynamicLossScale")
        check_like(mine_scale, state_dict["loss_scale"], "loss_scale")
        if mine_scale is not None:
            check_number("loss_scale.scale", state_dict["loss_scale"]["scale"], low=0.0, low_open=True)

    @_one_at_a_time
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`. Everything is checked before anything is
        written: a state that does not fit raises ``ValueError`` and changes nothing."""
        self.check_state_dict(state_dict)
        self.algorithm.load_state_dict(state_dict["algorithm"])
        with torch.no_grad():
            for mine, saved in zip(self._players_state(), state_dict["players"]):
                tc.foreach_copy_(mine["params"], saved["params"])
                for name, t in mine["buffers"].items():
                    t.copy_(saved["buffers"][name])
        self.skipped_steps = int(state_dict["skipped_steps"])
        if self.loss_scale is not None:
            self.loss_scale.load_state_dict(state_dict["loss_scale"])

    def __repr__(self) -> str:
        names = ", ".join(p.name for p in self.players)
        return f"Game([{names}], algorithm={self.algorithm!r})"


_BUFFERS = operator.attrgetter("buffers")
_requires_grad = operator.attrgetter("requires_grad")


def _module_buffers(player: Player) -> dict[str, Tensor]:
    """The persistent buffers of a player's module (those in its ``state_dict``), by name."""
    if player.module is None:
        return {}
    out = {}
    # a torch.compile wrapper: the module it holds (names as in eager mode)
    for prefix, sub in tc.compiled_original(player.module).named_modules():
        keep = tc.persistent_buffer_names(sub)
        for name, b in sub._buffers.items():
            if b is not None and name in keep:
                out[f"{prefix}.{name}" if prefix else name] = b
    return out


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


def _base_name(player: Player) -> str:
    """A player's name before :func:`_unique_names` suffixed it."""
    return player.name if player.name_given else re.sub(r"_\d+$", "", player.name)


def _check_algorithm(algorithm: Any) -> None:
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"algorithm must be a gameopt Algorithm, got {type(algorithm).__name__}")


class _Watch:
    """What a game's layout was built on: each player's buffers, where each parameter
    is registered, each parameter's storage pointer and shape, and every player's
    registries (:meth:`Player.registry_watch`), all checked in one set of C-level passes."""

    def __init__(self, players: Sequence[Player], places: Sequence[tuple[nn.Module, str, nn.Parameter]]) -> None:
        self.players = list(players)
        self.buffers = [p.buffers for p in players]
        self.subs = [sub for sub, _, _ in places]
        self.names = [name for _, name, _ in places]
        self.registered = [q for _, _, q in places]
        self.params = [q for p in players for b in p.buffers for q in b.params]
        self.ptrs = [q.data_ptr() for q in self.params]
        self.shapes = [q.shape for q in self.params]
        watched = [p.registry_watch() for p in players]
        self.reg_dicts, self.reg_names, self.reg_values, self.dicts, self.sizes, self.flagged, self.flags = (
            [x for w in watched for x in w[k]] for k in range(7)
        )

    def intact(self) -> bool:
        """Nothing moved: the same buffers, registrations, storage, shapes and flags
        (what ``links_intact`` and every player's ``registry_intact`` check)."""
        return (
            all(map(operator.is_, map(_BUFFERS, self.players), self.buffers))
            and links_intact(self.params, self.ptrs, self.shapes, self.subs, self.names, self.registered)
            and all(map(operator.is_, map(dict.get, self.reg_dicts, self.reg_names), self.reg_values))
            and list(map(len, self.dicts)) == self.sizes
            and list(map(_requires_grad, self.flagged)) == self.flags
        )


def _check_not_borrowed(state_tensors: Sequence[Tensor], borrowed: Sequence[Vec], name: str) -> None:
    """Refuse a state (given by its tensors) that holds a vector that :meth:`Oracle.xi`
    lent (the gradient buffer, which the next evaluation overwrites)."""
    lent = {t.untyped_storage().data_ptr() for vec in borrowed for t in vec}
    if lent and any(t.untyped_storage().data_ptr() in lent for t in state_tensors):
        raise RuntimeError(
            f"{name}.update returned a state that holds the result of oracle.xi(), which is borrowed "
            "(the next evaluation overwrites it): keep a copy (oracle.empty().copy_(xi)) instead"
        )


def _unchecked(delta: Vec, new_tensors: Sequence[Tensor], old_state: Any) -> list[Tensor]:
    """The tensors of a step to check for finiteness, each once: the delta and the
    new state's tensors, less what the old state already held (checked when committed)."""
    old = tensors_in(old_state)
    if not old and not new_tensors:
        return list(delta)
    seen = set(map(id, old))
    out = []
    for t in [*delta, *new_tensors]:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _is_vec(obj: Any, layout: JointLayout) -> bool:
    """A joint vector of ``layout`` in a state: typed, never guessed from shapes."""
    if not isinstance(obj, Vec):
        return False
    if [t.shape for t in obj] != [d.shape for d in layout.data]:
        raise RuntimeError("the algorithm state holds a gameopt.Vec that is not a joint vector of the game")
    return True


def _untyped_vectors(obj: Any, layout: JointLayout, path: str = "state") -> list[str]:
    """Where a state holds a joint vector as a plain list (not a :class:`Vec`): a
    re-fuse could not carry it by parameter. Shapes are a guess: debug mode only."""
    if isinstance(obj, Vec):
        return []
    if isinstance(obj, dict):
        return [w for k, v in obj.items() for w in _untyped_vectors(v, layout, f"{path}[{k!r}]")]
    if isinstance(obj, (list, tuple)):
        if (
            isinstance(obj, list)
            and len(obj) == len(layout.data)
            and all(isinstance(t, Tensor) and t.shape == d.shape for t, d in zip(obj, layout.data))
        ):
            return [path]
        return [w for k, v in enumerate(obj) for w in _untyped_vectors(v, layout, f"{path}[{k}]")]
    return []


def _map_vectors(obj: Any, layout: JointLayout, fn: Callable[[Vec], Any]) -> Any:
    """Apply ``fn`` to every joint vector (of ``layout``) inside a state structure."""
    if isinstance(obj, _PerParam):
        return fn(obj)
    if _is_vec(obj, layout):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_vectors(v, layout, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_vectors(v, layout, fn) for v in obj)
    return obj


class _PerParam(dict):
    """A joint vector taken apart by parameter identity: id(param) -> (param, values).
    The parameter object is held so that its id cannot be reused meanwhile."""


def _unflatten(layout: JointLayout, vec: Vec) -> _PerParam:
    out = _PerParam()
    for e in layout.entries:
        for p, view in zip(e.buffer.params, e.buffer.views(layout.entry_view(vec, e))):
            out[id(p)] = (p, view.clone())
    return out


def _carry(old: Any, fresh: Any, layout: JointLayout) -> Any:
    """The algorithm state after a re-layout: ``fresh`` (a new ``init_state``) with each
    surviving parameter's part of every joint vector taken from ``old`` (taken apart
    by :func:`_unflatten`), and ``old``'s other values (step counts)."""
    if isinstance(old, _PerParam):
        return _fill(layout, old, fresh)
    if isinstance(old, dict):
        if "t" in old and isinstance(old.get("m"), _PerParam):  # a rule's state with a step count
            return {
                **{k: _carry(v, fresh[k], layout) for k, v in old.items() if k != "t"},
                "t": _counts(old, fresh, layout),
            }
        return {k: _carry(v, fresh[k], layout) for k, v in old.items()}
    if isinstance(old, (list, tuple)):
        return type(old)(_carry(v, f, layout) for v, f in zip(old, fresh))
    return old


def _counts(old: dict[str, Any], fresh: dict[str, Any], layout: JointLayout) -> int | Vec:
    """An update rule's step count after a re-layout: a parameter that joined since (or
    whose shape changed) starts from 0, as under torch.optim, so that its bias
    correction is its own. One number while all parameters share it; else one per
    element, a joint vector like the moments."""
    t = old["t"]
    if isinstance(t, int):
        moments = old["m"]
        carried = all(
            id(p) in moments and moments[id(p)][0] is p and moments[id(p)][1].shape == p.shape
            for e in layout.entries
            for p in e.buffer.params
        )
        if t == 0 or carried:
            return t
        t = _PerParam({k: (p, torch.full_like(values, t)) for k, (p, values) in old["m"].items()})
    zeros = Vec(torch.zeros_like(x) for x in fresh["m"])
    return _fill(layout, t, zeros)


def _fill(layout: JointLayout, per_param: _PerParam, vec: Vec) -> Vec:
    """Write each parameter's own values (by identity, never by position) into ``vec``;
    a parameter that joined since, or whose shape changed, keeps ``vec``'s fresh state."""
    fresh = []
    with torch.no_grad():
        for e in layout.entries:
            for p, view in zip(e.buffer.params, e.buffer.views(layout.entry_view(vec, e))):
                old = per_param.get(id(p))
                if old is not None and old[0] is p and old[1].shape == view.shape:
                    view.copy_(old[1])
                else:
                    fresh.append(tuple(view.shape))
    if fresh:
        log.info("fresh algorithm state for %d parameter(s) of shapes %s", len(fresh), fresh)
    return vec
