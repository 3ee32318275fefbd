"""Second-order methods against their closed-form updates (explicit J, ξ and
cross gradients), iterate for iterate in float64, with per-player learning rates;
and the Linearization's products against explicit matrices."""

from __future__ import annotations

import functools

import pytest
import torch
from games import GAMES, straight_and_resumed

import gameopt
from gameopt.autodiff.substitution import substituted
from gameopt.testing import oracle


def _blocks(tg, ws):
    sizes = [w.numel() for w in ws]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return sizes, offsets


def _ho(tg, ws):
    J = tg.jac_ref(ws)
    sizes, offs = _blocks(tg, ws)
    H = J.clone()
    for s, o in zip(sizes, offs):
        H[o : o + s, o : o + s] = 0
    return J, H


def _chi(tg, ws):
    J = tg.jac_ref(ws)
    sizes, offs = _blocks(tg, ws)
    g = tg.grads_ref(ws)
    out = []
    for i in range(len(ws)):
        c = torch.zeros(sizes[i], dtype=torch.float64)
        for j in range(len(ws)):
            if j != i:
                block = J[offs[j] : offs[j] + sizes[j], offs[i] : offs[i] + sizes[i]]  # ∂ξ_j/∂w_i
                c = c + block.T @ g[i][j]
        out.append(c)
    return torch.cat(out)


def _eta(ws, lrs):
    return torch.cat([torch.full((w.numel(),), lr, dtype=torch.float64) for w, lr in zip(ws, lrs)])


def ref_direction(name, tg, ws, lrs, state, **kw):
    """w_{t+1} − w_t by the closed form."""
    xi = torch.cat(tg.xi_ref(ws))
    J, H = _ho(tg, ws)
    eta = _eta(ws, lrs)
    if name == "hgd":
        return -eta * (J.T @ xi)
    if name == "consensus":
        return -eta * (xi + kw["gamma"] * J.T @ xi)
    if name == "sga":
        a_xi = 0.5 * (J.T @ xi - J @ xi)
        jt = J.T @ xi
        lam = kw["lam"] * torch.sign((xi @ jt) * (a_xi @ jt) / xi.numel() + kw["eps"]) if kw["align"] else kw["lam"]
        return -eta * (xi + lam * a_xi)
    if name == "cgd":
        n = xi.numel()
        return torch.linalg.solve(torch.eye(n, dtype=torch.float64) + eta[:, None] * H, -eta * xi)
    if name == "acgd":
        beta, eps = kw["beta"], kw["eps"]
        t = state.get("t", 0) + 1
        v = beta * state.get("v", torch.zeros_like(xi)) + (1 - beta) * xi**2
        state.update(t=t, v=v)
        eta = (1 - beta**t) ** 0.5 * eta / (v.sqrt() + eps)
        n = xi.numel()
        return torch.linalg.solve(torch.eye(n, dtype=torch.float64) + eta[:, None] * H, -eta * xi)
    alpha = kw["alpha"]
    xi0 = xi - alpha * H @ xi
    if name == "la":
        return -eta * xi0
    chi = _chi(tg, ws)
    if name == "lola":
        base = xi if kw.get("shaping_only") else xi0
        return -eta * (base - alpha * chi)
    if name == "sos":
        inner = (-alpha * chi) @ xi0
        p1 = 1.0 if inner >= 0 else min(1.0, float(-kw["a"] * (xi0 @ xi0) / inner))
        p2 = float(xi @ xi) if float(xi.norm()) < kw["b"] else 1.0
        return -eta * (xi0 - min(p1, p2) * alpha * chi)
    raise ValueError(name)


METHODS = [
    ("hgd", lambda lr: gameopt.HamiltonianGD(lr), {}),
    ("consensus", lambda lr: gameopt.ConsensusOptimization(lr, gamma=0.7), {"gamma": 0.7}),
    ("sga", lambda lr: gameopt.SGA(lr, lam=0.8), {"lam": 0.8, "align": True, "eps": 0.1}),
    ("sga", lambda lr: gameopt.SGA(lr, lam=0.8, align=False), {"lam": 0.8, "align": False, "eps": 0.1}),
    ("cgd", lambda lr: gameopt.CGD(lr, tol=1e-14), {}),
    ("la", lambda lr: gameopt.LA(lr, alpha=0.4), {"alpha": 0.4}),
    ("lola", lambda lr: gameopt.LOLA(lr, alpha=0.4), {"alpha": 0.4}),
    ("lola", lambda lr: gameopt.LOLA(lr, alpha=0.4, shaping_only=True), {"alpha": 0.4, "shaping_only": True}),
    ("sos", lambda lr: gameopt.SOS(lr, alpha=0.4), {"alpha": 0.4, "a": 0.5, "b": 0.1}),
    ("sos", lambda lr: gameopt.SOS(lr, alpha=0.4, a=0.3, b=50.0), {"alpha": 0.4, "a": 0.3, "b": 50.0}),
]
IDS = ["HGD", "Consensus", "SGA-align", "SGA", "CGD", "LA", "LOLA", "LOLA-shaping", "SOS", "SOS-b50"]


