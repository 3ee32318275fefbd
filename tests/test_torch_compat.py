"""gameopt._torch_compat: the one gate to torch's private API, and its fallbacks."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from gameopt import _torch_compat as tc

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gameopt"

#: private attributes of torch objects that gameopt used before they moved to _torch_compat
PRIVATE_ATTRIBUTES = {
    "_use_count",
    "_post_accumulate_grad_hooks",
    "_backward_hooks",
    "_flat_weight_refs",
    "_init_flat_weights",
    "_non_persistent_buffers_set",
    "_engine_run_backward",
    "_execution_engine",
    "_disabled_torch_function_impl",
    "_orig_mod",
    "_version",
}


def _getattr_of_torch(node: ast.AST) -> bool:
    """``getattr(torch..., name)`` with a name the scan cannot read (an f-string, a
    variable) or a private one: what ``torch._x`` chains would be, written so that
    the attribute scan does not see it."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"):
        return False
    if len(node.args) < 2:
        return False
    owner, name = node.args[0], node.args[1]
    while isinstance(owner, ast.Attribute):
        owner = owner.value
    if not (isinstance(owner, ast.Name) and owner.id == "torch"):
        return False
    literal = isinstance(name, ast.Constant) and isinstance(name.value, str)
    return not literal or (name.value.startswith("_") and not name.value.startswith("__"))


