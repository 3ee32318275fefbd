"""Experiments run as a user would: command line, bad values, kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from experiments import bilinear
from experiments.common import checkpoint_bytes, read_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


# (module, arguments for a run that lasts a few seconds, metrics rows before the kill).
# Only equalities between two runs on this machine: where a long or chaotic run
# ends depends on the CPU's vector kernels (SOS on the IPD at lr 1 ended at loss
# 1.19 here and 1.24 elsewhere).
KILLABLE = [
    (
        "experiments.bilinear",
        ["--algorithm", "optimisticadam", "--lr", "0.01", "--steps", "6000", "--checkpoint-every", "300"],
        900,
    ),
    (
        "experiments.mixture_gan",
        ["--algorithm", "optimisticadam", "--hidden", "32", "--batch", "64", "--steps", "1500"]
        + ["--log-every", "1", "--checkpoint-every", "100"],
        400,
    ),
    (
        "experiments.opponent_shaping",
        ["--game", "ipd", "--algorithm", "sos", "--steps", "800", "--checkpoint-every", "50"],
        250,
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("module, args, rows", KILLABLE, ids=[k[0] for k in KILLABLE])
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, module, args, rows) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start(out: Path) -> subprocess.Popen:
        cmd = [sys.executable, "-m", module, *args, "--out", str(out), "--no-progress"]
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    uninterrupted, proc = start(straight), start(killed)  # side by side
    ckpt = killed / "checkpoint.pt"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and (killed / "metrics.csv").exists():
            if (killed / "metrics.csv").read_text().count("\n") > rows:  # a few checkpoints in
                break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert not (killed / "summary.json").exists()
    saved_step = read_checkpoint(ckpt)["step"]
    assert 0 < saved_step < int(args[args.index("--steps") + 1])
    assert uninterrupted.wait(timeout=300) == 0, uninterrupted.stderr.read()
    uninterrupted.stderr.close()

    res = _run(module, *args, "--out", str(killed), "--no-progress", "--resume")
    assert res.returncode == 0, res.stderr
    a = json.loads((straight / "summary.json").read_text())
    b = json.loads((killed / "summary.json").read_text())
    assert a == b  # final parameters (or their digest) and metrics, bit for bit
    assert (straight / "metrics.csv").read_text() == (killed / "metrics.csv").read_text()


def _bilinear(capsys, *args: str) -> tuple[int, str]:
    """experiments.bilinear in this process: (exit code, stderr)."""
    code = bilinear.main([*args, "--no-progress"])
    return code, capsys.readouterr().err


def test_damaged_or_foreign_checkpoints_are_refused(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    base = ["--steps", "50", "--checkpoint-every", "10", "--out", str(out)]
    assert _bilinear(capsys, *base)[0] == 0
    good = (out / "checkpoint.pt").read_bytes()
    # another configuration
    code, err = _bilinear(capsys, *base, "--lr", "0.05", "--resume")
    assert code == 2 and "another configuration" in err
    # truncated
    (out / "checkpoint.pt").write_bytes(good[: len(good) // 2])
    code, err = _bilinear(capsys, *base, "--resume")
    assert code == 2 and "damaged" in err and len(err.strip().splitlines()) == 1
    # another experiment's (intact) checkpoint
    (out / "checkpoint.pt").write_bytes(checkpoint_bytes({"experiment": "mixture_gan", "step": 10}))
    code, err = _bilinear(capsys, *base, "--resume")
    assert code == 2 and "mixture_gan" in err


def test_flipped_bytes_are_caught_and_the_previous_checkpoint_resumes(tmp_path, capsys) -> None:
    """torch.load does not check a zip's CRCs: 20 flipped bytes in the parameters
    used to resume silently. The sha256 catches them; checkpoint.prev.pt, renamed,
    continues the run bit for bit."""
    out, straight = tmp_path / "run", tmp_path / "straight"
    assert _bilinear(capsys, "--steps", "50", "--checkpoint-every", "10", "--out", str(straight))[0] == 0
    assert _bilinear(capsys, "--steps", "30", "--checkpoint-every", "10", "--out", str(out))[0] == 0
    ckpt, prev = out / "checkpoint.pt", out / "checkpoint.prev.pt"
    assert read_checkpoint(ckpt)["step"] == 30 and read_checkpoint(prev)["step"] == 20
    raw = bytearray(ckpt.read_bytes())
    x = read_checkpoint(ckpt)["game"]["players"][0]["params"][0]
    at = raw.find(x.numpy().tobytes())  # x's 80 bytes of float64 data, stored verbatim
    assert at > 0
    for i in range(at + 30, at + 50):
        raw[i] ^= 0xFF
    ckpt.write_bytes(bytes(raw))
    torch.load(ckpt, weights_only=True)  # still loads: only the checksum tells
    code, err = _bilinear(capsys, "--steps", "50", "--checkpoint-every", "10", "--out", str(out), "--resume")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "damaged" in err and "checkpoint.prev.pt (step 20) is intact" in err and "rename it" in err
    prev.rename(ckpt)  # what the message says to do
    code, err = _bilinear(capsys, "--steps", "50", "--checkpoint-every", "10", "--out", str(out), "--resume")
    assert code == 0, err
    assert (out / "summary.json").read_text() == (straight / "summary.json").read_text()
    assert (out / "metrics.csv").read_text() == (straight / "metrics.csv").read_text()
    # both damaged: start over
    ckpt.write_bytes(b"garbage")
    prev.write_bytes(b"garbage")
    code, err = _bilinear(capsys, "--steps", "50", "--out", str(out), "--resume")
    assert code == 2 and "damaged too" in err and "--overwrite" in err


def test_a_fresh_run_does_not_mix_with_the_run_in_its_folder(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert _bilinear(capsys, "--steps", "8", "--out", str(out))[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, err = _bilinear(capsys, "--steps", "5", "--out", str(out))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched
    # a run killed before its first checkpoint left only its config: refused too
    (out / "checkpoint.pt").unlink()
    (out / "checkpoint.prev.pt").unlink()
    (out / "metrics.csv").unlink()
    (out / "summary.json").unlink()
    assert _bilinear(capsys, "--steps", "5", "--out", str(out))[0] == 2
    code, err = _bilinear(capsys, "--steps", "5", "--out", str(out), "--resume")
    assert code == 2 and "no checkpoint" in err and "--overwrite" in err
    # --overwrite starts over: nothing of the old run is left
    assert _bilinear(capsys, "--steps", "5", "--out", str(out), "--overwrite")[0] == 0
    assert (out / "metrics.csv").read_text().count("\n") == 6
    assert json.loads((out / "summary.json").read_text())["config"]["experiment"] == "bilinear"
    assert read_checkpoint(out / "checkpoint.pt")["step"] == 5


def test_resume_refuses_a_checkpoint_past_steps(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert _bilinear(capsys, "--steps", "20", "--out", str(out))[0] == 0
    code, err = _bilinear(capsys, "--steps", "10", "--out", str(out), "--resume")
    assert code == 2 and "at step 20, past --steps 10" in err
    assert _bilinear(capsys, "--steps", "20", "--out", str(out), "--resume")[0] == 0  # nothing left to do


@pytest.mark.slow
def test_one_run_per_folder_and_a_killed_runs_lock_is_taken_over(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "experiments.bilinear", "--steps", "10000000", "--checkpoint-every", "500"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([*cmd, "--out", str(out), "--no-progress"], cwd=ROOT, env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not (out / "checkpoint.pt").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert proc.poll() is None
        for flag in ("--resume", "--overwrite"):
            code, err = _bilinear(capsys, "--steps", "1", "--out", str(out), flag)
            assert code == 2 and "in use by another run" in err and len(err.strip().splitlines()) == 1
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert (out / "config.json").exists()  # --overwrite did not touch the running run's files
    stale = out / ".checkpoint.pt.0123456789ab.tmp"  # as a kill in the middle of a write leaves
    stale.write_bytes(b"partial")
    step = read_checkpoint(out / "checkpoint.pt")["step"]
    code, err = _bilinear(capsys, "--steps", str(step), "--out", str(out), "--resume")
    assert code == 0, err
    assert not stale.exists()
    assert (out / "metrics.csv").read_text().count("\n") == step + 1


@pytest.mark.slow
def test_a_full_disk_ends_the_run_in_one_line_and_keeps_the_last_checkpoint(tmp_path, capsys) -> None:
    """A file-size limit (as a full disk) stops the third checkpoint's write."""
    import resource

    small = tmp_path / "small"
    assert _bilinear(capsys, "--steps", "20", "--checkpoint-every", "10", "--out", str(small))[0] == 0
    limit = (small / "checkpoint.pt").stat().st_size + 100  # the step-20 checkpoint fits, step 30's not

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (Python ignores it anyway)

    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "experiments.bilinear", "--steps", "100", "--checkpoint-every", "10"]
        + ["--out", str(out), "--no-progress"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
        preexec_fn=limited,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert "could not write the checkpoint of step 30" in res.stderr and "step 20" in res.stderr
    assert read_checkpoint(out / "checkpoint.pt")["step"] == 20
    assert read_checkpoint(out / "checkpoint.prev.pt")["step"] == 10
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no temporary file
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algorithm", "nope"], "unknown algorithm"),
        (["--lr", "-0.1"], "--lr must be positive"),
        (["--lr", "inf"], "--lr must be positive and finite"),
        (["--lr", "nan"], "--lr must be positive and finite"),
        (["--lr", "0.1", "0.1", "0.1"], "3 learning rates for 2 players"),
        (["--steps", "0"], "--steps must be positive"),
        (["--out", "/nonexistent/dir/run"], "does not exist"),
        (["--hp", "gamma"], "KEY=VALUE"),
        (["--algorithm", "sga", "--hp", "gamma=1"], "no hyperparameter"),
        (["--algorithm", "lookahead-simgd", "--hp", "k=0"], "k must be"),
        (["--algorithm", "lookahead-simgd", "--hp", "alpha_la=2"], "alpha"),
        (["--algorithm", "eg", "--hp", "extrapolation_lr=-1"], "extrapolation_lr"),
        (["--resume", "--overwrite"], "pass one of them"),
    ],
)
def test_bad_command_lines_give_one_line_and_exit_2(tmp_path, capsys, args, message) -> None:
    code, err = _bilinear(capsys, "--out", str(tmp_path / "r"), *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_an_int_is_a_number(tmp_path, capsys) -> None:
    args = ["--algorithm", "eg", "--hp", "extrapolation_lr=1", "--steps", "2", "--out", str(tmp_path / "r")]
    code, err = _bilinear(capsys, *args)
    assert code == 0, err


# every experiment builds its game inside building_game: a per-player length that
# does not fit the game is a usage error, not a traceback
@pytest.mark.parametrize(
    "module, lrs",
    [
        ("experiments.bilinear", 3),
        ("experiments.dirac_gan", 3),
        ("experiments.n_player", 3),  # 4 players by default
        ("experiments.opponent_shaping", 3),
        ("experiments.spectrum", 3),
        ("experiments.mixture_gan", 3),
        ("experiments.digits_gan", 3),
        ("experiments.matrix_games", 3),
        ("experiments.constrained_learning", 3),
    ],
)
def test_per_player_values_that_do_not_fit_the_game_give_exit_2(tmp_path, capsys, module, lrs) -> None:
    import importlib

    threads = torch.get_num_threads()
    try:
        code = importlib.import_module(module).main(["--lr", *["0.1"] * lrs, "--out", str(tmp_path / "r")])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert code == 2 and f"{lrs} learning rates" in err and len(err.strip().splitlines()) == 1


def test_atomic_save_never_leaves_a_partial_file(tmp_path, monkeypatch) -> None:
    from experiments.common import atomic_save

    path = tmp_path / "ckpt.pt"
    atomic_save({"a": torch.ones(3)}, path)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_save({"a": torch.zeros(3)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left


@pytest.mark.slow
def test_bilinear_smoke_and_help(tmp_path) -> None:
    res = _run("experiments.bilinear", "--help")
    assert res.returncode == 0 and "--algorithm" in res.stdout
    res = _run(
        "experiments.bilinear", "--algorithm", "cgd", "--steps", "5", "--out", str(tmp_path / "r"), "--no-progress"
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "r" / "metrics.csv").read_text().count("\n") == 6


# ------------------------------------------- unusable run folders (issue 22)
def _listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("where", ["file", "under-file", "resume-file"])
def test_a_file_in_the_way_of_the_run_folder_gives_one_line_and_exit_2(tmp_path, capsys, where) -> None:
    (tmp_path / "afile").write_bytes(b"not a folder")
    out = {"file": "afile", "under-file": "afile/run", "resume-file": "afile"}[where]
    extra = ["--resume"] if where == "resume-file" else []
    before = _listing(tmp_path)
    code, err = _bilinear(capsys, "--steps", "3", "--out", str(tmp_path / out), *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "afile" in err, err
    assert _listing(tmp_path) == before  # nothing changed


@pytest.mark.parametrize("failing", ["lock", "mkdir", "config"])
def test_a_run_folder_without_permission_gives_one_line_and_exit_2(tmp_path, capsys, monkeypatch, failing) -> None:
    """A read-only folder, or no permission: simulated (as root, permissions do not stop writes)."""
    import errno

    import experiments.common as common

    out = tmp_path / "run"
    if failing != "mkdir":
        out.mkdir()
    real_open, real_mkdir = os.open, Path.mkdir

    def refused(path) -> OSError:
        return PermissionError(errno.EACCES, "Permission denied", str(path))

    def no_lock(path, *args, **kwargs):
        if Path(path).name in ("run.lock", *common.RUN_FILES) or ".tmp" in Path(path).name:
            raise refused(path)
        return real_open(path, *args, **kwargs)

    def no_mkdir(self, *args, **kwargs):
        if self == out:
            raise refused(self)
        return real_mkdir(self, *args, **kwargs)

    if failing == "lock":
        monkeypatch.setattr(common.os, "open", no_lock)
    elif failing == "mkdir":
        monkeypatch.setattr(Path, "mkdir", no_mkdir)
    else:  # the lock is taken, then the folder refuses new files
        real_builtin_open = open

        def no_files(path, mode="r", *args, **kwargs):
            if str(path).startswith(str(out)) and any(m in mode for m in "wxa"):
                raise refused(path)
            return real_builtin_open(path, mode, *args, **kwargs)

        monkeypatch.setattr("builtins.open", no_files)
    before = _listing(tmp_path)
    code, err = _bilinear(capsys, "--steps", "3", "--out", str(out))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Permission denied" in err, err
    after = _listing(tmp_path)
    after.pop("run/run.lock", None)  # the lock file (empty), where the lock was taken
    assert after == before  # nothing written


def test_an_os_error_elsewhere_is_not_taken_for_the_run_folder(tmp_path, monkeypatch) -> None:
    import experiments.common as common

    def broken(argv):
        common._run_folder = tmp_path / "run"
        raise FileNotFoundError(2, "No such file or directory", "/elsewhere/data.csv")

    with pytest.raises(FileNotFoundError):
        common.main_guard(broken)([])


@pytest.mark.parametrize("name, hyper", [("extraadam", {}), ("simgd", {"momentum": 0.5})], ids=["adam", "momentum"])
def test_make_algorithm_refuses_to_replace_an_update_rule_the_run_sets(name, hyper) -> None:
    """A run that sets the update rule itself (the constrained run's dual rule) is not
    silently overridden by an Adam variant or ``--hp momentum``."""
    import gameopt
    from experiments.common import UsageError, make_algorithm

    with pytest.raises(UsageError, match="sets the update rule"):
        make_algorithm(name, [0.1, 0.1], {**hyper, "update": [gameopt.Plain(), gameopt.NuPI()]})
    make_algorithm(name, [0.1, 0.1], hyper)  # without a rule of the run's own, as before