@pytest.mark.parametrize("game_name", list(GAMES))
@pytest.mark.parametrize("name, make, kw", METHODS, ids=IDS)
@pytest.mark.parametrize("raw", [False, True], ids=["module", "params"])
def test_matches_closed_form(name, make, kw, game_name, raw) -> None:
    tg = GAMES[game_name]()
    lrs = [0.05 + 0.02 * i for i in range(len(tg.init))]
    game = tg.build(make(lrs), raw=raw)
    ws = [w.clone() for w in tg.init]
    state: dict = {}
    for t in range(5):
        step = ref_direction(name, tg, ws, lrs, state, **kw)
        ws = [w + d for w, d in zip(ws, torch.split(step, [w.numel() for w in ws]))]
        game.step()
        torch.testing.assert_close(torch.cat(tg.params()), torch.cat(ws), rtol=1e-9, atol=1e-11, msg=f"step {t}")


@pytest.mark.parametrize("zero_sum", [False, True])
def test_cgd_and_acgd_on_zero_sum_games(zero_sum) -> None:
    tg = GAMES["bilinear"]()
    lrs = [0.3, 0.2]
    algo = gameopt.ACGD(lrs, tol=1e-30, atol=0.0) if zero_sum else gameopt.CGD(lrs, tol=1e-13, zero_sum=True)
    game = tg.build(algo)
    ws, state = [w.clone() for w in tg.init], {}
    for t in range(5):
        kw = {"beta": 0.99, "eps": 1e-5} if zero_sum else {}
        step = ref_direction("acgd" if zero_sum else "cgd", tg, ws, lrs, state, **kw)
        ws = [w + d for w, d in zip(ws, torch.split(step, [w.numel() for w in ws]))]
        game.step()
        torch.testing.assert_close(torch.cat(tg.params()), torch.cat(ws), rtol=1e-9, atol=1e-11, msg=f"step {t}")


def test_zero_sum_solver_refuses_general_sum_games() -> None:
    game = GAMES["quadratic"](n_players=2).build(gameopt.CGD(0.1, zero_sum=True))
    with pytest.raises(ValueError, match="zero-sum"):
        game.step()
    with pytest.raises(ValueError, match="two-player"):
        GAMES["quadratic"]().build(gameopt.ACGD(0.1))


@pytest.mark.parametrize("game_name", list(GAMES))
@pytest.mark.parametrize("raw", [False, True], ids=["module", "params"])
@pytest.mark.parametrize("cross", [False, True], ids=["", "cross"])
def test_linearization_products(game_name, raw, cross) -> None:
    tg = GAMES[game_name]()
    game = tg.build(gameopt.SimGD(0.1), raw=raw)
    ws = tg.params()
    J, H = _ho(tg, ws)
    lin = oracle(game).linearize(cross=cross)
    assert (lin.cross is not None) == cross
    layout = game.layout
    g = torch.Generator().manual_seed(0)
    v = layout.from_per_player([torch.randn(w.numel(), generator=g, dtype=torch.float64) for w in ws])
    flat = lambda vec: torch.cat(  # noqa: E731
        [x if isinstance(x, torch.Tensor) else torch.cat(x) for x in layout.per_player(vec)]
    )
    vv = flat(v)
    cases = {
        "jvp": (lin.jvp(v), J @ vv),
        "vjp": (lin.vjp(v), J.T @ vv),
        "offdiag_jvp": (lin.offdiag_jvp(v), H @ vv),
        "jvp_many": (lin.jvp_many(v), J @ vv),
        "jvp_many_again": (lin.jvp_many(v), J @ vv),
        "offdiag_jvp_again": (lin.offdiag_jvp(v), H @ vv),
        "chi": (lin.chi(), _chi(tg, ws)),
        "shaping": (lin.shaping(v), H @ vv + _chi(tg, ws)),
        "shaping without chi": (lin.shaping(v, chi=False), H @ vv),
        "shaping without v": (lin.shaping(None), _chi(tg, ws)),
    }
    for name, (got, want) in cases.items():
        torch.testing.assert_close(flat(got), want, rtol=1e-11, atol=1e-12, msg=name)


@pytest.mark.parametrize("make", [lambda: gameopt.ACGD([0.2, 0.1]), lambda: gameopt.CGD([0.2, 0.1], zero_sum=True)])
def test_zero_sum_solvers_resume_bit_exact(make) -> None:

    tg = GAMES["bilinear"]()
    straight = straight_and_resumed(tg, make, steps=6, cut=3).straight
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), straight))


