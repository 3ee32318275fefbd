"""Calls into a game from inside its own running step (from the losses, or code the
step runs, on the thread that holds the game's lock).

A call that would change the game (a step, a load, a new algorithm) is refused:
:func:`refused`. A read-only one (ξ, a Jacobian product, a checkpoint) runs, at the
point the step is evaluating and without touching what the step is using: the step
may have put aliases or dual tensors in the modules' parameter registries (for its
Jacobian products), and lent its gradient buffers to the algorithm. :func:`registered`
puts the parameters back in the registries for the call, and the step's values
after it; :func:`apart` gives the call gradient storage of its own, and Jacobian
products that never run the losses again; :func:`step_start` is what a checkpoint
taken there saves. None of this runs outside a step.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping

from torch import Tensor

from .. import _torch_compat as tc
from ..autodiff import ForwardMode, Problem
from ..layout import JointLayout
from ..vec import Vec


def refused(call: str) -> RuntimeError:
    """The error for ``call``, which would change the game, made inside a running step."""
    return RuntimeError(
        f"{call} was called from inside a running step (by its losses, or code the step runs, on its thread): "
        "it would change the game under the step, so it is refused and nothing changed. Call it between steps, "
        "after game.step() returns"
    )


@contextlib.contextmanager
def registered(problem: Problem) -> Iterator[None]:
    """Within the block, every module registers its own parameters (as between steps);
    afterwards, what the running step had registered in their place."""
    places = [(tc.parameter_registry(sub), name, p) for sub, name, p in problem.registrations]
    current = [registry[name] for registry, name, _ in places]
    try:
        for registry, name, p in places:
            registry[name] = p
        yield
    finally:
        for (registry, name, _), value in zip(places, current):
            registry[name] = value


def apart(problem: Problem) -> tuple[Problem, Vec]:
    """``problem`` for a read-only call inside a running step, and the new joint vector
    its gradient views point into. A vector field written through it leaves the
    game's gradient buffers (lent to the running step) untouched: every player's
    gradient is captured and copied there (no size reaches ``IN_PLACE_MIN``; the path
    through ``.grad`` would write the game's buffers). A linearization made on it
    takes J v through its kept graph (double backward, as where forward mode is
    missing), never by running the losses again: it may be used while the step runs."""
    layout = problem.layout
    grad = layout.zeros()
    views = {
        id(p): view
        for e in layout.entries
        for p, view in zip(e.buffer.params, e.buffer.views(layout.entry_view(grad, e)))
    }
    grad_views = [[views[id(p)] for p in params] for params in problem.params]
    graph_only = ForwardMode()
    graph_only.ok = False
    return dataclasses.replace(
        problem, grad_views=grad_views, sizes=[0] * len(problem.sizes), forward_mode=graph_only
    ), grad


def step_start(layout: JointLayout, point: Vec | None, buffers: list[tuple[Tensor, Tensor]]) -> Mapping[int, Tensor]:
    """What a checkpoint taken inside a running step saves in place of live tensors
    (by id): the module buffers the step started from (``buffers``: the step's
    ``saved_buffers``), and while the step evaluates away from its point, that
    point (``point``: ``Moves.backup``) in place of each player buffer's values."""
    start = {id(b): copy for b, copy in buffers}
    if point is not None:
        start.update((id(e.buffer.data), layout.entry_view(point, e)) for e in layout.entries)
    return start
