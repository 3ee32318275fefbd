"""A player: one module's trainable parameters in fused flat buffers."""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from . import _torch_compat as tc
from .buffer import FlatBuffer, FlatParameter, mark_stale
from .constraints import Box, Constraint, NonNegative, as_constraint
from .copying import copy_callable
from .sharded import ShardedBuffer, fsdp_params_of, is_sharded
from .unmovable import ddp_refusal

_SPARSE_MODULES = (nn.Embedding, nn.EmbeddingBag)
_MISSING = object()
_requires_grad = operator.attrgetter("requires_grad")


class RegistryWatch(NamedTuple):
    """What :meth:`Player.registry_intact` compares (:meth:`Player.registry_watch`),
    as parallel lists that :func:`registries_intact` checks in three C-level passes."""

    #: the registries (a module's parameter or submodule dict), one per registration
    reg_dicts: list[dict]
    #: the name looked up in each of them
    reg_names: list[str]
    #: the value found there at fusing
    reg_values: list[Any]
    #: every registry, for its size
    dicts: list[dict]
    #: their sizes at fusing
    sizes: list[int]
    #: the parameters whose ``requires_grad`` is watched
    flagged: list[Tensor]
    #: their flags at fusing
    flags: list[bool]

    @classmethod
    def joined(cls, watches: Sequence[RegistryWatch]) -> RegistryWatch:
        """Several players' watches (one at least) as one, checked in the same three passes."""
        return cls(*([x for part in parts for x in part] for parts in zip(*watches)))


def registries_intact(watched: RegistryWatch) -> bool:
    """The three C-level passes of :meth:`Player.registry_intact` over what
    :meth:`Player.registry_watch` returns (or several players' watches joined): every
    registration still holds its value, every registry its size, every watched
    parameter its ``requires_grad`` flag."""
    reg_dicts, reg_names, reg_values, dicts, sizes, flagged, flags = watched
    return (
        all(map(operator.is_, map(dict.get, reg_dicts, reg_names), reg_values))
        and list(map(len, dicts)) == sizes
        and list(map(_requires_grad, flagged)) == flags
    )


def _carry_flat_parameters(old: Sequence[FlatBuffer], new: Sequence[FlatBuffer]) -> None:
    """After re-fusing, hand each old buffer's flat parameter tensor to the new buffer
    that holds its parameters (one group to one group: always), so that an optimizer
    built on it keeps training the module. One whose parameters split across groups,
    all left, or whose new group already took another raises when used."""
    if len(old) == 1 and len(new) == 1:
        new[0].adopt(old[0])
        return
    where = {id(p): k for k, b in enumerate(new) for p in b.params}
    taken: set[int] = set()
    for buf in old:
        targets = {where[id(p)] for p in buf.params if id(p) in where}
        if len(targets) == 1 and not targets & taken:
            taken |= targets
            new[targets.pop()].adopt(buf)
        elif type(buf.data) is FlatParameter and buf.data.__dict__.get("_gameopt_buffer") is buf:
            what = "split across groups" if len(targets) > 1 else "left the player or joined another group"
            mark_stale(buf.data, f"the player re-fused and this group's parameters {what}")


#: what fusing makes (:meth:`Player._fuse`), left out of copies and pickles: a copy fuses its own
_FUSED = frozenset(
    {
        "buffers",
        "has_sparse_grad",
        "_params",
        "_owners",
        "_where",
        "constraints",
        "_modules_seen",
        "_reg_dicts",
        "_reg_names",
        "_reg_values",
        "_dicts",
        "_sizes",
        "_flagged",
        "_flags",
    }
)


