"""Micro-benchmarks for gameopt (run as ``python3 -m benchmarks.<name>``).

* ``benchmarks.flat_update``: vector updates on fused flat buffers vs. per-parameter
  loops, ``torch._foreach_*`` and cat/split, against the memory-bandwidth limit.
* ``benchmarks.step_cost``: the cost of one ``Game.step`` per algorithm, as a
  multiple of one hand-written evaluation of the vector field ξ into hand-fused
  buffers, beside the same algorithms written the obvious way (per-parameter
  loop, ``torch._foreach_*``, ``torch.cat``) and cooper's extragradient optimizers.
* ``benchmarks.second_order``: the second-order methods the same way, hand-rolled
  consensus and SGA, ACGD against ``cgds``, reverse passes against players.
* ``benchmarks.scaling``: cost against the number of players and of parameters,
  vectors kept and peak memory per step.
* ``benchmarks.distributed``: steps on 1 and 2 gloo ranks, collectives per step.
* ``benchmarks.gpu`` (via ``benchmarks/gpu.sh``): the table on a CUDA GPU with a
  DCGAN-size pair, peak memory, and a 10^8-parameter bandwidth test.

All interleave the candidates with their baseline (A B, B A, A B, ...) and report
medians and the median of per-round ratios; see :mod:`benchmarks._common`.
"""
