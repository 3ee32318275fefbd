"""Deep copies of the callables a player or a game holds (their losses).

Python copies a function as itself, so a copied game whose losses are a closure over
its modules (``def make_losses(gen, disc): def losses(): ...``) would go on
evaluating the original's modules. :func:`copy_callable` copies a closure deeply
too: what it closes over and its default arguments, through the same deep copy as
the rest (so the players' modules it refers to become the copies' modules, and a
weak reference to something copied refers to its copy). Global
names are not copied: losses that reach the modules through a module's globals keep
evaluating the originals, and the copy refuses its first step (the losses do not
depend on its players' parameters).
"""

from __future__ import annotations

import copy
import types
import weakref
from typing import Any


def copy_callable(fn: Any, memo: dict[int, Any]) -> Any:
    """A deep copy of ``fn`` within the deep copy whose ``memo`` is given: a plain
    function with a closure or default arguments is rebuilt around deep copies of
    them (a function it closes over likewise); anything else is
    ``copy.deepcopy(fn, memo)`` (a bound method copies its object)."""
    if not isinstance(fn, types.FunctionType):
        return copy.deepcopy(fn, memo)
    if id(fn) in memo:
        return memo[id(fn)]
    if not (fn.__closure__ or fn.__defaults__ or fn.__kwdefaults__):
        return fn
    new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, None, _empty_cells(fn))
    memo[id(fn)] = new  # a closure that refers back to ``fn`` gets the copy
    for old, cell in zip(fn.__closure__ or (), new.__closure__ or ()):
        if _filled(old):  # an empty cell (a variable not assigned yet) stays empty
            cell.cell_contents = _copy(old.cell_contents, memo)
    new.__defaults__ = copy.deepcopy(fn.__defaults__, memo)
    new.__kwdefaults__ = copy.deepcopy(fn.__kwdefaults__, memo)
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    new.__dict__.update(copy.deepcopy(fn.__dict__, memo))
    return new


def _empty_cells(fn: types.FunctionType) -> tuple[types.CellType, ...] | None:
    return tuple(types.CellType() for _ in fn.__closure__) if fn.__closure__ else None


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _copy(value: Any, memo: dict[int, Any]) -> Any:
    """What a copied closure holds in place of ``value``: a function copied likewise,
    a weak reference to something this deep copy copied refers to the copy (a
    scheduler's wrapper of ``optimizer.step``), anything else deep-copied."""
    if isinstance(value, types.FunctionType):
        return copy_callable(value, memo)
    if type(value) is weakref.ref and id(target := value()) in memo:
        return weakref.ref(memo[id(target)])
    return copy.deepcopy(value, memo)