# ------------------------------------------------------------ the zero-sum path
class _Net(torch.nn.Module):
    def __init__(self, sizes, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b).double() for a, b in zip(sizes, sizes[1:]))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.7)

    def forward(self, x):
        for k, layer in enumerate(self.layers):
            x = layer(x)
            if k < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


def _zero_sum_game(kind, algorithm, raw=False):
    """Two players, losses (f, −f): bilinear, a 2-player quadratic, a small tanh GAN."""
    g = torch.Generator().manual_seed(3)
    if kind == "gan":
        gen, disc = _Net([2, 5, 2], 0), _Net([2, 5, 1], 1)
        x = torch.randn(16, 2, generator=g, dtype=torch.float64) + 1
        z = torch.randn(16, 2, generator=g, dtype=torch.float64)

        def losses():
            f = torch.nn.functional.softplus(-disc(x)).mean() + torch.nn.functional.softplus(disc(gen(z))).mean()
            return -f, f

        players = [gen, disc]
        if raw:
            players = [gameopt.Player(list(gen.parameters())), gameopt.Player(list(disc.parameters()))]
        return gameopt.Game(players, losses, algorithm=algorithm), lambda: [
            p.detach().clone() for m in (gen, disc) for p in m.parameters()
        ]
    n = 3
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    P = torch.randn(n, n, generator=g, dtype=torch.float64)
    P = P @ P.T if kind == "quadratic" else torch.zeros(n, n, dtype=torch.float64)
    Q = 0.5 * P.T if kind == "quadratic" else P
    c = torch.randn(n, generator=g, dtype=torch.float64) if kind == "quadratic" else torch.zeros(n, dtype=torch.float64)
    xs = [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(2)]
    from models import VecModule

    mods = [VecModule(w) for w in xs]

    def losses():
        x, y = mods[0].w, mods[1].w
        f = 0.5 * x @ P @ x + x @ A @ y - 0.5 * y @ Q @ y + c @ x
        return f, -f

    players = [gameopt.Player([m.w]) if raw else m for m in mods]
    return gameopt.Game(players, losses, algorithm=algorithm), lambda: [m.w.detach().clone() for m in mods]


ZERO_SUM = {
    "HGD": lambda zs: gameopt.HamiltonianGD([0.05, 0.03], zero_sum=zs),
    "Consensus": lambda zs: gameopt.ConsensusOptimization([0.05, 0.03], gamma=0.7, zero_sum=zs),
    "SGA-dimension": lambda zs: gameopt.SGA([0.05, 0.03], lam=0.8, zero_sum=zs),
    "SGA-tensors": lambda zs: gameopt.SGA([0.05, 0.03], lam=0.8, sign_normalizer="tensors", zero_sum=zs),
    "SGA-fixed": lambda zs: gameopt.SGA([0.05, 0.03], lam=-0.8, align=False, zero_sum=zs),
}


@pytest.mark.parametrize("kind", ["bilinear", "quadratic", "gan"])
@pytest.mark.parametrize("name", list(ZERO_SUM))
@pytest.mark.parametrize("raw", [False, True], ids=["module", "params"])
def test_zero_sum_path_matches_general_path(kind, name, raw) -> None:
    general, params_g = _zero_sum_game(kind, ZERO_SUM[name](False), raw)
    zero_sum, params_z = _zero_sum_game(kind, ZERO_SUM[name](True), raw)
    for t in range(6):
        general.step()
        zero_sum.step()
        for a, b in zip(params_g(), params_z()):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12, msg=f"step {t}")


@pytest.mark.parametrize("kind", ["bilinear", "gan"])
def test_cgd_zero_sum_solver_matches_general_solver(kind) -> None:
    general, params_g = _zero_sum_game(kind, gameopt.CGD([0.05, 0.03], tol=1e-15))
    zero_sum, params_z = _zero_sum_game(kind, gameopt.CGD([0.05, 0.03], tol=1e-15, zero_sum=True))
    for t in range(4):
        general.step()
        zero_sum.step()
        for a, b in zip(params_g(), params_z()):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12, msg=f"step {t}")


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("raw", [False, True], ids=["module", "params"])
def test_zero_sum_linearization_products(batched, raw) -> None:
    game, _ = _zero_sum_game("gan", gameopt.SimGD(0.1), raw)
    general = oracle(game).linearize()
    zs = oracle(game).linearize(zero_sum=True, batched=batched)
    assert isinstance(zs, gameopt.autodiff.ZeroSumLinearization)
    layout = game.layout
    g = torch.Generator().manual_seed(0)
    v = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in layout.data]
    close = lambda a, b, msg: [  # noqa: E731
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-13, msg=msg) for x, y in zip(a, b)
    ]
    close(zs.xi, general.xi, "xi")
    for name in ("jvp", "vjp", "offdiag_jvp", "jvp_many"):
        close(getattr(zs, name)(v), getattr(general, name)(v), name)
    for i, j in ((0, 1), (1, 0), (0, 0), (1, 1)):
        close(zs.block_vjp(i, j, v), general.block_vjp(i, j, v), f"block_vjp {i} {j}")
    close(zs.chi(), general.chi(), "chi")
    close(zs.shaping(v), general.shaping(v), "shaping")
    for a, b in zip(zs.cross_gradients(), general.cross_gradients()):
        close(a, b, "cross_gradients")
    (jt, j), (jt_ref, j_ref) = zs.vjp_jvp(v), general.vjp_jvp(v)
    close(jt, jt_ref, "vjp_jvp: vjp")
    close(j, j_ref, "vjp_jvp: jvp")


