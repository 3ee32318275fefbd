"""RMSProp as an update rule (torch.optim's and TF1's conventions) and SGA's sign
rule (normalized by the dimension or by the number of weight tensors), against
torch.optim.RMSprop and closed forms, iterate for iterate in float64."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from games import GAMES, ref_trajectory, straight_and_resumed
from torch import Tensor, nn

import gameopt


def _lrs(n: int) -> list[float]:
    return [0.05 + 0.02 * i for i in range(n)]


class RefRMSProp:
    """The closed form, in the interface of games.RefRule: v ← ρ v + (1 − ρ) d²,
    out = d / (√v + ε) from v = 0 ("torch") or d / √(v + ε) from v = 1 ("tf1")."""

    def __init__(self, decay: float, eps: float, convention: str) -> None:
        self.decay, self.eps, self.convention = decay, eps, convention
        self.state: dict = {}

    def __call__(self, ds: list[Tensor]) -> list[Tensor]:
        start = 0.0 if self.convention == "torch" else 1.0
        v = self.state.get("v", [torch.full_like(d, start) for d in ds])
        v = [self.decay * vi + (1 - self.decay) * d * d for vi, d in zip(v, ds)]
        self.state["v"] = v
        if self.convention == "torch":
            return [d / (vi.sqrt() + self.eps) for d, vi in zip(ds, v)]
        return [d / (vi + self.eps).sqrt() for d, vi in zip(ds, v)]


# ------------------------------------------------------------------ RMSProp
@pytest.mark.parametrize("game_name", ["bilinear", "quadratic", "nonquadratic"])
@pytest.mark.parametrize("decay, eps", [(0.99, 1e-8), (0.5, 1e-3), (0, 0.1)])
def test_rmsprop_torch_matches_torch_optim_rmsprop(game_name, decay, eps) -> None:
    """SimGD with RMSProp(convention="torch") is torch.optim.RMSprop on each player's
    own loss (one optimizer per player, its own learning rate) on an unfused copy."""
    tg = GAMES[game_name]()
    lrs = _lrs(len(tg.init))
    game = tg.build(gameopt.SimGD(lrs, update=gameopt.RMSProp(decay, eps)))
    ws = [nn.Parameter(w.clone()) for w in tg.init]
    opts = [torch.optim.RMSprop([w], lr=lr, alpha=decay, eps=eps) for w, lr in zip(ws, lrs)]
    for t in range(10):
        losses = tg.losses_fn(ws)
        grads = [torch.autograd.grad(f, w, retain_graph=True)[0] for f, w in zip(losses, ws)]
        for w, g, opt in zip(ws, grads, opts):
            w.grad = g
            opt.step()
        game.step()
        for mine, ref in zip(tg.params(), ws):
            torch.testing.assert_close(mine, ref.detach(), rtol=1e-12, atol=1e-14, msg=f"step {t}")


@pytest.mark.parametrize("game_name", ["bilinear", "quadratic"])
def test_rmsprop_tf1_matches_tf1_formula(game_name) -> None:
    """TF1: ms starts at 1, ms ← ρ ms + (1 − ρ) g², w ← w − η g / √(ms + ε), written out here."""
    tg = GAMES[game_name]()
    lrs = _lrs(len(tg.init))
    game = tg.build(gameopt.SimGD(lrs, update=gameopt.RMSProp(decay=0.9, eps=1e-10, convention="tf1")))
    ws = [w.clone() for w in tg.init]
    ms = [torch.ones_like(w) for w in ws]
    for t in range(10):
        g = tg.xi_ref(ws)
        ms = [0.9 * m + 0.1 * gi**2 for m, gi in zip(ms, g)]
        ws = [w - lr * gi / torch.sqrt(m + 1e-10) for w, gi, m, lr in zip(ws, g, ms, lrs)]
        game.step()
        for mine, ref in zip(tg.params(), ws):
            torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-14, msg=f"step {t}")


def test_defaults_are_the_conventions_defaults() -> None:
    torch_rule, tf1_rule = gameopt.RMSProp(), gameopt.RMSProp(convention="tf1")
    assert (torch_rule.decay, torch_rule.eps) == (0.99, 1e-8)  # torch.optim.RMSprop's alpha, eps
    assert (tf1_rule.decay, tf1_rule.eps) == (0.9, 1e-10)  # tf.train.RMSPropOptimizer's decay, epsilon
    like = [torch.zeros(3)]
    assert torch.equal(torch_rule.init(like)["v"][0], torch.zeros(3))
    assert torch.equal(tf1_rule.init(like)["v"][0], torch.ones(3))
    assert "convention='tf1'" in repr(tf1_rule)


@pytest.mark.parametrize("convention", ["torch", "tf1"])
@pytest.mark.parametrize("algo", ["simgd", "eg", "optimistic"])
def test_rmsprop_inside_first_order_algorithms(algo, convention) -> None:
    """Inside Extragradient both evaluations advance v; inside Optimistic one does."""
    tg = GAMES["nonquadratic"]()
    lrs = _lrs(3)
    make = {"simgd": gameopt.SimGD, "eg": gameopt.Extragradient, "optimistic": gameopt.Optimistic}[algo]
    expected = ref_trajectory(tg, algo, lrs, 7, rule=RefRMSProp(0.8, 1e-3, convention))
    game = tg.build(make(lrs, update=gameopt.RMSProp(0.8, 1e-3, convention=convention)))
    for t in range(7):
        game.step()
        for w, ref in zip(tg.params(), expected[t]):
            torch.testing.assert_close(w, ref, rtol=1e-12, atol=1e-12, msg=f"step {t}")


def _sga_direction(xi: Tensor, J: Tensor, lam: float, eps: float, n: int) -> Tensor:
    """ξ + λ Aᵀξ with λ = |λ₀| sign(⟨ξ, Jᵀξ⟩⟨Aᵀξ, Jᵀξ⟩ / n + ε)."""
    jt = J.T @ xi
    a_xi = 0.5 * (J.T @ xi - J @ xi)
    return xi + lam * torch.sign((xi @ jt) * (a_xi @ jt) / n + eps) * a_xi


@pytest.mark.parametrize("convention", ["torch", "tf1"])
@pytest.mark.parametrize("method", ["consensus", "sga"])
def test_rmsprop_inside_second_order_algorithms(method, convention) -> None:
    """w ← w − η RMSProp(ξ + γ Jᵀξ) and w ← w − η RMSProp(ξ + λ Aᵀξ): one advance of v per step."""
    tg = GAMES["quadratic"]()
    lrs = _lrs(3)
    rule = gameopt.RMSProp(0.7, 1e-4, convention=convention)
    algo = (
        gameopt.ConsensusOptimization(lrs, 0.3, update=rule)
        if method == "consensus"
        else gameopt.SGA(lrs, 0.8, update=rule)
    )
    game = tg.build(algo)
    ref = RefRMSProp(0.7, 1e-4, convention)
    ws = [w.clone() for w in tg.init]
    sizes = [w.numel() for w in ws]
    for t in range(6):
        xi, J = torch.cat(tg.xi_ref(ws)), tg.jac_ref(ws)
        d = xi + 0.3 * J.T @ xi if method == "consensus" else _sga_direction(xi, J, 0.8, 0.1, xi.numel())
        out = ref([d])[0]
        ws = [w - lr * o for w, o, lr in zip(ws, torch.split(out, sizes), lrs)]
        game.step()
        torch.testing.assert_close(torch.cat(tg.params()), torch.cat(ws), rtol=1e-10, atol=1e-12, msg=f"step {t}")


RESUMED = {
    "SimGD": lambda lr, rule: gameopt.SimGD(lr, update=rule),
    "AltGD": lambda lr, rule: gameopt.AltGD(lr, update=rule),
    "Extragradient": lambda lr, rule: gameopt.Extragradient(lr, update=rule),
    "Optimistic": lambda lr, rule: gameopt.Optimistic(lr, update=rule),
    "Consensus": lambda lr, rule: gameopt.ConsensusOptimization(lr, 0.5, update=rule),
    "SGA-tensors": lambda lr, rule: gameopt.SGA(lr, update=rule, sign_normalizer="tensors"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("convention", ["torch", "tf1"])
@pytest.mark.parametrize("name", list(RESUMED))
def test_resume_is_bit_exact(name, convention, dtype) -> None:
    """Four steps, a state_dict through torch.save/load (weights_only), four more:
    the same bits as eight straight steps."""
    tg = GAMES["nonquadratic"]()
    lrs = _lrs(3)

    def make() -> gameopt.Algorithm:
        return RESUMED[name](lrs, gameopt.RMSProp(convention=convention))

    straight = straight_and_resumed(tg, make, steps=8, cut=4, dtype=dtype).straight
    for a, b in zip(tg.params(), straight):
        assert a.dtype == dtype
        assert torch.equal(a, b)


@pytest.mark.parametrize("convention", ["torch", "tf1"])
def test_apply_leaves_its_inputs_and_writes_into_empty(convention) -> None:
    rule = gameopt.RMSProp(0.9, 1e-6, convention=convention)
    d = [torch.randn(5, dtype=torch.float64), torch.randn(2, dtype=torch.float64)]
    state = {"v": [torch.rand(5, dtype=torch.float64), torch.rand(2, dtype=torch.float64)]}
    d0, v0 = [t.clone() for t in d], [t.clone() for t in state["v"]]
    handed: list[Tensor] = []

    def empty() -> list[Tensor]:
        out = [torch.full_like(t, float("nan")) for t in d]
        handed.extend(out)
        return out

    out, new = rule.apply(d, state, empty)
    assert all(torch.equal(a, b) for a, b in zip(d, d0))
    assert all(torch.equal(a, b) for a, b in zip(state["v"], v0))
    ids = {id(t) for t in handed}
    assert all(id(t) in ids for t in [*out, *new["v"]])
    assert all(torch.isfinite(t).all() for t in [*out, *new["v"]])


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"decay": 1.0}, "decay"),
        ({"decay": -0.1}, "decay"),
        ({"decay": math.nan}, "decay"),
        ({"decay": True}, "decay"),
        ({"decay": "0.9"}, "decay"),
        ({"eps": -1e-8}, "eps"),
        ({"eps": math.inf}, "eps"),
        ({"eps": math.nan}, "eps"),
        ({"eps": False}, "eps"),
        ({"convention": "tf2"}, "convention"),
    ],
)
def test_rmsprop_bad_arguments_raise_a_value_error_naming_them(kw, name) -> None:
    with pytest.raises(ValueError, match=name):
        gameopt.RMSProp(**kw)


def test_rmsprop_ints_are_numbers() -> None:
    rule = gameopt.RMSProp(decay=0, eps=1)
    assert rule.decay == 0.0 and isinstance(rule.decay, float) and rule.eps == 1.0


# ------------------------------------------------------------ SGA's sign rule
def _indefinite_game() -> tuple[list[Tensor], Callable[..., list[Tensor]], Callable[[Tensor], Tensor], Tensor]:
    """Player 0 holds two 1-element tensors x = (x₁, x₂), player 1 one tensor y ∈ R²:
    f₀ = −½‖x‖² + xᵀBy + aᵀx, f₁ = ½‖y‖² − yᵀBᵀx, so ξ = (−x + By + a, y − Bᵀx),
    J = [[−I, B], [−Bᵀ, I]] (d = 4 parameters in n = 3 weight tensors). Its symmetric
    part is indefinite, so ⟨ξ, Jᵀξ⟩⟨Aᵀξ, Jᵀξ⟩ can be negative."""
    B = torch.tensor([[2.0, -1.0], [0.5, 1.5]], dtype=torch.float64)
    a = torch.tensor([3.0, -2.0], dtype=torch.float64)
    init = [torch.tensor([0.4], dtype=torch.float64), torch.tensor([-0.3], dtype=torch.float64)]
    init.append(torch.tensor([0.2, 0.1], dtype=torch.float64))

    def losses(ws):
        x, y = torch.cat(ws[:2]), ws[2]
        return [-0.5 * x @ x + x @ B @ y + a @ x, 0.5 * y @ y - y @ B.T @ x]

    def xi(w):  # w: the flat joint vector
        x, y = w[:2], w[2:]
        return torch.cat([-x + B @ y + a, y - B.T @ x])

    eye = torch.eye(2, dtype=torch.float64)
    J = torch.cat([torch.cat([-eye, B], 1), torch.cat([-B.T, eye], 1)])
    return init, losses, xi, J


def _build_indefinite(algorithm: gameopt.Algorithm) -> tuple[gameopt.Game, list[nn.Parameter]]:
    init, losses, _, _ = _indefinite_game()
    ws = [nn.Parameter(w.clone()) for w in init]
    players = [gameopt.Player(ws[:2], name="x"), gameopt.Player(ws[2:], name="y")]
    return gameopt.Game(players, lambda: losses(ws), algorithm=algorithm), ws


def _sign_product(w: Tensor) -> float:
    _, _, xi_fn, J = _indefinite_game()
    xi = xi_fn(w)
    jt = J.T @ xi
    return float((xi @ jt) * ((0.5 * (J.T @ xi - J @ xi)) @ jt))


def test_sign_normalizers_follow_their_closed_forms_and_differ() -> None:
    """With ε between |p|/d and |p|/n (p < 0 the product), the paper's text
    (n = d = 4 parameters) keeps λ > 0 where the authors' code (n = 3 weight
    tensors) flips it; each follows w ← w − η(ξ + λ Aᵀξ) with its own n."""
    init, _, xi_fn, J = _indefinite_game()
    w0 = torch.cat(init)
    p = _sign_product(w0)
    assert p < 0
    eps = abs(p) * (1 / 4 + 1 / 3) / 2
    lrs = [0.01, 0.02]
    eta = torch.tensor([0.01, 0.01, 0.02, 0.02], dtype=torch.float64)
    first = {}
    for normalizer, n in (("dimension", 4), ("tensors", 3)):
        game, ws = _build_indefinite(gameopt.SGA(lrs, lam=0.7, eps=eps, sign_normalizer=normalizer))
        w = w0.clone()
        for t in range(5):
            w = w - eta * _sga_direction(xi_fn(w), J, 0.7, eps, n)
            game.step()
            got = torch.cat([v.detach() for v in ws])
            torch.testing.assert_close(got, w, rtol=1e-12, atol=1e-13, msg=f"{normalizer}, step {t}")
            if t == 0:
                first[normalizer] = got
    step_d, step_t = first["dimension"] - w0, first["tensors"] - w0
    assert not torch.allclose(step_d, step_t)
    a_xi = 0.5 * (J.T @ xi_fn(w0) - J @ xi_fn(w0))
    torch.testing.assert_close(step_d - step_t, -eta * 2 * 0.7 * a_xi)  # λ = +0.7 against −0.7


def test_tensors_normalizer_counts_the_fused_tensors_of_all_players() -> None:
    game, _ = _build_indefinite(gameopt.SGA(0.01, sign_normalizer="tensors"))
    assert sum(len(p.parameters) for p in game.players) == 3
    assert game.layout.num_elements == 4


def test_default_sign_normalizer_is_the_papers_dimension() -> None:
    sga = gameopt.SGA()
    assert sga.settings["sign_normalizer"] == "dimension"
    assert "sign_normalizer='dimension'" in repr(sga)


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"lam": math.nan}, "lam"),
        ({"lam": math.inf}, "lam"),
        ({"lam": True}, "lam"),
        ({"lam": "1"}, "lam"),
        ({"eps": math.nan}, "eps"),
        ({"eps": -0.1}, "eps"),
        ({"eps": math.inf}, "eps"),
        ({"eps": False}, "eps"),
        ({"align": 1}, "align"),
        ({"sign_normalizer": "parameters"}, "sign_normalizer"),
    ],
)
def test_sga_bad_arguments_raise_a_value_error_naming_them(kw, name) -> None:
    with pytest.raises(ValueError, match=name):
        gameopt.SGA(**kw)


def test_sga_ints_are_numbers() -> None:
    sga = gameopt.SGA(1, lam=2, eps=0)
    assert sga.settings["lam"] == 2.0 and sga.settings["eps"] == 0.0


# ----------------------------------------------- extrapolate / resume (issue 13)
class _DoubledAdam(gameopt.Adam):
    """A subclass with its own rule: extrapolate/resume must go through its apply."""

    memory_flags = True  # its apply takes them (declared again: it defines apply)

    def apply(self, d, state, empty=None, scratch=False, own_state=False):
        out, new = super().apply(d, state, empty, scratch=scratch, own_state=own_state)
        return [2 * o for o in out], new


@pytest.mark.parametrize(
    "rule",
    [
        gameopt.Plain(),
        gameopt.Momentum(0.7),
        gameopt.Momentum(0.7, nesterov=True),
        gameopt.Adam((0.5, 0.9)),
        gameopt.RMSProp(0.8),
        gameopt.RMSProp(0.8, convention="tf1"),
        _DoubledAdam((0.5, 0.9)),
    ],
    ids=repr,
)
@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "small vectors"])
def test_extrapolate_then_resume_give_apply_s_bits_and_leave_the_state(monkeypatch, rule, recompute) -> None:
    """The direction of ``extrapolate`` and the state of ``resume`` are ``apply``'s, bit
    for bit; the committed state is only read; Adam's memo is one vector (not two)
    from ``_RECOMPUTE_FROM`` elements on, the new moments below."""
    import gameopt.updates

    monkeypatch.setattr(gameopt.updates, "_RECOMPUTE_FROM", 0 if recompute else 1 << 62)
    torch.manual_seed(0)
    d = [torch.randn(7, dtype=torch.float64), torch.randn(3, dtype=torch.float32)]
    _, state = rule.apply(d, rule.init(d))  # a state that is not zero
    d = [torch.randn_like(t) for t in d]
    ref_out, ref_state = rule.apply([t.clone() for t in d], state)
    before = {k: [t.clone() for t in v] if isinstance(v, list) else v for k, v in state.items()}
    out, memo = rule.extrapolate([t.clone() for t in d], state)
    if type(rule) is gameopt.Adam:
        assert list(memo) == (["d"] if recompute else ["m", "v", "t"])
    new = rule.resume(memo, state)
    bits = lambda ts: [t.view(torch.int64 if t.dtype == torch.float64 else torch.int32) for t in ts]  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(bits(out), bits(ref_out)))
    assert new.keys() == ref_state.keys()
    for k, v in ref_state.items():
        if isinstance(v, list):
            assert all(torch.equal(a, b) for a, b in zip(bits(new[k]), bits(v)))
        else:
            assert new[k] == v
    for k, v in before.items():
        if isinstance(v, list):
            assert all(torch.equal(a, b) for a, b in zip(bits(state[k]), bits(v)))
        else:
            assert state[k] == v


# ------------------------------------------------------------------ step counts per parameter
class _Growing(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))

    def loss(self) -> torch.Tensor:
        out = ((self.w1 - 0.3) ** 2).sum()
        if hasattr(self, "w2"):
            out = out + ((self.w2 + 0.7) ** 4).sum() + (self.w1.sum() * self.w2.sum())
        return out


def _growing_game(make_rule):
    a, b = _Growing(), _Growing()
    game = gameopt.Game(
        [gameopt.Player(a, name="a"), gameopt.Player(b, name="b")],
        lambda: (a.loss(), b.loss()),
        algorithm=gameopt.SimGD(0.01, update=make_rule()),
    )
    return game, a, b


@pytest.mark.parametrize("how", ["added", "unfrozen"])
def test_adam_counts_steps_per_parameter_like_torch_optim(how):
    """A parameter that joins at step 20 starts with its own bias correction, as with a
    fresh torch.optim.Adam on it, and the others keep theirs."""
    # eps = 0: torch adds ε to the bias-corrected root, gameopt to the raw one (Kingma & Ba's efficient form)
    game, a, b = _growing_game(lambda: gameopt.Adam((0.9, 0.999), eps=0.0))
    ref = _Growing()
    if how == "unfrozen":
        for m in (a, b, ref):
            m.w2 = torch.nn.Parameter(torch.tensor([2.0, 0.1], dtype=torch.float64), requires_grad=False)
    opt1 = torch.optim.Adam([ref.w1], lr=0.01, betas=(0.9, 0.999), eps=0.0)
    for step in range(30):
        if step == 20:
            for m in (a, b, ref):
                if how == "added":
                    m.w2 = torch.nn.Parameter(torch.tensor([2.0, 0.1], dtype=torch.float64))
                else:
                    m.w2.requires_grad_(True)
            opt2 = torch.optim.Adam([ref.w2], lr=0.01, betas=(0.9, 0.999), eps=0.0)
        game.step()
        opts = [opt1] if step < 20 else [opt1, opt2]
        for o in opts:
            o.zero_grad()
        ref.loss().backward()
        for o in opts:
            o.step()
    torch.testing.assert_close(a.w1.detach(), ref.w1.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a.w2.detach(), ref.w2.detach(), rtol=1e-10, atol=1e-12)


def test_per_parameter_counts_survive_a_checkpoint_into_a_game_built_with_every_parameter():
    game, a, b = _growing_game(gameopt.Adam)
    for step in range(8):
        if step == 4:
            for m in (a, b):
                m.w2 = torch.nn.Parameter(torch.tensor([2.0, 0.1], dtype=torch.float64))
        game.step()
    sd = game.state_dict()
    assert isinstance(sd["algorithm"]["state"]["rule"]["t"], list)  # one count per element
    other, c, d = _growing_game(gameopt.Adam)
    for m in (c, d):
        m.w2 = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    other.load_state_dict(sd)
    for _ in range(3):
        game.step()
        other.step()
    assert torch.equal(a.w2.detach(), c.w2.detach()) and torch.equal(b.w1.detach(), d.w1.detach())
    sd["algorithm"]["state"]["rule"]["t"][0][0] = -1.0
    with pytest.raises(ValueError, match=r"rule\.t\[0\]: step counts, must be >= 0"):
        other.load_state_dict(sd)


# ------------------------------------------------------------------ one rule per player
def _per_player_refs():
    from games import RefRule

    return [RefRule("adam", betas=(0.5, 0.9)), RefRule("plain"), RefRule("momentum", momentum=0.7)]


def _per_player_rules():
    return [gameopt.Adam((0.5, 0.9)), gameopt.Plain(), gameopt.Momentum(0.7)]


@pytest.mark.parametrize("algo", ["simgd", "altgd"])
def test_one_update_rule_per_player_matches_its_closed_form(algo):
    """Each player's rule on its own part of ξ (SimGD), or on its ξ at the point left
    by the players before it (AltGD): the closed-form rules of tests/games.py."""
    from games import GAMES

    tg = GAMES["nonquadratic"]()
    lrs = [0.1, 0.05, 0.08]
    make = gameopt.SimGD if algo == "simgd" else gameopt.AltGD
    game = tg.build(make(lrs, update=_per_player_rules()))
    assert isinstance(game.algorithm.rule, gameopt.updates.PerPlayer)
    refs = _per_player_refs()
    ws = [w.clone() for w in tg.init]
    for _ in range(6):
        game.step()
        if algo == "simgd":
            xi = tg.xi_ref(ws)
            ws = [w - lr * ref([x])[0] for w, lr, ref, x in zip(ws, lrs, refs, xi)]
        else:
            for i in range(3):
                ws[i] = ws[i] - lrs[i] * refs[i]([tg.xi_ref(ws)[i]])[0]
        for a, b in zip(tg.params(), ws):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_a_list_of_equal_rules_is_that_one_rule_bit_for_bit():
    from games import GAMES

    runs = []
    for update in (gameopt.Adam((0.5, 0.9)), [gameopt.Adam((0.5, 0.9)) for _ in range(3)]):
        tg = GAMES["nonquadratic"]()
        game = tg.build(gameopt.Extragradient(0.05, update=update))
        assert type(game.algorithm.rule) is gameopt.Adam
        for _ in range(4):
            game.step()
        runs.append(tg.params())
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_per_player_rules_keep_their_settings_in_their_players_groups_and_checkpoints():
    from games import GAMES, assert_same_state

    tg = GAMES["nonquadratic"]()
    game = tg.build(gameopt.Extragradient([0.1, 0.05, 0.08], update=_per_player_rules()))
    groups = game.algorithm.param_groups
    assert groups[0]["betas"] == (0.5, 0.9) and "betas" not in groups[1] and groups[2]["momentum"] == 0.7
    groups[2]["momentum"] = 0.5  # a scheduler's change reaches player 2's rule only
    game.step()
    assert game.algorithm.rule.rules[2].momentum == 0.5
    saved = game.state_dict()
    tg2 = GAMES["nonquadratic"]()
    other = tg2.build(gameopt.Extragradient([0.1, 0.05, 0.08], update=_per_player_rules()))
    other.load_state_dict(saved)
    for _ in range(3):
        game.step()
        other.step()
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), tg2.params()))
    swapped = GAMES["nonquadratic"]().build(
        gameopt.Extragradient([0.1, 0.05, 0.08], update=[gameopt.Plain(), gameopt.Adam((0.5, 0.9)), gameopt.Momentum()])
    )
    before = swapped.state_dict()
    with pytest.raises(ValueError, match=r"rule\.rules\[0\]\.type: 'Adam' in the checkpoint, 'Plain' here"):
        swapped.load_state_dict(saved)
    assert_same_state(swapped.state_dict(), before)


def test_per_player_rules_refuse_a_count_that_does_not_fit_the_game():
    from games import GAMES

    with pytest.raises(ValueError, match="2 rules for 3 players"):
        GAMES["nonquadratic"]().build(gameopt.SimGD(0.1, update=[gameopt.Adam(), gameopt.Plain()]))
    with pytest.raises(TypeError, match=r"update\[1\] must be an UpdateRule"):
        gameopt.SimGD(0.1, update=[gameopt.Adam(), "sgd"])


# ------------------------------------------------------------------ nuPI
def test_nupi_matches_its_equations_and_plain_steps_at_kp_0():
    g = torch.Generator().manual_seed(0)
    ds = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(6)]
    kp, ki, nu = 0.7, 0.6, 0.3
    rule = gameopt.NuPI(kp=kp, ki=ki, ema=nu)
    state = rule.init([torch.zeros(5, dtype=torch.float64)])
    e = torch.zeros(5, dtype=torch.float64)
    for t, d in enumerate(ds):
        out, state = rule.apply([d.clone()], state)
        expected = ki * d if t == 0 else ki * d + kp * (1 - nu) * (d - e)
        e = torch.zeros(5, dtype=torch.float64) if t == 0 else nu * e + (1 - nu) * d
        torch.testing.assert_close(out[0], expected, rtol=1e-14, atol=1e-15)
        torch.testing.assert_close(state["e"][0], e, rtol=1e-14, atol=1e-15)
    plain = gameopt.NuPI(kp=0.0, ki=1.0)
    state = plain.init([torch.zeros(5, dtype=torch.float64)])
    for d in ds:
        out, state = plain.apply([d.clone()], state)
        assert torch.equal(out[0], d)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kp": -0.1}, "kp must be"),
        ({"ki": float("nan")}, "ki must be"),
        ({"ema": 1.0}, "ema must be"),
        ({"ki": 0.0}, "both are 0"),
    ],
)
def test_nupi_refuses_bad_gains(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gameopt.NuPI(**kwargs)


# ------------------------------------------- declared capabilities (issue 24)
class _Halved(gameopt.UpdateRule):
    """A user rule written without the memory flags: out = d / 2 (no state)."""

    def apply(self, d, state, empty=None):
        return gameopt.Vec(x * 0.5 for x in d), state


class _HalvedPlain(gameopt.UpdateRule):
    """The same rule, declaring and taking the flags."""

    memory_flags = True

    def apply(self, d, state, empty=None, scratch=False, own_state=False):
        return gameopt.Vec(x * 0.5 for x in d), state


def test_the_memory_flags_are_declared_not_detected() -> None:
    import gameopt.updates as U

    assert "inspect" not in vars(U)
    for rule in (U.Plain(), U.Momentum(), U.Adam(), U.RMSProp(), gameopt.NuPI(), U.PerPlayer([U.Plain(), U.Adam()])):
        assert rule.memory_flags is True, type(rule).__name__
    assert U.UpdateRule.memory_flags is False and _Halved.memory_flags is False and _HalvedPlain.memory_flags
    assert _DoubledAdam.memory_flags is True

    class AdamWithoutFlags(U.Adam):  # a new apply that does not declare them
        def apply(self, d, state, empty=None):
            return super().apply(d, state, empty)

    class AdamSubclass(U.Adam):  # Adam's apply, so Adam's declaration
        pass

    assert AdamWithoutFlags.memory_flags is False and AdamSubclass.memory_flags is True


@pytest.mark.parametrize(
    "make",
    [gameopt.SimGD, gameopt.Extragradient, gameopt.Optimistic, gameopt.PastExtragradient, gameopt.AltGD],
    ids=lambda m: m.__name__,
)
def test_a_user_rule_without_the_memory_flags_keeps_the_default_contract(make) -> None:
    """Called as apply(d, state, empty) (the flags would raise TypeError), it gives the
    iterates of the same rule that declares and takes them, bit for bit."""
    runs = []
    for rule in (_Halved(), _HalvedPlain()):
        tg = GAMES["nonquadratic"]()
        game = tg.build(make([0.05, 0.07, 0.09], update=rule))
        for _ in range(4):
            game.step()
        runs.append(tg.params())
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "rule, dtype, lost",
    [
        (gameopt.Adam(), torch.float16, True),
        (gameopt.RMSProp(), torch.float16, True),
        (gameopt.RMSProp(convention="tf1"), torch.float16, True),  # 1e-10 inside the root
        (gameopt.Adam(eps=1e-4), torch.float16, False),
        (gameopt.Adam(eps=0.0), torch.float16, False),  # no ε asked for: none lost
        (gameopt.Adam(), torch.bfloat16, False),  # float32's exponents: 1e-8 is kept
        (gameopt.Adam(), torch.float32, False),
        (gameopt.Momentum(0.9), torch.float16, False),
    ],
)
def test_zero_eps_advice_names_an_eps_the_dtype_rounds_to_zero(rule, dtype, lost) -> None:
    from gameopt.updates import zero_eps_advice

    said = zero_eps_advice(rule, dtype)
    assert bool(said) is lost
    assert not lost or f"eps={rule.eps:g} is 0 in float16" in said
