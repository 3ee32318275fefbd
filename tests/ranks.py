"""Spawning gloo ranks for the multi-process tests: each rank runs a worker and
writes what it found to a JSON file; the test reads every rank's and asserts."""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, worker: Callable[[int, int, int], dict[str, Any]], world: int, port: int, tmp: str) -> None:
    try:
        results = worker(rank, world, port)
    except Exception:
        results = {"error": traceback.format_exc()}
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(results))
    # The results are written. Leave without the interpreter's teardown: under load,
    # gloo's threads sometimes abort there ("terminate called without an active
    # exception", SIGABRT) after everything finished.
    os._exit(0)


def spawn(
    worker: Callable[[int, int, int], dict[str, Any]], world: int, tmp: Path, timeout: float = 240, may_leave: int = -1
) -> list[dict]:
    """Run ``worker(rank, world, port)`` on ``world`` spawned ranks; every rank's
    results, once all have finished (a rank still running after ``timeout`` seconds
    fails the test: a deadlock). A rank's exception is its results' ``"error"``. Rank
    ``may_leave`` may end without results (``{}``)."""
    port = free_port()
    ctx = mp.spawn(_entry, args=(worker, world, port, str(tmp)), nprocs=world, join=False)
    deadline = time.time() + timeout
    while not ctx.join(timeout=5) and time.time() < deadline:
        pass
    hung = [p for p in ctx.processes if p.is_alive()]
    for p in hung:
        p.kill()
    assert not hung, "a rank hung (deadlock?)"
    results = [
        json.loads((tmp / f"rank{r}.json").read_text()) if r != may_leave or (tmp / f"rank{r}.json").exists() else {}
        for r in range(world)
    ]
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res['error']}"
    return results
