"""Micro-benchmarks for gameopt (run as ``python3 -m benchmarks.<name>``).

* ``benchmarks.flat_update``: vector updates on fused flat buffers vs. per-parameter
  loops, ``torch._foreach_*`` and cat/split, against the memory-bandwidth limit.
* ``benchmarks.step_cost``: the cost of one ``Game.step`` per algorithm, as a
  multiple of one hand-written evaluation of the vector field ξ, and against
  cooper's extragradient optimizers.

Both interleave the candidates with their baseline (A B, B A, A B, ...) and report
medians and the median of per-round ratios; see :mod:`benchmarks._common`.
"""
