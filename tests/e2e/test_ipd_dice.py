"""experiments.ipd_dice: the vectorized environment, and the CLI as a user runs it
(a few small iterations; resume bit for bit; bad values in one line)."""

from __future__ import annotations

import torch

from experiments import ipd_dice


def test_the_environment_plays_every_episode_at_once_with_each_agents_own_view():
    torch.manual_seed(0)
    coop1, coop2 = torch.ones(5), torch.zeros(5)  # agent 1 always cooperates, agent 2 always defects
    s1, s2, m1, m2 = ipd_dice.sample_episodes(coop1, coop2, batch=7, rounds=4)
    assert s1.shape == (4, 7) and (m1 == 0).all() and (m2 == 1).all()
    assert (s1[0] == 0).all() and (s2[0] == 0).all()  # the start state
    assert (s1[1:] == 2).all() and (s2[1:] == 3).all()  # CD from agent 1's side, DC from agent 2's
    rewards = ipd_dice.REWARDS[2 * m1 + m2]
    assert (rewards[..., 0] == -3).all() and (rewards[..., 1] == 0).all()


def test_moves_follow_the_policies_probabilities():
    torch.manual_seed(1)
    coop = torch.tensor([0.3, 0.9, 0.5, 0.5, 0.1])
    s1, _, m1, _ = ipd_dice.sample_episodes(coop, coop, batch=4000, rounds=1)
    share = (m1 == 0).double().mean()
    assert abs(float(share) - 0.3) < 5 * (0.3 * 0.7 / 4000) ** 0.5


SMALL = ["--batch", "16", "--rounds", "10", "--no-progress", "--checkpoint-every", "2"]


def test_a_resumed_run_matches_an_uninterrupted_one_bit_for_bit(tmp_path, capsys):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for algorithm in ("lola", "naive"):
        args = ["--algorithm", algorithm, *SMALL]
        assert ipd_dice.main([*args, "--steps", "4", "--out", str(straight), "--overwrite"]) == 0
        assert ipd_dice.main([*args, "--steps", "2", "--out", str(resumed), "--overwrite"]) == 0
        assert ipd_dice.main([*args, "--steps", "4", "--out", str(resumed), "--resume"]) == 0
        a = (straight / "metrics.csv").read_text()
        assert a == (resumed / "metrics.csv").read_text() and a.count("\n") == 5
    assert "return per round" in capsys.readouterr().out


def test_bad_values_end_in_one_line_with_exit_2(tmp_path, capsys):
    for args, message in (
        (["--algorithm", "cgd"], "--algorithm must be one of"),
        (["--batch", "0"], "at least 1"),
    ):
        assert ipd_dice.main([*SMALL, *args, "--steps", "1", "--out", str(tmp_path / "r"), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