def test_zero_sum_path_refuses_other_games() -> None:
    game = GAMES["quadratic"](n_players=2).build(gameopt.SGA(0.1, zero_sum=True))
    before = [p.detach().clone() for p in game.layout.data]
    with pytest.raises(ValueError, match="zero-sum"):
        game.step()
    assert all(torch.equal(a, b) for a, b in zip(before, game.layout.data))
    with pytest.raises(ValueError, match="two-player"):
        GAMES["quadratic"]().build(gameopt.ConsensusOptimization(0.1, zero_sum=True)).step()
    with pytest.raises(ValueError, match="zero_sum"):
        gameopt.HamiltonianGD(0.1, zero_sum=1)


@pytest.mark.parametrize("align", [None, 64], ids=["packed", "padded"])
def test_zero_sum_products_on_padded_layouts_and_last(align) -> None:
    """The zero-sum products with the parameters as inputs: the same as the general
    path whether the joint storage is the parameters end to end (one cat per group)
    or padded (copies into views); ``last=True`` gives the same product and then
    refuses any other, on both paths."""
    game, _ = _zero_sum_game("gan", gameopt.SimGD(0.1))
    gen, disc = (p.module for p in game.players)
    if align is not None:
        players = [gameopt.Player(gen, align=align), gameopt.Player(disc, align=align)]
        game = gameopt.Game(players, game.losses, algorithm=gameopt.SimGD(0.1))
    zs, general = oracle(game).linearize(zero_sum=True), oracle(game).linearize()
    assert all(game.layout.packed) == (align is None)  # padded: the copies into views
    g = torch.Generator().manual_seed(0)
    v = gameopt.Vec(torch.randn(t.shape, generator=g, dtype=t.dtype) for t in game.layout.data)
    for a, b in zip(zs.xi, general.xi):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    for name in ("jvp", "offdiag_jvp", "chi"):
        args = () if name == "chi" else (v,)
        for a, b in zip(getattr(zs, name)(*args), getattr(general, name)(*args)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13, msg=name)
    for lin in (zs, general):
        lin.vjp(v)  # a product keeps the graph
        own = lin.vjp(lin.xi)
        for a, b in zip(lin.vjp(lin.xi, last=True), own):
            assert torch.equal(a, b)
        with pytest.raises(RuntimeError, match="last=True"):
            lin.vjp(v)


class _Odd(torch.nn.Module):
    """A player with a weight (transposed: non-contiguous), a bias and an unused parameter."""

    def __init__(self, n_in: int, n_out: int, seed: int, transposed: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(n_in, n_out, generator=g, dtype=torch.float64).t()
        self.w = torch.nn.Parameter(w if transposed else w.contiguous())
        self.b = torch.nn.Parameter(torch.randn(n_out, generator=g, dtype=torch.float64))
        self.unused = torch.nn.Parameter(torch.randn(2, generator=g, dtype=torch.float64))

    def forward(self, x):
        return torch.tanh(x @ self.w.t() + self.b)


def _odd_game(align=None, raw=False, sparse=None, transposed=False):
    """Three general-sum players; the first an embedding when ``sparse`` is given."""
    a, b, c = (_Odd(n, m, seed, transposed) for n, m, seed in ((3, 4, 0), (4, 3, 1), (3, 2, 2)))
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 3, generator=g, dtype=torch.float64)
    emb = None
    if sparse is not None:
        emb = torch.nn.Embedding(5, 3, sparse=sparse).double()
        with torch.no_grad():
            emb.weight.copy_(torch.randn(5, 3, generator=g, dtype=torch.float64))
        idx = torch.tensor([0, 2, 2, 4, 1, 2, 0, 3])

    def losses():
        h = a(x if emb is None else x + emb(idx))
        y = b(h)
        z = c(y)
        return [
            (h * y[:, :1]).sum() + z.sum(),
            (y - h[:, :3]).square().sum() * z.mean(),
            (z - 1).square().mean() + y.sum(),
        ]

    modules = [a, b, c] if emb is None else [torch.nn.ModuleList([a, emb]), b, c]
    players = [gameopt.Player(list(m.parameters()) if raw else m, align=align) for m in modules]
    return gameopt.Game(players, losses, algorithm=gameopt.SimGD(0.1))


