"""The generic checks an algorithm of the table passes (:class:`AlgoInfo` rows), and
the tools they are built from. Each check raises ``AssertionError`` with a message
naming the row, the step and what differs; none needs pytest."""

from __future__ import annotations

import copy
import functools
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..algorithms import Algorithm
from ..game import Game, NonFiniteError, StepOracle
from ..state import tensors_in
from .games import GAMES, Points, ReferenceGame, regularized_bilinear
from .references import ref_trajectory
from .table import AlgoInfo, learning_rates


# ----------------------------------------------------------------- tools
def oracle(game: Game, *args: Any, **kwargs: Any) -> StepOracle:
    """The oracle a step of ``game`` hands its algorithm, at the current point, with
    the losses bound to ``args`` and ``kwargs``: to try a piece of an algorithm
    (``algo.update(oracle(game), game.algorithm_state)``) or a linearization's products
    (``oracle(game).linearize(zero_sum=True)``) outside a step. The vectors it lends
    (``empty()``, ``moved``, …) are the game's scratch space: valid until its next step."""
    closure = functools.partial(game.losses, *args, **kwargs) if args or kwargs else game.losses
    return StepOracle(game.step_context, closure)


def held_storages(game: Game) -> set[int]:
    """The storages of the joint vectors ``game`` holds beyond its parameters and
    gradients: its algorithm state's (a wrapper's holds its base's) and its scratch
    vectors (:attr:`~gameopt.Game.scratch_vectors`), each counted by its tensor of the
    size of the first (device, dtype) group. Between warm steps, a game holds only what
    its algorithm's state needs. It reads ``game.algorithm_state``, so under the device
    verdict it reads the last step's verdict first (a refusal is then raised by the
    next step)."""
    n = game.layout.data[0].numel()
    own = {t.untyped_storage().data_ptr() for t in [*game.layout.data, *game.layout.grad]}
    held = [*tensors_in(game.algorithm_state), *(t for vec in game.scratch_vectors for t in vec)]
    return {t.untyped_storage().data_ptr() for t in held if t.numel() == n} - own


