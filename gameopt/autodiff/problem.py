"""What autodiff sees of a game (:class:`Problem`; never the ``Game``)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor, nn
from torch.overrides import has_torch_function

from .. import _torch_compat as tc
from ..evaluation import LossError
from ..layout import JointLayout
from ..sharded import ShardedBuffer
from ..vec import PieceViews, Vec


class ForwardMode:
    """Whether Jv may use forward-mode AD for these losses: set to False, once, when
    PyTorch reports an op without a forward-mode formula (then double backward)."""

    def __init__(self) -> None:
        self.ok = True


@dataclass(frozen=True)
class Problem:
    """All that autodiff sees of a game: per player its name, parameters, their
    views into the flat gradient buffer, where each is registered in its module, and
    whether it has sparse gradients; the joint layout; the cross-rank average of a
    joint vector. The game builds one per layout."""

    names: list[str]
    params: list[list[Tensor]]
    grad_views: list[list[Tensor]]
    places: list[list[list[tuple[nn.Module, str]]]]
    sparse: list[bool]
    sizes: list[int]  # trainable elements per player
    modules: list[nn.Module]  # the players' modules (players given as tensors have none)
    recurrent: bool  # a recurrent layer among them (its CPU kernel has no forward-mode AD)
    layout: JointLayout
    mean_: Callable[[Vec], Vec]  # average across ranks in place (identity on one process)
    parallel: bool  # data-parallel: ξ is an average across ranks
    forward_mode: ForwardMode
    #: per player, its buffers of FSDP-sharded shards (:mod:`gameopt.sharded`); empty
    #: for a player of whole parameters
    sharded: list[tuple[ShardedBuffer, ...]] = dataclasses.field(default_factory=list)

    @property
    def functional(self) -> bool:
        """Every player has a module whose parameters can be substituted."""
        return len(self.modules) == len(self.names)

    # Made once per layout (the game builds a new problem when a player re-fuses):
    @functools.cached_property
    def inputs(self) -> list[tuple[Tensor, ...]]:
        """Per player, its parameters as the tuple autograd's engine takes."""
        return [tuple(ps) for ps in self.params]

    @functools.cached_property
    def engine_ok(self) -> list[bool]:
        """Per player: autograd's engine entry point may take its parameters (it exists,
        and no parameter has ``__torch_function__``)."""
        return [tc.engine_run_backward is not None and not has_torch_function(ps) for ps in self.inputs]

    @functools.cached_property
    def on_cpu(self) -> list[bool]:
        """Per player: every parameter is on the CPU."""
        return [all(p.is_cpu for p in ps) for ps in self.params]

    @functools.cached_property
    def registrations(self) -> list[tuple[nn.Module, str, Tensor]]:
        """(module, name, parameter) for every place a parameter is registered."""
        return [
            (sub, name, p)
            for params, registered in zip(self.params, self.places)
            for p, places in zip(params, registered)
            for sub, name in places
        ]

    @functools.cached_property
    def aliases(self) -> dict[int, Tensor]:
        """Per parameter (by id): a detached alias (the same storage and version
        counter, a leaf of its own) that kept graphs are built on, so that they pin
        no parameter. Shared by every linearization of this layout."""
        return {id(p): p.detach().requires_grad_() for ps in self.params for p in ps}

    @functools.cached_property
    def piece_views(self) -> PieceViews:
        """Where each parameter's piece of ξ lies (:class:`~gameopt.vec.Pieces`): per player,
        its parameters' views of the joint gradient buffer and of the joint point (each
        a view of its group's tensor, sharing its version counter), and their groups."""
        layout = self.layout
        place = {id(p): (k, j) for k, e in enumerate(layout.entries) for j, p in enumerate(e.buffer.params)}
        places = [[place[id(p)] for p in ps] for ps in self.params]  # (entry, index in its buffer)

        def views_of(vec: Sequence[Tensor]) -> list[list[Tensor]]:
            entries = [e.buffer.views(layout.entry_view(vec, e)) for e in layout.entries]
            return [[entries[k][j] for k, j in ps] for ps in places]

        groups = [layout.entries[k].group for ps in places for k, _ in ps]
        return PieceViews(
            grad=layout.grad,
            grad_views=self.grad_views,
            point_views=views_of(layout.data),
            groups=groups,
            group_params=[groups.count(g) for g in range(len(layout.data))],
            views_of=views_of,
            packed=self.all_packed,
        )

    @functools.cached_property
    def entry_params(self) -> list[list[Tensor]]:
        """Per layout entry, the parameters of its buffer in order."""
        return [e.buffer.params for e in self.layout.entries]

    @functools.cached_property
    def entry_packed(self) -> list[bool]:
        """Per layout entry: its parameters tile its buffer (``FlatBuffer.packed``)."""
        return [e.buffer.packed for e in self.layout.entries]

    @functools.cached_property
    def all_packed(self) -> bool:
        """The parameters tile every joint group in storage order (``JointLayout.packed``)."""
        return all(self.layout.packed)

    @functools.cached_property
    def entries_of(self) -> list[list[int]]:
        """Per player, the indices of its layout entries."""
        entries = self.layout.entries
        return [[k for k, e in enumerate(entries) if e.player == i] for i in range(len(self.names))]

    @functools.cached_property
    def group_entries(self) -> list[list[int]]:
        """Per joint group, the indices of its layout entries in storage order."""
        layout = self.layout
        index = {id(e): k for k, e in enumerate(layout.entries)}
        return [[index[id(e)] for e in layout.group_entries(g)] for g in range(len(layout.data))]

    @functools.cached_property
    def storage_order(self) -> list[int]:
        """The indices of the layout entries, group by group, each in storage order."""
        return [k for ks in self.group_entries for k in ks]

    def refuse_complex(self, algorithm: str, first_order: str) -> None:
        """Raise ``ValueError`` naming the first complex parameter: ``algorithm``'s inner
        products and linear solves (``Vec.dot``, CG) treat vectors as real, so a
        second-order algorithm would step wrongly on complex players. ``first_order``
        names the algorithms that take them (update rules see complex as pairs of reals)."""
        for name, params in zip(self.names, self.params):
            for k, p in enumerate(params):
                if p.is_complex():
                    raise ValueError(
                        f"{algorithm} does not support complex parameters: player {name!r}, parameter {k} "
                        f"(shape {tuple(p.shape)}, {p.dtype}). Give the player a real parameter of shape "
                        f"(..., 2) (torch.view_as_real of the complex one) and use torch.view_as_complex of it "
                        f"in the losses, or use a first-order algorithm ({first_order})"
                    )


