"""What the evaluations of a game's losses within one step share.

An algorithm may evaluate the losses several times in one step: at an
extrapolated point (extragradient), at the point left by earlier players
(alternating GD), again with dual tensors for a forward-mode Jacobian product.
The rules, the same for every algorithm:

* **Random numbers.** Every evaluation sees the random numbers of the first: the
  global generators (CPU, and CUDA on the players' devices) are put back to their
  state at the start of the step before each further evaluation, and after the
  step they stand where one evaluation would have left them. Dropout masks and
  noise drawn inside the losses therefore agree between ξ and its Jacobian
  products. (A ``torch.Generator`` of the user's own is not touched.)
* **Module buffers** (BatchNorm running statistics) move once per step, exactly as
  under one plain evaluation at the step's starting point; every other evaluation
  leaves them as they were.
* **Metrics.** The losses callable returns one scalar per player, optionally
  followed by a dict of metrics (``return g_loss, d_loss, {"D(x)": dx}``). The
  metrics of the evaluation at the step's starting point are handed back by
  :meth:`Game.step` (``game.step(...).metrics``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

import torch
from torch import Tensor

from . import _torch_compat as tc

T = TypeVar("T")


class LossError(ValueError):
    """The losses callable returned something that is not one real floating-point
    scalar loss per player (None, an integer, boolean or complex tensor, ...), or a
    player's loss does not depend on its parameters. Raised before anything changes;
    a ``ValueError``."""


#: what a step without metrics holds: one empty read-only mapping, shared
_NO_METRICS: Mapping[str, Any] = MappingProxyType({})


class StepLosses(tuple):
    """The players' losses at the start of a step (a tuple: ``g, d = game.step()``),
    with the metrics the losses returned beside them in ``metrics``; with
    ``PastExtragradient``, at its extrapolated point (see :meth:`gameopt.Game.step`).

    Args:
        losses: one detached 0-d tensor per player.
        metrics: the dict the losses callable returned after the losses (copied);
            without metrics, ``metrics`` is an empty read-only mapping, shared (no
            dict per step: a small game's step is its bookkeeping).
    """

    metrics: Mapping[str, Any] = _NO_METRICS

    def __new__(cls, losses: Sequence[Tensor], metrics: Mapping[str, Any] | None = None) -> StepLosses:
        out = super().__new__(cls, losses)
        if metrics:
            out.metrics = dict(metrics)
        return out


def split_losses(out: Any, names: Sequence[str]) -> tuple[list[Tensor], Mapping[str, Any]]:
    """One scalar loss per player (named ``names``) and the optional metrics dict (an
    empty read-only mapping when there is none)."""
    metrics: Mapping[str, Any] = _NO_METRICS
    if isinstance(out, Tensor):
        out = list(out.unbind()) if out.dim() == 1 else [out]
    elif not isinstance(out, (tuple, list)):  # the usual returns skip the two checks
        _check_sequence(out)
    out = list(out)
    if len(out) == len(names) + 1 and isinstance(out[-1], dict):
        metrics = out.pop()
    if len(out) != len(names):
        raise LossError(
            f"losses returned {len(out)} values for {len(names)} players "
            "(return one scalar per player, optionally followed by a dict of metrics)"
        )
    for loss, name in zip(out, names):
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            what = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
            raise LossError(f"the loss of player {name!r} is not a scalar tensor (got {what})")
        if not loss.is_floating_point():
            raise _not_floating(loss, name)
    return out, metrics


def _check_sequence(out: Any) -> None:
    """Refuse a return value of the losses that holds no losses: None, or not iterable."""
    if out is None:
        raise LossError(
            "losses returned None: the losses callable must return one scalar loss per player (did it forget `return`?)"
        )
    if not isinstance(out, Iterable):
        raise LossError(
            f"losses returned a {type(out).__name__}: the losses callable must return one scalar loss per player "
            "(a tuple or list of 0-d tensors, optionally followed by a dict of metrics)"
        )


def _not_floating(loss: Tensor, name: str) -> LossError:
    """The error for a loss that is an integer, boolean or complex tensor."""
    kind = "a boolean" if loss.dtype == torch.bool else "a complex" if loss.is_complex() else "an integer"
    return LossError(
        f"the loss of player {name!r} is {kind} tensor ({loss.dtype}): losses must be real floating-point "
        "scalars with a graph to the players' parameters (an integer or boolean tensor has no gradient: "
        "compute the loss in floating point, not through a comparison, argmax or .long())"
    )


def check_zero_sum(losses: Sequence[Tensor], needs: str, nonfinite_ok: bool = False) -> None:
    """Refuse losses that are not a two-player zero-sum game (f, −f): a ``ValueError``
    saying what ``needs`` it unless there are two and their values sum to exactly zero
    (read as doubles, which is exact). Non-finite values cannot show it: with
    ``nonfinite_ok`` they pass (the caller refuses them as non-finite), else they
    are refused here."""
    if len(losses) == 2:
        a, b = float(losses[0].detach()), float(losses[1].detach())
        if nonfinite_ok and not (math.isfinite(a) and math.isfinite(b)):
            return
        if a + b == 0:
            return
    raise ValueError(f"{needs} needs a two-player zero-sum game given as losses (f, -f)")


def _detached(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.detach() if isinstance(v, Tensor) else v for k, v in metrics.items()}


class Evaluations:
    """The evaluations of the losses within one step: see the module docstring.

    Wrap each evaluation in ``with evaluations(plain):`` where ``plain`` says it is
    at the step's starting point; the first plain one is the step's own.
    """

    __slots__ = ("_registries", "_cuda", "_copies", "_start", "_plain_done", "metrics")  # one per step: no dict

    def __init__(
        self,
        registries: Sequence[dict[str, Tensor | None]],
        cuda_devices: Sequence[torch.device] = (),
        once: bool = False,
        copies: BufferCopies | None = None,
    ) -> None:
        """``registries``: the buffer registry of every module whose own buffers move
        (``_torch_compat.buffer_registry`` of each submodule; not copied); ``cuda_devices``:
        the CUDA devices whose generators the evaluations share (each once); ``once``:
        only the step's own evaluation will run (``Algorithm.evaluates_once``), so the
        generators' state is not kept, and any other evaluation is refused; ``copies``:
        where an evaluation away from the step's start saves the buffers (the game's,
        kept from step to step; an evaluation inside another's clones its own)."""
        self._registries = registries
        self._cuda = cuda_devices
        self._copies = copies
        self._start = None if once else self._rng()
        self._plain_done = False
        self.metrics: Mapping[str, Any] = _NO_METRICS  # the step's own evaluation's, once kept

    def _rng(self) -> tuple[Tensor, list[Tensor]]:
        cuda = [torch.cuda.get_rng_state(d) for d in self._cuda] if self._cuda else []
        return torch.default_generator.get_state(), cuda

    def _set_rng(self, state: tuple[Tensor, list[Tensor]]) -> None:
        torch.default_generator.set_state(state[0])
        for d, s in zip(self._cuda, state[1]):
            torch.cuda.set_rng_state(s, d)

    @contextlib.contextmanager
    def __call__(self, plain: bool) -> Iterator[bool]:
        """Yields True for the step's own evaluation (buffers move, the generators
        advance, its metrics are kept); any other sees the step's first random
        numbers and leaves buffers and generators as they were."""
        if plain and not self._plain_done:
            yield True
            self._plain_done = True
            return
        if self._start is None:
            raise RuntimeError(
                "the algorithm declares evaluates_once, yet evaluated the losses again within a step "
                "(or away from the current point); nothing changed"
            )
        now = self._rng()
        copies = self._copies
        own = copies is not None and not copies.in_use  # else inside another evaluation's
        saved = copies.save(self._registries) if copies is not None and own else saved_buffers(self._registries)
        if copies is not None and own:
            copies.in_use = True
        self._set_rng(self._start)
        try:
            yield False
        finally:
            self._set_rng(now)
            restore_buffers(saved)
            if copies is not None and own:
                copies.in_use = False

    def run_plain(self, evaluate: Callable[..., T], *args: Any) -> tuple[T, bool]:
        """``evaluate(*args)`` as an evaluation at the step's starting point (``with
        self(True) as own``), and ``own``; the step's own evaluation enters no context."""
        if not self._plain_done:
            out = evaluate(*args)
            self._plain_done = True
            return out, True
        with self(True) as own:
            return evaluate(*args), own

    def keep_metrics(self, metrics: Mapping[str, Any]) -> None:
        self.metrics = _detached(metrics)


def saved_buffers(registries: Sequence[dict[str, Tensor | None]]) -> list[tuple[Tensor, Tensor]]:
    """Each buffer in the modules' own buffer registries (``_torch_compat.buffer_registry``
    of every submodule: no recursive search, far cheaper than ``module.buffers()`` on
    deep models), with a copy of it to put back."""
    return [(b, b.clone()) for registry in registries for b in registry.values() if b is not None]


class BufferCopies:
    """Copies of the modules' own buffers that a step puts back if it fails, kept from
    one step to the next: :meth:`save` writes them with one foreach copy (one launch,
    where :func:`saved_buffers` clones buffer by buffer) and makes them again only when
    the buffers changed (their number, a shape, dtype or device). What it returns is
    valid until the next :meth:`save`: its holder sets :attr:`in_use`, and a caller
    that finds it set (an evaluation inside another's) saves with
    :func:`saved_buffers` instead."""

    def __init__(self) -> None:
        self._copies: list[Tensor] = []
        self._like: list[tuple[torch.Size, torch.dtype, torch.device]] = []
        #: whether a caller holds what :meth:`save` returned (one that nests makes its own)
        self.in_use = False

    def save(self, registries: Sequence[dict[str, Tensor | None]]) -> list[tuple[Tensor, Tensor]]:
        """Each buffer of ``registries`` (as :func:`saved_buffers` takes them) with its copy."""
        live = [b for registry in registries for b in registry.values() if b is not None]
        if not live:
            return []
        like = [(b.shape, b.dtype, b.device) for b in live]
        if like != self._like:
            self._copies, self._like = [torch.empty_like(b) for b in live], like
        tc.foreach_copy_(self._copies, live)
        return list(zip(live, self._copies))


def restore_buffers(saved: Sequence[tuple[Tensor, Tensor]]) -> None:
    """Put back what :func:`saved_buffers` or :meth:`BufferCopies.save` saved, in one
    foreach copy through ``.data`` (a kept graph may have saved a buffer and must not
    see a version bump)."""
    if saved:
        with torch.no_grad():
            tc.foreach_copy_([b.data for b, _ in saved], [copy for _, copy in saved])