def _private_uses(path: Path) -> list[str]:
    """``torch._x`` chains, ``from torch... import _x``, imports of torch's private
    modules, and the private tensor/module attributes above, with their lines."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, cur = [node.attr], node.value
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                chain.append(cur.id)
            chain.reverse()
            if chain[0] == "torch" and any(c.startswith("_") and not c.startswith("__") for c in chain[1:]):
                found.append(f"{path.name}:{node.lineno} {'.'.join(chain)}")
            elif node.attr in PRIVATE_ATTRIBUTES:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PRIVATE_ATTRIBUTES:
            found.append(f"{path.name}:{node.lineno} {node.value!r}")  # getattr(x, "_name")
        elif _getattr_of_torch(node):
            found.append(f"{path.name}:{node.lineno} getattr(torch, ...)")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            parts = node.module.split(".") + [a.name for a in node.names]
            if any(p.startswith("_") and not p.startswith("__") for p in parts):
                found.append(f"{path.name}:{node.lineno} from {node.module} import ...")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("torch.") and any(p.startswith("_") for p in a.name.split(".")):
                    found.append(f"{path.name}:{node.lineno} import {a.name}")
    return found


def test_no_module_but_the_compat_gate_uses_torchs_private_api():
    offenders = [
        use for path in sorted(PACKAGE.rglob("*.py")) if path.name != "_torch_compat.py" for use in _private_uses(path)
    ]
    assert offenders == []


def test_the_scan_finds_a_private_use(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch\nfrom torch.autograd.graph import _engine_run_backward\n"
        "x = torch._C._nn.flatten_dense_tensors([])\ny = t._use_count()\nz = getattr(m, '_orig_mod', m)\n"
        "f = getattr(torch, f'_foreach_{op}')\ng = getattr(torch.linalg, name)\nh = getattr(torch, '_foreach_add')\n"
        "ok = getattr(torch, 'add')\nalso_ok = getattr(tensor, f'{op}_')\n"
    )
    assert {use.split()[0] for use in _private_uses(bad)} == {f"bad.py:{k}" for k in (2, 3, 4, 5, 6, 7, 8)}


def test_the_fallbacks_compute_what_the_private_functions_do():
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(3, 2, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)]
    flat = tc._flatten(ts)
    assert torch.equal(flat, torch._C._nn.flatten_dense_tensors(ts))
    for a, b in zip(tc._unflatten(flat, ts), torch._C._nn.unflatten_dense_tensors(flat, ts)):
        assert torch.equal(a, b) and a.data_ptr() == b.data_ptr()  # views, as the private one's
    for name in ("add", "sub", "mul", "div", "neg", "sqrt", "reciprocal"):
        args = ([t.abs() + 1 for t in ts],) if name not in ("add", "sub", "mul", "div") else (ts, ts)
        kw = {"alpha": 0.5} if name == "add" else {}
        looped = tc._looped(name)(*args, **kw)
        fused = getattr(torch, f"_foreach_{name}")(*args, **kw)
        assert all(torch.equal(a, b) for a, b in zip(looped, fused))
    a, b = [t.clone() for t in ts], [t.clone() for t in ts]
    tc._looped("lerp_")(a, [t * 2 for t in ts], 0.25)
    torch._foreach_lerp_(b, [t * 2 for t in ts], 0.25)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    a, b = [t.clone() for t in ts], [t.clone() for t in ts]
    tc._looped("mul_")(a, [2.0, 3.0])
    torch._foreach_mul_(b, [2.0, 3.0])
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def _engine_case():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    unused = torch.randn(2, dtype=torch.float64, requires_grad=True)
    return a, b, unused, lambda: (a.sin() * b).sum() + a.square().mean()


def test_engine_on_caller_computes_what_autograd_grad_does():
    a, b, unused, loss_of = _engine_case()
    run = tc.engine_on_caller()
    assert run is not None  # torch's autograd logger is quiet here
    for retain in (True, False):
        loss = loss_of()
        want = torch.autograd.grad(loss_of(), (a, b, unused), allow_unused=True)
        got = run((loss,), (torch.ones_like(loss),), retain, False, (a, b, unused), True, False)
        assert got[2] is None and want[2] is None
        assert all(torch.equal(x, y) for x, y in zip(got[:2], want[:2]))
        assert a.grad is None and b.grad is None  # captured, never accumulated
        if retain:  # the graph is still there
            torch.autograd.grad(loss, a)
        else:
            try:
                torch.autograd.grad(loss, a)
            except RuntimeError as err:
                assert "second time" in str(err)
            else:
                raise AssertionError("the graph was kept")


def test_engine_on_caller_is_none_when_autograd_logs_debug(monkeypatch):
    """At DEBUG, torch's wrapper attaches its logging hooks to the graph: then (and
    only then) there is no direct entry, and the wrapper runs."""
    import logging

    log = logging.getLogger("torch.autograd.graph")
    try:
        for level, direct in ((logging.WARNING, True), (logging.DEBUG, False), (logging.NOTSET, True)):
            monkeypatch.setattr(log, "level", level)
            log.manager._clear_cache()
            assert (tc.engine_on_caller() is not None) == direct, level
    finally:
        monkeypatch.undo()
        log.manager._clear_cache()


def test_a_game_step_runs_the_engine_directly_only_on_the_cpu_without_cuda(monkeypatch):
    """The first-order vector field of CPU players takes the engine directly while
    CUDA is not initialized and torch's autograd logger is quiet; torch's wrapper
    otherwise (its device threads may run a part of the graph, or it logs)."""
    import gameopt

    calls = {"direct": 0, "wrapper": 0}
    direct, wrapper = tc.engine_on_caller(), tc.engine_run_backward

    def counted_direct(*a):
        calls["direct"] += 1
        return direct(*a)

    def counted_wrapper(*a, **k):
        calls["wrapper"] += 1
        return wrapper(*a, **k)

    monkeypatch.setattr(tc, "engine_on_caller", lambda: counted_direct if direct is not None else None)
    monkeypatch.setattr(tc, "engine_run_backward", counted_wrapper)
    # whether an earlier test of this process initialized CUDA is not this test's business
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    torch.manual_seed(0)
    x, y = nn.Linear(2, 1).double(), nn.Linear(2, 1).double()
    data = torch.randn(4, 2, dtype=torch.float64)
    game = gameopt.Game([x, y], lambda: (x(data).sum() * y(data).sum(), -(x(data).sum() * y(data).sum())))
    game.step()
    assert calls == {"direct": 2, "wrapper": 0}
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_initialized", lambda: True)
        game.step()
    assert calls == {"direct": 2, "wrapper": 2}
    # at DEBUG there is no direct entry (test above): the step takes the wrapper, whose
    # logging hooks are torch's own (on 2.4.1 they import torch's test utilities)
    monkeypatch.setattr(tc, "engine_on_caller", lambda: None)
    game.step()
    assert calls == {"direct": 2, "wrapper": 4}


def test_persistent_buffer_names_public_fallback_agrees(monkeypatch):
    m = nn.BatchNorm1d(3)
    m.register_buffer("scratch", torch.zeros(2), persistent=False)
    private = tc.persistent_buffer_names(m)
    monkeypatch.setattr(tc, "PUBLIC_ONLY", True)
    assert tc.persistent_buffer_names(m) == private == {"running_mean", "running_var", "num_batches_tracked"}


def test_make_dual_warns_about_nothing_of_torchs_own():
    from torch.autograd import forward_ad

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with forward_ad.dual_level():
            tc.make_dual(torch.ones(2), torch.ones(2))
    assert seen == []


def test_mkldnn_disabled_restores_the_users_setting():
    before = torch.backends.mkldnn.enabled
    with tc.mkldnn_disabled():
        assert torch.backends.mkldnn.enabled is False
    assert torch.backends.mkldnn.enabled == before


def test_compiled_original_sees_through_torch_compile():
    m = nn.Linear(2, 2)
    assert tc.compiled_original(m) is m
    assert tc.compiled_original(torch.compile(m, backend="eager")) is m


@pytest.mark.slow
def test_the_suite_passes_on_the_public_fallbacks():
    """Engine, foreach kernels, flattening and buffer names through their public
    fallbacks (GAMEOPT_TORCH_PUBLIC=1): the closed-form iterates, the products and the
    players' fusing hold there too."""
    # only pytest's own plugins: another plugin's warning (pytest-benchmark's beside
    # pytest-xdist) would be an error under the suite's filterwarnings
    env = {**os.environ, "GAMEOPT_TORCH_PUBLIC": "1", "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    code = "import gameopt._torch_compat as tc; assert tc.PUBLIC_ONLY and tc.engine_run_backward is tc._engine is None"
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)
    files = [
        "tests/test_vec.py",
        "tests/autodiff/test_autodiff.py",
        "tests/algorithms/test_algorithms.py",
        "tests/test_buffer.py",
        "tests/test_player.py",
        "tests/test_flat_parameter.py",
    ]
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files, "-k", "not trajectory"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
