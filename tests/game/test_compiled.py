"""``torch.compile``'d losses and modules in a game (issue #35, item 3).

Every first-order algorithm of the shared table steps compiled modules and a compiled
losses callable as it steps the eager ones: bit for bit under aot_autograd's eager
backend (the graphs torch's compiled autograd runs, without inductor's kernels),
under both verdicts and with a projection, and within rounding under inductor.
Second-order algorithms need double backward: they run where torch gives it
(``backend="eager"``: dynamo's graph in torch's own autograd) and are refused at the
first step, before anything moves, where it does not (aot_autograd's graphs).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
import torch._functorch.config
from torch import Tensor, nn
from torch._dynamo.testing import CompileCounterWithBackend

import gameopt
from gameopt import constraints as C
from gameopt.testing.table import ALGORITHMS, SECOND_ORDER, TWO_PLAYERS, AlgoInfo, learning_rates

# dynamo reads the .grad of a module's non-leaf input (d(g(z))), and torch warns about it
pytestmark = pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
HOW = ["modules", "losses"]
STEPS = 3


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    """Each test compiles anew (no cache entry, or recompile limit, carried between tests)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _gan(
    algorithm: gameopt.Algorithm,
    how: str = "modules",
    backend: object = None,
    verdict: str = "host",
    constrained: bool = False,
    zero_sum: bool = False,
    **compile_kw: object,
) -> tuple[gameopt.Game, list[nn.Module]]:
    """A BatchNorm GAN pair in float64 with its modules, or its losses callable, compiled
    with ``backend`` (``None``: eager); the game and the uncompiled modules. With
    ``constrained``, the discriminator's first weight lies in a box; with ``zero_sum``,
    the losses are (f, -f), f the generator's (a Wasserstein-style critic's gap)."""
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2)).double()
    disc = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    x, z = torch.randn(16, 2, dtype=torch.float64), torch.randn(16, 2, dtype=torch.float64)
    g, d = gen, disc
    if how == "modules" and backend is not None:
        g, d = torch.compile(gen, backend=backend, **compile_kw), torch.compile(disc, backend=backend, **compile_kw)

    def losses(batch: int = 16) -> tuple[Tensor, Tensor]:
        fake = d(g(z[:batch]))
        if zero_sum:
            f = d(x[:batch]).mean() - fake.mean()
            return f, -f
        return -fake.mean(), fake.mean() - d(x[:batch]).mean()

    if how == "losses" and backend is not None:
        losses = torch.compile(losses, backend=backend)
    players = [gameopt.Player(g), gameopt.Player(d, constraint={"0.weight": C.Box(-0.3, 0.3)} if constrained else None)]
    return gameopt.Game(players, losses, algorithm=algorithm, verdict=verdict), [gen, disc]


def _state(modules: list[nn.Module]) -> list[Tensor]:
    return [t.detach().clone() for m in modules for t in [*m.parameters(), *m.buffers()]]


def _run(info: AlgoInfo, steps: int = STEPS, **kw: object) -> list[Tensor]:
    game, modules = _gan(info.make(learning_rates(2)), zero_sum=info.players == 2, **kw)  # type: ignore[arg-type]
    for _ in range(steps):
        game.step()
    game.synchronize()
    return _state(modules)


def _equal(a: list[Tensor], b: list[Tensor]) -> bool:
    return all(torch.equal(s, t) for s, t in zip(a, b, strict=True))


@pytest.mark.parametrize("verdict", ["host", "device"])
@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("info", ALGORITHMS, ids=[a.name for a in ALGORITHMS])
def test_every_first_order_algorithm_steps_compiled_losses_and_modules_as_the_eager_ones(info, how, verdict) -> None:
    counter = CompileCounterWithBackend("aot_eager")
    compiled = _run(info, how=how, backend=counter, verdict=verdict)
    assert counter.frame_count >= 1  # the compiled graphs ran
    eager = _run(info, verdict=verdict)
    assert _equal(compiled, eager)
    assert not _equal(eager, _run(info, steps=STEPS - 1, verdict=verdict))  # each step moves something


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("name", ["SimGD", "Extragradient", "OptimisticAdam", "AnchoredExtragradient"])
def test_projected_algorithms_step_compiled_losses_and_modules_as_the_eager_ones(name, how) -> None:
    info = next(a for a in ALGORITHMS if a.name == name)
    compiled = _run(info, how=how, backend="aot_eager", constrained=True)
    assert _equal(compiled, _run(info, constrained=True))
    weight = compiled[len(_state([_gan(info.make([0.1, 0.1]))[1][0]]))]  # the discriminator's first
    assert weight.abs().max() == 0.3  # the box binds: a projection ran


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")  # inductor imports torch.jit APIs
def test_inductor_compiled_modules_step_as_the_eager_ones_within_rounding() -> None:
    """Inductor's fused kernels round differently; Adam's first steps (v near 0)
    magnify that the most, so the tolerance is Adam's."""
    for name in ["SimGD", "ExtraAdam", "PastExtragradient"]:
        info = next(a for a in ALGORITHMS if a.name == name)
        eager = _run(info)
        torch.testing.assert_close(_run(info, backend="inductor"), eager, rtol=1e-7, atol=1e-9)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")  # inductor imports torch.jit APIs
