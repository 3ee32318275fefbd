"""Diagnostics against explicit Jacobians."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch
from games import GAMES

import gameopt

matplotlib.use("Agg")


@pytest.mark.parametrize("game_name", list(GAMES))
def test_operator_and_spectrum_match_the_explicit_jacobian(game_name) -> None:
    tg = GAMES[game_name]()
    game = tg.build(gameopt.SimGD(0.1))
    J = tg.jac_ref(tg.params()).numpy()
    op = game.jacobian_operator()
    rng = np.random.default_rng(0)
    v = rng.standard_normal(J.shape[0])
    np.testing.assert_allclose(op.matvec(v), J @ v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.rmatvec(v), J.T @ v, rtol=1e-12, atol=1e-12)
    got = gameopt.diagnostics.eigenvalues(game)
    want = np.linalg.eigvals(J)
    np.testing.assert_allclose(np.sort_complex(got), np.sort_complex(want), rtol=1e-9, atol=1e-9)


def test_iterative_spectrum_for_larger_games() -> None:
    tg = GAMES["quadratic"](n_players=4, dim=60)
    game = tg.build(gameopt.SimGD(0.1))
    J = tg.jac_ref(tg.params()).numpy()
    got = gameopt.diagnostics.eigenvalues(game, k=4, dense_below=10)
    want = np.linalg.eigvals(J)
    want = want[np.argsort(-np.abs(want))][:4]
    np.testing.assert_allclose(np.sort(np.abs(got)), np.sort(np.abs(want)), rtol=1e-6)


def test_bilinear_game_is_pure_rotation_and_decomposition_matches() -> None:
    tg = GAMES["bilinear"]()
    game = tg.build(gameopt.SimGD(0.1))
    vals = gameopt.diagnostics.eigenvalues(game)
    np.testing.assert_allclose(np.real(vals), 0, atol=1e-10)  # zero-sum bilinear: no potential
    d = gameopt.diagnostics.decompose(game)
    ws = tg.params()
    xi = torch.cat(tg.xi_ref(ws)).numpy()
    J = tg.jac_ref(ws).numpy()
    A = 0.5 * (J - J.T)
    assert d.xi_norm == pytest.approx(np.linalg.norm(xi))
    assert d.hamiltonian == pytest.approx(0.5 * xi @ xi)
    assert d.potential == pytest.approx(0.0, abs=1e-12)
    assert d.rotation == pytest.approx(np.linalg.norm(A @ xi) / np.linalg.norm(xi))


def test_quadratic_game_potential_part() -> None:
    tg = GAMES["quadratic"]()
    game = tg.build(gameopt.SimGD(0.1))
    ws = tg.params()
    xi = torch.cat(tg.xi_ref(ws)).numpy()
    J = tg.jac_ref(ws).numpy()
    d = gameopt.diagnostics.decompose(game)
    assert d.potential == pytest.approx(xi @ J @ xi / (xi @ xi))
    assert d.sym_norm == pytest.approx(np.linalg.norm(0.5 * (J + J.T) @ xi))


def test_plot_spectrum(tmp_path) -> None:
    tg = GAMES["nonquadratic"]()
    game = tg.build(gameopt.SimGD(0.1))
    ax = gameopt.diagnostics.plot_spectrum(gameopt.diagnostics.eigenvalues(game), label="start")
    assert ax.get_xlabel().startswith("Re") and ax.get_ylabel().startswith("Im") and ax.get_title()
    ax.figure.savefig(tmp_path / "spectrum.png")
    assert (tmp_path / "spectrum.png").stat().st_size > 1000
