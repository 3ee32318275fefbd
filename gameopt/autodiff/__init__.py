"""The one place that knows autograd's subtleties, one job per module.

* :mod:`.problem`: what autodiff sees of a game (:class:`Problem`, never the ``Game``).
* :mod:`.xi`: first-order ξ into the fused gradient buffers
  (:func:`vector_field`), a backward of each player's loss pruned to its own
  parameters, through ``.grad`` or captured and copied.
* :mod:`.substitution`: the losses run on substituted tensors (a detached alias
  of each parameter, made once per layout, so a kept graph pins no parameter; dual
  tensors), with kernels that have double backward (math attention, mkldnn off).
* :mod:`.joint`: joint vectors from per-parameter tensors and per-parameter views
  of joint vectors, outside any graph.
* :mod:`.engine`: reverse-mode products handed to autograd's engine without
  ``autograd.grad``'s per-tensor Python checks.
* :mod:`.forward`: J v by forward-over-reverse (dual tensors).
* :mod:`.linearization`: ξ with its graph and the Jacobian products of a general
  game (:class:`GeneralLinearization`), and :func:`linearize`.
* :mod:`.zero_sum`: the same for a two-player zero-sum game (f, −f), every product a
  Hessian-vector product of f (:class:`ZeroSumLinearization`).

Both linearizations implement :class:`gameopt.protocols.Linearization`. Every
evaluation runs inside the step's :class:`~gameopt.evaluation.Evaluations` (same
random numbers, module buffers moved once); a re-evaluation with dual tensors falls
back to the double-vjp trick only where PyTorch reports an op without a
forward-mode formula, never on the user's errors.
"""

from .linearization import GeneralLinearization, linearize
from .problem import ForwardMode, Problem
from .xi import vector_field
from .zero_sum import ZeroSumLinearization

__all__ = ["ForwardMode", "GeneralLinearization", "Problem", "ZeroSumLinearization", "linearize", "vector_field"]