def assert_same_state(a: Any, b: Any, where: str = "state") -> None:
    """``a`` and ``b`` (nested dicts, lists, tuples, tensors, numbers: two
    ``state_dict()``, say) are equal: the same structure, tensors of the same dtype
    with the same values."""
    if isinstance(a, Tensor):
        if not (isinstance(b, Tensor) and a.dtype == b.dtype and torch.equal(a, b)):
            raise AssertionError(f"{where}: {_short(a)} != {_short(b)}")
    elif isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            raise AssertionError(f"{where}: keys {sorted(a)} != {sorted(b) if isinstance(b, dict) else _short(b)}")
        for k in a:
            assert_same_state(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            raise AssertionError(f"{where}: {len(a)} items != {_short(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif not a == b:
        raise AssertionError(f"{where}: {a!r} != {b!r}")


def _short(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"tensor({x.dtype}, {tuple(x.shape)})" if x.numel() > 6 else repr(x)
    return f"{len(x)} items" if isinstance(x, (list, tuple)) else repr(x)


def saved_and_loaded(obj: Any) -> Any:
    """``obj`` written with ``torch.save`` and read back with
    ``torch.load(weights_only=True)``, as a checkpoint is."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@dataclass
class Resumed:
    straight: Points  # the parameters after all steps in one run
    straight_game: Game
    checkpoint: dict[str, Any]  # the state after ``cut`` steps, through torch.save/load
    game: Game  # a fresh game loaded from it, stepped to the end


def straight_and_resumed(
    tg: ReferenceGame, make: Callable[[], Algorithm], steps: int, cut: int, **build: Any
) -> Resumed:
    """``steps`` steps in one run; then ``cut`` steps, a checkpoint written and read
    back (``weights_only``), and the remaining steps on a fresh game (fresh modules at
    the initial point) that loads it. ``tg.params()`` is then the resumed run's."""
    straight_game = tg.build(make(), **build)
    for _ in range(steps):
        straight_game.step()
    straight = tg.params()
    game = tg.build(make(), **build)
    for _ in range(cut):
        game.step()
    checkpoint = saved_and_loaded(game.state_dict())
    resumed = tg.build(make(), **build)
    resumed.load_state_dict(checkpoint)
    for _ in range(steps - cut):
        resumed.step()
    return Resumed(straight, straight_game, checkpoint, resumed)


def _game_for(info: AlgoInfo, default: str) -> ReferenceGame:
    """The reference game a check runs ``info`` on: ``default``, or for a two-player
    method :func:`~gameopt.testing.games.regularized_bilinear`."""
    return regularized_bilinear() if info.players == 2 else GAMES[default]()


def _assert_points(got: Points, want: Points, what: str, rtol: float = 0.0, atol: float = 0.0) -> None:
    for i, (a, b) in enumerate(zip(got, want)):
        if rtol == atol == 0.0:
            if not (a.dtype == b.dtype and torch.equal(a, b)):
                raise AssertionError(f"{what}, player {i}: {a.dtype} {a.tolist()} != {b.dtype} {b.tolist()}")
        else:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}, player {i}: {m}")


# ---------------------------------------------------------------- checks
def check_closed_form(info: AlgoInfo, game: str | None = None, raw: bool = False, steps: int = 7) -> None:
    """Float64 iterates of ``info``'s algorithm on a reference game (``game``, by
    name; the quadratic one by default) match its closed form ``info.ref`` to 1e-12,
    step after step; ``raw``: the players given as tensors rather than modules."""
    if not info.ref:
        raise ValueError(f"{info.name}: the row has no closed form (ref) to check against")
    tg = GAMES[game]() if game is not None else _game_for(info, "quadratic")
    lrs = learning_rates(len(tg.init))
    kw = dict(info.ref_kw)
    if fraction := kw.pop("extrapolation", None):
        kw["extrapolation_lrs"] = [x * fraction for x in lrs]
    expected = ref_trajectory(tg, info.ref, lrs, steps, rule=info.rule(), **kw)
    built = tg.build(info.make(lrs), raw=raw)
    for t in range(steps):
        built.step()
        _assert_points(tg.params(), expected[t], f"{info.name} on {tg.name}, step {t}", rtol=1e-12, atol=1e-12)


def check_resume(info: AlgoInfo, dtype: torch.dtype = torch.float64, steps: int = 8, cut: int = 4) -> None:
    """A run checkpointed after ``cut`` steps (through ``torch.save``/``load``) and
    resumed on a fresh game ends bit for bit where the uninterrupted run does (on the
    non-quadratic 3-player game, in ``dtype``)."""
    tg = _game_for(info, "nonquadratic")
    lrs = learning_rates(len(tg.init))
    straight = straight_and_resumed(tg, lambda: info.make(lrs), steps=steps, cut=cut, dtype=dtype).straight
    for i, w in enumerate(tg.params()):
        if w.dtype != dtype:
            raise AssertionError(f"{info.name}: player {i} is {w.dtype} after the resumed run, not {dtype}")
    _assert_points(tg.params(), straight, f"{info.name}: resumed after {cut} of {steps} steps vs straight")


def check_float32_tracks_float64(info: AlgoInfo, steps: int = 5) -> None:
    """In float32, ``steps`` steps on the quadratic game stay within 1e-4 (relative)
    of the float64 run, and the parameters stay float32."""
    tg = _game_for(info, "quadratic")
    lrs = learning_rates(len(tg.init))
    ends = []
    for dtype in (torch.float64, torch.float32):
        built = tg.build(info.make(lrs), dtype=dtype)
        for _ in range(steps):
            built.step()
        ends.append(tg.params())
    for i, w in enumerate(ends[1]):
        if w.dtype != torch.float32:
            raise AssertionError(f"{info.name}: player {i} is {w.dtype} after float32 steps")
    _assert_points([w.double() for w in ends[1]], ends[0], f"{info.name}: float32 vs float64", rtol=1e-4, atol=1e-5)


class InjectedFailure(Exception):
    """The error :func:`check_all_or_nothing` makes the losses raise."""


def check_all_or_nothing(info: AlgoInfo, warm: int = 2, most: int = 64) -> None:
    """A step that fails at any one of its evaluations (the losses raise, or are
    NaN) is refused whole: the error surfaces (``NonFiniteError`` for NaN), the
    parameters and ``state_dict()`` are bit for bit what they were, and the next step
    is the one an untouched game takes. Tried at the first, second, … evaluation of
    the step after ``warm`` steps, until the step evaluates fewer times (at most ``most``)."""
    for failure in ("nan", "error"):
        for k in range(1, most + 1):
            if not _refused_whole(info, warm, failure, k):
                break


def _refused_whole(info: AlgoInfo, warm: int, failure: str, k: int) -> bool:
    """Fail the ``k``-th evaluation of the step after ``warm`` steps and check it is
    refused whole; ``False`` when the step evaluates fewer than ``k`` times."""
    tg = _game_for(info, "nonquadratic")
    lrs = learning_rates(len(tg.init))
    losses, calls = tg.losses_fn, {"n": 0, "at": 0}

    def failing(ws: Points) -> list[Tensor]:
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            if failure == "error":
                raise InjectedFailure(f"evaluation {k}")
            return [f * float("nan") for f in losses(ws)]
        return losses(ws)

    tg.losses_fn = failing
    game = tg.build(info.make(lrs))
    for _ in range(warm):
        game.step()
    point, before = tg.params(), copy.deepcopy(game.state_dict())
    calls.update(n=0, at=k)
    what = f"{info.name}: the step failing at evaluation {k} ({failure})"
    expected: type[Exception] = NonFiniteError if failure == "nan" else InjectedFailure
    try:
        game.step()
    except expected:
        pass
    else:
        if calls["n"] < k:
            return False
        raise AssertionError(f"{what} was not refused")
    _assert_points(tg.params(), point, f"{what} moved the parameters")
    assert_same_state(game.state_dict(), before, f"{what} changed the state_dict")
    calls["at"] = 0
    game.step()
    _assert_points(tg.params(), _untouched(info, lrs, warm + 1), f"{what}: the next step")
    return True


def _untouched(info: AlgoInfo, lrs: list[float], steps: int) -> Points:
    tg = _game_for(info, "nonquadratic")
    game = tg.build(info.make(lrs))
    for _ in range(steps):
        game.step()
    return tg.params()


def checks_for(info: AlgoInfo) -> list[Callable[[], None]]:
    """Every generic check that applies to ``info`` (the closed form only if it has one)."""
    out: list[Callable[[], None]] = [functools.partial(check_closed_form, info)] if info.ref else []
    out += [
        functools.partial(check_resume, info),
        functools.partial(check_resume, info, torch.float32),
        functools.partial(check_float32_tracks_float64, info),
        functools.partial(check_all_or_nothing, info),
    ]
    return out


def check_all(infos: Iterable[AlgoInfo]) -> None:
    """Run :func:`checks_for` of each row; the first failure raises."""
    for info in infos:
        for check in checks_for(info):
            check()