def no_path_error(player_name: str) -> LossError:
    """The error for a loss that does not depend on its player's parameters: the
    losses did not use them, or used tensors the game does not differentiate (the
    second-order algorithms evaluate the losses on substitutes registered in the
    modules, which a tensor captured before the game was built never sees)."""
    return LossError(
        f"the loss of player {player_name!r} does not depend on that player's parameters: the losses did not "
        "use the player's current parameters. Either that loss does not involve the player, or the losses "
        "read tensors captured before the game was built (a parameter, or a value computed from one, held "
        "by a closure): read the parameters through the module on every call (module(x), module.weight)"
    )


def refuse_compiled(names: Sequence[str], losses: Sequence[Tensor]) -> None:
    """Raise :class:`LossError` if a loss's autograd graph holds a graph that
    ``torch.compile`` built with aot_autograd (its backends ``inductor`` and
    ``aot_eager``; a compiled module, a compiled losses callable, or any compiled
    piece on the way from the parameters, such as an activation), before it is
    differentiated with ``create_graph``. Such a backward has no double backward: a
    Jacobian product through it would raise (torch's own errors: "does not currently
    support double backward", donated buffers), or come back silently wrong where
    the compiled piece saved only intermediates. ``backend="eager"`` keeps torch's
    autograd and passes. One walk over the graph the losses share (each node once)."""
    seen: dict[int, object] = {}
    for name, loss in zip(names, losses):
        if _graph_has_aot_node(loss.grad_fn, seen):
            raise _compiled_error(name)


def _compiled_error(player_name: str) -> LossError:
    return LossError(
        f"the gradient of player {player_name!r}'s loss comes from a torch.compile'd graph built by "
        "aot_autograd (the backends 'inductor', the default, and 'aot_eager'): this algorithm needs double "
        "backward (Jacobian products), which such a graph does not give (the products would be zero or "
        "fail). Give the game uncompiled losses and modules (or compile them with backend='eager', which "
        "keeps torch's own autograd), or use a first-order algorithm (SimGD, Extragradient, Optimistic, ...)"
    )


def _from_aot_autograd(node: object) -> bool:
    """Whether an autograd node is a ``torch.autograd.Function`` of aot_autograd's."""
    forward_cls = getattr(node, "_forward_cls", None)
    return forward_cls is not None and (
        getattr(forward_cls, "_aot_id", None) is not None
        or getattr(forward_cls, "__module__", "").startswith("torch._functorch._aot_autograd")
    )


def _graph_has_aot_node(root: object, seen: dict[int, object]) -> bool:
    """Whether the autograd graph below ``root`` holds an aot_autograd node; the nodes
    in ``seen`` (walked before, none of them one) are not walked again. It holds the
    nodes, not only their ids: a node's Python object may be freed once dropped, and
    its id taken by another's."""
    todo = [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        if _from_aot_autograd(node):
            return True
        todo.extend(n for n, _ in getattr(node, "next_functions", ()))
    return False