@pytest.mark.parametrize("name", ["SGA", "ACGD"])
def test_second_order_algorithms_refuse_inductor_graphs_that_donate_their_buffers(name) -> None:
    """Recompiled for a second batch size, inductor's backward donates buffers (torch
    2.6 and newer) and raises torch's RuntimeError on ``create_graph`` (it did here):
    the graph is refused before it is differentiated, and nothing moved."""
    torch.manual_seed(0)
    gen, disc = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)), nn.Linear(2, 1)
    g, d = torch.compile(gen), torch.compile(disc)

    def losses() -> tuple[Tensor, Tensor]:
        f = d(torch.randn(16, 2)).mean() - d(g(torch.randn(16, 8))).mean()
        return f, -f

    # built first: torch 2.4's guards hold weak references to the parameters they saw, which fusing refuses
    game = gameopt.Game([g, d], losses, algorithm=next(a for a in SECOND if a.name == name).make([0.1, 0.1]))
    donating = hasattr(torch._functorch.config, "donated_buffer")  # torch 2.6 and newer; on by default
    with torch._functorch.config.patch(donated_buffer=True) if donating else contextlib.nullcontext():
        for batch in (16, 32):
            d(g(torch.randn(batch, 8))).sum().backward()
    before = _state([gen, disc])
    with pytest.raises(gameopt.LossError, match="aot_autograd"):
        game.step()
    assert _equal(_state([gen, disc]), before)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
@pytest.mark.skipif(not hasattr(torch._functorch.config, "donated_buffer"), reason="no donated buffers in this torch")
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")  # inductor imports torch.jit APIs
def test_inductor_modules_recompiled_for_another_batch_step_as_the_docs_say() -> None:
    """docs/integrations.md: a game keeps the graph between the players' backward
    passes, which inductor's backward refuses once it donates buffers (a recompile for
    a new batch size: the step raises, nothing moved); compiled with ``dynamic=False``
    and donation off, a game whose batch size changes steps as the eager one does.
    (Not donation off alone: torch 2.14.1's dynamic-shape graphs then give a retained
    graph's second backward wrong gradients, in plain PyTorch too.)"""
    with torch._functorch.config.patch(donated_buffer=True):
        game, modules = _gan(gameopt.Extragradient(0.1), backend="inductor")
        game.step(16)
        before = _state(modules)
        with pytest.raises(RuntimeError, match="donated buffers"):
            game.step(8)
        assert _equal(_state(modules), before)
    torch._dynamo.reset()
    with torch._functorch.config.patch(donated_buffer=False):
        states = []
        for backend in ("inductor", None):
            game, modules = _gan(gameopt.Extragradient(0.1), backend=backend, dynamic=False)
            for batch in (16, 8, 12, 16):
                game.step(batch)
            states.append(_state(modules))
    torch.testing.assert_close(*states, rtol=1e-7, atol=1e-9)


SECOND = [*SECOND_ORDER, *(a for a in TWO_PLAYERS if a.name in ("ACGD", "CGD-zero-sum"))]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("info", SECOND, ids=[a.name for a in SECOND])
def test_second_order_algorithms_run_where_the_compiled_graph_has_double_backward(info, how) -> None:
    """``backend="eager"``: dynamo's graph runs in torch's own autograd, double backward included."""
    counter = CompileCounterWithBackend("eager")
    compiled = _run(info, how=how, backend=counter)
    assert counter.frame_count >= 1
    assert _equal(compiled, _run(info))


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("name", ["SGA", "CGD", "Consensus-Adam", "Lookahead-CGD", "ACGD", "CGD-zero-sum"])
def test_second_order_algorithms_refuse_graphs_without_double_backward_before_anything_moves(name, how) -> None:
    info = next(a for a in SECOND if a.name == name)
    game, modules = _gan(info.make(learning_rates(2)), how=how, backend="aot_eager", zero_sum=info.players == 2)
    before = _state(modules)
    for _ in range(2):  # refused each time, and nothing moved
        with pytest.raises(gameopt.LossError, match="torch.compile'd graph built by aot_autograd.*backend='eager'"):
            game.step()
        assert _equal(_state(modules), before)


