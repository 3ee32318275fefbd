"""Running the losses on other tensors than the parameters: substituted values (the
aliases kept graphs are built on, dual tensors), and the kernels that have double
backward."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from torch import Tensor

from .. import _torch_compat as tc
from .problem import Problem


@contextlib.contextmanager
def substituted(problem: Problem, values: dict[int, Tensor]) -> Iterator[None]:
    """Let the modules use ``values[id(param)]`` in place of their parameters."""
    places = problem.registrations
    try:
        for sub, name, p in places:
            # in the dict itself (as torch.func.functional_call does): the module's
            # parameter order stays; looked up each time (a module's dict may be new)
            tc.parameter_registry(sub)[name] = values[id(p)]
        yield
    finally:
        for sub, name, p in places:
            tc.parameter_registry(sub)[name] = p


def graph_inputs(
    problem: Problem, params: Sequence[Sequence[Tensor]]
) -> tuple[list[list[Tensor]], contextlib.AbstractContextManager[None]]:
    """What a kept graph is built on, for each list of ``params``, and the context
    the losses run in. With modules: the problem's detached alias of each parameter
    (``Problem.aliases``), substituted for it, so that the graph pins no
    parameter (gameopt could not fuse it again while the graph lives). Players
    given as tensors: the tensors themselves."""
    if not problem.functional:
        return [list(ps) for ps in params], contextlib.nullcontext()
    aliases = problem.aliases
    return [[aliases[id(p)] for p in ps] for ps in params], substituted(problem, aliases)


@contextlib.contextmanager
def jacobian_mode(problem: Problem) -> Iterator[None]:
    """Kernels with double backward: the math attention backend, and mkldnn off where
    a recurrent layer would use its (forward-AD-less) CPU kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rnn = problem.recurrent
    with tc.mkldnn_disabled(bool(rnn)), sdpa_kernel(SDPBackend.MATH):
        yield
