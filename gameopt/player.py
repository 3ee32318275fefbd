"""A player: one module's trainable parameters in fused flat buffers."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from .buffer import FlatBuffer, links_intact

_SPARSE_MODULES = (nn.Embedding, nn.EmbeddingBag)


class Player:
    """One player of a game: its parameters live in flat buffers.

    The module's trainable parameters (``requires_grad=True``; tied weights once,
    in ``module.parameters()`` order) move into one contiguous :class:`FlatBuffer`
    per (device, dtype) group and become views of it; their ``.grad`` are views of
    the matching flat gradient buffer. Frozen parameters stay where they are.

    Args:
        module: an ``nn.Module``, or an iterable of ``nn.Parameter``.
        loss: optional zero-argument callable returning this player's scalar loss;
            a :class:`~gameopt.Game` built without a joint ``losses`` uses it.
        name: a label for messages (default: the module's class name).
        align: pad each parameter's start to this many bytes (default: tight).

    Conversions after fusing (``module.double()``, ``.to(...)``, ``p.data = ...``,
    ``load_state_dict(..., assign=True)``) are noticed by :meth:`check`, which every
    game step calls, and re-fused with the current values. Sparse gradients
    (``nn.Embedding(sparse=True)``) are densified into the flat gradient buffer.
    """

    def __init__(
        self,
        module: nn.Module | Iterable[nn.Parameter],
        *,
        loss: Callable[[], Tensor] | None = None,
        name: str | None = None,
        align: int | None = None,
    ) -> None:
        if align is not None and (not isinstance(align, int) or align <= 0):
            raise ValueError(f"align must be a positive number of bytes, got {align!r}")
        if isinstance(module, nn.Module):
            self.module: nn.Module | None = module
            default_name = type(module).__name__
        else:
            self.module = None
            self._given = list(module)
            for p in self._given:
                if not isinstance(p, Tensor):
                    raise TypeError(f"Player expects an nn.Module or Parameters, got {type(p).__name__}")
            default_name = "params"
        if loss is not None and not callable(loss):
            raise TypeError("loss must be a zero-argument callable returning a scalar tensor")
        self.loss = loss
        self.name = name if name is not None else default_name
        self.align = align
        self.generation = 0  # bumped each time the player re-fuses
        self._fuse()

    # ------------------------------------------------------------------ fusing
    def _collect(self) -> tuple[list[nn.Parameter], list[list[tuple[nn.Module, str]]]]:
        """Trainable parameters, deduplicated, and where each is registered."""
        params: list[nn.Parameter] = []
        owners: dict[int, list[tuple[nn.Module, str]]] = {}
        if self.module is None:
            for p in self._given:
                if p.requires_grad and id(p) not in owners:
                    owners[id(p)] = []
                    params.append(p)
        else:
            for sub in self.module.modules():
                for pname, p in sub._parameters.items():
                    if p is None or not p.requires_grad:
                        continue
                    if id(p) not in owners:
                        owners[id(p)] = []
                        params.append(p)
                    owners[id(p)].append((sub, pname))
        return params, [owners[id(p)] for p in params]

    def _fuse(self) -> None:
        params, owners = self._collect()
        if not params:
            raise ValueError(f"player {self.name!r} has no trainable parameters (requires_grad=True)")
        if self.module is not None:
            sparse = [m for m in self.module.modules() if isinstance(m, _SPARSE_MODULES) and m.sparse]
            self.has_sparse_grad = bool(sparse)
        else:
            self.has_sparse_grad = False
        groups: dict[tuple[torch.device, torch.dtype], list[nn.Parameter]] = {}
        for p in params:
            if p.layout != torch.strided:
                raise ValueError(f"player {self.name!r}: only strided (dense) parameters can be fused")
            groups.setdefault((p.device, p.dtype), []).append(p)
        modules = list(self.module.modules()) if self.module is not None else []
        self.buffers: tuple[FlatBuffer, ...] = tuple(FlatBuffer(g, self.align, modules) for g in groups.values())
        self._params = params
        self._owners = owners
        places = [(sub, name, p) for p, ps in zip(params, owners) for sub, name in ps]
        self._subs = [sub for sub, _, _ in places]
        self._names = [n for _, n, _ in places]
        self._registered = [p for _, _, p in places]
        self._where = {id(p): (b, i) for b in self.buffers for i, p in enumerate(b.params)}
        self.generation += 1

    # ---------------------------------------------------------------- checking
    def stale(self) -> str | None:
        """Why the module no longer uses this player's buffers, or ``None``."""
        # fast path, iterated in C: every registration still holds its parameter
        if links_intact((), (), (), self._subs, self._names, self._registered):
            return self._buffers_stale()
        for p, places in zip(self._params, self._owners):
            for sub, pname in places:
                if sub._parameters.get(pname) is not p:
                    return f"parameter {pname!r} of {type(sub).__name__} was replaced (assign=True or setattr)"
        return self._buffers_stale()

    def _buffers_stale(self) -> str | None:
        for buf in self.buffers:
            why = buf.stale()
            if why:
                return why
        return None

    def check(self) -> bool:
        """Re-fuse if the module changed since fusing; return True if it did.

        Raises a ``RuntimeError`` saying what happened if re-fusing is impossible.
        """
        why = self.stale()
        if why is None:
            return False
        try:
            self._fuse()
        except RuntimeError as err:
            raise RuntimeError(f"player {self.name!r}: {why}, and re-fusing failed: {err}") from err
        return True

    # ---------------------------------------------------------------- access
    def _single(self, what: str) -> FlatBuffer:
        self.check()
        if len(self.buffers) != 1:
            groups = ", ".join(f"{b.device}/{b.dtype} ({b.num_elements} elements)" for b in self.buffers)
            raise ValueError(
                f"player {self.name!r} has {len(self.buffers)} parameter groups ({groups}); "
                f"there is no single flat {what} tensor: use player.buffers[i].{what}"
            )
        return self.buffers[0]

    @property
    def params(self) -> Tensor:
        """The flat parameter tensor: the storage itself, so writes reach the module."""
        return self._single("data").data

    @property
    def grad(self) -> Tensor:
        """The flat gradient tensor; parameters without a gradient read as exact zeros."""
        buf = self._single("grad")
        buf.relink_grads()
        return buf.grad

    @property
    def numel(self) -> int:
        """The number of trainable elements (padding excluded)."""
        return sum(b.num_elements for b in self.buffers)

    @property
    def parameters(self) -> list[nn.Parameter]:
        """The fused parameters, in fusing order."""
        return list(self._params)

    def relink_grads(self) -> None:
        """Point every parameter's ``.grad`` back into the flat gradient buffers."""
        for b in self.buffers:
            b.relink_grads()

    def __repr__(self) -> str:
        return f"Player({self.name!r}, numel={self.numel}, buffers={list(self.buffers)})"