def test_a_game_of_compiled_modules_changes_to_a_second_order_algorithm_as_an_eager_game_does() -> None:
    """The first-order steps' compiled code, traced on the parameters, then serves the
    Jacobian products (on their substitutes)."""
    games = [_gan(gameopt.SimGD(0.1), backend=backend) for backend in ("eager", None)]
    for game, _ in games:
        game.step()
        game.algorithm = gameopt.SGA(0.1)
        game.step()
    assert _equal(*(_state(modules) for _, modules in games))


def test_a_game_of_compiled_modules_changes_to_a_second_order_algorithm_and_is_refused_at_its_step() -> None:
    """(A test of its own: dynamo would serve this game the code the eager backend
    compiled for the same modules' forward in the test above.)"""
    aot = _gan(gameopt.SimGD(0.1), backend="aot_eager")[0]
    aot.step()
    aot.algorithm = gameopt.SGA(0.1)  # whether the graph has double backward shows at the step
    with pytest.raises(gameopt.LossError, match="aot_autograd"):
        aot.step()
    aot.algorithm = gameopt.SimGD(0.1)
    aot.step()


class _Cubed(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x) ** 3


SECOND_WAYS = {
    "SGA": lambda: gameopt.SGA(0.1),
    "SGA-forward": lambda: gameopt.SGA(0.1, jvp="forward"),
    "CGD": lambda: gameopt.CGD(0.1),
}


@pytest.mark.parametrize("name", list(SECOND_WAYS))
def test_a_compiled_piece_on_the_way_from_the_parameters_is_refused_by_second_order_algorithms(name) -> None:
    """An aot_autograd graph that holds none of the players' parameters (a compiled
    activation) is on every path from them: its backward has no double backward, and
    the products through it came back wrong (SGA, CGD) or raised torch's error
    (forward mode). Refused before anything moves; first-order algorithms run on it."""
    torch.manual_seed(0)
    gen, disc = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2)), nn.Linear(2, 1, bias=False)
    act = torch.compile(_Cubed(), backend="aot_eager")
    z = torch.randn(16, 2)

    def losses() -> tuple[Tensor, Tensor]:
        f = act(disc(gen(z))).mean()
        return f, -f

    game = gameopt.Game([gen, disc], losses, algorithm=SECOND_WAYS[name]())
    before = _state([gen, disc])
    with pytest.raises(gameopt.LossError, match="aot_autograd"):
        game.step()
    assert _equal(_state([gen, disc]), before)
    game.algorithm = gameopt.SimGD(0.1)
    game.step()
    assert not _equal(_state([gen, disc]), before)


def test_a_compiled_submodule_keeps_the_eager_names_in_checkpoints_and_constraints() -> None:
    def make(compiled: bool) -> tuple[gameopt.Game, nn.Module]:
        torch.manual_seed(0)
        inner = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8))
        gen = nn.Sequential(
            torch.compile(inner, backend="aot_eager") if compiled else inner, nn.Tanh(), nn.Linear(8, 2)
        )
        disc, z = nn.Linear(2, 1), torch.randn(16, 2)
        box = gameopt.constraints.Box(-0.2, 0.2)
        players = [gameopt.Player(gen, constraint={"0.0.weight": box}), gameopt.Player(disc)]
        return gameopt.Game(players, lambda: (-disc(gen(z)).mean(), disc(gen(z)).mean())), gen

    (compiled, _), (eager, _) = make(True), make(False)
    compiled.step()
    saved = compiled.state_dict()
    assert set(saved["players"][0]["buffers"]) == {"0.1.running_mean", "0.1.running_var", "0.1.num_batches_tracked"}
    eager.load_state_dict(saved)
    assert _equal(_state([p.module for p in eager.players]), _state([p.module for p in compiled.players]))
    # the wrapper's name, which named_parameters gives, is taken too; a wrong name lists the eager ones
    inner = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8))
    gen = nn.Sequential(torch.compile(inner, backend="aot_eager"), nn.Tanh(), nn.Linear(8, 2))
    gameopt.Player(gen, constraint={"0._orig_mod.0.weight": gameopt.constraints.Box(-1, 1)})
    with pytest.raises(ValueError, match=r"its parameters: 0\.0\.weight, 0\.0\.bias, 0\.1\.weight"):
        gameopt.Player(gen, constraint={"0.weight": gameopt.constraints.Box(-1, 1)})
