"""Every figure on a docs page is current: its numbers, committed beside it in
figures/, equal those of a fresh run of the code that makes it, at a size that fits
the suite (the first steps of one run, or one of the runs the figure draws).

Where a figure's full run is deterministic on one machine and cheap, it is rerun as
committed; otherwise the check reruns a prefix. Long or chaotic runs end where the
CPU's vector kernels take them (a GAN after 2,000 steps, SOS on the IPD), so exact
equality is asserted only for short float64 runs of smooth dynamics; otherwise the
tolerances below hold across CPUs and fail on any change of the code's numbers.
Figures made by the docs build itself (the gallery, docs/examples/) need no check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "figures"


def _committed(name: str):
    return json.loads((FIGURES / name).read_text())


# ------------------------------------------------------------------------- demo
def test_the_demo_figure_was_made_with_the_demo_defaults() -> None:
    from experiments import demo

    record = _committed("demo_ring.json")
    assert (FIGURES / "demo_ring.png").is_file()
    assert (record["steps"], record["seed"], record["eval_every"]) == (demo.STEPS, demo.SEED, demo.EVAL_EVERY)
    assert (record["std"], record["batch"], record["eval_samples"]) == (demo.STD, demo.BATCH, demo.EVAL_SAMPLES)
    assert list(record["algorithms"]) == list(demo.ALGORITHMS)
    for entry in record["algorithms"].values():
        curve = entry["curve"]
        assert curve["step"] == [*range(0, demo.STEPS + 1, demo.EVAL_EVERY)]
        assert all(len(curve[key]) == len(curve["step"]) for key in ("modes", "high_quality", "mean_radius"))
        assert all(0 <= m <= 8 for m in curve["modes"]) and all(0 <= q <= 100 for q in curve["high_quality"])


@pytest.mark.parametrize("name", ["Adam", "SimGD (SGD)"])
def test_the_demo_curves_start_as_a_fresh_run(name: str) -> None:
    """The first 200 steps (three points of the curve: steps 0, 100, 200) of a fresh run."""
    from experiments import demo

    record = _committed("demo_ring.json")
    steps = 2 * record["eval_every"]
    fresh = demo.train((name, steps, record["seed"], record["eval_every"]))["curve"]
    committed = {key: values[:3] for key, values in record["algorithms"][name]["curve"].items()}
    assert fresh["step"] == committed["step"] == [0, record["eval_every"], steps]
    # the mean distance of the 2,500 samples from the origin moves with any change of the run
    assert fresh["mean_radius"] == pytest.approx(committed["mean_radius"], rel=1e-3)
    # 0.5 points of high quality are 12 samples; a mode's count may cross its threshold by one sample
    assert fresh["high_quality"] == pytest.approx(committed["high_quality"], abs=0.5)
    assert all(abs(a - b) <= 1 for a, b in zip(fresh["modes"], committed["modes"]))