def _per_param(game, vec):
    """A joint vector's values, parameter after parameter (no padding)."""
    layout = game.layout
    return torch.cat([t.reshape(-1) for e in layout.entries for t in e.buffer.views(layout.entry_view(vec, e))])


def _general_products(game, cross=False, jvp=True):
    lin = oracle(game).linearize(cross=cross)
    g = torch.Generator().manual_seed(0)
    layout = game.layout
    v = layout.zeros()
    for e in layout.entries:
        for view in e.buffer.views(layout.entry_view(v, e)):
            view.copy_(torch.randn(view.shape, generator=g, dtype=torch.float64))
    per = functools.partial(_per_param, game)
    parts = lin.block_vjp_parts(1, 2, layout.player_views(v, 1))
    out = {
        "xi": per(lin.xi),
        "vjp": per(lin.vjp(v)),
        "block_vjp": per(lin.block_vjp(0, 1, v)),
        "block_vjp_parts": torch.cat(
            [t.reshape(-1) for e, flat in zip(layout.by_player[2], parts) for t in e.buffer.views(flat)]
        ),
        "chi": per(lin.chi()),
    }
    if jvp:
        out |= {
            "jvp": per(lin.jvp(v)),
            "jvp_many": per(lin.jvp_many(v)),
            "offdiag_jvp": per(lin.offdiag_jvp(v)),
            "shaping": per(lin.shaping(v)),
        }
    out["vjp last"] = per(lin.vjp(lin.xi, last=True))
    with pytest.raises(RuntimeError, match="last=True"):
        lin.vjp(v)
    return out, v


@pytest.mark.parametrize("cross", [False, True], ids=["", "cross"])
def test_general_products_against_parameters_on_odd_layouts(cross) -> None:
    """The general products differentiate against the parameters themselves: the same
    bits whether the joint storage is the parameters end to end (one cat per group) or
    not (padded, or a transposed weight: copies into views), with an unused parameter,
    for players given as modules or as tensors; and J v, Jᵀv against a dense Jacobian of ξ."""
    assert all(_odd_game().layout.packed)  # one cat per group
    assert not any(e.buffer.packed for e in _odd_game(align=64).layout.entries)  # copies into views
    assert not any(e.buffer.packed for e in _odd_game(transposed=True).layout.entries)
    products = {t: _general_products(_odd_game(transposed=t), cross)[0] for t in (False, True)}
    for name in products[False]:  # a transposed weight: other kernels, other roundings
        torch.testing.assert_close(products[True][name], products[False][name], rtol=1e-12, atol=1e-13)
    for kw in ({"align": 64}, {"raw": True}, {"align": 64, "transposed": True}, {"raw": True, "transposed": True}):
        ref = products[kw.get("transposed", False)]
        got, _ = _general_products(_odd_game(**kw), cross)
        for name in ref:
            if "jvp" in name and kw.get("raw"):  # raw players: double backward instead of forward mode
                torch.testing.assert_close(got[name], ref[name], rtol=1e-12, atol=1e-13)
            else:
                assert torch.equal(got[name], ref[name]), (kw, name)
    # against the dense Jacobian of ξ(w) on unfused copies of the players
    game = _odd_game()
    params = [p for e in game.layout.entries for p in e.buffer.params]
    owner = [e.player for e in game.layout.entries for _ in e.buffer.params]

    def xi(flat):
        values = torch.split(flat, [p.numel() for p in params])
        subs = {id(p): t.view(p.shape) for p, t in zip(params, values)}
        with substituted(game.step_context.problem, subs):
            losses = game.losses()
        grads = []
        for i, loss in enumerate(losses):
            mine = [k for k, o in enumerate(owner) if o == i]
            gs = torch.autograd.grad(loss, [values[k] for k in mine], create_graph=True, allow_unused=True)
            grads += [torch.zeros_like(values[k]) if t is None else t for k, t in zip(mine, gs)]
        return torch.cat([t.reshape(-1) for t in grads])

    w = torch.cat([p.detach().reshape(-1) for p in params])
    J = torch.autograd.functional.jacobian(xi, w)
    _, v = _general_products(game)
    lin = game.linearize()
    vv = _per_param(game, v)
    for name, want in (("jvp", J @ vv), ("vjp", J.T @ vv)):
        got = _per_param(game, getattr(lin, name)(v))
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12, msg=name)