class Player:
    """One player of a game: its parameters live in flat buffers.

    The module's trainable parameters (``requires_grad=True``; tied weights once,
    in ``module.parameters()`` order) move into one contiguous :class:`~gameopt.buffer.FlatBuffer`
    per (device, dtype) group and become views of it; their ``.grad`` are views of
    the matching flat gradient buffer. Frozen parameters stay where they are.

    Args:
        module: an ``nn.Module``, an iterable of ``nn.Parameter``, or one tensor
            (one parameter). A non-leaf tensor is refused here (``ValueError``, as
            ``torch.optim`` does); a game refuses a player with ``meta`` parameters.
        loss: optional callable returning this player's scalar loss; a
            :class:`~gameopt.Game` built without a joint ``losses`` calls it with the
            arguments given to ``game.step(...)``.
        name: a label for messages (default: the module's class name).
        align: pad each parameter's start to this many bytes (default: tight).
        constraint: a feasible set (:mod:`gameopt.constraints`) for every parameter,
            or ``{"name": set, ...}`` for a module's parameters by name (the rest
            stay free). First-order algorithms become their projected or mirror
            versions; a starting point outside its set is projected when the game
            is built.

    Conversions after fusing (``module.double()``, ``.to(...)``, ``p.data = ...``,
    ``load_state_dict(..., assign=True)``), parameters added, removed, frozen
    (``requires_grad_(False)``) or unfrozen, and submodules added or replaced are
    noticed by :meth:`refresh`, which every game step calls, and re-fused with the
    current values. Sparse gradients (``nn.Embedding(sparse=True)``) are densified
    into the flat gradient buffer.

    Raises:
        ValueError: a module without trainable parameters, or a constraint that does
            not fit its parameter or names a parameter the module lacks.
    """

    def __init__(
        self,
        module: nn.Module | Tensor | Iterable[Tensor],
        *,
        loss: Callable[[], Tensor] | None = None,
        name: str | None = None,
        align: int | None = None,
        constraint: Any = None,
    ) -> None:
        if align is not None and (not isinstance(align, int) or align <= 0):
            raise ValueError(f"align must be a positive number of bytes, got {align!r}")
        if isinstance(module, nn.Module):
            self.module: nn.Module | None = module
            # a torch.compile wrapper keeps the name of the module it compiled
            default_name = type(tc.compiled_original(module)).__name__
        else:
            self.module = None
            # a single tensor is one parameter (not an iterable of its rows)
            self._given = [module] if isinstance(module, Tensor) else list(module)
            for p in self._given:
                if not isinstance(p, Tensor):
                    raise TypeError(f"Player expects an nn.Module or Parameters, got {type(p).__name__}")
            default_name = "params"
        if loss is not None and not callable(loss):
            raise TypeError("loss must be a callable returning a scalar tensor")
        self.loss = loss
        self.name = name if name is not None else default_name
        #: the name was given (``name=``), not made from the module's class
        self.name_given = name is not None
        self.align = align
        if constraint is not None and isinstance(constraint, dict):
            if self.module is None:
                raise ValueError("constraints by parameter name need a module (got an iterable of parameters)")
            constraint = {key: as_constraint(c, f"constraint[{key!r}]") for key, c in constraint.items()}
        elif constraint is not None:
            constraint = as_constraint(constraint)
        self._constraint = constraint
        self.constraints: dict[int, Constraint] = {}  # id(parameter) -> its feasible set
        self.generation = 0  # bumped each time the player re-fuses
        self._fuse()

    # ------------------------------------------------------------------ fusing
    def _collect(self) -> tuple[list[Tensor], list[list[tuple[nn.Module, str]]]]:
        """Trainable parameters, deduplicated, and where each is registered."""
        params: list[Tensor] = []
        owners: dict[int, list[tuple[nn.Module, str]]] = {}
        if self.module is None:
            for p in self._given:
                if p.requires_grad and id(p) not in owners:
                    owners[id(p)] = []
                    params.append(p)
        else:
            for sub in self.module.modules():
                for pname, p in tc.parameter_registry(sub).items():
                    if p is None or not p.requires_grad:
                        continue
                    if id(p) not in owners:
                        owners[id(p)] = []
                        params.append(p)
                    owners[id(p)].append((sub, pname))
        return params, [owners[id(p)] for p in params]

    def _resolve_constraints(self, params: list[Tensor]) -> dict[int, Constraint]:
        """id(parameter) -> its feasible set; checks that each set fits its parameter."""
        spec = self._constraint
        if spec is None:
            return {}
        named: list[tuple[str, Tensor]] = []
        if not isinstance(spec, dict):
            named = [(f"parameter {k}", p) for k, p in enumerate(params)]
            out = {id(p): spec for _, p in named}
        else:
            assert self.module is not None
            # by the eager modules' names (``0.weight``) where torch.compile wrapped the module or a
            # submodule, and by the wrappers' (``_orig_mod.0.weight``, as named_parameters has them)
            by_name = {
                f"{prefix}.{n}" if prefix else n: p
                for prefix, sub in tc.eager_named_modules(self.module, remove_duplicate=False)
                for n, p in tc.parameter_registry(sub).items()
                if p is not None
            }
            eager = list(by_name)
            by_name.update(self.module.named_parameters(remove_duplicate=False))
            trainable = {id(p) for p in params}
            out = {}
            for key, c in spec.items():
                if key not in by_name:
                    raise ValueError(
                        f"player {self.name!r}: constraint on {key!r}, but the module has no parameter named {key!r} "
                        f"(its parameters: {', '.join(eager)})"
                    )
                p = by_name[key]
                if id(p) not in trainable:
                    raise ValueError(f"player {self.name!r}: constraint on {key!r}, which is not trainable")
                named.append((key, p))
                out[id(p)] = c
        for what, t in named:
            out[id(t)].check(t.shape, what)
        return out

    def _fuse(self) -> None:
        modules = list(self.module.modules()) if self.module is not None else []
        wrapped = ddp_refusal(self.name, modules)
        if wrapped is not None:
            raise ValueError(wrapped)
        params, owners = self._collect()
        if not params:
            raise ValueError(f"player {self.name!r} has no trainable parameters (requires_grad=True)")
        constraints = self._resolve_constraints(params)  # before anything changes
        if self.module is not None:
            sparse = [m for m in self.module.modules() if isinstance(m, _SPARSE_MODULES) and m.sparse]
            has_sparse_grad = bool(sparse)
        else:
            has_sparse_grad = False
        groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
        for k, p in enumerate(params):
            if not p.is_leaf:  # torch.optim's reason
                raise ValueError(
                    f"player {self.name!r}: can't optimize a non-leaf Tensor (parameter {k}, of shape "
                    f"{tuple(p.shape)}, is the result of an operation): pass a leaf, e.g. nn.Parameter(t.detach())"
                )
            if p.layout != torch.strided:
                raise ValueError(f"player {self.name!r}: only strided (dense) parameters can be fused")
            groups.setdefault((p.device, p.dtype), []).append(p)
        old: tuple[FlatBuffer, ...] = getattr(self, "buffers", ())
        buffers = self._buffers(params, groups, modules, constraints)
        # every group fused: optimizers built on the old flat parameters follow them,
        # and parameters that left (frozen, removed, replaced) get their own storage
        _carry_flat_parameters(old, buffers)
        kept = {id(p) for p in params}
        for home, left in {id(p): (b, p) for b in old for p in b.params if id(p) not in kept}.values():
            home.release(left)
        self.has_sparse_grad = has_sparse_grad
        self.buffers: tuple[FlatBuffer, ...] = buffers
        self._params = params
        self._owners = owners
        self._where = {id(p): (b, i) for b in self.buffers for i, p in enumerate(b.params)}
        self.constraints = constraints
        self._snapshot(modules)
        self.generation += 1

    def _buffers(
        self,
        params: list[Tensor],
        groups: dict[tuple[torch.device, torch.dtype], list[Tensor]],
        modules: list[nn.Module],
        constraints: dict[int, Constraint],
    ) -> tuple[FlatBuffer, ...]:
        """One buffer per (device, dtype) group: of whole parameters, or of the local
        shards of parameters that ``fully_shard`` sharded (:mod:`gameopt.sharded`)."""
        sharded = [is_sharded(p) for p in params]
        if not any(sharded):
            return tuple(FlatBuffer(g, self.align, modules, owner=self) for g in groups.values())
        if not all(sharded):
            raise ValueError(
                f"player {self.name!r}: {sharded.count(True)} of its {len(params)} parameters are sharded (DTensor) "
                "and the rest are not: fully_shard the player's root module too, so that FSDP shards them all"
            )
        if self.module is None:
            raise ValueError(f"player {self.name!r}: give a sharded player as its module (fully_shard's), not tensors")
        if self.align is not None:
            raise ValueError(f"player {self.name!r}: align= does not apply to sharded parameters (FSDP pads them)")
        whole = [c for c in constraints.values() if not isinstance(c, (NonNegative, Box))]
        if whole:
            raise ValueError(
                f"player {self.name!r}: {type(whole[0]).__name__} constrains a whole parameter, which a rank holds "
                "only a shard of: sharded players take elementwise sets (Box, NonNegative)"
            )
        fsdp = {id(p): fp for p, fp in zip(params, fsdp_params_of(self.name, self.module, params))}
        return tuple(ShardedBuffer(g, [fsdp[id(p)] for p in g], modules, owner=self) for g in groups.values())

    def _snapshot(self, modules: list[nn.Module]) -> None:
        """Remember every registration (trainable or not, and every submodule), the
        sizes of the registries and the ``requires_grad`` flags, for
        :meth:`registry_intact`. The registry dicts themselves are kept: looking them up
        again costs more than the check."""
        self._modules_seen = modules
        entries = [(tc.parameter_registry(m), n, v) for m in modules for n, v in tc.parameter_registry(m).items()]
        entries += [(tc.submodule_registry(m), n, c) for m in modules for n, c in tc.submodule_registry(m).items()]
        self._reg_dicts = [d for d, _, _ in entries]
        self._reg_names = [n for _, n, _ in entries]
        self._reg_values = [v for _, _, v in entries]
        self._dicts = [tc.parameter_registry(m) for m in modules] + [tc.submodule_registry(m) for m in modules]
        self._sizes = list(map(len, self._dicts))
        registered = [v for m in modules for v in tc.parameter_registry(m).values()]
        candidates = self._given if self.module is None else registered
        self._flagged = list({id(p): p for p in candidates if p is not None}.values())
        self._flags = list(map(_requires_grad, self._flagged))

    # ---------------------------------------------------------------- checking
    def registry_intact(self) -> bool:
        """True when no parameter or submodule was added, removed or replaced and no
        ``requires_grad`` flag changed since fusing. Iterated in C (three passes), so a
        game can run it every step."""
        return registries_intact(self.registry_watch())

    def registry_watch(self) -> RegistryWatch:
        """What :meth:`registry_intact` compares, for a caller that checks several
        players in one pass (``RegistryWatch.joined``): the registries, the names
        looked up in them and the values found there at fusing; the registries and
        their sizes; the parameters whose ``requires_grad`` is watched and their flags.
        Valid until the player re-fuses (a new ``buffers`` tuple)."""
        return RegistryWatch(
            self._reg_dicts,
            self._reg_names,
            self._reg_values,
            self._dicts,
            self._sizes,
            self._flagged,
            self._flags,
        )

    def why_stale(self) -> str | None:
        """Why the module no longer uses this player's buffers, or ``None``: a
        parameter replaced, converted, added, removed, frozen or unfrozen, or a
        submodule added, removed or replaced since fusing."""
        if self.registry_intact():  # fast path
            return self._buffers_stale()
        return self._registry_change() or self._buffers_stale()

    def _registry_change(self) -> str | None:
        n_params = sum(len(tc.parameter_registry(m)) for m in self._modules_seen)
        for k, (reg, name, value) in enumerate(zip(self._reg_dicts, self._reg_names, self._reg_values)):
            now = reg.get(name, _MISSING)
            if now is not value:
                what = "parameter" if k < n_params else "submodule"
                how = "removed" if now is _MISSING else "replaced (assign=True or setattr)"
                return f"{what} {name!r} of {self._owner_of(reg)} was {how}"
        for reg, size in zip(self._dicts, self._sizes):
            if len(reg) != size:
                new = [n for n in reg if n not in self._reg_names]
                what = "parameter" if any(reg is tc.parameter_registry(m) for m in self._modules_seen) else "submodule"
                return f"{what} {new[0] if new else '?'!r} was added to {self._owner_of(reg)}"
        for p, flag in zip(self._flagged, self._flags):
            if p.requires_grad != flag:
                how = "unfrozen" if p.requires_grad else "frozen"
                return f"parameter {self._place(p)} was {how} (requires_grad={p.requires_grad})"
        return None

    def _owner_of(self, registry: dict) -> str:
        for m in self._modules_seen:
            if tc.parameter_registry(m) is registry or tc.submodule_registry(m) is registry:
                return type(m).__name__
        return "a module"

    def _place(self, p: Tensor) -> str:
        for reg, name, value in zip(self._reg_dicts, self._reg_names, self._reg_values):
            if value is p:
                return f"{name!r} of {self._owner_of(reg)}"
        return f"of shape {tuple(p.shape)}"

    def _buffers_stale(self) -> str | None:
        for buf in self.buffers:
            why = buf.why_stale()
            if why:
                return why
        return None

    def refresh(self) -> bool:
        """Re-fuse if the module changed since fusing; return True if it did.

        A parameter added (or unfrozen) since joins the buffers with its current
        value; one frozen, removed or replaced leaves them with its own copy of its
        value and gradient. Python identity of every parameter is kept, and so are
        the flat parameter tensors (``player.flat_param``, ``buffers[i].data``) where a
        group's parameters stay in one group. Raises a ``RuntimeError`` saying what
        happened if re-fusing is impossible.
        """
        why = self.why_stale()
        if why is None:
            return False
        try:
            self._fuse()
        except RuntimeError as err:
            raise RuntimeError(f"player {self.name!r}: {why}, and re-fusing failed: {err}") from err
        return True

    # ---------------------------------------------------------------- access
    def _single(self, what: str) -> FlatBuffer:
        self.refresh()
        if len(self.buffers) != 1:
            groups = ", ".join(f"{b.device}/{b.dtype} ({b.num_elements} elements)" for b in self.buffers)
            raise ValueError(
                f"player {self.name!r} has {len(self.buffers)} parameter groups ({groups}); "
                f"there is no single flat {what} tensor: use player.buffers[i].{what}"
            )
        return self.buffers[0]

    @property
    def flat_param(self) -> Tensor:
        """The flat parameter tensor, a :class:`~gameopt.buffer.FlatParameter`, is the
        storage itself, so writes reach the module, and a tensor any ``torch.optim``
        optimizer takes (``torch.optim.Adam([player.flat_param])``, LBFGS included):
        its ``.grad`` is :attr:`grad`. It is the same object for the player's whole
        life: it follows the parameters into a game's joint storage and through
        re-fusing (one that cannot follow raises when used, never trains nothing).
        A player with several (device, dtype) groups has one per group:
        ``player.buffers[i].data``."""
        return self._single("data").data

    @property
    def grad(self) -> Tensor:
        """The flat gradient tensor; parameters without a gradient read as exact zeros."""
        buf = self._single("grad")
        buf.relink_grads()
        return buf.grad

    @property
    def numel(self) -> int:
        """The number of trainable elements (padding excluded)."""
        return sum(b.num_elements for b in self.buffers)

    @property
    def parameters(self) -> list[Tensor]:
        """The fused parameters, in fusing order."""
        return list(self._params)

    @property
    def submodules(self) -> list[nn.Module]:
        """The module and all its submodules, as at fusing (the game checks every step
        that none was added, removed or replaced)."""
        return list(self._modules_seen)

    @property
    def places(self) -> list[list[tuple[nn.Module, str]]]:
        """For each fused parameter (in :attr:`parameters` order), the (module,
        attribute name) pairs where it is registered."""
        return [list(places) for places in self._owners]

    def grad_views(self) -> list[Tensor]:
        """For each fused parameter (in :attr:`parameters` order), its view into the
        flat gradient buffer."""
        return [buf.grad_view(idx) for buf, idx in map(self._where.__getitem__, map(id, self._params))]

    def relink_grads(self) -> None:
        """Point every parameter's ``.grad`` back into the flat gradient buffers."""
        for b in self.buffers:
            b.relink_grads()

    def unfuse(self) -> None:
        """Give every parameter its own storage again, with its current value and
        gradient, and drop gameopt's hooks: the module as before fusing (what a refused
        :class:`~gameopt.Game` does to the modules it wrapped). The player is done."""
        for b in self.buffers:
            for p in b.params:
                b.release(p)

    # --------------------------------------------------------------- copies
    def __getstate__(self) -> dict[str, Any]:
        """What a copy or a pickle keeps: the module (or the parameters), the loss and
        the settings. The fused storage stays behind: a copy fuses its own."""
        return {k: v for k, v in vars(self).items() if k not in _FUSED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._fuse()

    def __deepcopy__(self, memo: dict[int, Any]) -> Player:
        """An independent player: a deep copy of the module (or the parameters), fused
        into buffers of its own, the same values; the gradients start at zero, as
        ``copy.deepcopy`` of a module leaves them. A ``loss=`` closure over the module
        evaluates the copy's module (:func:`gameopt.copying.copy_callable`)."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        state = self.__getstate__()
        loss = state.pop("loss")
        state = copy.deepcopy(state, memo)
        state["loss"] = copy_callable(loss, memo)  # after the module: a closure over it takes the copy
        new.__setstate__(state)
        for b in new.buffers:  # as copy.deepcopy of a module leaves its parameters: no gradient
            b.zero_grad()
        return new

    def __repr__(self) -> str:
        return f"Player({self.name!r}, numel={self.numel}, buffers={list(self.buffers)})"
