"""Every use of PyTorch's private API in gameopt, behind one gate.

The rest of the package reaches torch's private names only through this module (a
test scans the package's code for any other use). Each entry says what it is for,
which torch versions it was checked on (2.4.1, the oldest supported; 2.13.0; 2.14.1,
the newest that installs on the project's machines), and its public fallback where
one exists. With the environment variable ``GAMEOPT_TORCH_PUBLIC=1`` every entry
that has a fallback takes it (read once, at import): the test suite runs a part of
itself that way on the default torch, so the fallbacks never rot.

Left out on purpose: ``nn.Module._parameters``, ``_buffers`` and ``_modules``, the
module's own registries, which gameopt reads and (for Jacobian products)
substitutes into exactly as ``torch.func.functional_call`` does; they have been the
same dicts since torch 1.0, and every torch version above runs the suite.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.autograd import forward_ad
from torch.autograd.graph import increment_version
from torch.utils._python_dispatch import TorchDispatchMode  # every ATen op, for counting (gameopt.testing.traffic)

__all__ = [
    "FSDP_PUBLIC",
    "INPLACE_VIEW_TAG",
    "PUBLIC_ONLY",
    "SEEDED_TAG",
    "TORCH_VERSION",
    "TorchDispatchMode",
    "compiled_original",
    "eager_named_modules",
    "default_store",
    "disabled_torch_function_impl",
    "dtensor_type",
    "engine_on_caller",
    "engine_run_backward",
    "flatten_dense",
    "foreach_add",
    "foreach_add_",
    "foreach_addcmul_",
    "foreach_copy_",
    "foreach_div",
    "foreach_div_",
    "foreach_lerp_",
    "foreach_mul",
    "foreach_mul_",
    "foreach_neg",
    "foreach_reciprocal",
    "foreach_sqrt",
    "foreach_sub",
    "foreach_sub_",
    "foreach_zero_",
    "fsdp_params",
    "fused_add_unless_",
    "local_shard",
    "make_dual",
    "mkldnn_disabled",
    "op_arguments",
    "optimizer_step_unobserved",
    "persistent_buffer_names",
    "place_shard",
    "post_accumulate_grad_hooks",
    "rehome_hooks",
    "rnn_flat_weights_cleared",
    "rnn_flat_weights_init",
    "shard_length",
    "sharded_dtensor",
    "unflatten_dense",
    "unsharded_param",
    "use_count",
    "version",
    "view_base",
]

#: (major, minor) of the running torch.
TORCH_VERSION: tuple[int, int] = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())  # type: ignore[union-attr, assignment]

#: Take the public fallback wherever one exists (``GAMEOPT_TORCH_PUBLIC=1``).
PUBLIC_ONLY: bool = os.environ.get("GAMEOPT_TORCH_PUBLIC", "") == "1"


# ----------------------------------------------------------------- foreach kernels
# torch._foreach_*: torch.optim's multi-tensor kernels (one dispatch per op over a
# list of tensors). Checked on 2.4.1, 2.13.0, 2.14.1. Fallback: a Python loop over
# the tensors with the same in-place or out-of-place method.
def _looped(method: str) -> Callable[..., Any]:
    def apply(tensors: Sequence[Tensor], *others: Any, **kwargs: Any) -> list[Tensor]:
        per = [o if isinstance(o, (list, tuple)) else [o] * len(tensors) for o in others]
        return [getattr(t, method)(*args, **kwargs) for t, *args in zip(tensors, *per)]

    return apply


def _foreach(name: str) -> Callable[..., Any]:
    """``torch._foreach_<name>``, or its public fallback (:func:`_looped`)."""
    kernel = getattr(torch, f"_foreach_{name}", None)
    return kernel if kernel is not None and not PUBLIC_ONLY else _looped(name)


foreach_add = _foreach("add")
foreach_add_ = _foreach("add_")
foreach_addcmul_ = _foreach("addcmul_")
foreach_copy_ = _foreach("copy_")


def fused_add_unless_(xs: Sequence[Tensor], ds: Sequence[Tensor], alpha: float, found_inf: Tensor) -> None:
    """In place, each ``x += alpha · d`` unless ``found_inf`` (a 0-d float32 tensor on
    the tensors' device) is nonzero, decided on the device: ``torch._fused_sgd_`` with
    ``lr = −alpha``, the kernel that skips a step when a ``GradScaler`` found an
    overflow (one launch for all); each ``x``'s version counter moves by one as with an
    in-place add (the kernel leaves it). On the CPU, ``x − (−alpha)·d`` is ``x + alpha·d``
    bit for bit in float32 and float64; the CUDA kernel forms ``alpha·d`` in double.
    Checked on 2.4.1, 2.13.0, 2.14.1. The CPU kernel for float16 and bfloat16 writes
    wrong values (torch 2.13: vectors of 16 elements or more left unmoved or garbled),
    so there, as where the kernel is missing: ``torch.where`` (a temporary and a copy;
    the host verdict's rounding)."""
    fused = getattr(torch, "_fused_sgd_", None)
    if fused is not None and not PUBLIC_ONLY and not (xs[0].is_cpu and xs[0].dtype in (torch.float16, torch.bfloat16)):
        fused(
            list(xs), list(ds), [], weight_decay=0.0, momentum=0.0, lr=-alpha, dampening=0.0,
            nesterov=False, maximize=False, is_first_step=False, found_inf=found_inf,
        )  # fmt: skip
        for x in xs:
            increment_version(x)  # the fused kernel does not: a graph that saved x must see the write
        return
    for x, d in zip(xs, ds):
        x.copy_(torch.where(found_inf > 0, x, torch.add(x, d, alpha=alpha)))


foreach_div = _foreach("div")
foreach_div_ = _foreach("div_")
foreach_lerp_ = _foreach("lerp_")
foreach_mul = _foreach("mul")
foreach_mul_ = _foreach("mul_")
foreach_neg = _foreach("neg")
foreach_reciprocal = _foreach("reciprocal")
foreach_sqrt = _foreach("sqrt")
foreach_sub = _foreach("sub")
foreach_sub_ = _foreach("sub_")
foreach_zero_ = _foreach("zero_")


# --------------------------------------------------------------- autograd's engine
# torch.autograd.graph._engine_run_backward: what torch.autograd.grad calls after its
# Python-side check of every (output, grad_output) pair.
# Present from torch 2.3; checked on 2.4.1, 2.13.0, 2.14.1. Fallback (None here):
# the caller takes torch.autograd.grad.
engine_run_backward: Callable[..., tuple[Tensor | None, ...]] | None
try:
    from torch.autograd.graph import _engine_run_backward as engine_run_backward
except ImportError:  # pragma: no cover - torch < 2.3
    engine_run_backward = None
if PUBLIC_ONLY:
    engine_run_backward = None

# The engine itself, for a backward that only the calling thread runs. Around the
# engine's ``run_backward``, torch's wrapper above does two things: it walks its
# logger's hierarchy to attach logging hooks to the graph when that logger is at
# DEBUG (2.4.1, 2.13.0, 2.14.1), and it stashes the caller's ``contextvars`` for
# the engine's device threads (2.13.0, 2.14.1; read by AOT-autograd's compiled
# backward). With the logger quiet (``isEnabledFor``: cached per logger) and every
# node run by the calling thread, whose context is the caller's, neither does
# anything, yet both cost, on a small game, a tenth of a whole step. The caller
# knows the graph's tensors are on the CPU and CUDA is not initialized; a graph that
# crosses to another accelerator between CPU parameters and a CPU loss runs there
# without the stashed context, as every backward did under 2.4.1. Checked on
# 2.4.1, 2.13.0, 2.14.1. Fallback: the wrapper (``engine_run_backward``).
_autograd_graph_log = logging.getLogger("torch.autograd.graph")
_engine = None if engine_run_backward is None else getattr(torch.autograd.Variable, "_execution_engine", None)


def engine_on_caller() -> Callable[..., tuple[Tensor | None, ...]] | None:
    """The engine's ``run_backward`` (the arguments of :data:`engine_run_backward`,
    all positional) for graphs that only the calling thread runs (their tensors on
    the CPU, CUDA not initialized), or ``None`` when torch's wrapper must run (its
    autograd logger is at DEBUG, or no engine entry point). Ask once per evaluation."""
    if _engine is None or _autograd_graph_log.isEnabledFor(logging.DEBUG):
        return None
    return _engine.run_backward


# ------------------------------------------------------------- torch.optim's step
# torch.optim.Optimizer wraps every subclass's ``step`` (``profile_hook_step``): a
# profiler range, the global and per-optimizer step hooks, and
# ``_optimizer_step_code`` (empty, for the profiler). An LR scheduler patches the
# instance's ``step`` to count calls. With none of them in play the wrapper does
# nothing but cost a profiler range. Reads ``_global_optimizer_pre_hooks`` /
# ``_post_hooks`` (torch.optim.optimizer), the optimizer's
# ``_optimizer_step_pre_hooks`` / ``_post_hooks`` and
# ``torch._C._autograd._profiler_enabled``; checked on 2.13.0, present since 2.0.
# Fallback: always the wrapper.
try:
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    _profiler_enabled: Callable[[], bool] | None = torch._C._autograd._profiler_enabled
except (ImportError, AttributeError):  # pragma: no cover - a torch that moved them
    _profiler_enabled = None


def optimizer_step_unobserved(optimizer: torch.optim.Optimizer) -> bool:
    """True when nothing observes ``optimizer.step``: no step hook (global or the
    optimizer's own), no patch of the instance's ``step`` (an LR scheduler's) and no
    profiler running. The undecorated step then does all that ``step`` would."""
    if _profiler_enabled is None or PUBLIC_ONLY:
        return False
    own = vars(optimizer)
    return not (
        _global_optimizer_pre_hooks
        or _global_optimizer_post_hooks
        or own.get("_optimizer_step_pre_hooks", True)
        or own.get("_optimizer_step_post_hooks", True)
        or "step" in own
        or _profiler_enabled()
    )


# ----------------------------------------------------------- flat packing of tensors
# torch._C._nn.flatten_dense_tensors / unflatten_dense_tensors: one cat of the
# flattened tensors, and views of a flat tensor shaped like a list (what DDP's
# bucketing uses). Checked on 2.4.1, 2.13.0, 2.14.1. Fallback: torch.cat and split.
def _flatten(tensors: Sequence[Tensor]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) != 1 else tensors[0].reshape(-1)


def _unflatten(flat: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    return [t.view_as(x) for t, x in zip(flat.split([x.numel() for x in like]), like)]


_C_nn = getattr(torch._C, "_nn", None)
if _C_nn is not None and hasattr(_C_nn, "flatten_dense_tensors") and not PUBLIC_ONLY:
    flatten_dense: Callable[[Sequence[Tensor]], Tensor] = _C_nn.flatten_dense_tensors
    unflatten_dense: Callable[[Tensor, Sequence[Tensor]], Sequence[Tensor]] = _C_nn.unflatten_dense_tensors
else:  # pragma: no cover - exercised with GAMEOPT_TORCH_PUBLIC=1
    flatten_dense, unflatten_dense = _flatten, _unflatten


# ------------------------------------------------------------------ tensor internals
def use_count(t: Tensor) -> int:
    """How many C++ references hold ``t``'s TensorImpl (an autograd graph's
    AccumulateGrad node is one): ``Tensor._use_count``, what
    ``torch.utils.swap_tensors`` itself checks. Checked on 2.4.1, 2.13.0, 2.14.1; no
    public equivalent."""
    return t._use_count()  # type: ignore[attr-defined]  # private: not in the type stubs


def view_base(t: Tensor) -> Tensor | None:
    """The tensor ``t`` is a view of (``Tensor._base``; a view holds it, so that
    ``torch.utils.swap_tensors`` refuses to move it), or ``None``. Checked on 2.4.1,
    2.13.0, 2.14.1; no public equivalent."""
    return t._base


#: ``t``'s version counter (``Tensor._version``): every in-place write through autograd
#: moves it, also through a view (views share their base's); a write through ``.data``
#: or numpy does not. An attribute getter, read every step (a call would cost more).
#: Checked on 2.13.0; no public equivalent.
version: Callable[[Tensor], int] = operator.attrgetter("_version")


def post_accumulate_grad_hooks(p: Tensor) -> dict[int, Callable[..., Any]] | None:
    """The hooks ``register_post_accumulate_grad_hook`` put on ``p`` (its
    ``_post_accumulate_grad_hooks`` dict, keyed like the handles), or None. Checked on
    2.4.1, 2.13.0, 2.14.1; no public way to list a tensor's hooks."""
    return p._post_accumulate_grad_hooks


def rehome_hooks(p: Tensor) -> None:
    """After ``torch.utils.swap_tensors(p, new)``, register ``p``'s tensor hooks on its
    new storage: ``swap_tensors`` leaves the C++ side of the hooks behind, and
    re-assigning the ``_backward_hooks``/``_post_accumulate_grad_hooks`` dicts
    registers them again. Checked on 2.4.1, 2.13.0, 2.14.1; no public equivalent."""
    for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
        hooks = getattr(p, attr)
        if hooks is not None:
            setattr(p, attr, hooks)


#: ``__torch_function__ = disabled_torch_function_impl`` makes a Tensor subclass's
#: operations return plain tensors: ``torch._C._disabled_torch_function_impl``, the
#: value PyTorch's "Extending torch" notes give for it. Checked on 2.4.1, 2.13.0,
#: 2.14.1; no public equivalent.
disabled_torch_function_impl = torch._C._disabled_torch_function_impl


def rnn_flat_weights_cleared(rnn: nn.RNNBase) -> None:
    """Drop an RNN's weak references to its flat weights before its parameters move
    (``_flat_weight_refs``), so ``_init_flat_weights`` after the move finds the new
    ones. Checked on 2.4.1, 2.13.0, 2.14.1; no public equivalent
    (``flatten_parameters`` reads the stale references)."""
    rnn._flat_weight_refs = []


def rnn_flat_weights_init(rnn: nn.RNNBase) -> None:
    """Rebuild an RNN's list of flat weights from its current parameters
    (``_init_flat_weights``, what ``RNNBase.__setattr__`` calls). Checked on 2.4.1,
    2.13.0, 2.14.1."""
    rnn._init_flat_weights()


# --------------------------------------------------------------------- module state
def compiled_original(module: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wrapped (``OptimizedModule._orig_mod``), or
    ``module`` itself when it is not compiled. Checked on 2.4.1, 2.13.0, 2.14.1; no
    public accessor."""
    if type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None), nn.Module):
        return cast(nn.Module, module._orig_mod)
    return module


def eager_named_modules(module: nn.Module, remove_duplicate: bool = True) -> Iterator[tuple[str, nn.Module]]:
    """``module.named_modules()`` (the same order, prefixes and duplicates rule) with
    every ``torch.compile`` wrapper on the way, the top one or a submodule's,
    replaced by the module it wraps: the names are those of the eager modules
    (``0.1``, not ``0._orig_mod.1``)."""
    seen: set[int] = set()

    def walk(m: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module]]:
        m = compiled_original(m)
        if remove_duplicate:
            if id(m) in seen:
                return
            seen.add(id(m))
        yield prefix, m
        for name, child in submodule_registry(m).items():
            if child is not None:
                yield from walk(child, f"{prefix}.{name}" if prefix else name)

    return walk(module, "")


def persistent_buffer_names(module: nn.Module) -> set[str]:
    """Names of ``module``'s own buffers that its ``state_dict`` saves: all but those
    registered with ``persistent=False`` (``_non_persistent_buffers_set``, checked on
    2.4.1, 2.13.0, 2.14.1). Fallback: the keys of the module's own
    ``state_dict(keep_vars=True)`` that name buffers."""
    if not PUBLIC_ONLY and hasattr(module, "_non_persistent_buffers_set"):
        return {n for n, b in buffer_registry(module).items() if b is not None} - module._non_persistent_buffers_set
    own = {n for n, b in module.named_buffers(recurse=False)}
    return {k for k in module.state_dict(keep_vars=True) if k in own}


# ------------------------------------------------------------------ module registries
def parameter_registry(module: nn.Module) -> dict[str, Any]:
    """The live dict in which ``module`` registers its own parameters
    (``nn.Module._parameters``; checked on 2.4.1, 2.13.0, 2.14.1). No public accessor
    returns the dict itself (``named_parameters(recurse=False)`` builds a new one),
    and gameopt needs it twice: to substitute a parameter in place, as
    ``torch.func.functional_call`` does, and to see a registration change by identity
    in one pass. Any torch keeps this attribute (``nn.Module.__setattr__`` writes it),
    so there is no fallback."""
    return module._parameters


def submodule_registry(module: nn.Module) -> dict[str, Any]:
    """The live dict of ``module``'s direct submodules (``nn.Module._modules``), as
    :func:`parameter_registry`."""
    return module._modules


def buffer_registry(module: nn.Module) -> dict[str, Any]:
    """The live dict of ``module``'s own buffers (``nn.Module._buffers``, ``None`` where
    a buffer is registered empty), as :func:`parameter_registry`; reading it costs one
    attribute access, where ``named_buffers(recurse=False)`` walks a generator."""
    return module._buffers


# ------------------------------------------------------------------ public wrappers
@contextlib.contextmanager
def mkldnn_disabled(disable: bool = True) -> Iterator[None]:
    """mkldnn kernels off inside (its CPU recurrent kernels have no forward-mode AD),
    through the public ``torch.backends.mkldnn.enabled`` flag."""
    before = torch.backends.mkldnn.enabled
    try:
        if disable:
            torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # a ContextProp: set as a bool
        yield
    finally:
        torch.backends.mkldnn.enabled = before


_JIT_NOTICE = r".*torch\.jit\.(script|trace)"


def make_dual(primal: Tensor, tangent: Tensor) -> Tensor:
    """``torch.autograd.forward_ad.make_dual``. Its first call loads torch's jvp
    decompositions through ``torch.jit.script``, which warns that TorchScript is
    deprecated (a DeprecationWarning before torch 2.14, a FutureWarning from 2.14):
    torch's own notice, about torch's own code, silenced here by message whatever
    its category."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_JIT_NOTICE)
        return forward_ad.make_dual(primal, tangent)


# ------------------------------------------------------------------------ FSDP2
# A module sharded with ``torch.distributed.fsdp.fully_shard`` (public since torch 2.6)
# keeps, per parameter, an ``FSDPParam``: the sharded ``DTensor`` parameter, its local
# shard padded to the size of rank 0's (``_sharded_param_data``, what the all-gather
# reads), the unsharded parameter a forward uses (a leaf of its own: autograd reaches
# it, not the sharded one) and its gradient's reduce-scatter, which adds into a
# sharded ``.grad`` that is set, in place (``grad._local_tensor += ...``). gameopt
# makes the padded shard a slice of a player's flat buffer and the sharded ``.grad``
# a ``DTensor`` over a view of the flat gradient, as ``FSDPParam.reset_sharded_param``
# itself re-points them after ``load_state_dict(assign=True)``. Checked on 2.13.0 and
# 2.14.1; no public equivalent (FSDP2 owns its shards). Torch before 2.6 has FSDP2
# only as a private module: sharded players are refused there.
FSDP_PUBLIC: bool = TORCH_VERSION >= (2, 6)


@functools.cache
def dtensor_type() -> type | None:
    """``torch.distributed.tensor.DTensor`` (public since 2.5; ``torch.distributed._tensor``
    on 2.4, so that a sharded parameter is refused there by name), or None."""
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch 2.4: private, and seen to refuse it
        try:
            from torch.distributed._tensor import DTensor
        except ImportError:
            return None
    return DTensor


def fsdp_params(module: nn.Module) -> list[Any]:
    """The ``FSDPParam`` of every parameter that ``fully_shard`` sharded in ``module``
    and its submodules (through ``FSDPModule._get_fsdp_state()`` and its param
    groups)."""
    out: list[Any] = []
    for sub in module.modules():
        get_state = getattr(sub, "_get_fsdp_state", None)
        if get_state is None:
            continue
        state = get_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:  # one group per module before the plural list
            group = getattr(state, "_fsdp_param_group", None)
            groups = [] if group is None else [group]
        for group in groups:
            out.extend(group.fsdp_params)
    return out


def local_shard(p: Tensor) -> Tensor:
    """A ``DTensor``'s local tensor (``_local_tensor``; ``to_local()`` makes a new view
    through autograd each call)."""
    return cast(Tensor, p._local_tensor)  # type: ignore[attr-defined]


def place_shard(fsdp_param: Any, padded: Tensor, length: int) -> None:
    """Make ``padded`` (1-D, the padded shard's size) the storage of an FSDP parameter's
    shard: what the all-gather reads, and the first ``length`` rows (along the shard
    dimension) the sharded ``DTensor``'s local tensor."""
    size = fsdp_param.padded_sharded_param_size
    dim = fsdp_param.fsdp_placement.dim
    fsdp_param._sharded_param_data = padded
    fsdp_param.sharded_param._local_tensor = padded.view(size).narrow(dim, 0, length)


def shard_length(fsdp_param: Any) -> int:
    """The rows of the local shard along the shard dimension (0 for an empty shard)."""
    size = fsdp_param.sharded_size
    return int(size[fsdp_param.fsdp_placement.dim]) if size.numel() else 0


def sharded_dtensor(fsdp_param: Any, local: Tensor) -> Tensor:
    """``local`` (the local shard's size) as a ``DTensor`` sharded like the parameter,
    outside autograd (``FSDPParam.to_sharded_dtensor``)."""
    return cast(Tensor, fsdp_param.to_sharded_dtensor(local))


def unsharded_param(fsdp_param: Any) -> Tensor | None:
    """The unsharded parameter that the last forward used (``_unsharded_param``; made at
    the first all-gather and reused), or None before any forward."""
    return getattr(fsdp_param, "_unsharded_param", None)


def default_store() -> Any:
    """The key-value store of the default process group (``_get_default_store``: the
    rendezvous store torchrun or ``init_process_group`` made), for messages between
    ranks outside collectives. Checked on 2.13.0 and 2.14.1; no public accessor."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


# ops' tags, read by the counter (gameopt.testing.traffic): a change of metadata in place, a random fill
INPLACE_VIEW_TAG = getattr(torch.Tag, "inplace_view", None)
SEEDED_TAG = getattr(torch.Tag, "nondeterministic_seeded", None)


def op_arguments(func: Any) -> list[Any]:
    """An ATen op's (``OpOverload``) declared arguments, each with ``name``,
    ``kwarg_only`` and ``alias_info`` (``is_write``: the op writes it), for the counter
    (gameopt.testing.traffic). ``_schema``; checked on 2.13.0; no public
    equivalent."""
    return list(func._schema.arguments)