def test_general_products_with_sparse_gradients() -> None:
    """A player with sparse gradients: the reverse-mode products equal those of the same
    game with dense gradients; J v (forward mode unavailable, the double-vjp trick
    unsupported by PyTorch there) refuses clearly instead of a wrong answer."""
    dense, _ = _general_products(_odd_game(sparse=False), jvp=False)
    sparse, _ = _general_products(_odd_game(sparse=True), jvp=False)
    for name in dense:
        torch.testing.assert_close(sparse[name], dense[name], rtol=1e-13, atol=1e-14, msg=name)
    lin = _odd_game(sparse=True).linearize()
    with pytest.raises(NotImplementedError, match="sparse gradients"):
        lin.jvp(lin.xi)


@pytest.mark.parametrize("zero_sum", [False, True])
def test_a_kept_linearization_does_not_pin_the_parameters(zero_sum) -> None:
    """A linearization kept alive (a traceback in a notebook, say) must not stop the
    modules from being fused again: its graph holds aliases, not the parameters."""
    game, _ = _zero_sum_game("gan", gameopt.SimGD(0.1))
    lin = oracle(game).linearize(zero_sum=zero_sum)
    modules = [p.module for p in game.players]
    other = gameopt.Game(modules, game.losses, algorithm=gameopt.SGA(0.1))  # fuses the modules again
    other.step()
    assert lin.vjp(lin.xi) is not None  # and the kept graph still works


@pytest.mark.parametrize("zero_sum", [False, True])
def test_a_step_after_a_re_fuse_differentiates_the_new_parameters(zero_sum) -> None:
    """Kept graphs are built on aliases made once per layout. After a module's
    parameters are replaced (``load_state_dict(assign=True)``: the game fuses them
    again), the next step takes the new values, bit for bit as a new game on the same
    modules does, and the module keeps its new parameters registered."""
    games = [_zero_sum_game("gan", ZERO_SUM["SGA-dimension"](zero_sum))[0] for _ in range(2)]
    for game in games:
        game.step()
        disc = game.players[1].module
        disc.load_state_dict({k: v + 0.25 for k, v in disc.state_dict().items()}, assign=True)
    games[0].step()  # notices the new parameters and fuses them
    modules = [p.module for p in games[1].players]
    gameopt.Game(modules, games[1].losses, algorithm=ZERO_SUM["SGA-dimension"](zero_sum)).step()
    modules = [[p.module for p in game.players] for game in games]
    for mine, ref in zip(modules[0], modules[1]):
        for (name, p), q in zip(mine.named_parameters(), ref.parameters()):
            assert type(p) is torch.nn.Parameter, name  # no alias left behind
            assert torch.equal(p, q), name
            assert p.data_ptr() != q.data_ptr()


@pytest.mark.parametrize("zero_sum", [False, True])
def test_a_module_whose_parameter_dict_was_replaced_still_gets_its_aliases(zero_sum) -> None:
    """Substituting the aliases looks each module's ``_parameters`` up afresh: a dict
    replaced by an equal one (same parameters, so the game sees nothing to re-fuse)
    must not leave the losses on the parameters themselves (ξ would miss them)."""
    game, _ = _zero_sum_game("gan", gameopt.SimGD(0.1))
    oracle(game).linearize(zero_sum=zero_sum)  # the aliases are made
    net = game.players[0].module.layers[0]
    net._parameters = dict(net._parameters)
    lin = oracle(game).linearize(zero_sum=zero_sum)
    field = game.layout.from_per_player(game.vector_field())
    for a, b in zip(lin.xi, field):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["HGD", "Consensus", "SGA-dimension"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_zero_sum_with_non_finite_losses_is_a_non_finite_step(name, bad) -> None:
    """Non-finite losses cannot show whether they are (f, −f): the step is refused as
    non-finite (skipped with ``on_nonfinite="skip"``), not as a game that is not zero-sum."""
    game, params = _zero_sum_game("gan", ZERO_SUM[name](True))
    good = game.losses
    game.losses = lambda: tuple(loss + bad for loss in good())
    before = params()
    with pytest.raises(gameopt.NonFiniteError, match="a loss of the zero-sum game is not finite"):
        game.step()
    game.on_nonfinite = "skip"
    game.step()
    assert game.skipped_steps == 1
    assert all(map(torch.equal, params(), before))


# ------------------------------------------ (Jᵀv, Jv) in one double backward (issue 35)
def _dense_jacobian(game):
    """J = ∂ξ/∂w of a game of modules, parameter after parameter (as in
    test_general_products_against_parameters_on_odd_layouts)."""
    params = [p for e in game.layout.entries for p in e.buffer.params]
    owner = [e.player for e in game.layout.entries for _ in e.buffer.params]

    def xi(flat):
        values = torch.split(flat, [p.numel() for p in params])
        with substituted(game.step_context.problem, {id(p): t.view(p.shape) for p, t in zip(params, values)}):
            losses = game.losses()
        grads = []
        for i, loss in enumerate(losses):
            mine = [k for k, o in enumerate(owner) if o == i]
            gs = torch.autograd.grad(loss, [values[k] for k in mine], create_graph=True, allow_unused=True)
            grads += [torch.zeros_like(values[k]) if t is None else t for k, t in zip(mine, gs)]
        return torch.cat([t.reshape(-1) for t in grads])

    return torch.autograd.functional.jacobian(xi, torch.cat([p.detach().reshape(-1) for p in params]))


@pytest.mark.parametrize(
    "kw", [{}, {"align": 64}, {"raw": True}, {"transposed": True}], ids=["packed", "padded", "params", "transposed"]
)
def test_vjp_jvp_equals_the_separate_products_and_the_dense_jacobian(kw) -> None:
    """``vjp_jvp`` (Jᵀv the value of the ``create_graph`` pass, Jv its derivative
    toward the grad_output) equals ``vjp`` and ``jvp`` (forward mode and double
    backward) on a non-quadratic three-player general-sum game with an unused
    parameter, J against the dense Jacobian of ξ; and the graph stays for later products."""
    game = _odd_game(**kw)
    _, v = _general_products(_odd_game(**kw), jvp=False)
    lin = oracle(game).linearize()
    per = functools.partial(_per_param, game)
    jt, j = map(per, lin.vjp_jvp(v))
    close = functools.partial(torch.testing.assert_close, rtol=1e-12, atol=1e-13)
    close(jt, per(lin.vjp(v)), msg="vjp")
    close(j, per(lin.jvp(v)), msg="jvp")
    close(j, per(lin.jvp_many(v)), msg="jvp, double backward")
    jt2, j2 = map(per, lin.vjp_jvp(lin.xi))  # v = ξ, as SGA asks
    close(jt2, per(lin.vjp(lin.xi)), msg="vjp of xi")
    close(j2, per(lin.jvp(lin.xi)), msg="jvp of xi")
    J = _dense_jacobian(_odd_game())  # the same parameters, one after the other
    close(jt, J.T @ per(v), msg="vjp, dense")
    close(j, J @ per(v), msg="jvp, dense")


@pytest.mark.parametrize("game_name", list(GAMES))
def test_vjp_jvp_against_the_closed_form_jacobian(game_name) -> None:
    tg = GAMES[game_name]()
    game = tg.build(gameopt.SimGD(0.1))
    J = tg.jac_ref(tg.params())
    lin = oracle(game).linearize()
    jt, j = lin.vjp_jvp(lin.xi)
    xi = torch.cat(tg.xi_ref(tg.params()))
    flat = lambda vec: torch.cat(  # noqa: E731
        [x if isinstance(x, torch.Tensor) else torch.cat(x) for x in game.layout.per_player(vec)]
    )
    torch.testing.assert_close(flat(jt), J.T @ xi, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(flat(j), J @ xi, rtol=1e-11, atol=1e-12)


def test_general_sga_evaluates_the_losses_once_per_step() -> None:
    """General-sum SGA takes Jᵀξ and Jξ from ξ's one graph: no second evaluation of
    the losses (forward-over-reverse re-ran them with dual parameters), the same step."""
    calls = []
    steps = {}
    for forward_mode in (True, False):
        game = _odd_game()
        losses = game.losses
        game.losses = lambda losses=losses: calls.append(1) or losses()
        game.algorithm = gameopt.SGA(0.1)
        game.step_context.problem.forward_mode.ok = forward_mode
        calls.clear()
        game.step()
        assert len(calls) == 1
        steps[forward_mode] = [t.clone() for t in game.layout.data]
    for a, b in zip(steps[True], steps[False]):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-14)


def test_vjp_jvp_with_sparse_gradients_takes_the_separate_products() -> None:
    """No graph toward a sparse gradient's grad_output: vjp_jvp refuses as jvp does."""
    lin = _odd_game(sparse=True).linearize()
    with pytest.raises(NotImplementedError, match="sparse gradients"):
        lin.vjp_jvp(lin.xi)


@pytest.mark.parametrize("game_name", list(GAMES))
@pytest.mark.parametrize("raw", [False, True], ids=["module", "params"])
def test_sga_jvp_forward_matches_the_closed_form_and_the_double_backward(game_name, raw) -> None:
    """``SGA(jvp="forward")``: Jᵀξ by a pass that frees ξ's graph, Jξ forward-over-reverse;
    the same iterates as the closed form and as the default path. Players given as
    tensors have no module to run with dual parameters: refused, nothing changes."""
    from games import assert_same_state

    tg = GAMES[game_name]()
    lrs = [0.05 + 0.02 * i for i in range(len(tg.init))]
    kw = {"lam": 0.8, "align": True, "eps": 0.1}
    game = tg.build(gameopt.SGA(lrs, lam=0.8, jvp="forward"), raw=raw)
    if raw:
        before = game.state_dict()
        with pytest.raises(RuntimeError, match=r"forward-mode AD is unavailable .*a player given as tensors"):
            game.step()
        assert_same_state(game.state_dict(), before)
        return
    other = GAMES[game_name]()
    default = other.build(gameopt.SGA(lrs, lam=0.8))
    ws = [w.clone() for w in tg.init]
    for t in range(3):
        step = ref_direction("sga", tg, ws, lrs, {}, **kw)
        ws = [w + d for w, d in zip(ws, torch.split(step, [w.numel() for w in ws]))]
        game.step()
        default.step()
        torch.testing.assert_close(torch.cat(tg.params()), torch.cat(ws), rtol=1e-9, atol=1e-11, msg=f"step {t}")
        torch.testing.assert_close(torch.cat(tg.params()), torch.cat(other.params()), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("cause", ["earlier", "now"])
def test_sga_jvp_forward_without_forward_mode_ad_is_refused_and_changes_nothing(monkeypatch, cause) -> None:
    """Without forward-mode AD the double backward would need ξ's graph, which the
    pass taking Jᵀξ freed: the step is refused naming the cause, and nothing changes."""
    from games import assert_same_state

    game = _odd_game()
    game.algorithm = gameopt.SGA(0.1, jvp="forward")
    game.step()
    before = game.state_dict()
    if cause == "earlier":
        game.step_context.problem.forward_mode.ok = False
        match = "an op without a forward-mode formula, met at an earlier product"
    else:
        import gameopt.autodiff.linearization as linearization

        def lacking(*args, **kwargs):
            raise NotImplementedError("Trying to use forward AD with some_op that does not support it")

        monkeypatch.setattr(linearization, "dual_tangents", lacking)
        match = "PyTorch: Trying to use forward AD with some_op"
    with pytest.raises(RuntimeError, match=match) as err:
        game.step()
    assert "SGA: jvp='double_backward'" in str(err.value)
    assert_same_state(game.state_dict(), before)
    game.algorithm.jvp = "double_backward"
    game.step()  # the default path needs no forward mode


def test_an_sga_checkpoint_resumes_under_either_jvp_path() -> None:
    """``jvp`` is how Jξ is taken, not which run: not part of the checkpoint's identity."""
    game = _odd_game()
    game.algorithm = gameopt.SGA(0.1)
    game.step()
    saved = game.state_dict()
    other = _odd_game()
    other.algorithm = gameopt.SGA(0.1, jvp="forward")
    other.load_state_dict(saved)
    other.step()
    game.step()
    for a, b in zip(game.layout.data, other.layout.data):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_sga_jvp_forward_frees_the_graph_of_xi_before_the_losses_run_again() -> None:
    """The memory of ``jvp="forward"``: when the losses run again with dual parameters,
    nothing the first evaluation saved for backward is held any more (counted by
    saved-tensor hooks); the default path evaluates the losses once."""
    import weakref

    class Saved:
        def __init__(self, t):
            self.t = t

    held: list[weakref.ref] = []

    def pack(t):
        saved = Saved(t)
        held.append(weakref.ref(saved))
        return saved

    alive: list[int] = []
    for jvp in ("forward", "double_backward"):
        game = _odd_game()
        losses = game.losses

        def hooked(losses=losses):
            if not held:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved.t):
                    return losses()
            alive.append(sum(ref() is not None for ref in held))
            return losses()

        game.losses = hooked
        game.algorithm = gameopt.SGA(0.1, jvp=jvp)
        game.step()
        assert held
        held.clear()
    assert alive == [0]


def test_sga_jvp_forward_sees_the_same_noise_and_moves_the_buffers_once() -> None:
    """``jvp="forward"`` re-evaluates the losses (dropout, noise drawn in the losses,
    training-mode BatchNorm): with the same random numbers and the buffers left as
    they are, it takes the step of the default path, which evaluates them once."""
    from test_evaluation import _buffers, _dcgan

    steps, buffers = {}, {}
    for jvp in ("forward", "double_backward"):
        gen, disc, losses, draws, _ = _dcgan(seed=1)
        game = gameopt.Game([gen, disc], losses, algorithm=gameopt.SGA(0.05, jvp=jvp))
        game.step()
        assert len(draws) == (2 if jvp == "forward" else 1)
        assert all(torch.equal(z, draws[0]) for z in draws)
        steps[jvp], buffers[jvp] = [t.clone() for t in game.layout.data], _buffers(gen, disc)
    for a, b in zip(steps["forward"], steps["double_backward"]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert all(map(torch.equal, buffers["forward"], buffers["double_backward"]))
